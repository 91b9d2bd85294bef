"""A small edged process for the tests: engine + MQTT front end, nothing else (the daemon is not ours).

    python tests/mqtt/mqtt_runner.py --config edged.toml --repository DIR --state-dir DIR [--inject N]

``--inject N`` feeds N pipeline inputs (``sensors/inject/frame``) straight into the front end after start,
as if they had arrived, so results exist while the broker is down; it prints "injected" once all N results
are stored in the outbox. SIGTERM stops cleanly.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sqlite3
import sys
import threading
import time
from pathlib import Path

import numpy as np

from edged.config import ModelsConfig, parse_config
from edged.engine import InferenceService
from edged.mqtt import MqttFrontEnd
from edged.mqtt._message import Inbound
from edged.mqtt.frontend import OUTBOX_FILE
from edged.protocol import encode_request


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", type=Path, required=True)
    parser.add_argument("--repository", type=Path, required=True)
    parser.add_argument("--state-dir", type=Path, required=True)
    parser.add_argument("--inject", type=int, default=0)
    args = parser.parse_args()
    config = parse_config(args.config.read_text(), str(args.config))
    service = InferenceService(args.repository, ModelsConfig())
    service.start()
    front = MqttFrontEnd(service, config.mqtt, args.state_dir, version="test-runner")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    front.start()
    if args.inject:
        inject(front, args.inject)
        # "stored" means committed to the outbox file: the outbox's depth also counts rows still waiting for
        # their group commit, which a kill -9 right after this line would lose (the test's, not an input's loss)
        while _committed_rows(args.state_dir / OUTBOX_FILE) < args.inject:
            time.sleep(0.01)
        print("injected", flush=True)
    print("started", flush=True)
    stop.wait()
    front.stop(5)
    service.close()
    return 0


def _committed_rows(path: Path) -> int:
    try:
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)) as db:
            return int(db.execute("SELECT COUNT(*) FROM outbox").fetchone()[0])
    except sqlite3.Error:  # not created yet
        return 0


def inject(front: MqttFrontEnd, count: int) -> None:
    for index in range(count):
        body, _ = encode_request({"input": np.full((1, 64), index % 17 / 16, np.float32)}, binary=False,
                                 request_id=f"inject-{index}")
        front.on_message(Inbound("sensors/inject/frame", body, 1, received_ns=time.time_ns()))


if __name__ == "__main__":
    sys.exit(main())
