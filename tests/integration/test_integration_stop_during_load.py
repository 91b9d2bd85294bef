"""SIGTERM while a model load runs: the whole stop still fits ``[server] stop_timeout_s``. A load of many
instances gives up between two of them; a backend stuck loading one instance is abandoned at the budget and the
process exits without waiting for it."""

from __future__ import annotations

import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
from integration.edged_daemon import DaemonProcess, config_with_fakes, start_daemon
from modelgen import add_custom_model

from edged.client import ClientError, ServerError

STOP_TIMEOUT_S = 3.0
# Each instance of the test backend takes this long to load; a load of LOAD_S in all is far past the budget.
INSTANCE_LOAD_S = 0.5
LOAD_S = 20.0
# Room past the budget for the interpreter to exit; the load alone would take LOAD_S.
EXIT_MARGIN_S = 4.0


def slow_loading_daemon(tmp_path: Path, instances: int) -> DaemonProcess:
    repo = tmp_path / "models"
    delay = LOAD_S / instances
    add_custom_model(repo, "slow_load", "doubling",
                     f'instance_group [ {{ count: {instances}, kind: KIND_CPU }} ]\n'
                     f'parameters {{ key: "load_delay_s" value: {{ string_value: "{delay}" }} }}')
    config = config_with_fakes(f'control_mode = "explicit"\n\n[server]\nstop_timeout_s = {STOP_TIMEOUT_S}\n'
                               'shutdown_timeout_s = 1.0\n')
    return start_daemon(tmp_path / "run", config=config, args=["--model-repository", str(repo)])


def wait_for_line(daemon: DaemonProcess, pattern: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if re.search(pattern, daemon.output()):
            return
        time.sleep(0.05)
    raise AssertionError(f"no line matching {pattern!r} in the daemon's output:\n{daemon.output()}")


def stop_during_load(daemon: DaemonProcess, loading: str) -> tuple[float, list[BaseException]]:
    """Start a load of slow_load from a client thread, SIGTERM once the daemon's output shows ``loading``; the
    seconds from the signal to the exit and what the load's client got."""
    answers: list[BaseException] = []

    def load() -> None:
        try:
            daemon.client(timeout_s=LOAD_S + 30).load("slow_load")
        except ClientError as e:
            answers.append(e)

    client = threading.Thread(target=load, daemon=True)
    client.start()
    wait_for_line(daemon, loading)
    signalled = time.monotonic()
    daemon.process.send_signal(signal.SIGTERM)
    try:
        daemon.process.wait(STOP_TIMEOUT_S + EXIT_MARGIN_S)
    except subprocess.TimeoutExpired:
        daemon.process.kill()
        daemon.process.wait(30)
        pytest.fail(f"edged still running {STOP_TIMEOUT_S + EXIT_MARGIN_S} s after SIGTERM (stop_timeout_s = "
                    f"{STOP_TIMEOUT_S}) during a {LOAD_S} s load:\n{daemon.output()}")
    took = time.monotonic() - signalled
    client.join(10)
    return took, answers


def test_sigterm_during_a_many_instance_load_stops_within_the_budget(tmp_path: Path) -> None:
    daemon = slow_loading_daemon(tmp_path, instances=40)
    try:
        took, answers = stop_during_load(daemon, r"loading slow_load instance 2\b")
    finally:
        daemon.stop(5)
    output = daemon.output()
    assert took < STOP_TIMEOUT_S + EXIT_MARGIN_S
    assert daemon.process.returncode == 0, output
    given_up = re.search(r"load abandoned after (\d+) of its 40 instances: the daemon is stopping", output)
    assert given_up is not None, output
    assert 2 <= int(given_up.group(1)) < 40
    assert "loading slow_load instance 39" not in output
    assert "abandoning the load" not in output  # it stopped by itself, between two instances
    assert len(answers) == 1 and isinstance(answers[0], ServerError), answers  # answered, not cut off
    assert answers[0].status == 503 and "the daemon is stopping" in str(answers[0])


def test_sigterm_during_one_uninterruptible_instance_load_exits_at_the_budget(tmp_path: Path) -> None:
    daemon = slow_loading_daemon(tmp_path, instances=1)
    try:
        took, answers = stop_during_load(daemon, r"loading slow_load instance 0\b")
    finally:
        daemon.stop(5)
    output = daemon.output()
    assert took < STOP_TIMEOUT_S + EXIT_MARGIN_S
    assert daemon.process.returncode == 0, output
    assert "abandoning the load of slow_load still running" in output
    assert "edged: stopped in" in output
    assert len(answers) == 1  # no success: the process left with the load unanswered


def test_sigterm_while_the_start_warms_up_a_hung_model_exits_at_the_budget(tmp_path: Path) -> None:
    """A model whose warm-up run never ends (a wedged backend) at the start, before READY: SIGTERM still stops
    the daemon within stop_timeout_s; before, the stop waited for the start's loads, as long as the run took."""
    repo = tmp_path / "models"
    add_custom_model(repo, "hung", "doubling",
                     f'parameters {{ key: "delay_s" value: {{ string_value: "{LOAD_S * 10}" }} }}')
    config = config_with_fakes(f'\n[server]\nstop_timeout_s = {STOP_TIMEOUT_S}\nshutdown_timeout_s = 1.0\n')
    daemon = start_daemon(tmp_path / "run", config=config, args=["--model-repository", str(repo)], wait=False)
    try:
        wait_for_line(daemon, r"listening on uds:")
        probe = daemon.client(timeout_s=10)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # the start's load is under way: the warm-up run is the stuck part
            if [m for m in probe.repository_index() if m.get("state") == "LOADING"]:
                break
            time.sleep(0.05)
        # LOADING comes a moment before the warm-up run: a SIGTERM in between makes the load give up before that
        # run, cleanly (a loaded CI machine saw it). A second later the run is under way (it lasts 200 s).
        time.sleep(1.0)
        signalled = time.monotonic()
        daemon.process.send_signal(signal.SIGTERM)
        try:
            daemon.process.wait(STOP_TIMEOUT_S + EXIT_MARGIN_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"edged still running {STOP_TIMEOUT_S + EXIT_MARGIN_S} s after SIGTERM (stop_timeout_s = "
                        f"{STOP_TIMEOUT_S}) with a warm-up run stuck at its start:\n{daemon.output()}")
        took = time.monotonic() - signalled
    finally:
        daemon.stop(5)
    output = daemon.output()
    assert took < STOP_TIMEOUT_S + EXIT_MARGIN_S
    assert daemon.process.returncode == 0, output
    # the stuck run is abandoned at the budget; had the SIGTERM still come before the run began, the load gave up
    assert ("abandoning the load of hung still running" in output
            or "load abandoned during warm-up: the daemon is stopping" in output), output
    assert "edged: stopped in" in output
    assert "edged: ready" not in output  # a stop during the start is no start
