"""``edged doctor``: what works and what does not on this device, each problem with the fix to apply.

Prints a table a technician can read (or JSON with ``--json``); exits 1 when a check fails (with
``--strict``, also on warnings).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import socket
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any

from edged.cli import _doctor_checks as checks
from edged.cli import _doctor_socket as sockets
from edged.cli._doctor_checks import Check
from edged.cli._doctor_genai import check_genai
from edged.cli._doctor_ota import check_ota
from edged.client import ClientError, EdgedClient
from edged.config import load_config, resolve_state_dir
from edged.errors import ConfigError

LABELS = {"ok": "OK", "warn": "WARN", "fail": "FAIL", "info": "INFO"}


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("doctor", help="check this device's setup and say how to fix problems",
                                   description=__doc__.splitlines()[0].replace("``", ""))
    parser.add_argument("--config", help="config file (default /etc/edged/edged.toml when it exists)")
    parser.add_argument("--socket", help="the daemon's socket (default: as every edged command finds it)")
    parser.add_argument("--root", default="/",
                        help="read the Jetson identification files and /proc (meminfo, pressure) under this root")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--strict", action="store_true", help="exit 1 on warnings too")
    parser.add_argument("--device-report", nargs="?", const="", metavar="FILE",
                        help="run the on-device validation (TensorRT vs ONNX Runtime, telemetry, memory, hardware "
                             "tests) and write FILE (default edged-device-report-HOST.json) and FILE.txt")
    parser.add_argument("--tests", type=Path, help="with --device-report: the tests/ of an edged source checkout, "
                                                   "to run its hardware tests")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    if args.device_report is not None:
        return device_report(args)
    results = collect(args, os.environ)
    if args.json:
        print(json.dumps([dataclasses.asdict(c) for c in results], indent=2))
    else:
        print(render(results))
    return exit_status(results, args.strict)


def device_report(args: argparse.Namespace) -> int:
    """Exit 1 when a step failed; skipped steps (no such hardware here) are not failures."""
    from edged.cli import _device_report as report

    target = Path(args.device_report or f"edged-device-report-{socket.gethostname()}.json")
    if target.suffix != ".json":
        raise ConfigError(f"--device-report: expected a .json file name, found {str(target)!r}")
    if args.tests is not None and not args.tests.is_dir():
        raise ConfigError(f"--tests: {args.tests} is not a directory")
    with tempfile.TemporaryDirectory(prefix="edged-device-report-") as scratch:
        steps = report.collect(Path(args.root), Path(scratch), args.tests)
    written, summary = report.write_report(steps, target)
    print(summary.read_text(), end="")
    print(f"\nwrote {written} and {summary}: send both back")
    return 1 if any(step.status == "failed" for step in steps) else 0


def exit_status(results: list[Check], strict: bool) -> int:
    failing = {"fail", "warn"} if strict else {"fail"}
    return 1 if any(c.status in failing for c in results) else 0


def collect(args: argparse.Namespace, env: Any) -> list[Check]:
    config = load_config(args.config)
    root = Path(args.root)
    jetson = checks.is_jetson(root)
    results = [*checks.check_platform(root), checks.check_tensorrt(jetson), checks.check_onnxruntime(jetson),
               check_genai(jetson), checks.check_torch(jetson), checks.check_allocator(config.memory),
               *checks.check_memory(config.memory, root / "proc"), checks.check_telemetry(config.telemetry, jetson)]
    path, found = socket_checks(args.socket, env)
    results.extend(found)
    if path is not None and found[-1].name == "daemon" and found[-1].status != "fail":  # something answers
        results.append(daemon_memory(path, config.memory.allocator))
        if config.mqtt.broker:
            results.append(daemon_outbox(path))
    results.extend(sockets.check_grpc(config.server))
    results.append(sockets.check_broker(config.mqtt.broker))
    results.append(checks.check_disk("state", config.state_dir or _default_state_dir(env)))
    results.append(checks.check_disk("models", config.models.repository))
    results.append(checks.check_service())
    results.extend(check_ota(config.ota))
    return results


def socket_checks(explicit: str | None, env: Any) -> tuple[str | None, list[Check]]:
    """The socket found (None if none) and its checks."""
    path, tried = sockets.find_socket(explicit, env)
    if path is None:
        return None, [Check("socket", "fail", "no socket at " + ", ".join(tried),
                            "start the daemon: sudo systemctl start edged (or `edged serve`), or pass --socket")]
    permissions = sockets.check_socket_permissions(path)
    if permissions.status == "fail":
        return path, [permissions]
    return path, [permissions, sockets.check_daemon(path)]


def daemon_memory(path: str, allocator: str) -> Check:
    """The memory block of the daemon's /v2/edged/status, judged against [memory] allocator."""
    try:
        with EdgedClient(path, timeout_s=sockets.PROBE_TIMEOUT_S) as client:
            block = client.status().get("memory")
    except ClientError as e:
        return Check("memory (daemon)", "info", f"the daemon did not report its memory: {e}")
    if not isinstance(block, dict):
        return Check("memory (daemon)", "info", "the daemon's /v2/edged/status has no memory block")
    return checks.check_daemon_memory(block, allocator)


def daemon_outbox(path: str) -> Check:
    """The MQTT outbox's disk as the daemon reports it: a full state directory stops results being stored."""
    try:
        with EdgedClient(path, timeout_s=sockets.PROBE_TIMEOUT_S) as client:
            block = client.status().get("mqtt")
    except ClientError as e:
        return Check("mqtt outbox disk", "info", f"the daemon did not report its MQTT outbox: {e}")
    outbox = block.get("outbox") if isinstance(block, dict) else None
    if not isinstance(outbox, dict):
        return Check("mqtt outbox disk", "info", "the daemon's /v2/edged/status has no mqtt outbox block")
    return checks.check_outbox_disk(outbox)


def _default_state_dir(env: Any) -> str:
    # A technician runs doctor outside the unit: the installed service's state is what matters then.
    if not env.get("STATE_DIRECTORY") and os.path.isdir("/var/lib/edged"):
        return "/var/lib/edged"
    return str(resolve_state_dir(None, env))


def render(results: list[Check], width: int = 100) -> str:
    name_width = max(len(c.name) for c in results)
    lines = []
    for check in results:
        head = f"{LABELS[check.status]:<5} {check.name:<{name_width}}  "
        body = textwrap.wrap(check.detail, max(40, width - len(head)), break_on_hyphens=False) or [""]
        lines.append(head + body[0])
        lines.extend(" " * len(head) + more for more in body[1:])
        if check.fix:
            lines.append(" " * len(head) + "fix: " + check.fix)
    problems = sum(c.status in ("fail", "warn") for c in results)
    lines.append("")
    lines.append("no problems found" if problems == 0 else f"{problems} problem(s): apply the fixes above")
    return "\n".join(lines)


if __name__ == "__main__":  # pragma: no cover
    from edged.cli.main import main

    sys.exit(main(["doctor", *sys.argv[1:]]))
