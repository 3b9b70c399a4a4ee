"""``acmrl eval``: the episodes, then ``report.{md,csv,json}``, ``episodes.csv`` and the plots.

The episodes run through ``acmrl rollout`` (resumable: a killed eval continues where it
stopped) into ``episodes.jsonl``; the report is rebuilt from that file, so it can be redone
without running the model (``acmrl eval ... report_only=true``). ``acmrl eval compare A B``
(:mod:`acmrl.eval.compare`) puts two result folders side by side.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import os
import warnings
from pathlib import Path
from typing import Any

import yaml

from acmrl.config import EvalConfig, RolloutConfig, to_dict
from acmrl.engines.base import Engine
from acmrl.eval.failures import FAILURES, Needs, task_needs
from acmrl.eval.report import build_report, rows_from
from acmrl.provenance import code_version, describe_code
from acmrl.rollout.prompts import DEFAULT_BUDGET
from acmrl.rollout.worker import planned_ids, read_trajectories, run_rollout

EPISODES = "episodes.jsonl"


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def rollout_config(cfg: EvalConfig) -> RolloutConfig:
    return RolloutConfig(
        model=cfg.model,
        sampling=cfg.sampling,
        agent=cfg.agent,
        env=cfg.env,
        engine=cfg.engine,
        arms=list(cfg.arms),
        samples=cfg.samples,
        seed=cfg.seed,
        concurrency=cfg.concurrency,
        output=str(Path(cfg.output) / EPISODES),
        tensorboard=False,
    )


def _budget_of(cfg: EvalConfig) -> Any:
    fallback = cfg.agent.max_context_tokens

    def budget(t: Any) -> int:
        return int(t.metrics.get("budget") or fallback or DEFAULT_BUDGET)

    return budget


def _environment(cfg: EvalConfig) -> Any:
    """The eval's environment, or None when it cannot be loaded here (a report of finished
    episodes never fails for this: it leaves the archive figures out, tells failures apart
    less finely and filters the episodes by arm and sample only, and says so)."""
    from acmrl.rollout.environment import build_environment

    try:
        return build_environment(cfg.env)
    except Exception as exc:
        warnings.warn(
            f"{cfg.env.name} did not load ({exc!r}): no archived-detail figures, and failures "
            "told apart only as over the budget, no answer or other answer",
            stacklevel=3,
        )
        return None


def needs_of(env: Any, ids: set[str]) -> dict[str, Needs] | None:
    """What each of the tasks ``ids`` of ``env`` needs (:func:`~acmrl.eval.failures.task_needs`):
    the documents its expert plan reads, the text its answer is read from, and whether that is
    a detail a later document selects (kb_search chain's recall questions, which a summary
    written before cannot know to keep and ``query_memory`` can bring back); None without an
    environment."""
    if env is None:
        return None
    tasks = {t.id: t for split in env.splits for t in env.tasks(split) if t.id in ids}
    return task_needs(env, list(tasks.values()))  # a task may be in two splits (eval and test)


def _oracle(cfg: EvalConfig) -> Engine:
    """``engine.kind=oracle``: the expert plan as the policy of every arm (its tokenizer is
    ``model.name``'s, which renders the contexts and counts the budget)."""
    from acmrl.models import load_tokenizer
    from acmrl.rollout.environment import build_environment
    from acmrl.rollout.prompts import context_budget
    from acmrl.teacher.demonstrate import oracle_engine

    env = build_environment(cfg.env)
    budget = context_budget(cfg.agent, env)
    tok = load_tokenizer(cfg.model.name)
    return oracle_engine(env, tok, budget, keep_code=cfg.agent.evolve_keep_code)


def in_plan(cfg: EvalConfig, trajs: list[Any], env: Any = None) -> tuple[list[Any], int]:
    """The episodes ``cfg`` asks for, and how many others the file holds.

    An eval resumed under another plan (an arm dropped, fewer samples, fewer tasks or another
    split) keeps the other episodes in ``episodes.jsonl``; the report covers only what the
    config asks for, so a figure never mixes in an arm, sample or task the config does not
    name. Without the environment (``env`` None) the tasks cannot be listed: arms and samples
    only."""
    if env is not None:
        planned = set(planned_ids(rollout_config(cfg), env))
        kept = [t for t in trajs if t.episode_id in planned]
    else:
        arms = set(cfg.arms)
        kept = [t for t in trajs if t.arm in arms and t.sample < cfg.samples]
    return kept, len(trajs) - len(kept)


def reported_ids(folder: str | Path) -> set[str] | None:
    """The episode ids a results folder's report covers (its ``episodes.csv``), None for a
    folder without one: what reads ``episodes.jsonl`` beside the report keeps to these."""
    path = Path(folder) / "episodes.csv"
    if not path.is_file():
        return None
    with path.open(newline="") as f:
        return {row["episode_id"] for row in csv.DictReader(f)}


def run_eval(cfg: EvalConfig, engine: Engine | None = None) -> dict[str, Any]:
    """Run (unless ``report_only``) and write the report; returns it."""
    out = Path(cfg.output)
    out.mkdir(parents=True, exist_ok=True)
    if not cfg.report_only:
        if engine is None and cfg.engine.kind == "oracle":
            engine = _oracle(cfg)
        run_rollout(rollout_config(cfg), engine=engine)
        # the eval's own config, in place of the rollout's: `acmrl eval -c OUT/config.yaml`
        # reruns it (its finished episodes kept) and `report_only=true` rebuilds its report; a
        # rebuild (perhaps of a narrower plan) leaves the record of what ran as it is
        saved = to_dict(dataclasses.replace(cfg, report_only=False))
        _atomic_write(out / "config.yaml", yaml.safe_dump(saved, sort_keys=False))
    path = out / EPISODES
    if not path.exists():
        raise ValueError(f"{path} does not exist: run the eval first (report_only=false)")
    env = _environment(cfg)
    trajs, left_out = in_plan(cfg, read_trajectories(path), env)
    if not trajs:
        raise ValueError(f"{path} holds no episodes of this config's arms, samples and tasks")
    rows = rows_from(trajs, _budget_of(cfg), needs_of(env, {t.task_id for t in trajs}))
    meta = {
        "model": cfg.model.name,
        "env": cfg.env.name,
        "env_options": cfg.env.options,
        "split": cfg.env.split,
        "samples": cfg.samples,
        "temperature": cfg.sampling.temperature,
        "max_new_tokens": cfg.sampling.max_new_tokens,
        "machine": cfg.machine,
        "repeat_rule": cfg.agent.repeat_rule,
        "text_call_rule": cfg.agent.text_call_rule,
        "on_overflow": cfg.agent.on_overflow,
        "force_compaction": cfg.agent.force_compaction,
        "episodes_left_out": left_out,
        "code": code_version(),
    }
    report = build_report(rows, meta)
    write_report(report, rows, out, plots=cfg.plots)
    return report


EPISODE_FIELDS = [
    "episode_id",
    "task_id",
    "arm",
    "sample",
    "status",
    "score",
    "turns",
    "valid_turns",
    "tool_calls",
    "malformed_calls",
    "mean_context_tokens",
    "peak_context_tokens",
    "budget",
    "compactions",
    "failed_edits",
    "compaction_cost",
    "policy_prompt_tokens",
    "cached_tokens",
    "reusable_tokens",
    "summariser_calls",
    "summariser_tokens",
    "summary_facts_in",
    "summary_facts_kept",
    "querier_calls",
    "querier_tokens",
    "archive_reads",
    "archive_detail",
    "failure",
    "needs_known",
    "env_incidents",
    "wall_s",
]


def write_report(
    report: dict[str, Any], rows: list[dict[str, Any]], out: Path, plots: bool = True
) -> None:
    _atomic_write(out / "report.json", json.dumps(report, indent=1))
    _atomic_write(out / "report.csv", report_csv(report))
    buf = io.StringIO()
    w = csv.DictWriter(buf, EPISODE_FIELDS, extrasaction="ignore")
    w.writeheader()
    w.writerows(rows)
    _atomic_write(out / "episodes.csv", buf.getvalue())
    if edits := [e for r in rows for e in r.get("edits") or []]:
        buf = io.StringIO()
        w = csv.DictWriter(buf, list(edits[0]))
        w.writeheader()
        w.writerows(edits)
        _atomic_write(out / "edits.csv", buf.getvalue())
    else:  # a report rebuilt without edits leaves none of an earlier one's
        (out / "edits.csv").unlink(missing_ok=True)
    figures = []
    if plots:
        from acmrl.eval.plots import write_plots

        figures = write_plots(report, rows, out)
    _atomic_write(out / "report.md", report_markdown(report, figures))


CSV_FIELDS = [
    "episodes",
    "tasks",
    "pass@1",
    "pass@1_low",
    "pass@1_high",
    "score",
    "tool_calls",
    "valid_call_rate",
    "malformed_per_episode",
    "turns",
    "mean_context_tokens",
    "peak_context_tokens",
    "max_peak_context_tokens",
    "budget",
    "compactions",
    "failed_edits",
    "compaction_cost",
    "compaction_cost_budget",
    "cache_reuse",
    "cache_reuse_bound",
    "summariser_calls",
    "summariser_tokens",
    "fact_retention",
    "querier_calls",
    "querier_tokens",
    "overflow",
    "wall_s",
]
DIFF_FIELDS = [
    "pass@1_abs",
    "pass@1_rel",
    "pass@1_paired_low",
    "pass@1_paired_high",
    "pass@1_mcnemar_p",
    "tool_calls_abs",
    "tool_calls_rel",
    "peak_abs",
    "peak_rel",
]


def report_csv(report: dict[str, Any]) -> str:
    extra = sorted(
        {k for s in report["arms"].values() for k in s if k.startswith("pass@")} - set(CSV_FIELDS)
    )
    fields = ["arm", *CSV_FIELDS, *extra, *(f"vs_react_{k}" for k in DIFF_FIELDS)]
    buf = io.StringIO()
    w = csv.DictWriter(buf, fields)
    w.writeheader()
    for arm, s in report["arms"].items():
        d = report["vs_react"].get(arm, {})
        w.writerow(
            {"arm": arm, **{k: s.get(k) for k in CSV_FIELDS + extra}}
            | {f"vs_react_{k}": d.get(k) for k in DIFF_FIELDS}
        )
    return buf.getvalue()


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:+.0%}"


def main_table(report: dict[str, Any]) -> str:
    """The Table-2 view: Pass@1, tool calls and peak tokens, with absolute and relative
    differences against react side by side."""
    arms, diffs = report["arms"], report["vs_react"]
    ks = sorted(
        {
            k
            for s in arms.values()
            for k in s
            if k.startswith("pass@") and k[5:].isdigit() and k != "pass@1"
        }
    )
    head = [
        "arm",
        "Pass@1 [95% CI]",
        "Δ abs",
        "Δ rel",
        *ks,
        "tool calls",
        "Δ abs",
        "Δ rel",
        "peak tokens",
        "Δ abs",
        "Δ rel",
        "overflow",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for arm, s in arms.items():
        d = diffs.get(arm)
        cells = [
            arm,
            f"{s['pass@1']:.3f} [{s['pass@1_low']:.2f}, {s['pass@1_high']:.2f}]",
            f"{d['pass@1_abs']:+.3f}" if d else "",
            _pct(d["pass@1_rel"]) if d else "",
            *(f"{s[k]:.3f}" for k in ks),
            f"{s['tool_calls']:.2f}",
            f"{d['tool_calls_abs']:+.2f}" if d else "",
            _pct(d["tool_calls_rel"]) if d else "",
            f"{s['peak_context_tokens']:.0f}",
            f"{d['peak_abs']:+.0f}" if d else "",
            _pct(d["peak_rel"]) if d else "",
            f"{s['overflow']:.2f}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def detail_table(report: dict[str, Any]) -> str:
    head = [
        "arm",
        "episodes",
        "valid-call rate",
        "malformed/ep",
        "mean ctx",
        "max peak",
        "compactions/ep",
        "compress loops/ep",
        "failed edits/ep",
        "Compaction Cost (tok)",
        "cost/budget",
        "cache reuse",
        "reuse bound",
        "summariser calls (tok)",
        "facts kept by summaries",
        "querier calls (tok)",
        "wall s/ep",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for arm, s in report["arms"].items():
        cells = [
            arm,
            str(s["episodes"]),
            f"{s['valid_call_rate']:.2f}",
            f"{s['malformed_per_episode']:.2f}",
            f"{s['mean_context_tokens']:.0f}",
            str(s["max_peak_context_tokens"]),
            f"{s['compactions']:.2f}",
            f"{s.get('compress_loops', 0.0):.2f}",
            f"{s.get('failed_edits', 0.0):.2f}",
            f"{s['compaction_cost']:.0f}",
            f"{s['compaction_cost_budget']:.3f}",
            f"{s['cache_reuse']:.2f}",
            f"{s['cache_reuse_bound']:.2f}",
            f"{s['summariser_calls']:.2f} ({s['summariser_tokens']:.0f})",
            facts_cell(s),
            f"{s['querier_calls']:.2f} ({s['querier_tokens']:.0f})",
            f"{s['wall_s']:.1f}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def facts_cell(s: dict[str, Any]) -> str:
    """An arm's fact retention with its counts, ``kept/in (share)``; ``-`` without summaries."""
    if s.get("fact_retention") is None:
        return "-"
    return f"{s['summary_facts_kept']}/{s['summary_facts_in']} ({s['fact_retention']:.2f})"


def overflow_rule(meta: dict[str, Any]) -> str:
    """The overflow rule of a report, in words (``agent.on_overflow``, ``force_compaction``)."""
    if meta.get("on_overflow") == "force_answer":
        text = (
            "Overflow rule (`agent.on_overflow=force_answer`): an input over the budget drops its "
            "oldest steps and the model is asked once for its final answer."
        )
    else:
        text = (
            "Overflow rule (`agent.on_overflow=fail`): an input over the budget ends the episode."
        )
    if meta.get("force_compaction"):
        text += (
            f" acm: the harness compacts at {meta['force_compaction']:.0%} of the budget "
            "(`agent.force_compaction`)."
        )
    return text


def archive_lines(report: dict[str, Any]) -> list[str]:
    """The tasks that need an archived detail, per arm: how often the archive was asked and
    Pass@1 with and without asking (nothing when no task needs one)."""
    arms = {a: s for a, s in report["arms"].items() if s.get("archive_episodes")}
    if not arms:
        return []

    def pct(x: float | None) -> str:
        return "-" if x is None else f"{x:.2f}"

    lines = [
        "## Tasks that need an archived detail",
        "",
        "A detail that matters only once a later document says so: a summary written before "
        "cannot know to keep it; the arm's archive tool (`query_memory` in acm, `read_memory` in "
        "memory) or reading the document again brings it back. Asked the archive: the share "
        "of these episodes where the policy called that tool.",
        "",
        "| arm | episodes | asked the archive | Pass@1 | Pass@1 when asked | Pass@1 when not |",
        "|---|---|---|---|---|---|",
    ]
    for a, s in arms.items():
        lines.append(
            f"| {a} | {s['archive_episodes']} | {s['archive_queried']:.2f} | "
            f"{pct(s['archive_pass'])} | {pct(s['archive_pass_queried'])} | "
            f"{pct(s['archive_pass_unqueried'])} |"
        )
    return [*lines, ""]


def edit_lines(report: dict[str, Any]) -> list[str]:
    """The context edits, per arm and kind (:mod:`acmrl.eval.edits`; nothing when no arm
    edited its context)."""
    arms = {a: s["edits"] for a, s in report["arms"].items() if s.get("edits")}
    if not arms:
        return []

    def num(x: float | None, spec: str) -> str:
        return "-" if x is None else format(x, spec)

    lines = [
        "## Context edits",
        "",
        "Per edit: the tokens generated for it (the call and the summariser's completion), the "
        "Cache Cost of the next input, and the share of the input before it that the next input "
        "still shares as its prefix (kept prefix: 1.0 when the edit only appends). Valid: the "
        "policy's applied edits over its calls of the tool, malformed ones included (none for the "
        "harness's edits); effective: of those calls, the applied edits that made the input "
        "smaller and kept every key term they had to keep. Facts: the task's key terms an "
        "applied edit had to keep, and kept (`edits.csv` has every edit).",
        "",
        "| arm | edit | per episode | valid | effective | refused (why) | generated, median | "
        "Cache Cost, median | kept prefix, mean | facts kept |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for a, kinds in arms.items():
        for kind, f in kinds.items():
            why = ", ".join(f"{k} {n}" for k, n in sorted(f["refusals"].items()))
            refused = f"{f['edits'] - f['applied']}" + (f" ({why})" if why else "")
            if f["malformed"]:
                refused += f", {f['malformed']} malformed"
            facts = f"{f['facts_kept']}/{f['facts_in']}" if f["facts_in"] else "-"
            lines.append(
                f"| {a} | {kind} | {f['per_episode']:.2f} | {num(f['valid_rate'], '.2f')} | "
                f"{num(f.get('effective_rate'), '.2f')} | {refused} | "
                f"{num(f['generated_median'], '.0f')} | {num(f['cache_cost_median'], '.0f')} | "
                f"{num(f['kept_prefix_mean'], '.2f')} | {facts} |"
            )
    return [*lines, ""]


FAILURE_WORDS = {
    "overflow": "over the budget",
    "no_answer": "no answer",
    "unread": "a needed document never read",
    "lost": "needed text not in the input",
    "wrong": "needed text in the input, other answer",
}


def failure_lines(report: dict[str, Any]) -> list[str]:
    """Why the failed episodes failed, per arm (:mod:`acmrl.eval.failures`; nothing when the
    report's rows carry no cause)."""
    arms = {a: s for a, s in report["arms"].items() if "failures" in s}
    if not arms:
        return []
    lines = [
        "## Why episodes failed",
        "",
        "One cause per failed episode, the first that holds, in the order of the columns; the "
        "needed documents are those the expert plan reads, the needed text what the answer is "
        "read from, and the input the one the policy answered from (`acmrl.eval.failures`).",
        "",
        "| arm | failed | " + " | ".join(FAILURE_WORDS[f] for f in FAILURES) + " |",
        "|---|---|" + "---|" * len(FAILURES),
    ]
    unknown = []
    for a, s in arms.items():
        counts = s["failures"]
        lines.append(
            f"| {a} | {sum(counts.values())}/{s['episodes']} | "
            + " | ".join(str(counts.get(f, 0)) for f in FAILURES)
            + " |"
        )
        if s.get("failures_needs_unknown"):
            unknown.append(f"{a} {s['failures_needs_unknown']}")
    if unknown:
        lines += [
            "",
            "What some tasks need was not known here (the environment did not load, or not for "
            "them), so their failures count as over the budget, no answer or other answer: "
            + ", ".join(unknown)
            + " failed episodes.",
        ]
    return [*lines, ""]


def report_markdown(report: dict[str, Any], figures: list[str]) -> str:
    m = report["meta"]
    any_arm = next(iter(report["arms"].values()))
    lines = [
        f"# acmrl eval: `{m['model']}` on `{m['env']}` ({m['split']})",
        "",
        f"{any_arm['tasks']} tasks x {m['samples']} sample(s) per arm; temperature "
        f"{m['temperature']}, at most {m['max_new_tokens']} tokens per turn; context budget "
        f"{any_arm['budget']} tokens (the complete rendered input)."
        + (f" Machine: {m['machine']}." if m.get("machine") else "")
        + (f" Report written by {describe_code(m['code'])}." if m.get("code") else "")
        + (
            " Harness rule on in every arm: an environment call identical to an earlier one "
            "whose result is still in the context is not run again (`agent.repeat_rule`)."
            if m.get("repeat_rule")
            else ""
        )
        + (
            " Harness rule on in every arm: a reply that writes a tool call as text, "
            "`name({...})`, gets an error observation instead of ending as the answer "
            "(`agent.text_call_rule`)."
            if m.get("text_call_rule")
            else ""
        )
        + f" {overflow_rule(m)}"
        + (
            f" {m['episodes_left_out']} episode(s) in `episodes.jsonl` of arms, samples or tasks "
            "this config does not ask for (an earlier run of another plan) are left out."
            if m.get("episodes_left_out")
            else ""
        ),
        "",
        main_table(report),
        "",
        "Δ: the arm minus react, absolute and relative. Peak tokens: each episode's largest model "
        "input, averaged over episodes.",
        "",
        "## Details",
        "",
        detail_table(report),
        "",
        *archive_lines(report),
        *edit_lines(report),
        *failure_lines(report),
        "## Reading this table",
        "",
        *(f"- {n}" for n in report["notes"]),
        "",
    ]
    if figures:
        lines += ["## Figures", "", *(f"![{f}]({f})" for f in figures), ""]
    return "\n".join(lines)
