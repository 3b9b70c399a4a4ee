import copy
import json
import time
from pathlib import Path

import pytest

from acmrl.context.evolve import EVOLVE_TOOL_SCHEMA, EvolveLimits, apply_evolve, evolve_call
from acmrl.context.prefix import reusable_prefix
from acmrl.context.render import Renderer
from acmrl.context.state import assistant, function_call, function_call_output, user, validate

FIXTURES = Path(__file__).parent / "fixtures" / "evolve"
EXAMPLES = sorted(p.name for p in FIXTURES.iterdir())


def base_state():
    return [
        user("Summarise the findings."),
        function_call("c1", "search", {"query": "findings"}),
        function_call_output("c1", "finding A; finding B; " * 20),
        assistant("Reading the results now."),
    ]


def run(code, state=None, **kw):
    state = base_state() if state is None else state
    return apply_evolve([*state, evolve_call("ev", code)], **kw)


def test_examples_are_four():
    assert EXAMPLES == [
        "01-selective-compression",
        "02-annotated-evidence",
        "03-current-task",
        "04-web-search",
    ]


@pytest.mark.parametrize("name", EXAMPLES)
def test_reference_examples_reproduce(name, tokenizer):
    before = json.loads((FIXTURES / name / "before.json").read_text())
    expected = json.loads((FIXTURES / name / "after.json").read_text())
    code = (FIXTURES / name / "code.js").read_text()
    validate(before)
    call = evolve_call("call_evolve", code)
    renderer = Renderer(tokenizer, system_prompt="sys", tools=[EVOLVE_TOOL_SCHEMA])
    result = apply_evolve([*before, call], renderer=renderer, call_tokens=50, output_weight=2.0)
    assert result.applied, result.error
    validate(result.state, allow_pending_evolve=False)
    assert result.state[:-2] == expected
    assert result.state[-2] == call
    receipt = result.state[-1]
    assert receipt["call_id"] == "call_evolve"
    body = json.loads(receipt["output"])
    assert body == result.receipt and body["applied"] is True
    assert body["tokens_after"] < body["tokens_before"]  # every example compacts
    assert body["cache_cost"] == body["tokens_after"] - body["reusable_prefix"]
    assert body["compaction_cost"] == 50 * 2.0 + body["cache_cost"]
    assert body["reusable_prefix"] > 0  # the system prompt and tools never change


def test_receipt_counts_call_tokens_when_not_given(tokenizer):
    r = Renderer(tokenizer)
    result = run("state[3].content[0].text = 'Reading.'; return state;", renderer=r)
    assert result.applied
    body = result.receipt
    assert body["call_tokens"] > 10
    assert body["compaction_cost"] == body["call_tokens"] + body["cache_cost"]
    # an edit of the last message keeps the whole prefix up to it, and its own turn header
    untouched = r.ids(base_state()[:3], add_generation_prompt=False)
    header = r.encode("<|im_start|>assistant\n")
    same_words = reusable_prefix(r.encode("Reading the results now."), r.encode("Reading."))
    assert body["reusable_prefix"] == len(untouched) + len(header) + same_words


def test_noop_edit_costs_only_the_call(tokenizer):
    result = run("return state;", renderer=Renderer(tokenizer), call_tokens=7)
    assert result.receipt["cache_cost"] == 0
    assert result.receipt["compaction_cost"] == 7.0


def test_input_state_is_never_mutated():
    state = [*base_state(), evolve_call("ev", "state[0].content[0].text = 'x'; return state;")]
    snapshot = copy.deepcopy(state)
    apply_evolve(state)
    assert state == snapshot


HOSTILE = {
    "infinite loop": ("while (true) {}", "time limit of 250 ms exceeded"),
    "busy recursion with catch": (
        "function f(){ try { return f(); } catch (e) { return f(); } } return f();",
        "limit",
    ),
    "array bomb": ("const a = []; while (true) a.push(new Array(100000).fill(1));", "memory limit"),
    "string bomb": ("let s = 'x'; while (true) s += s;", "memory limit"),
    "typed array bomb": (
        "const b = []; while (true) b.push(new Float64Array(1e6));",
        "memory limit",
    ),
    "one huge typed array": ("new Uint8Array(1e9); return state;", "memory limit"),
    "deep recursion": ("function f(n){ return f(n + 1) + 1; } return f(0);", "stack limit"),
    "huge output": (
        "const big = 'x'.repeat(900000); state[0].content[0].text = big + big; return state;",
        "limit",
    ),
    "promise": ("return Promise.resolve(state);", "synchronously"),
    "async thenable": ("return { then(r) { r(state); } };", "synchronously"),
    "not an array": ("return {items: state};", "must return the State array"),
    "undefined inside": (
        "state[0].extra = undefined; state.push(undefined); return state;",
        "non-JSON",
    ),
    "nan inside": ("state[2].output = NaN; return state;", "non-finite"),
    "function inside": ("state[0].f = () => 1; return state;", "non-JSON"),
    "deletes its own call": ("state.pop(); return state;", "must stay the last item"),
    "alters its own call": (
        'state[state.length - 1].arguments = \'{"code": "x"}\'; return state;',
        "must stay the last item",
    ),
    "moves its own call": ("const c = state.pop(); state.unshift(c); return state;", "invalid"),
    "breaks a tool pair": ("state.splice(2, 1); return state;", "invalid"),
    "invalid item": ("state.splice(1, 0, {type: 'image'}); return state;", "invalid"),
    "require": ("require('fs'); return state;", "'require' is not defined"),
    "fetch": ("fetch('http://127.0.0.1'); return state;", "'fetch' is not defined"),
    "process": ("process.exit(1); return state;", "'process' is not defined"),
    "std/os modules": ("std.open('/etc/passwd'); return state;", "'std' is not defined"),
    "eval escape": ("return (0, eval)('this').process.env;", "threw"),
    "syntax error": ("return state;;; }{", "threw"),
    "throws": ("throw new Error('nope');", "the code threw: Error: nope"),
    "throws null": ("throw null;", "the code threw null"),
    "prototype pollution": (
        "Array.isArray = () => true; JSON.stringify = () => '[]'; Object.prototype.then = 1; return 5;",
        "must return the State array",
    ),
    "toJSON trick": (
        "Array.prototype.toJSON = function () { return 'gotcha'; }; return state;",
        "invalid",
    ),
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_code_is_refused_and_state_kept(name):
    code, message = HOSTILE[name]
    state = [*base_state(), evolve_call("ev", code)]
    before = copy.deepcopy(state)
    result = apply_evolve(state)
    assert not result.applied
    assert message in result.error, result.error
    assert result.state[:-1] == before  # the old State stays, the call included
    validate(result.state, allow_pending_evolve=False)
    receipt = result.state[-1]
    assert receipt["type"] == "function_call_output" and receipt["call_id"] == "ev"
    assert json.loads(receipt["output"]) == {"applied": False, "error": result.error}


def test_python_survives_repeated_limit_hits():
    for _ in range(20):
        for code in (
            "while(true){}",
            "let s='x'; while(true) s+=s;",
            "function f(){return f()} f()",
        ):
            assert not run(code, limits=EvolveLimits(time_ms=20)).applied
    assert run("return state;").applied


NATIVE_STALLS = {
    # each spends seconds inside one native call, where QuickJS's own interrupt never runs
    "backtracking regex": 'const r = /(a+)+$/; r.test("a".repeat(30) + "b"); return state;',
    "backtracking regex in replace": (
        'state[0].content[0].text = "x".repeat(28).replace(/(x+x+)+y/, "z"); return state;'
    ),
}


@pytest.mark.parametrize("name", list(NATIVE_STALLS))
def test_time_limit_is_hard_inside_native_calls(name):
    from acmrl.context.jsworker import worker

    state = [*base_state(), evolve_call("ev", NATIVE_STALLS[name])]
    before = copy.deepcopy(state)
    restarts = worker().restarts
    t = time.perf_counter()
    result = apply_evolve(state)
    took = time.perf_counter() - t
    assert not result.applied and result.error == "time limit of 250 ms exceeded"
    assert took < 1.0, f"the script ran {took:.2f} s"
    assert result.state[:-1] == before  # the old State stays
    assert worker().restarts == restarts + 1  # the stuck sandbox was killed...
    assert run("return state;").applied  # ...and its successor runs the next edit
    assert "limit" in run("while (true) {}").error  # with the limits still in force
    assert "stack limit" in run("function f(n){ return f(n + 1) + 1; } return f(0);").error


def test_sandbox_runs_in_its_own_process():
    """The model's code cannot reach or stall the Python process that runs the agent loop."""
    import os

    from acmrl.context.jsworker import worker

    run("return state;")
    pid = worker()._proc.pid
    assert pid != os.getpid()
    assert run("return state;").applied and worker()._proc.pid == pid  # persistent


def test_size_limits():
    limits = EvolveLimits(code_bytes=100, state_bytes=5000)
    assert "code is" in run("/*" + "x" * 200 + "*/ return state;", limits=limits).error
    big = [user("x" * 6000)]
    assert "over the 5,000-byte limit" in run("return state;", state=big, limits=limits).error
    grow = "state[0].content[0].text = 'y'.repeat(6000); return state;"
    assert "returned State is over" in run(grow, state=[user("x")], limits=limits).error


def test_bad_arguments_are_refused():
    state = [*base_state(), function_call("ev", "evolve", {"code": "return state", "extra": 1})]
    result = apply_evolve(state)
    assert not result.applied and "exactly one argument" in result.error
    state = [*base_state(), function_call("ev", "evolve", {"code": 5})]
    assert "exactly one argument" in apply_evolve(state).error


def test_limits_must_be_positive():
    with pytest.raises(ValueError, match="time_ms"):
        EvolveLimits(time_ms=0)


def test_caller_bugs_raise():
    with pytest.raises(ValueError, match="in-flight evolve call"):
        apply_evolve(base_state())


def test_an_applied_programs_text_can_leave_the_context(tokenizer):
    from acmrl.context.evolve import APPLIED_CODE

    r = Renderer(tokenizer)
    code = "return state.filter(i => i.type !== 'message' || i.role === 'user');"
    kept = run(code, renderer=r, call_tokens=30)
    gone = run(code, renderer=r, call_tokens=30, keep_code=False)
    assert kept.applied and gone.applied
    assert kept.state[:-2] == gone.state[:-2]  # the same edit
    assert json.loads(kept.state[-2]["arguments"])["code"] == code
    assert gone.state[-2]["arguments"] == APPLIED_CODE
    assert gone.state[-2]["call_id"] == "ev" and gone.state[-1]["call_id"] == "ev"
    validate(gone.state, allow_pending_evolve=False)
    # the next input is shorter by the program; an edit before the call makes the call new
    # input either way, the stub costing less than the program
    assert gone.receipt["tokens_after"] < kept.receipt["tokens_after"]
    assert gone.receipt["cache_cost"] < kept.receipt["cache_cost"]
    # after an edit that changes nothing else, the stub is the only new input
    noop = run("return state;", renderer=r, call_tokens=5, keep_code=False)
    assert 0 < noop.receipt["cache_cost"] < 20
    assert noop.receipt["compaction_cost"] == 5 + noop.receipt["cache_cost"]
    # a refused program stays, so that its receipt's error can be read against it
    bad = run("return 1;", keep_code=False)
    assert not bad.applied and json.loads(bad.state[-2]["arguments"])["code"] == "return 1;"
