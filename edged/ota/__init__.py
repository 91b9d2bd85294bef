"""Model updates over the air from a TUF repository: verified, resumable, health-gated, rolled back on failure.

Device side: `OtaAgent` (the daemon runs one when ``[ota] enabled``). Operator side: `edged.ota.fleet`.
Daemon (release) updates are not handled yet: a target of kind "release" is skipped with that reason.
"""

from edged.ota._metrics import ota_metrics
from edged.ota.agent import OtaAgent

__all__ = ["OtaAgent", "ota_metrics"]
