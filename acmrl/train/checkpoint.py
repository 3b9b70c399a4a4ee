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


def _staging(root: str | Path, step: int) -> Path:
    return Path(root) / "checkpoints" / f".tmp-step-{step:06d}"


def stage_checkpoint(root: str | Path, step: int) -> Path:
    """An empty temporary folder for checkpoint ``step`` (what a half-written save left there
    is removed)."""
    tmp = _staging(root, step)
    tmp.parent.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    return tmp


def save_checkpoint(
    root: str | Path,
    step: int,
    model: Any,
    optimizer: Any,
    scheduler: Any,
    state: dict[str, Any],
    rng_ranks: list[dict[str, Any]] | None = None,
    tokenizer: Any = None,
    *,
    state_dict: dict[str, Any] | None = None,
    staged: bool = False,
) -> Path:
    """Write checkpoint ``step`` under ``root/checkpoints`` atomically; returns its folder.
    ``rng_ranks``: every training process's RNG state (index = rank), restored per rank.
    ``tokenizer`` is saved beside the weights, so ``model.name=<checkpoint>/model`` loads as it
    is (eval, export, a served checkpoint), a fully fine-tuned one too. ``state_dict``: the
    full weights gathered from a sharded model; ``optimizer=None`` with ``staged``: every
    process already wrote its optimizer shard into the staged folder."""
    ckpts = Path(root) / "checkpoints"
    final = ckpts / f"step-{step:06d}"
    tmp = _staging(root, step) if staged else stage_checkpoint(root, step)
    save_policy(model, tmp / "model", state_dict=state_dict)
    if tokenizer is not None:
        tokenizer.save_pretrained(tmp / "model")
    torch.save(
        {
            "optimizer": optimizer.state_dict() if optimizer is not None else None,
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


def is_sharded(acc: Any) -> bool:
    """Whether the model and optimizer are sharded over the processes (FSDP, DeepSpeed)."""
    from accelerate.utils import DistributedType

    return acc.distributed_type in (DistributedType.FSDP, DistributedType.DEEPSPEED)


def save_run_checkpoint(
    acc: Any,
    root: str | Path,
    step: int,
    model: Any,
    optimizer: Any,
    scheduler: Any,
    state: dict[str, Any],
    tokenizer: Any = None,
    *,
    sharded: bool | None = None,
) -> None:
    """Checkpoint ``step`` of a training run; every process calls it.

    Each process's RNG state is gathered. With a sharded model (FSDP, ZeRO-3) the full weights
    are gathered from every process (``accelerate``'s ``get_state_dict``) and each process
    writes its own optimizer shard (``optimizer-rank<i>.pt``) into the staged folder before the
    main process publishes it; ``sharded`` overrides the detection (tests)."""
    sharded = is_sharded(acc) if sharded is None else sharded
    state_dict = acc.get_state_dict(model) if sharded else None
    rng_ranks = None
    if acc.num_processes > 1:
        from accelerate.utils import gather_object

        rng_ranks = gather_object([rng_state()])
    if sharded:
        if acc.is_main_process:
            stage_checkpoint(root, step)
        acc.wait_for_everyone()
        shard = _staging(root, step) / f"optimizer-rank{acc.process_index}.pt"
        torch.save(optimizer.state_dict(), shard)
        acc.wait_for_everyone()
    if acc.is_main_process:
        save_checkpoint(
            root,
            step,
            acc.unwrap_model(model),
            None if sharded else optimizer,
            scheduler,
            state,
            rng_ranks,
            tokenizer,
            state_dict=state_dict,
            staged=sharded,
        )
    acc.wait_for_everyone()


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
    shard = path / f"optimizer-rank{rank}.pt"
    if blob["optimizer"] is None and not shard.is_file():
        raise ValueError(
            f"{path} holds the optimizer in per-process shards, and none for process {rank}: "
            "resume with the number of processes that wrote it"
        )
    optimizer.load_state_dict(
        blob["optimizer"]
        if blob["optimizer"] is not None
        else torch.load(shard, weights_only=False)
    )
    scheduler.load_state_dict(blob["scheduler"])
    ranks = blob.get("rng_ranks") or []
    set_rng_state(ranks[rank] if rank < len(ranks) else blob["rng"])
    return json.loads((path / STATE).read_text())
