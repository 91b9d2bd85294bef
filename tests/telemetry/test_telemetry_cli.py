"""``edged telemetry ...`` as a user runs it: a real subprocess for parse, the database for the others."""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from telemetry_data import TEGRASTATS, recorded_lines

from edged.cli.main import main
from edged.config import TelemetryConfig
from edged.telemetry import TelemetryService
from edged.telemetry._replay import ReplaySource


def test_parse_writes_one_json_object_per_line_and_reports_bad_lines_by_number():
    lines = [*recorded_lines("agx_orin_jp5.log")[:2], "this is not tegrastats", *recorded_lines("thor_jp7.log")]
    proc = subprocess.run([sys.executable, "-m", "edged.cli.main", "telemetry", "parse"],
                          input="\n".join(lines) + "\n", capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 1
    assert proc.stderr.strip().startswith("line 3: not a tegrastats line")
    records = [json.loads(line) for line in proc.stdout.splitlines()]
    assert len(records) == 4
    assert records[0]["timestamp"] == "04-24-2023 00:01:24" and records[0]["gpu_freq_mhz"] == 0
    assert records[2]["gpu_gpc_freq_mhz"] == [1000, 1000, 1000] and "gpu_gpc_freq_mhz" not in records[0]


@pytest.fixture(scope="module")
def history(tmp_path_factory) -> Path:
    """Two hours of Orin Nano samples at 1 s spacing, replayed at top speed, with one model running."""
    path = tmp_path_factory.mktemp("hist") / "telemetry.db"
    day = tmp_path_factory.mktemp("hist") / "lines.log"
    day.write_text("\n".join(recorded_lines("orin_nano_jp6.log")) + "\n")

    class Model:
        calls = 0

        def model_activity(self):
            self.calls += 1
            return {("digits", "1"): (self.calls * 3, self.calls * 1_000_000)}

    source = ReplaySource(str(day), speed=1e9, interval_s=1.0, loop=True)
    service = TelemetryService(TelemetryConfig(flush_interval_s=0.2), str(path), activity=Model(), source=source)
    service.start()
    assert service.wait_samples(7200, timeout=60)
    service.stop()
    return path


def test_summary_answers_over_the_database(history, capsys):
    start = time.perf_counter()
    assert main(["telemetry", "summary", "--db", str(history), "--since", "24h", "--json"]) == 0
    elapsed = time.perf_counter() - start
    summary = json.loads(capsys.readouterr().out)
    assert summary["samples"] >= 7200
    assert summary["series"]["power_mw:VDD_IN"]["max"] == 5832
    assert summary["series"]["power_mw:VDD_IN"]["min"] == 3913
    assert summary["energy_per_inference_mj"]["digits"] > 0
    assert elapsed < 1.0
    assert main(["telemetry", "summary", "--db", str(history)]) == 0
    assert "power_mw:VDD_IN" in capsys.readouterr().out


def test_query_and_export_csv_and_json(history, capsys, tmp_path):
    assert main(["telemetry", "query", "--db", str(history), "--since", "1m", "--series", "temp_c:tj"]) == 0
    rows = capsys.readouterr().out.splitlines()
    assert 55 <= len(rows) <= 62 and all(" temp_c:tj " in r for r in rows)
    out = tmp_path / "x.csv"
    assert main(["telemetry", "export", "--csv", "--db", str(history), "--since", "2h", "--table", "rollup_1m",
                 "--series", "gpu_load_pct", "-o", str(out)]) == 0
    table = list(csv.DictReader(io.StringIO(out.read_text())))
    assert 110 <= len(table) <= 121 and table[0]["series"] == "gpu_load_pct"
    assert main(["telemetry", "export", "--json", "--db", str(history), "--since", "10s"]) == 0
    assert {r["series"] for r in json.loads(capsys.readouterr().out)} >= {"power_mw:VDD_IN", "model:digits"}


def test_plot_writes_a_png(history, tmp_path, capsys):
    out = tmp_path / "h.png"
    assert main(["telemetry", "plot", "--db", str(history), "--since", "2h", "-o", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "wrote" in capsys.readouterr().out


def test_a_missing_database_is_a_clear_error(tmp_path, capsys):
    assert main(["telemetry", "summary", "--db", str(tmp_path / "none.db")]) == 1
    assert "no telemetry database at" in capsys.readouterr().err


def test_recorded_fixtures_are_where_the_tests_expect_them():
    assert len(list(TEGRASTATS.glob("*.log"))) >= 8


def test_summary_with_a_database_imports_neither_the_config_nor_the_writer(history):
    code = ("import sys; from edged.cli.main import main; "
            f"main(['telemetry', 'summary', '--db', {str(history)!r}]); "
            "print(sorted(m for m in sys.modules if m.startswith(('edged.config', 'edged.telemetry._service', "
            "'edged.telemetry._store', 'edged.telemetry._source', 'edged.telemetry.tegrastats', 'sqlite_utils'))))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert proc.stdout.splitlines()[-1] == "[]"


def test_parse_reads_bytes_that_are_not_utf8_and_a_superscript_digit_without_a_traceback():
    good = recorded_lines("agx_orin_jp5.log")[1]
    lines = [good.encode() + b" \xff\xfe", b"RAM 3000/7620MB CPU [1\xc2\xb2%@729] tj@50C", b"\xff not tegrastats"]
    proc = subprocess.run([sys.executable, "-m", "edged.cli.main", "telemetry", "parse"],
                          input=b"\n".join(lines) + b"\n", capture_output=True, timeout=60, check=False,
                          env={**os.environ, "PYTHONIOENCODING": "utf-8:strict"})  # as in a UTF-8 locale
    stderr = proc.stderr.decode()
    assert "Traceback" not in stderr and proc.returncode == 1
    assert stderr.strip().startswith("line 3: not a tegrastats line")
    records = [json.loads(line) for line in proc.stdout.decode().splitlines()]
    assert records[0]["unparsed"] == ["\ufffd\ufffd"] and records[1]["cpu"] == [{"load_pct": None, "freq_mhz": 729}]


def test_a_database_path_with_a_hash_or_question_mark_is_read_whole(history, tmp_path, capsys):
    """The path went into a file: URI as it was: '#' started a fragment, and another file was opened."""
    odd = tmp_path / "state #1?x=%41" / "telemetry.db"
    odd.parent.mkdir()
    shutil.copy(history, odd)
    assert main(["telemetry", "summary", "--db", str(odd), "--since", "24h", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["samples"] > 0


def test_a_database_on_read_only_media_is_read(history, tmp_path, capsys):
    """A WAL database needs its -shm file, which a read-only filesystem cannot hold: "unable to open database
    file" (a copy on an SD card mounted read-only, a snapshot)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mount = tmp_path / "ro"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mount)], capture_output=True,
                          text=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {done.stderr.strip()}")
    try:
        shutil.copy(history, mount / "telemetry.db")
        subprocess.run(["mount", "-o", "remount,ro", str(mount)], check=True)
        assert main(["telemetry", "summary", "--db", str(mount / "telemetry.db"), "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["samples"] > 0
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_huge_since_is_a_clear_error(history, capsys):
    """A window reaching past what a date can be raised OverflowError when its start was printed."""
    assert main(["telemetry", "summary", "--db", str(history), "--since", "99999999999999999999999w"]) == 1
    err = capsys.readouterr().err
    assert "at most 100 years" in err and "Traceback" not in err


@pytest.mark.parametrize("command", [["export", "--csv"], ["export", "--json"], ["plot"]])
@pytest.mark.parametrize("target", ["missing-dir/out.png", "a-directory.png"])
def test_an_output_file_that_cannot_be_written_is_a_one_line_error(history, tmp_path, capsys, command, target):
    """-o into a folder that does not exist (or onto a folder) ended in a FileNotFoundError traceback."""
    (tmp_path / "a-directory.png").mkdir()
    output = str(tmp_path / target)
    assert main(["telemetry", *command, "--db", str(history), "--since", "1h", "-o", output]) == 1
    err = capsys.readouterr().err
    assert err.startswith("edged telemetry: error: ") and "Traceback" not in err
    assert output in err and "-o" in err


def test_summary_header_spans_the_data_not_the_whole_window(history, capsys):
    """Two hours of history under the default --since 24h read '7201 samples from <a day ago> to <now>'."""
    from datetime import datetime

    assert main(["telemetry", "summary", "--db", str(history)]) == 0
    header = capsys.readouterr().out.splitlines()[0]
    count, first, last = header.split()[0], header.split()[3], header.split()[5]
    span = datetime.fromisoformat(last) - datetime.fromisoformat(first)
    # the replay runs at top speed until the fixture stops it: a loaded machine adds samples past 7200, each a
    # second of data, so the span follows the count (not the 24 h window)
    assert int(count) >= 7200 and abs(span.total_seconds() - (int(count) - 1)) <= 60, header
    assert main(["telemetry", "summary", "--db", str(history), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["to_elapsed"] - summary["first_elapsed"] == pytest.approx(span.total_seconds(), abs=1)
    assert summary["to_elapsed"] - summary["from_elapsed"] == 24 * 3600  # the window asked for


@pytest.mark.parametrize("command", [["summary"], ["query"], ["export", "--csv"]])
def test_a_database_that_is_not_edgeds_telemetry_is_named_as_such(tmp_path, capsys, command):
    """Another SQLite file (or an empty one) gave 'cannot read the telemetry database: no such table: samples',
    naming neither the file nor what to point --db at."""
    import sqlite3

    other = tmp_path / "other.db"
    sqlite3.connect(other).execute("CREATE TABLE foo (x)").connection.commit()
    assert main(["telemetry", *command, "--db", str(other)]) == 1
    err = capsys.readouterr().err
    assert f"{other} is not an edged telemetry database" in err and "telemetry.db" in err


def test_parse_on_a_terminal_says_it_reads_stdin():
    """Run by hand, edged telemetry parse waited on the terminal without a word, like a hang."""
    import pty

    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "edged.cli.main", "telemetry", "parse"], stdin=slave,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    os.close(slave)
    try:
        os.write(master, b"\x04")  # end of input, as Ctrl-D on the terminal
        _, err = proc.communicate(timeout=60)
    finally:
        os.close(master)
    assert proc.returncode == 0
    assert b"stdin" in err and b"tegrastats |" in err


def test_plot_writes_the_file_named_in_the_format_its_extension_names(history, tmp_path, capsys):
    for name, magic in (("power", b"\x89PNG"), ("power.svg", b"<?xml"), ("power.pdf", b"%PDF")):
        assert main(["telemetry", "plot", "--db", str(history), "--since", "10m", "-o", str(tmp_path / name)]) == 0
        assert (tmp_path / name).read_bytes().startswith(magic), name
    assert not (tmp_path / "power.png").exists()


def test_summary_first_sample_is_found_in_the_rollups_once_raw_rows_are_gone(tmp_path):
    """Past raw retention only rollups hold the start of the data: the header's start is the oldest minute
    bucket's, not an hour bucket's (up to an hour too early) nor the window's."""
    from edged.telemetry._query import TelemetryReader

    lines = tmp_path / "lines.log"
    lines.write_text("\n".join(recorded_lines("orin_nano_jp6.log")) + "\n")
    source = ReplaySource(str(lines), speed=1e9, interval_s=1.0, loop=True)
    service = TelemetryService(TelemetryConfig(flush_interval_s=0.2, raw_retention_s=600), str(tmp_path / "t.db"),
                               source=source)
    service.start()
    assert service.wait_samples(2 * 3600 + 1800, timeout=120)
    service.stop()
    summary = TelemetryReader(str(tmp_path / "t.db")).summary(24 * 3600)
    samples = summary["series"]["ram_used_mb"]["n"]
    assert samples >= 2 * 3600 + 1800 and summary["samples"] < samples  # most are rolled up only
    assert samples - 1 <= summary["to_elapsed"] - summary["first_elapsed"] <= samples + 60
