"""The on-disk layout of a Triton model repository: ``<repo>/<model>/config.pbtxt`` and
``<repo>/<model>/<version>/<model file>``.

Model names are single safe path segments; versions are positive decimal int64 folder names, without leading
zeros (`parse_version`, the one rule for folders and request URLs; anything else in a
model folder is ignored with a log line, as Triton does). Installing a version is atomic: the version appears
complete or not at all, even across a power cut.

Poll mode compares fingerprints: per version folder (and one for the model folder's own files) the names, sizes
and mtimes of the files that matter. Hidden files and the temporaries of editors and copy tools are not part of
a model, so creating or changing them reloads nothing.
"""

from __future__ import annotations

import logging
import os
import re
import secrets
import shutil
from collections.abc import Callable, Iterable
from dataclasses import replace
from pathlib import Path

from edged.durable import fsync_dir
from edged.errors import InvalidInput, ModelConfigError, ModelError
from edged.repository._build import parse_model_config
from edged.repository.confine import read_confined
from edged.repository.model_config import ModelConfig, VersionPolicy

logger = logging.getLogger(__name__)

CONFIG_FILENAME = "config.pbtxt"
# File name → runtime, in the order detect_runtime prefers them.
RUNTIME_FILES: tuple[tuple[str, str], ...] = (
    # first: a generative folder holds a model.onnx too, which only ORT GenAI can drive
    ("genai_config.json", "onnxruntime_genai"),
    ("model.onnx", "onnxruntime"),
    ("model.plan", "tensorrt"),
    ("model.pt", "pytorch"),
    ("model.pt2", "pytorch"),
)
_VERSION = re.compile(r"[1-9][0-9]{0,18}")
_MAX_VERSION = 2**63 - 1  # Triton's versions are int64: a larger folder name reads wrong in every client
# Triton's configs are a few KB; the cap keeps a hostile or mistaken file (a multi-GB log, a link to /dev/zero)
# from being read, and parsed under the registry lock, without bound.
MAX_CONFIG_BYTES = 1 << 20
_MAX_NAME = 255


def check_model_name(name: str) -> str:
    """Return ``name`` if it is one safe path segment; raise ModelConfigError otherwise."""
    problem = None
    if not name:
        problem = "is empty"
    elif "/" in name or "\\" in name:
        problem = "contains a path separator"
    elif "\0" in name:
        problem = "contains a NUL character"
    elif not is_utf8_name(name):
        problem = "is not UTF-8"
    elif name.startswith("."):
        problem = "starts with '.' (hidden, '.' or '..')"
    elif len(name.encode("utf-8", "surrogateescape")) > _MAX_NAME:
        problem = f"is longer than {_MAX_NAME} bytes"
    if problem is not None:
        raise ModelConfigError(f"model name {name!r} {problem}; expected a single path segment such as "
                               "'resnet50'")
    return name


def check_override_size(raw: str, model: str) -> None:
    """A load request's ``config`` override, refused (InvalidInput) when larger than a ``config.pbtxt`` may be: it is
    parsed where the request is answered, and a 29 MB one held every other request for 14 s."""
    size = len(raw.encode("utf-8", "surrogatepass"))
    if size > MAX_CONFIG_BYTES:
        raise InvalidInput(f"load request for model {model}: parameters.config is {size} bytes, more than the limit "
                           f"of {MAX_CONFIG_BYTES} bytes (a config.pbtxt's too); send only the fields you change")


def find_models(root: Path | str, skipped: Callable[[str], None] | None = None) -> list[str]:
    """Names of the model folders in a repository, sorted; hidden entries and files are skipped, and so are
    folders whose name is not UTF-8, each handed to ``skipped`` (default: a warning each time)."""
    root = Path(root)
    try:
        entries = list(os.scandir(root))
    except OSError as e:
        raise ModelError(f"model repository {str(root)!r} cannot be listed: {e.strerror}; point [models] "
                         "repository (or --model-repository) at a folder of model folders") from e
    names = []
    for entry in entries:
        if entry.name.startswith(".") or not entry.is_dir(follow_symlinks=True):
            continue
        if not is_utf8_name(entry.name):
            (skipped or warn_not_utf8)(entry.name)
            continue
        names.append(entry.name)
    return sorted(names)


def is_utf8_name(name: str) -> bool:
    """Whether a file name (as os.fsdecode gives it: undecodable bytes as lone surrogates) is UTF-8. Only such a
    name can be a model's: a URL, a JSON document or an MQTT topic cannot carry the others (orjson refuses them)."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def escaped_name(name: str) -> str:
    """A name that is not UTF-8, printable: its bytes as Python writes them (``b'cam\\xff'``)."""
    return ascii(os.fsencode(name))


def warn_not_utf8(name: str) -> None:
    logger.warning("model repository: skipping the folder %s: its name is not UTF-8, so no request, status or "
                   "index can name it; rename it (for example with convmv, or mv in a UTF-8 locale)",
                   escaped_name(name))


def parse_version(text: str) -> int | None:
    """The version a folder name or a URL's version segment names: a positive decimal int64 without leading zeros
    (folders and URLs follow one rule, so /versions/02 reaches no folder '2' that a folder '02' could not), or None."""
    if not _VERSION.fullmatch(text):
        return None
    number = int(text)
    return number if number <= _MAX_VERSION else None


def list_versions(model_dir: Path | str) -> list[int]:
    """The numeric version folders of a model, ascending; other entries are logged and ignored."""
    model_dir = Path(model_dir)
    versions: list[int] = []
    for entry in os.scandir(model_dir):
        if not entry.is_dir(follow_symlinks=True):
            continue
        number = parse_version(entry.name)
        if number is not None:
            versions.append(number)
        elif not entry.name.startswith("."):
            logger.info("model %s: ignoring folder %r, which is not a version number (expected 1, 2, ... up to "
                        "%d)", model_dir.name, entry.name, _MAX_VERSION)
    return sorted(versions)


def select_versions(policy: VersionPolicy, available: Iterable[int]) -> list[int]:
    """The versions a policy serves, ascending. Specific versions that are missing are logged."""
    present = sorted(set(available))
    if policy.kind == "all":
        return present
    if policy.kind == "latest":
        return present[-policy.num_versions:] if policy.num_versions > 0 else []
    missing = missing_versions(policy, present)
    if missing:
        logger.warning("version policy names versions %s, which are not in the repository (present: %s)",
                       missing, present)
    return sorted(set(policy.versions) & set(present))


def missing_versions(policy: VersionPolicy, available: Iterable[int]) -> list[int]:
    """Versions a ``specific`` policy names that are not available (empty for other policies)."""
    if policy.kind != "specific":
        return []
    return sorted(set(policy.versions) - set(available))


def detect_runtime(model_dir: Path | str, versions: Iterable[int]) -> str | None:
    """The runtime whose model file is in the newest version folder that has one, or None."""
    model_dir = Path(model_dir)
    for version in sorted(versions, reverse=True):
        for filename, runtime in RUNTIME_FILES:
            if (model_dir / str(version) / filename).exists():
                return runtime
    return None


def resolve_runtime(config: ModelConfig | None, model_dir: Path | str,
                    versions: Iterable[int]) -> tuple[ModelConfig | None, str | None]:
    """The config and the runtime a model folder is served with: the config's platform or backend, else the
    runtime of the newest model file. A config naming neither gets that file's backend, as Triton's auto-complete
    derives it, so its model file is the runtime's (model.onnx), not a bare 'model'."""
    if config is not None and config.runtime:
        return config, config.runtime
    runtime = detect_runtime(model_dir, versions)
    if config is not None and runtime is not None:
        config = replace(config, backend=runtime)
    return config, runtime


def load_model_config(model_dir: Path | str) -> ModelConfig | None:
    """Parse a model folder's ``config.pbtxt``; None when there is none. The name defaults to the folder's.

    The file is read as every file a config names is (`read_confined`): it must resolve inside the model folder
    (the config comes back through GET /v2/models/{m}/config, so a link out would leak what it points to), be a
    regular file (a FIFO is opened without blocking and refused: it hung the load with the registry lock held)
    and at most MAX_CONFIG_BYTES long."""
    model_dir = Path(model_dir)
    name = check_model_name(model_dir.name)
    path = model_dir / CONFIG_FILENAME
    if not os.path.lexists(path):
        return None
    try:
        raw = read_confined(model_dir, CONFIG_FILENAME, "the model config", max_bytes=MAX_CONFIG_BYTES)
    except ModelConfigError as e:
        raise ModelConfigError(e.reason, str(path)) from e
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ModelConfigError(f"the file is not UTF-8 text (byte {e.start})", str(path)) from e
    config = parse_model_config(text, str(path), default_name=name)
    if config.name != name:
        raise ModelConfigError(f"the config names the model '{config.name}' but its folder is '{name}'; "
                               "expected them to match", str(path))
    return config


# --- fingerprints for poll mode ---------------------------------------------------------------------------
# Editors' and copy tools' temporaries: vim swap files, emacs backups and autosaves, partial downloads/copies.
_TEMPORARY_SUFFIXES = ("~", ".swp", ".swo", ".swx", ".tmp", ".temp", ".part", ".partial", ".crdownload")
MODEL_FILES = ""  # the fingerprint key of the files directly in the model folder (config.pbtxt, labels)
Fingerprint = dict[str, tuple[tuple[str, int, int], ...]]


def is_temporary(name: str) -> bool:
    """A hidden file or an editor's / copier's temporary, which poll mode ignores."""
    return name.startswith((".", "#")) or name.endswith(_TEMPORARY_SUFFIXES)


def fingerprint(model_dir: Path | str) -> Fingerprint:
    """Names, sizes and mtimes of the files that make a model, by version folder name (MODEL_FILES for the
    model folder itself); hidden folders, temporaries and folders that are not versions are left out."""
    model_dir = Path(model_dir)
    result: Fingerprint = {}
    try:
        entries = list(os.scandir(model_dir))
    except OSError:
        return result
    result[MODEL_FILES] = _file_entries(e for e in entries if not e.is_dir(follow_symlinks=True))
    for entry in entries:
        if entry.is_dir(follow_symlinks=True) and parse_version(entry.name) is not None:
            result[entry.name] = _tree_entries(Path(entry.path))
    return result


def changed_versions(before: Fingerprint, after: Fingerprint) -> set[int] | None:
    """The version numbers whose files differ; None when the model folder's own files changed (all)."""
    if before.get(MODEL_FILES) != after.get(MODEL_FILES):
        return None
    return {int(key) for key in set(before) | set(after) if key != MODEL_FILES and before.get(key) != after.get(key)}


class Settling:
    """Poll mode acts on a model's change once two polls in a row saw the same new fingerprint: a file still
    being copied (its size or mtime still moving) is loaded only when complete."""

    def __init__(self) -> None:
        self._seen: dict[str, Fingerprint] = {}

    def settled(self, name: str, loaded: Fingerprint | None, now: Fingerprint, wait: bool = True) -> bool:
        """True when ``now`` differs from what is ``loaded`` and the previous poll saw ``now`` too (or,
        without ``wait``, at once: an operator's rescan means the files are in place)."""
        if loaded == now:
            self._seen.pop(name, None)
            return False
        if wait and self._seen.get(name) != now:
            self._seen[name] = now  # changed since the last poll: maybe still being written
            return False
        self._seen.pop(name, None)
        return True

    def keep_only(self, present: Iterable[str]) -> None:
        kept = set(present)
        self._seen = {name: seen for name, seen in self._seen.items() if name in kept}


def _file_entries(entries: Iterable[os.DirEntry[str]], prefix: str = "") -> tuple[tuple[str, int, int], ...]:
    found = []
    for entry in entries:
        if is_temporary(entry.name):
            continue
        try:
            st = entry.stat(follow_symlinks=True)
        except OSError:
            continue  # removed meanwhile: the next poll sees the folder without it
        found.append((prefix + entry.name, st.st_size, st.st_mtime_ns))
    return tuple(sorted(found))


def _tree_entries(folder: Path) -> tuple[tuple[str, int, int], ...]:
    found: list[tuple[str, int, int]] = []
    for dirpath, dirs, files in os.walk(folder):
        dirs[:] = [d for d in dirs if not is_temporary(d)]
        prefix = os.path.relpath(dirpath, folder.parent) + os.sep
        found.extend(_file_entries((e for e in os.scandir(dirpath) if e.name in files), prefix))
    return tuple(sorted(found))


# --- atomic installation ------------------------------------------------------------------------------------
def install_version(model_dir: Path | str, version: int, populate: Callable[[Path], None]) -> Path:
    """Create ``<model_dir>/<version>`` atomically: ``populate`` fills a hidden temporary folder, every file
    and folder in it is fsynced, then it is renamed into place and the model folder is fsynced."""
    model_dir = Path(model_dir)
    if version < 1:
        raise ModelError(f"model {model_dir.name}: version must be >= 1, found {version}")
    target = model_dir / str(version)
    if target.exists():
        raise ModelError(f"model {model_dir.name}: version {version} already exists at {str(target)!r}")
    model_dir.mkdir(parents=True, exist_ok=True)
    tmp = model_dir / f".install-{version}-{secrets.token_hex(6)}"
    tmp.mkdir()
    try:
        populate(tmp)
        _fsync_tree(tmp)
        os.rename(tmp, target)  # fails rather than merges if the version appeared meanwhile
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    fsync_dir(model_dir)
    return target


def _fsync_tree(root: Path) -> None:
    for folder, _dirs, files in os.walk(root):
        for name in files:
            fd = os.open(os.path.join(folder, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(Path(folder))
