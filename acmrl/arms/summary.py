"""``summary``: the harness replaces the whole history by a summary at a fixed threshold.

A monitor outside the policy's control (the policy has no context tool): before a generation
whose input reaches ``agent.summary_threshold`` x budget, the summariser (the same model,
greedy) condenses everything after the task into one summary message. The baseline that
isolates *agent-chosen* compaction: same summariser, no decision. Its teacher has no turn of
its own; its best scripted policy reads a document again for evidence a summary dropped.
"""

from __future__ import annotations

from typing import Any

from acmrl.arms.base import Arm
from acmrl.rollout import prompts
from acmrl.rollout.records import ModelCall, Step


class Summary(Arm):
    name = "summary"

    def before_generate(self, ep: Any, ids: list[int]) -> Any:
        if len(ids) < ep.agent.summary_threshold * ep.budget or len(ep.state) <= 2:
            return None
        items = ep.state[1:]

        def done(summary: str, helper: ModelCall, facts: dict[str, int]) -> None:
            ep.state = [ep.state[0], prompts.summary_item(summary or "(empty)", None)]
            step = Step(ep.turn, None, origin="harness")
            step.helper_calls.append(helper)
            step.events.append(ep.event("summary", 0, helper, **facts))
            ep.traj.steps.append(step)

        return ep.summarise(items, ep.state[:1], done)
