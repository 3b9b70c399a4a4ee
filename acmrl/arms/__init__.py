"""The arms: one module per way of handling the context, behind one interface (:class:`Arm`).

=========  =====================================================================================
react      the environment's tools only (:mod:`acmrl.arms.react`)
summary    the harness summarises the whole history at a threshold (:mod:`acmrl.arms.summary`)
memory     a background reflection keeps a memory outside the context (:mod:`acmrl.arms.memory`)
acm        the policy compacts (``manage_context``) and queries its archive (:mod:`acmrl.arms.acm`)
evolve     the policy edits its context with a program (:mod:`acmrl.arms.evolve`)
mask       the harness masks the oldest tool results at the budget (:mod:`acmrl.arms.mask`)
=========  =====================================================================================

Each module holds its arm's tools and system prompt, what the harness does before a generation
and on the arm's own calls, and what the teacher's scripted policies do in it (its compaction
call, its detours, its way to bring back lost evidence). Adding an arm is adding a module and
its entry here (and its name to :data:`acmrl.config.ARMS`, which configs are checked against).
"""

from __future__ import annotations

from typing import Any

from acmrl.arms.acm import Acm
from acmrl.arms.base import Arm, Turn
from acmrl.arms.evolve import Evolve
from acmrl.arms.mask import Mask
from acmrl.arms.memory import Memory
from acmrl.arms.react import React
from acmrl.arms.summary import Summary

REGISTRY: dict[str, Arm] = {
    a.name: a for a in (React(), Summary(), Memory(), Acm(), Evolve(), Mask())
}


def get_arm(name: str) -> Arm:
    """The arm called ``name``; a clear error for any other."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown arm {name!r}; arms: {', '.join(REGISTRY)}") from None


def arm_tools(env_tools: list[dict[str, Any]], arm: str, agent: Any = None) -> list[dict[str, Any]]:
    """The tools of an arm under the agent settings ``agent``: the environment's, then the
    arm's own."""
    return [*env_tools, *get_arm(arm).tool_schemas(agent)]


__all__ = ["REGISTRY", "Arm", "Turn", "arm_tools", "get_arm"]
