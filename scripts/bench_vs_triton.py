#!/usr/bin/env python3
"""Side-by-side: edged and NVIDIA Triton 2.51 serving the same tiny model, both driven by perf_analyzer.

Triton comes from the nvidia-pytriton 0.7.0 wheel (tritonserver 2.51 with only the Python backend), so it runs
the model with onnxruntime inside a Python-backend ``model.py`` that this script writes; edged runs as
``edged serve --http-port N``. Both listen on loopback TCP at the same time, and perf_analyzer (from the
tritonclient 2.51.0 wheel, see scripts/get_perf_analyzer.sh) measures them in alternation over HTTP, batch 1,
at each concurrency, for ``--rounds`` rounds; the table shows the medians and edged's ratios to Triton.

    .venv/bin/python scripts/bench_vs_triton.py [--concurrency 1 4] [--rounds 3] [--interval-ms 2000]

Needs: Debian's libb64-0d, pip access (first run: .cache/triton-venv and .cache/perf_analyzer are created).
Targets: edged >= 1.5x Triton's infer/s at every concurrency, with a lower p50.
"""

from __future__ import annotations

import argparse
import csv
import http.client
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / "models" / "tiny_mlp"
PERF_ANALYZER = ROOT / ".cache" / "perf_analyzer" / "perf_analyzer"
TRITON_VENV = ROOT / ".cache" / "triton-venv"
EDGED = ROOT / ".venv" / "bin" / "edged"
TRITON_PACKAGES = ("nvidia-pytriton==0.7.0", "onnxruntime", "numpy")
TARGET_RATIO = 1.5

TRITON_CONFIG = """name: "tiny_mlp"
backend: "python"
max_batch_size: 64
input [ { name: "input", data_type: TYPE_FP32, dims: [ 64 ] } ]
output [ { name: "output", data_type: TYPE_FP32, dims: [ 10 ] } ]
dynamic_batching { }
instance_group [ { count: 1, kind: KIND_CPU } ]
"""

# The stub embeds the system's libpython and does not see the venv: the venv's packages go on sys.path here.
TRITON_MODEL_PY = """import os
import sys

sys.path.insert(0, {site!r})

import onnxruntime as ort  # noqa: E402
import triton_python_backend_utils as pb_utils  # noqa: E402


class TritonPythonModel:
    def initialize(self, args):
        path = os.path.join(args["model_repository"], args["model_version"], "model.onnx")
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1  # as edged's onnxruntime backend by default
        options.inter_op_num_threads = 1
        self.session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "input").as_numpy()
            y = self.session.run(None, {{"input": x}})[0]
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("output", y)]))
        return responses
"""


@dataclass(frozen=True)
class Measurement:
    server: str
    concurrency: int
    infer_per_s: float
    p50_us: float
    p99_us: float


@dataclass(frozen=True)
class TritonInstall:
    server: Path
    backend_files: Path
    stub: Path
    site: Path
    library_path: str


# --- setup -------------------------------------------------------------------------------------------------
def ensure_perf_analyzer() -> None:
    if not PERF_ANALYZER.exists():
        subprocess.run(["bash", str(ROOT / "scripts" / "get_perf_analyzer.sh"), sys.executable], check=True)


def ensure_triton_venv(venv: Path) -> TritonInstall:
    python = venv / "bin" / "python"
    if not python.exists():
        print(f"creating {venv} with {', '.join(TRITON_PACKAGES)} (once)", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", *TRITON_PACKAGES], check=True)
    probe = ("import sysconfig, sys, json; print(json.dumps([sysconfig.get_paths()['purelib'], "
             "sysconfig.get_config_var('LIBDIR'), f'{sys.version_info[0]}.{sys.version_info[1]}']))")
    site, libdir, version = json.loads(subprocess.run([str(python), "-c", probe], check=True, capture_output=True,
                                                      text=True).stdout)
    package = Path(site) / "pytriton" / "tritonserver"
    # the server's bundled libraries (libcudart, ...) and the Python LIBDIR for the backend stub
    library_path = f"{libdir}:{Path(site) / 'nvidia_pytriton.libs'}"
    return TritonInstall(package / "bin" / "tritonserver", package / "backends" / "python",
                         package / "python_backend_stubs" / version / "triton_python_backend_stub", Path(site),
                         library_path)


def prepare_triton(work: Path, install: TritonInstall) -> tuple[Path, Path]:
    """(model repository, backend directory) for tritonserver."""
    repository = work / "triton-models"
    version_dir = repository / "tiny_mlp" / "1"
    version_dir.mkdir(parents=True)
    (repository / "tiny_mlp" / "config.pbtxt").write_text(TRITON_CONFIG)
    (version_dir / "model.py").write_text(TRITON_MODEL_PY.format(site=str(install.site)))
    shutil.copy(MODEL / "1" / "model.onnx", version_dir / "model.onnx")
    backends = work / "triton-backends"
    python_backend = backends / "python"
    shutil.copytree(install.backend_files, python_backend, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(install.stub, python_backend / "triton_python_backend_stub")
    return repository, backends


def prepare_edged(work: Path) -> Path:
    repository = work / "edged-models"
    repository.mkdir()
    shutil.copytree(MODEL, repository / "tiny_mlp")
    return repository


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


# --- servers -----------------------------------------------------------------------------------------------
def start_triton(install: TritonInstall, repository: Path, backends: Path, port: int,
                 log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "LD_LIBRARY_PATH": install.library_path}
    command = [str(install.server), "--model-repository", str(repository), "--backend-directory", str(backends),
               "--http-port", str(port), "--allow-grpc", "false", "--allow-metrics", "false",
               "--log-verbose", "0"]
    return subprocess.Popen(command, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT)


def start_edged(edged: Path, repository: Path, work: Path, port: int, log: Path) -> subprocess.Popen[bytes]:
    command = [str(edged), "serve", "--model-repository", str(repository), "--socket", str(work / "edged.sock"),
               "--http-port", str(port), "--state-dir", str(work / "edged-state"), "--log-level", "warning"]
    return subprocess.Popen(command, stdout=log.open("wb"), stderr=subprocess.STDOUT)


def wait_ready(name: str, process: subprocess.Popen[bytes], port: int, log: Path, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"{name} exited with {process.returncode} before it was ready; its log {log}:\n"
                             + log.read_text(errors="replace")[-3000:])
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
        try:
            conn.request("GET", "/v2/models/tiny_mlp/ready")
            if conn.getresponse().status == 200:
                return
        except OSError:
            pass
        finally:
            conn.close()
        time.sleep(0.2)
    raise SystemExit(f"{name} was not ready on 127.0.0.1:{port} within {timeout_s} s; see {log}")


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


# --- measuring ---------------------------------------------------------------------------------------------
def measure(server: str, port: int, concurrency: int, interval_ms: int, work: Path) -> Measurement:
    report = work / f"pa-{server}-c{concurrency}-{time.monotonic_ns()}.csv"
    command = [str(PERF_ANALYZER), "-m", "tiny_mlp", "-i", "http", "-u", f"127.0.0.1:{port}",
               "--concurrency-range", str(concurrency), "--measurement-interval", str(interval_ms),
               "--stability-percentage", "1000", "--max-trials", "3", "-f", str(report)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    if done.returncode != 0 or not report.exists():
        raise SystemExit(f"perf_analyzer against {server} failed ({done.returncode}):\n{done.stdout[-2000:]}\n"
                         f"{done.stderr[-2000:]}")
    with report.open() as handle:
        row = next(csv.DictReader(handle))
    return Measurement(server, concurrency, float(row["Inferences/Second"]), float(row["p50 latency"]),
                       float(row["p99 latency"]))


def median_of(runs: list[Measurement]) -> Measurement:
    return Measurement(runs[0].server, runs[0].concurrency, statistics.median(m.infer_per_s for m in runs),
                       statistics.median(m.p50_us for m in runs), statistics.median(m.p99_us for m in runs))


def report(results: dict[tuple[str, int], Measurement], concurrencies: list[int]) -> bool:
    print(f"\n{'server':<8} {'conc':>4} {'infer/s':>10} {'p50 us':>8} {'p99 us':>8}")
    for concurrency in concurrencies:
        for server in ("triton", "edged"):
            m = results[(server, concurrency)]
            print(f"{server:<8} {concurrency:>4} {m.infer_per_s:>10,.0f} {m.p50_us:>8.0f} {m.p99_us:>8.0f}")
    print(f"\n{'conc':>4} {'infer/s ratio':>14} {'p50 ratio':>10} {'p99 ratio':>10}  target (>= {TARGET_RATIO}x, "
          "lower p50)")
    met = True
    for concurrency in concurrencies:
        edged, triton = results[("edged", concurrency)], results[("triton", concurrency)]
        ratio = edged.infer_per_s / triton.infer_per_s
        ok = ratio >= TARGET_RATIO and edged.p50_us < triton.p50_us
        met = met and ok
        print(f"{concurrency:>4} {ratio:>13.2f}x {edged.p50_us / triton.p50_us:>9.2f}x "
              f"{edged.p99_us / triton.p99_us:>9.2f}x  {'met' if ok else 'NOT met'}")
    return met


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds; the table shows medians")
    parser.add_argument("--interval-ms", type=int, default=2000, help="perf_analyzer's measurement window")
    parser.add_argument("--triton-venv", type=Path, default=TRITON_VENV)
    parser.add_argument("--edged", type=Path, default=EDGED,
                        help="the edged executable to measure (default: this checkout's .venv/bin/edged)")
    parser.add_argument("--json", type=Path, default=None, help="also write every measurement to this file")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs, repositories)")
    return parser.parse_args()


def main() -> int:
    args = parse_args()
    ensure_perf_analyzer()
    install = ensure_triton_venv(args.triton_venv)
    work = Path(tempfile.mkdtemp(prefix="edged-vs-triton-", dir="/tmp"))
    triton_repo, backends = prepare_triton(work, install)
    ports = {"triton": free_port(), "edged": free_port()}
    logs = {name: work / f"{name}.log" for name in ports}
    processes = {"triton": start_triton(install, triton_repo, backends, ports["triton"], logs["triton"]),
                 "edged": start_edged(args.edged, prepare_edged(work), work, ports["edged"], logs["edged"])}
    runs: dict[tuple[str, int], list[Measurement]] = {}
    try:
        for name, process in processes.items():
            wait_ready(name, process, ports[name], logs[name])
        for round_number in range(args.rounds):
            for concurrency in args.concurrency:
                for name in ("edged", "triton") if round_number % 2 else ("triton", "edged"):
                    m = measure(name, ports[name], concurrency, args.interval_ms, work)
                    print(f"round {round_number + 1}: {name} c{concurrency}: {m.infer_per_s:,.0f} infer/s, "
                          f"p50 {m.p50_us:.0f} us, p99 {m.p99_us:.0f} us", file=sys.stderr)
                    runs.setdefault((name, concurrency), []).append(m)
    finally:
        for process in processes.values():
            stop(process)
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    results = {key: median_of(values) for key, values in runs.items()}
    met = report(results, args.concurrency)
    if args.json is not None:
        args.json.write_text(json.dumps([asdict(m) for values in runs.values() for m in values], indent=2))
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
