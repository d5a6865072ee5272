"""The per-problem tables (libra_opt.ir.tables) and the immutable RematProblem they rely on.

The tables replace four private caches (the simulator's, the lowering's, the bounds' and the
static section of the libra ``Timeline``): they must hold exactly what each of them computed,
be built once per problem, and a problem must refuse to change under them.
"""
import pickle
import random
from pathlib import Path

import numpy as np
import pytest

from libra_opt.ir.problem import BACKWARD, DeviceProfile, ProblemBuilder
from libra_opt.ir.problem_io import load_problem
from libra_opt.ir.schedule import Op
from libra_opt.ir.tables import ProblemTables
from libra_opt.passes.bounds import memory_lower_bound, node_memory_lower_bounds
from libra_opt.passes.costs import for_executor
from libra_opt.passes.lowering import Eviction, Policy, all_windows, default_windows, lower
from libra_opt.passes.simulator import no_remat_peak, simulate
from libra_opt.solvers.libra.estimate import Timeline

PROBLEMS = Path(__file__).resolve().parent.parent / "problems"



def views_and_outputs():
    """A forward with a view of an activation, a view of a weight (an activation on an input
    storage), a two-output op, workspace, a non-recomputable op, and a backward whose outputs
    include a view's base."""
    b = ProblemBuilder()
    x, w = b.input("x", 16), b.input("w", 32)
    (wt,) = b.op("t", [w], [("wt", 0, w)], time_s=0.0)
    (a,) = b.op("mm", [x, wt], [("a", 64)], time_s=2.0, workspace_bytes=8)
    (av,) = b.op("view", [a], [("av", 0, a)], time_s=0.0)
    m, r = b.op("drop", [av], [("m", 16), ("r", 64)], time_s=1.0, recomputable=False)
    (c,) = b.op("relu", [r], [("c", 64)], time_s=1.0, pointwise=True)
    (L,) = b.op("loss", [c], [("L", 4)], time_s=0.5)
    (gc,) = b.op("dc", [L, c], [("gc", 64)], time_s=1.0, phase=BACKWARD)
    (gr,) = b.op("dr", [gc, m, av], [("gr", 64)], time_s=1.0, phase=BACKWARD, workspace_bytes=16)
    (gw,) = b.op("dw", [gr, x], [("gw", 32)], time_s=2.0, phase=BACKWARD)
    return b.build([L, gw, a], device=DeviceProfile(memory_bytes_per_s=64.0), name="views")


def cases():
    yield views_and_outputs()
    yield for_executor(views_and_outputs(), "inductor")   # recompute times differ from first-run times
    yield load_problem(PROBLEMS / "gpt2-tiny-b2-s32-cpu.json.gz")
    yield load_problem(PROBLEMS / "resnet-tiny-b8-s32-cpu.json.gz")


@pytest.fixture(params=range(4), ids=["views", "views-inductor", "gpt2-tiny", "resnet-tiny"])
def problem(request):
    return list(cases())[request.param]


# ---------------------------------------------------------------- contents
def test_the_timeline_reads_the_problems_tables(problem):
    """The libra Timeline builds no tables of its own: it reads ``problem.tables``, which has
    every per-problem field the estimate reads."""
    from libra_opt.solvers.libra.tables import PROBLEM_FIELDS

    windows = sorted((s, a, b) for s, (a, b) in default_windows(problem).items())
    tl = Timeline(problem, windows)
    assert tl.tables is problem.tables and tl.copy().tables is problem.tables
    missing = [n for n in PROBLEM_FIELDS if not hasattr(problem.tables, n)]
    assert not missing, missing


def test_no_remat_memory_is_the_simulators(problem):
    """C0[i] is graph memory while node i runs in the no-remat plan, as the simulator counts it."""
    sim = simulate(problem)
    firsts = [k for k, ins in enumerate(lower(problem, [])) if ins.op == Op.COMPUTE]
    assert np.array_equal(sim.timeline_bytes[firsts], problem.tables.C0)
    assert int(problem.tables.C0.max()) == no_remat_peak(problem) == sim.peak_bytes


def test_tensor_and_node_tables_read_the_problem(problem):
    tab, p = problem.tables, problem
    for t in p.tensors:
        assert tab.t_input[t.id] == (t.kind == "input") != tab.t_act[t.id]
        assert tab.t_last_read[t.id] == (t.consumers[-1] if t.consumers else -1)
        assert tab.t_freeable[t.id] == (t.kind == "activation" and t.id not in p.outputs)
        on_it = [u.id for u in p.tensors if u.storage == t.storage]
        assert tab.t_alone[t.id] == (t.kind == "activation" and on_it == [t.id])
    for n in p.nodes:
        assert tab.n_facts[n.id] == (n.inputs, n.outputs, n.recomputable, n.time_s, n.workspace_bytes)
        assert tab.compute_instr[n.id].op == Op.COMPUTE and tab.compute_instr[n.id].arg == n.id
        # free candidates: freeable inputs and outputs; the static ones are read last at or before n
        assert tab.free_cands[n.id] == sorted({t for t in (*n.inputs, *n.outputs) if tab.t_freeable[t]})
        assert tab.free_static[n.id] == [t for t in tab.free_cands[n.id] if tab.t_last_read[t] <= n.id]
        for t in tab.free_cands[n.id]:
            assert n.id in tab.storage_nodes[tab.t_storage[t]]
    assert tab.n_rtime == p.recompute_time.tolist()
    assert tab.cum[-1] == pytest.approx(p.total_compute_s)


def test_lowering_windows_come_from_the_tables(problem):
    tab = problem.tables
    assert default_windows(problem) == tab.default_windows
    assert all_windows(problem) == [(s, x, y) for s, u in tab.uses.items() for x, y in zip(u, u[1:]) if y - x >= 2]
    # callers get copies: changing them leaves the tables alone
    wins = default_windows(problem)
    wins.clear()
    assert default_windows(problem) == tab.default_windows


def test_the_inductor_tables_price_recomputes_by_bytes():
    p = for_executor(views_and_outputs(), "inductor")
    relu = p.node_by_name("relu").id
    # relu reads r (64 B) and writes c (64 B) at 64 B/s: 2 s by bytes, capped by its measured 1 s
    assert p.tables.n_time[relu] == 1.0 and p.tables.n_rtime[relu] == 1.0
    q = for_executor(views_and_outputs().with_device(memory_bytes_per_s=256.0), "inductor")
    assert q.tables.n_rtime[relu] == pytest.approx(0.5) and q.tables.n_time[relu] == 1.0


# ------------------------------------------------------------- built once
def test_tables_are_built_once_and_shared(problem):
    tab = problem.tables
    assert isinstance(tab, ProblemTables) and problem.tables is tab and tab.problem is problem
    lists = [getattr(tab, name) for name in ("t_storage", "n_facts", "free_cands", "C0", "uses")]
    windows = default_windows(problem)
    evs = [Eviction(s, a, b, Policy.SWAP) for s, (a, b) in list(windows.items())[:3]]
    simulate(problem, lower(problem, evs))
    node_memory_lower_bounds(problem)
    assert problem.tables is tab
    assert all(getattr(tab, name) is x for name, x in zip(("t_storage", "n_facts", "free_cands", "C0", "uses"),
                                                           lists))


def test_shared_arrays_are_read_only(problem):
    tab = problem.tables
    for a in (tab.cum, tab.C0, tab.newws, problem.node_time, problem.recompute_time):
        with pytest.raises(ValueError, match="read-only"):
            a[0] = 1
    # the bounds hand out copies of the one computed array
    b = node_memory_lower_bounds(problem)
    first = b.copy()
    b[:] = 0
    assert np.array_equal(node_memory_lower_bounds(problem), first) and first.max() > 0
    assert memory_lower_bound(problem) >= int(node_memory_lower_bounds(problem).max())


def test_memo_computes_once():
    p = views_and_outputs()
    calls = []
    assert p.tables.memo("test.x", lambda: calls.append(1) or 42) == 42
    assert p.tables.memo("test.x", lambda: calls.append(1) or 43) == 42
    assert calls == [1]


def test_tables_do_not_keep_their_problem_alive():
    import gc
    import weakref

    p = views_and_outputs()
    tab = p.tables
    ref = weakref.ref(p)
    del p
    gc.collect()
    assert ref() is None
    with pytest.raises(ReferenceError, match="keep a reference to the problem"):
        tab.t_storage


# ----------------------------------------------------------- immutability
@pytest.mark.parametrize("field, value", [("name", "x"), ("executor", "inductor"), ("outputs", ()),
                                          ("device", DeviceProfile()), ("nodes", ())])
def test_a_problem_cannot_be_changed_in_place(field, value):
    p = views_and_outputs()
    before = getattr(p, field)
    with pytest.raises(AttributeError, match=rf"immutable.*problem\.replace\({field}=\.\.\.\)"):
        setattr(p, field, value)
    with pytest.raises(AttributeError, match="immutable"):
        delattr(p, field)
    assert getattr(p, field) is before


def test_new_attributes_and_cached_values_cannot_be_set_either():
    p = views_and_outputs()
    with pytest.raises(AttributeError, match=r"immutable.*replace\(\.\.\.\)"):
        p.extra = 1
    p.tables
    with pytest.raises(AttributeError, match="immutable"):
        p.tables = None
    with pytest.raises(AttributeError, match="immutable"):
        del p.node_time


def test_replace_builds_a_new_problem_with_new_tables():
    p = views_and_outputs()
    old = p.tables
    q = p.with_device(h2d_bytes_per_s=1.0)
    assert q is not p and q.tables is not old and q.tables.problem is q
    assert p.device.h2d_bytes_per_s == 55e9 and q.device.h2d_bytes_per_s == 1.0
    with pytest.raises(TypeError, match="unknown field.*'nmae'"):
        p.replace(nmae="x")


def test_pickle_and_copy_keep_the_fields_and_rebuild_the_tables():
    import copy

    p = load_problem(PROBLEMS / "gpt2-tiny-b2-s32-cpu.json.gz")
    peak = no_remat_peak(p)
    for q in (pickle.loads(pickle.dumps(p)), copy.copy(p), copy.deepcopy(p)):
        assert "tables" not in q.__dict__ and q.nodes == p.nodes and q.outputs == p.outputs
        assert q.tables is not p.tables and no_remat_peak(q) == peak
        with pytest.raises(AttributeError, match="immutable"):
            q.name = "x"


@pytest.mark.parametrize("seed", range(4))
def test_random_plans_simulate_the_same_on_a_copy(seed):
    """Plans lowered and simulated on a problem and on its pickled copy (fresh tables) agree."""
    rng = random.Random(seed)
    p = load_problem(PROBLEMS / "gpt2-tiny-b2-s32-cpu.json.gz")
    q = pickle.loads(pickle.dumps(p))
    wins = default_windows(p)
    # a storage whose producer cannot run again is swapped (a recomputation chain then swaps it in)
    evs = [Eviction(s, a, b, rng.choice([Policy.RECOMPUTE, Policy.SWAP])
                    if p.nodes[p.tensors[s].producer].recomputable else Policy.SWAP)
           for s, (a, b) in wins.items() if rng.random() < 0.5]
    sp, sq = lower(p, evs), lower(q, evs)
    assert sp == sq
    assert simulate(p, sp).peak_bytes == simulate(q, sq).peak_bytes
