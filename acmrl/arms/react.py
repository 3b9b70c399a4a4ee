"""``react``: the environment's tools and nothing else; the context grows until the budget.

The baseline of every comparison. Its best scripted policy answers from whatever the
observations show first (every shortcut a listing allows) and reads a document again when the
answer's evidence has left its context under the overflow rule.
"""

from __future__ import annotations

from acmrl.arms.base import Arm


class React(Arm):
    name = "react"
    noted_ceiling = True
