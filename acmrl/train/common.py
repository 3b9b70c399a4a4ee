"""What SFT and GRPO share: building the trained model (LoRA or full), the schedule, progress."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from acmrl.config import TrainConfig
from acmrl.context.prefix import reusable_prefix
from acmrl.models import adapter_base


def resolve_precision(configured: str) -> str:
    """The mixed precision a run uses: ``auto`` takes the launcher's (``accelerate launch``
    exports ``ACCELERATE_MIXED_PRECISION``), else bf16 on a CUDA GPU that supports it, else
    ``no``. An explicit value is refused when the launcher asked for another reduced precision
    (a launcher's ``no`` is its default and does not count)."""
    import os

    launcher = os.environ.get("ACCELERATE_MIXED_PRECISION", "no")
    if configured == "auto":
        if launcher != "no":
            return launcher
        import torch

        return "bf16" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "no"
    if launcher != "no" and launcher != configured:
        raise ValueError(
            f"optim.mixed_precision={configured} contradicts the launcher's mixed precision "
            f"{launcher} (accelerate launch --mixed_precision or its config file): drop one, or "
            "set optim.mixed_precision=auto"
        )
    return configured


def make_accelerator(mixed_precision: str, log_with: list[str], project_dir: str) -> Any:
    """A fresh ``Accelerator`` for one training run (``mixed_precision`` as the config says it,
    resolved by :func:`resolve_precision`).

    accelerate keeps one ``AcceleratorState`` per process and refuses a second ``Accelerator``
    with another precision (the demo, a notebook or the tests run SFT and GRPO in one process).
    The run-level state is dropped first; the process-level ``PartialState`` (the distributed
    setup) is kept. Under DeepSpeed, which sizes its batches from a dataloader that acmrl does
    not use (batches are packed by tokens), the micro-batch size is set to 1 sample.
    """
    import torch
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=False)
    # without a GPU, cpu=True makes a torchrun / accelerate launch of n processes use gloo
    acc = Accelerator(
        cpu=not torch.cuda.is_available(),
        mixed_precision=resolve_precision(mixed_precision),
        log_with=log_with or None,
        project_dir=project_dir,
    )
    plugin = getattr(acc.state, "deepspeed_plugin", None)
    if plugin is not None:
        plugin.deepspeed_config["train_micro_batch_size_per_gpu"] = 1
    return acc


def load_start_model(model_cfg: Any) -> tuple[Any, Any, bool]:
    """The model training starts from, its tokenizer, and whether it was an adapter folder.

    An adapter folder (the ``final/`` of an SFT run) is merged into its base, so new adapters
    train on top of it and "adapter disabled" means that starting policy.
    """
    from acmrl.models import load_model, resolve_model

    model, tok = load_model(model_cfg)
    return model, tok, adapter_base(resolve_model(model_cfg.name)) is not None


START_MODEL = "start-model"


def publish_start_model(out: Path, model: Any, tok: Any) -> Path:
    """Save the merged start model once under ``out/start-model`` with a fresh id (published by
    a rename; a rerun or another process finds it there): the base the run's adapters name."""
    import os
    import shutil
    import uuid

    from acmrl.models import MODEL_ID_FILE

    final = out / START_MODEL
    if (final / MODEL_ID_FILE).is_file():
        return final
    tmp = out / f".tmp-{START_MODEL}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    (tmp / MODEL_ID_FILE).write_text(uuid.uuid4().hex)
    try:
        os.replace(tmp, final)
    except OSError:  # another process published it first
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def save_policy(model: Any, folder: Path, state_dict: dict[str, Any] | None = None) -> None:
    """``save_pretrained`` (of ``state_dict`` when given: the full weights gathered from a
    sharded model); an adapter also records the id and place of its base (models.py), so it is
    loaded on exactly the weights it was trained on, or refused."""
    import os

    from acmrl.models import ADAPTER_BASE_FILE, model_id

    if state_dict is not None:
        model.save_pretrained(folder, state_dict=state_dict)
    else:
        model.save_pretrained(folder)
    peft = getattr(model, "peft_config", None)
    if not peft:
        return
    base = peft["default"].base_model_name_or_path
    record = {"base_model": base, "base_id": None, "relative": None}
    if base and Path(base).exists():
        record |= {"base_id": model_id(base), "relative": os.path.relpath(base, folder)}
    (Path(folder) / ADAPTER_BASE_FILE).write_text(json.dumps(record, indent=1))


def build_model(cfg: TrainConfig, resume_from: Path | None) -> tuple[Any, Any, bool]:
    """The trainable model of ``cfg`` (``.model``, ``.lora``, ``.output``): fresh, or from a
    checkpoint. Returns (model, tokenizer, started_from_adapter).

    When the start is an adapter folder (an SFT run's output), it is merged and the merge is
    published under ``output/start-model``: the new adapters name it as their base, so a
    checkpoint loads as the policy it was, not as an adapter on the raw base.
    """
    from acmrl.models import resolve_model

    if resume_from is not None and not cfg.lora.enabled:
        from acmrl.models import load_model, load_tokenizer

        merged = adapter_base(resolve_model(cfg.model.name)) is not None
        model, _ = load_model(
            dataclasses.replace(cfg.model, name=str(resume_from / "model")), with_tokenizer=False
        )
        return checkpointing(model, cfg), load_tokenizer(cfg.model.name), merged
    model, tok, merged = load_start_model(cfg.model)
    if not cfg.lora.enabled:
        return checkpointing(model, cfg), tok, merged
    from peft import LoraConfig, PeftModel, get_peft_model

    base = resolve_model(cfg.model.name)
    if merged:
        base = str(publish_start_model(Path(cfg.output), model, tok).resolve())
    elif Path(base).exists():
        base = str(Path(base).resolve())
    if resume_from is not None:
        model = PeftModel.from_pretrained(model, str(resume_from / "model"), is_trainable=True)
    else:
        lora = LoraConfig(
            r=cfg.lora.r,
            lora_alpha=cfg.lora.alpha,
            lora_dropout=cfg.lora.dropout,
            target_modules=list(cfg.lora.target_modules),
            layers_to_transform=top_layers(model, cfg.lora.top_layers),
            task_type="CAUSAL_LM",
        )
        model = get_peft_model(model, lora)
    model.peft_config["default"].base_model_name_or_path = base
    return checkpointing(model, cfg), tok, merged


def top_layers(model: Any, n: int | None) -> list[int] | None:
    """The indices of the last ``n`` decoder layers (``lora.top_layers``); None for all.

    With adapters only there, nothing below them needs a gradient, so autograd records no
    graph for the lower layers and the backward pass stops at the lowest adapted one."""
    if n is None:
        return None
    total = model.config.num_hidden_layers
    if n > total:
        raise ValueError(f"lora.top_layers={n}: the model has only {total} decoder layers")
    return list(range(total - n, total))


PREFIX_KEY = 16  # samples whose first tokens agree (one system prompt) are batched together


def prefix_groups(token_ids: Sequence[Sequence[int]], order: list[int]) -> list[list[int]]:
    """``order`` split by how each sample starts (its first ``PREFIX_KEY`` tokens: the policy's
    turns of one arm, the summariser's calls, ...), each group keeping the order it is given.

    >>> prefix_groups([[1] * 16 + [2], [3] * 16, [1] * 16 + [4]], [2, 1, 0])
    [[2, 0], [1]]
    """
    groups: dict[tuple[int, ...], list[int]] = {}
    for i in order:
        groups.setdefault(tuple(token_ids[i][:PREFIX_KEY]), []).append(i)
    return list(groups.values())


def fill_batches(
    token_ids: Sequence[Sequence[int]],
    loss_masks: Sequence[Sequence[int]],
    groups: list[list[int]],
    budget: int,
    max_len: int,
    shared: bool,
) -> list[list[int]]:
    """Batches of each group in turn, in its order, up to ``budget`` tokens of work: rows x
    longest row (padding counts), less (rows - 1) x the batch's common prefix when ``shared``
    (it is read once: :func:`acmrl.train.loss.target_logprobs`; only up to the first target,
    whose logits each row needs). A sample longer than the budget is a batch alone. SFT and
    GRPO batch with it."""
    batches: list[list[int]] = []
    for group in groups:
        cur: list[int] = []
        longest = common = 0
        for i in group:
            ids = token_ids[i][:max_len]
            n = len(ids)
            c = 0  # the batch's common prefix with this sample, read once
            if shared:
                c = reusable_prefix(token_ids[cur[0]][:common], ids) if cur else n
                c = min(c, next((j for j, m in enumerate(loss_masks[i]) if m), n))
            work = max(longest, n) * (len(cur) + 1) - len(cur) * min(common, c)
            if cur and work > budget:
                batches.append(cur)
                cur, longest, c = [], 0, n
            cur.append(i)
            longest, common = max(longest, n), c
        if cur:
            batches.append(cur)
    return batches


def shares_prefix(cfg: TrainConfig, num_processes: int) -> bool:
    """Whether a run reads each batch's common prefix once (``optim.share_prefix``): not with
    gradient checkpointing (which turns the model's cache off), and on one process only (DDP
    expects one forward per backward; a rank whose batch shares a prefix would take two while
    another takes one, and their collectives hang)."""
    return cfg.optim.share_prefix and not cfg.optim.gradient_checkpointing and num_processes == 1


def checkpointing(model: Any, cfg: TrainConfig) -> Any:
    """Gradient checkpointing when ``optim.gradient_checkpointing`` asks for it (non-reentrant:
    it needs no input that requires grad, so LoRA on frozen embeddings works)."""
    if cfg.optim.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model


def lr_lambda(optim: Any, updates_per_step: int = 1):
    """The learning-rate factor after ``u`` optimiser updates: linear warm-up, then constant or
    cosine decay to 0 at the last update.

    The schedule counts optimiser updates, never loop iterations: ``warmup_steps`` and
    ``max_steps`` are steps of ``updates_per_step`` updates each (GRPO's mu; 1 for SFT), so a
    run with several updates per step decays over all of them, and every step advances the
    schedule by ``updates_per_step`` whichever path it takes.

    >>> from types import SimpleNamespace
    >>> f = lr_lambda(SimpleNamespace(warmup_steps=0, schedule="cosine", max_steps=2), 2)
    >>> [round(f(u), 3) for u in range(5)]  # 4 updates in all: half-way after the first step
    [1.0, 0.854, 0.5, 0.146, 0.0]
    """
    warm = optim.warmup_steps * updates_per_step
    total = optim.max_steps * updates_per_step

    def f(update: int) -> float:
        if update < warm:
            return (update + 1) / warm
        if optim.schedule == "constant":
            return 1.0
        progress = (update - warm) / max(1, total - warm)
        return 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))

    return f


class MetricsLog:
    """``metrics.jsonl``: one line of every logged metric per step (the run's history without
    TensorBoard). A resumed run drops the lines past the checkpoint it resumes from."""

    def __init__(self, path: Path, resumed_step: int) -> None:
        self.path = path
        if path.exists():
            keep = [
                line
                for line in path.read_text().splitlines()
                if line.strip() and json.loads(line)["step"] <= resumed_step
            ]
            path.write_text("".join(f"{line}\n" for line in keep))

    def write(self, step: int, metrics: dict[str, Any]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a") as f:
            f.write(json.dumps({"step": step} | metrics, default=float) + "\n")


def progress_bar(name: str, visible: bool) -> Any:
    """A rich bar on a terminal; plain log lines in a pipe or a job log (acmrl/progress.py)."""
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn

    from acmrl.progress import progress

    columns = [
        TextColumn(name),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[info]}"),
    ]
    return progress(name, *columns, visible=visible)
