"""The agent loop, the four arms and the workers, on kb_search tiny.

The policy is either a script (the oracle's plan replayed as tool calls, with compactions where
a test wants them) or the tiny random model; summariser and querier calls go to the tiny random
model through the real HF engine. Environment, tools, archive, sandbox and costs all run for real.
"""

from __future__ import annotations

import itertools
import json

import pytest

from acmrl.config import AgentConfig, RolloutConfig, SamplingConfig
from acmrl.context.prefix import compaction_cost
from acmrl.context.render import format_tool_call
from acmrl.context.state import validate
from acmrl.engines.scripted import ScriptedEngine, replay
from acmrl.envs import load
from acmrl.rollout.agent import Episode
from acmrl.rollout.records import STATUSES, Trajectory
from acmrl.rollout.worker import read_trajectories, run_episodes, run_rollout


@pytest.fixture(scope="module")
def env():
    return load("kb_search", preset="tiny", seed=0)


@pytest.fixture(scope="module")
def tiny(tiny_engine):
    return tiny_engine


def calls(plan) -> list[str]:
    return [format_tool_call(name, args) for name, args in plan]


def episode(env, task, arm, tok, **agent) -> Episode:
    return Episode(
        f"{task.id}#{arm}#0",
        env,
        task,
        arm,
        tok,
        agent=AgentConfig(**agent),
        sampling=SamplingConfig(max_new_tokens=200),
    )


def play(ep: Episode, texts: list[str], helper) -> Trajectory:
    policy = ScriptedEngine(helper.tokenizer, replay({ep.id: texts}))
    run_episodes([ep], policy, helper_engine=helper)
    return ep.traj


def test_react_oracle_replay_is_recorded_exactly(env, tiny):
    task = env.tasks("eval")[0]
    plan = env.oracle_plan(task)
    ep = episode(env, task, "react", tiny.tokenizer, max_context_tokens=4096)
    traj = play(ep, calls(plan), tiny)
    assert traj.status == "answered" and traj.score == 1.0 and traj.answer == task.answer
    assert len(traj.steps) == len(plan) and traj.metrics["tool_calls"] == len(plan)
    validate(traj.final_state)
    # each call's prompt is the rendered State the model saw, extended turn by turn
    prompts = [s.call.prompt_ids for s in traj.steps]
    assert all(b[: len(a)] == a for a, b in itertools.pairwise(prompts))
    assert traj.metrics["peak_context_tokens"] == len(prompts[-1])
    again = Trajectory.from_dict(json.loads(json.dumps(traj.to_dict())))
    assert again == traj


def test_react_overflows_the_tiny_budget(env, tiny):
    task = env.tasks("eval")[0]
    traj = play(episode(env, task, "react", tiny.tokenizer), calls(env.oracle_plan(task)), tiny)
    assert traj.status == "overflow" and traj.score == 0.0
    assert "budget is 1024" in traj.error


def test_acm_compacts_archives_and_queries(env, tiny):
    task = env.tasks("eval")[0]
    plan = env.oracle_plan(task)
    texts = [*calls(plan[:2]), format_tool_call("manage_context", {}), *calls(plan[2:4])]
    texts += [
        format_tool_call("manage_context", {}),
        format_tool_call("query_memory", {"summary_id": "S9", "query": "birth year"}),
        format_tool_call("query_memory", {"summary_id": "S1", "query": "birth year"}),
        *calls(plan[4:]),
    ]
    # the tiny random summariser writes noise: keep it short so the budget is about the tools
    ep = episode(
        env,
        task,
        "acm",
        tiny.tokenizer,
        max_context_tokens=1536,
        summary_max_tokens=24,
        query_max_tokens=16,
    )
    traj = play(ep, texts, tiny)
    assert traj.status == "answered" and traj.score == 1.0, traj.error
    events = [e for s in traj.steps for e in s.events]
    assert [e.kind for e in events] == ["manage_context", "manage_context", "query_memory"]
    first = events[0]
    assert first.summary_id == "S1" and first.tokens_after < first.tokens_before
    assert first.cache_cost == first.tokens_after - first.reusable_prefix
    helper = traj.steps[2].helper_calls[0]
    assert helper.role == "summariser"
    gen, read = len(helper.completion_ids), len(helper.prompt_ids) - helper.cached_prefix_tokens
    assert first.compaction_cost == compaction_cost(
        first.call_tokens + gen, first.cache_cost + read, 1.0
    )
    obs = [o for s in traj.steps for o in s.observations]
    assert "Compacted 4 items into summary S1." in obs
    assert any(o.startswith("Error: unknown summary id 'S9'; valid ids: S1, S2") for o in obs)
    assert any(o.startswith("[from S1]") for o in obs)
    assert traj.metrics["compactions"] == 2 and traj.metrics["querier_calls"] == 1
    validate(traj.final_state)


def test_summary_monitor_replaces_history(env, tiny):
    task = env.tasks("eval")[0]
    ep = episode(env, task, "summary", tiny.tokenizer, summary_threshold=0.5, summary_max_tokens=24)
    traj = play(ep, calls(env.oracle_plan(task)), tiny)
    harness = [s for s in traj.steps if s.origin == "harness"]
    assert harness and harness[0].events[0].kind == "summary"
    assert harness[0].helper_calls[0].role == "summariser"
    assert traj.status == "answered" and traj.score == 1.0
    # after the summary the model saw only the task and the summary, under the threshold
    after = traj.steps[traj.steps.index(harness[0]) + 1].call.prompt_ids
    assert len(after) < 0.5 * 1024
    seen = tiny.tokenizer.decode(after)
    assert "[summary of earlier steps]" in seen and "This entry describes" not in seen


def test_evolve_applies_and_refuses(env, tiny):
    task = env.tasks("eval")[0]
    plan = env.oracle_plan(task)
    drop = (
        "return state.map(i => i.type === 'function_call_output' && i.output.length > 200 "
        "? {...i, output: i.output.slice(0, 200)} : i);"
    )
    texts = [*calls(plan[:2]), format_tool_call("evolve", {"code": drop})]
    texts += [format_tool_call("evolve", {"code": "return 42;"}), *calls(plan[2:])]
    traj = play(episode(env, task, "evolve", tiny.tokenizer, max_context_tokens=4096), texts, tiny)
    events = [e for s in traj.steps for e in s.events]
    assert [(e.kind, e.applied) for e in events] == [("evolve", True), ("evolve", False)]
    assert events[0].tokens_after < events[0].tokens_before and events[0].compaction_cost > 0
    assert "State" in events[1].detail or "array" in events[1].detail
    assert traj.status == "answered" and traj.score == 1.0


def test_malformed_calls_and_max_turns(env, tiny):
    task = env.tasks("eval")[0]
    bad = '<tool_call>\n{"name": "search", "arguments": {"q": 1}}\n</tool_call>'
    traj = play(episode(env, task, "react", tiny.tokenizer, max_turns=3), [bad], tiny)
    assert traj.status == "max_turns" and len(traj.steps) == 3
    assert "missing argument(s) ['query']" in traj.steps[0].errors[0]
    assert (
        traj.final_state[2]["role"] == "user"
        and "Error in tool call 1" in traj.final_state[2]["content"][0]["text"]
    )


def test_context_signal_and_hint(env, tiny):
    task = env.tasks("eval")[0]
    plan = env.oracle_plan(task)
    ep = episode(
        env, task, "acm", tiny.tokenizer, context_signal=True, harness_hint=True, hint_threshold=0.5
    )
    traj = play(ep, calls(plan), tiny)
    obs = traj.final_state[2]["output"]
    assert "[context: " in obs and "of 1024 tokens]" in obs
    assert any(
        "compact it now" in (i.get("output") or "")
        for i in traj.final_state
        if isinstance(i.get("output"), str)
    )


def test_untrained_policy_batched_over_all_arms(env, tiny, tmp_path):
    cfg = RolloutConfig(
        arms=["react", "summary", "acm", "evolve"],
        concurrency=8,
        output=str(tmp_path / "t.jsonl"),
        tensorboard=False,
    )
    cfg.env.options = {"preset": "tiny", "seed": 0}
    cfg.env.limit = 2
    cfg.sampling.max_new_tokens = 16
    cfg.agent.max_turns = 2
    rows = run_rollout(cfg, engine=tiny)
    trajs = read_trajectories(cfg.output)
    assert len(trajs) == 8 and all(t.status in STATUSES for t in trajs)
    assert {r["arm"] for r in rows} == {"react", "summary", "acm", "evolve"}
    for t in trajs:
        for s in t.steps:
            if s.call:  # the batched engine's ids are what the renderer produced
                assert s.call.prompt_ids[:3] == trajs[0].steps[0].call.prompt_ids[:3]


def test_a_killed_rollout_resumes_without_duplicates(env, tiny, tmp_path):
    out = tmp_path / "r.jsonl"
    cfg = RolloutConfig(arms=["react", "acm"], concurrency=2, output=str(out), tensorboard=False)
    cfg.env.options = {"preset": "tiny", "seed": 0}
    cfg.env.limit = 3
    cfg.sampling.max_new_tokens = 8
    cfg.agent.max_turns = 2

    class Kill(Exception):
        pass

    seen = []

    def killer(session_id: str, prompt: str) -> str:
        seen.append(session_id)
        if len(seen) == 4:
            raise Kill  # the process dies mid-batch
        return "I do not know."

    with pytest.raises(Kill):
        run_rollout(cfg, engine=ScriptedEngine(tiny.tokenizer, killer), tokenizer=tiny.tokenizer)
    first = out.read_text().splitlines()
    assert 0 < len(first) < 6
    with out.open("a") as f:
        f.write('{"episode_id": "torn')  # a line cut by the kill
    run_rollout(
        cfg,
        engine=ScriptedEngine(tiny.tokenizer, lambda s, p: "I do not know."),
        tokenizer=tiny.tokenizer,
    )
    ids = [json.loads(line)["episode_id"] for line in out.read_text().splitlines()]
    assert len(ids) == 6 == len(set(ids))
    assert ids[: len(first)] == [json.loads(x)["episode_id"] for x in first]


def test_repeat_rule_answers_a_repeated_call_without_running_it(env, tiny):
    task = env.tasks("eval")[0]
    first = env.oracle_plan(task)[0]
    texts = calls([first, first, ("answer", {"text": "x"})])
    for rule in (False, True):
        ep = episode(env, task, "react", tiny.tokenizer, max_context_tokens=4096, repeat_rule=rule)
        traj = play(ep, texts, tiny)
        second = traj.steps[1].observations[0]
        if rule:
            assert second.startswith("You already called search with these arguments on turn 1")
        else:
            assert second == traj.steps[0].observations[0]  # run again, same result


def test_repeat_rule_runs_a_call_again_once_its_result_was_compacted_away(env, tiny):
    """In a GRPO run of 2026-12-03 (240b3ef), 39 of 42 repeat-rule refusals came after a
    compaction, when the result to 'use' was no longer in the context; none of those 29 episodes
    succeeded."""
    task = env.tasks("eval")[0]
    plan = env.oracle_plan(task)
    first = plan[0]
    compact = ("manage_context", {})
    script = calls([first, compact, first, first, ("answer", {"text": task.answer})])
    ep = episode(env, task, "acm", tiny.tokenizer, max_context_tokens=4096, repeat_rule=True)
    traj = play(ep, script, tiny)
    results = [
        s.observations[0]
        for s in traj.steps
        if s.actions and s.actions[0] == {"name": first[0], "arguments": first[1]}
    ]
    assert len(results) == 3
    assert (
        results[1].split("\n[")[0] == results[0].split("\n[")[0]
    )  # run again after the compaction
    assert results[2].startswith("You already called search with these arguments on turn 3")


def test_repeat_rule_runs_a_read_again_once_an_evolve_program_cut_its_result(env, tiny):
    """A result an evolve program rewrote is no longer in the context as it was returned, so
    reading it again runs; an untouched one (the harness's context note aside) is refused."""
    task = env.tasks("eval")[0]
    search, read = env.oracle_plan(task)[:2]
    cut = "return state.map(i => i.type === 'function_call_output' ? {...i, output: 'cut'} : i);"
    keep = "return state;"
    for code, runs in ((cut, True), (keep, False)):
        script = calls([search, read, ("evolve", {"code": code}), read, ("answer", {"text": "x"})])
        ep = episode(
            env, task, "evolve", tiny.tokenizer, max_context_tokens=8192, repeat_rule=True,
            context_signal=True,
        )  # fmt: skip
        traj = play(ep, script, tiny)
        again = traj.steps[3].observations[0]
        assert traj.steps[2].events[0].applied
        if runs:
            assert again == traj.steps[1].observations[0]  # run again, the same document
        else:
            assert again.startswith("You already called open with these arguments on turn 2")


def test_repeat_rule_reads_again_what_the_memory_arm_moved(env, tiny):
    """The memory arm replaces a result by a stub once the agent has acted on it (the next
    environment call moves it to memory): reading it again then runs; before, it is refused."""
    task = env.tasks("eval")[0]
    search, read, other = env.oracle_plan(task)[:3]
    script = calls([search, read, read, other, read, ("answer", {"text": "x"})])
    ep = episode(env, task, "memory", tiny.tokenizer, max_context_tokens=8192, repeat_rule=True)
    traj = play(ep, script, tiny)
    reads = [s.observations[0] for s in traj.steps if s.actions and s.actions[0]["name"] == read[0]]
    assert len(reads) == 3 and reads[1].startswith("You already called open")
    assert reads[2] == reads[0]


def test_summaries_are_scored_on_the_needed_facts_they_keep(env, tiny):
    """The issue's "share of needed facts that survive a summary": each summary counts the
    task's key terms in the steps it replaced (and nowhere else in the context) and those it
    kept; the episode, the eval report and GRPO's metrics sum them."""
    task = env.tasks("eval")[0]
    plan = env.oracle_plan(task)
    person, town, year, event, doc, event_doc = env.key_terms(task)
    assert (plan[1][1]["doc_id"], plan[3][1]["doc_id"]) == (doc, event_doc)
    assert person in task.prompt and year in plan[2][1]["query"]
    compact = ("manage_context", {})
    script = calls([*plan[:2], compact, *plan[2:4], compact, plan[4]])
    ep = episode(env, task, "acm", tiny.tokenizer, max_context_tokens=4096)
    # the first summary keeps the town and drops the year; the second keeps the event
    summaries = [f"- The home town is {town}.", f"- Read {event_doc}: {event}."]
    helper = ScriptedEngine(tiny.tokenizer, replay({f"{ep.id}/summariser": summaries}))
    policy = ScriptedEngine(tiny.tokenizer, replay({ep.id: script}))
    run_episodes([ep], policy, helper_engine=helper)
    traj = ep.traj
    assert traj.score == 1.0, traj.error
    first, second = [e for s in traj.steps for e in s.events]
    # the person is in the task prompt, so only the town, year and document ids had to be kept
    assert (first.facts_in, first.facts_kept) == (3, 1)  # town, year, doc: kept the town
    # the town stays in view (the first summary); the year, the person's document (listed by
    # the lookup search again), the event's document and the event had to be kept: 2 of 4
    assert (second.facts_in, second.facts_kept) == (4, 2)
    assert traj.metrics["summary_facts_in"] == first.facts_in + second.facts_in
    assert traj.metrics["summary_facts_kept"] == 3
    again = Trajectory.from_dict(json.loads(json.dumps(traj.to_dict())))
    assert again.steps[2].events[0].facts_in == 3


def test_a_failing_key_terms_warns_and_the_episode_goes_on(env, tiny, monkeypatch):
    """A user environment whose key_terms (or oracle plan) raises loses the measurement, not
    the episode."""
    task = env.tasks("eval")[0]
    plan = env.oracle_plan(task)

    def broken(task):
        raise KeyError("no plan for this task")

    monkeypatch.setattr(env, "key_terms", broken)
    ep = episode(env, task, "acm", tiny.tokenizer, max_context_tokens=4096, summary_max_tokens=8)
    with pytest.warns(UserWarning, match="key_terms failed on .*not scored"):
        traj = play(ep, calls([*plan[:2], ("manage_context", {}), *plan[2:]]), tiny)
    assert traj.score == 1.0 and traj.metrics["compactions"] == 1
    assert traj.metrics["summary_facts_in"] == 0


def test_text_call_rule_turns_a_call_written_as_text_into_an_error(env, tiny):
    """A GRPO failure of 2026-12-03 (d748a20): after a compaction the student copied its summary's
    plan, 'open({"doc_id": ...})', as plain text, which ended the episode with that as its
    answer."""
    task = env.tasks("eval")[0]
    plan = env.oracle_plan(task)
    as_text = 'My summary says what I do next: open({"doc_id": "kb-00001"})'
    texts = [as_text, *calls(plan)]
    for rule in (False, True):
        ep = episode(env, task, "acm", tiny.tokenizer, max_context_tokens=4096, text_call_rule=rule)
        traj = play(ep, texts, tiny)
        if rule:  # an error to read, then the plan is played out and answers right
            assert traj.status == "answered" and traj.score == 1.0
            assert traj.metrics["malformed_calls"] == 1 and len(traj.steps) == 1 + len(plan)
            assert traj.steps[0].errors[0].startswith("Error in tool call 1: open({...}) written")
            said = [c["text"] for it in traj.final_state[:4] for c in it.get("content", [])]
            assert as_text in said  # it sees what it wrote, and then the error
            assert any(t.startswith("Error in tool call 1: open({...})") for t in said)
        else:  # the old behaviour: the text is the answer
            assert traj.status == "answered" and traj.answer == as_text and traj.score == 0.0
            assert len(traj.steps) == 1


def test_force_answer_asks_for_an_answer_from_the_truncated_context(env, tiny):
    """on_overflow=force_answer drops the oldest steps until the input fits
    and asks once for the final answer; fail keeps the old behaviour."""
    task = env.tasks("eval")[0]
    plan = env.oracle_plan(task)
    opens = [step for step in plan if step[0] == "open"]
    script = calls(plan[:-1]) + calls(opens * 4)  # keep reading until the budget is hit
    final = format_tool_call("answer", {"text": task.answer})
    budget = 1024

    failed = play(
        episode(env, task, "react", tiny.tokenizer, max_context_tokens=budget), script, tiny
    )
    assert failed.status == "overflow" and "forced_answer" not in failed.metrics

    ep = episode(
        env, task, "react", tiny.tokenizer, max_context_tokens=budget, on_overflow="force_answer"
    )
    traj = play(ep, [*script[: len(failed.steps)], final], tiny)
    assert traj.status == "answered" and traj.score == 1.0 and traj.metrics["forced_answer"] == 1
    last = traj.steps[-1].call
    assert len(last.prompt_ids) <= budget  # the forced request fits
    text = tiny.tokenizer.decode(last.prompt_ids)
    assert "Give your final answer now" in text and task.prompt in text  # the task stays
    assert len(last.prompt_ids) < len(traj.steps[-2].call.prompt_ids) + 400
    validate(traj.final_state)  # no call lost its result or the other way round

    # no answer when asked: the episode still ends 'overflow'
    ep = episode(
        env, task, "react", tiny.tokenizer, max_context_tokens=budget, on_overflow="force_answer"
    )
    search = format_tool_call("search", {"query": "more"})
    traj = play(ep, [*script[: len(failed.steps)], search], tiny)
    assert traj.status == "overflow" and traj.metrics["forced_answer"] == 1


def test_force_compaction_keeps_acm_under_the_budget(env, tiny):
    """acm with force_compaction: the harness compacts at the threshold, as manage_context."""
    task = env.tasks("eval")[0]
    plan = env.oracle_plan(task)
    budget = 1400
    plain = play(
        episode(env, task, "acm", tiny.tokenizer, max_context_tokens=budget, summary_max_tokens=16),
        calls(plan),
        tiny,
    )
    ep = episode(
        env,
        task,
        "acm",
        tiny.tokenizer,
        max_context_tokens=budget,
        summary_max_tokens=16,
        force_compaction=0.8,
    )
    traj = play(ep, calls(plan), tiny)
    forced = [s for s in traj.steps if s.origin == "harness"]
    assert forced and all(s.call is None for s in forced)
    assert all(
        e.kind == "manage_context" and e.detail.startswith("forced")
        for s in forced
        for e in s.events
    )
    assert traj.metrics["forced_compactions"] == len(forced) and traj.metrics["compactions"] >= 1
    assert forced[0].events[0].compaction_cost > 0  # charged like any compaction
    peak = max(len(s.call.prompt_ids) for s in traj.steps if s.call is not None)
    assert peak <= budget
    assert plain.metrics["peak_context_tokens"] > 0.8 * budget  # without it the input grew past
    assert "S1" in tiny.tokenizer.decode(traj.steps[-1].call.prompt_ids)  # the summary in view


def test_evolve_can_drop_a_programs_text_once_it_ran(env, tiny):
    task = env.tasks("eval")[0]
    plan = env.oracle_plan(task)
    drop = "return state.map(i => i.type === 'function_call_output' ? {...i, output: 'x'} : i);"
    texts = [*calls(plan[:2]), format_tool_call("evolve", {"code": drop}), *calls(plan[2:])]
    runs = {}
    for keep in (True, False):
        ep = episode(
            env, task, "evolve", tiny.tokenizer, max_context_tokens=4096, evolve_keep_code=keep
        )
        runs[keep] = play(ep, texts, tiny)
    for keep, traj in runs.items():
        after = tiny.tokenizer.decode(traj.steps[3].call.prompt_ids)  # the turn after the edit
        assert ("output: 'x'" in after) is keep, keep
        assert ('"(applied)"' in after) is not keep
        assert [e.applied for s in traj.steps for e in s.events] == [True]
    kept, gone = (runs[k].steps[3].call.prompt_ids for k in (True, False))
    assert len(gone) < len(kept)
    assert runs[False].status == "answered"  # the episode went on to the answer
