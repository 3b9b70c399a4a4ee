"""Shared fixtures: the converted default model (for its tokenizer) and a tiny random model."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from acmrl.config import DEFAULT_MODEL


@pytest.fixture(scope="session")
def default_model_dir() -> Path:
    """The converted SmolLM2 folder in the user cache; converted on first use (~25 s, once)."""
    from acmrl.models import ensure_default_model

    return ensure_default_model()


@pytest.fixture(scope="session")
def tokenizer(default_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(default_model_dir)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, default_model_dir) -> Path:
    """A random 2-layer Llama with the SmolLM2 tokenizer, a few MB, deterministic (seed 0)."""
    from acmrl.models import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", tokenizer_from=DEFAULT_MODEL)


@pytest.fixture(scope="module")
def tiny_engine(tiny_model_dir):
    """The transformers engine over the tiny model (float32), fresh for each test module."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from acmrl.engines.hf import HFEngine

    torch.set_flush_denormal(True)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    return HFEngine(model, AutoTokenizer.from_pretrained(tiny_model_dir), max_batch=8)


@pytest.fixture(scope="session")
def script():
    """``script(name)``: ``scripts/<name>.py`` loaded as a module (the scripts are no package)."""

    def load(name: str):
        path = Path(__file__).resolve().parents[1] / "scripts" / f"{name}.py"
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod

    return load
