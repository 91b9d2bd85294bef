"""The composition root: reads the config, builds every part in order, owns the event loop, threads,
signals, sd_notify and the watchdog. Nothing else wires parts together.

`edged.daemon.app.run_daemon` is the entry point; it is not imported here, so that the small systemd helpers
in this package can be imported without the serving stack.
"""
