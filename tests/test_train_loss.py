"""Losses with hand-computed numbers; the arithmetic is in the comments."""

from __future__ import annotations

import doctest
import math

import pytest
import torch

import acmrl.train.loss as L


def test_doctests():
    assert doctest.testmod(L).failed == 0


def test_token_logprobs_shift_by_one():
    # vocab 2; logits favour token 1 at position 0 and token 0 at position 1
    logits = torch.tensor([[[0.0, math.log(3.0)], [math.log(3.0), 0.0], [0.0, 0.0]]])
    ids = torch.tensor([[0, 1, 0]])
    lp = L.token_logprobs(logits, ids)
    # position 1 (token 1) from logits[0]: p = 3/4; position 2 (token 0) from logits[1]: p = 3/4
    assert lp[0].tolist() == pytest.approx([0.0, math.log(0.75), math.log(0.75)])


def test_sft_loss_weighted_token_mean():
    logprobs = torch.tensor([[0.0, -1.0, -2.0], [0.0, -3.0, -4.0]])
    mask = torch.tensor([[0, 1, 1], [0, 1, 0]])
    weights = torch.tensor([1.0, 0.5])
    # (1*1 + 1*2 + 0.5*3) / 3 target tokens = 4.5 / 3 = 1.5
    assert L.sft_loss(logprobs, mask, weights).item() == pytest.approx(1.5)


def test_topk_kl_is_zero_when_student_matches_teacher_and_positive_otherwise():
    # vocab 3, one sample of 2 tokens; the target is token 1 (position 1), predicted by logits[0]
    student = torch.tensor([[[math.log(0.5), math.log(0.25), math.log(0.25)], [0.0, 0.0, 0.0]]])
    ids = torch.tensor([[[0, 0], [0, 1]]])  # at position 1 the teacher's top-2: tokens 0 and 1
    mask = torch.tensor([[0, 1]])
    same = torch.tensor([[[0.0, 0.0], [math.log(0.5), math.log(0.25)]]])
    # teacher renormalised: 2/3, 1/3; student on those tokens: log 0.5, log 0.25
    # KL = 2/3 (log 2/3 - log 1/2) + 1/3 (log 1/3 - log 1/4) = 2/3 log(4/3) + 1/3 log(4/3) = log(4/3)
    assert L.topk_kl(student, ids, same, mask).item() == pytest.approx(math.log(4 / 3))
    exact = torch.tensor([[[0.0, 0.0], [math.log(2 / 3), math.log(1 / 3)]]])
    student2 = torch.tensor([[[math.log(2 / 3), math.log(1 / 3), -30.0], [0.0, 0.0, 0.0]]])
    assert L.topk_kl(student2, ids, exact, mask).item() == pytest.approx(0.0, abs=1e-6)


def test_group_advantages_scaled():
    adv = L.group_advantages(
        torch.tensor([1.0, 0.0, 3.0, 1.0]), torch.tensor([0, 0, 1, 1]), scale=True
    )
    # group 0: mean 0.5, std 0.5 -> +1, -1; group 1: mean 2, std 1 -> +1, -1
    assert adv.tolist() == pytest.approx([1.0, -1.0, 1.0, -1.0], abs=1e-5)


def test_grpo_loss_clips_and_aggregates_by_token():
    old = torch.zeros(2, 3)
    # sample 0: ratios e^0.5 = 1.6487 (clipped to 1.2 for A > 0) and 1; sample 1: ratio e^-0.5 = 0.6065
    new = torch.tensor([[0.0, 0.5, 0.0], [0.0, -0.5, 0.0]])
    adv = torch.tensor([1.0, -1.0])
    mask = torch.tensor([[0, 1, 1], [0, 1, 0]])
    out = L.grpo_loss(new, old, adv, mask, clip_eps=0.2)
    # token terms: -min(1.6487*1, 1.2*1) = -1.2; -min(1*1, 1*1) = -1;
    #              A = -1, ratio 0.6065: -min(-0.6065, -0.8) = 0.8
    # mean over 3 target tokens: (-1.2 - 1 + 0.8) / 3 = -0.4667
    assert out.loss.item() == pytest.approx(-1.4 / 3, abs=1e-4)
    assert out.clip_fraction.item() == pytest.approx(
        2 / 3
    )  # two of three ratios are outside 1 +- 0.2
    ref = torch.zeros(2, 3)
    with_kl = L.grpo_loss(new, old, adv, mask, clip_eps=0.2, ref_logprobs=ref, kl_coef=0.1)
    # k3 per token: d = ref - new: -0.5 -> e^-0.5 + 0.5 - 1 = 0.1065; 0 -> 0; 0.5 -> e^0.5 - 1.5 = 0.1487
    kl = (math.exp(-0.5) + 0.5 - 1 + math.exp(0.5) - 0.5 - 1) / 3
    assert with_kl.kl.item() == pytest.approx(kl, abs=1e-4)
    assert with_kl.loss.item() == pytest.approx(-1.4 / 3 + 0.1 * kl, abs=1e-4)


def test_target_logprobs_match_the_full_computation(tiny_model_dir):
    """Projecting onto the vocabulary only at target positions changes nothing but the cost."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    torch.manual_seed(0)
    ids = torch.randint(0, 1000, (2, 9))
    attn = torch.ones_like(ids)
    attn[1, 7:] = 0  # right padding
    mask = torch.tensor([[0, 0, 0, 1, 1, 0, 0, 1, 1], [0, 0, 1, 1, 1, 1, 0, 0, 0]])
    lp, logits = L.target_logprobs(model, ids, attn, mask, temperature=0.7)
    full = L.token_logprobs(model(input_ids=ids, attention_mask=attn).logits / 0.7, ids)
    assert logits.shape == (8, model.config.vocab_size)
    assert torch.allclose(lp, full * mask, atol=1e-5)
    assert (lp[mask == 0] == 0).all()


def test_target_logprobs_fallback_for_older_transformers(tiny_model_dir, monkeypatch):
    """Without boolean logits_to_keep (transformers < 5.2x) the full logits are selected: same
    numbers."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    ids = torch.randint(0, 1000, (2, 7), generator=torch.Generator().manual_seed(1))
    attn = torch.ones_like(ids)
    mask = torch.tensor([[0, 0, 1, 1, 0, 1, 1], [0, 1, 1, 0, 0, 0, 0]])
    fast, _ = L.target_logprobs(model, ids, attn, mask)
    monkeypatch.setattr(L, "_keeps_masks", lambda: False)
    slow, logits = L.target_logprobs(model, ids, attn, mask)
    assert logits.shape == (6, model.config.vocab_size)
    assert torch.allclose(fast, slow, atol=1e-5)


@pytest.mark.parametrize("keeps_masks", [True, False])
def test_a_shared_prefix_read_once_gives_the_same_loss_and_gradients(
    tiny_model_dir, monkeypatch, keeps_masks
):
    """Rows that start alike (an agent's system prompt) read that start once; the logprobs and
    the LoRA gradients are those of the plain forward, with right padding and uneven rows."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    monkeypatch.setattr(L, "_keeps_masks", lambda: keeps_masks)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    lora = LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    model = get_peft_model(model, lora)
    g = torch.Generator().manual_seed(2)
    prefix = torch.randint(5, 1000, (40,), generator=g)
    rows = [torch.cat([prefix, torch.randint(5, 1000, (n,), generator=g)]) for n in (6, 11, 9)]
    T = max(len(r) for r in rows)
    ids = torch.zeros(3, T, dtype=torch.long)
    attn, mask = torch.zeros_like(ids), torch.zeros_like(ids)
    for b, r in enumerate(rows):
        ids[b, : len(r)], attn[b, : len(r)] = r, 1
        mask[b, 38 : len(r)] = 1
    keep = torch.zeros_like(mask, dtype=torch.bool)
    keep[:, :-1] = mask[:, 1:].bool()
    assert L.shared_prefix_length(ids, attn, keep) == 37  # up to the first needed logits
    out = []
    for share in (False, True):
        model.zero_grad()
        lp, logits = L.target_logprobs(model, ids, attn, mask, share_prefix=share)
        (-(lp * mask).sum() / mask.sum()).backward()
        grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.requires_grad])
        out.append((lp.detach(), logits.detach(), grads))
    (lp0, lg0, g0), (lp1, lg1, g1) = out
    assert lg1.shape == lg0.shape == (int(mask[:, 1:].sum()), model.config.vocab_size)
    assert torch.allclose(lp0, lp1, atol=1e-5)
    assert g0.abs().max() > 0 and torch.allclose(g0, g1, atol=1e-5)
    # nothing shared (a single row, or rows that differ at once): the plain forward
    assert L.shared_prefix_length(ids[:1], attn[:1], keep[:1]) == 0
    other = ids.clone()
    other[1, 0] += 1
    assert L.shared_prefix_length(other, attn, keep) == 0
