"""Per-turn samples from hand-built trajectories: packing, prefix breaks, masks, origin, weight."""

from __future__ import annotations

from acmrl.rollout.records import ContextEvent, ModelCall, Step, Trajectory
from acmrl.train.samples import ENV, POLICY, TEACHER, trajectory_samples


def call(prompt, completion, role="policy", logprobs=None):
    return ModelCall(role, prompt, completion, logprobs or [-0.5] * len(completion), 0, "stop", 0.0)


def traj(steps, score=1.0):
    t = Trajectory("e", "t", "kb_search", "acm", 0, 0, "m", "q", "a", steps=steps)
    t.score = score
    return t


def test_calls_that_extend_each_other_pack_into_one_sample():
    s1 = Step(0, call([1, 2, 3], [4, 5]))
    s2 = Step(1, call([1, 2, 3, 4, 5, 6, 7], [8], logprobs=[-0.1]))  # prompt = previous + [6, 7]
    (sample,) = trajectory_samples(traj([s1, s2]))
    assert sample.token_ids == [1, 2, 3, 4, 5, 6, 7, 8]
    assert sample.origin == [ENV, ENV, ENV, POLICY, POLICY, ENV, ENV, POLICY]
    assert sample.loss_mask == [0, 0, 0, 1, 1, 0, 0, 1]
    assert sample.old_logprobs == [0, 0, 0, -0.5, -0.5, 0, 0, -0.1]
    assert sample.calls == 2 and sample.weight == 1.0


def test_a_compaction_breaks_the_prefix_and_starts_a_new_sample():
    s1 = Step(0, call([1, 2, 3], [4]))
    event = ContextEvent("manage_context", 4, 3, 1, 2, 1, 0, 3.0)
    s2 = Step(1, call([1, 9, 9], [5]), events=[event])  # the history was rewritten after token 1
    s3 = Step(2, call([1, 9, 9, 5, 6], [7]))
    first, second = trajectory_samples(traj([s1, s2, s3], score=0.0))
    assert first.token_ids == [1, 2, 3, 4] and second.token_ids == [1, 9, 9, 5, 6, 7]
    assert second.loss_mask == [0, 0, 0, 1, 0, 1]
    assert first.weight == second.weight == 0.0  # a failed run teaches nothing on its own


def test_teacher_tokens_are_targets_without_behaviour_logprobs():
    s1 = Step(0, call([1, 2], [3]))
    s2 = Step(1, call([1, 2, 3, 4], [5, 6], role="teacher", logprobs=[]), origin="teacher")
    helper = Step(2, None, helper_calls=[call([7], [8], role="summariser")], origin="harness")
    (sample,) = trajectory_samples(traj([s1, s2, helper], score=0.0))
    assert sample.origin == [ENV, ENV, POLICY, ENV, TEACHER, TEACHER]
    assert sample.loss_mask == [0, 0, 1, 0, 1, 1]
    assert sample.old_logprobs[-2:] == [0.0, 0.0]
    assert sample.weight == 1.0  # it holds the teacher's turn


def test_helper_calls_become_samples_on_request_and_pack_false_splits_turns():
    s1 = Step(0, call([1, 2], [3]))
    s2 = Step(1, call([1, 2, 3, 4], [5]), helper_calls=[call([7, 7], [8, 9], role="summariser")])
    assert len(trajectory_samples(traj([s1, s2]))) == 1  # helpers left out by default
    _, helper = trajectory_samples(traj([s1, s2]), helpers=True)
    assert helper.token_ids == [7, 7, 8, 9] and helper.loss_mask == [0, 0, 1, 1]
    assert helper.origin == [ENV, ENV, POLICY, POLICY] and helper.old_logprobs[-1] == -0.5
    one, two = trajectory_samples(traj([s1, s2]), pack=False)
    assert one.token_ids == [1, 2, 3] and two.token_ids == [1, 2, 3, 4, 5]
    assert two.loss_mask == [0, 0, 0, 0, 1]  # the earlier turn is context, not a target again
