"""The transformers engine: real KV reuse across turns, exactness, batching, sampling controls."""

from __future__ import annotations

import pytest
import torch

from acmrl.context.prefix import reusable_prefix as common_prefix
from acmrl.engines.base import EngineError, Request
from acmrl.engines.hf import HFEngine


@pytest.fixture(scope="module")
def model_and_tokenizer(tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_flush_denormal(True)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    return model, AutoTokenizer.from_pretrained(tiny_model_dir)


def engine(mt, **kw) -> HFEngine:
    return HFEngine(*mt, **kw)


def prompt(tok, text: str) -> list[int]:
    msgs = [{"role": "user", "content": text}]
    return tok.apply_chat_template(
        msgs, add_generation_prompt=True, tokenize=True, return_dict=False
    )


def test_greedy_is_identical_with_and_without_cache_reuse(model_and_tokenizer):
    _, tok = model_and_tokenizer
    reuse, fresh = engine(model_and_tokenizer), engine(model_and_tokenizer, reuse_cache=False)
    ids = prompt(tok, "Find the year the Lantern Fair was held.")
    history: list[list[int]] = []
    for turn in range(3):
        a = reuse.generate([Request("s", ids, max_tokens=12)])[0]
        b = fresh.generate([Request("s", ids, max_tokens=12)])[0]
        assert a.completion_ids == b.completion_ids, turn
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)
        assert b.cached_prefix_tokens == 0
        if turn:  # everything the engine read last turn is reused: prompt + completion[:-1]
            assert a.cached_prefix_tokens == common_prefix(history[-1], ids)
            assert a.cached_prefix_tokens == len(history[-1])
        history.append(ids + a.completion_ids[:-1])
        ids = (
            ids + a.completion_ids + tok.encode(f"\nobservation {turn}\n", add_special_tokens=False)
        )
    # a context edit in the middle: the cache is cropped to the prefix before the edit
    edited = ids[:20] + tok.encode(" [summary of turns 1-2] ", add_special_tokens=False) + ids[-10:]
    a = reuse.generate([Request("s", edited, max_tokens=12)])[0]
    b = fresh.generate([Request("s", edited, max_tokens=12)])[0]
    assert a.cached_prefix_tokens == common_prefix(history[-1] + [], edited) >= 20
    assert a.completion_ids == b.completion_ids


def test_logprobs_match_a_teacher_forced_forward(model_and_tokenizer):
    model, tok = model_and_tokenizer
    ids = prompt(tok, "What is in the archive?")
    c = engine(model_and_tokenizer).generate([Request("s", ids, max_tokens=10)])[0]
    with torch.no_grad():
        logits = model(torch.tensor([ids + c.completion_ids])).logits[0].float()
    logp = torch.log_softmax(logits[len(ids) - 1 : -1], -1)
    expected = logp.gather(1, torch.tensor(c.completion_ids)[:, None])[:, 0].tolist()
    assert c.logprobs == pytest.approx(expected, abs=1e-4)
    assert c.completion_ids == logits[len(ids) - 1 : -1].argmax(-1).tolist()  # greedy


def test_a_batch_gives_what_each_request_gives_alone(model_and_tokenizer):
    _, tok = model_and_tokenizer
    eng = engine(model_and_tokenizer)
    texts = ["Hi", "Where was the Amber Kite Festival held in 1962?", "List three towns."]
    reqs = [Request(f"b{i}", prompt(tok, t), max_tokens=8 + 4 * i) for i, t in enumerate(texts)]
    alone = [engine(model_and_tokenizer).generate([r])[0] for r in reqs]
    together = eng.generate(reqs)
    for x, y in zip(alone, together, strict=True):
        assert x.completion_ids == y.completion_ids and x.session_id == y.session_id
        assert x.logprobs == pytest.approx(y.logprobs, abs=1e-4)
    # and the split-back caches are right: the next turn reuses each session exactly
    nxt = [
        Request(r.session_id, r.prompt_ids + c.completion_ids, max_tokens=4)
        for r, c in zip(reqs, together, strict=True)
    ]
    for r, c in zip(nxt, eng.generate(nxt), strict=True):
        assert c.cached_prefix_tokens == len(r.prompt_ids) - 1
        assert c.completion_ids == engine(model_and_tokenizer).generate([r])[0].completion_ids


def test_sampling_seed_stop_and_length(model_and_tokenizer):
    _, tok = model_and_tokenizer
    eng = engine(model_and_tokenizer)
    ids = prompt(tok, "Tell me a story.")
    sample = lambda seed, **kw: eng.generate(  # noqa: E731
        [Request(f"x{seed}", ids, max_tokens=16, temperature=1.0, seed=seed, **kw)]
    )[0]
    assert sample(1).completion_ids == sample(1).completion_ids
    assert sample(1).completion_ids != sample(2).completion_ids
    assert (
        sample(3, top_p=1e-6).completion_ids
        == eng.generate([Request("g", ids, max_tokens=16)])[0].completion_ids
    )
    greedy = eng.generate([Request("g2", ids, max_tokens=16)])[0]
    assert greedy.finish_reason == "length" and len(greedy.completion_ids) == 16
    stop = tok.decode(greedy.completion_ids[4:6])
    cut = eng.generate([Request("g3", ids, max_tokens=16, stop=[stop])])[0]
    assert cut.finish_reason == "stop" and stop in cut.text
    assert cut.completion_ids == greedy.completion_ids[: len(cut.completion_ids)]
    assert len(cut.completion_ids) <= 6


def test_errors_and_session_bookkeeping(model_and_tokenizer):
    _, tok = model_and_tokenizer
    eng = engine(model_and_tokenizer, max_sessions=2)
    with pytest.raises(EngineError, match="empty prompt"):
        eng.generate([Request("e", [], max_tokens=4)])
    with pytest.raises(EngineError, match="exceeds the model's"):
        eng.generate([Request("e", [1] * eng.max_positions, max_tokens=4)])
    ids = prompt(tok, "Hello")
    for s in ("a", "b", "c"):
        eng.generate([Request(s, ids, max_tokens=3)])
    assert eng.cached_tokens("a") == 0 and eng.cached_tokens("c") == len(ids) + 2  # LRU evicted a
    eng.release("c")
    assert eng.cached_tokens("c") == 0


def test_a_new_session_borrows_the_prefix_another_has_read(model_and_tokenizer):
    """Episodes start with the same system prompt: a session's first turn reads only what it does
    not share with a session already read (stored, or earlier in the same batch). Outputs are
    those of reading everything; ``cached_prefix_tokens`` stays the session's own reuse (0 on a
    first turn), so a Compaction Cost never depends on the other episodes."""
    _, tok = model_and_tokenizer
    system = "You are a research agent. Call one tool at a time and read its result. " * 4

    def chat(text: str) -> list[int]:
        msgs = [{"role": "system", "content": system}, {"role": "user", "content": text}]
        return tok.apply_chat_template(
            msgs, add_generation_prompt=True, tokenize=True, return_dict=False
        )

    a, b = chat("Find the Amber Kite Festival."), chat("Who founded the Salt Road Market?")
    common = common_prefix(a, b)
    assert common >= 40
    plain = engine(model_and_tokenizer, share_prefix=False)
    expected = [plain.generate([Request(s, p, max_tokens=10)])[0] for s, p in (("a", a), ("b", b))]
    assert plain.borrowed_tokens == 0

    stored = engine(model_and_tokenizer)  # b's first turn borrows from a's stored session
    got = [stored.generate([Request(s, p, max_tokens=10)])[0] for s, p in (("a", a), ("b", b))]
    batched = engine(model_and_tokenizer)  # b borrows from a, read earlier in the same batch
    together = batched.generate([Request("a", a, max_tokens=10), Request("b", b, max_tokens=10)])
    for eng, out in ((stored, got), (batched, together)):
        assert eng.borrowed_tokens == common
        for x, y in zip(expected, out, strict=True):
            assert x.completion_ids == y.completion_ids
            assert x.logprobs == pytest.approx(y.logprobs, abs=1e-4)
            assert y.cached_prefix_tokens == 0
    # the borrowing session's next turn reuses its own cache, as any session's does
    nxt = Request("b", b + got[1].completion_ids, max_tokens=4)
    again = stored.generate([nxt])[0]
    assert again.cached_prefix_tokens == len(nxt.prompt_ids) - 1
    assert again.completion_ids == plain.generate([nxt])[0].completion_ids
    # a prefix shorter than MIN_BORROWED is read again rather than borrowed
    short = engine(model_and_tokenizer)
    short.generate([Request("x", a, max_tokens=2)])
    short.generate([Request("y", a[:20] + b[common:], max_tokens=2)])
    assert short.borrowed_tokens == 0


def test_the_batch_cache_grown_in_place_gives_what_concatenation_gives(model_and_tokenizer):
    _, tok = model_and_tokenizer
    texts = ["Hi", "Where was the Amber Kite Festival held in 1962?", "List three towns.", "Go"]
    reqs = [Request(f"g{i}", prompt(tok, t), max_tokens=5 + 6 * i) for i, t in enumerate(texts)]
    grown, cat = engine(model_and_tokenizer), engine(model_and_tokenizer, grow_in_place=False)
    assert grown.grow_in_place and not cat.grow_in_place  # the tiny model's layers are plain
    a, b = grown.generate(reqs), cat.generate(reqs)
    for x, y in zip(a, b, strict=True):
        assert x.completion_ids == y.completion_ids
        assert x.logprobs == pytest.approx(y.logprobs, abs=1e-5)
    # the caches each session keeps after the batch are the same tensors' values
    for r in reqs:
        for (k1, v1), (k2, v2) in zip(
            grown._sessions[r.session_id].kv, cat._sessions[r.session_id].kv, strict=True
        ):
            assert torch.equal(k1, k2) and torch.equal(v1, v2)


def test_a_growing_layer_holds_what_concatenation_holds_past_its_room():
    from acmrl.engines.hf import _GrowingLayer

    k, v = torch.randn(2, 3, 5, 4), torch.randn(2, 3, 5, 4)
    layer = _GrowingLayer(torch.nn.functional.pad(k, (0, 0, 0, 1)), v.clone(), filled=5)
    layer._v = torch.nn.functional.pad(layer._v, (0, 0, 0, 1))
    want_k, want_v = k, v
    for _ in range(3):  # one step fits the room, the next two grow the buffer
        nk, nv = torch.randn(2, 3, 1, 4), torch.randn(2, 3, 1, 4)
        got_k, got_v = layer.update(nk, nv)
        want_k, want_v = torch.cat([want_k, nk], -2), torch.cat([want_v, nv], -2)
        assert torch.equal(got_k, want_k) and torch.equal(got_v, want_v)
    assert layer.get_seq_length() == 8
    layer.keep_rows(torch.tensor([1]))
    assert torch.equal(layer.keys, want_k[1:]) and torch.equal(layer.values, want_v[1:])
    with pytest.raises(NotImplementedError):
        layer.crop(-1)  # would leave the buffer behind the keys
