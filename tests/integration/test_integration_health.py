"""The live daemon's health surfaces with MQTT and telemetry on: the whole ``/metrics`` text read by the
reference Prometheus parser (labels with quotes and backslashes included), and the field failure of issue #13:
the process runs out of file descriptors, the telemetry sampler fails with EMFILE, is restarted, is shown as
degraded and stale in ``/v2/edged/status``, ``/metrics`` and the retained MQTT status, while readiness stays 200."""

from __future__ import annotations

import resource
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from integration.edged_daemon import DaemonProcess, start_daemon, wait_for
from mqtt.conftest import Broker, Subscriber
from prometheus_client.parser import text_string_to_metric_families

from edged.cli.status import describe
from edged.client import EdgedClient

TESTS = Path(__file__).resolve().parents[1]
SYSFS = TESTS / "fixtures" / "sysfs" / "orin_nano_jp6"
MODELS = TESTS.parent / "models"
AWKWARD_RAIL = 'VDD "IN" \\ main'
AWKWARD_MODEL = 'tiny "mlp"'  # a backslash is refused as a path separator


def sysfs_tree(directory: Path) -> Path:
    """A recorded Orin Nano sysfs tree whose input rail's label has a quote and a backslash in it."""
    root = directory / "sysfs"
    shutil.copytree(SYSFS, root, symlinks=True)
    label = next(root.glob("sys/devices/**/hwmon1/in1_label"))
    label.write_text(AWKWARD_RAIL + "\n")
    return root


@pytest.fixture
def running(tmp_path: Path) -> Iterator[tuple[DaemonProcess, Broker, EdgedClient]]:
    broker = Broker(tmp_path / "broker")
    broker.start()
    repository = tmp_path / "models"
    shutil.copytree(MODELS / "tiny_mlp", repository / "tiny_mlp")
    awkward = repository / AWKWARD_MODEL
    shutil.copytree(MODELS / "tiny_mlp", awkward)
    config_file = awkward / "config.pbtxt"
    config_file.write_text(config_file.read_text().replace('name: "tiny_mlp"', 'name: "tiny \\"mlp\\""'))
    config = (f'[models]\nrepository = "{repository}"\n\n'
              f'[telemetry]\nsource = "sysfs"\nsysfs_root = "{sysfs_tree(tmp_path)}"\ninterval_s = 0.2\n'
              'restart_backoff_s = 0.2\nrestart_backoff_max_s = 0.5\n\n'
              f'[mqtt]\nbroker = "{broker.url}"\ndevice_id = "health1"\n'
              '[[mqtt.pipelines]]\ninput = "sensors/+/frame"\nmodel = "tiny_mlp"\noutput = "results/{1}"\n')
    daemon = start_daemon(tmp_path / "daemon", config=config)
    client = daemon.client()
    try:
        yield daemon, broker, client
    finally:
        daemon.stop()
        broker.stop()


def scrape(client: EdgedClient) -> dict[str, Any]:
    """Every family of /metrics; the parser raises on any line that is not valid exposition text."""
    return {family.name: family for family in text_string_to_metric_families(client.metrics())}


def value(families: dict[str, Any], name: str, **labels: str) -> float:
    samples = [s.value for s in families[name].samples if all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(samples) == 1, f"{name}{labels}: {samples}"
    return float(samples[0])


def test_all_of_metrics_parses_with_awkward_labels_and_reports_thread_health(running) -> None:
    _, _, client = running
    wait_for(lambda: client.status()["mqtt"]["connected"], "mqtt connected")
    families = wait_for(lambda: (f := scrape(client)) and "edged_power_milliwatts" in f and f, "telemetry")
    assert value(families, "edged_power_milliwatts", rail=AWKWARD_RAIL) > 0
    assert value(families, "edged_telemetry_stale") == 0
    assert value(families, "edged_mqtt_connected") == 1
    for thread in ("mqtt_outbox", "mqtt_network", "mqtt_requests", "mqtt_pipelines[0]", "telemetry_sampler",
                   "telemetry_writer"):
        assert value(families, "edged_thread_restarts", thread=thread) == 0
        assert value(families, "edged_component_degraded", component=thread) == 0
    assert families["edged_thread_restarts"].type == "counter"
    assert value(families, "nv_inference_count", model="tiny_mlp", version="1") == 0
    assert value(families, "nv_inference_count", model=AWKWARD_MODEL, version="1") == 0
    assert value(families, "edged_model_memory_bytes", model=AWKWARD_MODEL, version="1") > 0
    assert value(families, "edged_http_connections") >= 1  # this scrape's own connection
    assert value(families, "edged_http_max_connections") > 0
    assert value(families, "edged_http_connections_refused") == 0  # the parser strips a counter's _total
    assert value(families, "edged_shm_regions") == 0
    status = client.status()
    assert status["health"]["state"] == "ok" and status["telemetry"]["stale"] is False


def test_out_of_file_descriptors_degrades_telemetry_and_recovers(running) -> None:
    daemon, broker, client = running
    status_sub = Subscriber(broker.port, ["edged/health1/status"])
    try:
        wait_for(lambda: any(orjson.loads(m.payload)["state"] == "online" for m in list(status_sub.messages)),
                 "the birth message")
        wait_for(lambda: client.status()["telemetry"]["last_sample_age_s"] is not None, "a first sample")
        limits = resource.prlimit(daemon.pid, resource.RLIMIT_NOFILE)
        # Below the lowest descriptor it may open (0-2 are taken): every open fails with EMFILE, while the
        # descriptors already open (the client's connection, the broker's, the databases) keep working.
        resource.prlimit(daemon.pid, resource.RLIMIT_NOFILE, (3, limits[1]))
        try:
            sampler = wait_for(lambda: (c := client.status()["health"]["components"]["telemetry_sampler"])
                               ["restarts"] >= 1 and c, "the sampler's restart")
            assert "Too many open files" in sampler["last_error"] and sampler["state"] != "ok"
            telemetry = wait_for(lambda: (t := client.status()["telemetry"])["stale"] and t, "stale telemetry")
            assert telemetry["last_sample_age_s"] >= 1.0
            families = scrape(client)
            assert value(families, "edged_telemetry_stale") == 1
            assert "edged_power_milliwatts" not in families and "edged_temperature_celsius" not in families
            assert value(families, "edged_thread_restarts", thread="telemetry_sampler") >= 1
            assert value(families, "edged_component_degraded", component="telemetry_sampler") == 1
            assert client.ready()  # readiness is about inference
            doc = client.status()
            assert doc["health"]["state"] == "degraded" and "telemetry_sampler" in doc["health"]["reason"]
            shown = describe(doc)  # what `edged status` prints
            assert any(line.startswith("health") and "degraded" in line for line in shown)
            assert any("telemetry_sampler" in line and "restarts" in line for line in shown)
            assert any(line.startswith("telemetry") and "STALE" in line for line in shown)
            retained = wait_for(lambda: [d for m in list(status_sub.messages)
                                         if (d := orjson.loads(m.payload))["state"] == "degraded"], "degraded")
            assert "Too many open files" in retained[-1]["reason"]
        finally:
            resource.prlimit(daemon.pid, resource.RLIMIT_NOFILE, limits)
        wait_for(lambda: client.status()["health"]["state"] == "ok", "healthy again")
        assert client.status()["telemetry"]["stale"] is False
        wait_for(lambda: orjson.loads(status_sub.messages[-1].payload)["state"] == "online", "online again")
    finally:
        status_sub.close()


def test_a_damaged_telemetry_database_leaves_the_daemon_serving_with_telemetry_degraded(tmp_path: Path) -> None:
    """`edged serve` exited with "file is not a database"; now it serves, says why and what to do, and recovers."""
    repository = tmp_path / "models"
    shutil.copytree(MODELS / "tiny_mlp", repository / "tiny_mlp")
    database = tmp_path / "daemon" / "state" / "telemetry.db"
    database.parent.mkdir(parents=True)
    database.write_bytes(b"not sqlite, " * 1000)
    config = (f'[models]\nrepository = "{repository}"\n\n'
              f'[telemetry]\nsource = "sysfs"\nsysfs_root = "{SYSFS}"\ninterval_s = 0.2\n'
              'restart_backoff_s = 0.2\nrestart_backoff_max_s = 0.5\n')
    daemon = start_daemon(tmp_path / "daemon", config=config)
    try:
        client = daemon.client()
        assert client.ready()  # readiness is about inference
        doc = client.status()
        writer = doc["health"]["components"]["telemetry_writer"]
        assert writer["state"] == "degraded" and str(database) in writer["reason"]
        assert "move it aside" in writer["reason"] and doc["telemetry"]["store_error"] == writer["reason"]
        assert value(scrape(client), "edged_component_degraded", component="telemetry_writer") == 1
        shown = describe({**doc, "live": True, "ready": True})  # what `edged status` prints
        assert any(line.startswith("telemetry") and "NOT STORED" in line for line in shown)
        assert any("telemetry_writer degraded" in line and str(database) in line for line in shown)
        wait_for(lambda: client.status()["telemetry"]["last_sample_age_s"] is not None, "live readings")
        database.rename(database.with_name("telemetry.db.damaged"))
        wait_for(lambda: client.status()["health"]["components"]["telemetry_writer"]["state"] == "ok",
                 "the store opened on a retry")
        assert client.status()["telemetry"]["store_error"] is None
    finally:
        assert daemon.stop() == 0


def test_a_looping_replay_of_garbage_is_reported_and_sigterm_stops_the_daemon(tmp_path: Path) -> None:
    """The sampler spun on such a file forever at 100 % CPU, and SIGTERM left the daemon hanging in its stop."""
    replay = tmp_path / "capture.log"
    replay.write_text("not tegrastats\n" * 50)
    config = (f'[telemetry]\nsource = "replay"\nreplay_file = "{replay}"\nreplay_loop = true\n'
              'replay_speed = 1000.0\n')
    daemon = start_daemon(tmp_path / "daemon", config=config)
    try:
        client = daemon.client()
        sampler = wait_for(lambda: (c := client.status()["health"]["components"]["telemetry_sampler"])
                           ["state"] == "degraded" and c, "the sampler to report the file")
        assert str(replay) in sampler["reason"] and "no usable tegrastats line" in sampler["reason"]
        assert client.ready()
    finally:
        code = daemon.stop(wait_s=20.0)  # SIGKILL after that: a negative status
    assert code == 0, daemon.output()
