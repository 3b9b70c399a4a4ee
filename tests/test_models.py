import json
import os
import platform
import subprocess
import sys

import pytest
import torch

from acmrl import models
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


REFAULTS = """
import resource, sys, torch
from acmrl.models import configure_malloc
if sys.argv[1] == "keep":
    assert configure_malloc(True, None) and configure_malloc(True, None)  # idempotent
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
counts = []
for _ in range(5):  # 64 MB, over glibc's largest mmap threshold: allocated, used, freed
    n = faults()
    x = torch.ones(16 * 2**20)
    counts.append(faults() - n)
    del x
print(min(counts[1:]))  # the fewest faults of a reallocation (the heap settles in one or two)
"""


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc",
    reason="glibc's malloc only",
)
def test_kept_freed_memory_is_reused_without_page_faults():
    """By default glibc unmaps a freed 64 MB tensor, and the next one is faulted in again, page
    by page (16,384 pages of 4 KB); with freed memory kept, the next one reuses it."""

    def refaults(mode: str) -> int:
        out = subprocess.run(
            [sys.executable, "-c", REFAULTS, mode], capture_output=True, text=True, check=True
        )
        return int(out.stdout.strip())

    assert refaults("default") > 8_000
    assert refaults("keep") < 1_000


def test_configure_torch_sets_malloc_on_cpu_only(monkeypatch):
    calls = []
    monkeypatch.setattr(models, "configure_malloc", lambda *a: calls.append(a) or True)
    models.configure_torch(ModelConfig(device="cpu"))
    models.configure_torch(ModelConfig(device="cpu", keep_freed_memory=False))
    models.configure_torch(ModelConfig(device="cpu", mmap_threshold_mb=None))
    assert calls == [(True, 32.0), (False, 32.0), (True, None)]
    models.configure_torch(ModelConfig(device="cuda"))
    assert len(calls) == 3


RETURNED = """
import sys
from acmrl.models import configure_malloc, resident_gb
threshold = None if sys.argv[1] == "none" else float(sys.argv[1])
assert configure_malloc(True, threshold)
start, blocks = resident_gb()[0], []
for i in range(24):  # a step's tensors, 8-19.5 MiB, each page touched
    blocks.append(bytearray((8 << 20) + i * (512 << 10)))
    blocks[-1][::4096] = b"x" * len(blocks[-1][::4096])
held = resident_gb()[0] - start
del blocks
print(held, resident_gb()[0] - start)
"""


@pytest.mark.skipif(
    not sys.platform.startswith("linux")
    or platform.libc_ver()[0] != "glibc"
    or "malloc" in os.environ.get("LD_PRELOAD", ""),
    reason="glibc's malloc only",
)
def test_a_fixed_mmap_threshold_returns_freed_blocks_from_its_size_on():
    """With freed memory kept and no threshold, the 330 MiB of 24 freed blocks of 8-19.5 MiB
    stay resident, in a heap that the next step's differently sized blocks fragment; with a
    16 MiB threshold the blocks from 16 MiB on had their own mappings and went back to the
    system when freed, and the 188 MiB of the smaller ones stay."""

    def rss_gb(threshold: str) -> tuple[float, float]:
        out = subprocess.run(
            [sys.executable, "-c", RETURNED, threshold], capture_output=True, text=True
        )
        assert out.returncode == 0, out.stderr
        held, after = map(float, out.stdout.split())
        return held, after

    held, after = rss_gb("none")
    assert held > 0.3 and after > 0.3
    held, after = rss_gb("16")
    assert held > 0.3 and 0.15 < after < 0.25


def test_adapter_base_follows_a_moved_run_and_keeps_a_hub_base(tmp_path):
    """An adapter records its base; a run folder moved with its base finds it through the
    relative record, and a base that was a hub id (no relative record) stays that id."""
    base, adapter = tmp_path / "run" / "start-model", tmp_path / "run" / "sft" / "final"
    base.mkdir(parents=True)
    adapter.mkdir(parents=True)
    (adapter / "adapter_config.json").write_text(
        json.dumps({"base_model_name_or_path": "/elsewhere/start-model"})
    )
    record = adapter / models.ADAPTER_BASE_FILE
    record.write_text(
        json.dumps({"base_model": "/elsewhere/start-model", "relative": "../../start-model"})
    )
    assert models.adapter_base(adapter) == str(base.resolve())
    (adapter / "adapter_config.json").write_text(
        json.dumps({"base_model_name_or_path": "org/hub-model"})
    )
    record.write_text(
        json.dumps({"base_model": "org/hub-model", "base_id": None, "relative": None})
    )
    assert models.adapter_base(adapter) == "org/hub-model"
    assert models.adapter_base(tmp_path) is None  # not an adapter folder


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc_trim is glibc's")
def test_release_freed_memory_gives_a_finished_jobs_memory_back():
    """With freed memory kept (the engines' setting), 300 MB freed stays resident until
    release_freed_memory; the demo calls it between stages so their peaks do not stack."""
    script = """
from acmrl.models import configure_malloc, release_freed_memory, resident_gb
assert configure_malloc(True, None)
chunks = [bytearray(1 << 20) for _ in range(300)]
for c in chunks:
    c[::4096] = b"x" * len(c[::4096])  # touch every page
held = resident_gb()[0]
del chunks
kept = resident_gb()[0]
assert release_freed_memory()
print(held, kept, resident_gb()[0])
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    held, kept, released = map(float, out.stdout.split())
    assert kept > held - 0.05  # freed, but still resident
    assert released < kept - 0.25  # given back
