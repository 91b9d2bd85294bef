"""``edged status``: is the daemon live and ready, which models are ready, the sockets' and gRPC's counters,
MQTT, memory and telemetry source.

Reads the health routes and ``/v2/edged/status``. Exits 0 when the daemon is ready, 1 when it answers but is
not ready (or on any error), so scripts can wait on it.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from typing import Any

from edged.cli._socket import add_client_options, client_from
from edged.client import ModelNotFoundError


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("status", help="the running daemon's health, models, MQTT, memory, telemetry",
                                   description="Show whether the daemon is live and ready, its models, MQTT, "
                                   "memory and telemetry source. Exits 0 when ready, 1 otherwise.")
    parser.add_argument("--json", action="store_true", help="print the status document as JSON")
    add_client_options(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    with client_from(args) as client:
        live = client.live()
        ready = client.ready()
        try:
            doc = client.status()
        except ModelNotFoundError:  # a daemon without edged's status route: report what Triton's API gives
            doc = {"models": client.repository_index()}
        socket_path = client.socket_path
    doc = {**doc, "live": live, "ready": ready}
    doc.setdefault("socket", socket_path)
    if args.json:
        json.dump(doc, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print("\n".join(describe(doc)))
    return 0 if ready else 1


def describe(doc: Mapping[str, Any]) -> list[str]:
    lines = [_row("daemon", _daemon(doc)),
             _row("server", f"live {_yes(doc.get('live'))}, ready {_yes(doc.get('ready'))}")]
    loop = doc.get("restart_loop")
    if isinstance(loop, dict):
        lines.append(_row("restarts", str(loop.get("message", "restarting in a loop"))))
    lines.extend(_models(doc.get("models", [])))
    if isinstance(doc.get("limits"), dict):
        lines.append(_row("sockets", _sockets(doc)))
    if isinstance(doc.get("grpc"), dict):
        lines.append(_row("grpc", _grpc(doc["grpc"])))
    lines.append(_row("mqtt", _mqtt(doc.get("mqtt"))))
    lines.append(_row("memory", _memory(doc.get("memory"))))
    lines.append(_row("telemetry", _telemetry(doc.get("telemetry"))))
    lines.extend(_health(doc.get("health")))
    return lines


def _row(label: str, text: str) -> str:
    return f"{label:<10} {text}"


def _yes(value: Any) -> str:
    return "yes" if value else "no"


def _daemon(doc: Mapping[str, Any]) -> str:
    parts = [f"edged {doc.get('version', '?')}"]
    if "pid" in doc:
        parts.append(f"pid {doc['pid']}")
    if "uptime_s" in doc:
        parts.append(f"up {float(doc['uptime_s']):.0f} s")
    parts.append(f"socket {doc.get('socket') or '?'}")
    if doc.get("http_port"):
        parts.append(f"http 127.0.0.1:{doc['http_port']}")
    for address in doc.get("grpc_listeners") or ():
        parts.append(f"grpc {address}")
    return ", ".join(parts)


def _models(models: Any) -> list[str]:
    if not isinstance(models, list) or not models:
        return [_row("models", "none")]
    ready = sum(1 for m in models if str(m.get("state", "")).upper() == "READY")
    lines = [_row("models", f"{ready} of {len(models)} ready")]
    for m in models:
        version = f" v{m['version']}" if m.get("version") else ""
        reason = f": {m['reason']}" if m.get("reason") else ""
        lines.append(_row("", f"{m.get('name', '?')}{version} {m.get('state', '?')}{reason}"))
    return lines


def _mqtt(mqtt: Any) -> str:
    if not isinstance(mqtt, dict) or mqtt.get("enabled") is False:
        return "disabled"
    broker = mqtt.get("broker")
    if mqtt.get("connected"):
        parts = ["connected" + (f" to {broker}" if broker else "")]
    else:  # what went wrong and that edged keeps trying: the technician's next step is the broker, not edged
        error = f"{mqtt['last_error']}; " if mqtt.get("last_error") else ""
        parts = ["disconnected" + (f" from {broker}" if broker else "")
                 + f" ({error}reconnecting, results wait in the outbox)"]
    outbox = mqtt.get("outbox")
    if isinstance(outbox, dict) and "depth" in outbox:
        parts.append(f"outbox {outbox['depth']} waiting")
    drops = mqtt.get("drops")
    if isinstance(drops, dict) and drops:
        parts.append("dropped " + " ".join(f"{reason} {count}" for reason, count in sorted(drops.items())))
    return ", ".join(parts)


def _memory(memory: Any) -> str:
    if not isinstance(memory, dict):
        return "-"
    budget = memory.get("budget_bytes")
    parts = [f"budget {_mib(budget)}" if budget else "no budget",
             f"pressure {_yes(memory.get('under_pressure'))}"]
    if memory.get("allocator"):
        parts.append(f"allocator {memory['allocator']}")
    return ", ".join(parts)


def _mib(value: Any) -> str:
    return f"{int(value) / (1 << 20):.0f} MiB"


def _telemetry(telemetry: Any) -> str:
    if not isinstance(telemetry, dict):
        return "-"
    reason = f" ({telemetry['reason']})" if telemetry.get("reason") else ""
    text = f"source {telemetry.get('source', '?')}{reason}"
    if telemetry.get("store_error"):  # the reason and what to do are on the telemetry_writer health line
        text += ", history NOT STORED"
    if telemetry.get("stale"):
        age = telemetry.get("last_sample_age_s")
        text += ", STALE (" + (f"last sample {float(age):.0f} s ago" if age is not None else "no sample yet") + ")"
    return text


def _health(health: Any) -> list[str]:
    """One line for the background threads, plus one per component that is not ok or has restarted."""
    if not isinstance(health, dict):
        return []
    components = health.get("components") or {}
    lines = [_row("health", str(health.get("state", "?")))]
    for name, c in sorted(components.items()):
        if c.get("state") != "ok" or c.get("restarts") or c.get("errors"):
            detail = f"{name} {c.get('state')}, {c.get('restarts', 0)} restarts, {c.get('errors', 0)} errors"
            reason = c.get("reason") or c.get("last_error")
            lines.append(_row("", detail + (f": {reason}" if reason else "")))
    return lines


def _grpc(grpc: Mapping[str, Any]) -> str:
    """The gRPC front end's counters (its listeners are on the daemon line)."""
    limit = f" of {grpc['max_connections']}" if "max_connections" in grpc else ""
    parts = [f"connections {grpc.get('connections', '?')}{limit}",
             f"stream in flight peak {grpc.get('stream_in_flight_peak', '?')} of "
             f"{grpc.get('stream_in_flight_limit', '?')}"]
    if grpc.get("connections_refused"):  # past max_connections: GOAWAY ENHANCE_YOUR_CALM
        parts.append(f"{grpc['connections_refused']} connections refused")
    holds = grpc.get("stream_holds")
    if holds:  # streams that stopped taking input: clients not reading their answers, or at the bound
        parts.append(f"streams held {holds} times")
    activated = grpc.get("activated") or []
    if activated:
        parts.append("socket-activated " + " ".join(str(address) for address in activated))
    return ", ".join(parts)


def _sockets(doc: Mapping[str, Any]) -> str:
    limits = doc["limits"]
    parts = [f"connections {doc.get('connections', '?')} of {limits.get('max_connections', '?')}",
             f"refused {limits.get('connections_refused', 0)}",
             f"bodies in flight {_mib(limits.get('inflight_body_bytes', 0))} of "
             f"{_mib(limits.get('inflight_body_limit_bytes', 0))}"]
    if limits.get("bodies_refused"):
        parts.append(f"bodies refused {limits['bodies_refused']}")
    return ", ".join(parts)
