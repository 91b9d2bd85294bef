"""The references edged's generation is compared with: the chat template rendered by transformers, and greedy
decoding by ONNX Runtime GenAI's own generator loop, in process."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def render_with_transformers(model_dir: Path, messages: list[dict[str, Any]]) -> str:
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(model_dir))
    template = (model_dir / "chat_template.jinja").read_text()
    text: str = tokenizer.apply_chat_template(messages, chat_template=template, tokenize=False,
                                              add_generation_prompt=True)
    return text


def og_greedy(model_dir: Path, prompt: str, max_new_tokens: int) -> tuple[list[int], list[int], str]:
    """(prompt ids, new token ids without the end-of-sequence token, their text)."""
    import onnxruntime_genai as og

    model = og.Model(str(model_dir))
    tokenizer = og.Tokenizer(model)
    ids = [int(t) for t in tokenizer.encode(prompt)]
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(ids) + max_new_tokens, do_sample=False)
    generator = og.Generator(model, params)
    generator.append_tokens(ids)
    out: list[int] = []
    while not generator.is_done():
        generator.generate_next_token()
        out.append(int(generator.get_next_tokens()[0]))
    eos = set(tokenizer.eos_token_ids) if hasattr(tokenizer, "eos_token_ids") else set()
    if out and out[-1] in eos:
        out = out[:-1]
    stream = tokenizer.create_stream()  # whole-sequence decode gives "" when the bytes are not valid UTF-8
    return ids, out, "".join(stream.decode(t) for t in out)
