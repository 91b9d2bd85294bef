"""``edged bench``: throughput and latency percentiles over a transport, next to raw onnxruntime."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from pathlib import Path
from typing import Any


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "bench", help="measure throughput and latency over a transport",
        description="Measure throughput and p50/p99/p999 latency at chosen concurrency levels. The inproc "
        "transport runs the engine in this process beside a raw onnxruntime session.run loop on the same model; "
        "uds and http measure a daemon from a separate client process; mqtt goes through a broker; openai "
        "measures a generative model through /v1/chat/completions as GenAI-Perf does (TTFT, ITL, output tokens/s). "
        "Scenarios come from flags or from a TOML file of [[scenario]] tables (the same keys as the flags; openai "
        "adds prompt_tokens, output_tokens and stream).")
    parser.add_argument("--scenarios", type=Path, metavar="FILE", help="TOML file with [[scenario]] tables")
    parser.add_argument("--model", help="default: tiny_llama for --transport openai, tiny_mlp otherwise")
    parser.add_argument("--transport", choices=("inproc", "uds", "http", "mqtt", "openai"), default="inproc",
                        help="openai: a generative model through POST /v1/chat/completions (over the socket, or "
                        "loopback TCP with --http-port), reported as GenAI-Perf does: TTFT and ITL p50/p99, "
                        "output tokens/s, requests/s")
    parser.add_argument("--concurrency", default="1", help="comma-separated levels, e.g. 1,4,16")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per measurement")
    parser.add_argument("--batching", choices=("config", "on", "off", "both"), default="config",
                        help="inproc: run with dynamic batching as configured, forced on, off, or both")
    parser.add_argument("--no-raw", action="store_true", help="inproc: skip the raw onnxruntime comparison; "
                        "openai: skip the in-process ORT GenAI generator loop")
    parser.add_argument("--client", choices=("callbacks", "threads", "asyncio"), default="callbacks",
                        help="inproc: how the concurrency is kept: completion callbacks that submit the next "
                        "request (InferenceService.submit, as perf_analyzer --async; measures the engine), threads "
                        "calling the blocking infer(), or coroutines awaiting infer_async() on one event loop")
    parser.add_argument("--model-repository", type=Path, help="repository for inproc and --spawn "
                        "(default: the bundled sample models)")
    parser.add_argument("--socket", help="uds: the daemon's socket (default: found as the other commands do)")
    parser.add_argument("--http-port", type=int, help="http: the daemon's loopback port")
    parser.add_argument("--spawn", action="store_true", help="start a private daemon for uds/http scenarios")
    parser.add_argument("--shm", action="store_true", help="uds: inputs and outputs through system shared memory "
                        "(a region per connection; the input is copied in before every request)")
    parser.add_argument("--prompt-tokens", type=int, help="openai: prompt length in tokens (default 32)")
    parser.add_argument("--output-tokens", type=int, help="openai: max_tokens of each request (default 32)")
    parser.add_argument("--stream", action=argparse.BooleanOptionalAction, default=None,
                        help="openai: stream with server-sent events (default) or wait for whole answers")
    parser.add_argument("--json", type=Path, metavar="FILE", help="also write the results as JSON")
    parser.set_defaults(handler=run)


def _scenarios(args: argparse.Namespace) -> list[Any]:
    from edged.bench import Scenario, load_scenarios
    from edged.bench._scenario import check
    from edged.errors import ConfigError

    if args.scenarios:
        return load_scenarios(args.scenarios)
    try:
        levels = tuple(int(level) for level in args.concurrency.split(","))
    except ValueError:
        raise ConfigError(f"--concurrency: expected comma-separated integers, found {args.concurrency!r}") from None
    model = args.model or ("tiny_llama" if args.transport == "openai" else "tiny_mlp")
    scenario = Scenario(model=model, transport=args.transport, concurrency=levels, batch=args.batch,
                        duration_s=args.duration, batching=args.batching, compare_raw=not args.no_raw,
                        client=args.client, shm=args.shm, prompt_tokens=args.prompt_tokens,
                        output_tokens=args.output_tokens, stream=args.stream)
    check(scenario)
    return [scenario]


def run(args: argparse.Namespace) -> int:
    from edged.bench import report, run_all, spawned_daemon
    from edged.daemon.paths import bundled_models

    scenarios = _scenarios(args)
    if args.json:
        _check_writable(args.json)  # before the run: minutes of measurement must not end in a lost result
    repository = args.model_repository or bundled_models()
    needs_daemon = any(s.transport in ("uds", "http", "openai") for s in scenarios)

    def progress(message: str) -> None:
        print(f"edged bench: {message}", file=sys.stderr, flush=True)

    with contextlib.ExitStack() as stack:
        target = None
        if needs_daemon and args.spawn:
            progress("starting a private daemon")
            target = stack.enter_context(spawned_daemon(repository, args.http_port))
        elif needs_daemon:
            # http scenarios use the port alone, openai ones too when it is named: only uds needs the socket
            needs_socket = any(s.transport == "uds" or (s.transport == "openai" and not args.http_port)
                               for s in scenarios)
            socket = args.socket or (_discover_socket() if needs_socket else None)
            target = {"unix": socket, "port": args.http_port}
        results = run_all(scenarios, repository, target, progress)
    print(report(results))
    if args.json:
        try:
            args.json.write_text(json.dumps([r.as_json() for r in results], indent=2) + "\n", encoding="utf-8")
        except OSError as e:
            raise _json_error(args.json, e) from e
    return 0


def _json_error(path: Path, error: OSError) -> Exception:
    from edged.errors import ConfigError

    return ConfigError(f"--json {path}: cannot write there ({error.strerror or error}); name a file in a folder "
                       "that exists and that you may write")


def _check_writable(path: Path) -> None:
    if path.is_dir():
        raise _json_error(path, IsADirectoryError(21, "Is a directory"))
    folder = path.parent
    if not folder.is_dir():
        raise _json_error(path, FileNotFoundError(2, f"no folder {folder}"))
    if not os.access(folder, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise _json_error(path, PermissionError(13, "Permission denied"))


def _discover_socket() -> str:
    from edged.client._discovery import find_sockets

    search = find_sockets(None)
    if not search.existing:
        raise search.unreachable("no socket file exists; or pass --spawn to start a private daemon")
    return search.existing[0]
