"""Journald priority prefixes under systemd, timestamps elsewhere; decided from JOURNAL_STREAM."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = """
import logging, sys
from edged.daemon._logging import configure_logging
configure_logging(sys.argv[1], sys.argv[2])
log = logging.getLogger("edged.test")
log.debug("debug line")
log.info("loaded %s", "resnet")
log.warning("slow")
try:
    raise ValueError("boom")
except ValueError:
    log.exception("failed")
"""


def _run(tmp_path: Path, level: str, fmt: str, journal_stream: str | None) -> list[str]:
    out = tmp_path / "stderr.txt"
    env = {k: v for k, v in os.environ.items() if k != "JOURNAL_STREAM"}
    with out.open("wb") as stderr:
        if journal_stream == "match":
            st = os.fstat(stderr.fileno())
            env["JOURNAL_STREAM"] = f"{st.st_dev}:{st.st_ino}"
        elif journal_stream is not None:
            env["JOURNAL_STREAM"] = journal_stream
        subprocess.run([sys.executable, "-c", SCRIPT, level, fmt], stderr=stderr, env=env, check=True,
                       timeout=60)
    return out.read_text().splitlines()


def test_auto_under_systemd_writes_priority_prefixes_without_timestamps(tmp_path: Path) -> None:
    lines = _run(tmp_path, "info", "auto", "match")
    assert lines[0] == "<6>edged.test: loaded resnet"
    assert lines[1] == "<4>edged.test: slow"
    assert lines[2] == "<3>edged.test: failed"
    # every traceback line keeps the error priority, so the journal does not file it as info
    assert len(lines) > 4
    assert all(line.startswith("<3>") for line in lines[2:])
    assert lines[-1] == "<3>ValueError: boom"


def test_auto_with_a_foreign_journal_stream_falls_back_to_plain(tmp_path: Path) -> None:
    # stderr was redirected by a wrapper: JOURNAL_STREAM names another file
    lines = _run(tmp_path, "info", "auto", "1:2")
    assert re.match(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} INFO    edged.test: loaded resnet$", lines[0])
    assert not any(line.startswith("<") for line in lines)


def test_plain_without_systemd_has_timestamps_and_honours_level(tmp_path: Path) -> None:
    lines = _run(tmp_path, "debug", "auto", None)
    assert re.match(r"^\d{4}-\d\d-\d\d .* DEBUG   edged.test: debug line$", lines[0])
    assert "WARNING edged.test: slow" in lines[2]


@pytest.mark.parametrize("journal_stream", [None, "match"])
def test_explicit_format_wins_over_detection(tmp_path: Path, journal_stream: str | None) -> None:
    assert _run(tmp_path, "warning", "journald", journal_stream)[0] == "<4>edged.test: slow"
    plain = _run(tmp_path, "warning", "plain", journal_stream)
    assert re.match(r"^\d{4}-.* WARNING edged.test: slow$", plain[0])
