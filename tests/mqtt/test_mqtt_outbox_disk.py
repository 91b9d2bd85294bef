"""A full disk under the outbox: the pipeline waits, says why, and resumes by itself when space returns.

The state directory is a real 2 MB tmpfs (mounting needs root, as CI has; skipped with the reason otherwise),
the broker a real mosquitto, the engine real onnxruntime. The disk is filled with a plain file beside the
outbox and freed by deleting it.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from pathlib import Path

import paho.mqtt.client as paho
import pytest
from conftest import Broker, Subscriber, wait_until
from paho.mqtt.enums import CallbackAPIVersion
from test_mqtt_outbox import frame, ids_of
from tmpfs_mount import mounted_tmpfs

from edged.cli._doctor_checks import check_outbox_disk
from edged.config import MqttConfig, PipelineConfig
from edged.engine import InferenceService
from edged.mqtt import MqttFrontEnd
from edged.mqtt._metrics import Metrics
from edged.mqtt._outbox import Outbox

MESSAGES = 3000


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    with mounted_tmpfs(tmp_path / "state", "2m") as mount_point:
        yield mount_point


def fill(directory: Path) -> Path:
    """Write a file until the file system refuses more: the disk is then full."""
    filler = directory / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError as e:
        if e.errno != errno.ENOSPC:
            raise
    finally:
        os.close(fd)
    return filler


def full_everywhere(front: MqttFrontEnd) -> bool:
    """The outbox's disk is "full" with a reason and little space in the status, the metrics and the doctor."""
    outbox = front.status()["outbox"]
    doctor = check_outbox_disk(outbox)  # what `edged doctor` reads from the daemon
    return (outbox["disk"] == "full" and bool(outbox["disk_error"]) and outbox["disk_free_bytes"] < 1 << 20
            and doctor.status == "fail" and outbox["disk_error"] in doctor.detail and doctor.fix is not None
            and "edged_mqtt_outbox_write_failing 1" in front.prometheus_lines())


def test_a_full_disk_pauses_the_pipeline_reports_it_and_resumes_by_itself(
        service: InferenceService, broker: Broker, small_disk: Path) -> None:
    config = MqttConfig(broker=broker.url, device_id="disk1", reconnect_min_s=0.05, reconnect_max_s=0.5,
                        pipelines=(PipelineConfig(input="flood/+/in", model="tiny_mlp", output="flood/{1}/out",
                                                  qos=1, max_in_flight=4096),))
    front = MqttFrontEnd(service, config, small_disk, version="test")
    front.start()
    sub = Subscriber(broker.port, ["flood/+/out"])
    pub = paho.Client(CallbackAPIVersion.VERSION2, client_id="flood-sensor")
    pub.connect("127.0.0.1", broker.port)
    pub.loop_start()
    try:
        wait_until(lambda: front.status()["connected"], what="connected")
        filler = fill(small_disk)
        for i in range(MESSAGES):
            pub.publish(f"flood/s{i % 4}/in", frame(i), 1)
        # One moment where every surface says so. While the disk is full, a deletion can free a page that one
        # small retried group fits in, and the state flips to "ok" for a moment: so wait for agreement rather
        # than read the surfaces one after another. SQLite words ENOSPC "database or disk is full" or, when the
        # WAL or its index cannot grow, "disk I/O error": the state is "full" either way (free space is ~0).
        wait_until(lambda: full_everywhere(front), 120, "status, metrics and doctor to say the disk is full")
        assert front.status()["errors"].get("outbox_write", 0) >= 1
        filler.unlink()  # space returns: nothing else is done to the daemon
        try:
            wait_until(lambda: len(ids_of(list(sub.messages))[0]) >= MESSAGES, 240, f"all {MESSAGES} results")
        except AssertionError as e:  # say where they stopped: the outbox, the pipeline or the broker
            got = len(ids_of(list(sub.messages))[0])
            raise AssertionError(f"{e}: {got} arrived; mqtt status {front.status()}") from e
        ids, duplicates, _ = ids_of(list(sub.messages))
        assert ids == {f"m-{i}" for i in range(MESSAGES)}
        # no restart, and unless the connection dropped under load, no reconnect: nothing acknowledged twice
        assert duplicates == 0 or front.status()["connects"] > 1, duplicates
        wait_until(lambda: front.status()["outbox"]["depth"] == 0, 120, "the outbox to empty")
        assert front.status()["outbox"]["disk"] == "ok"
        assert check_outbox_disk(front.status()["outbox"]).status == "ok"
        assert "edged_mqtt_outbox_write_failing 0" in front.prometheus_lines()
    finally:
        pub.loop_stop()
        sub.close()
        front.stop(5)
    # every deletion was retried until it stuck: a restart resends nothing that was acknowledged
    reopened = Outbox(small_disk / "mqtt-outbox.sqlite3", config.outbox, Metrics())
    assert reopened.depth == 0
    reopened.stop(1)
