"""Prefix-cache arithmetic (docs/design.md, "Costs").

An exact-prefix cache reuses the computation of the longest identical initial run of token ids
between the previous full model input (with its completion) and the new one. Both sides must be
the *complete* rendered inputs, system prompt and tool definitions included, tokenised exactly as
the engine sees them; :mod:`acmrl.context.render` produces them.

- reusable prefix = longest common initial run of token ids
- Cache Cost = tokens in the new input - tokens in the reusable prefix
- Compaction Cost = generated compaction-call tokens x output-token weight + Cache Cost

Costs are in input-token equivalents; the output-token weight is the price of one output token
relative to one uncached input token. Engines also report what they actually reused; this is the
model-independent bound.
"""

from __future__ import annotations

from collections.abc import Sequence


def reusable_prefix(before_ids: Sequence[int], after_ids: Sequence[int]) -> int:
    """Length of the longest common initial run of ``before_ids`` and ``after_ids``.

    >>> reusable_prefix([1, 2, 3], [1, 9, 3])
    1
    >>> reusable_prefix([1, 2, 3], [1, 2])
    2
    """
    n = min(len(before_ids), len(after_ids))
    # one pass in chunks (slices compare in C), then the first differing chunk element by element
    step = 2048
    for start in range(0, n, step):
        end = min(n, start + step)
        a, b = before_ids[start:end], after_ids[start:end]
        if list(a) != list(b):
            return start + next(i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y)
    return n


def cache_cost(before_ids: Sequence[int], after_ids: Sequence[int]) -> int:
    """Tokens of the new input outside the reusable prefix.

    >>> cache_cost([1, 2, 3], [1, 9, 3])
    2
    >>> cache_cost([1, 2, 3], [1, 2])
    0
    >>> cache_cost([1], [1, 2])
    1
    """
    return len(after_ids) - reusable_prefix(before_ids, after_ids)


def compaction_cost(call_tokens: int, cache_cost: int, output_weight: float) -> float:
    """Generated compaction-call tokens x output-token weight + Cache Cost.

    Summariser and querier tokens (``acm`` and ``summary`` arms) are generated tokens too: pass
    them inside ``call_tokens``.

    >>> compaction_cost(call_tokens=40, cache_cost=300, output_weight=4.0)
    460.0
    """
    if call_tokens < 0 or cache_cost < 0:
        raise ValueError(
            f"token counts must be >= 0, got call_tokens={call_tokens}, cache_cost={cache_cost}"
        )
    if output_weight < 0:
        raise ValueError(f"output_weight must be >= 0, got {output_weight}")
    return float(call_tokens * output_weight + cache_cost)
