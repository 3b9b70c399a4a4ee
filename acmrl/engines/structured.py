"""Structured output: a completion constrained to a JSON schema, as OpenAI-compatible servers
offer it (``response_format``).

A request may carry ``response_format`` in the OpenAI shape, which vLLM's completions endpoint
accepts too: ``{"type": "json_schema", "json_schema": {"name": ..., "schema": {...}}}``, or
``{"type": "json_object"}`` (any JSON object), or ``{"type": "text"}`` (no constraint). The
``openai`` engine sends it to its servers; the transformers engine (and so ``acmrl serve``)
enforces it itself: before each token, the tokens that cannot continue a text the schema accepts
are masked out (llguidance computes the mask from the schema and the tokenizer), and the reply
ends once the object is complete, with no end-of-turn token after it (vLLM emits one): such
replies are for parsing, not for training a policy to stop. The reply's logprobs are those of
the constrained distribution (vLLM returns the unconstrained ones by default). Whitespace between JSON tokens is fixed (``", "`` and ``": "``), so that a small
model cannot fill its budget with blank lines.
"""

from __future__ import annotations

import json
from typing import Any

import torch

from acmrl.engines.base import EngineError

TYPES = ("json_schema", "json_object", "text")
_COMPILE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def check_response_format(rf: Any) -> dict[str, Any] | None:
    """``rf`` checked: None for no constraint (absent or ``text``), else the JSON schema to
    enforce. ValueError names what is wrong."""
    if rf is None:
        return None
    if not isinstance(rf, dict) or rf.get("type") not in TYPES:
        raise ValueError(f"'response_format' must be an object whose 'type' is one of {TYPES}")
    if rf["type"] == "text":
        return None
    if rf["type"] == "json_object":
        return {"type": "object"}
    spec = rf.get("json_schema")
    schema = spec.get("schema") if isinstance(spec, dict) else None
    if not isinstance(schema, dict):
        raise ValueError(
            "'response_format' of type json_schema needs 'json_schema': {'name': ..., "
            "'schema': {...}}"
        )
    return schema


def _grammar(schema: dict[str, Any]) -> str:
    import llguidance

    return llguidance.LLMatcher.grammar_from_json_schema(json.dumps(schema), overrides=_COMPILE)


def schema_error(schema: dict[str, Any]) -> str:
    """Why llguidance cannot enforce ``schema`` ("" when it can), checked without a tokenizer:
    a server refuses such a request before it joins a batch."""
    import llguidance

    try:
        return llguidance.LLMatcher.validate_grammar(_grammar(schema))
    except ValueError as exc:
        return str(exc)


def json_schema_format(name: str, schema: dict[str, Any]) -> dict[str, Any]:
    """The ``response_format`` that asks for a reply matching ``schema`` (not OpenAI's "strict"
    mode, which refuses a root ``anyOf`` and objects open to more properties)."""
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema}}


class Grammars:
    """Per-tokenizer factory of :class:`Constraint`; the tokenizer's llguidance form is built
    once (about a second)."""

    def __init__(self, tokenizer: Any, eos_ids: set[int]) -> None:
        self.tokenizer, self.eos_ids = tokenizer, sorted(eos_ids)
        self._ll: Any = None

    def constraint(self, response_format: Any) -> Constraint | None:
        try:
            schema = check_response_format(response_format)
        except ValueError as exc:
            raise EngineError(str(exc)) from None
        if schema is None:
            return None
        try:
            import llguidance
            import llguidance.hf
        except ImportError:
            raise EngineError(
                "structured output (response_format) needs the llguidance package: "
                "pip install llguidance"
            ) from None
        if self._ll is None:
            self._ll = llguidance.hf.from_tokenizer(self.tokenizer, eos_token=self.eos_ids)
        matcher = llguidance.LLMatcher(self._ll, _grammar(schema), log_level=0)
        if matcher.is_error():
            raise EngineError(f"response_format: the JSON schema is refused: {matcher.get_error()}")
        return Constraint(matcher)


class Constraint:
    """One completion's matcher: :meth:`mask` the logits before sampling, :meth:`consume` the
    token sampled."""

    def __init__(self, matcher: Any) -> None:
        self.matcher = matcher

    def mask(self, logits: torch.Tensor) -> torch.Tensor:
        """``logits`` with every token the schema forbids next at -inf."""
        allowed = torch.frombuffer(bytearray(self.matcher.compute_logit_bias()), dtype=torch.uint8)
        n = min(len(allowed), logits.shape[-1])
        out = torch.full_like(logits, float("-inf"))
        keep = allowed[:n] > 0
        out[:n][keep] = logits[:n][keep]
        if not bool(keep.any()):
            raise EngineError(f"structured output: no token can continue ({self.error()})")
        return out

    def consume(self, token: int) -> None:
        if not self.matcher.consume_token(token):
            raise EngineError(f"structured output: token {token} refused ({self.error()})")

    @property
    def done(self) -> bool:
        """The object is complete: nothing but the end of the reply may follow."""
        return bool(self.matcher.is_stopped())

    def error(self) -> str:
        return self.matcher.get_error() or "no error"
