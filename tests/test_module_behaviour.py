"""An optimized module behaves like a module (issue 13): ``copy.deepcopy`` and a
pickle / ``torch.save`` round trip give an independent module that trains like
eager PyTorch and leaves the original untouched; ``state_dict`` keys are the
plain model's; ``no_grad`` / ``eval`` run at any batch size; data-dependent
ops and wrong inputs get clear errors."""
from __future__ import annotations

import copy
import io
import pickle

import pytest
import torch
from torch import nn

from libra_opt.errors import CaptureError, InputMismatchError, ShapeMismatchError
from libra_opt.optimize import optimize

pytestmark = pytest.mark.usefixtures("one_intra_op_thread")

BATCH = 8


class Net(nn.Module):
    """Linear -> BatchNorm (running statistics: buffers a stray copy would
    update) -> ReLU -> Linear -> ReLU -> Linear."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(16, 32)
        self.bn = nn.BatchNorm1d(32)
        self.mid = nn.Linear(32, 32)
        self.out = nn.Linear(32, 4)

    def forward(self, x):
        return self.out(self.mid(self.bn(self.inp(x)).relu()).relu())


def square_loss(y):
    """Module level, so that a module using it pickles."""
    return (y * y).mean()


def make(seed=0, solver="checkpoint-all", device="cpu", **kw):
    torch.manual_seed(seed)
    model = Net().to(device)
    x = torch.randn(BATCH, 16, device=device)
    om = optimize(model, x, 0.95, solver=solver, loss_fn=square_loss, profile=False, **kw)
    return model, om, x


def state(module):
    """A detached copy of every parameter and buffer, by the plain model's names."""
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def assert_trains_like_eager(om, ref, steps=2, seed=1):
    """``steps`` SGD steps of ``om`` and of the eager ``ref`` (same start): equal
    losses, gradients, parameters and BatchNorm statistics."""
    assert om.model is not ref
    opt = torch.optim.SGD(om.parameters(), lr=0.1, momentum=0.9)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x = torch.randn(BATCH, 16, generator=gen).to(om.device)
        loss = om(x)
        loss.backward()
        ref_loss = square_loss(ref(x))
        ref_loss.backward()
        assert torch.allclose(loss, ref_loss, rtol=1e-6, atol=1e-7)
        for (name, p), q in zip(om.model.named_parameters(), ref.parameters()):
            assert torch.allclose(p.grad, q.grad, rtol=1e-5, atol=1e-7), name
        opt.step(), ref_opt.step(), opt.zero_grad(), ref_opt.zero_grad()
    assert om.lowered is not None and (om.lowered.recomputed or om.lowered.swapped)   # the plan ran
    for k, v in state(om).items():
        assert torch.allclose(v.float(), ref.state_dict()[k].float(), rtol=1e-5, atol=1e-6), k


def test_deepcopy_trains_its_own_model_and_leaves_the_original_untouched():
    model, om, x = make()
    assert_trains_like_eager(om, copy.deepcopy(model), steps=1)      # the original has compiled and run
    before = state(om)
    twin = copy.deepcopy(om)
    ref = copy.deepcopy(model)
    assert twin.model is not om.model and twin.swap is not om.swap and twin.lowered is None
    assert_trains_like_eager(twin, ref)
    for k, v in state(om).items():                                   # parameters, BN statistics, counters
        assert torch.equal(v, before[k]), k
    with torch.no_grad():                                            # a teacher / EMA copy evaluates itself
        assert not torch.equal(twin(x), om(x))
    assert_trains_like_eager(om, copy.deepcopy(model), steps=1)      # the original still trains


@pytest.mark.cuda
def test_cuda_swap_plan_deepcopy_and_torch_save_get_their_own_streams_and_buffers():
    """On CUDA with a swap plan: the copy and the loaded module get their own
    transfer stream and pinned host pool, train like eager, and leave the
    original's parameters and statistics untouched."""
    model, om, x = make(solver="swap-all", device="cuda")
    assert om.plan.schedule.counts()["swap_out"] > 0
    assert_trains_like_eager(om, copy.deepcopy(model), steps=1)
    before = state(om)
    buf = io.BytesIO()
    torch.save(om, buf)
    buf.seek(0)
    for twin in (copy.deepcopy(om), torch.load(buf, weights_only=False)):
        assert twin.swap is not om.swap and twin.swap.pool is not om.swap.pool
        assert_trains_like_eager(twin, copy.deepcopy(model))
        assert twin.swap.d2h_bytes > 0
        for k, v in state(om).items():
            assert torch.equal(v, before[k]), k


@pytest.mark.parametrize("how", ["pickle", "torch.save"])
def test_pickle_round_trip_trains_like_the_original(how):
    model, om, _ = make()
    assert_trains_like_eager(om, copy.deepcopy(model), steps=1)
    before = state(om)
    if how == "pickle":
        loaded = pickle.loads(pickle.dumps(om))
    else:
        buf = io.BytesIO()
        torch.save(om, buf)
        buf.seek(0)
        loaded = torch.load(buf, weights_only=False)
    assert loaded.plan.schedule == om.plan.schedule and loaded.problem.nodes == om.problem.nodes
    assert_trains_like_eager(loaded, copy.deepcopy(model))
    for k, v in state(om).items():
        assert torch.equal(v, before[k]), k


def test_state_dicts_load_into_each_other_under_strict():
    model, om, x = make()
    plain = Net()
    assert list(om.state_dict()) == list(plain.state_dict())         # no "model." prefix
    plain.load_state_dict(om.state_dict(), strict=True)              # optimized -> plain
    other = Net()                                                    # another initialisation
    om.load_state_dict(other.state_dict(), strict=True)              # plain -> optimized
    for k, v in other.state_dict().items():
        assert torch.equal(model.state_dict()[k], v), k
    with pytest.raises(RuntimeError, match="Missing key"):
        om.load_state_dict({k: v for k, v in other.state_dict().items() if k != "bn.running_mean"})
    # as a submodule: the parent's keys are the plain model's under the parent's name
    holder, plain_holder = nn.Module(), nn.Module()
    holder.net, plain_holder.net = om, Net()
    assert list(holder.state_dict()) == list(plain_holder.state_dict())
    holder.load_state_dict(plain_holder.state_dict(), strict=True)
    plain_holder.load_state_dict(holder.state_dict(), strict=True)
    assert torch.equal(om.model.inp.weight, plain_holder.net.inp.weight)
    assert_trains_like_eager(om, copy.deepcopy(model), steps=1)      # loaded weights train under the plan


def test_no_grad_and_eval_run_at_another_batch_size_without_the_plan():
    model, om, x = make()
    small = x[:3]
    with torch.no_grad():                                            # a validation loop's last, smaller batch
        assert torch.equal(om(small), square_loss(model(small)))
    om.eval()
    with torch.no_grad():
        assert torch.equal(om(small), square_loss(model(small)))
    small_grad = small.clone().requires_grad_()
    with pytest.warns(UserWarning, match="without the plan"):      # eval with grad: eager autograd, said once
        om(small_grad).backward()
    ref_in = small.clone().requires_grad_()
    square_loss(copy.deepcopy(model).eval()(ref_in)).backward()
    assert torch.allclose(small_grad.grad, ref_in.grad)
    om.zero_grad()
    om.train()
    _, refusing, _ = make(max_shapes=1)
    with pytest.raises(ShapeMismatchError, match="plan was made for"):
        refusing(small)                                  # training at another shape, new shapes not planned: refused
    assert_trains_like_eager(om, copy.deepcopy(model), steps=1)


class StoresItem(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        y = self.lin(x)
        self.last_mean = y.mean().item()          # a logging habit: a Python number kept on the module
        return y.relu().sum()


class NonZero(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        y = self.lin(x)
        return y[torch.nonzero(y > 0, as_tuple=True)].sum()


class TwoInputs(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x, extra=None):
        y = self.lin(x).relu()
        return (y if extra is None else y + extra).sum()


@pytest.mark.parametrize("cls,match", [(StoresItem, r"\.item\(\).*self\.last_mean = y\.mean\(\)\.item\(\)"),
                                       (NonZero, r"torch\.nonzero: a tensor whose size depends on its values")])
def test_data_dependent_ops_fail_in_optimize_naming_the_op(cls, match):
    with pytest.raises(CaptureError, match=match):
        optimize(cls(), torch.randn(4, 8), 1.0, solver="none", profile=False)


def test_a_wrong_number_of_inputs_is_reported_as_such():
    om = optimize(TwoInputs(), torch.randn(4, 8), 1.0, solver="none", profile=False)
    x = torch.randn(4, 8)
    om(x).backward()
    with pytest.raises(InputMismatchError, match="missing a required argument: 'x'"):
        om()
    with pytest.raises(InputMismatchError, match=r"called with 2 distinct input tensor\(s\).*made for 1"):
        om(x, torch.randn(4, 8))


def test_package_optimize_is_callable_after_the_submodule_is_imported_by_name():
    """``import libra_opt.optimize`` binds the package attribute to the
    submodule; ``libra_opt.optimize(...)`` still plans the model."""
    import importlib

    import libra_opt

    importlib.import_module("libra_opt.optimize")
    torch.manual_seed(0)
    om = libra_opt.optimize(Net(), torch.randn(BATCH, 16), 1.0, profile=False)
    assert om.plan.peak_bytes <= om.plan.budget_bytes
    assert type(om).__name__ == "OptimizedModule"
