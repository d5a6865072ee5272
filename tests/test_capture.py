"""Capture (issue 2): joint graphs of real architectures, problem IR, and the
CPU allocation-tracker check of the simulated no-remat peak."""
from __future__ import annotations

import copy
import functools
import operator

import pytest
import torch
from torch import nn

from libra_opt.frontend.capture import build_problem, capture, node_phase
from libra_opt.errors import CaptureError
from libra_opt.ir.problem import BACKWARD, FORWARD, INPUT
from libra_opt.runtime.executor import StorageTracker, measure_joint_peak
from libra_opt.passes.simulator import simulate
from libra_opt.apps.zoo import build_model

pytestmark = pytest.mark.usefixtures("one_intra_op_thread")

#: (zoo name, batch, dropout): tiny configs, random weights, nothing downloaded
ARCHS = {
    "gpt2": ("gpt2-tiny", 4, 0.1),
    "bert": ("bert-tiny", 4, 0.1),
    "llama": ("llama-tiny", 4, 0.0),
    "vit": ("vit-tiny", 8, 0.1),
    "resnet": ("resnet-tiny", 8, 0.0),
}


@functools.lru_cache(maxsize=None)
def captured(arch: str):
    """(ZooModel, CapturedStep) of a tiny architecture, captured once per session
    (test_runtime.py imports this to share the captures)."""
    name, batch, dropout = ARCHS[arch]
    zm = build_model(name, batch, dropout=dropout, seed=0)
    step = capture(zm.model, zm.args, zm.kwargs, loss_fn=zm.loss_fn)
    return zm, step


@pytest.mark.parametrize("arch", list(ARCHS))
def test_capture_builds_valid_problem(arch):
    zm, step = captured(arch)
    p = build_problem(step)
    p.validate()
    joint_names = {n.name for n in step.joint.graph.nodes}
    calls = [n for n in step.joint.graph.nodes if n.op == "call_function" and n.target is not operator.getitem]
    # one problem node per call_function node (getitem folded), named after it, in graph order
    assert [n.name for n in p.nodes] == [n.name for n in calls]
    assert all(n.name in joint_names for n in p.nodes)
    # phases are contiguous: forward then backward, as default_partition splits them
    phases = [n.phase for n in p.nodes]
    assert phases == sorted(phases, key=lambda ph: ph == BACKWARD)
    assert FORWARD in phases and BACKWARD in phases
    # primals: every parameter and buffer of the model, then tangents
    n_params = len(list(zm.model.parameters()))
    assert step.primal_kinds.count("parameter") == n_params
    buffers = {id(b) for b in zm.model.buffers()}
    assert all(id(t) in buffers for t, k in zip(step.primals, step.primal_kinds) if k == "buffer")
    assert len(step.primals) + len(step.tangents) == len(step.joint.graph.find_nodes(op="placeholder"))
    # the step is model + loss: one scalar tangent of ones
    assert [tuple(t.shape) for t in step.tangents] == [()] and step.tangents[0].item() == 1.0
    # fixed memory: parameters counted once (tied weights share a storage), Adam = 2x trainable
    storages = {q.untyped_storage().data_ptr(): q.untyped_storage().nbytes() for q in zm.model.parameters()}
    assert p.fixed.parameters_bytes == sum(storages.values())
    assert p.fixed.optimizer_state_bytes == 2 * p.fixed.gradients_bytes
    # outputs: the loss and one gradient per parameter (at least)
    assert len(p.outputs) >= n_params + 1


@pytest.mark.parametrize("arch", list(ARCHS))
def test_no_remat_peak_matches_allocation_tracker(arch):
    """The simulated no-remat peak equals the peak of live storages when the
    joint graph runs with an fx.Interpreter freeing values after last use."""
    _, step = captured(arch)
    p = build_problem(step)
    sim = simulate(p).peak_bytes
    measured = measure_joint_peak(step).peak_bytes
    assert abs(measured - sim) <= 0.05 * sim, (measured, sim)


def test_views_share_storage_and_random_ops_replay_their_rng_state():
    _, step = captured("gpt2")
    p = build_problem(step)
    by_target = {}
    for n in p.nodes:
        by_target.setdefault(n.target, []).append(n)
    # aten.view of an activation is a view: 0 bytes, storage of its base
    views = [p.tensors[n.outputs[0]] for n in by_target["aten.view.default"]
             if p.tensors[p.tensors[n.outputs[0]].storage].kind != INPUT and n.outputs]
    assert views and all(t.nbytes == 0 for t in views if t.is_view)
    assert any(t.is_view for t in views)
    # _unsafe_view aliases its input (found by storage identity, not by schema)
    uv = [p.tensors[n.outputs[0]] for n in by_target.get("aten._unsafe_view.default", [])]
    assert uv and all(t.is_view and t.nbytes == 0 for t in uv)
    # dropout is seeded-random: recomputable by replaying the generator state saved just before it (a
    # tensor of its own, read by the dropout); the state-saving node itself is never recomputed
    drop = by_target["aten.native_dropout.default"]
    assert drop and all(n.recomputable for n in drop)
    states = by_target["libra.rng_state.default"]
    assert len(states) == len(drop) and not any(n.recomputable for n in states)
    for d in drop:
        saved = [p.tensors[t] for t in d.inputs if p.tensors[t].producer is not None
                 and p.nodes[p.tensors[t].producer].target == "libra.rng_state.default"]
        assert len(saved) == 1 and saved[0].nbytes == torch.get_rng_state().numel() and saved[0].dtype == "uint8"
    assert all(n.recomputable for n in by_target["aten.mm.default"])


def test_hand_computed_linear_step():
    """y = relu(x W^T), loss = y.sum(): bytes of each activation by hand."""
    torch.manual_seed(0)
    lin = nn.Linear(4, 3, bias=False)
    x = torch.randn(2, 4)
    step = capture(lin, (x,), loss_fn=lambda y: torch.relu(y).sum())
    p = build_problem(step, optimizer="sgd")
    assert step.primal_kinds == ["parameter", "input"]
    assert p.fixed.parameters_bytes == 3 * 4 * 4 and p.fixed.inputs_bytes == 2 * 4 * 4 + 4  # + scalar tangent
    assert p.fixed.optimizer_state_bytes == 48
    mm = next(n for n in p.nodes if n.target == "aten.mm.default" and n.phase == FORWARD)
    assert p.tensors[mm.outputs[0]].nbytes == 2 * 3 * 4
    relu = next(n for n in p.nodes if n.target == "aten.relu.default")
    assert p.tensors[relu.outputs[0]].nbytes == 2 * 3 * 4
    loss = next(n for n in p.nodes if n.target == "aten.sum.default")
    assert p.tensors[loss.outputs[0]].nbytes == 4
    # the weight gradient is an output: 48 bytes
    grads = [p.tensors[t] for t in p.outputs if p.tensors[t].shape == (3, 4)]
    assert grads and p.storage_bytes(grads[0].id) == 48
    assert abs(measure_joint_peak(step).peak_bytes - simulate(p).peak_bytes) == 0


def test_capture_leaves_buffers_and_rng_untouched():
    zm, _ = captured("resnet")
    model = copy.deepcopy(zm.model)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.get_rng_state()
    capture(model, zm.args, zm.kwargs, loss_fn=zm.loss_fn)
    assert torch.equal(rng, torch.get_rng_state())
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_capture_under_autocast_bf16():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 8))
    x = torch.randn(4, 16)
    step = capture(model, (x,), autocast_dtype=torch.bfloat16, loss_fn=lambda y: y.float().pow(2).mean())
    p = build_problem(step)
    assert step.autocast_dtype == torch.bfloat16
    assert any(t.dtype == "bfloat16" and t.kind != INPUT for t in p.tensors)
    assert p.provenance.dtype == "bfloat16"
    assert abs(measure_joint_peak(step).peak_bytes - simulate(p).peak_bytes) <= 0.05 * simulate(p).peak_bytes


class _PrintingModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        print("forward called")
        return self.lin(x)


class _BranchingModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        y = self.lin(x)
        if y.sum().item() > 0:
            return y * 2
        return y


def test_graph_break_print_raises_capture_error_naming_it():
    with pytest.raises(CaptureError, match="print"):
        capture(_PrintingModel(), (torch.randn(2, 4),), loss_fn=lambda y: y.sum())


def test_graph_break_item_branch_raises_capture_error_naming_it():
    with pytest.raises(CaptureError, match=r"item\(\)|data-dependent"):
        capture(_BranchingModel(), (torch.randn(2, 4),), loss_fn=lambda y: y.sum())


def test_node_phase_matches_problem_boundary():
    _, step = captured("llama")
    ph = node_phase(step.joint, step.num_fwd_outputs)
    p = build_problem(step)
    assert all(ph[n.name] == n.phase for n in p.nodes)
    assert all(ph[n.name] == BACKWARD for n in step.joint.graph.nodes if n.name.startswith("tangents"))


def test_storage_tracker_counts_views_once_and_frees():
    with StorageTracker() as tr:
        a = torch.empty(1000, dtype=torch.float32)      # 4000 bytes
        v = a.view(10, 100)                             # view: no bytes
        b = v.t().contiguous()                          # a copy: 4000 bytes
        assert tr.live_bytes == 8000
        del a
        assert tr.live_bytes == 8000                    # the view keeps the storage
        del v, b
        assert tr.live_bytes == 0
    assert tr.peak_bytes == 8000
