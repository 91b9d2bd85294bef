"""Confinement of every file a model config names to that model's folder.

``default_model_filename``, ``label_filename`` and ``input_data_file`` come from ``config.pbtxt`` or from a
load request's ``config`` override, so they are caller input: without this a caller allowed to load models
could make edged read any file edged can read (labels come back in classification results). Guarantees:

- the name is relative and resolves, symlinks included, to a path inside the resolved model folder; a symlink
  from one file of the folder to another of the same folder is fine, one leading out is refused;
- the file, where it exists, is a regular file (not a device, FIFO or folder);
- `read_confined` opens the resolved path without following a final symlink and checks the opened file
  descriptor itself (regular file, still inside the folder), so a swap between the check and the open
  cannot redirect the read.

Refusals are ModelConfigErrors naming the field, the value and the folder.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import stat
from collections.abc import Iterable
from math import prod
from pathlib import Path, PurePosixPath
from typing import Literal

from edged.errors import ModelConfigError
from edged.repository.datatypes import TRITON_TO_NUMPY
from edged.repository.model_config import ModelConfig, WarmupInput

TRT_CACHE_PARAMETER = "trt_engine_cache_path"  # onnxruntime's TensorRT engine cache: a folder it writes to
# A label file is read whole and kept as one string per line: the largest real ones (ImageNet-21k, ~22k classes)
# are under 1 MiB, and the cap keeps a config naming a large file of its folder (the model itself) as labels from
# holding that memory.
MAX_LABEL_BYTES = 4 << 20
_OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK  # NONBLOCK: a FIFO must not hang us


def confined_path(model_dir: Path | str, name: str, what: str, *, under: str = "", must_exist: bool = True,
                  kind: Literal["file", "folder"] = "file") -> Path:
    """The resolved path of ``name`` (relative to ``model_dir/under``), refused unless it stays inside the
    model folder.

    ``what`` names the config field for messages, e.g. ``"label_filename of output 'prob'"``; ``under`` is
    the subfolder the field is relative to (a version folder, ``warmup``). With ``must_exist`` false a
    missing file is returned (resolved as far as it exists) for the caller to report. ``kind`` "folder" is
    for a field naming a folder (an engine cache) instead of a regular file.
    """
    folder = Path(os.path.realpath(model_dir))
    if not name or "\0" in name:
        raise ModelConfigError(f"{what} {name!r} is not a file name (model folder {folder})")
    if PurePosixPath(name).is_absolute():
        raise ModelConfigError(f"{what} {name!r} is an absolute path; name a file inside the model folder "
                               f"{folder}")
    try:
        resolved = (folder / under / name).resolve(strict=must_exist)
    except FileNotFoundError:
        raise ModelConfigError(f"{what} {name!r}: no such file in the model folder {folder}") from None
    except (OSError, RuntimeError) as e:  # RuntimeError: a symlink loop
        raise ModelConfigError(f"{what} {name!r} cannot be resolved in the model folder {folder}: {e}") from e
    if not resolved.is_relative_to(folder):
        raise ModelConfigError(f"{what} {name!r} leads outside the model folder {folder}; name a file inside "
                               "it (no '..' escapes, no symlinks pointing out)")
    with contextlib.suppress(FileNotFoundError):
        mode = resolved.stat().st_mode
        if kind == "file" and not stat.S_ISREG(mode):
            raise ModelConfigError(f"{what} {name!r} in the model folder {folder} is not a regular file")
        if kind == "folder" and not stat.S_ISDIR(mode):
            raise ModelConfigError(f"{what} {name!r} in the model folder {folder} is not a folder")
    return resolved


def read_confined(model_dir: Path | str, name: str, what: str, *, under: str = "",
                  max_bytes: int | None = None, at_most: int | None = None) -> bytes:
    """The bytes of ``name``, confined as by `confined_path`, checked again on the opened descriptor. With
    ``max_bytes`` a larger file is refused before and while it is read (it may grow between the two); with
    ``at_most`` only its first bytes are read (a warm-up file uses as many as its tensor takes)."""
    path = confined_path(model_dir, name, what, under=under)
    folder = Path(os.path.realpath(model_dir))
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except OSError as e:
        raise ModelConfigError(f"{what} {name!r}: cannot open {path}: {e.strerror}") from e
    with os.fdopen(fd, "rb") as file:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ModelConfigError(f"{what} {name!r} in the model folder {folder} is not a regular file")
        _check_descriptor(fd, folder, what, name)
        if max_bytes is None:
            return file.read() if at_most is None else file.read(at_most)
        data = file.read(max_bytes + 1) if info.st_size <= max_bytes else b""
        if info.st_size > max_bytes or len(data) > max_bytes:
            raise ModelConfigError(f"{what} {name!r} in the model folder {folder} is larger than the limit of "
                                   f"{max_bytes} bytes (found {max(info.st_size, len(data))})")
        return data


def _check_descriptor(fd: int, folder: Path, what: str, name: str) -> None:
    """Where /proc shows what a descriptor really opened, check that it is still inside the folder."""
    try:
        opened = Path(os.readlink(f"/proc/self/fd/{fd}"))
    except OSError:
        return  # no /proc (a container without it): the checks before the open stand alone
    if not opened.is_relative_to(folder):
        raise ModelConfigError(f"{what} {name!r} was replaced while being opened and now leads outside the "
                               f"model folder {folder}")


def check_config_files(config: ModelConfig, model_dir: Path | str, versions: Iterable[int]) -> None:
    """Refuse a config naming any file outside its model folder, or a label file that is not there, before anything
    of the model is read."""
    for version in versions:
        confined_path(model_dir, config.model_filename, "default_model_filename", under=str(version),
                      must_exist=False)
    for output in config.output:
        if output.label_filename:
            # must exist: Triton's load fails on a label file it cannot read (a misspelt name went unnoticed)
            what = f"label_filename of output {output.name!r}"
            size = confined_path(model_dir, output.label_filename, what).stat().st_size
            if size > MAX_LABEL_BYTES:
                raise ModelConfigError(f"{what} {output.label_filename!r} in the model folder "
                                       f"{os.path.realpath(model_dir)} is larger than the limit of {MAX_LABEL_BYTES} "
                                       f"bytes (found {size}); a label file holds one class name per line")
    cache = config.parameters.get(TRT_CACHE_PARAMETER)
    if cache:
        confined_path(model_dir, cache, f"parameter {TRT_CACHE_PARAMETER}", must_exist=False, kind="folder")
    for entry in config.model_warmup:
        for name, spec in entry.inputs.items():
            if spec.source == "input_data_file":
                what = f"input_data_file of warm-up {entry.name!r} input {name!r}"
                path = confined_path(model_dir, spec.input_data_file, what, under="warmup", must_exist=False)
                if entry.batch_size == 0:
                    continue  # never read: Triton skips a sample of batch_size 0
                _check_warmup_file_size(path, what, spec.input_data_file, warmup_shape(config, entry.batch_size, spec),
                                        spec.data_type)


def warmup_shape(config: ModelConfig, batch_size: int, spec: WarmupInput) -> list[int]:
    """The shape of a warm-up input's tensor: its dims (-1 counts as 1), after the batch when the model batches."""
    shape = [d if d > 0 else 1 for d in spec.dims]
    return [max(1, batch_size), *shape] if config.max_batch_size > 0 else shape


def _check_warmup_file_size(path: Path, what: str, name: str, shape: list[int], data_type: str) -> None:
    """A data file too short to fill its tensor is the config's error (400), found before any instance loads;
    inside the load it was a failed load (500). A type without a fixed size (TYPE_STRING) is not checked."""
    dtype = TRITON_TO_NUMPY.get(data_type)
    if dtype is None or dtype.kind == "O":
        return
    needed = prod(shape) * int(dtype.itemsize)
    try:
        size = path.stat().st_size
    except OSError:
        return  # missing: the read at load says so
    if size < needed:
        raise ModelConfigError(f"{what} {name!r} ({path}) holds {size} bytes, fewer than the {needed} of its tensor "
                               f"({data_type}, shape {shape})")


def with_confined_parameters(config: ModelConfig, model_dir: Path | str) -> ModelConfig:
    """The config a backend receives: a path-valued parameter (the TensorRT engine cache) named relative to
    the model folder becomes its confined absolute path, so the runtime never resolves it against its own
    working directory."""
    cache = config.parameters.get(TRT_CACHE_PARAMETER)
    if not cache:
        return config
    path = confined_path(model_dir, cache, f"parameter {TRT_CACHE_PARAMETER}", must_exist=False, kind="folder")
    return dataclasses.replace(config, parameters={**config.parameters, TRT_CACHE_PARAMETER: str(path)})
