"""`edged infer`, `edged models` and `edged status` as real processes against the real server, found through
$EDGED_SOCKET or --socket; failures exit non-zero with a message naming the socket."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import server_harness as harness


def edged(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(harness.EDGED), *args], check=False, capture_output=True, text=True,
                          timeout=60, env=env)


def test_infer_from_npy_prints_json_outputs(server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    x = np.random.default_rng(0).standard_normal((2, 64)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    done = edged("infer", "tiny_mlp", "--input", f"input={tmp_path / 'x.npy'}", env=server.env())
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["model_name"] == "tiny_mlp"
    out = doc["outputs"][0]
    assert out["name"] == "output" and out["datatype"] == "FP32" and out["shape"] == [2, 10]
    with harness.EdgedClient(server.socket_path) as client:
        expected = client.infer("tiny_mlp", {"input": x}).as_numpy("output")
    np.testing.assert_allclose(np.array(out["data"]).reshape(2, 10), expected, rtol=1e-5, atol=1e-6)


def test_infer_from_json_over_the_json_transport_to_npy_files(server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    row = [0.5] * 64  # no batch dimension: the CLI adds a batch of one; the datatype comes from the metadata
    (tmp_path / "x.json").write_text(json.dumps(row))
    done = edged("infer", "tiny_mlp", "--input", f"input=@{tmp_path / 'x.json'}", "--json-transport",
                 "--output-format", "npy", "--output-dir", str(tmp_path / "out"), "--socket", server.socket_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(tmp_path / "out" / "output.npy")
    out = np.load(tmp_path / "out" / "output.npy")
    assert out.shape == (1, 10) and out.dtype == np.float32
    inline = edged("infer", "tiny_mlp", "--input", json.dumps([row]), env=server.env())
    assert inline.returncode == 0, inline.stderr
    np.testing.assert_allclose(np.array(json.loads(inline.stdout)["outputs"][0]["data"]), out.ravel(), rtol=1e-6)


def test_an_output_dir_that_cannot_be_written_is_one_error_line(server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "a-file").write_text("")
    row = json.dumps([[0.5] * 64])
    for where in (tmp_path / "a-file", tmp_path / "a-file" / "under", Path("/proc/edged-out")):
        done = edged("infer", "tiny_mlp", "--input", row, "--output-dir", str(where), env=server.env())
        assert done.returncode == 1, done.stderr
        assert "Traceback" not in done.stderr and f"--output-dir {where}: cannot write" in done.stderr, done.stderr


def test_infer_errors_exit_non_zero_with_the_servers_message(server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    np.save(tmp_path / "bad.npy", np.zeros((1, 63), np.float32))
    done = edged("infer", "tiny_mlp", "--input", f"input={tmp_path / 'bad.npy'}", env=server.env())
    assert done.returncode == 1
    assert "edged infer: error:" in done.stderr and "63" in done.stderr
    missing = edged("infer", "nope", "--input", "[1]", env=server.env())
    assert missing.returncode == 1 and "nope" in missing.stderr
    wrong = edged("infer", "tiny_mlp", "--input", "other=[1]", env=server.env())
    assert wrong.returncode == 1 and "other" in wrong.stderr and "input" in wrong.stderr


def test_models_list_table_and_json(server) -> None:  # type: ignore[no-untyped-def]
    table = edged("models", env=server.env())
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].split() == ["MODEL", "VERSION", "STATE", "REASON"]
    assert any(line.split()[:3] == ["tiny_mlp", "1", "READY"] for line in lines[1:])
    as_json = edged("models", "list", "--json", env=server.env())
    assert {"name": "tiny_mlp", "version": "1", "state": "READY", "reason": ""} in json.loads(as_json.stdout)
    parent_flag = edged("models", "--json", "list", env=server.env())
    assert json.loads(parent_flag.stdout) == json.loads(as_json.stdout)


def test_models_show(server) -> None:  # type: ignore[no-untyped-def]
    shown = edged("models", "show", "tiny_mlp", env=server.env())
    assert shown.returncode == 0, shown.stderr
    assert "ready     yes" in shown.stdout and "max batch 64" in shown.stdout
    assert any(line.split()[:3] == ["input", "input", "FP32"] for line in shown.stdout.splitlines())
    doc = json.loads(edged("models", "show", "tiny_mlp", "--json", env=server.env()).stdout)
    assert doc["ready"] is True and doc["config"]["max_batch_size"] == 64


def test_models_load_and_unload(explicit_server) -> None:  # type: ignore[no-untyped-def]
    env = explicit_server.env()
    loaded = edged("models", "load", "digits_onnx", env=env)
    assert loaded.returncode == 0, loaded.stderr
    assert loaded.stdout.strip() == "digits_onnx: loaded"
    unloaded = edged("models", "unload", "digits_onnx", env=env)
    assert unloaded.returncode == 0 and unloaded.stdout.strip() == "digits_onnx: unloaded"
    bad = edged("models", "load", "ghost", env=env)
    assert bad.returncode == 1 and "ghost" in bad.stderr


def test_status_human_and_json(server) -> None:  # type: ignore[no-untyped-def]
    human = edged("status", env=server.env())
    assert human.returncode == 0, human.stderr
    assert "live yes, ready yes" in human.stdout
    assert "tiny_mlp v1 READY" in human.stdout
    doc = json.loads(edged("status", "--json", env=server.env()).stdout)
    assert doc["live"] is True and doc["ready"] is True
    assert any(m["name"] == "tiny_mlp" for m in doc["models"])


def test_every_command_names_the_socket_it_tried(tmp_path: Path) -> None:
    path = str(tmp_path / "absent.sock")
    for args in (["status"], ["models"], ["models", "show", "m"], ["infer", "m", "--input", "[1]"]):
        done = edged(*args, "--socket", path)
        assert done.returncode == 1, args
        assert path in done.stderr and "edged serve" in done.stderr, done.stderr
    env = {"PATH": "/usr/bin:/bin", "EDGED_SOCKET": path, "XDG_RUNTIME_DIR": str(tmp_path)}
    done = edged("status", env=env)
    assert done.returncode == 1
    assert path in done.stderr and str(tmp_path / "edged" / "edged.sock") in done.stderr


def test_infer_over_shared_memory_gives_the_same_outputs_and_leaves_no_region(server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    x = np.random.default_rng(5).standard_normal((3, 64)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    before = set(Path("/dev/shm").iterdir())
    command = [str(harness.EDGED), "infer", "tiny_mlp", "--input", f"input={tmp_path / 'x.npy'}", "--shm"]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          env=server.env()) as cli:
        stdout, stderr = cli.communicate(timeout=60)
    assert cli.returncode == 0, stderr
    out = json.loads(stdout)["outputs"][0]
    with harness.EdgedClient(server.socket_path) as client:
        expected = client.infer("tiny_mlp", {"input": x}).as_numpy("output")
        assert client.system_shared_memory_status() == []
    np.testing.assert_allclose(np.array(out["data"]).reshape(3, 10), expected, rtol=1e-5, atol=1e-6)
    # A parallel run's other worker makes and removes regions of its own meanwhile: the ones this CLI process
    # could have left carry its pid in their names.
    assert [p.name for p in set(Path("/dev/shm").iterdir()) - before if str(cli.pid) in p.name] == []


def test_json_files_that_are_not_utf8_get_one_error_line_naming_the_file(server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    latin1 = tmp_path / "latin1.json"
    latin1.write_bytes(b"[0.5, 0.5] # caf\xe9")  # byte 16 is a Latin-1 "e" with an acute accent
    runs = {"infer": edged("infer", "tiny_mlp", "--input", f"input=@{latin1}", env=server.env()),
            "models": edged("models", "load", "tiny_mlp", "--config", f"@{latin1}", env=server.env())}
    option = {"infer": "--input input", "models": "--config"}
    for command, done in runs.items():
        assert done.returncode == 1, done.stderr
        assert "Traceback" not in done.stderr, done.stderr
        assert done.stderr.strip().splitlines() == [
            f"edged {command}: error: {option[command]}: {latin1} is not UTF-8 text (byte 16); JSON files must be "
            "UTF-8"], done.stderr


def test_a_npy_input_that_is_not_a_npy_file_is_named_as_such(server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """numpy read a file without its magic bytes as a pickle, and the error told the user the file held pickled
    data and how to load it unsafely (allow_pickle=)."""
    (tmp_path / "x.npy").write_bytes(b"1,2,3\n4,5,6\n")
    done = edged("infer", "tiny_mlp", "--input", f"input={tmp_path / 'x.npy'}", env=server.env())
    assert done.returncode == 1
    assert done.stderr.startswith("edged infer: error: --input input: ") and "Traceback" not in done.stderr
    assert "not a .npy file" in done.stderr and "numpy.save" in done.stderr
    assert "pickle" not in done.stderr
    missing = edged("infer", "tiny_mlp", "--input", f"input={tmp_path / 'none.npy'}", env=server.env())
    assert missing.returncode == 1 and "No such file or directory" in missing.stderr


def test_a_load_that_outlasts_the_timeout_says_the_daemon_goes_on_loading(explicit_server) -> None:  # type: ignore[no-untyped-def]
    """The error read only 'no answer from SOCKET within 0.001 s' while the daemon went on and loaded the model:
    nothing said the load was not refused, how to follow it, or how to wait longer (a TensorRT load takes
    minutes on a Jetson, the default timeout is 30 s)."""
    env = explicit_server.env()
    # not loaded first: a test before this one in the module may have loaded it, and a load of a loaded model
    # answers within the millisecond
    assert edged("models", "unload", "digits_onnx", env=env).returncode == 0
    slow = edged("models", "load", "digits_onnx", "--timeout", "0.001", env=env)
    assert slow.returncode == 1
    assert "still be loading" in slow.stderr and "edged models list" in slow.stderr and "--timeout" in slow.stderr
    import time

    with harness.EdgedClient(explicit_server.socket_path) as client:
        deadline = time.monotonic() + 60  # the load goes on in the daemon: wait for it through readiness
        while not client.model_ready("digits_onnx") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert client.model_ready("digits_onnx")
        client.unload("digits_onnx")


def test_an_input_nested_past_the_parsers_depth_is_one_error_line(server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    done = edged("infer", "tiny_mlp", "--input", f"input=@{tmp_path / 'deep.json'}", env=server.env())
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.startswith("edged infer: error: --input input: ") and "nested" in done.stderr


def test_output_names_with_path_characters_stay_inside_the_output_dir(tmp_path: Path) -> None:
    """Output names come from the model (a TensorFlow export names them 'dense/BiasAdd:0'): each becomes one file
    in --output-dir, its '/', '\\', NUL and '%' percent-encoded, never a path of its own ('../x' wrote beside
    the folder, '/abs' anywhere)."""
    import onnx
    from onnx import TensorProto, helper

    running = harness.ThreadedServer(models=())
    names = ["dense/BiasAdd:0", "../escaped", "/tmp/edged-abs-out", "a%2Fb", "back\\slash"]
    graph = helper.make_graph([helper.make_node("Identity", ["INPUT"], [n]) for n in names], "paths",
                              [helper.make_tensor_value_info("INPUT", TensorProto.FLOAT, ["batch", 4])],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["batch", 4]) for n in names])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    (Path(running.repository) / "paths" / "1").mkdir(parents=True)
    onnx.save(model, str(Path(running.repository) / "paths" / "1" / "model.onnx"))
    running.start()
    try:
        out = tmp_path / "work" / "out"
        for fmt in ("npy", "json"):
            done = edged("infer", "paths", "--input", json.dumps([[1.0, 2.0, 3.0, 4.0]]), "--output-format", fmt,
                         "--output-dir", str(out), "--socket", running.socket_path)
            assert done.returncode == 0, done.stderr
            written = sorted(p.name for p in out.iterdir() if p.suffix == f".{fmt}")
            assert written == sorted(f"{n}.{fmt}" for n in ("dense%2FBiasAdd:0", "..%2Fescaped",
                                                            "%2Ftmp%2Fedged-abs-out", "a%252Fb", "back%5Cslash"))
            assert sorted(done.stdout.split()) == sorted(str(out / name) for name in written)
        assert not (tmp_path / "work" / "escaped.npy").exists() and not Path("/tmp/edged-abs-out.npy").exists()
    finally:
        running.stop()
