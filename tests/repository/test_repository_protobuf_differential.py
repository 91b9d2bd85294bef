"""Differential test: edged's schema-less ``config.pbtxt`` parser against protobuf's own ``text_format`` with
Triton's ``model_config.proto`` schema (the generated ``model_config_pb2`` that edged.grpcapi ships), at the
level of the parsed tree (test_repository_pbtxt_differential.py compares the built, normalised config).

For every real fixture and for configs generated from the schema itself, both parsers must see the same fields
with the same values: every field protobuf holds is in edged's tree with an equal value (enums by name, floats
at the field's precision, strings after escapes), and edged's tree holds nothing protobuf does not. The builder
(``parse_model_config``) must agree with protobuf on the fields it interprets.

Where edged deliberately differs (documented here and in the repository module docstrings):
- An unknown field is a ``ParseError`` for protobuf; edged's schema-less tree holds it, and its builder refuses it
  at its position (``edged.repository._schema``, the same schema as tables, checked against it here).
- Repeating a singular field is a ``ParseError`` for protobuf's ``Parse``; edged's builder reports it.
- edged's builder refuses some values protobuf accepts (negative dims other than -1, unknown data types in
  ``data_type``): protobuf checks syntax and types only, Triton's model-config validation checks the rest.
"""

from __future__ import annotations

import math
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edged.errors import EdgedError
from edged.repository import Field, Ident, Message, dump, parse, parse_model_config

text_format = pytest.importorskip("google.protobuf.text_format")
from google.protobuf import descriptor as pb_descriptor  # noqa: E402  (after the skip above)
from google.protobuf.message import Message as PbMessage  # noqa: E402

FIXTURES = Path(__file__).parent.parent / "fixtures" / "model_configs"
FD = pb_descriptor.FieldDescriptor


PB2: ModuleType = pytest.importorskip("edged.grpcapi.proto.model_config_pb2")  # Triton's model_config.proto


def protobuf_parse(text: str) -> PbMessage:
    message: PbMessage = PB2.ModelConfig()
    text_format.Parse(text, message)
    return message


# --- the comparison ----------------------------------------------------------------------------------------

def differences(tree: Message, message: PbMessage, where: str = "") -> list[str]:
    """Every way edged's tree and protobuf's message disagree, as readable lines (empty when they agree)."""
    out: list[str] = []
    known = {fd.name for fd in message.DESCRIPTOR.fields}
    for item in tree.fields:
        if item.name not in known:
            out.append(f"{where}{item.name}: in edged's tree, not in the schema")
    for fd in message.DESCRIPTOR.fields:
        mine = [item.value for item in tree.fields if item.name == fd.name]
        out += _field_differences(fd, mine, message, f"{where}{fd.name}")
    return out


def _field_differences(fd: Any, mine: list[Any], message: PbMessage, where: str) -> list[str]:
    theirs = getattr(message, fd.name)
    if _is_map(fd):
        return _map_differences(fd, mine, theirs, where)
    if _repeated(fd):
        if len(mine) != len(theirs):
            return [f"{where}: edged has {len(mine)} values, protobuf {len(theirs)}"]
        out: list[str] = []
        for index, (a, b) in enumerate(zip(mine, theirs, strict=True)):
            out += _value_differences(fd, a, b, f"{where}[{index}]")
        return out
    present = message.HasField(fd.name) if fd.has_presence else theirs != fd.default_value
    if not mine:
        return [f"{where}: protobuf has {theirs!r}, edged nothing"] if present else []
    return _value_differences(fd, mine[-1], theirs, where)


def _repeated(fd: Any) -> bool:
    if hasattr(fd, "is_repeated"):  # protobuf >= 6; older releases have only `label`
        return bool(fd.is_repeated)
    return bool(fd.label == FD.LABEL_REPEATED)


def _is_map(fd: Any) -> bool:
    return bool(fd.type == FD.TYPE_MESSAGE and fd.message_type.GetOptions().map_entry)


def _map_differences(fd: Any, mine: list[Any], theirs: Any, where: str) -> list[str]:
    value_fd = fd.message_type.fields_by_name["value"]
    key_fd = fd.message_type.fields_by_name["key"]
    entries: dict[Any, Any] = {}
    for entry in mine:
        if not isinstance(entry, Message):
            return [f"{where}: edged has a scalar where a map entry belongs"]
        keys = [f.value for f in entry.fields if f.name == "key"]
        values = [f.value for f in entry.fields if f.name == "value"]
        key = _scalar(key_fd, keys[-1]) if keys else key_fd.default_value
        entries[key] = values[-1] if values else None
    if set(entries) != set(theirs.keys()):
        return [f"{where}: keys {sorted(map(str, entries))} vs {sorted(map(str, theirs.keys()))}"]
    out: list[str] = []
    for key, value in entries.items():
        if value is None:
            continue  # an entry without a value holds the default on both sides
        out += _value_differences(value_fd, value, theirs[key], f"{where}[{key!r}]")
    return out


def _value_differences(fd: Any, mine: Any, theirs: Any, where: str) -> list[str]:
    if fd.type in (FD.TYPE_MESSAGE, FD.TYPE_GROUP):
        if not isinstance(mine, Message):
            return [f"{where}: edged has scalar {mine!r}, protobuf a message"]
        return differences(mine, theirs, f"{where}.")
    if isinstance(mine, Message):
        return [f"{where}: edged has a message, protobuf {theirs!r}"]
    try:
        value = _scalar(fd, mine)
    except (TypeError, ValueError, KeyError) as e:
        return [f"{where}: edged's {mine!r} is not a {fd.type} value ({e})"]
    if fd.type == FD.TYPE_ENUM:
        theirs = fd.enum_type.values_by_number[theirs].name
    if _equal(fd, value, theirs):
        return []
    return [f"{where}: edged {value!r}, protobuf {theirs!r}"]


def _scalar(fd: Any, value: Any) -> Any:
    """edged's tree value as the type protobuf stores for this field."""
    kind = fd.type
    if kind == FD.TYPE_ENUM:
        if isinstance(value, Ident):
            return value.name
        return fd.enum_type.values_by_number[int(value)].name
    if kind == FD.TYPE_BOOL:
        if isinstance(value, Ident):
            return {"true": True, "t": True, "false": False, "f": False}[value.name.lower()]
        return bool(int(value))
    if kind in (FD.TYPE_FLOAT, FD.TYPE_DOUBLE):
        if isinstance(value, Ident):
            name = value.name.lower()
            return {"inf": math.inf, "infinity": math.inf, "nan": math.nan}[name.lstrip("-")] * (
                -1 if name.startswith("-") else 1)
        return float(value)
    if kind in (FD.TYPE_STRING, FD.TYPE_BYTES):
        if not isinstance(value, str):
            raise TypeError("not a string")
        return value.encode("utf-8") if kind == FD.TYPE_BYTES else value
    if isinstance(value, (Ident, str, float)):
        raise TypeError("not an integer")
    return int(value)


def _equal(fd: Any, a: Any, b: Any) -> bool:
    if fd.type == FD.TYPE_FLOAT:
        a = float(np.float32(a))
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or a == b
    return bool(a == b)


# --- real configs ------------------------------------------------------------------------------------------

REAL = sorted(FIXTURES.glob("*.pbtxt"))


@pytest.mark.parametrize("path", REAL, ids=lambda p: p.stem)
def test_every_fixture_parses_to_the_same_fields_as_protobuf(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    assert differences(parse(text, str(path)), protobuf_parse(text)) == []


@pytest.mark.parametrize("path", REAL, ids=lambda p: p.stem)
def test_edged_dump_of_every_fixture_reads_back_in_protobuf_unchanged(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    assert protobuf_parse(dump(parse(text))) == protobuf_parse(text)


def _builder_view(message: PbMessage) -> dict[str, Any]:
    data_type = PB2.DataType.Name
    return {
        "platform": message.platform, "backend": message.backend, "max_batch_size": message.max_batch_size,
        "inputs": [(t.name, data_type(t.data_type), tuple(t.dims)) for t in message.input],
        "outputs": [(t.name, data_type(t.data_type), tuple(t.dims)) for t in message.output],
        "instance_counts": [g.count for g in message.instance_group],
    }


@pytest.mark.parametrize("path", REAL, ids=lambda p: p.stem)
def test_builder_reads_what_protobuf_reads_for_the_fields_it_interprets(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    message = protobuf_parse(text)
    try:
        config = parse_model_config(text, str(path), default_name=path.stem)
    except EdgedError as e:  # a refusal (sequence batching, ensembles) must be of a field protobuf has set
        assert any(message.HasField(name) for name in ("sequence_batching", "ensemble_scheduling")), e
        return
    assert _builder_view(message) == {
        "platform": config.platform, "backend": config.backend, "max_batch_size": config.max_batch_size,
        "inputs": [(t.name, t.data_type, tuple(t.dims)) for t in config.input],
        "outputs": [(t.name, t.data_type, tuple(t.dims)) for t in config.output],
        "instance_counts": [g.count for g in config.instance_group],
    }
    if message.HasField("dynamic_batching"):
        assert config.dynamic_batching is not None
        assert tuple(config.dynamic_batching.preferred_batch_size) == tuple(
            message.dynamic_batching.preferred_batch_size)
        assert config.dynamic_batching.max_queue_delay_microseconds == \
            message.dynamic_batching.max_queue_delay_microseconds


# --- configs generated from the schema ---------------------------------------------------------------------

_INT_RANGES = {
    **dict.fromkeys((FD.TYPE_INT32, FD.TYPE_SINT32, FD.TYPE_SFIXED32), (-(2**31), 2**31 - 1)),
    **dict.fromkeys((FD.TYPE_INT64, FD.TYPE_SINT64, FD.TYPE_SFIXED64), (-(2**63), 2**63 - 1)),
    FD.TYPE_UINT32: (0, 2**32 - 1), FD.TYPE_FIXED32: (0, 2**32 - 1),
    FD.TYPE_UINT64: (0, 2**64 - 1), FD.TYPE_FIXED64: (0, 2**64 - 1),
}


def _scalar_strategy(fd: Any) -> st.SearchStrategy[Any]:
    kind = fd.type
    if kind in _INT_RANGES:
        low, high = _INT_RANGES[kind]
        return st.integers(min_value=low, max_value=high)
    if kind == FD.TYPE_BOOL:
        return st.booleans()
    if kind == FD.TYPE_FLOAT:
        return st.floats(width=32, allow_nan=False)
    if kind == FD.TYPE_DOUBLE:
        return st.floats(allow_nan=False)
    if kind == FD.TYPE_ENUM:
        return st.sampled_from([v.number for v in fd.enum_type.values])
    if kind == FD.TYPE_BYTES:
        return st.text(max_size=8).map(lambda s: s.encode("utf-8"))  # edged reads strings as UTF-8 text
    return st.text(max_size=12)


@st.composite
def _filled(draw: st.DrawFn, message: PbMessage, depth: int) -> PbMessage:
    for fd in message.DESCRIPTOR.fields:
        nested = fd.type == FD.TYPE_MESSAGE
        if (nested and depth <= 0) or draw(st.integers(0, 5)) != 0:
            continue
        target = getattr(message, fd.name)
        if _is_map(fd):
            key_fd, value_fd = (fd.message_type.fields_by_name[n] for n in ("key", "value"))
            for key in draw(st.lists(_scalar_strategy(key_fd), max_size=2, unique=True)):
                if value_fd.type == FD.TYPE_MESSAGE:
                    draw(_filled(target[key], depth - 1))
                else:
                    target[key] = draw(_scalar_strategy(value_fd))
        elif _repeated(fd):
            for _ in range(draw(st.integers(0, 2))):
                if nested:
                    draw(_filled(target.add(), depth - 1))
                else:
                    target.append(draw(_scalar_strategy(fd)))
        elif nested:
            target.SetInParent()
            draw(_filled(target, depth - 1))
        else:
            setattr(message, fd.name, draw(_scalar_strategy(fd)))
    return message


GENERATED = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@GENERATED
@given(st.data(), st.booleans(), st.booleans())
def test_generated_configs_parse_to_the_same_fields_as_protobuf(data: st.DataObject, one_line: bool,
                                                                  utf8: bool) -> None:
    message = data.draw(_filled(PB2.ModelConfig(), 3))
    text = text_format.MessageToString(message, as_one_line=one_line, as_utf8=utf8)
    assert differences(parse(text), protobuf_parse(text)) == [], text


@GENERATED
@given(st.data())
def test_generated_configs_survive_edged_dump_unchanged_for_protobuf(data: st.DataObject) -> None:
    message = data.draw(_filled(PB2.ModelConfig(), 3))
    text = text_format.MessageToString(message)
    assert protobuf_parse(dump(parse(text))) == message, text


def test_an_unknown_field_is_in_edgeds_tree_and_refused_by_its_builder_and_by_protobuf() -> None:
    text = 'name: "m"\nfuture_field { x: 1 }\n'
    assert Field("future_field", Message((Field("x", 1),))) in parse(text).fields
    with pytest.raises(text_format.ParseError):
        protobuf_parse(text)
    with pytest.raises(EdgedError, match="field 'future_field' is unknown"):
        parse_model_config(text)


def _schema_of(descriptor: Any, messages: dict[str, dict[str, str]], enums: dict[str, tuple[str, ...]]) -> None:
    scalars = {FD.TYPE_BOOL: "bool", FD.TYPE_INT32: "int32", FD.TYPE_UINT32: "uint32", FD.TYPE_INT64: "int64",
               FD.TYPE_UINT64: "uint64", FD.TYPE_FLOAT: "float", FD.TYPE_DOUBLE: "double", FD.TYPE_STRING: "string"}

    def name(full: str) -> str:
        return full.removeprefix("inference.")

    def kind(fd: Any) -> str:
        if fd.type == FD.TYPE_MESSAGE and fd.message_type.GetOptions().map_entry:
            return f"map {kind(fd.message_type.fields_by_name['key'])} {kind(fd.message_type.fields_by_name['value'])}"
        if fd.type == FD.TYPE_MESSAGE:
            _schema_of(fd.message_type, messages, enums)
            return name(fd.message_type.full_name)
        if fd.type == FD.TYPE_ENUM:
            enums[name(fd.enum_type.full_name)] = tuple(v.name for v in sorted(fd.enum_type.values,
                                                                                 key=lambda v: v.number))
            return name(fd.enum_type.full_name)
        return scalars[fd.type]

    if name(descriptor.full_name) in messages:
        return
    fields: dict[str, str] = {}
    messages[name(descriptor.full_name)] = fields
    for fd in descriptor.fields:
        text = kind(fd)
        fields[fd.name] = ("*" + text) if _repeated(fd) and not text.startswith("map ") else text


def test_edgeds_schema_tables_are_tritons_model_config_proto() -> None:
    from edged.repository._schema import ENUMS, MESSAGES

    messages: dict[str, dict[str, str]] = {}
    enums: dict[str, tuple[str, ...]] = {}
    _schema_of(PB2.ModelConfig.DESCRIPTOR, messages, enums)
    assert messages == MESSAGES
    assert enums == ENUMS
    assert all(len(set(values)) == len(values) for values in ENUMS.values())


def test_the_comparison_sees_a_changed_value_a_missing_field_and_an_extra_one() -> None:
    message = protobuf_parse('max_batch_size: 5 input { name: "a" dims: [1, 2] }')
    assert differences(parse('max_batch_size: 4 input { name: "a" dims: [1, 2] }'), message) == [
        "max_batch_size: edged 4, protobuf 5"]
    assert differences(parse('max_batch_size: 5 input { name: "a" dims: [1] }'), message) == [
        "input[0].dims: edged has 1 values, protobuf 2"]
    assert differences(parse('max_batch_size: 5 input { name: "a" dims: [1, 2] } bogus: 1'), message) == [
        "bogus: in edged's tree, not in the schema"]
