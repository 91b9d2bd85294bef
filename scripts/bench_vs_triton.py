#!/usr/bin/env python3
"""Side-by-side: edged and NVIDIA Triton 2.51 serving the same models, both driven by perf_analyzer.

Triton comes from the nvidia-pytriton 0.7.0 wheel (tritonserver 2.51 with only the Python backend), so it runs
each model with onnxruntime inside a Python-backend ``model.py`` that this script writes (one thread, as edged's
onnxruntime backend); edged runs this checkout's code (``python -m edged serve`` with ``PYTHONPATH`` set to it).
Both listen on loopback TCP, HTTP and gRPC, at the same time, and perf_analyzer (from the tritonclient 2.51.0
wheel, see scripts/get_perf_analyzer.sh) measures them in alternation, batch 1, for ``--rounds`` rounds:

- tiny_mlp over HTTP and over gRPC at each ``--concurrency``: target edged >= 1.5x Triton's infer/s with a
  lower p50;
- camera_frame (a [1,1080,1920,3] UINT8 frame) over gRPC and HTTP with ``--shared-memory system``, concurrency
  1, beside edged's in-process engine: target edged's p50 overhead over the engine at most half of Triton's
  overhead over the same engine figure. The engine (edged.bench._floor) runs in this script's process on the
  daemon's own repository copy (same config, same session options), stays warm for the whole run, and is
  measured for a window right before and right after each server, whose overhead in that round is its p50
  minus the mean of the two; the report takes the medians of those per-round overheads. Each camera row also
  has the server's CPU per inference (its processes from /proc, Triton's Python-backend stubs included) beside
  the engine's, a figure that a shared machine's load moves far less than latency.

The table shows the medians of the rounds; ``--json`` keeps every round.

    PYTHONPATH=$PWD .venv/bin/python scripts/bench_vs_triton.py [--concurrency 1 4] [--rounds 3]
    PYTHONPATH=$PWD .venv/bin/python scripts/bench_vs_triton.py --no-tiny --rounds 12 --interval-ms 1000  # camera

Needs: Debian's libb64-0d, pip access (first run: .cache/triton-venv and .cache/perf_analyzer are created).
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
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

from edged.bench._floor import EngineFloor

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "models"
PERF_ANALYZER = ROOT / ".cache" / "perf_analyzer" / "perf_analyzer"
TRITON_VENV = ROOT / ".cache" / "triton-venv"
TRITON_PACKAGES = ("nvidia-pytriton==0.7.0", "onnxruntime", "numpy")
TARGET_RATIO = 1.5  # edged's infer/s over Triton's, tiny model
TARGET_OVERHEAD = 0.5  # edged's overhead over the engine / Triton's, camera frame in shared memory
SERVED = ("tiny_mlp", "camera_frame")
SHM_KEY = ("edged-key", "bench")  # edged refuses shared memory over TCP without a [server.tcp_restricted] key

# The stub embeds the system's libpython and does not see the venv: the venv's packages go on sys.path here.
# One model.py for every model: inputs and outputs are the ONNX graph's, by name.
# The imports and initialize, shared with bench_batch_delay.py's batching model.py.
TRITON_MODEL_HEAD = """import os
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
        self.inputs = [i.name for i in self.session.get_inputs()]
        self.outputs = [o.name for o in self.session.get_outputs()]

"""
TRITON_MODEL_PY = TRITON_MODEL_HEAD + """    def execute(self, requests):
        responses = []
        for request in requests:
            feed = {{name: pb_utils.get_input_tensor_by_name(request, name).as_numpy() for name in self.inputs}}
            values = self.session.run(None, feed)
            responses.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor(name, value) for name, value in zip(self.outputs, values)]))
        return responses
"""


@dataclass(frozen=True)
class Scenario:
    model: str
    protocol: str  # "http", "grpc" or "grpc-stream" (ModelStreamInfer, perf_analyzer --streaming)
    concurrency: int
    shm: str  # perf_analyzer's --shared-memory: "none" or "system"

    @property
    def label(self) -> str:
        shm = ", shm" if self.shm != "none" else ""
        return f"{self.model} {self.protocol} c{self.concurrency}{shm}"


@dataclass(frozen=True)
class Measurement:
    server: str  # "triton", "edged" or "engine" (edged's in-process engine)
    scenario: str
    infer_per_s: float
    p50_us: float
    p99_us: float
    # mean latency outside the server's own compute (client send and receive, network, server queue), from
    # perf_analyzer's breakdown; Triton's compute includes its Python backend's round trip to the stub
    transport_us: float = 0.0
    floor_us: float = 0.0  # camera rows: the engine's p50, mean of its windows just before and just after this one
    cpu_us: float = 0.0  # camera rows: CPU per inference of the server's processes (the engine: of this process)


@dataclass(frozen=True)
class TritonInstall:
    server: Path
    backend_files: Path
    stub: Path
    site: Path
    library_path: str


@dataclass(frozen=True)
class Ports:
    http: int
    grpc: int

    def of(self, protocol: str) -> int:
        return self.http if protocol == "http" else self.grpc


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
    """(model repository, backend directory) for tritonserver: edged's configs with the Python backend."""
    repository = work / "triton-models"
    for name in SERVED:
        version_dir = repository / name / "1"
        version_dir.mkdir(parents=True)
        config = (MODELS / name / "config.pbtxt").read_text()
        (repository / name / "config.pbtxt").write_text(config.replace('platform: "onnxruntime_onnx"',
                                                                        'backend: "python"'))
        (version_dir / "model.py").write_text(TRITON_MODEL_PY.format(site=str(install.site)))
        shutil.copy(MODELS / name / "1" / "model.onnx", version_dir / "model.onnx")
    backends = work / "triton-backends"
    python_backend = backends / "python"
    shutil.copytree(install.backend_files, python_backend, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(install.stub, python_backend / "triton_python_backend_stub")
    return repository, backends


def prepare_edged(work: Path, ports: Ports) -> tuple[Path, Path]:
    """(model repository, config file) for edged."""
    repository = work / "edged-models"
    for name in SERVED:
        shutil.copytree(MODELS / name, repository / name)
    config = work / "edged.toml"
    config.write_text(f'[server]\nhttp_port = {ports.http}\ngrpc_port = {ports.grpc}\n\n[telemetry]\nsource = "off"\n'
                      f'\n[server.tcp_restricted]\nshared-memory = "{SHM_KEY[0]}={SHM_KEY[1]}"\n')
    return repository, config


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def edged_env() -> dict[str, str]:
    """This checkout's edged, whatever the venv has installed."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH"))))}


# --- servers -----------------------------------------------------------------------------------------------
def start_triton(install: TritonInstall, repository: Path, backends: Path, ports: Ports,
                 log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "LD_LIBRARY_PATH": install.library_path}
    command = [str(install.server), "--model-repository", str(repository), "--backend-directory", str(backends),
               "--http-port", str(ports.http), "--grpc-port", str(ports.grpc), "--allow-metrics", "false",
               "--log-verbose", "0"]
    return subprocess.Popen(command, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT)


def start_edged(repository: Path, config: Path, work: Path, log: Path) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "edged", "serve", "--config", str(config), "--model-repository",
               str(repository), "--socket", str(work / "edged.sock"), "--state-dir", str(work / "edged-state"),
               "--log-level", "warning"]
    return subprocess.Popen(command, env=edged_env(), stdout=log.open("wb"), stderr=subprocess.STDOUT)


def wait_ready(name: str, process: subprocess.Popen[bytes], port: int, log: Path, timeout_s: float = 180) -> None:
    deadline = time.monotonic() + timeout_s
    pending = list(SERVED)
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"{name} exited with {process.returncode} before it was ready; its log {log}:\n"
                             + log.read_text(errors="replace")[-3000:])
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
        try:
            conn.request("GET", f"/v2/models/{pending[0]}/ready")
            if conn.getresponse().status == 200:
                pending.pop(0)
                if not pending:
                    return
                continue
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
def measure(server: str, port: int, scenario: Scenario, interval_ms: int, work: Path) -> Measurement:
    report = work / f"pa-{server}-{time.monotonic_ns()}.csv"
    streaming = ["--streaming"] if scenario.protocol == "grpc-stream" else []
    command = [str(PERF_ANALYZER), *streaming, "-m", scenario.model, "-i", scenario.protocol.removesuffix("-stream"),
               "-u", f"127.0.0.1:{port}",
               "--concurrency-range", str(scenario.concurrency), "--measurement-interval", str(interval_ms),
               "--stability-percentage", "1000", "--max-trials", "3", "--shared-memory", scenario.shm,
               "-H", f"{SHM_KEY[0]}:{SHM_KEY[1]}", "-f", str(report)]
    for _ in range(3):  # on a loaded machine a window can miss even a 1000 % stability bound: measure again
        done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
        if done.returncode == 0 and report.exists():
            break
    if done.returncode != 0 or not report.exists():
        raise SystemExit(f"perf_analyzer against {server} ({scenario.label}) failed ({done.returncode}):\n"
                         f"{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    with report.open() as handle:
        row = next(csv.DictReader(handle))
    transport = sum(float(row.get(column) or 0) for column in ("Client Send", "Network+Server Send/Recv",
                                                                 "Server Queue", "Client Recv"))
    return Measurement(server, scenario.label, float(row["Inferences/Second"]), float(row["p50 latency"]),
                       float(row["p99 latency"]), transport)


def measure_engine(floor: EngineFloor, scenario: Scenario, interval_ms: int) -> Measurement:
    """edged's in-process engine (concurrency 1, callbacks), the floor both servers are held to."""
    result, cpu_s = floor.measure(interval_ms / 1000)
    return Measurement("engine", scenario.label, result.throughput, result.p50_us, result.p99_us, cpu_us=cpu_s * 1e6)


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of ``pid`` and its children (Triton's Python-backend stubs)."""
    total = 0.0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone meanwhile
        if stat.parent.name == str(pid) or int(fields[1]) == pid:
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def inference_count(port: int, model: str) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", f"/v2/models/{model}/stats")
        return int(json.loads(conn.getresponse().read())["model_stats"][0]["inference_count"])
    finally:
        conn.close()


def measure_with_cpu(server: str, pid: int, ports: Ports, scenario: Scenario, interval_ms: int,
                     work: Path) -> Measurement:
    """`measure`, with the server's CPU per inference over perf_analyzer's run (its trials and warm-up)."""
    cpu, count = process_cpu_s(pid), inference_count(ports.http, scenario.model)
    m = measure(server, ports.of(scenario.protocol), scenario, interval_ms, work)
    done = inference_count(ports.http, scenario.model) - count
    return dataclasses.replace(m, cpu_us=(process_cpu_s(pid) - cpu) * 1e6 / max(1, done))


def median_of(runs: list[Measurement]) -> Measurement:
    return Measurement(runs[0].server, runs[0].scenario, statistics.median(m.infer_per_s for m in runs),
                       statistics.median(m.p50_us for m in runs), statistics.median(m.p99_us for m in runs),
                       statistics.median(m.transport_us for m in runs), statistics.median(m.floor_us for m in runs),
                       statistics.median(m.cpu_us for m in runs))


# --- report ------------------------------------------------------------------------------------------------
def report_throughput(results: dict[tuple[str, str], Measurement], scenarios: list[Scenario]) -> bool:
    print(f"\n{'scenario':<24} {'triton/s':>9} {'p50':>6} {'p99':>6} {'edged/s':>9} {'p50':>6} {'p99':>6} "
          f"{'ratio':>6} {'p50 r':>6}  target (>= {TARGET_RATIO}x infer/s, lower p50)")
    met = True
    for scenario in scenarios:
        triton, edged = results[("triton", scenario.label)], results[("edged", scenario.label)]
        ratio = edged.infer_per_s / triton.infer_per_s
        ok = ratio >= TARGET_RATIO and edged.p50_us < triton.p50_us
        met = met and ok
        print(f"{scenario.label:<24} {triton.infer_per_s:>9,.0f} {triton.p50_us:>6.0f} {triton.p99_us:>6.0f} "
              f"{edged.infer_per_s:>9,.0f} {edged.p50_us:>6.0f} {edged.p99_us:>6.0f} {ratio:>5.2f}x "
              f"{edged.p50_us / triton.p50_us:>5.2f}x  {'met' if ok else 'NOT met'}")
    return met


def report_overhead(runs: dict[tuple[str, str], list[Measurement]], scenarios: list[Scenario]) -> bool:
    """Per server, the median over rounds of (its p50 - the floor measured around it) and of (its CPU per
    inference - the engine's), and edged's over Triton's for each. A latency ratio is only judged when both
    overheads are positive: a floor above a server's p50 is no floor."""
    met = True
    for scenario in scenarios:
        engine = median_of(runs[("engine", scenario.label)])
        rows = {name: runs[(name, scenario.label)] for name in ("triton", "edged")}
        over = {name: statistics.median(m.p50_us - m.floor_us for m in values) for name, values in rows.items()}
        cpu = {name: median_of(values).cpu_us - engine.cpu_us for name, values in rows.items()}
        print(f"{scenario.label:<24} {len(rows['edged'])} rounds; engine p50 {engine.p50_us:,.0f} us (median of "
              f"{len(runs[('engine', scenario.label)])} windows), CPU {engine.cpu_us:,.0f} us/inference")
        for name, values in rows.items():
            median = median_of(values)
            print(f"{'':<24} {name}: p50 {median.p50_us:,.0f} us, overhead over the floor around it "
                  f"{over[name]:+,.0f} us (rounds: {', '.join(f'{m.p50_us - m.floor_us:+.0f}' for m in values)}); "
                  f"CPU {median.cpu_us:,.0f} us/inference ({cpu[name]:+,.0f} over the engine); "
                  f"mean time outside its compute (perf_analyzer) {median.transport_us:,.0f} us")
        for kind, figures in (("p50", over), ("CPU", cpu)):
            if figures["triton"] <= 0 or figures["edged"] < 0:
                print(f"{'':<24} {kind} overhead ratio not evaluable: an overhead over the floor is negative")
                met = False
                continue
            ratio = figures["edged"] / figures["triton"]
            ok = ratio <= TARGET_OVERHEAD
            met = met and ok
            print(f"{'':<24} {kind} overhead ratio edged / triton {ratio:.2f} (target <= {TARGET_OVERHEAD}) "
                  f"{'met' if ok else 'NOT met'}")
    return met


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--protocols", nargs="+", choices=("http", "grpc", "grpc-stream"), default=["http", "grpc"],
                        help="grpc-stream: ModelStreamInfer (perf_analyzer --streaming), tiny model only")
    parser.add_argument("--no-camera", action="store_true", help="skip the camera_frame shared-memory rows")
    parser.add_argument("--no-tiny", action="store_true", help="skip the tiny_mlp rows")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds; the table shows medians")
    parser.add_argument("--interval-ms", type=int, default=2000, help="perf_analyzer's measurement window")
    parser.add_argument("--triton-venv", type=Path, default=TRITON_VENV)
    parser.add_argument("--json", type=Path, default=None, help="also write every measurement to this file")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs, repositories)")
    return parser.parse_args()


def scenarios_of(args: argparse.Namespace) -> tuple[list[Scenario], list[Scenario]]:
    """(tiny-model scenarios, camera-frame shared-memory scenarios)."""
    tiny = [] if args.no_tiny else [Scenario("tiny_mlp", p, c, "none") for p in args.protocols
                                    for c in args.concurrency]
    camera = [] if args.no_camera else [Scenario("camera_frame", p, 1, "system") for p in args.protocols
                                        if p != "grpc-stream"]
    return tiny, camera


def run_rounds(args: argparse.Namespace, scenarios: list[Scenario], ports: dict[str, Ports], pids: dict[str, int],
               floor: EngineFloor | None, work: Path) -> dict[tuple[str, str], list[Measurement]]:
    runs: dict[tuple[str, str], list[Measurement]] = {}
    for round_number in range(args.rounds):
        for scenario in scenarios:
            order = ("edged", "triton") if round_number % 2 else ("triton", "edged")
            if scenario.shm == "none" or floor is None:
                for name in order:
                    m = measure(name, ports[name].of(scenario.protocol), scenario, args.interval_ms, work)
                    report_round(round_number, m, runs)
                continue
            # engine, server, engine, server, engine: each server between two windows of the floor
            engine = [measure_engine(floor, scenario, args.interval_ms)]
            report_round(round_number, engine[-1], runs)
            for name in order:
                m = measure_with_cpu(name, pids[name], ports[name], scenario, args.interval_ms, work)
                engine.append(measure_engine(floor, scenario, args.interval_ms))
                report_round(round_number, dataclasses.replace(m, floor_us=(engine[-2].p50_us + engine[-1].p50_us) / 2),
                             runs)
                report_round(round_number, engine[-1], runs)
    return runs


def report_round(round_number: int, m: Measurement, runs: dict[tuple[str, str], list[Measurement]]) -> None:
    floor = f", floor {m.floor_us:.0f} us" if m.floor_us else ""
    cpu = f", CPU {m.cpu_us:.0f} us/inference" if m.cpu_us else ""
    print(f"round {round_number + 1}: {m.server} {m.scenario}: {m.infer_per_s:,.0f} infer/s, p50 {m.p50_us:.0f} us, "
          f"p99 {m.p99_us:.0f} us{floor}{cpu}", file=sys.stderr)
    runs.setdefault((m.server, m.scenario), []).append(m)


def main() -> int:
    args = parse_args()
    ensure_perf_analyzer()
    install = ensure_triton_venv(args.triton_venv)
    tiny, camera = scenarios_of(args)
    work = Path(tempfile.mkdtemp(prefix="edged-vs-triton-", dir="/tmp"))
    ports = {name: Ports(free_port(), free_port()) for name in ("triton", "edged")}
    triton_repo, backends = prepare_triton(work, install)
    edged_repo, edged_config = prepare_edged(work, ports["edged"])
    logs = {name: work / f"{name}.log" for name in ports}
    processes = {"triton": start_triton(install, triton_repo, backends, ports["triton"], logs["triton"]),
                 "edged": start_edged(edged_repo, edged_config, work, logs["edged"])}
    floor: EngineFloor | None = None
    try:
        for name, process in processes.items():
            wait_ready(name, process, ports[name].http, logs[name])
        if camera:
            floor = EngineFloor(edged_repo, "camera_frame")  # the daemon's repository copy: the same config
        pids = {name: process.pid for name, process in processes.items()}
        runs = run_rounds(args, tiny + camera, ports, pids, floor, work)
    finally:
        if floor is not None:
            floor.close()
        for process in processes.values():
            stop(process)
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    results = {key: median_of(values) for key, values in runs.items()}
    met = report_throughput(results, tiny)
    if camera:
        print()
        met = report_overhead(runs, camera) and met
    if args.json is not None:
        args.json.write_text(json.dumps([asdict(m) for values in runs.values() for m in values], indent=2))
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
