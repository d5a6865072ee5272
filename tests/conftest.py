"""Shared pytest setup: skip tests marked ``cuda`` when no CUDA GPU is present; the
``one_intra_op_thread`` fixture for modules that run many tiny eager ops."""
import os

import pytest

REMAT_GRAPHS = os.environ.get("LIBRA_REMAT_GRAPHS",
                              os.path.join(os.path.dirname(__file__), "..", "..", "shared", "remat-graphs"))


def pytest_collection_modifyitems(config, items):
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def remat_graphs_dir():
    """The folder of external instances (../shared/remat-graphs); skips if absent."""
    d = os.path.abspath(REMAT_GRAPHS)
    if not os.path.isdir(d):
        pytest.skip(f"remat-graphs not found at {d}; set LIBRA_REMAT_GRAPHS")
    return d


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
def tiny_problem():
    """Forward a = f(x): 100 B, 1 s; b = g(a): 100 B, 1 s.  Backward gb = h(b): 100 B, 1 s;
    ga = k(gb, a): 10 B, 1 s.  Output ga.  Parameters: 1000 B.  No-remat peak 300 B."""
    from libra_opt.problem import BACKWARD, DeviceProfile, FixedMemory, ProblemBuilder

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
    from libra_opt.schedule import Compute, Free, Schedule

    return Schedule([Compute(0), Compute(1), Free(1), Compute(2), Free(2), Compute(0), Compute(3), Free(1),
                     Free(3)], {"solver": "hand"})
