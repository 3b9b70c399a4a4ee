"""The GPU check: bf16 SFT steps and one GRPO step of a randomly initialised model on one device.

    python3 scripts/gpu_check.py --tokenizer DIR [--size 300m] [--device cuda] [--out DIR]

Run by scripts/gpu_check.sh on a lent GPU machine (no network: the model is built from a config,
the tokenizer is SmolLM2's, carried in). Prints one table: SFT tokens/s and peak memory at
bf16 (accelerate autocast, fp32 master weights, AdamW), then one GRPO step with the ``hf``
engine (the trainer's own weights): generated tokens/s, training tokens/s, peak memory and the
mean absolute difference between the engine's logprobs and the trainer's (``logprob_mismatch``).
The same figures go to ``--out``/gpu_check.json. ``--size tiny --device cpu`` runs the same
code here in a minute (tests/test_gpu_check.py).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

SIZES = {
    # ~360M parameters with SmolLM2's 49,152-token vocabulary (SmolLM2-360M's shape)
    "300m": dict(
        hidden_size=960,
        intermediate_size=2560,
        num_hidden_layers=32,
        num_attention_heads=15,
        num_key_value_heads=5,
    ),
    "tiny": dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    ),
}


def build(out: Path, tokenizer: str, size: str) -> Path:
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(tokenizer)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tok),
        max_position_embeddings=8192,
        tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        **SIZES[size],
    )
    model = LlamaForCausalLM(config)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def sft_steps(model_dir: Path, steps: int, seq: int, batch: int) -> dict[str, float]:
    """bf16 SFT steps on random tokens (the speed and memory do not depend on the data)."""
    import torch

    from acmrl.config import ModelConfig
    from acmrl.models import load_model
    from acmrl.train.common import make_accelerator
    from acmrl.train.loss import sft_loss, target_logprobs

    acc = make_accelerator("bf16", [], str(model_dir.parent))
    model, _ = load_model(ModelConfig(name=str(model_dir), dtype="float32"), with_tokenizer=False)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    model, opt = acc.prepare(model, opt)
    model.train()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (batch, seq), generator=g).to(acc.device)
    attn = torch.ones_like(ids)
    mask = torch.ones_like(ids)
    mask[:, 0] = 0
    weights = torch.ones(batch, seq, device=acc.device)
    if acc.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(steps + 1):  # the first step warms up (kernels, allocator)
        t0 = time.perf_counter()
        lp, _ = target_logprobs(model, ids, attn, mask)
        loss = sft_loss(lp, mask, weights)
        acc.backward(loss)
        opt.step()
        opt.zero_grad()
        if acc.device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    peak = torch.cuda.max_memory_allocated() / 2**30 if acc.device.type == "cuda" else float("nan")
    params = sum(p.numel() for p in model.parameters())
    return {
        "params_m": params / 1e6,
        "sft_tokens_per_step": batch * seq,
        "sft_s_per_step": sum(times[1:]) / steps,
        "sft_tokens_per_s": batch * seq * steps / sum(times[1:]),
        "sft_peak_gib": peak,
        "sft_loss": float(loss.detach()),
    }


def grpo_step(
    model_dir: Path, out: Path, new_tokens: int, group: int, tasks: int, max_batch: int
) -> dict:
    """One GRPO step (hf engine, bf16 autocast) on a one-tool-free task; engine logprobs kept
    beside the trainer's so their mismatch is measured."""
    import torch

    from acmrl.config import GRPOConfig
    from acmrl.envs.base import Environment, Task
    from acmrl.train.grpo import run_grpo

    class Echo(Environment):
        """Say the word: any reply containing it succeeds."""

        name = "echo"

        def __init__(self) -> None:
            super().__init__(metric="contains")
            made = [Task(f"t{i}", f"Say the word number {i}.", "the", {}) for i in range(tasks)]
            self._tasks = {"train": made}

        def tools(self) -> list:
            return []

        def _handlers(self, task: Task) -> dict:
            return {}

    cfg = GRPOConfig(output=str(out / "grpo"), log_with=[], save_rollouts=False)
    cfg.model.name = str(model_dir)
    cfg.model.dtype = "float32"
    cfg.arms = ["react"]
    cfg.agent.max_turns = 1
    cfg.sampling.max_new_tokens = new_tokens
    cfg.sampling.stop = []
    cfg.engine.max_batch = max_batch
    cfg.group_size, cfg.tasks_per_step = group, tasks
    cfg.lora.enabled = False
    cfg.optim.max_steps = 1
    cfg.optim.mixed_precision = "bf16"
    cfg.updates_per_step = 2  # recomputed old logprobs: their mismatch to the engine's is logged
    cfg.skip_flat_groups = False
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    result = run_grpo(cfg, env=Echo())
    wall = time.perf_counter() - t0
    rows = [json.loads(line) for line in (out / "grpo" / "metrics.jsonl").read_text().splitlines()]
    m = rows[-1]
    peak = torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else float("nan")
    return {
        "grpo_episodes": group * tasks,
        "grpo_max_batch": max_batch,
        "grpo_wall_s": wall,
        "grpo_gen_tokens_per_s": m.get("rollout/gen_tokens_per_s", float("nan")),
        "grpo_train_tokens_per_s": m.get("train/tokens_per_s", float("nan")),
        "grpo_logprob_mismatch": m.get("train/logprob_mismatch", float("nan")),
        "grpo_reward": m.get("reward/mean", float("nan")),
        "grpo_peak_gib": peak,
        "grpo_steps": result["steps"],
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer", required=True, help="a folder with SmolLM2's tokenizer")
    ap.add_argument("--size", choices=sorted(SIZES), default="300m")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--out", default="/tmp/acmrl-gpu-check")
    ap.add_argument("--sft-steps", type=int, default=10, help="0 skips the SFT part")
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--tasks", type=int, default=8)
    ap.add_argument("--max-batch", type=int, default=8, help="engine.max_batch of the GRPO step")
    args = ap.parse_args()
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("gpu_check: no CUDA device (use --device cpu --size tiny to try it here)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model_dir = build(out / "model", args.tokenizer, args.size)
    env = {
        "device": torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu",
        "torch": torch.__version__,
        "transformers": __import__("transformers").__version__,
        "size": args.size,
    }
    figures = dict(env)
    if args.sft_steps > 0:
        figures |= sft_steps(model_dir, args.sft_steps, args.seq, args.batch)
    figures |= grpo_step(model_dir, out, args.new_tokens, args.group, args.tasks, args.max_batch)
    (out / "gpu_check.json").write_text(json.dumps(figures, indent=1))
    width = max(len(k) for k in figures)
    for key, value in figures.items():
        shown = f"{value:.4g}" if isinstance(value, float) else value
        print(f"{key:<{width}}  {shown}")


if __name__ == "__main__":
    main()
