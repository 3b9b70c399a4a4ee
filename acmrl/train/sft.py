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

from acmrl.config import SFTConfig
from acmrl.train.checkpoint import load_training_state, prune_checkpoints, save_run_checkpoint
from acmrl.train.common import (
    build_model,
    fill_batches,
    lr_lambda,
    make_accelerator,
    prefix_groups,
    save_policy,
    shares_prefix,
)
from acmrl.train.loop import train_loop
from acmrl.train.loss import sft_loss, target_logprobs, topk_kl_at
from acmrl.train.runs import start_run


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
            f"dataset {cfg.dataset!r} has no sample with weight > {cfg.min_weight} and a target "
            "(its card, README.md in the annotate output, counts what it holds: successful "
            "student runs, valid teacher edits, failed assessments)"
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


class SFTTrainer:
    """One SFT run: the model, optimiser and the deterministic batch order, one step at a time
    (:func:`acmrl.train.loop.train_loop` drives it)."""

    name = "sft"

    def __init__(
        self, cfg: SFTConfig, *, resume: bool | str = False, resume_from: str | Path | None = None
    ) -> None:
        torch.manual_seed(cfg.seed)
        self.cfg = cfg
        self.out = Path(cfg.output)
        ckpt = start_run(cfg, resume=resume, resume_from=resume_from)
        self.samples = load_samples(cfg)
        self.acc = acc = make_accelerator(cfg.optim.mixed_precision, cfg.log_with, str(self.out))
        model, self.tok, _ = build_model(cfg, ckpt)
        self.params = [p for p in model.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(self.params, lr=cfg.optim.lr, weight_decay=cfg.optim.weight_decay)
        self.sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(cfg.optim))
        state: dict[str, Any] = {"step": 0, "epoch": 0, "batch": 0, "losses": []}
        if ckpt is not None:
            state = load_training_state(ckpt, opt, self.sched, rank=acc.process_index)
        self.model, self.opt = acc.prepare(model, opt)
        tok = self.tok
        self.pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        self.start_step, self.epoch, self.pos = state["step"], state["epoch"], state["batch"]
        self.losses: list[float] = list(state["losses"])
        self.batches = self._epoch(self.epoch)
        self.share = shares_prefix(cfg, acc.num_processes)
        self.model.train()

    def _epoch(self, epoch: int) -> list[list[int]]:
        acc = self.acc
        return epoch_batches(self.samples, epoch, self.cfg)[acc.process_index :: acc.num_processes]

    def step(self, step: int) -> dict[str, float]:
        cfg, acc = self.cfg, self.acc
        t0 = time.perf_counter()
        if self.pos >= len(self.batches):
            self.epoch, self.pos = self.epoch + 1, 0
            self.batches = self._epoch(self.epoch)
        idx = self.batches[self.pos]
        batch = collate([self.samples[i] for i in idx], cfg.max_len, self.pad, acc.device)
        lp, logits = target_logprobs(
            self.model,
            batch["input_ids"],
            batch["attention_mask"],
            batch["loss_mask"],
            share_prefix=self.share,
        )
        nll = sft_loss(lp, batch["loss_mask"], batch["weights"])
        use_kl = cfg.kl_coef and "topk_ids" in batch
        kl = sft_topk_kl(logits, batch) if use_kl else torch.zeros(())
        loss = nll + cfg.kl_coef * kl
        acc.backward(loss)
        if cfg.optim.max_grad_norm:
            acc.clip_grad_norm_(self.params, cfg.optim.max_grad_norm)
        self.opt.step()
        self.sched.step()
        self.opt.zero_grad()
        self.pos += 1
        self.losses.append(float(loss.detach()))
        tokens = int(batch["attention_mask"].sum())
        metrics = {
            "loss": self.losses[-1],
            "nll": float(nll.detach()),
            "kl": float(kl.detach()),
            "lr": self.sched.get_last_lr()[0],
            "target_tokens": int(batch["loss_mask"].sum()),
            "tokens_per_s": tokens / max(1e-9, time.perf_counter() - t0),  # the step's own time
        }
        return metrics

    def describe(self, metrics: dict[str, float]) -> str:
        return f"loss {metrics['loss']:.4f}"

    def save(self, step: int) -> None:
        extra = {"epoch": self.epoch, "batch": self.pos, "losses": self.losses[-1000:]}
        save_run_checkpoint(
            self.acc, self.out, step, self.model, self.opt, self.sched, extra, self.tok
        )
        if self.acc.is_main_process:
            prune_checkpoints(self.out, self.cfg.save_total_limit)

    def save_final(self) -> Path:
        final = self.out / "final"
        if self.acc.is_main_process:
            save_policy(self.acc.unwrap_model(self.model), final)
            self.tok.save_pretrained(final)
        return final

    def close(self) -> None:
        pass

    def result(self) -> dict[str, Any]:
        return {"losses": self.losses}


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
    trainer = SFTTrainer(cfg, resume=resume, resume_from=resume_from)
    return train_loop(trainer, cfg, stop_after)
