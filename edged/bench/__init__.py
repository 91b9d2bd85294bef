"""``edged bench``: load generation over each transport, beside the raw runtime in the same run."""

from edged.bench._openai import GenResult
from edged.bench._runner import report, run_all, spawned_daemon
from edged.bench._scenario import Scenario, load_scenarios
from edged.bench._stats import Result, table

__all__ = ["GenResult", "Result", "Scenario", "load_scenarios", "report", "run_all", "spawned_daemon", "table"]
