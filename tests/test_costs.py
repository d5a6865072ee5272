"""Executor cost models (libra_opt.passes.costs): a recomputed pointwise op priced by
the bytes it moves under the Inductor executor, unchanged under eager."""
import dataclasses
import gzip
import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch

from libra_opt import load_problem, solve
from libra_opt.passes.costs import bytes_moved, for_executor, is_fusible_op, recompute_times
from libra_opt.errors import ProblemError
from libra_opt.ir.problem import BACKWARD, ProblemBuilder
from libra_opt.ir.problem_io import problem_from_dict, problem_to_dict, save_problem
from libra_opt.ir.schedule import Compute, Free, Schedule
from libra_opt.passes.simulator import simulate

PROBLEMS = os.path.join(os.path.dirname(__file__), os.pardir, "problems")
BW = 1e12  # bytes per second


def chain_problem():
    """x -> mm -> a -> relu -> b -> (backward) g1(b) -> g2(a, g1): relu is pointwise.

    a and b are 1,000 float32 elements (4,000 bytes) each; relu's measured time
    is 10 us, its bytes moved 8,000 -> 8 ns at 1 TB/s."""
    bld = ProblemBuilder()
    x = bld.input("x", 4000, shape=(1000,), dtype="float32")
    (a,) = bld.op("mm", [x], [("a", 4000, None, (1000,), "float32")], time_s=50e-6, target="aten.mm.default")
    (b,) = bld.op("relu", [a], [("b", 4000, None, (1000,), "float32")], time_s=10e-6,
                  target="aten.relu.default", pointwise=True)
    (g1,) = bld.op("g1", [b], [("g1", 4000)], time_s=20e-6, phase=BACKWARD, target="aten.mm.default")
    (g2,) = bld.op("g2", [a, g1], [("g2", 4000)], time_s=20e-6, phase=BACKWARD, target="aten.mm.default")
    return bld.build(outputs=[g2]).with_device(memory_bytes_per_s=BW), (a, b, g1, g2)


def recompute_plan(p, ids):
    """Free b after the forward, recompute relu before g1."""
    a, b, g1, g2 = ids
    return Schedule([Compute(0), Compute(1), Free(b), Compute(1), Compute(2), Free(b), Compute(3), Free(a),
                     Free(g1)])


def test_pointwise_recompute_costs_its_bytes_under_inductor():
    p, ids = chain_problem()
    q = for_executor(p, "inductor")
    assert q.executor == "inductor" and p.executor == "eager"
    assert bytes_moved(p, 1) == 8000
    assert list(recompute_times(p)) == [n.time_s for n in p.nodes]
    rt = recompute_times(q)
    assert rt[1] == pytest.approx(8000 / BW)                         # relu: bytes / bandwidth
    assert list(rt[[0, 2, 3]]) == [50e-6, 20e-6, 20e-6]               # compute-bound ops keep their time
    # never above the measured time: a slow bandwidth leaves relu at its 10 us
    slow = for_executor(p, "inductor", memory_bytes_per_s=1.0)
    assert recompute_times(slow)[1] == 10e-6


def test_executor_changes_a_recomputing_plan_and_not_the_no_remat_plan():
    p, ids = chain_problem()
    q = for_executor(p, "inductor")
    assert simulate(q).time_s == simulate(p).time_s == pytest.approx(p.total_compute_s)
    plan = recompute_plan(p, ids)
    eager, fused = simulate(p, plan), simulate(q, plan)
    assert eager.recompute_s == pytest.approx(10e-6) and eager.added_s == pytest.approx(10e-6)
    assert fused.recompute_s == pytest.approx(8000 / BW)
    assert fused.time_s == pytest.approx(p.total_compute_s + 8000 / BW)
    assert fused.peak_bytes == eager.peak_bytes                        # memory is the executor's concern not


def test_for_executor_checks_its_arguments():
    p, _ = chain_problem()
    with pytest.raises(ProblemError, match="unknown executor"):
        for_executor(p, "tvm")
    bare = p.with_device(memory_bytes_per_s=None)
    with pytest.raises(ProblemError, match="memory_bytes_per_s"):
        for_executor(bare, "inductor")
    with pytest.raises(ProblemError, match="positive"):
        for_executor(p, "inductor", memory_bytes_per_s=0.0)
    assert for_executor(p, "eager") is p
    assert for_executor(bare, "inductor", memory_bytes_per_s=BW).device.memory_bytes_per_s == BW


def test_is_fusible_op_follows_the_min_cut_partitioner():
    aten = torch.ops.aten
    for op in (aten.add.Tensor, aten.mul.Tensor, aten.gelu.default, aten._to_copy.default, "aten.tanh.default",
               "aten.sum.dim_IntList"):
        assert is_fusible_op(op), op
    for op in (aten.mm.default, aten.addmm.default, aten.convolution.default, aten.native_dropout.default,
               aten.view.default, "aten.bmm.default", "not.an.op", "aten.no_such_op.default"):
        assert not is_fusible_op(op), op


def test_old_problem_files_load_and_new_fields_round_trip(tmp_path):
    path = os.path.join(PROBLEMS, "gpt2-tiny-b2-s32-cpu.json.gz")
    with gzip.open(path, "rt") as f:
        raw = json.load(f)
    assert "pointwise" not in raw["nodes"][0] and "memory_bytes_per_s" not in raw["device"]
    old = load_problem(path)
    assert old.executor == "eager" and old.device.memory_bytes_per_s is None
    assert not any(n.pointwise for n in old.nodes)
    # priced for inductor, the flags come from the node targets; saving and loading keeps all of it
    q = for_executor(old, "inductor", memory_bytes_per_s=BW)
    flagged = [n for n in q.nodes if n.pointwise]
    assert flagged and all(is_fusible_op(n.target) for n in flagged)
    back = load_problem(save_problem(q, tmp_path / "q.json.gz"))
    assert back.executor == "inductor" and back.device.memory_bytes_per_s == BW
    assert back.nodes == q.nodes
    assert list(back.recompute_time) == list(q.recompute_time)
    with pytest.raises(ProblemError, match="executor"):
        problem_from_dict({**problem_to_dict(q), "executor": "tvm"})


def test_eager_plans_do_not_depend_on_the_pointwise_flags():
    """The eager cost model ignores the new flags: libra's plans are the ones it
    made before (instruction lists compared)."""
    p = load_problem(os.path.join(PROBLEMS, "gpt2-tiny-b2-s32-cpu.json.gz"))
    flagged = p.replace(nodes=[dataclasses.replace(n, pointwise=is_fusible_op(n.target)) for n in p.nodes])
    flagged = flagged.with_device(memory_bytes_per_s=BW)
    for budget in (0.95, 0.9):
        assert solve(p, budget, "libra").schedule == solve(flagged, budget, "libra").schedule


def test_libra_plans_and_the_simulator_agree_under_inductor():
    p = load_problem(os.path.join(PROBLEMS, "gpt2-tiny-b2-s32-cpu.json.gz"))
    q = for_executor(p, "inductor", memory_bytes_per_s=BW)
    r = solve(q, 0.9, "libra", policy="recompute")
    sim = simulate(q, r.schedule)
    assert r.time_s == pytest.approx(sim.time_s) and sim.peak_bytes <= r.peak_bytes
    # the same plan priced as eager runs it is no cheaper
    assert simulate(p, r.schedule).time_s >= sim.time_s


def test_checkmate_objective_prices_recomputes_by_the_executor():
    from libra_opt.solvers.checkmate.model import CheckmateGraph

    p, _ = chain_problem()
    q = for_executor(p, "inductor")
    g = CheckmateGraph.from_problem(q)
    assert list(g.cost_s) == [n.time_s for n in q.nodes]           # first computations: measured
    assert list(g.recompute_cost_s) == list(q.recompute_time)      # recomputations: the executor's price
    assert g.recompute_cost_s[1] < g.cost_s[1]


def test_cli_prices_a_problem_file_for_an_executor(tmp_path, capsys):
    from libra_opt.cli import main

    p, _ = chain_problem()
    path = save_problem(p.with_device(memory_bytes_per_s=None), tmp_path / "chain.json")
    assert main(["simulate", str(path), "--executor", "inductor"]) == 2
    assert "--memory-bandwidth" in capsys.readouterr().err
    assert main(["simulate", str(path), "--executor", "inductor", "--memory-bandwidth", "1e12"]) == 0
    assert main(["solve", str(path), "--budget", "100%", "--executor", "eager"]) == 0


@pytest.mark.cuda
def test_a_fused_pointwise_chain_costs_about_its_bytes_on_cuda():
    """The inductor price of a pointwise chain (bytes moved / measured
    bandwidth) against the chain compiled by Inductor and timed."""
    import statistics

    from libra_opt.frontend.profiling import measure_memory_bandwidth

    bw = measure_memory_bandwidth("cuda")
    x = torch.randn(64 * 2**20, device="cuda")          # 256 MiB
    f = torch.compile(lambda x: (torch.relu(x) * 2 + 1).tanh())
    f(x)
    samples = []
    for _ in range(10):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        f(x)
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) / 1e3)
    estimate = 2 * x.nbytes / bw                        # fused: x read once, the result written once
    assert 0.5 * estimate <= statistics.median(samples) <= 2.0 * estimate
