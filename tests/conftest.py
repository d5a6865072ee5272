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
