"""``edged serve``: the daemon in the foreground."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from edged.config import load_config, with_overrides
from edged.errors import ConfigKeyError


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "serve", help="run the daemon in the foreground",
        description="Run the inference daemon in the foreground. With no arguments it serves the bundled sample "
        "models on a user-writable Unix socket, with no MQTT broker. Flags override the config file "
        "(default /etc/edged/edged.toml when it exists); the config file overrides built-in defaults.")
    parser.add_argument("--config", metavar="FILE", help="TOML config file (default: /etc/edged/edged.toml if present)")
    parser.add_argument("--model-repository", metavar="DIR", help="Triton-style model repository")
    parser.add_argument("--socket", metavar="PATH", help="Unix socket path (default: $RUNTIME_DIRECTORY/edged.sock, "
                        "$XDG_RUNTIME_DIR/edged/edged.sock or /tmp/edged-$UID/edged.sock)")
    parser.add_argument("--http-port", type=int, metavar="N",
                        help="also listen on loopback TCP port N (for tritonclient, perf_analyzer)")
    parser.add_argument("--grpc-port", type=int, metavar="N",
                        help="also serve KServe v2 gRPC (Triton's GRPCInferenceService) on loopback TCP port N")
    parser.add_argument("--grpc-socket", metavar="PATH",
                        help="also serve KServe v2 gRPC on this Unix socket (unix://PATH for tritonclient)")
    parser.add_argument("--mqtt-broker", metavar="URL", help="MQTT broker, mqtt://host:port or mqtts://host:port")
    parser.add_argument("--device-id", metavar="ID",
                        help="device id in MQTT topics (default: derived from /etc/machine-id, else the host name)")
    parser.add_argument("--state-dir", metavar="DIR", help="where SQLite databases and the outbox live")
    parser.add_argument("--model-control-mode", choices=("none", "explicit", "poll"),
                        help="as Triton's: none (load all, no API changes), explicit (load/unload API), "
                        "poll (rescan the repository)")
    parser.add_argument("--log-level", choices=("debug", "info", "warning", "error"))
    parser.set_defaults(handler=run)


FLAG_KEYS: dict[str, str] = {
    "model_repository": "models.repository",
    "socket": "server.socket",
    "http_port": "server.http_port",
    "grpc_port": "server.grpc_port",
    "grpc_socket": "server.grpc_socket",
    "mqtt_broker": "mqtt.broker",
    "device_id": "mqtt.device_id",
    "state_dir": "state_dir",
    "model_control_mode": "models.control_mode",
    "log_level": "logging.level",
}


def run(args: argparse.Namespace) -> int:
    config = loaded = load_config(args.config)
    overrides = {key: getattr(args, flag) for flag, key in FLAG_KEYS.items() if getattr(args, flag) is not None}
    if overrides:
        config = with_overrides(config, overrides)
    # The allocator comes first: it may re-execute the process before any thread or heavy import exists.
    from edged.memory import ensure_allocator
    ensure_allocator(config.memory, list(getattr(sys, "orig_argv", sys.argv)))
    from edged.daemon._logging import configure_logging
    configure_logging(config.logging.level, config.logging.format)
    from edged.daemon.app import run_daemon
    try:
        return run_daemon(config, loaded)
    except ConfigKeyError as e:  # a part refused a value: say where it came from, the file or a flag
        if e.where is not None:
            raise
        raise e.located(origin_of(e.key, overrides, config.source)) from e


def origin_of(key: str, overrides: dict[str, object], source: str | None) -> str | None:
    """The flag that set ``key`` (``--state-dir``), else the config file it was read from (None: a default)."""
    for flag, dotted in FLAG_KEYS.items():
        if dotted == key and dotted in overrides:
            return "--" + flag.replace("_", "-")
    return source
