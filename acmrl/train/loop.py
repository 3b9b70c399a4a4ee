"""The training loop that SFT and GRPO share: steps, metrics, progress, checkpoints, preemption.

A trainer (:class:`Trainer`) knows how to take one optimiser step and how to save; the loop
(:func:`train_loop`) drives it: it starts the trackers, writes every step's metrics to
``metrics.jsonl`` and the configured trackers, shows a progress bar, saves every ``save_every``
steps, at the last step and when SIGTERM or SIGUSR1 arrives (then it stops, and the result says
which signal and the exit code to leave with), prunes old checkpoints through the trainer's
``save``, stops early at ``stop_after`` (tests), and saves the final policy when the run
reached ``max_steps``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from acmrl.config import TrainConfig, to_dict
from acmrl.models import pick_device, release_freed_memory
from acmrl.train.common import MetricsLog, progress_bar
from acmrl.train.runs import Preemption


class Trainer(Protocol):
    """What :func:`train_loop` needs of a trainer."""

    name: str  # "sft", "grpo": the progress bar, the trackers' project, the preemption message
    acc: Any  # its accelerate.Accelerator
    out: Path  # the run folder
    start_step: int  # the step it resumes at (0 for a fresh run)

    def step(self, step: int) -> dict[str, float]:
        """Optimiser step ``step`` (0-based); its metrics."""
        ...

    def describe(self, metrics: dict[str, float]) -> str:
        """The progress bar's text for a step's metrics."""
        ...

    def save(self, step: int) -> None:
        """A checkpoint after ``step`` steps (old ones pruned)."""
        ...

    def save_final(self) -> Path:
        """The trained policy under ``out/final``."""
        ...

    def close(self) -> None:
        """Release what the run holds (logs, connections), whether it ended or failed."""
        ...

    def result(self) -> dict[str, Any]:
        """The trainer's own entries of the run's result (its losses, rewards)."""
        ...


def train_loop(trainer: Trainer, cfg: TrainConfig, stop_after: int | None = None) -> dict[str, Any]:
    """Run ``trainer`` from its start step to ``cfg.optim.max_steps``; the run's result."""
    acc, total = trainer.acc, cfg.optim.max_steps
    if cfg.log_with:
        config = {k: str(v) for k, v in to_dict(cfg).items()}
        acc.init_trackers(f"acmrl-{trainer.name}", config=config)
    step = saved = trainer.start_step
    trim = cfg.model.malloc_trim_every if pick_device(cfg.model.device) == "cpu" else None
    history = MetricsLog(trainer.out / "metrics.jsonl", step) if acc.is_main_process else None
    progress = progress_bar(trainer.name, acc.is_main_process)
    bar = progress.add_task(trainer.name, total=total, completed=step, info="")
    progress.start()
    stop = Preemption().start()
    try:
        while step < total:
            metrics = trainer.step(step)
            step += 1
            if trim and step % trim == 0:
                release_freed_memory()
            acc.log(metrics, step=step)
            if history is not None:
                history.write(step, metrics)
            progress.update(bar, completed=step, info=trainer.describe(metrics))
            preempted = stop.requested(acc)
            if step % cfg.save_every == 0 or step == total or preempted:
                trainer.save(step)
                saved = step
            if preempted or (stop_after is not None and step >= stop_after):
                break
    finally:
        stop.close()
        progress.stop()
        trainer.close()
    interrupted = stop.report(trainer.name, saved, total)
    final = trainer.save_final() if step == total else None
    acc.end_training()
    return {
        "steps": step,
        **trainer.result(),
        "output": str(trainer.out),
        "final": str(final) if final else None,
        "processes": acc.num_processes,
        "rank": acc.process_index,
        "interrupted": interrupted,
        "exit_code": stop.exit_code() if interrupted is not None else 0,
    }
