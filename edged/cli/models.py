"""``edged models``: the daemon's model repository: list (the default), show, load, unload (and validate, a
file check that needs no daemon, registered from ``edged.cli.models_validate`` when that module is present)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from edged.cli._args import read_json_argument
from edged.cli._socket import add_client_options, client_from
from edged.client import ClientTimeout
from edged.errors import ConfigError


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("models", help="list, show, load and unload the daemon's models",
                                   description="The daemon's model repository: list (the default), show, load, "
                                   "unload; validate checks model files without a daemon.")
    add_client_options(parser)
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.set_defaults(handler=list_models)
    actions = parser.add_subparsers(dest="action", metavar="ACTION")
    listing = actions.add_parser("list", help="the repository index: every model with its state and reason")
    _leaf_options(listing)
    listing.set_defaults(handler=list_models)
    show = actions.add_parser("show", help="a model's metadata, config and readiness")
    show.add_argument("model")
    show.add_argument("--version", default="")
    _leaf_options(show)
    show.set_defaults(handler=show_model)
    load = actions.add_parser("load", help="load (or reload) a model")
    load.add_argument("model")
    load.add_argument("--config", default=None, metavar="JSON|@FILE",
                      help="override config as Triton's JSON model config, inline or @file.json")
    _leaf_options(load)
    load.set_defaults(handler=load_model)
    unload = actions.add_parser("unload", help="unload a model")
    unload.add_argument("model")
    _leaf_options(unload)
    unload.set_defaults(handler=unload_model)
    try:
        from edged.cli.models_validate import register_validate
    except ImportError:
        return  # not built in this tree
    register_validate(actions)


def _leaf_options(parser: argparse.ArgumentParser) -> None:
    # SUPPRESS keeps `edged models --json list` working: a leaf only sets what it was given.
    parser.add_argument("--socket", metavar="PATH", default=argparse.SUPPRESS, help="the daemon's Unix socket")
    parser.add_argument("--timeout", metavar="SECONDS", type=float, default=argparse.SUPPRESS)
    parser.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="print JSON")


def list_models(args: argparse.Namespace) -> int:
    with client_from(args) as client:
        index = client.repository_index()
    if args.json:
        _print_json(index)
        return 0
    rows = [(str(m.get("name", "")), str(m.get("version", "")), str(m.get("state", "")),
             str(m.get("reason", ""))) for m in index]
    print(_table(("MODEL", "VERSION", "STATE", "REASON"), rows) if rows else "no models in the repository")
    return 0


def show_model(args: argparse.Namespace) -> int:
    with client_from(args) as client:
        ready = client.model_ready(args.model, args.version)
        metadata = client.model_metadata(args.model, args.version)
        config = client.model_config(args.model, args.version)
    if args.json:
        _print_json({"ready": ready, "metadata": metadata, "config": config})
        return 0
    print(f"model     {metadata.get('name', args.model)}")
    print(f"versions  {', '.join(str(v) for v in metadata.get('versions', [])) or '-'}")
    print(f"platform  {metadata.get('platform', config.get('platform', '')) or config.get('backend', '-')}")
    print(f"ready     {'yes' if ready else 'no'}")
    print(f"max batch {config.get('max_batch_size', 0)}")
    rows = [(kind[:-1], str(t.get("name", "")), str(t.get("datatype", "")), str(t.get("shape", "")))
            for kind in ("inputs", "outputs") for t in metadata.get(kind, [])]
    print(_table(("TENSOR", "NAME", "DATATYPE", "SHAPE"), rows))
    return 0


def load_model(args: argparse.Namespace) -> int:
    config = _read_config(args.config) if args.config else None
    with client_from(args) as client:
        try:
            client.load(args.model, config)
        except ClientTimeout as e:  # the daemon does not give up on the load when this client stops waiting
            raise ClientTimeout(f"{e}; the daemon may still be loading it (a TensorRT engine can take minutes): "
                                "follow it with `edged models list`, or wait longer with --timeout SECONDS") from e
        ready = client.model_ready(args.model)
    print(f"{args.model}: loaded" + ("" if ready else " (not ready yet)"))
    return 0


def unload_model(args: argparse.Namespace) -> int:
    with client_from(args) as client:
        client.unload(args.model)
    print(f"{args.model}: unloaded")
    return 0


def _read_config(value: str) -> dict[str, Any]:
    doc = read_json_argument("--config", value, "a Triton model config as JSON")
    if not isinstance(doc, dict):
        raise ConfigError(f"--config: expected a JSON object, found {type(doc).__name__}")
    return doc


def _table(header: tuple[str, ...], rows: Sequence[tuple[str, ...]]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
             for row in [header, *rows]]
    return "\n".join(lines)


def _print_json(doc: Any) -> None:
    json.dump(doc, sys.stdout, indent=2)
    sys.stdout.write("\n")
