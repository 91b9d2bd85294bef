"""Entry point of the ``edged`` console script.

Each subcommand lives in its own module exposing ``register(subparsers)``; the module adds its parser and sets
``handler`` to a function ``(argparse.Namespace) -> int``. Modules are imported here by name so that a heavy
subcommand costs nothing to the others.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from edged import __version__
from edged.errors import EdgedError

# Subcommand modules, in the order ``edged --help`` lists them.
SUBCOMMAND_MODULES: tuple[str, ...] = (
    "edged.cli.serve",
    "edged.cli.infer",
    "edged.cli.models",
    "edged.cli.status",
    "edged.cli.bench",
    "edged.cli.telemetry",
    "edged.cli.top",
    "edged.cli.doctor",
    "edged.cli.build_engine",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="edged",
        description="Inference daemon for edge devices: Triton-style model repository, KServe v2 over a Unix "
        "socket, MQTT, telemetry.",
    )
    parser.add_argument("--version", action="version", version=f"edged {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module_name in SUBCOMMAND_MODULES:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as e:
            if e.name != module_name:
                raise
            continue  # a subcommand not built yet in this tree
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return 2
    try:
        code: int = handler(args)
    except EdgedError as e:
        print(f"edged {args.command}: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
