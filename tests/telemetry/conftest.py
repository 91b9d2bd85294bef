from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from tmpfs_mount import mounted_tmpfs


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
    with mounted_tmpfs(tmp_path / "mnt", "1m", mode="0700") as mount:
        yield mount
