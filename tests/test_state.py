import json
import math

import pytest

from acmrl.context.state import (
    StateError,
    assistant,
    function_call,
    function_call_output,
    user,
    validate,
)


def good_state():
    return [
        user("find x"),
        assistant("searching"),
        function_call("c1", "search", {"query": "x"}),
        function_call("c2", "open", {"doc_id": "d"}),
        function_call_output("c1", "r1"),
        function_call_output(
            "c2", [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]
        ),
        assistant("done"),
    ]


def test_valid_states_pass():
    validate([])
    validate(good_state())
    validate([*good_state(), function_call("e1", "evolve", {"code": "return state"})])


def rejects(state, rule, index=None, **kw):
    with pytest.raises(StateError) as info:
        validate(state, **kw)
    assert info.value.rule == rule, str(info.value)
    assert info.value.index == index, str(info.value)
    return str(info.value)


def test_json_rules():
    s = good_state()
    s[0]["content"][0]["text"] = math.nan
    rejects(s, "json", 0)
    s = good_state()
    s[1]["content"][0]["extra"] = {1: "int key"}
    rejects(s, "json", 1)
    s = good_state()
    s[4]["output"] = {"set": {1, 2}}
    rejects(s, "json", 4)
    deep: list = []
    node = deep
    for _ in range(150):
        node.append([])
        node = node[0]
    s = good_state()
    s[0]["content"] = deep
    assert "nesting exceeds" in rejects(s, "json", 0)
    cyclic: list = []
    cyclic.append(cyclic)
    s = good_state()
    s[0]["content"] = cyclic
    rejects(s, "json", 0)
    rejects("not a list", "state")


@pytest.mark.parametrize(
    "mutate, rule, index",
    [
        (lambda s: s.__setitem__(0, "text"), "item", 0),
        (lambda s: s[0].__setitem__("type", "image"), "type", 0),
        (lambda s: s[0].__setitem__("role", "system"), "role", 0),
        (lambda s: s[0].__setitem__("content", []), "content", 0),
        (
            lambda s: s[0].__setitem__("content", [{"type": "input_text", "text": "  "}]),
            "content",
            0,
        ),
        (lambda s: s[1]["content"][0].__setitem__("type", "input_text"), "content", 1),
        (lambda s: s[0].__setitem__("id", "x"), "fields", 0),
        (lambda s: s[2].__setitem__("arguments", "{bad json"), "arguments", 2),
        (lambda s: s[2].__setitem__("arguments", "[1, 2]"), "arguments", 2),
        (lambda s: s[2].__setitem__("arguments", {"query": "x"}), "arguments", 2),
        (lambda s: s[2].__setitem__("name", ""), "field", 2),
        (lambda s: s[3].__setitem__("call_id", "c1"), "duplicate-call-id", 3),
        (lambda s: s[4].__setitem__("call_id", "zz"), "orphan-output", 4),
        (lambda s: s.insert(5, function_call_output("c1", "again")), "duplicate-output", 5),
        (lambda s: s.insert(4, user("interrupt")), "unanswered-call", 4),
        (lambda s: s.insert(0, function_call_output("c0", "early")), "orphan-output", 0),
        (lambda s: s.pop(5), "unanswered-call", 5),
        (lambda s: s.append(function_call("c9", "search", {"q": 1})), "unanswered-call", 7),
    ],
)
def test_rule_violations_name_index_and_rule(mutate, rule, index):
    s = good_state()
    mutate(s)
    rejects(s, rule, index)


def test_only_a_trailing_evolve_call_may_be_in_flight():
    ev = function_call("e1", "evolve", {"code": "return state"})
    rejects([*good_state(), ev], "unanswered-call", 7, allow_pending_evolve=False)
    rejects([*good_state(), ev, user("more")], "unanswered-call", 8)
    two = [*good_state(), function_call("c9", "search", {"q": "y"}), ev]
    rejects(two, "unanswered-call", 7)


def test_error_message_is_readable():
    s = good_state()
    s[4]["call_id"] = "zz"
    with pytest.raises(
        StateError, match=r"item 4: orphan-output: no earlier call has call_id 'zz'"
    ):
        validate(s)


def test_constructors_make_json_strings():
    call = function_call("c", "search", {"query": "é"})
    assert json.loads(call["arguments"]) == {"query": "é"}
