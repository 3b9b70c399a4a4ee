"""``acmrl audit``: the ceilings of a task set, before anything is trained.

For the configured split it runs each arm's best scripted policy and the trivial strategies
(:mod:`acmrl.teacher.ceiling`) through the real agent loop, under the budget and overflow rule
of the config (``force_answer`` by default, the fair rule), and writes per strategy: Pass@1 with
its Wilson interval, mean and largest peak tokens, the overflow share, tool calls, compactions,
``query_memory`` calls and Compaction Cost. A trained arm is read against its ceiling; a task
set whose trivial strategies score, or whose ``react`` ceiling equals the managing arms', does
not need context management, whatever a trained comparison on it shows.

The episodes go to ``episodes.jsonl`` as they end (a rerun continues), then ``audit.json`` and
``audit.md`` are written atomically.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from acmrl.arms import get_arm
from acmrl.config import AgentConfig, AuditConfig, SamplingConfig
from acmrl.engines.scripted import ScriptedEngine
from acmrl.eval.report import arm_summary, episode_row
from acmrl.provenance import code_version, describe_code
from acmrl.rollout.agent import Episode
from acmrl.rollout.prompts import context_budget
from acmrl.rollout.worker import TrajectoryWriter, read_trajectories, run_episodes
from acmrl.teacher.ceiling import answer_text, audit_reply

EPISODES = "episodes.jsonl"


# the trivial strategies that follow a prefix of the expert's plan
PLANNED_TRIVIAL = ("listed_title", "def_line", "first_argument", "random_argument")


def strategies(cfg: AuditConfig, planned: bool = True) -> list[tuple[str, str]]:
    """``(strategy, arm)`` pairs in report order: the arms' ceilings (those of react and mask,
    whose only means of keeping a fact is the policy's thoughts, twice: as is and ``noted``,
    its thoughts repeating the evidence it read), then the trivial ones, then
    ``model`` (the configured model in react) with ``model_react``. Without an expert plan
    (``planned`` False) only what needs none: the trivial strategies that read no plan and the
    model's react."""
    ceilings = [
        (name, arm)
        for arm in cfg.arms
        for name in (("ceiling", "noted") if get_arm(arm).noted_ceiling else ("ceiling",))
    ]
    trivial = [(t, "react") for t in cfg.trivial if planned or t not in PLANNED_TRIVIAL]
    model = [("model", "react")] if cfg.model_react or not planned else []
    return (ceilings if planned else []) + trivial + model


SETTINGS = "audit-settings.json"


def settings(cfg: AuditConfig) -> dict[str, Any]:
    """What an episode's outcome depends on: the agent section, the tasks and the tokenizer (a
    rerun may add arms, strategies or tasks, never change these)."""
    return {
        "agent": dataclasses.asdict(cfg.agent),
        "env": {"name": cfg.env.name, "options": cfg.env.options, "split": cfg.env.split},
        "tokenizer": cfg.model.name,
        "model_tokens": cfg.model_tokens,  # what the model row's turns may generate
    }


def check_settings(out: Path, now: dict[str, Any]) -> None:
    """Record the settings of the episodes in ``out``; refuse to add to episodes run under
    others, naming what changed (a report would otherwise mix them under the new header)."""
    from acmrl.eval.run import _atomic_write

    path = out / SETTINGS
    if not path.exists():
        if (out / EPISODES).exists():
            raise ValueError(
                f"{out / EPISODES} has no {SETTINGS} beside it: its settings are unknown; use "
                "another output folder or remove it"
            )
        _atomic_write(path, json.dumps(now, indent=1, sort_keys=True))
        return
    before, after = _flat(json.loads(path.read_text())), _flat(now)
    # an agent option added since those episodes ran had its default there
    default = _flat({"agent": dataclasses.asdict(AgentConfig())})
    was = {k: before.get(k, default.get(k)) for k in set(before) | set(after)}
    changed = [
        f"{k}: {was[k]!r} -> {after.get(k)!r}" for k in sorted(was) if was[k] != after.get(k)
    ]
    if changed:
        raise ValueError(
            f"{out} holds audit episodes run under other settings ({'; '.join(changed)}); use "
            "another output folder or remove it"
        )


def _flat(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested settings as dotted keys.

    >>> _flat({"agent": {"budget": 1300}, "tokenizer": "m"})
    {'agent.budget': 1300, 'tokenizer': 'm'}
    """
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict) and k != "options":
            out |= _flat(v, f"{prefix}{k}.")
        else:
            out[f"{prefix}{k}"] = v
    return out


def run_audit(cfg: AuditConfig) -> dict[str, Any]:
    """Run the audit's episodes (those not already in the output) and write its report."""
    from acmrl.eval.run import _atomic_write
    from acmrl.models import load_tokenizer
    from acmrl.rollout.environment import build_environment

    env = build_environment(cfg.env)
    tokenizer = load_tokenizer(cfg.model.name)
    budget = context_budget(cfg.agent, env)
    tasks = env.tasks(cfg.env.split)[: cfg.env.limit]
    if not tasks:
        raise ValueError(f"{cfg.env.name} split {cfg.env.split!r} has no tasks")
    no_plan = env.has_plan(*tasks)  # a mixture may hold tasks with and without one
    chosen = strategies(cfg, planned=no_plan is None)
    train = env.tasks("train") if "train" in env.splits else tasks
    answers = [(t.id, answer_text(t)) for t in train]
    out = Path(cfg.output)
    out.mkdir(parents=True, exist_ok=True)
    check_settings(out, settings(cfg))
    writer = TrajectoryWriter(out / EPISODES)
    scripted = SamplingConfig(max_new_tokens=4096)  # a script's turn is never cut
    model = SamplingConfig(max_new_tokens=cfg.model_tokens)  # greedy

    def episodes(which: set[str]) -> list[Episode]:
        return [
            Episode(
                f"{t.id}#{arm}#{name}",
                env,
                t,
                arm,
                tokenizer,
                agent=cfg.agent,
                sampling=model if name == "model" else scripted,
            )
            for t in tasks
            for name, arm in chosen
            if (name == "model") == ("model" in which) and f"{t.id}#{arm}#{name}" not in writer.done
        ]

    reply = audit_reply(env, tokenizer, budget, answers, keep_code=cfg.agent.evolve_keep_code)
    engine = ScriptedEngine(tokenizer, reply, truncate=False)
    try:
        run_episodes(
            episodes({"scripts"}),
            engine,
            concurrency=cfg.concurrency,
            on_done=lambda e: writer.write(e.traj),
        )
        if own := episodes({"model"}):
            from acmrl.engines.hf import HFEngine

            run_episodes(
                own,
                HFEngine.from_config(cfg.model),
                concurrency=cfg.concurrency,
                on_done=lambda e: writer.write(e.traj),
            )
    finally:
        writer.close()
    wanted = {f"{t.id}#{arm}#{name}" for t in tasks for name, arm in chosen}
    trajs = [t for t in read_trajectories(out / EPISODES) if t.episode_id in wanted]
    report = build_audit(trajs, cfg, budget, chosen)
    report["no_plan"] = no_plan
    report["fixed_prompt_tokens"] = fixed_prompts(env, tasks[0], tokenizer, chosen, cfg, budget)
    report["code"] = code_version()
    _atomic_write(out / "audit.json", json.dumps(report, indent=1))
    _atomic_write(out / "audit.md", audit_markdown(report))
    return report


def fixed_prompts(
    env: Any,
    task: Any,
    tokenizer: Any,
    chosen: list[tuple[str, str]],
    cfg: AuditConfig,
    budget: int,
) -> dict[str, int]:
    """Each audited arm's fixed prompt in tokens: its system message and tool schemas, as the
    episode renders them under ``cfg.agent`` before the task's first message."""
    from acmrl.arms import arm_tools, get_arm
    from acmrl.context.render import Renderer

    tools = env.session(task).tools
    out = {}
    for arm in dict.fromkeys(arm for _, arm in chosen):
        system = get_arm(arm).system_prompt(budget, cfg.agent)
        renderer = Renderer(tokenizer, system, arm_tools(tools, arm, cfg.agent))
        out[arm] = len(renderer.ids([], add_generation_prompt=False))
    return out


def build_audit(
    trajs: list[Any], cfg: AuditConfig, budget: int, chosen: list[tuple[str, str]] | None = None
) -> dict[str, Any]:
    rows: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for t in trajs:
        name = t.episode_id.rsplit("#", 1)[1]
        row = episode_row(t, int(t.metrics.get("budget") or budget))
        row["query_memory"] = sum(a["name"] == "query_memory" for s in t.steps for a in s.actions)
        rows.setdefault((name, t.arm), []).append(row)
    table = []
    for name, arm in chosen if chosen is not None else strategies(cfg):
        got = rows.get((name, arm), [])
        if not got:
            continue
        s = arm_summary(got, 1)
        table.append(
            {
                "strategy": name,
                "arm": arm,
                "episodes": s["episodes"],
                "pass@1": s["pass@1"],
                "pass@1_low": s["pass@1_low"],
                "pass@1_high": s["pass@1_high"],
                "peak_context_tokens": s["peak_context_tokens"],
                "max_peak_context_tokens": s["max_peak_context_tokens"],
                "overflow": s["overflow"],
                "tool_calls": s["tool_calls"],
                "compactions": s["compactions"],
                "query_memory": sum(r["query_memory"] for r in got) / len(got),
                "compaction_cost": s["compaction_cost"],
            }
        )
    return {
        "env": cfg.env.name,
        "env_options": cfg.env.options,
        "split": cfg.env.split,
        "tasks": len({t.task_id for t in trajs}),
        "budget": budget,
        "on_overflow": cfg.agent.on_overflow,
        "tokenizer": cfg.model.name,
        "strategies": table,
    }


def _fixed_line(report: dict[str, Any]) -> list[str]:
    fixed = report.get("fixed_prompt_tokens") or {}
    if not fixed:
        return []
    each = ", ".join(f"{arm} {n:,}" for arm, n in fixed.items())
    return [f"Fixed prompt (system message and tool schemas), tokens: {each}.", ""]


def _plan_line(report: dict[str, Any]) -> list[str]:
    lines = []
    if report.get("no_plan"):
        lines.append(
            f"No expert plan ({report['no_plan']}): the arms' ceilings cannot be scripted and "
            "are not measured; the trivial strategies that follow a plan are left out."
        )
    if any(r["strategy"] == "model" for r in report["strategies"]):
        lines.append(
            f"`model` is `{report['tokenizer']}` itself in react, greedy: an agent not trained "
            "on these tasks."
        )
    return [*lines, ""] if lines else []


def audit_markdown(report: dict[str, Any]) -> str:
    opts = ", ".join(f"{k}={v}" for k, v in report["env_options"].items())
    lines = [
        f"# Audit: {report['env']} ({opts}), split {report['split']}",
        "",
        f"{report['tasks']} tasks, budget {report['budget']} tokens, "
        f"on_overflow={report['on_overflow']}. A ceiling is the arm's best scripted policy "
        "(it answers only once its context shows the answer's evidence); `noted` is the same "
        "with each thought first repeating the evidence lines it has read (react's and mask's "
        "only way to keep a fact past the overflow rule's dropping of its oldest steps or "
        "mask's masking of its oldest results), so their ceilings are the better of their two "
        "rows; the trivial "
        "strategies play react and read no document (code_nav's first_argument and "
        "random_argument read the first definition)."
        + (f" Report written by {describe_code(report['code'])}." if report.get("code") else ""),
        "",
        *_fixed_line(report),
        *_plan_line(report),
        "| strategy | arm | Pass@1 [95% CI] | peak tokens (mean / max) | overflow | tool calls "
        "| compactions | query_memory | Compaction Cost/ep |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in report["strategies"]:
        lines.append(
            f"| {r['strategy']} | {r['arm']} | {r['pass@1']:.3f} [{r['pass@1_low']:.2f}, "
            f"{r['pass@1_high']:.2f}] | {r['peak_context_tokens']:.0f} / "
            f"{r['max_peak_context_tokens']} | {r['overflow']:.2f} | {r['tool_calls']:.1f} "
            f"| {r['compactions']:.2f} | {r['query_memory']:.2f} | {r['compaction_cost']:.0f} |"
        )
    return "\n".join(lines) + "\n"
