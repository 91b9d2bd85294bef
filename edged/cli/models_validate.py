"""``edged models validate PATH [--json]``: check a model folder or a config.pbtxt offline.

Parses the config, auto-completes it from the model file where the runtime can describe one (ONNX, read with
onnxruntime through the ONNX backend, imported only here and only when needed; a generative folder is checked
by cli/_validate_genai.py), and prints Triton's JSON
model-config; without --json, also a summary of fields kept but not applied, and warnings. Errors are printed
as ``file:line:column: message`` and the exit status is 1.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edged.cli._validate_genai import GENAI_RUNTIME, describe_generative
from edged.config import ServerConfig
from edged.errors import EdgedError, ModelConfigError
from edged.repository import (
    BUILTIN_BACKENDS,
    CONFIG_FILENAME,
    autocomplete,
    check_config_files,
    check_platform_backend,
    check_warmup,
    detect_runtime,
    list_versions,
    load_model_config,
    missing_versions,
    model_config_to_json,
    normalize,
    parse_model_config,
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
    parser.set_defaults(handler=validate)


def validate(args: argparse.Namespace) -> int:
    try:
        report = validate_path(Path(args.path))
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


def validate_path(path: Path) -> Report:
    model_dir = path.parent if path.is_file() or path.name == CONFIG_FILENAME else path
    if not model_dir.is_dir():
        raise ModelConfigError(f"expected a model folder or its {CONFIG_FILENAME}, found nothing there",
                               str(path))
    warnings: list[str] = []
    notes: list[str] = []
    config = _read_file(path, warnings) if path.is_file() else load_model_config(model_dir)
    config_path = str(path if path.is_file() else model_dir / CONFIG_FILENAME)
    if config is not None:  # the checks a load makes of the config alone, in the same words
        check_platform_backend(config, config_path, backends=None)
        if config.backend and config.backend not in BUILTIN_BACKENDS:
            warnings.append(f"backend '{config.backend}' is not one of edged's ({', '.join(BUILTIN_BACKENDS)}); "
                            "the daemon loads it only where [models] backends names it")
    versions = list_versions(model_dir)
    chosen = select_versions(config.version_policy, versions) if config is not None else versions[-1:]
    if config is not None and (missing := missing_versions(config.version_policy, versions)):
        warnings.append(f"version policy names versions {missing}, which are not present")
    runtime = (config.runtime if config is not None and config.runtime else None) or detect_runtime(
        model_dir, chosen)
    if config is not None:  # before any model file is read: the daemon refuses the same names
        check_config_files(config, model_dir, chosen)
    completed = _complete(config, model_dir, chosen, runtime, warnings, notes)
    # the daemon's default [server] max_tensor_elements: validate reads no edged.toml
    check_warmup(completed, config_path, ServerConfig().max_tensor_elements)
    return Report(model_config_to_json(completed), unknown_fields(completed), warnings, notes)


def _read_file(path: Path, warnings: list[str]) -> ModelConfig:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ModelConfigError(f"cannot read the model config as UTF-8 text: {e}", str(path)) from e
    config = parse_model_config(text, str(path), default_name=path.parent.name)
    if config.name != path.parent.name:
        warnings.append(f"the config names the model '{config.name}' but its folder is "
                        f"'{path.parent.name}'; the daemon refuses to load it there")
    return config


def _complete(config: ModelConfig | None, model_dir: Path, versions: list[int], runtime: str | None,
              warnings: list[str], notes: list[str]) -> ModelConfig:
    if runtime is None:
        if config is None:
            raise ModelConfigError("no config.pbtxt and no model file (model.onnx, model.plan, model.pt, "
                                   "model.pt2) in any version folder", str(model_dir))
        warnings.append("no model file found in the selected versions; config checked on its own")
        return normalize(config)
    explicit = config is not None and (config.runtime or config.default_model_filename)
    filename = config.model_filename if config is not None and explicit else _default_filename(runtime)
    model_file = next((model_dir / str(v) / filename for v in reversed(versions)
                       if (model_dir / str(v) / filename).exists()), None)
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
