"""Answer scoring: SQuAD normalisation, EM, token F1, set answers, the judge hook; and load()."""

from __future__ import annotations

import doctest
import textwrap

import pytest

import acmrl.envs
from acmrl.envs import EnvError, load, scoring
from acmrl.envs.scoring import (
    JudgeError,
    contains,
    exact_match,
    llm_judge,
    normalize_answer,
    parse_verdict,
    score_answer,
    set_f1,
    token_f1,
)


def test_doctests():
    for module in (scoring, acmrl.envs):
        result = doctest.testmod(module)
        assert result.failed == 0 and result.attempted > 0, module.__name__


def test_normalisation_and_exact_match():
    assert normalize_answer("  An Apple, the PIE! ") == "apple pie"
    assert exact_match("The Veltra Festival.", "veltra festival") == 1.0
    assert exact_match("Veltra Festival 1962", "Veltra Festival") == 0.0


def test_token_f1_hand_computed():
    # prediction tokens: kelm holdings of port elm (5); reference: kelm holdings (2); common 2
    # precision 2/5, recall 2/2 -> F1 = 2 * 0.4 * 1 / 1.4 = 0.5714...
    assert token_f1("Kelm Holdings of Port Elm", "Kelm Holdings") == pytest.approx(0.8 / 1.4)
    # repeated tokens count once per occurrence on each side: "a a b" vs "a b b"
    # after normalisation "a" is an article and vanishes: "b" vs "b b" -> p 1/1, r 1/2 -> 2/3
    assert token_f1("a a b", "a b b") == pytest.approx(2 / 3)
    assert token_f1("", "") == 1.0 and token_f1("x", "") == 0.0


def test_contains_needs_whole_words():
    assert contains("It was the Kelm Holdings.", "Kelm Holdings") == 1.0
    assert contains("It was Kelm Holdingsworth.", "Kelm Holdings") == 0.0


def test_set_answers():
    items = ["Alpha", "Beta", "Gamma"]
    assert set_f1("Gamma, Beta and Alpha", items) == 1.0
    # two of three, nothing wrong: p 1, r 2/3 -> F1 0.8
    assert set_f1("Beta; alpha", items) == pytest.approx(0.8)
    # one right and one wrong: p 1/2, r 1/3 -> F1 = 2*(1/6)/(5/6) = 0.4
    assert set_f1("Alpha, Delta", items) == pytest.approx(0.4)
    assert score_answer("Beta, Alpha, Gamma", items, answer_set=True) == 1.0


def test_alternatives_take_the_best_match():
    assert score_answer("marble stone", ["marble", "marble stone"]) == 1.0
    assert score_answer(None, "x") == 0.0
    with pytest.raises(ValueError, match="unknown metric 'bleu'"):
        score_answer("x", "x", metric="bleu")


def test_judge_verdicts():
    assert parse_verdict('{"verdict": "correct"}') == 1.0
    assert parse_verdict('Sure. {"verdict": "incorrect"} done') == 0.0
    assert parse_verdict("The response is CORRECT.") == 1.0
    with pytest.raises(JudgeError, match="no verdict"):
        parse_verdict("I cannot tell.")


def test_judge_hook_is_used_by_the_environment():
    prompts: list[str] = []

    def complete(prompt: str) -> str:  # a deterministic grader: right iff the reference is quoted
        prompts.append(prompt)
        ref = prompt.split("Reference answer: ")[1].split("\n")[0]
        said = prompt.split("Response: ")[1].split("\n")[0]
        return '{"verdict": "correct"}' if ref.lower() in said.lower() else "incorrect"

    env = load("kb_search", preset="tiny", judge=llm_judge(complete))
    task = env.tasks("eval")[0]
    assert env.score(task, f"I think it is the {task.answer}, held that year") == 1.0
    assert env.score(task, "no idea") == 0.0
    assert len(prompts) == 2 and task.prompt in prompts[0]
    # without a judge the same verbose answer fails exact match
    assert load("kb_search", preset="tiny").score(task, f"It is the {task.answer}, I think") == 0.0


def test_load_errors_name_the_problem(tmp_path, monkeypatch):
    with pytest.raises(EnvError, match=r"unknown environment 'nope'.*kb_search"):
        load("nope")
    with pytest.raises(EnvError, match="unexpected keyword argument 'colour'"):
        load("corpus_qa", queries="q", corpus="c", colour="red")
    with pytest.raises(EnvError, match="no preset 'huge'"):
        load("kb_search", preset="huge")
    with pytest.raises(EnvError, match=r"does not take option\(s\) \['depth'\]"):
        load("kb_search", preset="tiny", depth=3)
    with pytest.raises(EnvError, match="metric='bleu'"):
        load("kb_search", preset="tiny", metric="bleu")
    with pytest.raises(EnvError, match="no split 'test'"):
        load("kb_search", preset="tiny").tasks("test")
    with pytest.raises(EnvError, match="cannot import"):
        load("no_such_module:Env")
    (tmp_path / "my_envs.py").write_text(
        textwrap.dedent(
            """
            from acmrl.envs import Environment, Task

            class Echo(Environment):
                name = "echo"
                def __init__(self, word="hi", **kw):
                    super().__init__(**kw)
                    self._tasks = {"eval": [Task("echo/0", f"Say {word}.", word)]}
                def tools(self):
                    return []
                def _handlers(self, task):
                    return {}
                def oracle_plan(self, task):
                    return [("answer", {"text": task.answer})]

            NotAnEnv = dict
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    env = load("my_envs:Echo", word="salut")
    session = env.session(env.tasks("eval")[0])
    assert [t["function"]["name"] for t in session.tools] == ["answer"]
    assert session.call("answer", {"text": "Salut!"}) == "Answer submitted."
    assert session.score() == 1.0
    with pytest.raises(EnvError, match=r"not an acmrl\.envs\.Environment subclass"):
        load("my_envs:NotAnEnv")
