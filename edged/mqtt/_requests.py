"""Request/response over ``{prefix}/infer/{model}[/{version}]``.

The reply goes to the MQTT v5 ResponseTopic with the request's CorrelationData, or (MQTT 3.1.1) to the topic
named by ``reply_to`` in the JSON request. A request with no usable reply topic is dropped and counted, and so is
one whose reply topic is under edged's own prefix or a pipeline's input (``check_reply_topic``). A pool
of workers serves requests in any order; a full queue answers its oldest request with an error.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

from edged.config import MqttConfig
from edged.engine import InferenceService
from edged.errors import EdgedError, PayloadError, QueueFull
from edged.mqtt._codecs import BINARY_TYPE, HEADER_LENGTH, JSON_TYPE, codec_for, error_payload, reply_topic_in
from edged.mqtt._message import Inbound, Outbound
from edged.mqtt._metrics import Metrics
from edged.mqtt._msgid import Identity
from edged.mqtt._queue import BoundedQueue
from edged.mqtt._topics import check_reply_topic, subscription_filter
from edged.mqtt._work import Job, finish, result_parameters, start
from edged.supervision import HealthBoard, SupervisedPool

log = logging.getLogger(__name__)
MAX_ELEMENTS = 64 * 1024 * 1024


class Publisher(Protocol):
    def send(self, message: Outbound, wait_s: float | None = None,
             room_wait: Callable[[], bool] | None = None) -> None: ...
    def ack(self, message: Inbound) -> None: ...


class RequestHandler:
    def __init__(self, service: InferenceService, config: MqttConfig, v5: bool, publisher: Publisher,
                 metrics: Metrics, identify: Callable[[Inbound], Identity],
                 health: HealthBoard | None = None, *, prefix: str = "edged") -> None:
        """``prefix``: edged's own topics (``edged/{device_id}``), which no reply may go to."""
        self._service = service
        self._prefix = prefix
        self._inputs = tuple(subscription_filter(p.input) for p in config.pipelines)
        self._config = config
        self._v5 = v5
        self._publisher = publisher
        self._metrics = metrics
        self._identify = identify
        # QoS 1/2 requests are flow-controlled by the broker, and queue past the capacity (see _queue)
        self._queue: BoundedQueue[Job] = BoundedQueue(config.request_workers * 64, "drop_oldest",
                                                      hold_flow_controlled=True)
        self._health = (health or HealthBoard()).component("mqtt_requests")
        self._workers = SupervisedPool("edged-mqtt-request", config.request_workers, self._work, self._health)

    def start(self) -> None:
        self._workers.start()

    def stop(self, timeout_s: float) -> None:
        self._queue.close()
        self._workers.stop(timeout_s)
        left = self._queue.clear()
        if left:
            self._metrics.drop("shutdown", left)

    # --- network thread ------------------------------------------------------------------------------------
    def accept(self, message: Inbound, model: str, version: str) -> None:
        reply = self.reply_topic(message)
        if reply is None:
            self._publisher.ack(message)  # dropped and counted: nobody could be answered
            return
        ident = self._identify(message)
        # binary outputs need the user property Inference-Header-Content-Length: only for a v5 requester (one
        # that names a ResponseTopic); a "reply_to" requester speaks 3.1.1 and would get a blob it cannot split
        binary_ok = self._v5 and message.response_topic is not None
        job = Job(message, model, version, codec_for(message, "json"), reply, binary_ok, ident.message_id,
                  answers=ident.answers)
        dropped = self._queue.put(job, flow_controlled=message.qos > 0, size=len(message.payload))
        if dropped is not None:
            self._metrics.drop("backpressure")
            self.reply_error(dropped.message, QueueFull(
                f"the MQTT request queue is full ({self._config.request_workers * 64} requests); try again "
                "later"), dropped.reply_topic)

    def reject(self, message: Inbound, error: EdgedError) -> None:
        """Answer a request that cannot even be queued (bad topic, oversized) if it has a reply topic."""
        reply = self.reply_topic(message)
        if reply is None:
            self._publisher.ack(message)
            return
        self._metrics.error(type(error).__name__)
        self.reply_error(message, error, reply)

    def reply_error(self, message: Inbound, error: EdgedError, topic: str | None) -> None:
        if topic is None:
            self._publisher.ack(message)
            return
        ident = self._identify(message)
        # the same parameters as every other result (edged_message_id, input_timestamp, received_ns): a refusal
        # before any decoding, such as a bad topic, is a result consumers de-duplicate too
        body = error_payload(str(error), parameters=result_parameters(message, ident.message_id))
        self._publisher.send(Outbound(topic, body, message.qos,
                                      correlation_data=message.correlation_data, content_type=JSON_TYPE,
                                      message_id=ident.message_id, answers=ident.answers,
                                      on_stored=lambda: self._publisher.ack(message)))

    def reply_topic(self, message: Inbound) -> str | None:
        topic = message.response_topic
        if topic is None and len(message.payload) <= self._config.max_payload_bytes:
            topic = reply_topic_in(message)
        if topic is None:
            self._metrics.drop("no_reply_topic")
            log.info("mqtt: request on %r has no reply topic (v5 ResponseTopic or \"reply_to\"); dropped",
                     message.topic[:200])
            return None
        try:
            return check_reply_topic(topic, self._prefix, self._inputs)
        except PayloadError as e:
            self._metrics.drop("bad_topic")
            log.info("mqtt: request on %r: %s; dropped", message.topic[:200], e)
            return None

    # --- workers -------------------------------------------------------------------------------------------
    def _work(self) -> None:
        while not self._queue.finished:
            for job in self._queue.take(1):
                try:
                    self._serve(job)
                except Exception as e:  # one bad request must not end the worker
                    log.exception("mqtt: serving a request on %r failed", job.message.topic[:200])
                    self._metrics.error("internal")
                    self._health.error(e)
                    continue
                self._health.ok()

    def _serve(self, job: Job) -> None:
        start(self._service, job, self._config.max_payload_bytes, MAX_ELEMENTS, inline=True)
        body, header_length, ok = finish(job, None, 0)
        if not ok:
            self._metrics.error("request")
        user = ((HEADER_LENGTH, str(header_length)),) if header_length is not None else ()
        message = job.message
        self._publisher.send(Outbound(
            job.reply_topic or "", body, message.qos, correlation_data=message.correlation_data,
            content_type=BINARY_TYPE if header_length is not None else JSON_TYPE, user_properties=user,
            message_id=job.message_id, answers=job.answers, on_stored=lambda: self._publisher.ack(message)))
