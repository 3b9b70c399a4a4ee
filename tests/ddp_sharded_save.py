"""The sharded checkpoint path (FSDP / ZeRO-3) under a 2-process gloo launch.

accelerate enables FSDP and DeepSpeed only with an accelerator, so on this CPU the processes run
DDP and ``save_run_checkpoint(..., sharded=True)`` takes the sharded path by hand: the full
weights come from ``get_state_dict`` (a collective), every process writes its own optimizer
shard into the staged folder, the main process publishes it. Each process then restores its own
shard (marked with its rank) and checks the saved weights against the live ones.

    torchrun --nproc_per_node 2 tests/ddp_sharded_save.py MODEL_DIR OUT
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository

from acmrl.train.checkpoint import load_training_state, save_run_checkpoint
from acmrl.train.common import make_accelerator


def main() -> None:
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    model_dir, out = sys.argv[1], Path(sys.argv[2])
    acc = make_accelerator("no", [], str(out))
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda u: 1.0)
    model, opt = acc.prepare(model, opt)
    ids = torch.randint(5, 400, (2, 16), generator=torch.Generator().manual_seed(acc.process_index))
    acc.backward(model(input_ids=ids, labels=ids).loss)
    opt.step()
    sched.step()
    opt.param_groups[0]["rank_marker"] = acc.process_index  # each process's shard differs
    save_run_checkpoint(acc, out, 1, model, opt, sched, {"losses": []}, sharded=True)
    ckpt = out / "checkpoints" / "step-000001"
    shards = sorted(p.name for p in ckpt.glob("optimizer-rank*.pt"))
    assert shards == ["optimizer-rank0.pt", "optimizer-rank1.pt"], shards
    fresh = torch.optim.AdamW(acc.unwrap_model(model).parameters(), lr=1e-3)
    fresh_sched = torch.optim.lr_scheduler.LambdaLR(fresh, lambda u: 1.0)
    load_training_state(ckpt, fresh, fresh_sched, rank=acc.process_index)
    assert fresh.param_groups[0]["rank_marker"] == acc.process_index
    saved = load_file(str(ckpt / "model" / "model.safetensors"))
    live = acc.unwrap_model(model).state_dict()
    assert all(torch.equal(saved[k], live[k]) for k in saved), "saved weights differ"
    acc.wait_for_everyone()
    print(f"process {acc.process_index}: shard restored, weights equal", flush=True)
    acc.end_training()  # take the process group down before exit, as train() does


if __name__ == "__main__":
    main()
