#!/usr/bin/env python3
"""Build the bundled generative test model ``models/tiny_llama`` offline, deterministically.

A byte-level BPE tokenizer trained with ``tokenizers`` on the text below, a Llama from a ``transformers``
config with fixed random weights (``torch.manual_seed(0)``), exported in fp32 for the CPU by ONNX Runtime
GenAI's model builder, plus a chat template. The model talks nonsense; it exists so that tests can compare
edged's generation token for token with ``transformers`` and ``og.Generator`` on the same weights.

Needs the dev extra (transformers, tokenizers, onnx-ir, onnxruntime-genai, torch). The Hugging Face folder is
kept in ``<out>/tiny_llama_hf`` beside the model repository folder only when ``--keep-hf`` is given.
Usage: ``python scripts/make_genai_model.py [--out models] [--keep-hf DIR]``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

TEXT = """\
The edge device wakes before dawn and reads its sensors. A camera watches the gate, a microphone listens for
the bell, and a small model decides what matters. Nothing leaves the board unless it has to.
Jetson modules run neural networks beside the machines they watch. They lose power without warning, so every
file that matters is written to a temporary name, synced and renamed.
A model repository holds one folder per model. Each folder has a configuration and numbered versions; the
daemon loads the newest version, warms it up and only then reports that it is ready.
The assistant answers questions about the weather, the doors and the lights. When it needs a fact it calls a
tool: get the temperature, open the gate, switch on the porch light. The tool replies and the assistant goes on.
Tokens arrive one at a time. The first token takes longest, because the whole prompt is read; each token after
it costs one step of the model. A client that stops listening should stop the work it asked for.
"""

# A Llama 3 style template with tool support: tools are listed in the system turn as JSON, a tool's answer is
# a "tool" turn, an assistant's tool calls are written back as JSON so a conversation can be replayed. The
# calls are Llama 3.x JSON tool calls, so the model config names the llama3_json tool parser. Everything is
# compact JSON: this tokenizer spends about a token per JSON character, and the context is 256 tokens.
CHAT_TEMPLATE = """\
{%- if tools %}<|system|>Tools:
{% for tool in tools %}{{ tool.function | tojson(separators=(',', ':')) }}
{% endfor %}<|end|>
{% endif %}
{%- for message in messages %}
{%- if message.role == 'tool' %}<|tool|>{{ message.content }}<|end|>
{% elif message.tool_calls %}<|assistant|>{% for call in message.tool_calls %}\
{"name":"{{ call.function.name }}","parameters":{{ call.function.arguments }}}{% endfor %}<|end|>
{% else %}<|{{ message.role }}|>{{ message.content }}<|end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|assistant|>{% endif %}"""

SPECIAL = ["<s>", "</s>", "<unk>", "<|system|>", "<|user|>", "<|assistant|>", "<|tool|>", "<|end|>"]

MODEL_CONFIG = """name: "tiny_llama"
backend: "onnxruntime_genai"
max_batch_size: 0
instance_group [ { count: 1, kind: KIND_CPU } ]
parameters { key: "tool_parser" value: { string_value: "llama3_json" } }
"""


def train_tokenizer(hf: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(TEXT.splitlines(), trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>", model_max_length=256)
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(hf)


def save_llama(hf: Path) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast.from_pretrained(hf)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.eos_token_id, tie_word_embeddings=False)
    model = LlamaForCausalLM(config).eval()
    model.save_pretrained(hf)


def export(hf: Path, version_dir: Path) -> None:
    with tempfile.TemporaryDirectory() as cache:
        subprocess.run([sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(hf), "-o",
                        str(version_dir), "-p", "fp32", "-e", "cpu", "-c", cache], check=True,
                       stdout=subprocess.DEVNULL)
    (version_dir / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    genai = json.loads((version_dir / "genai_config.json").read_text())
    genai["search"]["max_length"] = 256
    (version_dir / "genai_config.json").write_text(json.dumps(genai, indent=4) + "\n")


def build(out: Path, keep_hf: Path | None = None) -> Path:
    folder = out / "tiny_llama"
    with tempfile.TemporaryDirectory() as tmp:
        hf = keep_hf or Path(tmp) / "hf"
        hf.mkdir(parents=True, exist_ok=True)
        train_tokenizer(hf)
        save_llama(hf)
        version_dir = folder / "1"
        if version_dir.exists():
            shutil.rmtree(version_dir)
        version_dir.mkdir(parents=True)
        export(hf, version_dir)
    (folder / "config.pbtxt").write_text(MODEL_CONFIG)
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent.parent / "models")
    parser.add_argument("--keep-hf", type=Path, default=None, help="also keep the transformers folder here")
    args = parser.parse_args()
    print(f"wrote {build(args.out, args.keep_hf)}")


if __name__ == "__main__":
    main()
