"""The ``openai`` transport: a generative model measured through ``POST /v1/chat/completions``, reported as
GenAI-Perf reports an OpenAI endpoint.

Definitions (GenAI-Perf's): time to first token (TTFT) runs from sending the request to the first chunk that
carries generated text (the role-only chunk sent before generation starts does not count); inter-token latency
(ITL) of one request is (request latency - TTFT) / (output tokens - 1), so a request of one token has none;
output tokens/s is every output token of the measurement over its wall time, requests/s likewise. Token counts
come from the server's ``usage`` (``stream_options.include_usage`` when streaming), never from a guess.
Non-streaming requests have no TTFT or ITL: their rows report request latency only.

Concurrency N is N threads, each with one keep-alive connection and one request outstanding; the daemon runs in
another process, so the client's GIL is not the server's. Prompts are built from a fixed word list and
calibrated against the server's own prompt count before measuring, so ``prompt_tokens`` means the tokens the
model reads (chat template included).
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from edged.errors import ClientError

Progress = Callable[[str], None]
WORDS = ("the", "gate", "sensor", "reads", "motion", "near", "north", "door", "after", "dark", "so", "lights",
         "turn", "on", "and", "camera", "records", "until", "quiet")
CALIBRATION_ROUNDS = 5
TIMEOUT_S = 120.0


@dataclass(frozen=True)
class Load:
    """One measurement's request shape."""

    model: str
    prompt_tokens: int
    output_tokens: int
    stream: bool


@dataclass(frozen=True)
class GenResult:
    label: str
    transport: str
    model: str
    concurrency: int
    stream: bool
    requests: int
    errors: int
    seconds: float
    prompt_tokens: float  # mean per request, as the server counted them
    output_tokens: float  # mean per request
    output_tokens_per_s: float
    requests_per_s: float
    latency_p50_ms: float
    latency_p99_ms: float
    ttft_p50_ms: float | None  # None when not streaming
    ttft_p99_ms: float | None
    itl_p50_ms: float | None  # None when not streaming or no request produced two tokens
    itl_p99_ms: float | None

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Sample:
    latency_s: float
    ttft_s: float | None
    prompt_tokens: int
    output_tokens: int


@dataclass
class Tally:
    samples: list[Sample] = field(default_factory=list)
    errors: int = 0
    first_error: str = ""
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, sample: Sample | None, error: str = "") -> None:
        with self.lock:
            if sample is not None:
                self.samples.append(sample)
                return
            self.errors += 1
            self.first_error = self.first_error or error


class _Client:
    """One keep-alive connection to the daemon (its Unix socket, or loopback TCP when a port is named)."""

    def __init__(self, target: dict[str, Any]) -> None:
        from edged.client import UnixHTTPConnection

        self._connection: http.client.HTTPConnection
        if target.get("unix"):
            self._connection = UnixHTTPConnection(target["unix"], TIMEOUT_S)
        else:
            self._connection = http.client.HTTPConnection(target["host"], target["port"], timeout=TIMEOUT_S)

    def close(self) -> None:
        self._connection.close()

    def chat(self, load: Load, prompt: str) -> Sample:
        body: dict[str, Any] = {"model": load.model, "messages": [{"role": "user", "content": prompt}],
                                "max_tokens": load.output_tokens, "temperature": 0}
        if load.stream:
            body |= {"stream": True, "stream_options": {"include_usage": True}}
        start = time.perf_counter()
        try:
            self._connection.request("POST", "/v1/chat/completions", json.dumps(body).encode(),
                                     {"content-type": "application/json"})
            response = self._connection.getresponse()
            if response.status != 200:
                raise ClientError(f"HTTP {response.status}: {response.read()[:300].decode(errors='replace')}")
            if not load.stream:
                usage = json.loads(response.read())["usage"]
                return Sample(time.perf_counter() - start, None, usage["prompt_tokens"], usage["completion_tokens"])
            return _read_stream(response, start)
        except (OSError, http.client.HTTPException, ValueError, KeyError) as e:
            self._connection.close()  # reconnects on the next request
            raise ClientError(f"{type(e).__name__}: {e}") from e


def _read_stream(response: http.client.HTTPResponse, start: float) -> Sample:
    first: float | None = None
    usage: dict[str, int] | None = None
    while True:
        line = response.readline()
        if not line:
            raise ClientError("the stream ended before data: [DONE]")
        if not line.startswith(b"data: "):
            continue
        data = line[6:].strip()
        if data == b"[DONE]":
            break
        event = json.loads(data)
        if "error" in event:
            raise ClientError(f"error event: {event['error'].get('message')}")
        if event.get("usage"):
            usage = event["usage"]
        choices = event.get("choices") or [{}]
        if first is None and choices[0].get("delta", {}).get("content"):
            first = time.perf_counter() - start
    end = time.perf_counter() - start
    response.read()  # the chunked terminator, so the connection can carry the next request
    if usage is None:
        raise ClientError("the stream carried no usage chunk")
    return Sample(end, first, usage["prompt_tokens"], usage["completion_tokens"])


def calibrated_prompt(target: dict[str, Any], load: Load) -> str:
    """A prompt of ``load.prompt_tokens`` tokens as the server counts them, or as near as words allow."""
    client = _Client(target)
    try:
        words = max(1, load.prompt_tokens)
        probe = Load(load.model, load.prompt_tokens, 1, False)
        for _ in range(CALIBRATION_ROUNDS):
            counted = client.chat(probe, _words(words)).prompt_tokens
            if counted == load.prompt_tokens:
                break
            # tokens per word is near constant past the template's fixed part, so one step lands close
            words = max(1, words + round((load.prompt_tokens - counted) * words / max(counted, 1)))
        return _words(words)
    finally:
        client.close()


def _words(count: int) -> str:
    return " ".join(WORDS[i % len(WORDS)] for i in range(count))


def measure(label: str, target: dict[str, Any], load: Load, prompt: str, concurrency: int,
            duration_s: float) -> GenResult:
    tally = Tally()
    deadline = time.perf_counter() + duration_s

    def worker() -> None:
        client = _Client(target)
        try:
            while True:  # at least one request each, however late the thread started
                try:
                    tally.add(client.chat(load, prompt))
                except ClientError as e:
                    tally.add(None, str(e))
                if time.perf_counter() >= deadline:
                    break
        finally:
            client.close()

    start = time.perf_counter()
    threads = [threading.Thread(target=worker, name=f"bench-openai-{i}") for i in range(concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return summarize(label, load, concurrency, tally, time.perf_counter() - start)


def summarize(label: str, load: Load, concurrency: int, tally: Tally, seconds: float,
              transport: str = "openai") -> GenResult:
    samples = tally.samples
    if not samples:
        raise ClientError(f"{label}: every request failed ({tally.first_error}); is {load.model} a loaded "
                          "generative model (GET /v1/models)?")
    outputs = sum(s.output_tokens for s in samples)
    latency = _percentiles([s.latency_s for s in samples])
    ttft = _percentiles([s.ttft_s for s in samples if s.ttft_s is not None])
    itl = _percentiles([(s.latency_s - s.ttft_s) / (s.output_tokens - 1) for s in samples
                        if s.ttft_s is not None and s.output_tokens > 1])
    return GenResult(label, transport, load.model, concurrency, load.stream, len(samples), tally.errors, seconds,
                     sum(s.prompt_tokens for s in samples) / len(samples), outputs / len(samples),
                     outputs / seconds, len(samples) / seconds, latency[0] or 0.0, latency[1] or 0.0,
                     *ttft, *itl)


def _percentiles(values_s: list[float]) -> tuple[float | None, float | None]:
    if not values_s:
        return None, None
    p50, p99 = np.percentile(np.asarray(values_s, dtype=np.float64) * 1000.0, (50, 99))
    return float(p50), float(p99)


def gen_table(results: list[GenResult]) -> str:
    width = max([30, *(len(r.label) for r in results)])
    header = (f"{'scenario':<{width}} {'conc':>4} {'TTFT p50 ms':>11} {'TTFT p99 ms':>11} {'ITL p50 ms':>10} "
              f"{'ITL p99 ms':>10} {'out tok/s':>9} {'req/s':>7} {'in tok':>6} {'out tok':>7} {'errors':>6}")
    lines = [header, "-" * len(header)]
    for r in results:
        lines.append(f"{r.label:<{width}} {r.concurrency:>4} {_ms(r.ttft_p50_ms, 11)} {_ms(r.ttft_p99_ms, 11)} "
                     f"{_ms(r.itl_p50_ms, 10)} {_ms(r.itl_p99_ms, 10)} {r.output_tokens_per_s:>9.1f} "
                     f"{r.requests_per_s:>7.2f} {r.prompt_tokens:>6.0f} {r.output_tokens:>7.1f} {r.errors:>6}")
    return "\n".join(lines)


def _ms(value: float | None, width: int) -> str:
    return f"{'-':>{width}}" if value is None else f"{value:>{width}.2f}"
