"""The teacher-annotated dataset: a Hugging Face ``DatasetDict`` built from annotation records.

Two tables:

- ``trajectories``: one row per trajectory: the student's own runs (with their assessment) and
  the runs resumed from a teacher's edit (with the edit's provenance), plus the whole trajectory
  as JSON;
- ``samples``: the per-turn training samples derived from every trajectory
  (:mod:`acmrl.train.samples`): token ids as the student saw and wrote them after any
  compaction, loss mask, token origin, old logprobs, weight.

It is rebuilt from every ``records-*.jsonl`` in the output folder (or the files given), so the
shards of a sharded run combine into one dataset, saved with ``save_to_disk`` (published by one
rename), exported to Parquet, and described by a dataset card with the counts. Builds by
concurrent shards take turns (a lock file) and each writes its own temporary folder; a record a
running shard is still writing (a line without its newline) is left for the next build.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

from acmrl.rollout.records import Trajectory
from acmrl.train.samples import POLICY, TEACHER, SampleWeights, trajectory_samples


def read_records(out: Path, paths: list[Path] | None = None) -> list[dict[str, Any]]:
    """The complete records of ``paths`` (default: every ``records-*.jsonl`` under ``out``)."""
    records = []
    for path in paths if paths is not None else sorted(out.glob("records-*.jsonl")):
        data = path.read_bytes()
        data = data[: data.rfind(b"\n") + 1]  # a line still being written is not a record yet
        records += [json.loads(line) for line in data.decode("utf-8").splitlines() if line.strip()]
    return records


@contextlib.contextmanager
def _build_lock(out: Path):
    """One dataset build at a time in ``out`` (shards finishing together take turns)."""
    with (out / ".dataset.lock").open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _row(traj: Trajectory, role: str, a: dict[str, Any] | None, n_samples: int) -> dict[str, Any]:
    edit = traj.edit or {}
    a = a or {}
    return {
        "episode_id": traj.episode_id,
        "task_id": traj.task_id,
        "env": traj.env,
        "arm": traj.arm,
        "role": role,  # student | resumed | demonstration
        "status": traj.status,
        "score": float(traj.score),
        "answer": traj.answer or "",
        "reference": json.dumps(traj.reference),
        "edit_kind": edit.get("kind") or a.get("kind") or "",
        "edit_step": int(edit.get("step", a.get("step", -1))),
        "rationale": edit.get("rationale") or a.get("rationale") or "",
        "teacher": edit.get("teacher") or a.get("teacher") or "",
        "assessment_valid": bool(a.get("valid", True)),
        "assessment_errors": json.dumps(a.get("errors", [])),
        "resumed_from": edit.get("source", ""),
        "n_samples": n_samples,
        "trajectory": json.dumps(traj.to_dict(), ensure_ascii=False),
    }


def build_dataset(
    out: str | Path,
    weights: SampleWeights | None = None,
    paths: list[Path] | None = None,
    solve_filter: bool = False,
) -> tuple[Any, dict[str, Any]]:
    """Rebuild ``out/dataset`` (and Parquet files and the card) from the records; returns the
    DatasetDict and the card's counts. Every trajectory's samples include its summariser and
    querier calls (a demonstration's notes are the teacher's), weighted per token by
    ``weights`` (:mod:`acmrl.train.samples`). ``paths``: these records files only. With
    ``solve_filter`` a task whose every resume succeeded keeps only its demonstrations
    (:func:`solved_in_every_resume`)."""
    out = Path(out)
    with _build_lock(out):
        return _build(out, weights, paths, solve_filter)


def solved_in_every_resume(record: dict[str, Any]) -> bool:
    """Whether the student solved the task in every resume of the record (at least one): the
    reference's solve-count filter drops such a question, which has nothing left to teach."""
    scores = [r.get("score") or 0.0 for r in record.get("resumed", [])]
    return bool(scores) and all(s >= 1.0 for s in scores)


def _build(
    out: Path, weights: SampleWeights | None, paths: list[Path] | None, solve_filter: bool
) -> tuple[Any, dict[str, Any]]:
    from datasets import Dataset, DatasetDict

    traj_rows, sample_rows = [], []
    dropped = 0
    for rec in read_records(out, paths):
        by_source = {a["source"]: a for a in rec["assessments"]}
        if solve_filter and solved_in_every_resume(rec):
            dropped += 1
            rec = {**rec, "trajectories": [], "resumed": []}
        for role, key in (
            ("student", "trajectories"),
            ("resumed", "resumed"),
            ("demonstration", "demonstrations"),
        ):
            for data in rec.get(key, []):
                traj = Trajectory.from_dict(data)
                samples = trajectory_samples(traj, helpers=True, weights=weights)
                traj_rows.append(_row(traj, role, by_source.get(traj.episode_id), len(samples)))
                topk = rec.get("topk", {}).get(traj.episode_id) or []
                if len(topk) != len(samples):  # none stored, or for other samples: NLL only
                    topk = [{"ids": [], "logprobs": []}] * len(samples)
                sample_rows += [
                    s.to_dict()
                    | {
                        "role": role,
                        "teacher_topk_ids": t["ids"],
                        "teacher_topk_logprobs": t["logprobs"],
                    }
                    for s, t in zip(samples, topk, strict=True)
                ]
    if not traj_rows:
        raise ValueError(f"{out}: no annotation records to build a dataset from")
    ds = DatasetDict(
        {"trajectories": Dataset.from_list(traj_rows), "samples": Dataset.from_list(sample_rows)}
    )
    tmp, final = out / f".dataset.tmp-{os.getpid()}", out / "dataset"
    shutil.rmtree(tmp, ignore_errors=True)
    ds.save_to_disk(str(tmp))
    old = out / f".dataset.old-{os.getpid()}"
    if final.exists():
        os.replace(final, old)
    os.replace(tmp, final)
    shutil.rmtree(old, ignore_errors=True)
    (out / "parquet").mkdir(exist_ok=True)
    for split in ds:
        part = out / "parquet" / f".{split}.parquet.tmp-{os.getpid()}"
        ds[split].to_parquet(str(part))
        os.replace(part, out / "parquet" / f"{split}.parquet")
    stats = card_stats(traj_rows, sample_rows) | {"solved_dropped": dropped}
    card_tmp = out / f".README.md.tmp-{os.getpid()}"
    card_tmp.write_text(card(stats))
    os.replace(card_tmp, out / "README.md")
    return ds, stats


def card_stats(trajs: list[dict[str, Any]], samples: list[dict[str, Any]]) -> dict[str, Any]:
    student = [t for t in trajs if t["role"] == "student"]
    resumed = [t for t in trajs if t["role"] == "resumed"]
    edited = [
        t
        for t in student
        if t["edit_kind"] in ("injection", "correction") and t["assessment_valid"]
    ]
    origins = Counter(o for s in samples for o in s["origin"])
    return {
        "student_trajectories": len(student),
        "student_success": sum(t["score"] >= 1.0 for t in student),
        "edits": dict(Counter(t["edit_kind"] or "none" for t in student if t["assessment_valid"])),
        "failed_assessments": sum(not t["assessment_valid"] for t in student),
        "edited_trajectories": len(edited),
        "edited_source_success": sum(t["score"] >= 1.0 for t in edited),
        "resumed_runs": len(resumed),
        "resumed_success": sum(t["score"] >= 1.0 for t in resumed),
        "demonstrations": sum(t["role"] == "demonstration" for t in trajs),
        "demonstration_success": sum(
            t["score"] >= 1.0 for t in trajs if t["role"] == "demonstration"
        ),
        "demonstration_failed": sum(
            t["score"] < 1.0 for t in trajs if t["role"] == "demonstration"
        ),
        "samples": len(samples),
        "trained_samples": sum(s["weight"] > 0 for s in samples),
        "helper_samples": sum(s["kind"] != "policy" for s in samples),
        "target_tokens": sum(sum(s["loss_mask"]) for s in samples),
        "weighted_target_tokens": round(sum(sum(s["weights"]) for s in samples), 2),
        "tokens": sum(len(s["token_ids"]) for s in samples),
        "policy_tokens": origins[POLICY],
        "teacher_tokens": origins[TEACHER],
        "by_arm": {  # a failed assessment is counted as such, not as its placeholder kind
            arm: dict(
                Counter(
                    (t["edit_kind"] or "none") if t["assessment_valid"] else "failed"
                    for t in student
                    if t["arm"] == arm
                )
            )
            for arm in sorted({t["arm"] for t in student})
        },
    }


def card(stats: dict[str, Any]) -> str:
    rows = "\n".join(f"| {k} | {v} |" for k, v in stats.items() if not isinstance(v, dict))
    edits = "\n".join(f"| {k} | {v} |" for k, v in sorted(stats["edits"].items()))
    edits = edits or "| (none: no assessment was valid) | 0 |"
    arms = "\n".join(f"| {arm} | {json.dumps(c)} |" for arm, c in stats["by_arm"].items())
    return f"""---
tags: [acmrl, agentic-context-management, teacher-annotated]
configs:
- config_name: trajectories
  data_files: parquet/trajectories.parquet
- config_name: samples
  data_files: parquet/samples.parquet
---
# acmrl teacher-annotated dataset

Student trajectories with and without context tools, the teacher's assessment of each (injection,
correction or no action, with a first-person rationale), and the student's runs resumed from each
valid edit; with `demonstrations`, one whole episode per task and arm whose every policy turn the
oracle teacher wrote. `samples` holds per-turn training samples: `token_ids` exactly as the model read and
wrote them (after any compaction), `loss_mask`, `origin` (0 environment, 1 policy, 2 teacher),
`old_logprobs`, `weights` (per token) and `weight` (their largest), `kind` (policy, summariser
or querier).

Load with `datasets.load_from_disk("dataset")` or from the Parquet files.

## Counts

| count | value |
| --- | --- |
{rows}

## Edits

| kind | trajectories |
| --- | --- |
{edits}

| arm | edits |
| --- | --- |
{arms}
"""
