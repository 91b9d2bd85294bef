from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def fake_tegrastats(tmp_path: Path):
    """Build an executable that prints recorded lines like tegrastats, records its argv, then exits."""
    def build(lines: list[str], name: str = "tegrastats") -> Path:
        data = tmp_path / f"{name}.lines"
        data.write_text("\n".join(lines) + "\n", encoding="utf-8")
        script = tmp_path / name
        script.write_text(
            f"#!{sys.executable}\n"
            "import sys\n"
            f"open({str(tmp_path / (name + '.argv'))!r}, 'a').write(' '.join(sys.argv[1:]) + '\\n')\n"
            f"for line in open({str(data)!r}):\n"
            "    sys.stdout.write(line)\n"
            "    sys.stdout.flush()\n",
            encoding="utf-8")
        script.chmod(0o755)
        return script
    return build


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs mounted for the test (a full disk, read-only remounts); skipped where mounting is not allowed."""
    mount = tmp_path / "mnt"
    mount.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs", str(mount)],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)
