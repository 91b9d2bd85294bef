"""``edged top``: a live terminal view in the spirit of jtop, fed by the daemon over its Unix socket.

It reads ``GET /v2/edged/telemetry`` (the telemetry snapshot) and ``GET /v2/models/stats`` (Triton statistics
JSON) through `edged.client`. ``--once`` prints one frame and exits; into a pipe or a file it prints one frame
per interval, one after the other.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from typing import Any

from edged.client import EdgedClient, ModelNotFoundError
from edged.errors import ClientError


def _bar(pct: float | None, width: int = 20) -> str:
    if pct is None:
        return "off".ljust(width + 7)
    filled = round(max(0.0, min(100.0, pct)) / 100 * width)
    return f"[{'#' * filled}{'.' * (width - filled)}] {pct:3.0f}%"


def _text(value: Any) -> str:
    """A name from the daemon (model, rail, sensor) as plain text: rich reads '[...]' in a cell as markup, so
    'det[bold]' would print as 'det' in bold, and an unknown tag such as '[/x]' raises."""
    from rich.markup import escape

    return escape(str(value))


def _system_table(snap: dict[str, Any]) -> Any:
    from rich.table import Table

    s = snap.get("sample") or {}
    table = Table(title=_text(f"edged top - source {snap.get('source')}, power mode {snap.get('power_mode') or '-'}"),
                  show_header=False, expand=True)
    table.add_column("what", style="bold")
    table.add_column("value")
    for i, core in enumerate(s.get("cpu") or []):
        freq = f" @{core['freq_mhz']} MHz" if core.get("freq_mhz") else ""
        table.add_row(f"CPU{i}", _text(_bar(core.get("load_pct")) + freq))
    gpu_freq = f" @{s['gpu_freq_mhz']} MHz" if s.get("gpu_freq_mhz") is not None else ""
    table.add_row("GPU", _text(_bar(s.get("gpu_load_pct")) + gpu_freq))
    if s.get("ram_total_mb"):
        table.add_row("RAM", _text(_bar(100 * s["ram_used_mb"] / s["ram_total_mb"])
                                   + f" {s['ram_used_mb']}/{s['ram_total_mb']} MB"))
    rails = ", ".join(f"{k} {v['now']} mW" for k, v in (s.get("power_mw") or {}).items())
    table.add_row("Power", _text(f"in {snap.get('power_in_mw') or '-'} mW  ({rails or 'no rails'})"))
    temps = ", ".join(f"{k} {v:.1f}C" for k, v in (s.get("temps_c") or {}).items())
    table.add_row("Temp", _text(temps or "-"))
    if snap.get("stale"):  # /metrics drops such readings; here they stay, marked as old
        age = snap.get("last_sample_age_s")
        when = f"last sample {age:.0f} s ago" if age is not None else "no sample yet"
        table.add_row("Telemetry", _text(f"STALE: {when}; the readings above are not current "
                                         "(see edged status for why)"), style="red")
    if snap.get("off_reason"):
        table.add_row("Telemetry", _text(snap["off_reason"]))
    if snap.get("throttle_active"):
        table.add_row("Throttle", _text(", ".join(snap["throttle_active"])), style="red")
    return table


def _models_table(stats: dict[str, Any], snap: dict[str, Any], rates: dict[tuple[str, str], float]) -> Any:
    from rich.table import Table

    energy = snap.get("energy_per_inference_mj") or {}
    table = Table(title="models", expand=True)
    for column in ("model", "version", "inferences", "infer/s", "executions", "avg compute ms", "mJ/inference"):
        table.add_column(column, justify="left" if column == "model" else "right")
    for m in stats.get("model_stats") or []:
        infer = (m.get("inference_stats") or {}).get("compute_infer") or {}
        avg = infer.get("ns", 0) / infer["count"] / 1e6 if infer.get("count") else None
        mj = energy.get(m.get("name"))
        rate = rates.get(_key(m))
        table.add_row(_text(m.get("name")), _text(m.get("version", "")), str(m.get("inference_count", 0)),
                      f"{rate:.1f}" if rate is not None else "-", str(m.get("execution_count", 0)),
                      f"{avg:.2f}" if avg is not None else "-", f"{mj:.1f}" if mj is not None else "-")
    return table


def _key(model_stats: dict[str, Any]) -> tuple[str, str]:
    return str(model_stats.get("name")), str(model_stats.get("version", ""))


class _Rates:
    """Inferences per second of each model version between two frames; none at the first."""

    def __init__(self) -> None:
        self._before: tuple[float, dict[tuple[str, str], int]] | None = None

    def update(self, stats: dict[str, Any]) -> dict[tuple[str, str], float]:
        now = time.monotonic()
        counts = {_key(m): int(m.get("inference_count", 0)) for m in stats.get("model_stats") or []}
        rates: dict[tuple[str, str], float] = {}
        if self._before is not None and now > self._before[0]:
            then, before = self._before
            rates = {k: max(0, n - before[k]) / (now - then) for k, n in counts.items() if k in before}
        self._before = (now, counts)
        return rates


def frame(snap: dict[str, Any], stats: dict[str, Any], rates: dict[tuple[str, str], float] | None = None) -> Any:
    from rich.console import Group

    return Group(_system_table(snap), _models_table(stats, snap, rates or {}))


_OFF = "telemetry is off: set [telemetry] source in the daemon's config (auto picks tegrastats, jtop or sysfs)"


def _fetch(client: EdgedClient, rates: _Rates) -> Any:
    try:
        snap = client.telemetry()
    except ModelNotFoundError:  # 404: the daemon runs without telemetry; its models are still worth a view
        snap = {"source": "off", "off_reason": _OFF}
    stats = client.statistics()
    return frame(snap, stats, rates.update(stats))


def _run(args: argparse.Namespace) -> int:
    try:
        from rich.console import Console
        from rich.live import Live
    except ImportError as e:
        raise ClientError("edged top needs rich: pip install 'edged[view]'") from e
    console = Console()
    rates = _Rates()
    with EdgedClient(args.socket, timeout_s=5.0) as client:  # finds the socket as every other command does
        if args.once:
            console.print(_fetch(client, rates))
            return 0
        if not console.is_terminal:
            # Into a pipe or a file, Live would print only when it stops, which a live view never does: a frame
            # per interval instead, one after the other, as `top -b` writes.
            while True:
                console.print(_fetch(client, rates))
                sys.stdout.flush()
                time.sleep(args.interval)
        with Live(_fetch(client, rates), console=console, screen=False, auto_refresh=False) as live:
            while True:
                time.sleep(args.interval)  # the refresh period of an interactive view, not a readiness wait
                live.update(_fetch(client, rates), refresh=True)


def _interval(text: str) -> float:
    try:
        value = float(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, found {text!r}") from e
    if not (math.isfinite(value) and value > 0):  # time.sleep() raises on a negative one
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, found {text!r}")
    return value


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("top", help="live view of the device and the models (like jtop)")
    parser.add_argument("--socket", help="daemon socket (default: $EDGED_SOCKET, $RUNTIME_DIRECTORY/edged.sock, "
                        "$XDG_RUNTIME_DIR/edged/edged.sock, /tmp/edged-$UID/edged.sock, /run/edged/edged.sock: the "
                        "first that exists)")
    parser.add_argument("--once", action="store_true", help="print one frame and exit")
    parser.add_argument("--interval", type=_interval, default=1.0, help="seconds between refreshes (> 0)")
    parser.set_defaults(handler=_run)
