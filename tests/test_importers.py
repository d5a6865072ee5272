"""Importers of external graphs (:mod:`libra_opt.importers`) on node-link files the tests
write themselves (a mirrored Checkmate-format training graph from conftest.py and random layered
graphs of :mod:`libra_opt.generators`) and on small hand-made graphs."""
from __future__ import annotations

import json
import logging
import os

import pytest

from conftest import MIRRORED_SIZES_MIB, mirrored_checkmate_graph
from libra_opt.passes.bounds import memory_lower_bound
from libra_opt.errors import ProblemError, ProblemFileError
from libra_opt.frontend.generators import random_layered_graph, random_layered_graph_dict
from libra_opt.frontend.importers import load_problem_any, load_remat_graph
from libra_opt.ir.problem import BACKWARD, FORWARD
from libra_opt.ir.problem_io import load_problem, save_problem
from libra_opt.passes.simulator import simulate

#: name -> node-link object; the edge count of each is its number of links
GRAPHS = {
    "mirror_train.json": lambda: mirrored_checkmate_graph(),
    "random_layered_n60.json": lambda: random_layered_graph_dict(60, seed=3),
    "random_layered_n150.json": lambda: random_layered_graph_dict(150, width=0.43, seed=4),
}


def raw(path):
    with open(path) as f:
        return json.load(f)


def written(tmp_path, filename):
    d = GRAPHS[filename]()
    path = tmp_path / filename
    path.write_text(json.dumps(d))
    return str(path), d


@pytest.mark.parametrize("filename", list(GRAPHS))
def test_graph_counts_match_the_file(tmp_path, filename):
    path, d = written(tmp_path, filename)
    p = load_remat_graph(path)
    n_nodes, n_edges = len(d["nodes"]), len(d["links"])
    assert len(p.nodes) == n_nodes and len(p.tensors) == n_nodes
    # one tensor per node, read by each successor: the consumer lists are the edges
    assert sum(len(t.consumers) for t in p.tensors) == n_edges
    assert all(n.outputs == (n.id,) and len(n.inputs) == len(set(n.inputs)) for n in p.nodes)
    # outputs are the sinks
    assert list(p.outputs) == [t.id for t in p.tensors if not t.consumers]
    assert p.provenance.source == "import" and p.provenance.extra["file"] == filename
    r = simulate(p)
    assert r.peak_bytes > 0 and r.time_s == pytest.approx(p.total_compute_s)
    assert 0 < memory_lower_bound(p) <= r.peak_bytes


def test_checkmate_graph_mirrors_forward_and_backward(checkmate_graph_file):
    path = checkmate_graph_file
    p = load_remat_graph(path)
    d = raw(path)
    assert len(p.nodes) == 2 * len(MIRRORED_SIZES_MIB) + 1
    by_id = {n["id"]: n for n in d["nodes"]}
    for node in p.nodes:  # node ids are the eager order
        src = by_id[node.id]
        assert node.name == src["name"]
        assert node.time_s == float(src["cost_cpu"])
        assert p.tensors[node.id].nbytes == src["cost_ram"]
        assert node.phase == (BACKWARD if src["backward"] else FORWARD)
    # the forward part comes first, then the backward part
    phases = [n.phase for n in p.nodes]
    assert phases == sorted(phases, key=lambda ph: ph == BACKWARD)
    assert p.boundary == sum(not n["backward"] for n in d["nodes"])
    assert p.provenance.batch == 256  # from the name, Checkmate's "<model>_<batch>_(h, w)_train"
    # the edges of the file are exactly the inputs of the problem
    edges = {(e["source"], e["target"]) for e in d["links"]}
    assert {(i, n.id) for n in p.nodes for i in n.inputs} == edges


@pytest.mark.parametrize("filename", ["random_layered_n60.json", "random_layered_n150.json"])
def test_random_layered_graph_follows_the_graph_order(tmp_path, filename):
    path, d = written(tmp_path, filename)
    p = load_remat_graph(path)
    order = d["graph"]["order"]
    by_name = {n["name"]: n for n in d["nodes"]}
    assert [n.name for n in p.nodes] == [f"n{k}" for k in order]
    for node in p.nodes:
        src = by_name[order[node.id]]
        assert node.phase == FORWARD
        assert node.time_s == float(src["duration"])
        assert p.tensors[node.id].nbytes == src["out_cost"]
    assert p.fixed.parameters_bytes == sum(n["param_cost"] for n in d["nodes"])
    # the graph's target node is the sink, last in the order
    assert p.outputs == (len(order) - 1,) and order[-1] == d["graph"]["target_node"]
    assert p.boundary == len(p.nodes)


def test_bandwidth_sets_the_device(checkmate_graph_file):
    p = load_remat_graph(checkmate_graph_file, bandwidth_bytes_per_s=1e6)
    assert p.device.h2d_bytes_per_s == 1e6 == p.device.d2h_bytes_per_s
    with pytest.raises(ProblemError, match="bandwidth"):
        load_remat_graph(checkmate_graph_file, bandwidth_bytes_per_s=-1)


@pytest.mark.parametrize("filename", list(GRAPHS))
def test_load_problem_any_dispatches_and_round_trips(tmp_path, filename):
    path, _ = written(tmp_path, filename)
    p = load_problem_any(path)
    saved = save_problem(p, tmp_path / "p.json.gz")
    q = load_problem_any(saved)
    assert q.nodes == p.nodes and q.tensors == p.tensors and q.outputs == p.outputs
    assert q.provenance == p.provenance and q.device == p.device and q.fixed == p.fixed
    assert load_problem(saved).name == p.name


# ---------------------------------------------------------------- the generator
def test_generator_is_seeded_layered_and_documented():
    """Same seed, same graph; another seed, another graph; every edge runs from a layer to a
    later one (the ``order`` is layer by layer), skip edges are about ``skip_density`` of all edges,
    and every node lies on a path from the source to the sink."""
    import networkx as nx

    a = random_layered_graph_dict(120, seed=7)
    assert a == random_layered_graph_dict(120, seed=7)
    assert a != random_layered_graph_dict(120, seed=8)
    g = nx.DiGraph([(e["0"], e["1"]) for e in a["links"]])
    assert nx.is_directed_acyclic_graph(g) and g.number_of_nodes() == 120
    src, dst = a["graph"]["source_node"], a["graph"]["target_node"]
    assert set(nx.descendants(g, src)) | {src} == set(g.nodes) == set(nx.ancestors(g, dst)) | {dst}
    pos = {v: k for k, v in enumerate(a["graph"]["order"])}
    assert all(pos[u] < pos[v] for u, v in g.edges)
    depth = {}
    for v in a["graph"]["order"]:  # longest-path layer of each node
        depth[v] = max((depth[u] + 1 for u in g.predecessors(v)), default=0)
    skips = sum(depth[v] - depth[u] > 1 for u, v in g.edges)
    assert 0.05 < skips / g.number_of_edges() < 0.3
    assert all(n["out_cost"] >= 10 and n["out_cost"] % 10 == 0 and 0 <= n["duration"] <= 1000 for n in a["nodes"])
    p = random_layered_graph(120, seed=7)
    assert len(p.nodes) == 120 and p.boundary == len(p.nodes) and p.name == a["graph"]["name"]
    assert p.total_compute_s == sum(n["duration"] for n in a["nodes"])


@pytest.mark.parametrize("bad, word", [(dict(n=2), "n must"), (dict(n=10.5), "n must"), (dict(width=0), "width"),
                                       (dict(edge_density=1.5), "edge_density"), (dict(skip_density=0.95), "skip"),
                                       (dict(width_variation=-0.1), "width_variation"),
                                       (dict(max_duration=-1), "max_duration"),
                                       (dict(mean_out_bytes=float("nan")), "mean_out_bytes")])
def test_generator_rejects_bad_parameters(bad, word):
    with pytest.raises(ProblemError, match=word):
        random_layered_graph(**(dict(n=50) | bad))


# ---------------------------------------------------------------- hand-made graphs
def checkmate_graph(nodes, edges):
    return {"directed": True, "multigraph": False, "graph": {"name": "tiny_8_(1, 1)_train"},
            "nodes": [dict(id=i, name=nm, backward=bw, cost_cpu=c, cost_ram=m) for i, nm, bw, c, m in nodes],
            "links": [{"source": s, "target": t} for s, t in edges]}


def write(tmp_path, d, name="g.json"):
    path = tmp_path / name
    path.write_text(json.dumps(d))
    return path


def test_hand_made_checkmate_graph(tmp_path):
    # 0 -> 1 -> 2(bwd) , 0 -> 2 ; two sinks? no: 2 is the only sink
    d = checkmate_graph([(0, "f", False, 2, 100), (1, "g", False, 3, 50), (2, "g_bwd", True, 4, 10)],
                        [(0, 1), (1, 2), (0, 2)])
    p = load_remat_graph(write(tmp_path, d))
    assert [n.inputs for n in p.nodes] == [(), (0,), (0, 1)]
    assert p.outputs == (2,) and p.boundary == 2 and p.provenance.batch == 8
    # no-remat peak by hand: f 100; g 100+50 = 150; g_bwd 150 + 10 = 160 (a and b freed after)
    assert simulate(p).peak_bytes == 160


def test_non_topological_ids_fall_back_to_a_topological_sort(tmp_path, caplog):
    # edge 1 -> 0 makes the node ids a non-topological order
    d = checkmate_graph([(0, "late", False, 1, 8), (1, "early", False, 1, 16)], [(1, 0)])
    with caplog.at_level(logging.WARNING, logger="libra_opt.frontend.importers"):
        p = load_remat_graph(write(tmp_path, d))
    assert [n.name for n in p.nodes] == ["early", "late"]
    assert "not a topological order" in caplog.text


def test_random_layered_order_that_is_not_topological_is_replaced(tmp_path, caplog):
    d = {"directed": True, "multigraph": False, "graph": {"name": "r", "order": [1, 0]},
         "nodes": [dict(name=0, duration=1, out_cost=5, param_cost=2), dict(name=1, duration=2, out_cost=6,
                                                                             param_cost=3)],
         "links": [{"0": 0, "1": 1}]}
    with caplog.at_level(logging.WARNING, logger="libra_opt.frontend.importers"):
        p = load_remat_graph(write(tmp_path, d))
    assert [n.name for n in p.nodes] == ["n0", "n1"] and "'order'" in caplog.text
    assert p.fixed.parameters_bytes == 5 and p.outputs == (1,)


def test_duplicate_names_are_made_unique(tmp_path):
    d = checkmate_graph([(0, "conv", False, 1, 8), (1, "conv", False, 1, 8)], [(0, 1)])
    p = load_remat_graph(write(tmp_path, d))
    assert [n.name for n in p.nodes] == ["conv", "conv#1"]


@pytest.mark.parametrize("mutate, field, message", [
    (lambda d: d["nodes"][1].pop("cost_ram"), "nodes[1].cost_ram", "has no 'cost_ram'"),
    (lambda d: d["nodes"][0].update(cost_cpu="slow"), "nodes[0].cost_cpu", "non-negative finite number"),
    (lambda d: d["nodes"][0].update(cost_ram=1.5), "nodes[0].cost_ram", "non-negative integer"),
    (lambda d: d["nodes"][0].update(backward="no"), "nodes[0].backward", "true or false"),
    (lambda d: d.update(directed=False), "directed", "directed"),
    (lambda d: d.pop("links"), "links", "'links'"),
    (lambda d: d.update(nodes=[{"id": 0, "colour": 1}]), "nodes[0]", "unknown node format"),
    (lambda d: d["links"].append({"source": 1}), "links[1]", "'target'"),
])
def test_bad_graph_raises_naming_file_and_field(tmp_path, mutate, field, message):
    d = checkmate_graph([(0, "f", False, 2, 100), (1, "g", True, 3, 50)], [(0, 1)])
    mutate(d)
    path = write(tmp_path, d)
    with pytest.raises(ProblemFileError) as e:
        load_remat_graph(path)
    assert e.value.field == field and message in str(e.value) and str(path) in str(e.value)


def test_cycle_is_rejected(tmp_path):
    d = checkmate_graph([(0, "f", False, 2, 100), (1, "g", True, 3, 50)], [(0, 1), (1, 0)])
    path = write(tmp_path, d)
    with pytest.raises(ProblemFileError, match="cycle") as e:
        load_remat_graph(path)
    assert str(path) in str(e.value)


def test_load_problem_any_rejects_other_json(tmp_path):
    path = write(tmp_path, {"hello": 1})
    with pytest.raises(ProblemFileError, match="neither a libra-opt problem") as e:
        load_problem_any(path)
    assert str(path) in str(e.value)
    path = write(tmp_path, {"schema": "libra-opt/remat-problem", "version": 7}, "v7.json")
    with pytest.raises(ProblemFileError) as e:
        load_problem_any(path)
    assert e.value.field == "version"
