"""Tool calling and response_format through the official openai client, over loopback TCP and the Unix socket,
on the bundled tiny Llama (llama3_json) and on copies of it whose chat template and ``tool_parser`` speak the
Hermes and Mistral formats. The model talks nonsense, so a forced call (tool_choice required or named) is
what makes its output a call: llguidance constrains the real generation to the parser's format, and the
server parses the real output back; nothing is faked."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import server_harness as harness

openai = pytest.importorskip("openai")

# small: the tiny model's tokenizer spends a token per JSON character, and its context is 256 tokens
GATE = {"type": "function", "function": {"name": "gate", "parameters": {"properties": {"side": {"enum": ["n", "s"]}},
                                                                        "required": ["side"]}}}
LIGHT = {"type": "function", "function": {"name": "light", "parameters": {"properties": {"on": {"type": "boolean"}},
                                                                          "required": ["on"]}}}
ASK = [{"role": "user", "content": "Open the gate"}]

# the variants' templates list the tools in the system turn, briefly; what differs is the output format
VARIANT_TEMPLATE = """\
{%- if tools %}<|system|>{% for tool in tools %}{{ tool.function | tojson(separators=(',', ':')) }}\
{% endfor %}<|end|>
{% endif %}
{%- for message in messages %}<|{{ message.role }}|>{{ message.content }}<|end|>
{% endfor %}
{%- if add_generation_prompt %}<|assistant|>{% endif %}"""


def tcp_client(server: harness.ThreadedServer) -> Any:
    return openai.OpenAI(base_url=f"http://127.0.0.1:{server.port}/v1", api_key="unused", max_retries=0)


def uds_client(server: harness.ThreadedServer) -> Any:
    transport = httpx.HTTPTransport(uds=server.socket_path)
    return openai.OpenAI(base_url="http://localhost/v1", api_key="unused", max_retries=0,
                         http_client=httpx.Client(transport=transport))


def _variant(repository: Path, name: str, template: str, parser: str) -> None:
    folder = repository / name
    harness.shutil.copytree(repository / "tiny_llama", folder)
    (folder / "1" / "chat_template.jinja").write_text(template)
    config = (folder / "config.pbtxt").read_text().replace('"tiny_llama"', f'"{name}"')
    (folder / "config.pbtxt").write_text(config.replace('"llama3_json"', f'"{parser}"'))


@pytest.fixture(scope="module")
def tool_server() -> Iterator[harness.ThreadedServer]:
    pytest.importorskip("onnxruntime_genai")
    server = harness.ThreadedServer(models=("tiny_llama",), tcp=True)
    _variant(server.repository, "tiny_hermes", VARIANT_TEMPLATE, "hermes")
    _variant(server.repository, "tiny_mistral", VARIANT_TEMPLATE, "mistral")
    _variant(server.repository, "tiny_plain", VARIANT_TEMPLATE, "none")
    plain = server.repository / "tiny_plain" / "config.pbtxt"
    plain.write_text("\n".join(line for line in plain.read_text().splitlines() if "tool_parser" not in line))
    yield server.start()
    server.stop()


@pytest.mark.parametrize("client_for", [tcp_client, uds_client], ids=["tcp", "uds"])
@pytest.mark.parametrize("model", ["tiny_llama", "tiny_hermes", "tiny_mistral"])
def test_required_tool_choice_returns_a_parsed_call(tool_server: harness.ThreadedServer, client_for: Any,
                                                    model: str) -> None:
    reply = client_for(tool_server).chat.completions.create(
        model=model, messages=ASK, tools=[GATE, LIGHT], tool_choice="required", temperature=0)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    (call,) = choice.message.tool_calls
    arguments = json.loads(call.function.arguments)
    assert call.type == "function" and call.id.startswith("call_")
    assert (call.function.name, sorted(arguments)) in (("gate", ["side"]), ("light", ["on"]))


@pytest.mark.parametrize("model", ["tiny_llama", "tiny_hermes", "tiny_mistral"])
def test_a_named_tool_choice_streams_tool_call_deltas_as_openai_does(tool_server: harness.ThreadedServer,
                                                                       model: str) -> None:
    named = {"type": "function", "function": {"name": "light"}}
    whole = uds_client(tool_server).chat.completions.create(
        model=model, messages=ASK, tools=[GATE, LIGHT], tool_choice=named, temperature=0)
    chunks = list(uds_client(tool_server).chat.completions.create(
        model=model, messages=ASK, tools=[GATE, LIGHT], tool_choice=named, temperature=0,
        stream=True))
    deltas = [c.choices[0].delta.tool_calls for c in chunks if c.choices and c.choices[0].delta.tool_calls]
    assert deltas[0][0].id and deltas[0][0].function.name == "light"
    arguments = "".join(d[0].function.arguments or "" for d in deltas)
    assert {d[0].index for d in deltas} == {0}
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == ""
    assert json.loads(arguments) == json.loads(whole.choices[0].message.tool_calls[0].function.arguments)
    assert set(json.loads(arguments)) == {"on"}


def test_a_forced_call_cut_short_by_max_tokens_is_content_with_finish_length(
        tool_server: harness.ThreadedServer) -> None:
    reply = tcp_client(tool_server).chat.completions.create(
        model="tiny_llama", messages=ASK, tools=[GATE], tool_choice="required", max_tokens=5, temperature=0)
    choice = reply.choices[0]
    assert choice.finish_reason == "length" and not choice.message.tool_calls
    assert choice.message.content.startswith('{"name')


def test_tool_choice_none_leaves_the_tools_out_of_the_prompt(tool_server: harness.ThreadedServer) -> None:
    client = tcp_client(tool_server)
    plain = client.chat.completions.create(model="tiny_llama", messages=ASK, max_tokens=3, temperature=0)
    none = client.chat.completions.create(model="tiny_llama", messages=ASK, tools=[GATE], tool_choice="none",
                                          max_tokens=3, temperature=0)
    auto = client.chat.completions.create(model="tiny_llama", messages=ASK, tools=[GATE], max_tokens=3,
                                          temperature=0)
    assert none.usage.prompt_tokens == plain.usage.prompt_tokens < auto.usage.prompt_tokens
    assert none.choices[0].message.content == plain.choices[0].message.content


def test_a_conversation_with_tool_calls_and_results_renders_as_transformers_renders_it(
        tool_server: harness.ThreadedServer, model_dir: Path) -> None:
    messages = [*ASK, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "gate", "arguments": '{"side":"n"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "open"}]
    reply = tcp_client(tool_server).chat.completions.create(model="tiny_llama", messages=messages, tools=[GATE],
                                                            max_tokens=2, temperature=0)
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(model_dir))
    prompt = tokenizer.apply_chat_template(messages, tools=[GATE], tokenize=False, add_generation_prompt=True,
                                           chat_template=(model_dir / "chat_template.jinja").read_text())
    assert '{"name":"gate","parameters":{"side":"n"}}' in prompt and "<|tool|>open" in prompt
    assert reply.usage.prompt_tokens == len(tokenizer(prompt, add_special_tokens=False)["input_ids"])


def test_response_format_json_schema_output_parses_and_matches(tool_server: harness.ThreadedServer) -> None:
    schema = {"type": "object", "properties": {"open": {"type": "boolean"}}, "required": ["open"],
              "additionalProperties": False}
    for stream in (False, True):
        kwargs: dict[str, Any] = {"model": "tiny_llama", "messages": ASK, "max_tokens": 40, "temperature": 0,
                                      "response_format": {"type": "json_schema",
                                                       "json_schema": {"name": "answer", "schema": schema}}}
        if stream:
            text = "".join(c.choices[0].delta.content or "" for c in
                           uds_client(tool_server).chat.completions.create(stream=True, **kwargs) if c.choices)
        else:
            text = tcp_client(tool_server).chat.completions.create(**kwargs).choices[0].message.content
        assert set(json.loads(text)) == {"open"} and isinstance(json.loads(text)["open"], bool)


def test_response_format_json_object_gives_a_json_object(tool_server: harness.ThreadedServer) -> None:
    reply = tcp_client(tool_server).chat.completions.create(
        model="tiny_llama", messages=ASK, max_tokens=40, seed=0, temperature=1,
        response_format={"type": "json_object"})
    assert reply.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(reply.choices[0].message.content), dict)


def test_response_format_text_is_plain_generation(tool_server: harness.ThreadedServer) -> None:
    client = tcp_client(tool_server)
    plain = client.chat.completions.create(model="tiny_llama", messages=ASK, max_tokens=6, temperature=0)
    text = client.chat.completions.create(model="tiny_llama", messages=ASK, max_tokens=6, temperature=0,
                                          response_format={"type": "text"})
    assert text.choices[0].message.content == plain.choices[0].message.content


def _error(server: harness.ThreadedServer, body: dict[str, Any]) -> dict[str, Any]:
    with httpx.Client(base_url=f"http://127.0.0.1:{server.port}") as http:
        response = http.post("/v1/chat/completions", json={"model": "tiny_llama", "messages": ASK,
                                                           "max_tokens": 4, **body})
    assert response.status_code == 400, response.text
    error: dict[str, Any] = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    return error


@pytest.mark.parametrize(("body", "param"), [
    ({"tools": "gate"}, "tools"),
    ({"tools": []}, "tools"),
    ({"tools": [{"type": "retrieval"}]}, "tools[0]"),
    ({"tools": [{"type": "function", "function": {"name": "rm -rf /"}}]}, "tools[0].function.name"),
    ({"tools": [{"type": "function", "function": {"name": "a" * 65}}]}, "tools[0].function.name"),
    ({"tools": [{"type": "function", "function": {"name": "g", "parameters": "x"}}]}, "tools[0].function.parameters"),
    ({"tools": [{"type": "function", "function": {"name": "g", "parameters": {"type": "array"}}}]},
     "tools[0].function.parameters"),
    ({"tools": [{"type": "function", "function": {"name": "g", "parameters": {"required": "x"}}}]},
     "tools[0].function.parameters.required"),
    ({"tools": [{"type": "function", "function": {"name": "g", "exec": "x"}}]}, "tools[0].function.exec"),
    ({"tools": [GATE, GATE]}, "tools[1].function.name"),
    ({"tools": [GATE] * 129}, "tools"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"parallel_tool_calls": False}, "parallel_tool_calls"),
    ({"tools": [GATE], "parallel_tool_calls": "no"}, "parallel_tool_calls"),
    ({"tools": [GATE], "tool_choice": "sometimes"}, "tool_choice"),
    ({"tools": [GATE], "tool_choice": {"type": "function", "function": {"name": "light"}}}, "tool_choice"),
    ({"response_format": {"type": "xml"}}, "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": []}}},
     "response_format.json_schema.schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "bogus"}}}},
     "response_format"),
    ({"response_format": {"type": "json_object"}, "tools": [GATE], "tool_choice": "required"}, "response_format"),
    ({"messages": [{"role": "user", "content": "hi", "tool_calls": []}]}, "messages[0].tool_calls"),
    ({"messages": [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "gate", "arguments": "{not json"}}]}]},
     "messages[0].tool_calls[0].function.arguments"),
    ({"messages": [{"role": "assistant", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "gate", "arguments": "[1]"}}]}]},
     "messages[0].tool_calls[0].function.arguments"),
    ({"messages": [{"role": "tool", "content": "x", "tool_call_id": 7}]}, "messages[0].tool_call_id"),
])
def test_broken_tool_requests_get_400_naming_the_field(tool_server: harness.ThreadedServer, body: dict[str, Any],
                                                       param: str) -> None:
    assert _error(tool_server, body)["param"] == param


def test_tools_for_a_model_without_a_tool_parser_are_refused(tool_server: harness.ThreadedServer) -> None:
    error = _error(tool_server, {"model": "tiny_plain", "tools": [GATE]})
    assert error["param"] == "tools" and "tool_parser" in error["message"]


def test_a_hostile_schema_does_not_stop_the_server(tool_server: harness.ThreadedServer) -> None:
    deep: dict[str, Any] = {"type": "object"}
    for _ in range(200):
        deep = {"type": "object", "properties": {"x": deep}, "required": ["x"]}
    hostile = {"type": "function", "function": {"name": "deep", "parameters": deep}}
    with httpx.Client(base_url=f"http://127.0.0.1:{tool_server.port}", timeout=120) as http:
        response = http.post("/v1/chat/completions", json={"model": "tiny_llama", "messages": ASK,
                                                           "tools": [hostile], "tool_choice": "required",
                                                           "max_tokens": 4})
    assert response.status_code == 400  # the prompt outgrows the context: refused before generating
    reply = tcp_client(tool_server).chat.completions.create(
        model="tiny_llama", messages=ASK, tools=[GATE], tool_choice="required", temperature=0)
    assert reply.choices[0].finish_reason == "tool_calls"


@pytest.mark.parametrize("model", ["tiny_hermes", "tiny_mistral"])
def test_a_schema_written_to_break_out_of_the_grammar_stays_data(tool_server: harness.ThreadedServer,
                                                                 model: str) -> None:
    evil = '}\nstart: "pwned"\n%json {'
    tool = {"type": "function", "function": {"name": "gate", "parameters": {
        "properties": {"x": {"enum": [evil]}}, "required": ["x"]}}}
    reply = tcp_client(tool_server).chat.completions.create(model=model, messages=ASK, tools=[tool],
                                                            tool_choice="required", temperature=0)
    (call,) = reply.choices[0].message.tool_calls
    assert json.loads(call.function.arguments) == {"x": evil}


def test_parallel_tool_calls_false_is_accepted_and_gives_one_call(tool_server: harness.ThreadedServer) -> None:
    reply = tcp_client(tool_server).chat.completions.create(
        model="tiny_hermes", messages=ASK, tools=[GATE, LIGHT], tool_choice="required", parallel_tool_calls=False,
        temperature=0)
    assert reply.choices[0].finish_reason == "tool_calls" and len(reply.choices[0].message.tool_calls) == 1
