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

from ..errors import ProblemError
from ..ir.problem import RematProblem

__all__ = ["random_layered_graph", "random_layered_graph_dict", "training_graph_dict", "large_beside_small_graph",
           "early_regeneration_graph", "vgg_segmentation_graph", "unet_graph"]


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


def training_graph_dict(forward, *, skips=(), name: str = "training_graph") -> dict:
    """A training step in Checkmate's graph format: a forward chain, a loss and
    the mirrored backward, as a node-link JSON object.

    Parameters
    ----------
    forward : sequence of (cost, nbytes)
        The forward layers in order: compute cost (relative units, treated as
        seconds) and output size (bytes).  Layer 0 reads nothing (the data);
        layer ``i`` reads layer ``i - 1``.
    skips : sequence of (i, k)
        Skip connections (``i < k - 1``): layer ``k`` also reads layer ``i``
        (a U-Net's concatenation), and the backward of layer ``i`` also reads
        the gradient made by the backward of layer ``k``.
    name : str
        The graph's name.

    Returns
    -------
    dict
        Checkmate node-link format (``id``, ``name``, ``backward``,
        ``cost_cpu``, ``cost_ram``; see :mod:`libra_opt.importers`), node ids in
        eager order: forward ``0..L-1``, the loss ``L``, then the backward of
        layer ``L-1`` down to layer 1.  The backward of layer ``k`` reads the
        gradient of its output (the loss or the next layer's backward, plus its
        skip readers' backward), its inputs and its output; it costs twice the
        forward and makes a gradient the size of its first input.

    Raises
    ------
    ProblemError
        Fewer than two layers, a negative cost or size, a skip that is not
        forward by at least two layers.

    Source: the backward structure of the Checkmate training graphs (Jain et
    al., MLSys 2020, sec. 3: the gradient of a layer reads the layer's input,
    output and upstream gradient).
    """
    fw = [(float(c), int(b)) for c, b in forward]
    L = len(fw)
    if L < 2:
        raise ProblemError(f"training_graph_dict needs at least 2 forward layers, got {L}")
    if any(c < 0 or b < 0 for c, b in fw):
        raise ProblemError("training_graph_dict: costs and sizes must be non-negative")
    skips = sorted({(int(i), int(k)) for i, k in skips})
    for i, k in skips:
        if not 0 <= i < k - 1 < L - 1:
            raise ProblemError(f"training_graph_dict: skip ({i}, {k}) must satisfy 0 <= i < k - 1 < {L - 1}")
    ins = {k: [k - 1] + [i for i, kk in skips if kk == k] for k in range(1, L)}
    readers = {i: [k for k in range(1, L) if i in ins[k]] for i in range(L)}
    nodes = [{"id": k, "name": f"fwd{k}", "backward": False, "cost_cpu": c, "cost_ram": b}
             for k, (c, b) in enumerate(fw)]
    loss = L
    nodes.append({"id": loss, "name": "loss", "backward": False, "cost_cpu": 0.0, "cost_ram": 4})
    links = [(i, k) for k in range(1, L) for i in ins[k]] + [(L - 1, loss)]
    bwd = {k: L + (L - k) for k in range(L - 1, 0, -1)}   # id of the backward of layer k
    for k in range(L - 1, 0, -1):
        c, _ = fw[k]
        nodes.append({"id": bwd[k], "name": f"bwd{k}", "backward": True, "cost_cpu": 2 * c,
                      "cost_ram": fw[k - 1][1]})
        grads = [loss] if k == L - 1 else []
        grads += [bwd[r] for r in readers[k]]
        links += [(g, bwd[k]) for g in grads] + [(i, bwd[k]) for i in ins[k]] + [(k, bwd[k])]
    return {"directed": True, "multigraph": False, "graph": {"name": name},
            "nodes": nodes, "links": [{"source": u, "target": v} for u, v in sorted(set(links))]}


def _as_problem(d: dict) -> RematProblem:
    from .importers import remat_graph_from_dict

    name = d["graph"]["name"]
    return remat_graph_from_dict(d, path=f"{name}.json", name=name)


def large_beside_small_graph(n: int = 24, *, seed: int = 0, large_factor: float = 6.0,
                             ratio_edge: float = 1.3) -> RematProblem:
    """A training graph with one large, costly activation beside several small,
    cheap ones: the pattern where recomputing the large one frees the most
    bytes per second, but a few small recomputes free what a budget needs for
    less time (a greedy that takes the best ratio first overshoots).

    Parameters
    ----------
    n : int
        Nodes, 7 to 201 (``n // 2`` forward layers, the loss, their backward).
    seed : int
        Seed of ``numpy.random.default_rng``.
    large_factor : float
        Size of the large activation over the small ones' mean (> 1).
    ratio_edge : float
        Bytes per second of recomputing the large one over the best small
        one's (> 1: the greedy's first choice).

    Returns
    -------
    RematProblem
        Through :func:`training_graph_dict`: small layers of 80 to 120 bytes
        at 6 to 8 bytes per cost unit, the large one in the last third of the
        forward; Checkmate's format (times in relative cost units).

    Raises
    ------
    ProblemError
        A parameter out of its range.
    """
    if not 7 <= int(n) <= 201 or not large_factor > 1 or not ratio_edge > 1:
        raise ProblemError(f"large_beside_small_graph: need 7 <= n <= 201, large_factor > 1, ratio_edge > 1; "
                           f"got n={n}, large_factor={large_factor}, ratio_edge={ratio_edge}")
    rng = np.random.default_rng(seed)
    L = int(n) // 2
    sizes = rng.integers(80, 121, size=L)
    ratios = rng.uniform(6.0, 8.0, size=L)
    fw = [(float(np.round(s / r, 2)), int(s)) for s, r in zip(sizes, ratios)]
    fw[0] = (0.0, int(sizes[0]))   # the data
    big = int(rng.integers(max(1, (2 * L) // 3), L - 1)) if L > 3 else 1
    nbytes = int(round(large_factor * sizes.mean()))
    fw[big] = (float(np.round(nbytes / (ratio_edge * ratios.max()), 2)), nbytes)
    return _as_problem(training_graph_dict(fw, name=f"large_beside_small_n{n}_seed{seed}"))


def early_regeneration_graph(n: int = 20, *, seed: int = 0) -> RematProblem:
    """A single-phase graph where the optimum regenerates two storages early,
    one reading the other: a costly producer ``P`` (read by ``R`` and by a
    middle node ``M``) and a large ``R`` (read right after it and again near
    the end) are both live across a peak between them.  The budget needs both
    off the peak; the cheap plan recomputes ``P`` at ``M`` and keeps it
    until ``R``'s late use, where ``R`` is recomputed from it, instead of
    recomputing ``P`` twice or something costlier.

    Parameters
    ----------
    n : int
        Nodes, 10 to 100: the source, ``P``, ``R``, its early use, a peak
        region, ``M``, filler nodes, ``R``'s late use and the sink.
    seed : int
        Seed of ``numpy.random.default_rng`` (sizes and costs vary by up to
        25%; the filler nodes' are random).

    Returns
    -------
    RematProblem
        Random-layered format (:mod:`libra_opt.importers`): one forward phase,
        times in relative cost units treated as seconds, sizes as bytes.

    Raises
    ------
    ProblemError
        ``n`` out of range.
    """
    if not 10 <= int(n) <= 100:
        raise ProblemError(f"early_regeneration_graph: need 10 <= n <= 100, got n={n}")
    n = int(n)
    rng = np.random.default_rng(seed)

    def jitter(x: float) -> int:
        return int(round(x * rng.uniform(0.75, 1.25)))

    peak_len = max(2, (n - 8) // 3)
    tail_len = n - 8 - peak_len
    dur, size, edges = [], [], []

    def add(d: int, s: int, preds) -> int:
        dur.append(d)
        size.append(max(10, s))
        v = len(dur) - 1
        edges.extend((u, v) for u in preds)
        return v

    src = add(0, 500, [])
    P = add(jitter(550), jitter(1600), [src])
    R = add(jitter(360), jitter(5000), [P])
    u = add(jitter(300), jitter(1000), [R])            # R's early use
    prev = u
    for _ in range(peak_len):                          # the peak: big temporaries
        prev = add(int(rng.integers(50, 400)), int(rng.integers(2000, 4000)), [prev])
    M = add(jitter(200), jitter(800), [P, prev])       # P's middle use
    prev = M
    for _ in range(tail_len):
        prev = add(int(rng.integers(50, 900)), int(rng.integers(300, 2500)), [prev])
    late = add(jitter(250), jitter(600), [R, prev])     # R's late use
    sink = add(0, 10, [late, u])
    assert sink == n - 2
    add(0, 10, [sink])
    nodes = [{"name": v, "duration": dur[v], "out_cost": size[v], "param_cost": 0} for v in range(n)]
    name = f"early_regeneration_n{n}_seed{seed}"
    d = {"directed": True, "multigraph": False,
         "graph": {"name": name, "order": list(range(n)), "source_node": 0, "target_node": n - 1},
         "nodes": nodes, "links": [{"0": a, "1": b} for a, b in sorted(set(edges))]}
    return _as_problem(d)


def _conv_layers(spec, batch: int, size: int, channels: int, who: str):
    """Forward layers ``(cost, nbytes)`` of a CNN from ``spec`` (ints: 3x3
    convolutions with that many output channels; ``"M"``: 2x2 max-pool;
    ``"U"``: 2x upsampling), fp32 activations at ``batch`` x ``size`` x
    ``size`` x ``channels`` input; cost in GFLOP (2 per multiply-add).
    Returns the layers and each one's channel count; raises
    :class:`ProblemError` (naming ``who``) unless ``batch >= 1`` and ``size``
    is a positive multiple of 16."""
    if batch < 1 or size < 16 or size % 16:
        raise ProblemError(f"{who}: need batch >= 1 and size a positive multiple of 16, "
                           f"got batch={batch}, size={size}")
    layers, chans = [(0.0, 4 * batch * channels * size * size)], [channels]
    h, c = size, channels
    for x in spec:
        if x == "M":
            h //= 2
            cost = batch * c * h * h * 4 / 1e9
        elif x == "U":
            h *= 2
            cost = batch * c * h * h / 1e9
        else:
            cost = 2.0 * batch * h * h * c * int(x) * 9 / 1e9
            c = int(x)
        layers.append((round(cost, 4), 4 * batch * c * h * h))
        chans.append(c)
    return layers, chans


#: SegNet-style VGG16 encoder / mirrored decoder (Badrinarayanan et al., TPAMI 2017)
VGG_SEGMENTATION = [64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M",
                    "U", 512, 512, 256, "U", 256, 256, 128, "U", 128, 64, "U", 64, 64, 21]
#: U-Net (Ronneberger et al., MICCAI 2015), four levels; decoder convolutions after each upsampling
UNET = [64, 64, "M", 128, 128, "M", 256, 256, "M", 512, 512, "M", 1024, 1024,
        "U", 512, 512, "U", 256, 256, "U", 128, 128, "U", 64, 64, 2]


def vgg_segmentation_graph(batch: int = 80, size: int = 224) -> RematProblem:
    """A VGG16-style segmentation CNN's training step (SegNet-like encoder /
    decoder, no skips) in Checkmate's format, via :func:`training_graph_dict`:
    fp32 activations (batch 80 at 224x224 gives ~980 MiB first-level
    convolution outputs), costs in GFLOP.

    Raises
    ------
    ProblemError
        ``batch`` or ``size`` not positive, or ``size`` not a multiple of 16.
    """
    fw, _ = _conv_layers(VGG_SEGMENTATION, batch, size, 3, "vgg_segmentation_graph")
    return _as_problem(training_graph_dict(fw, name=f"vgg_segmentation_b{batch}_s{size}"))


def unet_graph(batch: int = 8, size: int = 256) -> RematProblem:
    """A U-Net's training step (Ronneberger et al., MICCAI 2015: four levels,
    each decoder level reading the encoder output of the same resolution
    through a skip connection) in Checkmate's format, via
    :func:`training_graph_dict`: fp32 activations, costs in GFLOP.

    Raises
    ------
    ProblemError
        ``batch`` or ``size`` not positive, or ``size`` not a multiple of 16.
    """
    fw, _ = _conv_layers(UNET, batch, size, 1, "unet_graph")
    # skip: the last convolution before each pool feeds the first convolution after the matching upsampling
    pools = [k + 1 for k, x in enumerate(UNET) if x == "M"]      # layer ids (layer 0 is the input)
    ups = [k + 1 for k, x in enumerate(UNET) if x == "U"]
    skips = [(pools[i] - 1, ups[len(ups) - 1 - i] + 1) for i in range(len(pools))]
    return _as_problem(training_graph_dict(fw, skips=skips, name=f"unet_b{batch}_s{size}"))
