"""acmrl demo: every stage end to end at the smoke size (tiny random model), and a rerun skips."""

from __future__ import annotations

import json
import os
import signal

from acmrl.config import DemoConfig
from acmrl.demo import STAGES, stage_configs
from acmrl.train.common import MetricsLog

# the rows of a demo's summary: both arms, base and trained
BASE_AND_TRAINED = {("react", "base"), ("react", "trained"), ("acm", "base"), ("acm", "trained")}


def summary_rows(out) -> set[tuple[str, str]]:
    summary = json.loads((out / "summary.json").read_text())
    return {(r["arm"], r["model"]) for r in summary["rows"]}


def test_stage_configs_chain_the_stages(tmp_path):
    cfg = DemoConfig(size="tiny", output=str(tmp_path / "demo"))
    c = stage_configs(cfg)
    out = tmp_path / "demo"
    assert c["sft"].dataset == str(out / "annotate")
    assert c["round"].model.name == str(out / "sft" / "final") and not c["round"].demonstrations
    assert c["sft-round"].dataset == [str(out / "annotate"), str(out / "round")]
    assert c["sft-round"].model.name == str(out / "sft" / "final")
    # the round fine-tunes a good policy: a fifth of SFT's learning rate
    assert c["sft-round"].optim.lr == c["sft"].optim.lr / 5
    assert c["grpo"].model.name == str(out / "sft-round" / "final")
    assert c["eval-sft"].env == c["eval-round"].env == c["eval-base"].env
    assert c["eval-trained"].model.name == str(out / "grpo" / "final")
    assert c["export"].model.name == str(out / "grpo" / "final")
    assert c["export"].eval_dir == str(out / "eval-trained")
    assert c["eval-base"].env == c["eval-trained"].env  # the same held-out tasks
    assert c["eval-base"].env.split == "eval" and c["annotate"].env.split == "train"
    assert c["annotate"].demonstrations
    # the held-out worlds are never trained on
    trained = set(c["annotate"].env.options["seeds"])
    assert trained.isdisjoint(c["eval-base"].env.options["seeds"])
    assert c["grpo"].env == c["annotate"].env and len(trained) == 10
    assert c["eval-base"].agent.repeat_rule and c["annotate"].teacher.pressure_spread
    assert c["eval-base"].agent.text_call_rule and c["grpo"].agent.text_call_rule
    assert c["round"].teacher.switch_arms and c["round"].arms == ["react", "acm"]
    # SFT, the round's SFT and GRPO adapt the top 15 of SmolLM2's 30 layers; 0 asks for all
    assert c["sft"].lora.top_layers == c["sft-round"].lora.top_layers == 15
    assert c["grpo"].lora.top_layers == 15
    c = stage_configs(DemoConfig(size="tiny", output=str(tmp_path / "demo"), top_layers=0))
    assert c["sft"].lora.top_layers is None and c["sft-round"].lora.top_layers is None
    assert c["grpo"].lora.top_layers is None
    assert c["annotate"].teacher.answers == c["round"].teacher.answers == "plain"
    c = stage_configs(DemoConfig(size="tiny", output=str(tmp_path / "demo"), answers="cited"))
    assert c["annotate"].teacher.answers == c["round"].teacher.answers == "cited"
    small = stage_configs(DemoConfig(size="smoke", output=str(tmp_path / "s")))
    assert small["sft"].lora.top_layers is None  # a tiny model has fewer layers


def test_the_default_demo_trains_acm_on_chain_by_sft_alone(tmp_path, script):
    from acmrl.demo import SIZES

    out = tmp_path / "demo"
    c = stage_configs(DemoConfig(output=str(out)))
    # no teacher round and no GRPO: the SFT policy is the one evaluated and exported
    assert list(c) == ["eval-base", "annotate", "sft", "eval-trained", "export"]
    assert c["eval-trained"].model.name == c["export"].model.name == str(out / "sft" / "final")
    assert c["eval-trained"].arms == c["eval-base"].arms == ["react", "acm"]
    # acm's own best policy, compacting after every read, on 16 tasks of each of 10 worlds
    ann = c["annotate"]
    assert ann.arms == ["acm"] and ann.teacher.policy == "best" and ann.demonstrations
    assert ann.teacher.pressure_spread == [] and ann.teacher.late_share == 0.0
    assert ann.env.options["options"] == {"preset": "chain", "n_train": 16}
    assert c["eval-base"].env.options["options"] == {"preset": "chain", "n_eval": 8}
    # the fair overflow rule everywhere, the chain budget
    for stage in ("annotate", "eval-base", "eval-trained"):
        assert c[stage].agent.on_overflow == "force_answer", stage
        assert c[stage].agent.max_context_tokens == 2048, stage
    # held out from training, and never the chain protocol's dev or test worlds
    protocol = script("chain_table2")
    trained = set(ann.env.options["seeds"])
    held_out = set(c["eval-base"].env.options["seeds"])
    assert trained.isdisjoint(held_out)
    assert held_out.isdisjoint(protocol.DEV_WORLDS + protocol.TEST_WORLDS)
    assert c["sft"].optim.max_steps == SIZES["default"].sft_steps


def test_a_demo_without_round_or_grpo_skips_them(tmp_path, tiny_model_dir, monkeypatch):
    """The default's shape (SFT alone, on chain) at the smoke size: the stages it has run, the
    export and the curves read the SFT policy."""
    import dataclasses

    from typer.testing import CliRunner

    from acmrl import demo
    from acmrl.cli import app

    chain = dataclasses.replace(
        demo.SIZES["default"], train_worlds=1, train_tasks=2, eval_worlds=1, eval_tasks=2,
        max_turns=3, max_new_tokens=24, sft_steps=2, top_layers=None,
    )  # fmt: skip
    monkeypatch.setitem(demo.SIZES, "smoke", chain)
    out = tmp_path / "demo"
    args = ["demo", "--size", "smoke", f"model.name={tiny_model_dir}", f"output={out}"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    done = sorted(p.name for p in (out / ".done").iterdir())
    skipped = {"eval-sft", "round", "sft-round", "eval-round", "grpo", "grpo-vs-start"}
    assert done == sorted(set(STAGES) - skipped)
    assert "[8/8] curves" in result.output
    assert (out / "export" / "model.safetensors").exists()
    curves = (out / "curves" / "curves.md").read_text()
    assert "| sft | acm |" in curves and "| sft | react |" in curves and "grpo" not in curves
    assert summary_rows(out) == BASE_AND_TRAINED
    # each stage says what it left resident; its marker keeps the peak so far
    assert result.output.count("peak so far") == 8
    assert json.loads((out / ".done" / "sft").read_text())["peak_rss_gb"] > 0
    # the folder holds this size's demo: another size there is refused, not skipped through
    other = CliRunner().invoke(app, ["demo", "--size", "tiny", f"output={out}"])
    assert other.exit_code != 0 and "holds a demo of size 'smoke', not 'tiny'" in other.output


def test_rollouts_that_train_nothing_run_in_bf16_where_training_does(tmp_path):
    c = stage_configs(DemoConfig(size="tiny", output=str(tmp_path / "d"), precision="bf16"))
    for stage in ("eval-base", "eval-sft", "round", "eval-round", "eval-trained"):
        assert c[stage].model.dtype == "bfloat16", stage
        assert c[stage].engine.max_batch == c[stage].concurrency == 16, stage
    # the weights that train stay float32 (autocast), and so does GRPO's own sampler
    assert c["sft"].model.dtype == c["grpo"].model.dtype == "float32"
    assert c["sft"].optim.mixed_precision == "bf16"
    assert c["grpo"].optim.batch_tokens == 8192
    c = stage_configs(DemoConfig(size="tiny", output=str(tmp_path / "d"), precision="no"))
    assert c["eval-sft"].model.dtype == "float32"
    # float32 activations take twice the memory: GRPO's micro-batches are halved (8192 tokens
    # peaked at 22.5 GB on a 24 GB CPU machine without bf16)
    assert c["grpo"].optim.batch_tokens == 4096


def test_long_recipe_holds_out_enough_tasks_and_unseen_worlds(tmp_path):
    from acmrl.envs import load

    c = stage_configs(DemoConfig(size="long", output=str(tmp_path / "long")))
    held_out = load(c["eval-base"].env.name, **c["eval-base"].env.options)
    assert len(held_out.tasks("eval")[: c["eval-base"].env.limit]) >= 50
    trained = set(c["annotate"].env.options["seeds"])
    unseen = [c[k].env.options["seeds"] for k in c if k.startswith("eval-unseen")]
    assert len(unseen) == 2 and all(trained.isdisjoint(s) for s in unseen)
    assert all(set(s).isdisjoint(c["eval-base"].env.options["seeds"]) for s in unseen)
    assert c["eval-unseen-200"].model.name == str(tmp_path / "long" / "export")
    assert c["eval-unseen-200"].env.limit == 32 and c["eval-base"].env.limit == 56
    # the SFT stage's curve point on 16 tasks; GRPO's start is compared on all 56
    assert c["eval-sft"].env.limit == 16 and c["eval-round"].env.limit == 56
    assert c["eval-trained"].env == c["eval-round"].env
    assert c["grpo"].scale_advantages and c["grpo"].optim.lr == 2e-4
    assert c["grpo"].skip_failed_groups and c["grpo"].sampling.temperature == 0.8


def test_smoke_demo_runs_every_stage(tmp_path, tiny_model_dir, monkeypatch):
    from typer.testing import CliRunner

    from acmrl.cli import app

    out = tmp_path / "demo"
    args = ["demo", "--size", "smoke", f"model.name={tiny_model_dir}", f"output={out}"]
    bad = CliRunner().invoke(app, [*args, "stop_after=anotate"])
    assert bad.exit_code != 0 and "stop_after='anotate' is not a stage" in bad.output
    part = CliRunner().invoke(app, [*args, "stop_after=annotate"])
    assert part.exit_code == 0, part.output
    assert (out / ".done" / "annotate").exists() and not (out / ".done" / "sft").exists()
    assert "stopped after annotate" in part.output

    # a real SIGTERM during the SFT stage's first step: the step is saved, the stage is not
    # marked done, and the demo exits with 128 + 15; the rerun continues from that checkpoint
    write = MetricsLog.write

    def term_at_step_1(self, step, metrics):
        write(self, step, metrics)
        if step == 1:
            os.kill(os.getpid(), signal.SIGTERM)

    with monkeypatch.context() as patch:
        patch.setattr(MetricsLog, "write", term_at_step_1)
        stopped = CliRunner().invoke(app, args)
    assert stopped.exit_code == 128 + signal.SIGTERM, stopped.output
    assert "sft stopped by signal 15 after saving a checkpoint" in stopped.output
    assert not (out / ".done" / "sft").exists() and not (out / "sft" / "final").exists()
    saved = out / "sft" / "checkpoints" / "step-000001" / "training.pt"
    saved_at = saved.stat().st_mtime_ns
    result = CliRunner().invoke(app, args)  # continues inside the SFT stage
    assert result.exit_code == 0, result.output
    assert result.output.count("done already, skipped") == 3
    assert "sft: continuing from" in result.output and "step-000001" in result.output
    assert saved.stat().st_mtime_ns == saved_at  # step 1 was not trained again
    steps = [json.loads(line)["step"] for line in (out / "sft" / "metrics.jsonl").open()]
    assert steps == [1, 2]
    for stage in STAGES:
        assert (out / ".done" / stage).exists(), stage
    assert summary_rows(out) == BASE_AND_TRAINED
    assert (out / "export" / "model.safetensors").exists()
    assert "acmrl eval" in (out / "export" / "README.md").read_text()  # the report in the card
    assert "| acm | Pass@1 |" in (out / "compare.md").read_text()
    assert (out / "configs" / "grpo.yaml").exists()
    versus = (out / "grpo_vs_start.md").read_text()
    assert "| acm | Compaction Cost per success |" in versus and "the bar is" in versus
    curves = (out / "curves" / "curves.md").read_text()
    assert "| base | acm |" in curves and "| grpo | react |" in curves
    assert "| sft | acm |" in curves and "| teacher round | acm |" in curves
    assert "exported checkpoint:" in result.output and "wall time" in result.output

    again = CliRunner().invoke(app, args)  # every stage is done: only the summary runs
    assert again.exit_code == 0, again.output
    assert again.output.count("done already, skipped") == len(STAGES)
