"""``mask``: observation masking, the harness's cheapest context management.

The policy has react's prompt and tools and no context tool. Before a generation whose input
is over the budget, the harness replaces the oldest tool results, one at a time, by a short
placeholder until the input fits; the policy's own thoughts and calls stay, and so does the
newest result. Nothing is generated for it, so its Compaction Cost is the Cache Cost alone:
the next input from the first masked result on, the newest result and the completion before
it included (as for every edit, docs/design.md). The simple strategy that matched LLM
summarisation on SWE-bench agents (Lindenbauer et al., 2025, "The Complexity Trap"); here it is
the baseline that keeps react's whole means (its thoughts) and drops only what must go. What
a masked result said survives only where the policy's own words repeated it, so the audit
plays its ceiling twice, as is and ``noted`` (each thought repeating the evidence read so far),
and its teacher's best policy (``teacher.policy=best``) is the noted one. The teacher has no
turn of its own.
"""

from __future__ import annotations

from typing import Any

from acmrl.arms.base import Arm
from acmrl.rollout import prompts
from acmrl.rollout.records import Step, terms_kept

MASKED = "(result omitted: the context was over its budget; call the tool again to see it)"


def is_masked(item: dict[str, Any]) -> bool:
    return item.get("type") == "function_call_output" and item.get("output") == MASKED


class Mask(Arm):
    name = "mask"
    noted_ceiling = True
    best_noted = True

    def before_generate(self, ep: Any, ids: list[int]) -> Any:
        if len(ids) <= ep.budget:
            return None
        outputs = [
            i
            for i, item in enumerate(ep.state)
            if item["type"] == "function_call_output" and not is_masked(item)
        ]
        state = list(ep.state)
        masked = []
        for i in outputs[:-1]:  # the newest result stays: it is what the next turn reads
            masked.append(state[i])
            state[i] = {**state[i], "output": MASKED}
            if len(ep.renderer.ids(state)) <= ep.budget:
                break
        if not masked:
            return None  # nothing left to mask: the overflow rule decides
        # as for a summary: the key terms the masked results held and the task does not, and
        # of those the ones the context still holds elsewhere (the policy's own words)
        facts_in, facts_kept = terms_kept(
            ep.key_terms(),
            prompts.items_text(masked),
            prompts.items_text(state[1:]),
            prompts.items_text(state[:1]),
        )
        ep.state = state
        step = Step(ep.turn, None, origin="harness")
        step.events.append(
            ep.event(
                "mask",
                0,
                None,
                detail=f"{len(masked)} results masked",
                facts_in=facts_in,
                facts_kept=facts_kept,
            )
        )
        ep.traj.steps.append(step)
        return None
