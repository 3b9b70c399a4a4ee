"""Losses of SFT and GRPO on per-turn samples, and group-relative advantages.

Shapes: ``B`` samples, ``T`` positions. ``logprobs[b, t]`` is the model's log-probability of token
``t`` of sample ``b`` given the tokens before it (position 0 has none and is masked out);
``mask[b, t]`` is 1 where token ``t`` is a training target. All losses aggregate at the token
level: a sum over every target token of the batch divided by the number of target tokens, so a
long turn weighs by its tokens, not as one sample (the DAPO / Dr. GRPO choice).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import torch
import torch.nn.functional as F

from acmrl.models import cache_argument, cache_of


def token_logprobs(logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """``[B, T]`` log-probabilities of each token given its prefix (0 at position 0).

    ``logits[b, t]`` predicts token ``t + 1``, so the result is shifted by one.
    """
    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    picked = logp.gather(-1, input_ids[:, 1:, None])[..., 0]
    return F.pad(picked, (1, 0))


@cache
def _keeps_masks() -> bool:
    """Whether this transformers takes a boolean ``[B, T]`` mask as ``logits_to_keep``
    (``slice_logits_to_keep``, transformers >= 5.2x)."""
    from transformers import modeling_utils

    return getattr(modeling_utils, "slice_logits_to_keep", None) is not None


def target_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    mask: torch.Tensor,
    temperature: float = 1.0,
    share_prefix: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``[B, T]`` log-probabilities of the target tokens (0 elsewhere), and the ``[N, V]`` logits
    of the N target positions, projecting onto the vocabulary only where a target is predicted.

    Prompts are most of a GRPO sample; skipping their vocabulary projection (``logits_to_keep``
    as a boolean mask) saves most of the logits' time and memory. Logits are divided by
    ``temperature`` so the distribution is the one that was sampled from.

    With ``share_prefix``, the tokens every row starts with (an agent's system prompt and tool
    definitions: most of each sample) are read once, and every row continues from their keys and
    values; gradients flow back through that one pass. The loss and its gradients are those of
    the plain forward (a test checks it); only the work shrinks.
    """
    tmask = torch.zeros_like(mask, dtype=torch.bool)
    tmask[:, 1:] = mask[:, 1:].bool()
    keep = torch.zeros_like(tmask)
    keep[:, :-1] = tmask[:, 1:]  # position t predicts token t + 1
    shared = shared_prefix_length(input_ids, attention_mask, keep) if share_prefix else 0
    if shared >= MIN_SHARED_PREFIX:
        logits = _shared_prefix_logits(model, input_ids, attention_mask, keep, shared)
    elif _keeps_masks():
        out = model(input_ids=input_ids, attention_mask=attention_mask, logits_to_keep=keep)
        logits = out.logits.reshape(-1, out.logits.shape[-1])
    else:  # older transformers slice with a 1-D index only: project everywhere, then select
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[keep]
    logits = logits.float() / temperature
    targets = input_ids[tmask]
    picked = logits.gather(-1, targets[:, None])[:, 0] - torch.logsumexp(logits, dim=-1)
    full = torch.zeros(mask.shape, dtype=picked.dtype, device=picked.device)
    return full.masked_scatter(tmask, picked), logits


MIN_SHARED_PREFIX = 16  # shorter common prefixes are read per row: not worth a second pass


def shared_prefix_length(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, keep: torch.Tensor
) -> int:
    """How many leading tokens every row of a batch shares (real tokens, not padding), up to the
    first position whose logits are needed and leaving every row one token to read; 0 for a
    single row.

    >>> ids = torch.tensor([[5, 6, 7, 8], [5, 6, 9, 0]])
    >>> shared_prefix_length(ids, torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]]), ids < 0)
    2
    """
    B, T = input_ids.shape
    if B < 2:
        return 0
    same = (input_ids == input_ids[:1]).all(0) & attention_mask.bool().all(0)
    differs = (~same).nonzero()
    n = int(differs[0, 0]) if len(differs) else T
    needed = keep.any(0).nonzero()
    if len(needed):
        n = min(n, int(needed[0, 0]))
    return max(0, min(n, T - 1))


def _shared_prefix_logits(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    keep: torch.Tensor,
    shared: int,
) -> torch.Tensor:
    """The ``[N, V]`` logits at ``keep``: the first ``shared`` tokens (the same in every row, no
    logits needed there) in one pass of one row, then every row's rest on top of its cache."""
    from transformers import DynamicCache

    B = input_ids.shape[0]
    head = model(
        input_ids=input_ids[:1, :shared],
        attention_mask=attention_mask[:1, :shared],
        use_cache=True,
        logits_to_keep=1,
    )
    past = cache_of(head)
    data = [
        (layer.keys.expand(B, -1, -1, -1), layer.values.expand(B, -1, -1, -1))
        for layer in past.layers
    ]
    config = getattr(model, "config", None)
    cache = DynamicCache(ddp_cache_data=data, config=config)
    T = input_ids.shape[1]
    positions = torch.arange(shared, T, device=input_ids.device).expand(B, -1)
    rest_keep = keep[:, shared:]
    out = model(
        input_ids=input_ids[:, shared:],
        attention_mask=attention_mask,
        position_ids=positions,
        use_cache=True,
        logits_to_keep=rest_keep if _keeps_masks() else 0,
        **{cache_argument(model): cache},
    )
    logits = out.logits if _keeps_masks() else out.logits[rest_keep]
    return logits.reshape(-1, logits.shape[-1])


def entropy(logits: torch.Tensor) -> torch.Tensor:
    """Mean entropy of ``[N, V]`` next-token distributions (no gradient)."""
    with torch.no_grad():
        logp = torch.log_softmax(logits, dim=-1)
        return -(logp.exp() * logp).sum(-1).mean() if len(logits) else logits.new_zeros(())


def sft_loss(logprobs: torch.Tensor, mask: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Weighted negative log-likelihood of the target tokens: sum(w * mask * -logp) / sum(mask).

    ``weights`` is ``[B, T]`` (the soft supervision of each token, :mod:`acmrl.train.samples`)
    or ``[B]`` (one weight per sample).
    """
    m = mask.float()
    w = weights if weights.dim() == 2 else weights[:, None]
    return -(logprobs * m * w).sum() / m.sum().clamp(min=1.0)


def topk_kl(
    logits: torch.Tensor, topk_ids: torch.Tensor, topk_logprobs: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """Forward KL(teacher || student) on the teacher's top-k support, per target token, averaged.

    ``topk_ids`` / ``topk_logprobs`` are ``[B, T, k]``: at position ``t`` the teacher's k most
    likely tokens *for* token ``t`` (so they pair with ``logits[:, t - 1]``). The teacher's
    probabilities are renormalised over its top k; the student's are its full-vocabulary
    log-probabilities of those same tokens.
    """
    tmask = mask[:, 1:].bool()
    return topk_kl_at(logits[:, :-1][tmask], topk_ids[:, 1:][tmask], topk_logprobs[:, 1:][tmask])


def topk_kl_at(
    logits: torch.Tensor, topk_ids: torch.Tensor, topk_logprobs: torch.Tensor
) -> torch.Tensor:
    """:func:`topk_kl` on the ``[N, V]`` student logits of N target positions (as
    :func:`target_logprobs` returns them) and the teacher's ``[N, k]`` top-k there."""
    if not len(logits):
        return logits.new_zeros(())
    student = torch.log_softmax(logits.float(), dim=-1).gather(-1, topk_ids)
    teacher = torch.log_softmax(topk_logprobs.float(), dim=-1)  # renormalised over the top k
    return (teacher.exp() * (teacher - student)).sum(-1).mean()


def group_advantages(
    rewards: torch.Tensor, groups: torch.Tensor, scale: bool = False, atol: float = 1e-6
) -> torch.Tensor:
    """Reward minus its group's mean (optionally divided by the group's std); one value per rollout.

    A group whose rewards are equal within ``atol`` (relative to their size, at least 1) is
    flat: its advantages are exactly 0. The floating-point mean of equal rewards is not always
    the reward itself, and std scaling would blow that rounding up into a same-sign push.

    >>> group_advantages(torch.tensor([1.0, 0.0, 0.5, 0.5]), torch.tensor([0, 0, 1, 1])).tolist()
    [0.5, -0.5, 0.0, 0.0]
    >>> group_advantages(torch.tensor([0.7] * 8), torch.tensor([0] * 8), scale=True).tolist()
    [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    """
    adv = torch.zeros_like(rewards)
    for g in groups.unique():
        sel = groups == g
        r = rewards[sel]
        if float(r.max() - r.min()) <= atol * max(1.0, float(r.abs().max())):
            continue  # flat
        a = r - r.mean()
        if scale:
            a = a / (r.std(unbiased=False) + 1e-6)
        adv[sel] = a
    return adv


@dataclass
class GRPOLossOut:
    loss: torch.Tensor  # scalar
    clip_fraction: torch.Tensor  # share of target tokens whose ratio was clipped
    ratio_mean: torch.Tensor
    kl: torch.Tensor  # scalar, 0 without a reference


def grpo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_eps: float = 0.2,
    ref_logprobs: torch.Tensor | None = None,
    kl_coef: float = 0.0,
) -> GRPOLossOut:
    """Clipped importance-ratio policy loss with token-level aggregation, plus an optional KL to
    the reference (the k3 estimator, exp(ref - new) - (ref - new) - 1).

    ``advantages`` is ``[B]``: every token of a sample shares its rollout's advantage.
    ``mask`` may hold weights (GRPO's segment weights): the result is then their weighted mean.
    """
    m = mask.float()
    total = m.sum()
    n = torch.where(total > 0, total, torch.ones_like(total))
    ratio = torch.exp(logprobs - old_logprobs)
    adv = advantages[:, None]
    unclipped = ratio * adv
    clipped = ratio.clamp(1 - clip_eps, 1 + clip_eps) * adv
    policy = -torch.minimum(unclipped, clipped)
    loss = (policy * m).sum() / n
    kl = torch.zeros((), dtype=loss.dtype)
    if ref_logprobs is not None and kl_coef > 0:
        d = ref_logprobs - logprobs
        kl = ((torch.exp(d) - d - 1) * m).sum() / n
        loss = loss + kl_coef * kl
    clip_fraction = (((ratio - 1).abs() > clip_eps).float() * m).sum() / n
    return GRPOLossOut(loss, clip_fraction, (ratio * m).sum() / n, kl)
