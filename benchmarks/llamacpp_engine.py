"""Would llama.cpp serve rollouts faster than the transformers engine on this CPU?

    pip install llama-cpp-python==0.3.36      # builds llama.cpp from source (28 min on 2 cores beside a training job)
    .venv/bin/python benchmarks/llamacpp_engine.py [--rows 16] [--weights f32 f16 q8_0]

The workload of ``benchmarks/decode_batch.py``: ``--rows`` kb_search tiny inputs (rendered States
of expert episodes, ~750-1,250 tokens each), each asked for 20 to 96 new tokens, greedy, never
stopping early. Each engine first reads every prompt into its session (prefill, timed), then
decodes all rows together from the cached prompts (decode, timed).

- ``hf``: :class:`acmrl.engines.hf.HFEngine` in float32, one batch of all rows.
- ``llamacpp``: a minimal engine over llama-cpp-python's low-level API with the same
  ``Request``/``Completion`` protocol: one llama.cpp sequence per session (non-unified KV cache,
  so a row attends over its own session only), the session's cache cropped to the common prefix
  of the next prompt (``llama_memory_seq_rm``), the uncached suffixes of all rows prefilled in
  one ``llama_batch``, then one token per live row per ``llama_decode``; logprobs from the
  returned logits. The model is the same weights exported to GGUF here (the ``gguf`` package,
  Q/K rows permuted back to llama.cpp's rotary layout), as F32, F16 or Q8_0
  (``llama_model_quantize``).

Printed per engine: prefill and decode seconds, their ratio to hf, and how many rows' greedy
completions equal hf's (with the largest logprob difference on the tokens where they agree).
Run alone: CPU contention from other jobs distorts the timings. Measured result and decision in
docs/rollout.md ("Measured: a llama.cpp engine").
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from decode_batch import inputs, timed

from acmrl.config import ModelConfig
from acmrl.context.prefix import reusable_prefix
from acmrl.engines.base import Completion, Engine, EngineError, Request
from acmrl.engines.hf import HFEngine
from acmrl.models import load_model


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """transformers' rotate-half q/k rows -> llama.cpp's interleaved rotary layout."""
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def export_gguf(model: Any, tokenizer: Any, out: Path) -> None:
    """A float32 llama-architecture GGUF of a transformers Llama model (token ids only: the
    vocabulary is written for llama.cpp to load, never to tokenize)."""
    import gguf

    c = model.config
    sd = {k: v.detach().float().cpu().numpy() for k, v in model.state_dict().items()}
    w = gguf.GGUFWriter(str(out), "llama")
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_block_count(c.num_hidden_layers)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    theta = getattr(c, "rope_theta", None) or c.rope_parameters["rope_theta"]
    w.add_rope_freq_base(float(theta))
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_rope_dimension_count(
        getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    )
    w.add_vocab_size(c.vocab_size)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    tokens = [f"[unused{i}]" for i in range(c.vocab_size)]
    for t, i in tokenizer.get_vocab().items():
        if i < c.vocab_size:
            tokens[i] = t
    special = set(tokenizer.all_special_ids)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types(
        [
            gguf.TokenType.CONTROL if i in special else gguf.TokenType.NORMAL
            for i in range(len(tokens))
        ]
    )
    merges = json.loads(tokenizer.backend_tokenizer.to_str())["model"]["merges"]
    w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in merges])
    w.add_eos_token_id(tokenizer.eos_token_id)
    names = {
        "input_layernorm": "attn_norm",
        "self_attn.v_proj": "attn_v",
        "self_attn.o_proj": "attn_output",
        "post_attention_layernorm": "ffn_norm",
        "mlp.gate_proj": "ffn_gate",
        "mlp.up_proj": "ffn_up",
        "mlp.down_proj": "ffn_down",
    }
    w.add_tensor("token_embd.weight", sd["model.embed_tokens.weight"])
    w.add_tensor("output_norm.weight", sd["model.norm.weight"])
    if not c.tie_word_embeddings:
        w.add_tensor("output.weight", sd["lm_head.weight"])
    for i in range(c.num_hidden_layers):
        p = f"model.layers.{i}."
        q = _permute(sd[p + "self_attn.q_proj.weight"], c.num_attention_heads)
        k = _permute(sd[p + "self_attn.k_proj.weight"], c.num_key_value_heads)
        w.add_tensor(f"blk.{i}.attn_q.weight", q)
        w.add_tensor(f"blk.{i}.attn_k.weight", k)
        for hf_name, gg_name in names.items():
            w.add_tensor(f"blk.{i}.{gg_name}.weight", sd[p + hf_name + ".weight"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


_QUIET = None


@dataclass
class _Row:
    req: Request
    seq: int
    cached: int
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish: str | None = None


class LlamaCppEngine(Engine):
    """Greedy-only llama.cpp engine for this benchmark: one sequence per session, kept across
    calls and cropped to the common prefix of the next prompt."""

    name = "llamacpp"

    def __init__(self, path: Path, tokenizer: Any, slots: int, slot_tokens: int = 2048) -> None:
        import llama_cpp as L

        self.L = L
        global _QUIET
        if _QUIET is None:  # kept for the process's life: llama.cpp holds on to the callback
            _QUIET = L.llama_log_callback(lambda level, text, data: None)
            L.llama_log_set(_QUIET, ctypes.c_void_p(0))
            L.llama_backend_init()
        self.model = L.llama_model_load_from_file(
            str(path).encode(), L.llama_model_default_params()
        )
        cp = L.llama_context_default_params()
        cp.n_ctx, cp.n_seq_max, cp.kv_unified = slots * slot_tokens, slots, False
        cp.n_batch, cp.n_ubatch = 2048, 512
        cp.n_threads = cp.n_threads_batch = os.cpu_count() or 1
        self.ctx = L.llama_init_from_model(self.model, cp)
        if not self.model or not self.ctx:
            raise EngineError(f"llama.cpp could not load {path}")
        self.mem = L.llama_get_memory(self.ctx)
        self.n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(self.model))
        self.batch = L.llama_batch_init(2048, 0, 1)
        self.tokenizer, self.eos_ids = tokenizer, {tokenizer.eos_token_id}
        self.slots: dict[str, tuple[int, list[int]]] = {}

    def close(self) -> None:
        self.L.llama_batch_free(self.batch)
        self.L.llama_free(self.ctx)
        self.L.llama_model_free(self.model)

    def _decode(self, items: list[tuple[int, int, int, bool]]) -> list[np.ndarray]:
        """(sequence, position, token, logits wanted) in chunks of the batch size."""
        out = []
        for start in range(0, len(items), 2048):
            chunk, b = items[start : start + 2048], self.batch
            for j, (seq, pos, tok, want) in enumerate(chunk):
                b.token[j], b.pos[j], b.n_seq_id[j], b.logits[j] = tok, pos, 1, int(want)
                b.seq_id[j][0] = seq
            b.n_tokens = len(chunk)
            if (rc := self.L.llama_decode(self.ctx, b)) != 0:
                raise EngineError(f"llama_decode returned {rc}")
            for j, (*_, want) in enumerate(chunk):
                if want:
                    ptr = self.L.llama_get_logits_ith(self.ctx, j)
                    out.append(np.ctypeslib.as_array(ptr, shape=(self.n_vocab,)).copy())
        return out

    def _take(self, row: _Row, logits: np.ndarray) -> None:
        z = logits - logits.max()
        token = int(z.argmax())
        row.tokens.append(token)
        row.logprobs.append(float(z[token] - np.log(np.exp(z).sum())))
        if token in self.eos_ids:
            row.finish = "stop"
        elif len(row.tokens) >= row.req.max_tokens:
            row.finish = "length"

    def generate(self, requests: list[Request]) -> list[Completion]:
        t0 = time.perf_counter()
        rows, items = [], []
        for req in requests:
            seq, ids = self.slots.get(req.session_id, (len(self.slots), []))
            reuse = min(reusable_prefix(ids, req.prompt_ids), len(req.prompt_ids) - 1)
            self.L.llama_memory_seq_rm(self.mem, seq, reuse, -1)
            self.slots[req.session_id] = (seq, list(req.prompt_ids))
            rows.append(_Row(req, seq, reuse))
            n = len(req.prompt_ids)
            items += [(seq, p, req.prompt_ids[p], p == n - 1) for p in range(reuse, n)]
        for row, logits in zip(rows, self._decode(items), strict=True):
            self._take(row, logits)
        while live := [r for r in rows if r.finish is None]:
            items = []
            for r in live:
                items.append((r.seq, len(r.req.prompt_ids) + len(r.tokens) - 1, r.tokens[-1], True))
                self.slots[r.req.session_id][1].append(r.tokens[-1])
            for r, logits in zip(live, self._decode(items), strict=True):
                self._take(r, logits)
        wall = time.perf_counter() - t0
        return [
            Completion(
                r.req.session_id,
                r.tokens,
                r.logprobs,
                r.cached,
                r.finish or "length",
                "",
                len(r.req.prompt_ids),
                wall,
            )
            for r in rows
        ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--weights", nargs="+", default=["f32", "f16", "q8_0"])
    args = ap.parse_args()
    import llama_cpp as L

    torch.set_flush_denormal(True)
    model, tok = load_model(ModelConfig(dtype="float32"))
    prompts = inputs(tok, args.rows)
    n = len(prompts)
    lengths = [20 + (76 * i) // max(1, n - 1) for i in range(n)]
    print(
        f"{n} rows, {sum(map(len, prompts))} prompt tokens, new tokens {min(lengths)}..{max(lengths)}"
    )
    pre0, dec0, ref = timed(HFEngine(model, tok, max_batch=n), prompts, lengths)
    print(
        "| engine | weights | prefill s | decode s | prefill vs hf | decode vs hf | rows = hf | max logprob diff |"
    )
    print("|---|---|---|---|---|---|---|---|")
    print(f"| hf | float32 | {pre0:.1f} | {dec0:.1f} | 1.00x | 1.00x | {n}/{n} | 0 |")
    ftypes = {"f32": 0, "f16": 1, "q8_0": 7}  # LLAMA_FTYPE_*
    with tempfile.TemporaryDirectory() as tmp:
        f32 = Path(tmp) / "f32.gguf"
        export_gguf(model, tok, f32)
        for name in args.weights:
            path = f32
            if name != "f32":
                path = Path(tmp) / f"{name}.gguf"
                params = L.llama_model_quantize_default_params()
                params.ftype = ftypes[name]
                if L.llama_model_quantize(str(f32).encode(), str(path).encode(), params) != 0:
                    raise SystemExit(f"llama_model_quantize failed for {name}")
            engine = LlamaCppEngine(path, tok, slots=n)
            pre, dec, out = timed(engine, prompts, lengths)
            engine.close()
            same, diff = 0, 0.0
            for a, b in zip(ref, out, strict=True):
                same += a.completion_ids == b.completion_ids
                for x, y, lx, ly in zip(
                    a.completion_ids, b.completion_ids, a.logprobs, b.logprobs, strict=False
                ):
                    if x != y:
                        break
                    diff = max(diff, abs(lx - ly))
            print(
                f"| llamacpp | {name} | {pre:.1f} | {dec:.1f} | {pre0 / pre:.2f}x | {dec0 / dec:.2f}x "
                f"| {same}/{n} | {diff:.3f} |"
            )


if __name__ == "__main__":
    main()
