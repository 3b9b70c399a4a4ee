"""What keeps a long training run alive under a scheduler.

- :func:`start_run` picks the checkpoint a run continues from (``--resume``: the newest complete
  one under ``output``; ``--resume-from PATH``: a given checkpoint or run folder), writes the
  resolved config to ``output/config.yaml``, and on a resume compares it with the config the
  checkpoint's run saved: a change that would make the continuation a different run (learning
  rate, data, model, LoRA rank, ...) is refused, naming every changed key.
- :class:`Preemption` turns SIGTERM and SIGUSR1 (what Slurm sends before a time limit or a
  preemption, ``#SBATCH --signal=USR1@600``) into "save a checkpoint after this step and stop";
  with several processes the request is agreed by all of them, so every rank stops at the same
  step. The command then exits with 128 + the signal number, and ``--resume`` continues exactly.
- Checkpoint retention (``save_total_limit``) is :func:`acmrl.train.checkpoint.prune_checkpoints`.
"""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path
from typing import Any

from acmrl.config import TrainConfig, to_dict
from acmrl.train.checkpoint import STATE, latest_checkpoint

CONFIG = "config.yaml"

#: keys that may change when a run is continued: how long it runs, how often it saves, where
#: it writes and logs, how many episodes are in flight. Any other change is refused.
RESUMABLE = (
    "optim.max_steps",
    "save_every",
    "save_total_limit",
    "log_with",
    "output",
    "concurrency",
    "save_rollouts",
)


# options whose absence from a saved run means another value than their default now (the run
# predates them and behaved that way), and whether it matters in that run (its flat config)
FORMER: dict[str, tuple[Any, Any]] = {
    # decision groups kept their source as a member until decisions.source existed
    "decisions.source": ("member", lambda run: (run.get("decisions.share") or 0) > 0),
}


def _flat(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in d.items():
        if isinstance(value, dict) and value and all(isinstance(k, str) for k in value):
            out |= _flat(value, f"{prefix}{key}.")
        else:
            out[f"{prefix}{key}"] = value
    return out


def config_changes(
    old: dict[str, Any], new: dict[str, Any], defaults: dict[str, Any] | None = None
) -> list[str]:
    """``key: old -> new`` for every key that differs and may not change on a resume.

    An option the old config lacks (a run saved before the option existed) is no change while
    the new config keeps its value in ``defaults``: a new option defaults to the old behaviour,
    except the options of :data:`FORMER`, whose absence means their former value.

    >>> config_changes({"agent": {"a": 1}}, {"agent": {"a": 1, "b": False}}, {"agent": {"b": False}})
    []
    >>> config_changes({"agent": {"a": 1}}, {"agent": {"a": 1, "b": True}}, {"agent": {"b": False}})
    ["agent.b: '<absent>' -> True"]
    """
    a, b, d = _flat(old), _flat(new), _flat(defaults or {})
    changed = []
    for key in sorted(set(a) | set(b)):
        if key in RESUMABLE or key.split(".")[0] in RESUMABLE:
            continue
        if key not in a and key in FORMER:
            former, matters = FORMER[key]
            if matters(a) and b.get(key) != former:
                changed.append(f"{key}: {former!r} (before the option existed) -> {b.get(key)!r}")
            continue
        if key not in a and key in d and b.get(key) == d[key]:
            continue
        if a.get(key, "<absent>") != b.get(key, "<absent>"):
            changed.append(f"{key}: {a.get(key, '<absent>')!r} -> {b.get(key, '<absent>')!r}")
    return changed


def _checkpoint_at(path: Path) -> Path:
    """A checkpoint folder, or the newest complete one of a run folder."""
    if (path / STATE).is_file():
        return path
    found = latest_checkpoint(path)
    if found is None:
        raise ValueError(
            f"--resume-from {path}: neither a checkpoint (no {STATE}) nor a run folder with a "
            "complete checkpoint under checkpoints/"
        )
    return found


def start_run(
    cfg: TrainConfig, *, resume: bool | str = False, resume_from: str | Path | None = None
) -> Path | None:
    """The checkpoint this run continues from (None: a fresh start), after writing the resolved
    config to ``output/config.yaml`` (atomically) and checking it against the checkpoint's run.
    ``resume="auto"`` continues from the newest checkpoint when there is one (a requeued job)."""
    import yaml

    out = Path(cfg.output)
    ckpt: Path | None = None
    if resume_from is not None:
        ckpt = _checkpoint_at(Path(resume_from))
    elif resume:
        ckpt = latest_checkpoint(out)
        if ckpt is None and resume != "auto":
            raise ValueError(f"--resume: no complete checkpoint under {out}/checkpoints")
    resolved = to_dict(cfg)
    if ckpt is not None:
        saved = ckpt.parent.parent / CONFIG
        if saved.is_file():
            old = yaml.safe_load(saved.read_text()) or {}
            changes = config_changes(old, resolved, to_dict(type(cfg)()))
            if changes:
                raise ValueError(
                    f"resuming from {ckpt}: the config differs from the one its run saved "
                    f"({saved}) in " + "; ".join(changes) + ". Restore those values, or start "
                    f"a new run (only {', '.join(RESUMABLE)} may change on a resume)"
                )
    # every process writes the same text; each through its own temporary file
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / f".{CONFIG}.{os.getpid()}"
    tmp.write_text(yaml.safe_dump(resolved, sort_keys=False))
    os.replace(tmp, out / CONFIG)
    return ckpt


class Preemption:
    """``with Preemption() as stop:`` ... ``if stop.requested(acc): save, break``.

    Installs handlers for SIGTERM and SIGUSR1 (main thread only; elsewhere it never fires) and
    restores the previous ones on exit. ``signum`` is the signal received, or None.
    """

    SIGNALS = (signal.SIGTERM, signal.SIGUSR1)

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous: dict[int, Any] = {}

    def _handle(self, signum: int, frame: Any) -> None:
        self.signum = signum

    def start(self) -> Preemption:
        if threading.current_thread() is threading.main_thread():
            for sig in self.SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def close(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def __enter__(self) -> Preemption:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def requested(self, acc: Any = None) -> bool:
        """Whether any process received a signal (a collective when there are several)."""
        local = self.signum or 0
        if acc is not None and acc.num_processes > 1:
            import torch

            flag = torch.tensor([float(local)], device=acc.device)
            local = int(acc.reduce(flag, reduction="sum").item())
            if local and self.signum is None:
                self.signum = int(signal.SIGTERM)  # another rank was signalled
        return bool(local)

    def report(self, kind: str, step: int, total: int) -> int | None:
        """The signal that stopped a run before its last step (None: it was not stopped, or it
        had finished anyway), said once on stdout."""
        if self.signum is None or step >= total:
            return None
        print(
            f"{kind}: signal {self.signum} received; checkpoint at step {step} saved, stopping "
            "(continue with --resume)",
            flush=True,
        )
        return self.signum

    def exit_code(self) -> int:
        """128 + the signal number, the shell's code for "ended by that signal"."""
        return 128 + int(self.signum or signal.SIGTERM)
