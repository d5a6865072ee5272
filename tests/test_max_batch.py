"""``libra-opt max-batch``: the OOM-safe search, the no-CUDA refusal, the
simulated prediction, and the reference training methods (CPU)."""
from __future__ import annotations

import math

import pytest
import torch

from libra_opt.errors import InfeasibleBudgetError, LibraOptError
from libra_opt.apps.batch_search import Trial, oom_safe, search_max_batch
from libra_opt.apps.max_batch import max_batch, predict_max_batch, scale_problem
from libra_opt.apps.train_methods import fixed_memory_bytes, make_train_step, solver_budget


# ------------------------------------------------------------------ search
class FakeGPU:
    """A step that "runs out of memory" above ``max_ok``, like a real one:
    by raising ``torch.OutOfMemoryError``."""

    def __init__(self, max_ok: int):
        self.max_ok = max_ok
        self.calls: list[int] = []

    def __call__(self, batch: int):
        self.calls.append(batch)
        if batch > self.max_ok:
            raise torch.OutOfMemoryError(f"CUDA out of memory. Tried to allocate {batch} GiB")
        return {"peak": batch}


@pytest.mark.parametrize("max_ok", [1, 2, 3, 5, 7, 8, 9, 63, 64, 65, 100, 1000])
def test_search_finds_exactly_the_largest_fitting_batch(max_ok):
    step = FakeGPU(max_ok)
    res = search_max_batch(oom_safe(step))
    assert res.batch == max_ok
    assert res.first_failure == max_ok + 1
    # exponential then binary: about 2 log2(max) probes, never a batch probed twice
    assert len(step.calls) == len(set(step.calls))
    assert len(step.calls) <= 2 * math.ceil(math.log2(max_ok + 1)) + 2
    ok = [t for t in res.trials if t.fits]
    assert all(t.batch <= max_ok for t in ok) and all(t.batch > max_ok for t in res.trials if not t.fits)
    assert res.trial(max_ok).info == {"peak": max_ok}
    assert "out of memory" in res.trial(max_ok + 1).reason


def test_search_when_nothing_fits_and_from_a_larger_start():
    assert search_max_batch(oom_safe(FakeGPU(0))).batch == 0
    # start above the maximum: binary search below it
    step = FakeGPU(5)
    res = search_max_batch(oom_safe(step), start=16)
    assert res.batch == 5 and step.calls[0] == 16


def test_search_stops_at_the_limit():
    res = search_max_batch(lambda b: True, limit=40)
    assert res.batch == 40 and res.limit_reached
    assert [t.batch for t in res.trials] == [1, 2, 4, 8, 16, 32, 40]



@pytest.mark.parametrize("max_ok", [0, 1, 2, 7, 64, 100, 368, 1000])
@pytest.mark.parametrize("error", [-0.6, -0.1, -0.03, 0.0, 0.03, 0.1, 0.6])
def test_guided_search_finds_the_maximum_from_any_guess(max_ok, error):
    """With a guess (a prediction off by ``error``) the search is still exact, never probes a batch
    twice, and with a guess within 10 % it needs fewer probes than the search from 1."""
    guess = max(1, round(max_ok * (1 + error)))
    calls, plain_calls = [], []   # a bare predicate: oom_safe's OOM handling is tested above

    def fits(b, log=calls):
        log.append(b)
        return b <= max_ok

    res = search_max_batch(fits, guess=guess)
    assert res.batch == max_ok
    assert calls[0] == guess and len(calls) == len(set(calls))
    assert all(t.batch <= max_ok for t in res.trials if t.fits)
    assert all(t.batch > max_ok for t in res.trials if not t.fits)
    search_max_batch(lambda b: fits(b, plain_calls))
    if max_ok >= 64 and abs(error) <= 0.1:
        assert len(calls) < len(plain_calls), (calls, plain_calls)


def test_guided_search_respects_the_limit():
    res = search_max_batch(lambda b: True, guess=30, limit=40)
    assert res.batch == 40 and res.limit_reached
    assert max(t.batch for t in res.trials) == 40
    res = search_max_batch(lambda b: b <= 12, guess=100, limit=50)
    assert res.batch == 12 and res.trials[0].batch == 50
    with pytest.raises(ValueError):
        search_max_batch(lambda b: True, guess=0)


def test_search_accepts_bools_and_rejects_bad_arguments():
    assert search_max_batch(lambda b: b <= 11).batch == 11
    with pytest.raises(ValueError):
        search_max_batch(lambda b: True, start=0)
    with pytest.raises(ValueError):
        search_max_batch(lambda b: True, start=8, limit=4)


def test_oom_safe_counts_infeasible_budget_as_no_fit_and_reraises_other_errors():
    def no_plan(b):
        raise InfeasibleBudgetError(100, 200, "libra")

    t = oom_safe(no_plan)(3)
    assert isinstance(t, Trial) and not t.fits and "no plan" in t.reason

    def bug(b):
        raise KeyError("a real bug")

    with pytest.raises(KeyError):
        oom_safe(bug)(1)
    # cuBLAS reports an allocation failure as a RuntimeError
    assert not oom_safe(lambda b: (_ for _ in ()).throw(RuntimeError("CUBLAS_STATUS_ALLOC_FAILED")))(1).fits


# ------------------------------------------------------------- no CUDA
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_max_batch_without_cuda_refuses_clearly():
    with pytest.raises(LibraOptError, match="max-batch needs a CUDA GPU for a hard cap"):
        max_batch("gpt2-tiny", "16GiB", "libra")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_cli_max_batch_without_cuda_exits_with_the_message(capsys):
    from libra_opt.cli import main

    assert main(["max-batch", "--model", "gpt2-tiny", "--memory", "16GiB"]) == 2
    assert "needs a CUDA GPU for a hard cap" in capsys.readouterr().err


# ------------------------------------------------------------ budget maths
def test_fixed_memory_and_solver_budget():
    model = torch.nn.Sequential(torch.nn.Linear(10, 20), torch.nn.BatchNorm1d(20))
    x = torch.zeros(4, 10)
    f = fixed_memory_bytes(model, (x,))
    params = (10 * 20 + 20 + 20 + 20) * 4
    buffers = (20 + 20) * 4 + 8  # running mean, var, num_batches_tracked (int64)
    assert f["parameters"] == params and f["buffers"] == buffers
    assert f["optimizer_state"] == 2 * params and f["inputs"] == 4 * 10 * 4
    assert f["total"] == params + buffers + 2 * params + 160
    assert solver_budget(1000, 300, 0.1) == 600
    assert solver_budget(1000, 300, 50) == 650
    with pytest.raises(InfeasibleBudgetError):
        solver_budget(1000, 990, 0.05)


# ------------------------------------------------------ reference methods
@pytest.mark.parametrize("method", ["none", "checkpoint", "save-on-cpu"])
def test_reference_methods_train_like_eager(method):
    """Per-block checkpointing and save-on-cpu change where activations live,
    not the maths: the same losses as eager over two AdamW steps."""
    from libra_opt.apps.zoo import build_model

    ref = make_train_step("none", build_model("gpt2-tiny", 2, 16))
    other = make_train_step(method, build_model("gpt2-tiny", 2, 16))
    for _ in range(2):
        a, b = ref(), other()
        assert a == pytest.approx(b, rel=1e-5)


def test_checkpoint_wraps_the_repeated_blocks():
    from libra_opt.apps.train_methods import _block_modules
    from libra_opt.apps.zoo import build_model

    assert len(_block_modules(build_model("gpt2-tiny", 1, 8).model)) == 2
    assert len(_block_modules(build_model("resnet-tiny", 1, 32).model)) == 2  # basic blocks 1-1


# ---------------------------------------------------------- --simulate
@pytest.fixture(scope="module")
def tiny_profiles():
    from libra_opt.frontend.profiling import profile

    return tuple(profile("gpt2-tiny", batch=b, seq=32, device="cpu", warmup=0, repeats=1, progress=False)
                 for b in (2, 4))


def test_scale_problem_is_linear_in_the_batch(tiny_profiles):
    from libra_opt.passes.simulator import no_remat_peak

    p2, p4 = tiny_profiles
    assert [t.nbytes for t in scale_problem(p2, 2, p4, 4, 4).tensors] == [t.nbytes for t in p4.tensors]
    p8 = scale_problem(p2, 2, p4, 4, 8)
    for a, b, c in zip(p2.tensors, p4.tensors, p8.tensors):
        assert c.nbytes == max(0, b.nbytes + 2 * (b.nbytes - a.nbytes))  # slope per 2 batches
    assert p8.fixed.parameters_bytes == p4.fixed.parameters_bytes
    assert p8.fixed.inputs_bytes == 3 * p4.fixed.inputs_bytes - 2 * p2.fixed.inputs_bytes  # v2 + 2 (v4 - v2)
    assert no_remat_peak(p8) > no_remat_peak(p4)


def test_simulate_predicts_libra_batch_at_least_eager(tiny_profiles):
    from libra_opt.passes.simulator import no_remat_peak

    p2, p4 = tiny_profiles
    # a cap where eager fits a batch of about 8: fixed memory + 8/4 of batch 4's peak, plus the reserve
    cap = int((p4.fixed.resident_bytes + 2 * no_remat_peak(p4)) / 0.95)
    eager = predict_max_batch("gpt2-tiny", cap, "none", seq=32, problems=tiny_profiles, progress=False)
    assert eager.predicted and eager.batch >= 4
    # eager's answer is right by the simulator: it fits, one more does not
    budget = cap - int(0.05 * cap)
    at = scale_problem(p2, 2, p4, 4, eager.batch)
    assert no_remat_peak(at) + at.fixed.resident_bytes <= budget
    above = scale_problem(p2, 2, p4, 4, eager.batch + 1)
    assert no_remat_peak(above) + above.fixed.resident_bytes > budget
    planned = predict_max_batch("gpt2-tiny", cap, "libra", seq=32, problems=tiny_profiles, progress=False)
    assert planned.batch >= eager.batch
    assert planned.peak_bytes <= budget and planned.samples_per_s > 0
    assert "PREDICTION" in planned.summary()
    # a guided search (as the headline benchmark runs it from a prediction) gives the same answer
    for guess in (1, planned.batch, 3 * planned.batch):
        again = predict_max_batch("gpt2-tiny", cap, "libra", seq=32, problems=tiny_profiles, progress=False,
                                  guess=guess)
        assert again.batch == planned.batch and again.search.trials[0].batch == guess


def test_simulate_refuses_pytorch_reference_methods(tiny_profiles):
    with pytest.raises(LibraOptError, match="not PyTorch's"):
        predict_max_batch("gpt2-tiny", "1GiB", "checkpoint", problems=tiny_profiles, progress=False)


def test_oom_wrapped_by_another_exception_still_counts_as_no_fit():
    def compiled_step(b):
        try:
            raise torch.OutOfMemoryError("CUDA out of memory")
        except torch.OutOfMemoryError as e:
            raise ValueError("backend compiler failed") from e

    assert not oom_safe(compiled_step)(2).fits


# ------------------------------------------- memory as measured (issue 11)
def test_memory_cap_resolves_the_device_index(monkeypatch):
    """``set_per_process_memory_fraction`` needs an index: ``"cuda"`` is the current device."""
    from libra_opt.apps.max_batch import memory_cap

    calls = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 2)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: calls.append(("props", i)) or
                        type("P", (), {"total_memory": 80 << 30})())

    def fraction(f, device):
        if not isinstance(device, int):
            raise ValueError(f"Expected a cuda device with a specified index or an integer, but got {device}")
        calls.append(("fraction", f, device))

    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", fraction)
    with memory_cap(16 << 30, "cuda") as total:
        assert total == 80 << 30
    with memory_cap(8 << 30, torch.device("cuda:1")):
        pass
    assert calls == [("props", 2), ("fraction", 0.2, 2), ("fraction", 1.0, 2),
                     ("props", 1), ("fraction", 0.1, 1), ("fraction", 1.0, 1)]
    with pytest.raises(LibraOptError, match="above the GPU's total memory"):
        with memory_cap(100 << 30, "cuda"):
            pass


def test_adamw_state_created_up_front_is_the_state_its_first_step_creates():
    from libra_opt.apps.train_methods import init_optimizer_state

    torch.manual_seed(0)
    a = torch.nn.Linear(8, 8)
    b = torch.nn.Linear(8, 8)
    b.load_state_dict(a.state_dict())
    oa, ob = torch.optim.AdamW(a.parameters(), lr=1e-2), torch.optim.AdamW(b.parameters(), lr=1e-2)
    kept = torch.ones_like(a.weight)
    a.weight.grad = kept                                   # a gradient the user keeps
    assert init_optimizer_state(oa) == 2 and init_optimizer_state(oa) == 0
    assert a.weight.grad is kept and a.bias.grad is None
    assert torch.equal(a.weight, b.weight) and oa.param_groups[0]["lr"] == 1e-2
    assert set(oa.state[a.weight]) == {"step", "exp_avg", "exp_avg_sq"}
    a.weight.grad = None
    x = torch.randn(4, 8)
    for _ in range(2):
        for m, o in ((a, oa), (b, ob)):
            m(x).square().sum().backward()
            o.step()
            o.zero_grad()
    assert torch.equal(a.weight, b.weight) and torch.equal(oa.state[a.weight]["exp_avg_sq"],
                                                          ob.state[b.weight]["exp_avg_sq"])


@pytest.mark.parametrize("make", [lambda ps: torch.optim.Adam(ps, lr=1e-2, weight_decay=0.1),
                                  lambda ps: torch.optim.SGD(ps, lr=1e-2, momentum=0.9, weight_decay=0.1)],
                         ids=["adam-l2", "sgd-momentum-l2"])
def test_optimizer_state_created_up_front_trains_like_lazy_state_with_l2_decay(make):
    """An L2 weight decay adds ``decay * p`` to the zero gradient of the
    up-front step: the state must still be the lazy first step's."""
    from libra_opt.apps.train_methods import init_optimizer_state

    torch.manual_seed(0)
    a, b = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)
    b.load_state_dict(a.state_dict())
    oa, ob = make(a.parameters()), make(b.parameters())
    assert init_optimizer_state(oa) == 2
    x = torch.randn(4, 8)
    for _ in range(2):
        for m, o in ((a, oa), (b, ob)):
            m(x).square().sum().backward()
            o.step()
            o.zero_grad()
    assert torch.equal(a.weight, b.weight) and torch.equal(a.bias, b.bias)


def test_resident_memory_is_measured_with_the_optimizer_state_and_the_allocator_overhead():
    from libra_opt.runtime.memory import FakeCachingAllocator
    from libra_opt.apps.train_methods import measure_resident

    fake = FakeCachingAllocator.scaled(1024)
    with fake.tracking():
        model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.BatchNorm1d(64))
        x = torch.randn(32, 64)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        before = fake.allocated()
        res = measure_resident(model, opt, (x,), fake)
    params = sum(p.numel() * 4 for p in model.parameters())
    assert res.parameters == params and res.inputs == 32 * 64 * 4 and res.gradients == 0
    assert res.optimizer_state >= 2 * params                      # exp_avg, exp_avg_sq (+ step counters)
    assert res.allocated_bytes == fake.allocated() > before       # the state AdamW would create lazily is there
    assert res.allocated_bytes >= res.parameters + 2 * params + res.inputs   # measured: state included
    assert res.reserved_bytes == fake.reserved() and res.allocator_overhead == res.reserved_bytes - res.allocated_bytes
    assert res.allocator_overhead > 0                             # segments hold more than the blocks
    assert "optimizer state" in str(res)


def test_max_batch_plans_each_batch_from_small_profiles(tiny_profiles):
    """A probe's problem: the step captured at its batch (exact bytes) with op times extrapolated from the
    profiles at 2 and 4 (the unplanned step never runs there); the memory floor is checked first and names
    its op."""
    from libra_opt.frontend.capture import build_problem, capture
    from libra_opt.apps.max_batch import _scaled_builder, memory_floor
    from libra_opt.apps.zoo import build_model

    p2, p4 = tiny_profiles
    zm = build_model("gpt2-tiny", 8, 32)
    step = capture(zm.model, zm.args, zm.kwargs, loss_fn=zm.loss_fn)
    floors = {}
    p8 = _scaled_builder(tiny_profiles, (2, 4), 8, 1 << 40, "libra", floors)(step)
    assert [t.nbytes for t in p8.tensors] == [t.nbytes for t in build_problem(step).tensors]
    assert [n.time_s for n in p8.nodes] == pytest.approx([n.time_s for n in scale_problem(p2, 2, p4, 4, 8).nodes])
    f = memory_floor(p8)
    assert floors[8]["bytes"] == f["bytes"] > 0 and f["node"] in {n.name for n in p8.nodes}
    with pytest.raises(InfeasibleBudgetError, match=f"memory floor at batch 8: op {f['node']}"):
        _scaled_builder(tiny_profiles, (2, 4), 8, f["bytes"] - 1, "libra", {})(step)


def test_prediction_says_what_limits_the_batch(tiny_profiles):
    from libra_opt.passes.simulator import no_remat_peak

    p2, p4 = tiny_profiles
    cap = int((p4.fixed.resident_bytes + 2 * no_remat_peak(p4)) / 0.95)
    planned = predict_max_batch("gpt2-tiny", cap, "libra", seq=32, problems=tiny_profiles, progress=False)
    bad = planned.search.first_failure
    assert bad == planned.batch + 1
    floor = memory_floor_at(tiny_profiles, bad)
    if floor["bytes"] > cap - int(0.05 * cap) - scale_problem(p2, 2, p4, 4, bad).fixed.resident_bytes:
        assert planned.limit.startswith(f"the memory floor at batch {bad}: op {floor['node']}")
    else:
        assert planned.limit.startswith(f"batch {bad}: ")
    assert "limited by: " + planned.limit in planned.summary()


def memory_floor_at(profiles, batch):
    from libra_opt.apps.max_batch import memory_floor

    return memory_floor(scale_problem(profiles[0], 2, profiles[1], 4, batch))


def mlp_zoo(batch: int, device="cpu"):
    """A zoo entry for the end-to-end test: six tanh layers of 256 (fast to capture and compile)."""
    torch.manual_seed(0)
    layers = []
    for _ in range(6):
        layers += [torch.nn.Linear(256, 256), torch.nn.Tanh()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(256, 1)).to(device), (torch.randn(batch, 256, device=device),)


@pytest.mark.slow
def test_search_under_a_fake_cap_end_to_end(monkeypatch, one_intra_op_thread):
    """max-batch's whole probe against a capped fake caching allocator on the CPU: profiled at 2 and 4 only,
    planned from the captured step, calibrated (two measured steps), trained under the cap; nothing of a
    probe stays allocated; eager's search ends at an out-of-memory error that the result names."""
    import libra_opt.runtime.memory as mem
    from libra_opt.apps.max_batch import search_under_cap
    from libra_opt.runtime.memory import FakeCachingAllocator

    spec = f"{__name__}:mlp_zoo"
    cap = 3 << 20
    fake = FakeCachingAllocator.scaled(64, cap=cap)
    monkeypatch.setattr(mem, "memory_for", lambda device: fake)
    capped = (lambda module: fake.tracking(module))
    res = search_under_cap(spec, cap, "libra", memory=fake, capped=capped, device="cpu", progress=False,
                           guess=8, limit=8, time_repeats=1)
    assert res.batch == 8 and res.search.limit_reached and res.limit.startswith("the search limit")
    assert res.calibration and res.calibration[-1].fits
    assert res.reserved_peak_bytes <= cap and res.samples_per_s > 0
    assert res.resident.optimizer_state >= 2 * res.resident.parameters        # AdamW state, created up front
    assert "measured reserved peak" in res.summary() and "profiled at batches 2 and 4 only" in res.summary()
    assert fake.allocated() == 0                                              # no probe leaks its tensors
    small = FakeCachingAllocator.scaled(64, cap=2 << 20)          # gradients 1.5 MiB + activations
    eager = search_under_cap(spec, small.cap, "none", memory=small, capped=lambda module: small.tracking(module),
                             device="cpu", progress=False, limit=4096, time_repeats=1)
    bad = eager.search.first_failure
    assert eager.batch >= 1 and bad == eager.batch + 1 and eager.limit.startswith(f"batch {bad}: out of memory")
    assert all(t.info["reserved_peak_bytes"] <= small.cap for t in eager.search.trials if t.fits)


def test_cli_max_batch_passes_calibration_and_profile_batches_through(monkeypatch, capsys):
    """On a GPU the CLI calls max_batch with the closed loop on (--no-calibrate turns it off), the
    reserve left to max_batch's default, and the profiling batches; it prints the summary."""
    import libra_opt.apps.max_batch as mb
    from libra_opt.apps.batch_search import SearchResult
    from libra_opt.cli import main

    calls = []

    def fake_max_batch(model, memory, method, **kw):
        calls.append(kw)
        return mb.MaxBatchResult(model, method, 16 << 30, 7, 10.0, 0.7, False,
                                 SearchResult(7, (Trial(7, True), Trial(8, False, "out of memory"))),
                                 planned_peak_bytes=15 << 30, reserved_peak_bytes=(15 << 30) + (1 << 29),
                                 limit="batch 8: out of memory")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "fake GPU")
    monkeypatch.setattr(mb, "max_batch", fake_max_batch)
    assert main(["max-batch", "--model", "gpt2-tiny", "--memory", "16GiB", "--profile-batches", "3,6"]) == 0
    assert main(["max-batch", "--model", "gpt2-tiny", "--memory", "16GiB", "--no-calibrate", "--reserve", "1GiB"]) == 0
    assert calls[0]["calibrate"] is True and calls[0]["reserve"] is None and calls[0]["profile_batches"] == (3, 6)
    assert calls[1]["calibrate"] is False and calls[1]["reserve"] == 1 << 30
    out = capsys.readouterr().out
    assert "planned peak 15.00 GiB, measured reserved peak 15.50 GiB (cap 16.00 GiB)" in out
    assert "limited by: batch 8: out of memory" in out
