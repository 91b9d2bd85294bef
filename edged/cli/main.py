"""Entry point of the ``edged`` console script.

Each subcommand lives in its own module exposing ``register(subparsers)``; the module adds its parser and sets
``handler`` to a function ``(argparse.Namespace) -> int``. Modules are imported here by name so that a heavy
subcommand costs nothing to the others.
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
from collections.abc import Sequence

from edged import __version__
from edged.errors import EdgedError

# Subcommands: name → (module, one-line help). Only the chosen command's module is imported, so a quick
# command (``edged telemetry summary``) does not pay for numpy, the client or the engine.
COMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("edged.cli.serve", "run the daemon in the foreground"),
    "infer": ("edged.cli.infer", "run one inference through the daemon"),
    "models": ("edged.cli.models", "list, show, load, unload and validate models"),
    "status": ("edged.cli.status", "the daemon's state: models, MQTT, memory, telemetry"),
    "bench": ("edged.cli.bench", "measure throughput and latency over a transport"),
    "telemetry": ("edged.cli.telemetry", "tegrastats parsing and the telemetry history"),
    "top": ("edged.cli.top", "a live terminal view of the device and the models"),
    "doctor": ("edged.cli.doctor", "check the installation and say how to fix problems"),
    "build-engine": ("edged.cli.build_engine", "build a TensorRT engine from an ONNX model"),
    "ota": ("edged.cli.ota", "the daemon's updates: status, history, check, rollback, selftest"),
    "fleet": ("edged.cli.fleet", "the operator's signed model-update repository (TUF)"),
}


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser with every subcommand, or with only ``only`` fully built (the others listed by name)."""
    parser = argparse.ArgumentParser(
        prog="edged",
        description="Inference daemon for edge devices: Triton-style model repository, KServe v2 over a Unix "
        "socket, MQTT, telemetry.",
    )
    parser.add_argument("--version", action="version", version=f"edged {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module_name, summary) in COMMANDS.items():
        if only is not None and name != only:
            subparsers.add_parser(name, help=summary, add_help=False)
            continue
        importlib.import_module(module_name).register(subparsers)
    _describe(parser)
    return parser


def _subcommands(parser: argparse.ArgumentParser) -> list[argparse._SubParsersAction[argparse.ArgumentParser]]:
    return [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]


def _describe(parser: argparse.ArgumentParser) -> None:
    """A subcommand registered with only a one-line ``help`` gets it as its ``--help`` description too, so that
    ``edged telemetry parse --help`` says what the command does, not only its usage line."""
    for action in _subcommands(parser):
        helps = {choice.dest: choice.help for choice in action._choices_actions}
        for name, sub in action.choices.items():
            if sub.description is None and helps.get(name):
                sub.description = str(helps[name])
            _describe(sub)


def _innermost(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The subcommand's parser that ``args`` reached (``edged telemetry summary``), for its usage and errors."""
    for action in _subcommands(parser):
        chosen = getattr(args, action.dest, None)
        if chosen in action.choices:
            return _innermost(action.choices[chosen], args)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return _run(argv)
    except BrokenPipeError:
        # The reader of our output went away (`edged telemetry query | head`): not an error to report with a
        # traceback. stdout goes to /dev/null so the interpreter's last flush at exit cannot raise it again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 128 + signal.SIGPIPE


def _run(argv: Sequence[str] | None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    chosen = next((word for word in words if not word.startswith("-")), None)
    parser = build_parser(only=chosen if chosen in COMMANDS else "")
    args, extra = parser.parse_known_args(words)
    if extra:  # refused by the subcommand that was given them, with its usage: not by the top-level parser
        _innermost(parser, args).error(f"unrecognized arguments: {' '.join(extra)}")
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return 2
    try:
        code: int = handler(args)
        sys.stdout.flush()  # a reader gone away is seen here, inside main, and not at the interpreter's exit
    except EdgedError as e:
        print(f"edged {args.command}: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
