"""edged: an inference daemon for edge devices.

Serves models from a Triton-style model repository over KServe v2 (HTTP over a Unix socket) and MQTT,
records power and thermal telemetry, and manages memory on devices whose CPU and GPU share one pool.
"""

__version__ = "0.1.0"
