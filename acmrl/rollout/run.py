"""``acmrl rollout``: tasks x arms x samples with a progress bar, resumable JSONL, a summary table."""

from __future__ import annotations

import random
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from acmrl.config import ConfigError, RolloutConfig, to_dict
from acmrl.engines.base import Engine
from acmrl.envs import Environment
from acmrl.rollout.agent import Episode
from acmrl.rollout.judge import load_env
from acmrl.rollout.worker import (
    TrajectoryWriter,
    episode_id,
    read_trajectories,
    run_episodes,
    summary_rows,
)


def make_engine(cfg: Any) -> Engine:
    """The student engine of a rollout or annotate config; it carries the tokenizer that renders
    States (``engine.tokenizer``)."""
    e = cfg.engine
    if e.kind == "oracle":
        raise ConfigError(
            "engine.kind=oracle is the expert plan as a policy, for acmrl eval only; "
            "rollout, annotate and GRPO need a model (hf, openai or vllm)"
        )
    if e.kind == "openai":
        import os

        from acmrl.engines.openai import OpenAIEngine
        from acmrl.models import load_tokenizer

        engine = OpenAIEngine(
            e.base_urls,
            e.served_model or cfg.model.name,
            load_tokenizer(cfg.model.name),
            api_key=os.environ.get(e.api_key_env),
            timeout_s=e.timeout_s,
            max_retries=e.max_retries,
            concurrency=cfg.concurrency,
        )
        return engine
    if e.kind == "vllm":
        return vllm_engine(cfg)
    from acmrl.engines.hf import HFEngine

    return HFEngine.from_config(
        cfg.model,
        reuse_cache=e.reuse_cache,
        share_prefix=e.share_prefix,
        max_batch=e.max_batch,
        seed=cfg.seed,
    )


ALONE_MEMORY = 0.85  # vLLM alone on the GPU (rollout, eval, annotate)
COLOCATED_MEMORY = 0.3  # beside a trainer: the weights, gradients and optimizer need the rest


def vllm_engine(cfg: Any, enable_lora: bool = False, colocated: bool = False) -> Engine:
    """vLLM over ``cfg.model``; an adapter folder is served as a LoRA on its base model.
    ``colocated``: it shares the GPU with a trainer (GRPO): a smaller memory share by default
    (TRL's colocate default, 0.3) and sleep mode on CUDA, so the update gets the memory back."""
    import json
    from pathlib import Path

    from acmrl.engines.vllm import VLLMEngine
    from acmrl.models import resolve_model

    e, where = cfg.engine, Path(resolve_model(cfg.model.name))
    adapter = None
    if (where / "adapter_config.json").is_file():
        adapter = str(where)
        where = Path(
            resolve_model(
                json.loads((where / "adapter_config.json").read_text())["base_model_name_or_path"]
            )
        )
    return VLLMEngine(
        str(where),
        dtype=cfg.model.dtype,
        max_model_len=e.max_model_len,
        gpu_memory_utilization=e.gpu_memory_utilization
        or (COLOCATED_MEMORY if colocated else ALONE_MEMORY),
        sleep_mode=colocated and e.vllm_sleep,
        lora_path=adapter,
        enable_lora=enable_lora,
        max_lora_rank=e.max_lora_rank,
        seed=cfg.seed,
    )


def make_episode(
    cfg: Any, eid: str, env: Environment, task: Any, arm: str, sample: int, tokenizer: Any
) -> Episode:
    """An episode of a config with ``agent``, ``sampling``, ``model`` and ``seed``; its sampling
    seed derives from the config's seed and the episode id, so a rerun samples the same. A
    config that trains the helper calls (GRPO's ``train_helpers``) samples them too."""
    return Episode(
        eid,
        env,
        task,
        arm,
        tokenizer,
        agent=cfg.agent,
        sampling=cfg.sampling,
        sample=sample,
        seed=cfg.seed * 1_000_003 + zlib.crc32(eid.encode()),
        model=cfg.model.name,
        sample_helpers=getattr(cfg, "train_helpers", False),
    )


def plan_episodes(
    cfg: RolloutConfig, env: Environment, tokenizer: Any, skip: set[str]
) -> Iterator[Episode]:
    tasks = env.tasks(cfg.env.split)[: cfg.env.limit]
    for task in tasks:
        for arm in cfg.arms:
            for sample in range(cfg.samples):
                eid = episode_id(task.id, arm, sample)
                if eid in skip:
                    continue
                yield make_episode(cfg, eid, env, task, arm, sample, tokenizer)


def _tensorboard(cfg: RolloutConfig) -> Any:
    if not cfg.tensorboard:
        return None
    from torch.utils.tensorboard import SummaryWriter

    return SummaryWriter(str(Path(cfg.output).parent / "tensorboard"))


def run_rollout(
    cfg: RolloutConfig, engine: Engine | None = None, tokenizer: Any = None
) -> list[dict[str, Any]]:
    """Run the rollout ``cfg`` describes; returns the per-arm summary rows of the whole file."""
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn

    from acmrl.progress import progress as progress_for

    env = load_env(cfg.env)
    n_tasks = len(env.tasks(cfg.env.split)[: cfg.env.limit])
    total = n_tasks * len(cfg.arms) * cfg.samples
    writer = TrajectoryWriter(cfg.output)
    if engine is None:
        engine = make_engine(cfg)
    tokenizer = tokenizer or engine.tokenizer  # type: ignore[attr-defined]
    tb = _tensorboard(cfg)
    counts: dict[str, int] = {}
    columns = [
        TextColumn("rollout"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[last]}"),
    ]
    try:
        with progress_for("rollout", *columns) as progress:
            bar = progress.add_task("episodes", total=total, completed=len(writer.done), last="")

            def done(ep: Episode) -> None:
                writer.write(ep.traj)
                counts[ep.arm] = counts.get(ep.arm, 0) + 1
                progress.update(
                    bar, advance=1, last=f"{ep.arm}: {ep.traj.status} {ep.traj.score:.2f}"
                )
                if tb is not None:
                    step = counts[ep.arm]
                    tb.add_scalar(f"{ep.arm}/score", ep.traj.score, step)
                    for key in (
                        "peak_context_tokens",
                        "tool_calls",
                        "compactions",
                        "compaction_cost",
                    ):
                        tb.add_scalar(f"{ep.arm}/{key}", ep.traj.metrics.get(key, 0), step)

            episodes = list(plan_episodes(cfg, env, tokenizer, writer.done))
            random.Random(cfg.seed).shuffle(episodes)  # mix arms so batches are not all one arm
            run_episodes(episodes, engine, concurrency=cfg.concurrency, on_done=done)
    finally:
        writer.close()
        if tb is not None:
            tb.close()
    (Path(cfg.output).parent / "config.yaml").write_text(_yaml(to_dict(cfg)))
    return summary_rows(read_trajectories(cfg.output))


def _yaml(data: dict[str, Any]) -> str:
    import yaml

    return yaml.safe_dump(data, sort_keys=False)


def print_summary(rows: list[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="rollout summary (per arm)")
    heads = [
        "arm",
        "episodes",
        "success",
        "score",
        "answered",
        "overflow",
        "mean ctx",
        "peak ctx",
        "tool calls",
        "compactions",
        "wall s",
    ]
    for h in heads:
        table.add_column(h, justify="left" if h == "arm" else "right")
    for r in rows:
        table.add_row(
            r["arm"],
            str(r["episodes"]),
            f"{r['success']:.2f}",
            f"{r['score']:.2f}",
            f"{r['answered']:.2f}",
            f"{r['overflow']:.2f}",
            f"{r['mean_context']:.0f}",
            str(r["peak_context"]),
            f"{r['tool_calls']:.1f}",
            f"{r['compactions']:.1f}",
            f"{r['wall_s']:.1f}",
        )
    console = Console()
    if console.width < 120:  # a pipe or a narrow terminal: do not squeeze the numbers
        console = Console(width=120)
    console.print(table)
