"""SFT on an annotated dataset: the loss falls, checkpoints are atomic, --resume is exact."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import yaml

from acmrl.config import SFTConfig
from acmrl.train.checkpoint import latest_checkpoint
from acmrl.train.sft import run_sft


@pytest.fixture(scope="module")
def dataset(tmp_path_factory, tiny_model_dir):
    """A small annotated dataset from kb_search tiny (scripted student, oracle teacher)."""
    from transformers import AutoTokenizer

    from acmrl.config import AnnotateConfig
    from acmrl.context.render import format_tool_call
    from acmrl.engines.scripted import ScriptedEngine
    from acmrl.teacher.annotate import run_annotate

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)

    def reply(session_id: str, prompt: str) -> str:
        if "<tool_response>" not in prompt:
            return "I think it is the Amber Kite Fair."
        return format_tool_call("answer", {"text": "Amber Kite Fair"})

    out = tmp_path_factory.mktemp("ann")
    cfg = AnnotateConfig(output=str(out), resumes=1)
    cfg.env.options = {"preset": "tiny", "seed": 0}
    cfg.env.split, cfg.env.limit = "train", 4
    cfg.agent.max_turns = 3
    run_annotate(cfg, engine=ScriptedEngine(tok, reply))
    return out


def config(tmp_path, dataset, tiny_model_dir, **optim) -> SFTConfig:
    cfg = SFTConfig(
        dataset=str(dataset), output=str(tmp_path / "sft"), save_every=3, log_with=["tensorboard"]
    )
    cfg.model.name = str(tiny_model_dir)
    cfg.lora.r = 4
    cfg.optim.max_steps = 6
    cfg.optim.batch_tokens = 2048
    cfg.optim.lr = 5e-3
    for k, v in optim.items():
        setattr(cfg.optim, k, v)
    return cfg


def test_sft_lowers_the_loss_and_saves(tmp_path, dataset, tiny_model_dir):
    cfg = config(tmp_path, dataset, tiny_model_dir, max_steps=12, schedule="constant")
    result = run_sft(cfg)
    losses = result["losses"]
    assert len(losses) == 12
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3  # it learns the teacher's turns
    assert (tmp_path / "sft" / "final" / "adapter_config.json").exists()
    assert latest_checkpoint(tmp_path / "sft").name == "step-000012"
    assert list((tmp_path / "sft").rglob("events.out.tfevents*"))  # TensorBoard logs


def test_resume_reproduces_the_uninterrupted_losses(tmp_path, dataset, tiny_model_dir):
    full = run_sft(config(tmp_path / "a", dataset, tiny_model_dir))["losses"]
    cfg = config(tmp_path / "b", dataset, tiny_model_dir)
    first = run_sft(cfg, stop_after=3)["losses"]  # "killed" right after the step-3 checkpoint
    # a save that was killed half-way leaves a temporary folder, which resume ignores
    (tmp_path / "b" / "sft" / "checkpoints" / ".tmp-step-000004").mkdir()
    resumed = run_sft(cfg, resume=True)["losses"]
    assert first == full[:3]
    assert resumed == pytest.approx(full, rel=1e-4, abs=1e-5)


def test_bad_dataset_is_a_clear_error(tmp_path, tiny_model_dir):
    cfg = SFTConfig(dataset=str(tmp_path / "nothing"), output=str(tmp_path / "o"))
    cfg.model.name = str(tiny_model_dir)
    with pytest.raises(ValueError, match="not found: give the folder acmrl annotate wrote"):
        run_sft(cfg)
    with pytest.raises(ValueError, match="no complete checkpoint"):
        run_sft(cfg, resume=True)


def test_kl_to_the_teacher_topk_adds_to_the_loss(tmp_path, tiny_model_dir):
    """With stored teacher top-k (here the tiny model itself) and kl_coef > 0 the loss grows by a
    positive KL term; the first step's NLL is the same either way (same weights, same batch)."""
    from transformers import AutoTokenizer

    from acmrl.config import AnnotateConfig
    from acmrl.engines.scripted import ScriptedEngine
    from acmrl.teacher.annotate import run_annotate

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)

    def reply(session_id: str, prompt: str) -> str:
        return "I think it is the Amber Kite Fair."

    ann = AnnotateConfig(output=str(tmp_path / "ann"), resumes=1)
    ann.env.options = {"preset": "tiny", "seed": 0}
    ann.env.split, ann.env.limit = "train", 2
    ann.agent.max_turns = 2
    ann.teacher.topk, ann.teacher.topk_model = 3, str(tiny_model_dir)
    run_annotate(ann, engine=ScriptedEngine(tok, reply))
    plain = run_sft(config(tmp_path / "p", tmp_path / "ann", tiny_model_dir, max_steps=1))
    cfg = config(tmp_path / "k", tmp_path / "ann", tiny_model_dir, max_steps=1)
    cfg.kl_coef = 1.0
    with_kl = run_sft(cfg)
    assert with_kl["losses"][0] > plain["losses"][0] + 1e-4


def test_runs_with_different_precision_in_one_process(tmp_path, dataset, tiny_model_dir):
    """accelerate keeps one state per process; a bf16 run must not block a later fp32 run (the
    demo and notebooks train several times in one process)."""
    for i, precision in enumerate(["bf16", "no"]):
        cfg = config(tmp_path / str(i), dataset, tiny_model_dir, max_steps=1)
        cfg.optim.mixed_precision = precision
        assert run_sft(cfg)["steps"] == 1


def test_several_datasets_train_as_one(tmp_path, dataset, tiny_model_dir):
    """Demonstrations plus a teacher round on the trained student: dataset=[a, b]."""
    from acmrl.train.sft import load_samples

    one = load_samples(config(tmp_path, dataset, tiny_model_dir))
    cfg = config(tmp_path, dataset, tiny_model_dir)
    cfg.dataset = [str(dataset), str(dataset / "dataset")]  # the folder or its dataset/
    assert len(load_samples(cfg)) == 2 * len(one) > 0
    cfg.dataset = [str(dataset), str(tmp_path / "missing")]
    with pytest.raises(ValueError, match="missing"):
        load_samples(cfg)


def test_save_total_limit_keeps_the_newest_checkpoints(tmp_path, dataset, tiny_model_dir):
    cfg = config(tmp_path, dataset, tiny_model_dir, max_steps=4)
    cfg.save_every, cfg.save_total_limit = 1, 2
    run_sft(cfg)
    names = sorted(p.name for p in (tmp_path / "sft" / "checkpoints").iterdir())
    assert names == ["step-000003", "step-000004"]


def test_resume_from_a_checkpoint_and_a_changed_config_is_refused(
    tmp_path, dataset, tiny_model_dir
):
    full = run_sft(config(tmp_path / "a", dataset, tiny_model_dir))["losses"]
    ckpt = tmp_path / "a" / "sft" / "checkpoints" / "step-000003"
    # another output folder continues from run a's step 3: the same losses from step 4 on
    other = run_sft(config(tmp_path / "b", dataset, tiny_model_dir), resume_from=ckpt)
    assert other["losses"] == pytest.approx(full, rel=1e-4, abs=1e-5)
    assert (tmp_path / "b" / "sft" / "config.yaml").is_file()
    changed = config(tmp_path / "c", dataset, tiny_model_dir, lr=1e-3)
    changed.lora.r = 8
    with pytest.raises(ValueError, match=r"lora\.r: 4 -> 8; optim\.lr: 0\.005 -> 0\.001"):
        run_sft(changed, resume_from=tmp_path / "a" / "sft")
    # a run saved before an option existed resumes while the option keeps its default
    saved = tmp_path / "a" / "sft" / "config.yaml"
    old = yaml.safe_load(saved.read_text())
    assert old["lora"].pop("top_layers") is None and old.pop("min_weight") == 0.0
    saved.write_text(yaml.safe_dump(old))
    longer = config(tmp_path / "a", dataset, tiny_model_dir, max_steps=7)  # may change
    assert run_sft(longer, resume=True)["steps"] == 7


def test_sigterm_saves_and_resume_matches_the_uninterrupted_run(tmp_path, dataset, tiny_model_dir):
    """A real SIGTERM to `acmrl train sft`: it saves a checkpoint after the current step and
    exits with 143; --resume then gives the losses of the run that was never stopped."""
    import json
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    from acmrl.config import load_config

    def overrides(out: Path) -> list[str]:
        return [
            f"dataset={dataset}",
            f"model.name={tiny_model_dir}",
            f"output={out}",
            "lora.r=4",
            "optim.max_steps=40",
            "optim.batch_tokens=2048",
            "optim.lr=5e-3",
            "save_every=100",
            "log_with=[]",
        ]

    full = run_sft(load_config(SFTConfig, None, overrides(tmp_path / "full")))["losses"]
    out = tmp_path / "stopped"
    cli = Path(sys.executable).parent / "acmrl"
    proc = subprocess.Popen(
        [str(cli), "train", "sft", *overrides(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    metrics = out / "metrics.jsonl"
    deadline = time.monotonic() + 300
    while not (metrics.exists() and metrics.read_text().count("\n") >= 2):
        assert proc.poll() is None, proc.communicate()[0]
        assert time.monotonic() < deadline
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    log, _ = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, log
    ckpt = latest_checkpoint(out)
    stopped_at = json.loads((ckpt / "trainer_state.json").read_text())["step"]
    assert 2 <= stopped_at < 40, log
    assert "stopped by signal 15" in log
    assert not (out / "final").exists()
    resumed = run_sft(load_config(SFTConfig, None, overrides(out)), resume=True)
    assert resumed["steps"] == 40
    assert resumed["losses"] == pytest.approx(full, rel=1e-4, abs=1e-5)


def test_a_full_fine_tuning_checkpoint_loads_as_a_model(tmp_path, dataset, tiny_model_dir):
    """Checkpoints hold the tokenizer: eval or export can take `<checkpoint>/model` as it is."""
    from acmrl.config import ModelConfig
    from acmrl.models import load_model

    cfg = config(tmp_path, dataset, tiny_model_dir, max_steps=2)
    cfg.lora.enabled, cfg.save_every = False, 1
    run_sft(cfg)
    _, tok = load_model(ModelConfig(name=str(latest_checkpoint(cfg.output) / "model")))
    assert tok is not None and tok.decode(tok.encode("year 1712")) == "year 1712"


def test_gradient_checkpointing_gives_the_same_losses(tmp_path, dataset, tiny_model_dir):
    plain = run_sft(config(tmp_path / "a", dataset, tiny_model_dir, max_steps=3))["losses"]
    cfg = config(tmp_path / "b", dataset, tiny_model_dir, max_steps=3, gradient_checkpointing=True)
    from acmrl.train.common import build_model

    model = build_model(cfg, None)[0]
    assert any(getattr(m, "gradient_checkpointing", False) for m in model.modules())
    assert run_sft(cfg)["losses"] == pytest.approx(plain, rel=1e-5, abs=1e-6)


def test_top_layers_adapts_the_last_layers_and_stops_the_backward_there(
    tmp_path, dataset, tiny_model_dir
):
    """``lora.top_layers``: adapters only in the last N decoder layers, and no backward pass
    through the layers below them (their autograd graph is never recorded)."""
    import torch

    from acmrl.train.common import build_model

    def backward_calls(cfg):
        model = build_model(cfg, None)[0]
        layers = model.base_model.model.model.layers
        trained = {
            n.split(".layers.")[1].split(".")[0]
            for n, p in model.named_parameters()
            if p.requires_grad
        }
        calls = [0] * len(layers)
        for i, layer in enumerate(layers):
            layer.register_full_backward_hook(lambda *_, i=i: calls.__setitem__(i, calls[i] + 1))
        ids = torch.tensor([[1, 2, 3, 4, 5, 6]])
        model(input_ids=ids).logits.float().sum().backward()
        return trained, calls

    every_layer = backward_calls(config(tmp_path / "a", dataset, tiny_model_dir))
    top = config(tmp_path / "b", dataset, tiny_model_dir, max_steps=2)
    top.lora.top_layers = 1
    assert every_layer == ({"0", "1"}, [1, 1])
    assert backward_calls(top) == ({"1"}, [0, 1])
    result = run_sft(top)  # trains, and its adapter says where it applies
    assert result["steps"] == 2
    adapter = json.loads((Path(top.output) / "final" / "adapter_config.json").read_text())
    assert adapter["layers_to_transform"] == [1]
    top.lora.top_layers = 3
    with pytest.raises(ValueError, match=r"lora.top_layers=3: the model has only 2 decoder"):
        build_model(top, None)


def test_mixed_precision_follows_the_launcher(monkeypatch):
    from acmrl.train.common import resolve_precision

    monkeypatch.delenv("ACCELERATE_MIXED_PRECISION", raising=False)
    assert resolve_precision("auto") == "no"  # no GPU here
    assert resolve_precision("bf16") == "bf16"
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "bf16")  # accelerate launch --mixed_precision
    assert resolve_precision("auto") == "bf16"
    assert resolve_precision("bf16") == "bf16"
    with pytest.raises(ValueError, match=r"optim\.mixed_precision=fp16 contradicts the launcher's"):
        resolve_precision("fp16")
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "no")  # the launcher's default
    assert resolve_precision("fp16") == "fp16"


def test_batches_group_samples_that_start_alike():
    """With share_prefix, a batch holds samples of one start (one system prompt), and their
    common prefix counts once: more samples per batch for the same work."""
    from acmrl.train.sft import epoch_batches

    head_a, head_b = list(range(100, 700)), list(range(2000, 2600))
    samples = []
    for i in range(12):
        head = head_a if i % 2 else head_b
        ids = head + [5000 + i] * 100
        samples.append({"token_ids": ids, "loss_mask": [0] * 650 + [1] * 50})
    cfg = SFTConfig()
    cfg.optim.batch_tokens = 2000
    plain = epoch_batches(
        samples,
        0,
        dataclasses.replace(cfg, optim=dataclasses.replace(cfg.optim, share_prefix=False)),
    )
    shared = epoch_batches(samples, 0, cfg)
    assert max(len(b) for b in plain) == 2  # 700 tokens each, padded
    assert sorted(i for b in shared for i in b) == list(range(12))
    for b in shared:
        assert len({i % 2 for i in b}) == 1  # one system prompt per batch
        assert 600 + 100 * len(b) <= 2000 or len(b) == 1
    assert max(len(b) for b in shared) >= 6 and len(shared) < len(plain)
    assert epoch_batches(samples, 0, cfg) == shared != epoch_batches(samples, 1, cfg)


def test_malloc_trim_every_gives_freed_memory_back_every_n_steps(
    tmp_path, dataset, tiny_model_dir, monkeypatch
):
    import acmrl.train.loop

    calls = []
    monkeypatch.setattr(acmrl.train.loop, "release_freed_memory", lambda: calls.append(1))
    cfg = config(tmp_path / "a", dataset, tiny_model_dir, max_steps=5)
    cfg.model.malloc_trim_every = 2
    run_sft(cfg)
    assert len(calls) == 2  # after steps 2 and 4
    cfg = config(tmp_path / "b", dataset, tiny_model_dir, max_steps=5)
    cfg.model.malloc_trim_every = None
    run_sft(cfg)
    assert len(calls) == 2
