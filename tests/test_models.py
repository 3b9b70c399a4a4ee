import json

import pytest
import torch

from acmrl.config import ModelConfig
from acmrl.models import (
    MARKER,
    ModelError,
    build_tiny_model,
    chat_generate,
    convert_gguf,
    embedded_gguf,
    load_model,
    resolve_model,
)


def test_tiny_model_is_small_and_deterministic(tiny_model_dir, tmp_path, default_model_dir):
    again = build_tiny_model(tmp_path / "again", tokenizer_from=str(default_model_dir))
    a, tok = load_model(ModelConfig(name=str(tiny_model_dir)))
    b, _ = load_model(ModelConfig(name=str(again)))
    assert sum(p.numel() for p in a.parameters()) < 3_000_000
    for (na, pa), (nb, pb) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        assert na == nb and torch.equal(pa, pb)
    other = build_tiny_model(tmp_path / "seed1", tokenizer_from=str(default_model_dir), seed=1)
    c, _ = load_model(ModelConfig(name=str(other)))
    assert not torch.equal(a.lm_head.weight, c.lm_head.weight)
    assert len(tok) == a.config.vocab_size == 49152


def test_tiny_model_generates(tiny_model_dir):
    model, tok = load_model(ModelConfig(name=str(tiny_model_dir)))
    text, n = chat_generate(model, tok, "hello", max_new_tokens=5)
    assert n == 5 and isinstance(text, str)
    sampled = [
        chat_generate(model, tok, "hello", max_new_tokens=8, temperature=1.0, seed=s)[0]
        for s in (3, 3)
    ]
    assert sampled[0] == sampled[1]


def test_resolve_model_rejects_folders_that_are_not_models(tmp_path):
    with pytest.raises(ModelError, match=r"has no config\.json"):
        resolve_model(str(tmp_path))
    assert resolve_model("org/some-hub-id") == "org/some-hub-id"


def test_converted_default_is_complete(default_model_dir):
    record = json.loads((default_model_dir / MARKER).read_text())
    assert record["logits_checked_equal"] is True
    assert record["parameters"] == 134_515_008
    assert (default_model_dir / "model.safetensors").is_file()


def test_killed_conversion_leaves_no_folder(tmp_path, monkeypatch):
    from transformers import PreTrainedModel

    def boom(self, *a, **k):
        raise KeyboardInterrupt("killed mid-save")

    monkeypatch.setattr(PreTrainedModel, "save_pretrained", boom)
    out = tmp_path / "models" / "converted"
    with pytest.raises(KeyboardInterrupt):
        convert_gguf(embedded_gguf(), out)
    assert not out.exists()
    assert list((tmp_path / "models").iterdir()) == []  # the temporary folder is gone too


@pytest.mark.slow
def test_default_model_loads_and_generates():
    model, tok = load_model(ModelConfig())
    assert model.config.num_hidden_layers == 30
    text, n = chat_generate(model, tok, "What is the capital of France?", max_new_tokens=12)
    assert n > 0 and "Paris" in text


def test_attention_implementations_agree(tiny_model_dir):
    import torch

    from acmrl.config import ModelConfig
    from acmrl.models import ModelError, load_model

    ids = torch.tensor([[1, 20, 300, 4000, 42, 7]])
    logits = {}
    for impl in ("eager", "sdpa"):
        model, _ = load_model(ModelConfig(name=str(tiny_model_dir), attn_implementation=impl))
        assert model.config._attn_implementation == impl
        with torch.no_grad():
            logits[impl] = model(ids).logits
    assert torch.allclose(logits["eager"], logits["sdpa"], atol=1e-4)
    try:
        import flash_attn  # noqa: F401
    except ImportError:
        with pytest.raises(ModelError, match="needs the flash-attn package"):
            load_model(
                ModelConfig(name=str(tiny_model_dir), attn_implementation="flash_attention_2")
            )
