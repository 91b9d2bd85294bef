"""README.md's fenced code blocks, and what the docs tests do with each one.

A block is named by a marker, a piece of text found in that block and in no other, rather than by its line
number, so paragraphs added around it do not move it to another entry. Every block of the README must be
matched by exactly one marker of ``RUN`` (executed against a real daemon by test_readme_run.py), ``CHECKED``
(parsed by edged's own parsers, or compared with the repository, by test_readme_blocks.py) or ``SKIPPED`` (with
the reason it cannot run here): a new block fails the tests until someone decides which it is, so none is
skipped silently.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
FENCE = re.compile(r"^```(\w*)\s*$")


@dataclass(frozen=True)
class Block:
    language: str
    first_line: str
    text: str
    line: int  # 1-based line of the block's first content line, for messages only


def readme_blocks(path: Path = README) -> list[Block]:
    lines = path.read_text().splitlines()
    blocks: list[Block] = []
    start: int | None = None
    language = ""
    for number, line in enumerate(lines, 1):
        match = FENCE.match(line)
        if match is None:
            continue
        if start is None:
            start, language = number, match.group(1)
            continue
        body = lines[start:number - 1]
        first = next((text.strip() for text in body if text.strip()), "")
        blocks.append(Block(language, first, "\n".join(body) + "\n", start + 1))
        start = None
    if start is not None:
        raise AssertionError(f"{path.name}:{start}: a code fence is never closed")
    return blocks


def block(marker: str) -> Block:
    """The one block that contains ``marker``."""
    found = [candidate for candidate in readme_blocks() if marker in candidate.text]
    if len(found) != 1:
        lines = [candidate.line for candidate in found]
        raise AssertionError(f"README.md has {len(found)} code blocks containing {marker!r} (at lines {lines}), "
                             "expected exactly one")
    return found[0]


# Executed against a real daemon (and a real mosquitto) started from this checkout: test_readme_run.py.
RUN: dict[str, str] = {
    "# its first line names the socket": "the Quick start's queries, verbatim, against a daemon on the default "
                                         "socket path",
    "/v2/models/tiny_mlp/infer": "the socket API's curl, verbatim",
    "tritonclient.http as httpclient": "tritonclient over HTTP; port 8000 replaced by the daemon's free port",
    "SharedMemoryRegion.create": "the camera frame through shared memory, verbatim",
    "grpcclient.InferenceServerClient": "tritonclient over gRPC; port 8001 replaced by the daemon's free port",
    "with EdgedClient() as client:": "the Python client, verbatim",
    "InferenceService(Path(\"models\")": "the engine in-process, verbatim, from the repository root",
    "import httpx, openai": "the OpenAI client, streaming over the socket; port 8000 replaced",
    "[server.tcp_restricted]": "the daemon with this block: tritonclient loads a model and registers shared "
                               "memory over TCP with the key, and is refused without it",
    "# demo.toml": "the MQTT sensor pipeline's config, with the broker's free port",
    "mosquitto_rr -V 5": "mosquitto_sub, mosquitto_pub and mosquitto_rr verbatim against a real mosquitto on a "
                         "free port (the clients' config files name it); the test starts the broker and the daemon",
}

# Parsed by edged's own parsers or compared with the repository: test_readme_blocks.py.
CHECKED: dict[str, str] = {
    "state_dir = ": "edged's config loader; defaults named in comments equal the built-in ones",
    "[ota]": "edged's config loader; defaults named in comments equal the built-in ones",
    "edged serve [--config FILE]": "the same flags as `edged serve --help`",
    "edged fleet init REPO": "each command parsed by edged's own argument parser (REPO, the model 'detector', a "
                             "broker and a release tarball are the reader's own)",
    "one package per part": "every folder and edged package named exists",
}

# Neither run nor parsed here, and why.
SKIPPED: dict[str, str] = {
    "./dev serve     #": "installs Debian and Python packages from the network: tests/packaging/"
                         "test_packaging_dev_script.py checks what it installs, and the Quick start's queries run "
                         "against the daemon it starts",
    "detector/1/model.plan": "an illustration of the layout: `detector` (TensorRT) is not a bundled model",
    "ssh jetson": "needs a Jetson over ssh and aarch64 wheels from the network; tests/packaging builds and "
                  "installs a host tarball",
}
