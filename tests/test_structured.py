"""Structured output (response_format): the transformers engine constrains a reply to a JSON
schema, acmrl serve takes the field, the openai engine sends it, and the LLM teacher's replies
then always parse, even from a random model."""

from __future__ import annotations

import json

import jsonschema
import pytest

from acmrl.engines.base import EngineError, Request
from acmrl.engines.openai import OpenAIEngine
from acmrl.engines.structured import check_response_format, json_schema_format
from acmrl.teacher.llm import assessment_schema
from tests.test_engine_openai import prompt, start_server

SCHEMA = {
    "type": "object",
    "properties": {
        "kind": {"enum": ["injection", "correction"]},
        "step": {"enum": [0, 1, 2]},
        "note": {"type": "string", "pattern": "^I( [^ ]{1,8}){2,5}$"},
    },
    "required": ["kind", "step", "note"],
    "additionalProperties": False,
}


def test_the_random_model_writes_only_objects_of_the_schema(tiny_engine):
    """A random model's free reply is no JSON; constrained, every sample is a valid object
    and the reply ends with it (finish "stop", before max_tokens, nothing after the object)."""
    tok = tiny_engine.tokenizer
    ids = prompt(tok, "Reply with JSON.")
    free = tiny_engine.generate([Request("free", ids, max_tokens=40)])[0]
    with pytest.raises(json.JSONDecodeError):
        json.loads(free.text)
    fmt = json_schema_format("edit", SCHEMA)
    reqs = [
        Request(f"s{i}", ids, 120, temperature=1.0, seed=i, response_format=fmt) for i in range(6)
    ]
    replies = tiny_engine.generate(reqs)
    for c in replies:
        obj = json.loads(c.text)
        jsonschema.validate(obj, SCHEMA)
        assert c.finish_reason == "stop" and len(c.completion_ids) < 120  # ended at the object
        # logprobs of the constrained distribution: a token the schema forces (the key
        # "step" after "kind"'s value) has probability 1
        assert all(lp <= 0.0 for lp in c.logprobs) and 0.0 in c.logprobs
    assert len({c.text for c in replies}) > 1  # sampling still samples, within the schema
    # one batch of constrained and free rows: each row keeps its own constraint
    mixed = tiny_engine.generate(
        [
            Request("m0", ids, 40),
            Request("m1", ids, 120, response_format=fmt),
            Request("m2", ids, 60, response_format={"type": "json_object"}),
        ]
    )
    assert mixed[0].text == free.text
    jsonschema.validate(json.loads(mixed[1].text), SCHEMA)
    assert mixed[2].finish_reason == "length" or isinstance(json.loads(mixed[2].text), dict)
    assert mixed[2].text.startswith("{")


def test_a_schema_that_cannot_be_enforced_fails_before_the_batch_runs(tiny_engine):
    ids = prompt(tiny_engine.tokenizer, "Hello")
    tiny_engine.generate([Request("kept", ids, 4)])
    cached = tiny_engine.cached_tokens("kept")
    bad = json_schema_format("x", {"type": "strnig"})
    with pytest.raises(EngineError, match=r"schema is refused.*strnig"):
        tiny_engine.generate([Request("kept", ids, 4), Request("bad", ids, 4, response_format=bad)])
    assert cached > 0 and tiny_engine.cached_tokens("kept") == cached  # no session was touched


def test_bad_response_formats_are_named():
    assert check_response_format(None) is None
    assert check_response_format({"type": "text"}) is None
    assert check_response_format({"type": "json_object"}) == {"type": "object"}
    with pytest.raises(ValueError, match="'type' is one of"):
        check_response_format({"type": "xml"})
    with pytest.raises(ValueError, match="needs 'json_schema'"):
        check_response_format({"type": "json_schema", "json_schema": {"name": "x"}})


def test_acmrl_serve_enforces_a_schema_the_openai_engine_sends(tiny_model_dir, tiny_engine):
    proc, url = start_server(tiny_model_dir)
    try:
        eng = OpenAIEngine([url], "tiny", tiny_engine.tokenizer, max_retries=0)
        ids = prompt(tiny_engine.tokenizer, "Reply with JSON.")
        fmt = json_schema_format("edit", SCHEMA)
        remote = eng.generate([Request("r", ids, 120, response_format=fmt)])[0]
        here = tiny_engine.generate([Request("r", ids, 120, response_format=fmt)])[0]
        jsonschema.validate(json.loads(remote.text), SCHEMA)
        assert remote.completion_ids == here.completion_ids  # greedy: the same constrained reply
        with pytest.raises(EngineError, match=r"HTTP 400.*response_format"):
            eng.generate([Request("b", ids, 8, response_format={"type": "yaml"})])
        bad = json_schema_format("x", {"type": "string", "pattern": "(("})
        with pytest.raises(EngineError, match=r"HTTP 400.*cannot be enforced.*unclosed group"):
            eng.generate([Request("b", ids, 8, response_format=bad)])
    finally:
        proc.kill()
        proc.wait()


def test_assessment_schema_admits_the_arms_own_edits_only():
    search = {
        "type": "function",
        "function": {
            "name": "search",
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string"}},
                "required": ["query"],
            },
        },
    }
    manage = {
        "type": "function",
        "function": {"name": "manage_context", "parameters": {"type": "object"}},
    }
    schema = assessment_schema(3, [search, manage])
    rationale = "I have read the two results and still need the event's page."
    ok = [
        {"kind": "no_action"},
        {
            "kind": "correction",
            "step": 2,
            "rationale": rationale,
            "action": {"name": "search", "arguments": {"query": "x"}},
        },
        {
            "kind": "injection",
            "step": 0,
            "rationale": rationale,
            "action": {"name": "manage_context", "arguments": {}},
        },
    ]
    for obj in ok:
        jsonschema.validate(obj, schema)
    bad = [
        {**ok[1], "step": 3},  # no such step
        {**ok[2], "action": {"name": "search", "arguments": {"query": "x"}}},  # not a context tool
        {**ok[1], "rationale": "The agent should search."},  # not first person
        {**ok[1], "rationale": "I search."},  # too short
        {**ok[1], "action": {"name": "search", "arguments": {}}},  # its schema's required field
    ]
    for obj in bad:
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(obj, schema)
    # a react trajectory (no context tool) admits corrections only
    react = assessment_schema(2, [search])
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(ok[2], react)
    assert [v["properties"]["kind"]["const"] for v in react["anyOf"]] == [
        "correction",
        "no_action",
    ]


def test_assessment_schema_leaves_out_what_would_be_refused_whatever_the_wording():
    """query_memory names a summary that exists at its step (none before the first compaction:
    left out there); an answer call gives the reference answer."""

    def fn(name, **props):
        params = {"type": "object", "properties": props, "required": list(props)}
        return {"type": "function", "function": {"name": name, "parameters": params}}

    tools = [
        fn("answer", text={"type": "string"}),
        fn("manage_context"),
        fn("query_memory", summary_id={"type": "string"}, query={"type": "string"}),
    ]
    schema = assessment_schema(3, tools, [set(), {"S1"}, {"S1", "S2"}], ["Monday"])
    why = "I compacted my notes before, and the day I need was in the steps I archived then."

    def edit(kind, step, name, **args):
        action = {"name": name, "arguments": args}
        return {"kind": kind, "step": step, "rationale": why, "action": action}

    for ok in (
        edit("injection", 1, "query_memory", summary_id="S1", query="first day"),
        edit("injection", 2, "query_memory", summary_id="S2", query="first day"),
        edit("injection", 0, "manage_context"),
        edit("correction", 0, "answer", text="Monday"),
    ):
        jsonschema.validate(ok, schema)
    for bad in (
        edit("injection", 0, "query_memory", summary_id="S1", query="first day"),  # none yet
        edit("injection", 1, "query_memory", summary_id="S2", query="first day"),  # not yet
        edit("injection", 2, "query_memory", summary_id="123456789", query="x"),
        edit("correction", 0, "answer", text="Sunday"),
    ):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)
