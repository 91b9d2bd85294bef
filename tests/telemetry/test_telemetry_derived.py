"""Energy per inference, throttling and over-temperature events, Prometheus text, the MQTT summary."""

from __future__ import annotations

import json
import shutil
import sqlite3

import numpy as np
import pytest
from modelgen import add_model, mlp_weights
from telemetry_data import SYSFS, recorded_lines

from edged.config import ModelsConfig, TelemetryConfig
from edged.engine import InferenceService, InferRequest
from edged.errors import TelemetryError
from edged.telemetry import Rail, Sample, TelemetryService, render_prometheus, summary_payload
from edged.telemetry._derived import EnergyAttributor, ThrottleDetector, input_power_mw
from edged.telemetry._sysfs import SysfsSource
from edged.telemetry.tegrastats import parse_tegrastats


def test_input_power_prefers_the_input_rail_then_sums():
    s = Sample(t=0, ram_used_mb=1, ram_total_mb=2,
               power_mw={"VDD_GPU_SOC": Rail(2399), "VDD_CPU_CV": Rail(400), "VIN_SYS_5V0": Rail(4032)})
    assert input_power_mw(s) == 2399 + 400 + 4032  # AGX Orin has no module input rail: the sum
    s = Sample(t=0, ram_used_mb=1, ram_total_mb=2, power_mw={"VDD_GPU_SOC": Rail(2399), "VDD_CPU_CV": Rail(400)})
    assert input_power_mw(s) == 2799
    s = Sample(t=0, ram_used_mb=1, ram_total_mb=2, power_mw={"POM_5V_GPU": Rail(78), "POM_5V_IN": Rail(2132)})
    assert input_power_mw(s) == 2132
    assert input_power_mw(Sample(t=0, ram_used_mb=1, ram_total_mb=2)) is None


def test_energy_is_split_by_compute_share_and_divided_by_inferences():
    energy = EnergyAttributor()
    a, b = ("a", "1"), ("b", "1")
    assert energy.update(100.0, 6000, {a: (0, 0), b: (0, 0)}) == []
    # 2 s at 6 W = 12 J; a used 3/4 of the compute time for 30 inferences, b 1/4 for 10
    out = energy.update(102.0, 6000, {a: (30, 300_000_000), b: (10, 100_000_000)})
    assert {m.model: m.energy_mj for m in out} == {"a": pytest.approx(9000.0), "b": pytest.approx(3000.0)}
    assert energy.per_inference_mj() == {"a": pytest.approx(300.0), "b": pytest.approx(300.0)}
    assert energy.update(103.0, 6000, {a: (30, 300_000_000), b: (10, 100_000_000)}) == []  # idle
    out = energy.update(104.0, 5000, {a: (5, 50_000_000), b: (10, 100_000_000)})  # a reloaded
    assert [(m.model, m.inferences, m.energy_mj) for m in out] == [("a", 5, pytest.approx(5000.0))]


def test_frequency_caps_and_trip_points_become_enter_and_leave_events(tmp_path):
    root = tmp_path / "root"
    shutil.copytree(SYSFS / "orin_nano_jp6", root, symlinks=True)
    detector = ThrottleDetector(over_temp_c=85.0)
    source = SysfsSource(str(root), 1.0)
    assert detector.update(source.read()) == []
    (root / "sys/devices/platform/bus@0/17000000.gpu/devfreq/17000000.gpu/max_freq").write_text("408000000\n")
    (root / "sys/devices/virtual/thermal/thermal_zone0/temp").write_text("96500\n")  # cpu over 95 C passive
    events = detector.update(source.read())
    assert {(e.kind, e.subject) for e in events} == {("throttle", "gpu"), ("over_temperature", "cpu")}
    assert detector.update(source.read()) == []  # still throttled: no new event
    (root / "sys/devices/platform/bus@0/17000000.gpu/devfreq/17000000.gpu/max_freq").write_text("624750000\n")
    assert [(e.kind, e.subject) for e in detector.update(source.read())] == [("throttle_end", "gpu")]
    assert detector.counts == {"throttle:gpu": 1, "over_temperature:cpu": 1}


def test_pmic_die_constant_100c_is_not_an_over_temperature():
    s = Sample(t=0, ram_used_mb=1, ram_total_mb=2, temps_c={"PMIC": 100.0, "CPU": 48.0})
    assert ThrottleDetector(over_temp_c=85.0).update(s) == []


class Counters:
    def __init__(self) -> None:
        self.calls = 0

    def model_activity(self):
        self.calls += 1
        return {("digits", "1"): (self.calls * 4, self.calls * 2_000_000)}


def test_service_snapshot_prometheus_and_events_from_sysfs(tmp_path):
    config = TelemetryConfig(source="sysfs", sysfs_root=str(SYSFS / "orin_nano_jp6"), interval_s=0.01,
                             flush_interval_s=0.05)
    service = TelemetryService(config, str(tmp_path / "t.db"), activity=Counters())
    service.start()
    try:
        assert service.wait_samples(3, timeout=20)
        service.record_event("model_load", "digits", "version 1")
    finally:
        service.stop()
    snap = service.snapshot()
    json.dumps(snap)
    assert snap["source"] == "sysfs" and snap["power_in_mw"] == 5263 and snap["power_mode"] == "15W"
    assert snap["energy_per_inference_mj"]["digits"] > 0
    text = service.render_prometheus()
    assert "# TYPE edged_gpu_utilization gauge\nedged_gpu_utilization 7\n" in text
    assert 'edged_power_milliwatts{rail="VDD_IN"} 5263' in text
    assert 'edged_temperature_celsius{sensor="tj"} 45.968' in text
    assert 'edged_cpu_utilization{core="0"}' in text and 'core="5"' not in text
    assert 'edged_energy_per_inference_millijoules{model="digits"}' in text
    assert f"edged_memory_used_bytes {2638 * 1024 * 1024}\n" in text
    kinds = {r[0] for r in sqlite3.connect(tmp_path / "t.db").execute("SELECT kind FROM events")}
    assert kinds == {"model_load", "power_mode"}


def _snap(gpu: int, pin: int, temps: dict[str, float]) -> dict:
    return {"t": 100.0, "sample": {"gpu_load_pct": gpu, "ram_used_mb": 2000, "temps_c": temps},
            "cpu_load_pct": 10.0, "power_in_mw": pin, "energy_per_inference_mj": {"digits": 12.3456},
            "throttle_active": []}


def test_summary_payload_deadband_and_byte_budget():
    temps = {f"sensor{i}": 40.0 + i for i in range(10)}
    first = summary_payload(_snap(10, 5000, temps), None, 1024)
    assert first is not None and b'"temps"' in first and b'"mj"' in first
    assert summary_payload(_snap(12, 5100, temps), _snap(10, 5000, temps), 1024) is None  # inside deadband
    assert summary_payload(_snap(30, 5100, temps), _snap(10, 5000, temps), 1024) is not None
    small = summary_payload(_snap(10, 5000, temps), None, 120)
    assert small is not None and len(small) <= 120 and b'"temps"' not in small
    assert json.loads(small)["gpu"] == 10
    with pytest.raises(TelemetryError, match="budget"):
        summary_payload(_snap(10, 5000, temps), None, 10)


def test_prometheus_of_an_empty_snapshot_is_still_valid_text():
    text = render_prometheus({"source": "off", "samples": 0})
    assert text.startswith("# HELP edged_telemetry_samples_total")
    assert 'edged_telemetry_samples_total{source="off"} 0\n' in text
    assert text.endswith("edged_telemetry_stale 0\n")


def _recorded_power() -> list[int]:
    """Module input power of recorded Orin Nano samples, one per second (what the service charges)."""
    powers = [input_power_mw(parse_tegrastats(line)) for line in recorded_lines("orin_nano_jp6.log")]
    return [p for p in powers if p is not None]


def test_energy_charges_the_first_burst_after_a_load_and_never_a_removed_versions_history_again(tmp_path):
    """Fed by the real engine: a model loaded and run between two samples was not charged for that burst, and
    removing one of two versions made the model's summed counters fall, read as a reload: the other version's
    whole history was charged again."""
    config = 'name: "multi"\nplatform: "onnxruntime_onnx"\nversion_policy: { all: {} }\n'
    add_model(tmp_path, "multi", config, {v: mlp_weights(in_dim=4, hidden=4, out_dim=2, seed=v) for v in (1, 2)})
    power = _recorded_power()
    engine = InferenceService(tmp_path, ModelsConfig(control_mode="poll"))
    engine.start()
    x = np.ones((1, 4), np.float32)

    def run(model: str, version: str, times: int) -> None:
        for _ in range(times):
            engine.infer(InferRequest(model, {"input": x}, version=version))

    try:
        energy = EnergyAttributor()
        energy.update(0.0, power[0], engine.model_activity())
        run("multi", "1", 6)
        run("multi", "2", 3)
        energy.update(1.0, power[1], engine.model_activity())
        assert energy.inferences == {"multi": 9}
        shutil.rmtree(tmp_path / "multi" / "1")  # version 1 leaves; version 2 serves on with its counters
        add_model(tmp_path, "late", None, {1: mlp_weights(in_dim=4, hidden=4, out_dim=2, seed=3)})
        engine.poll()
        engine.poll()  # a change is applied once it is the same in two polls
        assert [e["version"] for e in engine.repository_index() if e["name"] == "multi"] == ["2"]
        run("multi", "2", 2)
        run("late", "1", 4)  # loaded and run between two samples
        out = energy.update(2.0, power[2], engine.model_activity())
        assert energy.inferences == {"multi": 11, "late": 4}
        assert sum(m.energy_mj for m in out) == pytest.approx(power[2] * 1.0)  # the whole interval, shared
    finally:
        engine.close()


def test_without_a_power_reading_energy_per_inference_is_unknown_not_zero(tmp_path, capsys):
    """A device without power rails (sysfs with no hwmon monitor, tegrastats without rails) exported
    edged_energy_per_inference_millijoules 0 and the summary printed 0.00 mJ: unknown reported as free."""
    from edged.cli.main import main
    from edged.telemetry._replay import ReplaySource

    replay = tmp_path / "norails.log"
    replay.write_text("".join(f"RAM 3000/7620MB CPU [{i % 9}%@1510,5%@1510] GR3D_FREQ 40%@[612,612] "
                              "cpu@50.5C tj@51C\n" for i in range(40)))
    database = tmp_path / "t.db"
    service = TelemetryService(TelemetryConfig(flush_interval_s=0.05), str(database), activity=Counters(),
                               source=ReplaySource(str(replay), speed=1e6, interval_s=1.0))
    service.start()
    try:
        assert service.wait_samples(40, timeout=20)
    finally:
        service.stop()
    snap = service.snapshot()
    assert snap["power_in_mw"] is None and snap["energy_per_inference_mj"] == {}
    assert "edged_energy_per_inference_millijoules" not in service.render_prometheus()
    assert main(["telemetry", "summary", "--db", str(database), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["energy_per_inference_mj"] == {} and summary["series"]["model:digits"]["max"] > 0


def test_attributed_energy_is_exported_as_joule_and_inference_counters(tmp_path):
    """Only a since-start gauge in millijoules was exported: no counter in joules that rate() can turn into the
    energy per inference of the last 5 minutes, as Prometheus conventions ask."""
    from prometheus_client.parser import text_string_to_metric_families

    from edged.telemetry._replay import ReplaySource

    replay = tmp_path / "known.log"
    replay.write_text("RAM 3000/7620MB CPU [10%@1510] GR3D_FREQ 40%@[612,612] tj@51C "
                      "VDD_IN 6000mW/6000mW VDD_SOC 1500mW/1500mW\n" * 11)
    service = TelemetryService(TelemetryConfig(flush_interval_s=0.05), str(tmp_path / "t.db"), activity=Counters(),
                               source=ReplaySource(str(replay), speed=1e6, interval_s=1.0))
    service.start()
    try:
        assert service.wait_samples(11, timeout=20)
    finally:
        service.stop()
    families = {f.name: f for f in text_string_to_metric_families(service.render_prometheus())}
    joules, inferences = families["edged_model_energy_joules"], families["edged_model_energy_inferences"]
    assert joules.type == inferences.type == "counter"
    # 10 intervals of 1 s at 6 W, 4 inferences in each
    assert [(s.name, s.labels, s.value) for s in joules.samples] == [
        ("edged_model_energy_joules_total", {"model": "digits"}, pytest.approx(60.0))]
    assert [(s.labels, s.value) for s in inferences.samples] == [({"model": "digits"}, 40)]
    per_inference = families["edged_energy_per_inference_millijoules"].samples[0].value
    assert per_inference == pytest.approx(1500.0)
