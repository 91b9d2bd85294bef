"""The tegrastats parser: one pure function over one line, for every format from TX1 (L4T 28) to Thor (JP7).

The line is scanned left to right; at each position the known field patterns are tried in order and the first
that matches is consumed. Whatever matches none of them is kept verbatim in ``unparsed``: an unknown token is
never fatal. A line without a ``RAM`` field is not a tegrastats line and raises `TelemetryParseError`.

Decisions (documented in the module so that callers can rely on them):
- Sizes printed in kB or GB are converted to MB integers, rounding to the nearest MB (1 MB = 1024 kB).
- An offline sensor's sentinel (-256C, printed by tegrastats for a rail-gated GPU or an off DLA/PVA) is left
  out of ``temps_c`` altogether: a sensor without a reading has no temperature. R39's ``name@cur/maxC`` keeps
  the current value.
- Power rails: ``NAME now/avg`` with or without ``mW``; more values (R39 ``now/avg/max``) keep the first two.
  A name printed twice (AGX Orin's ``NC``) keeps its first value.
- A core printed as ``off`` is ``{"load_pct": null, "freq_mhz": null}``; the old ``cpu [a%,b%]@f`` form gives
  every core the shared frequency.
- For a per-GPC GPU frequency list ``x%@[a,b]`` the list is kept in ``gpu_gpc_freq_mhz`` and ``gpu_freq_mhz``
  is the common value when all are equal, else the maximum.
- A field whose value no Jetson can report costs that field only: it is left out of the sample and kept
  verbatim in ``unparsed``, as an unknown token is (a load outside 0-100 %, swap used above its total, a clock
  above 100 GHz, a rail above 1 kW, a temperature outside -100..250 C, a number too long to read). One bad
  thermal zone or a torn rail must not cost the input power, and so the energy, of every line. The RAM field
  is the exception: impossible there (used above total, above 16 TiB) the line is corrupt
  (`TelemetryParseError`, counted by the source, not stored), as a line without it is not tegrastats.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from edged.errors import TelemetryParseError
from edged.telemetry._sample import CpuCore, Engine, Rail, Sample

_NUM = r"-?\d+(?:\.\d+)?"
_SENTINEL_C = -256.0
_TIMESTAMP = re.compile(r"\s*(\d\d-\d\d-\d{4} \d\d:\d\d:\d\d)\s+")
_RAM = re.compile(r"RAM (\d+)/(\d+)([kMG]B)\s*(?:\(lfb (\d+)x(\d+)([kMG]B)\))?")
_SWAP = re.compile(r"SWAP (\d+)/(\d+)([kMG]B)\s*(?:\(cached (\d+)([kMG]B)\))?")
_IRAM = re.compile(r"IRAM (\d+)/(\d+)([kMG]B)\s*(?:\(lfb (\d+)([kMG]B)\))?")
_CPU = re.compile(r"(?:CPU|cpu) \[([^\]]*)\](?:@(\d+))?")
_LOAD_FREQ = r"(?:(\d+)%)?(?:@(?:(\d+)|\[([\d,]*)\]))?"
_GPU = re.compile(r"(GR3D_FREQ|GR3D) " + _LOAD_FREQ + r"(?=\s|$)")
_EMC = re.compile(r"(EMC_FREQ|EMC) " + _LOAD_FREQ + r"(?=\s|$)")
_MTS = re.compile(r"MTS fg (\d+)% bg (\d+)%")
_TEMP = re.compile(r"([A-Za-z][\w\-]*)@(" + _NUM + r")C(?:/(" + _NUM + r")C?)?(?=\s|$)")
_RAIL = re.compile(r"([A-Za-z][\w]*) (\d+)(?:mW)?/(\d+)(?:mW)?((?:/\d+(?:mW)?)*)(?=\s|$)")
_RAIL_SINGLE = re.compile(r"([A-Za-z][\w]*) (\d+)mW(?=\s|$)")
_ENGINE_OFF = re.compile(r"([A-Z][A-Z0-9_]*) (?:off|OFF)(?=\s|$)")
_ENGINE = re.compile(r"([A-Z][A-Z0-9_]*) " + _LOAD_FREQ + r"(?=\s|$)")
_ENGINE_BARE = re.compile(r"([A-Z][A-Z0-9_]*) (\d+)(?=\s|$)")  # "APE 174", "NVENC 716": a frequency
_TOKEN = re.compile(r"\S+")
_TO_MB = {"kB": 1 / 1024, "MB": 1.0, "GB": 1024.0}
# Physically sane bounds (far above any Jetson, far below 2**63): outside them the line is corrupt.
_MAX_MB = 16 * 1024 * 1024  # 16 TiB
_MAX_MHZ = 100_000
_MAX_MW = 1_000_000  # 1 kW per rail; Thor's module draws at most ~130 W
_TEMP_RANGE_C = (-100.0, 250.0)


def _mb(value: str, unit: str) -> int:
    return round(int(value) * _TO_MB[unit])


@dataclass
class _Builder:
    ram: tuple[int, int] | None = None
    swap: tuple[int, int] | None = None
    cpu: list[CpuCore] = field(default_factory=list)
    gpu: tuple[int | None, int | None, tuple[int, ...] | None] = (None, None, None)
    emc: tuple[int | None, int | None] = (None, None)
    temps: dict[str, float] = field(default_factory=dict)
    rails: dict[str, Rail] = field(default_factory=dict)
    engines: dict[str, Engine] = field(default_factory=dict)
    unparsed: list[str] = field(default_factory=list)


def _load_freq(m: re.Match[str]) -> tuple[int | None, int | None, tuple[int, ...] | None] | None:
    load, freq, gpcs = m.group(2), m.group(3), m.group(4)
    if load is None and freq is None and gpcs is None:
        return None
    gpc_list = tuple(int(v) for v in gpcs.split(",") if v) if gpcs is not None else None
    freq_mhz = int(freq) if freq is not None else None
    if gpc_list:
        freq_mhz = gpc_list[0] if len(set(gpc_list)) == 1 else max(gpc_list)
    return (int(load) if load is not None else None, freq_mhz, gpc_list)


def _ascii_digits(text: str) -> bool:
    """0-9 only: str.isdigit() also accepts '²' and other digits int() refuses."""
    return text.isascii() and text.isdigit()


def _pct_ok(value: int | None) -> bool:
    return value is None or 0 <= value <= 100


def _mhz_ok(value: int | None) -> bool:
    return value is None or 0 <= value <= _MAX_MHZ


def _load_freq_ok(lf: tuple[int | None, int | None, tuple[int, ...] | None]) -> bool:
    return _pct_ok(lf[0]) and _mhz_ok(lf[1]) and all(_mhz_ok(f) for f in lf[2] or ())


def _parse_cpu(b: _Builder, m: re.Match[str]) -> list[CpuCore]:
    shared = int(m.group(2)) if m.group(2) else None
    cores: list[CpuCore] = []
    for item in m.group(1).split(","):
        item = item.strip()
        if item.lower() == "off" or not item:
            cores.append(CpuCore(None, None))
            continue
        load, _, freq = item.partition("@")
        load_pct = int(load.rstrip("%")) if _ascii_digits(load.rstrip("%")) else None
        freq_mhz = int(freq) if _ascii_digits(freq) else shared
        if not (_pct_ok(load_pct) and _mhz_ok(freq_mhz)):  # this core's reading only
            b.unparsed.append(item)
            load_pct, freq_mhz = None, None
        cores.append(CpuCore(load_pct, freq_mhz))
    return cores


def _refused(b: _Builder, m: re.Match[str]) -> int:
    """Keep a field whose value no Jetson can report in ``unparsed``, and go on after it."""
    b.unparsed.append(m.group(0))
    return m.end()


def _try_memory(b: _Builder, line: str, pos: int) -> int | None:
    if m := _RAM.match(line, pos):
        b.ram = (_mb(m.group(1), m.group(3)), _mb(m.group(2), m.group(3)))
        return m.end()
    if m := _SWAP.match(line, pos):
        swap = (_mb(m.group(1), m.group(3)), _mb(m.group(2), m.group(3)))
        if not 0 <= swap[0] <= swap[1] <= _MAX_MB:
            return _refused(b, m)
        b.swap = swap
        return m.end()
    if m := _IRAM.match(line, pos):
        return m.end()  # IRAM (older SoCs' video memory) is recognised, not reported
    if m := _CPU.match(line, pos):
        b.cpu = _parse_cpu(b, m)
        return m.end()
    return None


def _try_clocks(b: _Builder, line: str, pos: int) -> int | None:
    if (m := _GPU.match(line, pos)) and (lf := _load_freq(m)):
        if not _load_freq_ok(lf):
            return _refused(b, m)
        b.gpu = lf
        return m.end()
    if (m := _EMC.match(line, pos)) and (lf := _load_freq(m)):
        if not _load_freq_ok(lf):
            return _refused(b, m)
        b.emc = (lf[0], lf[1])
        return m.end()
    if m := _MTS.match(line, pos):
        fg, bg = int(m.group(1)), int(m.group(2))
        if not (_pct_ok(fg) and _pct_ok(bg)):
            return _refused(b, m)
        b.engines["MTS"] = Engine(True, extra=(("fg_pct", fg), ("bg_pct", bg)))
        return m.end()
    return None


def _try_sensors(b: _Builder, line: str, pos: int) -> int | None:
    if m := _TEMP.match(line, pos):
        value = float(m.group(2))
        if value == _SENTINEL_C:
            return m.end()
        if not _TEMP_RANGE_C[0] <= value <= _TEMP_RANGE_C[1]:
            return _refused(b, m)
        b.temps[m.group(1)] = value
        return m.end()
    if m := _RAIL.match(line, pos):
        rail = Rail(int(m.group(2)), int(m.group(3)))
        if not (0 <= rail.now_mw <= _MAX_MW and 0 <= (rail.avg_mw or 0) <= _MAX_MW):
            return _refused(b, m)
        b.rails.setdefault(m.group(1), rail)
        return m.end()
    if m := _RAIL_SINGLE.match(line, pos):
        if not 0 <= int(m.group(2)) <= _MAX_MW:
            return _refused(b, m)
        b.rails.setdefault(m.group(1), Rail(int(m.group(2)), None))
        return m.end()
    return _try_engines(b, line, pos)


def _try_engines(b: _Builder, line: str, pos: int) -> int | None:
    if m := _ENGINE_OFF.match(line, pos):
        b.engines[m.group(1)] = Engine(False)
        return m.end()
    if (m := _ENGINE.match(line, pos)) and (lf := _load_freq(m)):
        if not _load_freq_ok(lf):
            return _refused(b, m)
        b.engines[m.group(1)] = Engine(True, lf[0], lf[1])
        return m.end()
    if m := _ENGINE_BARE.match(line, pos):
        if not _mhz_ok(int(m.group(2))):
            return _refused(b, m)
        b.engines[m.group(1)] = Engine(True, None, int(m.group(2)))
        return m.end()
    return None


def parse_tegrastats(line: str, t: float = 0.0) -> Sample:
    """Parse one tegrastats line; raise `TelemetryParseError` when it has no RAM field."""
    b = _Builder()
    timestamp = None
    line = line.removeprefix("\ufeff")  # a byte order mark: a capture saved by a Windows editor
    pos = 0
    if m := _TIMESTAMP.match(line):
        timestamp, pos = m.group(1), m.end()
    end = len(line.rstrip())
    while pos < end:
        if line[pos].isspace():
            pos += 1
            continue
        try:
            new_pos = _try_memory(b, line, pos) or _try_clocks(b, line, pos) or _try_sensors(b, line, pos)
        except ValueError:  # a number the patterns took that int()/float() cannot read (past 4300 digits)
            new_pos = None
        if new_pos is None:
            token = _TOKEN.match(line, pos)
            new_pos = token.end() if token else end
            b.unparsed.append(line[pos:new_pos])
        pos = new_pos
    if b.ram is None:
        raise TelemetryParseError(
            f"not a tegrastats line (expected a 'RAM used/totalMB' field): {line.strip()[:80]!r}")
    if problem := _out_of_range(b):
        raise TelemetryParseError(f"corrupt tegrastats line ({problem}): {line.strip()[:80]!r}")
    return Sample(
        t=t, timestamp=timestamp, ram_used_mb=b.ram[0], ram_total_mb=b.ram[1],
        swap_used_mb=b.swap[0] if b.swap else None, swap_total_mb=b.swap[1] if b.swap else None,
        cpu=tuple(b.cpu), gpu_load_pct=b.gpu[0], gpu_freq_mhz=b.gpu[1], gpu_gpc_freq_mhz=b.gpu[2],
        emc_load_pct=b.emc[0], emc_freq_mhz=b.emc[1], temps_c=b.temps, power_mw=b.rails,
        engines=b.engines, unparsed=tuple(b.unparsed),
    )


def _out_of_range(b: _Builder) -> str | None:
    """What in the RAM field no Jetson can report, or None (every other field was checked as it was read)."""
    assert b.ram is not None
    used, total = b.ram
    if not 0 <= used <= total <= _MAX_MB:
        return f"RAM {used}/{total}MB: used must be at most total, total at most {_MAX_MB} MB"
    return None
