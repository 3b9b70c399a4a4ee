"""``acmrl train grpo``: online GRPO on task success minus compaction cost.

The algorithm, per step ``s`` (one optimiser step per ``updates_per_step``):

1. **Tasks.** ``tasks_per_step`` tasks of the training split, taken in order from a shuffle of
   the split that is seeded by ``seed`` and the epoch, so the data position is the step number
   and a resumed run sees the same next tasks. Under ``accelerate launch`` each process takes
   every n-th of them.
2. **Rollouts.** ``group_size`` (G) episodes per task and arm, run by the rollout workers
   (:func:`acmrl.rollout.worker.run_episodes`). The sampling policy is always the current one:
   the ``hf`` engine runs *the model being trained* (the same parameter tensors; LoRA layers
   included); the ``vllm`` engine serves the trained LoRA adapter, saved and loaded under a new
   LoRA id after every optimiser step, and so do ``openai`` servers (vLLM's runtime adapter
   API), or under full fine-tuning they receive the full weights over NCCL through TRL's
   ``VLLMClient`` (:mod:`acmrl.train.weight_sync`). Each episode's sampling seed derives from (seed, step,
   episode id). With ``rollout_dtype`` (``auto``: bfloat16 under bf16 mixed precision) the
   ``hf`` engine samples from a merged copy of the policy in that dtype, refreshed after every
   optimiser step (:mod:`acmrl.train.sampler`): at bf16 speed, with the old logprobs
   recomputed by the trainer as always.
   With ``decisions.share`` > 0, that share of the groups are *decision groups*
   (:mod:`acmrl.train.decisions`): one episode (a scout, not trained), then G branches that
   replay it up to one of its decision states (a compaction call, manage_context or evolve, or
   an input above ``decisions.context_share`` of the budget) and sample from there on, in a
   second phase (``decisions.source=member``: the episode and G - 1 branches).
3. **Rewards.** :func:`acmrl.rewards.trajectory_reward`: success minus the weighted Compaction
   Cost (summariser and querier tokens included, in units of the budget), malformed-call and
   compress-loop penalties. Every term is logged.
4. **Advantages.** Group-relative: each rollout's reward minus the mean of its group (task x
   arm); divided by the group's std when ``scale_advantages``. An advantage belongs to an
   episode, computed before the episode is split into segments: an episode counts once in its
   group however many segments its compactions cut it into. An episode that a tool-server
   incident marked (``env_incidents``) and a decision group's scout are left out of their
   group's mean and trained on nothing.
5. **Samples.** :func:`acmrl.train.samples.trajectory_samples`: per-turn samples (segments),
   consecutive calls packed while the prompt extends the previous sequence, a new sample at
   every prefix break (compaction); the loss mask covers the policy's own tokens. Every target
   token of a rollout shares its advantage; a decision group's member has targets only at its
   decision turn (``decisions.credit=continuation``: from it on).
6. **Loss.** :func:`acmrl.train.loss.grpo_loss`: ``-min(r A, clip(r, 1-eps, 1+eps) A)`` with
   ``r = exp(logp - logp_old)``, averaged over all target tokens of the step's batch (token-level
   aggregation), plus ``kl_coef`` x the k3 estimate of KL(policy || reference). The average is
   weighted per segment (:func:`acmrl.train.grpo_steps.segment_coefficients`): by default every
   target token counts once; ``aggregation=segment`` averages within each segment first, and
   ``segment_weight=inverse`` gives each segment 1 / its episode's segments, so an episode's
   weight does not grow with the compactions it made. Gradients accumulate over micro-batches
   of at most ``optim.batch_tokens`` tokens.

Deliberate departures from textbook GRPO (DeepSeekMath):

- **Token-level aggregation** over the whole batch (DAPO, Dr. GRPO) instead of a per-sequence
  mean: an episode's many turns weigh by their tokens, and long turns are not discounted.
- **Advantages are not std-scaled by default** (Dr. GRPO): std scaling up-weights groups that
  are nearly all right or all wrong. ``scale_advantages=true`` restores it.
- **Multi-turn, multi-sample rollouts.** One rollout is an episode of many model calls; after a
  compaction the context is rebuilt, so one rollout gives several samples, each exactly the
  token sequence the model read, all with the rollout's advantage.
- **The summariser and querier calls are trained too** (``train_helpers``): the student writes
  its own summaries and memory extracts; their tokens get the rollout's advantage, so GRPO
  shapes how to compact as well as when.
- **Flat groups are skipped** (``skip_flat_groups``, as DAPO's dynamic-sampling filter but
  without re-sampling): a group whose rewards are all equal has zero advantage and, without a
  KL term, no gradient; it is not forwarded.
- **Groups without a success can be dropped too** (``skip_failed_groups``): where every
  rollout failed, the rewards differ by the cost terms only, so the group would push towards
  the cheapest failure (a wrong answer without the last compaction, an early overflow); with
  ``scale_advantages`` that push has the full advantage scale. DAPO's filter drops all-wrong
  groups as well; all-right groups are kept here, as their cost differences are the timing
  signal.
- **Old logprobs are recomputed** by the trainer before the update (``old_logprobs=recompute``,
  as verl does) rather than taken from the engine: the engine's batched, cached decoding is not
  bit-identical to the training forward, and the ratio must be 1 on the first update. With one
  update per step they are the update's own forward, detached (as TRL does for one iteration);
  with more, a separate no-grad pass before the first. The mean absolute difference to the
  engine's logprobs is logged (``logprob_mismatch``).
- **Temperature.** Logits are divided by the sampling temperature in the loss, so the trained
  distribution is the one sampled from (as TRL does).
- **The reference** for the KL is the start model: the policy with its adapter disabled under
  LoRA (an SFT adapter given as ``model.name`` is merged into the base first), a frozen copy
  of the start model under full fine-tuning (reloaded from ``model.name`` on ``--resume``).
- **Checkpoints are the trained policy.** Started from an SFT adapter, the merged start model
  is saved once as ``start-model/`` and every adapter the run writes names it as its base (with
  its id), so ``acmrl eval`` / ``acmrl export`` / ``model.name=`` on a checkpoint compute what
  the live policy computed at that step; an adapter on another base is refused.
- **Multi-process.** Each process rolls out its own tasks; a group never spans processes, so
  advantages need no communication; token-level aggregation is per process and DDP averages the
  gradients. FSDP and ZeRO-3 shard the weights the ``hf`` engine samples from and are not
  supported for GRPO (they are for SFT).
"""

from __future__ import annotations

import copy
import time
import warnings
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch
from peft import PeftModel

from acmrl.config import GRPOConfig
from acmrl.envs import Environment
from acmrl.rewards import trajectory_reward
from acmrl.rollout.agent import Episode
from acmrl.rollout.environment import build_environment
from acmrl.rollout.worker import JsonlLog, run_episodes
from acmrl.train.checkpoint import load_training_state, prune_checkpoints, save_run_checkpoint
from acmrl.train.common import (
    build_model,
    fill_batches,
    load_start_model,
    lr_lambda,
    make_accelerator,
    prefix_groups,
    save_policy,
    shares_prefix,
)
from acmrl.train.decisions import branch_phase, live_calls, own_prefill
from acmrl.train.grpo_steps import (
    branching_groups,
    episode_facts,
    group_key,
    reward_weights,
    rollout_metrics,
    segment_coefficients,
    step_episodes,
    step_tasks,
)
from acmrl.train.loop import train_loop
from acmrl.train.loss import entropy, group_advantages, grpo_loss, target_logprobs
from acmrl.train.runs import start_run
from acmrl.train.samples import Sample, trajectory_samples


def token_batches(
    samples: list[Sample], budget: int, max_len: int, shared: bool = False
) -> list[list[int]]:
    """Indices of ``samples`` in micro-batches of at most ``budget`` tokens of work, in order of
    length so padding is small (a sample longer than the budget is a batch alone). With
    ``shared`` (``optim.share_prefix`` on one process) a micro-batch holds samples of one start
    (the policy's turns share the system prompt and tool definitions, the summariser's calls
    theirs), whose common prefix is read once and counts once."""
    order = sorted(range(len(samples)), key=lambda i: len(samples[i].token_ids))
    ids = [s.token_ids for s in samples]
    masks = [s.loss_mask for s in samples]
    groups = prefix_groups(ids, order) if shared else [order]
    return fill_batches(ids, masks, groups, budget, max_len, shared)


def collate(
    samples: list[Sample],
    advantages: list[float],
    max_len: int,
    pad_id: int,
    device: Any,
    coefficients: list[float] | None = None,
) -> dict[str, torch.Tensor]:
    """A micro-batch; ``loss_weight`` is the loss mask times each sample's segment coefficient
    (:func:`acmrl.train.grpo_steps.segment_coefficients`; 1 when none is given)."""
    T = max(min(len(s.token_ids), max_len) for s in samples)
    B = len(samples)
    ids = torch.full((B, T), pad_id, dtype=torch.long)
    attn = torch.zeros(B, T, dtype=torch.long)
    mask = torch.zeros(B, T, dtype=torch.long)
    engine_lp = torch.zeros(B, T)
    coef = torch.tensor(coefficients or [1.0] * B, dtype=torch.float32)
    for b, s in enumerate(samples):
        n = min(len(s.token_ids), T)
        ids[b, :n] = torch.tensor(s.token_ids[:n])
        attn[b, :n] = 1
        mask[b, :n] = torch.tensor(s.loss_mask[:n])
        engine_lp[b, :n] = torch.tensor(s.old_logprobs[:n])
    mask[:, 0] = 0
    out = {
        "input_ids": ids,
        "attention_mask": attn,
        "loss_mask": mask,
        "loss_weight": mask.float() * coef[:, None],
        "engine_logprobs": engine_lp,
        "advantages": torch.tensor(advantages, dtype=torch.float32),
    }
    return {k: v.to(device) for k, v in out.items()}


def _mismatch(lp: torch.Tensor, batch: dict[str, torch.Tensor]) -> float:
    """Summed absolute difference between the trainer's and the engine's target logprobs."""
    return float(((lp - batch["engine_logprobs"]).abs() * batch["loss_mask"].float()).sum())


def _forward(model: Any, batch: dict[str, torch.Tensor], temperature: float, share: bool):
    lp, logits = target_logprobs(
        model,
        batch["input_ids"],
        batch["attention_mask"],
        batch["loss_mask"],
        temperature,
        share_prefix=share,
    )
    return logits, lp


class GRPOTrainer:
    """The state of one GRPO run, one step at a time (:func:`acmrl.train.loop.train_loop` drives
    it)."""

    name = "grpo"

    def __init__(
        self,
        cfg: GRPOConfig,
        *,
        resume: bool | str = False,
        resume_from: str | Path | None = None,
        env: Environment | None = None,
    ) -> None:
        torch.manual_seed(cfg.seed)
        self.cfg = cfg
        self.out = Path(cfg.output)
        ckpt = start_run(cfg, resume=resume, resume_from=resume_from)
        self.env = env or build_environment(cfg.env)
        self.tasks = self.env.tasks(cfg.env.split)[: cfg.env.limit]
        if not self.tasks:
            raise ValueError(f"env {cfg.env.name!r} split {cfg.env.split!r} has no tasks")
        self.acc = make_accelerator(cfg.optim.mixed_precision, cfg.log_with, str(self.out))
        if cfg.tasks_per_step < self.acc.num_processes:
            raise ValueError(
                f"tasks_per_step={cfg.tasks_per_step} is smaller than the "
                f"{self.acc.num_processes} training processes: every process needs a task (its "
                f"group) per step; use tasks_per_step >= {self.acc.num_processes}"
            )
        model, self.tok, self.started_from_adapter = build_model(cfg, ckpt)
        self.ref = None
        if cfg.kl_coef > 0 and not cfg.lora.enabled:
            # the reference is the start model, also when resuming from a later checkpoint
            start = copy.deepcopy(model) if ckpt is None else load_start_model(cfg.model)[0]
            self.ref = start.eval().requires_grad_(False)
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.share = shares_prefix(cfg, self.acc.num_processes)
        self.opt = torch.optim.AdamW(
            self.params, lr=cfg.optim.lr, weight_decay=cfg.optim.weight_decay
        )
        self.sched = torch.optim.lr_scheduler.LambdaLR(
            self.opt, lr_lambda(cfg.optim, cfg.updates_per_step)
        )
        self.state: dict[str, Any] = {"step": 0, "losses": [], "rewards": []}
        if ckpt is not None:
            self.state = load_training_state(
                ckpt, self.opt, self.sched, rank=self.acc.process_index
            )
        self.start_step = self.state["step"]
        self.model, self.opt = self.acc.prepare(model, self.opt)
        if self.ref is not None:
            self.ref.to(self.acc.device)
        self.sampler: Any = None  # the merged copy the hf engine samples from, if any
        self.weight_sync: Any = None  # full-weight sync into served engines, once opened
        self.engine = self._make_engine()
        self.pad = self.tok.pad_token_id if self.tok.pad_token_id is not None else 0
        self.weights = reward_weights(cfg)
        # this step's decision groups (acmrl.train.decisions): each member's trained turns, the
        # branches' ids and the figures logged
        self.credit: dict[str, tuple[int, int | None]] = {}
        self.branch_ids: set[str] = set()
        self.scouts: set[str] = set()  # sources that found a group's state, not trained
        self.live_from: dict[str, int] = {}  # a branch's decision turn: where its calls are live
        self.decision_metrics: dict[str, float] = {}
        self.dropped_calls: list[Any] = []  # a step's diverged branches' live model calls
        self.prefilled: int | None = None  # what the engine prefilled in a step's rollouts
        self.log = (
            JsonlLog(self.out / f"rollouts-rank{self.acc.process_index}.jsonl", "episode_id")
            if cfg.save_rollouts
            else None
        )

    def _make_engine(self) -> Any:
        from acmrl.engines.factory import trainer_engine

        engine = trainer_engine(self.cfg, self._rollout_model, self.tok, self._served_base)
        if engine.loads_policy:  # it serves its own copy: hand it the policy it starts from
            self._sync(engine, self.state["step"])
        return engine

    def _rollout_model(self) -> Any:
        """The model an in-process engine samples: the very parameters being trained (PEFT
        injects its LoRA layers into the base model, so generating with the base model uses
        them), or a merged copy in the rollout dtype, refreshed after every optimiser step."""
        inner = self.acc.unwrap_model(self.model)
        dtype = self.rollout_dtype()
        if dtype is not None:
            from acmrl.train.sampler import SamplerCopy

            self.sampler = SamplerCopy(inner, dtype)
            return self.sampler.model
        return inner.get_base_model() if isinstance(inner, PeftModel) else inner

    def _served_base(self) -> str:
        """The model an engine that loads the policy serves the trained adapter on: the start
        model, or the merged SFT model ``build_model`` published when GRPO starts from an
        adapter."""
        from acmrl.models import resolve_model

        if self.started_from_adapter:
            return self.acc.unwrap_model(self.model).peft_config["default"].base_model_name_or_path
        return resolve_model(self.cfg.model.name)

    def rollout_dtype(self) -> torch.dtype | None:
        """The dtype of the sampler copy, or None to sample from the live parameters."""
        choice = self.cfg.rollout_dtype
        if choice == "auto":
            choice = "bfloat16" if self.acc.mixed_precision == "bf16" else "live"
        if choice == "live":
            return None
        dtype = getattr(torch, choice)
        live = next(self.acc.unwrap_model(self.model).parameters()).dtype
        return None if dtype == live else dtype

    def _sync(self, engine: Any, step: int) -> None:
        """Hand the current policy to vLLM or the servers: the adapter (saved per process,
        published by a rename; a server reads it from this path, so ``output`` must be on a
        shared disk), or under full fine-tuning the weights themselves (:meth:`_push_weights`)."""
        import shutil

        if not self.cfg.lora.enabled:
            self._push_weights()
            return

        root = self.out / "sync" / f"rank{self.acc.process_index}"
        final, tmp = root / f"step-{step:06d}", root / f".tmp-step-{step:06d}"
        shutil.rmtree(tmp, ignore_errors=True)
        save_policy(self.acc.unwrap_model(self.model), tmp)
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        engine.load_adapter(str(final))
        for old in root.glob("step-*"):
            if old != final:
                shutil.rmtree(old, ignore_errors=True)

    def _push_weights(self) -> None:
        """Stream the full weights into every server (TRL's VLLMClient over NCCL): gathered by
        every process (FSDP / ZeRO-3 shards), sent by the main one, which the others wait for."""
        from acmrl.train.weight_sync import FullWeightSync

        state = self.acc.get_state_dict(self.model)
        if self.acc.is_main_process:
            if self.weight_sync is None:
                e = self.cfg.engine
                self.weight_sync = FullWeightSync(
                    e.base_urls, self.acc.device, e.group_port, timeout_s=e.timeout_s
                )
            self.weight_sync.push(state)
        self.acc.wait_for_everyone()

    # -- one step ---------------------------------------------------------------------------------

    def rollout(self, step: int) -> tuple[list[Episode], float]:
        """The step's episodes: whole-episode groups, and the decision groups' sources and
        branches (:mod:`acmrl.train.decisions`), which run in a second phase."""
        cfg = self.cfg
        rank, world = self.acc.process_index, self.acc.num_processes
        every = step_tasks(self.tasks, step, cfg)
        tasks = every[rank::world]
        # drawn over the whole step; this process's task j is the step's task rank + j x world
        sources = {
            (k // world, arm)
            for k, arm in branching_groups(cfg, len(every), step)
            if k % world == rank
        }
        episodes = step_episodes(cfg, self.env, tasks, step, self.tok, sources)
        self.credit, self.branch_ids, self.live_from, self.decision_metrics = {}, set(), {}, {}
        self.dropped_calls, self.scouts = [], set()
        self.model.eval()
        t0 = time.perf_counter()
        before = getattr(self.engine, "prefilled_tokens", None)
        run_episodes(episodes, self.engine, concurrency=cfg.concurrency)
        if sources:
            firsts = [e for e in episodes if e.id.endswith("#0")]
            picked = {(k, arm) for k, arm in sources}
            heads = [
                e
                for e in firsts
                if (int(e.id.split("/", 2)[1]), e.arm) in picked  # s<step>/<k>/task#arm#0
            ]
            episodes += self._branch(heads)
        after = getattr(self.engine, "prefilled_tokens", None)
        # the engine's own count where it keeps one (own and borrowed prefixes both saved)
        self.prefilled = None if before is None or after is None else after - before
        return episodes, time.perf_counter() - t0

    def _branch(self, sources: list[Episode]) -> list[Episode]:
        """Second phase (:func:`acmrl.train.decisions.branch_phase`); keeps what the update
        and the step's figures read of it."""
        b = branch_phase(sources, self.cfg, self.env, self.tok, self.engine)
        self.credit.update(b.credit)
        self.branch_ids, self.live_from, self.decision_metrics = b.ids, b.live_from, b.metrics
        self.dropped_calls, self.scouts = b.dropped_calls, b.scouts
        return b.episodes

    def advantages(
        self, episodes: list[Episode]
    ) -> tuple[list[float], list[float], list[dict[str, float]]]:
        rewards, terms = [], []
        for ep in episodes:
            r, t = trajectory_reward(
                ep.traj.to_dict(),
                ep.budget,
                self.weights,
                self.cfg.reward.success_threshold,
                self.cfg.agent.output_weight,
            )
            rewards.append(r)
            terms.append(t)
        # a group of its own (advantage 0, and left out of the samples): a scout, which found
        # its group's state and whose reward, drawn with that state, is no fair sample of it;
        # and an episode its tools failed (a server restart), whose reward says nothing of the
        # policy, so it must not move its group's mean either
        names = [
            e.id if e.id in self.scouts or e.traj.metrics.get("env_incidents") else group_key(e.id)
            for e in episodes
        ]
        keys = {k: i for i, k in enumerate(dict.fromkeys(names))}
        groups = torch.tensor([keys[k] for k in names])
        adv = group_advantages(
            torch.tensor(rewards, dtype=torch.float64), groups, self.cfg.scale_advantages
        )
        if self.cfg.skip_failed_groups:
            won = torch.tensor([t["success"] > 0 for t in terms])
            for g in groups.unique():
                sel = groups == g
                if not bool(won[sel].any()):
                    adv[sel] = 0.0  # no success in the group: costs alone would rank failures
        return rewards, adv.tolist(), terms

    def samples(
        self, episodes: list[Episode], adv: list[float]
    ) -> tuple[list[Sample], list[float], list[float], int]:
        """The step's samples, each with its episode's advantage and its segment coefficient;
        and how many episodes were left out as flat. A decision group's member is trained on
        its credited turns only."""
        cfg = self.cfg
        samples, sample_adv, coefs, flat = [], [], [], 0
        for ep, a in zip(episodes, adv, strict=True):
            if ep.id in self.scouts:  # it found a decision group's state: not trained
                continue
            if ep.traj.metrics.get("env_incidents"):  # its tools failed it (a server restart):
                continue  # its reward says nothing of the policy
            if a == 0.0 and cfg.skip_flat_groups and cfg.kl_coef == 0:
                flat += ep.id not in self.branch_ids  # whole episodes, as rollout/episodes
                continue
            made = trajectory_samples(
                ep.traj, helpers=cfg.train_helpers, turns=self.credit.get(ep.id)
            )
            counted = [(s, sum(s.loss_mask[1 : cfg.max_len])) for s in made]
            own = [s for s, n in counted if n]
            targets = [n for _, n in counted if n]
            samples += own
            sample_adv += [a] * len(own)
            coefs += segment_coefficients(targets, cfg.aggregation, cfg.segment_weight)
        return samples, sample_adv, coefs, flat

    def update(
        self, samples: list[Sample], adv: list[float], coefs: list[float] | None = None
    ) -> dict[str, float]:
        """``updates_per_step`` optimiser steps on the step's samples; returns the last's metrics.
        The loss is the mean over the step's target tokens weighted by ``coefs`` (one segment
        coefficient per sample; all 1: the plain token mean)."""
        cfg, acc = self.cfg, self.acc
        T = cfg.sampling.temperature
        coefs = coefs or [1.0] * len(samples)
        batches = [
            collate(
                [samples[i] for i in idx],
                [adv[i] for i in idx],
                cfg.max_len,
                self.pad,
                acc.device,
                [coefs[i] for i in idx],
            )
            for idx in token_batches(samples, cfg.optim.batch_tokens, cfg.max_len, self.share)
        ]
        n_local = sum(float(b["loss_weight"].sum()) for b in batches)
        n_targets = sum(float(b["loss_mask"].sum()) for b in batches)
        # every process takes part in the same collectives: the same number of micro-batches
        # (a process with fewer runs zero-gradient ones) and one all-reduce per update, on the
        # last; the loss is the token mean over every process's targets
        n_total = self._sum(n_local)
        n_micro = int(self._max(len(batches)))
        world = acc.num_processes
        # old and reference logprobs, before any update. With one update per step the old
        # policy is the current one: its logprobs are the update's own forward, detached (the
        # ratio is exactly 1), which saves a forward pass per batch
        on_policy = cfg.updates_per_step == 1 and cfg.old_logprobs == "recompute"
        self.model.eval()
        mismatch = 0.0
        with torch.no_grad():
            for b in batches:
                if cfg.old_logprobs == "recompute" and not on_policy:
                    _, lp = _forward(self.model, b, T, self.share)
                    mismatch += _mismatch(lp, b)
                    b["old_logprobs"] = lp
                elif not on_policy:
                    b["old_logprobs"] = b["engine_logprobs"]
                if cfg.kl_coef > 0:
                    b["ref_logprobs"] = self._ref_logprobs(b, T)
        self.model.train()
        metrics: dict[str, float] = {}
        for _ in range(cfg.updates_per_step):
            sums = {"loss": 0.0, "kl": 0.0, "clip_fraction": 0.0, "ratio": 0.0, "entropy": 0.0}
            for i in range(n_micro):
                sync = i == n_micro - 1
                with nullcontext() if sync else acc.no_sync(self.model):
                    if i >= len(batches):
                        self._zero_backward()
                        continue
                    b = batches[i]
                    logits, lp = _forward(self.model, b, T, self.share)
                    if on_policy:
                        mismatch += _mismatch(lp.detach(), b)
                    out = grpo_loss(
                        lp,
                        lp.detach() if on_policy else b["old_logprobs"],
                        b["advantages"],
                        b["loss_weight"],
                        clip_eps=cfg.clip_eps,
                        ref_logprobs=b.get("ref_logprobs"),
                        kl_coef=cfg.kl_coef,
                    )
                    share = float(b["loss_weight"].sum()) / (n_total or 1.0)
                    # token-level mean over the whole step's batch, on every process: DDP
                    # averages the processes' gradients, so each contributes world x its share
                    acc.backward(out.loss * share * world)
                    sums["loss"] += float(out.loss.detach()) * share
                    sums["kl"] += float(out.kl.detach()) * share
                    sums["clip_fraction"] += float(out.clip_fraction) * share
                    sums["ratio"] += float(out.ratio_mean.detach()) * share
                    sums["entropy"] += float(entropy(logits)) * share
                    del logits
            if cfg.optim.max_grad_norm:
                metrics["grad_norm"] = float(
                    acc.clip_grad_norm_(self.params, cfg.optim.max_grad_norm)
                )
            self.opt.step()
            self.sched.step()
            self.opt.zero_grad()
            metrics |= {f"train/{k}": self._sum(v) for k, v in sums.items()}
        targets = self._sum(n_targets)
        metrics["train/logprob_mismatch"] = self._sum(mismatch) / max(1.0, targets)
        metrics["train/target_tokens"] = targets
        metrics["train/tokens"] = self._sum(sum(float(b["attention_mask"].sum()) for b in batches))
        return metrics

    def _sum(self, value: float) -> float:
        """``value`` summed over the training processes."""
        if self.acc.num_processes == 1:
            return float(value)
        t = torch.tensor([float(value)], dtype=torch.float64, device=self.acc.device)
        return float(self.acc.reduce(t, reduction="sum"))

    def _max(self, value: float) -> float:
        if self.acc.num_processes == 1:
            return float(value)
        t = torch.tensor([float(value)], dtype=torch.float64, device=self.acc.device)
        return float(self.acc.gather(t).max())

    def _zero_backward(self) -> None:
        """A micro-batch with no data: a zero gradient through the model, so that this process
        makes the same backward (and all-reduce) calls as the others."""
        ids = torch.full((1, 2), self.pad, device=self.acc.device)
        out = self.model(input_ids=ids, attention_mask=torch.ones_like(ids))
        self.acc.backward(out.logits.sum() * 0.0)

    def _ref_logprobs(self, b: dict[str, torch.Tensor], T: float) -> torch.Tensor:
        if self.ref is not None:
            return _forward(self.ref, b, T, self.share)[1]
        inner = self.acc.unwrap_model(self.model)
        with inner.disable_adapter() if isinstance(inner, PeftModel) else nullcontext():
            return _forward(self.model, b, T, self.share)[1]

    def step(self, step: int) -> dict[str, Any]:
        """GRPO step ``step`` (0-based); returns its metrics."""
        episodes, rollout_s = self.rollout(step)
        if self.log is not None:
            for ep in episodes:
                if ep.id not in self.log.done:
                    self.log.write(ep.traj.to_dict())
        rewards, adv, terms = self.advantages(episodes)
        samples, sample_adv, coefs, flat = self.samples(episodes, adv)
        self.engine.sleep()  # a colocated engine frees its memory for the update
        t0 = time.perf_counter()
        n_any = int(self.acc.gather(torch.tensor([len(samples)], device=self.acc.device)).sum())
        metrics: dict[str, Any]
        if n_any:  # a process without samples takes part with zero-gradient micro-batches
            metrics = self.update(samples, sample_adv, coefs)
        else:  # every group flat everywhere: no gradient, so no optimiser step (Adam's momentum
            # would keep moving the weights); the schedule advances by the step's updates, on
            # purpose before any optimiser step when the run starts flat (torch warns of that)
            with warnings.catch_warnings():
                warnings.filterwarnings(
                    "ignore", "Detected call of `lr_scheduler.step", UserWarning
                )
                for _ in range(self.cfg.updates_per_step):
                    self.sched.step()
            metrics = {"train/loss": 0.0, "train/target_tokens": 0.0, "train/tokens": 0.0}
        train_s = time.perf_counter() - t0
        # what the engine generated and prefilled, diverged branches included: a branch's
        # replayed turns were played back, neither generated nor read
        live = [c for ep in episodes for c in live_calls(ep.traj, self.live_from.get(ep.id, -1))]
        live += self.dropped_calls
        gen_tokens = sum(len(c.completion_ids) for c in live)
        # without the engine's count: the prompts less the prefix each session reused
        prefilled = self.prefilled
        if prefilled is None:
            prefilled = own_prefill(live)
        gen_all = self._sum(gen_tokens)
        self.state["gen_tokens"] = self.state.get("gen_tokens", 0) + int(gen_all)
        self.engine.wake_up()
        if self.sampler is not None and n_any:  # the next rollouts sample the update
            self.sampler.refresh()
        self.engine.policy_updated()  # what the old policy computed is not reused
        if self.engine.loads_policy:  # the next rollouts sample the update
            self._sync(self.engine, step + 1)
        # every process's episodes, not only this one's share; a branch is not a whole episode
        # of the policy (its start was replayed), so the rollout figures leave it out
        branched = self.branch_ids
        facts = [
            episode_facts(e.traj, r, t)
            for e, r, t in zip(episodes, rewards, terms, strict=True)
            if e.id not in branched
        ]
        if self.acc.num_processes > 1:
            from accelerate.utils import gather_object

            facts = gather_object(facts)
        metrics |= rollout_metrics(facts)
        metrics |= self._decision_step_metrics(episodes, adv)
        metrics |= {
            "rollout/flat_episodes": self._sum(flat),
            "rollout/seconds": rollout_s,
            "rollout/gen_tokens_per_s": gen_tokens / max(1e-9, rollout_s),
            # every process's, this step and since the run's start (a resume continues it):
            # what runs of different group shapes are compared at
            "rollout/gen_tokens": gen_all,
            "rollout/gen_tokens_total": float(self.state["gen_tokens"]),
            "rollout/prefill_tokens": self._sum(prefilled),
            "train/seconds": train_s,
            "train/tokens_per_s": metrics.get("train/tokens", 0) / max(1e-9, train_s),
            "train/samples": len(samples),
            "lr": self.sched.get_last_lr()[0],
        }
        self.state["losses"] = [*self.state["losses"], metrics.get("train/loss", 0.0)]
        self.state["rewards"] = [*self.state["rewards"], metrics["reward/mean"]]
        return metrics

    def _decision_step_metrics(self, episodes: list[Episode], adv: list[float]) -> dict[str, float]:
        """The decision groups' figures of this step (summed over processes where they count)."""
        if not self.cfg.decisions.share:
            return {}
        mine = self.decision_metrics
        credit = self.credit
        members = [a for e, a in zip(episodes, adv, strict=True) if e.id in credit]
        out = dict(mine)
        out["decision/members"] = float(len(members))
        out["decision/nonflat_members"] = float(sum(a != 0.0 for a in members))
        out["decision/scouts"] = float(len(self.scouts))
        # counts are summed over the processes; shares and per-group figures are this process's
        for key in (
            "decision/groups",
            "decision/without_state",
            "decision/diverged",
            "decision/members",
            "decision/nonflat_members",
            "decision/scouts",
        ):
            out[key] = self._sum(out.get(key, 0.0))
        return out

    def describe(self, metrics: dict[str, Any]) -> str:
        return (
            f"reward {metrics['reward/mean']:.3f} success {metrics['rollout/success']:.2f} "
            f"loss {metrics.get('train/loss', 0.0):.4f}"
        )

    def close(self) -> None:
        if self.log is not None:
            self.log.close()
        if self.weight_sync is not None:
            self.weight_sync.close()

    def result(self) -> dict[str, Any]:
        return {"losses": list(self.state["losses"]), "rewards": list(self.state["rewards"])}

    # -- checkpoints ------------------------------------------------------------------------------

    def save(self, step: int) -> None:
        save_run_checkpoint(
            self.acc,
            self.out,
            step,
            self.model,
            self.opt,
            self.sched,
            {
                "losses": self.state["losses"][-1000:],
                "rewards": self.state["rewards"][-1000:],
                "gen_tokens": self.state.get("gen_tokens", 0),
            },
            self.tok,
        )
        if self.acc.is_main_process:
            prune_checkpoints(self.out, self.cfg.save_total_limit)

    def save_final(self) -> Path:
        final = self.out / "final"
        if self.acc.is_main_process:
            model = self.acc.unwrap_model(self.model)
            if self.started_from_adapter and isinstance(model, PeftModel):
                # the adapter was trained on top of a merged SFT adapter: save the whole policy
                model = copy.deepcopy(model).merge_and_unload()
            save_policy(model, final)
            self.tok.save_pretrained(final)
        return final


def run_grpo(
    cfg: GRPOConfig,
    *,
    resume: bool | str = False,
    resume_from: str | Path | None = None,
    stop_after: int | None = None,
    env: Environment | None = None,
) -> dict[str, Any]:
    """Train; ``resume`` / ``resume_from`` continue a run (acmrl/train/runs.py); SIGTERM or
    SIGUSR1 saves a checkpoint after the current step and returns with ``interrupted`` set.
    ``stop_after`` ends the run early after that many steps (tests of ``--resume``).
    ``env`` replaces the configured environment (tests and library use)."""
    trainer = GRPOTrainer(cfg, resume=resume, resume_from=resume_from, env=env)
    return train_loop(trainer, cfg, stop_after)
