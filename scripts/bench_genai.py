"""Time to first token and cost per output token: streaming chat completions over edged's Unix socket against
ONNX Runtime GenAI's generator loop in process, on the bundled tiny Llama, side by side in one run.

The server runs in its own process (as the daemon does); the client sends one streaming request at a time on a
raw Unix socket and timestamps the first content event and the final ``[DONE]``. Greedy decoding, the same
prompt and token count for both; runs alternate between the two and the medians are printed.

    .venv/bin/python scripts/bench_genai.py [--runs 30] [--tokens 64] [--concurrency 8] [--max-sequences 8]

``--concurrency N`` also measures aggregate output tokens/s: N streaming clients at once against the server
(``max_sequences`` of the model set by ``--max-sequences``) beside N in-process generators run one after another.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / "models" / "tiny_llama"
MESSAGES = [{"role": "user", "content": "Tokens arrive one at a time. What does the first token cost?"}]


def serve_edged(path: str, max_sequences: int) -> None:
    import uvloop

    from edged.config import ModelsConfig, ServerConfig
    from edged.engine import InferenceService
    from edged.serving import HttpServer, open_listeners

    repo = Path(tempfile.mkdtemp())
    shutil.copytree(MODEL, repo / "tiny_llama")
    (repo / "tiny_llama" / "config.pbtxt").write_text(
        'name: "tiny_llama"\nbackend: "onnxruntime_genai"\n'
        f'parameters {{ key: "max_sequences" value: {{ string_value: "{max_sequences}" }} }}\n')
    service = InferenceService(repo, ModelsConfig())
    service.start()
    config = ServerConfig()

    async def main() -> None:
        listeners = open_listeners(config, Path(path), environ={})
        server = HttpServer(service, config)
        await server.start([item.socket for item in listeners])
        print("ready", flush=True)
        await asyncio.Event().wait()
    uvloop.run(main())


def over_socket(path: str, tokens: int) -> tuple[float, float, int]:
    """(seconds to the first content event, seconds per later token, tokens generated)."""
    body = json.dumps({"model": "tiny_llama", "messages": MESSAGES, "max_tokens": tokens, "temperature": 0,
                       "stream": True, "stream_options": {"include_usage": True}}).encode()
    request = (b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
               b"content-length: %d\r\n\r\n%s" % (len(body), body))
    with socket.socket(socket.AF_UNIX) as sock:
        sock.connect(path)
        began = time.perf_counter()
        sock.sendall(request)
        first = 0.0
        seen = b""
        while b"data: [DONE]" not in seen:
            data = sock.recv(65536)
            if not data:
                raise SystemExit("the server closed the stream")
            seen += data
            if not first and seen.count(b'"content":') >= 2:  # the role event carries an empty content
                first = time.perf_counter()
        done = time.perf_counter()
    usage = json.loads(seen[seen.rindex(b'"usage":') + 8:].split(b"}", 1)[0] + b"}")
    count = usage["completion_tokens"] + 1  # the end-of-sequence token is generated too, and not counted
    return first - began, (done - first) / max(1, count - 1), count


def in_process(tokens: int) -> tuple[float, float, int]:
    import onnxruntime_genai as og
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    model, tokenizer = _og_model()
    template = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True).from_string(
        (MODEL / "1" / "chat_template.jinja").read_text())
    began = time.perf_counter()
    ids = tokenizer.encode(template.render(messages=MESSAGES, tools=None, add_generation_prompt=True))
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(ids) + tokens, do_sample=False)
    generator = og.Generator(model, params)
    stream = tokenizer.create_stream()
    generator.append_tokens(ids)
    first = 0.0
    count = 0
    while not generator.is_done():
        generator.generate_next_token()
        stream.decode(int(generator.get_next_tokens()[0]))
        count += 1
        if count == 1:
            first = time.perf_counter()
    done = time.perf_counter()
    return first - began, (done - first) / max(1, count - 1), count


def concurrent(path: str, tokens: int, clients: int) -> tuple[float, int]:
    """(aggregate output tokens/s, tokens) of ``clients`` streaming requests sent at once."""
    results: list[tuple[float, float, int]] = []
    threads = [threading.Thread(target=lambda: results.append(over_socket(path, tokens))) for _ in range(clients)]
    began = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - began
    count = sum(r[2] for r in results)
    return count / elapsed, count


def one_after_another(tokens: int, runs: int) -> tuple[float, int]:
    """(aggregate output tokens/s, tokens) of ``runs`` in-process generators run one after another."""
    began = time.perf_counter()
    count = sum(in_process(tokens)[2] for _ in range(runs))
    return count / (time.perf_counter() - began), count


def _cpu_s(pid: int) -> float:
    """User plus system CPU seconds of process ``pid`` so far (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


_CACHE: dict[str, object] = {}


def _og_model() -> tuple[object, object]:
    import onnxruntime_genai as og

    if "model" not in _CACHE:
        _CACHE["model"] = og.Model(str(MODEL / "1"))
        _CACHE["tokenizer"] = og.Tokenizer(_CACHE["model"])
    return _CACHE["model"], _CACHE["tokenizer"]  # type: ignore[return-value]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=0)
    parser.add_argument("--max-sequences", type=int, default=1)
    parser.add_argument("--serve-edged", metavar="PATH")
    args = parser.parse_args()
    if args.serve_edged:
        serve_edged(args.serve_edged, args.max_sequences)
        return
    path = str(Path(tempfile.mkdtemp(dir="/tmp")) / "edged.sock")
    proc = subprocess.Popen([sys.executable, __file__, "--serve-edged", path, "--max-sequences",
                             str(args.max_sequences)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    if proc.stdout.readline().strip() != "ready":
        raise SystemExit("edged did not start")
    try:
        for _ in range(3):  # warm both paths
            over_socket(path, args.tokens)
            in_process(args.tokens)
        edged, local = [], []
        server_cpu = local_cpu = 0.0
        for _ in range(args.runs):
            before = _cpu_s(proc.pid)
            edged.append(over_socket(path, args.tokens))
            server_cpu += _cpu_s(proc.pid) - before
            before = time.thread_time()
            local.append(in_process(args.tokens))
            local_cpu += time.thread_time() - before
        together: list[tuple[float, float]] = []
        for _ in range(args.runs if args.concurrency else 0):
            together.append((concurrent(path, args.tokens, args.concurrency)[0],
                             one_after_another(args.tokens, args.concurrency)[0]))
    finally:
        proc.terminate()
        proc.wait()
    for name, runs in (("in-process og.Generator", local), ("edged, SSE over the Unix socket", edged)):
        ttft = statistics.median(r[0] for r in runs) * 1e3
        per_token = statistics.median(r[1] for r in runs) * 1e6
        print(f"{name:34s} TTFT p50 {ttft:7.3f} ms   per token p50 {per_token:7.1f} µs   tokens {runs[0][2]}")
    pairs = list(zip(edged, local, strict=True))
    ttft_added = statistics.median(e[0] - o[0] for e, o in pairs) * 1e3
    token_added = statistics.median(e[1] - o[1] for e, o in pairs) * 1e6
    print(f"added by edged: TTFT {ttft_added:.3f} ms, per token {token_added:.1f} µs (medians of paired runs)")
    tokens = sum(r[2] for r in edged)
    print(f"CPU per output token (whole requests): edged server {server_cpu / tokens * 1e6:.1f} µs, in-process "
          f"generator {local_cpu / sum(r[2] for r in local) * 1e6:.1f} µs; added "
          f"{(server_cpu / tokens - local_cpu / sum(r[2] for r in local)) * 1e6:.1f} µs")
    if together:
        served = statistics.median(t[0] for t in together)
        alone = statistics.median(t[1] for t in together)
        ratio = statistics.median(t[0] / t[1] for t in together)
        print(f"concurrency {args.concurrency}, max_sequences {args.max_sequences}: edged {served:.0f} output "
              f"tokens/s aggregate, {args.concurrency} in-process generators one after another {alone:.0f} tokens/s; "
              f"ratio {ratio:.2f} (median of paired runs)")

if __name__ == "__main__":
    main()
