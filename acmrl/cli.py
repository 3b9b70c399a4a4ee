"""The ``acmrl`` command.

Every subcommand takes ``--config file.yaml`` and ``key.path=value`` overrides, validates the whole
configuration first, and only then imports torch and loads models, so a bad config fails in well
under a second and ``acmrl --help`` never pays for the heavy imports.
"""

from __future__ import annotations

import importlib
import sys
import time
from pathlib import Path
from typing import Annotated, NoReturn

import typer

from acmrl.config import (
    AnnotateConfig,
    AuditConfig,
    ConfigError,
    DemoConfig,
    EvalConfig,
    ExportConfig,
    GenerateConfig,
    GRPOConfig,
    RolloutConfig,
    ServeConfig,
    SFTConfig,
    load_config,
)

app = typer.Typer(
    name="acmrl",
    help="Train LLM agents to manage their own context on long tool-use tasks.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
train_app = typer.Typer(help="Training stages: sft, grpo.", no_args_is_help=True)
app.add_typer(train_app, name="train")

ConfigOpt = Annotated[
    Path | None, typer.Option("--config", "-c", help="YAML config file; overrides apply on top")
]
Overrides = Annotated[
    list[str] | None,
    typer.Argument(help="config overrides as key.path=value, e.g. model.dtype=bfloat16"),
]


Resume = Annotated[bool, typer.Option("--resume", help="continue from the latest checkpoint")]
AutoResume = Annotated[
    bool,
    typer.Option(
        "--auto-resume",
        help="continue from the latest checkpoint if there is one, else start (requeued jobs)",
    ),
]
ResumeFrom = Annotated[
    Path | None,
    typer.Option(
        "--resume-from",
        help="continue from this checkpoint folder (or the newest checkpoint of this run folder)",
    ),
]


def fail(message: str, code: int = 2) -> NoReturn:
    """One clear line on stderr and a non-zero exit."""
    print(f"acmrl: error: {message}", file=sys.stderr)
    raise typer.Exit(code)


def _load(cls: type, config: Path | None, overrides: list[str] | None):
    try:
        return load_config(cls, config, overrides or [])
    except ConfigError as exc:
        fail(f"config: {exc}")


@app.command()
def generate(
    prompt: Annotated[str, typer.Option("--prompt", "-p", help="the user message")],
    config: ConfigOpt = None,
    overrides: Overrides = None,
) -> None:
    """Generate one chat reply: proves a model loads and runs (default: the embedded SmolLM2)."""
    cfg = _load(GenerateConfig, config, overrides)
    from acmrl.models import ModelError, chat_generate, load_model

    t0 = time.perf_counter()
    try:
        model, tokenizer = load_model(cfg.model)
    except ModelError as exc:
        fail(str(exc))
    t1 = time.perf_counter()
    s = cfg.sampling
    text, n = chat_generate(
        model,
        tokenizer,
        prompt,
        system_prompt=cfg.system_prompt,
        max_new_tokens=s.max_new_tokens,
        temperature=s.temperature,
        top_p=s.top_p,
        seed=s.seed,
    )
    t2 = time.perf_counter()
    print(text)
    print(
        f"[{cfg.model.name}: loaded in {t1 - t0:.1f}s, {n} tokens in {t2 - t1:.1f}s "
        f"({n / max(t2 - t1, 1e-9):.1f} tok/s)]",
        file=sys.stderr,
    )


@app.command()
def convert(
    gguf: Annotated[
        Path | None, typer.Option(help="GGUF file; default: the embedded SmolLM2 file")
    ] = None,
    out: Annotated[
        Path | None, typer.Option(help="output folder; default: the acmrl model cache")
    ] = None,
    force: Annotated[bool, typer.Option(help="convert again even if the folder exists")] = False,
) -> None:
    """Convert a GGUF model into a plain Hugging Face folder (done automatically for the default)."""
    from acmrl.models import MARKER, ModelError, convert_gguf, default_model_dir, embedded_gguf

    try:
        src = gguf or embedded_gguf()
    except ModelError as exc:
        fail(str(exc))
    if not src.is_file():
        fail(f"GGUF file {src} does not exist")
    dest = out or default_model_dir()
    if (dest / MARKER).is_file() and not force:
        print(f"{dest} already converted (use --force to redo)")
        return
    if force and dest.exists():
        import shutil

        shutil.rmtree(dest)
    record = convert_gguf(src, dest)
    print(
        f"converted {src.name} -> {dest} in {record['seconds']}s ({record['parameters']:,} params)"
    )


@app.command()
def rollout(config: ConfigOpt = None, overrides: Overrides = None) -> None:
    """Run a student over tasks x arms x samples; write trajectories (JSONL, resumable)."""
    cfg = _load(RolloutConfig, config, overrides)
    from acmrl.engines.base import EngineError
    from acmrl.envs import EnvError
    from acmrl.models import ModelError
    from acmrl.rollout.run import print_summary
    from acmrl.rollout.worker import run_rollout

    try:
        rows = run_rollout(cfg)
    except (EnvError, ModelError, EngineError, ValueError) as exc:
        fail(str(exc))
    print_summary(rows)
    typer.echo(f"trajectories: {cfg.output}")


@app.command()
def serve(config: ConfigOpt = None, overrides: Overrides = None) -> None:
    """Serve a model over an OpenAI-compatible completions API (token ids, logprobs, cached tokens)."""
    cfg = _load(ServeConfig, config, overrides)
    from acmrl.engines.hf import HFEngine
    from acmrl.engines.server import make_server
    from acmrl.models import ModelError

    try:
        engine = HFEngine.from_config(
            cfg.model,
            reuse_cache=cfg.engine.reuse_cache,
            share_prefix=cfg.engine.share_prefix,
            max_batch=cfg.engine.max_batch,
        )
    except ModelError as exc:
        fail(str(exc))
    adapters = None
    if cfg.allow_adapter_loading:
        import dataclasses

        from acmrl.engines.server import Adapters

        def adapter_engine(path: str) -> HFEngine:
            model = dataclasses.replace(cfg.model, name=path)
            return HFEngine.from_config(
                model,
                reuse_cache=cfg.engine.reuse_cache,
                share_prefix=cfg.engine.share_prefix,
                max_batch=cfg.engine.max_batch,
            )

        adapters = Adapters(adapter_engine, cfg.engine.max_batch, cfg.max_adapters)
    try:
        server = make_server(
            engine,
            engine.tokenizer,
            cfg.model.name,
            cfg.host,
            cfg.port,
            cfg.engine.max_batch,
            adapters,
        )
    except OSError as exc:
        fail(f"cannot listen on {cfg.host}:{cfg.port}: {exc}")
    host, port = server.server_address[:2]
    typer.echo(f"acmrl serve: listening on http://{host}:{port} (model {cfg.model.name})", err=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


@app.command()
def annotate(
    config: ConfigOpt = None,
    overrides: Overrides = None,
    shard: Annotated[str | None, typer.Option("--shard", help="this job's part, i/n")] = None,
    no_dataset: Annotated[
        bool,
        typer.Option("--no-dataset", help="record this shard's tasks only; --merge builds it"),
    ] = False,
    merge: Annotated[
        int | None,
        typer.Option(
            "--merge",
            min=1,
            help="build the dataset of an N-shard run once every shard has all its tasks",
        ),
    ] = None,
) -> None:
    """Student runs, teacher edits, resumed runs -> a Hugging Face dataset (sharded, resumable)."""
    extra = [
        *([f"shard={shard}"] if shard else []),
        *(["build_dataset=false"] if no_dataset else []),
    ]
    cfg = _load(AnnotateConfig, config, [*(overrides or []), *extra])
    from acmrl.engines.base import EngineError
    from acmrl.envs import EnvError
    from acmrl.models import ModelError
    from acmrl.teacher.annotate import merge_shards, run_annotate

    try:
        stats = merge_shards(cfg, merge) if merge else run_annotate(cfg)
    except (EnvError, ModelError, EngineError, ValueError) as exc:
        fail(str(exc))
    for key, value in stats.items():
        typer.echo(f"{key}: {value}")
    if merge or cfg.build_dataset:
        typer.echo(f"dataset: {cfg.output}/dataset (card: {cfg.output}/README.md)")
    else:
        typer.echo(f"records: {cfg.output}/records-{cfg.shard.replace('/', '-of-')}.jsonl")


def _trained(result: dict, label: str, series: list[float], final: str | None, out: str) -> None:
    """The closing lines of a training command, one per process; a run stopped by SIGTERM or
    SIGUSR1 (after saving its checkpoint) exits with 128 + the signal number."""
    series = series or [float("nan")]
    typer.echo(
        f"process {result['rank']} of {result['processes']}: steps {result['steps']}; "
        f"{label} first {series[0]:.4f}, last {series[-1]:.4f}"
    )
    if result.get("interrupted") is not None:
        typer.echo(f"stopped by signal {result['interrupted']}: resume with --resume ({out})")
        raise typer.Exit(result["exit_code"])
    typer.echo(f"model: {final} (checkpoints: {out}/checkpoints)")


@train_app.command()
def sft(
    config: ConfigOpt = None,
    overrides: Overrides = None,
    resume: Resume = False,
    auto_resume: AutoResume = False,
    resume_from: ResumeFrom = None,
) -> None:
    """Supervised fine-tuning on a teacher-annotated dataset (LoRA or full; checkpoints, --resume)."""
    cfg = _load(SFTConfig, config, overrides)
    from acmrl.models import ModelError
    from acmrl.train.sft import run_sft

    try:
        result = run_sft(cfg, resume="auto" if auto_resume else resume, resume_from=resume_from)
    except (ModelError, ValueError) as exc:
        fail(str(exc))
    _trained(result, "loss", result["losses"], f"{cfg.output}/final", cfg.output)


@train_app.command()
def grpo(
    config: ConfigOpt = None,
    overrides: Overrides = None,
    resume: Resume = False,
    auto_resume: AutoResume = False,
    resume_from: ResumeFrom = None,
) -> None:
    """Online GRPO on task success minus compaction cost (rollouts share the trained weights)."""
    cfg = _load(GRPOConfig, config, overrides)
    from acmrl.envs import EnvError
    from acmrl.models import ModelError
    from acmrl.train.grpo import run_grpo

    try:
        result = run_grpo(cfg, resume="auto" if auto_resume else resume, resume_from=resume_from)
    except (EnvError, ModelError, ValueError) as exc:
        fail(str(exc))
    _trained(result, "mean reward", result["rewards"], result["final"], cfg.output)


# `acmrl eval NAME ...`: the tables over result folders (module, function, the two folders it
# takes; None: any number, as a list)
TABLES = {
    "compare": ("acmrl.eval.compare", "compare", "RESULTS_A RESULTS_B"),
    "edits": ("acmrl.eval.edit_change", "edit_change_md", "START TRAINED"),
    "seeds": ("acmrl.eval.seeds", "seeds_table", None),
    "report": ("acmrl.eval.multi", "multi_report", None),
}


@app.command(name="eval")
def eval_(
    config: ConfigOpt = None,
    overrides: Overrides = None,
    output: Annotated[
        Path | None,
        typer.Option(
            "--output",
            "-o",
            help="compare / report / seeds / versus / edits: write the table here too",
        ),
    ] = None,
) -> None:
    """Evaluate a model per arm and write a report; `acmrl eval compare A B` compares two runs,
    `acmrl eval report A B C ...` puts several benchmarks in one Table 2,
    `acmrl eval seeds A B C ...` the runs of several training seeds in one table (or
    `acmrl eval seeds acm=A0,A1 summary=S0,S1` with one trained student per arm),
    `acmrl eval versus START TRAINED [-c grpo.yaml]` a GRPO policy against its start,
    `acmrl eval edits START TRAINED` how its context edits (programs, summaries) changed."""
    args = list(overrides or [])
    if args and args[0] == "versus":
        if len(args) != 3:
            fail("usage: acmrl eval versus START TRAINED [--config GRPO_YAML] [--output FILE]")
        _versus(args[1], args[2], config, output)
        return
    if args and args[0] in TABLES:
        module, name, usage = TABLES[args[0]]
        if usage and len(args) != 3:
            fail(f"usage: acmrl eval {args[0]} {usage} [--output FILE]")
        make = getattr(importlib.import_module(module), name)
        try:
            typer.echo(make(args[1], args[2], output) if usage else make(args[1:], output))
        except ValueError as exc:
            fail(str(exc))
        return
    cfg = _load(EvalConfig, config, args)
    from acmrl.engines.base import EngineError
    from acmrl.eval.run import run_eval
    from acmrl.models import ModelError

    try:
        report = run_eval(cfg)
    except (ModelError, EngineError, ValueError) as exc:
        fail(str(exc))
    from acmrl.eval.run import main_table

    typer.echo(main_table(report))
    for note in report["notes"]:
        typer.echo(f"- {note}")
    typer.echo(f"report: {cfg.output}/report.md (csv, json, plots alongside)")


@app.command()
def audit(config: ConfigOpt = None, overrides: Overrides = None) -> None:
    """The ceilings of a task set: each arm's best scripted policy and the trivial strategies,
    under the budget and overflow rule; writes audit.json and audit.md."""
    cfg = _load(AuditConfig, config, overrides)
    from acmrl.envs import EnvError
    from acmrl.eval.audit import audit_markdown, run_audit
    from acmrl.models import ModelError

    try:
        report = run_audit(cfg)
    except (EnvError, ModelError, ValueError) as exc:
        fail(str(exc))
    typer.echo(audit_markdown(report))
    typer.echo(f"audit: {cfg.output}/audit.md (json and episodes alongside)")


def _versus(start: str, trained: str, config: Path | None, output: Path | None) -> None:
    """GRPO's policy (an eval folder) against the policy it started from, under the reward
    weights of the GRPO run's config (``--config``; the defaults without it)."""
    from acmrl.config import GRPOConfig
    from acmrl.eval.versus import versus_start
    from acmrl.train.grpo_steps import reward_weights

    cfg = _load(GRPOConfig, config, [])
    try:
        text = versus_start(
            start, trained, reward_weights(cfg), output, output_weight=cfg.agent.output_weight
        )
    except ValueError as exc:
        fail(str(exc))
    typer.echo(text)


@app.command()
def export(config: ConfigOpt = None, overrides: Overrides = None) -> None:
    """Export a trained policy: merged safetensors, chat template, generation config, model card."""
    cfg = _load(ExportConfig, config, overrides)
    from acmrl.models import ModelError
    from acmrl.train.export import run_export

    try:
        out = run_export(cfg)
    except (ModelError, ValueError) as exc:
        fail(str(exc))
    typer.echo(f"exported: {out} (model card: {out}/README.md)")


@app.command()
def demo(
    config: ConfigOpt = None,
    overrides: Overrides = None,
    size: Annotated[
        str | None,
        typer.Option(
            "--size",
            help="default (kb_search chain, SFT), smoke, small, tiny (kb_search tiny with a "
            "teacher round and GRPO), long (the longer tiny recipe), large",
        ),
    ] = None,
) -> None:
    """The whole pipeline on the embedded default model, from tasks to an exported checkpoint.

    Stages: tasks, baseline eval, annotation, SFT, a teacher round and GRPO where the size has
    them, eval of the trained model, export, base vs trained; it prints where the reports and
    the checkpoint are.
    """
    args = list(overrides or []) + ([f"size={size}"] if size else [])
    cfg = _load(DemoConfig, config, args)
    from acmrl.demo import StageStopped, run_demo
    from acmrl.engines.base import EngineError
    from acmrl.models import ModelError

    try:
        run_demo(cfg)
    except StageStopped as exc:
        typer.echo(str(exc))
        raise typer.Exit(exc.exit_code) from None
    except (ModelError, EngineError, ValueError) as exc:
        fail(str(exc))


def main() -> None:
    app()


if __name__ == "__main__":
    main()
