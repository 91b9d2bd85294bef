"""Checks of a model config against itself that a load and ``edged models validate`` share.

Triton's ValidateModelConfig refuses these before it reads a model file: a platform or backend it does not
serve, a platform and backend that name different runtimes, and ``model_warmup`` entries that do not fit the
config's inputs or max_batch_size. Here they are ModelConfigErrors (HTTP 400) naming the file and the field, so a
load refuses them before any runtime sees the warm-up tensors and validate refuses them offline.
"""

from __future__ import annotations

from collections.abc import Collection
from math import prod

from edged.errors import ModelConfigError
from edged.repository._normalize import PLATFORM_BACKENDS
from edged.repository.model_config import (
    BACKEND_DEFAULT_FILENAME,
    TRITON_TO_KSERVE,
    UNSUPPORTED,
    ModelConfig,
    ModelWarmup,
    TensorConfig,
)

# The platforms edged serves, and the backend each one means (tensorflow_* are Triton's, not edged's).
SERVED_PLATFORMS: dict[str, str] = {p: b for p, b in PLATFORM_BACKENDS.items() if b in BACKEND_DEFAULT_FILENAME}
BUILTIN_BACKENDS: tuple[str, ...] = tuple(sorted(BACKEND_DEFAULT_FILENAME))
# Triton bounds model_warmup count only by uint32; every run holds the registry for the whole load, so a count in
# the billions never ends it. Warming a steady state takes a handful of runs: ten thousand is far past any use.
MAX_WARMUP_COUNT = 10_000


def check_platform_backend(config: ModelConfig, path: str | None,
                           backends: Collection[str] | None = BUILTIN_BACKENDS) -> None:
    """Refuse a platform edged does not serve, a backend not in ``backends`` (None: any backend, for a caller
    that checks the name where it looks the backend up) and a platform whose runtime is not the backend's."""
    platform, backend = config.platform, config.backend
    if platform and platform not in SERVED_PLATFORMS:
        raise ModelConfigError(f"field 'platform' is {platform!r}, which edged does not serve; supported "
                               f"platforms: {', '.join(SERVED_PLATFORMS)} (or set field 'backend' to one of "
                               f"{', '.join(BUILTIN_BACKENDS)})", path)
    if backend and backends is not None and backend not in backends:
        raise unknown_backend(backend, backends, path)
    if platform and backend and SERVED_PLATFORMS[platform] != backend:
        raise ModelConfigError(f"field 'platform' is {platform!r} (backend {SERVED_PLATFORMS[platform]!r}) but "
                               f"field 'backend' is {backend!r}; set one of them, or both to the same runtime",
                               path)


def unknown_backend(backend: str, backends: Collection[str], path: str | None) -> ModelConfigError:
    return ModelConfigError(f"field 'backend' is {backend!r}, which edged does not know; supported backends: "
                            f"{', '.join(sorted(backends))} (more can be named in [models] backends)", path)


def check_supported(config: ModelConfig, path: str | None) -> None:
    """Refuse fields of Triton's schema whose semantics edged does not implement, where they are in effect: served
    as if absent, a request got another answer than Triton gives (a decoupled model answered over HTTP, which
    Triton refuses; a ragged model fed padded tensors; a checksum agent's check skipped). Fields that change no
    answer (``response_cache``: Triton without a cache configured serves the same; metrics, profiles) are kept."""
    extra = config.extra
    policy = extra.get("model_transaction_policy")
    if isinstance(policy, dict) and policy.get("decoupled") in (True, 1):
        raise ModelConfigError("field 'model_transaction_policy.decoupled' is true: decoupled models (any number "
                               "of responses per request, over a stream) are not supported by edged, which answers "
                               "each request once; serve the model with decoupled: false if it gives one response "
                               "per request", path)
    for name, what in (("batch_input", "batch inputs"), ("batch_output", "batch outputs")):
        if extra.get(name):
            raise ModelConfigError(f"field '{name}': {what} (ragged batching) are not supported by edged: requests "
                                   "are batched only when their shapes match, and the model gets no batch input "
                                   f"tensors; remove {name} and give the model inputs with a batch dimension", path)
    for spec in config.input:
        if spec.allow_ragged_batch:
            raise ModelConfigError(f"input {spec.name!r}: field 'allow_ragged_batch' is true: ragged batching is not "
                                   "supported by edged (requests are batched only when their shapes match, never "
                                   "concatenated into one flat tensor); remove it", path)
    agents = extra.get("model_repository_agents")
    if isinstance(agents, dict) and agents.get("agents"):
        raise ModelConfigError("field 'model_repository_agents': repository agents (checksum, relocation) are not "
                               "run by edged, so their checks and changes to the model files would be skipped; "
                               "remove them (edged's signed updates verify model files: see Updates in README)",
                               path)
    runtime = extra.get("runtime", "")
    if runtime and runtime != f"libtriton_{config.runtime}.so":  # Triton's library for the backend: edged's own
        raise ModelConfigError(f"field 'runtime' is {runtime!r}: edged serves each backend with its own runtime (a "
                               f"Python-based runtime such as model.py is not supported); remove it, or name "
                               f"libtriton_{config.runtime or '<backend>'}.so", path)
    operations = extra.get("model_operations")
    if isinstance(operations, dict) and operations.get("op_library_filename"):
        raise ModelConfigError("field 'model_operations.op_library_filename': custom operation libraries are not "
                               "loaded by edged; export the model with standard operators (or register the custom "
                               "operators in the ONNX Runtime session through a backend of your own)", path)


def check_tensor_types(config: ModelConfig, path: str | None) -> None:
    """Refuse tensors of a type edged cannot carry (BF16) and inputs or outputs that are not tensors (ONNX
    sequences, maps, optionals), on the completed config: such a model loaded, advertised the type and failed every
    request (ZipMap's output with a 500); refused at load, it says so once, where the operator looks."""
    for kind, specs in (("input", config.input), ("output", config.output)):
        for spec in specs:
            if spec.data_type not in TRITON_TO_KSERVE:
                raise ModelConfigError(not_a_tensor(kind, spec.name, spec.data_type), path)
            if spec.data_type == "TYPE_BF16":
                raise ModelConfigError(f"{kind} {spec.name!r} is TYPE_BF16, which edged cannot serve (its tensors "
                                       "are numpy arrays, and numpy has no bfloat16); export the model with FP16 or "
                                       "FP32 inputs and outputs", path)


def not_a_tensor(kind: str, name: str, found: str) -> str:
    """Why a model input or output that is not a tensor (an ONNX sequence, map or optional, which a backend's
    signature reports as ``UNSUPPORTED(<its type>)``) cannot be served, and what to do instead."""
    if found.startswith(UNSUPPORTED) and found.endswith(")"):
        found = found[len(UNSUPPORTED):-1]
    advice = ("leave it out of the config's output list (list the outputs to serve)" if kind == "output"
              else "export the model with a tensor in its place")
    if "map(" in found:
        advice += ", or export the model without it (skl2onnx: options={id(model): {'zipmap': False}} gives the " \
                  "probabilities as a tensor)"
    return (f"{kind} {name!r} has type {found} in the model file, which is not a tensor; edged, like Triton, serves "
            f"tensor inputs and outputs only: {advice}")


def check_batching(config: ModelConfig, path: str | None) -> None:
    """Refuse a ``preferred_batch_size`` above max_batch_size, as Triton does, on the completed config (auto-complete
    may set max_batch_size): no batch can reach it, so every batch waited out its whole delay. (Triton also refuses
    preserve_ordering with several priority levels or a DELAY timeout; edged serves both, answers in queueing
    order, see engine.ordering.)"""
    batching = config.dynamic_batching
    if batching is None:
        return
    for size in batching.preferred_batch_size:
        if size > config.max_batch_size:
            raise ModelConfigError(f"field 'dynamic_batching.preferred_batch_size' holds {size}, more than "
                                   f"max_batch_size {config.max_batch_size}; a preferred batch size must be at "
                                   "most max_batch_size", path)


def check_io_and_groups(config: ModelConfig, path: str | None) -> None:
    """Refuse, on the completed config, what Triton's ValidateModelInput/Output and ValidateInstanceGroup refuse:
    FORMAT_NHWC/NCHW without 3 dims, shape tensors, non-linear formats, profiles and NVDLA devices outside TensorRT,
    and GPUs listed for KIND_CPU or KIND_MODEL groups. Loaded, such a field was ignored."""
    tensorrt = config.runtime == "tensorrt"
    for kind, specs in (("input", config.input), ("output", config.output)):
        for index, spec in enumerate(specs):
            label = f"{kind} {spec.name!r}: field"
            if spec.format in ("FORMAT_NHWC", "FORMAT_NCHW") and len(spec.dims) != 3:
                raise ModelConfigError(f"{label} 'format' is {spec.format}, which needs 3 dims (C, H, W in some "
                                       f"order); found dims {list(spec.dims)} (use FORMAT_NONE for other shapes)",
                                       path)
            if spec.is_shape_tensor and not tensorrt:
                raise ModelConfigError(f"{label} 'is_shape_tensor' is true, but shape tensors are only supported by "
                                       f"TensorRT models (this one is {config.runtime}'s); remove it", path)
            if config.extra.get(f"{kind}[{index}].is_non_linear_format_io") and not tensorrt:
                raise ModelConfigError(f"{label} 'is_non_linear_format_io' is true, but non-linear formats are only "
                                       f"supported by TensorRT models (this one is {config.runtime}'s)", path)
    for index, group in enumerate(config.instance_group):
        where = f"instance_group[{index}]"
        if group.gpus and group.kind in ("KIND_CPU", "KIND_MODEL"):
            raise ModelConfigError(f"{where}: kind {group.kind} with field 'gpus' {list(group.gpus)}; GPUs go with "
                                   "kind KIND_GPU (or KIND_AUTO), as Triton requires", path)
        if config.extra.get(f"{where}.profile") and not tensorrt:
            raise ModelConfigError(f"{where}: field 'profile' names TensorRT optimization profiles, but the model is "
                                   f"{config.runtime}'s; remove it", path)
        if config.extra.get(f"{where}.secondary_devices") and not tensorrt:
            raise ModelConfigError(f"{where}: field 'secondary_devices' (NVDLA) is only supported by TensorRT "
                                   f"models (this one is {config.runtime}'s); remove it", path)


def check_reshapes(config: ModelConfig, path: str | None) -> None:
    """Refuse a ``reshape`` that does not keep its tensor's element count, by Triton's rule (ValidateIOShape):
    fixed shapes hold the same number of elements (an empty reshape, a scalar, goes with dims holding one), and
    shapes with -1 have as many -1s, the fixed runs between them holding the same counts ([2, 4, -1, 6] can become
    [8, -1, 1, 6]). Such a config loaded, and every request it got then failed with a 500."""
    for kind, specs in (("input", config.input), ("output", config.output)):
        for spec in specs:
            if spec.reshape is None:
                continue
            if not spec.reshape.shape and config.max_batch_size == 0:  # Triton's ValidateIOShape
                raise ModelConfigError(f"{kind} {spec.name!r}: field 'reshape' is empty (a scalar), which a "
                                       "non-batching model (max_batch_size 0) cannot have, as in Triton; give the "
                                       "shape, such as [ 1 ]", path)
            dims, shape = list(spec.dims), list(spec.reshape.shape)
            problem = _reshape_problem(dims, shape)
            if problem:
                raise ModelConfigError(f"{kind} {spec.name!r}: field 'reshape' shape {shape} {problem} than dims "
                                       f"{dims}; a reshape must keep the tensor's element count (-1 dimensions "
                                       "pair up between the two)", path)


def _reshape_problem(dims: list[int], shape: list[int]) -> str:
    runs_dims, runs_shape = _fixed_runs(dims), _fixed_runs(shape)
    if len(runs_dims) != len(runs_shape):
        return "has another number of variable-size (-1) dimensions"
    if len(runs_dims) == 1 and not shape and prod(dims) == 1:
        return ""  # a scalar reshape of a one-element tensor
    if runs_dims != runs_shape or (not dims) != (not shape):
        return "holds another number of elements"
    return ""


def _fixed_runs(dims: list[int]) -> list[int]:
    """The element counts of the runs of fixed dimensions between the -1s (one run when there is no -1)."""
    runs, current = [], 1
    for dim in dims:
        if dim == -1:
            runs.append(current)
            current = 1
        else:
            current *= dim
    return [*runs, current]


def check_warmup(config: ModelConfig, path: str | None, max_elements: int) -> None:
    """Refuse ``model_warmup`` entries that cannot run on this config: checked on the completed config, whose
    inputs are known, and before any tensor is made (a huge batch or dims would allocate without bound)."""
    if not config.input:  # inputs unknown (validate without a model file to complete from): nothing to check against
        return
    inputs = {spec.name: spec for spec in config.input}
    for index, entry in enumerate(config.model_warmup):
        if entry.batch_size == 0:
            continue  # never run (Triton skips such a sample)
        where = f"model_warmup[{index}]" + (f" ({entry.name!r})" if entry.name else "")
        _check_entry(config, entry, where, inputs, path, max_elements)


def _check_entry(config: ModelConfig, entry: ModelWarmup, where: str, inputs: dict[str, TensorConfig],
                 path: str | None, max_elements: int) -> None:
    limit = max(1, config.max_batch_size)
    if entry.batch_size > limit:
        raise ModelConfigError(f"{where}: field 'batch_size' is {entry.batch_size}, more than "
                               f"{limit} (max_batch_size {config.max_batch_size})", path)
    if entry.count > MAX_WARMUP_COUNT:
        raise ModelConfigError(f"{where}: field 'count' is {entry.count}, more than the limit of {MAX_WARMUP_COUNT} "
                               "runs (each run holds up every other load and unload); a few runs warm a model up",
                               path)
    batch = max(1, entry.batch_size) if config.max_batch_size > 0 else 1
    for name, given in entry.inputs.items():
        spec = inputs.get(name)
        field = f"{where}: field 'inputs[{name}]"
        if spec is None:
            raise ModelConfigError(f"{field}' names no input of the model (inputs: {', '.join(inputs)})", path)
        if given.data_type != spec.data_type:
            raise ModelConfigError(f"{field}.data_type' is {given.data_type}, but input {name!r} is "
                                   f"{spec.data_type}", path)
        fits = len(given.dims) == len(spec.dims) and all(
            d in (-1, g) for g, d in zip(given.dims, spec.dims, strict=True))
        if not fits:
            raise ModelConfigError(f"{field}.dims' is {list(given.dims)}, but input {name!r} has dims "
                                   f"{list(spec.dims)} (-1: any size)", path)
        elements = batch * prod(max(1, d) for d in given.dims)
        if elements > max_elements:
            raise ModelConfigError(f"{field}' makes {elements} elements (batch_size x dims), more than the limit "
                                   f"of {max_elements} ([server] max_tensor_elements)", path)
    for tensor in config.input:
        if tensor.name not in entry.inputs and not tensor.optional:
            raise ModelConfigError(f"{where}: field 'inputs' has no entry for the model's input {tensor.name!r} "
                                   f"(inputs: {', '.join(inputs)})", path)
