"""Workers: many episodes at once, their model calls batched, trajectories written as they end.

``run_episodes`` runs a list of episodes, and ``run_rollout(cfg)`` (``acmrl rollout`` and the
evals) builds them from tasks x arms x samples and writes them. Up to ``concurrency`` episodes are
in flight; each round collects the pending request of every episode, sends policy calls to the
policy engine and summariser/querier calls to the helper engine (the student itself unless
configured), in one batch each, and hands the completions back. A finished episode is appended to
the JSONL output at once (one line, flushed and fsynced), so a killed run loses at most the
episodes in flight; on restart the episodes already in the file are skipped, and a torn last line
is cut off first.
"""

from __future__ import annotations

import json
import os
import random
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from acmrl.config import ARMS, RolloutConfig, to_dict
from acmrl.engines.base import Completion, Engine, EngineError, Request
from acmrl.engines.factory import make_engine
from acmrl.envs.base import Environment
from acmrl.rollout.agent import Episode, make_episode
from acmrl.rollout.environment import build_environment
from acmrl.rollout.records import Trajectory


class JsonlLog:
    """Appends JSON objects to a file, one complete line each, resumably.

    ``done`` holds the ``key`` of every line already written; on open, a line torn by a kill is
    cut off (its work runs again), so a restarted job neither duplicates nor loses anything.
    """

    def __init__(self, path: str | Path, key: str) -> None:
        self.path = Path(path)
        self.key = key
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.done: set[str] = set()
        if self.path.exists():
            self._recover()
        self._file = self.path.open("a", encoding="utf-8")

    def _recover(self) -> None:
        data = self.path.read_bytes()
        end = data.rfind(b"\n") + 1
        if end < len(data):
            with self.path.open("r+b") as f:
                f.truncate(end)
        for n, line in enumerate(data[:end].splitlines(), 1):
            if not line.strip():
                continue
            try:
                self.done.add(json.loads(line)[self.key])
            except (json.JSONDecodeError, KeyError) as exc:
                raise ValueError(
                    f"{self.path}:{n}: not a line of this job ({exc}); move the file away"
                ) from exc

    def write(self, obj: dict[str, Any]) -> None:
        self._file.write(json.dumps(obj, ensure_ascii=False) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())
        self.done.add(obj[self.key])

    def close(self) -> None:
        self._file.close()


class TrajectoryWriter(JsonlLog):
    """One line per episode, keyed by ``episode_id``."""

    def __init__(self, path: str | Path) -> None:
        super().__init__(path, "episode_id")

    def write(self, traj: Trajectory) -> None:  # type: ignore[override]
        super().write(traj.to_dict())


def read_trajectories(path: str | Path) -> list[Trajectory]:
    out = []
    with Path(path).open(encoding="utf-8") as f:
        for line in f:
            if line.strip():
                out.append(Trajectory.from_dict(json.loads(line)))
    return out


def _serve(engine: Engine, pairs: list[tuple[Episode, Request]]) -> None:
    """Generate for a batch; if the engine refuses it, retry one by one so only culprits fail."""
    if not pairs:
        return
    try:
        completions: list[Completion | EngineError] = list(engine.generate([r for _, r in pairs]))
    except EngineError:
        completions = []
        for _, req in pairs:
            try:
                completions.append(engine.generate([req])[0])
            except EngineError as exc:
                completions.append(exc)
    for (episode, _), c in zip(pairs, completions, strict=True):
        if isinstance(c, EngineError):
            episode.fail(f"engine: {c}")
        else:
            episode.receive(c)


def run_episodes(
    episodes: Iterable[Episode],
    engine: Engine,
    *,
    helper_engine: Engine | None = None,
    concurrency: int = 8,
    on_done: Callable[[Episode], None] = lambda ep: None,
) -> None:
    """Drive ``episodes`` to completion, ``concurrency`` at a time, batching their model calls."""
    helper_engine = helper_engine or engine
    waiting = iter(episodes)
    active: list[Episode] = []
    started: dict[str, float] = {}
    while True:
        while len(active) < concurrency:
            nxt = next(waiting, None)
            if nxt is None:
                break
            started[nxt.id] = time.perf_counter()
            active.append(nxt)
        if not active:
            return
        policy, helpers = [], []
        for ep in active:
            req = ep.next_request()
            if req is not None:
                (policy if ep.pending_role == "policy" else helpers).append((ep, req))
        for ep in [e for e in active if e.done]:
            ep.traj.metrics["wall_s"] = round(time.perf_counter() - started.pop(ep.id), 3)
            for suffix in ("", "/summariser", "/querier"):
                engine.release(ep.id + suffix)
                helper_engine.release(ep.id + suffix)
            on_done(ep)
        active = [e for e in active if not e.done]
        _serve(engine, policy)
        _serve(helper_engine, helpers)


def episode_id(task_id: str, arm: str, sample: int) -> str:
    return f"{task_id}#{arm}#{sample}"


def _mean(ts: list[Trajectory], key: str) -> float:
    return sum(t.metrics.get(key, 0) for t in ts) / len(ts)


def summary_rows(trajectories: Iterable[Trajectory]) -> list[dict[str, Any]]:
    """Per arm: episodes, success, mean score, context tokens, tool calls, compactions, wall time."""
    by_arm: dict[str, list[Trajectory]] = {}
    for t in trajectories:
        by_arm.setdefault(t.arm, []).append(t)
    rows = []
    order = {arm: i for i, arm in enumerate(ARMS)}
    for arm, ts in sorted(by_arm.items(), key=lambda kv: order.get(kv[0], len(order))):
        n = len(ts)
        rows.append(
            {
                "arm": arm,
                "episodes": n,
                "success": sum(t.score >= 1.0 for t in ts) / n,
                "score": sum(t.score for t in ts) / n,
                "answered": sum(t.status == "answered" for t in ts) / n,
                "overflow": sum(t.status == "overflow" for t in ts) / n,
                "mean_context": _mean(ts, "mean_context_tokens"),
                "peak_context": max(t.metrics.get("peak_context_tokens", 0) for t in ts),
                "tool_calls": _mean(ts, "tool_calls"),
                "compactions": _mean(ts, "compactions"),
                "wall_s": _mean(ts, "wall_s"),
            }
        )
    return rows


def _plan(cfg: RolloutConfig, env: Environment) -> Iterator[tuple[Any, str, int, str]]:
    """(task, arm, sample, episode id) of every episode ``cfg`` asks for, in plan order."""
    for task in env.tasks(cfg.env.split)[: cfg.env.limit]:
        for arm in cfg.arms:
            for sample in range(cfg.samples):
                yield task, arm, sample, episode_id(task.id, arm, sample)


def planned_ids(cfg: RolloutConfig, env: Environment) -> list[str]:
    """The episode ids ``cfg`` asks for, in plan order (tasks, then arms, then samples)."""
    return [eid for *_, eid in _plan(cfg, env)]


def plan_episodes(
    cfg: RolloutConfig, env: Environment, tokenizer: Any, skip: set[str]
) -> Iterator[Episode]:
    for task, arm, sample, eid in _plan(cfg, env):
        if eid not in skip:
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

    env = build_environment(cfg.env)
    planned = planned_ids(cfg, env)
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
            # a file resumed under another plan (fewer arms, tasks or samples) may hold episodes
            # this one does not ask for: they stay in the file and are not counted here
            done_here = len(writer.done.intersection(planned))
            bar = progress.add_task("episodes", total=len(planned), completed=done_here, last="")

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
