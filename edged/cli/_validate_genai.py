"""``edged models validate`` on a generative model (backend onnxruntime_genai): the version folder holds what
ORT GenAI loads, the limits in config.pbtxt parse, the chat template compiles in the same sandbox the daemon
renders it in, and the memory the model will be charged (weights plus the KV caches) is reported.

Nothing is loaded: the checks read genai_config.json and the file names (edged/backends/genai_config.py);
Jinja2 is imported only to compile the template, and its absence is a warning, not an error.
"""

from __future__ import annotations

from pathlib import Path

from edged.backends.genai_config import check_model_folder, max_length
from edged.errors import ModelConfigError
from edged.repository.model_config import ModelConfig, ModelSignature

GENAI_RUNTIME = "onnxruntime_genai"
MIB = 1 << 20


def describe_generative(folder: Path, name: str, config: ModelConfig | None, warnings: list[str],
                        notes: list[str]) -> ModelSignature:
    report = check_model_folder(folder, name, config.parameters if config is not None else {})
    _compile_template(report.template, name, warnings)
    limits = report.limits
    note = (f"generative model: {report.weight_bytes / MIB:.1f} MiB of weights; KV cache {report.kv_bytes / MIB:.1f}"
            f" MiB for max_sequences {limits.max_sequences} x max_length {max_length(report.shape, limits)} tokens"
            f" ({report.shape.layers} layers, {report.shape.kv_heads} KV heads of {report.shape.head_size}); "
            f"max_waiting {limits.max_waiting}")
    notes.append(note)
    return ModelSignature(inputs=(), outputs=(), notes=(note,))


def _compile_template(path: Path, name: str, warnings: list[str]) -> None:
    try:
        import jinja2.sandbox
    except ImportError as e:
        warnings.append(f"the chat template was not compiled ({e}; it needs the genai extra)")
        return
    environment = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    try:
        environment.from_string(path.read_text(encoding="utf-8"))
    except (jinja2.TemplateError, OSError, UnicodeDecodeError) as e:
        raise ModelConfigError(f"model {name}: chat template {path} does not compile: {e}") from e
