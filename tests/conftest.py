"""Shared pytest setup: skip tests marked ``cuda`` when no CUDA GPU is present; the
``one_intra_op_thread`` fixture for modules that run many tiny eager ops; node-link graph
files written by the tests themselves (``checkmate_graph_file``, ``layered_graph_file``),
so that a clone of the repository is all the suite needs; ``descend_calls``, the ``libra``
descents a test runs."""
import json

import pytest

MiB = 2**20
#: forward output sizes (MiB) of the mirrored Checkmate-format graph: two large early layers,
#: like VGG's first block, so the smallest feasible budget (the working set of one backward op)
#: is below the no-remat peak
MIRRORED_SIZES_MIB = (12, 12, 6, 6, 4, 4, 4, 4, 2, 2)


def mirrored_checkmate_graph(sizes=MIRRORED_SIZES_MIB, name="mirror_256_(32, 32)_train") -> dict:
    """A training graph in Checkmate's node-link format (fields ``id``, ``name``, ``backward``,
    ``cost_cpu``, ``cost_ram``): a chain of forward layers ``f0..f{k-1}`` (output ``sizes[i]`` MiB,
    cost 3 for the first two, 2 after), a loss, and a backward half that mirrors it: ``f{i}_backward``
    reads the gradient from above, ``f{i}`` and ``f{i-1}`` and writes the gradient of its input."""
    k = len(sizes)
    costs = [3.0, 3.0] + [2.0] * (k - 2)
    nodes, links = [], []
    for i in range(k):
        nodes.append(dict(id=i, name=f"f{i}", backward=False, cost_cpu=costs[i], cost_ram=sizes[i] * MiB))
        if i:
            links.append((i - 1, i))
    nodes.append(dict(id=k, name="loss", backward=False, cost_cpu=1.0, cost_ram=4))
    links.append((k - 1, k))
    back = {}
    for j, i in enumerate(range(k - 1, -1, -1)):
        nid = back[i] = k + 1 + j
        nodes.append(dict(id=nid, name=f"f{i}_backward", backward=True, cost_cpu=2 * costs[i],
                          cost_ram=sizes[max(i - 1, 0)] * MiB))
        links += [(k if i == k - 1 else back[i + 1], nid), (i, nid)] + ([(i - 1, nid)] if i else [])
    return {"directed": True, "multigraph": False, "graph": {"name": name},
            "nodes": nodes, "links": [{"source": s, "target": t} for s, t in links]}


def pytest_collection_modifyitems(config, items):
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def checkmate_graph_file(tmp_path):
    """A :func:`mirrored_checkmate_graph` written as node-link JSON; returns its path (str)."""
    path = tmp_path / "mirror_train.json"
    path.write_text(json.dumps(mirrored_checkmate_graph()))
    return str(path)


@pytest.fixture
def layered_graph_file(tmp_path):
    """A random layered graph of :mod:`libra_opt.generators` (100 nodes, seed 0) written as
    node-link JSON; returns its path (str)."""
    from libra_opt.frontend.generators import random_layered_graph_dict

    path = tmp_path / "random_layered_n100.json"
    path.write_text(json.dumps(random_layered_graph_dict(100, seed=0)))
    return str(path)


@pytest.fixture(scope="module")
def one_intra_op_thread():
    """One intra-op thread for the module: on a busy 2-core machine OpenMP's spinning
    threads make tiny ops hundreds of times slower; results do not depend on it."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture
def descend_calls(monkeypatch):
    """Every ``Refiner.descend`` call of the test (``libra``'s descents), as ``(policy, budgets)``
    (a tuple of bytes), in order; the list may be cleared between solves."""
    from libra_opt.solvers.libra.refine import Refiner

    calls = []
    descend = Refiner.descend

    def spy(self, budgets, to_end=False):
        calls.append((self.opts.policy, tuple(budgets)))
        return descend(self, budgets, to_end)

    monkeypatch.setattr(Refiner, "descend", spy)
    return calls


@pytest.fixture
def stopped_lowerings(monkeypatch):
    """Records, per lowering of a baseline plan under a limit
    (``solvers.baselines._lower_within``), whether it stopped at the limit
    (True) or ran to the end (False).  The baselines' peak prover is off
    (``PeakProver.over`` proves nothing), so that the plans it would prove
    over a limit first are lowered (the prover's own tests:
    ``tests/test_peak_bound.py``)."""
    from libra_opt.passes.peak_bound import PeakProver
    from libra_opt.solvers import baselines

    monkeypatch.setattr(PeakProver, "over", lambda self, limit: False)
    lower_within, stops = baselines._lower_within, []

    def counted(*a):
        got = lower_within(*a)
        stops.append(got is None)
        return got
    monkeypatch.setattr(baselines, "_lower_within", counted)
    return stops


@pytest.fixture
def tiny_problem():
    """Forward a = f(x): 100 B, 1 s; b = g(a): 100 B, 1 s.  Backward gb = h(b): 100 B, 1 s;
    ga = k(gb, a): 10 B, 1 s.  Output ga.  Parameters: 1000 B.  No-remat peak 300 B."""
    from libra_opt.ir.problem import BACKWARD, DeviceProfile, FixedMemory, ProblemBuilder

    bld = ProblemBuilder()
    x = bld.input("x", 8)
    (a,) = bld.op("f", [x], [("a", 100)], time_s=1.0)
    (b,) = bld.op("g", [a], [("b", 100)], time_s=1.0)
    (gb,) = bld.op("h", [b], [("gb", 100)], time_s=1.0, phase=BACKWARD)
    (ga,) = bld.op("k", [gb, a], [("ga", 10)], time_s=1.0, phase=BACKWARD)
    return bld.build([ga], fixed=FixedMemory(parameters_bytes=1000), device=DeviceProfile(name="test"),
                     name="tiny")


@pytest.fixture
def tiny_recompute_plan():
    """A plan of ``tiny_problem`` that recomputes a for k: peak 210 B instead of 300 B, +1 s."""
    from libra_opt.ir.schedule import Compute, Free, Schedule

    return Schedule([Compute(0), Compute(1), Free(1), Compute(2), Free(2), Compute(0), Compute(3), Free(1),
                     Free(3)], {"solver": "hand"})
