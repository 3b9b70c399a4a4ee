"""``acm``: the policy compacts its own context and can ask the archive of what it compacted.

``manage_context()`` replaces the steps since the last summary by a summary (the summariser is
the same model, greedy) and archives them under the summary's id (``S1``, ...);
``query_memory(summary_id, query)`` answers a question from an archived block (the querier, the
same model). ``agent.force_compaction`` makes the harness compact at a share of the budget, as
the call would. The teacher demonstrates and injects ``manage_context``; the turn after it
continues the plan the summary wrote down; the best scripted policy asks its archive for
evidence a summary could not have known to keep, compacting first when the extract would not
fit.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from acmrl.arms.base import Arm, Turn
from acmrl.context.archive import Archive, ArchiveError
from acmrl.context.render import tool_schema
from acmrl.engines.base import Completion
from acmrl.rollout import prompts
from acmrl.rollout.records import ModelCall, Step

MANAGE_CONTEXT = "manage_context"
QUERY_MEMORY = "query_memory"
QUERY_ROOM = 160  # tokens a query_memory call and its extract may add to the context
_SUMMARY_ID = re.compile(r"\[(S\d+)\] summary of earlier steps")

ACM_PROMPT = (
    "Your context holds at most {budget} tokens; beyond that the task fails. `manage_context()` "
    "replaces your steps since the last summary with a short summary (the raw steps are archived "
    "under the summary's id); `query_memory(summary_id, query)` answers a question from an "
    "archived block. Compact before your context is full, and keep facts you will need later."
)

ACM_TOOLS = [
    tool_schema(
        MANAGE_CONTEXT,
        "Compress your steps since the last summary into a summary; the raw steps are archived "
        "under the summary's id (e.g. S1) and leave your context.",
        {},
    ),
    tool_schema(
        QUERY_MEMORY,
        "Ask a question about an archived block of your earlier steps; returns a short extract.",
        {
            "summary_id": {"type": "string", "description": "The id of a summary, e.g. S1."},
            "query": {"type": "string", "description": "What you need from that block."},
        },
    ),
]


class Acm(Arm):
    name = "acm"
    archive_tool = QUERY_MEMORY
    tools = ACM_TOOLS
    compacts = True
    demo_compaction_says = "so I will compact my earlier steps before I go on."
    injection_says = "I will compact my earlier steps before I continue."
    resumes_from_summary = True

    def system_prompt(self, budget: int, agent: Any = None) -> str:
        return f"{prompts.BASE_PROMPT}\n\n{ACM_PROMPT.format(budget=budget)}"

    def start(self, ep: Any) -> None:
        ep.archive = Archive()

    # -- the harness ------------------------------------------------------------------------------

    def before_generate(self, ep: Any, ids: list[int]) -> Any:
        """``agent.force_compaction``: the harness compacts the steps since the last summary, as
        ``manage_context`` would, and the turn goes on from the smaller input."""
        force = ep.agent.force_compaction
        if force is None or len(ids) < force * ep.budget or ep.boundary() >= len(ep.state):
            return None
        start = ep.boundary()
        items = ep.state[start:]

        def done(summary: str, helper: ModelCall, facts: dict[str, int]) -> None:
            sid = ep.archive.put(items, summary)
            ep.state = [*ep.state[:start], prompts.summary_item(summary, sid)]
            step = Step(ep.turn, None, origin="harness")
            step.helper_calls.append(helper)
            step.events.append(
                ep.event(
                    MANAGE_CONTEXT,
                    0,
                    helper,
                    summary_id=sid,
                    detail=f"forced at {force:.0%} of the budget",
                    **facts,
                )
            )
            ep.traj.steps.append(step)

        return ep.summarise(items, ep.state[:start], done)

    def run_call(self, ep: Any, call_id: str, call: Any) -> Any:
        if call.name == MANAGE_CONTEXT:
            return self._manage_context(ep, call_id, call.tokens)
        return self._query_memory(ep, call_id, call.arguments, call.tokens)

    def _manage_context(self, ep: Any, call_id: str, call_tokens: int) -> Any:
        start, call_item = ep.boundary(), ep.state[-1]
        items = ep.state[start:-1]
        if not items:
            ep.output(call_id, "Nothing to compact: no steps since the last summary.")
            return None

        def done(summary: str, helper: ModelCall, facts: dict[str, int]) -> None:
            sid = ep.archive.put(items, summary)
            ep.state = [*ep.state[:start], prompts.summary_item(summary, sid), call_item]
            event = ep.event(MANAGE_CONTEXT, call_tokens, helper, summary_id=sid, **facts)
            ep.step.helper_calls.append(helper)
            ep.step.events.append(event)
            ep.output(call_id, f"Compacted {len(items)} items into summary {sid}.")

        return ep.summarise(items, ep.state[:start], done)

    def _query_memory(self, ep: Any, call_id: str, args: dict[str, Any], call_tokens: int) -> Any:
        sid = args["summary_id"].strip()
        try:
            items = ep.archive.get(sid)
        except ArchiveError as exc:
            ep.output(call_id, f"Error: {exc}")
            return None
        text = prompts.querier_prompt(ep.agent).format(
            summary_id=sid, steps=prompts.items_text(items), query=args["query"]
        )
        ids = ep.helper_ids(prompts.QUERIER_SYSTEM, text)

        def done(c: Completion) -> None:
            helper = ep.record("querier", ids, c)
            ep.step.helper_calls.append(helper)
            without = len(ep.renderer.ids(ep.state, add_generation_prompt=False))
            ep.output(call_id, f"[from {sid}] {c.text.strip() or '(nothing found)'}")
            own = len(ep.renderer.ids(ep.state, add_generation_prompt=False)) - without
            ep.step.events.append(ep.event(QUERY_MEMORY, call_tokens, helper, own, summary_id=sid))

        return ep.ask("querier", ids, ep.agent.query_max_tokens, done)

    # -- the teacher ------------------------------------------------------------------------------

    def compaction(
        self,
        task: Any,
        plan: list[Any],
        seen: str,
        *,
        repeats: bool,
        keep: Sequence[str] = (),
    ) -> tuple[str, dict[str, Any]]:
        return MANAGE_CONTEXT, {}

    def recover(self, policy: Any, prompt: str, evidence: Any) -> Turn | None:
        """Ask the archive (each summary once) for evidence that has a query; compact first when
        the extract would not fit beside what is in view (the notes keep what this step read)."""
        if not evidence.query:
            return None
        todo = [sid for sid in _SUMMARY_ID.findall(prompt) if sid not in policy.queried]
        if not todo:
            return None
        size = policy.size(prompt)
        if not policy.compacted and size + QUERY_ROOM > policy.budget:
            policy.compacted = True
            why = f"My context is at {size} of {policy.budget} tokens"
            return f"{why}, so I will compact before I ask my archive.", MANAGE_CONTEXT, {}
        policy.queried.add(todo[0])
        args = {"summary_id": todo[0], "query": evidence.query}
        return f"I need {evidence.query} from {todo[0]}.", QUERY_MEMORY, args
