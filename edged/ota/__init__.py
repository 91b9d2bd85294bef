"""Model updates over the air from a TUF repository: verified, resumable, health-gated, rolled back on failure.

Device side: `OtaAgent` (the daemon runs one when ``[ota] enabled``). Operator side: `edged.ota.fleet`.
Daemon releases: `edged.ota._release` verifies and hands them off; `edged.ota.release_apply` (``edged-update``,
root) installs them, checks them and rolls them back.
"""

from edged.ota._metrics import ota_metrics
from edged.ota.agent import OtaAgent

__all__ = ["OtaAgent", "ota_metrics"]
