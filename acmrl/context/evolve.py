"""The ``evolve`` tool: model-written JavaScript that transforms the agent's own State (the
Self-Evolving Agents write-up, docs/design.md).

The model calls ``evolve`` with ``{"code": "<function body>"}``. The body runs as
``function (state) { ... }`` over a copy of the current State in QuickJS, which has no I/O
globals at all (no ``require``, ``fetch``, ``process``, timers or files). Each run gets a fresh
context with a CPU-time limit, a heap limit and a stack limit; code and State sizes are bounded
before and after. The returned value must be a State array, returned synchronously (a Promise is
refused and pending jobs never run), JSON-serialisable, valid under :func:`state.validate`, and
must end with the evolve call itself, unchanged. Otherwise the previous State stays.

Either way a receipt (the call's ``function_call_output``) tells the model what happened. On
success, when a :class:`~acmrl.context.render.Renderer` is given, it reports the measured figures
of docs/design.md: tokens before and after, the reusable prefix, Cache Cost, the call's tokens and
Compaction Cost. "Before" is the previous model input plus the evolve call it generated, "after"
is the new State through the same call; both are complete renders (system prompt and tools
included) without the receipt, whose own tokens are new in either case.

The code runs in a sandbox child process (:mod:`acmrl.context.jsworker`): QuickJS's own CPU-time
limit stops ordinary loops, and a script stuck inside one native call (a backtracking regular
expression) is stopped from outside, by killing the child at the time limit plus a margin; the
edit is then refused with the time-limit error, the old State stays and a new child takes over.
"""

from __future__ import annotations

import copy
import json
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from acmrl.context.jsworker import SandboxRefused, worker
from acmrl.context.prefix import compaction_cost, reusable_prefix
from acmrl.context.state import EVOLVE_TOOL, FunctionCallOutput, State, StateError, validate

if TYPE_CHECKING:
    from acmrl.context.render import Renderer

KiB, MiB = 1024, 1024 * 1024


@dataclass(frozen=True)
class EvolveLimits:
    """Resource bounds for one evolve run (defaults as in the seed-001 reference implementation)."""

    time_ms: int = 250
    heap_bytes: int = 16 * MiB
    stack_bytes: int = 256 * KiB
    code_bytes: int = 64 * KiB
    state_bytes: int = 1 * MiB
    margin_ms: int = 250  # past time_ms + this (wall clock), the sandbox process is killed

    def __post_init__(self) -> None:
        names = ("time_ms", "heap_bytes", "stack_bytes", "code_bytes", "state_bytes", "margin_ms")
        for name in names:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"EvolveLimits.{name} must be a positive integer, got {value!r}")


@dataclass
class EvolveResult:
    applied: bool
    error: str | None
    state: State
    receipt: dict[str, Any]
    timings: dict[str, float] = field(default_factory=dict)


class EvolveRefused(Exception):
    """Internal: the edit is refused; the message goes into the receipt."""


def run_js(state_json: str, code: str, limits: EvolveLimits) -> str:
    """Run ``code`` over the State in this process's sandbox worker (a fresh, limited QuickJS
    context per run, in a child process killed at the deadline); return the result JSON."""
    try:
        return worker().run(
            state_json,
            code,
            limits.time_ms,
            limits.heap_bytes,
            limits.stack_bytes,
            margin_ms=limits.margin_ms,
        )
    except SandboxRefused as exc:
        raise EvolveRefused(str(exc)) from None


def _code_of(call: dict[str, Any]) -> str:
    try:
        args = json.loads(call["arguments"])
    except json.JSONDecodeError:
        raise EvolveRefused("the evolve arguments are not valid JSON") from None
    if not isinstance(args, dict) or set(args) != {"code"} or not isinstance(args["code"], str):
        raise EvolveRefused('evolve takes exactly one argument, {"code": "<function body>"}')
    return args["code"]


# what an applied program's call holds once its text has left the context (``keep_code=False``)
APPLIED_CODE = json.dumps({"code": "(applied)"})


def _receipt(call_id: str, body: dict[str, Any]) -> FunctionCallOutput:
    return {"type": "function_call_output", "call_id": call_id, "output": json.dumps(body)}


def apply_evolve(
    state: State,
    limits: EvolveLimits | None = None,
    *,
    renderer: Renderer | None = None,
    call_tokens: int | None = None,
    output_weight: float = 1.0,
    before_ids: list[int] | None = None,
    keep_code: bool = True,
) -> EvolveResult:
    """Execute the in-flight ``evolve`` call that ends ``state``.

    Returns the State to continue from (the new one on success, the original on failure) with the
    receipt appended. ``call_tokens`` is the number of tokens the model generated for the call;
    when omitted and a renderer is given, the call's text is tokenised to count them.
    ``before_ids`` (the previous prompt ids + the call's completion ids, which the agent loop
    already holds) saves rendering the old State again.
    ``keep_code=False`` replaces an applied program's text by :data:`APPLIED_CODE` in the State
    to continue from, so that later inputs do not carry it (the receipt stays; the measured
    "after" is that State, so the stub's tokens count in the Cache Cost). A refused program's
    text stays, for the model to see what its receipt's error refers to.
    A State that does not end in an evolve call, or is invalid, is a caller bug and raises.
    """
    limits = limits or EvolveLimits()
    if (
        not state
        or state[-1].get("type") != "function_call"
        or state[-1].get("name") != EVOLVE_TOOL
    ):
        raise ValueError("apply_evolve needs a State whose last item is the in-flight evolve call")
    validate(state)
    original = copy.deepcopy(state)
    call = original[-1]
    timings: dict[str, float] = {}
    try:
        new_state = _execute(original, call, limits, timings)
        error = None
    except EvolveRefused as exc:
        new_state, error = original, str(exc)

    if error is None and not keep_code:
        new_state = [*new_state[:-1], {**call, "arguments": APPLIED_CODE}]
    if error is None:
        body: dict[str, Any] = {"applied": True}
        if renderer is not None:
            t = time.perf_counter()
            body.update(
                _measure(original, new_state, renderer, call_tokens, output_weight, before_ids)
            )
            timings["measure"] = time.perf_counter() - t
    else:
        body = {"applied": False, "error": error}
    # new_state was validated with its evolve call in flight; the receipt answers exactly that
    # call, so the result is valid without walking the whole State a second time
    final = [*new_state, _receipt(call["call_id"], body)]
    return EvolveResult(error is None, error, final, body, timings)


def _execute(
    state: State, call: dict[str, Any], limits: EvolveLimits, timings: dict[str, float]
) -> State:
    code = _code_of(call)
    if len(code.encode()) > limits.code_bytes:
        raise EvolveRefused(
            f"the code is {len(code.encode()):,} bytes; the limit is {limits.code_bytes:,}"
        )
    t = time.perf_counter()
    state_json = json.dumps(state, ensure_ascii=False)
    timings["json_in"] = time.perf_counter() - t
    if len(state_json.encode()) > limits.state_bytes:
        raise EvolveRefused(f"the State is over the {limits.state_bytes:,}-byte limit")
    t = time.perf_counter()
    out_json = run_js(state_json, code, limits)
    timings["quickjs"] = time.perf_counter() - t
    if len(out_json.encode()) > limits.state_bytes:
        raise EvolveRefused(f"the returned State is over the {limits.state_bytes:,}-byte limit")
    t = time.perf_counter()
    new_state = json.loads(out_json)
    timings["json_out"] = time.perf_counter() - t
    t = time.perf_counter()
    try:
        validate(new_state)
    except StateError as exc:
        raise EvolveRefused(f"the returned State is invalid: {exc}") from None
    finally:
        timings["validate"] = time.perf_counter() - t
    if not new_state or new_state[-1] != call:
        raise EvolveRefused("the evolve call must stay the last item, unchanged")
    return new_state


def _measure(
    before: State,
    after: State,
    renderer: Renderer,
    call_tokens: int | None,
    output_weight: float,
    before_ids: list[int] | None,
) -> dict[str, Any]:
    from acmrl.context.render import format_tool_call

    call = before[-1]
    if before_ids is None:
        before_ids = renderer.ids(before, add_generation_prompt=False)
    after_ids = renderer.ids(after, add_generation_prompt=False)
    if call_tokens is None:
        call_tokens = renderer.count(format_tool_call(call["name"], call["arguments"]))
    prefix = reusable_prefix(before_ids, after_ids)
    cost = len(after_ids) - prefix  # cache_cost, without a second scan
    return {
        "tokens_before": len(before_ids),
        "tokens_after": len(after_ids),
        "reusable_prefix": prefix,
        "cache_cost": cost,
        "call_tokens": call_tokens,
        "compaction_cost": compaction_cost(call_tokens, cost, output_weight),
    }


def evolve_call(call_id: str, code: str) -> dict[str, Any]:
    """The function_call item for an evolve with ``code`` (handy for tests and teachers)."""
    return {
        "type": "function_call",
        "call_id": call_id,
        "name": EVOLVE_TOOL,
        "arguments": json.dumps({"code": code}),
    }


# The tool's description and the system prompt's State suffix, in three sizes
# (``agent.evolve_prompt``): ``full`` gives the item types and the rules (the Self-Evolving
# Agents write-up, chapter 4), ``brief`` the item shapes in one line, ``none`` only that the
# context is an array of items, for a student that has learnt the rest.
EVOLVE_DESCRIPTIONS = {
    "full": (
        "Edit your own working memory. `code` is the body of a JavaScript function that receives "
        "`state` (the structured form of the context you see, described in the system message) "
        "and returns the new State. Keep, drop, shorten, move, merge or annotate items; keep this "
        "evolve call as the last item, unchanged. The code runs isolated with small time and "
        "memory limits; an invalid result is rejected and your memory stays as it was. Edits "
        "cost tokens: the context after the first changed token is processed again, so prefer "
        "edits near the end and keep material you still need exactly as it is."
    ),
    "brief": (
        "Edit your working memory: `code` is a JavaScript function body that gets `state` and "
        "returns the new State, with this call last and unchanged; an invalid result is "
        "rejected. Edits near the end cost least; keep what you still need verbatim."
    ),
    "none": "Edit your working memory: `code` is a JavaScript body from `state` to the new State.",
}


def evolve_tool_schema(prompt: str = "full") -> dict[str, Any]:
    """The ``evolve`` tool's schema with the description of size ``prompt``."""
    return {
        "type": "function",
        "function": {
            "name": EVOLVE_TOOL,
            "description": EVOLVE_DESCRIPTIONS[prompt],
            "parameters": {
                "type": "object",
                "properties": {
                    "code": {
                        "type": "string",
                        "description": "JavaScript function body: (state) => newState, synchronous",
                    }
                },
                "required": ["code"],
                "additionalProperties": False,
            },
        },
    }


EVOLVE_TOOL_SCHEMA: dict[str, Any] = evolve_tool_schema("full")

# Appended to the system prompt of the evolve arm: the State's structure, so that the model can
# write code against what it sees (the Self-Evolving Agents write-up, chapter 4).
STATE_PROMPTS = {
    "full": """\
The conversation after this system message is your working memory, which you manage yourself with
the `evolve` tool. It may already contain your earlier edits. It corresponds to this structure:

type TextPart = { type: "input_text" | "output_text"; text: string };
type Item =
  | { type: "message"; role: "user"; content: TextPart[] }        // parts are "input_text"
  | { type: "message"; role: "assistant"; content: TextPart[] }   // parts are "output_text"
  | { type: "function_call"; call_id: string; name: string; arguments: string } // JSON text
  | { type: "function_call_output"; call_id: string; output: string | TextPart[] };
type State = Item[];

Every function_call is answered by exactly one function_call_output with the same call_id, before
the next message. When you edit, keep what later work needs and minimise the Compaction Cost.""",
    "brief": """\
The conversation after this system message is your working memory, which you edit with `evolve`:
a State, an array of items {type: "message", role, content: [{type, text}]}, {type:
"function_call", call_id, name, arguments} and {type: "function_call_output", call_id, output}.""",
    "none": "The conversation after this system message is your working memory, an array of items.",
}
