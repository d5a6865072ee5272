"""Importers of rematerialization instances that other projects published.

:func:`load_remat_graph` reads networkx node-link JSON graphs (the files
Moccasin published, see ``benchmarks/README.md``, and those of
:mod:`libra_opt.generators`) into a :class:`RematProblem`;
:func:`load_problem_any` reads either such a graph or a libra-opt problem file,
deciding by content.

Two node formats exist:

``checkmate``
    The Checkmate (Jain et al., MLSys 2020) training graphs of VGG16,
    ResNet50 and MobileNet as exported by Moccasin (Bartan et al., ICML 2023).
    Node fields ``id``, ``name``, ``backward`` (bool), ``cost_cpu`` (relative
    compute cost), ``cost_ram`` (bytes of the node's output).  Node ids are
    the eager order; the backward half mirrors the forward half.
``random-layered``
    Random layered DAGs of "Neural Topological Ordering for Computation
    Graphs" (Gagrani et al., NeurIPS 2022, appendix A), as used by Moccasin.
    Node fields ``name`` (the node id), ``duration`` (compute cost),
    ``out_cost`` (output size), ``param_cost`` (parameter size); edges use the
    keys ``"0"``/``"1"`` for source/target; the graph carries an ``order``
    (a topological order), ``source_node`` and ``target_node``.  There is no
    forward/backward split: every node is ``"forward"``.

How a graph becomes a problem:

- each graph node is one :class:`~libra_opt.problem.Node` with **one** output
  tensor of ``cost_ram`` / ``out_cost`` bytes (its own storage, no views, no
  workspace) that every successor reads;
- ``time_s`` is ``cost_cpu`` / ``duration`` unchanged: **relative cost units
  treated as seconds**.  Step times and added times of plans on these
  instances are therefore in those units (compare them as ratios);
- the eager order is the node ids (Checkmate) or the graph's ``order``
  (random layered); if that is not a topological order of the edges, a
  topological sort (smallest id first) is used instead and a warning logged;
- ``param_cost`` is summed into :attr:`FixedMemory.parameters_bytes`
  (outside the activation budget);
- the problem's outputs are the sink nodes' tensors (nodes without
  successors): they must be resident at the end of the step;
- the device is :class:`~libra_opt.problem.DeviceProfile`'s default
  (55 GB/s each way, copies overlap compute) unless
  ``bandwidth_bytes_per_s`` is given.  Since times are in relative units, pick
  the bandwidth in bytes per *cost unit* when swapping costs matter;
- ``provenance.source == "import"``; ``provenance.extra`` records the file,
  the format and the units.

Source: the file formats of the graphs published with Moccasin (Bartan et al.,
ICML 2023), as described above; parsing with :func:`networkx.node_link_graph`.
"""
from __future__ import annotations

import logging
import math
import os
import re
from pathlib import Path
from typing import Any

import networkx as nx

from ..errors import ProblemError, ProblemFileError
from ..ir.problem import BACKWARD, FORWARD, DeviceProfile, FixedMemory, Node, Provenance, RematProblem, Tensor
from ..ir.problem_io import is_problem_dict, problem_from_dict, read_json

log = logging.getLogger(__name__)

CHECKMATE = "checkmate"
RANDOM_LAYERED = "random-layered"
TIME_UNIT = "relative cost units, treated as seconds"

__all__ = ["load_remat_graph", "remat_graph_from_dict", "load_problem_any", "CHECKMATE", "RANDOM_LAYERED"]


def _fail(path: str, message: str, field: str | None = None) -> ProblemFileError:
    return ProblemFileError(f"{path}: {message}", field)


def _detect_format(d: dict, path: str) -> str:
    nodes = d.get("nodes")
    if not isinstance(nodes, list) or not nodes:
        raise _fail(path, "a node-link graph needs a non-empty 'nodes' list", "nodes")
    first = nodes[0]
    if not isinstance(first, dict):
        raise _fail(path, f"nodes[0] must be an object, got {type(first).__name__}", "nodes[0]")
    if "cost_ram" in first or "cost_cpu" in first:
        return CHECKMATE
    if "out_cost" in first or "duration" in first:
        return RANDOM_LAYERED
    raise _fail(path, f"unknown node format (fields {sorted(first)}); expected Checkmate nodes "
                      f"(id, name, backward, cost_cpu, cost_ram) or random layered nodes "
                      f"(name, duration, out_cost, param_cost)", "nodes[0]")


def _node_link_graph(d: dict, fmt: str, path: str) -> nx.DiGraph:
    links = d.get("links")
    if not isinstance(links, list):
        raise _fail(path, "a node-link graph needs a 'links' list (networkx node_link_data with edges='links')",
                    "links")
    if d.get("directed") is not True:
        raise _fail(path, "the graph must be directed (a DAG of ops)", "directed")
    name_key = "id" if fmt == CHECKMATE else "name"
    source, target = "source", "target"
    if links and isinstance(links[0], dict) and "source" not in links[0] and {"0", "1"} <= set(links[0]):
        source, target = "0", "1"
    for k, n in enumerate(d["nodes"]):
        if not isinstance(n, dict) or name_key not in n:
            raise _fail(path, f"node {k} has no {name_key!r} field", f"nodes[{k}].{name_key}")
    for k, e in enumerate(links):
        if not isinstance(e, dict) or source not in e or target not in e:
            raise _fail(path, f"link {k} needs {source!r} and {target!r} fields", f"links[{k}]")
    kw: dict[str, Any] = dict(directed=True, multigraph=bool(d.get("multigraph", False)), name=name_key,
                              source=source, target=target)
    try:
        try:
            g = nx.node_link_graph(d, edges="links", **kw)
        except TypeError:  # networkx < 3.4 calls the keyword `link`
            g = nx.node_link_graph(d, link="links", **kw)
    except (KeyError, TypeError, ValueError, nx.NetworkXError) as e:
        raise _fail(path, f"not a networkx node-link graph ({type(e).__name__}: {e})") from e
    return nx.DiGraph(g) if g.is_multigraph() else g


def _number(v: Any, where: str, path: str, integral: bool) -> float | int:
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0
    if ok and integral and isinstance(v, float) and not v.is_integer():
        ok = False
    if not ok:
        kind = "a non-negative integer" if integral else "a non-negative finite number"
        raise _fail(path, f"{where} must be {kind}, got {v!r}", where)
    return int(v) if integral else float(v)


def _eager_order(g: nx.DiGraph, fmt: str, path: str) -> list:
    if not nx.is_directed_acyclic_graph(g):
        cycle = nx.find_cycle(g)
        raise _fail(path, f"the graph has a cycle through {cycle[:4]}; a training step is a DAG")
    nodes = set(g.nodes)
    if fmt == RANDOM_LAYERED and "order" in g.graph:
        order, what = list(g.graph["order"]), "the graph's 'order'"
    else:
        try:
            order, what = sorted(nodes), "the node ids"
        except TypeError:  # mixed id types
            order, what = list(g.nodes), "the file's node order"
    pos = {n: k for k, n in enumerate(order)}
    if len(order) == len(nodes) and set(order) == nodes and all(pos[u] < pos[v] for u, v in g.edges):
        return order
    log.warning("%s: %s is not a topological order of the edges; using a topological sort instead", path, what)
    try:
        return list(nx.lexicographical_topological_sort(g))
    except TypeError:
        return list(nx.topological_sort(g))


def remat_graph_from_dict(d: dict, *, path: str = "<graph>", bandwidth_bytes_per_s: float | None = None,
                          name: str | None = None) -> RematProblem:
    """Build a problem from a parsed node-link graph (see the module docstring).

    Parameters
    ----------
    d : dict
        The JSON object of a node-link graph.
    path : str
        File name used in error messages and provenance.
    bandwidth_bytes_per_s : float, optional
        Host<->device bandwidth each way (bytes per second, i.e. per cost
        unit); the :class:`DeviceProfile` default if ``None``.
    name : str, optional
        Problem name; the file's stem if ``None``.

    Returns
    -------
    RematProblem

    Raises
    ------
    ProblemFileError
        Not a node-link graph of a known format, a missing or bad node field
        (``field`` names it), a cycle; the message names the file.
    ProblemError
        ``bandwidth_bytes_per_s`` is not a positive number.
    """
    if bandwidth_bytes_per_s is not None and not (
            isinstance(bandwidth_bytes_per_s, (int, float)) and math.isfinite(bandwidth_bytes_per_s)
            and bandwidth_bytes_per_s > 0):
        raise ProblemError(f"bandwidth_bytes_per_s must be a positive number of bytes per second, "
                           f"got {bandwidth_bytes_per_s!r}")
    if not isinstance(d, dict):
        raise _fail(path, f"a node-link graph is a JSON object, got {type(d).__name__}")
    fmt = _detect_format(d, path)
    g = _node_link_graph(d, fmt, path)
    index = {n: k for k, n in enumerate(g.nodes)}  # node -> position in the file, for field names
    order = _eager_order(g, fmt, path)
    pos = {n: k for k, n in enumerate(order)}

    names: dict[str, int] = {}
    nodes: list[Node] = []
    tensors: list[Tensor] = []
    params = 0
    for k, gn in enumerate(order):
        a = g.nodes[gn]
        where = f"nodes[{index[gn]}]"
        if fmt == CHECKMATE:
            for key in ("cost_cpu", "cost_ram", "backward"):
                if key not in a:
                    raise _fail(path, f"Checkmate node {gn!r} has no {key!r}", f"{where}.{key}")
            time_s = _number(a["cost_cpu"], f"{where}.cost_cpu", path, integral=False)
            nbytes = _number(a["cost_ram"], f"{where}.cost_ram", path, integral=True)
            if not isinstance(a["backward"], bool):
                raise _fail(path, f"{where}.backward must be true or false, got {a['backward']!r}",
                            f"{where}.backward")
            phase = BACKWARD if a["backward"] else FORWARD
            label = str(a.get("name", gn))
        else:
            for key in ("duration", "out_cost"):
                if key not in a:
                    raise _fail(path, f"random layered node {gn!r} has no {key!r}", f"{where}.{key}")
            time_s = _number(a["duration"], f"{where}.duration", path, integral=False)
            nbytes = _number(a["out_cost"], f"{where}.out_cost", path, integral=True)
            params += _number(a.get("param_cost", 0), f"{where}.param_cost", path, integral=True)
            phase = FORWARD
            label = f"n{gn}"
        if label in names:  # names must be unique: add the graph id
            label = f"{label}#{gn}"
        names[label] = k
        preds = sorted(pos[u] for u in g.predecessors(gn))
        succs = sorted(pos[v] for v in g.successors(gn))
        nodes.append(Node(id=k, name=label, target=label, phase=phase, time_s=time_s, workspace_bytes=0,
                          recomputable=True, inputs=tuple(preds), outputs=(k,)))
        tensors.append(Tensor(id=k, name=label, producer=k, consumers=tuple(succs), storage=k, nbytes=nbytes))
    sinks = [k for k, gn in enumerate(order) if g.out_degree(gn) == 0]

    stem = Path(path).name
    for suffix in (".gz", ".json"):
        stem = stem[:-len(suffix)] if stem.endswith(suffix) else stem
    graph_name = str(g.graph.get("name", "")) or stem
    batch = None
    m = re.search(r"_(\d+)_\(", graph_name)
    if fmt == CHECKMATE and m:
        batch = int(m.group(1))
    device = DeviceProfile() if bandwidth_bytes_per_s is None else DeviceProfile(
        name="abstract", h2d_bytes_per_s=float(bandwidth_bytes_per_s), d2h_bytes_per_s=float(bandwidth_bytes_per_s))
    provenance = Provenance(source="import", model=graph_name, batch=batch,
                            extra={"file": Path(path).name, "format": fmt, "time_unit": TIME_UNIT,
                                   "bytes_unit": "bytes" if fmt == CHECKMATE else "relative size units, treated "
                                                                                 "as bytes"})
    try:
        problem = RematProblem(nodes, tensors, sinks, fixed=FixedMemory(parameters_bytes=params), device=device,
                               provenance=provenance, name=name or stem)
    except ProblemError as e:  # pragma: no cover - the construction above keeps every invariant
        raise _fail(path, str(e)) from e
    log.info("imported %s graph %s: %d nodes, %d edges, %d outputs", fmt, path, len(nodes),
             g.number_of_edges(), len(sinks))
    return problem


def load_remat_graph(path: str | os.PathLike, *, bandwidth_bytes_per_s: float | None = None) -> RematProblem:
    """Read a networkx node-link graph (Checkmate or random layered) as a problem.

    Parameters
    ----------
    path : str or PathLike
        A ``.json`` (or ``.json.gz``) file, e.g. Checkmate's
        ``vgg16_b256_train.json`` as exported by Moccasin.
    bandwidth_bytes_per_s : float, optional
        Host<->device bandwidth each way, bytes per second (per cost unit);
        the :class:`DeviceProfile` default (55e9) if ``None``.

    Returns
    -------
    RematProblem
        One node and one tensor per graph node, in eager order; outputs are
        the sinks; times in relative cost units treated as seconds.

    Raises
    ------
    FileNotFoundError
        No such file.
    ProblemFileError
        Not valid JSON, not a node-link graph of a known format, a bad node
        field (``field`` names it) or a cycle; the message names the file.
    """
    return remat_graph_from_dict(read_json(path), path=str(path), bandwidth_bytes_per_s=bandwidth_bytes_per_s)


def load_problem_any(path: str | os.PathLike, *, bandwidth_bytes_per_s: float | None = None) -> RematProblem:
    """Read a libra-opt problem file or a node-link remat graph, by content.

    A JSON object whose ``schema`` is ``"libra-opt/remat-problem"`` is read
    with :func:`~libra_opt.problem_io.problem_from_dict`; one with ``nodes`` and
    ``links`` with :func:`load_remat_graph`.

    Parameters
    ----------
    path : str or PathLike
        ``.json`` or ``.json.gz``.
    bandwidth_bytes_per_s : float, optional
        Only for remat graphs (see :func:`load_remat_graph`); a problem file
        has its own device profile, and passing it there raises.

    Returns
    -------
    RematProblem

    Raises
    ------
    FileNotFoundError
        No such file.
    ProblemFileError
        Neither format, or the format's own errors; the message names the file.
    """
    d = read_json(path)
    if is_problem_dict(d):
        if bandwidth_bytes_per_s is not None:
            raise ProblemError(f"{path} is a libra-opt problem with its own device profile; do not pass "
                               f"bandwidth_bytes_per_s (use problem.with_device(...) to change it)")
        return problem_from_dict(d, source=str(path))
    if isinstance(d, dict) and "nodes" in d and "links" in d:
        return remat_graph_from_dict(d, path=str(path), bandwidth_bytes_per_s=bandwidth_bytes_per_s)
    if isinstance(d, dict) and "schema" in d:
        return problem_from_dict(d, source=str(path))  # raises naming the schema field
    keys = sorted(d)[:8] if isinstance(d, dict) else type(d).__name__
    raise ProblemFileError(f"{path}: neither a libra-opt problem (schema 'libra-opt/remat-problem') nor a "
                           f"networkx node-link graph (nodes + links); found {keys}", "schema")
