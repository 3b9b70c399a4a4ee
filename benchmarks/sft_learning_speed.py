"""What learns fastest per CPU-minute: SFT variants on the oracle's demonstrations, side by side.

    .venv/bin/python benchmarks/sft_learning_speed.py [--worlds 30] [--steps 40] [--every 20]
        [--variants lora,full] [--out runs/bench-sft] [--model PATH]

The training data are the oracle's grounded demonstrations (``acmrl annotate`` with
``demonstrations: true``) on ``--worlds`` kb_search tiny worlds (seeds 1..N); the held-out data
are demonstrations on the eval split of worlds 0 and 100, which no variant trains on. Each
variant runs ``--steps`` SFT steps of 4096 tokens with bf16 autocast where the CPU has it, and
saves a checkpoint every ``--every`` steps. For each checkpoint the benchmark prints, beside the
wall time it took to reach it:

- the held-out NLL per token of the teacher's answer turn (its rationale and the call);
- the held-out NLL of the answer's text, the decisive tokens of kb_search (which event of the
  town's list happened in the birth year);
- how many held-out answers start with the right token under greedy decoding (the lookup).
One forward pass per held-out task, on the answer turn's exact context.

Variants: ``lora`` (rank 16, lr 5e-4), ``full`` (all weights, lr 5e-5), ``lora-plain`` (as
``lora``, without ``optim.share_prefix``: every sample reads its own system prompt) and
``lora-top15`` (as ``lora``, adapters on the last 15 decoder layers only); more can be added to
VARIANTS. Measured figures: docs/train-history.md ("what LoRA SFT learns per step" and "full
fine-tuning against LoRA on the demo's data"). Run alone: other jobs on the same cores distort the wall times (the held-out figures do
not depend on it). ``--model`` with a tiny random model checks the script in a minute.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

VARIANTS: dict[str, dict[str, Any]] = {
    "lora": {"lora": {"enabled": True, "r": 16, "alpha": 32}, "lr": 5e-4},
    "full": {"lora": {"enabled": False}, "lr": 5e-5},
    # every sample reads its own system prompt (optim.share_prefix=false)
    "lora-plain": {"lora": {"enabled": True, "r": 16, "alpha": 32}, "lr": 5e-4, "share": False},
    # adapters on the last 15 of the 30 decoder layers: the backward pass stops there
    "lora-top15": {"lora": {"enabled": True, "r": 16, "alpha": 32, "top_layers": 15}, "lr": 5e-4},
}


def demonstrations(out: Path, seeds: list[int], split: str, model: str) -> Path:
    from acmrl.config import AnnotateConfig, load_config
    from acmrl.teacher.annotate import run_annotate

    if (out / "dataset" / "dataset_info.json").exists():
        return out
    cfg = load_config(
        AnnotateConfig,
        None,
        [
            f"model.name={model}",
            "env.name=mixture",
            f"env.options={json.dumps({'env': 'kb_search', 'seeds': seeds, 'options': {'preset': 'tiny'}})}",
            f"env.split={split}",
            "agent.max_turns=12",
            "agent.max_context_tokens=1400",
            "agent.context_signal=true",
            "sampling.max_new_tokens=96",
            'sampling.stop=["</tool_call>"]',
            "arms=[acm]",
            "demonstrations=true",
            "student_tasks=0",
            "teacher.pressure=0.75",
            "teacher.pressure_spread=[0.5, 0.9]",
            f"output={out}",
        ],
    )
    run_annotate(cfg)
    return out


def heldout(checkpoint: str, records: Path) -> dict[str, float]:
    """On the answer turn of every successful held-out demonstration (one forward pass each):
    the NLL of the teacher's whole completion, of the answer's text, and greedy first-token hits."""
    import torch

    from acmrl.config import ModelConfig
    from acmrl.models import load_model
    from acmrl.rollout.records import Trajectory

    model, tok = load_model(ModelConfig(name=checkpoint, dtype="float32"))
    model.eval()
    turn = n_turn = ans = n_ans = hits = answers = 0.0
    for line in records.read_text().splitlines():
        for d in json.loads(line)["demonstrations"]:
            if d["score"] < 1:
                continue
            traj = Trajectory.from_dict(d)
            call = [st.call for st in traj.steps if st.call and st.call.role == "teacher"][-1]
            comp = call.completion_ids
            cut = next(i for i in range(len(comp)) if '"text": "' in tok.decode(comp[: i + 1]))
            ids = torch.tensor([call.prompt_ids + comp])
            with torch.no_grad():
                logp = torch.log_softmax(model(ids).logits[0].float(), -1)
            start = len(call.prompt_ids)
            first = start + cut + 1
            end = start + len(comp)
            for j in range(start, end):
                turn -= float(logp[j - 1, ids[0, j]])
                n_turn += 1
            text_end = first + len(tok.encode(d["reference"], add_special_tokens=False))
            for j in range(first, min(text_end, end)):
                ans -= float(logp[j - 1, ids[0, j]])
                n_ans += 1
            hits += int(logp[first - 1].argmax()) == int(ids[0, first])
            answers += 1
    return {
        "turn_nll": turn / max(1.0, n_turn),
        "answer_nll": ans / max(1.0, n_ans),
        "answer_first_token": hits,
        "answers": answers,
    }


def train(variant: str, data: Path, out: Path, steps: int, every: int, model: str) -> float:
    from acmrl.config import SFTConfig, load_config
    from acmrl.train.sft import run_sft

    v = VARIANTS[variant]
    lora = v["lora"]
    overrides = [
        f"model.name={model}",
        f"dataset={data / 'dataset'}",
        f"output={out}",
        f"lora.enabled={str(lora['enabled']).lower()}",
        f"optim.lr={v['lr']}",
        f"optim.max_steps={steps}",
        "optim.batch_tokens=4096",
        "optim.warmup_steps=5",
        "max_len=2048",
        f"save_every={every}",
        "log_with=[]",
        f"optim.share_prefix={str(v.get('share', True)).lower()}",
    ]
    if lora["enabled"]:
        overrides += [f"lora.r={lora['r']}", f"lora.alpha={lora['alpha']}"]
        if lora.get("top_layers"):
            overrides.append(f"lora.top_layers={lora['top_layers']}")
    cfg = load_config(SFTConfig, None, overrides)
    from acmrl.demo import cpu_has_bf16

    cfg.optim.mixed_precision = "bf16" if cpu_has_bf16() else "no"
    t0 = time.perf_counter()
    run_sft(cfg)
    return time.perf_counter() - t0


def main() -> None:
    from acmrl.models import ensure_default_model

    ap = argparse.ArgumentParser()
    ap.add_argument("--worlds", type=int, default=30)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--every", type=int, default=20)
    ap.add_argument("--variants", default="lora,full")
    ap.add_argument("--out", default="runs/bench-sft")
    ap.add_argument("--model", default=None)
    args = ap.parse_args()
    model = args.model or ensure_default_model()
    out = Path(args.out)
    train_data = demonstrations(out / "train", list(range(1, args.worlds + 1)), "train", model)
    held = demonstrations(out / "heldout", [0, 100], "eval", model)
    records = next(held.glob("records-*.jsonl"))
    rows = [("base", 0, 0.0, heldout(model, records))]
    for variant in args.variants.split(","):
        folder = out / variant
        wall = train(variant, train_data, folder, args.steps, args.every, model)
        for ckpt in sorted((folder / "checkpoints").glob("step-*")):
            step = int(ckpt.name.split("-")[1])
            rows.append(
                (variant, step, wall * step / args.steps, heldout(str(ckpt / "model"), records))
            )
    print(
        f"{'variant':<8}{'step':>6}{'wall min':>10}{'turn NLL':>12}{'answer NLL':>12}{'first token':>13}"
    )
    for variant, step, wall, h in rows:
        print(
            f"{variant:<8}{step:>6}{wall / 60:>10.1f}{h['turn_nll']:>12.4f}{h['answer_nll']:>12.4f}"
            f"{int(h['answer_first_token']):>8}/{int(h['answers'])}"
        )
    (out / "results.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
