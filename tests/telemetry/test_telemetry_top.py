"""``edged top --once`` against a stdlib HTTP server on a Unix socket serving canned JSON."""

from __future__ import annotations

import json
import socketserver
import threading
from http.server import BaseHTTPRequestHandler

import pytest

from edged.cli.main import main

TELEMETRY = {
    "source": "tegrastats", "power_mode": "15W", "power_in_mw": 5263, "throttle_active": [],
    "energy_per_inference_mj": {"digits": 41.5},
    "sample": {"cpu": [{"load_pct": 12, "freq_mhz": 729}, {"load_pct": None, "freq_mhz": None}],
               "gpu_load_pct": 61, "gpu_freq_mhz": 624, "ram_used_mb": 3140, "ram_total_mb": 7620,
               "power_mw": {"VDD_IN": {"now": 5263, "avg": 5263}}, "temps_c": {"tj": 48.9}},
}
STATS = {"model_stats": [{"name": "digits", "version": "1", "inference_count": 1200, "execution_count": 300,
                          "inference_stats": {"compute_infer": {"count": 300, "ns": 450_000_000}}}]}


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = {"/v2/edged/telemetry": TELEMETRY, "/v2/models/stats": STATS}.get(self.path)
        data = json.dumps(body if body is not None else {"error": "not found"}).encode()
        self.send_response(200 if body is not None else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


class UnixHTTPServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True

    def get_request(self):  # BaseHTTPRequestHandler wants a (host, port) client address
        request, _ = super().get_request()
        return request, ("local", 0)


@pytest.fixture
def server(tmp_path):
    path = str(tmp_path / "edged.sock")
    httpd = UnixHTTPServer(path, Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield path
    httpd.shutdown()
    httpd.server_close()


def test_top_once_prints_one_frame_from_the_daemon(server, capsys):
    assert main(["top", "--once", "--socket", server]) == 0
    out = capsys.readouterr().out
    assert "source tegrastats" in out and "15W" in out
    assert "61%" in out and "@624 MHz" in out and "3140/7620 MB" in out
    assert "VDD_IN 5263 mW" in out and "tj 48.9C" in out
    assert "digits" in out and "1.50" in out and "41.5" in out  # 450 ms / 300 executions; mJ per inference
    assert "off" in out  # the offline core


def test_top_says_which_socket_it_tried(tmp_path, capsys):
    missing = str(tmp_path / "absent.sock")
    assert main(["top", "--once", "--socket", missing]) == 1
    err = capsys.readouterr().err
    assert "no edged daemon answered" in err and missing in err


def test_top_prints_model_and_rail_names_as_text_not_rich_markup(server, capsys, monkeypatch):
    """A name with brackets was read as markup: '[bold]' vanished into a style, '[/x]' raised MarkupError."""
    monkeypatch.setenv("COLUMNS", "200")  # wide enough that no cell wraps
    STATS["model_stats"].append({"name": "det[bold]x[/bold]", "version": "2", "inference_count": 1,
                                 "execution_count": 1, "inference_stats": {}})
    STATS["model_stats"].append({"name": "odd[/x]", "version": "1", "inference_count": 0, "execution_count": 0})
    TELEMETRY["sample"]["power_mw"]["VDD_[red]IN"] = {"now": 7, "avg": 7}
    try:
        assert main(["top", "--once", "--socket", server]) == 0
    finally:
        del STATS["model_stats"][1:], TELEMETRY["sample"]["power_mw"]["VDD_[red]IN"]
    out = capsys.readouterr().out
    assert "det[bold]x[/bold]" in out and "odd[/x]" in out and "VDD_[red]IN 7 mW" in out


@pytest.mark.parametrize("interval", ["-1", "0", "nan", "soon"])
def test_top_refuses_an_interval_that_is_not_a_positive_number_as_a_usage_error(interval, capsys):
    """--interval -1 reached time.sleep() and ended in a ValueError traceback."""
    with pytest.raises(SystemExit) as raised:
        main(["top", "--interval", interval])
    assert raised.value.code == 2
    assert "--interval" in capsys.readouterr().err


def test_top_into_a_pipe_prints_a_frame_per_interval(server):
    """Into a pipe (`edged top | tee`, a non-interactive ssh) rich's Live printed nothing until the end, which a
    live view never reaches: the reader waited forever on an empty pipe."""
    import os
    import select
    import subprocess
    import sys
    import time

    proc = subprocess.Popen([sys.executable, "-m", "edged.cli.main", "top", "--interval", "0.05", "--socket",
                             server], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out = b""
    deadline = time.monotonic() + 60  # a bound for a broken build, not a timing the test measures
    try:
        while out.count(b"source tegrastats") < 2 and time.monotonic() < deadline:
            ready, _, _ = select.select([proc.stdout], [], [], 1.0)
            if ready:
                chunk = os.read(proc.stdout.fileno(), 65536)
                if not chunk:
                    break
                out += chunk
    finally:
        proc.kill()
        proc.wait()
    assert out.count(b"source tegrastats") >= 2, (out[-500:], proc.stderr.read()[-500:])
    assert b"\x1b[" not in out  # no cursor movement or colour codes into a file


class NoTelemetryHandler(Handler):
    def do_GET(self) -> None:
        if self.path == "/v2/edged/telemetry":  # as the daemon answers with [telemetry] source = "off"
            data = json.dumps({"error": "telemetry is not enabled on this daemon"}).encode()
            self.send_response(404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        super().do_GET()


def test_top_without_telemetry_shows_the_models_and_how_to_turn_telemetry_on(tmp_path, capsys, monkeypatch):
    """With telemetry off, edged top refused to run at all ('telemetry is not enabled on this daemon'), model
    table included, and said nothing of how to enable it."""
    monkeypatch.setenv("COLUMNS", "200")
    path = str(tmp_path / "edged.sock")
    httpd = UnixHTTPServer(path, NoTelemetryHandler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        assert main(["top", "--once", "--socket", path]) == 0
    finally:
        httpd.shutdown()
        httpd.server_close()
    out = capsys.readouterr().out
    assert "digits" in out and "1200" in out  # the models table
    assert "telemetry is off" in out and "[telemetry] source" in out


class GrowingHandler(Handler):
    """Each statistics request finds 50 more inferences of 'digits' than the one before."""

    served = 0

    def do_GET(self) -> None:
        if self.path == "/v2/models/stats":
            GrowingHandler.served += 1
            stats = {"model_stats": [{**STATS["model_stats"][0], "inference_count": 1200 + 50 * self.served}]}
            data = json.dumps(stats).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        super().do_GET()


def test_top_shows_each_models_inference_rate_from_the_second_frame(tmp_path):
    """The README promises per-model rate; top showed only the cumulative counts."""
    import os
    import select
    import subprocess
    import sys
    import time

    path = str(tmp_path / "edged.sock")
    httpd = UnixHTTPServer(path, GrowingHandler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    proc = subprocess.Popen([sys.executable, "-m", "edged.cli.main", "top", "--interval", "0.1", "--socket", path],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, "COLUMNS": "160"})
    out = b""
    deadline = time.monotonic() + 60  # a bound for a broken build, not a timing the test measures
    try:
        while out.count(b"source tegrastats") < 3 and time.monotonic() < deadline:
            if select.select([proc.stdout], [], [], 1.0)[0]:
                chunk = os.read(proc.stdout.fileno(), 65536)
                if not chunk:
                    break
                out += chunk
    finally:
        proc.kill()
        proc.wait()
        httpd.shutdown()
        httpd.server_close()
    frames = out.decode().split("source tegrastats")[1:]
    assert len(frames) >= 3 and "infer/s" in frames[0]
    rows = [next(line for line in f.splitlines() if "digits" in line and "│" in line) for f in frames[:3]]
    assert rows[0].split("│")[4].strip() == "-"  # no rate before a second reading
    assert float(rows[2].split("│")[4]) > 0


def test_top_marks_stale_readings_as_stale(server, capsys, monkeypatch):
    """/metrics drops readings once the newest sample is too old; top showed them as current, unmarked."""
    monkeypatch.setenv("COLUMNS", "200")
    TELEMETRY.update(stale=True, last_sample_age_s=42.5)
    try:
        assert main(["top", "--once", "--socket", server]) == 0
    finally:
        del TELEMETRY["stale"], TELEMETRY["last_sample_age_s"]
    out = capsys.readouterr().out
    assert "STALE" in out and "42 s" in out
