"""The errors a reader of the README meets on the way (a wrong socket, a socket they may not open, a model that
is not there, a missing repository or group, a broker that is down, shared memory for a group that does not
exist), each through the command or call the README shows: each names what was wrong and says what to do next."""

from __future__ import annotations

import grp
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from server_harness import ThreadedServer, short_tempdir

from edged.client import ClientError, EdgedClient, SharedMemoryRegion
from tests.integration.edged_daemon import daemon_environment, start_daemon
from tests.mqtt.conftest import free_port

NOBODY = 65534
NO_SUCH_GROUP = "edged-no-such-group"


def edged(*args: str, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "edged", *args], capture_output=True, text=True,
                          env=daemon_environment(), timeout=timeout_s, check=False)


def one_line(text: str) -> str:
    return re.sub(r"\s+", " ", text)


@pytest.fixture(scope="module")
def server() -> Iterator[ThreadedServer]:
    running = ThreadedServer(models=("tiny_mlp",)).start()
    yield running
    running.stop()


def in_child_as_nobody(work: Callable[[], str]) -> str:
    """``work()``'s text, run in a forked child that has dropped root (permissions are not checked for root)."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        status = 0
        try:
            os.close(read_end)
            if os.geteuid() == 0:
                os.setgroups([])
                os.setgid(NOBODY)
                os.setuid(NOBODY)
            os.write(write_end, work().encode())
        except BaseException as e:  # the parent reports it
            os.write(write_end, f"child failed: {e!r}".encode())
            status = 1
        finally:
            os._exit(status)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        text = pipe.read().decode()
    os.waitpid(pid, 0)
    return text


def test_unknown_model_error_says_how_to_list_the_models(server: ThreadedServer) -> None:
    result = edged("infer", "no_such_model", "--input", "[1]", "--socket", server.socket_path)
    assert result.returncode == 1
    assert "'no_such_model' is not in the repository" in result.stderr
    assert "`edged models list`" in result.stderr


def test_socket_the_user_may_not_open_says_how_to_get_access(server: ThreadedServer) -> None:
    directory = Path(server.socket_path).parent
    directory.chmod(0o755)  # the folder may be entered, the socket (0660, root's) may not be opened by nobody
    if os.geteuid() != 0:
        Path(server.socket_path).chmod(0)

    def ready() -> str:
        try:
            EdgedClient(server.socket_path, timeout_s=5).ready()
        except ClientError as e:
            return str(e)
        return "connected"

    try:
        message = in_child_as_nobody(ready)
    finally:
        directory.chmod(0o700)
        Path(server.socket_path).chmod(0o660)
    assert "Permission denied" in message, message
    group = grp.getgrgid(Path(server.socket_path).stat().st_gid).gr_name
    assert "member of its group" in message and f"usermod -aG {group} $USER" in message, message
    assert "start the daemon" not in message, message  # it is running: starting one is not the fix


def test_missing_model_repository_says_how_to_point_at_one(tmp_path: Path) -> None:
    directory = Path(short_tempdir("edged-fe-"))
    try:
        result = edged("serve", "--model-repository", str(tmp_path / "absent"), "--socket",
                       str(directory / "edged.sock"), "--state-dir", str(directory / "state"), "--config",
                       str(_config(tmp_path, '[telemetry]\nsource = "off"\n')))
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    assert result.returncode == 1
    message = one_line(result.stderr)
    assert "absent' cannot be listed" in message and "--model-repository" in message, message


def _config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "edged.toml"
    path.write_text(text)
    return path


def test_access_group_that_does_not_exist_says_create_or_remove(tmp_path: Path) -> None:
    config = _config(tmp_path, f'[telemetry]\nsource = "off"\n[server.access]\ninfer_groups = ["{NO_SUCH_GROUP}"]\n')
    directory = Path(short_tempdir("edged-fe-"))
    try:
        result = edged("serve", "--config", str(config), "--socket", str(directory / "edged.sock"),
                       "--state-dir", str(directory / "state"))
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    assert result.returncode == 1
    message = one_line(result.stderr)
    assert f"unknown group '{NO_SUCH_GROUP}'" in message and f"groupadd {NO_SUCH_GROUP}" in message, message


@pytest.mark.parametrize(("flag", "key"), [("--http-port", "server.http_port"), ("--grpc-port", "server.grpc_port")])
def test_a_port_another_process_holds_says_stop_it_or_choose_another(tmp_path: Path, flag: str, key: str) -> None:
    config = _config(tmp_path, '[telemetry]\nsource = "off"\n')
    directory = Path(short_tempdir("edged-fe-"))
    with socket.create_server(("127.0.0.1", 0)) as holder:
        port = holder.getsockname()[1]
        try:
            result = edged("serve", "--config", str(config), "--socket", str(directory / "edged.sock"),
                           "--state-dir", str(directory / "state"), flag, str(port))
        finally:
            shutil.rmtree(directory, ignore_errors=True)
    assert result.returncode == 1
    message = one_line(result.stderr)
    assert f"127.0.0.1:{port}" in message and "another process listens there" in message, message
    assert f"{key}, {flag}" in message, message


@pytest.mark.parametrize(("flag", "key"), [("--socket", "server.socket"), ("--grpc-socket", "server.grpc_socket")])
def test_a_socket_in_a_folder_that_does_not_exist_says_create_it(tmp_path: Path, flag: str, key: str) -> None:
    config = _config(tmp_path, '[telemetry]\nsource = "off"\n')
    directory = Path(short_tempdir("edged-fe-"))
    missing = directory / "no-such-folder" / "x.sock"
    sockets = ["--socket", str(directory / "edged.sock")] if flag != "--socket" else []
    try:
        result = edged("serve", "--config", str(config), "--state-dir", str(directory / "state"), *sockets,
                       flag, str(missing))
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    assert result.returncode == 1
    message = one_line(result.stderr)
    assert f"mkdir -p {missing.parent}" in message and f"{key}, {flag}" in message, message


def test_fleet_status_with_the_broker_down_says_what_to_check() -> None:
    url = f"mqtt://127.0.0.1:{free_port()}"
    result = edged("fleet", "status", "--broker", url)
    assert result.returncode == 1
    message = one_line(result.stderr)
    assert f"broker {url}: cannot connect" in message and "--broker names its host and port" in message, message


def test_status_says_why_mqtt_is_disconnected_and_that_edged_keeps_trying(tmp_path: Path) -> None:
    port = free_port()  # nothing listens there: the broker is down
    models = tmp_path / "models"
    shutil.copytree(Path(__file__).resolve().parents[2] / "models" / "tiny_mlp", models / "tiny_mlp")
    workdir = Path(short_tempdir("edged-fe-"))
    daemon = start_daemon(workdir, config=f'[telemetry]\nsource = "off"\n[mqtt]\nbroker = "mqtt://127.0.0.1:{port}"\n'
                          'device_id = "first-errors"\n', args=["--model-repository", str(models)])
    try:
        for _ in range(200):  # status can say why only after the first connection attempt has failed
            result = edged("status", "--socket", str(daemon.socket_path))
            if "cannot connect" in result.stdout:
                break
        line = next(line for line in result.stdout.splitlines() if line.startswith("mqtt"))
        assert f"disconnected from 127.0.0.1:{port} (cannot connect" in line, line
        assert "reconnecting, results wait in the outbox" in line and "outbox 0 waiting" in line, line
        # the journal says it too, once however often the backoff retries
        assert daemon.output().count(f"mqtt: cannot connect to 127.0.0.1:{port}") == 1, daemon.output()
        assert "check that the broker runs there, or fix [mqtt] broker" in daemon.output()
    finally:
        daemon.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def test_share_with_a_group_that_does_not_exist_names_it_and_when_sharing_is_needed() -> None:
    with SharedMemoryRegion.create(f"/edged-fe-{os.getpid()}", 4096) as region, \
            pytest.raises(ClientError, match=f"no group '{NO_SUCH_GROUP}' on this machine: sharing a region is "
                                             "needed only when the daemon runs as another user"):
        region.share_with(NO_SUCH_GROUP)


def test_share_with_a_group_the_user_is_not_in_is_a_client_error() -> None:
    key = f"/edged-fe-{os.getpid()}-grp"

    def share() -> str:
        with SharedMemoryRegion.create(key, 4096) as region:
            try:
                region.share_with(0)  # root's group, which the unprivileged user is not in
            except ClientError as e:
                return str(e)
        return "shared"

    message = in_child_as_nobody(share)
    assert f"cannot give shared memory {key!r} to group 0" in message, message
    assert "only a member of the group (or root) may hand an object to it" in message
    assert not (Path("/dev/shm") / key[1:]).exists()


def test_socket_path_that_does_not_exist_names_it_and_how_to_start_the_daemon(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere.sock"
    result = edged("status", "--socket", str(missing))
    assert result.returncode == 1
    assert f"no edged daemon answered on {missing}" in result.stderr
    assert "start the daemon with `edged serve`" in result.stderr


def test_socket_file_nobody_listens_on_is_reported_as_refused(tmp_path: Path) -> None:
    stale = tmp_path / "stale.sock"
    with socket.socket(socket.AF_UNIX) as listener:  # bound and closed: the file stays, as after kill -9
        listener.bind(str(stale))
    result = edged("status", "--socket", str(stale))
    assert result.returncode == 1 and "Connection refused" in result.stderr and "edged serve" in result.stderr


def test_output_piped_into_a_reader_that_stops_early_ends_without_a_traceback() -> None:
    recorded = Path(__file__).resolve().parents[1] / "fixtures" / "tegrastats" / "orin_nano_jp6.log"
    lines = b"".join(line for line in recorded.read_bytes().splitlines(keepends=True)
                     if line.strip() and not line.startswith(b"#"))
    process = subprocess.Popen([sys.executable, "-m", "edged", "telemetry", "parse"], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=daemon_environment())
    assert process.stdin is not None and process.stdout is not None and process.stderr is not None
    stdin = process.stdin

    def feed() -> None:  # far more lines than the pipes hold, so edged goes on writing after the reader left
        try:
            for _ in range(2000):
                stdin.write(lines)
            stdin.close()
        except BrokenPipeError:
            pass  # edged stopped reading: it has seen the closed pipe

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    assert process.stdout.readline().startswith(b"{")
    process.stdout.close()  # as `| head -1` does after its line
    errors = process.stderr.read().decode()
    feeder.join(60)
    assert process.wait(60) == 128 + 13, errors  # 13: SIGPIPE, as a shell tool killed by it reports
    assert "Traceback" not in errors and "BrokenPipeError" not in errors, errors


def test_infer_input_named_wrong_says_which_input_the_model_has(server: ThreadedServer, tmp_path: Path) -> None:
    sample = tmp_path / "sample.json"
    sample.write_text("[" + ", ".join(["0.5"] * 64) + "]")
    typo = edged("infer", "tiny_mlp", "--input", f"inptu=@{sample}", "--socket", server.socket_path)
    assert typo.returncode == 1
    assert "the model has no input 'inptu'; its input is 'input'" in typo.stderr, typo.stderr
    for spec in (f"input=@{sample}", f"@{sample}"):  # named right, or NAME= left out: both run
        ran = edged("infer", "tiny_mlp", "--input", spec, "--socket", server.socket_path)
        assert ran.returncode == 0 and '"shape": [1, 10]' in ran.stdout, ran.stderr
