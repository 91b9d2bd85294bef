"""One inbound message on its way through the engine: decode, submit, wait, encode.

Shared by request/response topics and pipelines. Every failure becomes an ``{"error": ...}`` payload with the
engine's own message, exactly as the socket API words it.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edged.engine import InferenceService, InferRequest, InferResponse, RequestedOutput
from edged.errors import EdgedError, PayloadError, PayloadTooLarge, RequestTimeout
from edged.mqtt._codecs import decode, encode, error_payload, top_k
from edged.mqtt._message import Answer, Inbound
from edged.protocol import DecodedRequest
from edged.repository import MAX_LABEL_BYTES, read_confined

RESULT_TIMEOUT_S = 120.0


class Slot:
    """A one-shot result slot filled by the engine's done callback (possibly before submit returns).

    A lock held from birth and released by ``set`` rather than an Event: one C object per message instead of
    an Event's Condition, lock and waiter list, built and notified in Python (docs/benchmarks.md).
    """

    __slots__ = ("_unset", "result")

    def __init__(self) -> None:
        self._unset = threading.Lock()
        self._unset.acquire()
        self.result: InferResponse | EdgedError | None = None

    def set(self, result: InferResponse | EdgedError) -> None:
        if self.result is None:  # one-shot: a second outcome would release an unlocked lock
            self.result = result
            self._unset.release()

    def wait(self, model: str, timeout_s: float) -> InferResponse | EdgedError:
        if self.result is None and not self._unset.acquire(timeout=timeout_s):
            return RequestTimeout(f"model {model}: no response within {timeout_s} s")
        return self.result if self.result is not None else RequestTimeout(f"model {model}: no response")


@dataclass
class Job:
    """What a worker knows about one message: where it came from, what it asks, where the answer goes."""

    message: Inbound
    model: str
    version: str
    codec: str
    reply_topic: str | None
    binary_ok: bool
    message_id: str
    input_name: str | None = None
    decoded: DecodedRequest | None = None
    slot: Slot = field(default_factory=Slot)
    answers: Answer | None = None  # for the result's id state (see _msgid)

    def parameters(self) -> dict[str, Any]:
        """edged's own fields in a result: its message id and the input's timestamp, for de-duplication and
        latency measurements."""
        return result_parameters(self.message, self.message_id,
                                 None if self.decoded is None else self.decoded.parameters.get("timestamp"))


def result_parameters(message: Inbound, message_id: str, stamp: Any = None) -> dict[str, Any]:
    """``input_timestamp`` is the caller's own (the request's ``parameters.timestamp``, else a ``timestamp`` user
    property, a number when it reads as one: user properties are strings), else the receive time in Unix
    seconds, the unit of the README's example; ``received_ns`` is always the receive time in nanoseconds. Once
    the default was nanoseconds and a user property came back as a string, so a consumer could not read the
    field without knowing which source had filled it."""
    if stamp is None:
        stamp = _number_or_text(message.user_property("timestamp"))
    if stamp is None:
        stamp = message.received_ns / 1e9
    return {"edged_message_id": message_id, "input_timestamp": stamp, "received_ns": message.received_ns}


def _number_or_text(text: str | None) -> Any:
    if text is None:
        return None
    try:
        return int(text)  # exactly, also past 2^53 (nanoseconds)
    except ValueError:
        pass
    try:
        number = float(text)
    except ValueError:
        return text
    return number if math.isfinite(number) else text  # NaN and infinities are not JSON


def start(service: InferenceService, job: Job, max_payload: int, max_elements: int, inline: bool) -> None:
    """Decode and submit; the outcome (response or error) lands in ``job.slot``."""
    request = prepare(service, job, max_payload, max_elements)
    if request is not None:
        try:
            service.submit(request, job.slot.set, inline)
        except EdgedError as e:
            job.slot.set(e)
        except (ValueError, TypeError, OverflowError) as e:
            job.slot.set(PayloadError(f"cannot submit the payload for model {job.model}: {e}"))


def start_many(service: InferenceService, jobs: list[Job], max_payload: int, max_elements: int) -> None:
    """Decode and submit jobs for one model version together: the dynamic batcher batches them, and the calling
    thread runs the batches itself while an instance is idle (no hand-off to an engine worker and back)."""
    calls = []
    for job in jobs:
        request = prepare(service, job, max_payload, max_elements)
        if request is not None:
            calls.append((request, job.slot.set))
    if calls:
        service.submit_many(jobs[0].model, jobs[0].version, calls, inline=True)


def prepare(service: InferenceService, job: Job, max_payload: int, max_elements: int) -> InferRequest | None:
    """The job's engine request, or None with the error already in ``job.slot``."""
    try:
        if len(job.message.payload) > max_payload:
            raise PayloadTooLarge(f"message is {len(job.message.payload)} bytes, more than the limit of "
                                  f"{max_payload}")
        if service.needs_load(job.model):
            service.ensure_loaded(job.model)
        config = service.model_config(job.model, job.version)
        job.decoded = decode(job.message, job.codec, config, job.input_name, max_elements)
        return _request(job, job.decoded)
    except EdgedError as e:
        job.slot.set(e)
    except (ValueError, TypeError, OverflowError) as e:  # a payload no check above foresaw: its error, not ours
        job.slot.set(PayloadError(f"cannot decode the payload for model {job.model}: {e}"))
    return None


def _request(job: Job, decoded: DecodedRequest) -> InferRequest:
    outputs = tuple(RequestedOutput(o.name, o.binary_data, o.class_count) for o in decoded.outputs)
    return InferRequest(job.model, decoded.inputs, job.version, decoded.id, outputs, decoded.parameters,
                        decoded.priority, decoded.timeout_us)


def finish(job: Job, labels: dict[str, list[str]] | None, k: int,
           deadline_s: float = RESULT_TIMEOUT_S) -> tuple[bytes, int | None, bool]:
    """(payload, binary header length, ok) for the job's outcome."""
    result = job.slot.wait(job.model, deadline_s)
    request_id = job.decoded.id if job.decoded is not None else ""
    if isinstance(result, EdgedError):
        return error_payload(str(result), request_id, job.parameters()), None, False
    if labels is not None:
        result.outputs = top_k(result.outputs, labels, k)
    try:
        body, length = encode(result, job.decoded or DecodedRequest({}), job.parameters(), job.binary_ok)
    except (EdgedError, TypeError, ValueError) as e:
        return error_payload(f"cannot encode the response: {e}", request_id, job.parameters()), None, False
    return body, length, True


def load_labels(service: InferenceService, model: str, version: str, override: str | None) -> dict[str, list[str]]:
    """Output name → labels, from the pipeline's label file or each output's label_filename."""
    config = service.model_config(model, version)
    labels: dict[str, list[str]] = {}
    for output in config.output:
        if override:  # the pipeline's labels key: edged.toml is the operator's, so it may name any file
            path = Path(override) if Path(override).is_absolute() else Path(service.repository) / model / override
            try:
                labels[output.name] = path.read_text(encoding="utf-8").splitlines()
            except OSError as e:
                raise PayloadError(f"model {model}: cannot read label file {path}: {e}") from e
        elif output.label_filename:  # the model config's: confined to the model folder
            raw = read_confined(Path(service.repository) / model, output.label_filename,
                                f"model {model}: label_filename of output {output.name!r}", max_bytes=MAX_LABEL_BYTES)
            labels[output.name] = raw.decode("utf-8", errors="replace").splitlines()
    return labels
