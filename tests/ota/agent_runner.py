"""A device's update run in its own process, so a test can kill -9 it mid-update.

Usage: python -m tests.ota.agent_runner SETTINGS_JSON; runs one check, prints the state, then sleeps (a daemon
watching its update) until killed.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from edged.config import ModelsConfig, OtaConfig
from edged.engine import InferenceService
from edged.ota import OtaAgent


def main() -> None:
    settings = json.loads(sys.argv[1])
    repository, state_dir = Path(settings.pop("repository")), Path(settings.pop("state_dir"))
    machine_id = Path(settings.pop("machine_id"))
    service = InferenceService(repository, ModelsConfig())
    service.start()
    agent = OtaAgent(OtaConfig(enabled=True, **settings), service, repository, state_dir, machine_id=machine_id)
    print(json.dumps(agent.check()), flush=True)
    while True:
        time.sleep(60)


if __name__ == "__main__":
    main()
