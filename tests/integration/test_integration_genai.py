"""The real daemon serves the bundled generative model out of the box: the official openai client, bound to the
daemon's Unix socket, lists it and streams a chat completion; `edged status` shows it like any other model."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from integration.edged_daemon import daemon_environment, start_daemon

openai = pytest.importorskip("openai")
pytest.importorskip("onnxruntime_genai")


def test_daemon_serves_the_bundled_tiny_llama_to_the_openai_client(tmp_path: Path) -> None:
    daemon = start_daemon(tmp_path, config='[telemetry]\nsource = "off"\n')
    try:
        client = openai.OpenAI(base_url="http://localhost/v1", api_key="unused", max_retries=0,
                               http_client=httpx.Client(transport=httpx.HTTPTransport(uds=str(daemon.socket_path))))
        assert "tiny_llama" in [m.id for m in client.models.list()]
        chunks = list(client.chat.completions.create(
            model="tiny_llama", messages=[{"role": "user", "content": "Open the gate"}], max_tokens=8,
            temperature=0, stream=True))
        assert chunks[-1].choices[0].finish_reason in ("stop", "length")
        status = subprocess.run([sys.executable, "-m", "edged", "status", "--socket", str(daemon.socket_path),
                                 "--json"], capture_output=True, text=True, env=daemon_environment(), check=True)
        assert "tiny_llama" in json.dumps(json.loads(status.stdout))
    finally:
        assert daemon.stop() == 0
