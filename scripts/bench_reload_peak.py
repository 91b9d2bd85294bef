"""Peak RSS of a model load and of its reload under a memory budget, measured from outside the daemon.

    .venv/bin/python scripts/bench_reload_peak.py [--budget-mb 200] [--reload auto,side_by_side,replace]
        [--model chain|mlp] [--factor F] [--allocator system|jemalloc|tcmalloc] [--baseline DIR]

Starts ``edged serve`` (explicit model control, telemetry off, ``[memory] budget_mb``) once per reload policy,
loads and unloads a tiny model (onnxruntime's one-time start-up), then for a ~50 MB ONNX model: resets the
daemon's VmHWM (``/proc/<pid>/clear_refs``), loads it, resets again, loads it again (a reload), and prints
VmRSS before, the VmHWM rise and the budget's free part for each step. ``--baseline DIR`` runs the same steps
against another checkout (e.g. ``git archive <commit> | tar -x -C DIR``) without a ``reload`` key, so both are
measured side by side in one run.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_memory import build_model

from edged.client import ClientError, EdgedClient

MIB = 1024 * 1024
ROOT = Path(__file__).resolve().parent.parent


def status_kib(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/{pid}/status has no {key}")


def start(source: Path, work: Path, repo: Path, args: argparse.Namespace, reload: str) -> subprocess.Popen[bytes]:
    work.mkdir(parents=True)
    models = f'\n[models]\nreload = "{reload}"\n' if reload != "-" else ""
    factor = f"load_estimate_factor = {args.factor}\n" if args.factor else ""
    (work / "edged.toml").write_text(f'[telemetry]\nsource = "off"\n\n[memory]\nbudget_mb = {args.budget_mb}\n'
                                     f'allocator = "{args.allocator}"\n{factor}{models}')
    command = [sys.executable, "-m", "edged", "serve", "--socket", str(work / "s"), "--state-dir",
               str(work / "state"), "--config", str(work / "edged.toml"), "--model-repository", str(repo),
               "--model-control-mode", "explicit"]
    env = {**os.environ, "PYTHONPATH": str(source)}
    with (work / "log").open("wb") as log:
        process = subprocess.Popen(command, cwd=source, env=env, stdout=log, stderr=subprocess.STDOUT)
    probe = EdgedClient(work / "s", timeout_s=5)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        try:
            if probe.ready():
                return process
        except ClientError:
            probe.close()
        time.sleep(0.05)
    process.kill()
    raise RuntimeError(f"edged did not start: {(work / 'log').read_text()}")


def step(pid: int, client: EdgedClient, name: str) -> dict[str, Any]:
    free = client.status()["memory"].get("free_bytes")
    Path(f"/proc/{pid}/clear_refs").write_text("5")
    before = status_kib(pid, "VmRSS")
    try:
        client.load(name)
        outcome = "200"
    except ClientError as e:
        outcome = f"refused: {str(e)[:60]}..."
    return {"rss_before": before / 1024, "hwm_rise": (status_kib(pid, "VmHWM") - before) / 1024,
            "free": None if free is None else free / MIB, "rss_after": status_kib(pid, "VmRSS") / 1024,
            "outcome": outcome}


def run(label: str, source: Path, work: Path, repo: Path, args: argparse.Namespace, reload: str) -> None:
    process = start(source, work, repo, args, reload)
    client = EdgedClient(work / "s", timeout_s=120)
    try:
        client.load("warm")
        client.unload("warm")
        for what in ("load", "reload"):
            r = step(process.pid, client, "big")
            free = "n/a (not reported)" if r["free"] is None else f"{r['free']:.0f}"
            print(f"| {label} | {reload} | {what} | {r['rss_before']:.0f} | {r['hwm_rise']:.0f} | {free} | "
                  f"{r['rss_after']:.0f} | {r['outcome']} |", flush=True)
    finally:
        client.close()
        process.terminate()
        process.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--budget-mb", type=float, default=200)
    parser.add_argument("--reload", default="auto,side_by_side,replace")
    parser.add_argument("--factor", type=float, help="[memory] load_estimate_factor (default: not set)")
    parser.add_argument("--allocator", default="system", choices=["system", "jemalloc", "tcmalloc"])
    parser.add_argument("--model", default="chain", choices=["chain", "mlp"],
                        help="chain: 3 MatMul+Relu layers of 2048x2048; mlp: one 3600x3600 layer")
    parser.add_argument("--baseline", type=Path, help="another checkout to measure the same way, first")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="edged-reload-") as tmp:
        repo = Path(tmp) / "models"
        for name in ("big", "warm"):
            (repo / name / "1").mkdir(parents=True)
        big = repo / "big" / "1" / "model.onnx"
        size = build_model(big) if args.model == "chain" else build_model(big, width=3600, layers=1)
        build_model(repo / "warm" / "1" / "model.onnx", width=64, layers=1)
        print(f"{args.model} model {size / MIB:.1f} MiB, budget {args.budget_mb:.0f} MiB, allocator "
              f"{args.allocator}; MiB throughout")
        print("| code | reload | step | VmRSS before | VmHWM rise | budget free before | VmRSS after | answer |")
        print("|---|---|---|---|---|---|---|---|")
        if args.baseline is not None:
            run("baseline", args.baseline, Path(tmp) / "baseline", repo, args, "-")
        for policy in args.reload.split(","):
            run("this", ROOT, Path(tmp) / policy, repo, args, policy)


if __name__ == "__main__":
    main()
