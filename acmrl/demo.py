"""``acmrl demo``: the whole pipeline on the embedded default model, end to end, on a CPU.

Stages, each in its own folder under ``output`` and each skipped when a previous run finished it
(a ``.done`` marker), so an interrupted demo continues where it stopped. A training stage
(SFT, GRPO) stopped part-way continues from its newest checkpoint; one stopped by SIGTERM or
SIGUSR1 saves a checkpoint first, is not marked done, and the demo exits with 128 + the signal
number (:class:`StageStopped`):

1. ``tasks``: the ``kb_search`` tasks (train and eval splits) under the demo's context budget;
2. ``eval-base``: the base model, ``react`` and ``acm``, on the eval tasks;
3. ``annotate``: the oracle's demonstrations on the training tasks (a warm start: the base
   model makes no valid tool call, so its own runs would teach nothing);
4. ``sft``: fine-tuning on the demonstrations;
5. ``eval-sft``: the SFT policy on the eval tasks (``acm``);
6. ``round``: an on-policy teacher round (the ACM write-up's method): the SFT student runs training
   tasks in ``react`` and ``acm``, the oracle corrects its mistakes and injects compactions
   (switching ``react`` runs to ``acm`` at the edit), and the student resumes from each edit;
7. ``sft-round``: fine-tuning from the SFT policy on the demonstrations and the round together;
8. ``eval-round``: that policy on the eval tasks (``acm``);
9. ``grpo``: GRPO from that policy, sampled groups, on success minus Compaction Cost;
10. ``eval-trained``: the trained policy on the eval tasks (``react`` and ``acm``);
11. ``export``: the trained policy as one Hugging Face folder, with the eval report in its card;
12. ``compare``: base vs trained, side by side (``compare.md``);
13. ``grpo-vs-start``: the GRPO policy vs the policy it started from on the same held-out
    tasks: Pass@1 and mean reward with paired intervals, Compaction Cost per success, mean
    compaction point (``grpo_vs_start.md``, :mod:`acmrl.eval.versus`);
14. ``curves``: the held-out numbers of every stage in one table and plots, and GRPO per step
    (``curves/``).

The default size, on ``kb_search`` ``chain``, runs tasks, eval-base, annotate (``acm``'s best
policy), sft, eval-trained (the SFT policy, ``react`` and ``acm``), export, compare and curves:
it has no teacher round and no GRPO (``Size.has``). The sizes on ``tiny`` run every stage.

The training tasks come from ``kb_search`` worlds ``seed + 1`` ... (many worlds, so the student
learns the skill rather than one world's names); the held-out tasks from worlds ``seed``,
``seed + 100``, ``seed + 101`` ..., never trained on. The ``long`` size also evaluates the
exported checkpoint on two more unseen worlds (``eval-unseen``).

Every stage's configuration is written to ``configs/<stage>.yaml`` in the output folder, so each
can be rerun by hand with the matching ``acmrl`` command.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

from acmrl.config import (
    AgentConfig,
    AnnotateConfig,
    DemoConfig,
    EngineConfig,
    EnvConfig,
    EvalConfig,
    ExportConfig,
    GRPOConfig,
    ModelConfig,
    SamplingConfig,
    SFTConfig,
    to_dict,
)


@dataclasses.dataclass(frozen=True)
class Size:
    """How big a demo is: its tasks, budget and the length of each training stage."""

    preset: str  # the kb_search preset
    budget: int  # the context budget, tokens of complete model input
    train_worlds: int  # kb_search worlds (seeds seed+1 ...) whose training splits are taught
    train_tasks: int
    eval_worlds: int  # held-out worlds: seed, seed+100, seed+101, ...
    eval_tasks: int
    max_turns: int
    max_new_tokens: int
    sft_steps: int
    round_tasks: int  # training tasks the SFT student runs in the teacher round (per arm)
    round_steps: int
    grpo_steps: int
    group_size: int
    grpo_tasks: int
    unseen: bool = False  # also evaluate the export on two more unseen worlds
    unseen_tasks: int = 0  # tasks per unseen world (0: eval_tasks)
    sft_eval_tasks: int = 0  # held-out tasks of the SFT stage's eval (0: eval_tasks)
    top_layers: int | None = None  # SFT's and GRPO's LoRA on the last N decoder layers (None: all)
    grpo_lr: float = 2e-5
    # std-scaled advantages (standard GRPO): in a group that all succeeds, the Compaction Cost
    # differences get the full advantage scale instead of about +-0.03 (Dr. GRPO's unscaled)
    grpo_scale_advantages: bool = False
    # tasks taken evenly from each world (the preset's n_train/n_eval per world), not the first
    # worlds' in order: a chain world holds 200 training tasks
    per_world: bool = False
    annotate_arms: tuple[str, ...] = ("react", "acm")  # the arms the teacher demonstrates
    # when the teacher compacts: "spread" draws each task's point from 0.5-0.9 of the budget and
    # leaves a share late; "read" compacts right after every read that the answer does not follow
    timing: str = "spread"
    # the training side's overflow rule (annotation, round, GRPO); every eval asks for an answer
    on_overflow: str = "fail"

    @property
    def trained_stage(self) -> str:
        """The stage whose policy the demo evaluates last and exports."""
        return "grpo" if self.grpo_steps else "sft-round" if self.round_tasks else "sft"

    def has(self, stage: str) -> bool:
        """Whether this size runs ``stage``: a size without a round or GRPO skips them, and
        without either its one SFT eval is ``eval-trained``."""
        if stage in ("round", "sft-round"):
            return self.round_tasks > 0
        if stage == "eval-round":  # GRPO's start; without GRPO the round's eval is eval-trained
            return self.round_tasks > 0 and self.grpo_steps > 0
        if stage in ("grpo", "grpo-vs-start"):
            return self.grpo_steps > 0
        if stage == "eval-sft":
            return self.trained_stage != "sft"
        return True


# Why each size's numbers are what they are, with the runs that chose them: docs/train.md,
# "The demo's settings, and the measurements behind them".
SIZES = {
    # a pipeline check in about a minute (the tests run it on a tiny random model)
    "smoke": Size(
        preset="tiny", budget=1300, train_worlds=1, train_tasks=2, eval_worlds=1, eval_tasks=2,
        max_turns=3, max_new_tokens=24, sft_steps=2, round_tasks=1, round_steps=1,
        grpo_steps=1, group_size=2, grpo_tasks=1,
    ),
    "small": Size(
        preset="tiny", budget=1300, train_worlds=4, train_tasks=64, eval_worlds=2, eval_tasks=8,
        max_turns=12, max_new_tokens=96, sft_steps=20, round_tasks=8, round_steps=10,
        grpo_steps=2, group_size=4, grpo_tasks=1,
    ),
    # the default: kb_search chain, where the answer is in a document's body three reads away
    # and the budget holds about two documents; the teacher demonstrates acm's best policy,
    # compacting after every read, and the student learns it by SFT alone (a teacher round
    # bought nothing on the dev worlds)
    "default": Size(
        preset="chain", budget=2048, train_worlds=10, train_tasks=160, eval_worlds=2,
        eval_tasks=16, max_turns=30, max_new_tokens=96, sft_steps=150, round_tasks=0,
        round_steps=0, grpo_steps=0, group_size=4, grpo_tasks=1, top_layers=15, per_world=True,
        annotate_arms=("acm",), timing="read", on_overflow="force_answer",
    ),
    # the former default on kb_search tiny (which a react policy solves by a shortcut,
    # docs/envs.md): SFT, a teacher round and GRPO, every stage of the pipeline in an hour
    "tiny": Size(
        preset="tiny", budget=1300, train_worlds=10, train_tasks=160, eval_worlds=2,
        eval_tasks=16, max_turns=12, max_new_tokens=96, sft_steps=100, round_tasks=16,
        round_steps=10, grpo_steps=2, group_size=4, grpo_tasks=1, top_layers=15, grpo_lr=2e-4,
        grpo_scale_advantages=True,
    ),
    # the longer CPU recipe: more worlds and steps, >= 50 held-out tasks, unseen worlds
    "long": Size(
        preset="tiny", budget=1300, train_worlds=30, train_tasks=480, eval_worlds=7,
        eval_tasks=56, max_turns=12, max_new_tokens=96, sft_steps=150, round_tasks=16,
        round_steps=30, grpo_steps=4, group_size=4, grpo_tasks=2, unseen=True,
        unseen_tasks=32, sft_eval_tasks=16, top_layers=15, grpo_lr=2e-4,
        grpo_scale_advantages=True,
    ),
    # longer multi-hop tasks, for a GPU
    "large": Size(
        preset="small", budget=2048, train_worlds=4, train_tasks=800, eval_worlds=2,
        eval_tasks=40, max_turns=16, max_new_tokens=128, sft_steps=150, round_tasks=64,
        round_steps=50, grpo_steps=20, group_size=8, grpo_tasks=4,
    ),
}  # fmt: skip

#: the stages in order, each with what its progress line says (from the size); a stage with a
#: config runs its command on it, the others ``Demo._<name>`` (dashes as underscores); the eval
#: of every unseen world follows when the size has some
STAGE_PLAN: tuple[tuple[str, Any], ...] = (
    ("tasks", lambda z: f"kb_search {z.preset}, budget {z.budget} tokens"),
    ("eval-base", lambda z: "the base model"),
    ("annotate", lambda z: "the oracle's demonstrations"),
    ("sft", lambda z: f"{z.sft_steps} steps on the demonstrations"),
    ("eval-sft", lambda z: "the SFT policy"),
    ("round", lambda z: f"teacher round: the SFT student on {z.round_tasks} tasks, edits, resumes"),
    ("sft-round", lambda z: f"{z.round_steps} steps on demonstrations + round"),
    ("eval-round", lambda z: "the policy after the round"),
    ("grpo", lambda z: f"{z.grpo_steps} GRPO steps"),
    ("eval-trained", lambda z: "the trained policy"),
    ("export", lambda z: "merged HF folder + card"),
    ("compare", lambda z: "base vs trained"),
    ("grpo-vs-start", lambda z: "GRPO's policy vs the one it started from"),
    (
        "curves",
        lambda z: "held-out numbers per stage" + (", GRPO per step" if z.grpo_steps else ""),
    ),
)
STAGES = [name for name, _ in STAGE_PLAN]
# the share of demonstrations that compact as late as the budget allows (teacher.late_share)
LATE_SHARE = 0.35
# held-out tasks come from worlds never trained on: the demo's seed, then seed + EVAL_WORLD ...
EVAL_WORLD = 100
# worlds the long recipe's export is finally evaluated on, one at a time: never seen anywhere
UNSEEN_WORLDS = (200, 201)


def eval_seeds(seed: int, z: Size) -> list[int]:
    return [seed] + [seed + EVAL_WORLD + i for i in range(z.eval_worlds - 1)]


def cpu_has_bf16() -> bool:
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def precision(cfg: DemoConfig) -> str:
    if cfg.precision != "auto":
        return cfg.precision
    import torch

    if torch.cuda.is_available():
        return "bf16" if torch.cuda.is_bf16_supported() else "no"
    return "bf16" if cpu_has_bf16() else "no"


def describe_machine() -> str:
    import os
    import platform

    import torch

    if torch.cuda.is_available():
        return f"{torch.cuda.get_device_name(0)}, {os.cpu_count()} CPU cores"
    cpu = platform.processor() or platform.machine()
    return f"CPU only ({cpu}, {os.cpu_count()} cores)"


@dataclasses.dataclass(frozen=True)
class Recipe:
    """What the stages of one demo share: its size, folders, tasks, agent and models. Each
    stage's config is built by one function of it below; docs/train.md ("The demo's settings,
    and the measurements behind them") says why each setting is what it is."""

    cfg: DemoConfig
    z: Size
    out: Path
    env: EnvConfig  # the held-out worlds (eval split)
    train_env: EnvConfig  # the training worlds' training split
    agent: AgentConfig
    greedy: SamplingConfig
    model: ModelConfig  # the base model, as configured (training)
    infer: ModelConfig  # the same for rollouts that train nothing: bf16 where training is
    mp: str  # training autocast: "bf16" or "no"
    wide: EngineConfig  # 16 episodes decoded together

    @classmethod
    def of(cls, cfg: DemoConfig) -> Recipe:
        z = SIZES[cfg.size]
        preset: dict[str, Any] = {"preset": z.preset}
        eval_opts, train_opts = dict(preset), dict(preset)
        if z.per_world:
            eval_opts["n_eval"] = z.eval_tasks // z.eval_worlds
            train_opts["n_train"] = z.train_tasks // z.train_worlds
        # many worlds to learn the skill, not one world's names; held-out worlds to test it
        env = EnvConfig(
            name="mixture",
            options={"env": "kb_search", "seeds": eval_seeds(cfg.seed, z), "options": eval_opts},
        )
        train_env = EnvConfig(
            name="mixture",
            options={
                "env": "kb_search",
                "seeds": [cfg.seed + 1 + i for i in range(z.train_worlds)],
                "options": train_opts,
            },
            split="train",
            limit=z.train_tasks,
        )
        # the context signal shows the agent its context size, so when to compact is
        # learnable; the repeat rule answers an identical call whose result is in view, and the
        # text-call rule a call written as text with an error (every arm alike)
        agent = AgentConfig(
            max_turns=z.max_turns,
            max_context_tokens=z.budget,
            context_signal=True,
            repeat_rule=True,
            text_call_rule=True,
            on_overflow=z.on_overflow,
        )
        mp = precision(cfg)
        model = cfg.model
        return cls(
            cfg=cfg,
            z=z,
            out=Path(cfg.output),
            env=env,
            train_env=train_env,
            agent=agent,
            greedy=SamplingConfig(max_new_tokens=z.max_new_tokens, stop=["</tool_call>"]),
            model=model,
            infer=dataclasses.replace(model, dtype="bfloat16") if mp == "bf16" else model,
            mp=mp,
            wide=EngineConfig(max_batch=16),
        )

    def path(self, *parts: str) -> str:
        return str(self.out.joinpath(*parts))

    @property
    def top_layers(self) -> int | None:
        top = self.z.top_layers if self.cfg.top_layers is None else self.cfg.top_layers
        return top or None


def eval_config(
    r: Recipe,
    name: str,
    model_name: str,
    arms: tuple[str, ...] = ("react", "acm"),
    env: EnvConfig | None = None,
    split: str = "eval",
    limit: int = 0,
) -> EvalConfig:
    """An eval stage: greedy, the fair overflow rule, the held-out worlds by default."""
    env = env or r.env
    return EvalConfig(
        model=dataclasses.replace(r.infer, name=model_name),
        sampling=r.greedy,
        agent=dataclasses.replace(r.agent, on_overflow="force_answer"),  # the fair rule
        env=dataclasses.replace(env, split=split, limit=limit or r.z.eval_tasks),
        arms=list(arms),
        engine=r.wide,
        concurrency=16,
        output=r.path(name),
        machine=r.cfg.machine or describe_machine(),
    )


def annotate_config(r: Recipe) -> AnnotateConfig:
    """The oracle's demonstrations on the training tasks, in the size's arms."""
    annotate = AnnotateConfig(
        model=r.model,
        sampling=r.greedy,
        # a demonstration needs the turns of the whole plan, whatever the size's limit
        agent=dataclasses.replace(r.agent, max_turns=max(r.agent.max_turns, 12)),
        env=r.train_env,
        arms=list(r.z.annotate_arms),
        resumes=1,
        # one resume per edit: the solve-count filter would drop exactly the edits that worked
        solve_filter=False,
        demonstrations=True,
        student_tasks=0,  # the base model makes no valid call: its runs would teach nothing
        seed=r.cfg.seed,
        output=r.path("annotate"),
    )
    if r.z.timing == "read":
        # each arm's own best strategy, compacting right after every read that the answer does
        # not follow: one rule, the same in every task
        annotate.teacher.policy = "best"
        annotate.teacher.pressure, annotate.teacher.pressure_spread = 0.05, []
        annotate.teacher.late_share = 0.0
    else:
        annotate.teacher.pressure = 0.75
        annotate.teacher.pressure_spread = [0.5, 0.9]  # each task compacts at its own point
        # a share of the tasks compact only when the next result would not fit, so they answer
        # at once after the last read: two timings in the SFT policy, for GRPO to choose
        annotate.teacher.late_share = LATE_SHARE
    annotate.teacher.answers = r.cfg.answers  # the round's teacher is a replace of this one
    return annotate


def sft_config(r: Recipe) -> SFTConfig:
    """LoRA SFT on the demonstrations."""
    sft = SFTConfig(
        model=r.model,
        dataset=r.path("annotate"),
        seed=r.cfg.seed,
        output=r.path("sft"),
        # a demo stopped mid-SFT continues from here (~3 min of steps at most, 60 MB each)
        save_every=max(1, min(10, r.z.sft_steps // 2)),
        save_total_limit=2,
    )
    sft.optim.lr, sft.optim.max_steps, sft.optim.warmup_steps = 1e-3, r.z.sft_steps, 2
    sft.optim.batch_tokens, sft.optim.mixed_precision = 4096, r.mp
    sft.lora.top_layers = r.top_layers  # the round's SFT (a replace of this one) shares it
    return sft


def round_config(r: Recipe, annotate: AnnotateConfig) -> AnnotateConfig:
    """The teacher round: the SFT student on training tasks, the oracle's edits, its resumes."""
    return dataclasses.replace(
        annotate,
        model=dataclasses.replace(r.infer, name=r.path("sft", "final")),
        engine=r.wide,
        concurrency=16,
        env=dataclasses.replace(r.train_env, limit=r.z.round_tasks),
        agent=r.agent,
        demonstrations=False,
        student_tasks=None,
        teacher=dataclasses.replace(annotate.teacher, pressure_spread=[]),
        output=r.path("round"),
    )


def sft_round_config(r: Recipe, sft: SFTConfig) -> SFTConfig:
    """A fresh LoRA on the merged SFT policy, over the demonstrations and the round, at a
    fifth of SFT's learning rate."""
    return dataclasses.replace(
        sft,
        model=dataclasses.replace(r.model, name=r.path("sft", "final")),
        dataset=[r.path("annotate"), r.path("round")],
        output=r.path("sft-round"),
        save_every=max(1, min(10, r.z.round_steps)),
        optim=dataclasses.replace(sft.optim, max_steps=r.z.round_steps, lr=sft.optim.lr / 5),
    )


def grpo_config(r: Recipe) -> GRPOConfig:
    """GRPO from the round's policy (the SFT policy without a round), acm arm, on success minus
    Compaction Cost."""
    z = r.z
    start = "sft-round" if z.has("sft-round") else "sft"
    grpo = GRPOConfig(
        model=dataclasses.replace(r.model, name=r.path(start, "final")),
        agent=r.agent,
        env=r.train_env,
        arms=["acm"],
        group_size=z.group_size,
        tasks_per_step=z.grpo_tasks,
        kl_coef=0.0,  # no KL term (DAPO, Dr. GRPO; TRL's default)
        seed=r.cfg.seed,
        output=r.path("grpo"),
        save_every=1,  # a GRPO step takes minutes here
        save_total_limit=2,
    )
    grpo.sampling.max_new_tokens = z.max_new_tokens
    grpo.sampling.temperature = 0.8
    grpo.optim.lr, grpo.optim.max_steps, grpo.optim.schedule = z.grpo_lr, z.grpo_steps, "constant"
    grpo.scale_advantages = z.grpo_scale_advantages
    # std-scaled, a group that all failed would rank its failures by cost alone: dropped
    grpo.skip_failed_groups = z.grpo_scale_advantages
    # the loss is the token mean over the step's targets: the micro-batch changes the memory,
    # not the update (8,192 tokens do not fit 24 GB in float32)
    grpo.optim.batch_tokens = 8192 if r.mp == "bf16" else 4096
    grpo.optim.mixed_precision = r.mp
    grpo.lora.top_layers = r.top_layers  # a fresh LoRA on the same top layers as SFT's
    return grpo


def export_config(r: Recipe) -> ExportConfig:
    """The trained policy as one Hugging Face folder, its eval in the card."""
    return ExportConfig(
        model=dataclasses.replace(r.model, name=r.path(r.z.trained_stage, "final")),
        arm="acm",
        env=r.env,
        agent=r.agent,
        eval_dir=r.path("eval-trained"),
        output=r.path("export"),
    )


def stage_configs(cfg: DemoConfig) -> dict[str, Any]:
    """The configuration of every stage, derived from the demo's size."""
    r = Recipe.of(cfg)
    z = r.z
    annotate, sft = annotate_config(r), sft_config(r)
    sft_model, round_model = r.path("sft", "final"), r.path("sft-round", "final")
    every: dict[str, Any] = {
        "eval-base": eval_config(r, "eval-base", r.model.name),
        "annotate": annotate,
        "sft": sft,
        "eval-sft": eval_config(r, "eval-sft", sft_model, ("acm",), limit=z.sft_eval_tasks),
        "round": round_config(r, annotate),
        "sft-round": sft_round_config(r, sft),
        "eval-round": eval_config(r, "eval-round", round_model, ("acm",)),
        "grpo": grpo_config(r),
        "eval-trained": eval_config(r, "eval-trained", r.path(z.trained_stage, "final")),
        "export": export_config(r),
    }
    configs = {name: c for name, c in every.items() if z.has(name)}
    for world in UNSEEN_WORLDS if z.unseen else ():
        unseen_env = dataclasses.replace(
            r.env, options={**r.env.options, "seeds": [cfg.seed + world]}
        )
        # every task of a world never seen is held out: its training split too
        name = f"eval-unseen-{world}"
        configs[name] = eval_config(
            r, name, r.path("export"), ("acm",), unseen_env, "train", limit=z.unseen_tasks
        )
    return configs


class StageStopped(Exception):
    """A training stage stopped by a signal after saving its checkpoint: not done, and a rerun of
    the same command continues it from that checkpoint."""

    def __init__(self, stage: str, signum: int, exit_code: int) -> None:
        super().__init__(
            f"{stage} stopped by signal {signum} after saving a checkpoint; rerun the same "
            "command to continue from it"
        )
        self.exit_code = exit_code


def _yaml(obj: Any) -> str:
    import yaml

    return yaml.safe_dump(to_dict(obj), sort_keys=False)


class Demo:
    def __init__(self, cfg: DemoConfig) -> None:
        from rich.console import Console

        self.cfg = cfg
        self.out = Path(cfg.output)
        self.console = Console()
        if self.console.width < 120:  # a pipe or a narrow terminal: do not squeeze the table
            self.console = Console(width=120)
        self.configs = stage_configs(cfg)
        self.times: dict[str, float] = {}
        self.skipped: list[str] = []
        self.n_stages = len(STAGES)

    def _done(self, stage: str) -> Path:
        return self.out / ".done" / stage

    def stage(self, n: int, name: str, fn: Any, what: str) -> None:
        marker = self._done(name)
        if marker.exists():
            self.times[name] = float(json.loads(marker.read_text())["seconds"])
            self.skipped.append(name)
            self.console.print(f"[dim][{n}/{self.n_stages}] {name}: done already, skipped[/dim]")
            return
        from acmrl.models import release_freed_memory, resident_gb

        self.console.rule(f"[bold][{n}/{self.n_stages}] {name}[/bold]: {what}")
        t0 = time.perf_counter()
        fn()
        self.times[name] = time.perf_counter() - t0
        # the next stage starts from what is still in use, not from this one's high-water mark
        release_freed_memory()
        now, peak = resident_gb()
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text(json.dumps({"seconds": self.times[name], "peak_rss_gb": peak}))
        self.console.print(
            f"[green]{name} finished in {self.times[name]:.0f} s[/green] (resident {now:.1f} GB, "
            f"peak so far {peak:.1f} GB)"
        )

    def _check_started_with_same_size(self) -> None:
        """A rerun continues only the demo it started: the stages' ``.done`` markers do not say
        which size made them, so another size in the same folder would skip its stages and
        report the other's results."""
        import yaml

        before = self.out / "configs" / "demo.yaml"
        if not before.exists():
            return
        was = (yaml.safe_load(before.read_text()) or {}).get("size")
        if was is not None and was != self.cfg.size:
            raise ValueError(
                f"{self.out} holds a demo of size {was!r}, not {self.cfg.size!r}: rerun with "
                f"--size {was} to continue it, or give another output="
            )

    def run(self) -> dict[str, Any]:
        c = self.configs
        self._check_started_with_same_size()
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "configs").mkdir(exist_ok=True)
        for name, stage_cfg in c.items():
            (self.out / "configs" / f"{name}.yaml").write_text(_yaml(stage_cfg))
        (self.out / "configs" / "demo.yaml").write_text(_yaml(self.cfg))
        z = SIZES[self.cfg.size]
        steps = [(name, self._stage_fn(name), what(z)) for name, what in STAGE_PLAN if z.has(name)]
        for world in UNSEEN_WORLDS if z.unseen else ():
            name = f"eval-unseen-{world}"
            steps.append((name, self._stage_fn(name), f"the export on unseen world {world}"))
        self.n_stages = len(steps)
        names = [name for name, _, _ in steps]
        stop = self.cfg.stop_after
        if stop is not None and stop not in names:
            raise ValueError(f"stop_after={stop!r} is not a stage of this demo: {names}")
        for n, (name, fn, what) in enumerate(steps, 1):
            self.stage(n, name, fn, what)
            if name == stop:
                self.console.print(f"stopped after {name} (stop_after); rerun without it to go on")
                return {"stopped_after": name, "seconds": dict(self.times)}
        return self.summary()

    # -- the stages: a stage with a config runs its command; the others are methods ------------

    def _stage_fn(self, name: str) -> Any:
        """What stage ``name`` runs: its command on its config, by the config's kind (an eval,
        the teacher, a training run, the export), or the method ``_<name>``."""
        cfg = self.configs.get(name)
        if cfg is None:
            return getattr(self, "_" + name.replace("-", "_"))
        if isinstance(cfg, EvalConfig):
            from acmrl.eval.run import run_eval

            return lambda: run_eval(cfg)
        if isinstance(cfg, AnnotateConfig):
            from acmrl.teacher.annotate import run_annotate

            return lambda: run_annotate(cfg)
        if isinstance(cfg, ExportConfig):
            from acmrl.train.export import run_export

            return lambda: run_export(cfg)
        from acmrl.train.grpo import run_grpo
        from acmrl.train.sft import run_sft

        run = run_grpo if isinstance(cfg, GRPOConfig) else run_sft
        return lambda: self._train(name, run, cfg)

    def _compare(self) -> None:
        from acmrl.eval.compare import compare

        compare(self.out / "eval-base", self.out / "eval-trained", self.out / "compare.md")

    def _train(self, name: str, run: Any, cfg: Any) -> None:
        """A training stage, continued from its newest checkpoint when an earlier run of the demo
        stopped inside it; a run stopped by a signal raises :class:`StageStopped`."""
        from acmrl.train.checkpoint import latest_checkpoint

        ckpt = latest_checkpoint(Path(cfg.output))
        if ckpt is not None:
            self.console.print(f"{name}: continuing from {ckpt} (an earlier run stopped there)")
        result = run(cfg, resume="auto")
        if result.get("interrupted") is not None:
            raise StageStopped(name, result["interrupted"], result["exit_code"])

    def _grpo_vs_start(self) -> None:
        from acmrl.eval.versus import versus_start
        from acmrl.train.grpo_steps import reward_weights

        grpo = self.configs["grpo"]
        start = "eval-round" if "eval-round" in self.configs else "eval-sft"  # GRPO's start
        text = versus_start(
            self.out / start,
            self.out / "eval-trained",
            reward_weights(grpo),
            self.out / "grpo_vs_start.md",
            output_weight=grpo.agent.output_weight,
        )
        self.console.print(text)

    def _curves(self) -> None:
        from acmrl.eval.curves import write_curves

        z = SIZES[self.cfg.size]
        # each training stage's held-out eval; the last one's is eval-trained
        evals = {"sft": "eval-sft", "sft-round": "eval-round", "grpo": "eval-trained"}
        evals[z.trained_stage] = "eval-trained"
        stages = [("base", self.out / "eval-base")] + [
            (label, self.out / evals[stage])
            for label, stage in (("sft", "sft"), ("teacher round", "sft-round"), ("grpo", "grpo"))
            if z.has(stage)
        ]
        write_curves(stages, self.out / "curves", self.out / "grpo" if z.has("grpo") else None)

    def _tasks(self) -> None:
        from acmrl.envs import load

        env_cfg = self.configs["annotate"].env
        env = load(env_cfg.name, **env_cfg.options)
        z = SIZES[self.cfg.size]
        eval_cfg = self.configs["eval-base"].env
        held_out = load(eval_cfg.name, **eval_cfg.options)
        info = {
            "train_env": {"name": env_cfg.name, "options": env_cfg.options},
            "eval_env": {"name": eval_cfg.name, "options": eval_cfg.options},
            "budget": z.budget,
            "train_tasks": [t.id for t in env.tasks("train")[: z.train_tasks]],
            "eval_tasks": [t.id for t in held_out.tasks("eval")[: z.eval_tasks]],
        }
        (self.out / "tasks.json").write_text(json.dumps(info, indent=1))
        self.console.print(
            f"{len(info['train_tasks'])} training tasks, {len(info['eval_tasks'])} held-out "
            f"eval tasks; context budget {z.budget} tokens"
        )

    def summary(self) -> dict[str, Any]:
        from rich.table import Table

        base = json.loads((self.out / "eval-base" / "report.json").read_text())
        trained = json.loads((self.out / "eval-trained" / "report.json").read_text())
        table = Table(title=f"acmrl demo ({self.cfg.size}): base vs trained, held-out tasks")
        for h in [
            "arm",
            "model",
            "Pass@1 [95% CI]",
            "valid-call rate",
            "tool calls",
            "peak tokens",
            "compactions",
            "overflow",
        ]:
            table.add_column(h, justify="left" if h in ("arm", "model") else "right")
        rows = []
        for arm in base["arms"]:
            for label, rep in (("base", base), ("trained", trained)):
                s = rep["arms"].get(arm)
                if s is None:
                    continue
                rows.append({"arm": arm, "model": label} | s)
                table.add_row(
                    arm,
                    label,
                    f"{s['pass@1']:.3f} [{s['pass@1_low']:.2f}, {s['pass@1_high']:.2f}]",
                    f"{s['valid_call_rate']:.2f}",
                    f"{s['tool_calls']:.2f}",
                    f"{s['peak_context_tokens']:.0f}",
                    f"{s['compactions']:.2f}",
                    f"{s['overflow']:.2f}",
                )
        self.console.print(table)
        total = sum(self.times.values())
        stages = ", ".join(f"{k} {v:.0f} s" for k, v in self.times.items())
        self.console.print(f"wall time {total:.0f} s ({stages})")
        if self.skipped:
            self.console.print(f"(stages done by an earlier run: {', '.join(self.skipped)})")
        self.console.print(f"report (base): {self.out / 'eval-base' / 'report.md'}")
        self.console.print(f"report (trained): {self.out / 'eval-trained' / 'report.md'}")
        self.console.print(f"before/after: {self.out / 'compare.md'}")
        self.console.print(f"learning curves: {self.out / 'curves' / 'curves.md'}")
        self.console.print(f"exported checkpoint: {self.out / 'export'}")
        result = {"rows": rows, "seconds": self.times, "total_seconds": total}
        (self.out / "summary.json").write_text(json.dumps(result, indent=1))
        return result


def run_demo(cfg: DemoConfig) -> dict[str, Any]:
    return Demo(cfg).run()
