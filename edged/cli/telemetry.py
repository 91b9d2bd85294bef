"""``edged telemetry``: parse tegrastats lines, and read the telemetry database directly (no daemon needed).

``parse`` reads lines on stdin and writes one JSON object per line (the contract of `Sample.to_json`); a line
that is not tegrastats gives ``line N: ...`` on stderr, the others are still parsed, and the exit status is 1.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime
from typing import Any, TextIO

from edged.errors import TelemetryError, TelemetryParseError
from edged.telemetry._query import TelemetryReader, parse_duration
from edged.telemetry.plot import output_error


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("telemetry", help="parse tegrastats output; query the telemetry history")
    sub = parser.add_subparsers(dest="telemetry_command", metavar="SUBCOMMAND", required=True)
    p = sub.add_parser("parse", help="tegrastats lines on stdin -> one JSON object per line on stdout",
                       description="Read tegrastats lines on stdin (tegrastats | edged telemetry parse, or "
                       "< capture.log) and write one JSON object per line on stdout; a line that is not "
                       "tegrastats is reported on stderr by number, and the exit status is then 1.")
    p.set_defaults(handler=_parse)
    for name, help_text, since in (("summary", "min/mean/max per series, events, energy per inference", "24h"),
                                   ("query", "time series rows", "1h"),
                                   ("export", "time series as CSV or JSON", "24h"),
                                   ("plot", "power, temperature, GPU load and inference rate to a PNG", "6h")):
        p = sub.add_parser(name, help=help_text)
        p.add_argument("--db", help="telemetry database (default: <state dir>/telemetry.db)")
        p.add_argument("--config", help="edged config file (for the state dir and retention)")
        p.add_argument("--since", default=since, help=f"window of device life back from the newest sample, "
                       f"unaffected by wall clock steps (default {since})")
        p.set_defaults(handler=_HANDLERS[name])
        if name in ("query", "export"):
            p.add_argument("--series", default="%", help="SQL LIKE pattern on series names, e.g. 'temp_c:%%'")
            p.add_argument("--table", choices=("raw", "rollup_1m", "rollup_1h"), help="default: finest")
    sub.choices["summary"].add_argument("--json", action="store_true", help="JSON instead of a table")
    fmt = sub.choices["export"].add_mutually_exclusive_group(required=True)
    fmt.add_argument("--csv", action="store_true")
    fmt.add_argument("--json", action="store_true")
    sub.choices["export"].add_argument("-o", "--output", help="file to write (default: stdout)")
    sub.choices["plot"].add_argument("-o", "--output", required=True,
                                   help="file to write: PNG, or SVG or PDF as its extension says")


def _parse(args: argparse.Namespace) -> int:
    from edged.telemetry.tegrastats import parse_tegrastats

    failed = 0
    if sys.stdin.isatty():  # run by hand: say what it waits for rather than sit there like a hang
        print("reading tegrastats lines from stdin (e.g. tegrastats | edged telemetry parse, or < capture.log); "
              "Ctrl-D ends", file=sys.stderr)
    # Bytes, decoded here: whatever the locale, a byte that is not UTF-8 is U+FFFD in its line, not a traceback.
    for number, raw in enumerate(sys.stdin.buffer, start=1):
        line = raw.decode("utf-8", errors="replace")
        if not line.strip():
            continue
        try:
            record = parse_tegrastats(line).to_json()
        except TelemetryParseError as e:
            failed += 1
            print(f"line {number}: {e}", file=sys.stderr)
            continue
        sys.stdout.write(json.dumps(record, separators=(",", ":")) + "\n")
    return 1 if failed else 0


def _reader(args: argparse.Namespace, needs_config: bool = True) -> TelemetryReader:
    """The database of ``--db``, else of the config. The summary needs no retention settings, so with ``--db``
    and no ``--config`` it skips reading the config (and importing the config package: a third of its time)."""
    if args.db and args.config is None and not needs_config:
        return TelemetryReader(args.db)
    from edged.config import load_config
    from edged.telemetry._paths import default_database_path

    config = load_config(args.config)
    return TelemetryReader(args.db or default_database_path(config.state_dir, config.telemetry.database),
                           config.telemetry)


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t).isoformat(timespec="seconds")


def _summary(args: argparse.Namespace) -> int:
    summary = _reader(args, needs_config=False).summary(parse_duration(args.since))
    if args.json:
        print(json.dumps(summary, indent=2, sort_keys=True))
        return 0
    if not summary["samples"] and not summary["series"]:
        print("no telemetry in the database yet")
        return 0
    # From the oldest data in the window, not the window's start: two hours of data under --since 24h. The
    # count of every sample (rolled up too) is the RAM series', which every sample has.
    count = max(summary["samples"], (summary["series"].get("ram_used_mb") or {}).get("n") or 0)
    print(f"{count} samples from {_iso(summary['first'])} to {_iso(summary['to'])}")
    print(f"{'series':<40} {'min':>10} {'mean':>10} {'max':>10}")
    for name, s in sorted(summary["series"].items()):
        print(f"{name:<40} {s['min']:>10.1f} {s['mean']:>10.1f} {s['max']:>10.1f}")
    for model, mj in sorted(summary["energy_per_inference_mj"].items()):
        print(f"energy per inference {model}: {mj:.2f} mJ")
    for kind, count in sorted(summary["events"].items()):
        print(f"events {kind}: {count}")
    return 0


def _query(args: argparse.Namespace) -> int:
    for p in _reader(args).points(parse_duration(args.since), args.series, args.table):
        print(f"{_iso(p.t)} {p.series} {p.mean:g} {p.min:g} {p.max:g}")
    return 0


def _write_export(out: TextIO, rows: list[dict[str, Any]], as_csv: bool) -> None:
    if as_csv:
        import csv

        writer = csv.DictWriter(out, fieldnames=["t", "time", "elapsed_s", "series", "mean", "min", "max"])
        writer.writeheader()
        writer.writerows(rows)
    else:
        json.dump(rows, out, separators=(",", ":"))
        out.write("\n")


def _export(args: argparse.Namespace) -> int:
    points = _reader(args).points(parse_duration(args.since), args.series, args.table)
    rows = [{"t": p.t, "time": _iso(p.t), "elapsed_s": p.elapsed, "series": p.series, "mean": p.mean,
             "min": p.min, "max": p.max} for p in points]
    if args.output:
        try:
            with open(args.output, "w", encoding="utf-8", newline="") as f:
                _write_export(f, rows, args.csv)
        except OSError as e:
            raise TelemetryError(output_error(args.output, e)) from e
    else:
        _write_export(sys.stdout, rows, args.csv)
    return 0


def _plot(args: argparse.Namespace) -> int:
    from edged.telemetry.plot import plot_history

    drawn = plot_history(_reader(args), parse_duration(args.since), args.output)
    print(f"wrote {args.output} ({drawn} points)")
    return 0


_HANDLERS = {"summary": _summary, "query": _query, "export": _export, "plot": _plot}
