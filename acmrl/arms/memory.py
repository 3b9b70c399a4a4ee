"""``memory``: a background reflection keeps a memory outside the context.

After each environment result the reflection (a helper call, counted as the summariser's)
merges the new call and result into the memory; results the agent has already acted on leave
the context (their text is replaced by :data:`MOVED`), and ``read_memory()`` shows the memory.
The teacher reads the memory before searching again or answering from what moved there; the
best scripted policy reads it for a detail it knew to matter when the reflection wrote it.
"""

from __future__ import annotations

import json
from typing import Any

from acmrl.arms.base import Arm, Turn
from acmrl.context.render import tool_schema
from acmrl.engines.base import Completion
from acmrl.rollout import prompts

READ_MEMORY = "read_memory"
MOVED = "(moved to memory; read_memory() shows what was kept)"

MEMORY_PROMPT = (
    "You have a memory outside your context. After each tool result a background reflection "
    "writes what matters into it, and once you have acted on a result the raw result leaves your "
    "context. `read_memory()` shows your memory."
)

MEMORY_TOOLS = [
    tool_schema(READ_MEMORY, "Show your memory: what the reflections kept from your steps.", {})
]

REFLECT_PROMPT = """Task of the agent:
{task}

Memory so far:
{memory}

Steps to summarise:
{steps}

Write the agent's updated memory in the first person: what the memory so far holds that the task
may still need, and every fact, name, number, year and document id of these steps the task may
still need. Write only the memory."""


class Memory(Arm):
    name = "memory"
    archive_tool = READ_MEMORY
    tools = MEMORY_TOOLS

    def system_prompt(self, budget: int, agent: Any = None) -> str:
        return f"{prompts.BASE_PROMPT}\n\n{MEMORY_PROMPT}"

    def start(self, ep: Any) -> None:
        ep.raw_results = []  # call ids whose raw results are still in the context

    def run_call(self, ep: Any, call_id: str, call: Any) -> Any:
        ep.output(call_id, ep.memory or "My memory is empty.")
        return None

    def after_env_call(self, ep: Any, call_id: str) -> Any:
        """Distil the new call and its result into the memory; results the agent has already
        acted on leave the context."""
        items = ep.state[-2:]
        text = REFLECT_PROMPT.format(
            task=ep.task.prompt, memory=ep.memory or "(empty)", steps=prompts.items_text(items)
        )
        ids = ep.helper_ids(prompts.SUMMARISER_SYSTEM, text)

        def done(c: Completion) -> None:
            helper = ep.record("summariser", ids, c)
            ep.memory = c.text.strip() or ep.memory
            moved = set(ep.raw_results)
            for item in ep.state:
                if item["type"] == "function_call_output" and item["call_id"] in moved:
                    item["output"] = MOVED
            ep.raw_results = [call_id]
            ep.step.helper_calls.append(helper)
            ep.step.events.append(
                ep.event("memory", 0, helper, detail=f"moved {len(moved)} results")
            )

        return ep.ask("summariser", ids, ep.agent.summary_max_tokens, done)

    def demo_detour(self, policy: Any, prompt: str, name: str, args: dict[str, Any]) -> Turn | None:
        """What moved to memory is read back before searching again or answering from it."""
        if policy.read_memory or not policy.done:
            return None
        again = name == "search" and (name, json.dumps(args, sort_keys=True)) in policy.done
        if again or (name == "answer" and not policy.in_view(args, prompt)):
            policy.read_memory = True
            return "What I need has moved to my memory; I will read it.", READ_MEMORY, {}
        return None

    def recover(self, policy: Any, prompt: str, evidence: Any) -> Turn | None:
        """A detail whose selector came later was not known to matter when the reflections wrote
        the memory: reading the memory cannot bring it back, only its document can."""
        if policy.read_memory or evidence.selector is not None:
            return None
        policy.read_memory = True
        return "What I need may be in my memory; I will read it.", READ_MEMORY, {}
