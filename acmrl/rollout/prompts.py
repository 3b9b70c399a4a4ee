"""The prompts every arm shares: the base system prompt, the summariser and querier prompts, the
budget, and the summary messages (each arm's own prompt and tools: :mod:`acmrl.arms`)."""

from __future__ import annotations

import json
from typing import Any

from acmrl.context.state import Item, State, message_text, output_text, user

BASE_PROMPT = (
    "You are a research agent. Solve the task with the tools. Call one tool at a time and read "
    "its result before the next call. When you know the answer, call `answer` with only the answer."
)

SUMMARISER_SYSTEM = "You write faithful, compact notes of an agent's work for the agent itself."

SUMMARISER_PROMPT = """Task of the agent:
{task}

Steps to summarise:
{steps}

Write a concise summary of these steps in the first person. Keep every fact, name, number, year and
document id the task may still need; drop everything else. Write only the summary."""

STRUCTURED_PROMPT = """Task of the agent:
{task}

Steps to summarise:
{steps}

Write the agent's memory of these steps in the first person, in two sections:
Knowledge state: every fact, name, number, year and document id the task may still need, one per
line starting with "- ".
Thoughts: what I have done, what I will do next and why, one per line starting with "- ".
Write only the two sections, each headed by its name and a colon."""

SUMMARY_PROMPTS = {"notes": SUMMARISER_PROMPT, "structured": STRUCTURED_PROMPT}


def summariser_prompt(agent: Any) -> str:
    """The run's summariser prompt: its own, else the one of ``agent.summary_format``."""
    return agent.summariser_prompt or SUMMARY_PROMPTS[agent.summary_format]


def querier_prompt(agent: Any) -> str:
    return agent.querier_prompt or QUERIER_PROMPT


QUERIER_SYSTEM = "You extract the facts an agent asks for from its archived notes."

QUERIER_PROMPT = """Archived steps {summary_id}:
{steps}

Question: {query}

Answer with only the relevant facts from the archived steps, briefly. If they hold no answer, say so."""


DEFAULT_BUDGET = 8192


def context_budget(agent: Any, env: Any) -> int:
    """The context budget an episode runs under, in tokens: ``agent.max_context_tokens``, else
    the environment's ``max_context_tokens``, else 8192. The episode, the exported agent spec and
    the oracle engine all read it here.

    >>> from types import SimpleNamespace as N
    >>> context_budget(N(max_context_tokens=None), N(max_context_tokens=1300))
    1300
    >>> context_budget(N(max_context_tokens=2048), N(max_context_tokens=1300))
    2048
    """
    return agent.max_context_tokens or env.max_context_tokens or DEFAULT_BUDGET


def items_text(items: State) -> str:
    """A plain-text transcript of State items, for the summariser and the querier."""
    lines = []
    for item in items:
        kind = item["type"]
        if kind == "message":
            lines.append(f"{item['role']}: {message_text(item)}")
        elif kind == "function_call":
            args = json.loads(item["arguments"])
            lines.append(f"call {item['name']}({json.dumps(args, ensure_ascii=False)})")
        else:
            lines.append(f"result: {output_text(item)}")
    return "\n".join(lines)


def summary_item(text: str, summary_id: str | None) -> Item:
    if summary_id is None:
        return user(f"[summary of earlier steps]\n{text}")
    return user(
        f'[{summary_id}] summary of earlier steps (archived; query_memory("{summary_id}", ...) '
        f"retrieves details):\n{text}"
    )


def is_summary(item: Item) -> bool:
    return (
        item.get("type") == "message"
        and item.get("role") == "user"
        and message_text(item).startswith(("[summary of earlier steps]", "[S"))
    )


def helper_messages(system: str, prompt: str) -> list[dict[str, Any]]:
    return [{"role": "system", "content": system}, {"role": "user", "content": prompt}]
