"""The OpenAPI 3 document of the socket API (``GET /v2/edged/openapi.json``), used for fuzzing and clients."""

from __future__ import annotations

from typing import Any

import orjson

from edged import __version__

_ERROR = {"type": "object", "properties": {"error": {"type": "string"}}, "required": ["error"]}
_TENSOR = {
    "type": "object", "required": ["name", "shape", "datatype"],
    "properties": {
        "name": {"type": "string"}, "datatype": {"type": "string"},
        "shape": {"type": "array", "items": {"type": "integer", "minimum": 0}},
        "parameters": {"type": "object"}, "data": {"type": "array"},
    },
}
_INFER_REQUEST = {
    "type": "object", "required": ["inputs"],
    "properties": {
        "id": {"type": "string"}, "parameters": {"type": "object"},
        "inputs": {"type": "array", "items": {"$ref": "#/components/schemas/Tensor"}},
        "outputs": {"type": "array", "items": {"type": "object", "required": ["name"],
                                               "properties": {"name": {"type": "string"},
                                                              "parameters": {"type": "object"}}}},
    },
}
_GENERATE_REQUEST = {  # Triton's generate extension
    "type": "object", "required": ["text_input"],
    "properties": {
        "text_input": {"type": "string"},
        "parameters": {"type": "object", "properties": {
            "max_tokens": {"type": "integer", "minimum": 1}, "temperature": {"type": "number"},
            "top_p": {"type": "number"}, "top_k": {"type": "integer"}, "seed": {"type": "integer"},
            "stop": {"type": "string"}, "stream": {"type": "boolean"}}},
        "return_finish_reason": {"type": "boolean"}, "return_num_input_tokens": {"type": "boolean"},
        "return_num_output_tokens": {"type": "boolean"}, "exclude_input_in_output": {"type": "boolean"},
    },
}
_MODEL = {"name": "model_name", "in": "path", "required": True, "schema": {"type": "string"}}
_VERSION = {"name": "model_version", "in": "path", "required": True, "schema": {"type": "string"}}


def _responses(ok: str, schema: dict[str, Any] | None = None, media: str = "application/json") -> dict[str, Any]:
    success: dict[str, Any] = {"description": ok}
    if schema is not None:
        success["content"] = {media: {"schema": schema}}
    error = {"description": "error",
             "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
    return {"200": success, "400": error, "403": error, "404": error, "503": error}


def _get(summary: str, schema: dict[str, Any] | None = None, media: str = "application/json",
         params: tuple[dict[str, Any], ...] = ()) -> dict[str, Any]:
    return {"get": {"summary": summary, "parameters": list(params), "responses": _responses(summary, schema, media)}}


def _post(summary: str, body: dict[str, Any], schema: dict[str, Any] | None,
          params: tuple[dict[str, Any], ...] = ()) -> dict[str, Any]:
    return {"post": {"summary": summary, "parameters": list(params),
                     "requestBody": {"required": False, "content": {"application/json": {"schema": body}}},
                     "responses": _responses(summary, schema)}}


def _model_paths(prefix: str, params: tuple[dict[str, Any], ...]) -> dict[str, Any]:
    obj = {"type": "object"}
    return {
        prefix: _get("model metadata", obj, params=params),
        f"{prefix}/ready": _get("model readiness", params=params),
        f"{prefix}/config": _get("model configuration (Triton JSON)", obj, params=params),
        f"{prefix}/stats": _get("model statistics", obj, params=params),
        f"{prefix}/infer": _post("inference", {"$ref": "#/components/schemas/InferRequest"}, obj, params),
        f"{prefix}/generate": _post("text generation (generative models)",
                                    {"$ref": "#/components/schemas/GenerateRequest"}, obj, params),
        f"{prefix}/generate_stream": _post("text generation as Server-Sent Events",
                                           {"$ref": "#/components/schemas/GenerateRequest"}, None, params),
    }


def openapi_document() -> bytes:
    obj = {"type": "object"}
    paths: dict[str, Any] = {
        "/v2": _get("server metadata", obj),
        "/v2/health/live": _get("server liveness"),
        "/v2/health/ready": _get("server readiness"),
        "/v2/models/stats": _get("statistics of every model", obj),
        **_model_paths("/v2/models/{model_name}", (_MODEL,)),
        **_model_paths("/v2/models/{model_name}/versions/{model_version}", (_MODEL, _VERSION)),
        "/v2/repository/index": _post("repository index", {"type": "object", "properties": {
            "ready": {"type": "boolean"}}}, {"type": "array", "items": obj}),
        "/v2/repository/models/{model_name}/load": _post("load a model", {"type": "object", "properties": {
            "parameters": {"type": "object", "properties": {"config": {"type": "string"}}}}}, None, (_MODEL,)),
        "/v2/repository/models/{model_name}/unload": _post("unload a model", obj, None, (_MODEL,)),
        "/metrics": _get("Prometheus metrics", {"type": "string"}, "text/plain"),
        "/v2/edged/status": _get("daemon status", obj),
        "/v2/edged/telemetry": _get("telemetry snapshot", obj),
        "/v2/edged/openapi.json": _get("this document", obj),
        # answered only when [ota] enabled (404 otherwise); check and rollback need the admin permission
        "/v2/edged/ota/status": _get("model update state (OTA)", obj),
        "/v2/edged/ota/history": _get("finished model updates and targets remembered as bad", obj),
        "/v2/edged/ota/check": _post("check the update repository now and install what is due", obj, obj),
        "/v2/edged/ota/rollback": _post("roll back the last model update", obj, obj),
        "/v2/edged/ota/selftest": _post("every served model answers its test vectors or warm-up", obj, obj),
    }
    doc = {
        "openapi": "3.0.3",
        "info": {"title": "edged KServe v2 API", "version": __version__},
        "paths": paths,
        "components": {"schemas": {"Error": _ERROR, "Tensor": _TENSOR, "InferRequest": _INFER_REQUEST,
                                  "GenerateRequest": _GENERATE_REQUEST}},
    }
    return orjson.dumps(doc)
