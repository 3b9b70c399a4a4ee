"""``acmrl annotate``: the student with and without context tools, the teacher's edits, the student
resuming from them, and the dataset; sharded and resumable.

Per task (``i/n`` shards take tasks i, i+n, ...): the student runs once per arm (by default
``react``, without context tools, and ``acm``, with them); the teacher assesses each trajectory;
each valid injection or correction is spliced in and the student resumes ``resumes`` times. One
record per task is appended to ``records-i-of-n.jsonl`` as soon as the task is done (fsynced), so
a killed job resumes where it stopped; at the end the dataset is rebuilt from all records present.
"""

from __future__ import annotations

import dataclasses
import zlib
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path
from typing import Any

from acmrl.arms import arm_tools
from acmrl.config import AnnotateConfig
from acmrl.engines.base import Engine
from acmrl.engines.factory import make_engine
from acmrl.envs import Environment, Task
from acmrl.rollout.agent import Episode
from acmrl.rollout.environment import build_environment
from acmrl.rollout.records import Trajectory
from acmrl.rollout.worker import JsonlLog, run_episodes
from acmrl.teacher.assessment import Assessment, seen_text, summaries_before, validate
from acmrl.teacher.dataset import build_dataset, read_records
from acmrl.teacher.demonstrate import demonstrate
from acmrl.teacher.llm import LLMTeacher, gold_evidence
from acmrl.teacher.oracle import OracleTeacher
from acmrl.teacher.splice import run_spliced, splice_episodes, state_before
from acmrl.teacher.topk import add_teacher_topk
from acmrl.train.samples import SampleWeights, trajectory_samples


def known_names(env: Environment) -> set[str]:
    docs = getattr(env, "documents", None) or []
    return {d.title for d in docs} | {d.id for d in docs}


def make_teacher(cfg: AnnotateConfig, env: Environment, student: Engine) -> Any:
    t = cfg.teacher
    if t.kind == "oracle":
        return OracleTeacher(
            env,
            pressure=t.pressure,
            tokenizer=student.tokenizer,  # type: ignore[attr-defined]
            switch_arms=t.switch_arms,
            answers=t.answers,
        )
    if t.base_urls:
        from acmrl.engines.openai import OpenAIEngine
        from acmrl.models import load_tokenizer

        name = t.model or cfg.model.name
        tok = load_tokenizer(name)
        engine: Engine = OpenAIEngine(t.base_urls, t.served_model or name, tok)
    elif t.model is None:
        engine, tok = student, student.tokenizer  # type: ignore[attr-defined]
    else:
        from acmrl.engines.hf import HFEngine

        engine = HFEngine.from_config(dataclasses.replace(cfg.model, name=t.model))
        tok = engine.tokenizer  # type: ignore[attr-defined]
    return LLMTeacher(
        engine,
        tok,
        max_attempts=t.max_attempts,
        max_tokens=t.max_tokens,
        known_names=known_names(env),
        evidence=gold_evidence(env),
        structured=t.structured_output,
        score=env.score,
        needed=lambda task: _still_needed(env, task),
        temperature=t.temperature,
        seed=cfg.seed,
    )


def _assess(
    teacher: Any, env: Environment, task: Task, ep: Episode, cfg: AnnotateConfig
) -> Assessment:
    def state_at(step: int) -> list[dict[str, Any]]:
        return state_before(
            env, task, ep.traj, step, ep.renderer.tokenizer, agent=cfg.agent, sampling=cfg.sampling
        )

    if isinstance(teacher, LLMTeacher):
        a = teacher.assess(task, ep.traj, ep.budget, ep.tools, state_at)
    else:
        a = teacher.assess(task, ep.traj, ep.budget, state_at)
        if a.kind != "no_action":
            evolve = isinstance(a.action, dict) and a.action.get("name") == "evolve"
            a.errors = validate(
                a,
                seen=seen_text(ep.traj, a.step, ep.renderer.tokenizer),
                reference=task.answer,
                # an edit that switches arms is checked against the tools it switches to
                tools=arm_tools(ep.session.tools, a.arm, ep.agent) if a.arm else ep.tools,
                known_names=known_names(env),
                state=state_at(a.step) if evolve else None,
                needed=_still_needed(env, task) if evolve else None,
                score=lambda text: env.score(task, text),
                summaries=summaries_before(ep.traj, a.step),
            )
            a.valid = not a.errors
    return a


def _still_needed(env: Environment, task: Task) -> list[str]:
    from acmrl.arms.evolve_edits import still_needed

    try:
        plan = env.oracle_plan(task)
    except NotImplementedError:  # an environment without an expert plan
        plan = None
    return still_needed(task, plan)


def annotate_tasks(
    cfg: AnnotateConfig,
    env: Environment,
    tasks: list[Task],
    engine: Engine,
    teacher: Any,
    topk_model: Any = None,
    student_ids: set[str] | None = None,
    phase: Callable[[str], None] = lambda _: None,
) -> list[dict[str, Any]]:
    """Student runs, assessments and resumes for ``tasks`` (those in ``student_ids``, when given),
    and demonstrations when configured: one record per task. ``phase`` is told what runs now
    (the progress line of a chunk whose tasks all end together)."""
    episodes = {
        task.id: [
            Episode(
                f"{task.id}#{arm}#0",
                env,
                task,
                arm,
                engine.tokenizer,  # type: ignore[attr-defined]
                agent=cfg.agent,
                sampling=cfg.sampling,
                seed=cfg.seed * 1_000_003 + zlib.crc32(f"{task.id}#{arm}".encode()),
                model=cfg.model.name,
            )
            for arm in cfg.arms
        ]
        for task in tasks
        if student_ids is None or task.id in student_ids
    }
    runs = [e for eps in episodes.values() for e in eps]
    if runs:
        phase(f"student runs: {len(runs)} episodes")
    run_episodes(runs, engine, concurrency=cfg.concurrency)
    resume_sampling = dataclasses.replace(cfg.sampling, temperature=cfg.resume_temperature)
    records, jobs, owner, assessed = [], [], [], 0
    for task in tasks:
        record: dict[str, Any] = {
            "task_id": task.id,
            "trajectories": [],
            "assessments": [],
            "resumed": [],
        }
        for ep in episodes.get(task.id, []):
            assessed += 1
            phase(f"teacher: assessing {assessed}/{len(runs)}")
            a = _assess(teacher, env, task, ep, cfg)
            record["trajectories"].append(ep.traj.to_dict())
            record["assessments"].append(a.to_dict() | {"source": ep.traj.episode_id})
            if a.valid and a.kind != "no_action":
                eps, scripts = splice_episodes(
                    env,
                    task,
                    ep.traj,
                    a,
                    engine.tokenizer,  # type: ignore[attr-defined]
                    agent=cfg.agent,
                    sampling=resume_sampling,
                    n=cfg.resumes,
                    seed=ep.seed,
                )
                jobs.append((ep.traj, a, eps, scripts))
                owner.append(record)
        records.append(record)
    # every resume of the chunk in one batched run
    if jobs:
        phase(f"resumes from {len(jobs)} edits")
    resumed = run_spliced(jobs, engine, engine.tokenizer, concurrency=cfg.concurrency)  # type: ignore[attr-defined]
    for record, trajs in zip(owner, resumed, strict=True):
        record["resumed"] += [t.to_dict() for t in trajs]
    if cfg.demonstrations:
        phase("demonstrations")
        demos = demonstrate(
            env,
            tasks,
            cfg.arms,
            engine.tokenizer,  # type: ignore[attr-defined]
            agent=cfg.agent,
            sampling=cfg.sampling,
            pressure=cfg.teacher.pressure,
            pressure_spread=cfg.teacher.pressure_spread or None,
            answers=cfg.teacher.answers,
            late_share=cfg.teacher.late_share,
            policy=cfg.teacher.policy,
        )
        by_task: dict[str, list[dict[str, Any]]] = {}
        for d in demos:
            by_task.setdefault(d.task_id, []).append(d.to_dict())
        for record in records:
            record["demonstrations"] = by_task.get(record["task_id"], [])
    for record in records:
        if topk_model is not None:
            _attach_topk(record, topk_model, cfg.teacher.topk)
    return records


def _attach_topk(record: dict[str, Any], model: Any, k: int) -> None:
    """The teacher model's top-k logprobs on every sample of the record's trajectories."""
    record["topk"] = {}
    for data in record["trajectories"] + record["resumed"] + record.get("demonstrations", []):
        traj = Trajectory.from_dict(data)
        samples = [s.to_dict() for s in trajectory_samples(traj, helpers=True)]
        add_teacher_topk(model, samples, k)
        record["topk"][data["episode_id"]] = [
            {"ids": s["teacher_topk_ids"], "logprobs": s["teacher_topk_logprobs"]} for s in samples
        ]


def load_topk_model(cfg: AnnotateConfig) -> Any:
    if cfg.teacher.topk == 0:
        return None
    from acmrl.models import load_model

    name = cfg.teacher.topk_model or cfg.teacher.model or cfg.model.name
    model, _ = load_model(dataclasses.replace(cfg.model, name=name))
    return model


def run_annotate(cfg: AnnotateConfig, engine: Engine | None = None) -> dict[str, Any]:
    """Run this shard's tasks (skipping those already recorded) and rebuild the dataset."""
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn

    from acmrl.progress import progress as progress_for

    i, n = (int(x) for x in cfg.shard.split("/"))
    env = build_environment(cfg.env)
    every = env.tasks(cfg.env.split)[: cfg.env.limit]
    scripted = cfg.demonstrations or cfg.teacher.kind == "oracle"
    if every and scripted and (why := env.has_plan(*every)) is not None:
        needs = "demonstrations=true" if cfg.demonstrations else "teacher.kind=oracle"
        raise ValueError(
            f"{needs} needs the environment's expert plan, and {cfg.env.name} has none "
            f"({why}); annotate with the LLM teacher instead: teacher.kind=llm "
            "demonstrations=false (teacher.base_urls for a served teacher)"
        )
    tasks = every[i::n]
    student_ids = None
    if cfg.student_tasks is not None:  # taken before sharding, so every shard agrees
        student_ids = {t.id for t in every[: cfg.student_tasks]}
    out = Path(cfg.output)
    log = JsonlLog(out / f"records-{i}-of-{n}.jsonl", key="task_id")
    todo = [t for t in tasks if t.id not in log.done]
    engine = engine or make_engine(cfg)
    teacher = make_teacher(cfg, env, engine)
    topk_model = load_topk_model(cfg)
    chunk = max(1, cfg.concurrency // len(cfg.arms))
    columns = [
        TextColumn(f"annotate {cfg.shard}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[phase]}"),
    ]
    try:
        with progress_for(f"annotate {cfg.shard}", *columns) as progress:
            done = len(tasks) - len(todo)
            bar = progress.add_task("tasks", total=len(tasks), completed=done, phase="")
            for start in range(0, len(todo), chunk):
                part = todo[start : start + chunk]
                for record in annotate_tasks(
                    cfg,
                    env,
                    part,
                    engine,
                    teacher,
                    topk_model,
                    student_ids,
                    phase=lambda what: progress.update(bar, phase=what),
                ):
                    log.write(record)
                    progress.update(bar, advance=1, phase="")
    finally:
        log.close()
    if not cfg.build_dataset:
        return {"shard": cfg.shard, "tasks": len(tasks), "annotated now": len(todo)}
    _, stats = build_dataset(out, sample_weights(cfg), solve_filter=cfg.solve_filter)
    return stats


def merge_shards(cfg: AnnotateConfig, n: int) -> dict[str, Any]:
    """Build the dataset of an ``n``-shard run (a job array's merge step): every shard must have
    recorded all of its tasks, and no records of another sharding may lie beside them."""
    env = build_environment(cfg.env)
    every = env.tasks(cfg.env.split)[: cfg.env.limit]
    out = Path(cfg.output)
    paths = [out / f"records-{i}-of-{n}.jsonl" for i in range(n)]
    others = sorted(set(out.glob("records-*.jsonl")) - set(paths))
    if others:
        raise ValueError(
            f"--merge {n}: {', '.join(p.name for p in others)} in {out} are from another "
            "sharding; move them away or merge with that number of shards"
        )
    short = []
    for i, path in enumerate(paths):
        want = {t.id for t in every[i::n]}
        done = {r["task_id"] for r in read_records(out, [path])} if path.exists() else set()
        if want - done:
            short.append(f"shard {i}/{n} recorded {len(want & done)} of {len(want)} tasks")
    if short:
        raise ValueError(f"--merge {n}: " + "; ".join(short) + " (rerun those shards: they resume)")
    _, stats = build_dataset(out, sample_weights(cfg), paths, solve_filter=cfg.solve_filter)
    return stats


def sample_weights(cfg: AnnotateConfig) -> SampleWeights:
    return SampleWeights(**{f.name: getattr(cfg.weights, f.name) for f in fields(SampleWeights)})
