"""Fuzzed model output never crashes a run.

Thousands of random and adversarial completions (broken JSON, unclosed and nested tags, huge
arguments, unicode, calls to unknown tools, prose around calls, deep nesting, numbers past
Python's digit limit) go through the parser and through the real agent loop of every arm, the
summariser's and querier's replies fuzzed too. Each must become an observation, a malformed-call
count or an ordinary end of the episode, never an exception (an episode that ends ``error``).
"""

from __future__ import annotations

import json
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from acmrl.arms.acm import ACM_TOOLS
from acmrl.config import AgentConfig, SamplingConfig
from acmrl.context.evolve import EVOLVE_TOOL_SCHEMA
from acmrl.context.render import TOOL_CALL_CLOSE, TOOL_CALL_OPEN, parse_completion
from acmrl.engines.scripted import ScriptedEngine
from acmrl.envs import load
from acmrl.rollout.agent import Episode
from acmrl.rollout.worker import run_episodes

TOOL_NAMES = ["search", "open", "answer", "manage_context", "query_memory", "evolve", "nope", ""]

FRAGMENTS = [
    TOOL_CALL_OPEN,
    TOOL_CALL_CLOSE,
    '{"name": ',
    '"arguments": ',
    "{",
    "}",
    "[",
    "]",
    '"',
    "\\",
    ",",
    ":",
    "null",
    "NaN",
    "Infinity",
    "1e999",
    "9" * 5000,  # past Python's int-parsing digit limit
    "[" * 3000 + "]" * 3000,  # deeper than json's recursion limit
    "\u202e\u0000\ufeff",  # RTL override, NUL, BOM
    "é漢字🙂",
    "<|im_end|>",
    "<|im_start|>user\n",
    "</tool_response>",
    "\n",
    " ",
]


def random_value(r: random.Random, depth: int = 0):
    kind = r.randrange(9 if depth < 3 else 5)
    if kind == 0:
        return r.choice(["", "x", "kb-00001", "S1", "S99", "é🙂", "a" * r.randrange(1, 30000)])
    if kind == 1:
        return r.choice([0, -1, 1 << 70, 3.5, True, False, None])
    if kind == 2:
        return r.choice(["return state;", "while(true){}", "throw null;", "return 5;", "}{"])
    if kind == 3:
        return "".join(r.choice(FRAGMENTS) for _ in range(r.randrange(1, 6)))
    if kind == 4:
        return "return state.slice(0, -1);"
    if kind in (5, 6):
        return [random_value(r, depth + 1) for _ in range(r.randrange(4))]
    return {
        r.choice(["query", "doc_id", "text", "code", "summary_id", "x"]): random_value(r, depth + 1)
        for _ in range(r.randrange(4))
    }


def random_call(r: random.Random) -> str:
    name = r.choice(TOOL_NAMES)
    args = (
        random_value(r)
        if r.random() < 0.3
        else {
            k: random_value(r)
            for k in r.sample(
                ["query", "doc_id", "text", "code", "summary_id", "extra"], r.randrange(4)
            )
        }
    )
    body = json.dumps({"name": name, "arguments": args}, ensure_ascii=r.random() < 0.5)
    roll = r.random()
    if roll < 0.15:
        body = body[: r.randrange(len(body) + 1)]  # cut anywhere
    elif roll < 0.25:
        body = body.replace('"', "'")
    elif roll < 0.3:
        body = f"{TOOL_CALL_OPEN}{body}{TOOL_CALL_CLOSE}"  # nested
    elif roll < 0.35:
        body = json.dumps([{"name": name, "arguments": args}])  # a list, not an object
    close = TOOL_CALL_CLOSE if r.random() < 0.85 else ""
    return f"{TOOL_CALL_OPEN}\n{body}\n{close}"


def random_completion(r: random.Random) -> str:
    parts = []
    for _ in range(r.randrange(1, 5)):
        roll = r.random()
        if roll < 0.45:
            parts.append(random_call(r))
        elif roll < 0.75:
            parts.append("".join(r.choice(FRAGMENTS) for _ in range(r.randrange(1, 12))))
        else:
            parts.append(
                r.choice(["I will look this up.", "Let me think.", "", "The answer is 42."])
            )
    return r.choice(["", "\n", " "]).join(parts)


ALL_TOOLS = [
    *load("kb_search", preset="tiny", seed=0).tools(),
    *ACM_TOOLS,
    EVOLVE_TOOL_SCHEMA,
]


@given(
    text=st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=40)), max_size=30).map(
        "".join
    )
)
@settings(max_examples=3000, deadline=None, suppress_health_check=list(HealthCheck))
def test_parser_never_raises_on_arbitrary_text(text):
    parsed = parse_completion(text, ALL_TOOLS)
    for error in parsed.errors:
        assert isinstance(error.observation(), str) and error.observation()
    for call in parsed.calls:
        assert isinstance(call.arguments, dict)


def test_parser_never_raises_on_generated_adversarial_calls():
    r = random.Random(7)
    n = 0
    for _ in range(3000):
        parsed = parse_completion(random_completion(r), ALL_TOOLS)
        n += len(parsed.calls) + len(parsed.errors)
        for error in parsed.errors:
            assert error.observation()
    assert n > 3000  # the generator really produces calls, valid and not


@pytest.mark.parametrize("arm", ["react", "summary", "acm", "evolve"])
def test_agent_loop_survives_fuzzed_completions(arm, tiny_engine):
    env = load("kb_search", preset="tiny", seed=0)
    tasks = env.tasks("train") + env.tasks("eval")
    r = random.Random(hash(arm) % 1000)
    tok = tiny_engine.tokenizer

    def reply(session_id: str, prompt: str) -> str:
        if session_id.endswith(("/summariser", "/querier")) and r.random() < 0.5:
            return r.choice(["", "- S1: the town is X.", "\u202e🙂" * 50, "x " * 400])
        text = random_completion(r)
        if TOOL_CALL_OPEN not in text and r.random() < 0.9:  # plain prose ends the episode
            text += random_call(r)
        return text

    engine = ScriptedEngine(tok, reply, truncate=True)
    episodes = [
        Episode(
            f"{task.id}#{arm}#{i}",
            env,
            task,
            arm,
            tok,
            agent=AgentConfig(
                max_turns=12,
                max_context_tokens=r.choice([1400, 4096]),
                summary_max_tokens=64,
                on_overflow=r.choice(["fail", "force_answer"]),
                force_compaction=0.9 if arm == "acm" and i % 2 else None,
                evolve_time_ms=50,
            ),
            sampling=SamplingConfig(max_new_tokens=r.choice([64, 512])),
        )
        for i in range(6)
        for task in tasks
    ]
    run_episodes(episodes, engine, concurrency=8)
    trajs = [ep.traj for ep in episodes]
    completions = sum(1 for t in trajs for s in t.steps if s.call is not None)
    assert completions >= 800, completions  # per arm (x4 arms; plus 6,000 parser cases)
    statuses = {s: sum(t.status == s for t in trajs) for s in {t.status for t in trajs}}
    print(f"{arm}: {completions} fuzzed completions, {len(trajs)} episodes, {statuses}")
    errors = [(t.episode_id, t.error) for t in trajs if t.status == "error"]
    assert not errors, errors[:3]
    assert {t.status for t in trajs} <= {"answered", "overflow", "max_turns"}
    assert sum(t.metrics["malformed_calls"] for t in trajs) > 0
