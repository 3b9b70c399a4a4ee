"""GRPO's decision groups and segment weights: branches replay their source exactly through the
real environment and context tools, are credited at the decision turn only, and an episode's
weight in the loss follows the configured segment rule."""

from __future__ import annotations

import json

import pytest
import torch

from acmrl.config import AgentConfig, GRPOConfig, SamplingConfig
from acmrl.context.render import format_tool_call
from acmrl.engines.scripted import ScriptedEngine, replay
from acmrl.envs import load
from acmrl.rollout.agent import Episode
from acmrl.rollout.worker import run_episodes
from acmrl.train.decisions import (
    Decision,
    branch_id,
    branch_scripts,
    decision_states,
    mark_branch,
    pick_decision,
    policy_turns,
    prefill_figures,
    run_with_replays,
    turns_credited,
)
from acmrl.train.grpo import collate
from acmrl.train.grpo_steps import branching_groups, group_key, segment_coefficients
from acmrl.train.loss import grpo_loss
from acmrl.train.samples import trajectory_samples

AGENT = {"max_context_tokens": 1536, "summary_max_tokens": 24, "query_max_tokens": 16}


@pytest.fixture(scope="module")
def env():
    return load("kb_search", preset="tiny", seed=0)


def calls(plan) -> list[str]:
    return [format_tool_call(name, args) for name, args in plan]


def acm_episode(env, task, eid, tok) -> Episode:
    return Episode(
        eid,
        env,
        task,
        "acm",
        tok,
        agent=AgentConfig(**AGENT),
        sampling=SamplingConfig(max_new_tokens=200),
    )


@pytest.fixture(scope="module")
def source(env, tiny_engine):
    """An acm episode that reads twice, compacts (turn 2) and goes on to the right answer; its
    summaries are the tiny model's."""
    task = env.tasks("eval")[0]
    plan = env.oracle_plan(task)
    texts = [*calls(plan[:2]), format_tool_call("manage_context", {}), *calls(plan[2:])]
    ep = acm_episode(env, task, "s1/0/" + f"{task.id}#acm#0", tiny_engine.tokenizer)
    run_episodes(
        [ep],
        ScriptedEngine(tiny_engine.tokenizer, replay({ep.id: texts})),
        helper_engine=tiny_engine,
    )
    assert ep.traj.status == "answered" and ep.traj.score == 1.0, ep.traj.error
    return ep, texts


def test_decision_states_are_the_context_tool_calls_and_the_full_inputs(source):
    ep, _ = source
    tool = decision_states(ep.traj, ep.budget, context_share=1.0)
    assert [(d.turn, d.reason) for d in tool] == [(2, "tool")]
    every = decision_states(ep.traj, ep.budget, context_share=0.0)
    assert [d.turn for d in every] == list(range(len(policy_turns(ep.traj))))
    assert all(0 < d.share < 1 for d in every)
    # the draw is seeded by the run's seed and the episode id: a resumed run draws the same
    assert pick_decision(every, 3, ep.id) == pick_decision(every, 3, ep.id)
    assert len({pick_decision(every, s, ep.id).turn for s in range(20)}) > 1
    assert pick_decision([], 0, ep.id) is None


def test_branches_replay_the_source_and_are_credited_at_the_decision(env, source, tiny_engine):
    ep, texts = source
    tok = tiny_engine.tokenizer
    d = Decision(2, "tool", 0.5)
    ids = [branch_id(ep.id, r) for r in (1, 2)]
    assert {group_key(i) for i in ids} == {group_key(ep.id)}  # one group with the source
    scripts = {}
    for eid in ids:
        scripts |= branch_scripts(ep.traj, d, eid, tok)
    # the source's turns before the decision, and the summary it wrote there, are not replayed
    assert [r.text for r in scripts[ids[0]]] == texts[:2] and f"{ids[0]}/summariser" not in scripts

    played = {ids[1]: iter(texts[2:])}

    def live(session_id: str, prompt: str) -> str:
        """What the policy samples from the decision on: b1 answers at once (wrongly), b2
        compacts and goes on as the source did; summaries are short notes."""
        if session_id.endswith("/summariser"):
            return "I read two documents."
        if session_id == ids[0]:
            return format_tool_call("answer", {"text": "nobody"})
        return next(played[session_id])

    branches = [acm_episode(env, ep.task, eid, tok) for eid in ids]
    run_with_replays(branches, scripts, ScriptedEngine(tok, live), tok, concurrency=2)
    b1, b2 = (b.traj for b in branches)
    assert all(mark_branch(b.traj, ep.traj, d) for b in branches)
    assert b1.status == "answered" and b1.score == 0.0
    assert b2.score == 1.0 and b2.metrics["compactions"] == 1
    src_turns, b1_turns = policy_turns(ep.traj), policy_turns(b1)
    # the replayed turns are the source's own calls (its sampled ids and logprobs)...
    assert [t.call for t in b1_turns[:2]] == [t.call for t in src_turns[:2]]
    # ...the decision turn starts from the source's input, and is the branch's own
    assert b1_turns[2].call.prompt_ids == src_turns[2].call.prompt_ids
    assert b1_turns[2].text != src_turns[2].text
    assert b1.edit == {"kind": "branch", "source": ep.id, "step": 2, "reason": "tool", "share": 0.5}

    def targets(traj, turns):
        return sum(sum(s.loss_mask) for s in trajectory_samples(traj, True, turns=turns))

    decision, rest = turns_credited(d, "decision"), turns_credited(d, "continuation")
    assert decision == (2, 2) and rest == (2, None)
    assert targets(b1, decision) == len(b1_turns[2].call.completion_ids)
    # the source's decision turn and the summary that turn made
    summary = [c for s in ep.traj.steps for c in s.helper_calls if c.role == "summariser"]
    assert len(summary) == 1
    turn2 = len(src_turns[2].call.completion_ids) + len(summary[0].completion_ids)
    assert targets(ep.traj, decision) == turn2
    later = sum(len(t.call.completion_ids) for t in src_turns[3:])
    assert targets(ep.traj, rest) == turn2 + later
    # a branch under continuation credit: its turns from the decision on and its own summary,
    # nothing of the replayed turns
    b2_turns = policy_turns(b2)
    b2_summary = [c for s in b2.steps for c in s.helper_calls if c.role == "summariser"]
    own = sum(len(t.call.completion_ids) for t in b2_turns[2:]) + len(b2_summary[0].completion_ids)
    assert targets(b2, rest) == own
    # a branch checked against another source is refused: it is not a sample of that state
    other = acm_episode(env, env.tasks("eval")[1], "x#acm#0", tok)
    run_episodes([other], ScriptedEngine(tok, replay({other.id: texts})), helper_engine=tiny_engine)
    assert not mark_branch(b1, other.traj, d)
    # without an engine's own count, what each session reused of its own: a branch's first live
    # call reuses what its replayed turns read, as the source's did
    figures = prefill_figures([(b1, 2), (b2, 2)], None, 1)
    assert 0.0 < figures["decision/prefill_share"] < 1.0  # the scripted engine reuses nothing
    assert b1_turns[2].call.cached_prefix_tokens > 0  # besides what the replay read


def test_a_branch_that_replays_to_the_end_costs_what_its_source_did(env, tiny_engine):
    """Two compactions before the decision (their summaries the tiny model's, the second
    reusing the first's cached prefix): a branch that goes on exactly as the source did gets
    the same reward terms, so nothing but its own choices sets it apart in its group."""
    from acmrl.rewards import RewardWeights, trajectory_reward

    tok = tiny_engine.tokenizer
    task = env.tasks("eval")[0]
    plan = env.oracle_plan(task)
    compact = format_tool_call("manage_context", {})
    texts = [*calls(plan[:2]), compact, *calls(plan[2:3]), compact, *calls(plan[3:])]
    src = acm_episode(env, task, "s1/0/t#acm#0", tok)
    run_episodes([src], ScriptedEngine(tok, replay({src.id: texts})), helper_engine=tiny_engine)
    summaries = [c for s in src.traj.steps for c in s.helper_calls]
    assert len(summaries) == 2 and summaries[1].cached_prefix_tokens > 0
    d = Decision(5, "context", 0.5)  # after both compactions
    eid = branch_id(src.id, 1)
    same = ScriptedEngine(tok, replay({eid: texts[5:]}))
    branch = acm_episode(env, task, eid, tok)
    run_with_replays([branch], branch_scripts(src.traj, d, eid, tok), same, tok, concurrency=1)
    assert mark_branch(branch.traj, src.traj, d)
    w = RewardWeights()
    a = trajectory_reward(src.traj.to_dict(), src.budget, w)
    b = trajectory_reward(branch.traj.to_dict(), branch.budget, w)
    assert a == b and src.traj.metrics["compaction_cost"] > 0


def test_a_turn_cut_at_the_token_limit_replays_as_cut(env, tiny_engine):
    """The tiny model's turns are cut at 8 tokens; replayed as text they would end as plain
    replies (the final answer) and the branch would stop there. Replayed as recorded, every
    branch reaches the source's decision state."""
    tok = tiny_engine.tokenizer
    task = env.tasks("eval")[0]

    def sampled(eid: str) -> Episode:
        return Episode(
            eid,
            env,
            task,
            "acm",
            tok,
            agent=AgentConfig(max_turns=3),
            sampling=SamplingConfig(max_new_tokens=8, temperature=1.0),
            seed=len(eid),
        )

    src = sampled("s1/0/t#acm#0")
    run_episodes([src], tiny_engine)
    cut = [t.call.finish_reason for t in policy_turns(src.traj)]
    assert cut == ["length"] * 3 and src.traj.status == "max_turns"
    d = Decision(2, "context", 0.5)
    branches = [sampled(branch_id(src.id, r)) for r in (1, 2)]
    scripts = {}
    for b in branches:
        scripts |= branch_scripts(src.traj, d, b.id, tok)
    run_with_replays(branches, scripts, tiny_engine, tok, concurrency=2)
    assert all(mark_branch(b.traj, src.traj, d) for b in branches)
    assert all(len(policy_turns(b.traj)) == 3 for b in branches)


def test_branching_groups_take_the_configured_share():
    cfg = GRPOConfig(arms=["acm", "react"])
    assert branching_groups(cfg, 4, 0) == set()
    cfg.decisions.share = 0.5
    chosen = branching_groups(cfg, 4, 0)
    assert len(chosen) == 4 and chosen <= {(k, a) for k in range(4) for a in ("acm", "react")}
    assert chosen == branching_groups(cfg, 4, 0)
    cfg.decisions.share = 1.0
    assert len(branching_groups(cfg, 4, 3)) == 8
    # one group a step at share 0.5 (rounded, it would be all or none): half the steps
    one = GRPOConfig(arms=["acm"])
    one.decisions.share = 0.5
    drawn = sum(len(branching_groups(one, 1, step)) for step in range(200))
    assert 80 < drawn < 120


def test_an_episodes_weight_follows_the_segment_rule(env, source, tiny_engine):
    """Two real episodes through GRPOTrainer.samples, one compacting (three segments: before the
    compaction, after it, and the summary) and one not (one segment): under aggregation=segment
    with weight inverse each weighs 1; with weight one each weighs by its segments; under token
    aggregation each weighs by its target tokens. Every segment carries its episode's one
    advantage, computed before the split."""
    from types import SimpleNamespace

    from acmrl.train.grpo import GRPOTrainer

    ep, _ = source
    task = env.tasks("eval")[0]
    plain = Episode(
        "s1/0/t#react#0",
        env,
        task,
        "react",
        tiny_engine.tokenizer,
        agent=AgentConfig(max_context_tokens=4096),
        sampling=SamplingConfig(max_new_tokens=200),
    )
    play = ScriptedEngine(tiny_engine.tokenizer, replay({plain.id: calls(env.oracle_plan(task))}))
    run_episodes([plain], play)
    weights = {}
    for aggregation, rule in (("segment", "inverse"), ("segment", "one"), ("token", "one")):
        cfg = GRPOConfig(aggregation=aggregation, segment_weight=rule)
        fake = SimpleNamespace(cfg=cfg, credit={}, branch_ids=set(), scouts=set())
        samples, adv, coefs, _ = GRPOTrainer.samples(fake, [ep, plain], [0.25, -0.25])
        by_episode: dict[str, float] = {}
        for s, a, c in zip(samples, adv, coefs, strict=True):
            assert a == (0.25 if s.episode_id == ep.id else -0.25)
            by_episode[s.episode_id] = by_episode.get(s.episode_id, 0) + c * sum(s.loss_mask[1:])
        segments = {e: sum(s.episode_id == e for s in samples) for e in by_episode}
        assert segments == {ep.id: 3, plain.id: 1}
        weights[aggregation, rule] = by_episode
    assert weights["segment", "inverse"] == pytest.approx({ep.id: 1.0, plain.id: 1.0})
    assert weights["segment", "one"] == pytest.approx({ep.id: 3.0, plain.id: 1.0})
    tokens = weights["token", "one"]
    assert tokens[ep.id] == sum(
        len(c.completion_ids) for s in ep.traj.steps for c in [s.call, *s.helper_calls] if c
    )


def test_the_loss_is_the_weighted_token_mean(source, tiny_engine):
    """collate's loss weights (mask x segment coefficient) make grpo_loss the weighted mean of the
    per-token losses; with every coefficient 1 it is the plain token mean, as before."""
    ep, _ = source
    samples = trajectory_samples(ep.traj, helpers=True)
    coefs = segment_coefficients([sum(s.loss_mask[1:]) for s in samples], "segment", "inverse")
    adv = [0.7] * len(samples)
    b = collate(samples, adv, 4096, 0, "cpu", coefs)
    torch.manual_seed(0)
    lp = -torch.rand(b["loss_mask"].shape)
    old = lp - 0.05 * torch.randn(lp.shape)
    out = grpo_loss(lp, old, b["advantages"], b["loss_weight"], clip_eps=0.2)
    ratio = torch.exp(lp - old)
    per_token = -torch.minimum(ratio * 0.7, ratio.clamp(0.8, 1.2) * 0.7)
    w = b["loss_mask"].float() * torch.tensor(coefs)[:, None]
    assert float(out.loss) == pytest.approx(float((per_token * w).sum() / w.sum()), rel=1e-5)
    # split into micro-batches, each weighted by its share of the step's weights (as
    # GRPOTrainer.update does), the loss is the same
    halves = [collate(samples[:1], adv[:1], 4096, 0, "cpu", coefs[:1])]
    halves.append(collate(samples[1:], adv[1:], 4096, 0, "cpu", coefs[1:]))
    total = sum(float(h["loss_weight"].sum()) for h in halves)
    split = 0.0
    for h in halves:
        torch.manual_seed(0)
        h_lp = -torch.rand(h["loss_mask"].shape)
        h_old = h_lp - 0.05 * torch.randn(h_lp.shape)
        out_h = grpo_loss(h_lp, h_old, h["advantages"], h["loss_weight"], clip_eps=0.2)
        split += float(out_h.loss) * float(h["loss_weight"].sum()) / total
        h_ratio = torch.exp(h_lp - h_old)
        h_tok = -torch.minimum(h_ratio * 0.7, h_ratio.clamp(0.8, 1.2) * 0.7)
        h["expected"] = (h_tok * h["loss_weight"]).sum()
    assert split == pytest.approx(float(sum(h["expected"] for h in halves)) / total, rel=1e-5)
    plain = collate(samples, adv, 4096, 0, "cpu")
    assert torch.equal(plain["loss_weight"], plain["loss_mask"].float())
    m = plain["loss_mask"].float()
    base = grpo_loss(lp, old, plain["advantages"], plain["loss_weight"], clip_eps=0.2)
    assert float(base.loss) == pytest.approx(float((per_token * m).sum() / m.sum()), rel=1e-5)


def _branching_config(tmp_path, model_dir, save_rollouts: bool) -> GRPOConfig:
    """One GRPO step of 2 kb_search tasks x 3 on the tiny model, every group branching at a
    state drawn anywhere (context share 0)."""
    cfg = GRPOConfig(output=str(tmp_path / "grpo"), log_with=[], save_rollouts=save_rollouts)
    cfg.model.name = str(model_dir)
    cfg.env.name, cfg.env.options = "kb_search", {"preset": "tiny"}
    cfg.arms = ["acm"]
    cfg.agent.max_turns = 3
    cfg.sampling.max_new_tokens = 8
    cfg.group_size, cfg.tasks_per_step = 3, 2
    cfg.lora.r = 4
    cfg.skip_flat_groups = False
    cfg.decisions.share, cfg.decisions.context_share = 1.0, 0.0
    return cfg


def test_a_grpo_step_with_decision_groups(tmp_path, tiny_model_dir, env):
    """A real GRPO step on kb_search with every group branching: its decision groups are built
    from the rollouts, replayed without divergence, trained at their decision turns, and the
    prefill with the engine's prefix cache is measured beside the prompt tokens."""
    from acmrl.train.grpo import GRPOTrainer

    cfg = _branching_config(tmp_path, tiny_model_dir, save_rollouts=False)
    cfg.aggregation, cfg.segment_weight = "segment", "inverse"
    trainer = GRPOTrainer(cfg)
    try:
        metrics = trainer.step(0)
    finally:
        trainer.close()
    assert metrics["decision/groups"] == 2 and metrics["decision/diverged"] == 0
    # each group is three branches; the sources scouted the states and are not trained
    assert metrics["decision/members"] == 6 and metrics["decision/scouts"] == 2
    assert len(trainer.branch_ids) == 6 and set(trainer.credit) == trainer.branch_ids
    assert not trainer.scouts & set(trainer.credit)
    assert metrics["rollout/flat_episodes"] <= metrics["rollout/episodes"]
    assert metrics["rollout/episodes"] == 2  # the sources: branches are not whole episodes
    assert metrics["decision/prefilled_tokens_per_group"] > 0
    assert (
        metrics["decision/prefilled_tokens_per_group"] < metrics["decision/prompt_tokens_per_group"]
    )
    assert metrics["train/target_tokens"] > 0
    # the step's rollout cost: the engine's own prefill count, and what it generated
    assert metrics["rollout/prefill_tokens"] == trainer.engine.prefilled_tokens
    assert metrics["rollout/gen_tokens_total"] == metrics["rollout/gen_tokens"] > 0


def test_diverged_branches_count_in_the_rollout_tokens(tmp_path, tiny_model_dir, env, monkeypatch):
    """A branch dropped as diverged is never trained, but the engine generated its tokens: the
    step's ``rollout/gen_tokens`` are the sources' and the dropped branches' together."""
    import acmrl.train.decisions as decisions
    from acmrl.train.grpo import GRPOTrainer

    monkeypatch.setattr(decisions, "mark_branch", lambda *a: False)  # every branch diverged
    cfg = _branching_config(tmp_path, tiny_model_dir, save_rollouts=True)
    trainer = GRPOTrainer(cfg)
    try:
        metrics = trainer.step(0)
    finally:
        trainer.close()
    assert metrics["decision/diverged"] == 6 and not trainer.branch_ids
    dropped = sum(len(c.completion_ids) for c in trainer.dropped_calls)
    sources = [json.loads(x) for x in (tmp_path / "grpo" / "rollouts-rank0.jsonl").open()]
    assert len(sources) == 2  # the dropped branches are not written as episodes
    assert all(t["edit"]["kind"] == "scout" for t in sources)  # marked, as branches are
    calls = [
        c for t in sources for st in t["steps"] for c in [st["call"], *st["helper_calls"]] if c
    ]
    assert dropped > 0
    assert metrics["rollout/gen_tokens"] == dropped + sum(len(c["completion_ids"]) for c in calls)


def test_the_trainer_gives_each_segment_its_episodes_advantage_and_weight(source):
    """GRPOTrainer.samples: every segment of an episode carries the episode's one advantage
    (computed before the split), and under aggregation=segment, weight inverse, the episode's
    segments weigh 1 in all."""
    from types import SimpleNamespace

    from acmrl.train.grpo import GRPOTrainer

    ep, _ = source
    cfg = GRPOConfig(aggregation="segment", segment_weight="inverse")
    fake = SimpleNamespace(cfg=cfg, credit={}, branch_ids=set(), scouts=set())
    samples, adv, coefs, flat = GRPOTrainer.samples(fake, [ep], [0.25])
    assert flat == 0 and len(samples) >= 3 and adv == [0.25] * len(samples)
    total = sum(c * sum(s.loss_mask[1:]) for c, s in zip(coefs, samples, strict=True))
    assert total == pytest.approx(1.0)
    fake.credit = {ep.id: (2, 2)}  # a decision group's member: its decision turn only
    decided, _, _, _ = GRPOTrainer.samples(fake, [ep], [0.25])
    assert sum(sum(s.loss_mask) for s in decided) < sum(sum(s.loss_mask) for s in samples)


def test_a_scout_is_neither_trained_nor_in_its_groups_mean(source):
    """A decision group's source found the state from what it did there, so its reward is no
    fair sample of that state: under decisions.source=scout it is its own group (advantage 0)
    and trains nothing, and the branches' advantages are taken against their own mean."""
    import copy
    from types import SimpleNamespace

    from acmrl.train.grpo import GRPOTrainer
    from acmrl.train.grpo_steps import reward_weights

    ep, _ = source
    scout = copy.deepcopy(ep)
    scout.id = "s0/0/t#acm#0"
    branches = []
    for r, score in ((1, 1.0), (2, 0.0)):
        b = copy.deepcopy(ep)
        b.id, b.traj.score = f"s0/0/t#acm#b{r}", score
        branches.append(b)
    scout.traj.score = 1.0  # a success that would pull the branches' mean up
    cfg = GRPOConfig()
    fake = SimpleNamespace(
        cfg=cfg, weights=reward_weights(cfg), credit={b.id: (2, 2) for b in branches},
        scouts={scout.id}, branch_ids={b.id for b in branches},
    )  # fmt: skip
    rewards, adv, _ = GRPOTrainer.advantages(fake, [scout, *branches])
    assert adv[0] == 0.0
    assert adv[1] == pytest.approx(rewards[1] - (rewards[1] + rewards[2]) / 2)
    assert adv[2] == pytest.approx(-adv[1]) and adv[1] > 0
    samples, _, _, _ = GRPOTrainer.samples(fake, [scout, *branches], adv)
    assert samples and scout.id not in {s.episode_id for s in samples}
    # as a member (decisions.source=member) it would be in the group and trained
    member = SimpleNamespace(**{**vars(fake), "scouts": set()})
    member.credit = {**fake.credit, scout.id: (2, 2)}
    _, adv_member, _ = GRPOTrainer.advantages(member, [scout, *branches])
    assert adv_member[0] != 0.0 and adv_member[1] != adv[1]


def test_an_episode_marked_by_a_tool_server_incident_is_left_out_of_the_update(source):
    """An episode whose tool server was restarted during it (``env_incidents``) trains nothing
    and does not move its group's mean: its reward says nothing of the policy."""
    import copy
    from types import SimpleNamespace

    from acmrl.train.grpo import GRPOTrainer
    from acmrl.train.grpo_steps import reward_weights

    ep, _ = source
    marked = copy.deepcopy(ep)
    marked.traj.metrics["env_incidents"] = 1
    cfg = GRPOConfig()
    fake = SimpleNamespace(
        cfg=cfg, weights=reward_weights(cfg), credit={}, branch_ids=set(), scouts=set()
    )
    kept, adv, _, _ = GRPOTrainer.samples(fake, [ep, marked], [0.25, -0.25])
    alone, _, _, _ = GRPOTrainer.samples(fake, [ep], [0.25])
    assert kept and len(kept) == len(alone) and adv == [0.25] * len(kept)
    # in a group of three, the failed one (ids ...#0-#2 of one task) is out of the mean
    group = []
    for i, score in enumerate((1.0, 0.0, 1.0)):
        e = copy.deepcopy(marked if i == 2 else ep)
        e.id, e.traj.score = f"s0/0/t#acm#{i}", score
        group.append(e)
    rewards, adv, _ = GRPOTrainer.advantages(fake, group)
    assert adv[2] == 0.0
    assert adv[0] == pytest.approx(rewards[0] - (rewards[0] + rewards[1]) / 2) and adv[0] > 0


def test_a_decision_run_saved_before_the_source_option_does_not_resume_as_scouts():
    """A run saved before decisions.source existed kept its source as a member: resuming it
    under the new default (scout) would change its groups mid-run, so it is refused; a run
    without decision groups resumes as before."""
    from acmrl.train.runs import config_changes

    new = {"decisions": {"share": 0.5, "source": "scout"}}
    defaults = {"decisions": {"share": 0.0, "source": "scout"}}
    changed = config_changes({"decisions": {"share": 0.5}}, new, defaults)
    assert changed == ["decisions.source: 'member' (before the option existed) -> 'scout'"]
    member = {"decisions": {"share": 0.5, "source": "member"}}
    assert config_changes({"decisions": {"share": 0.5}}, member, defaults) == []
    plain = {"decisions": {"share": 0.0, "source": "scout"}}
    assert config_changes({"decisions": {"share": 0.0}}, plain, defaults) == []
