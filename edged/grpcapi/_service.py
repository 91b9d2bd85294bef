"""The RPCs other than inference: health, metadata, config, statistics, repository and shared memory.

Each takes the request message and returns the response message or raises an EdgedError (mapped to a status by
``_status``). The engine's JSON documents (the HTTP API's) are converted with protobuf's own ``json_format``,
so both front ends report the same fields. Loads and unloads block: the server runs them in the executor.
"""

from __future__ import annotations

from typing import Any

import orjson
from google.protobuf import json_format
from google.protobuf.message import Message

from edged.engine import InferenceService
from edged.errors import InvalidInput, ModelConfigError, SharedMemoryNotFound
from edged.grpcapi.proto import grpc_service_pb2 as pb
from edged.repository import check_override_size, model_config_from_json, model_config_to_json
from edged.repository.model_config import ModelConfig
from edged.shm import Caller, SharedMemoryRegistry

_CUDA_REFUSED = ("failed to register CUDA shared memory region: '{}', GPUs not supported (CUDA IPC does not exist "
                 "on Jetson's integrated GPU; use system shared memory)")


def _parse(doc: Any, message: Message) -> None:
    try:
        json_format.ParseDict(doc, message, ignore_unknown_fields=True)
    except json_format.ParseError as e:
        raise InvalidInput(f"cannot express {type(message).__name__} in Triton's message: {e}") from e


class Service:
    def __init__(self, service: InferenceService, shared_memory: SharedMemoryRegistry) -> None:
        self._service = service
        self._shm = shared_memory
        self.draining = False

    # --- health and metadata --------------------------------------------------------------------------------
    def server_live(self, request: pb.ServerLiveRequest) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=self._service.live)

    def server_ready(self, request: pb.ServerReadyRequest) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=self._service.ready and not self.draining)

    def health_check(self, request: pb.ModelReadyRequest) -> bytes:
        """grpc.health.v1.Health/Check: HealthCheckResponse{status} encoded by hand (field 1, a varint), SERVING (1)
        while the server is ready, else NOT_SERVING (2); the service named is not looked at, as in Triton."""
        return b"\x08\x01" if self._service.ready and not self.draining else b"\x08\x02"

    def model_ready(self, request: pb.ModelReadyRequest) -> pb.ModelReadyResponse:
        return pb.ModelReadyResponse(ready=self._service.model_ready(request.name, request.version))

    def server_metadata(self, request: pb.ServerMetadataRequest) -> pb.ServerMetadataResponse:
        response = pb.ServerMetadataResponse()
        _parse(self._service.server_metadata(), response)
        return response

    def model_metadata(self, request: pb.ModelMetadataRequest) -> pb.ModelMetadataResponse:
        response = pb.ModelMetadataResponse()
        _parse(self._service.model_metadata(request.name, request.version), response)
        return response

    def model_config(self, request: pb.ModelConfigRequest) -> pb.ModelConfigResponse:
        response = pb.ModelConfigResponse()
        _parse(model_config_to_json(self._service.model_config(request.name, request.version)), response.config)
        return response

    def model_statistics(self, request: pb.ModelStatisticsRequest) -> pb.ModelStatisticsResponse:
        response = pb.ModelStatisticsResponse()
        _parse(self._service.statistics(request.name, request.version), response)
        return response

    # --- repository -----------------------------------------------------------------------------------------
    def repository_index(self, request: pb.RepositoryIndexRequest) -> pb.RepositoryIndexResponse:
        _check_repository(request.repository_name)
        response = pb.RepositoryIndexResponse()
        _parse({"models": self._service.repository_index(ready_only=request.ready)}, response)
        return response

    def load(self, request: pb.RepositoryModelLoadRequest) -> pb.RepositoryModelLoadResponse:
        """Blocking: called in the executor."""
        _check_repository(request.repository_name)
        self._service.load_model(request.model_name, load_override(request))
        return pb.RepositoryModelLoadResponse()

    def unload(self, request: pb.RepositoryModelUnloadRequest) -> pb.RepositoryModelUnloadResponse:
        """Blocking: called in the executor."""
        _check_repository(request.repository_name)
        # tritonclient sends unload_dependents (false by default) with every unload; edged serves no ensembles,
        # so a model has no dependents and either value unloads just the model
        unsupported = sorted(key for key, value in request.parameters.items()
                             if key != "unload_dependents" or value.WhichOneof("parameter_choice") != "bool_param")
        if unsupported:
            raise InvalidInput(f"unload request for model {request.model_name}: unsupported parameters "
                               f"{unsupported}")
        self._service.unload_model(request.model_name)
        return pb.RepositoryModelUnloadResponse()

    # --- system shared memory (the HTTP API's registry) and CUDA shared memory (not offered) ----------------
    # Each takes the caller (edged.grpcapi._access): the Unix-socket peer, whose regions only it may use, or TCP's.
    def shm_status(self, request: pb.SystemSharedMemoryStatusRequest,
                   caller: Caller) -> pb.SystemSharedMemoryStatusResponse:
        response = pb.SystemSharedMemoryStatusResponse()
        for region in self._shm.status(request.name, caller):
            entry = response.regions[str(region["name"])]
            _parse(region, entry)
        return response

    def shm_register(self, request: pb.SystemSharedMemoryRegisterRequest,
                     caller: Caller) -> pb.SystemSharedMemoryRegisterResponse:
        self._shm.register(request.name, request.key, request.offset, request.byte_size, caller)
        return pb.SystemSharedMemoryRegisterResponse()

    def shm_unregister(self, request: pb.SystemSharedMemoryUnregisterRequest,
                       caller: Caller) -> pb.SystemSharedMemoryUnregisterResponse:
        if request.name:
            self._shm.unregister(request.name, caller)
        else:
            self._shm.unregister_all(caller)
        return pb.SystemSharedMemoryUnregisterResponse()

    def cuda_status(self, request: pb.CudaSharedMemoryStatusRequest) -> pb.CudaSharedMemoryStatusResponse:
        if request.name:
            raise SharedMemoryNotFound(f"Unable to find cuda shared memory region: '{request.name}'")
        return pb.CudaSharedMemoryStatusResponse()

    def cuda_register(self, request: pb.CudaSharedMemoryRegisterRequest) -> pb.CudaSharedMemoryRegisterResponse:
        raise InvalidInput(_CUDA_REFUSED.format(request.name))

    def cuda_unregister(self, request: pb.CudaSharedMemoryUnregisterRequest,
                        ) -> pb.CudaSharedMemoryUnregisterResponse:
        return pb.CudaSharedMemoryUnregisterResponse()  # nothing is ever registered


def _check_repository(name: str) -> None:
    if name:
        raise InvalidInput(f"repository_name {name!r}: edged serves one repository; leave repository_name empty")


def load_override(request: pb.RepositoryModelLoadRequest) -> ModelConfig | None:
    """The ``config`` parameter of a load request (Triton's JSON model config as a string), if any."""
    model = request.model_name
    unsupported = sorted(key for key in request.parameters if key != "config")
    if unsupported:
        raise InvalidInput(f"load request for model {model}: unsupported parameters {unsupported} (edged accepts "
                           "only \"config\"; model files come from the repository)")
    if "config" not in request.parameters:
        return None
    parameter = request.parameters["config"]
    if parameter.WhichOneof("parameter_choice") != "string_param":
        raise InvalidInput(f"load request for model {model}: parameters.config must be a string_param")
    check_override_size(parameter.string_param, model)
    try:
        config = model_config_from_json(orjson.loads(parameter.string_param), f"load request for {model}")
    except orjson.JSONDecodeError as e:
        raise InvalidInput(f"load request for model {model}: parameters.config is not valid JSON: {e}") from None
    except ModelConfigError as e:  # its reason: the error's path already says "load request for <model>"
        raise InvalidInput(f"load request for model {model}: {e.reason}") from None
    if config.name and config.name != model:
        raise InvalidInput(f"load request for model {model}: the config names model {config.name!r}")
    return config
