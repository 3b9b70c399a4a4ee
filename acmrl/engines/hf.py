"""The transformers engine: batched generation with a KV cache kept per session across turns.

Each session's cache holds the keys and values of everything the model has read so far (prompt
plus its completion). On the next turn the new prompt is compared with those token ids; the cache
is cropped to the longest common prefix and only the rest is prefilled. After a context edit
(compaction, evolve) the common prefix is whatever precedes the edit, so the reuse reported in
``cached_prefix_tokens`` is the reuse that really happened. With ``reuse_cache=False`` every turn
is prefilled from scratch (the baseline of ``benchmarks/rollout_throughput.py``).

A session with little or nothing of its own to reuse (its first turn, a helper call) borrows the
longest prefix another session has read (``share_prefix``): the episodes of one arm start with the
same system prompt and tool definitions, a GRPO group with the same task, so only the first of
them reads those tokens. The borrowed prefix is not reported in ``cached_prefix_tokens``, which
stays the session's own reuse: the Compaction Cost charges what the agent's own context edit
broke, and must not depend on which other episodes ran beside it. ``borrowed_tokens`` counts it.

A batch is prefilled session by session (only the uncached suffix), then decoded together: the
caches are left-padded to a common length with an attention mask and explicit positions, one
token per row per step, and split back per session afterwards. In float32 the greedy output is the
same with and without reuse (a test checks it). A row that finishes leaves the batch
(``drop_finished``), so the others decode without it.
"""

from __future__ import annotations

import random
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from acmrl.context.prefix import reusable_prefix
from acmrl.engines.base import Completion, Engine, EngineError, Request
from acmrl.engines.structured import Constraint, Grammars
from acmrl.models import cache_argument, cache_of

KV = list[tuple[torch.Tensor, torch.Tensor]]  # per layer: keys, values [1, kv_heads, seq, head_dim]
# a prefix is borrowed from another session only when it saves at least this many tokens
MIN_BORROWED = 32


@dataclass
class _Cached:
    ids: list[int]
    kv: KV


@dataclass
class _Row:
    req: Request
    kv: KV
    length: int  # tokens in kv
    cached: int
    generator: torch.Generator
    tokens: list[int]
    logprobs: list[float]
    finish: str | None = None
    constraint: Constraint | None = None  # the request's response_format


class _GrowingLayer(DynamicLayer):
    """A decode batch's cache layer whose keys and values live in a buffer with room for the
    batch's new tokens: each step writes its token in place, where transformers'
    ``DynamicLayer`` concatenates, copying the whole cache (16 rows of 2,000 tokens: 0.7 GB
    over the 30 layers, every token). ``keys``/``values`` are views of the filled part."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, filled: int) -> None:
        super().__init__()
        self._k, self._v, self.filled = keys, values, filled
        self.device, self.is_initialized = keys.device, True
        self._views()

    def _views(self) -> None:
        self.keys = self._k[:, :, : self.filled]
        self.values = self._v[:, :, : self.filled]

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        end = self.filled + key_states.shape[-2]
        if end > self._k.shape[-2]:  # past the room made for the batch: grow it
            room = max(end, 2 * self._k.shape[-2])
            self._k = F.pad(self._k, (0, 0, 0, room - self._k.shape[-2]))
            self._v = F.pad(self._v, (0, 0, 0, room - self._v.shape[-2]))
        self._k[:, :, self.filled : end] = key_states
        self._v[:, :, self.filled : end] = value_states
        self.filled = end
        self._views()
        return self.keys, self.values

    def keep_rows(self, index: torch.Tensor) -> None:
        self._k, self._v = self._k.index_select(0, index), self._v.index_select(0, index)
        self._views()

    def _not_here(self, *args: Any, **kwargs: Any) -> None:
        # DynamicLayer's own edits assign ``keys``/``values`` and would leave the buffer behind
        raise NotImplementedError("a decode batch's cache is only extended and cut by row")

    crop = batch_repeat_interleave = batch_select_indices = reorder_cache = reset = _not_here


def _kv_of(cache: Any) -> KV:
    return [(layer.keys, layer.values) for layer in cache.layers]


def _length(kv: KV) -> int:
    """Tokens held in a cache."""
    return kv[0][0].shape[2]


class HFEngine(Engine):
    name = "hf"

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        reuse_cache: bool = True,
        max_batch: int = 8,
        max_sessions: int = 64,
        seed: int = 0,
        drop_finished: bool = True,
        share_prefix: bool = True,
        grow_in_place: bool = True,
    ) -> None:
        self.model = model.eval()
        self.share_prefix = share_prefix  # False: the baseline of benchmarks/rollout_throughput.py
        self.borrowed_tokens = 0  # prompt tokens read from another session's cache
        self.prefilled_tokens = 0  # prompt tokens computed (neither reused nor borrowed)
        self.drop_finished = drop_finished  # False: the baseline of benchmarks/decode_batch.py
        self.tokenizer = tokenizer
        self.reuse_cache = reuse_cache
        self.max_batch = max_batch
        self.max_sessions = max_sessions
        self.device = next(model.parameters()).device
        self.max_positions = getattr(model.config, "max_position_embeddings", None) or 1 << 30
        eos = {tokenizer.eos_token_id}
        gen_eos = getattr(model.generation_config, "eos_token_id", None)
        eos |= set(gen_eos) if isinstance(gen_eos, list) else {gen_eos}
        self.eos_ids = {e for e in eos if e is not None}
        self.pad_id = (
            tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(self.eos_ids)
        )
        self._cache_kw = cache_argument(model)
        # a decode batch's cache grows in place (``_GrowingLayer``) where every layer of the
        # model's own cache is a plain ``DynamicLayer`` (no sliding window, no sharing);
        # False: the baseline of benchmarks/decode_batch.py
        plain = all(type(x) is DynamicLayer for x in DynamicCache(config=model.config).layers)
        self.grow_in_place = grow_in_place and plain
        self._sessions: OrderedDict[str, _Cached] = OrderedDict()
        self._seeds = random.Random(seed)
        self._grammars = Grammars(tokenizer, self.eos_ids)

    @classmethod
    def from_config(cls, model_cfg: Any, **kwargs: Any) -> HFEngine:
        from acmrl.models import load_model

        model, tokenizer = load_model(model_cfg)
        return cls(model, tokenizer, **kwargs)

    # -- sessions ---------------------------------------------------------------------------------

    def release(self, session_id: str) -> None:
        self._sessions.pop(session_id, None)

    def close(self) -> None:
        self._sessions.clear()

    def policy_updated(self) -> None:
        """The KV caches hold the old policy's keys and values: none may be reused."""
        self._sessions.clear()

    def cached_tokens(self, session_id: str) -> int:
        entry = self._sessions.get(session_id)
        return len(entry.ids) if entry else 0

    def _store(self, session_id: str, ids: list[int], kv: KV) -> None:
        self._sessions[session_id] = _Cached(ids, kv)
        self._sessions.move_to_end(session_id)
        while len(self._sessions) > self.max_sessions:
            self._sessions.popitem(last=False)  # least recently used

    # -- generation -------------------------------------------------------------------------------

    def generate(self, requests: list[Request]) -> list[Completion]:
        out: list[Completion] = []
        for i in range(0, len(requests), self.max_batch):
            out += self._generate_batch(requests[i : i + self.max_batch])
        return out

    def _check(self, req: Request) -> None:
        if not req.prompt_ids:
            raise EngineError(f"session {req.session_id}: empty prompt")
        if len(req.prompt_ids) + req.max_tokens > self.max_positions:
            raise EngineError(
                f"session {req.session_id}: prompt of {len(req.prompt_ids)} tokens + "
                f"{req.max_tokens} new tokens exceeds the model's {self.max_positions} positions"
            )

    @torch.inference_mode()
    def _prefill(
        self, req: Request, batch: list[_Cached] | None = None
    ) -> tuple[KV, int, torch.Tensor]:
        """Crop the session's cache to the reusable prefix and read the rest of the prompt. When
        another session (a stored one, or one of ``batch`` read before it) shares a longer
        prefix with the prompt, by at least ``MIN_BORROWED`` tokens, that prefix is borrowed
        instead; the reuse returned is the session's own either way."""
        entry = self._sessions.pop(req.session_id, None)
        prompt = req.prompt_ids
        own = 0
        if entry is not None and self.reuse_cache:
            own = min(reusable_prefix(entry.ids, prompt), _length(entry.kv), len(prompt) - 1)
        source, start = (entry.kv if own else None), own
        if self.reuse_cache and self.share_prefix:
            for other in [*self._sessions.values(), *(batch or [])]:
                if other.ids[:1] != prompt[:1]:
                    continue
                n = min(reusable_prefix(other.ids, prompt), _length(other.kv), len(prompt) - 1)
                if n >= start + MIN_BORROWED:
                    source, start = other.kv, n
            self.borrowed_tokens += start - own
        self.prefilled_tokens += len(prompt) - start
        data = [(k[:, :, :start], v[:, :, :start]) for k, v in source] if start else None
        cache = DynamicCache(ddp_cache_data=data, config=self.model.config)
        ids = torch.tensor([prompt[start:]], device=self.device)
        out = self.model(input_ids=ids, use_cache=True, logits_to_keep=1, **{self._cache_kw: cache})
        return _kv_of(cache_of(out)), own, out.logits[0, -1].float()

    def _sample(self, row: _Row, logits: torch.Tensor) -> None:
        req = row.req
        if row.constraint is not None:
            logits = row.constraint.mask(logits)
        if req.temperature > 0:
            logp = F.log_softmax(logits / req.temperature, dim=-1)
            probs = logp.exp()
            if req.top_p < 1.0:
                sorted_p, order = probs.sort(descending=True)
                keep = sorted_p.cumsum(-1) - sorted_p < req.top_p  # always keeps the top token
                probs = torch.zeros_like(probs).scatter(0, order[keep], sorted_p[keep])
            token = int(torch.multinomial(probs, 1, generator=row.generator))
        else:
            logp = F.log_softmax(logits, dim=-1)
            token = int(logits.argmax())
        row.tokens.append(token)
        row.logprobs.append(float(logp[token]))
        if row.constraint is not None:
            row.constraint.consume(token)
        if (
            token in self.eos_ids
            or (req.stop and self._hit_stop(row))
            or (row.constraint is not None and row.constraint.done)
        ):
            row.finish = "stop"
        elif len(row.tokens) >= req.max_tokens:
            row.finish = "length"

    def _hit_stop(self, row: _Row) -> bool:
        tail = self.tokenizer.decode(row.tokens[-16:], skip_special_tokens=False)
        return any(s in tail for s in row.req.stop)

    def _text(self, tokens: list[int]) -> str:
        if tokens and tokens[-1] in self.eos_ids:
            tokens = tokens[:-1]
        return self.tokenizer.decode(tokens, skip_special_tokens=False)

    @torch.inference_mode()
    def _generate_batch(self, requests: list[Request]) -> list[Completion]:
        t0 = time.perf_counter()
        rows: list[_Row] = []
        read: list[_Cached] = []  # the batch's prompts read so far, which later rows may borrow
        for req in requests:
            self._check(req)
        # a schema that cannot be enforced fails before any session's cache is touched
        constraints = [self._grammars.constraint(r.response_format) for r in requests]
        for req, constraint in zip(requests, constraints, strict=True):
            kv, cached, logits = self._prefill(req, read)
            read.append(_Cached(req.prompt_ids, kv))
            seed = req.seed if req.seed is not None else self._seeds.getrandbits(63)
            gen = torch.Generator(device="cpu").manual_seed(seed)
            row = _Row(req, kv, len(req.prompt_ids), cached, gen, [], [], constraint=constraint)
            self._sample(row, logits.cpu())
            rows.append(row)
        steps = self._decode(rows)
        wall = time.perf_counter() - t0
        out = []
        for row, kv in zip(rows, steps, strict=True):
            self._store(row.req.session_id, row.req.prompt_ids + row.tokens[:-1], kv)
            out.append(
                Completion(
                    row.req.session_id,
                    row.tokens,
                    row.logprobs,
                    row.cached,
                    row.finish or "length",
                    self._text(row.tokens),
                    len(row.req.prompt_ids),
                    wall,
                )
            )
        return out

    def _decode_layers(self, rows: list[_Row], width: int, room: int) -> list[_GrowingLayer]:
        """The rows' caches, left-padded to ``width``, in buffers of ``room`` tokens."""
        layers = []
        for layer in range(len(rows[0].kv)):
            k0 = rows[0].kv[layer][0]
            shape = (len(rows), k0.shape[1], room, k0.shape[3])
            ks, vs = k0.new_empty(shape), k0.new_empty(shape)
            for i, r in enumerate(rows):
                pad = width - r.length  # left padding, masked out; zeroed so no NaN reaches it
                ks[i, :, :pad].zero_()
                vs[i, :, :pad].zero_()
                ks[i, :, pad:width] = r.kv[layer][0][0]
                vs[i, :, pad:width] = r.kv[layer][1][0]
            layers.append(_GrowingLayer(ks, vs, width))
        return layers

    def _decode(self, rows: list[_Row]) -> list[KV]:
        """Decode all unfinished rows together; each row's cache (prompt + completion[:-1]) after.

        A row that finishes leaves the batch at the next step (its cache is cut out first), so
        the rows still generating do not carry finished ones along: a turn that closes its call
        in 25 tokens no longer rides in every step of a 96-token one."""
        width = max(r.length for r in rows)
        room = width + max(r.req.max_tokens - len(r.tokens) for r in rows)
        if self.grow_in_place:
            cache = DynamicCache(config=self.model.config)
            cache.layers = self._decode_layers(rows, width, room)
        else:
            data = []
            for layer in range(len(rows[0].kv)):
                ks = [F.pad(r.kv[layer][0], (0, 0, width - r.length, 0)) for r in rows]
                vs = [F.pad(r.kv[layer][1], (0, 0, width - r.length, 0)) for r in rows]
                data.append((torch.cat(ks), torch.cat(vs)))
            cache = DynamicCache(ddp_cache_data=data, config=self.model.config)
        mask = torch.zeros(len(rows), width, dtype=torch.long, device=self.device)
        for i, r in enumerate(rows):
            mask[i, width - r.length :] = 1
        live = list(range(len(rows)))  # the rows in the batch, in the cache's order
        result: list[KV] = [[] for _ in rows]
        fed = 0
        while True:
            done = [j for j, i in enumerate(live) if rows[i].finish is not None]
            if done and (self.drop_finished or len(done) == len(live)):
                kv = _kv_of(cache)
                for j in done:
                    r = rows[live[j]]
                    start, end = width - r.length, width + len(r.tokens) - 1
                    result[live[j]] = [
                        (k[j : j + 1, :, start:end].clone(), v[j : j + 1, :, start:end].clone())
                        for k, v in kv
                    ]
                gone = set(done)
                keep = [j for j in range(len(live)) if j not in gone]
                if not keep:
                    return result
                index = torch.tensor(keep, device=self.device)
                for layer in cache.layers:
                    if isinstance(layer, _GrowingLayer):
                        layer.keep_rows(index)
                    else:
                        layer.keys = layer.keys.index_select(0, index)
                        layer.values = layer.values.index_select(0, index)
                mask = mask.index_select(0, index)
                live = [live[j] for j in keep]
            last = [rows[i].tokens[-1] if rows[i].finish is None else self.pad_id for i in live]
            ids = torch.tensor([[t] for t in last], device=self.device)
            pos = torch.tensor([[rows[i].length + fed] for i in live], device=self.device)
            mask = torch.cat(
                [mask, torch.ones(len(live), 1, dtype=torch.long, device=self.device)], 1
            )
            out = self.model(
                input_ids=ids,
                attention_mask=mask,
                position_ids=pos,
                **{self._cache_kw: cache},
                use_cache=True,
            )
            cache = cache_of(out)
            fed += 1
            logits = out.logits[:, -1].float().cpu()
            for j, i in enumerate(live):
                if rows[i].finish is None:
                    self._sample(rows[i], logits[j])
