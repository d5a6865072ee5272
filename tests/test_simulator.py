"""The simulator (:mod:`libra_opt.simulator`) on hand-made graphs whose peak
memory and time are computed by hand in the comments, and every rejection.

Conventions of the simulator used in the arithmetic: an op's outputs are
allocated when it starts and its workspace only while it runs; the timeline
records, per instruction, the compute-stream time and the graph memory
(compute: at its start, workspace included; others: after the instruction).
Graph inputs are fixed memory and never counted.  Bandwidth is set to
100 B/s so that a copy of 100 B takes 1 s.
"""
from __future__ import annotations

import numpy as np
import pytest

from libra_opt.passes.bounds import memory_lower_bound, node_memory_lower_bounds
from libra_opt.errors import BudgetExceededError, ScheduleError
from libra_opt.ir.problem import BACKWARD, DeviceProfile, FixedMemory, ProblemBuilder
from libra_opt.ir.schedule import Compute, Free, Schedule, SwapIn, SwapOut, Wait, no_remat_schedule
from libra_opt.passes.simulator import no_remat_peak, resident_at, simulate

SLOW = DeviceProfile(name="test", h2d_bytes_per_s=100.0, d2h_bytes_per_s=100.0)


def chain():
    """x (input, 1000 B) -> a = f(x): 100 B, 1 s -> b = g(a): 200 B, 2 s -> c = h(b): 50 B, 3 s; output c.
    Tensor ids: x 0, a 1, b 2, c 3.  Fixed memory: 7 B of parameters."""
    bld = ProblemBuilder()
    x = bld.input("x", 1000)
    (a,) = bld.op("f", [x], [("a", 100)], time_s=1.0)
    (b,) = bld.op("g", [a], [("b", 200)], time_s=2.0)
    (c,) = bld.op("h", [b], [("c", 50)], time_s=3.0, phase=BACKWARD)
    return bld.build([c], fixed=FixedMemory(parameters_bytes=7), device=SLOW)


def test_chain_with_frees():
    p = chain()
    s = no_remat_schedule(p)
    assert s.instructions == [Compute(0), Compute(1), Free(1), Compute(2), Free(2)]
    r = simulate(p, s)
    # memory:  Compute(f) a=100 | Compute(g) a+b = 300 | Free(a) 200 | Compute(h) b+c = 250 | Free(b) 50
    # time:    f starts at 0, g at 1, Free(a) after g at 3, h starts at 3, Free(b) after h at 6
    assert list(r.timeline_bytes) == [100, 300, 200, 250, 50]
    assert list(r.timeline_t) == [0.0, 1.0, 3.0, 3.0, 6.0]
    assert r.peak_bytes == 300 and r.peak_index == 1
    assert r.total_peak_bytes == 300 + 7          # + the parameters (the input x is not graph memory)
    assert r.time_s == 6.0 and r.compute_s == 6.0  # 1 + 2 + 3
    assert r.recompute_s == 0 and r.stall_s == 0 and r.added_s == 0
    assert r.d2h_bytes == r.h2d_bytes == r.host_peak_bytes == 0
    assert no_remat_peak(p) == 300
    assert resident_at(p, s, 2) == {2}            # after Free(a): only b
    # graph inputs are not counted: inputs_bytes does not appear anywhere in the peak
    assert simulate(p.replace(fixed=FixedMemory())).peak_bytes == 300


def test_views_share_storage_and_freeing_the_base_keeps_it():
    # x -> a = f(x): 100 B, 1 s -> v = view(a) (0 B, 0.5 s) -> b = g(v): 10 B, 1 s; output b
    bld = ProblemBuilder()
    x = bld.input("x", 64)
    (a,) = bld.op("f", [x], [("a", 100)], time_s=1.0)
    (v,) = bld.op("view", [a], [("v", 0, a)], time_s=0.5)
    (b,) = bld.op("g", [v], [("b", 10)], time_s=1.0)
    p = bld.build([b])
    s = Schedule([Compute(0), Compute(1), Free(a), Compute(2), Free(v)])
    r = simulate(p, s)
    # Compute(f) 100 | Compute(view): same storage, still 100 | Free(a): v holds the storage, still 100
    # | Compute(g) 100 + 10 = 110 | Free(v): last tensor on the storage, released -> 10
    assert list(r.timeline_bytes) == [100, 100, 100, 110, 10]
    assert r.peak_bytes == 110 and r.time_s == 2.5  # 1 + 0.5 + 1
    assert resident_at(p, s, 2) == {v}
    # the no-remat plan frees a after its last use (the view) and v after g: same numbers
    assert simulate(p).peak_bytes == 110


def test_workspace_is_transient():
    # x -> a = f(x): 100 B with 1000 B of workspace -> b = g(a): 10 B; output b
    bld = ProblemBuilder()
    x = bld.input("x", 8)
    (a,) = bld.op("f", [x], [("a", 100)], time_s=1.0, workspace_bytes=1000)
    (b,) = bld.op("g", [a], [("b", 10)], time_s=1.0)
    p = bld.build([b])
    r = simulate(p)
    # Compute(f) 100 + 1000 workspace = 1100 | Compute(g) 100 + 10 = 110 (workspace gone) | Free(a) 10
    assert list(r.timeline_bytes) == [1100, 110, 10]
    assert r.peak_bytes == 1100 and r.peak_index == 0


def test_multi_output_node():
    # x -> (a 100 B, m 30 B) = f(x) -> c = g(a): 5 B ; d = h(m): 7 B; outputs c, d
    bld = ProblemBuilder()
    x = bld.input("x", 8)
    a, m = bld.op("f", [x], [("a", 100), ("m", 30)], time_s=1.0)
    (c,) = bld.op("g", [a], [("c", 5)], time_s=1.0)
    (d,) = bld.op("h", [m], [("d", 7)], time_s=1.0)
    p = bld.build([c, d])
    s = no_remat_schedule(p)
    assert s.instructions == [Compute(0), Compute(1), Free(a), Compute(2), Free(m)]
    r = simulate(p, s)
    # Compute(f) both outputs at once: 130 | Compute(g) 135 | Free(a) 35 | Compute(h) 42 | Free(m) 12
    assert list(r.timeline_bytes) == [130, 135, 35, 42, 12]
    assert r.peak_bytes == 135 and r.peak_index == 1


def fwd_bwd():
    """Forward a = f(x): 100 B, 1 s; b = g(a): 100 B, 1 s.  Backward gb = h(b): 100 B, 1 s;
    ga = k(gb, a): 10 B, 1 s.  Output ga.  Tensor ids: x 0, a 1, b 2, gb 3, ga 4."""
    bld = ProblemBuilder()
    x = bld.input("x", 8)
    (a,) = bld.op("f", [x], [("a", 100)], time_s=1.0)
    (b,) = bld.op("g", [a], [("b", 100)], time_s=1.0)
    (gb,) = bld.op("h", [b], [("gb", 100)], time_s=1.0, phase=BACKWARD)
    (ga,) = bld.op("k", [gb, a], [("ga", 10)], time_s=1.0, phase=BACKWARD)
    return bld.build([ga], device=SLOW)


def test_recompute_lowers_the_peak_and_costs_its_time():
    p = fwd_bwd()
    # no remat: f 100 | g 200 | h 300 | Free(b) 200 | k 210 | Free(a) 110 | Free(gb) 10  -> peak 300
    assert simulate(p).peak_bytes == 300
    s = Schedule([Compute(0), Compute(1), Free(1), Compute(2), Free(2), Compute(0), Compute(3), Free(1), Free(3)])
    r = simulate(p, s)
    # f 100 | g 200 | Free(a) 100 | h 200 | Free(b) 100 | f again 200 | k 210 | Free(a) 110 | Free(gb) 10
    assert list(r.timeline_bytes) == [100, 200, 100, 200, 100, 200, 210, 110, 10]
    assert r.peak_bytes == 210 and r.peak_index == 6
    # time: 4 nodes of 1 s + f recomputed (1 s)
    assert r.time_s == 5.0 and r.compute_s == 5.0 and r.recompute_s == 1.0 and r.added_s == 1.0
    assert s.recomputed_nodes() == [0]


def swap_problem(a_bytes=100, t3=3.0, overlap=True):
    """n0 a = f(x): a_bytes, 1 s (fwd); n1 b = g(a): 10 B, 3 s (fwd); n2 c = h(b): 10 B, 3 s (bwd);
    n3 e = m(c): 10 B, t3 s (bwd); n4 d = k(e, a): 10 B, 1 s (bwd).  Output d.
    Tensor ids: x 0, a 1, b 2, c 3, e 4, d 5."""
    bld = ProblemBuilder()
    x = bld.input("x", 8)
    (a,) = bld.op("f", [x], [("a", a_bytes)], time_s=1.0)
    (b,) = bld.op("g", [a], [("b", 10)], time_s=3.0)
    (c,) = bld.op("h", [b], [("c", 10)], time_s=3.0, phase=BACKWARD)
    (e,) = bld.op("m", [c], [("e", 10)], time_s=t3, phase=BACKWARD)
    (d,) = bld.op("k", [e, a], [("d", 10)], time_s=1.0, phase=BACKWARD)
    dev = DeviceProfile(name="test", h2d_bytes_per_s=100.0, d2h_bytes_per_s=100.0, copies_overlap_compute=overlap)
    return bld.build([d], device=dev)


A = 1
# Offload a after its forward use by g, bring it back for k.
SWAP_PLAN = Schedule([Compute(0), SwapOut(A), Compute(1), Free(A), Compute(2), Free(2), SwapIn(A), Compute(3),
                      Free(3), Wait(A), Compute(4), Free(A), Free(4)])


def test_swap_hidden_behind_compute_has_no_stall():
    p = swap_problem()
    r = simulate(p, SWAP_PLAN)
    # idx instr        t    memory (B)
    #  0  Compute(f)    0   a                                   = 100
    #  1  SwapOut(a)    1   copy 1 -> 2 (100 B at 100 B/s)        100
    #  2  Compute(g)    1   a + b                               = 110
    #  3  Free(a)       4   copy ended at 2 <= 4: released         10
    #  4  Compute(h)    4   b + c                               =  20
    #  5  Free(b)       7                                          10
    #  6  SwapIn(a)     7   allocated at issue; copy 7 -> 8       110
    #  7  Compute(m)    7   c + a + e                           = 120
    #  8  Free(c)      10                                         110
    #  9  Wait(a)      10   arrived at 8 <= 10: no stall          110
    # 10  Compute(k)   10   a + e + d                           = 120
    # 11  Free(a)      11                                          20
    # 12  Free(e)      11                                          10
    assert list(r.timeline_bytes) == [100, 100, 110, 10, 20, 10, 110, 120, 110, 110, 120, 20, 10]
    assert list(r.timeline_t) == [0, 1, 1, 4, 4, 7, 7, 7, 10, 10, 10, 11, 11]
    assert r.stall_s == 0.0
    # time = compute = 1 + 3 + 3 + 3 + 1 = 11: both copies hide behind compute
    assert r.time_s == 11.0 == r.compute_s and r.added_s == 0.0
    assert r.d2h_bytes == 100 and r.h2d_bytes == 100 and r.host_peak_bytes == 100
    assert r.peak_bytes == 120 and r.peak_index == 7
    # during h the no-remat plan holds a, b, c = 120 B; the swap plan 20 B
    assert simulate(p).timeline_bytes[2] == 120


def test_swapped_out_storage_is_released_only_when_its_copy_ends():
    # a = 500 B: each copy takes 5 s; m takes 6 s so that the swap-in still hides
    p = swap_problem(a_bytes=500, t3=6.0)
    r = simulate(p, SWAP_PLAN)
    # f 0->1 (500) | SwapOut 1->6 | g 1->4 (510) | Free(a) at 4: copy runs to 6, storage kept (510)
    # | h at 4: still kept, 500 + b + c = 520 | Free(b) at 7: the copy ended at 6, a released, then b: 10
    # | SwapIn at 7, arrives 12 (510) | m 7->13 (520) | Free(c) 510 | Wait: 12 <= 13 | k 13->14 (520) | 20 | 10
    assert list(r.timeline_bytes) == [500, 500, 510, 510, 520, 10, 510, 520, 510, 510, 520, 20, 10]
    assert 1 not in resident_at(p, SWAP_PLAN, 3)  # the tensor is gone, its storage is not yet
    assert r.stall_s == 0.0 and r.time_s == 14.0  # 1 + 3 + 3 + 6 + 1


def test_swap_in_while_the_swap_out_still_runs_takes_a_second_buffer():
    # same problem; a is swapped back in right after being freed, while its copy out (1 -> 6) still runs
    p = swap_problem(a_bytes=500, t3=6.0)
    plan = Schedule([Compute(0), SwapOut(A), Compute(1), Free(A), SwapIn(A), Compute(2), Free(2), Wait(A),
                     Compute(3), Free(3), Compute(4), Free(A), Free(4)])
    r = simulate(p, plan)
    # f 500 | SwapOut 500 | g 510 | Free(a) at 4: old buffer kept until 6 (510)
    # | SwapIn(a) at 4: a fresh 500 B buffer beside the old one: 1010; its copy waits for the host copy:
    #   6 -> 11 | h at 4: 1020 | Free(b) at 7: old buffer released (6 <= 7) and b: 510
    # | Wait(a) at 7: stall until 11 (4 s) | m 11 -> 17 (520) | Free(c) 510 | k 17 -> 18 (520) | 20 | 10
    assert list(r.timeline_bytes) == [500, 500, 510, 510, 1010, 1020, 510, 510, 520, 510, 520, 20, 10]
    assert r.stall_s == 4.0 and r.time_s == 18.0


def test_swap_that_stalls():
    # a = 250 B: each copy takes 2.5 s; m takes 1 s, so the swap-in overlaps only 1 s of compute
    p = swap_problem(a_bytes=250, t3=1.0)
    r = simulate(p, SWAP_PLAN)
    # f 0->1; SwapOut 1->3.5; g 1->4; Free(a) at 4 (copy done); h 4->7; SwapIn issued at 7, arrives 9.5;
    # m 7->8; Wait(a) at 8: stall = 9.5 - 8 = 1.5 = transfer 2.5 - overlapped compute 1; k 9.5->10.5
    assert r.stall_s == pytest.approx(1.5)
    assert r.compute_s == 9.0                          # 1 + 3 + 3 + 1 + 1
    assert r.time_s == pytest.approx(10.5) and r.added_s == pytest.approx(1.5)
    assert r.timeline_t[10] == pytest.approx(9.5)      # Compute(k) starts after the stall
    assert r.timeline_bytes[4] == 20                   # a released during h


def test_copies_that_do_not_overlap_compute_are_serialized():
    p = swap_problem(overlap=False)
    r = simulate(p, SWAP_PLAN)
    # f 0->1; SwapOut occupies 1->2; g 2->5; Free(a); h 5->8; Free(b);
    # SwapIn occupies 8->9; m 9->12; Free(c); Wait: arrived at 9; k 12->13
    assert list(r.timeline_t) == [0, 2, 2, 5, 5, 8, 9, 9, 12, 12, 12, 13, 13]
    assert r.time_s == 13.0                    # 11 s of compute + 2 x 1 s of copies
    assert r.compute_s == 11.0 and r.stall_s == 0.0 and r.added_s == 2.0
    # the same plan on a device whose copies overlap compute hides both copies
    assert simulate(swap_problem(overlap=True), SWAP_PLAN).time_s == 11.0


def test_budget_is_honoured_exactly():
    p = chain()
    assert simulate(p, budget=300).peak_bytes == 300
    with pytest.raises(BudgetExceededError) as e:
        simulate(p, budget=299)
    # Compute(g) is the first instruction over 299 B (100 + 200)
    assert e.value.index == 1 and e.value.instruction == "Compute(g)"
    assert "Compute(g)" in str(e.value) and "over the budget" in str(e.value)


# ------------------------------------------------------------------ rejections
def rejected(p, instrs, message, index, instruction):
    with pytest.raises(ScheduleError, match=message) as e:
        simulate(p, Schedule(instrs))
    assert e.value.index == index and e.value.instruction == instruction
    if index is not None:
        assert f"instruction {index} ({instruction})" in str(e.value)
    return e.value


def test_reject_use_before_compute():
    rejected(chain(), [Compute(1)], r"uses tensor 'a' before it is computed \(Compute\(f\) must come first\)",
             0, "Compute(g)")


def test_reject_use_after_free():
    rejected(chain(), [Compute(0), Free(1), Compute(1)], "uses tensor 'a' after it was freed", 2, "Compute(g)")


def test_reject_use_before_wait():
    plan = [Compute(0), SwapOut(A), Compute(1), Free(A), Compute(2), Free(2), SwapIn(A), Compute(3), Free(3),
            Compute(4)]
    rejected(swap_problem(), plan, r"uses tensor 'a' before Wait\(a\)", 9, "Compute(k)")


def test_reject_recompute_of_a_non_recomputable_node():
    bld = ProblemBuilder()
    x = bld.input("x", 8)
    (a,) = bld.op("dropout", [x], [("a", 100)], time_s=1.0, recomputable=False)
    (b,) = bld.op("g", [a], [("b", 10)], time_s=1.0)
    p = bld.build([b])
    rejected(p, [Compute(0), Free(a), Compute(0), Compute(1)], "'dropout' .* is not recomputable", 2,
             "Compute(dropout)")


def test_reject_free_of_an_output():
    rejected(chain(), [Compute(0), Compute(1), Compute(2), Free(3)], "frees 'c', an output of the step", 3,
             "Free(c)")


def test_reject_missing_output_at_the_end():
    err = rejected(chain(), [Compute(0), Compute(1)], "output 'c' .* is never computed", None, None)
    assert "instruction" not in str(err)


def test_reject_swap_of_a_view():
    bld = ProblemBuilder()
    (a,) = bld.op("f", [], [("a", 100)], time_s=1.0)
    (v,) = bld.op("view", [a], [("v", 0, a)])
    (b,) = bld.op("g", [v], [("b", 10)], time_s=1.0)
    p = bld.build([b], device=SLOW)
    rejected(p, [Compute(0), Compute(1), SwapOut(v)], "swaps out view 'v'.*swap its base 'a'", 2, "SwapOut(v)")
    rejected(p, [Compute(0), Compute(1), SwapOut(a), Free(a), Free(v), SwapIn(v)], "swaps in view 'v'", 5,
             "SwapIn(v)")


def test_reject_budget_exceeded_names_the_instruction():
    p = swap_problem()
    # the swap plan peaks at 120 B at instruction 7 (Compute(m)); a budget of 115 B fails there
    with pytest.raises(BudgetExceededError) as e:
        simulate(p, SWAP_PLAN, budget=115)
    assert e.value.index == 7 and e.value.instruction == "Compute(m)"
    # a budget of 105 B fails earlier, at the first instruction over it: Compute(g) = 110 B at index 2
    with pytest.raises(BudgetExceededError) as e:
        simulate(p, SWAP_PLAN, budget=105)
    assert e.value.index == 2 and e.value.instruction == "Compute(g)"
    assert simulate(p, SWAP_PLAN, budget=120).peak_bytes == 120


def test_reject_other_malformed_plans():
    p = swap_problem()
    rejected(p, [Compute(0), Wait(A)], "has no copy in flight", 1, "Wait(a)")
    rejected(p, [Compute(0), SwapIn(A)], "no host copy", 1, "SwapIn(a)")
    rejected(p, [Compute(0), SwapOut(A), SwapIn(A)], "still resident", 2, "SwapIn(a)")
    rejected(p, [Compute(0), Free(A), Free(A)], "not resident", 2, "Free(a)")
    rejected(p, [Compute(0), Free(0)], "graph input 'x'", 1, "Free(x)")
    with pytest.raises(ScheduleError, match="not a node id") as e:
        simulate(p, Schedule([Compute(17)]))
    assert e.value.index == 0


# ------------------------------------------------------------------ memory lower bound
def test_memory_lower_bound_by_hand():
    p = chain()
    # per node: f: a = 100; g: a + b = 300; h: b + c = 250; outputs together: c = 50  -> 300
    assert list(node_memory_lower_bounds(p)) == [100, 300, 250]
    assert memory_lower_bound(p) == 300 == simulate(p).peak_bytes


def test_memory_lower_bound_counts_workspace_and_earlier_outputs():
    # x -> a = f(x) 100 B -> loss = l(a) 5 B (an output) ; ga = k(loss, a) 40 B (an output) ;
    # y = m(ga) 20 B with 300 B workspace (an output)
    bld = ProblemBuilder()
    x = bld.input("x", 8)
    (a,) = bld.op("f", [x], [("a", 100)])
    (loss,) = bld.op("l", [a], [("loss", 5)])
    (ga,) = bld.op("k", [loss, a], [("ga", 40)], phase=BACKWARD)
    (y,) = bld.op("m", [ga], [("y", 20)], phase=BACKWARD, workspace_bytes=300)
    p = bld.build([loss, ga, y])
    # f: a = 100; l: a + loss = 105; k: loss + a + ga = 145;
    # m: ga + y + loss (produced by an ancestor, never freeable) + workspace 300 = 365
    assert list(node_memory_lower_bounds(p)) == [100, 105, 145, 365]
    assert memory_lower_bound(p) == 365
    # the no-remat plan: f 100 | l 105 | k 145 | Free(a) 45 | m 45 + 20 + 300 = 365
    assert simulate(p).peak_bytes == 365


def test_memory_lower_bound_is_below_every_plan():
    p = fwd_bwd()
    lb = memory_lower_bound(p)
    # k reads gb and a and makes ga: 100 + 100 + 10 = 210, the peak of the recompute plan above
    assert lb == 210
    plan = Schedule([Compute(0), Compute(1), Free(1), Compute(2), Free(2), Compute(0), Compute(3), Free(1),
                     Free(3)])
    assert lb <= simulate(p, plan).peak_bytes <= simulate(p).peak_bytes


def test_timeline_arrays_have_one_entry_per_instruction():
    p = swap_problem()
    r = simulate(p, SWAP_PLAN)
    assert r.timeline_t.shape == r.timeline_bytes.shape == (len(SWAP_PLAN),)
    assert np.all(np.diff(r.timeline_t) >= 0)


def test_a_schedule_copied_with_new_metadata_is_its_own_and_simulates_the_same():
    """``Schedule.of`` and ``Schedule.with_meta`` (no per-instruction conversion) give a schedule equal to
    the constructor's, with its own instruction list and metadata: changing the copy leaves the original."""
    p = chain()
    s = no_remat_schedule(p)
    c = s.with_meta({"k": 1})
    assert c == s == Schedule(list(s.instructions)) == Schedule.of(s.instructions)
    assert c.instructions is not s.instructions and c.meta == {"k": 1} and "k" not in s.meta
    c.instructions.pop()
    c.meta["k"] = 2
    assert len(s) == len(c) + 1 and "k" not in s.meta
    assert simulate(p, Schedule.of(s.instructions)).peak_bytes == simulate(p, s).peak_bytes
