"""``acmrl export``: a trained policy as one self-contained Hugging Face folder.

The folder holds the merged weights (an adapter is folded into its base) as safetensors; the
tokenizer with the tool-capable chat template the agent was trained with; a generation config
whose end-of-turn tokens stop generation; ``acmrl.json`` (the arm, context budget, system
prompt and tool schemas the agent expects); and a model card (``README.md``) with the same
prompt and tools and the latest eval table. ``AutoModelForCausalLM.from_pretrained`` loads it and
``acmrl rollout model.name=FOLDER`` runs it.

The folder is written next to its destination and published by one rename; before that, the
exported weights are reloaded and their logits compared with the trained model's on the agent's
first prompt, so a broken export never replaces a good one.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from acmrl.arms import arm_tools, get_arm
from acmrl.config import AgentConfig, ExportConfig, to_dict
from acmrl.context.render import Renderer
from acmrl.rollout import prompts
from acmrl.rollout.environment import build_environment
from acmrl.train.common import adapter_base, load_start_model


def agent_spec(cfg: ExportConfig) -> dict[str, Any]:
    """The system prompt, tools and budget an agent of ``cfg.arm`` sees on ``cfg.env``, and the
    agent settings that differ from the defaults (the harness must run the policy with them:
    ``agent.evolve_keep_code``, for one, changes what the policy reads after its own edits)."""
    env = build_environment(cfg.env)
    task = env.tasks(cfg.env.split)[0]
    budget = prompts.context_budget(cfg.agent, env)
    return {
        "arm": cfg.arm,
        "env": cfg.env.name,
        "max_context_tokens": budget,
        "system_prompt": get_arm(cfg.arm).system_prompt(budget, cfg.agent),
        "tools": arm_tools(env.session(task).tools, cfg.arm, cfg.agent),
        "example_task": task.prompt,
        "agent": {k: v for k, v in to_dict(cfg.agent).items() if v != _DEFAULT_AGENT[k]},
    }


_DEFAULT_AGENT = to_dict(AgentConfig())


def _override(key: str, value: Any) -> str:
    """``agent.KEY=VALUE`` as the command line reads it."""
    if isinstance(value, bool):
        return f"agent.{key}={str(value).lower()}"
    if isinstance(value, str):
        return f"agent.{key}={value}"
    return f"agent.{key}={json.dumps(value)}"


def _eval_table(eval_dir: str | None) -> str:
    if not eval_dir:
        return "No evaluation was attached to this export (`acmrl export eval_dir=...`)."
    report = Path(eval_dir) / "report.md"
    if not report.is_file():
        raise ValueError(f"eval_dir {eval_dir!r} has no report.md: give a folder acmrl eval wrote")
    return report.read_text().strip()


def model_card(
    spec: dict[str, Any], source: str, base: str | None, eval_table: str, adapter: bool = False
) -> str:
    tools = json.dumps(spec["tools"], indent=2)
    front = ["---", "library_name: transformers", "tags: [acmrl, agent, context-management]"]
    if base:
        front.append(f"base_model: {base}")
    front.append("---")
    return "\n".join(
        [
            *front,
            "",
            f"# acmrl policy: `{spec['arm']}` agent on `{spec['env']}`",
            "",
            f"Exported by `acmrl export` from `{source}`"
            + (
                f": a LoRA adapter of `{base}` (load the base, then `PeftModel.from_pretrained`)."
                if adapter
                else f" (adapter merged into `{base}`)."
                if base
                else "."
            ),
            "The agent manages its own context within a budget of "
            f"{spec['max_context_tokens']} tokens (system prompt and tool definitions included).",
            "",
            "## Use",
            "",
            "```bash",
            " ".join(
                [
                    f"acmrl rollout model.name=THIS_FOLDER arms=[{spec['arm']}]",
                    *(_override(k, v) for k, v in spec.get("agent", {}).items()),
                ]
            ),
            "```",
            "",
            "or with transformers: render the conversation with the tokenizer's chat template, "
            "passing the tools below, and generate; the model answers with "
            "`<tool_call>{...}</tool_call>` blocks.",
            "",
            "## System prompt",
            "",
            "```text",
            spec["system_prompt"],
            "```",
            "",
            "## Tools",
            "",
            "```json",
            tools,
            "```",
            "",
            "## Evaluation",
            "",
            eval_table,
            "",
        ]
    )


def _first_prompt(tok: Any, spec: dict[str, Any]) -> list[int]:
    renderer = Renderer(tok, spec["system_prompt"], spec["tools"])
    from acmrl.context.state import user

    return renderer.ids([user(spec["example_task"])])


DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}


def push_folder(folder: Path, repo_id: str, private: bool) -> str:
    """Upload an export folder to the Hub (``huggingface_hub``; the token from ``HF_TOKEN`` or
    the cached login); returns the repository's URL."""
    from huggingface_hub import HfApi

    api = HfApi()
    url = api.create_repo(repo_id, private=private, exist_ok=True)
    api.upload_folder(folder_path=str(folder), repo_id=repo_id, commit_message="acmrl export")
    return str(url)


def run_export(cfg: ExportConfig) -> Path:
    import torch
    from transformers import AutoModelForCausalLM

    from acmrl.models import resolve_model

    spec = agent_spec(cfg)
    eval_table = _eval_table(cfg.eval_dir)
    source = Path(resolve_model(cfg.model.name))
    base = adapter_base(str(source))
    if cfg.adapter_only:
        if base is None:
            raise ValueError(
                f"adapter_only: {cfg.model.name!r} is not an adapter folder (no "
                "adapter_config.json); export it merged"
            )
        return _export_adapter(cfg, spec, source, base, eval_table)
    model, tok, _ = load_start_model(cfg.model)
    if cfg.dtype != "auto":
        model = model.to(getattr(torch, DTYPES[cfg.dtype]))
    tok.chat_template = Renderer(tok).chat_template
    gen = model.generation_config
    # generation stops at the end of the assistant's turn (<|im_end|> in the ChatML template)
    eos = {tok.eos_token_id, tok.get_vocab().get("<|im_end|>")}
    gen.eos_token_id = sorted(e for e in eos if e is not None)
    gen.pad_token_id = tok.pad_token_id if tok.pad_token_id is not None else gen.eos_token_id[0]

    out = Path(cfg.output)
    tmp = out.parent / f".tmp-{out.name}"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    tok.save_pretrained(tmp)
    (tmp / "acmrl.json").write_text(json.dumps({**spec, "source": cfg.model.name}, indent=1))
    (tmp / "README.md").write_text(model_card(spec, cfg.model.name, base, eval_table))
    (tmp / "export_config.json").write_text(json.dumps(to_dict(cfg), indent=1, default=str))

    # the reloaded folder must compute what the trained model computes
    # (in float32 on both sides: the saved weights must be exactly the ones in memory, whatever
    # the export dtype; a 16-bit forward alone would differ by its own rounding)
    model = model.float()
    ids = torch.tensor([_first_prompt(tok, spec)], device=model.device)
    reloaded = AutoModelForCausalLM.from_pretrained(tmp, dtype=torch.float32).to(model.device)
    with torch.no_grad():
        want = model(input_ids=ids).logits[0, -1].float()
        got = reloaded(input_ids=ids).logits[0, -1].float()
    diff = float((want - got).abs().max())
    if diff > cfg.max_logit_diff:
        raise ValueError(
            f"export check failed: the reloaded model's logits differ by {diff:.3g} "
            f"(> {cfg.max_logit_diff}); {tmp} is kept for inspection, {out} is untouched"
        )
    _publish(tmp, out, cfg)
    return out


def _publish(tmp: Path, out: Path, cfg: ExportConfig) -> None:
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)
    if cfg.push_to_hub:
        assert cfg.hub_repo_id is not None
        url = push_folder(out, cfg.hub_repo_id, cfg.hub_private)
        print(f"pushed {out} to {url}")


def _export_adapter(
    cfg: ExportConfig, spec: dict[str, Any], source: Path, base: str, eval_table: str
) -> Path:
    """The adapter itself (not merged), its tokenizer with the agent's chat template, the spec
    and the card; checked by loading base + exported adapter against the trained policy."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from acmrl.models import resolve_model

    out = Path(cfg.output)
    tmp = out.parent / f".tmp-{out.name}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for f in source.iterdir():
        if f.is_file() and (f.name.startswith("adapter_") or f.name.startswith("acmrl_")):
            shutil.copy2(f, tmp / f.name)
    tok = AutoTokenizer.from_pretrained(
        source if (source / "tokenizer_config.json").exists() else resolve_model(base)
    )
    tok.chat_template = Renderer(tok).chat_template
    tok.save_pretrained(tmp)
    (tmp / "acmrl.json").write_text(
        json.dumps({**spec, "source": cfg.model.name, "adapter_of": base}, indent=1)
    )
    (tmp / "README.md").write_text(model_card(spec, cfg.model.name, base, eval_table, adapter=True))
    (tmp / "export_config.json").write_text(json.dumps(to_dict(cfg), indent=1, default=str))
    merged, _, _ = load_start_model(cfg.model)  # the trained policy (base + adapter, merged)
    base_model = AutoModelForCausalLM.from_pretrained(resolve_model(base), dtype=merged.dtype)
    reloaded = PeftModel.from_pretrained(base_model, tmp)
    ids = torch.tensor([_first_prompt(tok, spec)], device=merged.device)
    with torch.no_grad():
        want = merged(input_ids=ids).logits[0, -1].float()
        got = reloaded(input_ids=ids).logits[0, -1].float()
    diff = float((want - got).abs().max())
    if diff > cfg.max_logit_diff:
        raise ValueError(
            f"export check failed: base + exported adapter differs from the trained policy by "
            f"{diff:.3g} (> {cfg.max_logit_diff}); {tmp} is kept for inspection"
        )
    _publish(tmp, out, cfg)
    return out
