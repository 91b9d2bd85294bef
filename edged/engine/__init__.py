"""The inference engine: model versions, their lifecycle, dynamic batching and statistics.

Usable in-process as a library::

    service = InferenceService(Path("models"), ModelsConfig())
    service.start()
    response = service.infer(InferRequest("digits_onnx", {"input": pixels}))
"""

from edged.engine.lifecycle import ModelState
from edged.engine.scheduler import Done
from edged.engine.service import InferenceService
from edged.engine.types import Cancellation, InferRequest, InferResponse, RequestedOutput
from edged.engine.version import ModelVersion

__all__ = ["Cancellation", "Done", "InferRequest", "InferResponse", "InferenceService", "ModelState", "ModelVersion",
           "RequestedOutput"]
