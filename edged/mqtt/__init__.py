"""The MQTT front end: request/response topics, sensor pipelines and a durable outbox over one paho connection.

Topics (prefix ``edged/{device_id}``): ``{prefix}/status`` (retained birth, will, stopped),
``{prefix}/infer/{model}[/{version}]`` (requests; replies to the v5 ResponseTopic or the JSON ``reply_to``),
``{prefix}/telemetry``, and the pipelines of ``[[mqtt.pipelines]]``.
"""

from edged.mqtt._settings import parse_broker
from edged.mqtt.frontend import MqttFrontEnd
from edged.mqtt.loadgen import PipelineClient, RequestClient

__all__ = ["MqttFrontEnd", "PipelineClient", "RequestClient", "parse_broker"]
