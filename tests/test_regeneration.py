"""The regeneration rule shared by the lowering and the libra estimate (libra_opt.passes.regeneration)."""
from libra_opt.passes.regeneration import dropped_after_step, regeneration_steps

# a chain x -> n0 -> a -> n1 -> (b, c) -> n2 -> d ; node 3 reads b, c and d
PRODUCER = {0: None, 1: 0, 2: 1, 3: 1, 4: 2}     # tensor -> node
INPUTS = {0: (0,), 1: (1,), 2: (2, 3)}           # node -> tensors read


def _steps(missing, by_swap=lambda t: False, needed=(2, 3, 4)):
    miss = set(missing)
    return regeneration_steps(needed, [t for t in needed if t in miss], miss.__contains__, by_swap,
                              PRODUCER, INPUTS)


def test_post_order_recomputes_inputs_first_and_a_multi_output_node_once():
    steps, pending = _steps({1, 2, 3, 4})
    assert steps == [(False, 0), (False, 1), (False, 2)]   # node 1 makes b and c: run once
    # reads pending: a by node 1; b, c by node 2 and by the node itself; d by the node
    assert pending == {0: 1, 1: 1, 2: 2, 3: 2, 4: 1}


def test_a_swapped_in_tensor_stops_the_walk():
    steps, pending = _steps({1, 2, 3, 4}, by_swap=lambda t: t == 2)
    # b comes back by swap-in: its producer's input a is not needed for it, but c still needs node 1
    assert (True, 2) in steps and (False, 1) in steps and (False, 2) in steps
    assert steps.index((False, 0)) < steps.index((False, 1)) < steps.index((False, 2))


def test_resident_inputs_are_read_in_place():
    steps, _ = _steps({4})
    assert steps == [(False, 2)]


def test_drop_rule_frees_only_chain_tensors_with_no_pending_read_past_their_last_use():
    pending = {1: 0, 2: 1, 3: 0}
    last = {1: 5, 2: 9, 3: 9, 4: 9}
    storage = {1: 1, 2: 2, 3: 3, 4: 4}
    off = {3}
    got = dropped_after_step([1, 2, 3, 4], resident={1, 2, 3}, pending=pending, q=6, is_output={1: False, 2: False, 3: False, 4: True},
                             last_use=last, storage=storage, storage_off=lambda s, q: s in off)
    # 1: past its last use; 2: a read is pending; 3: its storage is meant to be off; 4: not made by the chain
    assert got == [1, 3]
    assert dropped_after_step([1], resident={1}, pending={}, q=6, is_output={1: True}, last_use=last, storage=storage,
                              storage_off=lambda s, q: True) == []


def test_a_tensor_read_twice_by_a_step_is_freed_once():
    got = dropped_after_step([1, 1], resident={1}, pending={}, q=6, is_output={1: False}, last_use={1: 5},
                             storage={1: 1}, storage_off=lambda s, q: False)
    assert got == [1]


def test_no_by_swap_is_every_missing_tensor_recomputed():
    # by_swap=None (nothing on the host, the lowering's and the estimate's common case) walks as a
    # by_swap that always says no, on every subset of missing tensors
    import itertools
    for k in range(1, 5):
        for missing in itertools.combinations((1, 2, 3, 4), k):
            assert _steps(missing, by_swap=None) == _steps(missing), missing
