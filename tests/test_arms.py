"""The arms as objects: one registry that configs agree with, each arm's tools and prompt in one
place, and a new arm that is one class (the agent loop calls its hooks and nothing else)."""

from __future__ import annotations

from typing import Any

import pytest

from acmrl.arms import REGISTRY, Arm, arm_tools, get_arm
from acmrl.config import ARMS, AgentConfig, SamplingConfig
from acmrl.context.render import format_tool_call, tool_schema
from acmrl.engines.scripted import ScriptedEngine, replay
from acmrl.envs import load
from acmrl.rollout.agent import Episode
from acmrl.rollout.worker import run_episodes


@pytest.fixture(scope="module")
def env():
    return load("kb_search", preset="tiny", seed=0)


def test_the_registry_is_the_configs_list_of_arms():
    assert tuple(REGISTRY) == ARMS
    with pytest.raises(ValueError, match="unknown arm 'nope'; arms: react, summary"):
        get_arm("nope")


def test_each_arms_tools_and_prompt(env):
    task = env.tasks("eval")[0]
    env_tools = env.session(task).tools
    names = {a: [t["function"]["name"] for t in arm_tools(env_tools, a)] for a in ARMS}
    base = [t["function"]["name"] for t in env_tools]
    assert names["react"] == names["summary"] == base
    assert names["acm"] == [*base, "manage_context", "query_memory"]
    assert names["memory"] == [*base, "read_memory"]
    assert names["evolve"] == [*base, "evolve"]
    assert names["mask"] == base  # react's tools and prompt: the harness masks, not the policy
    assert get_arm("mask").system_prompt(2048) == get_arm("react").system_prompt(2048)
    assert "2048 tokens" in get_arm("acm").system_prompt(2048)
    assert "read_memory()" in get_arm("memory").system_prompt(2048)
    assert get_arm("react").system_prompt(2048) == get_arm("summary").system_prompt(2048)
    # the arms whose policy compacts by a call of its own have one among their tools
    for arm in REGISTRY.values():
        if arm.compacts:
            name, _ = arm.compaction(task, env.oracle_plan(task), task.prompt, repeats=False)
            assert name in arm.tool_names, arm.name
    assert {a.name for a in REGISTRY.values() if a.compacts} == {"acm", "evolve"}


class Scratch(Arm):
    """A test arm: a ``note`` tool that keeps a line outside the context and says how many."""

    name = "scratch"
    tools = (tool_schema("note", "Keep a line.", {"text": {"type": "string"}}),)

    def start(self, ep: Any) -> None:
        ep.notes = []

    def system_prompt(self, budget: int, agent: Any = None) -> str:
        return super().system_prompt(budget, agent) + "\n\nnote(text) keeps a line."

    def run_call(self, ep: Any, call_id: str, call: Any) -> Any:
        ep.notes.append(call.arguments["text"])
        ep.output(call_id, f"{len(ep.notes)} notes kept.")
        return None


def test_a_new_arm_is_one_class(env, tokenizer, monkeypatch):
    monkeypatch.setitem(REGISTRY, "scratch", Scratch())
    task = env.tasks("eval")[0]
    ep = Episode(
        f"{task.id}#scratch#0",
        env,
        task,
        "scratch",
        tokenizer,
        agent=AgentConfig(max_turns=4),
        sampling=SamplingConfig(max_new_tokens=64),
    )
    texts = [
        format_tool_call("note", {"text": "look for the town"}),
        format_tool_call("answer", {"text": "x"}),
    ]
    run_episodes([ep], ScriptedEngine(tokenizer, replay({ep.id: texts})))
    assert ep.notes == ["look for the town"]
    assert ep.traj.steps[0].observations == ["1 notes kept."]
    assert ep.traj.status == "answered"
    assert "note(text) keeps a line." in tokenizer.decode(ep.traj.steps[0].call.prompt_ids)


def test_the_evolve_prompt_comes_in_three_sizes(env, tokenizer):
    from acmrl.context.render import Renderer

    task = env.tasks("eval")[0]
    tools = env.session(task).tools

    def fixed(arm, **agent):
        cfg = AgentConfig(**agent)
        system = get_arm(arm).system_prompt(2048, cfg)
        return len(Renderer(tokenizer, system, arm_tools(tools, arm, cfg)).ids([], False))

    sizes = [fixed("evolve", evolve_prompt=p) for p in ("full", "brief", "none")]
    assert sizes[0] > sizes[1] > sizes[2] > fixed("react")
    assert sizes[0] == fixed("evolve")  # the default is the full description
    # every size keeps one evolve tool whose code is its only argument
    for p in ("full", "brief", "none"):
        (schema,) = get_arm("evolve").tool_schemas(AgentConfig(evolve_prompt=p))
        assert schema["function"]["name"] == "evolve"
        assert schema["function"]["parameters"]["required"] == ["code"]
    # other arms ignore the setting
    assert fixed("acm", evolve_prompt="none") == fixed("acm")


def test_an_evolve_teacher_leaves_room_only_for_what_its_program_leaves_in_the_input(tokenizer):
    """The budget bounds inputs. With agent.evolve_keep_code the next program stays in the
    input, so the teacher reading on leaves room for all of it. Without it only its
    rationale, stub call and receipt stay, and that is the reserve: on kb_search chain the
    teacher then skips the cut before the second document that only made that room. It makes
    fewer programs and succeeds as often."""
    from acmrl.teacher.demonstrate import Demonstrator, demonstrate

    env = load("kb_search", preset="chain", seed=1)
    tasks = env.tasks("train")[:6]
    arm = get_arm("evolve")
    prompt = tasks[0].prompt
    reserve = {
        keep: arm.compaction_reserve(
            Demonstrator(env, tasks[0], "evolve", 2048, tokenizer, 0.05, keep_code=keep), prompt
        )
        for keep in (True, False)
    }
    assert 40 < reserve[False] < 150 < 300 < reserve[True]
    programs, wins = {}, {}
    for keep in (True, False):
        agent = AgentConfig(max_context_tokens=2048, evolve_prompt="none", evolve_keep_code=keep)
        trajs = demonstrate(
            env,
            tasks,
            ["evolve"],
            tokenizer,
            agent=agent,
            sampling=SamplingConfig(max_new_tokens=512),
            pressure=0.05,
            policy="best",
        )
        steps = [s for t in trajs for s in t.steps]
        programs[keep] = sum(a["name"] == "evolve" for s in steps for a in s.actions)
        wins[keep] = sum(t.score >= 1.0 for t in trajs)
    assert programs[False] < programs[True] and wins[False] >= wins[True] > 0


def test_mask_replaces_the_oldest_results_until_the_input_fits_and_the_episode_goes_on(tokenizer):
    """Over the budget, the oldest tool results become a placeholder, one at a time, until the
    input fits; the newest result and the policy's own words stay; the edit is charged the
    Cache Cost of the input it changed and counted as a compaction; the episode then goes on."""
    from acmrl.arms.mask import MASKED
    from acmrl.rewards import compaction_points

    env = load("kb_search", preset="chain", seed=0)

    def only_first(task) -> list[str]:  # key terms only the first document states
        read = [env.session(task).call("open", d) for d in opened(task)]
        return [
            k
            for k in env.key_terms(task)
            if k in read[0]
            and not any(k in r for r in read[1:])
            and k not in task.prompt
            and not k.startswith("kb-")
        ]

    def opened(task) -> list[dict]:
        return [args for name, args in env.oracle_plan(task) if name == "open"]

    task = next(t for t in env.tasks("eval") if only_first(t))  # a recall question's number
    docs, fact = opened(task), only_first(task)[0]
    budget = 1600  # the prompt and two documents fit, three do not

    def play(note: str) -> Episode:
        texts = [
            format_tool_call("open", docs[0]),
            note + format_tool_call("open", docs[1]),
            format_tool_call("open", docs[2]),
            format_tool_call("answer", {"text": "x"}),
        ]
        ep = Episode(
            f"{task.id}#mask#0",
            env,
            task,
            "mask",
            tokenizer,
            agent=AgentConfig(max_turns=8, max_context_tokens=budget, on_overflow="fail"),
            sampling=SamplingConfig(max_new_tokens=256),
        )
        run_episodes([ep], ScriptedEngine(tokenizer, replay({ep.id: texts})))
        return ep

    ep, bare = play(f"I note: {fact}.\n"), play("")
    t = ep.traj
    assert t.status == "answered"  # no overflow: masking made room for the third document
    outputs = [x for x in ep.state if x["type"] == "function_call_output"]
    assert outputs[0]["output"] == MASKED and outputs[-1]["output"] != MASKED
    masks = [e for s in t.steps for e in s.events if e.kind == "mask"]
    assert masks and all(s.origin == "harness" for s in t.steps if s.events)
    e = masks[0]
    assert 0 < e.reusable_prefix < e.tokens_before and e.cache_cost > 0
    assert e.compaction_cost == e.cache_cost  # nothing generated for it
    assert e.tokens_after <= budget
    # key terms left with the masked results; those still in the context count as kept (the
    # ids the calls name), and a term only the first document held only where it was noted
    assert 0 < e.facts_kept <= e.facts_in

    def lost(episode: Episode) -> int:
        return sum(x.facts_in - x.facts_kept for s in episode.traj.steps for x in s.events)

    assert lost(bare) > lost(ep)
    assert compaction_points([vars(x) for x in masks], budget)  # a compaction like the others
    # every policy input fitted the budget, and the policy's note is still there
    assert all(len(s.call.prompt_ids) <= budget for s in t.steps if s.call is not None)
    assert f"I note: {fact}." in tokenizer.decode(t.steps[-1].call.prompt_ids)
