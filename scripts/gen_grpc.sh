#!/usr/bin/env bash
# Regenerate edged/grpcapi/proto/*_pb2.py and *_pb2.pyi from Triton's .proto files (taken unchanged from
# triton-inference-server/common, directory protobuf/). grpcio-tools is needed here only, never at run time.
# The file names inside the descriptors stay "grpc_service.proto" / "model_config.proto", as in Triton's own
# generated modules, so that a process holding both (tests with tritonclient) registers them once.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-.venv/bin/python}"
PROTO=edged/grpcapi/proto
"$PYTHON" -m grpc_tools.protoc -I "$PROTO" --python_out="$PROTO" --pyi_out="$PROTO" \
    "$PROTO/model_config.proto" "$PROTO/grpc_service.proto"
# protoc writes "import model_config_pb2" (absolute): make it package-relative.
sed -i 's/^import model_config_pb2 as model__config__pb2$/from . import model_config_pb2 as model__config__pb2/' \
    "$PROTO/grpc_service_pb2.py"
sed -i 's/^import model_config_pb2 as _model_config_pb2$/from . import model_config_pb2 as _model_config_pb2/' \
    "$PROTO/grpc_service_pb2.pyi"
