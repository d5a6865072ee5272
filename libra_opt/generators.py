"""Random layered computation graphs, as rematerialization problems.

Source: Gagrani et al., "Neural Topological Ordering for Computation Graphs",
NeurIPS 2022, appendix A ("layered graphs"): synthetic DAGs shaped like
neural-network computation graphs.  Nodes sit in layers; edges run mostly
from one layer to the next, with a share of skip connections to later layers;
each node has a compute duration and an output size.  The generator has the
paper's four knobs: layer width, variation of the width between layers, edge
density between consecutive layers and skip-connection density; the graphs
Moccasin (Bartan et al., ICML 2023) benchmarks on are named after them
(``random_layered_n100_w0.27_nlv0.75_ed0.2_scd0.14``).  The distributions
below are this module's own reading of that description, written without the
authors' code: they give graphs of the same kind and similar statistics, not
the same graphs.

The algorithm (all draws from ``numpy.random.default_rng(seed)``):

1. A source node (layer 0) and a sink node (last layer) frame ``n - 2`` inner
   nodes.  Inner layers are filled in turn; a layer's width is
   ``round(width * sqrt(n) * (1 + width_variation * u))`` with ``u`` uniform
   in ``[-1, 1]``, at least 1, and the last layer takes what is left.
2. Each pair (node of layer ``l``, node of layer ``l + 1``) is an edge with
   probability ``edge_density``; then every node gets one random predecessor
   in the previous layer and one random successor in the next layer if it has
   none, so every node lies on a source-sink path.
3. ``skip_density`` is the share of skip edges among all edges: that many
   extra edges join a random inner node to a random node two or more layers
   later (no duplicates).
4. Inner nodes get a duration uniform in ``[0, max_duration]`` (integer cost
   units) and an output size ``10 * ceil(e / 10)`` with ``e`` exponential of
   mean ``mean_out_bytes`` (at least 10).  The source and sink take 0 time;
   the source's output counts like any other, the sink's is 10.

The graph is returned as a :class:`~libra_opt.problem.RematProblem` through
the random-layered importer (:func:`libra_opt.importers.remat_graph_from_dict`):
one forward phase, no backward half, times in relative cost units treated as
seconds, sizes as bytes.  :func:`random_layered_graph_dict` gives the
node-link JSON object itself (the file format of those benchmarks).
"""
from __future__ import annotations

import math

import numpy as np

from .errors import ProblemError
from .problem import RematProblem

__all__ = ["random_layered_graph", "random_layered_graph_dict"]


def _check(n, width, width_variation, edge_density, skip_density, max_duration, mean_out_bytes) -> None:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 3:
        raise ProblemError(f"n must be an integer >= 3 (a source, a sink and inner nodes), got {n!r}")
    for name, v, lo_open in (("width", width, True), ("mean_out_bytes", mean_out_bytes, True),
                             ("max_duration", max_duration, False)):
        if not (isinstance(v, (int, float)) and math.isfinite(v) and (v > 0 if lo_open else v >= 0)):
            raise ProblemError(f"{name} must be a finite number {'>' if lo_open else '>='} 0, got {v!r}")
    for name, v, hi in (("width_variation", width_variation, 1.0), ("edge_density", edge_density, 1.0),
                        ("skip_density", skip_density, 0.9)):
        if not (isinstance(v, (int, float)) and 0 <= v <= hi):
            raise ProblemError(f"{name} must be a number in [0, {hi}], got {v!r}")


def random_layered_graph_dict(n: int = 100, *, width: float = 0.27, width_variation: float = 0.75,
                              edge_density: float = 0.2, skip_density: float = 0.14, max_duration: int = 1000,
                              mean_out_bytes: float = 2000.0, seed: int = 0) -> dict:
    """A random layered DAG as a networkx node-link JSON object (the
    random-layered format of :mod:`libra_opt.importers`).

    Parameters
    ----------
    n : int
        Number of nodes, source and sink included (>= 3).
    width : float
        Layer width relative to ``sqrt(n)`` (> 0): the mean inner layer has
        about ``width * sqrt(n)`` nodes.
    width_variation : float
        In ``[0, 1]``: how much a layer's width varies around that mean
        (0: all layers equally wide).
    edge_density : float
        In ``[0, 1]``: probability of each edge between consecutive layers.
    skip_density : float
        In ``[0, 0.9]``: share of skip connections (edges that jump two or
        more layers) among all edges.
    max_duration : int
        Largest compute duration of a node (cost units; durations are uniform
        integers in ``[0, max_duration]``).
    mean_out_bytes : float
        Mean output size of a node (bytes, exponentially distributed, rounded
        up to a multiple of 10).
    seed : int
        Seed of :func:`numpy.random.default_rng`: the same arguments give the
        same graph.

    Returns
    -------
    dict
        ``{"directed": True, "multigraph": False, "graph": {"name", "order",
        "source_node", "target_node"}, "nodes": [{"name", "duration",
        "out_cost", "param_cost"}], "links": [{"0": u, "1": v}]}``; node 0 is
        the source, node ``n - 1`` the sink, ``order`` is layer by layer.

    Raises
    ------
    ProblemError
        A parameter out of its range (the message names it).
    """
    _check(n, width, width_variation, edge_density, skip_density, max_duration, mean_out_bytes)
    n = int(n)
    rng = np.random.default_rng(seed)
    inner = n - 2
    mean_w = max(1.0, width * math.sqrt(n))
    layers: list[list[int]] = [[0]]
    nxt = 1
    while nxt <= inner:
        w = max(1, int(round(mean_w * (1 + width_variation * rng.uniform(-1, 1)))))
        w = min(w, inner + 1 - nxt)
        layers.append(list(range(nxt, nxt + w)))
        nxt += w
    layers.append([n - 1])

    edges: set[tuple[int, int]] = set()
    for a, b in zip(layers, layers[1:]):
        mask = rng.random((len(a), len(b))) < edge_density
        edges.update((a[i], b[j]) for i, j in zip(*np.nonzero(mask)))
        has_pred = {v for u, v in edges if v in set(b)}
        for v in b:
            if v not in has_pred:
                edges.add((a[int(rng.integers(len(a)))], v))
        has_succ = {u for u, v in edges if u in set(a)}
        for u in a:
            if u not in has_succ:
                edges.add((u, b[int(rng.integers(len(b)))]))

    layer_of = {v: k for k, layer in enumerate(layers) for v in layer}
    inner_layers = len(layers) - 2
    if skip_density > 0 and inner_layers >= 3:
        want = int(round(skip_density / (1 - skip_density) * len(edges)))
        pairs_possible = sum(len(layers[i]) * len(layers[j]) for i in range(1, len(layers) - 1)
                             for j in range(i + 2, len(layers) - 1))
        want = min(want, pairs_possible)
        added = 0
        while added < want:
            i = int(rng.integers(1, len(layers) - 3))
            j = int(rng.integers(i + 2, len(layers) - 1))
            u = layers[i][int(rng.integers(len(layers[i])))]
            v = layers[j][int(rng.integers(len(layers[j])))]
            if (u, v) not in edges:
                edges.add((u, v))
                added += 1

    durations = rng.integers(0, int(max_duration) + 1, size=n)
    sizes = 10 * np.ceil(rng.exponential(mean_out_bytes, size=n) / 10).astype(np.int64)
    nodes = []
    for v in range(n):
        end = v in (0, n - 1)
        nodes.append({"name": v, "duration": 0 if end else int(durations[v]),
                      "out_cost": 10 if v == n - 1 else max(10, int(sizes[v])), "param_cost": 0})
    order = [v for layer in layers for v in layer]
    assert all(layer_of[u] < layer_of[v] for u, v in edges)
    name = (f"random_layered_n{n}_w{width:g}_nlv{width_variation:g}_ed{edge_density:g}_scd{skip_density:g}"
            f"_seed{seed}")
    return {"directed": True, "multigraph": False,
            "graph": {"name": name, "order": order, "source_node": 0, "target_node": n - 1},
            "nodes": nodes, "links": [{"0": u, "1": v} for u, v in sorted(edges)]}


def random_layered_graph(n: int = 100, *, width: float = 0.27, width_variation: float = 0.75,
                         edge_density: float = 0.2, skip_density: float = 0.14, max_duration: int = 1000,
                         mean_out_bytes: float = 2000.0, seed: int = 0,
                         bandwidth_bytes_per_s: float | None = None) -> RematProblem:
    """A random layered DAG (module docstring) as a rematerialization problem.

    Parameters
    ----------
    n, width, width_variation, edge_density, skip_density, max_duration, mean_out_bytes, seed
        As in :func:`random_layered_graph_dict`.
    bandwidth_bytes_per_s : float, optional
        Host<->device bandwidth each way, bytes per cost unit (the
        :class:`~libra_opt.problem.DeviceProfile` default if ``None``).

    Returns
    -------
    RematProblem
        ``n`` nodes in the graph's layer order, one output tensor each (of the
        node's ``out_cost`` bytes); the sink's tensor is the output; every
        node is forward and recomputable.

    Raises
    ------
    ProblemError
        A parameter out of its range.
    """
    from .importers import remat_graph_from_dict

    d = random_layered_graph_dict(n, width=width, width_variation=width_variation, edge_density=edge_density,
                                  skip_density=skip_density, max_duration=max_duration,
                                  mean_out_bytes=mean_out_bytes, seed=seed)
    name = d["graph"]["name"]
    return remat_graph_from_dict(d, path=f"{name}.json", bandwidth_bytes_per_s=bandwidth_bytes_per_s, name=name)
