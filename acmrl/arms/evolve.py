"""``evolve``: the policy edits its own context by writing a program over the State.

``evolve(code)`` runs JavaScript in a sandbox (:mod:`acmrl.context.evolve`): the program gets
the State's items and returns the new ones; the harness validates the result, charges the
generated tokens and the Cache Cost of the next input, and leaves a receipt. The teacher writes
programs that keep the documents' needed facts verbatim (:mod:`acmrl.arms.evolve_edits`), in
demonstrations and injected edits alike.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from acmrl.arms.base import Arm
from acmrl.arms.evolve_edits import TOOL_RESPONSE, keep_facts_code, kept_lines
from acmrl.context.evolve import (
    APPLIED_CODE,
    EVOLVE_TOOL_SCHEMA,
    STATE_PROMPTS,
    EvolveLimits,
    apply_evolve,
    evolve_tool_schema,
)
from acmrl.context.render import format_tool_call
from acmrl.context.state import EVOLVE_TOOL, output_text
from acmrl.rollout import prompts
from acmrl.rollout.records import terms_kept

MiB = 1024 * 1024


def _size(agent: Any) -> str:
    """How much of the State the prompt describes (``agent.evolve_prompt``; None: full)."""
    return agent.evolve_prompt if agent is not None else "full"


def _without_programs(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The State's items less its evolve calls and their receipts."""
    ids = {i["call_id"] for i in items if i["type"] == "function_call" and i["name"] == EVOLVE_TOOL}
    return [i for i in items if i.get("call_id") not in ids]


class Evolve(Arm):
    name = "evolve"
    tools = (EVOLVE_TOOL_SCHEMA,)
    compacts = True
    demo_compaction_says = "so I will cut what I have read down to its facts."
    injection_says = "I will cut the documents I have read down to their facts."

    def system_prompt(self, budget: int, agent: Any = None) -> str:
        return f"{prompts.BASE_PROMPT}\n\n{STATE_PROMPTS[_size(agent)]}"

    def tool_schemas(self, agent: Any = None) -> tuple[dict[str, Any], ...]:
        return (evolve_tool_schema(_size(agent)),)

    def run_call(self, ep: Any, call_id: str, call: Any) -> Any:
        limits = EvolveLimits(
            time_ms=ep.agent.evolve_time_ms, heap_bytes=ep.agent.evolve_heap_mb * MiB
        )
        before = ep.state[:-1]  # without the in-flight call
        result = apply_evolve(
            ep.state,
            limits,
            renderer=ep.renderer,
            call_tokens=call.tokens,
            output_weight=ep.agent.output_weight,
            before_ids=ep.last_input,
            keep_code=ep.agent.evolve_keep_code,
        )
        ep.state = result.state
        ep.step.observations.append(output_text(ep.state[-1]))
        # an applied program's needed facts: the task's key terms the State held before it (not
        # in the question), and those the items it returned still hold; programs (this one's
        # call and receipt, and earlier ones kept by evolve_keep_code) are left out of both, as
        # their code names what they mean to keep. A refused program changed nothing and is
        # not scored. Each program may drop any term, so a term counts again at each program.
        n_in = n_kept = 0
        if result.applied:
            n_in, n_kept = terms_kept(
                ep.key_terms(),
                prompts.items_text(_without_programs(before)),
                prompts.items_text(_without_programs(ep.state[:-2])),
                ep.task.prompt,
            )
        # applied or refused, the edit is charged its generated tokens and the Cache Cost of
        # the next input (the receipt's figures tell the model what the edit itself did)
        ep.step.events.append(
            ep.event(
                EVOLVE_TOOL,
                call.tokens,
                None,
                applied=result.applied,
                detail=result.error or "",
                facts_in=n_in,
                facts_kept=n_kept,
            )
        )
        return None

    def compaction_reserve(self, policy: Any, prompt: str) -> int:
        """The tokens the next program adds to the input: with ``agent.evolve_keep_code`` the
        whole turn; without it what stays once the program has run (its rationale, the stub
        call and the receipt). The budget bounds inputs, so such a program is generated past it,
        as acm's summary is by the summariser."""
        if not policy.keep_code:
            b = policy.budget
            counts = (
                "tokens_before",
                "tokens_after",
                "reusable_prefix",
                "cache_cost",
                "call_tokens",
            )
            receipt = {"applied": True, **dict.fromkeys(counts, b), "compaction_cost": float(b)}
            turn = policy.compaction_turn(b, EVOLVE_TOOL, json.loads(APPLIED_CODE))
            return len(
                policy.tok.encode(f"{turn}\n{json.dumps(receipt)}", add_special_tokens=False)
            )
        task = policy.task
        _, args = self.compaction(
            task,
            policy.env.oracle_plan(task),
            prompt,
            repeats=True,
            keep=kept_lines(policy.env, task, TOOL_RESPONSE.findall(prompt)),
        )
        turn = f"{self.demo_compaction_says}\n{format_tool_call(EVOLVE_TOOL, args)}"
        return len(policy.tok.encode(turn, add_special_tokens=False))

    def compaction(
        self,
        task: Any,
        plan: list[Any],
        seen: str,
        *,
        repeats: bool,
        keep: Sequence[str] = (),
    ) -> tuple[str, dict[str, Any]]:
        return EVOLVE_TOOL, {"code": keep_facts_code(task, plan, seen, repeats=repeats, keep=keep)}
