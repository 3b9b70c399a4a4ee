"""Checkpoints that survive a kill: written to a temporary folder, published by one rename.

A checkpoint folder ``checkpoints/step-000050`` holds the adapter or model (``save_pretrained``),
the optimiser and scheduler state, every RNG state, and ``trainer_state.json`` (step, data
position, recent losses). It becomes visible only once complete, so a kill during a save leaves
the previous checkpoint as the latest; ``--resume`` picks the newest complete one.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from acmrl.train.common import save_policy

STATE = "trainer_state.json"


def rng_state() -> dict[str, Any]:
    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if state["cuda"]:
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(
    root: str | Path,
    step: int,
    model: Any,
    optimizer: Any,
    scheduler: Any,
    state: dict[str, Any],
    rng_ranks: list[dict[str, Any]] | None = None,
    tokenizer: Any = None,
) -> Path:
    """Write checkpoint ``step`` under ``root/checkpoints`` atomically; returns its folder.
    ``rng_ranks``: every training process's RNG state (index = rank), restored per rank.
    ``tokenizer`` is saved beside the weights, so ``model.name=<checkpoint>/model`` loads as it
    is (eval, export, a served checkpoint), a fully fine-tuned one too."""
    ckpts = Path(root) / "checkpoints"
    ckpts.mkdir(parents=True, exist_ok=True)
    final = ckpts / f"step-{step:06d}"
    tmp = ckpts / f".tmp-step-{step:06d}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    save_policy(model, tmp / "model")
    if tokenizer is not None:
        tokenizer.save_pretrained(tmp / "model")
    torch.save(
        {
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "rng": rng_state(),
            "rng_ranks": rng_ranks or [],
        },
        tmp / "training.pt",
    )
    (tmp / STATE).write_text(json.dumps({**state, "step": step}, indent=1))
    with (tmp / STATE).open() as f:
        os.fsync(f.fileno())
    if final.exists():  # re-saving the same step (a resumed run): replace it
        shutil.rmtree(final)
    os.replace(tmp, final)
    return final


def prune_checkpoints(root: str | Path, keep: int | None) -> list[Path]:
    """Delete all but the newest ``keep`` complete checkpoints (None keeps every one); returns
    the deleted folders. A checkpoint is removed only after a newer one is complete."""
    ckpts = Path(root) / "checkpoints"
    if keep is None or not ckpts.exists():
        return []
    done = sorted(p for p in ckpts.glob("step-*") if (p / STATE).exists())
    old = done[: max(0, len(done) - keep)]
    for path in old:
        # renamed first, so a kill half-way never leaves a half-deleted "complete" checkpoint
        doomed = path.with_name(f".del-{path.name}")
        os.replace(path, doomed)
        shutil.rmtree(doomed, ignore_errors=True)
    return old


def latest_checkpoint(root: str | Path) -> Path | None:
    ckpts = Path(root) / "checkpoints"
    done = sorted(p for p in ckpts.glob("step-*") if (p / STATE).exists()) if ckpts.exists() else []
    return done[-1] if done else None


def load_training_state(
    path: Path, optimizer: Any, scheduler: Any, rank: int = 0
) -> dict[str, Any]:
    """Restore optimiser, scheduler and RNG states (this process's own, when every process's
    was saved); returns ``trainer_state.json``."""
    blob = torch.load(path / "training.pt", weights_only=False)
    optimizer.load_state_dict(blob["optimizer"])
    scheduler.load_state_dict(blob["scheduler"])
    ranks = blob.get("rng_ranks") or []
    set_rng_state(ranks[rank] if rank < len(ranks) else blob["rng"])
    return json.loads((path / STATE).read_text())
