"""Measure the memory cost of ONNX Runtime load/unload cycles under glibc malloc, jemalloc and tcmalloc.

    .venv/bin/python scripts/bench_memory.py [--cycles 50] [--arena off|on] [--allocators system,jemalloc]

For each allocator it starts a worker process (this script with ``worker``) that calls ensure_allocator
first (so the re-exec path is the one measured), then loads a ~50 MB ONNX model from a path, runs it at two
batch sizes, unloads it and calls release_memory, ``--cycles`` times. Prints one JSON line per allocator
and a table. tests/memory/test_memory_onnx_cycles.py runs the same worker.
"""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import median
from typing import Any

MIB = 1024 * 1024


def build_model(path: Path, width: int = 2048, layers: int = 3) -> int:
    """A MatMul+Relu chain with ``layers`` float32 [width, width] weights (3 x 2048^2 x 4 B = 50.3 MB)."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    nodes, inits, prev = [], [], "x"
    for i in range(layers):
        weight = (rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32)
        inits.append(numpy_helper.from_array(weight, f"w{i}"))
        nodes.append(helper.make_node("MatMul", [prev, f"w{i}"], [f"m{i}"]))
        out = "y" if i == layers - 1 else f"r{i}"
        nodes.append(helper.make_node("Relu", [f"m{i}"], [out]))
        prev = out
    graph = helper.make_graph(
        nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", width])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return sum(int(np.prod(t.dims)) * 4 for t in inits)


def worker(args: argparse.Namespace) -> None:
    from edged.config import MemoryConfig
    from edged.memory import ensure_allocator, measure_footprint, read_rss_bytes, release_memory

    state = ensure_allocator(MemoryConfig(allocator=args.allocator), sys.orig_argv)
    import numpy as np
    import onnxruntime as ort

    idle = read_rss_bytes()
    options = ort.SessionOptions()
    options.enable_cpu_mem_arena = args.arena == "on"
    options.intra_op_num_threads = args.threads
    run_options = ort.RunOptions()
    if options.enable_cpu_mem_arena:  # with the arena off ORT rejects a shrink request
        run_options.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")
    inputs = [np.ones((batch, 2048), dtype=np.float32) for batch in (1, 16)]
    rows: list[dict[str, Any]] = []
    for _ in range(args.cycles):
        started = time.perf_counter()
        reset_peak_rss()
        with measure_footprint() as probe:
            session = ort.InferenceSession(args.model, options, providers=["CPUExecutionProvider"])
        loaded = time.perf_counter()
        peak = peak_rss_bytes() - probe.rss_before_bytes
        trimmed = release_memory(state).rss_after_bytes - probe.rss_before_bytes
        for x in inputs:
            session.run(None, {"x": x}, run_options)
        del session
        gc.collect()
        report = release_memory(state)
        rows.append({"load_s": loaded - started, "unload_s": time.perf_counter() - loaded,
                     "footprint": probe.footprint.rss_bytes if probe.footprint else None,
                     "footprint_released": trimmed, "load_peak": peak,
                     "rss": report.rss_after_bytes, "released": report.released_bytes})
    print(json.dumps({"allocator": state.name, "library": state.library, "reexecuted": state.reexecuted,
                      "idle_rss": idle, "cycles": rows}), flush=True)


def reset_peak_rss() -> None:
    # Writing 5 to clear_refs resets VmHWM (Linux 4.0+), so the next peak is this load's.
    Path("/proc/self/clear_refs").write_text("5", encoding="ascii")


def peak_rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text(encoding="ascii").splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def run_worker(model: Path, allocator: str, cycles: int, arena: str, threads: int) -> dict[str, Any]:
    command = [sys.executable, str(Path(__file__).resolve()), "worker", "--model", str(model),
               "--allocator", allocator, "--cycles", str(cycles), "--arena", arena, "--threads", str(threads)]
    done = subprocess.run(command, check=False, capture_output=True, text=True, timeout=600,
                          cwd=Path(__file__).resolve().parent.parent)
    if done.returncode != 0:
        raise RuntimeError(f"worker for {allocator} exited with {done.returncode}: {done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def summarize(result: dict[str, Any], settle: int = 3) -> dict[str, float]:
    cycles = result["cycles"]
    rss = [c["rss"] for c in cycles]
    med = sorted(c["load_s"] for c in cycles)[len(cycles) // 2]
    return {
        "idle_mib": result["idle_rss"] / MIB,
        "footprint_first_mib": cycles[0]["footprint"] / MIB,
        "footprint_median_mib": sorted(c["footprint"] for c in cycles)[len(cycles) // 2] / MIB,
        "footprint_released_median_mib": median([c["footprint_released"] for c in cycles]) / MIB,
        "load_peak_median_mib": median([c["load_peak"] for c in cycles]) / MIB,
        "load_ms_median": med * 1000,
        "unload_ms_median": sorted(c["unload_s"] for c in cycles)[len(cycles) // 2] * 1000,
        "rss_after_first_mib": rss[0] / MIB,
        "rss_settled_mib": rss[settle - 1] / MIB,
        "rss_last_mib": rss[-1] / MIB,
        "rss_max_mib": max(rss) / MIB,
        "growth_after_settle_mib": (rss[-1] - rss[settle - 1]) / MIB,
    }


def main() -> None:
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=raw)
    parser.add_argument("mode", nargs="?", default="bench", choices=["bench", "worker"])
    parser.add_argument("--model", default="")
    parser.add_argument("--allocator", default="system")
    parser.add_argument("--allocators", default="system,jemalloc,tcmalloc")
    parser.add_argument("--cycles", type=int, default=50)
    parser.add_argument("--arena", choices=["on", "off"], default="off")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    if args.mode == "worker":
        worker(args)
        return
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "model.onnx"
        weights = build_model(model)
        print(f"model: {weights / 1e6:.1f} MB of weights, file {model.stat().st_size / 1e6:.1f} MB, "
              f"arena {args.arena}, {args.cycles} cycles, {args.threads} threads")
        for allocator in args.allocators.split(","):
            result = run_worker(model, allocator, args.cycles, args.arena, args.threads)
            summary = summarize(result)
            rounded = {k: round(v, 2) for k, v in summary.items()}
            print(json.dumps({"allocator": result["allocator"], **rounded}))
            trace = " ".join(f"{c['rss'] / MIB:.0f}" for c in result["cycles"])
            print("  rss after each cycle (MiB):", trace)


if __name__ == "__main__":
    main()
