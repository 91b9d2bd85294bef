"""Fixtures for OTA: a real nginx serving a real TUF repository made by `edged fleet`, a real engine."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edged.config import ModelsConfig, OtaConfig
from edged.engine import InferenceService
from edged.engine.memory_governor import MemoryGovernor
from edged.ota import OtaAgent
from edged.ota.fleet import FleetRepository
from tests.modelgen import mlp_reference, mlp_weights, write_mlp_onnx

NGINX = shutil.which("nginx") or "/usr/sbin/nginx"
MODEL = "mlp"
CONFIG = f"""name: "{MODEL}"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ {{ name: "input", data_type: TYPE_FP32, dims: [ 64 ] }} ]
output [ {{ name: "output", data_type: TYPE_FP32, dims: [ 10 ] }} ]
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Nginx:
    """nginx as an unprivileged static host (daemon off, every path in tmp); its access log counts bytes."""

    def __init__(self, root: Path, work: Path, locations: str = "") -> None:
        """``locations``: extra nginx ``location`` blocks inside the server (a throttled path, for instance)."""
        self.port = free_port()
        self.work = work
        work.mkdir(parents=True, exist_ok=True)
        self.access_log = work / "access.log"
        conf = work / "nginx.conf"
        user = "user root;\n" if os.geteuid() == 0 else ""  # as root, workers drop to nobody: keep tmp readable
        conf.write_text(user + f"""daemon off;
worker_processes 1;
pid {work}/nginx.pid;
error_log {work}/error.log warn;
events {{ worker_connections 64; }}
http {{
    log_format counted '$request_uri $status $body_bytes_sent "$http_range"';
    access_log {self.access_log} counted;
    client_body_temp_path {work}/body; proxy_temp_path {work}/proxy; fastcgi_temp_path {work}/fastcgi;
    uwsgi_temp_path {work}/uwsgi; scgi_temp_path {work}/scgi;
    server {{ listen 127.0.0.1:{self.port}; root {root}; {locations} }}
}}
""")
        self.process = subprocess.Popen([NGINX, "-c", str(conf), "-p", str(work)], stderr=subprocess.PIPE)
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                break
            except OSError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"nginx did not start: {self.process.stderr}") from None
                time.sleep(0.02)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log_lines(self) -> list[tuple[str, int, int, str]]:
        """(uri, status, body bytes, Range header) per request logged so far."""
        rows = []
        for line in self.access_log.read_text().splitlines():
            uri, status, sent, rng = line.split(" ", 3)
            rows.append((uri, int(status), int(sent), rng.strip('"')))
        return rows

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(10)


@pytest.fixture
def fleet(tmp_path: Path) -> FleetRepository:
    FleetRepository.init(tmp_path / "fleet")
    return FleetRepository(tmp_path / "fleet")


@pytest.fixture
def nginx(tmp_path: Path, fleet: FleetRepository) -> Iterator[Nginx]:
    server = Nginx(fleet.path, tmp_path / "nginx")
    yield server
    server.stop()


def model_folder(root: Path, version: int, seed: int, config: str = CONFIG, hidden: int = 256) -> Path:
    folder = root / MODEL
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.pbtxt").write_text(config)
    write_mlp_onnx(folder / str(version) / "model.onnx", mlp_weights(seed=seed, hidden=hidden))
    return folder


def write_fragile_onnx(path: Path, seed: int) -> None:
    """The MLP of ``seed`` behind a Reshape to one row: batch 1 (its test vectors) works, batch 2 fails at run
    time (the shape is computed from the input, so no shape inference catches it at load)."""
    w0, b0, w1, b1 = mlp_weights(seed=seed)
    nodes = [helper.make_node("Shape", ["input"], ["s"]), helper.make_node("Div", ["s", "s"], ["ones"]),
             helper.make_node("Mul", ["ones", "one_row"], ["target"]),
             helper.make_node("Reshape", ["input", "target"], ["r"]),
             helper.make_node("MatMul", ["r", "w0"], ["h0"]), helper.make_node("Add", ["h0", "b0"], ["h1"]),
             helper.make_node("Relu", ["h1"], ["h2"]), helper.make_node("MatMul", ["h2", "w1"], ["h3"]),
             helper.make_node("Add", ["h3", "b1"], ["output"])]
    graph = helper.make_graph(
        nodes, "fragile", [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 64])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", 10])],
        [numpy_helper.from_array(np.array([1, 64], np.int64), "one_row"), numpy_helper.from_array(w0, "w0"),
         numpy_helper.from_array(b0, "b0"), numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(b1, "b1")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))


def vectors_for(seed: int, offset: float = 0.0, hidden: int = 256) -> bytes:
    """Test vectors the model made with ``seed`` passes (``offset`` != 0 makes them wrong)."""
    x = np.linspace(-1, 1, 64, dtype=np.float32).reshape(1, 64)
    y = mlp_reference(mlp_weights(seed=seed, hidden=hidden), x) + offset
    return json.dumps([{"inputs": {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 64],
                                               "data": x.ravel().tolist()}]},
                        "outputs": [{"name": "output", "datatype": "FP32", "shape": [1, 10],
                                     "data": y.ravel().tolist()}], "rtol": 1e-4, "atol": 1e-5}]).encode()


def device_paths(tmp: Path) -> tuple[Path, Path]:
    return tmp / "device" / "models", tmp / "device" / "state"


class Device:
    """A device: served repository with version 1, a real engine, an OTA agent pointed at nginx."""

    def __init__(self, tmp: Path, url: str, root_file: Path, seed_repository: bool = True, hidden: int = 256,
                 memory: MemoryGovernor | None = None, **ota: object) -> None:
        self.repository, self.state_dir = device_paths(tmp)
        if seed_repository:
            model_folder(self.repository, 1, seed=1, hidden=hidden)
        (tmp / "machine-id").write_text("0123456789abcdef0123456789abcdef\n")
        settings = {"watch_s": 0.0, "min_requests": 0, **ota}
        self.config = OtaConfig(enabled=True, repository_url=url, root_file=str(root_file), **settings)  # type: ignore[arg-type]
        self.service = InferenceService(self.repository, ModelsConfig(), memory=memory)
        self.agent = self.new_agent()
        self.agent.recover_files()  # the daemon's start-up order: before the engine loads anything
        self.service.start()

    def new_agent(self) -> OtaAgent:
        return OtaAgent(self.config, self.service, self.repository, self.state_dir,
                        machine_id=self.repository.parent.parent / "machine-id")

    def served_version(self) -> str:
        from edged.engine import InferRequest
        x = np.zeros((1, 64), np.float32)
        return self.service.infer(InferRequest(MODEL, {"input": x})).version

    def close(self) -> None:
        self.service.close()


@pytest.fixture
def device(tmp_path: Path, nginx: Nginx, fleet: FleetRepository) -> Iterator[Device]:
    made = Device(tmp_path, nginx.url, fleet.metadata_dir / "1.root.json")
    yield made
    made.close()
