"""Configuration: nested dataclasses, YAML files and dotted command-line overrides.

Every acmrl command takes ``--config file.yaml`` plus overrides such as ``model.dtype=bfloat16``.
The YAML file and the overrides are merged into the command's dataclass and checked *before* any
model loads: unknown keys, wrong types and impossible values raise :class:`ConfigError` with one
line that names the field and what it accepts.

Each field documents itself through ``field(metadata={"help": ...})``; range checks live in the
same metadata (``"min"``, ``"max"``) so that the declaration is the one place to read. A dataclass
may add cross-field checks in a ``check(self) -> None`` method that raises ``ConfigError``.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import types
import typing
from pathlib import Path
from typing import Any, Literal, TypeVar, get_args, get_origin, get_type_hints

import yaml

T = TypeVar("T")


class ConfigError(ValueError):
    """A configuration value is unknown, of the wrong type, or out of range."""


def option(default: Any, help: str, **checks: Any) -> Any:
    """A dataclass field with its help text and optional ``min``/``max`` bounds.

    Mutable defaults (lists, dicts) are copied per instance.
    """
    meta = {"help": help, **checks}
    if isinstance(default, list | dict):
        return dataclasses.field(default_factory=lambda: type(default)(default), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def section(cls: type, help: str, **defaults: Any) -> Any:
    """A nested dataclass field with its help text; ``defaults`` override the section's own
    defaults for this command (a YAML file or override still wins)."""
    return dataclasses.field(
        default_factory=lambda: cls(**defaults), metadata={"help": help, "defaults": defaults}
    )


# ---------------------------------------------------------------------------------------------
# building a dataclass from plain data


def _describe(tp: Any) -> str:
    origin = get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in get_args(tp))
    if origin in (types.UnionType, typing.Union):
        return " or ".join(_describe(a) for a in get_args(tp))
    if origin is list:
        (inner,) = get_args(tp) or (Any,)
        return f"a list, each item {_describe(inner)}"
    if origin is dict:
        return "a mapping"
    if tp is type(None):
        return "null"
    if dataclasses.is_dataclass(tp):
        return "a mapping of its fields"
    return {int: "an integer", float: "a number", str: "a string", bool: "true or false"}.get(
        tp, getattr(tp, "__name__", str(tp))
    )


_FLOAT = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")


def _convert(value: Any, tp: Any, where: str) -> Any:
    """Check ``value`` against the annotation ``tp`` and convert it (dicts into dataclasses)."""
    origin = get_origin(tp)
    if tp is Any:
        return value
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: got {value!r}, expected {_describe(tp)}")
        return _build(tp, value, where + ".")
    if origin in (types.UnionType, typing.Union):
        args = get_args(tp)
        if value is None and type(None) in args:
            return None
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _convert(value, arg, where)
            except ConfigError:
                pass
        raise ConfigError(f"{where}: got {value!r}, expected {_describe(tp)}")
    if origin is Literal:
        if not any(value == a and type(value) is type(a) for a in get_args(tp)):
            raise ConfigError(f"{where}: got {value!r}, expected {_describe(tp)}")
        return value
    if origin is list:
        (inner,) = get_args(tp) or (Any,)
        if not isinstance(value, list):
            raise ConfigError(f"{where}: got {value!r}, expected {_describe(tp)}")
        return [_convert(v, inner, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: got {value!r}, expected {_describe(tp)}")
        _, inner = get_args(tp) or (str, Any)
        return {str(k): _convert(v, inner, f"{where}.{k}") for k, v in value.items()}
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: got {value!r}, expected true or false")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: got {value!r}, expected an integer")
        return value
    if tp is float:
        if isinstance(value, str) and _FLOAT.fullmatch(value.strip()):
            # YAML 1.1 reads 5e-5 (no dot) as a string; it is a number to anyone writing it
            return float(value)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{where}: got {value!r}, expected a number")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: got {value!r}, expected a string")
        return value
    if tp is Path:
        if not isinstance(value, str | Path):
            raise ConfigError(f"{where}: got {value!r}, expected a path")
        return Path(value)
    raise TypeError(f"config field {where} has an unsupported annotation {tp!r}")


def _check_bounds(f: dataclasses.Field, value: Any, where: str) -> None:
    lo, hi = f.metadata.get("min"), f.metadata.get("max")
    if value is None or not isinstance(value, int | float):
        return
    if lo is not None and value < lo:
        raise ConfigError(f"{where}: got {value!r}, must be >= {lo}")
    if hi is not None and value > hi:
        raise ConfigError(f"{where}: got {value!r}, must be <= {hi}")


def _build(cls: type[T], data: dict[str, Any], prefix: str = "") -> T:
    hints = get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = [k for k in data if k not in fields]
    if unknown:
        key = unknown[0]
        close = difflib.get_close_matches(str(key), list(fields), n=1)
        hint = f" (did you mean '{prefix}{close[0]}'?)" if close else ""
        raise ConfigError(
            f"unknown key '{prefix}{key}'{hint}; valid keys here: "
            + ", ".join(prefix + name for name in fields)
        )
    kwargs = {}
    for name, value in data.items():
        where = prefix + name
        if isinstance(value, dict) and fields[name].metadata.get("defaults"):
            value = {**fields[name].metadata["defaults"], **value}
        converted = _convert(value, hints[name], where)
        _check_bounds(fields[name], converted, where)
        kwargs[name] = converted
    try:
        obj = cls(**kwargs)
    except TypeError as exc:  # a required field is missing
        raise ConfigError(f"{prefix.rstrip('.') or cls.__name__}: {exc}") from None
    # defaults are checked too, so a bad default in code cannot hide
    for name, f in fields.items():
        if name not in kwargs:
            _check_bounds(f, getattr(obj, name), prefix + name)
    check = getattr(obj, "check", None)
    if callable(check):
        check()
    return obj


# ---------------------------------------------------------------------------------------------
# YAML + overrides


def parse_override(text: str) -> tuple[list[str], Any]:
    """Split ``a.b.c=value`` into its key path and a YAML-parsed value.

    >>> parse_override("model.dtype=bfloat16")
    (['model', 'dtype'], 'bfloat16')
    >>> parse_override("rollout.samples=4")
    (['rollout', 'samples'], 4)
    """
    key, sep, raw = text.partition("=")
    if not sep or not key or any(not part for part in key.split(".")):
        raise ConfigError(f"override {text!r} is not of the form key.path=value")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as exc:
        raise ConfigError(f"override {text!r}: the value is not valid YAML ({exc})") from None
    return key.split("."), value


def _set_path(data: dict[str, Any], path: list[str], value: Any) -> None:
    node = data
    for i, part in enumerate(path[:-1]):
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(
                f"override {'.'.join(path)}: '{'.'.join(path[: i + 1])}' is not a section"
            )
        node = child
    node[path[-1]] = value


def read_yaml(path: str | Path) -> dict[str, Any]:
    """Read a YAML mapping; a missing file or a non-mapping is a ConfigError."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file {str(p)!r} does not exist")
    try:
        data = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {str(p)!r} is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {str(p)!r} must hold a mapping at the top level")
    return data


def load_config(cls: type[T], path: str | Path | None = None, overrides: list[str] = ()) -> T:
    """Build ``cls`` from an optional YAML file plus dotted overrides, validating everything."""
    data = read_yaml(path) if path is not None else {}
    for text in overrides:
        key_path, value = parse_override(text)
        _set_path(data, key_path, value)
    return _build(cls, data)


def to_dict(cfg: Any) -> dict[str, Any]:
    """Plain-data view of a config (for logging and for writing next to outputs)."""

    def plain(v: Any) -> Any:
        if isinstance(v, Path):
            return str(v)
        if isinstance(v, list):
            return [plain(x) for x in v]
        if isinstance(v, dict):
            return {k: plain(x) for k, x in v.items()}
        return v

    return {k: plain(v) for k, v in dataclasses.asdict(cfg).items()}


def field_help(cls: type) -> dict[str, str]:
    """Dotted field name -> help text, for every field of ``cls`` and its sections."""
    out: dict[str, str] = {}
    hints = get_type_hints(cls)
    for f in dataclasses.fields(cls):
        out[f.name] = f.metadata.get("help", "")
        if dataclasses.is_dataclass(hints[f.name]):
            for sub, text in field_help(hints[f.name]).items():
                out[f"{f.name}.{sub}"] = text
    return out


# ---------------------------------------------------------------------------------------------
# the sections shared by commands

DEFAULT_MODEL = "smollm2-135m-instruct"


@dataclasses.dataclass
class ModelConfig:
    """Which model to load and how."""

    name: str = option(
        DEFAULT_MODEL,
        "the embedded default 'smollm2-135m-instruct' (converted from its GGUF file on first use), "
        "a local Hugging Face folder, or a hub id (needs network or a warm HF cache)",
    )
    dtype: Literal["float32", "bfloat16", "float16"] = option(
        "float32", "weights and compute dtype; float32 keeps cache reuse exact on CPU"
    )
    device: str = option("auto", "'auto' (cuda if available, else cpu), 'cpu', 'cuda' or 'cuda:N'")
    attn_implementation: Literal["auto", "eager", "sdpa", "flash_attention_2"] = option(
        "auto",
        "attention kernel (transformers' attn_implementation); auto: transformers' choice "
        "(sdpa where supported); flash_attention_2 needs the flash-attn package and a GPU",
    )
    threads: int | None = option(None, "CPU threads for torch; null keeps torch's default", min=1)
    keep_freed_memory: bool = option(
        True,
        "on a CPU with glibc, keep freed heap memory in the process for reuse instead of "
        "returning it to the system and faulting it in anew (with mmap_threshold_mb null: "
        "every allocation from the heap; SFT steps 1.07x faster; docs/train.md); false keeps "
        "glibc's trimming",
    )
    malloc_trim_every: int | None = option(
        4,
        "training on a CPU with glibc: give the heap's freed memory back to the system "
        "(malloc_trim) every N optimiser steps; a kept heap that the steps' ever-different "
        "tensor sizes fragment otherwise grows step after step (SFT: 10.4 GB by step 245); "
        "null: never",
        min=1,
    )
    mmap_threshold_mb: float | None = option(
        32.0,
        "on a CPU with glibc, give each allocation of at least this many MiB its own mapping, "
        "returned to the system when freed (a fixed M_MMAP_THRESHOLD; the largest glibc "
        "allows is 32): a training step's attention scores then leave no hole in the heap "
        "(SFT peak 6.43 GB against 7.26 over 48 steps; the chain demo's peak 9.4 GB against 10.2, "
        "SFT 11% slower); 1 with keep_freed_memory false gives "
        "the lowest peak, SFT 1.4x slower (docs/train.md); null: glibc's own threshold, or "
        "everything from the heap with keep_freed_memory",
        min=0.0625,
        max=32,
    )

    def check(self) -> None:
        if not self.name.strip():
            raise ConfigError("model.name: must not be empty")
        if not re.fullmatch(r"auto|cpu|mps|cuda(:\d+)?", self.device):
            raise ConfigError(
                f"model.device: got {self.device!r}, expected 'auto', 'cpu', 'mps', 'cuda' or 'cuda:N'"
            )


@dataclasses.dataclass
class SamplingConfig:
    """How completions are sampled."""

    max_new_tokens: int = option(128, "most tokens generated per model call", min=1)
    temperature: float = option(0.0, "softmax temperature; 0 means greedy decoding", min=0.0)
    top_p: float = option(1.0, "nucleus sampling mass, in (0, 1]", min=0.0, max=1.0)
    seed: int = option(0, "random seed for sampling", min=0)
    stop: list[str] = option([], "strings that end a completion when generated")

    def check(self) -> None:
        if self.top_p <= 0.0:
            raise ConfigError(f"sampling.top_p: got {self.top_p}, must be in (0, 1]")


@dataclasses.dataclass
class GenerateConfig:
    """`acmrl generate`: one chat completion from a model, to check that it loads and runs."""

    model: ModelConfig = section(ModelConfig, "the model to run")
    sampling: SamplingConfig = section(SamplingConfig, "sampling parameters")
    system_prompt: str | None = option(None, "an optional system message before the prompt")


@dataclasses.dataclass
class AgentConfig:
    """The agent loop and its context management (the arms of docs/design.md)."""

    max_turns: int = option(30, "policy turns before an episode ends 'max_turns'", min=1)
    max_context_tokens: int | None = option(
        None, "budget on the fully rendered model input; null takes the environment's", min=64
    )
    summary_threshold: float = option(
        0.7,
        "summary arm: the monitor summarises when the input reaches this share of the budget",
        min=0.05,
        max=1.0,
    )
    summary_max_tokens: int = option(256, "most tokens a summary may have", min=8)
    summary_format: Literal["notes", "structured"] = option(
        "notes",
        "the summariser's memory: notes (first-person fact list) or structured (the ACM "
        "reference's 'Knowledge state' and 'Thoughts' sections)",
    )
    summariser_prompt: str | None = option(
        None,
        "your own summariser prompt ({task} and {steps} are filled in); null: summary_format's",
    )
    querier_prompt: str | None = option(
        None,
        "your own query_memory prompt ({summary_id}, {steps}, {query} filled in); null: acmrl's",
    )
    query_max_tokens: int = option(128, "most tokens a query_memory extract may have", min=8)
    output_weight: float = option(
        1.0, "price of one generated token in uncached input tokens, for Compaction Cost", min=0.0
    )
    context_signal: bool = option(
        False, "append the current context size to the last observation of each turn"
    )
    harness_hint: bool = option(
        False, "acm/evolve: tell the agent to compact when the context nears the budget"
    )
    hint_threshold: float = option(
        0.8, "share of the budget at which the hint appears", min=0.05, max=1.0
    )
    evolve_time_ms: int = option(250, "evolve: CPU-time limit of one run", min=1)
    evolve_heap_mb: int = option(16, "evolve: JavaScript heap limit", min=1)
    evolve_prompt: Literal["full", "brief", "none"] = option(
        "full",
        "evolve: how much of the State the system prompt and the tool describe: 'full' the "
        "item types and the rules, 'brief' the item shapes in one line, 'none' only that the "
        "context is an array of items (a trained student; docs/rollout.md)",
    )
    evolve_keep_code: bool = option(
        True,
        "evolve: a program's text stays in the context after it ran; false replaces it with a "
        "one-line stub (its receipt stays) so that later inputs do not carry it",
    )
    repeat_rule: bool = option(
        False,
        "every arm: an environment call identical to an earlier one of the episode whose result "
        "is still in the context is not run again; a short observation says so (a result that "
        "was compacted or summarised away is read again; reports state when this is on)",
    )
    text_call_rule: bool = option(
        False,
        "every arm: a reply with no tool call that writes one as text, name({...}) for one of "
        "the arm's tools, is a malformed call (an error observation, the episode goes on), not "
        "the final answer (reports state when this is on)",
    )
    on_overflow: Literal["fail", "force_answer"] = option(
        "fail",
        "every arm, when the next input exceeds the budget: fail (the episode ends 'overflow'), "
        "or force_answer (the oldest steps are dropped until the input fits and the model is "
        "asked once for its final answer, as the ACM reference does); reports state the rule",
    )
    force_compaction: float | None = option(
        None,
        "acm: the harness compacts (manage_context, summarised by the summariser) when the input "
        "reaches this share of the budget and steps were added since the last summary; the "
        "reference uses 0.95; null: never",
        min=0.05,
        max=1.0,
    )

    def check(self) -> None:
        for name, need in (
            ("summariser_prompt", ("{task}", "{steps}")),
            ("querier_prompt", ("{summary_id}", "{steps}", "{query}")),
        ):
            text = getattr(self, name)
            if text is not None:
                missing = [p for p in need if p not in text]
                if missing:
                    raise ConfigError(
                        f"agent.{name}: the prompt must contain {', '.join(need)}; "
                        f"missing {', '.join(missing)}"
                    )


ARMS = ("react", "summary", "memory", "acm", "evolve")


def check_arms(arms: list[str]) -> None:
    """Every arm known, at least one."""
    if not arms or any(a not in ARMS for a in arms):
        raise ConfigError(f"arms: got {arms}, each must be one of {', '.join(ARMS)}")


@dataclasses.dataclass
class JudgeConfig:
    """An LLM judge of the answers (the ``judge`` metric; corpus_qa's browsecomp-plus preset
    scores with it): any engine, asked whether the answer matches the reference."""

    model: str | None = option(
        None, "the judge model (a local folder or hub id); null: no judge (the env's metric)"
    )
    base_urls: list[str] = option(
        [], "OpenAI-compatible servers of the judge; empty: run it with transformers here"
    )
    served_model: str | None = option(None, "the judge's name on those servers; null: model")
    max_tokens: int = option(24, "most tokens of a verdict reply", min=4)


@dataclasses.dataclass
class EnvConfig:
    """Which tasks to run."""

    name: str = option(
        "kb_search", "environment: kb_search, code_nav, corpus_qa, or package.module:Class"
    )
    options: dict[str, Any] = option(
        {"preset": "small", "seed": 0}, "keyword options for acmrl.envs.load (presets are options)"
    )
    split: str = option("eval", "the split whose tasks run")
    limit: int | None = option(None, "run only the first N tasks of the split", min=1)
    judge: JudgeConfig = section(JudgeConfig, "an LLM judge of the answers (metric=judge)")


@dataclasses.dataclass
class EngineConfig:
    """The generation backend."""

    kind: Literal["hf", "openai", "vllm", "oracle"] = option(
        "hf",
        "hf: transformers in this process; openai: OpenAI-compatible servers (vllm serve, "
        "acmrl serve); vllm: vLLM's offline engine in this process (pip install acmrl[vllm]); "
        "oracle (acmrl eval only): the teacher's expert plan plays every arm, so Table 2 "
        "compares the arms' context handling with the policy held fixed",
    )
    reuse_cache: bool = option(True, "keep each session's KV cache across turns (hf)")
    share_prefix: bool = option(
        True,
        "hf: a session with little of its own to reuse (a first turn, a helper call) borrows "
        "the longest prefix another session has read, e.g. the system prompt and tools; outputs "
        "and reported reuse are unchanged (benchmarks/rollout_throughput.py)",
    )
    max_batch: int = option(8, "most requests decoded together (hf)", min=1)
    base_urls: list[str] = option(
        [], "openai: server URLs, e.g. http://node1:8000; sessions keep to one"
    )
    served_model: str | None = option(
        None, "openai: the model name the servers know; null: model.name"
    )
    api_key_env: str = option(
        "OPENAI_API_KEY", "openai: environment variable holding the API key, if any"
    )
    timeout_s: float = option(120.0, "openai: seconds to wait for one completion", min=0.1)
    max_retries: int = option(4, "openai: retries per server with exponential backoff", min=0)
    gpu_memory_utilization: float | None = option(
        None,
        "vllm: share of GPU memory vLLM may take; null: 0.85 alone (rollout, eval), 0.3 beside "
        "a GRPO trainer (the update needs the rest)",
        min=0.05,
        max=1.0,
    )
    vllm_sleep: bool = option(
        True,
        "vllm beside a GRPO trainer on CUDA: sleep mode during the update (its weights go to "
        "CPU memory and its KV cache is freed), woken for the next rollouts",
    )
    max_model_len: int | None = option(None, "vllm: longest sequence; null: the model's", min=64)
    max_lora_rank: int = option(64, "vllm: largest adapter rank it serves", min=1)
    group_port: int = option(
        51216,
        "openai, GRPO with full fine-tuning: the NCCL port of the first server's weight-transfer "
        "group (TRL's VLLMClient; the next servers take the following ports)",
        min=1,
        max=65535,
    )

    def check(self) -> None:
        if self.kind == "openai" and not self.base_urls:
            raise ConfigError("engine.base_urls: the openai engine needs at least one server URL")


@dataclasses.dataclass
class RolloutConfig:
    """`acmrl rollout`: run a student over tasks x arms x samples and write trajectories."""

    model: ModelConfig = section(ModelConfig, "the student model")
    sampling: SamplingConfig = section(SamplingConfig, "sampling of the student's turns")
    agent: AgentConfig = section(AgentConfig, "the agent loop and context management")
    env: EnvConfig = section(EnvConfig, "the tasks")
    engine: EngineConfig = section(EngineConfig, "the generation backend")
    arms: list[str] = option(list(ARMS), f"arms to run: {', '.join(ARMS)}")
    samples: int = option(1, "episodes per task and arm", min=1)
    seed: int = option(0, "base seed of the episodes' sampling", min=0)
    concurrency: int = option(8, "episodes in flight at once (their calls are batched)", min=1)
    output: str = option("runs/rollout/trajectories.jsonl", "JSONL file, one line per episode")
    tensorboard: bool = option(True, "log per-arm metrics to TensorBoard next to the output")

    def check(self) -> None:
        check_arms(self.arms)


@dataclasses.dataclass
class ServeConfig:
    """`acmrl serve`: an OpenAI-compatible completions server for a model (transformers engine)."""

    model: ModelConfig = section(ModelConfig, "the model to serve")
    engine: EngineConfig = section(EngineConfig, "batching and cache reuse")
    host: str = option("127.0.0.1", "address to listen on (0.0.0.0 for every interface)")
    port: int = option(8000, "port; 0 picks a free one (printed at start)", min=0, max=65535)
    allow_adapter_loading: bool = option(
        False,
        "accept POST /v1/load_lora_adapter (vLLM's runtime adapter API; paths on this "
        "machine): what GRPO with engine.kind=openai uses to sync its adapter",
    )
    max_adapters: int = option(2, "runtime adapters kept at once (the oldest goes first)", min=1)


@dataclasses.dataclass
class TeacherConfig:
    """Who assesses the student's trajectories."""

    kind: Literal["oracle", "llm"] = option(
        "oracle", "oracle: the environment's ground truth; llm: a model asked for JSON"
    )
    pressure: float = option(
        0.6,
        "oracle: inject a compaction once the input reaches this share of the budget",
        min=0.05,
        max=1.0,
    )
    pressure_spread: list[float] = option(
        [],
        "demonstrations: [lo, hi] to draw each task's compaction point from (seeded by the "
        "task); empty: pressure for all",
    )
    late_share: float = option(
        0.0,
        "demonstrations: the share of tasks (drawn per task, seeded) whose teacher compacts only "
        "when the next result would not fit, never by pressure alone: it answers without "
        "compacting once nothing more is to be read, where the others compact first (two "
        "timings for GRPO to choose between)",
        min=0.0,
        max=1.0,
    )
    policy: Literal["expert", "best"] = option(
        "expert",
        "demonstrations: expert, the plan of every arm alike (compacting at the pressure); best, "
        "each arm's own best scripted policy (acmrl audit's ceiling): it answers once the "
        "answer's evidence is in view (a react demonstration uses every shortcut the "
        "observations allow) and brings a missing detail back its arm's way (acm: query_memory); "
        "its answer turn cites the sentence that states the answer where the environment names "
        "one, so teacher.answers applies to expert demonstrations only",
    )
    switch_arms: bool = option(
        True,
        "oracle: inject manage_context into a react run that nears the budget, as the ACM "
        "reference does; the resumed episode switches to the acm arm at the edit (system prompt "
        "and tools rebuilt, earlier turns replayed)",
    )
    answers: Literal["plain", "reasoned", "cited"] = option(
        "plain",
        "demonstrations and corrections: how the answer turn's rationale reads. plain: 'I have "
        "read everything the question depends on ...'; reasoned: it restates the fact the "
        "answer rests on and what it looks for (kb_search: the birth year, then 'the event held "
        "in <town> in <year>'), never the answer; cited: where a document in view states the "
        "answer (kb_search: the event took place in the town and year asked for), it cites "
        "that sentence and the document's id, so that answering now depends on what was read",
    )
    max_attempts: int = option(
        3, "llm: tries per trajectory before the assessment is failed", min=1
    )
    model: str | None = option(
        None, "llm: the teacher model (a local folder or hub id); null: the student model"
    )
    base_urls: list[str] = option(
        [], "llm: OpenAI-compatible servers of the teacher; empty: run it with transformers here"
    )
    served_model: str | None = option(None, "llm: the teacher's name on those servers")
    max_tokens: int = option(400, "llm: most tokens of one assessment reply", min=16)
    temperature: float = option(
        0.0,
        "llm: sampling temperature of the teacher's replies; 0: greedy (a retry then differs "
        "only by the errors it is shown)",
        min=0.0,
    )
    structured_output: bool = option(
        True,
        "llm: send the reply's JSON schema as OpenAI's response_format, which vLLM and acmrl "
        "serve enforce (a reply that always parses); false for a server without it",
    )
    topk: int = option(
        0, "top-k logprobs of a teacher model at each target position of the samples; 0: off", min=0
    )
    topk_model: str | None = option(
        None, "model for those logprobs (transformers); null: teacher.model, else the student"
    )


@dataclasses.dataclass
class WeightsConfig:
    """SFT weight of each target token (docs/train.md, "What SFT is taught"). Turns replayed
    before a teacher's edit are never targets."""

    teacher: float = option(1.0, "the teacher's edited turn of a resumed run", min=0.0)
    after_success: float = option(
        1.0, "student turns after an edit (and a student's own run) when the run succeeds", min=0.0
    )
    after_failure: float = option(
        0.0, "the same turns when the run fails (a partial score interpolates)", min=0.0
    )
    demo_success: float = option(1.0, "every turn and note of a successful demonstration", min=0.0)
    demo_failure: float = option(0.0, "the same for a failed demonstration; 0 drops it", min=0.0)


@dataclasses.dataclass
class AnnotateConfig:
    """`acmrl annotate`: student runs with and without context tools, teacher edits, resumes,
    and a Hugging Face dataset of trajectories and per-turn training samples."""

    model: ModelConfig = section(ModelConfig, "the student model")
    sampling: SamplingConfig = section(SamplingConfig, "sampling of the student's own runs")
    agent: AgentConfig = section(AgentConfig, "the agent loop and context management")
    env: EnvConfig = section(EnvConfig, "the tasks")
    engine: EngineConfig = section(EngineConfig, "the student's generation backend")
    teacher: TeacherConfig = section(TeacherConfig, "the teacher")
    arms: list[str] = option(
        ["react", "acm"], "student arms per task: without and with context tools"
    )
    resumes: int = option(
        4, "student continuations from each valid edit (the ACM reference samples 4)", min=1
    )
    solve_filter: bool = option(
        True,
        "the reference's solve-count filter: a task whose every resume succeeds teaches "
        "nothing the student cannot already do, so its student runs and resumes are left out "
        "of the dataset (its demonstrations stay); counted on the card as solved_dropped",
    )
    demonstrations: bool = option(
        False, "also record one oracle demonstration per task and arm (a warm start for SFT)"
    )
    student_tasks: int | None = option(
        None, "run the student (and edits, resumes) on the first N tasks only; null: all", min=0
    )
    resume_temperature: float = option(0.7, "sampling temperature of the continuations", min=0.0)
    seed: int = option(0, "base seed", min=0)
    concurrency: int = option(8, "student episodes in flight at once", min=1)
    output: str = option("runs/annotate", "folder: records, the dataset, parquet files, the card")
    shard: str = option("0/1", "this job's part of the tasks, i/n (tasks i, i+n, i+2n, ...)")
    build_dataset: bool = option(
        True, "build the dataset when this shard is done (false in a job array: the merge does)"
    )
    weights: WeightsConfig = section(
        WeightsConfig, "SFT weights of the samples (a rerun rebuilds the dataset with new ones)"
    )

    def check(self) -> None:
        check_arms(self.arms)
        spread = self.teacher.pressure_spread
        if spread and not (len(spread) == 2 and 0.05 <= spread[0] <= spread[1] <= 1.0):
            raise ConfigError(
                f"teacher.pressure_spread: got {spread}, expected [lo, hi] with "
                "0.05 <= lo <= hi <= 1, e.g. [0.4, 0.9]"
            )
        m = re.fullmatch(r"(\d+)/(\d+)", self.shard)
        if not m or not 0 <= int(m.group(1)) < int(m.group(2)):
            raise ConfigError(f"shard: got {self.shard!r}, expected i/n with 0 <= i < n, e.g. 0/4")


@dataclasses.dataclass
class LoraConfig:
    """Low-rank adapters (peft); off means full fine-tuning."""

    enabled: bool = option(True, "train LoRA adapters instead of all weights")
    r: int = option(16, "adapter rank", min=1)
    alpha: int = option(32, "adapter scaling numerator (scale = alpha / r)", min=1)
    dropout: float = option(
        0.0, "dropout on the adapter input; 0 keeps resumes exact", min=0.0, max=1.0
    )
    target_modules: list[str] = option(
        ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        "linear layers that get adapters",
    )
    top_layers: int | None = option(
        None,
        "adapt only the last N decoder layers (null: all): the backward pass stops below them",
        min=1,
    )


@dataclasses.dataclass
class OptimConfig:
    """Optimiser, schedule and batching."""

    lr: float = option(2e-4, "peak learning rate (LoRA; use ~1e-5 for full fine-tuning)", min=0.0)
    weight_decay: float = option(0.0, "AdamW weight decay", min=0.0)
    warmup_steps: int = option(0, "linear warm-up steps", min=0)
    schedule: Literal["constant", "cosine"] = option("cosine", "decay after warm-up")
    max_steps: int = option(100, "optimiser steps", min=1)
    batch_tokens: int = option(
        4096, "tokens per batch (padded samples are packed up to this)", min=64
    )
    max_grad_norm: float = option(1.0, "gradient clipping; 0 disables", min=0.0)
    mixed_precision: Literal["auto", "no", "bf16", "fp16"] = option(
        "auto",
        "autocast the forward passes (accelerate). auto: the launcher's setting (accelerate "
        "launch --mixed_precision / its config file), else bf16 on a CUDA GPU that has it, else "
        "no; an explicit value that contradicts the launcher's is refused. bf16 is ~1.4x "
        "faster on CPUs with AMX",
    )
    gradient_checkpointing: bool = option(
        False, "recompute activations in the backward pass (less memory, ~30% more compute)"
    )
    share_prefix: bool = option(
        True,
        "SFT and GRPO: batch samples that start alike (same system prompt and tools) and read "
        "their common prefix once per batch; the prefix counts once against batch_tokens, so a "
        "batch holds more samples for the same work (benchmarks/sft_learning_speed.py, "
        "benchmarks/grpo_update.py). One process "
        "only (under DDP the extra forward pass would break its one-forward-per-backward "
        "contract); off with gradient_checkpointing",
    )


@dataclasses.dataclass
class SFTConfig:
    """`acmrl train sft`: supervised fine-tuning on a teacher-annotated dataset."""

    model: ModelConfig = section(ModelConfig, "the student to fine-tune")
    dataset: str | list[str] = option(
        "runs/annotate/dataset",
        "a dataset written by acmrl annotate (load_from_disk), or a list of them trained as one "
        "(demonstrations and the teacher rounds on the trained student)",
    )
    lora: LoraConfig = section(LoraConfig, "adapters")
    optim: OptimConfig = section(OptimConfig, "optimisation")
    kl_coef: float = option(
        0.0, "weight of the forward KL to the stored teacher top-k logprobs (0: off)", min=0.0
    )
    min_weight: float = option(0.0, "skip samples whose weight is at or below this", min=0.0)
    max_len: int = option(4096, "samples longer than this are cut (their targets too)", min=16)
    seed: int = option(0, "data order and initialisation seed", min=0)
    output: str = option("runs/sft", "folder: checkpoints, the final model, TensorBoard logs")
    save_every: int = option(50, "checkpoint every N steps (and at the end)", min=1)
    save_total_limit: int | None = option(
        None, "keep only the newest N checkpoints (null: all)", min=1
    )
    log_with: list[str] = option(["tensorboard"], "trackers: tensorboard, wandb, mlflow")


@dataclasses.dataclass
class RewardConfig:
    """Reward = success x w_success - each cost x its weight (acmrl/rewards)."""

    success: float = option(1.0, "weight of task success (the environment's score)")
    compaction_cost: float = option(
        0.1, "weight of the summed Compaction Cost in units of the budget", min=0.0
    )
    malformed: float = option(0.01, "penalty per malformed tool call", min=0.0)
    compress_loops: float = option(
        0.05, "penalty per compaction with no environment call since the last one", min=0.0
    )
    failed_edits: float = option(
        0.01, "penalty per refused context edit (an evolve whose code or result failed)", min=0.0
    )
    resource_use: float = option(
        0.0,
        "weight of (uncached input + generated tokens x output weight) / budget; 0: off",
        min=0.0,
    )
    success_threshold: float | None = option(
        None, "score at or above which success is 1 (else 0); null keeps the raw score"
    )


@dataclasses.dataclass
class DecisionConfig:
    """GRPO's decision groups (acmrl/train/decisions.py): groups that branch at the state where
    the policy chose whether to compact, so the choice is credited, not the whole episode."""

    share: float = option(
        0.0,
        "share of each step's groups (task x arm) that branch at a decision instead of being "
        "whole episodes (0: whole episodes only)",
        min=0.0,
        max=1.0,
    )
    context_share: float = option(
        0.7,
        "a policy turn is a decision state when it compacts (a manage_context or evolve call) "
        "or its input is above this share of the budget",
        min=0.0,
        max=1.0,
    )
    credit: Literal["decision", "continuation"] = option(
        "decision",
        "which tokens of a branch get its advantage: the decision turn's (and the summaries or "
        "extracts it triggered), or those and every later turn's",
    )
    source: Literal["scout", "member"] = option(
        "scout",
        "the episode a decision state is drawn from: a scout that is not trained (its group is "
        "G fresh branches, or G fresh whole episodes when it has no decision state), or a member "
        "of its group beside G - 1 branches (cheaper, but the state was chosen by what that "
        "episode did there, so its reward is a biased sample: at a state drawn because it "
        "compacted, its action is compaction by construction)",
    )


@dataclasses.dataclass
class GRPOConfig:
    """`acmrl train grpo`: online GRPO on task success minus compaction cost."""

    model: ModelConfig = section(
        ModelConfig, "the policy to train (a model, or the adapter folder an SFT run wrote)"
    )
    sampling: SamplingConfig = section(
        SamplingConfig, "sampling of the rollouts", temperature=1.0, stop=["</tool_call>"]
    )
    agent: AgentConfig = section(AgentConfig, "the agent loop and context management")
    env: EnvConfig = section(EnvConfig, "the training tasks", split="train")
    engine: EngineConfig = section(EngineConfig, "the rollout backend (hf: shares the weights)")
    arms: list[str] = option(["acm"], "arms rolled out; each task x arm is one group")
    lora: LoraConfig = section(LoraConfig, "adapters")
    optim: OptimConfig = section(OptimConfig, "optimisation (max_steps: GRPO steps)")
    reward: RewardConfig = section(RewardConfig, "reward weights")
    group_size: int = option(8, "rollouts per task and arm (G)", min=2)
    tasks_per_step: int = option(4, "tasks per GRPO step (across all processes)", min=1)
    updates_per_step: int = option(
        1, "optimiser steps on each batch of rollouts (mu; > 1 makes the clip matter)", min=1
    )
    scale_advantages: bool = option(False, "divide advantages by the group's reward std")
    clip_eps: float = option(0.2, "importance-ratio clip range", min=0.0)
    kl_coef: float = option(
        0.0, "weight of the KL to the reference (the start model; adapter off under LoRA)", min=0.0
    )
    old_logprobs: Literal["recompute", "engine"] = option(
        "recompute", "old-policy logprobs: a forward pass of the trainer, or the engine's"
    )
    train_helpers: bool = option(
        True, "also train the summariser and querier calls (how to compact, not only when)"
    )
    skip_flat_groups: bool = option(
        True, "drop groups whose rewards are all equal (zero advantage) unless kl_coef > 0"
    )
    decisions: DecisionConfig = section(DecisionConfig, "groups that branch at a decision")
    aggregation: Literal["token", "segment"] = option(
        "token",
        "how the loss averages: over every target token of the step (a segment weighs by its "
        "tokens), or per segment (a segment's token mean, times its segment weight)",
    )
    segment_weight: Literal["one", "inverse"] = option(
        "one",
        "weight of each segment (a sample: the tokens of one unbroken context, or one summariser "
        "/ querier call): 1, or 1 / the number of segments of its episode (so under "
        "aggregation=segment every episode weighs the same however often it compacted)",
    )
    skip_failed_groups: bool = option(
        False,
        "drop groups in which no rollout succeeds: their rewards differ by costs only, which "
        "(std-scaled above all) would teach failing cheaply, e.g. overflowing before a compaction",
    )
    max_len: int = option(8192, "samples longer than this are cut (their targets too)", min=16)
    concurrency: int = option(32, "episodes in flight at once during a rollout phase", min=1)
    rollout_dtype: Literal["auto", "live", "bfloat16", "float32"] = option(
        "auto",
        "hf engine: live samples from the trained parameters themselves; a dtype samples from a "
        "merged copy in it, refreshed after every optimiser step; auto: bfloat16 where "
        "optim.mixed_precision is bf16, else live",
    )
    seed: int = option(0, "task order and sampling seed", min=0)
    output: str = option("runs/grpo", "folder: checkpoints, rollouts, final model, TensorBoard")
    save_every: int = option(10, "checkpoint every N steps (and at the end)", min=1)
    save_total_limit: int | None = option(
        None, "keep only the newest N checkpoints (null: all)", min=1
    )
    save_rollouts: bool = option(True, "append every rollout to rollouts-rank<i>.jsonl")
    log_with: list[str] = option(["tensorboard"], "trackers: tensorboard, wandb, mlflow")

    def check(self) -> None:
        check_arms(self.arms)
        if self.sampling.temperature <= 0:
            raise ConfigError(
                "sampling.temperature: GRPO needs sampling (> 0); greedy rollouts of a group "
                "are identical and carry no signal"
            )
        if self.engine.kind == "oracle":
            raise ConfigError(
                "engine.kind=oracle is the expert plan as a policy, for acmrl eval only; GRPO "
                "samples its own policy (hf, vllm or openai)"
            )
        if self.engine.kind == "vllm" and not self.lora.enabled:
            raise ConfigError(
                "engine.kind=vllm (colocated) syncs a LoRA adapter after every step; for full "
                "fine-tuning serve the model (engine.kind=openai against vllm serve: the full "
                "weights are streamed over NCCL, acmrl/train/weight_sync.py), enable lora, or "
                "use hf"
            )
        if self.engine.kind == "vllm" and self.lora.r > self.engine.max_lora_rank:
            raise ConfigError(
                f"lora.r={self.lora.r} exceeds engine.max_lora_rank={self.engine.max_lora_rank}"
            )


#: a training run's config: what build_model, start_run and the training loop read of it
#: (``model``, ``lora``, ``optim``, ``output``, ``save_every``, ``log_with``, ``seed``)
TrainConfig = SFTConfig | GRPOConfig


@dataclasses.dataclass
class ExportConfig:
    """`acmrl export`: a merged Hugging Face folder with its chat template and model card."""

    model: ModelConfig = section(
        ModelConfig, "the trained policy: an adapter folder (merged into its base) or a model"
    )
    arm: str = option("acm", "the arm the policy was trained for: its system prompt and tools")
    env: EnvConfig = section(EnvConfig, "the environment whose tools go into the card")
    agent: AgentConfig = section(AgentConfig, "the agent settings (the context budget)")
    eval_dir: str | None = option(
        None, "a folder written by acmrl eval; its report.md goes into the model card"
    )
    output: str = option("runs/export", "the exported folder (replaced atomically)")
    max_logit_diff: float = option(
        1e-3, "most the reloaded export's logits may differ from the trained model's", min=0.0
    )
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = option(
        "auto", "weights dtype of the export (auto: the trained model's)"
    )
    adapter_only: bool = option(
        False,
        "for an adapter policy: export the adapter (with its base's id in the card) instead of "
        "merged weights",
    )
    push_to_hub: bool = option(
        False, "upload the finished folder to the Hugging Face Hub (huggingface_hub, HF_TOKEN)"
    )
    hub_repo_id: str | None = option(None, "push_to_hub: the repository, e.g. user/acm-policy")
    hub_private: bool = option(True, "push_to_hub: create the repository private")

    def check(self) -> None:
        if self.arm not in ARMS:
            raise ConfigError(f"arm: got {self.arm!r}, must be one of {', '.join(ARMS)}")
        if self.push_to_hub and not self.hub_repo_id:
            raise ConfigError("push_to_hub needs hub_repo_id (e.g. hub_repo_id=user/acm-policy)")


@dataclasses.dataclass
class EvalConfig:
    """`acmrl eval`: a model per arm over an eval split; a report with intervals and plots."""

    model: ModelConfig = section(
        ModelConfig, "the model to evaluate (a folder, an adapter, an alias)"
    )
    sampling: SamplingConfig = section(
        SamplingConfig, "sampling (greedy by default)", stop=["</tool_call>"]
    )
    agent: AgentConfig = section(
        AgentConfig,
        "the agent loop and context management; an eval answers at an overflow (force_answer, "
        "the fair rule: an arm without context tools is asked for its answer, as the managing "
        "arms get to give one) unless told otherwise",
        on_overflow="force_answer",
    )
    env: EnvConfig = section(EnvConfig, "the tasks (the eval split by default)")
    engine: EngineConfig = section(EngineConfig, "the generation backend")
    arms: list[str] = option(list(ARMS), "arms to evaluate; react is the baseline of the deltas")
    samples: int = option(1, "episodes per task and arm (k > 1 adds pass@k)", min=1)
    seed: int = option(0, "base seed of the episodes' sampling", min=0)
    concurrency: int = option(8, "episodes in flight at once", min=1)
    output: str = option("runs/eval", "results folder: episodes, report.md/csv/json, plots")
    plots: bool = option(True, "write the PNG figures")
    report_only: bool = option(False, "rebuild the report from the episodes already in output")
    machine: str | None = option(None, "a description of the machine, printed in the report")

    def check(self) -> None:
        check_arms(self.arms)
        if self.samples > 1 and self.sampling.temperature <= 0:
            raise ConfigError(
                "samples > 1 needs sampling.temperature > 0: greedy samples are identical"
            )


# acmrl audit's trivial strategies (acmrl/teacher/ceiling.py): kb_search's, then code_nav's
TRIVIAL_STRATEGIES = (
    "first_result",
    "listed_title",
    "frequent",
    "random",
    "first_argument",
    "random_argument",
    "def_line",
)


@dataclasses.dataclass
class AuditConfig:
    """`acmrl audit`: what a task set admits before anything is trained: each arm's best
    scripted policy (its ceiling) and the trivial strategies, under the budget and overflow
    rule of the agent section."""

    model: ModelConfig = section(
        ModelConfig, "whose tokenizer renders the contexts and counts the budget (no weights load)"
    )
    agent: AgentConfig = section(
        AgentConfig, "the agent loop, budget and overflow rule", on_overflow="force_answer"
    )
    env: EnvConfig = section(EnvConfig, "the tasks (the eval split by default)")
    arms: list[str] = option(list(ARMS), "arms whose best scripted policy runs")
    trivial: list[str] = option(
        ["first_result", "listed_title", "frequent", "random"],
        "trivial strategies (react arm): first_result, listed_title, frequent, random; "
        "code_nav chain: first_argument, random_argument; code_nav trace: def_line too",
    )
    model_react: bool = option(
        False,
        "also run model.name (its weights) in react, greedy: what an agent not trained on the "
        "task reaches; always on when the environment has no expert plan (its ceilings cannot "
        "be scripted)",
    )
    model_tokens: int = option(256, "model_react: most tokens per turn", min=8)
    concurrency: int = option(16, "episodes in flight at once", min=1)
    output: str = option("runs/audit", "folder of episodes.jsonl, audit.json and audit.md")

    def check(self) -> None:
        check_arms(self.arms)
        unknown = [t for t in self.trivial if t not in TRIVIAL_STRATEGIES]
        if unknown:
            known = ", ".join(TRIVIAL_STRATEGIES)
            raise ConfigError(f"trivial: unknown strategies {unknown}; known: {known}")


@dataclasses.dataclass
class DemoConfig:
    """`acmrl demo`: tasks, baseline eval, annotation, SFT (then a teacher round and GRPO where the
    size has them), eval, export, on one machine."""

    size: Literal["smoke", "small", "default", "tiny", "long", "large"] = option(
        "default",
        "default: kb_search chain, SFT on acm's best demonstrations (about 50 min on a 2-core "
        "CPU with bf16); smoke: a pipeline check; small, tiny and long: kb_search tiny with a "
        "teacher round and GRPO (tiny: the former default; long: >= 50 held-out tasks, unseen "
        "worlds); large: GPU",
    )
    model: ModelConfig = section(ModelConfig, "the base model (the embedded SmolLM2 by default)")
    output: str = option("runs/demo", "folder of every stage; a rerun skips the finished stages")
    seed: int = option(0, "seed of the tasks and of every stage", min=0)
    precision: Literal["auto", "no", "bf16"] = option(
        "auto", "training autocast; auto: bf16 where the CPU (AMX/AVX512-BF16) or GPU has it"
    )
    machine: str | None = option(
        None, "a description of the machine for the reports; null: detected"
    )
    stop_after: str | None = option(
        None,
        "stop once this stage is done (e.g. annotate, to build on the demonstrations by hand); "
        "a rerun without it continues",
    )
    top_layers: int | None = option(
        None,
        "LoRA on the last N decoder layers only in SFT, the round's SFT and GRPO (0: all layers); "
        "null: the size's (15 of SmolLM2-135M's 30 for default and long, all for the others)",
        min=0,
    )
    answers: Literal["plain", "reasoned", "cited"] = option(
        "plain",
        "the teacher's answer rationale in the demonstrations and the round's corrections "
        "(teacher.answers; cited: the sentence of the document read that states the answer)",
    )


# `configs/<command>*.yaml` holds configs for that command (checked by the tests)
COMMAND_CONFIGS: dict[str, type] = {
    "generate": GenerateConfig,
    "rollout": RolloutConfig,
    "serve": ServeConfig,
    "annotate": AnnotateConfig,
    "sft": SFTConfig,
    "grpo": GRPOConfig,
    "export": ExportConfig,
    "eval": EvalConfig,
    "audit": AuditConfig,
    "demo": DemoConfig,
}


def config_class_for(path: str | Path) -> type:
    """The config class of a checked-in config file, from the command its file name starts with."""
    stem = Path(path).stem
    for command, cls in COMMAND_CONFIGS.items():
        if stem == command or stem.startswith(command + "_"):
            return cls
    raise ConfigError(f"{path}: file name must start with one of {sorted(COMMAND_CONFIGS)}")
