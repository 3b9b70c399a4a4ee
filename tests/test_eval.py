"""acmrl eval: per-episode figures by hand, a full report from an oracle-driven run, compare."""

from __future__ import annotations

import csv
import dataclasses
import doctest
import json
import shutil
import subprocess

import pytest

import acmrl.eval.report as R
from acmrl.config import EvalConfig, load_config
from acmrl.engines.scripted import ScriptedEngine
from acmrl.envs import load
from acmrl.eval.compare import compare
from acmrl.eval.run import reported_ids, run_eval
from acmrl.provenance import PACKAGE_ROOT, read_code_version
from acmrl.rollout.records import ContextEvent, ModelCall, Step, Trajectory


def test_doctests():
    assert doctest.testmod(R).failed == 0


def _call(prompt, completion, cached=0, role="policy"):
    return ModelCall(role, prompt, completion, [], cached, "stop", 0.0)


def test_episode_row_by_hand():
    t = Trajectory("e", "t1", "kb", "acm", 0, 0, "m", "q", "a")
    t.steps = [
        Step(0, _call([1, 2, 3], [4, 5]), actions=[{"name": "search"}]),
        # prompt extends the last input + output by [6]: 5 tokens reusable, the engine reused 4
        Step(1, _call([1, 2, 3, 4, 5, 6], [7], cached=4), errors=["bad json"]),
        # after a compaction only [1, 2] survives; the summariser read 10 and wrote 3 tokens
        Step(
            2,
            _call([1, 2, 9], [8], cached=2),
            actions=[{"name": "manage_context"}],
            events=[ContextEvent("manage_context", 700, 300, 2, 5, 1, 13, 19.0)],
            helper_calls=[_call(list(range(10)), [1, 2, 3], role="summariser")],
        ),
    ]
    t.score, t.status = 1.0, "answered"
    t.compute_metrics()
    row = R.episode_row(t, budget=1000)
    assert row["turns"] == 3 and row["valid_turns"] == 2  # the turn with an error made no call
    # prompts 3 + 6 + 3 = 12; cached 0 + 4 + 2 = 6; bound 0 + 5 + 2 = 7
    assert (row["policy_prompt_tokens"], row["cached_tokens"], row["reusable_tokens"]) == (12, 6, 7)
    assert row["compaction_at"] == [0.7]
    assert row["summariser_calls"] == 1 and row["summariser_tokens"] == 13
    assert row["cost_call_tokens"] == 1 and row["cost_cache_tokens"] == 5


def test_compaction_points_count_applied_compactions_only():
    """One rule for every report (eval, GRPO's rollout metrics, versus, curves): applied
    compactions, not a refused one nor a query_memory lookup, over the episode's own budget."""
    t = Trajectory("e", "t1", "kb", "acm", 0, 0, "m", "q", "a")
    events = [
        ContextEvent("manage_context", 600, 200, 2, 5, 1, 13, 19.0),
        ContextEvent("manage_context", 900, 900, 2, 0, 0, 0, 0.0, applied=False),
        ContextEvent("query_memory", 500, 540, 2, 0, 0, 8, 8.0),
        ContextEvent("evolve", 800, 300, 2, 5, 1, 0, 9.0),
    ]
    t.steps = [Step(0, _call([1], [2]), events=events)]
    assert t.compaction_points() == []  # no budget recorded: no point to place
    t.metrics["budget"] = 1000
    assert t.compaction_points() == [0.6, 0.8]
    assert t.compaction_points(budget=2000) == [0.3, 0.4]
    again = Trajectory.from_dict(json.loads(json.dumps(t.to_dict())))
    assert again.compaction_points() == [0.6, 0.8]  # versus reads the JSON records


def test_arm_summary_and_paired_differences():
    def row(task, arm, success, peak):
        return {
            "task_id": task,
            "arm": arm,
            "success": success,
            "score": success,
            "turns": 2,
            "valid_turns": 1,
            "malformed_calls": 0,
            "tool_calls": 2,
            "mean_context_tokens": 100,
            "peak_context_tokens": peak,
            "budget": 1000,
            "compactions": 0,
            "compaction_cost": 0.0,
            "policy_prompt_tokens": 10,
            "cached_tokens": 5,
            "reusable_tokens": 8,
            "summariser_calls": 0,
            "summariser_tokens": 0,
            "querier_calls": 0,
            "querier_tokens": 0,
            "overflow": 0.0,
            "wall_s": 1.0,
        }

    rows = [row(f"t{i}", "react", float(i < 2), 900) for i in range(10)]
    rows += [row(f"t{i}", "acm", float(i < 6), 800) for i in range(10)]
    report = R.build_report(rows, {"samples": 1})
    acm, d = report["arms"]["acm"], report["vs_react"]["acm"]
    assert acm["pass@1"] == 0.6 and acm["valid_call_rate"] == 0.5
    assert acm["cache_reuse"] == 0.5 and acm["cache_reuse_bound"] == 0.8
    assert d["pass@1_abs"] == pytest.approx(0.4) and d["pass@1_rel"] == pytest.approx(2.0)
    assert d["pass@1_paired_low"] > 0  # 4 tasks flip to success, none the other way
    # exact McNemar: 4 discordant pairs, all one way: p = 2 * C(4, 0) / 2**4 = 0.125, so the
    # bootstrap interval excludes 0 where the exact test does not reject at 0.05
    assert (d["only_arm"], d["only_react"], d["pass@1_mcnemar_p"]) == (4, 0, 0.125)
    assert any(
        "exact McNemar p = 0.125 (4 episodes solved by acm alone, 0" in n for n in report["notes"]
    )
    assert d["peak_abs"] == -100
    assert any("relative gain" in n for n in report["notes"])  # react is at 0.2: flagged below 0.3
    assert any("excludes 0" in n for n in report["notes"])


def oracle_engine(env, tokenizer, pressure=0.75, budget=1400, policy="expert"):
    """The oracle's demonstrations as an engine: the same policy for every arm (``best``: each
    arm's best scripted policy)."""
    from acmrl.teacher.demonstrate import oracle_engine as engine

    return engine(env, tokenizer, budget, pressure, policy=policy)


def test_eval_writes_a_full_report_and_compare_reads_two(tmp_path, tokenizer):
    env = load("kb_search", preset="tiny", seed=0)
    cfg = EvalConfig(output=str(tmp_path / "a"), arms=["react", "acm"], machine="test CPU")
    assert cfg.agent.on_overflow == "force_answer"  # the fair rule is an eval's default
    cfg.env.options = {"preset": "tiny", "seed": 0}
    cfg.env.limit = 4
    cfg.agent.max_context_tokens = 1400
    cfg.agent.on_overflow = "fail"  # this report's react fails where it overflows
    report = run_eval(cfg, engine=oracle_engine(env, tokenizer))
    out = tmp_path / "a"
    for name in [
        "episodes.jsonl",
        "episodes.csv",
        "report.md",
        "report.csv",
        "report.json",
        "success_vs_peak.png",
        "compaction_points.png",
        "cost_breakdown.png",
    ]:
        assert (out / name).stat().st_size > 0, name
    acm, react = report["arms"]["acm"], report["arms"]["react"]
    assert acm["pass@1"] == 1.0 and acm["compactions"] >= 1 and acm["valid_call_rate"] == 1.0
    assert react["overflow"] > 0 and react["pass@1"] < 1.0
    assert acm["summariser_calls"] >= 1 and acm["compaction_cost"] > 0
    # the oracle's summaries keep every needed fact; react writes none
    assert acm["fact_retention"] == 1.0 and acm["summary_facts_in"] > 0
    assert react["fact_retention"] is None
    md = (out / "report.md").read_text()
    assert f"| {acm['summary_facts_kept']}/{acm['summary_facts_in']} (1.00) |" in md
    assert "Pass@1 [95% CI]" in md and "Reading this table" in md and "test CPU" in md
    saved = json.loads((out / "report.json").read_text())
    assert saved["vs_react"]["acm"]["pass@1_abs"] > 0
    # the report says which code wrote it: this checkout's commit, if it is one
    code = saved["meta"]["code"]
    assert code == read_code_version(PACKAGE_ROOT)
    assert f"Report written by acmrl {code['acmrl']}" in md
    if code["commit"]:
        assert f" at {code['commit'][:7]}" in md

    # the same episodes, the report rebuilt without a model; then a "before" with a worse policy
    cfg.report_only = True
    assert run_eval(cfg)["arms"]["acm"]["pass@1"] == 1.0
    # the folder keeps the eval's own config: it loads as one and rebuilds the same report
    again = load_config(EvalConfig, out / "config.yaml", ["report_only=true"])
    assert (again.arms, again.env, again.agent) == (cfg.arms, cfg.env, cfg.agent)
    assert run_eval(again)["arms"] == run_eval(cfg)["arms"]
    # the same file under a plan of one arm, then of fewer tasks: the other episodes stay in
    # the file, out of the report and of episodes.csv, which other readers keep to
    one = EvalConfig(output=cfg.output, arms=["acm"], report_only=True)
    one.env, one.agent = cfg.env, cfg.agent
    report = run_eval(one)
    assert list(report["arms"]) == ["acm"] and report["meta"]["episodes_left_out"] == 4
    # a rebuild leaves the record of what ran as it was
    assert load_config(EvalConfig, out / "config.yaml", []).arms == cfg.arms
    assert (
        "4 episode(s) in `episodes.jsonl` of arms, samples or tasks"
        in (out / "report.md").read_text()
    )
    assert len((out / "episodes.jsonl").read_text().splitlines()) == 8
    assert len(reported_ids(out)) == 4 and all("#acm#" in i for i in reported_ids(out))
    fewer = EvalConfig(output=cfg.output, arms=["react", "acm"], report_only=True)
    fewer.env, fewer.agent = dataclasses.replace(cfg.env, limit=2), cfg.agent
    report = run_eval(fewer)
    assert report["arms"]["acm"]["tasks"] == 2 and report["meta"]["episodes_left_out"] == 4
    run_eval(cfg)  # both arms and four tasks again, for what follows
    assert len(reported_ids(out)) == 8
    worse = EvalConfig(output=str(tmp_path / "b"), arms=["react", "acm"])
    worse.env = cfg.env
    worse.agent.max_context_tokens = 1400
    run_eval(worse, engine=ScriptedEngine(tokenizer, lambda s, p: "I do not know."))
    text = compare(tmp_path / "b", tmp_path / "a", output=tmp_path / "cmp.md")
    assert "| acm | Pass@1 | 0.000 | 1.000 | +1.000 | n/a |" in text
    assert "paired 95% CI over 4 tasks" in text and (tmp_path / "cmp.md").exists()
    assert "manage_context" not in text  # the worse policy made no edit to set beside acm's
    same = compare(tmp_path / "a", tmp_path / "a")
    assert "| acm | manage_context: valid rate | 1.00 | 1.00 | +0.00 | +0% |" in same
    assert "| acm | manage_context: kept prefix, mean |" in same


def test_compare_needs_result_folders(tmp_path):
    with pytest.raises(ValueError, match=r"no report\.json"):
        compare(tmp_path, tmp_path)


def test_report_over_benchmarks_says_where_a_gain_holds(tmp_path, tokenizer):
    """Two oracle-driven evals: a tight budget (react overflows, acm wins) and a loose one (no
    gain): one table with a row per (benchmark, arm) and a note that the gain holds on one only."""
    from acmrl.eval.multi import multi_report

    for seed, budget in ((0, 1250), (1, 16000)):
        env = load("kb_search", preset="tiny", seed=seed)
        cfg = EvalConfig(output=str(tmp_path / f"s{seed}"), arms=["react", "acm"])
        cfg.env.options = {"preset": "tiny", "seed": seed}
        cfg.env.limit = 3
        cfg.agent.max_context_tokens = budget
        cfg.agent.on_overflow = "fail"  # react fails where it overflows, at the tight budget
        run_eval(cfg, engine=oracle_engine(env, tokenizer, budget=budget))
    text = multi_report([tmp_path / "s0", tmp_path / "s1"], output=tmp_path / "table.md")
    rows = [line for line in text.splitlines() if line.startswith("| kb_search")]
    assert len(rows) == 4, text
    assert rows[1].startswith("| kb_search (preset tiny, seed 0) | acm | 1.000")
    assert (
        "acm: its Pass@1 gain over react holds on kb_search (preset tiny, seed 0) only; "
        "none on kb_search (preset tiny, seed 1)." in text
    )
    assert (tmp_path / "table.md").read_text() == text
    assert "compress loops/ep" in (tmp_path / "s0" / "report.md").read_text()
    with pytest.raises(ValueError, match=r"no report\.json"):
        multi_report([tmp_path])


def test_every_arm_on_kb_search_tiny_driven_by_the_oracle(tmp_path, tokenizer):
    """The five responses to a growing history side by side (Table 2), the same oracle policy
    in each: react overflows at 1,400 tokens, the context-managing arms do not; the memory arm's
    reflections are counted as summariser calls and charged as compactions."""
    env = load("kb_search", preset="tiny", seed=0)
    arms = ["react", "summary", "memory", "acm", "evolve"]
    cfg = EvalConfig(output=str(tmp_path / "all"), arms=arms)
    cfg.env.options = {"preset": "tiny", "seed": 0}
    cfg.agent.max_context_tokens = 1400
    cfg.agent.context_signal = True
    report = run_eval(cfg, engine=oracle_engine(env, tokenizer))
    assert list(report["arms"]) == arms
    memory = report["arms"]["memory"]
    assert memory["pass@1"] == 1.0 and memory["overflow"] == 0.0
    assert memory["summariser_calls"] >= memory["tool_calls"] - 1  # one reflection per result
    assert memory["compaction_cost"] > 0
    assert report["arms"]["react"]["overflow"] > 0.5
    # each arm's context edits, edit by edit: acm's summaries are generated by the summariser,
    # evolve's programs by the policy; react and memory's queries edit nothing of the kind
    edits = {a: s.get("edits", {}) for a, s in report["arms"].items()}
    assert edits["react"] == {} and set(edits["acm"]) == {"manage_context"}
    assert set(edits["summary"]) == {"summary"} and set(edits["memory"]) == {"memory"}
    acm, evolve = edits["acm"]["manage_context"], edits["evolve"]["evolve"]
    assert acm["valid_rate"] == 1.0 and acm["generated_median"] > 10
    assert evolve["applied"] == evolve["edits"] > 0 and evolve["valid_rate"] == 1.0
    assert 0 < evolve["effective_rate"] <= evolve["valid_rate"]
    assert evolve["generated_median"] > acm["generated_median"]  # a program, not a call
    assert 0 < evolve["facts_kept"] <= evolve["facts_in"]
    for f in (acm, evolve):
        assert 0.0 < f["kept_prefix_mean"] < 1.0 and f["cache_cost_median"] > 0
    with (tmp_path / "all" / "edits.csv").open() as fh:
        lines = list(csv.DictReader(fh))
    assert len(lines) == sum(f["edits"] for k in edits.values() for f in k.values())
    assert "## Context edits" in (tmp_path / "all" / "report.md").read_text()
    print((tmp_path / "all" / "report.md").read_text().split("\n## Details")[0])


def test_context_edits_by_hand():
    """An evolve episode with an applied program, a refused one and a call that never ran:
    the valid-program rate counts all three, the refusal is told by its error."""
    from acmrl.eval.edits import edit_figures

    t = Trajectory("e", "t1", "kb", "evolve", 0, 0, "m", "q", "a")
    applied = ContextEvent("evolve", 1000, 950, 900, 120, 300, 0, 420.0, facts_in=5, facts_kept=4)
    refused = ContextEvent(
        "evolve", 700, 760, 700, 60, 200, 0, 260.0, applied=False,
        detail="the code threw: SyntaxError: unexpected token in expression: ')'",
    )  # fmt: skip
    bad = '<tool_call>{"name": "evolve", "arguments": {"code": "return s"}</tool_call>'
    code = {"name": "evolve", "arguments": {"code": "return state;"}}
    t.steps = [
        Step(0, _call([1], [2]), actions=[code], events=[applied]),
        Step(1, _call([1], [2]), actions=[{"name": "evolve"}], events=[refused]),
        Step(2, _call([1], [2]), text=bad, errors=["Error in tool call 1: not valid JSON"]),
    ]
    row = R.episode_row(t, budget=2000)
    assert row["edit_calls"] == {"evolve": {"ran": 2, "malformed": 1}}
    assert [e["refusal"] for e in row["edits"]] == ["", "syntax"]
    assert row["edits"][0]["kept_prefix"] == 0.9
    assert [e["program"] for e in row["edits"]] == ["return state;", ""]
    f = edit_figures([row])["evolve"]
    assert (f["edits"], f["applied"], f["malformed"]) == (2, 1, 1)
    assert f["valid_rate"] == pytest.approx(1 / 3) and f["refusals"] == {"syntax": 1}
    assert (f["facts_in"], f["facts_kept"]) == (5, 4)  # an applied edit's only
    assert f["generated_median"] == 250 and f["cache_cost_median"] == 90
    # acm: a manage_context with nothing to compact ran but edited nothing, a harness-forced
    # compaction is no call of the policy's, and an evolve call (not acm's tool) is another
    # mistake, not an edit attempted
    t = Trajectory("e", "t1", "kb", "acm", 0, 0, "m", "q", "a")
    own = ContextEvent("manage_context", 900, 400, 300, 100, 9, 200, 300.0)
    forced = ContextEvent("manage_context", 1800, 500, 300, 100, 0, 200, 300.0)
    evolve = '<tool_call>{"name": "evolve", "arguments": {}}</tool_call>'
    t.steps = [
        Step(0, _call([1], [2]), actions=[{"name": "manage_context"}], events=[own]),
        Step(1, _call([1], [2]), actions=[{"name": "manage_context"}]),
        Step(2, None, events=[forced], origin="harness"),
        Step(3, _call([1], [2]), text=evolve, errors=["Error in tool call 1: unknown tool"]),
    ]
    row = R.episode_row(t, budget=2000)
    assert row["edit_calls"] == {"manage_context": {"ran": 2, "malformed": 0}}
    f = edit_figures([row])
    assert list(f) == ["manage_context"] and f["manage_context"]["valid_rate"] == 0.5
    # the harness's own edits have no valid rate
    summary = {"kind": "summary", "applied": 1.0, "refusal": "", "generated": 90,
               "cache_cost": 50, "kept_prefix": 0.5, "facts_in": 2, "facts_kept": 2}  # fmt: skip
    assert edit_figures([{"edits": [summary]}])["summary"]["valid_rate"] is None


def _versus_folder(folder, episodes, facts=None, kept=None, refused=()):
    """An eval folder holding ``episodes``: (task, success, compaction cost, points); each
    compaction's summary had ``facts`` = (needed facts in, kept) when given and kept the share
    ``kept`` of the prefix before it when given (one share, or one per task); the tasks in
    ``refused`` get one more edit, refused, that kept the whole prefix."""
    import json

    folder.mkdir(parents=True)

    def share(task):
        return kept[task] if isinstance(kept, dict) else kept

    lines = []
    for i, (task, win, cost, points) in enumerate(episodes):
        events = [
            {
                "kind": "manage_context",
                "applied": True,
                "tokens_before": int(p * 1000),
                "compaction_cost": cost / max(1, len(points)),
            }
            | ({"facts_in": facts[0], "facts_kept": facts[1]} if facts else {})
            | ({"reusable_prefix": round(share(task) * p * 1000)} if kept is not None else {})
            for p in points
        ]
        if task in refused:
            events.append(
                {"kind": "manage_context", "applied": False, "tokens_before": 500}
                | {"reusable_prefix": 500, "compaction_cost": 0.0}
            )
        lines.append(
            json.dumps(
                {
                    "episode_id": f"{task}#acm#{i}",
                    "task_id": task,
                    "arm": "acm",
                    "score": 1.0 if win else 0.0,
                    "metrics": {"budget": 1000, "compaction_cost": cost},
                    "steps": [
                        {"actions": [{"name": "manage_context"}], "events": [e]} for e in events
                    ]
                    + [{"actions": [{"name": "answer"}], "events": []}],
                }
            )
        )
    (folder / "episodes.jsonl").write_text("\n".join(lines) + "\n")


def test_versus_start_reports_reward_cost_per_success_and_compaction_point(tmp_path):
    from acmrl.eval.versus import versus_start
    from acmrl.rewards import RewardWeights

    w = RewardWeights(success=1.0, compaction_cost=0.1)
    _versus_folder(
        tmp_path / "start",
        [("t1", True, 1000, [0.9]), ("t2", True, 1000, [0.9]), ("t3", False, 800, [0.8])],
    )
    _versus_folder(  # cheaper successes, compacting earlier, one task more solved
        tmp_path / "trained",
        [("t1", True, 600, [0.6]), ("t2", True, 600, [0.6]), ("t3", True, 600, [0.6])],
    )
    text = versus_start(tmp_path / "start", tmp_path / "trained", w, tmp_path / "v.md")
    assert (tmp_path / "v.md").read_text() == text
    assert "| acm | Compaction Cost per success | 1000 | 600 | -400 | -40% |" in text
    assert "| acm | mean compaction point | 0.867 | 0.600 | -0.267 | |" in text
    assert "| acm | Pass@1 | 0.667 | 1.000 | +0.333 |" in text
    assert "the bar is met" in text
    assert "needed facts kept" not in text  # recorded by neither (episodes before the counts)
    _versus_folder(
        tmp_path / "kept", [("t1", True, 600, [0.6, 0.7]), ("t2", False, 600, [0.6])], (3, 2)
    )
    kept = versus_start(tmp_path / "start", tmp_path / "kept", w)
    assert "| acm | needed facts kept by edits | - | 0.667 | - | |" in kept
    assert "kept prefix" not in text  # recorded by neither
    # the reverse direction: dearer successes, lower reward
    back = versus_start(tmp_path / "trained", tmp_path / "start", w)
    assert "+67%" in back and "mean reward not up" in back and "the bar is not met" in back


def test_versus_reports_the_kept_prefix_with_a_paired_interval_for_every_seed(tmp_path):
    """The share of the prefix cache each applied edit kept, start against trained: per edit
    in each side, and paired over the tasks both edited (each task's edits averaged first); a
    refused edit, which only appends its receipt, does not count."""
    from acmrl.eval.versus import versus_seeds, versus_start
    from acmrl.rewards import RewardWeights

    w = RewardWeights(success=1.0, compaction_cost=0.1)
    start = [("t1", True, 1000, [0.9]), ("t2", True, 1000, [0.9]), ("t3", False, 800, [0.8])]
    _versus_folder(tmp_path / "start", start, kept={"t1": 0.2, "t2": 0.6, "t3": 0.4})
    # two edits on t1, one on t2 beside a refused one, none on t3
    _versus_folder(
        tmp_path / "s0",
        [("t1", True, 600, [0.6, 0.8]), ("t2", True, 600, [0.6]), ("t3", False, 0, [])],
        kept={"t1": 0.9, "t2": 0.5},
        refused={"t2"},
    )
    _versus_folder(tmp_path / "s1", start, kept={"t1": 0.2, "t2": 0.6, "t3": 0.4})  # unchanged
    text = versus_start(tmp_path / "start", tmp_path / "s0", w)
    # per applied edit 0.400 -> 0.767 (2 x 0.9 and 0.5); paired over t1 (+0.7) and t2 (-0.1)
    assert (
        "| acm | kept prefix per applied edit, mean | 0.400 | 0.767 | +0.367 | paired over the "
        "2 tasks both edited: +0.300 [-0.100, +0.700] |" in text
    )
    table = versus_seeds(
        tmp_path / "start", [("seed 0", tmp_path / "s0"), ("seed 1", tmp_path / "s1")], w, "acm"
    )
    assert "| 0.400 -> 0.767; paired +0.300 [-0.100, +0.700] over 2 tasks |" in table
    assert "| 0.400 -> 0.400; paired +0.000 [+0.000, +0.000] over 3 tasks |" in table
    assert "kept prefix per edit 0.583 (0.400 to 0.767) against 0.400." in table


def test_eval_edits_shows_a_kind_of_edit_that_one_side_stopped_making(tmp_path):
    """A policy that learned to stop writing programs: its start's programs are shown beside
    an empty side, not dropped; a refused program's kept prefix (it only appended a receipt)
    does not count."""
    import dataclasses
    import json

    from acmrl.eval.edit_change import edit_change, edit_change_md

    def folder(name, steps):
        t = Trajectory("e1", "t1", "kb", "evolve", 0, 0, "m", "q", "a")
        t.steps = steps
        (tmp_path / name).mkdir()
        (tmp_path / name / "episodes.jsonl").write_text(json.dumps(dataclasses.asdict(t)) + "\n")
        return tmp_path / name

    applied = ContextEvent("evolve", 1000, 950, 900, 120, 300, 0, 420.0, facts_in=5, facts_kept=4)
    refused = ContextEvent(
        "evolve", 700, 760, 700, 60, 200, 0, 260.0, applied=False,
        detail="the code threw: SyntaxError: unexpected token in expression: ')'",
    )  # fmt: skip
    code = {"name": "evolve", "arguments": {"code": "return state;"}}
    start = folder(
        "start",
        [
            Step(0, _call([1], [2]), actions=[code], events=[applied]),
            Step(1, _call([1], [2]), actions=[code], events=[refused]),
        ],
    )
    trained = folder("trained", [Step(0, _call([1], [2]), actions=[{"name": "answer"}])])
    v = edit_change(start, trained)["evolve"]["evolve"]
    assert v["trained"] is None and v["start"]["edits"] == 2
    assert v["start"]["kept_prefix_mean"] == 0.9  # the refused one's 1.0 left out
    assert v["dist"]["kept_prefix"] == ([0.9] * 5, None)
    assert v["kept_prefix"].tasks == 0
    md = edit_change_md(start, trained)
    assert "## evolve: evolve" in md and "| edits (per episode) | 2 (2.00) | 0 (0.00) |" in md
    assert "no task on which both applied such an edit" in md
    assert "return state;" in md and "Trained: (none)" in md


def test_eval_edits_shows_how_programs_and_summaries_changed(tmp_path, tokenizer):
    """acmrl eval edits over two real evals of the oracle (compacting at two points stands in
    for a policy before and after training): per arm and kind of edit, the figures of both, the
    kept prefix paired over the tasks both edited, the per-edit percentiles, and the first
    programs of both on the same task."""
    import csv
    import statistics

    from typer.testing import CliRunner

    from acmrl.cli import app
    from acmrl.eval.edit_change import edit_change

    env = load("kb_search", preset="tiny", seed=0)
    for name, pressure in (("a", 0.75), ("b", 0.5)):
        cfg = EvalConfig(output=str(tmp_path / name), arms=["acm", "evolve"], plots=False)
        cfg.env.options, cfg.env.limit = {"preset": "tiny", "seed": 0}, 3
        cfg.agent.max_context_tokens = 1400
        run_eval(cfg, engine=oracle_engine(env, tokenizer, pressure=pressure))
    figures = edit_change(tmp_path / "a", tmp_path / "b")
    assert set(figures) == {"acm", "evolve"}
    assert set(figures["evolve"]) == {"evolve"} and set(figures["acm"]) == {"manage_context"}

    def kept(folder, arm):  # per task, the mean of its edits' kept prefix, from edits.csv
        by: dict[str, list[float]] = {}
        with (folder / "edits.csv").open() as f:
            for r in csv.DictReader(f):
                if r["arm"] == arm and r["kept_prefix"]:
                    by.setdefault(r["task_id"], []).append(float(r["kept_prefix"]))
        return {t: sum(v) / len(v) for t, v in by.items()}

    for arm, kind in (("evolve", "evolve"), ("acm", "manage_context")):
        v = figures[arm][kind]
        ka, kb = kept(tmp_path / "a", arm), kept(tmp_path / "b", arm)
        both = sorted(set(ka) & set(kb))
        assert v["kept_prefix"].tasks == len(both) > 0
        want = statistics.mean(kb[t] - ka[t] for t in both)
        assert v["kept_prefix"].diff == pytest.approx(want)
        assert v["kept_prefix"].low <= v["kept_prefix"].diff <= v["kept_prefix"].high
        for side in v["dist"]["generated"]:
            assert side[0] <= side[2] <= side[4]
    task, first_a, first_b = figures["evolve"]["evolve"]["examples"][0]
    assert first_a["kind"] == first_b["kind"] == "evolve" and "return" in first_b["program"]
    out = tmp_path / "edits.md"
    res = CliRunner().invoke(
        app, ["eval", "edits", str(tmp_path / "a"), str(tmp_path / "b"), "-o", str(out)]
    )
    assert res.exit_code == 0, res.output
    md = out.read_text()
    assert "## evolve: evolve" in md and "## acm: manage_context" in md
    assert f"### Task `{task}`, the first evolve edit" in md and first_b["program"][:40] in md
    assert "| kept prefix | trained |" in md
    usage = CliRunner().invoke(app, ["eval", "edits", str(tmp_path / "a")])
    assert usage.exit_code != 0 and "usage: acmrl eval edits" in usage.output
    # the other tables over result folders go through the same dispatch
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    for args, head in (
        (["compare", a, b], "# acmrl eval compare"),
        (["seeds", a, b], "# 2 runs per arm, every one listed"),
        (["report", a], "Pass@1"),
    ):
        res = CliRunner().invoke(app, ["eval", *args])
        assert res.exit_code == 0 and head in res.output, (args, res.output[-500:])
    usage = CliRunner().invoke(app, ["eval", "compare", a])
    assert usage.exit_code != 0 and "usage: acmrl eval compare RESULTS_A RESULTS_B" in usage.output
    bad = CliRunner().invoke(app, ["eval", "seeds", a, str(tmp_path / "nowhere")])
    assert bad.exit_code != 0 and "has no report.json" in bad.output


def test_eval_versus_command_reads_the_grpo_runs_reward_weights(tmp_path):
    from typer.testing import CliRunner

    from acmrl.cli import app

    _versus_folder(tmp_path / "start", [("t1", True, 1000, [0.9]), ("t2", False, 800, [0.8])])
    _versus_folder(tmp_path / "trained", [("t1", True, 600, [0.6]), ("t2", True, 600, [0.6])])
    (tmp_path / "grpo.yaml").write_text("reward:\n  compaction_cost: 0.5\n")
    args = ["eval", "versus", str(tmp_path / "start"), str(tmp_path / "trained")]
    result = CliRunner().invoke(
        app, [*args, "-c", str(tmp_path / "grpo.yaml"), "-o", str(tmp_path / "v.md")]
    )
    assert result.exit_code == 0, result.output
    assert (tmp_path / "v.md").read_text().strip() == result.output.strip()
    assert "Compaction Cost 0.5" in result.output and "| -40% |" in result.output
    missing = CliRunner().invoke(app, ["eval", "versus", str(tmp_path / "start"), "nowhere"])
    assert missing.exit_code != 0 and "nowhere has no episodes.jsonl" in missing.output
    usage = CliRunner().invoke(app, ["eval", "versus", str(tmp_path / "start")])
    assert usage.exit_code != 0 and "usage: acmrl eval versus" in usage.output


def test_seeds_table_lists_every_run_and_pairs_the_arms(tmp_path, tokenizer):
    """Two runs on the same tasks (the oracle at two compaction points stands in for two
    training seeds): each run listed, mean [min, max] per arm, and per run the paired
    difference of two arms with its exact McNemar p."""
    from acmrl.eval.seeds import seeds_table

    env = load("kb_search", preset="tiny", seed=0)
    for name, pressure in (("s0", 0.75), ("s1", 0.9)):
        cfg = EvalConfig(output=str(tmp_path / name), arms=["react", "summary", "acm"], plots=False)
        cfg.env.options = {"preset": "tiny", "seed": 0}
        cfg.env.limit = 4
        cfg.agent.max_context_tokens = 1250
        cfg.agent.on_overflow = "fail"
        run_eval(cfg, engine=oracle_engine(env, tokenizer, pressure=pressure, budget=1250))
    runs = [tmp_path / "s0", tmp_path / "s1"]
    text = seeds_table(runs, output=tmp_path / "seeds.md")
    reports = [json.loads((r / "report.json").read_text()) for r in runs]
    for run, report in zip(runs, reports, strict=True):
        assert f"| {run} | acm | {report['arms']['acm']['pass@1']:.3f}" in text
    acm = [r["arms"]["acm"]["pass@1"] for r in reports]
    mean = f"{sum(acm) / 2:.3f} [{min(acm):.3f}, {max(acm):.3f}]"
    assert f"| acm | 2 | {mean} |" in text
    pair = [line for line in text.splitlines() if line.startswith(f"| react | acm | {runs[0]} |")]
    d = reports[0]["vs_react"]["acm"]
    assert len(pair) == 1 and f"{d['only_arm']} / {d['only_react']}" in pair[0]
    assert f"{d['pass@1_mcnemar_p']:.3g} |" in pair[0]
    assert (tmp_path / "seeds.md").read_text() == text
    # over both runs: each task's successes averaged over the runs, the McNemar on every pair
    rows = [list(csv.DictReader((r / "episodes.csv").open())) for r in runs]
    won = {
        arm: sum(float(x["score"]) >= 1.0 for rs in rows for x in rs if x["arm"] == arm)
        for arm in ("react", "acm")
    }
    tasks = sum(x["arm"] == "acm" for x in rows[0])
    pooled = [line for line in text.splitlines() if line.startswith("| react | acm | all 2 runs |")]
    assert len(pooled) == 1 and f"| {(won['acm'] - won['react']) / (2 * tasks):+.3f} |" in pooled[0]
    # the pooled McNemar counts are the runs' counts added up (each run paired with itself)
    per_run = [
        line.split(" | ")[5]
        for line in text.splitlines()
        if line.startswith("| react | acm | ") and "all 2 runs" not in line
    ]
    alone = [tuple(int(x) for x in c.split(" / ")) for c in per_run]
    total = (sum(b for b, _ in alone), sum(a for _, a in alone))
    assert pooled[0].split(" | ")[5] == f"{total[0]} / {total[1]}"
    # the sign-flip test: in one run (one sample per task) it is the McNemar test
    per_run_rows = [
        line.split(" | ")
        for line in text.splitlines()
        if line.startswith("| react | acm | ") and "all 2 runs" not in line
    ]
    assert len(per_run_rows) == 2
    for cells in per_run_rows:
        assert cells[6] == cells[7].removesuffix(" |")
    # a run folder with "=" in its path is a folder, not a column
    (tmp_path / "seed=0").symlink_to(runs[0])
    assert f"| {tmp_path / 'seed=0'} | acm |" in seeds_table([tmp_path / "seed=0"])
    # one model per arm: columns named per arm, paired run by run (seed by seed)
    cols = [f"acm={runs[0]},{runs[1]}", f"react:other={runs[1]},{runs[0]}"]
    composed = seeds_table(cols)
    assert f"| {runs[1]} | react:other | {reports[1]['arms']['react']['pass@1']:.3f}" in composed
    cross = [line for line in composed.splitlines() if line.startswith("| react:other | acm |")]
    assert len(cross) == 3 and cross[0].startswith(f"| react:other | acm | {runs[1]} : {runs[0]} |")
    assert "Mean peak tokens, acm / react:other:" in composed
    assert "| summary |" not in composed
    with pytest.raises(ValueError, match="each needs as many"):
        seeds_table([f"acm={runs[0]},{runs[1]}", f"react={runs[0]}"])
    with pytest.raises(ValueError, match="ARM one of"):
        seeds_table([f"acme={runs[0]}"])
    with pytest.raises(ValueError, match="not both"):
        seeds_table([f"acm={runs[0]}", str(runs[1])])
    fewer = EvalConfig(output=str(tmp_path / "fewer"), arms=["react", "summary", "acm"])
    fewer.env.options, fewer.env.limit, fewer.plots = {"preset": "tiny", "seed": 0}, 2, False
    fewer.agent.max_context_tokens, fewer.agent.on_overflow = 1250, "fail"
    run_eval(fewer, engine=oracle_engine(env, tokenizer, budget=1250))
    with pytest.raises(ValueError, match="different tasks"):
        seeds_table([runs[0], tmp_path / "fewer"])
    fairer = EvalConfig(output=str(tmp_path / "fairer"), arms=["react", "summary", "acm"])
    fairer.env.options, fairer.env.limit, fairer.plots = {"preset": "tiny", "seed": 0}, 4, False
    fairer.agent.max_context_tokens = 1250  # force_answer, the default
    run_eval(fairer, engine=oracle_engine(env, tokenizer, budget=1250))
    with pytest.raises(ValueError, match=r"other settings .*\(on_overflow\)"):
        seeds_table([runs[0], tmp_path / "fairer"])


def test_the_sign_flip_test_counts_a_task_once_over_the_seeds():
    """Four tasks that b solves and a does not, in each of three runs: the McNemar test over
    every run's pairs sees 12 independent wins (p = 2 / 4096); with the task as the unit there
    are 4, and 2 of the 16 sign patterns are as extreme (p = 0.125)."""
    from acmrl.eval.report import mcnemar, sign_flip

    runs = range(3)
    a = {f"t{t}#{r}": [0.0] for t in range(4) for r in runs}
    b = {f"t{t}#{r}": [1.0] for t in range(4) for r in runs}
    assert mcnemar(a, b).p == 2 / 4096
    tasks_a = {f"t{t}": [0.0] * 3 for t in range(4)}
    tasks_b = {f"t{t}": [1.0] * 3 for t in range(4)}
    assert sign_flip(tasks_a, tasks_b) == 0.125 == sign_flip(tasks_b, tasks_a)
    # a tie and opposite differences: t0 +3, t1 -1, t2 0, t3 +1, so |sum| = 3; of the 8 sign
    # patterns of (3, 1, 1), 6 reach |3| (5, 3, 3 and their mirrors)
    tasks_a["t1"], tasks_b["t1"] = [1.0, 0.0, 0.0], [0.0] * 3
    tasks_a["t2"] = tasks_b["t2"] = [1.0, 1.0, 0.0]
    tasks_b["t3"] = [1.0, 0.0, 0.0]
    assert sign_flip(tasks_a, tasks_b) == 6 / 8
    with pytest.raises(ValueError, match="same number of episodes"):
        sign_flip({"t": [1.0]}, {"t": [1.0, 0.0]})


def test_report_splits_the_tasks_that_need_an_archived_detail(tmp_path, tokenizer):
    """On kb_search chain, the recall questions need a detail a later document selects: the
    report says how often each arm asked its archive on them (its own archive tool:
    query_memory in acm, read_memory in memory) and its Pass@1 with and without asking; the
    best acm and memory policies ask on every one, the summary arm cannot."""
    from acmrl.eval.seeds import seeds_table

    env = load("kb_search", preset="chain", seed=0)
    arms = ["react", "summary", "memory", "acm"]
    cfg = EvalConfig(output=str(tmp_path / "r"), arms=arms, plots=False)
    cfg.env.options = {"preset": "chain", "seed": 0}
    cfg.env.limit = 8
    cfg.agent.max_turns = 30
    report = run_eval(cfg, engine=oracle_engine(env, tokenizer, budget=2048, policy="best"))
    recall = [t for t in env.tasks("eval")[:8] if t.metadata["question"] == "recall"]
    acm, summary = report["arms"]["acm"], report["arms"]["summary"]
    assert acm["archive_episodes"] == summary["archive_episodes"] == len(recall) > 0
    assert acm["archive_queried"] == 1.0 and acm["archive_pass_queried"] == 1.0
    assert summary["archive_queried"] == 0.0 and summary["archive_pass_queried"] is None
    memory = report["arms"]["memory"]
    assert memory["archive_queried"] == 1.0 and memory["archive_episodes"] == len(recall)
    with (tmp_path / "r" / "episodes.csv").open() as f:
        reads = {(r["arm"], r["task_id"]): int(r["archive_reads"]) for r in csv.DictReader(f)}
    assert all(reads["memory", t.id] >= 1 and reads["summary", t.id] == 0 for t in recall)
    md = (tmp_path / "r" / "report.md").read_text()
    assert "## Tasks that need an archived detail" in md
    assert f"| acm | {len(recall)} | 1.00 | 1.00 | 1.00 | - |" in md
    with (tmp_path / "r" / "episodes.csv").open() as f:
        flags = {r["task_id"]: r["archive_detail"] for r in csv.DictReader(f)}
    assert {k for k, v in flags.items() if v == "1.0"} == {t.id for t in recall}
    text = seeds_table([tmp_path / "r"])
    ratio = acm["peak_context_tokens"] / report["arms"]["react"]["peak_context_tokens"]
    assert f"Mean peak tokens, acm / react: {ratio:.3f}." in text
    assert f"| {tmp_path / 'r'} | acm | {len(recall)} | 1.00 | 1.00 | - |" in text


def test_failure_causes_one_per_failed_episode():
    """Each cause of :mod:`acmrl.eval.failures` from an episode built by hand: the budget first,
    then no answer, a needed document never read, the needed text gone from the context, and a
    wrong answer with the needed text in view; a success has no cause."""
    from acmrl.eval.failures import Needs, failure_counts, failure_of

    needs = Needs(reads=("d1", "d2"), evidence=("XK-1234",))
    read = [
        Step(0, None, actions=[{"name": "open", "arguments": {"doc_id": d}}]) for d in ("d1", "d2")
    ]
    seen = [{"type": "message", "content": [{"text": "[d2] the ledger code XK-1234"}]}]

    def ep(answer, status="answered", steps=read, state=seen, score=0.0, **metrics):
        return Trajectory(
            "e", "t", "kb_search", "acm", 0, 0, "m", "?", "XK-1234", steps=steps,
            answer=answer, status=status, score=score, metrics=metrics, final_state=state,
        )  # fmt: skip

    assert failure_of(ep("XK-1234", score=1.0), needs) is None
    assert failure_of(ep("", status="overflow"), needs) == "overflow"
    assert failure_of(ep("XK-9", forced_answer=True), needs) == "overflow"
    assert failure_of(ep(None, status="max_turns"), needs) == "no_answer"
    assert failure_of(ep("  "), needs) == "no_answer"
    assert failure_of(ep("(no reply)"), needs) == "no_answer"  # the agent's empty plain reply
    assert failure_of(ep("XK-9", steps=read[:1]), needs) == "unread"
    assert failure_of(ep("XK-9", state=[]), needs) == "lost"
    assert failure_of(ep("XK-9"), needs) == "wrong"
    # the answering turn is not the input it answered from: a reply quoting the code is not it
    said = [{"role": "assistant", "content": "the code is XK-1234"}]
    assert failure_of(ep("XK-9", state=said), needs) == "lost"
    assert failure_of(ep("XK-9", steps=read[:1], state=[]), needs) == "unread"  # unread first
    grep = [Step(0, None, actions=[{"name": "grep", "arguments": {"path": "d1"}}]), read[1]]
    assert failure_of(ep("XK-9", steps=grep), needs) == "unread"  # grep is not a read tool
    assert failure_of(ep("XK-9", steps=[], state=[]), None) == "wrong"  # nothing known
    rows = [{"failure": f} for f in ("lost", "lost", "wrong", "none")]
    assert failure_counts(rows) == {
        "overflow": 0, "no_answer": 0, "unread": 0, "lost": 2, "wrong": 1
    }  # fmt: skip
    assert set(failure_counts([{"failure": "none"}]).values()) == {0}  # none failed
    assert failure_counts([{}, {}]) == {}  # rows written before causes were recorded


def test_report_says_why_episodes_failed(tmp_path, tokenizer):
    """On kb_search chain: react's best policy goes over the budget on every task (the third
    document never fits), a policy that answers at once fails for a document it never read,
    and acm's best policy fails nothing; the report, episodes.csv and the seeds table say so."""
    from acmrl.eval.seeds import seeds_table

    env = load("kb_search", preset="chain", seed=0)

    def run(name, arms, engine):
        cfg = EvalConfig(output=str(tmp_path / name), arms=arms, plots=False)
        cfg.env.options, cfg.env.limit, cfg.agent.max_turns = {"preset": "chain", "seed": 0}, 4, 30
        return run_eval(cfg, engine=engine)

    arms = ["react", "summary", "acm"]
    best = run("best", arms, oracle_engine(env, tokenizer, budget=2048, policy="best"))
    assert best["arms"]["react"]["failures"] == {
        "overflow": 4, "no_answer": 0, "unread": 0, "lost": 0, "wrong": 0
    }  # fmt: skip
    assert best["arms"]["acm"]["pass@1"] == 1.0
    assert set(best["arms"]["acm"]["failures"].values()) == {0}
    md = (tmp_path / "best" / "report.md").read_text()
    assert "## Why episodes failed" in md and "| react | 4/4 | 4 | 0 | 0 | 0 | 0 |" in md
    assert "| acm | 0/4 | 0 | 0 | 0 | 0 | 0 |" in md
    # the needed text survives the real documents, summaries and archive queries: the best
    # policies' successes, given another answer, fail with the text in view; without the
    # context, for its loss
    from acmrl.eval.failures import failure_of, task_needs
    from acmrl.rollout.worker import read_trajectories

    trajs = [t for t in read_trajectories(tmp_path / "best" / "episodes.jsonl") if t.score >= 1]
    assert {t.arm for t in trajs} == {"summary", "acm"}
    needs = task_needs(env, env.tasks("eval")[:4])
    for t in trajs:
        t.score, t.answer = 0.0, "ZZ-0000"
        assert failure_of(t, needs[t.task_id]) == "wrong", t.episode_id
        t.final_state = t.final_state[:1]  # the question alone
        assert failure_of(t, needs[t.task_id]) == "lost", t.episode_id
    hasty = run("hasty", ["react"], ScriptedEngine(tokenizer, lambda s, p: "I do not know."))
    assert hasty["arms"]["react"]["failures"]["unread"] == 4
    with (tmp_path / "hasty" / "episodes.csv").open() as f:
        assert {r["failure"] for r in csv.DictReader(f)} == {"unread"}
    text = seeds_table([tmp_path / "best"])
    assert f"| {tmp_path / 'best'} | react | 4/4 | 4 | 0 | 0 | 0 | 0 |" in text


def test_the_code_version_names_the_commit_and_local_changes(tmp_path):
    import acmrl.provenance

    assert doctest.testmod(acmrl.provenance).failed == 0
    if shutil.which("git") is None:
        assert read_code_version(tmp_path)["commit"] is None
        pytest.skip("git is not installed: a report names no commit")

    def git(*args):
        quiet = ["-c", "commit.gpgsign=false", "-c", "core.hooksPath=/dev/null"]
        subprocess.run(["git", *quiet, "-C", str(tmp_path), *args], check=True, capture_output=True)

    git("init", "-q")
    (tmp_path / "f.txt").write_text("a")
    git("add", "f.txt")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    sha = subprocess.run(
        ["git", "-C", str(tmp_path), "rev-parse", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    read = read_code_version  # uncached: the checkout changes below
    installed = read_code_version(PACKAGE_ROOT)["acmrl"]
    assert read(tmp_path) == {"acmrl": installed, "commit": sha, "dirty": False}
    (tmp_path / "f.txt").write_text("b")
    assert read(tmp_path)["dirty"] is True
    (tmp_path / "g.txt").write_text("untracked files do not count")
    (tmp_path / "f.txt").write_text("a")
    assert read(tmp_path)["dirty"] is False
    assert read(tmp_path / "no-such-dir")["commit"] is None  # not a checkout: no commit
    (tmp_path / "sub").mkdir()  # inside a checkout but not its top: not this code's commit
    assert read(tmp_path / "sub")["commit"] is None
