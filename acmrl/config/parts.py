"""The sections that several commands share: the model, its sampling, the agent, the
environment, the engine, the teacher, LoRA, the optimiser, the reward and GRPO's decision groups."""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Literal

from acmrl.config.base import ConfigError, option, section

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


ARMS = ("react", "summary", "memory", "acm", "evolve", "mask")
#: the arms a rollout or an eval runs unless told: every arm but ``mask``, the observation-masking
#: baseline, which is asked for by name (``acmrl audit`` plays every arm)
DEFAULT_ARMS = ("react", "summary", "memory", "acm", "evolve")


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
