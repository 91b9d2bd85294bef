"""What each client call sends and how its answer is read; shared by the sync and asyncio clients.

A ``Call`` is an HTTP request as plain data; the transports send it and hand back a ``Reply``. Reading a reply
turns error statuses into the typed errors of ``_errors`` and bodies into JSON, text or an ``InferResult``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import numpy as np
import orjson

from edged.client._errors import ProtocolError, error_for
from edged.client._result import Array, InferResult
from edged.client.shm import ShmOutput, ShmTensor
from edged.errors import EdgedError
from edged.protocol import decode_response, encode_request

HEADER_LENGTH = "Inference-Header-Content-Length"
FAMILY_HEADER = "x-edged-error"  # the server's error family, when it names it
JSON_TYPE = "application/json"
OCTET_TYPE = "application/octet-stream"


@dataclass(frozen=True)
class Call:
    method: str
    path: str
    what: str  # names the call in error messages
    body: bytes = b""
    headers: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Reply:
    status: int
    headers: Mapping[str, str]  # names in lower case
    body: bytes


def model_path(model: str, version: str = "", suffix: str = "") -> str:
    if not model:
        raise ValueError("a model name is required")
    path = f"/v2/models/{quote(model, safe='')}"
    if version:
        path += f"/versions/{quote(str(version), safe='')}"
    return path + suffix


def _describe(model: str, version: str) -> str:
    return f"model {model!r}" + (f" version {version}" if version else "")


def get(path: str, what: str) -> Call:
    return Call("GET", path, what)


def post_json(path: str, what: str, doc: Mapping[str, Any]) -> Call:
    return Call("POST", path, what, orjson.dumps(doc), (("Content-Type", JSON_TYPE),))


def infer_call(model: str, inputs: Mapping[str, Array | ShmTensor], outputs: Sequence[str] | None, version: str,
               binary: bool, request_id: str, parameters: Mapping[str, Any] | None,
               shm_outputs: Mapping[str, ShmOutput] | None = None) -> Call:
    if not inputs:
        raise ValueError(f"infer on model {model!r}: at least one input is required")
    arrays = {name: np.asarray(value) for name, value in inputs.items() if not isinstance(value, ShmTensor)}
    placed = [{"name": name, "datatype": value.datatype, "shape": list(value.shape),
               "parameters": value.parameters()} for name, value in inputs.items() if isinstance(value, ShmTensor)]
    placed_outputs = {name: out.parameters() for name, out in (shm_outputs or {}).items()}
    body, header_length = encode_request(arrays, tuple(outputs or ()), binary, request_id, parameters, placed,
                                         placed_outputs)
    if header_length is None:
        headers: tuple[tuple[str, str], ...] = (("Content-Type", JSON_TYPE),)
    else:
        headers = (("Content-Type", OCTET_TYPE), (HEADER_LENGTH, str(header_length)))
    return Call("POST", model_path(model, version, "/infer"), f"infer on {_describe(model, version)}", body,
                headers)


def load_call(model: str, config: Mapping[str, Any] | None) -> Call:
    doc: dict[str, Any] = {}
    if config is not None:
        # Triton's load API takes the override config as a JSON string
        doc["parameters"] = {"config": orjson.dumps(config).decode()}
    return post_json(f"/v2/repository/models/{quote(model, safe='')}/load", f"load model {model!r}", doc)


def unload_call(model: str) -> Call:
    return post_json(f"/v2/repository/models/{quote(model, safe='')}/unload", f"unload model {model!r}", {})


def shm_register_call(name: str, key: str, byte_size: int, offset: int) -> Call:
    return post_json(f"/v2/systemsharedmemory/region/{quote(name, safe='')}/register",
                     f"register shared memory region {name!r}", {"key": key, "offset": offset,
                                                                 "byte_size": byte_size})


def shm_unregister_call(name: str) -> Call:
    if not name:
        return post_json("/v2/systemsharedmemory/unregister", "unregister all shared memory regions", {})
    return post_json(f"/v2/systemsharedmemory/region/{quote(name, safe='')}/unregister",
                     f"unregister shared memory region {name!r}", {})


def shm_status_call(name: str) -> Call:
    if not name:
        return get("/v2/systemsharedmemory/status", "shared memory status")
    return get(f"/v2/systemsharedmemory/region/{quote(name, safe='')}/status",
               f"status of shared memory region {name!r}")


def stats_call(model: str, version: str) -> Call:
    if not model:
        return get("/v2/models/stats", "statistics")
    return get(model_path(model, version, "/stats"), f"statistics of {_describe(model, version)}")


# --- reading replies ---------------------------------------------------------------------------------------
def checked(call: Call, reply: Reply) -> Reply:
    if reply.status >= 400:
        raise error_for(reply.status, reply.body, call.what, reply.headers.get(FAMILY_HEADER))
    return reply


def read_json(call: Call, reply: Reply) -> Any:
    body = checked(call, reply).body
    try:
        return orjson.loads(body) if body else {}
    except orjson.JSONDecodeError as e:
        raise ProtocolError(f"{call.what}: the daemon's answer is not JSON ({e}): {body[:200]!r}") from e


def read_dict(call: Call, reply: Reply) -> dict[str, Any]:
    doc = read_json(call, reply)
    if not isinstance(doc, dict):
        raise ProtocolError(f"{call.what}: expected a JSON object, found {type(doc).__name__}")
    return doc


def read_list(call: Call, reply: Reply) -> list[Any]:
    doc = read_json(call, reply)
    if not isinstance(doc, list):
        raise ProtocolError(f"{call.what}: expected a JSON list, found {type(doc).__name__}")
    return doc


def read_text(call: Call, reply: Reply) -> str:
    return checked(call, reply).body.decode("utf-8", "replace")


def read_health(reply: Reply) -> bool:
    return reply.status == 200


def read_model_ready(call: Call, reply: Reply) -> bool:
    if reply.status == 404:
        raise error_for(404, reply.body, call.what, reply.headers.get(FAMILY_HEADER))
    return reply.status == 200


def read_infer(call: Call, reply: Reply) -> InferResult:
    checked(call, reply)
    raw_length = reply.headers.get(HEADER_LENGTH.lower())
    try:
        header_length = int(raw_length) if raw_length is not None else None
        doc, outputs = decode_response(reply.body, header_length)
    except (ValueError, EdgedError) as e:
        raise ProtocolError(f"{call.what}: the daemon's answer could not be decoded: {e}") from e
    return InferResult(outputs, doc)

