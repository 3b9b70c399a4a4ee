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
json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(10**9), 10**9)
    | st.text(max_size=12)
    | st.floats(allow_nan=False, allow_infinity=False, allow_subnormal=False, width=32)
)
json_values = st.recursive(
    json_scalars,
    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=6), c, max_size=3),
    max_leaves=8,
)
arguments = st.dictionaries(st.text(min_size=1, max_size=8), json_values, max_size=4)
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
