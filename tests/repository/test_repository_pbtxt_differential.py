"""Differential test: edged's config.pbtxt parser against protobuf's own ``text_format`` with Triton's
``model_config.proto`` (the generated module edged.grpcapi ships), over every fixture and bundled model and
over hypothesis-generated configs.

edged's form is Triton's GET-config JSON, which fills defaults the file left out (version_policy, instance
group names and counts, optimization, default_model_filename): so the rule is that every field protobuf
read from the file has the same value in edged's form, and edged adds only fields the file did not set.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from google.protobuf import json_format, text_format
from hypothesis import given, settings
from hypothesis import strategies as st

from edged.errors import ModelConfigError
from edged.grpcapi.proto import model_config_pb2 as mc
from edged.repository import model_config_to_json, parse_model_config

TESTS = Path(__file__).resolve().parents[1]
FILES = sorted((TESTS / "fixtures" / "model_configs").glob("*.pbtxt")) + sorted(
    (TESTS.parent / "models").glob("*/config.pbtxt"))


def _as_dict(message: mc.ModelConfig) -> dict[str, Any]:
    return json_format.MessageToDict(message, preserving_proto_field_name=True)


def _agrees(theirs: Any, ours: Any, where: str = "") -> list[str]:
    """Where ``ours`` differs from a value protobuf read (``theirs``); fields only ``ours`` has are defaults."""
    if isinstance(theirs, dict) and isinstance(ours, dict):
        return [problem for key, value in theirs.items()
                for problem in _agrees(value, ours.get(key), f"{where}.{key}")]
    if isinstance(theirs, list) and isinstance(ours, list) and len(theirs) == len(ours):
        return [problem for index, (a, b) in enumerate(zip(theirs, ours, strict=True))
                for problem in _agrees(a, b, f"{where}[{index}]")]
    return [] if theirs == ours else [f"{where}: protobuf read {theirs!r}, edged {ours!r}"]


def _compare(text: str, name: str) -> list[str]:
    theirs = text_format.Parse(text, mc.ModelConfig())
    ours = mc.ModelConfig()
    json_format.ParseDict(model_config_to_json(parse_model_config(text, name)), ours)
    return _agrees(_as_dict(theirs), _as_dict(ours))


# Where edged is stricter on purpose: stateful and ensemble models are refused at the field that needs them
# (served as if stateless they would answer wrongly), so those fixtures are checked for the refusal instead.
_REFUSED = ("sequence_batching", "ensemble_scheduling")


@pytest.mark.parametrize("path", FILES, ids=lambda path: f"{path.parent.name}/{path.name}")
def test_every_fixture_reads_the_same_as_protobuf_text_format(path: Path) -> None:
    text = path.read_text()
    refused = [field for field in _REFUSED if text_format.Parse(text, mc.ModelConfig()).HasField(field)]
    if refused:
        with pytest.raises(ModelConfigError, match=f"field '{refused[0]}'"):
            parse_model_config(text, str(path))
        return
    assert _compare(text, str(path)) == []


_NAMES = st.from_regex(r"[a-z][a-z0-9_]{0,11}", fullmatch=True)
_TYPES = st.sampled_from(["TYPE_FP32", "TYPE_FP16", "TYPE_INT64", "TYPE_UINT8", "TYPE_BOOL", "TYPE_STRING"])
_DIMS = st.lists(st.one_of(st.just(-1), st.integers(1, 4096)), min_size=1, max_size=4)


def _tensor(name: str, datatype: str, dims: list[int]) -> str:
    return f'{{ name: "{name}" data_type: {datatype} dims: [ {", ".join(map(str, dims))} ] }}'


@settings(max_examples=80, deadline=None)
@given(name=_NAMES, max_batch=st.integers(0, 64), inputs=st.lists(st.tuples(_NAMES, _TYPES, _DIMS), min_size=1,
                                                                    max_size=3, unique_by=lambda t: t[0]),
       outputs=st.lists(st.tuples(_NAMES, _TYPES, _DIMS), min_size=1, max_size=3, unique_by=lambda t: t[0]),
       count=st.integers(1, 4), batching=st.booleans(), delay=st.integers(0, 10_000))
def test_generated_configs_read_the_same_as_protobuf_text_format(
        name: str, max_batch: int, inputs: list[tuple[str, str, list[int]]],
        outputs: list[tuple[str, str, list[int]]], count: int, batching: bool, delay: int) -> None:
    lines = [f'name: "{name}"', 'platform: "onnxruntime_onnx"', f"max_batch_size: {max_batch}",
             "input [ " + ", ".join(_tensor(*t) for t in inputs) + " ]",
             "output [ " + ", ".join(_tensor(*t) for t in outputs) + " ]",
             f"instance_group [ {{ count: {count} kind: KIND_CPU }} ]"]
    if batching and max_batch > 0:
        lines.append(f"dynamic_batching {{ max_queue_delay_microseconds: {delay} }}")
    assert _compare("\n".join(lines) + "\n", f"{name}/config.pbtxt") == []
