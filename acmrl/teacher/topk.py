"""A teacher model's top-k logprobs on the student's own view, for distillation.

For every sample (the exact token sequence the student read and wrote, after any compaction),
the teacher model reads the same ids and, at each position whose token is a training target
(``loss_mask`` 1), gives the ``k`` most likely next tokens and their logprobs. It never sees the
uncompressed history: it is asked what it would do in the student's situation.
"""

from __future__ import annotations

from typing import Any

import torch


@torch.inference_mode()
def teacher_topk(
    model: Any, token_ids: list[int], loss_mask: list[int], k: int
) -> tuple[list[list[int]], list[list[float]]]:
    """Top-``k`` ids and logprobs predicting each target token (one entry per ``loss_mask`` 1)."""
    device = next(model.parameters()).device
    targets = [i for i, m in enumerate(loss_mask) if m and i > 0]
    if not targets:
        return [], []
    ids = torch.tensor([token_ids[: targets[-1]]], device=device)
    logits = model(input_ids=ids).logits[0].float()
    logp = torch.log_softmax(logits[[t - 1 for t in targets]], dim=-1)
    top = logp.topk(k, dim=-1)
    return top.indices.tolist(), top.values.tolist()


def add_teacher_topk(model: Any, samples: list[dict[str, Any]], k: int) -> None:
    """Attach ``teacher_topk_ids`` / ``teacher_topk_logprobs`` to each sample dict in place."""
    for s in samples:
        s["teacher_topk_ids"], s["teacher_topk_logprobs"] = teacher_topk(
            model, s["token_ids"], s["loss_mask"], k
        )
