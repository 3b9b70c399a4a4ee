"""GRPO's update with and without reading each micro-batch's shared prefix once.

    .venv/bin/python benchmarks/grpo_update.py --config RUN/config.yaml \
        --rollouts RUN/rollouts-rank0.jsonl [--steps 1 2] [--helpers] [--only off|on]

Replays real GRPO steps of a finished run: the episodes a step rolled out (episode ids
``s<step>/...`` in its rollouts file), their rewards and group-relative advantages under the
run's own config, and the samples GRPO trains on (the summariser's calls too with
``--helpers``, as ``train_helpers=true`` does). Each step's samples then go through one
:meth:`acmrl.train.grpo.GRPOTrainer.update` with ``optim.share_prefix`` off and on, from the same
weights and a fresh optimiser, and the update is timed (after an untimed warm-up of both on a
few samples). Printed per step: samples, micro-batches, tokens in the batches, target tokens,
seconds each way, the ratio, and both losses (which must agree: the shared read changes the
work, not the update). ``--only`` runs one variant, e.g. under ``/usr/bin/time -v`` for its
peak memory.

The policy's samples of one arm start with the same system prompt and tool definitions (~750 of
~1,200 tokens on kb_search tiny); without sharing, every row reads them again. Run alone: CPU
contention from other jobs distorts the timings.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from types import SimpleNamespace

import torch

from acmrl.config import GRPOConfig, load_config
from acmrl.rollout.prompts import context_budget
from acmrl.rollout.records import Trajectory
from acmrl.train.grpo import GRPOTrainer, token_batches


def step_episodes(path: str, step: int) -> list[SimpleNamespace]:
    """The episodes GRPO rolled out at ``step`` (1-based, as the rollouts file names them)."""
    out = []
    with open(path) as f:
        for line in f:
            data = json.loads(line)
            scout = (data.get("edit") or {}).get("kind") == "scout"  # trained on nothing
            if data["episode_id"].startswith(f"s{step}/") and not scout:
                out.append(SimpleNamespace(id=data["episode_id"], traj=Trajectory.from_dict(data)))
    if not out:
        raise SystemExit(f"{path}: no episode of step {step} (ids start 's{step}/')")
    return out


def timed_update(trainer: GRPOTrainer, samples, adv, share: bool) -> tuple[float, dict, int]:
    start = [p.detach().clone() for p in trainer.params]
    trainer.share = share
    trainer.opt.state.clear()
    t0 = time.perf_counter()
    metrics = trainer.update(samples, adv)
    seconds = time.perf_counter() - t0
    n_batches = len(
        token_batches(samples, trainer.cfg.optim.batch_tokens, trainer.cfg.max_len, share)
    )
    with torch.no_grad():  # the next variant starts from the same weights
        for p, p0 in zip(trainer.params, start, strict=True):
            p.copy_(p0)
    trainer.opt.state.clear()
    return seconds, metrics, n_batches


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", required=True, help="the GRPO run's config.yaml")
    ap.add_argument("--rollouts", required=True, help="the run's rollouts-rank0.jsonl")
    ap.add_argument("--steps", type=int, nargs="+", default=[1])
    ap.add_argument("--helpers", action="store_true", help="train the summariser's calls too")
    ap.add_argument(
        "--only",
        choices=["off", "on"],
        help="run one variant (e.g. under /usr/bin/time -v for its peak memory)",
    )
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        cfg = load_config(GRPOConfig, args.config, [f"output={tmp}/grpo", "log_with=[]"])
        cfg.train_helpers = args.helpers
        cfg.save_rollouts = False
        trainer = GRPOTrainer(cfg)
        budget = context_budget(cfg.agent, trainer.env)
        print(
            f"{'step':>4} {'samples':>7} {'batches off/on':>14} {'tokens':>7} {'targets':>7} "
            f"{'s off':>7} {'s on':>7} {'off/on':>6} {'loss off':>10} {'loss on':>10}"
        )
        for step in args.steps:
            eps = step_episodes(args.rollouts, step)
            for ep in eps:
                ep.budget = budget
            _, adv, _ = trainer.advantages(eps)
            samples, sample_adv, _, _ = trainer.samples(eps, adv)
            if not samples:
                print(f"{step:>4} every group flat: nothing to train")
                continue
            # warm-up, untimed: the first update of a process pays for allocations and thread
            # start-up, which would otherwise go to whichever variant runs first
            for share in (False, True):
                timed_update(trainer, samples[:4], sample_adv[:4], share)
            nan = (float("nan"), {"train/loss": float("nan")}, 0)
            run_off, run_on = args.only in (None, "off"), args.only in (None, "on")
            off_s, off, off_b = (
                timed_update(trainer, samples, sample_adv, False) if run_off else nan
            )
            on_s, on, on_b = timed_update(trainer, samples, sample_adv, True) if run_on else nan
            off = off if run_off else on | {"train/loss": float("nan")}
            print(
                f"{step:>4} {len(samples):>7} {f'{off_b}/{on_b}':>14} "
                f"{int(off['train/tokens']):>7} {int(off['train/target_tokens']):>7} "
                f"{off_s:>7.1f} {on_s:>7.1f} {off_s / on_s:>6.2f} "
                f"{off['train/loss']:>10.6f} {on['train/loss']:>10.6f}"
            )


if __name__ == "__main__":
    main()
