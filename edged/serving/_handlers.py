"""The routes other than infer: health, metadata, config, statistics, repository, metrics and edged's own.

Each handler is a plain function of the service and the request; the App decides which run on the loop and
which (load, unload) run in the executor.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import orjson

from edged.engine import InferenceService
from edged.errors import InvalidInput, ModelConfigError, Unavailable
from edged.repository import check_override_size, model_config_from_json, model_config_to_json
from edged.repository.model_config import ModelConfig
from edged.serving._messages import Incoming
from edged.serving._metrics import render_metrics
from edged.serving._response import PROMETHEUS, Response, error_response, json_response
from edged.serving._routes import Kind, Route

_EMPTY_OK = Response(200, b"")
_EMPTY_BAD = Response(400, b"")


class TelemetryReader(Protocol):
    def snapshot(self) -> dict[str, Any]: ...
    def render_prometheus(self) -> str: ...


class Handlers:
    def __init__(self, service: InferenceService, telemetry: TelemetryReader | None,
                 status_provider: Callable[[], dict[str, Any]] | None, openapi: bytes,
                 metrics_provider: Callable[[], str] | None = None) -> None:
        self._service = service
        self._metrics_provider = metrics_provider
        self._telemetry = telemetry
        self._status_provider = status_provider
        self._openapi = openapi
        self._started = time.monotonic()
        self.denied: dict[str, int] = {}
        self.draining = False
        self.status_extra: Callable[[], dict[str, Any]] = dict
        self.metrics_extra: Callable[[], str] = str  # the server's own gauges (connections, bodies, regions)

    def handle(self, route: Route, incoming: Incoming) -> Response:
        handler = _TABLE[route.kind]
        return handler(self, route, incoming)

    def _server_metadata(self, route: Route, incoming: Incoming) -> Response:
        doc = self._service.server_metadata()
        # Triton's generate extension is HTTP-only (no gRPC form), so it is added here, and only while a
        # generative model is ready: before that every generate call would fail
        if self._service.generation.generative_models():
            doc = {**doc, "extensions": [*doc["extensions"], "generate"]}
        return json_response(doc)

    def _not_served(self, route: Route, incoming: Incoming) -> Response:
        """Triton's trace and logging extensions, answered as a Triton built without them (503, its code for
        UNAVAILABLE), so a client learns the feature is absent rather than the path mistyped."""
        if route.kind is Kind.TRACE_SETTING:
            raise Unavailable("the server does not support tracing: edged has no trace settings to read or "
                              "update (Triton's trace extension; gRPC TraceSetting answers UNIMPLEMENTED)")
        raise Unavailable("the server does not support dynamic logging: edged's log settings are fixed at start "
                          "(Triton's logging extension; gRPC LogSettings answers UNIMPLEMENTED)")

    def _live(self, route: Route, incoming: Incoming) -> Response:
        return _EMPTY_OK if self._service.live else _EMPTY_BAD

    def _ready(self, route: Route, incoming: Incoming) -> Response:
        return _EMPTY_OK if self._service.ready and not self.draining else _EMPTY_BAD

    def _model_ready(self, route: Route, incoming: Incoming) -> Response:
        if self._service.model_ready(route.model, route.version):
            return _EMPTY_OK
        version = f" version {route.version}" if route.version else ""
        return error_response(400, f"Model version not ready: model {route.model!r}{version}")  # Triton's words

    def _model_metadata(self, route: Route, incoming: Incoming) -> Response:
        return json_response(self._service.model_metadata(route.model, route.version))

    def _model_config(self, route: Route, incoming: Incoming) -> Response:
        return json_response(model_config_to_json(self._service.model_config(route.model, route.version)))

    def _stats(self, route: Route, incoming: Incoming) -> Response:
        return json_response(self._service.statistics(route.model, route.version))

    def _index(self, route: Route, incoming: Incoming) -> Response:
        body = _json_object(incoming.body, "repository index request")
        ready = body.get("ready", False)
        if not isinstance(ready, bool):
            raise InvalidInput(f"repository index: \"ready\" must be true or false, found {ready!r}")
        return json_response(self._service.repository_index(ready_only=ready))

    def _metrics(self, route: Route, incoming: Incoming) -> Response:
        return self.metrics_render()()

    def metrics_render(self) -> Callable[[], Response]:
        """The parts of /metrics that live on the event loop, read now; the returned call renders the engine's
        families, per model version, and may run on another thread: with hundreds of models that is most of
        the work, and it must not stall the loop (every other client, the watchdog)."""
        extra = self._telemetry.render_prometheus() if self._telemetry is not None else ""
        if self._metrics_provider is not None:  # the daemon's own parts: memory, MQTT
            extra += self._metrics_provider()
        extra += self.metrics_extra()
        denied = dict(self.denied)  # a copy: the loop counts refusals while the render reads
        service = self._service
        return lambda: Response(200, render_metrics(service, denied, extra).encode(), PROMETHEUS)

    def _status(self, route: Route, incoming: Incoming) -> Response:
        service = self._service
        models = [{"name": v.config.name, "version": v.version_str, "state": v.state.value,
                   "exec_p50_us": v.exec_p50_us, "instances": v.describe_instances(),
                   "inference_count": v.stats.inference_count} for v in service.loaded_versions()]
        doc: dict[str, Any] = {**service.server_metadata(), "live": service.live,
                               "ready": service.ready and not self.draining,
                               "uptime_s": round(time.monotonic() - self._started, 3), "models": models,
                               **self.status_extra()}
        if self._status_provider is not None:
            doc.update(self._status_provider())
        return json_response(doc)

    def _telemetry_snapshot(self, route: Route, incoming: Incoming) -> Response:
        if self._telemetry is None:
            return error_response(404, "telemetry is not enabled on this daemon")
        return json_response(self._telemetry.snapshot())

    def _openapi_doc(self, route: Route, incoming: Incoming) -> Response:
        return Response(200, self._openapi)


_TABLE: dict[Kind, Callable[[Handlers, Route, Incoming], Response]] = {
    Kind.SERVER_METADATA: Handlers._server_metadata, Kind.LIVE: Handlers._live, Kind.READY: Handlers._ready,
    Kind.ALL_STATS: Handlers._stats, Kind.MODEL_METADATA: Handlers._model_metadata,
    Kind.MODEL_READY: Handlers._model_ready, Kind.MODEL_CONFIG: Handlers._model_config,
    Kind.MODEL_STATS: Handlers._stats, Kind.REPOSITORY_INDEX: Handlers._index, Kind.METRICS: Handlers._metrics,
    Kind.STATUS: Handlers._status, Kind.TELEMETRY: Handlers._telemetry_snapshot,
    Kind.OPENAPI: Handlers._openapi_doc, Kind.TRACE_SETTING: Handlers._not_served,
    Kind.LOG_SETTINGS: Handlers._not_served,
}


def load_override(body: bytes | bytearray, model: str) -> ModelConfig | None:
    """The ``parameters.config`` of a load request (Triton's JSON model config as a string), if any."""
    doc = _json_object(body, f"load request for model {model}")
    params = doc.get("parameters", {})
    if not isinstance(params, dict):
        raise InvalidInput(f"load request for model {model}: \"parameters\" must be an object")
    unsupported = sorted(key for key in params if key != "config")
    if unsupported:
        raise InvalidInput(f"load request for model {model}: unsupported parameters {unsupported} (edged accepts "
                           "only \"config\"; model files come from the repository)")
    raw = params.get("config")
    if raw is None:
        return None
    if not isinstance(raw, str):
        raise InvalidInput(f"load request for model {model}: parameters.config must be a JSON string")
    check_override_size(raw, model)
    try:
        config = model_config_from_json(orjson.loads(raw), f"load request for {model}")
    except orjson.JSONDecodeError as e:
        raise InvalidInput(f"load request for model {model}: parameters.config is not valid JSON: {e}") from None
    except ModelConfigError as e:  # its reason: the error's path already says "load request for <model>"
        raise InvalidInput(f"load request for model {model}: {e.reason}") from None
    if config.name and config.name != model:
        raise InvalidInput(f"load request for model {model}: the config names model {config.name!r}")
    return config


def _json_object(body: bytes | bytearray, what: str) -> Mapping[str, Any]:
    if not body.strip():
        return {}
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as e:
        raise InvalidInput(f"{what}: body is not valid JSON: {e}") from None
    if not isinstance(doc, dict):
        raise InvalidInput(f"{what}: body must be a JSON object")
    return doc
