"""``libra_opt.frontend.profiling.problem_of``: the one model-to-problem pipeline
(capture, profile, device profile, build) that ``optimize``, ``profile``, the
demo and the headline benchmark share; and the core not importing the zoo."""
import ast
from pathlib import Path

import pytest
import torch

import libra_opt.optimize as opt
from libra_opt.frontend.capture import capture
from libra_opt.frontend.profiling import UNIT_TIME_S, ProfilingError, problem_of
from libra_opt.passes.simulator import simulate

ROOT = Path(__file__).resolve().parents[1]


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)), torch.randn(8, 16)


def _loss(out):
    return out.square().mean()


def test_problem_of_model_equals_problem_of_its_captured_step():
    model, x = _mlp()
    from_model = problem_of(model, x, loss_fn=_loss, profile=False, optimizer="sgd")
    from_step = problem_of(capture(model, (x,), {}, loss_fn=_loss), profile=False, optimizer="sgd")
    assert [(n.name, n.target, n.inputs, n.outputs) for n in from_model.nodes] == \
        [(n.name, n.target, n.inputs, n.outputs) for n in from_step.nodes]
    assert [t.nbytes for t in from_model.tensors] == [t.nbytes for t in from_step.tensors]
    assert all(n.time_s == UNIT_TIME_S for n in from_model.nodes)
    params = sum(q.numel() * 4 for q in model.parameters())
    assert from_model.fixed.optimizer_state_bytes == params      # sgd: 1x the parameters
    assert simulate(from_model).peak_bytes == simulate(from_step).peak_bytes
    assert opt.problem_of is problem_of                          # the old import path is the same function


def test_problem_of_profiles_and_records_provenance():
    model, x = _mlp()
    p = problem_of(model, (x,), loss_fn=_loss, warmup=0, repeats=1, name="mlp")
    assert p.name == "mlp"
    assert all(n.time_s > 0 for n in p.nodes)
    assert p.device.h2d_bytes_per_s > 0 and p.device.memory_bytes_per_s > 0
    extra = p.provenance.extra
    assert extra["timer"] == "perf_counter" and extra["repeats"] == 1 and extra["warmup"] == 0
    assert extra["optimizer"] == "adam" and "capture_passes" in extra
    assert extra["profile"]["calibration"] > 0


def test_problem_of_bad_input():
    model, x = _mlp()
    step = capture(model, (x,), {}, loss_fn=_loss)
    with pytest.raises(ProfilingError, match="already captured"):
        problem_of(step, (x,), profile=False)
    with pytest.raises(ProfilingError, match="optimizer"):
        problem_of(step, optimizer="lion")
    with pytest.raises(ProfilingError, match="nn.Module or a CapturedStep"):
        problem_of("gpt2-tiny")


def _imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            names.add("." * node.level + (node.module or ""))
    return names


def test_profiling_does_not_import_the_zoo():
    assert not any("zoo" in m for m in _imported_modules(ROOT / "libra_opt" / "frontend" / "profiling.py"))
