import pytest

from acmrl.context.prefix import cache_cost, compaction_cost, reusable_prefix
from acmrl.context.render import Renderer
from acmrl.context.state import assistant, function_call, function_call_output, user


@pytest.mark.parametrize(
    "before, after, prefix, cost",
    [
        ([1, 2, 3], [1, 9, 3], 1, 2),  # the Self-Evolving Agents write-up's numbers
        ([1, 2, 3], [1, 2], 2, 0),
        ([1], [1, 2], 1, 1),
        ([], [5, 6], 0, 2),
        ([4, 5], [], 0, 0),
        ([7, 8, 9], [7, 8, 9], 3, 0),
        ([1, 2, 3], [9, 2, 3], 0, 3),
    ],
)
def test_reference_numbers(before, after, prefix, cost):
    assert reusable_prefix(before, after) == prefix
    assert cache_cost(before, after) == cost


def test_long_sequences_find_the_exact_break():
    base = list(range(10_000))
    for cut in (0, 1, 4_999, 9_999):
        changed = base.copy()
        changed[cut] = -1
        assert reusable_prefix(base, changed) == cut
        assert cache_cost(base, changed) == 10_000 - cut


def test_compaction_cost():
    # 40 generated call tokens at output weight 4 (= 160) plus a cache cost of 300
    assert compaction_cost(40, 300, 4.0) == 460.0
    assert compaction_cost(0, 0, 1.0) == 0.0
    with pytest.raises(ValueError):
        compaction_cost(-1, 0, 1.0)
    with pytest.raises(ValueError):
        compaction_cost(1, 0, -1.0)


def test_edit_position_decides_the_cost_on_real_renders(tokenizer):
    r = Renderer(tokenizer, system_prompt="You are a research agent.")
    state = [user("Question: who founded the Harlow Trust?")]
    for i in range(6):
        state += [
            function_call(f"c{i}", "search", {"query": f"q{i}"}),
            function_call_output(f"c{i}", f"document {i}: " + "lorem ipsum dolor " * 40),
        ]
    state.append(assistant("Still looking."))
    before = r.ids(state)
    near_end = [dict(x) for x in state]
    near_end[-2] = function_call_output("c5", "document 5: shortened")
    near_start = [dict(x) for x in state]
    near_start[2] = function_call_output("c0", "document 0: shortened")
    end_ids, start_ids = r.ids(near_end), r.ids(near_start)
    # the system prompt and the untouched items are reused in both cases
    assert reusable_prefix(before, end_ids) > 0.9 * len(end_ids)
    assert reusable_prefix(before, start_ids) < 0.2 * len(start_ids)
    assert cache_cost(before, start_ids) > 5 * cache_cost(before, end_ids)
    # the system prompt is part of the measured input
    assert r.ids(state)[: len(r.encode("<|im_start|>system\nYou are"))] == r.encode(
        "<|im_start|>system\nYou are"
    )
