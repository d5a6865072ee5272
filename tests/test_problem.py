"""Invariants of the problem IR (:mod:`libra_opt.problem`): order, producers
before consumers, storages and views, and every kind of ProblemError."""
from __future__ import annotations

import dataclasses

import pytest

from libra_opt.errors import ProblemError
from libra_opt.ir.problem import (ACTIVATION, BACKWARD, FORWARD, INPUT, DeviceProfile, FixedMemory, Node,
                                  ProblemBuilder, RematProblem, Tensor)


def small():
    """x (input, 1000 B) -> a = f(x) 100 B -> v = view(a) -> b = g(v, x) 10 B [backward]; output b."""
    bld = ProblemBuilder()
    x = bld.input("x", 1000)
    (a,) = bld.op("f", [x], [("a", 100)], time_s=1.0)
    (v,) = bld.op("view", [a], [("v", 0, a)], time_s=0.0)
    (b,) = bld.op("g", [v, x], [("b", 10)], time_s=2.0, phase=BACKWARD, workspace_bytes=7)
    return bld.build(outputs=[b], fixed=FixedMemory(parameters_bytes=3))


def parts(p: RematProblem):
    return list(p.nodes), list(p.tensors), list(p.outputs)


def test_builder_problem_is_in_order_with_producers_before_consumers():
    p = small()
    assert [n.id for n in p.nodes] == [0, 1, 2]
    assert [t.id for t in p.tensors] == [0, 1, 2, 3]
    for n in p.nodes:
        for t in n.inputs:
            prod = p.tensors[t].producer
            assert prod is None or prod < n.id
        for t in n.outputs:
            assert p.tensors[t].producer == n.id
    # consumers are exactly the nodes that read each tensor, ascending
    assert p.tensors[0].consumers == (0, 2)  # x read by f and g
    assert p.tensors[1].consumers == (1,)    # a read by view
    assert p.tensors[2].consumers == (2,)    # v read by g
    assert p.tensors[3].consumers == ()


def test_views_share_storage_and_own_zero_bytes():
    p = small()
    a, v = p.tensors[1], p.tensors[2]
    assert not a.is_view and v.is_view
    assert v.storage == a.id and v.nbytes == 0
    assert p.storage_bytes(v.id) == 100 == p.storage_bytes(a.id)
    assert p.storage_views[a.id] == (1, 2)  # base first
    assert v.kind == ACTIVATION and p.tensors[0].kind == INPUT


def test_derived_quantities():
    p = small()
    assert p.boundary == 2                       # first backward node
    assert p.total_compute_s == 3.0              # 1 + 0 + 2
    assert list(p.node_time) == [1.0, 0.0, 2.0]
    assert p.input_bytes == 1000
    assert p.fixed.resident_bytes == 3
    assert p.node_by_name("g").id == 2
    with pytest.raises(KeyError, match="no node named 'nope'"):
        p.node_by_name("nope")
    q = p.with_device(h2d_bytes_per_s=5.0)
    assert q.device.h2d_bytes_per_s == 5.0 and q.nodes == p.nodes
    assert p.output_set == frozenset({3})


def test_a_problem_without_backward_has_boundary_at_the_end():
    bld = ProblemBuilder()
    (a,) = bld.op("f", [], [("a", 4)])
    p = bld.build([a])
    assert p.boundary == 1 and p.name == "problem"


def _set_node(nodes, i, **kw):
    nodes[i] = dataclasses.replace(nodes[i], **kw)


def _set_tensor(tensors, i, **kw):
    tensors[i] = dataclasses.replace(tensors[i], **kw)


def _swap_nodes(nodes, tensors, outputs):
    # g placed before view: ids no longer equal positions
    nodes[1], nodes[2] = nodes[2], nodes[1]


def _reads_later(nodes, tensors, outputs):
    # f (node 0) reads v, produced by node 1: not topological
    _set_node(nodes, 0, inputs=(0, 2))
    _set_tensor(tensors, 2, consumers=(0, 2))


def _consumers_wrong(nodes, tensors, outputs):
    _set_tensor(tensors, 1, consumers=(1, 2))


def _input_with_producer(nodes, tensors, outputs):
    # node 1 also produces y, marked as a graph input
    _set_node(nodes, 1, outputs=(2, 4))
    tensors.append(Tensor(4, "y", 1, (), 4, 8, kind=INPUT))


def _view_owns_bytes(nodes, tensors, outputs):
    _set_tensor(tensors, 2, nbytes=5)


def _view_of_view(nodes, tensors, outputs):
    # a second view w of v naming v (a view) as its storage
    nodes.append(Node(3, "view2", "view2", BACKWARD, 0.0, 0, True, (2,), (4,)))
    _set_tensor(tensors, 2, consumers=(2, 3))
    tensors.append(Tensor(4, "w", 3, (), 2, 0))


def _view_kind_differs(nodes, tensors, outputs):
    # v claims the storage of graph input x, but its node reads only a
    _set_tensor(tensors, 2, storage=0)


def _view_before_base(nodes, tensors, outputs):
    # base a produced by node 1 after its view (made by node 0)
    nodes[0] = Node(0, "mkview", "mkview", FORWARD, 0.0, 0, True, (0,), (1,))
    nodes[1] = Node(1, "mkbase", "mkbase", FORWARD, 0.0, 0, True, (), (2,))
    nodes[2] = dataclasses.replace(nodes[2], inputs=(1, 0))
    tensors[1] = Tensor(1, "v", 0, (2,), 2, 0)
    tensors[2] = Tensor(2, "a", 1, (), 2, 100)
    tensors[0] = dataclasses.replace(tensors[0], consumers=(0, 2))


INVALID = [
    ("node id differs from position", _swap_nodes, r"has id 2 but is at position 1"),
    ("unknown phase", lambda n, t, o: _set_node(n, 0, phase="sideways"), r"phase 'sideways'"),
    ("negative time", lambda n, t, o: _set_node(n, 0, time_s=-1.0), r"negative time or workspace"),
    ("negative workspace", lambda n, t, o: _set_node(n, 2, workspace_bytes=-1), r"negative time or workspace"),
    ("reads unknown tensor", lambda n, t, o: _set_node(n, 1, inputs=(9,)), r"reads unknown tensor 9"),
    ("consumer before producer", _reads_later, r"produced later.*not topological"),
    ("output not produced by node", lambda n, t, o: _set_node(n, 0, outputs=(1, 3)),
     r"lists output 3 whose producer is not this node"),
    ("tensor id differs from position", lambda n, t, o: _set_tensor(t, 3, id=7), r"has id 7 but is at position 3"),
    ("unknown kind", lambda n, t, o: _set_tensor(t, 3, kind="weird"), r"kind 'weird'"),
    ("input with a producer", _input_with_producer, r"'y': inputs have no producer and activations have one"),
    ("activation without producer", lambda n, t, o: t.append(Tensor(4, "z", None, (), 4, 8)),
     r"'z': inputs have no producer and activations have one"),
    ("producer does not list it", lambda n, t, o: _set_node(n, 2, outputs=()),
     r"names producer 2 which does not list it"),
    ("inconsistent consumers", _consumers_wrong, r"lists consumers \[1, 2\] but nodes \[1\] read it"),
    ("negative nbytes", lambda n, t, o: _set_tensor(t, 3, nbytes=-4), r"negative nbytes"),
    ("unknown storage", lambda n, t, o: _set_tensor(t, 3, storage=40), r"unknown storage 40"),
    ("view owns bytes", _view_owns_bytes, r"view 'v' owns 5 bytes"),
    ("view of a view", _view_of_view, r"itself a view; name the base"),
    ("view of a storage its node does not read", _view_kind_differs, r"reads no tensor on that storage"),
    ("view before base", _view_before_base, r"produced before its base"),
    ("output not a tensor", lambda n, t, o: o.append(99), r"output 99 is not a tensor id"),
]


@pytest.mark.parametrize("what, mutate, message", INVALID, ids=[c[0] for c in INVALID])
def test_every_invariant_violation_raises_problem_error(what, mutate, message):
    nodes, tensors, outputs = parts(small())
    mutate(nodes, tensors, outputs)
    with pytest.raises(ProblemError, match=message):
        RematProblem(nodes, tensors, outputs)


def test_the_unmutated_parts_are_valid():
    # guard for the table above: the base case itself passes validation
    nodes, tensors, outputs = parts(small())
    p = RematProblem(nodes, tensors, outputs, device=DeviceProfile(name="x"))
    assert p.device.name == "x" and len(p.nodes) == 3


def test_outputs_are_deduplicated_in_order():
    nodes, tensors, _ = parts(small())
    p = RematProblem(nodes, tensors, [3, 1, 3])
    assert p.outputs == (3, 1)


def test_replace_revalidates():
    p = small()
    with pytest.raises(ProblemError, match="output 12 is not a tensor id"):
        p.replace(outputs=[12])
    assert p.replace(name="renamed").name == "renamed"


def test_builder_view_of_a_graph_input_builds_a_valid_problem():
    from libra_opt.passes.simulator import simulate

    bld = ProblemBuilder()
    w = bld.input("w", 64)
    (wt,) = bld.op("t", [w], [("wt", 0, w)])
    (y,) = bld.op("mm", [wt], [("y", 8)], time_s=1.0)
    p = bld.build([y])
    # the view owns no bytes and the input is fixed memory: the only graph memory is y (8 B)
    assert p.tensors[wt].nbytes == 0 and simulate(p).peak_bytes == 8
