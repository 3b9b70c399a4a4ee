"""What SFT and GRPO share: building the trained model (LoRA or full), the schedule, progress."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any


def make_accelerator(mixed_precision: str, log_with: list[str], project_dir: str) -> Any:
    """A fresh ``Accelerator`` for one training run.

    accelerate keeps one ``AcceleratorState`` per process and refuses a second ``Accelerator``
    with another precision (the demo, a notebook or the tests run SFT and GRPO in one process).
    The run-level state is dropped first; the process-level ``PartialState`` (the distributed
    setup) is kept.
    """
    import torch
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=False)
    # without a GPU, cpu=True makes a torchrun / accelerate launch of n processes use gloo
    return Accelerator(
        cpu=not torch.cuda.is_available(),
        mixed_precision=mixed_precision,
        log_with=log_with or None,
        project_dir=project_dir,
    )


def adapter_base(path: str | Path) -> str | None:
    """The base model of a PEFT adapter folder, or None when ``path`` is not one."""
    cfg = Path(path) / "adapter_config.json"
    if not cfg.is_file():
        return None
    return json.loads(cfg.read_text())["base_model_name_or_path"]


def load_start_model(model_cfg: Any) -> tuple[Any, Any, bool]:
    """The model training starts from, its tokenizer, and whether it was an adapter folder.

    An adapter folder (the ``final/`` of an SFT run) is merged into its base, so new adapters
    train on top of it and "adapter disabled" means that starting policy.
    """
    from acmrl.models import load_model, resolve_model

    base = adapter_base(resolve_model(model_cfg.name))
    if base is None:
        model, tok = load_model(model_cfg)
        return model, tok, False
    from peft import PeftModel

    model, _ = load_model(dataclasses.replace(model_cfg, name=base))
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(resolve_model(model_cfg.name))
    merged = PeftModel.from_pretrained(model, resolve_model(model_cfg.name)).merge_and_unload()
    return merged.eval(), tok, True


def build_model(cfg: Any, resume_from: Path | None) -> tuple[Any, Any, bool]:
    """The trainable model of ``cfg`` (``.model``, ``.lora``): fresh, or from a checkpoint.

    Returns (model, tokenizer, started_from_adapter).
    """
    if resume_from is not None and not cfg.lora.enabled:
        from acmrl.models import load_model, resolve_model

        merged = adapter_base(resolve_model(cfg.model.name)) is not None
        model, tok = load_model(dataclasses.replace(cfg.model, name=str(resume_from / "model")))
        return model, tok, merged
    model, tok, merged = load_start_model(cfg.model)
    if not cfg.lora.enabled:
        return model, tok, merged
    from peft import LoraConfig, PeftModel, get_peft_model

    if resume_from is not None:
        model = PeftModel.from_pretrained(model, str(resume_from / "model"), is_trainable=True)
        return model, tok, merged
    lora = LoraConfig(
        r=cfg.lora.r,
        lora_alpha=cfg.lora.alpha,
        lora_dropout=cfg.lora.dropout,
        target_modules=list(cfg.lora.target_modules),
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, lora), tok, merged


def lr_lambda(optim: Any):
    """Linear warm-up, then constant or cosine decay to 0 at ``optim.max_steps``."""

    def f(step: int) -> float:
        if step < optim.warmup_steps:
            return (step + 1) / optim.warmup_steps
        if optim.schedule == "constant":
            return 1.0
        progress = (step - optim.warmup_steps) / max(1, optim.max_steps - optim.warmup_steps)
        return 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))

    return f


def progress_bar(name: str, visible: bool) -> Any:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = [
        TextColumn(name),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[info]}"),
    ]
    return Progress(*columns, disable=not visible)
