"""The request dispatcher shared by every connection: routing, access control, draining, executor hops."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import replace
from typing import Any, NamedTuple, cast

import httptools

from edged.access import BodyBudget
from edged.config import ServerConfig
from edged.engine import InferenceService
from edged.errors import EdgedError, InvalidInput
from edged.serving._access import AccessPolicy
from edged.serving._api_key import API_ACTION, ApiKey
from edged.serving._api_key import HEADER as API_KEY_HEADER
from edged.serving._chat import ChatPath
from edged.serving._generate import GeneratePath
from edged.serving._handlers import Handlers, load_override
from edged.serving._http import Connection
from edged.serving._infer import InferPath
from edged.serving._limits import RETRY, ConnectionLimit, model_body_bound
from edged.serving._messages import WANTED_HEADERS, Incoming, Slot
from edged.serving._openai import openai_error, openai_error_response
from edged.serving._response import Response, error_for, error_response, json_response, render
from edged.serving._routes import SHARED_MEMORY_KINDS, SPECS, Kind, Route, RouteSpec, is_openai_path, match
from edged.serving._shm_routes import handle_shm
from edged.shm import SharedMemoryRegistry

log = logging.getLogger(__name__)

_LAZY_KINDS = frozenset({Kind.INFER, Kind.MODEL_METADATA, Kind.MODEL_CONFIG, Kind.GENERATE, Kind.GENERATE_STREAM})
_OPENAI_KINDS = frozenset({Kind.CHAT_COMPLETIONS, Kind.COMPLETIONS, Kind.OPENAI_MODELS, Kind.OPENAI_MODEL})
_OPENAI_ROUTES = "GET /v1/models, GET /v1/models/{model}, POST /v1/chat/completions and POST /v1/completions"
_ACTIONS = {Kind.INFER: "run inference", Kind.LOAD: "load models", Kind.UNLOAD: "unload models"}
# Request targets already matched, by their raw bytes: clients repeat a handful of URLs, so most requests skip
# URL parsing, percent-decoding and route matching. Bounded, so that a client cycling through names cannot
# grow it; past the bound new URLs are matched every time, as before.
_ROUTE_CACHE_SIZE = 256


class _Target(NamedTuple):
    route: Route
    spec: RouteSpec
    lazy: bool  # a route that loads a lazily loaded model on first use
    action: str  # what access control says the caller may not do; looked up once per URL (Kind hashes slowly)
    infer: bool  # an infer route: compared once per URL, since reading an Enum member through its class is slow
    openai: bool  # a /v1 route: its errors are OpenAI's JSON, not Triton's


def _target(route: Route) -> _Target:
    return _Target(route, SPECS[route.kind], route.kind in _LAZY_KINDS, _ACTIONS.get(route.kind, route.kind.value),
                   route.kind is Kind.INFER, route.kind in _OPENAI_KINDS)


class App:
    def __init__(self, service: InferenceService, config: ServerConfig, access: AccessPolicy,
                 handlers: Handlers, connection_limit: ConnectionLimit,
                 shared_memory: SharedMemoryRegistry | None = None,
                 daemon_actions: Mapping[str, Callable[[], Any]] | None = None,
                 api_key: ApiKey | None = None) -> None:
        self.service = service
        self.limits = config
        self.connection_limit = connection_limit
        self.max_connections = connection_limit.effective
        self.refused_connections = 0  # past max_connections, since start
        self.refused: dict[Connection, None] = {}  # refused connections not closed yet, oldest first
        self.body_budget = BodyBudget(config.max_inflight_body_bytes)
        self.access = access
        # the headers connections keep: edged's own and those [server.tcp_restricted] names
        self.wanted_headers = WANTED_HEADERS | access.tcp.header_names | ({API_KEY_HEADER} if api_key else set())
        self.api_key = api_key  # required of /v1 requests over TCP when set
        self.wanted_lengths = frozenset(len(name) for name in self.wanted_headers)
        self.handlers = handlers
        self.connections: set[Connection] = set()
        self.active = 0
        self.draining = False
        self.shared_memory = SharedMemoryRegistry() if shared_memory is None else shared_memory
        self.infer = InferPath(service, config.max_tensor_elements, self.shared_memory, access.shm_caller)
        self.end_of_input = self.infer.end_of_input
        self.chat = ChatPath(service)
        self.generate = GeneratePath(service)
        self._loop = asyncio.get_running_loop()
        self._targets: dict[bytes, _Target] = {}
        self._lazy_models = service.lazy_models
        self.daemon_actions = dict(daemon_actions or {})  # "ota/check" → blocking callable returning JSON

    def dispatch(self, connection: Connection, incoming: Incoming, slot: Slot) -> None:
        if incoming.method == b"HEAD":
            connection = cast("Connection", HeadOnly(connection))
        target = self._targets.get(incoming.url) or self._match(connection, incoming, slot)
        if target is None:
            return  # answered
        route, spec = target.route, target.spec
        if incoming.method != spec.method and (not spec.also or incoming.method != spec.also) and \
                (incoming.method != b"HEAD" or spec.method != b"GET"):
            self._answer(connection, incoming, slot, _wrong_method(incoming.method, target))
            return
        if self.draining:
            message = "the server is shutting down"
            self._answer(connection, incoming, slot, replace(openai_error_response(503, message, headers=RETRY),
                                                             close=True)
                         if target.openai else replace(error_response(503, message, True), extra_headers=RETRY))
            return
        permission = spec.permission  # _permitted's success without the call: open routes, and infer when open
        if connection.kind == "tcp" or (permission != "open" and (permission != "infer" or not self.access.infer_open)):
            try:
                if connection.kind == "tcp":
                    self.access.tcp.check(spec.category, permission, incoming.headers, target.action)
                else:
                    self.access.check(connection.peer, permission, target.action)
            except EdgedError as e:
                self._denied(connection, incoming, slot, target, e)
                return
        if target.lazy and route.model in self._lazy_models:
            self._in_executor(connection, incoming, slot, lambda: self.service.ensure_loaded(route.model),
                              lambda _: self._route(connection, incoming, slot, route))
            return
        if target.infer:
            self.infer.handle(connection, incoming, slot, route.model, route.version)
        else:
            self._route(connection, incoming, slot, route)

    def body_bound(self, url: bytes) -> tuple[str, int] | None:
        """(model, the largest body its inputs can need) for an infer URL of a loaded model, else None."""
        target = self._targets.get(url)
        if target is None:
            try:
                route = match(httptools.parse_url(url).path)
            except (httptools.HttpParserInvalidURLError, InvalidInput):
                return None  # dispatch answers it
            if route is None:
                return None
            target = _target(route)
        route = target.route
        if route.kind is not Kind.INFER or self.service.needs_load(route.model):
            return None
        try:
            bound = model_body_bound(self.service.model_config(route.model, route.version))
        except EdgedError:
            return None  # unknown or unready model: dispatch answers it
        return None if bound is None else (route.model, bound)

    def _match(self, connection: Connection, incoming: Incoming, slot: Slot) -> _Target | None:
        """The target of a URL not seen before; None when the request was answered with an error."""
        path = incoming.url
        try:
            path = httptools.parse_url(incoming.url).path
            route = match(path)
        except httptools.HttpParserInvalidURLError:
            self._answer(connection, incoming, slot, openai_error_response(400, "malformed request URL")
                         if is_openai_path(path) else error_response(400, "malformed request URL"))
            return None
        except InvalidInput as e:
            self._answer(connection, incoming, slot, openai_error(e) if is_openai_path(path) else error_for(e))
            return None
        if route is None:
            self._answer(connection, incoming, slot, _not_found(incoming.method, path))
            return None
        target = _target(route)
        if len(self._targets) < _ROUTE_CACHE_SIZE:
            self._targets[incoming.url] = target
        return target

    def _route(self, connection: Connection, incoming: Incoming, slot: Slot, route: Route) -> None:
        if route.kind is Kind.INFER:
            self.infer.handle(connection, incoming, slot, route.model, route.version)
        elif route.kind in _OPENAI_KINDS and not self._key_accepted(connection, incoming, slot):
            return
        elif route.kind is Kind.CHAT_COMPLETIONS or route.kind is Kind.COMPLETIONS:
            self.chat.handle(connection, incoming, slot, chat=route.kind is Kind.CHAT_COMPLETIONS)
        elif route.kind is Kind.GENERATE or route.kind is Kind.GENERATE_STREAM:
            self.generate.handle(connection, incoming, slot, route.model, route.version,
                                 stream_route=route.kind is Kind.GENERATE_STREAM)
        elif route.kind is Kind.OPENAI_MODELS:
            self._answer(connection, incoming, slot, self.chat.models())
        elif route.kind is Kind.OPENAI_MODEL:
            self._answer(connection, incoming, slot, self.chat.model(route.model))
        elif route.kind is Kind.LOAD or route.kind is Kind.UNLOAD:
            self._repository_change(connection, incoming, slot, route)
        elif route.kind is Kind.DAEMON_READ or route.kind is Kind.DAEMON_ACTION:
            self._daemon_action(connection, incoming, slot, route)
        elif route.kind is Kind.METRICS:  # rendered off the loop: with many models it takes long
            self._in_executor(connection, incoming, slot, self.handlers.metrics_render(),
                              lambda response: self._answer(connection, incoming, slot, response))
        elif route.kind in SHARED_MEMORY_KINDS:
            try:
                caller = self.access.shm_caller(connection.kind == "tcp", connection.peer, incoming.headers)
                response = handle_shm(self.shared_memory, route, incoming.body, caller)
            except EdgedError as e:
                response = error_for(e)
            self._answer(connection, incoming, slot, response)
        else:
            try:
                response = self.handlers.handle(route, incoming)
            except EdgedError as e:
                response = error_for(e)
            self._answer(connection, incoming, slot, response)

    def _key_accepted(self, connection: Connection, incoming: Incoming, slot: Slot) -> bool:
        if self.api_key is None or connection.kind != "tcp":
            return True
        try:
            self.api_key.check(incoming.headers)  # checked from the head already (Connection._check_key)
        except EdgedError as e:
            self.count_denied(API_ACTION)
            self._answer(connection, incoming, slot, openai_error(e))
            return False
        return True

    def count_denied(self, action: str) -> None:
        denied = self.handlers.denied
        denied[action] = denied.get(action, 0) + 1

    def _denied(self, connection: Connection, incoming: Incoming, slot: Slot, target: _Target,
                error: EdgedError) -> None:
        """Access is checked on every request, not once per connection: a user removed from a group loses
        access within the peer cache's lifetime, and TCP requests are judged by their own headers."""
        self.count_denied(target.action)
        log.warning("%s (model %s)", error, target.route.model or "-")
        self._answer(connection, incoming, slot, openai_error(error) if target.openai else error_for(error))

    def _repository_change(self, connection: Connection, incoming: Incoming, slot: Slot, route: Route) -> None:
        service = self.service
        model = route.model
        work: Callable[[], None]
        if route.kind is Kind.LOAD:
            body = incoming.body
            # the override is parsed with the load, off the loop: one of up to 1 MiB held every client ~0.4 s
            work = lambda: service.load_model(model, load_override(body, model))  # noqa: E731
        else:
            work = lambda: service.unload_model(model)  # noqa: E731
        log.info("%s of model %s requested by %s", route.kind.value, model, self.access.describe(connection.peer))
        self._in_executor(connection, incoming, slot, work,
                          lambda _: self._answer(connection, incoming, slot, Response(200, b"")))

    def _daemon_action(self, connection: Connection, incoming: Incoming, slot: Slot, route: Route) -> None:
        action = self.daemon_actions.get(route.model)
        if action is None:
            part = route.model.split("/", 1)[0]
            self._answer(connection, incoming, slot, error_response(404, f"{route.model}: [{part}] is not enabled "
                                                                         "in this daemon's config"))
            return
        if route.kind is Kind.DAEMON_ACTION:
            log.info("%s requested by %s", route.model, self.access.describe(connection.peer))
        self._in_executor(connection, incoming, slot, action,
                          lambda doc: self._answer(connection, incoming, slot, json_response(doc)))

    def _in_executor(self, connection: Connection, incoming: Incoming, slot: Slot, work: Callable[[], Any],
                     then: Callable[[Any], None]) -> None:
        """Run blocking ``work`` off the loop; ``then`` gets its result on the loop, errors answer the request."""
        future = self._loop.run_in_executor(None, work)

        def finished(done: asyncio.Future[Any] | Future[Any]) -> None:
            error = done.exception()
            if error is None:
                try:
                    then(done.result())
                except Exception as e:  # a loop callback: an escaping error would leave the slot unanswered
                    connection.fail(slot, e, incoming.keep_alive)
            elif isinstance(error, EdgedError):
                self._answer(connection, incoming, slot, error_for(error))
            else:
                log.error("unexpected error in a blocking request handler", exc_info=error)
                self._answer(connection, incoming, slot, error_response(500, f"internal error: {error}"))

        future.add_done_callback(finished)

    def _answer(self, connection: Connection, incoming: Incoming, slot: Slot, response: Response) -> None:
        close = response.close or not incoming.keep_alive
        connection.respond(slot, render(response, incoming.keep_alive), close)


class HeadOnly:
    """The connection as the GET route of a HEAD request sees it: every answer goes out as the GET's would, head
    only (RFC 9110 9.3.2: a server must take HEAD wherever it takes GET). A HEAD answered with a body, as the 405
    was, leaves bytes a keep-alive client reads as the start of its next response. Anything else is the
    connection's own."""

    def __init__(self, connection: Connection) -> None:
        self._connection = connection

    def respond(self, slot: Slot, data: bytes, close: bool = False) -> None:
        end = data.find(b"\r\n\r\n")
        self._connection.respond(slot, data if end < 0 else data[:end + 4], close)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._connection, name)


def _wrong_method(method: bytes, target: _Target) -> Response:
    """405 with ``Allow`` (RFC 9110 requires it: a route takes one method, a few two, and HEAD wherever GET), in
    the shape of the route's API."""
    spec = target.spec
    allowed = spec.method + (b", " + spec.also if spec.also else b"")
    message = f"method {method.decode('latin-1')} is not allowed here; use {allowed.decode()}"
    allow = ((b"allow", allowed + b", HEAD" if spec.method == b"GET" else allowed),)
    if target.openai:
        return openai_error_response(405, message, headers=allow)
    return replace(error_response(405, message), extra_headers=allow)


def _not_found(method: bytes, path: bytes) -> Response:
    """404 for a path no route has: OpenAI's error JSON under /v1 (its clients read the message from it, for
    /v1/embeddings say), Triton's ``{"error": "Not Found"}`` elsewhere, as Triton's clients expect."""
    if not is_openai_path(path):
        return error_response(404, "Not Found")
    shown = path[:200].decode("latin-1")
    return openai_error_response(404, f"unknown request URL {method.decode('latin-1')} {shown}: edged's OpenAI API "
                                      f"serves {_OPENAI_ROUTES}", code="unknown_url")
