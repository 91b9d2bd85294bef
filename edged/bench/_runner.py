"""Runs scenarios over their transports and collects results, with progress on stderr."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from edged.bench._genai_raw import model_folder, run_raw_genai
from edged.bench._inproc import (
    execution_counts,
    make_inputs,
    run_engine,
    run_engine_asyncio,
    run_engine_callbacks,
    run_raw_onnxruntime,
    set_batching,
    start_service,
)
from edged.bench._openai import GenResult, Load, calibrated_prompt, gen_table, measure
from edged.bench._scenario import Scenario
from edged.bench._socket import remote_inputs, run_socket, wait_ready
from edged.bench._stats import Result, table
from edged.errors import ConfigError

Progress = Callable[[str], None]


MEASURE = {"callbacks": run_engine_callbacks, "threads": run_engine, "asyncio": run_engine_asyncio}


def run_inproc(scenario: Scenario, repository: Path, progress: Progress) -> list[Result]:
    service = start_service(repository, scenario.model)
    results: list[Result] = []
    try:
        inputs = make_inputs(service, scenario.model, scenario.batch)
        variants = {"both": (True, False), "on": (True,), "off": (False,)}.get(scenario.batching, (None,))
        measure = MEASURE[scenario.client]
        for batching in variants:
            if batching is not None:
                set_batching(service, scenario.model, batching)
            suffix = "" if batching is None else (" batching" if batching else " no-batching")
            if scenario.client not in scenario.label:
                suffix += f" {scenario.client}"
            for concurrency in scenario.concurrency:
                progress(f"{scenario.label}{suffix}: concurrency {concurrency} for {scenario.duration_s:.0f} s")
                measure(service, "warm-up", scenario.model, inputs, concurrency, scenario.warmup_s, scenario.batch)
                inferences, executions = execution_counts(service, scenario.model)
                result = measure(service, scenario.label + suffix, scenario.model, inputs, concurrency,
                                 scenario.duration_s, scenario.batch)
                inferences_after, executions_after = execution_counts(service, scenario.model)
                ran = executions_after - executions
                results.append(dataclasses.replace(
                    result, batching="" if batching is None else ("on" if batching else "off"),
                    mean_batch=(inferences_after - inferences) / ran if ran else 0.0))
        version = service.version_info(scenario.model)
        if scenario.compare_raw and version.config.runtime == "onnxruntime":
            progress(f"raw onnxruntime session.run on {scenario.model} for {scenario.duration_s:.0f} s")
            run_raw_onnxruntime(version.path, "warm-up", scenario.model, inputs, scenario.warmup_s, scenario.batch)
            results.append(run_raw_onnxruntime(version.path, f"raw onnxruntime {scenario.model}", scenario.model,
                                               inputs, scenario.duration_s, scenario.batch))
    finally:
        service.close()
    return results


def run_openai(scenario: Scenario, target: dict[str, Any], repository: Path, progress: Progress) -> list[GenResult]:
    prompt_tokens, output_tokens, stream = scenario.generative
    load = Load(scenario.model, prompt_tokens, output_tokens, stream)
    progress(f"{scenario.label}: calibrating a prompt of {prompt_tokens} tokens")
    prompt = calibrated_prompt(target, load)
    results = []
    for concurrency in scenario.concurrency:
        progress(f"{scenario.label}: concurrency {concurrency} for {scenario.duration_s:g} s")
        measure("warm-up", target, load, prompt, concurrency, scenario.warmup_s)
        results.append(measure(scenario.label, target, load, prompt, concurrency, scenario.duration_s))
    folder = model_folder(repository, scenario.model)
    if scenario.compare_raw and folder is not None:
        read = round(results[0].prompt_tokens)  # the daemon's count, chat template included
        progress(f"raw onnxruntime-genai generator loop on {folder} for {scenario.duration_s:g} s")
        run_raw_genai(folder, "warm-up", load, prompt, read, scenario.warmup_s)
        results.append(run_raw_genai(folder, f"raw onnxruntime-genai {scenario.model}", load, prompt, read,
                                     scenario.duration_s))
    return results


def run_remote(scenario: Scenario, target: dict[str, Any], progress: Progress) -> list[Result]:
    inputs = remote_inputs(target, scenario.model, scenario.batch)
    results = []
    for concurrency in scenario.concurrency:
        progress(f"{scenario.label}: concurrency {concurrency} for {scenario.duration_s:.0f} s")
        run_socket("warm-up", scenario.transport, target, scenario.model, inputs, concurrency, scenario.warmup_s,
                   scenario.batch, scenario.shm, scenario.body)
        results.append(run_socket(scenario.label, scenario.transport, target, scenario.model, inputs, concurrency,
                                  scenario.duration_s, scenario.batch, scenario.shm, scenario.body))
    return results


@contextlib.contextmanager
def spawned_daemon(repository: Path, http_port: int | None) -> Iterator[dict[str, Any]]:
    """A daemon in a child process on a private socket, for self-contained socket benchmarks."""
    with tempfile.TemporaryDirectory(prefix="edged-bench-") as tmp:
        sock = os.path.join(tmp, "edged.sock")
        config = Path(tmp) / "edged.toml"
        config.write_text('[telemetry]\nsource = "off"\n', encoding="utf-8")  # measure serving alone
        command = [sys.executable, "-m", "edged", "serve", "--config", str(config), "--socket", sock,
                   "--model-repository", str(repository), "--state-dir", tmp, "--log-level", "warning"]
        if http_port:
            command += ["--http-port", str(http_port)]
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL)
        try:
            target: dict[str, Any] = {"unix": sock, "port": http_port}
            wait_ready(target, 120)
            yield target
        finally:
            process.terminate()
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()


def run_all(scenarios: list[Scenario], repository: Path, target: dict[str, Any] | None,
            progress: Progress) -> list[Result | GenResult]:
    """Every scenario's rows: ``Result`` for inference transports, ``GenResult`` for openai."""
    results: list[Result | GenResult] = []
    for scenario in scenarios:
        if scenario.transport == "inproc":
            results += run_inproc(scenario, repository, progress)
        elif scenario.transport == "openai":
            if target is None:
                raise ConfigError(f"scenario {scenario.label}: transport openai needs a daemon: pass --socket / "
                                  "--http-port, or --spawn")
            results += run_openai(scenario, _openai_target(target), repository, progress)
        elif scenario.transport in ("uds", "http"):
            if target is None:
                raise ConfigError(f"scenario {scenario.label}: transport {scenario.transport} needs a daemon: pass "
                                  "--socket / --http-port, or --spawn")
            remote = target if scenario.transport == "uds" else {"host": "127.0.0.1", "port": target.get("port")}
            if scenario.transport == "http" and not remote["port"]:
                raise ConfigError("transport http needs --http-port N (the daemon's loopback listener)")
            results += run_remote(scenario, remote, progress)
        else:
            from edged.bench._mqtt import run_mqtt
            results += run_mqtt(scenario, repository, progress)
    return results


def _openai_target(target: dict[str, Any]) -> dict[str, Any]:
    """Loopback TCP when the daemon's port is named (what remote OpenAI clients use), else its Unix socket."""
    if target.get("port"):
        return {"host": "127.0.0.1", "port": target["port"]}
    return {"unix": target["unix"]}


def report(results: list[Result | GenResult]) -> str:
    """The inference table, then the generation table (GenAI-Perf's columns), each only when it has rows."""
    inference = [r for r in results if isinstance(r, Result)]
    generation = [r for r in results if isinstance(r, GenResult)]
    parts = ([table(inference)] if inference else []) + ([gen_table(generation)] if generation else [])
    return "\n\n".join(parts)
