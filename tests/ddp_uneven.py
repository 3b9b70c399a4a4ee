"""One GRPO update on fixed samples, for the uneven micro-batch test of tests/test_distributed.py.

Run alone it updates on every sample; under a 2-process launch rank 0 takes samples 0-2 (three
micro-batches) and rank 1 sample 3 (one). The gradient the optimiser receives is written to
``<out>/grad.pt`` (by rank 0; after DDP's all-reduce every rank holds the same).

    python tests/ddp_uneven.py MODEL_DIR OUT
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository, for tests.*

from acmrl.config import GRPOConfig
from acmrl.train.grpo import GRPOTrainer
from acmrl.train.samples import Sample
from tests.grpo_env import TargetEnv, override


def samples() -> tuple[list[Sample], list[float]]:
    r = random.Random(0)
    out = []
    for i, n in enumerate([60, 50, 40, 30]):
        ids = [r.randrange(5, 400) for _ in range(n)]
        mask = [0] * (n // 2) + [1] * (n - n // 2)
        out.append(Sample(f"e{i}", 0, ids, mask, [1] * n, [0.0] * n, 1.0, 1, [1.0] * n))
    return out, [1.0, -0.5, 0.25, -1.0]


def main() -> None:
    model_dir, out = sys.argv[1], Path(sys.argv[2])
    cfg = override(
        GRPOConfig(),
        model__name=model_dir,
        output=str(out),
        arms=["react"],
        tasks_per_step=2,
        log_with=[],
        kl_coef=0.0,
        lora__r=4,
        optim__batch_tokens=64,  # one sample per micro-batch
        optim__max_grad_norm=0.0,
        optim__mixed_precision="no",
        seed=0,
    )
    trainer = GRPOTrainer(cfg, env=TargetEnv(tasks=2))
    every, adv = samples()
    rank, world = trainer.acc.process_index, trainer.acc.num_processes
    mine = [0, 1, 2] if (world, rank) == (2, 0) else [3] if world == 2 else [0, 1, 2, 3]
    grads = {}
    step = trainer.opt.step

    def capture(*a, **k):
        for name, p in trainer.acc.unwrap_model(trainer.model).named_parameters():
            if p.grad is not None:
                grads[name] = p.grad.detach().clone()
        return step(*a, **k)

    trainer.opt.step = capture
    metrics = trainer.update([every[i] for i in mine], [adv[i] for i in mine])
    if rank == 0:
        torch.save({"grads": grads, "metrics": metrics}, out / "grad.pt")
    print(f"rank {rank} of {world}: {len(mine)} samples, loss {metrics['train/loss']:.6f}")
    # As train() does: leave together and take the process group down, or a rank that exits
    # while the other still saves can abort in gloo's teardown ("terminate called without an
    # active exception", seen in CI).
    trainer.acc.wait_for_everyone()
    trainer.acc.end_training()


if __name__ == "__main__":
    main()
