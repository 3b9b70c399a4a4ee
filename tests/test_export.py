"""acmrl export: merged safetensors that transformers loads and acmrl rollout runs."""

from __future__ import annotations

import json

import pytest
import torch

from acmrl.config import ExportConfig
from acmrl.context.render import acmrl_chat_template
from acmrl.train.export import run_export


@pytest.fixture(scope="module")
def adapter(tmp_path_factory, tiny_model_dir):
    """A LoRA adapter over the tiny model with non-zero weights (a fresh one is a no-op)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    peft = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    torch.manual_seed(1)
    with torch.no_grad():
        for name, p in peft.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    out = tmp_path_factory.mktemp("adapter") / "final"
    peft.save_pretrained(out)
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(out)
    return out


def _logits(model, ids):
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits[0, -1]


def test_export_merges_the_adapter_and_writes_a_complete_folder(tmp_path, adapter, tiny_model_dir):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    cfg = ExportConfig(output=str(tmp_path / "export"))
    cfg.model.name = str(adapter)
    cfg.env.options = {"preset": "tiny", "seed": 0}
    out = run_export(cfg)
    assert (out / "model.safetensors").exists()
    assert not (out / "adapter_config.json").exists()
    assert not list(tmp_path.glob(".tmp-*"))  # published by rename

    tok = AutoTokenizer.from_pretrained(out)
    assert tok.chat_template == acmrl_chat_template()
    gen = GenerationConfig.from_pretrained(out)
    assert tok.convert_tokens_to_ids("<|im_end|>") in gen.eos_token_id

    ids = tok.encode("Where was the Amber Kite Fair held?")
    exported = AutoModelForCausalLM.from_pretrained(out)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    trained = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(tiny_model_dir), adapter
    )
    assert torch.allclose(_logits(exported, ids), _logits(trained, ids), atol=1e-4)
    assert not torch.allclose(_logits(exported, ids), _logits(base, ids), atol=1e-2)

    spec = json.loads((out / "acmrl.json").read_text())
    assert spec["arm"] == "acm" and spec["max_context_tokens"] == 1024
    names = [t["function"]["name"] for t in spec["tools"]]
    assert {"search", "answer", "manage_context", "query_memory"} <= set(names)
    card = (out / "README.md").read_text()
    assert spec["system_prompt"] in card and '"manage_context"' in card
    assert "base_model:" in card


def test_exported_folder_runs_under_acmrl_rollout(tmp_path, adapter):
    from typer.testing import CliRunner

    from acmrl.cli import app

    cfg = ExportConfig(output=str(tmp_path / "export"))
    cfg.model.name = str(adapter)
    cfg.env.options = {"preset": "tiny", "seed": 0}
    out = run_export(cfg)
    traj = tmp_path / "rollout" / "trajectories.jsonl"
    args = [
        "rollout",
        f"model.name={out}",
        "env.options={preset: tiny}",
        "env.limit=1",
        "arms=[acm]",
        "agent.max_turns=2",
        "sampling.max_new_tokens=8",
        f"output={traj}",
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert json.loads(traj.read_text().splitlines()[0])["arm"] == "acm"


def test_export_refuses_an_eval_dir_without_a_report(tmp_path, adapter):
    cfg = ExportConfig(output=str(tmp_path / "export"), eval_dir=str(tmp_path))
    cfg.model.name = str(adapter)
    with pytest.raises(ValueError, match=r"no report\.md"):
        run_export(cfg)


def _cfg(tmp_path, adapter, **kw):
    cfg = ExportConfig(output=str(tmp_path / "export"), **kw)
    cfg.model.name = str(adapter)
    cfg.env.options = {"preset": "tiny", "seed": 0}
    return cfg


def test_export_in_bf16(tmp_path, adapter):
    """The export's weights in the dtype asked for."""
    from safetensors import safe_open

    out = run_export(_cfg(tmp_path, adapter, dtype="bfloat16"))
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        dtypes = {f.get_slice(k).get_dtype() for k in f.keys()}  # noqa: SIM118
    assert dtypes == {"BF16"}
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"


def test_export_adapter_only(tmp_path, adapter, tiny_model_dir):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = run_export(_cfg(tmp_path, adapter, adapter_only=True))
    assert (out / "adapter_config.json").exists() and not (out / "model.safetensors").exists()
    assert AutoTokenizer.from_pretrained(out).chat_template == acmrl_chat_template()
    card = (out / "README.md").read_text()
    assert "a LoRA adapter of" in card and f"base_model: {tiny_model_dir}" in card
    ids = AutoTokenizer.from_pretrained(out).encode("Where was the Amber Kite Fair held?")
    loaded = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir), out)
    trained = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(tiny_model_dir), adapter
    )
    assert torch.allclose(_logits(loaded, ids), _logits(trained, ids), atol=1e-5)
    with pytest.raises(ValueError, match="not an adapter folder"):
        run_export(_cfg(tmp_path, tiny_model_dir, adapter_only=True))


def test_push_to_hub_uploads_the_finished_folder(tmp_path, adapter, monkeypatch):
    """The upload itself cannot run here (no network): the Hub client is replaced by a recorder,
    and the test checks what it is handed, up to the prepared folder."""
    import huggingface_hub

    from acmrl.config import ConfigError

    calls = []

    class Recorder:
        def create_repo(self, repo_id, private, exist_ok):
            calls.append(("create", repo_id, private))
            return f"https://huggingface.co/{repo_id}"

        def upload_folder(self, folder_path, repo_id, commit_message):
            files = sorted(p.name for p in __import__("pathlib").Path(folder_path).iterdir())
            calls.append(("upload", folder_path, repo_id, files))

    monkeypatch.setattr(huggingface_hub, "HfApi", Recorder)
    out = run_export(_cfg(tmp_path, adapter, push_to_hub=True, hub_repo_id="me/acm-policy"))
    assert calls[0] == ("create", "me/acm-policy", True)
    kind, folder, repo, files = calls[1]
    assert (kind, folder, repo) == ("upload", str(out), "me/acm-policy")
    assert {"model.safetensors", "README.md", "acmrl.json", "config.json"} <= set(files)
    with pytest.raises(ConfigError, match="hub_repo_id"):
        ExportConfig(push_to_hub=True).check()


def test_the_spec_carries_the_agent_settings_the_policy_was_trained_under():
    from acmrl.train.export import agent_spec, model_card

    cfg = ExportConfig(arm="evolve")
    cfg.env.options = {"preset": "tiny", "seed": 0}
    default = agent_spec(cfg)
    assert default["agent"] == {}
    cfg.agent.evolve_prompt, cfg.agent.evolve_keep_code = "none", False
    spec = agent_spec(cfg)
    assert spec["agent"] == {"evolve_prompt": "none", "evolve_keep_code": False}
    assert len(spec["system_prompt"]) < len(default["system_prompt"])
    card = model_card(spec, "src", None, "no eval")
    assert (
        "acmrl rollout model.name=THIS_FOLDER arms=[evolve] agent.evolve_prompt=none "
        "agent.evolve_keep_code=false" in card
    )
