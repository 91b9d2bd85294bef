"""The KServe v2 inference protocol's tensor codec: JSON tensors and Triton's binary-data extension.

Pure functions over bytes, shared by the Unix-socket server, the MQTT front end and the client.
"""

from edged.protocol._nonfinite import loads as loads_json
from edged.protocol.codec import (
    DecodedRequest,
    OutputRequest,
    ResponseLike,
    decode_request,
    decode_response,
    encode_request,
    encode_response,
    error_body,
)
from edged.protocol.datatypes import KSERVE_TO_NUMPY, kserve_datatype

__all__ = [
    "KSERVE_TO_NUMPY", "DecodedRequest", "OutputRequest", "ResponseLike", "decode_request", "decode_response",
    "encode_request", "encode_response", "error_body", "kserve_datatype", "loads_json",
]
