import json
import string

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from acmrl.context.render import (
    Renderer,
    acmrl_chat_template,
    format_tool_call,
    messages_to_state,
    parse_completion,
    render_turn,
    renders_hermes_tools,
    state_to_messages,
    tool_schema,
)
from acmrl.context.state import assistant, function_call, function_call_output, user, validate

SEARCH = tool_schema("search", "search the corpus", {"query": {"type": "string"}})
OPEN = tool_schema(
    "open",
    "open a document",
    {"doc_id": {"type": "string"}, "page": {"type": "integer"}},
    ["doc_id"],
)
FREE = {
    "type": "function",
    "function": {"name": "free", "parameters": {"type": "object", "properties": {}}},
}
TOOLS = [SEARCH, OPEN, FREE]

# (no subnormal floats: earlier tests turn on torch.set_flush_denormal, which hypothesis detects)
# prose the model might write: no markup characters, so it cannot spell a tag or special token
prose = st.text(alphabet=string.ascii_letters + string.digits + " .,;:!?'-()\n", max_size=60).map(
    str.strip
)


# a string that spells a tool-call tag is left out: generation stops at </tool_call> (the
# sampling stop string), so no completion holds one inside a call, and the parser cuts a call at
# its first closing tag as the engine does (hypothesis draws such strings from the code's own
# constants)
def no_tag(n: int) -> st.SearchStrategy[str]:
    return st.text(max_size=n).filter(lambda t: "tool_call>" not in t)


json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(10**9), 10**9)
    | no_tag(12)
    | st.floats(allow_nan=False, allow_infinity=False, allow_subnormal=False, width=32)
)
json_values = st.recursive(
    json_scalars,
    lambda c: st.lists(c, max_size=3) | st.dictionaries(no_tag(6), c, max_size=3),
    max_leaves=8,
)
arguments = st.dictionaries(no_tag(8).filter(bool), json_values, max_size=4)
calls = st.lists(st.tuples(st.just("free"), arguments), max_size=3)


@given(text=prose, calls=calls)
@settings(max_examples=200)
def test_parse_inverts_render_turn(text, calls):
    parsed = parse_completion(render_turn(text, calls), TOOLS)
    assert parsed.ok
    assert parsed.text == text
    assert [(c.name, c.arguments) for c in parsed.calls] == calls


@st.composite
def states(draw):
    """Valid States: user turns, assistant turns with parallel calls, and their outputs."""
    state = [user(draw(prose.filter(bool)))]
    n = 0
    for _ in range(draw(st.integers(0, 4))):
        if draw(st.booleans()):
            state.append(assistant(draw(prose.filter(bool))))
        k = draw(st.integers(0, 2))
        ids = [f"c{n + i}" for i in range(k)]
        n += k
        for cid in ids:
            state.append(function_call(cid, "free", draw(arguments)))
        for cid in ids:
            if draw(st.booleans()):
                out = draw(prose)
            else:
                texts = draw(st.lists(prose, min_size=1, max_size=3))
                out = [{"type": "input_text", "text": t} for t in texts]
            state.append(function_call_output(cid, out))
        if draw(st.booleans()):
            state.append(user(draw(prose.filter(bool))))
    validate(state)
    return state


@given(state=states())
@settings(max_examples=150)
def test_messages_round_trip(state):
    assert messages_to_state(state_to_messages(state)) == state


@given(prefix=states(), text=prose, calls=calls)
@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
def test_completion_then_history_renders_identically(tokenizer, prefix, text, calls):
    """Token-in/token-out: prompt + what the model wrote == the render of the updated State."""
    assume(text or calls)
    # an assistant message directly followed by calls is one turn in the Responses shape, so the
    # agent loop never generates right after an assistant message (it ends or a user speaks)
    assume(prefix[-1]["role" if prefix[-1]["type"] == "message" else "type"] != "assistant")
    r = Renderer(tokenizer, system_prompt="You are an agent.", tools=TOOLS)
    completion = render_turn(text, calls)
    parsed = parse_completion(completion, TOOLS)
    turn = [assistant(parsed.text)] if parsed.text else []
    turn += [function_call(f"n{i}", c.name, c.arguments) for i, c in enumerate(parsed.calls)]
    prompt = r.text(prefix, add_generation_prompt=True)
    history = r.text(prefix + turn, add_generation_prompt=False)
    assert history == prompt + completion + "<|im_end|>\n"
    assert r.ids(prefix + turn, add_generation_prompt=False)[: len(r.ids(prefix))] == r.ids(prefix)


@pytest.mark.parametrize(
    "completion, kind",
    [
        ("<tool_call>\n{not json}\n</tool_call>", "bad-json"),
        ('<tool_call>\n["search"]\n</tool_call>', "bad-call"),
        (
            '<tool_call>\n{"name": "serch", "arguments": {"query": "x"}}\n</tool_call>',
            "unknown-tool",
        ),
        ('<tool_call>\n{"name": "search", "arguments": {}}\n</tool_call>', "missing-argument"),
        (
            '<tool_call>\n{"name": "search", "arguments": {"query": "x", "k": 3}}\n</tool_call>',
            "extra-argument",
        ),
        (
            '<tool_call>\n{"name": "open", "arguments": {"doc_id": "d", "page": "two"}}\n</tool_call>',
            "bad-argument-type",
        ),
        (
            '<tool_call>\n{"name": "open", "arguments": {"doc_id": "d", "page": true}}\n</tool_call>',
            "bad-argument-type",
        ),
        ('<tool_call>\n{"name": "search", "arguments": [1]}\n</tool_call>', "bad-arguments"),
        (
            '<tool_call>\n{"name": "search", "arguments": {"query": "x"}, "id": 1}\n</tool_call>',
            "bad-call",
        ),
        (
            'I will search.\n<tool_call>\n{"name": "search", "arguments": {"query": "x"',
            "unterminated",
        ),
    ],
)
def test_malformed_calls_become_errors(completion, kind):
    parsed = parse_completion(completion, TOOLS)
    assert not parsed.ok and not parsed.calls
    (err,) = parsed.errors
    assert err.kind == kind
    assert err.observation().startswith("Error in tool call 1: ")


def test_error_messages_name_the_problem():
    parsed = parse_completion('<tool_call>{"name": "serch", "arguments": {}}</tool_call>', TOOLS)
    assert "unknown tool 'serch'; available tools: free, open, search" in parsed.errors[0].message
    parsed = parse_completion('<tool_call>{"name": "search", "arguments": {}}</tool_call>', TOOLS)
    assert "search is missing argument(s) ['query']" in parsed.errors[0].message


def test_good_and_bad_calls_in_one_turn():
    text = (
        "Two calls.\n"
        + format_tool_call("search", {"query": "a"})
        + "\n<tool_call>{oops}</tool_call>"
    )
    parsed = parse_completion(text, TOOLS)
    assert parsed.text == "Two calls."
    assert [c.name for c in parsed.calls] == ["search"]
    assert [e.index for e in parsed.errors] == [1]


def test_arguments_given_as_a_json_string_are_accepted():
    parsed = parse_completion(
        '<tool_call>{"name": "search", "arguments": "{\\"query\\": \\"x\\"}"}</tool_call>', TOOLS
    )
    assert parsed.ok and parsed.calls[0].arguments == {"query": "x"}


def test_template_choice(tokenizer):
    assert not renders_hermes_tools(tokenizer)  # SmolLM2's ChatML template ignores tools
    r = Renderer(tokenizer)
    assert r.chat_template == acmrl_chat_template()
    tok = tokenizer.__class__.from_pretrained(tokenizer.name_or_path)
    tok.chat_template = acmrl_chat_template()
    assert renders_hermes_tools(tok)


def test_rendered_prompt_contains_system_tools_and_state(tokenizer):
    r = Renderer(tokenizer, system_prompt="Be brief.", tools=[SEARCH])
    state = [
        user("find x"),
        function_call("c1", "search", {"query": "x"}),
        function_call_output("c1", "result"),
    ]
    text = r.text(state)
    assert text.startswith("<|im_start|>system\nBe brief.\n\n# Tools")
    assert json.dumps(SEARCH) in text
    assert (
        '<|im_start|>assistant\n<tool_call>\n{"name": "search", "arguments": {"query": "x"}}\n</tool_call><|im_end|>'
        in text
    )
    assert "<|im_start|>user\n<tool_response>\nresult\n</tool_response><|im_end|>\n" in text
    assert text.endswith("<|im_start|>assistant\n")
    assert r.ids(state) == tokenizer.encode(text, add_special_tokens=False)


# --- incremental rendering: the Python twin of the template, and ids from cached pieces ---------

SPECIAL = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<tool_call>", "</tool_response>"]
# anything a tool or a model may produce: unicode, whitespace runs, special-token strings
wild = st.lists(
    st.text(max_size=16) | st.sampled_from([*SPECIAL, "\n", "\n\n", " ", "  ", "é", "🙂", "\t"]),
    max_size=5,
).map("".join)
wild_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**6), 10**6) | wild,
    lambda c: st.lists(c, max_size=3) | st.dictionaries(wild, c, max_size=3),
    max_leaves=6,
)


@st.composite
def wild_states(draw):
    """Valid States of every item kind with unicode, special-token strings and odd arguments."""

    said = wild.filter(str.strip)  # a message says something

    def parts(kind: str) -> list[dict[str, str]]:
        texts = [draw(said), *draw(st.lists(wild, max_size=2))]
        return [{"type": kind, "text": t} for t in texts]

    state = [user(draw(said))]
    n = 0
    for _ in range(draw(st.integers(0, 5))):
        if draw(st.booleans()):
            msg = assistant(draw(said))
            if draw(st.booleans()):
                msg["content"] = parts("output_text")
            state.append(msg)
        k = draw(st.integers(0, 3))
        ids = [f"c{n + i}" for i in range(k)]
        n += k
        for cid in ids:
            args = draw(st.dictionaries(wild, wild_json, max_size=3))
            state.append(function_call(cid, draw(st.sampled_from(["free", "search"])), args))
        for cid in ids:
            out = draw(wild) if draw(st.booleans()) else parts("input_text")
            state.append(function_call_output(cid, out))
        if draw(st.booleans()):
            msg = user(draw(said))
            if draw(st.booleans()):
                msg["content"] = parts("input_text")
            state.append(msg)
    validate(state)
    return state


@given(
    state=wild_states(),
    system=st.none() | wild,
    tools=st.sampled_from([[], TOOLS]),
    gen=st.booleans(),
)
@settings(
    max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
def test_python_template_renders_what_the_jinja_template_renders(
    tokenizer, state, system, tools, gen
):
    from acmrl.context.render import acmrl_chat_template, chatml_tools_text

    r = Renderer(tokenizer, system_prompt=system, tools=tools)
    assert r.chat_template == acmrl_chat_template()
    jinja = tokenizer.apply_chat_template(
        r.messages(state),
        tools=tools or None,
        chat_template=acmrl_chat_template(),
        tokenize=False,
        add_generation_prompt=gen,
    )
    assert chatml_tools_text(r.messages(state), tools, gen) == jinja


CASES = {"ids": 0}


@given(state=wild_states(), edit=wild, own=st.booleans(), data=st.data())
@settings(
    max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
def test_ids_from_cached_pieces_equal_a_whole_tokenisation(tokenizer, state, edit, own, data):
    """Turn by turn (each prefix of the State) and after an edit of one item, the ids built from
    cached pieces equal tokenising the whole render, for acmrl's template and the model's own."""
    r = Renderer(
        tokenizer,
        system_prompt="You are an agent.",
        tools=TOOLS,
        chat_template=tokenizer.chat_template if own else None,
    )
    assert r._pieces.exact
    if own:  # SmolLM2's own template takes string contents only
        for item in state:
            for key in ("content", "output"):
                if isinstance(item.get(key), list):
                    joined = "\n".join(p["text"] for p in item[key])
                    item[key] = [{**item[key][0], "text": joined}] if key == "content" else joined
    for end in range(1, len(state) + 1):
        for gen in (True, False):
            whole = tokenizer.encode(r.text(state[:end], gen), add_special_tokens=False)
            assert r.ids(state[:end], gen) == whole
            CASES["ids"] += 1
    i = data.draw(st.integers(0, len(state) - 1))
    edited = [dict(item) for item in state]
    if edited[i]["type"] == "message":
        text = edit if edit.strip() else "edited"
        edited[i]["content"] = [{"type": edited[i]["content"][0]["type"], "text": text}]
    elif edited[i]["type"] == "function_call_output":
        edited[i]["output"] = edit
    whole = tokenizer.encode(r.text(edited), add_special_tokens=False)
    assert r.ids(edited) == whole
    CASES["ids"] += 1
    CASES["examples"] = CASES.get("examples", 0) + 1
    assert r._pieces.hits > 0 or len(state) == 1
    print(
        f"\rcached-piece ids checked: {CASES['ids']} inputs in {CASES['examples']} States", end=""
    )
