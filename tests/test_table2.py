"""Table 2 across benchmarks: every arm, the oracle policy held fixed, on kb_search
tiny, code_nav over this project's own code and corpus_qa in BrowseComp-Plus format; and the
oracle's evolve demonstrations where ReAct overflows."""

from __future__ import annotations

import json
import random
from pathlib import Path

import acmrl
from acmrl.config import AgentConfig, EvalConfig, SamplingConfig
from acmrl.envs import load
from acmrl.eval.multi import multi_report
from acmrl.eval.run import run_eval
from acmrl.teacher.demonstrate import demonstrate

ARMS = ["react", "summary", "memory", "acm", "evolve"]
SYLLABLES = "ka lo mer ta vin su rel od an pe thi gor ul ve nash bri".split()


def _word(rng: random.Random) -> str:
    return "".join(rng.choice(SYLLABLES) for _ in range(rng.randint(1, 3)))


def _filler(rng: random.Random, sentences: int) -> str:
    return " ".join(
        " ".join(_word(rng) for _ in range(rng.randint(8, 14))).capitalize() + "."
        for _ in range(sentences)
    )


def browsecomp_corpus(folder: Path, questions: int = 6, seed: int = 0) -> dict[str, str]:
    """A small corpus in BrowseComp-Plus format (decrypted queries with ``gold_docs``, a corpus
    of ``docid``/``text``/``url``): long web-page-like documents (about 1,300 tokens of filler
    prose each) and two-document questions: a person's page names the archive that records
    them, and the archive's page holds the answer in one sentence that names the person. Both
    gold pages mention names the question gives; 20 other pages are distractors."""
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    docs, queries = [], []
    for q in range(questions):
        person = f"{_word(rng).capitalize()} {_word(rng).capitalize()}ston"
        archive = f"Harbour Rolls of {_word(rng).capitalize()}mouth"
        ship = f"the {_word(rng).capitalize()} {rng.choice(['Heron', 'Kite', 'Lark', 'Gull'])}"
        bio, rolls = f"doc-{q}-a", f"doc-{q}-b"
        docs.append(
            {
                "docid": bio,
                "text": f"{person}\n{_filler(rng, 40)} {person} is listed in the {archive}. "
                f"{_filler(rng, 40)}",
                "url": f"https://example.org/{bio}",
            }
        )
        docs.append(
            {
                "docid": rolls,
                "text": f"{archive}\n{_filler(rng, 40)} {person} sailed on {ship}. "
                f"{_filler(rng, 40)}",
                "url": f"https://example.org/{rolls}",
            }
        )
        queries.append(
            {
                "query_id": str(q),
                "query": f"On which ship did {person} sail, according to the archive that "
                "lists them?",
                "answer": ship,
                "gold_docs": [bio, rolls],
            }
        )
    for d in range(20):
        docs.append({"docid": f"doc-x{d}", "text": _filler(rng, 80), "url": ""})
    paths = {"queries": folder / "queries.jsonl", "corpus": folder / "corpus.jsonl"}
    for key, rows in (("queries", queries), ("corpus", docs)):
        paths[key].write_text("".join(json.dumps(r) + "\n" for r in rows))
    return {k: str(v) for k, v in paths.items()}


def _oracle_eval(out: Path, name: str, options: dict, budget: int) -> dict:
    cfg = EvalConfig(output=str(out), arms=ARMS, machine="test CPU", plots=False)
    cfg.engine.kind = "oracle"
    cfg.env.name, cfg.env.options, cfg.env.split = name, options, "eval"
    cfg.agent.max_context_tokens = budget
    cfg.agent.context_signal = True
    cfg.agent.on_overflow = "fail"  # the rule docs/eval.md's oracle Table 2 was measured under
    return run_eval(cfg)


def test_table2_over_three_benchmarks_driven_by_the_oracle(tmp_path, default_model_dir):
    """One Table 2 with a row per (benchmark, arm) over kb_search tiny,
    code_nav on acmrl's own code and corpus_qa (BrowseComp-Plus preset, exact match in place
    of the judge) on a corpus made here, every arm played by the same oracle policy."""
    corpus = browsecomp_corpus(tmp_path / "bcp")
    bcp = {**corpus, "preset": "browsecomp-plus", "metric": "em", "eval_frac": 1.0}
    runs = {
        "kb": ("kb_search", {"preset": "tiny", "seed": 0}, 1400),
        "code": ("code_nav", {"root": str(Path(acmrl.__file__).parent), "n_eval": 8}, 2400),
        "bcp": ("corpus_qa", bcp, 8192),
    }
    reports = {k: _oracle_eval(tmp_path / k, *v) for k, v in runs.items()}
    text = multi_report([tmp_path / k for k in runs], output=tmp_path / "table2.md")
    print(text)
    rows = [line for line in text.splitlines() if line.startswith("| ") and " | " in line]
    for bench in ("kb_search", "code_nav", "corpus_qa"):
        assert sum(line.startswith(f"| {bench}") for line in rows) == len(ARMS), text
    # what each benchmark shows with the policy held fixed
    kb, code, qa = (reports[k]["arms"] for k in ("kb", "code", "bcp"))
    assert kb["react"]["overflow"] > 0.5 and kb["acm"]["pass@1"] == 1.0
    assert code["react"]["pass@1"] == 1.0  # short reads: nothing to manage at 2,400 tokens
    assert qa["react"]["overflow"] > 0.5  # top-10 snippets of 512 tokens, then two pages
    assert qa["acm"]["pass@1"] == qa["evolve"]["pass@1"] == 1.0


def test_oracle_evolve_demonstrations_where_react_overflows(tmp_path, tokenizer):
    """The teacher's evolve demonstrations per environment under
    a budget where ReAct's overflow; counts printed. corpus_qa's pages are bulky, so the cut
    (keep the sentences that name what the plan needs) saves more than evolve's system prompt
    and program cost; code_nav's reads are short, so at a budget where ReAct overflows the
    evolve arm does not fit either (its State prompt and tool take ~430 tokens more;
    benchmarks/arm_budgets.py measures by how much per task)."""
    agent = dict(max_turns=12, context_signal=True)
    sampling = SamplingConfig(max_new_tokens=96, stop=["</tool_call>"])
    counts = {}
    cases = {
        "corpus_qa": (
            load(
                "corpus_qa",
                **browsecomp_corpus(tmp_path),
                preset="browsecomp-plus",
                metric="em",
                eval_frac=1.0,
            ),
            8192,
        ),
        "code_nav": (load("code_nav", root=str(Path(acmrl.__file__).parent), n_eval=8), 1000),
    }
    for name, (env, budget) in cases.items():
        tasks = env.tasks("eval")[:8]
        demos = demonstrate(
            env,
            tasks,
            ["react", "evolve"],
            tokenizer,
            agent=AgentConfig(max_context_tokens=budget, **agent),
            sampling=sampling,
            pressure=0.75,
        )
        for arm in ("react", "evolve"):
            mine = [d for d in demos if d.arm == arm]
            counts[(name, arm)] = (
                sum(d.score >= 1 for d in mine),
                sum(d.status == "overflow" for d in mine),
                len(mine),
            )
    for (name, arm), (won, over, n) in counts.items():
        print(f"{name} {arm}: {won}/{n} succeed, {over}/{n} overflow")
    # measured: corpus_qa react 1/6 succeed, 5/6 overflow; evolve 6/6 succeed. code_nav at
    # 1,000 tokens: react 3/8 succeed, 5/8 overflow; evolve 0/8 (it cannot start under it)
    react, evolve = counts[("corpus_qa", "react")], counts[("corpus_qa", "evolve")]
    assert react[1] > react[2] // 2 and evolve[0] == evolve[2]
    assert counts[("code_nav", "react")][1] > 0
