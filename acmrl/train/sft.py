"""``acmrl train sft``: supervised fine-tuning on a teacher-annotated dataset.

Each sample is the exact token sequence the student read and wrote (after any compaction); the
loss is the negative log-likelihood of its target tokens (``loss_mask``: the teacher's turn and
the student's own tokens), each sample weighted by its ``weight`` (the assessment's soft
supervision), aggregated per token. With ``kl_coef`` > 0, a forward KL to the teacher's stored
top-k logprobs is added at the same positions. LoRA (peft) by default, full fine-tuning with
``lora.enabled=false``; ``accelerate`` places the model and runs unchanged under
``accelerate launch`` (each process takes every n-th batch; gradients are averaged).

Batches are formed deterministically from the seed and the epoch, so a run resumed from a
checkpoint (``--resume``) sees the same next batch and reproduces the losses.
"""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

import torch

from acmrl.config import SFTConfig, to_dict
from acmrl.train.checkpoint import load_training_state, prune_checkpoints, save_run_checkpoint
from acmrl.train.common import (
    MetricsLog,
    build_model,
    fill_batches,
    lr_lambda,
    make_accelerator,
    prefix_groups,
    progress_bar,
    save_policy,
    shares_prefix,
)
from acmrl.train.loss import sft_loss, target_logprobs, topk_kl_at
from acmrl.train.runs import Preemption, start_run


def load_samples(cfg: SFTConfig) -> list[dict[str, Any]]:
    """The trainable samples of every dataset of ``cfg.dataset``, in order."""
    from datasets import load_from_disk

    folders = [cfg.dataset] if isinstance(cfg.dataset, str) else list(cfg.dataset)
    samples: list[dict[str, Any]] = []
    for folder in folders:
        path = Path(folder)
        if (
            not (path / "dataset_dict.json").exists()
            and (path / "dataset" / "dataset_dict.json").exists()
        ):
            path = path / "dataset"  # the annotate output folder was given
        try:
            ds = load_from_disk(str(path))
        except FileNotFoundError as exc:
            raise ValueError(
                f"dataset {folder!r} not found: give the folder acmrl annotate wrote"
            ) from exc
        samples += [
            s for s in ds["samples"] if s["weight"] > cfg.min_weight and any(s["loss_mask"])
        ]
    if not samples:
        raise ValueError(
            f"dataset {cfg.dataset!r} has no sample with weight > {cfg.min_weight} and a target"
        )
    return samples


def epoch_batches(samples: list[dict[str, Any]], epoch: int, cfg: SFTConfig) -> list[list[int]]:
    """Sample indices per batch for ``epoch``: a seeded shuffle, filled up to ``batch_tokens``
    counting padding (a sample longer than the budget is a batch alone).

    With ``optim.share_prefix`` the samples are first grouped by how they start (the policy's
    turns of one arm, the summariser's calls, ...), shuffled within each group, and a batch's
    common prefix counts once, as it is read once (:func:`acmrl.train.loss.target_logprobs`);
    the batches are then shuffled across groups."""
    rng = random.Random(cfg.seed * 1_000_003 + epoch)
    order = list(range(len(samples)))
    rng.shuffle(order)
    ids = [s["token_ids"] for s in samples]
    masks = [s["loss_mask"] for s in samples]
    budget, max_len = cfg.optim.batch_tokens, cfg.max_len
    if not cfg.optim.share_prefix:
        return fill_batches(ids, masks, [order], budget, max_len, shared=False)
    batches = fill_batches(ids, masks, prefix_groups(ids, order), budget, max_len, shared=True)
    rng.shuffle(batches)
    return batches


def collate(
    samples: list[dict[str, Any]], max_len: int, pad_id: int, device: Any
) -> dict[str, torch.Tensor]:
    """Padded tensors of a batch. ``loss_mask`` is 1 on the targets with a weight > 0 and
    ``weights`` holds each token's weight (a dataset without per-token weights repeats the
    sample's). ``topk_mask`` marks the targets that have the teacher's top-k: a sample without
    them, or a position past the stored ones, gets the NLL only, never a KL to padding."""
    T = max(min(len(s["token_ids"]), max_len) for s in samples)
    B = len(samples)
    ids = torch.full((B, T), pad_id, dtype=torch.long)
    attn = torch.zeros(B, T, dtype=torch.long)
    mask = torch.zeros(B, T, dtype=torch.long)
    weights = torch.zeros(B, T)
    k = max((len(t) for s in samples for t in s.get("teacher_topk_ids", [])[:1]), default=0)
    topk_ids = torch.zeros(B, T, max(k, 1), dtype=torch.long)
    topk_lp = torch.zeros(B, T, max(k, 1))
    topk_mask = torch.zeros(B, T, dtype=torch.bool)
    for b, s in enumerate(samples):
        n = min(len(s["token_ids"]), T)
        ids[b, :n] = torch.tensor(s["token_ids"][:n])
        attn[b, :n] = 1
        w = s.get("weights") or [float(s["weight"])] * len(s["token_ids"])
        weights[b, :n] = torch.tensor(w[:n], dtype=torch.float32)
        mask[b, :n] = torch.tensor(s["loss_mask"][:n]) * (weights[b, :n] > 0)
        # the teacher's top-k pairs with the targets of the stored loss mask, in order
        targets = [i for i, m in enumerate(s["loss_mask"]) if m and i > 0]
        for j, pos in enumerate(targets[: len(s.get("teacher_topk_ids", []))]):
            if pos < T and len(s["teacher_topk_ids"][j]) == k:
                topk_ids[b, pos] = torch.tensor(s["teacher_topk_ids"][j])
                topk_lp[b, pos] = torch.tensor(s["teacher_topk_logprobs"][j])
                topk_mask[b, pos] = True
    mask[:, 0] = 0  # position 0 has no prefix to predict it from
    out = {"input_ids": ids, "attention_mask": attn, "loss_mask": mask, "weights": weights}
    if k:
        out |= {"topk_ids": topk_ids, "topk_logprobs": topk_lp, "topk_mask": topk_mask}
    return {key: v.to(device) for key, v in out.items()}


def sft_topk_kl(logits: torch.Tensor, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """The top-k KL over the targets that have the teacher's top-k (``logits`` are the ``[N, V]``
    logits of the N targets of ``loss_mask``, in order, as :func:`target_logprobs` gives them)."""
    tmask = batch["loss_mask"].bool()  # position 0 is never a target (collate)
    has = batch["topk_mask"][tmask]
    return topk_kl_at(
        logits[has], batch["topk_ids"][tmask][has], batch["topk_logprobs"][tmask][has]
    )


def run_sft(
    cfg: SFTConfig,
    *,
    resume: bool | str = False,
    resume_from: str | Path | None = None,
    stop_after: int | None = None,
) -> dict[str, Any]:
    """Train; ``resume`` continues from the newest checkpoint under ``output``, ``resume_from``
    from a given checkpoint or run folder (acmrl/train/runs.py). SIGTERM or SIGUSR1 saves a
    checkpoint after the current step and returns with ``interrupted`` set to the signal.
    ``stop_after`` ends the run early after that many steps (tests)."""
    torch.manual_seed(cfg.seed)
    out = Path(cfg.output)
    ckpt = start_run(cfg, resume=resume, resume_from=resume_from)
    samples = load_samples(cfg)
    acc = make_accelerator(cfg.optim.mixed_precision, cfg.log_with, str(out))
    model, tok, _ = build_model(cfg, ckpt)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.optim.lr, weight_decay=cfg.optim.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(cfg.optim))
    state: dict[str, Any] = {"step": 0, "epoch": 0, "batch": 0, "losses": []}
    if ckpt is not None:
        state = load_training_state(ckpt, opt, sched, rank=acc.process_index)
    model, opt = acc.prepare(model, opt)
    if cfg.log_with:
        acc.init_trackers("acmrl-sft", config={k: str(v) for k, v in to_dict(cfg).items()})
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    step, epoch, pos = state["step"], state["epoch"], state["batch"]
    losses: list[float] = list(state["losses"])
    batches = epoch_batches(samples, epoch, cfg)[acc.process_index :: acc.num_processes]
    share = shares_prefix(cfg, acc.num_processes)
    model.train()
    t0 = time.perf_counter()
    history = MetricsLog(out / "metrics.jsonl", step) if acc.is_main_process else None
    progress = progress_bar("sft", acc.is_main_process)
    bar = progress.add_task("sft", total=cfg.optim.max_steps, completed=step, info="")
    progress.start()
    saved = step
    with Preemption() as stop:
        while step < cfg.optim.max_steps:
            if pos >= len(batches):
                epoch, pos = epoch + 1, 0
                batches = epoch_batches(samples, epoch, cfg)[acc.process_index :: acc.num_processes]
            batch = collate([samples[i] for i in batches[pos]], cfg.max_len, pad, acc.device)
            lp, logits = target_logprobs(
                model,
                batch["input_ids"],
                batch["attention_mask"],
                batch["loss_mask"],
                share_prefix=share,
            )
            nll = sft_loss(lp, batch["loss_mask"], batch["weights"])
            use_kl = cfg.kl_coef and "topk_ids" in batch
            kl = sft_topk_kl(logits, batch) if use_kl else torch.zeros(())
            loss = nll + cfg.kl_coef * kl
            acc.backward(loss)
            if cfg.optim.max_grad_norm:
                acc.clip_grad_norm_(params, cfg.optim.max_grad_norm)
            opt.step()
            sched.step()
            opt.zero_grad()
            step, pos = step + 1, pos + 1
            losses.append(float(loss.detach()))
            tokens = int(batch["attention_mask"].sum())
            logged = {
                "loss": losses[-1],
                "nll": float(nll.detach()),
                "kl": float(kl.detach()),
                "lr": sched.get_last_lr()[0],
                "target_tokens": int(batch["loss_mask"].sum()),
                "tokens_per_s": tokens / max(1e-9, time.perf_counter() - t0),
            }
            acc.log(logged, step=step)
            if history is not None:
                history.write(step, logged)
            t0 = time.perf_counter()
            progress.update(bar, completed=step, info=f"loss {losses[-1]:.4f}")
            preempted = stop.requested(acc)
            if step % cfg.save_every == 0 or step == cfg.optim.max_steps or preempted:
                saved = step
                save_run_checkpoint(
                    acc,
                    out,
                    step,
                    model,
                    opt,
                    sched,
                    {"epoch": epoch, "batch": pos, "losses": losses[-1000:]},
                    tok,
                )
                if acc.is_main_process:
                    prune_checkpoints(out, cfg.save_total_limit)
            if preempted or (stop_after is not None and step >= stop_after):
                break
    progress.stop()
    interrupted = stop.report("sft", saved, cfg.optim.max_steps)
    if acc.is_main_process and step == cfg.optim.max_steps:
        final = out / "final"
        save_policy(acc.unwrap_model(model), final)
        tok.save_pretrained(final)
    acc.end_training()
    return {
        "steps": step,
        "losses": losses,
        "output": str(out),
        "processes": acc.num_processes,
        "rank": acc.process_index,
        "interrupted": interrupted,
        "exit_code": stop.exit_code() if interrupted is not None else 0,
    }
