"""Reward terms with hand-computed numbers."""

from __future__ import annotations

import doctest

import pytest

import acmrl.rewards as rewards
from acmrl.rewards import RewardWeights, combine, compaction_cost, compress_loops, trajectory_reward


def test_doctests():
    result = doctest.testmod(rewards)
    assert result.failed == 0 and result.attempted >= 8


def test_compaction_cost_counts_every_event_in_budget_units():
    events = [{"compaction_cost": 100.0}, {"compaction_cost": 60.0}, {"compaction_cost": 40.0}]
    assert compaction_cost(events, 400) == 0.5  # (100 + 60 + 40) / 400
    with pytest.raises(ValueError, match="budget must be > 0"):
        compaction_cost(events, 0)


def test_compress_loops_need_progress_in_between():
    mc = {"actions": [{"name": "manage_context"}], "events": [{"kind": "manage_context"}]}
    failed = {"actions": [{"name": "evolve"}], "events": [{"kind": "evolve", "applied": False}]}
    query = {"actions": [{"name": "query_memory"}], "events": [{"kind": "query_memory"}]}
    open_ = {"actions": [{"name": "open"}], "events": []}
    assert compress_loops([mc, query, mc]) == 1  # a query is not progress in the world
    assert compress_loops([mc, failed, mc]) == 1  # a refused evolve compacts nothing
    assert compress_loops([mc, open_, mc, open_, mc]) == 0
    harness = {"actions": [], "events": [{"kind": "summary"}]}
    assert compress_loops([harness, harness]) == 1


def test_trajectory_reward_from_a_rollout_record():
    traj = {
        "score": 1.0,
        "metrics": {"malformed_calls": 3},
        "steps": [
            {
                "actions": [{"name": "manage_context"}],
                "events": [{"kind": "manage_context", "compaction_cost": 1024.0}],
            },
            {
                "actions": [{"name": "manage_context"}],
                "events": [{"kind": "manage_context", "compaction_cost": 1024.0}],
            },
        ],
    }
    reward, terms = trajectory_reward(traj, budget=2048, weights=RewardWeights())
    assert terms == {
        "success": 1.0,
        "compaction_cost": 1.0,
        "malformed": 3.0,
        "compress_loops": 1.0,
        "failed_edits": 0.0,
        "resource_use": 0.0,  # the record has no token counts
    }
    # 1 - 0.1 * 1.0 - 0.01 * 3 - 0.05 * 1 = 0.82
    assert reward == pytest.approx(0.82)
    assert (
        combine(terms, RewardWeights(success=2.0, compaction_cost=0, malformed=0, compress_loops=0))
        == 2.0
    )
