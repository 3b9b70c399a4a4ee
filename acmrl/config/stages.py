"""Each command's config (rollout, serve, annotate, SFT, GRPO, export, eval, audit, demo) and the
choice of one from a config file's name."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Literal

from acmrl.config.base import ConfigError, option, section
from acmrl.config.parts import (
    ARMS,
    DEFAULT_ARMS,
    AgentConfig,
    DecisionConfig,
    EngineConfig,
    EnvConfig,
    GenerateConfig,
    LoraConfig,
    ModelConfig,
    OptimConfig,
    RewardConfig,
    SamplingConfig,
    TeacherConfig,
    WeightsConfig,
    check_arms,
)


@dataclasses.dataclass
class RolloutConfig:
    """`acmrl rollout`: run a student over tasks x arms x samples and write trajectories."""

    model: ModelConfig = section(ModelConfig, "the student model")
    sampling: SamplingConfig = section(SamplingConfig, "sampling of the student's turns")
    agent: AgentConfig = section(AgentConfig, "the agent loop and context management")
    env: EnvConfig = section(EnvConfig, "the tasks")
    engine: EngineConfig = section(EngineConfig, "the generation backend")
    arms: list[str] = option(list(DEFAULT_ARMS), f"arms to run: {', '.join(ARMS)}")
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
    arms: list[str] = option(
        list(DEFAULT_ARMS),
        f"arms to evaluate ({', '.join(ARMS)}); react is the baseline of the deltas",
    )
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
