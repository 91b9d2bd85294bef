"""Readers of Linux sysfs and procfs under a configurable root (docs/jetson.md §3-5).

Paths and names are discovered at run time, never taken from a table: thermal zones by their ``type``, power
monitors by a hwmon ``name`` starting with "ina" (INA3221 on JP5+, INA238-family on Thor) or the JP4 IIO
driver ``ina3221x``, the GPU by devfreq ``device/of_node/name``. Every file is optional; a file that cannot be
read (EAGAIN from a power-gated zone, EACCES, a vanished hotplug core) is skipped, never fatal.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from edged.telemetry._sample import CpuCore, Rail

_GPU_OF_NAMES = ("gv11b", "gp10b", "ga10b", "gb10b", "gm20b")
_OFFLINE_MILLI_C = -256000
_TEMP_RANGE_MILLI_C = (-100_000, 250_000)  # the tegrastats parser's bounds, in m°C
_MODE_LINE = re.compile(r"<\s*POWER_MODEL\s+ID=(\d+)\s+NAME=(\S+)\s*>")


def read_text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace").strip().strip("\0")
    except OSError:
        return None


def read_int(path: Path) -> int | None:
    text = read_text(path)
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def _sensor_name(zone_type: str) -> str:
    for suffix in ("-thermal", "-therm"):
        if zone_type.endswith(suffix):
            return zone_type[: -len(suffix)]
    return zone_type


def read_thermal(root: Path) -> tuple[dict[str, float], dict[str, float]]:
    """(temperatures °C, lowest passive/hot trip point °C) by sensor name, offline zones left out."""
    temps: dict[str, float] = {}
    trips: dict[str, float] = {}
    for zone in sorted((root / "sys/class/thermal").glob("thermal_zone*")):
        zone_type = read_text(zone / "type")
        milli = read_int(zone / "temp")
        if zone_type is None or milli is None or milli == _OFFLINE_MILLI_C:
            continue
        name = _sensor_name(zone_type)
        if milli == 0 and name.lower().startswith("cv"):
            continue  # a DLA/PVA zone of a module without them reads 0 (docs/jetson.md §4)
        if not _TEMP_RANGE_MILLI_C[0] <= milli <= _TEMP_RANGE_MILLI_C[1]:
            continue  # a bogus read (docs/jetson.md §8): no reading, as the tegrastats parser drops the field
        temps[name] = milli / 1000.0
        for trip_type in zone.glob("trip_point_*_type"):
            if read_text(trip_type) in ("passive", "hot"):
                trip = read_int(trip_type.with_name(trip_type.name.replace("_type", "_temp")))
                if trip is not None and trip > 0:
                    trips[name] = min(trips.get(name, trip / 1000.0), trip / 1000.0)
    return temps, trips


def _hwmon_channel(hwmon: Path, label_file: Path) -> tuple[str, Rail] | None:
    label = read_text(label_file)
    n = label_file.name.split("_")[0].lstrip("incur")
    if not label or label == "NC" or "sum" in label.lower():
        return None
    power_uw = read_int(hwmon / f"power{n}_input")
    if power_uw is not None:
        return label, Rail(power_uw // 1000)
    mv, ma = read_int(hwmon / f"in{n}_input"), read_int(hwmon / f"curr{n}_input")
    if mv is None or ma is None:
        return None  # INA3221's sum-of-shunts entry has no current
    return label, Rail(mv * ma // 1000)


def read_rails(root: Path) -> dict[str, Rail]:
    """Power rails in mW from hwmon INA monitors (JP5+) or the JP4 ``ina3221x`` IIO driver."""
    rails: dict[str, Rail] = {}
    for hwmon in sorted((root / "sys/class/hwmon").glob("hwmon*")):
        if not (read_text(hwmon / "name") or "").startswith("ina"):
            continue
        labels = sorted(hwmon.glob("in*_label")) or sorted(hwmon.glob("curr*_label"))
        for label_file in labels:
            channel = _hwmon_channel(hwmon, label_file)
            if channel is not None:
                rails.setdefault(*channel)
    for iio in sorted((root / "sys/bus/i2c/drivers/ina3221x").glob("*/iio*device*")):
        for name_file in sorted(iio.glob("rail_name_*")):
            c = name_file.name.rsplit("_", 1)[1]
            label, power = read_text(name_file), read_int(iio / f"in_power{c}_input")
            if label and power is not None:
                rails.setdefault(label, Rail(power))
    return rails


def find_gpu_devfreq(root: Path) -> Path | None:
    """The devfreq node of the integrated GPU (docs/jetson.md §5, jtop's method)."""
    for node in sorted((root / "sys/class/devfreq").glob("*")):
        of_name = read_text(node / "device/of_node/name") or ""
        if of_name in _GPU_OF_NAMES or "gpu" in of_name or "gpu" in node.name:
            return node
    return None


def read_gpu(root: Path) -> tuple[int | None, int | None, tuple[int, int] | None]:
    """(load %, current MHz, (cap MHz, hardware max MHz)) of the GPU; Nones where unknown."""
    node = find_gpu_devfreq(root)
    if node is None:
        per_mille = read_int(root / "sys/devices/gpu.0/load")
        return (per_mille // 10 if per_mille is not None else None), None, None
    device = Path(os.path.realpath(node / "device"))
    per_mille = read_int(device / "load")
    cur_hz = read_int(node / "cur_freq")
    max_hz = read_int(node / "max_freq")
    available = [int(v) for v in (read_text(node / "available_frequencies") or "").split() if v.isdigit()]
    cap = (max_hz // 1_000_000, max(available) // 1_000_000) if max_hz and available else None
    return (per_mille // 10 if per_mille is not None else None,
            cur_hz // 1_000_000 if cur_hz is not None else None, cap)


def read_proc_stat(root: Path) -> dict[int, tuple[int, int]]:
    """cpu index -> (busy jiffies, total jiffies) for the online cores."""
    out: dict[int, tuple[int, int]] = {}
    for line in (read_text(root / "proc/stat") or "").splitlines():
        head, *fields = line.split()
        if head.startswith("cpu") and head[3:].isdigit() and len(fields) >= 4:
            values = [int(v) for v in fields[:8]]
            idle = values[3] + (values[4] if len(values) > 4 else 0)
            out[int(head[3:])] = (sum(values) - idle, sum(values))
    return out


def read_cpus(root: Path, prev: dict[int, tuple[int, int]], now: dict[int, tuple[int, int]],
              ) -> tuple[list[CpuCore], tuple[int, int] | None]:
    """Per-core load (from two /proc/stat readings) and frequency; the (cap, max) MHz of core 0's policy."""
    cpu_dir = root / "sys/devices/system/cpu"
    indexes = sorted(int(p.name[3:]) for p in cpu_dir.glob("cpu[0-9]*") if p.name[3:].isdigit())
    cores: list[CpuCore] = []
    for i in indexes or sorted(now):
        if read_int(cpu_dir / f"cpu{i}/online") == 0 or i not in now:
            cores.append(CpuCore(None, None))
            continue
        busy, total = now[i]
        p_busy, p_total = prev.get(i, (0, 0))
        load = round(100 * (busy - p_busy) / (total - p_total)) if total > p_total else 0
        khz = read_int(cpu_dir / f"cpu{i}/cpufreq/scaling_cur_freq")
        cores.append(CpuCore(load, khz // 1000 if khz is not None else None))
    cap_khz = read_int(cpu_dir / "cpu0/cpufreq/scaling_max_freq")
    max_khz = read_int(cpu_dir / "cpu0/cpufreq/cpuinfo_max_freq")
    return cores, ((cap_khz // 1000, max_khz // 1000) if cap_khz and max_khz else None)


def read_meminfo(root: Path) -> dict[str, int]:
    """/proc/meminfo in kB."""
    out: dict[str, int] = {}
    for line in (read_text(root / "proc/meminfo") or "").splitlines():
        key, _, rest = line.partition(":")
        value = rest.split()
        if value and value[0].isdigit():
            out[key] = int(value[0])
    return out


def read_power_mode(root: Path) -> str | None:
    """The nvpmodel power mode name, from /var/lib/nvpmodel/status and /etc/nvpmodel.conf (no root needed)."""
    status = read_text(root / "var/lib/nvpmodel/status") or ""
    if not status.startswith("pmode:") or not status[6:].isdigit():
        return None
    mode_id = int(status[6:])
    for m in _MODE_LINE.finditer(read_text(root / "etc/nvpmodel.conf") or ""):
        if int(m.group(1)) == mode_id:
            return m.group(2)
    return f"mode {mode_id}"
