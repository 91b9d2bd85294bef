"""An outbox on a disk so small that its own files fill it: acknowledged rows never pin the disk.

A real 1 MB tmpfs (mounting needs root; skipped otherwise), a real mosquitto, real onnxruntime. 3000 results
stream through the outbox while the test fills the disk, then frees it. Before: the WAL (past its 512 KiB cap)
lagged the main file by more than the free space, so neither the checkpoint nor the deletion of acknowledged
rows could run; the outbox's own files held the disk and writes failed forever (1304 of 3000 results arrived).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import paho.mqtt.client as paho
import pytest
from conftest import Broker, Subscriber, wait_until
from paho.mqtt.enums import CallbackAPIVersion
from test_mqtt_outbox import frame, ids_of
from test_mqtt_outbox_disk import fill
from tmpfs_mount import mounted_tmpfs

from edged.config import MqttConfig, PipelineConfig
from edged.engine import InferenceService
from edged.mqtt import MqttFrontEnd

MESSAGES = 3000
WAL_CAP_BYTES = 512 << 10  # the README's promise


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    with mounted_tmpfs(tmp_path / "state", "1m") as mount_point:
        yield mount_point


def test_an_outbox_that_fills_a_small_disk_itself_drains_and_frees_it(
        service: InferenceService, broker: Broker, tiny_disk: Path) -> None:
    config = MqttConfig(broker=broker.url, device_id="tiny1", reconnect_min_s=0.05, reconnect_max_s=0.5,
                        pipelines=(PipelineConfig(input="tiny/+/in", model="tiny_mlp", output="tiny/{1}/out",
                                                  qos=1, max_in_flight=4096),))
    front = MqttFrontEnd(service, config, tiny_disk, version="test")
    front.start()
    sub = Subscriber(broker.port, ["tiny/+/out"])
    pub = paho.Client(CallbackAPIVersion.VERSION2, client_id="tiny-sensor")
    pub.connect("127.0.0.1", broker.port)
    pub.loop_start()
    try:
        wait_until(lambda: front.status()["connected"], what="connected")
        for i in range(MESSAGES):
            pub.publish(f"tiny/s{i % 4}/in", frame(i), 1)
        wait_until(lambda: front.status()["outbox"]["depth"] > 0, 60, "results in the outbox")
        filler = fill(tiny_disk)  # while results stream through the outbox
        wait_until(lambda: front.status()["outbox"]["disk"] == "full", 120, "the outbox to find the disk full")
        filler.unlink()
        try:
            wait_until(lambda: len(ids_of(list(sub.messages))[0]) >= MESSAGES, 240, f"all {MESSAGES} results")
            wait_until(lambda: front.status()["outbox"]["depth"] == 0, 60, "the outbox to empty")
        except AssertionError as e:
            files = {p.name: p.stat().st_size for p in tiny_disk.iterdir()}
            raise AssertionError(f"{e}: {len(ids_of(list(sub.messages))[0])} arrived; files {files}; "
                                 f"mqtt status {front.status()}") from e
        assert ids_of(list(sub.messages))[0] == {f"m-{i}" for i in range(MESSAGES)}
        wait_until(lambda: front.status()["outbox"]["disk"] == "ok", 30, "writes to succeed again")
        wal = tiny_disk / "mqtt-outbox.sqlite3-wal"
        assert not wal.exists() or wal.stat().st_size <= WAL_CAP_BYTES
    finally:
        pub.loop_stop()
        sub.close()
        front.stop(5)
