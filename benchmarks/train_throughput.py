"""Training throughput: packed vs per-turn samples, and one acmrl GRPO step vs one TRL GRPO step.

    .venv/bin/python benchmarks/train_throughput.py [--model tiny|default|PATH] [--episodes 6]
        [--skip-trl] [--steps 4]

(a) Packing. The trajectories are expert (oracle) episodes of ``kb_search`` (preset
``--preset``): at turn k the policy read the rendered State after k tool calls and wrote the
expert's next call. :func:`acmrl.train.samples.trajectory_samples` packs the calls of an episode
into one sample (every turn extends the previous prompt); ``pack=False`` makes one sample per
turn, the way a single-turn trainer sees them. Both train the same target tokens with the same
loss (their summed NLL at the start is printed and must match); one pass over all samples with
the same token budget per batch, forward + backward + AdamW step, is timed. Printed: samples,
tokens processed, target tokens, wall time, target tokens/s, and the ratio.

(b) GRPO step. One batch of single-turn rollouts: ``--prompts`` prompts (the agent's first
rendered prompt for kb_search tasks) x ``--group`` completions of ``--new-tokens`` tokens, on the
same tiny random model, reward = a fixed function of the completion length (both trainers get
variance, so both update). acmrl: :class:`acmrl.train.grpo.GRPOTrainer` (rollout through the
agent loop and the hf engine, reward, advantages, update). TRL: ``trl.GRPOTrainer`` 1.16 with
``use_cpu=True``, fp32, no gradient checkpointing, the same prompts as text, the same group size,
completion length, learning rate and no KL. Both run ``--steps`` steps; the first is a warm-up and
the mean of the others is reported, with the ratio.

Run alone: CPU contention from other jobs distorts the timings.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from acmrl.config import DEFAULT_MODEL, GRPOConfig, ModelConfig
from acmrl.context.render import Renderer
from acmrl.envs import load
from acmrl.envs.pressure import SYSTEM_PROMPT, oracle_state
from acmrl.models import build_tiny_model, load_model
from acmrl.rollout.records import ModelCall, Step, Trajectory
from acmrl.train.loss import sft_loss, token_logprobs
from acmrl.train.samples import Sample, trajectory_samples


def expert_trajectories(env, tok, n: int) -> list[Trajectory]:
    """Oracle episodes as trajectories whose policy calls extend each other exactly."""
    out = []
    for task in env.tasks("eval")[:n]:
        renderer = Renderer(tok, SYSTEM_PROMPT, env.session(task).tools)
        state, score = oracle_state(env, task)
        traj = Trajectory(task.id, task.id, env.name, "react", 0, 0, "bench", task.prompt, "")
        traj.score = score
        for k in range((len(state) - 1) // 2):
            prompt = renderer.ids(state[: 1 + 2 * k])
            upto_call = renderer.ids(state[: 2 + 2 * k], add_generation_prompt=False)
            completion = upto_call[len(prompt) :]
            call = ModelCall("policy", prompt, completion, [], 0, "stop", 0.0)
            traj.steps.append(Step(k, call))
        out.append(traj)
    return out


def batches(samples: list[Sample], budget: int) -> list[list[Sample]]:
    out, cur = [], []
    for s in sorted(samples, key=lambda s: len(s.token_ids)):
        if cur and len(s.token_ids) * (len(cur) + 1) > budget:
            out.append(cur)
            cur = []
        cur.append(s)
    return out + ([cur] if cur else [])


def tensors(group: list[Sample], pad: int):
    T = max(len(s.token_ids) for s in group)
    ids = torch.full((len(group), T), pad)
    attn = torch.zeros(len(group), T, dtype=torch.long)
    mask = torch.zeros(len(group), T, dtype=torch.long)
    for b, s in enumerate(group):
        ids[b, : len(s.token_ids)] = torch.tensor(s.token_ids)
        attn[b, : len(s.token_ids)] = 1
        mask[b, : len(s.token_ids)] = torch.tensor(s.loss_mask)
    mask[:, 0] = 0
    return ids, attn, mask


def packing(model_name: str, preset: str, episodes: int, budget: int) -> None:
    import copy

    base, tok = load_model(ModelConfig(name=model_name))
    env = load("kb_search", preset=preset, seed=0)
    trajs = expert_trajectories(env, tok, episodes)
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    rows = []
    for pack in (True, False):
        samples = [s for t in trajs for s in trajectory_samples(t, pack=pack)]
        model = copy.deepcopy(base).train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
        with torch.no_grad():
            start_nll = 0.0
            for group in batches(samples, budget):
                ids, attn, mask = tensors(group, pad)
                lp = token_logprobs(model(input_ids=ids, attention_mask=attn).logits, ids)
                start_nll += float(-(lp * mask).sum())
        t0 = time.perf_counter()
        for group in batches(samples, budget):
            ids, attn, mask = tensors(group, pad)
            lp = token_logprobs(model(input_ids=ids, attention_mask=attn).logits, ids)
            sft_loss(lp, mask, torch.ones(len(group))).backward()
            opt.step()
            opt.zero_grad()
        wall = time.perf_counter() - t0
        targets = sum(sum(s.loss_mask[1:]) for s in samples)
        rows.append(
            (
                "packed" if pack else "per turn",
                len(samples),
                sum(len(s.token_ids) for s in samples),
                targets,
                wall,
                targets / wall,
                start_nll,
            )
        )
    print(f"\n(a) packing: {episodes} expert kb_search/{preset} episodes, model {model_name}")
    print(
        f"{'mode':<10}{'samples':>9}{'tokens':>10}{'targets':>9}{'wall s':>9}"
        f"{'targets/s':>11}{'start NLL':>12}"
    )
    for r in rows:
        print(f"{r[0]:<10}{r[1]:>9}{r[2]:>10}{r[3]:>9}{r[4]:>9.2f}{r[5]:>11.1f}{r[6]:>12.1f}")
    print(
        f"packed / per turn: {rows[0][5] / rows[1][5]:.2f}x target tokens/s, "
        f"{rows[1][2] / rows[0][2]:.2f}x fewer tokens processed"
    )


def reward_of(text: str) -> float:
    """The benchmark's reward: the reply's length in characters mod 7, over 6 (any fixed function
    of the completion with variance in every group does: both trainers then update)."""
    return (len(text) % 7) / 6


def grpo_step(model_dir: Path, prompts: int, group: int, new_tokens: int, steps: int) -> None:
    from acmrl.envs.kb_search import KBSearch
    from acmrl.train.grpo import GRPOTrainer

    class LengthKB(KBSearch):
        def score(self, task, answer):
            return reward_of(answer or "")

    env = LengthKB(preset="tiny", seed=0)
    with tempfile.TemporaryDirectory() as tmp:
        cfg = GRPOConfig(output=tmp, log_with=[], save_rollouts=False)
        cfg.model.name = str(model_dir)
        cfg.lora.enabled = False
        cfg.arms = ["react"]
        cfg.agent.max_turns = 1
        cfg.sampling.max_new_tokens = new_tokens
        cfg.sampling.stop = []
        cfg.group_size, cfg.tasks_per_step = group, prompts
        cfg.skip_flat_groups = False
        cfg.optim.lr, cfg.optim.schedule, cfg.optim.max_steps = 1e-6, "constant", steps
        cfg.optim.batch_tokens = 1 << 20  # one micro-batch, as TRL
        trainer = GRPOTrainer(cfg, env=env)
        ours, parts = [], []
        for s in range(steps):
            t0 = time.perf_counter()
            m = trainer.step(s)
            ours.append(time.perf_counter() - t0)
            parts.append((m["rollout/seconds"], m["train/seconds"]))
        first = [ep.next_request().prompt_ids for ep in trainer_episodes(trainer, prompts)]
    texts = [trainer.tok.decode(ids) for ids in first]
    theirs = trl_steps(model_dir, texts, group, new_tokens, steps)
    a, b = statistics.mean(ours[1:]), statistics.mean(theirs[1:])
    print(
        f"\n(b) one GRPO step: {prompts} prompts x {group} completions x {new_tokens} tokens, "
        f"tiny model, prompt {len(first[0])} tokens"
    )
    print(f"{'trainer':<10}{'step s (mean of ' + str(steps - 1) + ')':>24}{'all steps':>40}")
    print(f"{'acmrl':<10}{a:>24.3f}   {[round(x, 3) for x in ours]}")
    print(f"{'TRL':<10}{b:>24.3f}   {[round(x, 3) for x in theirs]}")
    roll = statistics.mean(p[0] for p in parts[1:])
    train = statistics.mean(p[1] for p in parts[1:])
    print(f"acmrl step = rollout {roll:.3f} s + update {train:.3f} s (+ rewards, samples)")
    print(f"acmrl / TRL step time: {a / b:.2f}x (TRL takes {b / a:.1f}x as long)")


def trainer_episodes(trainer, n: int):
    from acmrl.train.grpo_steps import step_episodes, step_tasks

    tasks = step_tasks(trainer.tasks, 0, trainer.cfg)
    eps = step_episodes(trainer.cfg, trainer.env, tasks, 0, trainer.tok)
    return eps[:: trainer.cfg.group_size][:n]


def trl_steps(model_dir: Path, prompts: list[str], group: int, new_tokens: int, steps: int):
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig as TRLConfig
    from trl import GRPOTrainer as TRLTrainer

    times: list[float] = []

    class Clock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            times.append(time.perf_counter() - self.t0)

    def reward(completions, **kw):
        return [reward_of(c) for c in completions]

    with tempfile.TemporaryDirectory() as tmp:
        args = TRLConfig(
            output_dir=tmp,
            per_device_train_batch_size=len(prompts) * group,
            num_generations=group,
            max_completion_length=new_tokens,
            learning_rate=1e-6,
            beta=0.0,
            max_steps=steps,
            use_cpu=True,
            bf16=False,
            gradient_checkpointing=False,
            report_to=[],
            save_strategy="no",
            logging_strategy="no",
            disable_tqdm=True,
            temperature=1.0,
            seed=0,
        )
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        tok = AutoTokenizer.from_pretrained(model_dir)
        data = Dataset.from_dict({"prompt": prompts * steps})
        trainer = TRLTrainer(
            model=model,
            reward_funcs=reward,
            args=args,
            train_dataset=data,
            processing_class=tok,
            callbacks=[Clock()],
        )
        trainer.train()
    return times


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="tiny", help="tiny (random, small), default, or a folder")
    p.add_argument("--preset", default="tiny")
    p.add_argument("--episodes", type=int, default=6)
    p.add_argument("--batch-tokens", type=int, default=8192)
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--group", type=int, default=4)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--skip-trl", action="store_true")
    a = p.parse_args()
    torch.set_flush_denormal(True)
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        tiny = build_tiny_model(Path(tmp) / "tiny", tokenizer_from=DEFAULT_MODEL)
        name = {"tiny": str(tiny), "default": DEFAULT_MODEL}.get(a.model, a.model)
        packing(name, a.preset, a.episodes, a.batch_tokens)
        if not a.skip_trl:
            grpo_step(tiny, a.prompts, a.group, a.new_tokens, a.steps)


if __name__ == "__main__":
    main()
