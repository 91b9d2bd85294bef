"""Sources: a fake tegrastats executable (restarted when it dies), sysfs trees of real modules, replay, auto."""

from __future__ import annotations

import shutil
import sys
import threading
import time
from pathlib import Path

import pytest
from telemetry_data import SYSFS, TEGRASTATS, recorded_lines

from edged.config import TelemetryConfig
from edged.errors import ConfigKeyError, TelemetryError
from edged.telemetry import TelemetryService, choose_source, open_source
from edged.telemetry._jtop import sample_from_jtop
from edged.telemetry._replay import ReplaySource
from edged.telemetry._sysfs import SysfsSource
from edged.telemetry._sysfs_read import read_power_mode
from edged.telemetry._tegrastats_source import TegrastatsSource


def test_tegrastats_source_reads_lines_passes_interval_and_restarts_a_dead_child(fake_tegrastats, tmp_path):
    lines = recorded_lines("orin_nano_jp6.log")[:2]
    script = fake_tegrastats(lines)
    config = TelemetryConfig(source="tegrastats", tegrastats_path=str(script), interval_s=0.25,
                             restart_backoff_s=0.01)
    source = TegrastatsSource(config)
    stop = threading.Event()
    try:
        samples = [source.next_sample(stop) for _ in range(5)]  # the child prints 2 lines, then exits
    finally:
        source.close()
    assert [s.ram_used_mb for s in samples if s] == [3162, 2639, 3162, 2639, 3162]
    assert source.restarts == 2
    assert (tmp_path / "tegrastats.argv").read_text().splitlines()[0] == "--interval 250"


def test_tegrastats_source_skips_lines_that_are_not_tegrastats(fake_tegrastats):
    script = fake_tegrastats(["tegrastats: warning, not root", recorded_lines("nano_jp4.log")[0]])
    source = TegrastatsSource(TelemetryConfig(tegrastats_path=str(script)))
    try:
        sample = source.next_sample(threading.Event())
    finally:
        source.close()
    assert sample is not None and sample.gpu_freq_mhz == 76 and source.bad_lines == 1


def test_missing_tegrastats_binary_is_a_telemetry_error(tmp_path):
    source = TegrastatsSource(TelemetryConfig(tegrastats_path=str(tmp_path / "absent")))
    with pytest.raises(TelemetryError, match="cannot start"):
        source.next_sample(threading.Event())


def test_auto_prefers_tegrastats_then_sysfs_then_off(fake_tegrastats, tmp_path):
    script = fake_tegrastats(recorded_lines("nano_jp4.log"))
    assert choose_source(TelemetryConfig(tegrastats_path=str(script))).name == "tegrastats"
    root = str(SYSFS / "orin_nano_jp6")
    missing = str(tmp_path / "none")
    choice = choose_source(TelemetryConfig(tegrastats_path=missing, sysfs_root=root,
                                           jtop_socket=missing))
    assert choice.name == "sysfs" and root in choice.reason
    empty = tmp_path / "empty"
    empty.mkdir()
    off = choose_source(TelemetryConfig(tegrastats_path=missing, sysfs_root=str(empty), jtop_socket=missing))
    assert off.name == "off"
    assert open_source(TelemetryConfig(source="off")) is None


def test_sysfs_orin_nano_tree_gives_rails_temps_gpu_and_offline_core():
    sample = SysfsSource(str(SYSFS / "orin_nano_jp6"), 1.0).read()
    assert {k: r.now_mw for k, r in sample.power_mw.items()} == {"VDD_IN": 5263, "VDD_CPU_GPU_CV": 715,
                                                                  "VDD_SOC": 1795}
    assert sample.temps_c == {"cpu": 44.156, "gpu": 45.968, "soc0": 44.687, "soc1": 45.312, "soc2": 43.781,
                              "tj": 45.968}
    assert (sample.gpu_load_pct, sample.gpu_freq_mhz) == (7, 306)
    assert len(sample.cpu) == 6 and sample.cpu[5].load_pct is None and sample.cpu[0].freq_mhz == 729
    assert sample.trips_c["cpu"] == 95.0
    assert sample.freq_caps == {"cpu": (1510, 1510), "gpu": (624, 624)}
    assert (sample.ram_used_mb, sample.ram_total_mb) == (2638, 7619)
    assert read_power_mode(SYSFS / "orin_nano_jp6") == "15W"


def test_sysfs_nano_jp4_tree_reads_the_iio_power_monitor_and_gpu0_load():
    sample = SysfsSource(str(SYSFS / "nano_jp4"), 1.0).read()
    assert {k: r.now_mw for k, r in sample.power_mw.items()} == {"POM_5V_IN": 2132, "POM_5V_GPU": 78,
                                                                  "POM_5V_CPU": 275}
    assert sample.gpu_load_pct == 16 and sample.temps_c["PMIC-Die"] == 100.0


def test_sysfs_agx_orin_tree_from_published_values_has_no_input_rail_and_skips_offline_cv_zones():
    sample = SysfsSource(str(SYSFS / "agx_orin_jp6"), 1.0).read()
    # mV x mA / 1000 of fastnvmetrics' AGX Orin example; channels 1 and 3 of 1-0041 are not connected
    assert {k: r.now_mw for k, r in sample.power_mw.items()} == {
        "VDD_GPU_SOC": 5201, "VDD_CPU_CV": 2680, "VIN_SYS_5V0": 4734, "VDDQ_VDD2_1V8AO": 613}
    assert sample.temps_c == {"cpu": 47.5, "gpu": 42.0, "soc0": 46.0, "soc1": 44.0, "soc2": 46.5, "tj": 47.5,
                              "tboard": 37.5, "tdiode": 39.75}  # cv0-2 had no reading (EAGAIN)


@pytest.mark.parametrize("tree", sorted(p.name for p in SYSFS.iterdir() if p.is_dir()))
def test_sysfs_source_reads_rails_and_temperatures_from_every_fixture_tree(tree):
    sample = SysfsSource(str(SYSFS / tree), 1.0).read()
    assert sample.power_mw and all(r.now_mw > 0 for r in sample.power_mw.values())
    assert sample.temps_c and all(0 < c < 110 for c in sample.temps_c.values())


def test_sysfs_cpu_load_is_the_delta_between_two_reads(tmp_path):
    root = tmp_path / "root"
    shutil.copytree(SYSFS / "nano_jp4", root, symlinks=True)
    source = SysfsSource(str(root), 1.0)
    source.read()
    stat = (root / "proc/stat").read_text().replace("cpu0 1000 0 500 22500", "cpu0 1750 0 500 22750")
    (root / "proc/stat").write_text(stat)
    assert source.read().cpu[0].load_pct == 75  # 750 busy of 1000 jiffies


def test_replay_paces_by_the_recorded_timestamps(tmp_path):
    lines = recorded_lines("agx_orin_jp5.log")[1:3]  # 10:59:22 then 10:59:23
    path = tmp_path / "two.log"
    path.write_text("\n".join(lines) + "\n")
    source = ReplaySource(str(path), speed=20.0)
    stop = threading.Event()
    start = time.monotonic()
    first, second = source.next_sample(stop), source.next_sample(stop)
    elapsed = time.monotonic() - start
    assert first is not None and second is not None and source.next_sample(stop) is None
    assert second.t - first.t == pytest.approx(1.0)
    assert 0.09 <= elapsed < 1.0  # two 1 s steps at 20x


def test_service_runs_on_a_fake_tegrastats_end_to_end(fake_tegrastats, tmp_path):
    script = fake_tegrastats(recorded_lines("orin_nano_jp6.log"))
    config = TelemetryConfig(source="auto", tegrastats_path=str(script), flush_interval_s=0.05,
                             restart_backoff_s=0.01)
    service = TelemetryService(config, str(tmp_path / "state" / "telemetry.db"))
    service.start()
    try:
        assert service.wait_samples(6, timeout=20)
    finally:
        service.stop()
    snap = service.snapshot()
    assert snap["source"] == "tegrastats" and snap["samples"] >= 6
    assert snap["power_in_mw"] in {3913, 5263, 5251, 5832}
    assert (tmp_path / "state" / "telemetry.db").is_file()


def test_jtop_client_attributes_map_to_a_sample():
    # Shapes and units of jetson-stats 4.2+ (jtop/core/memory.py, cpu.py, gpu.py, power.py, temperature.py).
    sample = sample_from_jtop(
        memory={"RAM": {"used": 2702336, "tot": 7802376}, "SWAP": {"used": 0, "tot": 3901168},
                "EMC": {"val": 2, "cur": 2133000}},
        cpu={"cpu": [{"online": True, "idle": 98.5, "freq": {"cur": 729600}}, {"online": False}]},
        gpu={"gpu": {"status": {"load": 7.0}, "freq": {"cur": 306000}}},
        power={"rail": {"VDD_IN": {"power": 5263, "avg": 5263}}, "tot": {"power": 7773, "avg": 7773}},
        temperature={"cpu": {"temp": 44.156, "online": True}, "cv0": {"temp": -256.0, "online": False}},
        engine={"NVENC": {"NVENC": {"online": False, "cur": 0}}, "APE": {"APE": {"online": True, "cur": 200000}}},
        t=1.0)
    assert (sample.ram_used_mb, sample.ram_total_mb, sample.swap_total_mb) == (2639, 7619, 3809)
    assert sample.cpu[0].load_pct == 2 and sample.cpu[0].freq_mhz == 729 and sample.cpu[1].load_pct is None
    assert (sample.gpu_load_pct, sample.gpu_freq_mhz, sample.emc_freq_mhz) == (7, 306, 2133)
    assert sample.temps_c == {"cpu": 44.156} and sample.power_mw["VDD_IN"].avg_mw == 5263
    assert sample.engines["APE"].freq_mhz == 200 and not sample.engines["NVENC"].on


def test_fixture_files_name_a_source_for_every_block():
    for path in sorted(Path(TEGRASTATS).glob("*.log")):
        text = path.read_text()
        assert text.count("# source:") >= 1, path


def test_describe_source_names_the_choice_and_the_reason(tmp_path):
    from edged.telemetry import describe_source
    missing = str(tmp_path / "none")
    text = describe_source(TelemetryConfig(tegrastats_path=missing, jtop_socket=missing,
                                           sysfs_root=str(SYSFS / "nano_jp4")))
    assert text.startswith("sysfs (auto: no ") and missing in text


def test_tegrastats_output_with_bytes_that_are_not_utf8_keeps_the_source_reading(tmp_path):
    """A strict decode raised UnicodeDecodeError out of every read: the source never gave another sample."""
    good = recorded_lines("orin_nano_jp6.log")[:2]
    data = tmp_path / "out.bin"
    data.write_bytes(good[0].encode() + b"\n" + good[0].replace("VDD_IN", "VDD_\xff\xfeIN").encode("latin-1")
                     + b"\n" + good[1].encode() + b"\n")
    script = tmp_path / "tegrastats"
    script.write_text(f"#!{sys.executable}\nimport sys\nsys.stdout.buffer.write(open({str(data)!r}, 'rb').read())\n"
                      "sys.stdout.flush()\nimport time\ntime.sleep(60)\n")
    script.chmod(0o755)
    source = TegrastatsSource(TelemetryConfig(source="tegrastats", tegrastats_path=str(script)))
    stop = threading.Event()
    try:
        samples = [source.next_sample(stop) for _ in range(3)]
    finally:
        source.close()
    assert all(s is not None for s in samples) and source.restarts == 0 and source.bad_lines == 0
    damaged = samples[1]
    assert damaged is not None and "VDD_\ufffd\ufffdIN" in damaged.unparsed  # that field alone is lost
    assert damaged.ram_used_mb > 0 and "VDD_SOC" in damaged.power_mw


def test_a_replay_file_that_cannot_be_used_is_named_by_its_key(tmp_path):
    """Review: "cannot read replay file X" named no key (an unopenable database degrades telemetry instead)."""
    missing = TelemetryConfig(source="replay", replay_file=str(tmp_path / "missing.log"))
    with pytest.raises(ConfigKeyError) as refused:
        open_source(missing)
    assert str(refused.value) == (f"[telemetry] replay_file: cannot read replay file {tmp_path / 'missing.log'}: "
                                  "No such file or directory")
    with pytest.raises(ConfigKeyError, match=r"^\[telemetry\] replay_file: source = 'replay' needs replay_file"):
        open_source(TelemetryConfig(source="replay"))


def test_jtop_gpu_clock_read_through_nvml_is_in_mhz():
    """jetson-stats reads the GPU through NVML on JetPack 7 (Thor, Orin): its freq 'cur' is then NVML's MHz
    (governor 'nvml'), not devfreq's kHz; divided by 1000 a 1300 MHz GPU showed 1 MHz."""
    common = {"memory": {"RAM": {"used": 2702336, "tot": 7802376}}, "cpu": {"cpu": []}, "power": {},
              "temperature": {}, "engine": {}, "t": 1.0}
    nvml = sample_from_jtop(gpu={"gpu": {"status": {"load": 35.0}, "freq": {"governor": "nvml", "cur": 1300,
                                                                           "max": 1300, "min": 0}}}, **common)
    assert (nvml.gpu_load_pct, nvml.gpu_freq_mhz) == (35, 1300)
    devfreq = sample_from_jtop(gpu={"gpu": {"status": {"load": 35.0},
                                            "freq": {"governor": "nvhost_podgov", "cur": 1300500}}}, **common)
    assert devfreq.gpu_freq_mhz == 1300


@pytest.mark.parametrize("bogus", ["-650788984", "2147483647", "125000000"])
def test_a_thermal_zone_with_a_bogus_reading_is_left_out_as_tegrastats_leaves_it(tmp_path, bogus):
    """A zone that now and then reads garbage (docs/jetson.md §8) became a -650788 C or 2147483 C sensor in
    /metrics and an over-temperature event; tegrastats' parser already drops such a field."""
    from edged.telemetry._sysfs_read import read_thermal

    root = tmp_path / "root"
    shutil.copytree(SYSFS / "orin_nano_jp6", root, symlinks=True)
    (root / "sys/class/thermal/thermal_zone1/temp").write_text(bogus + "\n")  # gpu-thermal
    temps, _ = read_thermal(root)
    assert "gpu" not in temps and temps["cpu"] == 44.156 and temps["tj"] == 45.968


def test_a_tegrastats_that_cannot_start_says_which_keys_to_change(tmp_path):
    """The error named the binary and errno only: nothing said to fix tegrastats_path or pick another source,
    as the jtop source's error does."""
    source = TegrastatsSource(TelemetryConfig(tegrastats_path=str(tmp_path / "absent")))
    with pytest.raises(TelemetryError) as raised:
        source.next_sample(threading.Event())
    message = str(raised.value)
    assert str(tmp_path / "absent") in message and "No such file" in message
    assert "[telemetry] tegrastats_path" in message and "source" in message.split("tegrastats_path", 1)[1]
