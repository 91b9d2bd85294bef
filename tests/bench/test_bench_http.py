"""``edged bench --transport http --http-port N``: a daemon on loopback TCP, measured over TCP alone."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from server_harness import ThreadedServer

from edged.cli.main import main


@pytest.mark.timeout(180)
def test_http_bench_needs_only_the_port(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With --http-port given, the CLI still looked for a Unix socket first and stopped with 'no edged daemon
    answered on /tmp/edged-0/edged.sock, ...' although http scenarios never use it (a daemon whose socket is
    elsewhere, or another KServe server on that port, could not be measured)."""
    for name in ("EDGED_SOCKET", "RUNTIME_DIRECTORY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))  # no socket to be found there
    server = ThreadedServer(models=("tiny_mlp",), tcp=True).start()
    try:
        code = main(["bench", "--transport", "http", "--http-port", str(server.port), "--duration", "0.3",
                     "--json", str(tmp_path / "results.json")])
    finally:
        server.stop()
    assert code == 0
    rows = json.loads((tmp_path / "results.json").read_text())
    assert [row["transport"] for row in rows] == ["http"] and rows[0]["requests"] > 0 and rows[0]["errors"] == 0
