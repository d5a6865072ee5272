"""Lowering of keep / recompute / swap decisions to schedules (libra_opt.passes.lowering).

Every expected peak, recompute time and copy volume below is derived by hand
in the comments from the simulator's rules: an op's outputs are allocated when
it starts, a tensor is freed after its last use (or after its eviction
position), a swapped-out storage is released when its copy has finished, a
swap-in allocates when issued.
"""
import pytest

from libra_opt.errors import ScheduleError
from libra_opt.passes.lowering import Eviction, Policy, all_windows, default_windows, evictions_for, lower, storage_uses
from libra_opt.ir.problem import BACKWARD, DeviceProfile, ProblemBuilder
from libra_opt.ir.schedule import Op, no_remat_schedule
from libra_opt.passes.simulator import simulate
from _chain_problems import input_of_a_recomputation

R, S = Policy.RECOMPUTE, Policy.SWAP


def run(problem, decisions, **kw):
    sched = lower(problem, evictions_for(problem, decisions), **kw)
    return sched, simulate(problem, sched)


# ---------------------------------------------------------------- a chain
def chain(d2h=10.0, h2d=10.0):
    """x -> a1(10) -> a2(20) -> a3(40) -> L(1); backward d2(20), d1(10), dw(5).

    Every node takes 1 s; copies move 10 bytes/s by default."""
    b = ProblemBuilder()
    x = b.input("x", 4)
    (a1,) = b.op("f1", [x], [("a1", 10)], time_s=1)
    (a2,) = b.op("f2", [a1], [("a2", 20)], time_s=1)
    (a3,) = b.op("f3", [a2], [("a3", 40)], time_s=1)
    (L,) = b.op("loss", [a3], [("L", 1)], time_s=1)
    (d2,) = b.op("b3", [L, a2], [("d2", 20)], time_s=1, phase=BACKWARD)
    (d1,) = b.op("b2", [d2, a1], [("d1", 10)], time_s=1, phase=BACKWARD)
    (dw,) = b.op("b1", [d1], [("dw", 5)], time_s=1, phase=BACKWARD)
    p = b.build(outputs=[L, dw], device=DeviceProfile(h2d_bytes_per_s=h2d, d2h_bytes_per_s=d2h))
    return p, dict(a1=a1, a2=a2, a3=a3, L=L, d2=d2, d1=d1, dw=dw)


def test_chain_windows():
    p, t = chain()
    # a1 is used at 0 (made), 1, 5; a2 at 1, 2, 4; a3 only in the forward (2, 3): no window.
    assert storage_uses(p)[t["a1"]] == [0, 1, 5]
    assert default_windows(p) == {t["a1"]: (1, 5), t["a2"]: (2, 4)}
    assert (t["a1"], 1, 5) in all_windows(p)
    # L and dw are step outputs: never evicted
    assert t["L"] not in storage_uses(p) and t["dw"] not in storage_uses(p)


def test_chain_no_decisions_is_no_remat():
    p, _ = chain()
    sched, sim = run(p, {})
    assert sched == no_remat_schedule(p)
    # C0 10, C1 30, C2 70, C3 71 (a1+a2+a3+L), free a3 -> 31, C4 51 ...
    assert sim.peak_bytes == 71
    assert sim.added_s == 0


def test_chain_recompute_one():
    p, t = chain()
    sched, sim = run(p, {t["a1"]: R})
    # a1 freed after C1: C2 = a2+a3 = 60, C3 = 61, free a3 -> 21, C4 41, free a2 -> 21,
    # recompute f1 -> 31, C5 41.
    assert sim.peak_bytes == 61
    assert sim.recompute_s == 1.0 and sim.added_s == 1.0
    assert sched.recomputed_nodes() == [0]
    assert sched.meta["evictions"] == [[t["a1"], 1, 5, "recompute"]]


def test_chain_recompute_chain():
    p, t = chain()
    sched, sim = run(p, {t["a1"]: R, t["a2"]: R})
    # C2: a2+a3 = 60 (a1 gone), then a2 freed; C3 41 -> 1.  Before b3: f1 (11), f2 (31),
    # free a1 (21), b3 41, free a2 (21).  Before b2: f1 again (31), b2 41.
    assert sim.peak_bytes == 60
    assert sim.recompute_s == 3.0  # f1 twice + f2
    assert sorted(i.arg for i in sched if i.op == Op.COMPUTE) == [0, 0, 0, 1, 1, 2, 3, 4, 5, 6]


def test_chain_swap_auto_prefetch_hides_copy():
    p, t = chain()
    sched, sim = run(p, {t["a1"]: S})
    # SwapOut after f1 (copy 1..2 s), Free after f2 at t=2: released at once.  Auto prefetch:
    # the copy (1 s) must end by b2's start (5 s) -> issued after node 3 (t=4, copy 4..5).
    ops = [(i.op, i.arg) for i in sched]
    assert ops.index((Op.SWAP_IN, t["a1"])) == ops.index((Op.COMPUTE, 3)) + 2  # after Compute(loss), Free(a3)
    assert sim.peak_bytes == 61
    assert sim.stall_s == 0 and sim.time_s == 7.0 and sim.added_s == 0
    assert sim.d2h_bytes == 10 and sim.h2d_bytes == 10 and sim.host_peak_bytes == 10
    assert sim.recompute_s == 0


def test_chain_swap_late_prefetch_stalls():
    p, t = chain()
    _, sim = run(p, {t["a1"]: S}, prefetch="late")
    # SwapIn right before b2 (t=5): copy 5..6, b2 waits 1 s.
    assert sim.stall_s == pytest.approx(1.0)
    assert sim.time_s == pytest.approx(8.0)
    assert sim.peak_bytes == 61


def test_chain_swap_slow_copy_delays_release():
    p, t = chain(d2h=5.0)
    _, sim = run(p, {t["a1"]: S})
    # copy out takes 2 s (1..3): a1 is still held while f3 runs (t=2): 10+20+40 = 70;
    # released at t=3, so the loss node sees 20+40+1 = 61.
    assert sim.peak_bytes == 70


def test_chain_explicit_prefetch_position():
    p, t = chain()
    sched = lower(p, [Eviction(t["a1"], 1, 5, S, prefetch_after=2)])
    sim = simulate(p, sched)
    # swap-in issued after f3 (mem a2+a3 = 60, +10 = 70), then the loss node: 71
    assert sim.peak_bytes == 71
    assert sim.stall_s == 0


# -------------------------------------------------------------- a diamond
def diamond():
    """a(10) feeds b(20) and c(30); d(40) = f(b, c); L(50); small gradients."""
    b = ProblemBuilder()
    x = b.input("x", 4)
    (a,) = b.op("fa", [x], [("a", 10)], time_s=1)
    (tb,) = b.op("fb", [a], [("b", 20)], time_s=2)
    (tc,) = b.op("fc", [a], [("c", 30)], time_s=3)
    (d,) = b.op("fd", [tb, tc], [("d", 40)], time_s=4)
    (L,) = b.op("loss", [d], [("L", 50)], time_s=1)
    (gb,) = b.op("gb", [L, tc], [("gb", 2)], time_s=1, phase=BACKWARD)
    (gc,) = b.op("gc", [L, tb], [("gc", 3)], time_s=1, phase=BACKWARD)
    (gw,) = b.op("gw", [gb, gc, a], [("gw", 1)], time_s=1, phase=BACKWARD)
    return b.build(outputs=[L, gw]), dict(a=a, b=tb, c=tc, d=d)


def test_diamond_windows():
    p, t = diamond()
    assert default_windows(p) == {t["a"]: (2, 7), t["b"]: (3, 6), t["c"]: (3, 5)}


@pytest.mark.parametrize("evict, peak, recompute", [
    # no remat: C4 = a+b+c+d+L = 150
    ((), 150, 0.0),
    # b off after fd: C4 = 10+30+40+50 = 130; fb replayed before gc (2 s)
    (("b",), 130, 2.0),
    # b, c off: C3 = 100 before they go, C4 = 10+40+50 = 100; fc (3 s) before gb, fb (2 s) before gc
    (("b", "c"), 100, 5.0),
    # a, b, c off: a goes after fc (C2 60 -> 50), C3 = 90, C4 = 90; chains: fa+fc (90 at fc), fa+fb, fa
    (("a", "b", "c"), 90, 8.0),
])
def test_diamond_recompute(evict, peak, recompute):
    p, t = diamond()
    sched, sim = run(p, {t[k]: R for k in evict})
    assert sim.peak_bytes == peak
    assert sim.recompute_s == pytest.approx(recompute)
    assert sim.added_s == pytest.approx(recompute)


def test_diamond_swap_everything():
    p, t = diamond()
    sched, sim = run(p, {t[k]: S for k in "abc"})
    # copies at 55 GB/s take nanoseconds.  a leaves after fc (C2 60 -> 50), b and c after fd
    # (C3 90 -> 40), C4 = 90 -> 50 without d.  c's window (3, 5) allows its prefetch only after the
    # loss node, and b's latest stall-free issue point is there too: 50 + 20 + 30 = 100, and gb
    # (2 bytes) runs with both resident: 102.
    assert sim.peak_bytes == 102
    assert sim.recompute_s == 0
    assert sim.d2h_bytes == 60 and sim.h2d_bytes == 60
    assert sim.stall_s < 1e-6 and sim.added_s < 1e-6
    assert sorted(sched.swapped_tensors()) == sorted(t[k] for k in "abc")


def test_prefetches_at_one_position_are_issued_in_order_of_use():
    p, t = diamond()
    p = p.with_device(h2d_bytes_per_s=50.0, d2h_bytes_per_s=1e9)
    sched, sim = run(p, {t["b"]: S, t["c"]: S})
    # both swap-ins can only be issued after the loss node (t = 11 s); c (30 B, 0.6 s) is needed by
    # gb at 11 s, b (20 B, 0.4 s) by gc at 12 s.  c first: gb waits 0.6 s, b arrives at 12 s: 0.6 s
    # of stalls.  b first: c arrives at 12 s, 1 s of stalls.
    ops = [(i.op, i.arg) for i in sched]
    assert ops.index((Op.SWAP_IN, t["c"])) < ops.index((Op.SWAP_IN, t["b"]))
    assert sim.stall_s == pytest.approx(0.6)


# ------------------------------------------------ a view of a saved activation
def view_graph():
    """a2 (20) is saved for backward only through its view a2v (0 bytes)."""
    b = ProblemBuilder()
    x = b.input("x", 4)
    (a1,) = b.op("f1", [x], [("a1", 10)], time_s=1)
    (a2,) = b.op("f2", [a1], [("a2", 20)], time_s=2)
    (a2v,) = b.op("view", [a2], [("a2v", 0, a2)], time_s=0.5)
    (a3,) = b.op("f3", [a2], [("a3", 40)], time_s=1)
    (L,) = b.op("loss", [a3], [("L", 50)], time_s=1)
    (d2,) = b.op("b3", [L, a2v], [("d2", 2)], time_s=1, phase=BACKWARD)
    (d1,) = b.op("b2", [d2, a1], [("d1", 1)], time_s=1, phase=BACKWARD)
    (dw,) = b.op("b1", [d1], [("dw", 1)], time_s=1, phase=BACKWARD)
    return b.build(outputs=[L, dw]), dict(a1=a1, a2=a2, a2v=a2v, a3=a3)


def test_view_storage_windows():
    p, t = view_graph()
    uses = storage_uses(p)
    # the storage of a2 is used by f2 (1), view (2), f3 (3) and, through a2v, by b3 (5)
    assert uses[t["a2"]] == [1, 2, 3, 5]
    assert t["a2v"] not in uses  # views have no storage of their own
    assert default_windows(p)[t["a2"]] == (3, 5)


def test_view_recompute():
    p, t = view_graph()
    base_peak = simulate(p).peak_bytes
    # no remat: C4 = a1 + a2 (held by a2v) + a3 + L = 120
    assert base_peak == 120
    sched, sim = run(p, {t["a2"]: R})
    # the storage goes after f3 (a2v freed too): C4 = 10+40+50 = 100; before b3 f2 and the view op
    # are replayed (a1 is still resident): 10+50+20 = 80.
    assert sim.peak_bytes == 100
    assert sim.recompute_s == pytest.approx(2.5)
    assert sched.recomputed_nodes() == [1, 2]


def test_view_swap_swaps_base():
    p, t = view_graph()
    sched, sim = run(p, {t["a2"]: S})
    assert sched.swapped_tensors() == [t["a2"]]  # the base, never the view
    assert sim.d2h_bytes == 20
    assert sim.peak_bytes == 100
    # the view is regenerated by replaying the view op on the swapped-in base
    assert sched.recomputed_nodes() == [2]
    assert sim.recompute_s == pytest.approx(0.5)


# ---------------------------------------------------- a multi-output node
def multi_output():
    """pool makes m (30) and idx (8); both are saved for backward."""
    b = ProblemBuilder()
    x = b.input("x", 4)
    (a,) = b.op("f1", [x], [("a", 10)], time_s=1)
    m, idx = b.op("pool", [a], [("m", 30), ("idx", 8)], time_s=2)
    (h,) = b.op("f3", [m], [("h", 40)], time_s=1)
    (L,) = b.op("loss", [h], [("L", 50)], time_s=1)
    (gm,) = b.op("g1", [L, m], [("gm", 5)], time_s=1, phase=BACKWARD)
    (gw,) = b.op("g2", [gm, idx, a], [("gw", 1)], time_s=1, phase=BACKWARD)
    return b.build(outputs=[L, gw]), dict(a=a, m=m, idx=idx)


def test_multi_output_recompute_one_output():
    p, t = multi_output()
    assert simulate(p).peak_bytes == 138  # C3: a + m + idx + h + L
    sched, sim = run(p, {t["m"]: R})
    # m goes after f3: C3 = 10+8+40+50 = 108, free h -> 68.  Replaying pool before g1 makes m again
    # (98) while idx is resident: its second copy is transient, 98 + 8 = 106.
    assert sim.peak_bytes == 108
    assert sim.recompute_s == 2.0
    assert sched.recomputed_nodes() == [1]


def test_multi_output_both_outputs():
    p, t = multi_output()
    _, sim = run(p, {t["m"]: R, t["idx"]: R, t["a"]: R})
    # a and idx go after pool (C1 48 -> 30), m after f3 (C2 70 -> 40), C3 90 -> 50.
    # Before g1: f1 (60), pool makes m and idx (98), a and idx dropped (80), g1 85, m freed (55).
    # Before g2 (needs idx and a): f1 (65), pool makes idx and m again (103).
    assert sim.peak_bytes == 103
    assert sim.recompute_s == pytest.approx(6.0)  # (f1 + pool) twice


# ------------------------------------------------- a non-recomputable node
def dropout_graph():
    b = ProblemBuilder()
    x = b.input("x", 4)
    (a,) = b.op("f1", [x], [("a", 10)], time_s=1)
    (y,) = b.op("dropout", [a], [("y", 10)], time_s=1, recomputable=False)
    (h,) = b.op("f3", [y], [("h", 20)], time_s=1)
    (L,) = b.op("loss", [h], [("L", 30)], time_s=1)
    (gy,) = b.op("g1", [L, y], [("gy", 2)], time_s=1, phase=BACKWARD)
    (gw,) = b.op("g2", [gy, a], [("gw", 1)], time_s=1, phase=BACKWARD)
    return b.build(outputs=[L, gw]), dict(a=a, y=y, h=h)


def test_non_recomputable_cannot_be_recomputed():
    p, t = dropout_graph()
    with pytest.raises(ScheduleError, match="not recomputable"):
        lower(p, evictions_for(p, {t["y"]: R}))


def test_non_recomputable_can_be_swapped():
    p, t = dropout_graph()
    sched, sim = run(p, {t["y"]: S})
    assert 1 not in sched.recomputed_nodes()
    assert sim.d2h_bytes == 10 and sim.recompute_s == 0
    # no remat: C3 = a+y+h+L = 70; y off after f3: C3 = 10+20+30 = 60
    assert simulate(p).peak_bytes == 70
    assert sim.peak_bytes == 60


def test_recomputable_input_of_dropout_is_fine():
    p, t = dropout_graph()
    _, sim = run(p, {t["a"]: R})
    # a leaves after dropout (C1 20 -> 10); C3 = 10+20+30 = 60; f1 replayed before g2 (1 s)
    assert sim.peak_bytes == 60
    assert sim.recompute_s == 1.0


# ------------------------------------------------------------------ errors
def test_overlapping_windows():
    p, t = chain()
    # a1 is used at 0, 1, 5: (1, 3) and (2, 5) contain no use but overlap
    with pytest.raises(ScheduleError, match="overlap"):
        lower(p, [Eviction(t["a1"], 1, 3, R), Eviction(t["a1"], 2, 5, R)])


def test_window_containing_a_use():
    p, t = chain()
    # a2 is used at 1, 2, 4: the window (1, 4) contains the use at 2
    with pytest.raises(ScheduleError, match="contains a use at position 2"):
        lower(p, [Eviction(t["a2"], 1, 4, R)])


def test_evicting_an_output():
    p, t = chain()
    with pytest.raises(ScheduleError, match="step output"):
        lower(p, [Eviction(t["L"], 3, 5, R)])


def test_evicting_before_production_or_backwards():
    p, t = chain()
    with pytest.raises(ScheduleError, match="before it is produced"):
        lower(p, [Eviction(t["a2"], 0, 1, R)])
    with pytest.raises(ScheduleError, match="after < before"):
        lower(p, [Eviction(t["a1"], 5, 1, R)])


def test_keep_entries_are_ignored():
    p, t = chain()
    assert lower(p, [Eviction(t["a1"], 1, 5, Policy.KEEP)]) == no_remat_schedule(p)


def test_adjacent_windows_regenerate_on_demand():
    p, t = chain()
    # a1 has no use at 3: two adjacent windows (1, 3), (3, 5) regenerate it only at its next use (5),
    # exactly as the single window (1, 5) does
    split = lower(p, [Eviction(t["a1"], 1, 3, R), Eviction(t["a1"], 3, 5, R)])
    assert split == lower(p, [Eviction(t["a1"], 1, 5, R)])
    assert simulate(p, split).recompute_s == 1.0



# ------------------------------------------------------------ retention
def single_phase():
    """x -> a(10) -> b(20) -> c(30) -> d(4), and e = fe(a, d) (4): a is read at 1 and 4.

    Every node takes 1 s.  Without decisions: C0 a = 10, C1 a+b = 30, C2 a+b+c = 60 (free b ->
    40), C3 a+c+d = 44 (free c -> 14), C4 a+d+e = 18: peak 60."""
    b = ProblemBuilder()
    x = b.input("x", 4)
    (a,) = b.op("fa", [x], [("a", 10)], time_s=1)
    (bb,) = b.op("fb", [a], [("b", 20)], time_s=1)
    (c,) = b.op("fc", [bb], [("c", 30)], time_s=1)
    (d,) = b.op("fd", [c], [("d", 4)], time_s=1)
    (e,) = b.op("fe", [a, d], [("e", 4)], time_s=1)
    return b.build(outputs=[e]), dict(a=a, b=bb, c=c, d=d, e=e)


def test_retain_keeps_a_tensor_past_its_last_use():
    from libra_opt.passes.lowering import Retain

    p, t = single_phase()
    # c's last use is node 3; retained through 4 for the chains before node 4, which does not
    # read it: freed once they have run (none here), before node 4: C4 = a+d+e = 18
    sched = lower(p, [Retain(t["c"], 4)])
    sim = simulate(p, sched)
    computes = [k for k, i in enumerate(sched) if i.op == Op.COMPUTE]
    assert sim.peak_bytes == 60 and sim.added_s == 0
    assert sim.timeline_bytes[computes[4]] == 18
    assert sched.meta["retained"] == [[t["c"], 4]]
    frees = [k for k, i in enumerate(sched) if i.op == Op.FREE and i.arg == t["c"]]
    assert len(frees) == 1 and computes[3] < frees[0] < computes[4]
    assert "retained" not in lower(p, []).meta


def test_retain_keeps_an_input_for_a_later_recomputation():
    """The single-phase case Checkmate's S covers: fo needs m again, m is evicted, and
    regenerating m needs a, which was freed after its last use (fm)."""
    from libra_opt.passes.lowering import Retain

    b = ProblemBuilder()
    x = b.input("x", 4)
    (a,) = b.op("fa", [x], [("a", 10)], time_s=1)
    (m,) = b.op("fm", [a], [("m", 20)], time_s=1)
    (y,) = b.op("fy", [m], [("y", 30)], time_s=1)
    (z,) = b.op("fz", [y], [("z", 4)], time_s=1)
    (o,) = b.op("fo", [m, z], [("o", 4)], time_s=1)
    p = b.build(outputs=[o])
    # m evicted over (2, 4): C0 10, C1 a+m = 30 (free a -> 20), C2 m+y = 50 (free m -> 30),
    # C3 y+z = 34 (free y -> 4); before fo the chain recomputes fa (14) and fm (34), frees a (24);
    # C4 m+z+o = 28.  Peak 50, 2 s recomputed.
    plain = lower(p, [Eviction(m, 2, 4, R)])
    sim = simulate(p, plain)
    assert plain.recomputed_nodes() == [0, 1] and sim.recompute_s == 2.0 and sim.peak_bytes == 50
    # a retained through 4: C1 30, C2 a+m+y = 60 (free m -> 40), C3 a+y+z = 44 (free y -> 14);
    # the chain is fm alone (34); C4 a+m+z+o = 38.  Peak 60, 1 s recomputed: a's 10 bytes buy 1 s.
    kept = lower(p, [Eviction(m, 2, 4, R), Retain(a, 4)])
    sim = simulate(p, kept)
    assert kept.recomputed_nodes() == [1] and sim.recompute_s == 1.0 and sim.peak_bytes == 60


def test_a_tensor_retained_for_a_chain_is_freed_after_its_last_read_in_it():
    """A retention that ends at a chain, whose node does not read the tensor, frees it right after
    the chain's step that reads it last, not after the chain: the rest of the chain runs without
    it (the hybrid MILP's plans do this)."""
    from libra_opt.passes.lowering import Retain

    b = ProblemBuilder()
    x = b.input("x", 4)
    (a,) = b.op("fa", [x], [("a", 10)], time_s=1)
    (bb,) = b.op("fb", [a], [("b", 10)], time_s=1)
    (m,) = b.op("fm", [bb], [("m", 40)], time_s=1)
    (y,) = b.op("fy", [m], [("y", 4)], time_s=1)
    (z,) = b.op("fz", [y], [("z", 4)], time_s=1)
    (o,) = b.op("fo", [m, z], [("o", 4)], time_s=1)
    p = b.build(outputs=[o])
    # m evicted over (3, 5), a retained through 5: the chain before fo recomputes fb (reads a) and
    # fm (reads b).  C2 a+b+m = 60; in the chain z+a+b = 24, then a is freed: z+b+m = 54 at fm
    # (64 with a held through the chain); C5 m+z+o = 48.  Peak 60.
    sched = lower(p, [Eviction(m, 3, 5, R), Retain(a, 5)])
    ops = [(i.op, i.arg) for i in sched.instructions]
    chain_fb = [k for k, x in enumerate(ops) if x == (Op.COMPUTE, 1)][1]
    chain_fm = [k for k, x in enumerate(ops) if x == (Op.COMPUTE, 2)][1]
    assert (Op.FREE, a) in ops[chain_fb + 1:chain_fm]
    sim = simulate(p, sched)
    assert sched.recomputed_nodes() == [1, 2] and sim.peak_bytes == 60


def test_bad_retentions_say_what_to_change():
    from libra_opt.passes.lowering import Retain

    p, t = single_phase()
    with pytest.raises(ScheduleError, match="last use"):
        lower(p, [Retain(t["b"], 2)])          # b's last use is 2
    with pytest.raises(ScheduleError, match="only activations"):
        lower(p, [Retain(t["e"], 4)])          # a step output is never freed
    # a view keeps its storage's window open: a (10) is read at 2, its view av at 5
    b = ProblemBuilder()
    x = b.input("x", 4)
    (a,) = b.op("fa", [x], [("a", 10)], time_s=1)
    (av,) = b.op("view", [a], [("av", 0, a)], time_s=0.5)
    (u,) = b.op("fu", [a], [("u", 20)], time_s=1)
    (v,) = b.op("fv", [u], [("v", 20)], time_s=1)
    (w,) = b.op("fw", [v], [("w", 4)], time_s=1)
    (o,) = b.op("fo", [av, w], [("o", 4)], time_s=1)
    q = b.build(outputs=[o])
    with pytest.raises(ScheduleError, match="either evicted or retained"):
        lower(q, [Eviction(a, 2, 5, R), Retain(a, 4)])


def test_swapped_retention_brings_an_input_back_for_its_chain():
    """Retain(swap=True): a is copied out once made, freed after its last use (fm) and swapped back
    in for the chain before fo, which replays fm alone; a is freed after it.  Same recompute as a
    resident retention (1 s), without its 10 bytes over fy and fz."""
    from libra_opt.passes.lowering import Retain

    p, a, m = input_of_a_recomputation()
    resident = simulate(p, lower(p, [Eviction(m, 2, 4, R), Retain(a, 4)]))
    sched = lower(p, [Eviction(m, 2, 4, R), Retain(a, 4, swap=True)])
    sim = simulate(p, sched)
    assert sched.recomputed_nodes() == [1] and sim.recompute_s == 1.0
    assert sim.peak_bytes == 50 < resident.peak_bytes == 60   # C2 m+y, as with no retention at all
    ops = [(i.op, i.arg) for i in sched]
    computes = [k for k, (op, arg) in enumerate(ops) if op == Op.COMPUTE]
    assert ops[computes[0] + 1] == (Op.SWAP_OUT, a)                    # copied out right after fa
    frees = [k for k, (op, arg) in enumerate(ops) if op == Op.FREE and arg == a]
    assert len(frees) == 2 and computes[1] < frees[0] < computes[2]   # freed after fm, its last use
    swap_in = ops.index((Op.SWAP_IN, a))
    wait = ops.index((Op.WAIT, a))
    recompute = computes[4]                                            # fm again, for fo
    assert ops[recompute] == (Op.COMPUTE, 1) and frees[0] < swap_in < wait < recompute < frees[1] < computes[5]
    assert sched.meta["swap_retained"] == [[a, 4]] and "retained" not in sched.meta
    # issued after a later position: the copy stalls, the schedule is otherwise the same
    late = lower(p, [Eviction(m, 2, 4, R), Retain(a, 4, swap=True, prefetch_after=3)])
    assert [(i.op, i.arg) for i in late].index((Op.SWAP_IN, a)) > computes[3]


def test_bad_swapped_retentions_say_what_to_change():
    from libra_opt.passes.lowering import Retain

    p, a, m = input_of_a_recomputation()
    with pytest.raises(ScheduleError, match="once swapped and once resident"):
        lower(p, [Retain(a, 4), Retain(a, 3, swap=True)])
    with pytest.raises(ScheduleError, match="swapped back twice"):
        lower(p, [Retain(a, 3, swap=True), Retain(a, 4, swap=True)])
    with pytest.raises(ScheduleError, match="prefetch_after=2 needs swap=True"):
        lower(p, [Retain(a, 4, prefetch_after=2)])
    with pytest.raises(ScheduleError, match="prefetch_after=4 needs"):
        lower(p, [Retain(a, 4, swap=True, prefetch_after=4)])
    # a view is never swapped, and a storage read again later cannot be swapped after one tensor's last use
    b = ProblemBuilder()
    x = b.input("x", 4)
    (c,) = b.op("fc", [x], [("c", 10)], time_s=1)
    (cv,) = b.op("view", [c], [("cv", 0, c)], time_s=0.5)
    (u,) = b.op("fu", [c], [("u", 20)], time_s=1)
    (v,) = b.op("fv", [u], [("v", 20)], time_s=1)
    (w,) = b.op("fw", [cv, v], [("w", 4)], time_s=1)
    (o,) = b.op("fo", [w], [("o", 4)], time_s=1)
    q = b.build(outputs=[o])
    with pytest.raises(ScheduleError, match="it is a view"):
        lower(q, [Retain(cv, 5, swap=True)])
    with pytest.raises(ScheduleError, match="used again at position 4"):
        lower(q, [Retain(c, 4, swap=True)])


# ------------------------------------------------------------ early regeneration
def test_early_regeneration_runs_the_chain_before_a_node_that_does_not_read_it():
    p, t = single_phase()
    # on demand: a evicted over (1, 4) is recomputed right before fe (node 4)
    late = lower(p, [Eviction(t["a"], 1, 4, R)])
    # early: recomputed before node 3 and kept: C0 10, C1 a+b = 30 (a freed -> 20), C2 b+c = 50
    # (free b -> 30), fa -> 40, C3 a+c+d = 44 (free c -> 14), C4 a+d+e = 18.  Peak 50, 1 s.
    early = lower(p, [Eviction(t["a"], 1, 3, R, regenerate=(t["a"],))])
    for sched in (late, early):
        assert sched.recomputed_nodes() == [0] and simulate(p, sched).recompute_s == 1.0
    ops = [(i.op, i.arg) for i in early]
    k3 = ops.index((Op.COMPUTE, 3))
    assert ops[k3 - 1] == (Op.COMPUTE, 0)                  # the chain runs before node 3
    sim = simulate(p, early)
    assert sim.peak_bytes == 50 and sim.timeline_bytes[k3] == 44
    assert early.meta["early"] == [[t["a"], 3, [t["a"]]]] and "early" not in late.meta
    ops_late = [(i.op, i.arg) for i in late]
    assert ops_late[ops_late.index((Op.COMPUTE, 4)) - 1] == (Op.COMPUTE, 0)


def test_bad_early_regeneration_says_what_to_change():
    p, t = single_phase()
    with pytest.raises(ScheduleError, match="needs policy recompute"):
        lower(p, [Eviction(t["a"], 1, 3, S, regenerate=(t["a"],))])
    with pytest.raises(ScheduleError, match="not on that storage"):
        lower(p, [Eviction(t["a"], 1, 3, R, regenerate=(t["b"],))])


# ------------------------------------------- mixed decisions on one op, views of a swapped base
def test_multi_output_op_recomputed_while_another_output_swaps_in():
    """bn makes ``out`` (recomputed through ``h``'s chain) and ``stat`` (swapped).
    ``stat``'s swap-in is issued after position 3 and waited for at its use (6);
    ``h``'s recomputation at 5 re-runs bn while that copy is in flight.  The
    copy must land first (Wait), then bn runs with ``stat`` already resident:
    its second write is transient, so the plan is valid and bn runs twice."""
    b = ProblemBuilder()
    x = b.input("x", 4)
    (a,) = b.op("f", [x], [("a", 100)], time_s=1)
    out, stat = b.op("bn", [a], [("out", 100), ("stat", 10)], time_s=1)
    (h,) = b.op("g", [out], [("h", 100)], time_s=1)
    (L,) = b.op("loss", [h], [("L", 1)], time_s=1)
    (g0,) = b.op("b0", [L], [("g0", 1)], time_s=1, phase=BACKWARD)
    (g1,) = b.op("b1", [g0, h], [("g1", 1)], time_s=1, phase=BACKWARD)
    (g2,) = b.op("b2", [g1, stat], [("g2", 1)], time_s=1, phase=BACKWARD)
    p = b.build(outputs=[L, g2], device=DeviceProfile(h2d_bytes_per_s=1.0, d2h_bytes_per_s=1e9))
    assert default_windows(p)[stat] == (1, 6) and default_windows(p)[h] == (3, 5)
    sched = lower(p, [Eviction(stat, 1, 6, S, prefetch_after=3), Eviction(h, 3, 5, R)])
    text = sched.to_text(p).split("\n")
    names = [line.split()[1] for line in text]
    k = names.index("Compute(bn)", names.index("Compute(bn)") + 1)   # the recomputation
    assert names[k - 1] == "Wait(stat)"
    res = simulate(p, sched)
    assert res.recompute_s == 3.0          # f (for a, freed after bn), bn, g
    assert res.h2d_bytes == 10
    # stat's 10 bytes take 10 s to come back, issued after position 3 (t = 4): the Wait ends at
    # t = 14 while the compute stream reached t = 5 (+ f's recompute, t = 6): 8 s of stall
    assert res.stall_s == pytest.approx(8.0)


def views_of_one_base():
    """a (100 bytes) with two views v1 = view(a), v2 = slice(a); the backward
    reads v1 at 5 and 7 and v2 at 6, so after a's window (3, 5) the views come
    back one at a time, both from a."""
    b = ProblemBuilder()
    x = b.input("x", 4)
    (a,) = b.op("f", [x], [("a", 100)], time_s=1)
    (v1,) = b.op("view", [a], [("v1", 0, a)], time_s=0)
    (v2,) = b.op("slice", [a], [("v2", 0, a)], time_s=0)
    (L,) = b.op("loss", [v2], [("L", 1)], time_s=1)
    (g0,) = b.op("b0", [L], [("g0", 1)], time_s=1, phase=BACKWARD)
    (g1,) = b.op("b1", [g0, v1], [("g1", 1)], time_s=1, phase=BACKWARD)
    (g2,) = b.op("b2", [g1, v2], [("g2", 1)], time_s=1, phase=BACKWARD)
    (g3,) = b.op("b3", [g2, v1], [("g3", 1)], time_s=1, phase=BACKWARD)
    p = b.build(outputs=[L, g3], device=DeviceProfile(h2d_bytes_per_s=1e9, d2h_bytes_per_s=1e9))
    return p, dict(a=a, v1=v1, v2=v2)


@pytest.mark.parametrize("policy", [S, R])
def test_second_view_of_a_regenerated_base_comes_from_the_base(policy):
    """After the window the base comes back once (swap-in or recompute) for
    v1 at 5; it stays while v1 holds its storage (no memory: the storage is
    held anyway), so v2 at 6 is remade from it instead of a second swap-in
    into a storage that is still on the device."""
    p, t = views_of_one_base()
    assert default_windows(p)[t["a"]] == (3, 5)
    sched, res = run(p, {t["a"]: policy})
    c = sched.counts()
    assert c["swap_in"] == (1 if policy == S else 0)
    assert res.peak_bytes == 103   # while b1 runs: a (100), L, g0 and g1 (1 each)
    if policy == S:
        # a is freed once, with the last view on its storage (after b3 reads v1)
        frees = [k for k, ins in enumerate(sched) if ins.op == Op.FREE and ins.arg == t["a"]]
        assert len(frees) == 2 and frees[-1] > [k for k, ins in enumerate(sched) if ins.op == Op.FREE
                                                 and ins.arg == t["v2"]][-1]


def test_swapped_base_read_by_a_later_chain_while_a_view_holds_its_storage():
    """a (swapped over (3, 5)) comes back for s0 at 5 through split, which
    also remakes s1 (read at 7).  At 6, o's recomputation reads a again while
    s1 still holds a's storage: a must still be there (a second swap-in into a
    storage on the device is impossible), so it is kept until s1 goes."""
    b = ProblemBuilder()
    x = b.input("x", 4)
    (a,) = b.op("f", [x], [("a", 100)], time_s=1)
    s0, s1 = b.op("split", [a], [("s0", 0, a), ("s1", 0, a)], time_s=0)
    (o,) = b.op("g", [a], [("o", 50)], time_s=1)
    (L,) = b.op("loss", [o, s1], [("L", 1)], time_s=1)
    (g0,) = b.op("b0", [L], [("g0", 1)], time_s=1, phase=BACKWARD)
    (g1,) = b.op("b1", [g0, s0], [("g1", 1)], time_s=1, phase=BACKWARD)
    (g2,) = b.op("b2", [g1, o], [("g2", 1)], time_s=1, phase=BACKWARD)
    (g3,) = b.op("b3", [g2, s1], [("g3", 1)], time_s=1, phase=BACKWARD)
    p = b.build(outputs=[L, g3], device=DeviceProfile(h2d_bytes_per_s=1e9, d2h_bytes_per_s=1e9))
    assert default_windows(p)[a] == (3, 5) and default_windows(p)[o] == (3, 6)
    sched, res = run(p, {a: S, o: R})
    assert sched.counts()["swap_in"] == 1 and res.recompute_s == 1.0   # g (split takes no time)
    names = sched.to_text(p).split("\n")
    assert sum(line.split()[1] == "Compute(split)" for line in names) == 2
    free_a = [k for k, line in enumerate(names) if line.split()[1] == "Free(a)"]
    free_s1 = [k for k, line in enumerate(names) if line.split()[1] == "Free(s1)"]
    assert free_a[-1] > free_s1[-1]


def test_policy_codes_round_trip_and_are_what_libra_stores():
    from libra_opt.passes.lowering import Policy
    from libra_opt.solvers.libra.estimate import KEEP, REC, SWAP
    assert [p.code for p in Policy] == [KEEP, REC, SWAP] == [0, 1, 2]
    assert all(Policy.of_code(p.code) is p for p in Policy)
    with pytest.raises(KeyError):
        Policy.of_code(3)


def test_watch_sees_each_prefix_and_its_exception_stops_the_lowering():
    """``lower(..., watch=f)`` calls ``f`` after each node with the instructions so far: growing prefixes of
    the schedule it returns, the last one the whole; an exception ``f`` raises propagates."""
    from libra_opt import generators as G

    p = G.random_layered_graph(30, seed=1)
    ev = evictions_for(p, {s: Policy.RECOMPUTE for s in default_windows(p)})
    seen = []
    sched = lower(p, ev, watch=lambda out: seen.append(list(out)))
    assert sched.instructions == lower(p, ev).instructions
    assert len(seen) == p.num_nodes and seen[-1] == sched.instructions
    assert all(a == b[:len(a)] and len(a) < len(b) for a, b in zip(seen, seen[1:]))

    class Stop(Exception):
        pass

    def stop(out):
        if len(out) > len(sched.instructions) // 2:
            raise Stop
    with pytest.raises(Stop):
        lower(p, ev, watch=stop)
