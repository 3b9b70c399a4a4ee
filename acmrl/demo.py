"""``acmrl demo``: the whole pipeline on the embedded default model, end to end, on a CPU.

Stages, each in its own folder under ``output`` and each skipped when a previous run finished it
(a ``.done`` marker), so an interrupted demo continues where it stopped:

1. ``tasks``: the ``kb_search`` tasks (train and eval splits) under the demo's context budget;
2. ``eval-base``: the base model, ``react`` and ``acm``, on the eval tasks;
3. ``annotate``: the student on the training tasks, the oracle teacher's edits, the student
   resuming from them, and the oracle's demonstrations (a warm start: the base model makes no
   valid tool call);
4. ``sft``: LoRA fine-tuning on that dataset;
5. ``grpo``: a short GRPO run from the SFT policy, on success minus Compaction Cost;
6. ``eval-trained``: the trained policy on the same eval tasks;
7. ``export``: the trained policy as one Hugging Face folder, with the eval report in its card;
8. ``compare``: base vs trained, side by side (``compare.md``);
9. ``curves``: the held-out numbers of every stage in one table and plots, and GRPO per step
   (``curves/``).

The training tasks come from ``kb_search`` worlds ``seed + 1`` ... (many worlds, so the student
learns the skill rather than one world's names); the held-out tasks from worlds ``seed`` and
``seed + 100``, never trained on.

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
    student_tasks: int | None  # the student's own runs, edits and resumes (demos cover all)
    eval_tasks: int
    max_turns: int
    max_new_tokens: int
    sft_steps: int
    grpo_steps: int
    group_size: int
    grpo_tasks: int


SIZES = {
    # a pipeline check in about a minute (the tests run it on a tiny random model)
    "smoke": Size("tiny", 1400, 1, 2, 1, 2, 3, 24, 2, 1, 2, 1),
    "small": Size("tiny", 1400, 4, 64, 2, 8, 12, 96, 20, 2, 4, 1),
    "default": Size("tiny", 1400, 10, 160, 4, 16, 12, 96, 40, 2, 4, 1),
    # longer multi-hop tasks, for a GPU
    "large": Size("small", 2048, 4, 800, None, 40, 16, 128, 150, 20, 8, 4),
}
STAGES = [
    "tasks",
    "eval-base",
    "annotate",
    "sft",
    "grpo",
    "eval-trained",
    "export",
    "compare",
    "curves",
]
# held-out tasks come from worlds never trained on: the demo's seed and seed + EVAL_WORLD
EVAL_WORLD = 100


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
        options={"env": "kb_search", "seeds": [cfg.seed, cfg.seed + EVAL_WORLD], "options": preset},
    )
    train_seeds = [cfg.seed + 1 + i for i in range(z.train_worlds)]
    train_env = EnvConfig(
        name="mixture",
        options={"env": "kb_search", "seeds": train_seeds, "options": preset},
        split="train",
        limit=z.train_tasks,
    )
    # the context signal shows the agent its context size, so when to compact is learnable; the
    # repeat rule (every arm alike) answers an identical repeated call without running it
    agent = AgentConfig(
        max_turns=z.max_turns, max_context_tokens=z.budget, context_signal=True, repeat_rule=True
    )
    greedy = SamplingConfig(max_new_tokens=z.max_new_tokens, stop=["</tool_call>"])
    model = cfg.model
    mp = precision(cfg)

    def eval_cfg(name: str, model_name: str) -> EvalConfig:
        e = EvalConfig(
            model=dataclasses.replace(model, name=model_name),
            sampling=greedy,
            agent=agent,
            env=dataclasses.replace(env, split="eval", limit=z.eval_tasks),
            arms=["react", "acm"],
            output=str(out / name),
            machine=cfg.machine or describe_machine(),
        )
        return e

    annotate = AnnotateConfig(
        model=model,
        sampling=greedy,
        agent=agent,
        env=train_env,
        arms=["react", "acm"],
        resumes=1,
        demonstrations=True,
        student_tasks=z.student_tasks,
        seed=cfg.seed,
        output=str(out / "annotate"),
    )
    annotate.teacher.pressure = 0.75
    annotate.teacher.pressure_spread = [0.5, 0.9]  # each task compacts at its own point
    sft = SFTConfig(
        model=model,
        dataset=str(out / "annotate"),
        seed=cfg.seed,
        output=str(out / "sft"),
        save_every=max(1, z.sft_steps // 2),
    )
    sft.optim.lr, sft.optim.max_steps, sft.optim.warmup_steps = 5e-4, z.sft_steps, 2
    sft.optim.batch_tokens, sft.optim.mixed_precision = 4096, mp
    grpo = GRPOConfig(
        model=dataclasses.replace(model, name=str(out / "sft" / "final")),
        agent=agent,
        env=train_env,
        arms=["acm"],
        group_size=z.group_size,
        tasks_per_step=z.grpo_tasks,
        kl_coef=0.02,
        seed=cfg.seed,
        output=str(out / "grpo"),
        save_every=max(1, z.grpo_steps),
    )
    grpo.sampling.max_new_tokens = z.max_new_tokens
    grpo.sampling.temperature = 0.8
    grpo.optim.lr, grpo.optim.max_steps, grpo.optim.schedule = 2e-5, z.grpo_steps, "constant"
    grpo.optim.batch_tokens, grpo.optim.mixed_precision = 8192, mp
    trained = str(out / "grpo" / "final")
    export = ExportConfig(
        model=dataclasses.replace(model, name=trained),
        arm="acm",
        env=env,
        agent=agent,
        eval_dir=str(out / "eval-trained"),
        output=str(out / "export"),
    )
    return {
        "eval-base": eval_cfg("eval-base", model.name),
        "annotate": annotate,
        "sft": sft,
        "grpo": grpo,
        "eval-trained": eval_cfg("eval-trained", trained),
        "export": export,
    }


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

    def _done(self, stage: str) -> Path:
        return self.out / ".done" / stage

    def stage(self, n: int, name: str, fn: Any, what: str) -> None:
        marker = self._done(name)
        if marker.exists():
            self.times[name] = float(json.loads(marker.read_text())["seconds"])
            self.skipped.append(name)
            self.console.print(f"[dim][{n}/{len(STAGES)}] {name}: done already, skipped[/dim]")
            return
        self.console.rule(f"[bold][{n}/{len(STAGES)}] {name}[/bold]: {what}")
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
        self.stage(1, "tasks", self._tasks, f"kb_search {z.preset}, budget {z.budget} tokens")
        self.stage(2, "eval-base", lambda: run_eval(c["eval-base"]), "the base model")
        self.stage(
            3, "annotate", lambda: run_annotate(c["annotate"]), "student, oracle teacher, resumes"
        )
        self.stage(4, "sft", lambda: run_sft(c["sft"]), f"{z.sft_steps} LoRA steps")
        self.stage(5, "grpo", lambda: run_grpo(c["grpo"]), f"{z.grpo_steps} GRPO steps")
        self.stage(6, "eval-trained", lambda: run_eval(c["eval-trained"]), "the trained policy")
        self.stage(7, "export", lambda: run_export(c["export"]), "merged HF folder + card")
        self.stage(
            8,
            "compare",
            lambda: compare(
                self.out / "eval-base", self.out / "eval-trained", self.out / "compare.md"
            ),
            "base vs trained",
        )
        self.stage(9, "curves", self._curves, "held-out numbers per stage, GRPO per step")
        return self.summary()

    def _curves(self) -> None:
        from acmrl.eval.curves import write_curves

        stages = [("base", self.out / "eval-base"), ("trained", self.out / "eval-trained")]
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
