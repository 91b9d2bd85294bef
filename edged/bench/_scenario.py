"""Benchmark scenarios from command-line flags or a TOML file (``[[scenario]]`` tables)."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from edged.config._loader import build
from edged.errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

Transport = Literal["inproc", "uds", "http", "mqtt", "openai"]
GENERATIVE_DEFAULTS = {"prompt_tokens": 32, "output_tokens": 32, "stream": True}


@dataclass(frozen=True)
class Scenario:
    model: str = "tiny_mlp"
    transport: Transport = "inproc"
    name: str = ""
    concurrency: tuple[int, ...] = (1,)
    batch: int = 1
    duration_s: float = 5.0
    warmup_s: float = 1.0
    batching: Literal["config", "on", "off", "both"] = "config"
    # inproc: raw onnxruntime session.run on the same model in the same run; openai: ORT GenAI's generator loop
    # in-process on the model's folder in the repository (--model-repository, default the bundled models)
    compare_raw: bool = True
    # inproc: requests kept in flight by completion callbacks (as perf_analyzer --async), threads calling infer(),
    # or coroutines awaiting infer_async() on one event loop
    client: Literal["callbacks", "threads", "asyncio"] = "callbacks"
    # uds: inputs and outputs through system shared memory (one region per connection, the input copied into it
    # before every request, as a camera writes each frame) instead of the request and response bodies
    shm: bool = False
    # uds/http: the request body's tensors in the binary-data extension (default) or as JSON lists
    body: Literal["binary", "json"] = "binary"
    # openai: the generation's shape (None = GENERATIVE_DEFAULTS); refused on the other transports, where they
    # would do nothing
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    stream: bool | None = None

    @property
    def generative(self) -> tuple[int, int, bool]:
        """(prompt tokens, output tokens, stream) of an openai scenario, defaults filled in."""
        return (GENERATIVE_DEFAULTS["prompt_tokens"] if self.prompt_tokens is None else self.prompt_tokens,
                GENERATIVE_DEFAULTS["output_tokens"] if self.output_tokens is None else self.output_tokens,
                bool(GENERATIVE_DEFAULTS["stream"] if self.stream is None else self.stream))

    @property
    def label(self) -> str:
        if self.transport == "openai":
            prompt, output, stream = self.generative
            return self.name or f"openai {self.model} {prompt}→{output}{' stream' if stream else ''}"
        kind = "+shm" if self.shm else "+json" if self.body == "json" else ""
        return self.name or f"{self.transport}{kind} {self.model} b{self.batch}"


@dataclass(frozen=True)
class ScenarioFile:
    scenario: tuple[Scenario, ...] = ()


def load_scenarios(path: Path) -> list[Scenario]:
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as e:  # strerror alone: str(e) repeats the path after the errno
        raise ConfigError(f"cannot read scenario file {path}: {e.strerror or e}") from e
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"cannot read scenario file {path}: {e}") from e
    except RecursionError:  # tomllib recurses per nesting level
        raise ConfigError(f"cannot read scenario file {path}: TOML nested too deeply to read") from None
    try:
        scenarios = build(ScenarioFile, data).scenario
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from e
    if not scenarios:
        raise ConfigError(f"{path}: no [[scenario]] tables")
    for index, scenario in enumerate(scenarios):
        check(scenario, f"{path}: scenario[{index}]")
    return list(scenarios)


def check(scenario: Scenario, where: str = "") -> None:
    """Refuses what a scenario names but its transport would not use, and generation shapes below one token.
    ``where``: the scenario's place in its file; empty for one made from flags (the command's own name already
    heads argparse's error line)."""
    where = f"{where}: " if where else ""
    given = [name for name in GENERATIVE_DEFAULTS if getattr(scenario, name) is not None]
    if scenario.transport != "openai" and given:
        raise ConfigError(f"{where}{', '.join(given)} apply only to transport openai, "
                          f"not {scenario.transport}")
    for name in ("prompt_tokens", "output_tokens"):
        value = getattr(scenario, name)
        if value is not None and value < 1:
            raise ConfigError(f"{where}{name} must be at least 1, found {value}")
    if not scenario.duration_s > 0:  # nothing measured is no figure: a table of zeros would read as one
        raise ConfigError(f"{where}the duration must be more than 0 s, found {scenario.duration_s}")
    if not scenario.warmup_s >= 0:
        raise ConfigError(f"{where}the warm-up must be 0 s or more, found {scenario.warmup_s}")
    if any(level < 1 for level in scenario.concurrency) or not scenario.concurrency:
        raise ConfigError(f"{where}concurrency levels must be at least 1, found {list(scenario.concurrency)}")
