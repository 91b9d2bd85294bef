"""Sensor pipelines: ``input`` topic filter → decode → model → optional top-k → ``output`` topic template.

One worker per pipeline takes whatever has queued (up to ``max_in_flight``), submits it all to the engine in one
call so the dynamic batcher can batch it, and runs those batches itself while a model instance is idle (no hop
to an engine worker and back), then publishes the results in arrival order: results keep the order of their
input topic. ``handoffs`` counts the times the worker had to be woken (checked per message by
tests/mqtt/test_mqtt_outbox_cost.py). Failures are published to the output topic as ``{"error": ...}`` and
counted; an input for a model the repository does not have (yet: it may be loaded later) also counts under
``errors{kind="model_missing"}``, and the start says so once. ``check_no_loops`` refuses pipelines whose
results would come back to them as inputs.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Sequence

from edged.config import MqttConfig, PipelineConfig
from edged.engine import InferenceService
from edged.errors import ConfigError, EdgedError, ModelNotFound, PayloadError
from edged.mqtt._codecs import BINARY_TYPE, HEADER_LENGTH, JSON_TYPE, codec_for
from edged.mqtt._message import Inbound, Outbound
from edged.mqtt._metrics import Metrics
from edged.mqtt._msgid import Identity
from edged.mqtt._queue import BoundedQueue
from edged.mqtt._requests import MAX_ELEMENTS, Publisher
from edged.mqtt._topics import (
    check_filter,
    check_template,
    filter_matches,
    filters_overlap,
    render,
    subscription_filter,
    template_may_match,
    wildcard_count,
)
from edged.mqtt._work import Job, finish, load_labels, start_many
from edged.supervision import HealthBoard, SupervisedThread

log = logging.getLogger(__name__)


def check_no_loops(pipelines: Sequence[PipelineConfig]) -> None:
    """Refuse pipelines whose output template can match their own input filter, or another pipeline's that leads
    back to them: edged subscribes to its inputs, so each result (and each error result) would come back as a
    new input, forever (one input gave ~900 messages in 5 s)."""
    inputs = [subscription_filter(p.input) for p in pipelines]
    feeds = {i: [j for j, q in enumerate(inputs) if template_may_match(p.output, inputs[i], q)]
             for i, p in enumerate(pipelines)}
    for start in feeds:
        path = _path_back(feeds, start)
        if path is not None:
            raise ConfigError("; ".join(
                f"mqtt.pipelines[{a}] output {pipelines[a].output!r} can match "
                f"{'its own' if a == b else f'mqtt.pipelines[{b}]'} input {pipelines[b].input!r}"
                for a, b in itertools.pairwise(path))
                + ": its results would come back as inputs, forever; change the output topic so that no input "
                "filter matches it")


def check_outside_prefix(pipelines: Sequence[PipelineConfig], prefix: str) -> None:
    """Refuse pipelines that read or write edged's own topics (``edged/{device_id}/...``): an input there feeds
    edged's status, requests and telemetry to the model (and a request matched by both a pipeline and the infer
    subscription is answered twice); an output there publishes results as the device's status or as requests.
    The same rule as a request's reply topic (`check_reply_topic`)."""
    own = f"{prefix}/+/#"
    for i, p in enumerate(pipelines):
        input_filter = subscription_filter(p.input)
        if filters_overlap(input_filter, own):
            raise ConfigError(f"mqtt.pipelines[{i}].input {p.input!r} can match edged's own topics under {prefix}/ "
                              "(status, infer, chat, telemetry, ota, commands): they would be fed to the model; "
                              f"subscribe to topics outside {prefix}/")
        if template_may_match(p.output, input_filter, f"{prefix}/#"):
            raise ConfigError(f"mqtt.pipelines[{i}].output {p.output!r} can be a topic under edged's own {prefix}/: "
                              "results would be published as the device's status, requests or commands; publish "
                              f"to topics outside {prefix}/")


def _path_back(feeds: dict[int, list[int]], start: int) -> list[int] | None:
    """A path of pipelines from ``start`` back to ``start`` (its first hop included), or None."""
    stack, seen = [(start, [start])], set()
    while stack:
        node, path = stack.pop()
        for nxt in feeds[node]:
            if nxt == start:
                return [*path, start]
            if nxt not in seen:
                seen.add(nxt)
                stack.append((nxt, [*path, nxt]))
    return None


class Pipeline:
    def __init__(self, index: int, service: InferenceService, pipeline: PipelineConfig, config: MqttConfig,
                 v5: bool, publisher: Publisher, metrics: Metrics, identify: Callable[[Inbound], Identity],
                 health: HealthBoard | None = None) -> None:
        try:
            # what its messages' topics match: a shared subscription's messages come without "$share/{group}/"
            self.filter = subscription_filter(pipeline.input)
            check_filter(self.filter)
            check_template(pipeline.output, wildcard_count(self.filter))
        except PayloadError as e:
            raise EdgedError(f"mqtt.pipelines[{index}]: {e}") from e
        self.config = pipeline
        self.name = f"pipelines[{index}]"
        self._service = service
        self._max_payload = config.max_payload_bytes
        self._v5 = v5
        self._publisher = publisher
        self._metrics = metrics
        self._identify = identify
        self._queue: BoundedQueue[Job] = BoundedQueue(pipeline.max_in_flight, pipeline.backpressure)
        self._labels: dict[str, list[str]] | None = None
        self._health = (health or HealthBoard()).component(f"mqtt_{self.name}")
        self._thread: SupervisedThread | None = None

    @property
    def queued(self) -> int:
        return len(self._queue)

    def match(self, topic: str) -> tuple[str, ...] | None:
        return filter_matches(self.filter, topic)

    def start(self) -> None:
        if self.config.model not in self._service.model_names():
            log.warning("mqtt %s: model %r is not in the repository (yet); until it is loaded each input on %r gets "
                        "an error result on %r, counted as errors{kind=\"model_missing\"}", self.name,
                        self.config.model, self.config.input, self.config.output)
        self._thread = SupervisedThread(f"edged-mqtt-{self.name}", self._work, self._health)
        self._thread.start()

    def stop(self, timeout_s: float) -> None:
        self._queue.close()
        if self._thread is not None:
            self._thread.stop()
            self._thread.join(timeout_s)
        left = self._queue.clear()
        if left:
            self._metrics.drop("shutdown", left)

    # --- network thread ------------------------------------------------------------------------------------
    def accept(self, message: Inbound, captures: tuple[str, ...]) -> None:
        try:
            topic = render(self.config.output, captures)
        except PayloadError as e:
            self._metrics.drop("bad_topic")
            self._publisher.ack(message)
            log.info("mqtt %s: input %r gives no valid output topic: %s", self.name, message.topic[:200], e)
            return
        codec = codec_for(message, self.config.codec) if self._v5 else self.config.codec
        ident = self._identify(message)
        job = Job(message, self.config.model, self.config.version or "", codec, topic, self._v5,
                  ident.message_id, self.config.input_name, answers=ident.answers)
        # the broker sends only so many unacknowledged QoS 1/2 inputs (_settings.receive_maximum_of)
        dropped = self._queue.put(job, flow_controlled=message.qos > 0, size=len(message.payload))
        if dropped is job:  # closed: not acknowledged, so the broker redelivers it after a restart
            self._metrics.drop("shutdown")
        elif dropped is not None:
            self._metrics.drop("backpressure")
            self._publisher.ack(dropped.message)
            log.debug("mqtt %s: dropped a message from %r (backpressure)", self.name, dropped.message.topic)

    # --- worker --------------------------------------------------------------------------------------------
    def _work(self) -> None:
        while not self._queue.finished:
            batch = self._queue.take(self.config.max_in_flight)
            try:
                self._run(batch)
            except Exception as e:  # one batch's failure is that batch's; the next batch runs at once
                log.exception("mqtt %s: a batch of %d failed", self.name, len(batch))
                self._metrics.error("internal", len(batch))
                self._health.error(e)
                continue
            if batch:
                self._health.ok()

    @property
    def handoffs(self) -> int:
        """Times the worker was woken for queued inputs (once per burst); the engine counts its own."""
        return self._queue.wakeups

    def _run(self, batch: list[Job]) -> None:
        if not batch:
            return
        start_many(self._service, batch, self._max_payload, MAX_ELEMENTS)
        labels = self._label_table()
        for job in batch:
            body, header_length, ok = finish(job, labels, self.config.top_k)
            if not ok:
                self._metrics.error("model_missing" if isinstance(job.slot.result, ModelNotFound) else "pipeline")
            # waiting for room in a full outbox helps only while the network thread reads (the PUBACKs)
            self._publisher.send(self._result(job, body, header_length), room_wait=self._network_reads)

    def _network_reads(self) -> bool:
        return not self._queue.producer_waits()

    def _result(self, job: Job, body: bytes, header_length: int | None) -> Outbound:
        user = ((HEADER_LENGTH, str(header_length)),) if header_length is not None else ()
        message = job.message
        return Outbound(job.reply_topic or "", body, self.config.qos,
                        content_type=BINARY_TYPE if header_length is not None else JSON_TYPE, user_properties=user,
                        message_id=job.message_id, answers=job.answers, on_stored=lambda: self._publisher.ack(message))

    def _label_table(self) -> dict[str, list[str]] | None:
        if self.config.postprocess != "topk":
            return None
        if self._labels is None:
            try:
                self._labels = load_labels(self._service, self.config.model, self.config.version or "",
                                           self.config.labels)
            except EdgedError as e:
                log.warning("mqtt %s: no labels (%s); top-k results carry indices only", self.name, e)
                return {}
        return self._labels
