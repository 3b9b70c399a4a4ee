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
    SamplingConfig,
    SFTConfig,
    to_dict,
)


@dataclasses.dataclass(frozen=True)
class Size:
    preset: str
    budget: int
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


SIZES = {
    # a pipeline check in about a minute (the tests run it on a tiny random model)
    "smoke": Size("tiny", 1300, 1, 2, 1, 2, 3, 24, 2, 1, 1, 1, 2, 1),
    "small": Size("tiny", 1300, 4, 64, 2, 8, 12, 96, 20, 8, 10, 2, 4, 1),
    # GRPO at lr 2e-4 with std-scaled advantages, so that a group whose samples all succeed
    # carries the cost difference of the two timings (scripts/grpo_timing.sh: from a 15/16
    # policy, 8 steps of 2 tasks x 4 at these settings made answering at the last read the
    # greedy choice, Compaction Cost per success -26%); here 2 steps of 1 task x 4 only, for
    # time: 3 steps of 2 tasks took 14-15 min a step here sharing the CPU (docs/train.md)
    # SFT 100 steps: 50 (a fifth of an epoch) gave 1, 5, 7, 12 and 15 of 16 held out with the
    # batch order; 100 gave 15/16 and 16/16 (seeds 1 and 0, the late-share data) and 15/16
    # twice before it, at +16 min here (docs/train.md)
    # LoRA on the top 15 of the 30 layers: a step 13.3 s instead of ~20 s here, and the same
    # demonstrations' 100 steps gave 15/16 held out (16/16 on all layers; docs/train.md)
    "default": dataclasses.replace(
        Size("tiny", 1300, 10, 160, 2, 16, 12, 96, 100, 16, 10, 2, 4, 1),
        grpo_lr=2e-4,
        grpo_scale_advantages=True,
        top_layers=15,
    ),
    # the longer CPU recipe: more worlds and steps, >= 50 held-out tasks, unseen worlds
    # sized to <= 2 h on a 2-core CPU from the default run's measured rates (12.3 s per SFT
    # step, ~9 s per held-out acm episode, ~40 s per GRPO episode): about 1 h 50 min; on the
    # later machine (17.7-20.6 s per SFT step) its run took 149 min of stages, and 124 min
    # with the cuts below (README "Latest long run")
    # four GRPO steps must move the policy for its cost to change: lr 2e-4 and std-scaled
    # advantages (in scripts/grpo_timing.sh's run, step 4 already answered at once at 13 of 15
    # last reads, greedily)
    # to fit 2 h on the later machine: SFT on the top 15 layers (as default), a round of 16
    # tasks per arm instead of 32 (the 32 of 2026-12-03, at 93b269e, took a 0.839 SFT policy
    # to 0.821, 18 min with its SFT), and the SFT stage's curve point on 16 of the 56 held-out tasks
    # (the round's eval, GRPO's start, keeps all 56 for the paired comparison); with GRPO on
    # the top 15 layers too (~88 s less a step), about 116 min from that run's stage times
    "long": dataclasses.replace(
        Size("tiny", 1300, 30, 480, 7, 56, 12, 96, 150, 16, 30, 4, 4, 2),
        unseen=True,
        unseen_tasks=32,
        sft_eval_tasks=16,
        grpo_lr=2e-4,
        grpo_scale_advantages=True,
        top_layers=15,
    ),
    # longer multi-hop tasks, for a GPU
    "large": Size("small", 2048, 4, 800, 2, 40, 16, 128, 150, 64, 50, 20, 8, 4),
}
STAGES = [
    "tasks",
    "eval-base",
    "annotate",
    "sft",
    "eval-sft",
    "round",
    "sft-round",
    "eval-round",
    "grpo",
    "eval-trained",
    "export",
    "compare",
    "grpo-vs-start",
    "curves",
]
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


def stage_configs(cfg: DemoConfig) -> dict[str, Any]:
    """The configuration of every stage, derived from the demo's size."""
    z = SIZES[cfg.size]
    out = Path(cfg.output)
    preset = {"preset": z.preset}
    # many worlds to learn the skill, not one world's names; held-out worlds to test it
    env = EnvConfig(
        name="mixture",
        options={"env": "kb_search", "seeds": eval_seeds(cfg.seed, z), "options": preset},
    )
    train_seeds = [cfg.seed + 1 + i for i in range(z.train_worlds)]
    train_env = EnvConfig(
        name="mixture",
        options={"env": "kb_search", "seeds": train_seeds, "options": preset},
        split="train",
        limit=z.train_tasks,
    )
    # the context signal shows the agent its context size, so when to compact is learnable; the
    # repeat rule (every arm alike) answers an identical call whose result is in view, and
    # the text-call rule (every arm alike) answers a call written as text with an error
    agent = AgentConfig(
        max_turns=z.max_turns,
        max_context_tokens=z.budget,
        context_signal=True,
        repeat_rule=True,
        text_call_rule=True,
    )
    greedy = SamplingConfig(max_new_tokens=z.max_new_tokens, stop=["</tool_call>"])
    model = cfg.model
    mp = precision(cfg)
    # rollouts that train nothing (evals, the teacher round's student) run in bf16 where training
    # autocasts in it: the same 15 of 16 held-out episodes as float32, in 131 s instead of 240 s
    # on this project's 2-core CPU (docs/train.md)
    infer = dataclasses.replace(model, dtype="bfloat16") if mp == "bf16" else model
    # 16 episodes decoded together: 16 x 40 tokens in 4.9 s instead of 7.7 s in batches of 8
    wide = EngineConfig(max_batch=16)

    def eval_cfg(
        name: str,
        model_name: str,
        arms: tuple[str, ...] = ("react", "acm"),
        env: Any = env,
        split: str = "eval",
        limit: int = 0,
    ) -> EvalConfig:
        e = EvalConfig(
            model=dataclasses.replace(infer, name=model_name),
            sampling=greedy,
            agent=dataclasses.replace(agent, on_overflow="force_answer"),  # the fair rule
            env=dataclasses.replace(env, split=split, limit=limit or z.eval_tasks),
            arms=list(arms),
            engine=wide,
            concurrency=16,
            output=str(out / name),
            machine=cfg.machine or describe_machine(),
        )
        return e

    annotate = AnnotateConfig(
        model=model,
        sampling=greedy,
        # a demonstration needs the turns of the whole plan, whatever the size's limit
        agent=dataclasses.replace(agent, max_turns=max(agent.max_turns, 12)),
        env=train_env,
        arms=["react", "acm"],
        resumes=1,
        # one resume per edit: the solve-count filter would drop exactly the edits that worked
        solve_filter=False,
        demonstrations=True,
        student_tasks=0,  # the base model makes no valid call: its runs would teach nothing
        seed=cfg.seed,
        output=str(out / "annotate"),
    )
    annotate.teacher.pressure = 0.75
    annotate.teacher.pressure_spread = [0.5, 0.9]  # each task compacts at its own point
    # a third of the tasks compact only when the next result would not fit: they answer at once
    # after the last read, where the others compact first (a compaction of ~650 tokens that
    # buys nothing): two timings in the SFT policy, for GRPO to choose the cheaper
    annotate.teacher.late_share = LATE_SHARE
    annotate.teacher.answers = cfg.answers  # the round's teacher is a replace of this one
    sft = SFTConfig(
        model=model,
        dataset=str(out / "annotate"),
        seed=cfg.seed,
        output=str(out / "sft"),
        # a demo stopped mid-SFT continues from here (~3 min of steps at most, 60 MB each)
        save_every=max(1, min(10, z.sft_steps // 2)),
        save_total_limit=2,
    )
    sft.optim.lr, sft.optim.max_steps, sft.optim.warmup_steps = 1e-3, z.sft_steps, 2
    sft.optim.batch_tokens, sft.optim.mixed_precision = 4096, mp
    top = z.top_layers if cfg.top_layers is None else cfg.top_layers
    sft.lora.top_layers = top or None  # the round's SFT (a replace of this one) shares it
    sft_model = str(out / "sft" / "final")
    # the teacher round: the SFT student on training tasks, the oracle's edits, its resumes
    round_ = dataclasses.replace(
        annotate,
        model=dataclasses.replace(infer, name=sft_model),
        engine=wide,
        concurrency=16,
        env=dataclasses.replace(train_env, limit=z.round_tasks),
        agent=agent,
        demonstrations=False,
        student_tasks=None,
        teacher=dataclasses.replace(annotate.teacher, pressure_spread=[]),
        output=str(out / "round"),
    )
    sft_round = dataclasses.replace(
        sft,
        model=dataclasses.replace(model, name=sft_model),
        dataset=[str(out / "annotate"), str(out / "round")],
        output=str(out / "sft-round"),
        save_every=max(1, min(10, z.round_steps)),
        # a fresh LoRA on the merged SFT policy at a fifth of SFT's lr: at SFT's own 1e-3 the
        # round's 10 steps took a 16/16 policy to 12/16 and a 1/16 one to 4/16; at 2e-4 the
        # same data kept 16/16 and took 1/16 to 12/16 (held out, docs/train.md; 2026-12-03, c66eeee)
        optim=dataclasses.replace(sft.optim, max_steps=z.round_steps, lr=sft.optim.lr / 5),
    )
    round_model = str(out / "sft-round" / "final")
    grpo = GRPOConfig(
        model=dataclasses.replace(model, name=round_model),
        agent=agent,
        env=train_env,
        arms=["acm"],
        group_size=z.group_size,
        tasks_per_step=z.grpo_tasks,
        # no KL term (DAPO, Dr. GRPO; TRL's default): the reference forward costs a quarter of
        # an update here, and a run of a few steps stays near its start anyway
        kl_coef=0.0,
        seed=cfg.seed,
        output=str(out / "grpo"),
        save_every=1,  # a GRPO step takes minutes here
        save_total_limit=2,
    )
    grpo.sampling.max_new_tokens = z.max_new_tokens
    # 0.8: from a policy trained on both timings, its samples differ where it matters (the
    # last read: answer or compact); at 1.0 the same 15/16 policy succeeded in 2 of 8 samples
    # (vs 4 of 8 at 0.8), so its groups carried success noise; at 0.8, before the demonstrations
    # had two timings, the samples were often identical (docs/train.md)
    grpo.sampling.temperature = 0.8
    grpo.optim.lr, grpo.optim.max_steps, grpo.optim.schedule = z.grpo_lr, z.grpo_steps, "constant"
    grpo.scale_advantages = z.grpo_scale_advantages
    # std-scaled, a group that all failed would rank its failures by cost alone (in a real step
    # a wrong answer given without the last compaction got the largest advantage): dropped
    grpo.skip_failed_groups = z.grpo_scale_advantages
    # GRPO's update holds the activations of a whole micro-batch: at 8192 tokens it peaked at
    # 22.5 GB in float32 (a 2-core CPU without bf16, 24 GB: killed by the OOM killer) and fits
    # in bf16; the loss is the token mean over the step's targets, so smaller micro-batches
    # change the memory, not the update
    grpo.optim.batch_tokens = 8192 if mp == "bf16" else 4096
    grpo.optim.mixed_precision = mp
    # GRPO's fresh LoRA on the same top layers as SFT's: the same step's update took 198 s
    # instead of 286 s, and 6 steps from the long recipe's round policy moved it as 4 steps on
    # all layers did (held out 0.821 and 0.804 from 0.857, Compaction Cost per success -16%
    # and -17%; docs/train.md; 2026-12-03, 25a13c0)
    grpo.lora.top_layers = sft.lora.top_layers
    trained = str(out / "grpo" / "final")
    export = ExportConfig(
        model=dataclasses.replace(model, name=trained),
        arm="acm",
        env=env,
        agent=agent,
        eval_dir=str(out / "eval-trained"),
        output=str(out / "export"),
    )
    configs = {
        "eval-base": eval_cfg("eval-base", model.name),
        "annotate": annotate,
        "sft": sft,
        "eval-sft": eval_cfg("eval-sft", sft_model, ("acm",), limit=z.sft_eval_tasks),
        "round": round_,
        "sft-round": sft_round,
        "eval-round": eval_cfg("eval-round", round_model, ("acm",)),
        "grpo": grpo,
        "eval-trained": eval_cfg("eval-trained", trained),
        "export": export,
    }
    if z.unseen:
        for world in UNSEEN_WORLDS:
            unseen_env = dataclasses.replace(
                env, options={**env.options, "seeds": [cfg.seed + world]}
            )
            # every task of a world never seen is held out: its training split too
            configs[f"eval-unseen-{world}"] = eval_cfg(
                f"eval-unseen-{world}",
                str(out / "export"),
                ("acm",),
                unseen_env,
                "train",
                limit=z.unseen_tasks,
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
        self.console.rule(f"[bold][{n}/{self.n_stages}] {name}[/bold]: {what}")
        t0 = time.perf_counter()
        fn()
        self.times[name] = time.perf_counter() - t0
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text(json.dumps({"seconds": self.times[name]}))
        self.console.print(f"[green]{name} finished in {self.times[name]:.0f} s[/green]")

    def run(self) -> dict[str, Any]:
        from acmrl.eval.run import compare, run_eval
        from acmrl.teacher.annotate import run_annotate
        from acmrl.train.export import run_export
        from acmrl.train.grpo import run_grpo
        from acmrl.train.sft import run_sft

        c = self.configs
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "configs").mkdir(exist_ok=True)
        for name, stage_cfg in c.items():
            (self.out / "configs" / f"{name}.yaml").write_text(_yaml(stage_cfg))
        (self.out / "configs" / "demo.yaml").write_text(_yaml(self.cfg))
        z = SIZES[self.cfg.size]
        steps = [
            ("tasks", self._tasks, f"kb_search {z.preset}, budget {z.budget} tokens"),
            ("eval-base", lambda: run_eval(c["eval-base"]), "the base model"),
            ("annotate", lambda: run_annotate(c["annotate"]), "the oracle's demonstrations"),
            (
                "sft",
                lambda: self._train("sft", run_sft, c["sft"]),
                f"{z.sft_steps} steps on the demonstrations",
            ),
            ("eval-sft", lambda: run_eval(c["eval-sft"]), "the SFT policy"),
            (
                "round",
                lambda: run_annotate(c["round"]),
                f"teacher round: the SFT student on {z.round_tasks} tasks, edits, resumes",
            ),
            (
                "sft-round",
                lambda: self._train("sft-round", run_sft, c["sft-round"]),
                f"{z.round_steps} steps on demonstrations + round",
            ),
            ("eval-round", lambda: run_eval(c["eval-round"]), "the policy after the round"),
            (
                "grpo",
                lambda: self._train("grpo", run_grpo, c["grpo"]),
                f"{z.grpo_steps} GRPO steps",
            ),
            ("eval-trained", lambda: run_eval(c["eval-trained"]), "the trained policy"),
            ("export", lambda: run_export(c["export"]), "merged HF folder + card"),
            (
                "compare",
                lambda: compare(
                    self.out / "eval-base", self.out / "eval-trained", self.out / "compare.md"
                ),
                "base vs trained",
            ),
            ("grpo-vs-start", self._versus, "GRPO's policy vs the one it started from"),
            ("curves", self._curves, "held-out numbers per stage, GRPO per step"),
        ]
        for world in UNSEEN_WORLDS if z.unseen else ():
            name = f"eval-unseen-{world}"
            steps.append(
                (name, lambda n=name: run_eval(c[n]), f"the export on unseen world {world}")
            )
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

    def _versus(self) -> None:
        from acmrl.eval.versus import versus_start
        from acmrl.train.grpo_steps import reward_weights

        grpo = self.configs["grpo"]
        text = versus_start(
            self.out / "eval-round",
            self.out / "eval-trained",
            reward_weights(grpo),
            self.out / "grpo_vs_start.md",
            output_weight=grpo.agent.output_weight,
        )
        self.console.print(text)

    def _curves(self) -> None:
        from acmrl.eval.curves import write_curves

        stages = [
            ("base", self.out / "eval-base"),
            ("sft", self.out / "eval-sft"),
            ("teacher round", self.out / "eval-round"),
            ("grpo", self.out / "eval-trained"),
        ]
        write_curves(stages, self.out / "curves", self.out / "grpo")

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
