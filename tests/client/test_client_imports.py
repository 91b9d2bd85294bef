"""The client is light: importing it pulls in neither the engine, the server nor any runtime."""

from __future__ import annotations

import json
import subprocess
import sys


def test_importing_the_client_loads_only_protocol_and_errors() -> None:
    code = ("import json, sys, edged.client; "
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith(('edged', 'onnxruntime', 'torch')))))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    loaded = json.loads(done.stdout)
    parts = {name.split(".")[1] for name in loaded if name.startswith("edged.")}
    assert parts <= {"client", "protocol", "errors"}, loaded
    assert not [name for name in loaded if name.startswith(("onnxruntime", "torch"))]
