"""GRPO: the reward rises on a learnable task, --resume is exact, the CLI runs a step."""

from __future__ import annotations

import contextlib
import itertools
import json
import math
from pathlib import Path
from typing import ClassVar

import pytest

from acmrl.config import ConfigError, GRPOConfig, load_config
from acmrl.train.checkpoint import latest_checkpoint
from acmrl.train.grpo import run_grpo, token_batches
from acmrl.train.grpo_steps import step_tasks
from acmrl.train.samples import Sample
from tests.grpo_env import TargetEnv, override, target_word


@pytest.fixture(scope="module")
def peaked_model(tmp_path_factory, default_model_dir):
    """A tiny random model with large weights: its next-token distribution is peaked, so a
    word outside its favourite is said now and then (the reward has variance from step 1)."""
    from acmrl.config import DEFAULT_MODEL
    from acmrl.models import build_tiny_model

    out = tmp_path_factory.mktemp("peaked") / "model"
    return build_tiny_model(out, tokenizer_from=DEFAULT_MODEL, initializer_range=1.0)


@pytest.fixture(scope="module")
def target(peaked_model):
    """The model's second most likely first word on the task: said in roughly 1 reply in 7."""
    return target_word(peaked_model)[0]


def config(tmp_path, model, target, **kw) -> GRPOConfig:
    cfg = GRPOConfig(output=str(tmp_path / "grpo"), log_with=[], save_rollouts=False)
    cfg.model.name = str(model)
    cfg.arms = ["react"]
    cfg.agent.max_turns = 1
    cfg.sampling.max_new_tokens = 2
    cfg.sampling.stop = [target]
    cfg.group_size = 8
    cfg.tasks_per_step = 2
    cfg.optim.lr = 3e-3
    cfg.optim.schedule = "constant"
    return override(cfg, **kw)


def test_step_tasks_cover_each_epoch_in_a_seeded_order():
    cfg = GRPOConfig(tasks_per_step=3)
    tasks = TargetEnv(tasks=5).tasks()
    first = [t.id for s in range(5) for t in step_tasks(tasks, s, cfg)]  # 15 = 3 epochs
    assert sorted(first[:5]) == sorted(first[5:10]) == [f"t{i}" for i in range(5)]
    assert first == [t.id for s in range(5) for t in step_tasks(tasks, s, cfg)]  # deterministic
    assert first[:5] != first[5:10]  # each epoch reshuffled


def test_token_batches_respect_the_budget():
    samples = [Sample("e", i, token_ids=[1] * n) for i, n in enumerate([10, 50, 30, 200, 40])]
    batches = token_batches(samples, budget=100, max_len=1000)
    assert sorted(i for b in batches for i in b) == [0, 1, 2, 3, 4]
    for b in batches:
        longest = max(len(samples[i].token_ids) for i in b)
        assert len(b) == 1 or longest * len(b) <= 100


def test_token_batches_read_a_shared_start_once():
    """With ``shared``, a micro-batch holds samples of one start and its common prefix counts
    once, so the same work budget takes more rows; without, rows x longest row."""
    heads = [list(range(100, 700)), list(range(2000, 2600))]
    samples = [
        Sample("e", i, token_ids=heads[i % 2] + [5000 + i] * (50 + i), loss_mask=[0] * 650 + [1])
        for i in range(12)
    ]
    plain = token_batches(samples, budget=1800, max_len=1000)
    shared = token_batches(samples, budget=1800, max_len=1000, shared=True)
    assert max(len(b) for b in plain) == 2
    assert sorted(i for b in shared for i in b) == list(range(12))
    for b in shared:
        assert len({i % 2 for i in b}) == 1  # one start per micro-batch
        lengths = [len(samples[i].token_ids) for i in b]
        assert lengths == sorted(lengths)  # still in order of length: little padding
        assert 600 + (max(lengths) - 600) * len(b) <= 1800
    assert max(len(b) for b in shared) >= 5 and len(shared) < len(plain)


def test_grpo_reads_the_shared_prefix_once_and_updates_the_same(
    tmp_path, peaked_model, target, monkeypatch
):
    """optim.share_prefix (the default) reads the group's common prompt once per micro-batch; the
    losses and rewards are those of the plain forward."""
    import acmrl.train.loss as loss

    calls = []
    real = loss._shared_prefix_logits

    def counted(*args):
        calls.append(args[-1])  # the shared length
        return real(*args)

    monkeypatch.setattr(loss, "_shared_prefix_logits", counted)
    kw = dict(optim__max_steps=2, lora__r=4, group_size=4, skip_flat_groups=False)
    plain = config(tmp_path / "a", peaked_model, target, optim__share_prefix=False, **kw)
    plain_result = run_grpo(plain, env=TargetEnv(target))
    assert calls == []
    shared = run_grpo(config(tmp_path / "b", peaked_model, target, **kw), env=TargetEnv(target))
    assert calls and min(calls) >= loss.MIN_SHARED_PREFIX
    assert shared["rewards"] == plain_result["rewards"]
    assert shared["losses"] == pytest.approx(plain_result["losses"], rel=1e-4, abs=1e-6)
    assert any(abs(x) > 0 for x in shared["losses"])


def test_greedy_sampling_and_served_engines_are_refused():
    with pytest.raises(ConfigError, match="temperature"):
        load_config(GRPOConfig, None, ["sampling.temperature=0"])
    with pytest.raises(ConfigError, match=r"engine\.kind=vllm \(colocated\).*enable lora"):
        load_config(GRPOConfig, None, ["engine.kind=vllm", "lora.enabled=false"])
    assert load_config(GRPOConfig, None, ["engine.kind=vllm"]).engine.kind == "vllm"
    # served engines take full fine-tuning: the weights are streamed (acmrl/train/weight_sync.py)
    served = ["engine.kind=openai", "engine.base_urls=[http://x]", "lora.enabled=false"]
    assert not load_config(GRPOConfig, None, served).lora.enabled


class RecordingClient:
    """Stands in for TRL's VLLMClient, whose NCCL weight transfer needs CUDA and a vLLM server
    (neither is on this machine): records every call and the tensors streamed."""

    made: ClassVar[list[RecordingClient]] = []

    def __init__(self, base_url: str, group_port: int, connection_timeout: float) -> None:
        self.base_url, self.group_port = base_url, group_port
        self.calls: list[str] = []
        self.pushes: list[dict] = []
        self.inside = False
        RecordingClient.made.append(self)

    def init_communicator(self, device) -> None:
        self.calls.append(f"init:{device}")

    @contextlib.contextmanager
    def weight_update(self):
        self.calls.append("start")
        self.inside = True
        yield
        self.inside = False
        self.calls.append("finish")

    def update_named_params(self, metadata, named_params) -> None:
        assert self.inside  # one grouped update per push
        got = {n: t.clone() for n, t in named_params}
        assert [m[0] for m in metadata] == list(got)
        for name, dtype, shape in metadata:
            assert dtype == str(got[name].dtype).removeprefix("torch.")
            assert shape == list(got[name].shape)
        self.pushes.append(got)
        self.calls.append("update")

    def reset_prefix_cache(self) -> None:
        self.calls.append("reset")

    def close_communicator(self) -> None:
        self.calls.append("close")


def test_full_fine_tuning_streams_the_weights_to_every_server(
    tmp_path, peaked_model, target, monkeypatch
):
    """GRPO without LoRA against two `acmrl serve` processes (the rollouts are real): after the
    start and after every step the full weights go to each server in one grouped update
    through the client (TRL's VLLMClient in a real run), by their Hugging Face names, then the
    server's prefix cache is reset. The last push is the saved final model."""
    from safetensors.torch import load_file

    from acmrl.train import weight_sync
    from tests.test_engine_openai import start_server

    RecordingClient.made = []
    monkeypatch.setattr(weight_sync, "CLIENT_CLS", RecordingClient)
    started = [start_server(peaked_model) for _ in range(2)]
    try:
        cfg = config(tmp_path, peaked_model, target, lora__enabled=False, optim__max_steps=2)
        cfg.engine.kind, cfg.engine.base_urls = "openai", [url for _, url in started]
        cfg.skip_flat_groups = False
        result = run_grpo(cfg, env=TargetEnv(target))
    finally:
        for proc, _ in started:
            proc.kill()
            proc.wait()
    assert result["steps"] == 2
    clients = RecordingClient.made
    assert [c.base_url for c in clients] == cfg.engine.base_urls
    assert [c.group_port for c in clients] == [51216, 51217]
    for c in clients:
        assert c.calls == ["init:cpu"] + ["start", "update", "finish", "reset"] * 3 + ["close"]
    start = load_file(str(Path(peaked_model) / "model.safetensors"))
    final = load_file(str(tmp_path / "grpo" / "final" / "model.safetensors"))
    first, last = clients[0].pushes[0], clients[0].pushes[-1]
    assert set(first) == set(final) and "lm_head.weight" not in first  # tied: sent once
    assert all(torch_equal(first[n], start[n]) for n in first)
    assert all(torch_equal(last[n], final[n]) for n in last)
    assert not all(torch_equal(first[n], last[n]) for n in last)  # the policy moved
    assert all(torch_equal(clients[1].pushes[-1][n], last[n]) for n in last)


def torch_equal(a, b) -> bool:
    import torch

    return torch.equal(a.to(b.dtype), b)


def test_full_weight_sync_needs_cuda():
    import torch

    from acmrl.train.weight_sync import FullWeightSync, WeightSyncError

    with pytest.raises(WeightSyncError, match=r"needs a CUDA device.*lora\.enabled=true"):
        FullWeightSync(["http://x:8000"], torch.device("cpu"), 51216)
    trl_utils = pytest.importorskip("trl.import_utils")  # installed with the bench extra

    if not trl_utils.is_vllm_available():  # this project's environment: TRL without vLLM
        from acmrl.train.weight_sync import _trl_client

        with pytest.raises(WeightSyncError, match=r"needs vllm installed beside the trainer"):
            _trl_client()


def test_grpo_with_served_rollouts_syncs_the_adapter(tmp_path, peaked_model, target):
    """Rollouts from two `acmrl serve` processes; after every step the trainer's LoRA adapter is
    loaded into both (vLLM's runtime adapter API) and sampled from: the logprobs the servers
    report match the trainer's recomputation at every step while the policy moves."""
    import urllib.request

    from tests.test_engine_openai import start_server

    started = [start_server(peaked_model, "allow_adapter_loading=true") for _ in range(2)]
    try:
        urls = [url for _, url in started]
        kw = dict(optim__max_steps=3, lora__r=4, group_size=4, updates_per_step=2, optim__lr=2e-2)
        cfg = config(tmp_path, peaked_model, target, **kw)
        cfg.engine.kind, cfg.engine.base_urls = "openai", urls
        cfg.skip_flat_groups = False
        result = run_grpo(cfg, env=TargetEnv(target))
        rows = [json.loads(line) for line in (tmp_path / "grpo" / "metrics.jsonl").open()]
        mismatch = [r["train/logprob_mismatch"] for r in rows]
        print(f"served GRPO: rewards {result['rewards']}, logprob mismatch per step {mismatch}")
        assert result["steps"] == 3 and max(mismatch) < 1e-3, mismatch
        assert any(abs(x) > 0 for x in result["losses"])  # the policy moved
        for url in urls:  # the newest adapter is served, the older ones were unloaded
            with urllib.request.urlopen(f"{url}/v1/models") as resp:
                names = [m["id"] for m in json.loads(resp.read())["data"]]
            assert len(names) == 2 and names[1].startswith("acmrl-"), names
    finally:
        for proc, _ in started:
            proc.kill()
            proc.wait()


def test_grpo_raises_the_mean_reward(tmp_path, peaked_model, target):
    """Must show: on a trivially learnable reward, 20 GRPO steps raise the mean reward."""
    cfg = config(tmp_path, peaked_model, target, lora__enabled=False, optim__max_steps=20)
    cfg.log_with = ["tensorboard"]
    result = run_grpo(cfg, env=TargetEnv(target))
    rewards = result["rewards"]
    assert len(rewards) == 20
    first, last = sum(rewards[:3]) / 3, sum(rewards[-5:]) / 5
    assert first < 0.5, rewards
    assert last > first + 0.4, rewards  # measured: 0.25 -> 0.97
    assert (tmp_path / "grpo" / "final" / "model.safetensors").exists()
    assert list((tmp_path / "grpo").rglob("events.out.tfevents*"))


def test_grpo_resume_reproduces_the_uninterrupted_run(tmp_path, peaked_model, target):
    """LoRA with a KL to the adapter-less reference: kill after 2 steps, --resume, same losses."""
    kw = dict(
        optim__max_steps=4,
        save_every=2,
        kl_coef=0.1,
        lora__r=4,
        group_size=4,
        skip_flat_groups=False,
        updates_per_step=2,
    )
    full = run_grpo(config(tmp_path / "a", peaked_model, target, **kw), env=TargetEnv(target))
    cfg = config(tmp_path / "b", peaked_model, target, **kw)
    cfg.save_rollouts = True
    part = run_grpo(cfg, stop_after=2, env=TargetEnv(target))
    assert part["steps"] == 2 and part["final"] is None
    assert latest_checkpoint(cfg.output).name == "step-000002"
    resumed = run_grpo(cfg, resume=True, env=TargetEnv(target))
    assert resumed["steps"] == 4
    assert resumed["losses"] == pytest.approx(full["losses"], rel=1e-4, abs=1e-6)
    assert resumed["rewards"] == full["rewards"]
    assert any(abs(x) > 0 for x in full["losses"])
    lines = (tmp_path / "b" / "grpo" / "rollouts-rank0.jsonl").read_text().splitlines()
    assert len(lines) == 4 * 2 * 4  # steps x tasks x group, none written twice
    # the history without TensorBoard: one line per step, the resumed steps not repeated
    history = (tmp_path / "b" / "grpo" / "metrics.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in history]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert [r["reward/mean"] for r in rows] == full["rewards"]
    # the rollout tokens since the start carry over the resume, as runs are compared at them
    whole = [json.loads(x) for x in (tmp_path / "a" / "grpo" / "metrics.jsonl").open()]
    totals = [r["rollout/gen_tokens_total"] for r in rows]
    assert totals == [r["rollout/gen_tokens_total"] for r in whole]
    assert totals == list(itertools.accumulate(r["rollout/gen_tokens"] for r in rows))
    assert totals[-1] > totals[0] > 0 and all(r["rollout/prefill_tokens"] > 0 for r in rows)


def test_sigusr1_saves_the_step_and_resume_is_exact(tmp_path, peaked_model, target):
    """A real SIGUSR1 (Slurm's --signal) during step 2's rollouts: step 2 finishes, is saved,
    the run returns interrupted (exit code 138 in the CLI); --resume matches the full run."""
    import os
    import signal

    class Signalled(TargetEnv):
        started = 0

        def session(self, task):
            Signalled.started += 1
            if Signalled.started == 9:  # the first episode of step 2 (2 tasks x 4 per step)
                os.kill(os.getpid(), signal.SIGUSR1)
            return super().session(task)

    kw = dict(optim__max_steps=4, save_every=10, lora__r=4, group_size=4, skip_flat_groups=False)
    full = run_grpo(config(tmp_path / "a", peaked_model, target, **kw), env=TargetEnv(target))
    cfg = config(tmp_path / "b", peaked_model, target, **kw)
    part = run_grpo(cfg, env=Signalled(target))
    assert part["interrupted"] == signal.SIGUSR1 and part["exit_code"] == 138
    assert part["steps"] == 2 and part["final"] is None
    assert latest_checkpoint(cfg.output).name == "step-000002"
    assert signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL  # the handler is restored
    resumed = run_grpo(cfg, resume=True, env=TargetEnv(target))
    assert resumed["steps"] == 4 and resumed["interrupted"] is None
    assert resumed["losses"] == pytest.approx(full["losses"], rel=1e-4, abs=1e-6)
    assert resumed["rewards"] == full["rewards"]


def test_learning_curves_from_stage_evals_and_grpo_metrics(tmp_path):
    """curves.md holds a row per stage and arm; grpo.png plots the per-step history."""
    from acmrl.eval.curves import write_curves
    from acmrl.eval.report import build_report, rows_from
    from acmrl.rollout.records import Trajectory

    def folder(name: str, wins: int) -> Path:
        trajs = []
        for i in range(4):
            t = Trajectory(f"e{i}", f"t{i}", "env", "acm", 0, 0, "m", "q", "a")
            t.status, t.score, t.metrics = "answered", float(i < wins), {"budget": 100}
            trajs.append(t)
        rows = rows_from(trajs, lambda t: 100)
        report = build_report(rows, {"samples": 1})
        out = tmp_path / name
        out.mkdir()
        (out / "report.json").write_text(json.dumps(report))
        with (out / "episodes.jsonl").open("w") as f:
            f.writelines(json.dumps(t.to_dict()) + "\n" for t in trajs)
        return out

    grpo = tmp_path / "grpo"
    grpo.mkdir()
    (grpo / "metrics.jsonl").write_text(
        "".join(
            json.dumps({"step": s, "reward/mean": s / 4, "rollout/success": s / 4}) + "\n"
            for s in (1, 2, 3)
        )
    )
    result = write_curves([("base", folder("a", 0)), ("sft", folder("b", 3))], tmp_path, grpo)
    text = (tmp_path / "curves.md").read_text()
    assert "| base | acm | 4 | 0.000" in text and "| sft | acm | 4 | 0.750" in text
    assert "mean reward 0.250 -> 0.750" in text
    assert "| facts kept |" in text.splitlines()[2]  # no summaries in these episodes: "-"
    assert (tmp_path / "curves.png").stat().st_size > 0 and (tmp_path / "grpo.png").exists()
    assert [r["stage"] for r in result["rows"]] == ["base", "sft"]


def test_rollout_metrics_pool_the_facts_the_summaries_kept():
    """rollout/fact_retention: the kept needed facts over those the step's summaries replaced,
    pooled over episodes (an episode without a summary adds nothing); NaN with none."""
    from acmrl.rollout.records import Trajectory
    from acmrl.train.grpo_steps import episode_facts, rollout_metrics

    def facts(facts_in: int, kept: int, score: float) -> dict:
        t = Trajectory("e", "t", "env", "acm", 0, 0, "m", "q", "a")
        t.score, t.status = score, "answered"
        t.compute_metrics()
        t.metrics |= {"summary_facts_in": facts_in, "summary_facts_kept": kept}
        return episode_facts(t, score, {"success": score})

    m = rollout_metrics([facts(4, 3, 1.0), facts(2, 0, 0.0), facts(0, 0, 0.0)])
    assert m["rollout/fact_retention"] == 0.5 and m["rollout/success"] == pytest.approx(1 / 3)
    assert math.isnan(rollout_metrics([facts(0, 0, 1.0)])["rollout/fact_retention"])


def test_rollout_metrics_follow_the_evolve_programs():
    """rollout/evolve/*: the step's valid-program rate (a call that never ran counts), and per
    program the tokens generated, the Cache Cost and the prefix kept; episodes without a
    program add nothing, and kinds no episode made are not logged."""
    from acmrl.rollout.records import ContextEvent, ModelCall, Step, Trajectory
    from acmrl.train.grpo_steps import episode_facts, rollout_metrics

    call = ModelCall("policy", [1], [2], [], 0, "stop", 0.0)

    def episode(*events, malformed=0):
        t = Trajectory("e", "t", "env", "evolve", 0, 0, "m", "q", "a")
        t.steps = [
            Step(i, call, actions=[{"name": "evolve"}], events=[e]) for i, e in enumerate(events)
        ]
        bad = '<tool_call>{"name": "evolve", "arguments": {"code": "x"</tool_call>'
        t.steps += [Step(9, call, text=bad, errors=["bad json"])] * malformed
        t.score, t.status = 1.0, "answered"
        t.compute_metrics()
        return episode_facts(t, 1.0, {"success": 1.0})

    good = ContextEvent("evolve", 1000, 500, 800, 100, 300, 0, 400.0)
    refused = ContextEvent("evolve", 500, 560, 500, 60, 100, 0, 160.0, applied=False, detail="x")
    m = rollout_metrics([episode(good, refused), episode(malformed=1), episode()])
    assert m["rollout/evolve/valid_rate"] == pytest.approx(1 / 3)
    assert m["rollout/evolve/effective_rate"] == pytest.approx(1 / 3)  # it cut 1,000 to 500
    assert m["rollout/evolve/generated"] == 200 and m["rollout/evolve/cache_cost"] == 80
    # the applied program's 0.8; the refused one only appended its receipt and is not counted
    assert m["rollout/evolve/kept_prefix"] == pytest.approx(0.8)
    assert not any(k.startswith("rollout/manage_context") for k in m)


def test_cli_runs_grpo_on_kb_search(tmp_path, tiny_model_dir):
    from typer.testing import CliRunner

    from acmrl.cli import app

    out = tmp_path / "cli"
    args = [
        "train",
        "grpo",
        f"model.name={tiny_model_dir}",
        "env.name=kb_search",
        "env.options={preset: tiny}",
        "optim.max_steps=1",
        "group_size=2",
        "tasks_per_step=1",
        "agent.max_turns=2",
        "sampling.max_new_tokens=8",
        "lora.r=4",
        "log_with=[]",
        f"output={out}",
        "skip_flat_groups=false",
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "steps 1" in result.output
    assert (out / "final" / "adapter_config.json").exists()


def test_the_sampler_copy_computes_the_live_policy_after_every_refresh(peaked_model):
    """A merged float32 copy of a LoRA policy gives the policy's logits; after the adapter
    moves it is stale until refreshed, and the live base weights are never touched."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from acmrl.train.sampler import SamplerCopy

    base = AutoModelForCausalLM.from_pretrained(peaked_model)
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"])
    policy = get_peft_model(base, lora)
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    before = {n: p.clone() for n, p in policy.named_parameters() if "lora_" not in n}
    copy = SamplerCopy(policy, torch.float32)
    ids = torch.tensor([[5, 17, 99, 3, 250, 8]])
    with torch.no_grad():
        live = policy(input_ids=ids).logits
        # the merged product rounds differently from the adapter's two matmuls: ~1e-4 on logits
        # of size ~10; a stale copy is off by far more (checked below)
        assert torch.allclose(copy.model(input_ids=ids).logits, live, atol=2e-3)
        for name, p in policy.named_parameters():
            if "lora_A" in name:
                p.add_(0.3)  # an optimiser step
        moved = policy(input_ids=ids).logits
        assert (copy.model(input_ids=ids).logits - moved).abs().max() > 0.1
        copy.refresh()
        assert torch.allclose(copy.model(input_ids=ids).logits, moved, atol=2e-3)
    for n, p in policy.named_parameters():
        if "lora_" not in n:
            assert torch.equal(p, before[n]), n


def test_grpo_samples_from_a_bf16_copy_and_still_learns(tmp_path, peaked_model, target):
    """rollout_dtype=bfloat16: the engine runs a merged bf16 copy, refreshed every step; the
    reward rises as with the live weights (it would not if the copy were stale: the rewards
    are the copy's samples), and the logged engine-vs-trainer gap stays bounded."""
    cfg = config(
        tmp_path,
        peaked_model,
        target,
        lora__enabled=False,
        optim__max_steps=20,
        rollout_dtype="bfloat16",
    )
    cfg.log_with = []
    result = run_grpo(cfg, env=TargetEnv(target))
    rewards = result["rewards"]
    first, last = sum(rewards[:3]) / 3, sum(rewards[-5:]) / 5
    assert last > first + 0.3, rewards
    rows = [json.loads(x) for x in (tmp_path / "grpo" / "metrics.jsonl").read_text().splitlines()]
    gaps = [r["train/logprob_mismatch"] for r in rows if "train/logprob_mismatch" in r]
    # per target token, in nats: large on this tiny model of huge weights (bf16 rounds its
    # logits of ~10 coarsely), and it does not grow as the policy moves (a stale copy would)
    assert len(gaps) >= 5 and max(gaps) < 0.5 and max(gaps[-3:]) <= max(gaps[:3]), gaps


def test_groups_without_a_success_are_dropped_not_ranked_by_cost():
    """All-failed groups differ by cost only: std-scaled, the cheapest failure (here an early
    overflow with no compaction) would get the full positive advantage. ``skip_failed_groups``
    zeroes them and keeps the all-success group, whose cost differences are the timing signal."""
    from types import SimpleNamespace

    from acmrl.train.grpo import GRPOTrainer
    from acmrl.train.grpo_steps import reward_weights

    def episode(group: str, i: int, score: float, cost: float):
        traj = {
            "score": score,
            "metrics": {"budget": 1000},
            "steps": [
                {
                    "actions": [{"name": "manage_context"}],
                    "events": [
                        {"kind": "manage_context", "applied": True, "compaction_cost": cost}
                    ],
                }
            ]
            if cost
            else [],
        }
        traj = SimpleNamespace(to_dict=lambda t=traj: t, metrics={})
        return SimpleNamespace(id=f"s0/0/{group}#acm#{i}", traj=traj, budget=1000)

    failed = [episode("t1", i, 0.0, c) for i, c in enumerate([0, 800, 900, 1200])]
    won = [episode("t2", i, 1.0, c) for i, c in enumerate([600, 600, 1200, 1200])]
    for skip in (False, True):
        cfg = GRPOConfig(scale_advantages=True, skip_failed_groups=skip)
        fake = SimpleNamespace(cfg=cfg, weights=reward_weights(cfg), scouts=set())
        _, adv, _ = GRPOTrainer.advantages(fake, failed + won)
        if skip:
            assert adv[:4] == [0.0] * 4
        else:
            assert adv[0] == max(adv[:4]) > 0.9  # the overflow without a compaction wins
        assert adv[4] == adv[5] > 0.9 and adv[6] == adv[7] < -0.9  # cheaper successes win


def test_a_step_without_any_signal_takes_no_optimiser_step(tmp_path, tiny_model_dir):
    """Every group flat (here: no success anywhere, with ``skip_failed_groups``): no gradient, so
    no optimiser step (Adam keeps no state, the LoRA B matrices stay at their zero init), the
    schedule still advances by the step's updates, and torch's warning about a scheduler step
    before an optimiser step (the intended order here) is not shown to the user."""
    import warnings

    import torch
    from safetensors.torch import load_file
    from typer.testing import CliRunner

    from acmrl.cli import app

    out = tmp_path / "flat"
    args = ["train", "grpo", f"model.name={tiny_model_dir}", "env.name=kb_search"]
    args += ["env.options={preset: tiny}", "optim.max_steps=1", "group_size=2"]
    args += ["tasks_per_step=1", "agent.max_turns=2", "sampling.max_new_tokens=8", "lora.r=4"]
    args += ["log_with=[]", f"output={out}", "skip_failed_groups=true"]
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert not [w for w in seen if "lr_scheduler.step" in str(w.message)]
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["rollout/success"] == 0.0 and rows[-1]["train/target_tokens"] == 0.0
    weights = load_file(out / "final" / "adapter_model.safetensors")
    b = [t for k, t in weights.items() if "lora_B" in k]
    assert b and all(float(t.abs().max()) == 0.0 for t in b)
    saved = torch.load(out / "checkpoints" / "step-000001" / "training.pt", weights_only=False)
    assert saved["optimizer"]["state"] == {}  # Adam never stepped
    assert saved["scheduler"]["last_epoch"] == 1  # the schedule did, once per update
