"""``edged models validate PATH [--json]``: check a model folder or a config.pbtxt offline.

Parses the config, auto-completes it from the model file where the runtime can describe one (ONNX, read with
onnxruntime through the ONNX backend, imported only here and only when needed; a generative folder is checked
by cli/_validate_genai.py), and prints Triton's JSON
model-config; without --json, also a summary of fields kept but not applied, and warnings. Errors are printed
as ``file:line:column: message`` and the exit status is 1. What the daemon cannot load is an error here too: no
version folder to serve, a version without its model file, a backend edged does not serve (``--config`` names the
edged.toml whose ``[models] backends`` adds backends and whose limits apply).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edged.cli._validate_genai import GENAI_RUNTIME, describe_generative
from edged.config import EdgedConfig, load_config
from edged.errors import EdgedError, ModelConfigError, ModelLoadError
from edged.repository import (
    BUILTIN_BACKENDS,
    CONFIG_FILENAME,
    MAX_CONFIG_BYTES,
    autocomplete,
    check_batching,
    check_config_files,
    check_io_and_groups,
    check_platform_backend,
    check_reshapes,
    check_supported,
    check_tensor_types,
    check_warmup,
    list_versions,
    load_model_config,
    missing_versions,
    model_config_to_json,
    normalize,
    parse_model_config,
    resolve_runtime,
    select_versions,
    unknown_fields,
)
from edged.repository.model_config import BACKEND_DEFAULT_FILENAME, ModelConfig, ModelSignature


@dataclass
class Report:
    config: dict[str, Any]
    kept: list[str]
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # facts worth knowing, such as a model's memory


def register_validate(models_subparsers: Any) -> None:
    parser = models_subparsers.add_parser(
        "validate", help="check a model folder or config.pbtxt and print Triton's JSON model config",
        description="Parse a model's config.pbtxt, auto-complete it from the model file where possible, and "
        "print the model config as Triton's GET /v2/models/{m}/config would.")
    parser.add_argument("path", type=Path, metavar="PATH", help="a model folder, or its config.pbtxt")
    parser.add_argument("--json", action="store_true", help="print only the JSON model config")
    parser.add_argument("--config", type=Path, metavar="FILE",
                        help="the daemon's edged.toml: its [models] backends and [server] limits apply")
    parser.set_defaults(handler=validate)


def validate(args: argparse.Namespace) -> int:
    try:
        settings = load_config(args.config) if args.config is not None else EdgedConfig()
        report = validate_path(Path(args.path), backends=(*BUILTIN_BACKENDS, *settings.models.backends),
                               max_elements=settings.server.max_tensor_elements)
    except EdgedError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(json.dumps(report.config, indent=2))
    if not args.json:
        for name in report.kept:
            print(f"note: field '{name}' is kept and reported but not applied by edged")
        for note in report.notes:
            print(f"note: {note}")
        for warning in report.warnings:
            print(f"warning: {warning}")
        print(f"ok: model '{report.config['name']}' is valid")
    return 0


def validate_path(path: Path, backends: Collection[str] = BUILTIN_BACKENDS,
                  max_elements: int = EdgedConfig().server.max_tensor_elements) -> Report:
    model_dir = path.parent if path.is_file() or path.name == CONFIG_FILENAME else path
    if not model_dir.is_dir():
        raise ModelConfigError(f"expected a model folder or its {CONFIG_FILENAME}, found nothing there",
                               str(path))
    warnings: list[str] = []
    notes: list[str] = []
    config = _read_file(path, warnings) if path.is_file() else load_model_config(model_dir)
    config_path = str(path if path.is_file() else model_dir / CONFIG_FILENAME)
    if config is not None:  # the checks a load makes of the config alone, in the same words
        check_platform_backend(config, config_path, backends=backends)
        check_supported(config, config_path)
        if config.backend and config.backend not in BUILTIN_BACKENDS:
            warnings.append(f"backend '{config.backend}' is not one of edged's ({', '.join(BUILTIN_BACKENDS)}); "
                            "the --config file's [models] backends names it")
    versions = list_versions(model_dir)
    if not versions and config is not None:  # the daemon's words (a folder without config is refused below)
        raise ModelLoadError(f"model {model_dir.name}: no numbered version folder in {model_dir}; put the model "
                             f"file in {model_dir / '1'}")
    chosen = select_versions(config.version_policy, versions) if config is not None else versions[-1:]
    if config is not None and (missing := missing_versions(config.version_policy, versions)):
        warnings.append(f"version policy names versions {missing}, which are not present")
    if config is not None and not chosen:
        raise ModelLoadError(f"model {model_dir.name}: no version to serve in {model_dir} (found versions: "
                             f"{versions}; version_policy {config.version_policy.kind})")
    config, runtime = resolve_runtime(config, model_dir, chosen)
    if config is not None and runtime is None:
        raise ModelLoadError(f"model {model_dir.name}: no config.pbtxt platform/backend and no model file edged "
                             f"recognises in {model_dir} (model.onnx, model.plan, model.pt, model.pt2)")
    if config is not None:  # before any model file is read: the daemon refuses the same names
        check_config_files(config, model_dir, chosen)
    completed = _complete(config, model_dir, chosen, runtime, warnings, notes)
    check_tensor_types(completed, config_path)
    check_reshapes(completed, config_path)
    check_io_and_groups(completed, config_path)
    check_batching(completed, config_path)
    check_warmup(completed, config_path, max_elements)
    return Report(model_config_to_json(completed), unknown_fields(completed), warnings, notes)


def _read_file(path: Path, warnings: list[str]) -> ModelConfig:
    try:
        with path.open("rb") as file:  # a regular file (validate_path checked): no FIFO to block on
            raw = file.read(MAX_CONFIG_BYTES + 1)
        if len(raw) > MAX_CONFIG_BYTES:
            raise ModelConfigError(f"the model config is larger than the limit of {MAX_CONFIG_BYTES} bytes (the "
                                   "daemon refuses it too)", str(path))
        text = raw.decode("utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ModelConfigError(f"cannot read the model config as UTF-8 text: {e}", str(path)) from e
    config = parse_model_config(text, str(path), default_name=path.parent.name)
    if config.name != path.parent.name:
        warnings.append(f"the config names the model '{config.name}' but its folder is "
                        f"'{path.parent.name}'; the daemon refuses to load it there")
    return config


def _complete(config: ModelConfig | None, model_dir: Path, versions: list[int], runtime: str | None,
              warnings: list[str], notes: list[str]) -> ModelConfig:
    if runtime is None:  # with a config, refused by validate_path in the daemon's words
        raise ModelConfigError("no config.pbtxt and no model file (model.onnx, model.plan, model.pt, "
                               "model.pt2) in any version folder", str(model_dir))
    filename = config.model_filename if config is not None else _default_filename(runtime)
    model_file = _model_file(model_dir, versions, runtime, filename, config)
    if runtime == GENAI_RUNTIME and model_file is not None:
        signature: ModelSignature | None = describe_generative(model_file.parent, model_dir.name, config, warnings,
                                                                    notes)
    else:
        signature = _describe(runtime, model_file, warnings) if model_file is not None else None
    if signature is None:
        if config is None:
            raise ModelConfigError(f"no config.pbtxt, and the {runtime} model file cannot be described here "
                                   "to auto-complete one", str(model_dir))
        return normalize(config)
    return autocomplete(config, model_dir.name, signature, runtime)


def _model_file(model_dir: Path, versions: list[int], runtime: str, filename: str,
                config: ModelConfig | None) -> Path | None:
    """The newest served version's model file; a served version without one is an error, as its load fails (a
    custom backend's files are its own: not checked)."""
    names = [filename]
    if runtime == "pytorch" and (config is None or not config.default_model_filename):
        names.append("model.pt2")  # the daemon serves a torch.export program where there is no model.pt
    found: Path | None = None
    for version in versions:
        path = next((model_dir / str(version) / n for n in names if (model_dir / str(version) / n).exists()), None)
        if path is None and runtime in BUILTIN_BACKENDS:
            raise ModelLoadError(f"model {model_dir.name}: version {version} has no model file {filename} (expected "
                                 f"{model_dir / str(version) / filename}); the daemon cannot load that version")
        found = path or found
    return found


def _default_filename(runtime: str) -> str:
    return BACKEND_DEFAULT_FILENAME.get(runtime, "model")


def _describe(runtime: str, model_file: Path, warnings: list[str]) -> ModelSignature | None:
    if runtime != "onnxruntime":
        warnings.append(f"auto-complete from {runtime} model files is not done by validate; config checked "
                        "on its own")
        return None
    try:
        from edged.backends.onnxruntime import OnnxRuntimeBackend
    except ImportError as e:
        warnings.append(f"cannot read the ONNX model's signature ({e}); config checked on its own")
        return None
    return OnnxRuntimeBackend().describe(model_file)
