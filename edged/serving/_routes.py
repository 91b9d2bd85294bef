"""The URL space of the socket API: Triton's paths plus edged's own under ``/v2/edged``.

A path is matched segment by segment after percent-decoding each segment on its own, so ``%2F`` can never
become a separator; names that are not one safe path segment are refused before any handler sees them.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Literal
from urllib.parse import unquote

import httptools

from edged.errors import InvalidInput

Permission = Literal["open", "infer", "admin"]


class Kind(Enum):
    SERVER_METADATA = "server_metadata"
    LIVE = "live"
    READY = "ready"
    ALL_STATS = "all_stats"
    MODEL_METADATA = "model_metadata"
    MODEL_READY = "model_ready"
    MODEL_CONFIG = "model_config"
    MODEL_STATS = "model_stats"
    INFER = "infer"
    REPOSITORY_INDEX = "repository_index"
    LOAD = "load"
    UNLOAD = "unload"
    METRICS = "metrics"
    STATUS = "status"
    TELEMETRY = "telemetry"
    OPENAPI = "openapi"
    SHM_STATUS = "system_shared_memory_status"
    SHM_REGISTER = "system_shared_memory_register"
    SHM_UNREGISTER = "system_shared_memory_unregister"
    CUDA_SHM_STATUS = "cuda_shared_memory_status"
    CUDA_SHM_REGISTER = "cuda_shared_memory_register"
    CUDA_SHM_UNREGISTER = "cuda_shared_memory_unregister"
    DAEMON_READ = "daemon_read"  # /v2/edged/ota/status|history: answered by a callable the daemon provides
    DAEMON_ACTION = "daemon_action"  # /v2/edged/ota/check|rollback
    OPENAI_MODELS = "openai_models"  # GET /v1/models: the generative models, in OpenAI's list shape
    OPENAI_MODEL = "openai_model"  # GET /v1/models/{model}: one of them (OpenAI's models.retrieve)
    CHAT_COMPLETIONS = "chat_completions"
    COMPLETIONS = "completions"
    GENERATE = "generate"  # Triton's generate extension: one JSON answer
    GENERATE_STREAM = "generate_stream"  # the same, as Server-Sent Events
    TRACE_SETTING = "trace_setting"  # Triton's trace extension: not served, answered as a Triton without it
    LOG_SETTINGS = "log_settings"  # Triton's logging extension: likewise


@dataclass(frozen=True)
class RouteSpec:
    method: bytes
    permission: Permission  # who may call it over the Unix socket (edged.serving._access)
    category: str  # its Triton API category, which [server.tcp_restricted] keys name (edged.config)
    also: bytes = b""  # a second method the route takes (Triton's settings routes: GET reads, POST updates)


# edged's own routes join the nearest Triton category: status and telemetry are statistics, the OpenAPI
# document is metadata. The repository index is open over TCP by default, as tritonclient expects.
SPECS: dict[Kind, RouteSpec] = {
    Kind.SERVER_METADATA: RouteSpec(b"GET", "open", "metadata"), Kind.LIVE: RouteSpec(b"GET", "open", "health"),
    Kind.READY: RouteSpec(b"GET", "open", "health"), Kind.ALL_STATS: RouteSpec(b"GET", "open", "statistics"),
    Kind.MODEL_METADATA: RouteSpec(b"GET", "open", "metadata"),
    Kind.MODEL_READY: RouteSpec(b"GET", "open", "health"),
    Kind.MODEL_CONFIG: RouteSpec(b"GET", "open", "model-config"),
    Kind.MODEL_STATS: RouteSpec(b"GET", "open", "statistics"),
    Kind.INFER: RouteSpec(b"POST", "infer", "inference"),
    Kind.REPOSITORY_INDEX: RouteSpec(b"POST", "open", "model-repository"),
    Kind.LOAD: RouteSpec(b"POST", "admin", "model-repository"),
    Kind.UNLOAD: RouteSpec(b"POST", "admin", "model-repository"),
    Kind.METRICS: RouteSpec(b"GET", "open", "statistics"), Kind.STATUS: RouteSpec(b"GET", "open", "statistics"),
    Kind.TELEMETRY: RouteSpec(b"GET", "open", "statistics"), Kind.OPENAPI: RouteSpec(b"GET", "open", "metadata"),
    # Shared memory needs the right to run inference; which regions a peer may touch is edged.shm's check.
    Kind.SHM_STATUS: RouteSpec(b"GET", "infer", "shared-memory"),
    Kind.SHM_REGISTER: RouteSpec(b"POST", "infer", "shared-memory"),
    Kind.SHM_UNREGISTER: RouteSpec(b"POST", "infer", "shared-memory"),
    Kind.CUDA_SHM_STATUS: RouteSpec(b"GET", "infer", "shared-memory"),
    Kind.CUDA_SHM_REGISTER: RouteSpec(b"POST", "infer", "shared-memory"),
    Kind.CUDA_SHM_UNREGISTER: RouteSpec(b"POST", "infer", "shared-memory"),
    Kind.DAEMON_READ: RouteSpec(b"GET", "open", "statistics"),
    Kind.DAEMON_ACTION: RouteSpec(b"POST", "admin", "model-repository"),
    Kind.OPENAI_MODELS: RouteSpec(b"GET", "infer", "inference"),
    Kind.OPENAI_MODEL: RouteSpec(b"GET", "infer", "inference"),
    Kind.CHAT_COMPLETIONS: RouteSpec(b"POST", "infer", "inference"),
    Kind.COMPLETIONS: RouteSpec(b"POST", "infer", "inference"),
    Kind.GENERATE: RouteSpec(b"POST", "infer", "inference"),
    Kind.GENERATE_STREAM: RouteSpec(b"POST", "infer", "inference"),
    Kind.TRACE_SETTING: RouteSpec(b"GET", "open", "trace", b"POST"),
    Kind.LOG_SETTINGS: RouteSpec(b"GET", "open", "logging", b"POST"),
}
# edged's daemon-provided routes: /v2/edged/<part>/<action> → the action's name ("ota/check")
DAEMON_ROUTES: dict[tuple[str, str], Kind] = {
    ("ota", "status"): Kind.DAEMON_READ, ("ota", "history"): Kind.DAEMON_READ,
    ("ota", "check"): Kind.DAEMON_ACTION, ("ota", "rollback"): Kind.DAEMON_ACTION,
    ("ota", "selftest"): Kind.DAEMON_ACTION,  # runs every model once: an administrator's (edged-update's) call
}
SHARED_MEMORY_KINDS = frozenset({Kind.SHM_STATUS, Kind.SHM_REGISTER, Kind.SHM_UNREGISTER, Kind.CUDA_SHM_STATUS,
                                 Kind.CUDA_SHM_REGISTER, Kind.CUDA_SHM_UNREGISTER})
_SHM_ACTIONS: dict[str, dict[str, Kind]] = {
    "systemsharedmemory": {"status": Kind.SHM_STATUS, "register": Kind.SHM_REGISTER,
                           "unregister": Kind.SHM_UNREGISTER},
    "cudasharedmemory": {"status": Kind.CUDA_SHM_STATUS, "register": Kind.CUDA_SHM_REGISTER,
                         "unregister": Kind.CUDA_SHM_UNREGISTER},
}

_FIXED: dict[tuple[str, ...], Kind] = {
    ("v2",): Kind.SERVER_METADATA, ("v2", "health", "live"): Kind.LIVE, ("v2", "health", "ready"): Kind.READY,
    ("v2", "models", "stats"): Kind.ALL_STATS, ("v2", "repository", "index"): Kind.REPOSITORY_INDEX,
    ("metrics",): Kind.METRICS, ("v2", "edged", "status"): Kind.STATUS,
    ("v2", "edged", "telemetry"): Kind.TELEMETRY, ("v2", "edged", "openapi.json"): Kind.OPENAPI,
    ("v1", "models"): Kind.OPENAI_MODELS, ("v1", "chat", "completions"): Kind.CHAT_COMPLETIONS,
    ("v1", "completions"): Kind.COMPLETIONS, ("v2", "trace", "setting"): Kind.TRACE_SETTING,
    ("v2", "logging"): Kind.LOG_SETTINGS,
}
_MODEL_SUFFIX: dict[str, Kind] = {
    "ready": Kind.MODEL_READY, "config": Kind.MODEL_CONFIG, "stats": Kind.MODEL_STATS, "infer": Kind.INFER,
    "generate": Kind.GENERATE, "generate_stream": Kind.GENERATE_STREAM,
}
_MODEL_PAIRS: dict[tuple[str, str], Kind] = {("trace", "setting"): Kind.TRACE_SETTING}
_MAX_SEGMENT = 255


@dataclass(frozen=True)
class Route:
    kind: Kind
    model: str = ""  # for shared-memory routes: the region name ("" for all regions); daemon routes: the action
    version: str = ""


def is_openai_path(path: bytes) -> bool:
    """Whether a request path is under ``/v1``, whose errors are OpenAI's JSON (Triton's shape elsewhere)."""
    return path == b"/v1" or path.startswith(b"/v1/")


def is_openai_url(url: bytes) -> bool:
    """Whether a raw request target is under ``/v1`` as `match` reads it: in origin or absolute form, with a
    query or not, its first segment percent-encoded or not (what a head-time check reads, before dispatch)."""
    if url.startswith(b"/v1/") or url == b"/v1":
        return True
    if url.startswith(b"/v2/"):
        return False  # the common case elsewhere, without a parse
    try:
        path = httptools.parse_url(url).path
    except httptools.HttpParserInvalidURLError:
        return False  # dispatch answers it
    if not path.startswith(b"/"):
        return False
    try:
        return _segment(path.split(b"/", 2)[1]) == "v1"
    except InvalidInput:
        return False


def match(path: bytes) -> Route | None:
    """The route for a request path (without the query), None when no route has that shape."""
    raw = path.split(b"/")
    if raw[0] != b"":
        raise InvalidInput("request path must start with '/'")
    if raw[-1] == b"" and len(raw) > 2:
        raw = raw[:-1]  # one trailing slash is tolerated
    parts = tuple(_segment(s) for s in raw[1:])
    fixed = _FIXED.get(parts)
    if fixed is not None:
        return Route(fixed)
    if len(parts) >= 3 and parts[:2] == ("v2", "models"):
        return _model_route(parts[2:])
    if len(parts) == 3 and parts[:2] == ("v1", "models"):
        return Route(Kind.OPENAI_MODEL, _name(parts[2]))
    if len(parts) == 5 and parts[:3] == ("v2", "repository", "models") and parts[4] in ("load", "unload"):
        return Route(Kind.LOAD if parts[4] == "load" else Kind.UNLOAD, _name(parts[3]))
    if len(parts) == 4 and parts[:2] == ("v2", "edged") and (parts[2], parts[3]) in DAEMON_ROUTES:
        return Route(DAEMON_ROUTES[parts[2], parts[3]], f"{parts[2]}/{parts[3]}")
    if len(parts) >= 3 and parts[0] == "v2" and parts[1] in _SHM_ACTIONS:
        return _shm_route(_SHM_ACTIONS[parts[1]], parts[2:])
    return None


def _shm_route(actions: dict[str, Kind], rest: tuple[str, ...]) -> Route | None:
    """``status`` / ``unregister`` for all regions, ``region/{name}/status|register|unregister`` for one."""
    if len(rest) == 1 and rest[0] in ("status", "unregister"):
        return Route(actions[rest[0]])
    if len(rest) == 3 and rest[0] == "region" and rest[2] in actions:
        return Route(actions[rest[2]], _name(rest[1], "shared memory region name"))
    return None


def _model_route(rest: tuple[str, ...]) -> Route | None:
    model = _name(rest[0])
    version = ""
    tail = rest[1:]
    if len(tail) >= 2 and tail[0] == "versions":
        version = _version(tail[1])
        tail = tail[2:]
    if not tail:
        return Route(Kind.MODEL_METADATA, model, version)
    if len(tail) == 1 and tail[0] in _MODEL_SUFFIX:
        return Route(_MODEL_SUFFIX[tail[0]], model, version)
    if len(tail) == 2 and not version and (tail[0], tail[1]) in _MODEL_PAIRS:
        return Route(_MODEL_PAIRS[tail[0], tail[1]], model)
    return None


def _segment(raw: bytes) -> str:
    if b"%" not in raw and b"\\" not in raw and raw.isascii():
        return raw.decode("ascii")  # the common case: nothing to decode, and "/" cannot appear
    try:
        text = unquote(raw.decode("ascii"), errors="strict")
    except (UnicodeDecodeError, ValueError):
        raise InvalidInput(f"request path segment {raw!r} is not valid percent-encoded UTF-8") from None
    if "/" in text or "\\" in text or "\0" in text:
        raise InvalidInput(f"request path segment {text!r} contains a path separator or NUL")
    return text


def _name(segment: str, what: str = "model name") -> str:
    if not segment or segment in (".", "..") or segment.startswith("."):
        raise InvalidInput(f"{what} {segment!r} is not valid; expected one path segment such as 'resnet50'")
    if len(segment.encode()) > _MAX_SEGMENT or not segment.isprintable():
        raise InvalidInput(f"{what} {segment!r} is too long or holds control characters")
    return segment


def _version(segment: str) -> str:
    if not segment.isascii() or not segment.isdigit():
        raise InvalidInput(f"model version {segment!r} is not a version number such as '1'")
    return segment
