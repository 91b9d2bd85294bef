"""The composition root: reads the config, builds every part in order, owns the event loop, threads,
signals, sd_notify and the watchdog. Nothing else wires parts together."""

from edged.daemon.app import Daemon, run_daemon

__all__ = ["Daemon", "run_daemon"]
