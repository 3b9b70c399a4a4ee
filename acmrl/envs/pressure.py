"""How much context pressure an environment creates, measured on the expert's episodes.

An oracle episode replays ``oracle_plan(task)`` in a session and keeps every call and observation,
as a ReAct agent would. Rendered with a real tokenizer (system prompt and tool definitions
included, exactly as the model would see it), it tells whether the full history fits the preset's
``max_context_tokens`` (it should not on ``kb_search small`` and up) and whether the largest single
step fits beside the task prompt (it must, or no amount of compaction could finish the task).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from acmrl.context.render import Renderer
from acmrl.context.state import State, function_call, function_call_output, user
from acmrl.envs.base import Environment, Task

SYSTEM_PROMPT = (
    "You solve tasks with tools. Think briefly, call one tool at a time, and call answer with "
    "only the final answer when you know it."
)


@dataclass
class OracleEpisode:
    steps: int  # tool calls, the final answer included
    observed_tokens: int  # tokens of all observations
    full_tokens: int  # the rendered model input holding the whole history
    base_tokens: int  # system prompt + tools + task prompt
    peak_step_tokens: int  # the largest single call + observation
    score: float


def oracle_state(env: Environment, task: Task) -> tuple[State, float]:
    """The State of a ReAct agent that followed the expert's plan, and the score it got."""
    session = env.session(task)
    state: State = [user(task.prompt)]
    for i, (name, args) in enumerate(env.oracle_plan(task)):
        call_id = f"call_{i}"
        state.append(function_call(call_id, name, args))
        state.append(function_call_output(call_id, session.call(name, args)))
    return state, session.score()


def oracle_episode(env: Environment, task: Task, renderer: Renderer) -> OracleEpisode:
    state, score = oracle_state(env, task)
    base = len(renderer.ids(state[:1]))
    full = len(renderer.ids(state))
    observed, peak, prev = 0, 0, base
    for end in range(3, len(state) + 1, 2):
        now = len(renderer.ids(state[:end]))
        peak = max(peak, now - prev)
        prev = now
        out = state[end - 1]
        observed += renderer.count(out["output"] if isinstance(out["output"], str) else "")
    return OracleEpisode((len(state) - 1) // 2, observed, full, base, peak, score)


def pressure_report(
    env: Environment, tokenizer: Any, *, split: str = "eval", limit: int = 50, doc_sample: int = 200
) -> dict[str, Any]:
    """The figures of the issue's "Must show" for one environment: documents, mean document
    tokens, mean observed tokens and steps of an oracle episode, and the share of oracle episodes
    whose full history exceeds ``max_context_tokens``."""
    renderer = Renderer(tokenizer, SYSTEM_PROMPT, env.session(env.tasks(split)[0]).tools)
    episodes = [oracle_episode(env, t, renderer) for t in env.tasks(split)[:limit]]
    budget = env.max_context_tokens
    docs = getattr(env, "documents", None) or []
    step = max(1, len(docs) // doc_sample)
    doc_tokens = [renderer.count(d.text) for d in docs[::step]]
    return {
        "documents": len(docs),
        "mean_doc_tokens": statistics.mean(doc_tokens) if doc_tokens else 0.0,
        "episodes": len(episodes),
        "mean_observed_tokens": statistics.mean(e.observed_tokens for e in episodes),
        "mean_full_tokens": statistics.mean(e.full_tokens for e in episodes),
        "mean_steps": statistics.mean(e.steps for e in episodes),
        "max_context_tokens": budget,
        "overflow_fraction": (
            sum(e.full_tokens > budget for e in episodes) / len(episodes) if budget else 0.0
        ),
        # base + summary room + the largest step: what a compacting agent must fit at once
        "max_base_plus_peak": max(e.base_tokens + e.peak_step_tokens for e in episodes),
        "oracle_score": statistics.mean(e.score for e in episodes),
    }
