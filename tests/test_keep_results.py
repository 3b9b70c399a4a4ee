"""scripts/keep_results.py: a run's small outputs are kept, and a table is rebuilt from them."""

from __future__ import annotations

import json

import pytest

from acmrl.config import EvalConfig
from acmrl.envs import load


def test_the_kept_files_rebuild_the_seeds_table(tmp_path, tokenizer, script):
    from acmrl.eval.edit_change import edit_change_md
    from acmrl.eval.run import run_eval
    from acmrl.eval.seeds import seeds_table
    from acmrl.eval.versus import versus_start
    from acmrl.rewards import RewardWeights
    from acmrl.teacher.demonstrate import oracle_engine

    run = tmp_path / "run"
    env = load("kb_search", preset="tiny", seed=0)
    for seed, pressure in ((0, 0.75), (1, 0.5)):
        cfg = EvalConfig(output=str(run / f"eval-test-s{seed}"), arms=["react", "acm"], plots=False)
        cfg.env.options, cfg.env.limit = {"preset": "tiny", "seed": 0}, 2
        cfg.agent.max_context_tokens = 1400
        run_eval(cfg, engine=oracle_engine(env, tokenizer, 1400, pressure))
    (run / "protocol.json").write_text(json.dumps({"steps": 3}))
    (run / "configs").mkdir()
    (run / "configs" / "sft-s0.yaml").write_text("seed: 0\n")
    (run / "table2.md").write_text("# table\n")
    (run / "annotate").mkdir()
    (run / "annotate" / "README.md").write_text("| demonstrations | 2 |\n")
    (run / "sft-s0" / "final").mkdir(parents=True)
    (run / "sft-s0" / "final" / "adapter_model.safetensors").write_bytes(b"\0" * 10)
    big = run / "notes.md"
    big.write_text("x" * 2_000_001)
    keep = script("keep_results").keep
    dest = tmp_path / "results" / "run"
    copied, skipped = keep(run, dest)
    kept = {p.relative_to(dest).as_posix() for p in copied}
    assert {"protocol.json", "configs/sft-s0.yaml", "table2.md", "annotate.md"} <= kept
    for seed in (0, 1):
        assert {f"eval-test-s{seed}/report.json", f"eval-test-s{seed}/episodes.csv"} <= kept
    assert not any("safetensors" in k or k.endswith(".jsonl") for k in kept)  # weights, raw
    assert "eval-test-s0/episodes.jsonl.gz" in kept  # the records, gzipped
    assert skipped == [f"{big} ({big.stat().st_size:,} bytes)"]  # over the limit: listed
    runs = [run / "eval-test-s0", run / "eval-test-s1"]
    again = [dest / "eval-test-s0", dest / "eval-test-s1"]
    assert seeds_table(again).replace(str(dest), "X") == seeds_table(runs).replace(str(run), "X")
    # versus and edits read the gzipped records as they read the run's own
    w = RewardWeights(success=1.0, compaction_cost=0.1)
    assert versus_start(again[0], again[1], w).replace(str(dest), "X") == versus_start(
        runs[0], runs[1], w
    ).replace(str(run), "X")
    assert edit_change_md(again[0], again[1]).replace(str(dest), "X") == edit_change_md(
        runs[0], runs[1]
    ).replace(str(run), "X")
    with pytest.raises(SystemExit, match=r"has no protocol\.json"):
        keep(tmp_path / "results", tmp_path / "elsewhere")
