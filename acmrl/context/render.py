"""Rendering a State to token ids, and parsing a completion back into text and tool calls.

acmrl is token-in/token-out: it renders every prompt itself and parses every completion itself,
so the ids it counts (budget, reusable prefix, training samples) are exactly the ids the engine
sees. Rendering goes State -> chat messages -> chat template -> text -> ids. The chat template is
the model's own when it renders tool calls in the Hermes ``<tool_call>`` form (Qwen-family
models); otherwise acmrl's ``templates/chatml_tools.jinja``, which shares ChatML's special
tokens with SmolLM2 and Qwen.

A tool call in a completion is ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``.
:func:`parse_completion` never raises on model output: malformed calls (bad JSON, unknown tool,
missing, extra or mistyped arguments, an unterminated block) come back as :class:`CallError` for
the agent loop to turn into an observation.
"""

from __future__ import annotations

import contextlib
import json
import re
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Any

from acmrl.context.state import Item, State

TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"
_CALL_RE = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


@cache
def acmrl_chat_template() -> str:
    """acmrl's ChatML + Hermes-tools chat template (also written into exported tokenizers)."""
    return resources.files("acmrl").joinpath("templates/chatml_tools.jinja").read_text()


# ---------------------------------------------------------------------------------------------
# State <-> chat messages


def _content(parts: list[dict[str, Any]], collapse: bool = True) -> str | list[dict[str, str]]:
    if collapse and len(parts) == 1:
        return parts[0]["text"]
    return [{"type": "text", "text": p["text"]} for p in parts]


def _parts(content: str | list[dict[str, Any]], part_type: str) -> list[dict[str, str]]:
    if isinstance(content, str):
        return [{"type": part_type, "text": content}]
    return [{"type": part_type, "text": p["text"]} for p in content]


def state_to_messages(state: State) -> list[dict[str, Any]]:
    """Chat messages for a State: an assistant message absorbs the function calls that follow it."""
    messages: list[dict[str, Any]] = []
    for item in state:
        kind = item["type"]
        if kind == "message":
            messages.append({"role": item["role"], "content": _content(item["content"])})
        elif kind == "function_call":
            last = messages[-1] if messages else None
            if last is None or last["role"] != "assistant":
                last = {"role": "assistant", "content": ""}
                messages.append(last)
            call = {"name": item["name"], "arguments": item["arguments"]}
            last.setdefault("tool_calls", []).append(
                {"id": item["call_id"], "type": "function", "function": call}
            )
        else:
            out = item["output"]
            # a tool output may be a string or a list of parts; the messages keep which it was
            content = out if isinstance(out, str) else _content(out, collapse=False)
            messages.append({"role": "tool", "tool_call_id": item["call_id"], "content": content})
    return messages


def messages_to_state(messages: list[dict[str, Any]]) -> State:
    """The inverse of :func:`state_to_messages` (system messages are not State and are refused)."""
    state: list[Item] = []
    for m in messages:
        role = m["role"]
        if role in ("user", "assistant"):
            if m.get("content"):
                part = "input_text" if role == "user" else "output_text"
                state.append(
                    {"type": "message", "role": role, "content": _parts(m["content"], part)}
                )
            for call in m.get("tool_calls") or []:
                fn = call["function"]
                args = fn["arguments"]
                if not isinstance(args, str):
                    args = json.dumps(args, ensure_ascii=False)
                state.append(
                    {
                        "type": "function_call",
                        "call_id": call["id"],
                        "name": fn["name"],
                        "arguments": args,
                    }
                )
        elif role == "tool":
            content = m["content"]
            out = content if isinstance(content, str) else _parts(content, "input_text")
            state.append(
                {"type": "function_call_output", "call_id": m["tool_call_id"], "output": out}
            )
        else:
            raise ValueError(f"message role {role!r} has no State item")
    return state


# ---------------------------------------------------------------------------------------------
# rendering to text and ids


def renders_hermes_tools(tokenizer: Any) -> bool:
    """Whether the tokenizer's own chat template renders tools and ``<tool_call>`` blocks."""
    if not getattr(tokenizer, "chat_template", None):
        return False
    probe = [
        {"role": "user", "content": "probe"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "type": "function",
                    "function": {"name": "probe_tool", "arguments": {"probe_arg": 7}},
                }
            ],
        },
    ]
    tools = [tool_schema("probe_tool", "a probe", {"probe_arg": {"type": "integer"}})]
    try:
        text = tokenizer.apply_chat_template(probe, tools=tools, tokenize=False)
    except Exception:  # any template failure means "cannot render tools"
        return False
    return (
        TOOL_CALL_OPEN in text
        and '"probe_arg": 7' in text
        and "probe_tool" in text.split(TOOL_CALL_OPEN)[0]
    )


@dataclass
class Renderer:
    """Renders States to the exact text and token ids a model sees.

    ``system_prompt`` and ``tools`` (OpenAI function schemas) are fixed per episode and sit
    outside the editable State, as the Self-Evolving Agents write-up prescribes.
    """

    tokenizer: Any
    system_prompt: str | None = None
    tools: list[dict[str, Any]] = field(default_factory=list)
    chat_template: str | None = None

    def __post_init__(self) -> None:
        if self.chat_template is None:
            own = renders_hermes_tools(self.tokenizer)
            self.chat_template = self.tokenizer.chat_template if own else acmrl_chat_template()
        self._own_args_as_dict = self.chat_template != acmrl_chat_template()
        self._pieces = PieceCache(self.tokenizer)

    def messages(self, state: State) -> list[dict[str, Any]]:
        msgs = state_to_messages(state)
        if self._own_args_as_dict:  # HF-style templates expect arguments as a mapping
            for m in msgs:
                for call in m.get("tool_calls", []):
                    call["function"]["arguments"] = json.loads(call["function"]["arguments"])
        if self.system_prompt:
            msgs.insert(0, {"role": "system", "content": self.system_prompt})
        return msgs

    def text(self, state: State, add_generation_prompt: bool = True) -> str:
        if self.chat_template == acmrl_chat_template():  # its Python twin, ~10x faster
            return chatml_tools_text(self.messages(state), self.tools, add_generation_prompt)
        return self.tokenizer.apply_chat_template(
            self.messages(state),
            tools=self.tools or None,
            chat_template=self.chat_template,
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
        )

    def ids(self, state: State, add_generation_prompt: bool = True) -> list[int]:
        """The complete model input, system prompt and tool definitions included."""
        return self.encode(self.text(state, add_generation_prompt))

    def encode(self, text: str) -> list[int]:
        """``tokenizer.encode(text, add_special_tokens=False)``, id for id, tokenising only the
        pieces between special tokens that this renderer has not seen (:class:`PieceCache`)."""
        return self._pieces.encode(text)

    def count(self, text: str) -> int:
        return len(self.encode(text))


def _text(content: str | list[dict[str, Any]]) -> str:
    return content if isinstance(content, str) else "\n".join(p["text"] for p in content)


@cache
def _tools_header(tools_json: str) -> str:
    lines = "".join("\n" + json.dumps(t, ensure_ascii=False) for t in json.loads(tools_json))
    return (
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
        + lines
        + "\n</tools>\n\nFor each function call, return a json object with function name and "
        "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
        '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
    )


def chatml_tools_text(
    messages: list[dict[str, Any]], tools: list[dict[str, Any]], add_generation_prompt: bool
) -> str:
    """What ``templates/chatml_tools.jinja`` renders, in Python (the template costs ~4 ms per
    100 KB of context through jinja; this ~0.3 ms). tests/test_render.py checks that the two
    agree character for character on random States."""
    out: list[str] = []
    has_system = bool(messages) and messages[0]["role"] == "system"
    if has_system or tools:
        out.append("<|im_start|>system\n")
        if has_system:
            out.append(_text(messages[0]["content"]))
        if tools:
            if has_system:
                out.append("\n\n")
            out.append(_tools_header(json.dumps(tools, ensure_ascii=False)))
        out.append("<|im_end|>\n")
    n = len(messages)
    for i, m in enumerate(messages):
        role = m["role"]
        if role == "system":
            if i:
                raise ValueError("a system message must come first")
        elif role == "user":
            out += ("<|im_start|>user\n", _text(m["content"]), "<|im_end|>\n")
        elif role == "assistant":
            out.append("<|im_start|>assistant\n")
            body = _text(m["content"]) if m.get("content") else ""
            out.append(body)
            for k, call in enumerate(m.get("tool_calls") or []):
                fn = call.get("function", call)
                if body or k:
                    out.append("\n")
                args = fn["arguments"]
                if not isinstance(args, str):
                    args = json.dumps(args, ensure_ascii=False)
                name = json.dumps(fn["name"], ensure_ascii=False)
                out += ('<tool_call>\n{"name": ', name, ', "arguments": ', args, "}\n</tool_call>")
            out.append("<|im_end|>\n")
        elif role == "tool":
            if i == 0 or messages[i - 1]["role"] != "tool":
                out.append("<|im_start|>user")
            out += ("\n<tool_response>\n", _text(m["content"]), "\n</tool_response>")
            if i == n - 1 or messages[i + 1]["role"] != "tool":
                out.append("<|im_end|>\n")
        else:
            raise ValueError(f"unknown role {role}")
    if add_generation_prompt:
        out.append("<|im_start|>assistant\n")
    return "".join(out)


class PieceCache:
    """Token ids of a text from cached pieces: a turn tokenises only what changed.

    A Hugging Face tokenizer cuts its input at every added token (``<|im_start|>``,
    ``<|im_end|>``, ...) before the model's own pre-tokenizer and BPE see it, so the ids of a
    text are the ids of its pieces between added tokens, concatenated with the added tokens' own
    ids. Every chat message is such a piece, so the rendered input of the next turn differs from
    the last one's by a few pieces (the new messages, the items an edit changed); their ids are
    kept here, keyed by the piece's text, in a bounded LRU cache. Where that cut is not exact,
    every text is tokenised whole (``exact`` is False): a slow (Python) tokenizer, an added
    token that strips the whitespace beside it or matches single words only, or a normaliser
    (it could rewrite text across a cut). tests/test_render.py checks the identity on random
    States for the embedded tokenizer and the shipped chat templates.
    """

    def __init__(self, tokenizer: Any, max_chars: int = 8_000_000) -> None:
        from collections import OrderedDict

        self.tokenizer = tokenizer
        self.max_chars = max_chars
        self.cache: OrderedDict[str, list[int]] = OrderedDict()
        self.chars = 0
        self.hits = self.misses = 0
        added = dict(getattr(tokenizer, "added_tokens_decoder", {}) or {})
        backend = getattr(tokenizer, "backend_tokenizer", None)
        self.exact = (
            bool(added)
            and backend is not None
            and backend.normalizer is None
            and not any(t.lstrip or t.rstrip or t.single_word for t in added.values())
        )
        self.added = {t.content: i for i, t in added.items()}
        longest_first = sorted(self.added, key=len, reverse=True)
        self.cut = (
            re.compile("(" + "|".join(map(re.escape, longest_first)) + ")") if added else None
        )

    def _whole(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def encode(self, text: str) -> list[int]:
        if not self.exact:
            return self._whole(text)
        ids: list[int] = []
        for n, piece in enumerate(self.cut.split(text)):
            if n % 2:  # the split's captured groups: added tokens
                ids.append(self.added[piece])
            elif piece:
                ids += self._piece(piece)
        return ids

    def _piece(self, piece: str) -> list[int]:
        got = self.cache.get(piece)
        if got is not None:
            self.cache.move_to_end(piece)
            self.hits += 1
            return got
        self.misses += 1
        got = self._whole(piece)
        self.cache[piece] = got
        self.chars += len(piece)
        while self.chars > self.max_chars and len(self.cache) > 1:
            old, _ = self.cache.popitem(last=False)
            self.chars -= len(old)
        return got


# ---------------------------------------------------------------------------------------------
# tool schemas, tool-call text, and parsing completions


def tool_schema(
    name: str, description: str, properties: dict[str, Any], required: list[str] | None = None
) -> dict[str, Any]:
    """An OpenAI function-tool schema; every property is required unless ``required`` says otherwise."""
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": properties,
                "required": list(properties) if required is None else required,
                "additionalProperties": False,
            },
        },
    }


def format_tool_call(name: str, arguments: str | dict[str, Any]) -> str:
    """The text of one tool call as the model writes it (and as acmrl's template renders it)."""
    args = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    return f'{TOOL_CALL_OPEN}\n{{"name": {json.dumps(name, ensure_ascii=False)}, "arguments": {args}}}\n{TOOL_CALL_CLOSE}'


def render_turn(text: str, calls: list[tuple[str, dict[str, Any]]]) -> str:
    """An assistant turn's text: the prose, then each call on its own lines."""
    pieces = [text] if text else []
    pieces += [format_tool_call(name, args) for name, args in calls]
    return "\n".join(pieces)


@dataclass
class ToolCall:
    name: str
    arguments: dict[str, Any]
    # where the call's <tool_call> block sits in the completion text (characters): the agent
    # counts the tokens the model generated for it from this
    span: tuple[int, int] = field(default=(0, 0), compare=False)
    tokens: int = field(default=0, compare=False)  # those tokens (set by the agent loop)


@dataclass
class CallError:
    """A tool call the model attempted that cannot run. ``kind`` is a short machine-readable tag."""

    index: int
    kind: str
    message: str
    raw: str

    def observation(self) -> str:
        return f"Error in tool call {self.index + 1}: {self.message}"


@dataclass
class ParsedTurn:
    text: str
    calls: list[ToolCall]
    errors: list[CallError]

    @property
    def ok(self) -> bool:
        return not self.errors


_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "object": (dict,),
    "array": (list,),
    "null": (type(None),),
}


def _type_ok(value: Any, expected: str | list[str] | None) -> bool:
    if expected is None:
        return True
    names = [expected] if isinstance(expected, str) else expected
    for name in names:
        types = _JSON_TYPES.get(name, (object,))
        if isinstance(value, bool) and name in ("integer", "number"):
            continue
        if isinstance(value, types):
            return True
    return False


def _schemas_by_name(tools: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    out = {}
    for tool in tools:
        fn = tool.get("function", tool)
        out[fn["name"]] = fn.get("parameters") or {"type": "object", "properties": {}}
    return out


def check_arguments(
    name: str, args: dict[str, Any], params: dict[str, Any]
) -> tuple[str, str] | None:
    """Check ``args`` against a tool's JSON-schema ``params``; ``(kind, message)`` when they do not fit."""
    props = params.get("properties", {})
    missing = [k for k in params.get("required", []) if k not in args]
    if missing:
        return "missing-argument", f"{name} is missing argument(s) {missing}"
    extra = [k for k in args if k not in props]
    if extra and params.get("additionalProperties", True) is False:
        return "extra-argument", f"{name} takes no argument(s) {extra}; it takes {sorted(props)}"
    for key, value in args.items():
        if key in props and not _type_ok(value, props[key].get("type")):
            want = props[key].get("type")
            shown = repr(value)
            shown = shown if len(shown) <= 80 else f"{shown[:60]}... ({len(shown)} characters)"
            return "bad-argument-type", f"{name}.{key} must be of type {want}, got {shown}"
    return None


def _loads(raw: str) -> Any:
    """``json.loads`` whose every failure is a :class:`ValueError` with a short reason: bad JSON,
    nesting deeper than the decoder's recursion limit, an integer past Python's digit limit."""
    try:
        return json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{exc.msg} at char {exc.pos}") from None
    except RecursionError:
        raise ValueError("nested too deeply") from None
    except ValueError as exc:  # e.g. an integer literal of thousands of digits
        raise ValueError(str(exc).split(";")[0][:120]) from None


def _check_call(index: int, raw: str, schemas: dict[str, dict[str, Any]]) -> ToolCall | CallError:
    try:
        obj = _loads(raw)
    except ValueError as exc:
        return CallError(index, "bad-json", f"the call is not valid JSON ({exc})", raw)
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return CallError(index, "bad-call", 'a call must be {"name": ..., "arguments": {...}}', raw)
    name = obj["name"]
    if name not in schemas:
        known = ", ".join(sorted(schemas)) or "none"
        return CallError(
            index, "unknown-tool", f"unknown tool {name!r}; available tools: {known}", raw
        )
    args = obj.get("arguments", {})
    if isinstance(args, str):  # some models emit the arguments as a JSON string
        with contextlib.suppress(ValueError):  # not JSON: refused just below
            args = _loads(args)
    if not isinstance(args, dict):
        return CallError(index, "bad-arguments", f"arguments of {name} must be a JSON object", raw)
    extra_keys = set(obj) - {"name", "arguments"}
    if extra_keys:
        return CallError(
            index, "bad-call", f"unexpected keys {sorted(extra_keys)} in the call", raw
        )
    problem = check_arguments(name, args, schemas[name])
    if problem is not None:
        return CallError(index, problem[0], problem[1], raw)
    return ToolCall(name, args)


def text_call(text: str, tools: list[dict[str, Any]]) -> CallError | None:
    """A tool call written as plain text, ``name({...})`` for one of ``tools``, as a
    :class:`CallError` (kind ``call-as-text``); None when the text names none.

    Used by ``agent.text_call_rule``: such a reply is not an answer, so the agent is told how a
    call is written instead of having its episode ended with the call as its answer.

    >>> tools = [{"type": "function", "function": {"name": "open", "parameters": {}}}]
    >>> text_call('My summary says what I do next: open({"doc_id": "kb-00028"})', tools).message
    'open({...}) written as text runs nothing; a call is <tool_call>{"name": "open", "arguments": {...}}</tool_call>'
    >>> text_call("The Jade Lark Exhibition (open to all)", tools) is None
    True
    """
    names = sorted(_schemas_by_name(tools), key=len, reverse=True)
    if not names:
        return None
    match = re.search(rf"\b({'|'.join(map(re.escape, names))})\s*\(\s*\{{", text)
    if match is None:
        return None
    name = match.group(1)
    return CallError(
        0,
        "call-as-text",
        f"{name}({{...}}) written as text runs nothing; a call is "
        f'{TOOL_CALL_OPEN}{{"name": "{name}", "arguments": {{...}}}}{TOOL_CALL_CLOSE}',
        text[match.start() : match.start() + 200],
    )


def parse_completion(text: str, tools: list[dict[str, Any]]) -> ParsedTurn:
    """Split a completion into prose and tool calls; malformed calls become :class:`CallError`."""
    schemas = _schemas_by_name(tools)
    calls: list[ToolCall] = []
    errors: list[CallError] = []
    prose: list[str] = []
    pos = 0
    index = 0
    for match in _CALL_RE.finditer(text):
        prose.append(text[pos : match.start()])
        pos = match.end()
        result = _check_call(index, match.group(1).strip(), schemas)
        if isinstance(result, ToolCall):
            result.span = match.span()
            calls.append(result)
        else:
            errors.append(result)
        index += 1
    tail = text[pos:]
    if TOOL_CALL_OPEN in tail:
        before, _, raw = tail.partition(TOOL_CALL_OPEN)
        prose.append(before)
        errors.append(
            CallError(index, "unterminated", f"a {TOOL_CALL_OPEN} block was not closed", raw)
        )
    else:
        prose.append(tail)
    return ParsedTurn("\n".join(p.strip() for p in prose if p.strip()), calls, errors)
