"""README.md's commands and Python examples, run as a reader runs them: against a real daemon started as the
Quick start starts it (no config file, no broker, the bundled models, the default socket path of the reader's
runtime directory), plus a real mosquitto on a free port for the MQTT example. Each block is taken from the
README at test time, so the README cannot drift from what works. Which blocks run here, and why the others do
not, is listed in readme_blocks.py."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from readme_blocks import ROOT, block
from server_harness import short_tempdir

from tests.integration.edged_daemon import DaemonProcess, daemon_environment, start_daemon
from tests.mqtt.conftest import Broker, Subscriber, free_port

pytestmark = pytest.mark.slow  # a daemon with every sample model, a broker and a second daemon: about a minute

DEFAULT_CONFIG = Path("/etc/edged/edged.toml")
RUN_TIMEOUT_S = 180


@dataclass
class Reader:
    """The reader's side: a scratch folder (with .venv/bin/edged running this checkout), their environment, and
    the daemon the Quick start started."""

    daemon: DaemonProcess
    scratch: Path
    env: dict[str, str]
    http_port: int
    grpc_port: int

    def sh(self, text: str, timeout_s: float = RUN_TIMEOUT_S) -> str:
        result = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", text], cwd=self.scratch, env=self.env,
                                capture_output=True, text=True, timeout=timeout_s, check=False)
        assert result.returncode == 0, f"exit {result.returncode}:\n{text}\n{result.stdout}{result.stderr}"
        return result.stdout

    def python(self, code: str, cwd: Path | None = None) -> str:
        code = code.replace("127.0.0.1:8000", f"127.0.0.1:{self.http_port}")
        code = code.replace("127.0.0.1:8001", f"127.0.0.1:{self.grpc_port}")
        result = subprocess.run([sys.executable, "-c", code], cwd=cwd or self.scratch, env=self.env,
                                capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False)
        assert result.returncode == 0, f"exit {result.returncode}:\n{code}\n{result.stdout}{result.stderr}"
        return result.stdout


def _scratch_venv(scratch: Path) -> None:
    """``.venv/bin/edged`` as the README calls it, running this checkout with the test's interpreter."""
    bin_dir = scratch / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "edged").write_text(f'#!/bin/sh\nexec "{sys.executable}" -m edged "$@"\n')
    (bin_dir / "edged").chmod(0o755)


@pytest.fixture(scope="module")
def reader() -> Iterator[Reader]:
    if DEFAULT_CONFIG.exists():
        pytest.skip(f"{DEFAULT_CONFIG} exists: the Quick start's daemon would read it")
    base = Path(short_tempdir("edged-rd-"))
    runtime = base / "run"
    runtime.mkdir(mode=0o700)
    (base / "home").mkdir()
    scratch = base / "scratch"
    _scratch_venv(scratch)
    env = daemon_environment({"XDG_RUNTIME_DIR": str(runtime), "HOME": str(base / "home")})
    for name in ("EDGED_SOCKET", "RUNTIME_DIRECTORY", "XDG_CONFIG_HOME"):
        env.pop(name, None)
    http_port, grpc_port = free_port(), free_port()
    # the socket at the path `edged serve` picks by default in this runtime directory: $XDG_RUNTIME_DIR/edged/
    daemon = start_daemon(runtime / "edged", args=["--http-port", str(http_port), "--grpc-port", str(grpc_port)],
                          env=env, socket_name="edged.sock")
    try:
        yield Reader(daemon, scratch, env, http_port, grpc_port)
    finally:
        daemon.stop()
        shutil.rmtree(base, ignore_errors=True)


def test_quick_start_queries_run_verbatim(reader: Reader) -> None:
    out = reader.sh(block("# its first line names the socket").text)
    assert str(reader.daemon.socket_path) in out.splitlines()[0]  # "its first line names the socket"
    assert re.search(r"^digits_onnx\s+1\s+READY", out, re.MULTILINE), out
    assert '"name":"digits_onnx"' in out
    assert re.search(r'^nv_inference_count\{model="tiny_mlp",version="1"\} \d+$', out, re.MULTILINE), out
    answer = json.loads(out.strip().splitlines()[-1])
    assert answer["model_name"] == "tiny_mlp" and answer["outputs"][0]["shape"] == [1, 10]


def test_socket_api_curl_runs_verbatim(reader: Reader) -> None:
    answer = json.loads(reader.sh(block("/v2/models/tiny_mlp/infer").text))
    assert answer["outputs"][0]["name"] == "output" and len(answer["outputs"][0]["data"]) == 10


def test_tritonclient_http_example_runs(reader: Reader) -> None:
    out = reader.python(block("tritonclient.http as httpclient").text)
    assert len(re.findall(r"-?\d+\.\d*(?:e[-+]\d+)?", out)) == 10, out


def test_tritonclient_grpc_example_connects(reader: Reader) -> None:
    code = block("grpcclient.InferenceServerClient").text
    out = reader.python(code + 'print(client.is_server_ready(), client.is_model_ready("tiny_mlp"))\n')
    assert out.split() == ["True", "True"]


def test_camera_frame_shared_memory_example_runs(reader: Reader) -> None:
    code = block("SharedMemoryRegion.create").text
    out = reader.python(code + "print(features.shape, features.dtype)\n")
    assert out.strip() == "(1, 8) float32"


def test_python_client_example_runs(reader: Reader) -> None:
    out = reader.python(block("with EdgedClient() as client:").text)
    assert out.strip() in [str(digit) for digit in range(10)]


def test_python_client_example_runs_on_its_asyncio_twin(reader: Reader) -> None:
    """"AsyncEdgedClient is the asyncio twin": the same example, with async with and await, gives the same."""
    sync = block("with EdgedClient() as client:").text
    imports, _, body = sync.partition("with EdgedClient() as client:")
    code = (imports.replace("from edged.client import EdgedClient",
                            "import asyncio\nfrom edged.client.aio import AsyncEdgedClient")
            + "async def main() -> None:\n    async with AsyncEdgedClient() as client:"
            + body.replace("\n    ", "\n        ").replace("client.infer(", "await client.infer(")
            + "asyncio.run(main())\n")
    assert "await client.infer(" in code
    assert reader.python(code).strip() == reader.python(sync).strip()


def test_in_process_engine_example_runs_from_the_checkout(reader: Reader) -> None:
    out = reader.python(block('InferenceService(Path("models")').text, cwd=ROOT)
    assert "InferResponse(model='digits_onnx'" in out  # what the submit() callback printed


def test_openai_streaming_example_runs_over_the_socket(reader: Reader) -> None:
    pytest.importorskip("openai", reason="the OpenAI example needs the openai package (dev extra)")
    pytest.importorskip("onnxruntime_genai", reason="tiny_llama needs the genai extra")
    out = reader.python(block("import httpx, openai").text)
    assert out.strip(), "the stream produced no text"


def _mqtt_client_config(home: Path, port: int) -> None:
    """mosquitto_pub, _sub and _rr read default options from ~/.config: the README's commands stay verbatim and
    reach the test's broker on its free port."""
    config = home / ".config"
    config.mkdir(exist_ok=True)
    for client in ("mosquitto_pub", "mosquitto_sub", "mosquitto_rr"):
        (config / client).write_text(f"-h 127.0.0.1\n-p {port}\n")


def test_mqtt_sensor_pipeline_and_request_response_run_verbatim(reader: Reader, tmp_path: Path) -> None:
    if shutil.which("mosquitto_rr") is None:
        pytest.skip("mosquitto_rr missing: apt-get install mosquitto-clients")
    broker = Broker(tmp_path / "broker", persistence=False)
    broker.start()
    demo = block("# demo.toml").text.replace('"mqtt://localhost:1883"', f'"{broker.url}"')
    assert broker.url in demo
    workdir = Path(short_tempdir("edged-rdm-"))
    daemon = start_daemon(workdir, config=demo, env={"HOME": reader.env["HOME"]})
    results = Subscriber(broker.port, ["results/#"])
    try:
        _mqtt_client_config(Path(reader.env["HOME"]), broker.port)
        # the broker and the daemon are the test's (above), and its subscriber replaces the backgrounded
        # `mosquitto_sub -t 'results/#'`, which could subscribe after the publish
        script = [line for line in block("mosquitto_rr -V 5").text.splitlines()
                  if not line.startswith(("mosquitto -p", ".venv/bin/edged serve"))
                  and not line.lstrip().startswith("#") and "results/#" not in line]
        out = reader.sh("\n".join(script) + "\n", timeout_s=60)
        birth, reply = (json.loads(line) for line in out.strip().splitlines())
        assert birth["state"] == "online" and birth["device_id"] == "demo"
        assert reply["model_name"] == "tiny_mlp" and reply["outputs"][0]["shape"] == [1, 10]
        (message,) = results.wait_for(1, timeout_s=30)
        assert message.topic == "results/door/digits"
        result = json.loads(message.payload)
        assert result["id"] == "f-1" and result["parameters"]["input_timestamp"] == 1732890000.5
        assert result["outputs"][0]["data"][0].endswith(":0:0"), result  # the README's digit is a zero
    finally:
        results.close()
        daemon.stop()
        broker.stop()
        shutil.rmtree(workdir, ignore_errors=True)
        for client in ("mosquitto_pub", "mosquitto_sub", "mosquitto_rr"):
            (Path(reader.env["HOME"]) / ".config" / client).unlink(missing_ok=True)


def test_tcp_restricted_block_lets_tritonclient_load_and_share_memory_with_the_key(reader: Reader,
                                                                                    tmp_path: Path) -> None:
    """The [server.tcp_restricted] block as the README gives it, with tritonclient as its comment says: with the
    key, load_model and system shared memory work over loopback TCP; without it they are refused."""
    port = free_port()
    models = tmp_path / "models"
    shutil.copytree(ROOT / "models" / "tiny_mlp", models / "tiny_mlp")
    workdir = Path(short_tempdir("edged-rdt-"))
    config = '[telemetry]\nsource = "off"\n\n' + block("[server.tcp_restricted]").text
    daemon = start_daemon(workdir, config=config, env={"HOME": reader.env["HOME"]},
                          args=["--http-port", str(port), "--model-control-mode", "explicit",
                                "--model-repository", str(models)])
    code = f"""
import numpy as np, tritonclient.http as httpclient, tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException
client = httpclient.InferenceServerClient("127.0.0.1:{port}")
try:
    client.load_model("tiny_mlp")
except InferenceServerException as e:
    print("without the key:", e.status())
client.load_model("tiny_mlp", headers={{"edged-key": "SECRET"}})
x = np.ones((1, 64), np.float32)
handle = shm.create_shared_memory_region("in0", "/edged-readme-{os.getpid()}", x.nbytes)
try:
    shm.set_shared_memory_region(handle, [x])
    client.register_system_shared_memory("in0", "/edged-readme-{os.getpid()}", x.nbytes,
                                         headers={{"edged-key": "SECRET"}})
    tensor = httpclient.InferInput("input", [1, 64], "FP32")
    tensor.set_shared_memory("in0", x.nbytes)
    try:
        client.infer("tiny_mlp", [tensor])
    except InferenceServerException as e:
        print("infer naming a region without the key:", e.status())
    print(client.infer("tiny_mlp", [tensor], headers={{"edged-key": "SECRET"}}).as_numpy("output").shape)
    client.unregister_system_shared_memory("in0", headers={{"edged-key": "SECRET"}})
finally:
    shm.destroy_shared_memory_region(handle)
"""
    try:
        out = reader.python(code)
    finally:
        daemon.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    assert out.split("\n")[:3] == ["without the key: 403", "infer naming a region without the key: 403", "(1, 10)"], out
