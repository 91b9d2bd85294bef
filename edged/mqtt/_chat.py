"""Chat over ``{prefix}/chat``: an OpenAI chat-completions request in, OpenAI's answer out, on a local model.

The reply goes where inference replies go: the MQTT v5 ResponseTopic with the request's CorrelationData, or
(MQTT 3.1.1) the topic in the JSON field ``reply_to``, which is taken out of the request before it is read. A
request without a usable reply topic is dropped and counted. Without ``"stream": true`` the answer is one
``chat.completion`` message; with it, one ``chat.completion.chunk`` message per piece of text (the first
carrying the role, as OpenAI's first chunk does) and a final chunk with ``finish_reason``, the answer's tool
calls whole (``tools`` work as over HTTP) and ``usage`` when ``stream_options.include_usage`` asks. Pieces go
at QoS 0 outside the outbox: they are only a preview, and a reconnect would replay them out of order. The final
message (the whole answer, the final chunk or an error) goes through the outbox at the request's QoS, and the
request is acknowledged to the broker once it is stored, so a chat is answered at least once like any request.
Every refusal is an error reply in OpenAI's error JSON naming what was wrong.

Concurrency: ``request_workers`` threads each carry one chat at a time, at most that many times 8 wait (the
oldest is answered with an error when more arrive); the engine's `GenerationService` bounds the sequences.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from edged.config import MqttConfig
from edged.engine.generation import GenerationRequest, GenerationService
from edged.engine.generation_stream import Finished, GenerationStream, TextDelta
from edged.errors import EdgedError, PayloadError, PayloadTooLarge, QueueFull
from edged.mqtt._codecs import JSON_TYPE, REPLY_TO
from edged.mqtt._message import Inbound, Outbound
from edged.mqtt._metrics import Metrics
from edged.mqtt._msgid import Identity
from edged.mqtt._queue import BoundedQueue
from edged.mqtt._requests import Publisher
from edged.supervision import HealthBoard, SupervisedPool

log = logging.getLogger(__name__)
QUEUED_PER_WORKER = 8


class ChatOrder(Protocol):
    @property
    def request(self) -> GenerationRequest: ...
    @property
    def model(self) -> str: ...
    @property
    def stream(self) -> bool: ...
    @property
    def include_usage(self) -> bool: ...


class ChatCodec(Protocol):
    """OpenAI's chat shapes; the HTTP front end implements them (serving/chat_codec.py) and the daemon hands
    them in, because front ends never import each other."""

    def read(self, body: bytes) -> ChatOrder: ...
    def new_id(self) -> str: ...
    def completion(self, ident: str, model: str, text: str, finished: Finished) -> dict[str, Any]: ...
    def chunk(self, ident: str, model: str, delta: dict[str, str], finished: Finished | None = None,
              include_usage: bool = False) -> dict[str, Any]: ...
    def error(self, error: BaseException) -> dict[str, Any]: ...


@dataclass(frozen=True)
class _Chat:
    message: Inbound
    reply_topic: str


class ChatHandler:
    def __init__(self, generation: GenerationService, codec: ChatCodec, config: MqttConfig,
                 publisher: Publisher, metrics: Metrics, identify: Callable[[Inbound], Identity],
                 health: HealthBoard | None = None) -> None:
        self._generation = generation
        self._codec = codec
        self._config = config
        self._publisher = publisher
        self._metrics = metrics
        self._identify = identify
        self._queue: BoundedQueue[_Chat] = BoundedQueue(config.request_workers * QUEUED_PER_WORKER, "drop_oldest")
        self._health = (health or HealthBoard()).component("mqtt_chat")
        self._workers = SupervisedPool("edged-mqtt-chat", config.request_workers, self._work, self._health)
        self._streams: set[GenerationStream] = set()  # generating now, cancelled on stop

    def start(self) -> None:
        self._workers.start()

    def stop(self, timeout_s: float) -> None:
        self._queue.close()
        for stream in list(self._streams):
            stream.cancel()
        self._workers.stop(timeout_s)
        left = self._queue.clear()
        if left:
            self._metrics.drop("shutdown", left)

    # --- network thread ------------------------------------------------------------------------------------
    def accept(self, message: Inbound, reply_topic: str | None) -> None:
        """Queue a chat; ``reply_topic`` as the request handler found it (None: dropped, counted there)."""
        if reply_topic is None:
            self._publisher.ack(message)
            return
        self._metrics.add("chat_requests")
        dropped = self._queue.put(_Chat(message, reply_topic))
        if dropped is not None:
            self._metrics.drop("backpressure")
            self._reply_error(dropped, QueueFull(f"the MQTT chat queue is full "
                                                 f"({self._config.request_workers * QUEUED_PER_WORKER} chats); "
                                                 "try again later"))

    # --- workers -------------------------------------------------------------------------------------------
    def _work(self) -> None:
        while not self._queue.finished:
            for chat in self._queue.take(1):
                try:
                    self._serve(chat)
                except EdgedError as e:
                    self._metrics.error("chat")
                    self._reply_error(chat, e)
                except Exception as e:  # one bad chat must not end the worker
                    log.exception("mqtt: serving a chat on %r failed", chat.message.topic[:200])
                    self._metrics.error("internal")
                    self._health.error(e)
                    self._reply_error(chat, e)
                    continue
                self._health.ok()

    def _serve(self, chat: _Chat) -> None:
        order = self._codec.read(_request_body(chat.message, self._config.max_payload_bytes))
        stream = self._generation.submit(order.request)
        self._streams.add(stream)
        try:
            self._answer(chat, order, stream)
        finally:
            self._streams.discard(stream)

    def _answer(self, chat: _Chat, order: ChatOrder, stream: GenerationStream) -> None:
        ident = self._codec.new_id()
        parts: list[str] = []
        if order.stream:
            self._preview(chat, self._codec.chunk(ident, order.model, {"role": "assistant", "content": ""}))
        for event in stream:
            if isinstance(event, TextDelta):
                if order.stream:
                    self._preview(chat, self._codec.chunk(ident, order.model, {"content": event.text}))
                else:
                    parts.append(event.text)
            elif isinstance(event, Finished):
                if event.reason == "cancelled":  # stopping: the request stays unacknowledged, for redelivery
                    return
                doc = (self._codec.chunk(ident, order.model, {}, event, order.include_usage) if order.stream
                       else self._codec.completion(ident, order.model, "".join(parts), event))
                self._final(chat, orjson.dumps(doc))

    def _preview(self, chat: _Chat, doc: dict[str, Any]) -> None:
        message = chat.message
        self._publisher.send(Outbound(chat.reply_topic, orjson.dumps(doc), 0,
                                      correlation_data=message.correlation_data, content_type=JSON_TYPE))

    def _final(self, chat: _Chat, payload: bytes) -> None:
        message = chat.message
        ident = self._identify(message)
        self._publisher.send(Outbound(chat.reply_topic, payload, message.qos,
                                      correlation_data=message.correlation_data, content_type=JSON_TYPE,
                                      message_id=ident.message_id, answers=ident.answers,
                                      on_stored=lambda: self._publisher.ack(message)))

    def _reply_error(self, chat: _Chat, error: BaseException) -> None:
        self._final(chat, orjson.dumps(self._codec.error(error)))


def _request_body(message: Inbound, limit: int) -> bytes:
    """The OpenAI request: the payload without the MQTT 3.1.1 ``reply_to`` (not an OpenAI parameter)."""
    if len(message.payload) > limit:
        raise PayloadTooLarge(f"the chat request is {len(message.payload)} bytes; [mqtt] max_payload_bytes is "
                              f"{limit}")
    try:
        doc = orjson.loads(message.payload)
    except orjson.JSONDecodeError:
        return message.payload  # the codec names the problem, as /v1/chat/completions does
    if isinstance(doc, dict) and REPLY_TO in doc:
        if not isinstance(doc.pop(REPLY_TO), str):
            raise PayloadError(f"'{REPLY_TO}' must be a topic name")
        return orjson.dumps(doc)
    return message.payload
