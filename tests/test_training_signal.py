"""What the student is taught is exactly what the method says. One test per item.

The trajectories are hand-built or scripted, so every number can be followed: token weights in
the samples, the learning-rate schedule, flat groups, the KL reference, helper sampling, the
cost of each context edit (worked out in the comments), resource use, checkpoints, and the
demonstrations' summaries and failures.
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from acmrl.config import AgentConfig, GRPOConfig, SamplingConfig
from acmrl.context.prefix import reusable_prefix
from acmrl.context.render import format_tool_call
from acmrl.engines.scripted import ScriptedEngine, replay
from acmrl.envs import load
from acmrl.rewards import RewardWeights, trajectory_reward
from acmrl.rollout.agent import Episode
from acmrl.rollout.records import ModelCall, Step, Trajectory
from acmrl.rollout.worker import run_episodes
from acmrl.train.samples import ENV, POLICY, TEACHER, trajectory_samples
from tests.grpo_env import TargetEnv, override


@pytest.fixture(scope="module")
def env():
    return load("kb_search", preset="tiny", seed=0)


# -- 1. SFT weights do not depend on packing ------------------------------------------------------


def _call(role: str, prompt: list[int], completion: list[int]) -> ModelCall:
    return ModelCall(role, prompt, completion, [-0.5] * len(completion), 0, "stop", 0.0)


def _resumed(score: float) -> Trajectory:
    """A resumed run: the student's replayed turn 0, the teacher's turn 1 (the edit), the
    student's turn 2 after it. Each prompt extends the last prompt + completion, so the three
    calls pack into one sample."""
    p0 = [1, 2, 3]
    c0 = [10, 11]  # student, before the edit
    p1 = p0 + c0 + [4]
    c1 = [20, 21, 22]  # teacher
    p2 = p1 + c1 + [5, 6]
    c2 = [30]  # student, after the edit
    traj = Trajectory("e#edit0", "t", "env", "acm", 0, 0, "m", "q", "a", score=score)
    traj.steps = [
        Step(0, _call("policy", p0, c0)),
        Step(1, _call("teacher", p1, c1), origin="teacher"),
        Step(2, _call("policy", p2, c2)),
    ]
    traj.edit = {"source": "e", "step": 1, "kind": "correction", "teacher": "oracle"}
    return traj


def _token_weights(samples) -> dict[int, tuple[int, float]]:
    """completion token id -> (loss mask, weight), whatever sample it sits in."""
    out = {}
    for s in samples:
        weights = getattr(s, "weights", None) or [s.weight] * len(s.token_ids)
        for t, o, m, w in zip(s.token_ids, s.origin, s.loss_mask, weights, strict=True):
            if o != ENV:
                out[t] = (m, w)
    return out


def test_sft_weights_do_not_depend_on_packing():
    for score, after in ((0.0, 0.0), (1.0, 1.0)):
        traj = _resumed(score)
        packed = trajectory_samples(traj)
        unpacked = trajectory_samples(traj, pack=False)
        assert len(packed) == 1 and len(unpacked) == 3
        want = {
            10: (0, 0.0),  # replayed before the edit: context
            11: (0, 0.0),
            20: (1, 1.0),  # the teacher's turn
            21: (1, 1.0),
            22: (1, 1.0),
            30: (1, after),  # after the edit: the resumed run's outcome
        }
        assert _token_weights(packed) == _token_weights(unpacked) == want
    # configurable: a failed resume may still teach a little
    from acmrl.train.samples import SampleWeights

    w = SampleWeights(after_failure=0.25)
    assert _token_weights(trajectory_samples(_resumed(0.0), weights=w))[30] == (1, 0.25)

    # SFT's batch: the same weighted loss packed or not
    from acmrl.train.loss import sft_loss
    from acmrl.train.sft import collate

    def loss(samples):
        batch = collate([s.to_dict() for s in samples], 64, 0, "cpu")
        lp = -batch["input_ids"].float() / 100  # any per-token logprob will do
        return float(sft_loss(lp, batch["loss_mask"], batch["weights"]) * batch["loss_mask"].sum())

    for score in (0.0, 1.0):
        traj = _resumed(score)
        assert loss(trajectory_samples(traj)) == pytest.approx(
            sum(loss([s]) for s in trajectory_samples(traj, pack=False))
        )


# -- 2. top-k KL only where top-k exists ----------------------------------------------------------


def test_topk_kl_only_where_topk_exists():
    from acmrl.train.loss import topk_kl_at
    from acmrl.train.sft import collate, sft_topk_kl

    torch.manual_seed(0)
    V = 50
    with_topk = {
        "token_ids": [1, 5, 6, 7],
        "loss_mask": [0, 1, 1, 1],
        "weights": [0.0, 1.0, 1.0, 1.0],
        "weight": 1.0,
        "teacher_topk_ids": [[5, 8, 9], [6, 8, 9], [7, 8, 9]],
        "teacher_topk_logprobs": [[-0.1, -3.0, -4.0]] * 3,
    }
    # a record annotated before teacher.topk was on: no top-k at all
    without = {
        "token_ids": [1, 12, 13],
        "loss_mask": [0, 1, 1],
        "weights": [0.0, 1.0, 1.0],
        "weight": 1.0,
        "teacher_topk_ids": [],
        "teacher_topk_logprobs": [],
    }
    batch = collate([with_topk, without], 16, 0, "cpu")
    logits = torch.randn(int(batch["loss_mask"].sum()), V)  # one row per target, in order
    kl = sft_topk_kl(logits, batch)
    # the KL of the first sample's 3 targets alone: the second sample adds NLL only
    alone = topk_kl_at(
        logits[:3],
        torch.tensor(with_topk["teacher_topk_ids"]),
        torch.tensor(with_topk["teacher_topk_logprobs"]),
    )
    assert float(kl) == pytest.approx(float(alone))
    assert batch["topk_mask"].tolist() == [[False, True, True, True], [False, False, False, False]]


# -- 3. the learning-rate schedule counts optimiser updates ---------------------------------------


def _grpo_cfg(tmp_path, model, **kw) -> GRPOConfig:
    cfg = GRPOConfig(output=str(tmp_path / "grpo"), log_with=[], save_rollouts=False)
    cfg.model.name = str(model)
    cfg.arms = ["react"]
    cfg.agent.max_turns = 1
    cfg.sampling.max_new_tokens = 2
    cfg.group_size = 2
    cfg.tasks_per_step = 1
    cfg.optim.lr = 1e-2
    cfg.lora.r = 4
    return override(cfg, **kw)


def _push(trainer) -> None:
    """Give the rollouts of a step advantages +1, -1, ... so the update moves the weights
    (the tiny random model never says the target word, so its own groups are flat)."""

    def advantages(episodes):
        rewards = [float(i % 2) for i in range(len(episodes))]
        terms = [{"success": r} for r in rewards]
        return rewards, [1.0 if i % 2 else -1.0 for i in range(len(episodes))], terms

    trainer.advantages = advantages


def test_lr_schedule_counts_optimiser_updates(tmp_path, tiny_model_dir):
    from acmrl.train.grpo import GRPOTrainer

    cfg = _grpo_cfg(
        tmp_path, tiny_model_dir, updates_per_step=2, optim__max_steps=2, optim__schedule="cosine"
    )
    trainer = GRPOTrainer(cfg, env=TargetEnv())
    _push(trainer)
    metrics = trainer.step(0)
    # 2 GRPO steps x 2 updates = 4 updates; after the first step's 2 the cosine is half-way:
    # lr = 1e-2 x 0.5 x (1 + cos(pi x 2/4)) = 5e-3 (counting GRPO steps it would be 0 already)
    assert trainer.sched.last_epoch == 2
    assert metrics["lr"] == pytest.approx(5e-3)
    # a step whose groups are all flat takes no optimiser step, but its updates still count
    trainer.samples = lambda episodes, adv: ([], [], [], len(episodes))
    trainer.step(1)
    assert trainer.sched.last_epoch == 4 and trainer.sched.get_last_lr()[0] == pytest.approx(0.0)


# -- 4. flat groups are exactly flat --------------------------------------------------------------


def test_flat_groups_are_exactly_flat():
    from acmrl.train.loss import group_advantages

    groups = torch.tensor([0] * 8 + [1] * 2)
    # eight equal rewards: their float32 mean is 0.70000005, not 0.7 (the old check `a == 0.0`
    # missed the group, and std scaling turned the rounding into +0.056 on every rollout)
    rewards = torch.tensor([0.7] * 8 + [1.0, 0.0])
    assert float(rewards[:8].mean()) != pytest.approx(0.7, abs=0.0)
    for scale in (False, True):
        adv = group_advantages(rewards, groups, scale=scale)
        assert adv[:8].tolist() == [0.0] * 8
        assert adv[8] > 0 > adv[9]
    # equal within a tolerance: rewards computed along different float paths
    near = torch.tensor([0.3, 0.1 + 0.2], dtype=torch.float64)
    assert group_advantages(near, torch.tensor([0, 0]), scale=True).tolist() == [0.0, 0.0]


# -- 5. the KL reference is the start model after --resume ----------------------------------------


def test_kl_reference_is_the_start_model_after_resume(tmp_path, tiny_model_dir):
    from transformers import AutoModelForCausalLM

    from acmrl.train.grpo import GRPOTrainer

    cfg = _grpo_cfg(
        tmp_path, tiny_model_dir, lora__enabled=False, kl_coef=0.1, save_every=1, optim__lr=1e-2
    )
    first = GRPOTrainer(cfg, env=TargetEnv())
    _push(first)
    first.step(0)
    first.save(1)
    resumed = GRPOTrainer(cfg, resume=True, env=TargetEnv())
    start = AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict()
    ref = resumed.ref.state_dict()
    trained = resumed.acc.unwrap_model(resumed.model).state_dict()
    name = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(trained[name], start[name])  # the step moved the weights
    assert all(torch.equal(ref[k], start[k]) for k in start)


# -- 6. trained helper calls are sampled ----------------------------------------------------------


class Recording(ScriptedEngine):
    def __init__(self, tokenizer, reply):
        super().__init__(tokenizer, reply, truncate=False)
        self.requests = []

    def generate(self, requests):
        self.requests += requests
        return super().generate(requests)


def _acm_script(env, task, eid: str) -> dict[str, list[str]]:
    plan = env.oracle_plan(task)
    return {
        eid: [
            format_tool_call(*plan[0]),
            "I will compact what I have read.\n" + format_tool_call("manage_context", {}),
            format_tool_call("answer", {"text": "no idea"}),
        ],
        f"{eid}/summariser": ["- Nothing needed yet."],
    }


def test_trained_helper_calls_are_sampled(env, tokenizer):
    from acmrl.rollout.agent import make_episode

    task = env.tasks("train")[0]
    for train_helpers, want in ((True, 0.9), (False, 0.0)):
        cfg = GRPOConfig(train_helpers=train_helpers)
        cfg.sampling.temperature = 0.9
        cfg.agent.max_context_tokens = 4096
        ep = make_episode(
            cfg, "e", env, task, "acm", 0, tokenizer, sample_helpers=cfg.train_helpers
        )
        engine = Recording(tokenizer, replay(_acm_script(env, task, "e")))
        run_episodes([ep], engine)
        helper = [r for r in engine.requests if r.session_id.endswith("/summariser")]
        policy = [r for r in engine.requests if r.session_id == "e"]
        assert len(helper) == 1 and all(r.temperature == 0.9 for r in policy)
        assert helper[0].temperature == want


# -- 7. costs are charged once, on the real next input, and never free ----------------------------


def _play(env, task, arm, texts, helpers, tokenizer, **agent) -> Episode:
    ep = Episode(
        f"{task.id}#{arm}#0",
        env,
        task,
        arm,
        tokenizer,
        agent=AgentConfig(max_context_tokens=8192, **agent),
        sampling=SamplingConfig(max_new_tokens=400),
    )
    scripts = {ep.id: texts} | {f"{ep.id}/{role}": t for role, t in helpers.items()}
    run_episodes([ep], ScriptedEngine(tokenizer, replay(scripts), truncate=False))
    return ep


def _next_prompt(traj: Trajectory, step: int) -> list[int]:
    return next(s.call.prompt_ids for s in traj.steps[step + 1 :] if s.call is not None)


def _last_input(traj: Trajectory, step: int) -> list[int]:
    call = traj.steps[step].call
    return call.prompt_ids + call.completion_ids


def test_costs_are_charged_once_on_the_real_next_input_acm(env, tokenizer):
    """An acm episode: search; compaction; query_memory and search in one completion; answer.
    Output weight 2."""
    task = env.tasks("eval")[0]
    (n1, a1), (n2, a2) = env.oracle_plan(task)[:2]
    texts = [
        format_tool_call(n1, a1),
        "My context grows, so I compact it.\n" + format_tool_call("manage_context", {}),
        format_tool_call("query_memory", {"summary_id": "S1", "query": "what did I find?"})
        + "\n"
        + format_tool_call(n2, a2),
        format_tool_call("answer", {"text": "no idea"}),
    ]
    helpers = {"summariser": ["- I searched once."], "querier": ["I searched once."]}
    ep = _play(env, task, "acm", texts, helpers, tokenizer, output_weight=2.0)
    traj = ep.traj
    assert traj.status == "answered"
    tok = len

    # step 1: manage_context. The model generated 35 tokens for it (rationale and call; the
    # end-of-turn token is not the call's); the summariser read a 264-token prompt (nothing
    # cached) and wrote 6 tokens.
    (mc,) = traj.steps[1].events
    call = traj.steps[1].call
    assert mc.call_tokens == tok(call.completion_ids) - 1 == 35
    summariser = traj.steps[1].helper_calls[0]
    assert (tok(summariser.prompt_ids), tok(summariser.completion_ids)) == (264, 6)
    # the next input actually sent (step 2's prompt) has 851 tokens; it shares 753 with step
    # 1's prompt + completion (system prompt, tools and task: the history after the task was
    # replaced by the summary), so Cache Cost = 851 - 753 = 98, receipt included.
    nxt, last = _next_prompt(traj, 1), _last_input(traj, 1)
    assert (tok(nxt), reusable_prefix(last, nxt)) == (851, 753)
    assert (mc.tokens_before, mc.tokens_after, mc.cache_cost) == (tok(last), 851, 98)
    # Compaction Cost = (35 + 6) generated x 2 + 264 unreused helper prompt + 98 = 444
    assert mc.compaction_cost == 444.0

    # step 2: query_memory, then a search, in one completion. No prefix broke: the next input
    # (1,132 tokens) adds 1,132 - 893 = 239 new tokens: the calls, the querier's extract and
    # the search results. The query is charged only the 26 tokens its own output adds.
    (qm,) = traj.steps[2].events
    nxt, last = _next_prompt(traj, 2), _last_input(traj, 2)
    assert (tok(nxt), reusable_prefix(last, nxt)) == (1132, 893)
    state = traj.final_state
    i = next(j for j, it in enumerate(state) if "[from S1]" in json.dumps(it))
    own = len(ep.renderer.ids(state[: i + 1], False)) - len(ep.renderer.ids(state[:i], False))
    assert qm.cache_cost == own == 26
    # its call is the 42 tokens up to the end of its own block, of the completion's 79 (the
    # search call after it is not a memory cost); the querier read 205 tokens and wrote 5:
    # Compaction Cost = (42 + 5) x 2 + 205 + 26 = 325
    assert (qm.call_tokens, tok(traj.steps[2].call.completion_ids) - 1) == (42, 79)
    querier = traj.steps[2].helper_calls[0]
    assert (tok(querier.prompt_ids), tok(querier.completion_ids)) == (205, 5)
    assert qm.compaction_cost == 325.0
    assert traj.metrics["compaction_cost"] == 444.0 + 325.0


def test_costs_are_charged_once_on_the_real_next_input_evolve(env, tokenizer):
    """An evolve episode: search; two edits in one completion (a no-op and one that drops the
    search result's text); a refused evolve; answer. Output weight 1."""
    task = env.tasks("eval")[0]
    n1, a1 = env.oracle_plan(task)[0]
    noop = format_tool_call("evolve", {"code": "return state;"})
    shorten = format_tool_call(
        "evolve",
        {
            "code": "return state.map(it => it.type === 'function_call_output' && "
            "!it.output.startsWith('{') ? {...it, output: 'searched'} : it);"
        },
    )
    refused = format_tool_call("evolve", {"code": "throw new Error('oops');"})
    texts = [
        format_tool_call(n1, a1),
        noop + "\n" + shorten,
        refused,
        format_tool_call("answer", {"text": "no idea"}),
    ]
    ep = _play(env, task, "evolve", texts, {}, tokenizer)
    traj = ep.traj
    tok = len

    # step 1: two edits in one completion, charged once in total on the next input
    first, second = traj.steps[1].events
    assert first.applied and second.applied
    nxt, last = _next_prompt(traj, 1), _last_input(traj, 1)
    # the next input has 1,255 tokens and shares 954 with the previous prompt + completion (up
    # to the search output, which the second edit rewrote): Cache Cost 1,255 - 954 = 301, the
    # receipts and the re-rendered calls included, charged on the first edit only
    assert (tok(nxt), reusable_prefix(last, nxt)) == (1255, 954)
    assert (first.cache_cost, second.cache_cost) == (301, 0)
    # the call tokens split the completion: 30 + 74 = 104 generated tokens (end-of-turn excluded)
    assert first.call_tokens + second.call_tokens == tok(traj.steps[1].call.completion_ids) - 1
    assert (first.call_tokens, second.call_tokens) == (30, 74)
    assert (first.compaction_cost, second.compaction_cost) == (30 + 301, 74)
    # a no-op is not free: the first edit's receipt alone measured its State change as 2
    # tokens (what the old rule charged), but the input sent next holds 301 new tokens
    assert json.loads(traj.steps[1].observations[0])["cache_cost"] == 2

    # step 2: a refused evolve is charged its 36 generated tokens and the Cache Cost of the next
    # input: the previous prompt + completion (1,292 tokens) is reused whole and the receipt
    # and the generation header add 1,332 - 1,292 = 40; it counts as a failed edit
    (bad,) = traj.steps[2].events
    nxt, last = _next_prompt(traj, 2), _last_input(traj, 2)
    assert not bad.applied and "the code threw" in bad.detail
    assert (bad.call_tokens, tok(nxt), reusable_prefix(last, nxt)) == (36, 1332, 1292)
    assert bad.cache_cost == 40 and bad.compaction_cost == 36 + 40
    assert traj.metrics["failed_edits"] == 1
    _, terms = trajectory_reward(traj.to_dict(), ep.budget, RewardWeights())
    assert terms["failed_edits"] == 1.0
    assert traj.metrics["compaction_cost"] == 331 + 74 + 76


# -- 8. resource use in the reward ----------------------------------------------------------------


def test_resource_use_in_the_reward(env, tokenizer):
    task = env.tasks("eval")[0]
    plan = env.oracle_plan(task)
    texts = [format_tool_call(*plan[0]), format_tool_call("answer", {"text": "no idea"})]
    ep = _play(env, task, "react", texts, {}, tokenizer, output_weight=4.0)
    c0, c1 = (s.call for s in ep.traj.steps)
    # uncached input: all of the first prompt, then what the second adds after the first
    # prompt + completion; generated: both completions
    uncached = (
        len(c0.prompt_ids)
        + len(c1.prompt_ids)
        - reusable_prefix(c0.prompt_ids + c0.completion_ids, c1.prompt_ids)
    )
    generated = len(c0.completion_ids) + len(c1.completion_ids)
    assert ep.traj.metrics["uncached_input_tokens"] == uncached
    assert ep.traj.metrics["generated_tokens"] == generated
    traj = ep.traj.to_dict()
    off, terms = trajectory_reward(traj, ep.budget, RewardWeights(), output_weight=4.0)
    assert terms["resource_use"] == pytest.approx((uncached + 4 * generated) / ep.budget)
    on, _ = trajectory_reward(traj, ep.budget, RewardWeights(resource_use=0.5), output_weight=4.0)
    assert on == pytest.approx(off - 0.5 * terms["resource_use"])


# -- 9. GRPO checkpoints are the trained policy ---------------------------------------------------


@pytest.fixture(scope="module")
def sft_adapter(tmp_path_factory, tiny_model_dir):
    """An SFT-like adapter on the tiny model with non-zero weights."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(1)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    lora = LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    model = get_peft_model(base, lora)
    out = tmp_path_factory.mktemp("sft") / "final"
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(out)
    return out


def test_grpo_checkpoints_are_the_trained_policy(tmp_path, sft_adapter, tiny_model_dir):
    from acmrl.config import EvalConfig, ModelConfig
    from acmrl.eval.run import run_eval
    from acmrl.models import ModelError, load_model
    from acmrl.rollout.agent import make_episode
    from acmrl.train.grpo import GRPOTrainer

    cfg = _grpo_cfg(tmp_path, sft_adapter, save_every=1)
    trainer = GRPOTrainer(cfg, env=TargetEnv())
    _push(trainer)
    trainer.step(0)
    trainer.save(1)
    ckpt = tmp_path / "grpo" / "checkpoints" / "step-000001" / "model"
    trainer.tok.save_pretrained(ckpt)  # not needed (the base's is used), but a user may

    # the checkpoint computes the live policy's logits
    ids = torch.tensor([[1, 9690, 198, 2683, 359, 253, 1151, 30, 2]])
    live = trainer.acc.unwrap_model(trainer.model).eval()
    with torch.no_grad():
        want = live(input_ids=ids).logits
        got = load_model(ModelConfig(name=str(ckpt)))[0](input_ids=ids).logits
    assert float((want - got).abs().max()) < 1e-4

    # acmrl eval on the checkpoint equals, token for token, the live policy's greedy episodes
    ev = EvalConfig(output=str(tmp_path / "eval"), plots=False, arms=["react"])
    ev.model.name = str(ckpt)
    ev.env.name, ev.env.options, ev.env.limit = "kb_search", {"preset": "tiny", "seed": 0}, 2
    ev.agent.max_turns = 2
    ev.sampling.max_new_tokens = 12
    run_eval(ev)
    evald = [json.loads(line) for line in (tmp_path / "eval" / "episodes.jsonl").open()]
    env = load("kb_search", preset="tiny", seed=0)
    eps = [
        make_episode(
            ev,
            t["episode_id"],
            env,
            next(x for x in env.tasks("eval") if x.id == t["task_id"]),
            "react",
            0,
            trainer.tok,
        )
        for t in evald
    ]
    run_episodes(eps, trainer.engine)
    for t, ep in zip(evald, eps, strict=True):
        got_ids = [s["call"]["completion_ids"] for s in t["steps"] if s["call"]]
        live_ids = [s.call.completion_ids for s in ep.traj.steps if s.call]
        assert got_ids == live_ids and got_ids

    # the adapter names the run's start-model (the merged SFT policy), not the raw base; put
    # on another base, it is refused
    conf = json.loads((ckpt / "adapter_config.json").read_text())
    assert conf["base_model_name_or_path"] == str((tmp_path / "grpo" / "start-model").resolve())
    conf["base_model_name_or_path"] = str(tiny_model_dir)
    (ckpt / "adapter_config.json").write_text(json.dumps(conf))
    with pytest.raises(ModelError, match="trained on the model with id"):
        load_model(ModelConfig(name=str(ckpt)))


# -- 10 and 11. demonstrations teach every role, and failed ones are not successes ----------------


def _demo_dataset(env, tokenizer, tmp_path, weights=None):
    from acmrl.teacher.dataset import build_dataset
    from acmrl.teacher.demonstrate import demonstrate

    tasks = env.tasks("train")[:4]
    demos = demonstrate(
        env,
        tasks,
        ["react", "acm"],
        tokenizer,
        agent=AgentConfig(max_context_tokens=1400, context_signal=True),
        sampling=SamplingConfig(),
        pressure=0.75,
    )
    out = tmp_path / "ann"
    out.mkdir(parents=True)
    with (out / "records-0-of-1.jsonl").open("w") as f:
        for task in tasks:
            mine = [d.to_dict() for d in demos if d.task_id == task.id]
            record = {"task_id": task.id, "trajectories": [], "assessments": [], "resumed": []}
            f.write(json.dumps(record | {"demonstrations": mine}) + "\n")
    ds, stats = build_dataset(out) if weights is None else build_dataset(out, weights)
    return demos, ds["samples"].to_list(), stats


def test_demonstrations_teach_every_role(env, tokenizer, tmp_path):
    demos, samples, stats = _demo_dataset(env, tokenizer, tmp_path)
    notes = [c for d in demos if d.arm == "acm" for s in d.steps for c in s.helper_calls]
    summaries = [s for s in samples if s.get("kind") == "summariser"]
    assert notes and len(summaries) == len(notes) == stats.get("helper_samples")
    for s in summaries:  # the teacher's notes, trained like its turns (acm demos succeed here)
        assert set(s["origin"]) == {ENV, TEACHER} and s["weight"] == 1.0
        targets = [t for t, m in zip(s["token_ids"], s["loss_mask"], strict=True) if m]
        assert "- " in tokenizer.decode(targets)


def test_failed_demonstrations_are_not_trained_as_successes(env, tokenizer, tmp_path):
    demos, samples, stats = _demo_dataset(env, tokenizer, tmp_path / "a")
    failed = {d.episode_id for d in demos if d.score < 1.0}
    assert failed and len(samples) > len(failed)  # react overflows here
    for s in samples:
        assert s["weight"] == (0.0 if s["episode_id"] in failed else 1.0)
    assert stats.get("demonstration_failed") == len(failed)
    assert stats["trained_samples"] == sum(s["episode_id"] not in failed for s in samples)
    # configurable: weight failed demonstrations by outcome
    from acmrl.train.samples import SampleWeights

    _, samples, _ = _demo_dataset(env, tokenizer, tmp_path / "b", SampleWeights(demo_failure=0.2))
    assert {s["weight"] for s in samples if s["episode_id"] in failed} == {0.2}
    assert all(POLICY not in s["origin"] for s in samples)
    assert math.isclose(max(s["weight"] for s in samples), 1.0)
