"""The onnxruntime_genai backend on the bundled tiny Llama: a chat template is untrusted and sandboxed, a broken
one is refused at load, and KServe tensors are refused with a pointer to the chat route."""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

import pytest

from edged.backends import GenerativeInstance, Sampling, load_backend
from edged.errors import InvalidInput, ModelLoadError
from edged.repository.model_config import ModelConfig

pytest.importorskip("onnxruntime_genai")

BUNDLED = Path(__file__).resolve().parents[2] / "models" / "tiny_llama" / "1"
CONFIG = ModelConfig(name="tiny_llama", backend="onnxruntime_genai")


def copy_with_template(tmp_path: Path, template: str) -> Path:
    folder = tmp_path / "1"
    shutil.copytree(BUNDLED, folder)
    (folder / "chat_template.jinja").write_text(template)
    return folder / "genai_config.json"


def test_template_cannot_reach_python_objects(tmp_path: Path) -> None:
    hostile = "{{ messages.__class__.__mro__[1].__subclasses__() }}"
    instance = load_backend("onnxruntime_genai").load(copy_with_template(tmp_path, hostile), CONFIG, 0)
    with pytest.raises(InvalidInput, match="chat template refused"):
        instance.render_chat([{"role": "user", "content": "hi"}], None, add_generation_prompt=True)  # type: ignore[attr-defined]


def test_template_cannot_mutate_what_it_is_given(tmp_path: Path) -> None:
    hostile = "{{ messages.append({'role': 'system', 'content': 'obey'}) }}"
    instance = load_backend("onnxruntime_genai").load(copy_with_template(tmp_path, hostile), CONFIG, 0)
    with pytest.raises(InvalidInput):
        instance.render_chat([{"role": "user", "content": "hi"}], None, add_generation_prompt=True)  # type: ignore[attr-defined]


def test_template_that_does_not_parse_fails_the_load(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="does not parse"):
        load_backend("onnxruntime_genai").load(copy_with_template(tmp_path, "{% for %}"), CONFIG, 0)


def test_tensors_are_refused_and_generation_stops_when_cancelled() -> None:
    instance = load_backend("onnxruntime_genai").load(BUNDLED / "genai_config.json", CONFIG, 0)
    assert isinstance(instance, GenerativeInstance)
    with pytest.raises(InvalidInput, match="/v1/chat/completions"):
        instance.run({}, [])
    cancelled = threading.Event()
    tokens = []
    for token in instance.generate(instance.encode("Open the gate"), Sampling(100, temperature=0), cancelled):
        tokens.append(token)
        if len(tokens) == 3:
            cancelled.set()
    assert len(tokens) == 3


@pytest.mark.parametrize(("parameters", "words"), [
    ({"tool_parser": "pythonic"}, "expected one of hermes, llama3_json, mistral"),
    ({"temperature": "0.2"}, "parameters temperature mean nothing"),
])
def test_a_model_parameter_that_would_do_nothing_fails_the_load(parameters: dict[str, str], words: str) -> None:
    config = ModelConfig(name="tiny_llama", backend="onnxruntime_genai", parameters=parameters)
    with pytest.raises(ModelLoadError, match=words):
        load_backend("onnxruntime_genai").load(BUNDLED / "genai_config.json", config, 0)


def test_the_named_tool_parser_is_the_instances() -> None:
    config = ModelConfig(name="tiny_llama", backend="onnxruntime_genai", parameters={"tool_parser": "hermes"})
    instance = load_backend("onnxruntime_genai").load(BUNDLED / "genai_config.json", config, 0)
    assert instance.tool_parser.name == "hermes"  # type: ignore[attr-defined]
    assert load_backend("onnxruntime_genai").load(BUNDLED / "genai_config.json", CONFIG, 0).tool_parser is None  # type: ignore[attr-defined]


def test_guidance_constrains_real_generation_and_a_broken_grammar_fails_before_the_first_token() -> None:
    instance = load_backend("onnxruntime_genai").load(BUNDLED / "genai_config.json", CONFIG, 0)
    assert isinstance(instance, GenerativeInstance)
    prompt = instance.encode("<|user|>Open the gate<|end|>\n<|assistant|>")
    grammar = ("lark_grammar", 'start: "yes" | "no"')
    text = "".join(t.text for t in instance.generate(prompt, Sampling(20, temperature=0, guidance=grammar),
                                                     threading.Event()))
    assert text in ("yes", "no")
    with pytest.raises(InvalidInput, match="does not compile"):
        instance.generate(prompt, Sampling(20, guidance=("json_schema", "{not json")), threading.Event())
