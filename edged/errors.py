"""The exception families of edged.

Every error edged raises on purpose is an `EdgedError`. Each part has its own family; front ends map the
families to HTTP status codes or MQTT error payloads through one table each. Foreign exceptions are translated
at the boundary with ``raise ... from e``. Messages name the object, what was expected and what was found.
"""

from __future__ import annotations


class EdgedError(Exception):
    """Root of every error edged raises on purpose."""


# --- configuration -----------------------------------------------------------------------------------------
class ConfigError(EdgedError):
    """The daemon's TOML configuration, or a command-line flag, is invalid."""


class ConfigKeyError(ConfigError):
    """A part found the value of one config key unusable (a file it names is missing, unreadable or not what it
    should hold; a source that cannot start). ``key`` is the dotted path (``mqtt.ca_file``), ``problem`` says what
    is wrong and what to do. It reads ``[mqtt] ca_file: problem``; `located` adds where the value came from: the
    config file (``FILE: [mqtt] ca_file: problem``) or the flag that set it (``--mqtt-broker: problem``)."""

    def __init__(self, key: str, problem: str, where: str | None = None) -> None:
        self.key = key
        self.problem = problem
        self.where = where
        section, _, name = key.rpartition(".")
        label = f"[{section}] {name}" if section else name
        if where is not None and where.startswith("--"):
            message = f"{where}: {problem}"
        elif where is not None:
            message = f"{where}: {label}: {problem}"
        else:
            message = f"{label}: {problem}"
        super().__init__(message)

    def located(self, where: str | None) -> ConfigKeyError:
        """The same error, saying where its value came from (a file path, or a flag such as ``--state-dir``)."""
        return ConfigKeyError(self.key, self.problem, where)


class ModelConfigError(ConfigError):
    """A model's config.pbtxt is invalid; the message names the file, line and column where known."""

    def __init__(self, message: str, path: str | None = None, line: int | None = None,
                 column: int | None = None) -> None:
        self.path = path
        self.line = line
        self.column = column
        where = ""
        if path is not None:
            where = path
            if line is not None:
                where += f":{line}"
                if column is not None:
                    where += f":{column}"
            where += ": "
        super().__init__(where + message)
        self.reason = message


class StateDirInUse(ConfigError):
    """Another process (an edged daemon) holds the state directory's lock: two daemons on one directory would
    corrupt each other's outbox, telemetry and OTA state. ``pid`` is the holder's, when it wrote it."""

    def __init__(self, state_dir: object, pid: int | None) -> None:
        self.state_dir = str(state_dir)
        self.pid = pid
        holder = f"PID {pid}" if pid is not None else "a process whose PID it has not written yet"
        super().__init__(f"state directory {self.state_dir} is in use by another edged daemon ({holder} holds its "
                         "edged.lock): stop that daemon first (systemctl stop edged), or give this one a "
                         "state_dir (--state-dir) of its own")


# --- models ------------------------------------------------------------------------------------------------
class ModelError(EdgedError):
    """Something is wrong with a model or a model version."""


class ModelNotFound(ModelError):
    """The model, or the requested version of it, is not in the repository."""


class ModelNotReady(ModelError):
    """The model exists but is not ready to serve (loading, unloading, failed, or unloaded)."""


class ModelLoadError(ModelError):
    """Loading a model version failed; the message says why and what to do."""


class BackendUnavailable(ModelLoadError):
    """The runtime a model needs (onnxruntime, torch, TensorRT, an execution provider) is not available."""


class UnknownBackend(BackendUnavailable):
    """No backend of that name is known; ``known`` lists the names that are (the registry words it as an error
    in the model's config)."""

    def __init__(self, message: str, name: str, known: tuple[str, ...]) -> None:
        super().__init__(message)
        self.name = name
        self.known = known


# --- requests ----------------------------------------------------------------------------------------------
class RequestError(EdgedError):
    """A request could not be served."""


class InvalidInput(RequestError):
    """A request is malformed or does not match the model's config."""


class InvalidParameter(InvalidInput):
    """A bad request parameter; ``param`` is its name, as OpenAI's error JSON reports it."""

    def __init__(self, message: str, param: str | None) -> None:
        super().__init__(message)
        self.param = param


class ContextLengthExceeded(InvalidParameter):
    """A prompt, or a prompt and max_tokens together, past what the model takes: OpenAI's 400 with code
    ``context_length_exceeded``, which its clients read to shorten the conversation."""


class PayloadTooLarge(InvalidInput):
    """A request, a tensor or a message is larger than a configured limit."""


class SharedMemoryLimit(PayloadTooLarge):
    """A region would pass ``[server] shm_max_regions`` or ``shm_max_bytes_mb``: HTTP 413, gRPC RESOURCE_EXHAUSTED
    (a server's resource, not a wrong argument)."""


class QueueFull(RequestError):
    """The model's queue is at its max_queue_size; the caller may retry later."""


class RequestTimeout(RequestError):
    """The request waited in the queue or ran longer than its timeout."""


class RequestCancelled(RequestError):
    """The caller went away (its call was cancelled or its deadline passed) while the request waited in the queue:
    it was never run (Triton: CANCELLED)."""


class InferenceFailed(RequestError):
    """The backend failed while running the request."""


class OutOfMemory(InferenceFailed):
    """The backend ran out of (device) memory running the request; later, or in a smaller batch, it may fit."""


class PermissionDenied(RequestError):
    """The caller is not allowed to do this (peer-credential access control)."""


class AnswersUnread(RequestError):
    """Answers already owed to this client wait unread past their bound (gRPC ``[server] grpc_max_unsent_mb``):
    this one is not kept; the client should read its answers, then retry (gRPC: RESOURCE_EXHAUSTED)."""


class Unavailable(RequestError):
    """The server is shutting down or not ready."""


# --- shared memory -----------------------------------------------------------------------------------------
class SharedMemoryError(RequestError):
    """A shared-memory region could not be registered, found or used (Triton: INTERNAL, 500)."""


class SharedMemoryInvalid(SharedMemoryError, InvalidInput):
    """A region's key, offset or size is wrong, or its object changed under it (Triton: INVALID_ARG, 400)."""


class SharedMemoryNotFound(SharedMemoryError):
    """No region of that name is registered (Triton: NOT_FOUND, 404)."""


class SharedMemoryExists(SharedMemoryError):
    """A region of that name is already registered (Triton: 400 over HTTP, ALREADY_EXISTS over gRPC)."""


# --- memory ------------------------------------------------------------------------------------------------
class MemoryBudgetExceeded(ModelLoadError):
    """Loading a model would exceed the memory budget and nothing can be evicted."""


class MemoryPressure(ModelLoadError):
    """The system is under memory pressure; new loads are refused."""


# --- telemetry, mqtt, ota, client --------------------------------------------------------------------------
class TelemetryError(EdgedError):
    """A telemetry source or store failed."""


class TelemetryParseError(TelemetryError):
    """A tegrastats line or a sysfs file could not be parsed."""


class MqttError(EdgedError):
    """The MQTT front end failed (connection, payload, outbox)."""


class PayloadError(MqttError, InvalidInput):
    """An MQTT payload could not be decoded."""


class OutboxError(MqttError):
    """The durable outbox could not store or read a message."""


class UpdateRejected(EdgedError):
    """An update bundle was refused (signature, hash, version, or health check)."""


class DownloadFailed(UpdateRejected):
    """An update could not be fetched or stored (network, slow retrieval, disk full): not the target's fault,
    so it is not remembered as bad and the next check tries again."""


class DiskFull(DownloadFailed):
    """The state directory has no room for an update; what it had written of it is removed."""


class BadDownload(DownloadFailed):
    """What arrived is not the signed target (its hash or length differ): a tampering mirror or proxy, or bytes
    damaged on the way. The target itself is not judged by it (its signed hash is what was checked against), so
    it is not remembered as bad: the bytes are dropped and the next check downloads it afresh."""


class ClientError(EdgedError):
    """The client could not reach the daemon or got an error back."""


class ServerUnreachable(ClientError):
    """Nothing answered on the socket the client tried; the message names it."""
