"""Benchmark the MQTT front end: a thin wrapper over ``edged bench --transport mqtt`` (edged/bench/_mqtt.py).

    .venv/bin/python scripts/bench_mqtt.py [--duration 5] [--concurrency 1,4] [--outbox-cost]

Without --outbox-cost it runs ``edged bench --transport mqtt``: request/response latency per concurrency level
and a QoS 1 pipeline's messages/s with loss counted, against a private mosquitto and daemon. With --outbox-cost
it also runs the same pipeline measurement against three daemons (outbox with fsync batch, outbox with fsync
off, no outbox) and prints the daemon's CPU time per message for each.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from edged.bench import Scenario
from edged.bench._mqtt import OutboxMode, pipeline_row, private_daemon, request_payload
from edged.cli.main import main as edged_main

ROOT = Path(__file__).resolve().parents[1]


def _progress(message: str) -> None:
    print(f"bench_mqtt: {message}", file=sys.stderr, flush=True)


def outbox_cost(duration_s: float) -> None:
    scenario = Scenario(transport="mqtt", duration_s=duration_s)
    cpu: dict[OutboxMode, float] = {}
    modes: tuple[OutboxMode, ...] = ("batch", "off", "direct")
    for mode in modes:
        with private_daemon(ROOT / "models", scenario.model, mode) as daemon:
            result, cpu[mode] = pipeline_row(daemon, scenario, request_payload(daemon, scenario), _progress)
        print(f"outbox {mode:>6}: {result.throughput:7.0f} msg/s, {result.errors} lost or failed, "
              f"daemon CPU {cpu[mode] * 1e6:5.0f} µs per message")
    for mode in modes[:2]:
        print(f"outbox fsync={mode}: {cpu[mode] / cpu['direct'] - 1:+.1%} daemon CPU per message vs no outbox")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per measurement")
    parser.add_argument("--concurrency", default="1,4", help="request/response levels, e.g. 1,4,16")
    parser.add_argument("--outbox-cost", action="store_true", help="also compare the outbox's CPU cost")
    args = parser.parse_args()
    code = edged_main(["bench", "--transport", "mqtt", "--duration", str(args.duration),
                       "--concurrency", args.concurrency, "--model-repository", str(ROOT / "models")])
    if code == 0 and args.outbox_cost:
        outbox_cost(args.duration)
    return code


if __name__ == "__main__":
    sys.exit(main())
