"""The State: the agent's editable working memory, as an ordered list of JSON items.

Items follow the OpenAI Responses API input shape (docs/design.md):

- ``{"type": "message", "role": "user" | "assistant", "content": [{"type": "input_text" |
  "output_text", "text": ...}, ...]}`` (user parts are ``input_text``, assistant parts ``output_text``)
- ``{"type": "function_call", "call_id": ..., "name": ..., "arguments": "<JSON object as a string>"}``
- ``{"type": "function_call_output", "call_id": ..., "output": str | [{"type": "input_text", "text": ...}]}``

System instructions and tool definitions are not part of the State. Because model-written code can
rewrite the State (``evolve``), :func:`validate` is the gate every State passes before it is
installed: it checks JSON-compatibility and the tool-call relationships, and names the item index
and the rule that failed.
"""

from __future__ import annotations

import json
import math
from typing import Any, Literal, TypedDict

MAX_DEPTH = 100
EVOLVE_TOOL = "evolve"


class TextPart(TypedDict):
    type: Literal["input_text", "output_text"]
    text: str


class Message(TypedDict):
    type: Literal["message"]
    role: Literal["user", "assistant"]
    content: list[TextPart]


class FunctionCall(TypedDict):
    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str


class FunctionCallOutput(TypedDict):
    type: Literal["function_call_output"]
    call_id: str
    output: str | list[TextPart]


Item = Message | FunctionCall | FunctionCallOutput
State = list[Item]


class StateError(ValueError):
    """A State breaks a rule. ``index`` is the offending item (None for the State as a whole)."""

    def __init__(self, rule: str, detail: str, index: int | None = None):
        self.rule, self.detail, self.index = rule, detail, index
        where = f"item {index}" if index is not None else "state"
        super().__init__(f"{where}: {rule}: {detail}")


# ---------------------------------------------------------------------------------------------
# constructors


def user(text: str) -> Message:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def assistant(text: str) -> Message:
    return {
        "type": "message",
        "role": "assistant",
        "content": [{"type": "output_text", "text": text}],
    }


def function_call(call_id: str, name: str, arguments: dict[str, Any] | str) -> FunctionCall:
    args = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    return {"type": "function_call", "call_id": call_id, "name": name, "arguments": args}


def function_call_output(call_id: str, output: str | list[TextPart]) -> FunctionCallOutput:
    return {"type": "function_call_output", "call_id": call_id, "output": output}


def message_text(item: Message) -> str:
    """The text of a message, parts joined by newlines."""
    return "\n".join(part["text"] for part in item["content"])


def output_text(item: FunctionCallOutput) -> str:
    """The text of a tool output, parts joined by newlines."""
    out = item["output"]
    return out if isinstance(out, str) else "\n".join(part["text"] for part in out)


# ---------------------------------------------------------------------------------------------
# validation


def check_json(value: Any, index: int | None = None, depth: int = 0) -> None:
    """Reject anything that does not survive a JSON round trip unchanged.

    Only dict (string keys), list, str, finite int/float, bool and None pass; nesting is bounded,
    which also stops cyclic structures.
    """
    if depth > MAX_DEPTH:
        raise StateError("json", f"nesting exceeds {MAX_DEPTH} levels", index)
    if value is None or isinstance(value, str | bool | int):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise StateError("json", f"non-finite number {value!r}", index)
        return
    if isinstance(value, list):
        for child in value:
            check_json(child, index, depth + 1)
        return
    if type(value) is dict:
        for key, child in value.items():
            if not isinstance(key, str):
                raise StateError("json", f"non-string key {key!r}", index)
            check_json(child, index, depth + 1)
        return
    raise StateError("json", f"{type(value).__name__} is not JSON data", index)


_KEYS = {
    "message": {"type", "role", "content"},
    "function_call": {"type", "call_id", "name", "arguments"},
    "function_call_output": {"type", "call_id", "output"},
}
_PART_TYPE = {"user": "input_text", "assistant": "output_text"}


def _nonempty_str(value: Any, what: str, index: int) -> None:
    if not isinstance(value, str) or not value:
        raise StateError("field", f"{what} must be a non-empty string, got {value!r}", index)


def _check_parts(parts: Any, part_type: str, what: str, index: int) -> None:
    if not isinstance(parts, list) or not parts:
        raise StateError("content", f"{what} must be a non-empty list of parts", index)
    for j, part in enumerate(parts):
        if not isinstance(part, dict) or set(part) != {"type", "text"}:
            raise StateError("content", f"{what}[{j}] must be {{type, text}}, got {part!r}", index)
        if part["type"] != part_type:
            raise StateError(
                "content", f"{what}[{j}].type must be {part_type!r}, got {part['type']!r}", index
            )
        if not isinstance(part["text"], str):
            raise StateError("content", f"{what}[{j}].text must be a string", index)


def _check_item(item: Any, index: int) -> None:
    if not isinstance(item, dict):
        raise StateError("item", f"items are objects, got {type(item).__name__}", index)
    kind = item.get("type")
    if kind not in _KEYS:
        raise StateError(
            "type", f"unknown item type {kind!r}; expected one of {sorted(_KEYS)}", index
        )
    extra = set(item) - _KEYS[kind]
    missing = _KEYS[kind] - set(item)
    if extra or missing:
        raise StateError(
            "fields",
            f"{kind} has missing {sorted(missing)} / unexpected {sorted(extra)} fields",
            index,
        )
    if kind == "message":
        role = item["role"]
        if role not in _PART_TYPE:
            raise StateError("role", f"role must be 'user' or 'assistant', got {role!r}", index)
        _check_parts(item["content"], _PART_TYPE[role], "content", index)
        if not any(part["text"].strip() for part in item["content"]):
            raise StateError("content", "message text is empty", index)
    elif kind == "function_call":
        _nonempty_str(item["call_id"], "call_id", index)
        _nonempty_str(item["name"], "name", index)
        if not isinstance(item["arguments"], str):
            raise StateError("arguments", "arguments must be a JSON string", index)
        try:
            args = json.loads(item["arguments"])
        except json.JSONDecodeError as exc:
            raise StateError(
                "arguments", f"arguments are not valid JSON ({exc.msg})", index
            ) from None
        if not isinstance(args, dict):
            raise StateError("arguments", "arguments must decode to a JSON object", index)
    else:
        _nonempty_str(item["call_id"], "call_id", index)
        out = item["output"]
        if not isinstance(out, str):
            _check_parts(out, "input_text", "output", index)


def validate(state: Any, *, allow_pending_evolve: bool = True) -> None:
    """Raise :class:`StateError` unless ``state`` is a valid State.

    Rules: JSON-compatible values only; known item types and roles with exactly their fields;
    non-empty content; ``arguments`` a JSON string of an object; unique ``call_id``s; every call
    answered by exactly one output that follows it, before any further message; no orphan or
    duplicate outputs. The single exception is an ``evolve`` call that is the last item: it is
    in flight while its code runs (disallowed with ``allow_pending_evolve=False``).
    """
    if not isinstance(state, list):
        raise StateError("state", f"a State is a list of items, got {type(state).__name__}")
    calls: dict[str, int] = {}
    answered: set[str] = set()
    pending: dict[str, int] = {}
    for index, item in enumerate(state):
        check_json(item, index)
        _check_item(item, index)
        kind = item["type"]
        if kind == "message" and pending:
            first = next(iter(pending))
            raise StateError(
                "unanswered-call",
                f"call {first!r} (item {pending[first]}) has no output before this message",
                index,
            )
        if kind == "function_call":
            call_id = item["call_id"]
            if call_id in calls:
                raise StateError(
                    "duplicate-call-id",
                    f"call_id {call_id!r} already used by item {calls[call_id]}",
                    index,
                )
            calls[call_id] = index
            pending[call_id] = index
        elif kind == "function_call_output":
            call_id = item["call_id"]
            if call_id in answered:
                raise StateError("duplicate-output", f"call {call_id!r} is already answered", index)
            if call_id not in pending:
                raise StateError("orphan-output", f"no earlier call has call_id {call_id!r}", index)
            del pending[call_id]
            answered.add(call_id)
    if pending:
        call_id, index = next(iter(pending.items()))
        in_flight = (
            allow_pending_evolve
            and len(pending) == 1
            and index == len(state) - 1
            and state[index]["name"] == EVOLVE_TOOL
        )
        if not in_flight:
            raise StateError("unanswered-call", f"call {call_id!r} has no output", index)
