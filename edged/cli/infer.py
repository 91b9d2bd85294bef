"""``edged infer``: one inference through the running daemon, inputs from .npy files or JSON.

Each ``--input NAME=VALUE`` names a model input; VALUE is a ``.npy`` file, ``@file.json``, or a JSON list
given inline. JSON values take their datatype from the model's metadata; a value missing only the batch
dimension gets a batch of one. Outputs go to stdout as JSON, or to ``--output-dir`` as .json or .npy files.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
from pathlib import Path
from typing import Any

import numpy as np

from edged.cli._args import read_json_argument
from edged.cli._socket import add_client_options, client_from
from edged.client import InferResult
from edged.errors import ConfigError
from edged.protocol import KSERVE_TO_NUMPY

Array = np.ndarray[Any, Any]

# what a tensor name looks like, as opposed to the start of a JSON list or of a file path
_INPUT_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.:-]*")


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("infer", help="run one inference through the daemon",
                                   description="Run one inference through the running daemon. Inputs are .npy "
                                   "files, @file.json or inline JSON lists; JSON takes its datatype from the "
                                   "model's metadata, and a value missing only the batch dimension gets a batch "
                                   "of one.")
    parser.add_argument("model", help="model name")
    parser.add_argument("--input", "-i", dest="inputs", action="append", required=True, metavar="NAME=VALUE",
                        help="an input: NAME=FILE.npy, NAME=@FILE.json or NAME='[[...]]' (repeat per input; "
                        "NAME= may be left out when the model has one input)")
    parser.add_argument("--output", "-o", dest="outputs", action="append", default=None, metavar="NAME",
                        help="request only this output (repeatable; default: all)")
    parser.add_argument("--version", default="", help="model version (default: the server's policy)")
    parser.add_argument("--output-format", choices=("json", "npy"), default="json",
                        help="json (default) or npy; npy writes NAME.npy files into --output-dir (default .)")
    parser.add_argument("--output-dir", type=Path, default=None, metavar="DIR",
                        help="write each output to DIR/NAME.json or DIR/NAME.npy instead of stdout")
    parser.add_argument("--json-transport", action="store_true",
                        help="send and receive tensors as JSON instead of the binary-data extension")
    parser.add_argument("--shm", action="store_true",
                        help="pass the inputs (and the outputs whose size the model fixes) through a system "
                        "shared-memory region instead of the HTTP body; the daemon must be able to open it "
                        "(same user, or in this user's group)")
    parser.add_argument("--request-id", default="", help="id echoed in the response")
    add_client_options(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    with client_from(args) as client:
        metadata = client.model_metadata(args.model, args.version)
        inputs = read_inputs(args.inputs, metadata)
        if args.shm:
            from edged.cli._infer_shm import infer_through_shm

            result = infer_through_shm(client, args.model, inputs, metadata, args.outputs, args.version,
                                       args.request_id)
        else:
            result = client.infer(args.model, inputs, args.outputs, args.version, binary=not args.json_transport,
                                  request_id=args.request_id)
    write_result(result, args.output_format, args.output_dir)
    return 0


# --- inputs ------------------------------------------------------------------------------------------------
def read_inputs(specs: list[str], metadata: dict[str, Any]) -> dict[str, Array]:
    declared = {str(entry["name"]): entry for entry in metadata.get("inputs", []) if isinstance(entry, dict)}
    inputs: dict[str, Array] = {}
    for spec in specs:
        name, value = _split(spec, declared)
        if name in inputs:
            raise ConfigError(f"--input {name} is given twice")
        entry = declared.get(name)
        if entry is None:
            raise ConfigError(f"model {metadata.get('name', '?')!r} has no input {name!r}; its inputs are "
                              f"{sorted(declared)}")
        inputs[name] = fit_to_model(_load_value(name, value, str(entry.get("datatype", ""))), entry)
    return inputs


def _split(spec: str, declared: dict[str, Any]) -> tuple[str, str]:
    name, sep, value = spec.partition("=")
    if sep and name in declared:
        return name, value
    if len(declared) == 1:
        # NAME= may be left out, but a name that is not the input's is a typo, not part of the value (unless the
        # whole argument names an existing file)
        if sep and _INPUT_NAME.fullmatch(name) and not os.path.exists(spec):
            raise ConfigError(f"--input {spec!r}: the model has no input {name!r}; its input is "
                              f"{next(iter(declared))!r} (NAME= may also be left out)")
        return next(iter(declared)), spec
    if not sep:
        raise ConfigError(f"--input {spec!r}: expected NAME=VALUE; the model's inputs are {sorted(declared)}")
    return name, value


_NPY_MAGIC = b"\x93NUMPY"


def _load_value(name: str, value: str, datatype: str) -> Array:
    if value.endswith(".npy"):
        try:
            with open(value, "rb") as f:
                # Without NumPy's magic bytes np.load takes the file for a pickle and says so, and how to load
                # it unsafely: wrong, and the wrong advice.
                if f.read(len(_NPY_MAGIC)) != _NPY_MAGIC:
                    raise ConfigError(f"--input {name}: {value} is not a .npy file (it does not start with "
                                      "NumPy's header); write it with numpy.save, or pass @file.json")
                f.seek(0)
                loaded: Array = np.load(f, allow_pickle=False)
        except OSError as e:
            raise ConfigError(f"--input {name}: cannot read {value}: {e.strerror or e}") from e
        except ValueError as e:
            raise ConfigError(f"--input {name}: cannot read {value}: {e}") from e
        return loaded
    data = read_json_argument(f"--input {name}", value, "a .npy file, @file.json or a JSON list")
    dtype = KSERVE_TO_NUMPY.get(datatype)
    if dtype is None:
        raise ConfigError(f"--input {name}: the model's datatype {datatype!r} cannot be read from JSON")
    try:
        return np.asarray(data, dtype=dtype)
    except RecursionError:
        raise ConfigError(f"--input {name}: JSON value nested too deeply for an array of {datatype}") from None
    except (ValueError, TypeError, OverflowError) as e:
        raise ConfigError(f"--input {name}: JSON value is not a regular array of {datatype}: {e}") from e


def fit_to_model(array: Array, entry: dict[str, Any]) -> Array:
    """Cast to the input's datatype where that loses no kind, and add a missing batch dimension of one."""
    dtype = KSERVE_TO_NUMPY.get(str(entry.get("datatype", "")))
    if dtype is not None and array.dtype != dtype and dtype.kind != "O" \
            and np.can_cast(array.dtype, dtype, "same_kind"):
        array = array.astype(dtype)
    shape = [int(d) for d in entry.get("shape", [])]
    if not shape or array.ndim == len(shape):
        return array
    if array.ndim == len(shape) - 1 and shape[0] == -1:
        return array[np.newaxis, ...]
    if shape.count(-1) <= 1 and all(d != 0 for d in shape):
        known = math.prod(d for d in shape if d > 0)
        if known and array.size % known == 0:
            return array.reshape(shape)
    return array  # the daemon explains the mismatch


# --- outputs -----------------------------------------------------------------------------------------------
def write_result(result: InferResult, output_format: str, output_dir: Path | None) -> None:
    if output_format == "npy" or output_dir is not None:
        directory = output_dir or Path(".")
        try:
            directory.mkdir(parents=True, exist_ok=True)
            for name, array in result.outputs.items():
                path = directory / f"{_output_file_stem(name)}.{output_format}"
                if output_format == "npy":
                    np.save(path, array, allow_pickle=False)
                else:
                    path.write_text(json.dumps(_output_doc(name, array, result)) + "\n")
                print(path)
        except OSError as e:
            raise ConfigError(f"--output-dir {directory}: cannot write the outputs there ({e.strerror or e}); "
                              "name a folder you can write to") from e
        return
    doc = {"model_name": result.model_name, "model_version": result.model_version,
           "outputs": [_output_doc(name, array, result) for name, array in result.outputs.items()]}
    if result.id:
        doc["id"] = result.id
    json.dump(doc, sys.stdout)
    sys.stdout.write("\n")


_UNSAFE_IN_FILE_NAMES = str.maketrans({c: f"%{ord(c):02X}" for c in "%/\\\0"})


def _output_file_stem(name: str) -> str:
    """The file name (less its suffix) an output is written to: the output's name with '%', '/', '\\' and NUL
    percent-encoded, so that a name from the model ('dense/BiasAdd:0', '../x', '/abs') is one file inside
    --output-dir, and two names never share a file."""
    return name.translate(_UNSAFE_IN_FILE_NAMES)


def _output_doc(name: str, array: Array, result: InferResult) -> dict[str, Any]:
    datatype = next((str(o.get("datatype")) for o in result.doc.get("outputs", []) if o.get("name") == name), "")
    data = [x.decode("utf-8", "replace") if isinstance(x, bytes) else x for x in array.ravel().tolist()]
    return {"name": name, "datatype": datatype, "shape": list(array.shape), "data": data}
