"""The device-memory interface and the closed loop (``optimize(calibrate=True)``):
a fake caching allocator that rounds, caches and splits like PyTorch's; the loop
converges within its bound, reports each iteration and fails with the smallest
budget that would work; on a real model (CPU) it leaves the user's state alone
and trains like eager PyTorch."""
from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch

from libra_opt.frontend.calibrate import CalibrationError, CalibrationStep, calibrate, measure_step, preserved_state
from libra_opt.errors import InfeasibleBudgetError
from libra_opt.runtime.memory import (CudaMemory, FakeCachingAllocator, TrackerMemory, configure_allocator,
                                      cuda_index, memory_for)

KiB = 1024


# ------------------------------------------------------------ fake allocator
def test_fake_allocator_rounds_caches_splits_and_coalesces():
    a = FakeCachingAllocator(round_bytes=512, small_size=1 * KiB, small_segment=2 * KiB, large_segment=20 * KiB,
                             min_large_alloc=10 * KiB, round_large=2 * KiB)
    assert a.malloc("x", 100) == 512                  # rounded up; small pool: a 2 KiB segment
    assert (a.allocated(), a.reserved()) == (512, 2 * KiB)
    assert a.malloc("y", 3000) == 3072                # large pool: a 20 KiB segment, split
    assert a.reserved() == 22 * KiB and a.segment_allocations == 2
    a.free("y")
    assert a.allocated() == 512 and a.reserved() == 22 * KiB      # cached, not released
    assert a.malloc("z", 5000) == 5120 and a.segment_allocations == 2  # reuses the cached segment
    a.free("z")
    assert len(a.segments[1].blocks) == 1 and a.segments[1].blocks[0].size == 20 * KiB  # coalesced again
    assert a.malloc("w", 12 * KiB) == 12 * KiB        # >= min_large_alloc: best fit is still the free 20 KiB block
    assert a.malloc("v", 16 * KiB) == 16 * KiB and a.reserved() == 38 * KiB   # own segment, rounded to 2 KiB
    assert a.peak_reserved() == 38 * KiB
    a.free("v"), a.free("w")
    a.empty_cache()                                    # releases the segments nothing lives in
    assert a.reserved() == 2 * KiB and a.allocated() == 512
    a.reset_peak()
    assert a.peak_reserved() == 2 * KiB
    # a remainder too small to split is handed out whole, and counted whole
    b = FakeCachingAllocator(round_bytes=512, small_size=1 * KiB, small_segment=2 * KiB, large_segment=20 * KiB,
                             min_large_alloc=10 * KiB, round_large=2 * KiB)
    assert b.malloc("big", 19.5 * KiB) == 20 * KiB
    with pytest.raises(ValueError):
        b.malloc("big", 1)
    with pytest.raises(KeyError):
        b.free("nothing")


def test_fake_allocator_cap_releases_the_cache_then_runs_out_of_memory():
    a = _toy_allocator(cap=40 * KiB)
    a.malloc(1, 8 * KiB)                 # a 20 KiB segment, split: 12 KiB cached
    a.malloc(2, 15 * KiB)                # >= 10 KiB: a segment of its own, 16 KiB
    a.free(2)                            # cached
    assert a.reserved() == 36 * KiB
    a.malloc(3, 18 * KiB)                # a new 18 KiB segment would cross the cap: the cache goes first
    assert a.reserved() == 38 * KiB and a.allocated() == 26 * KiB
    a.malloc(4, 4 * KiB)                 # carved from the cached remainder of the first segment
    assert a.reserved() == 38 * KiB
    with pytest.raises(torch.OutOfMemoryError, match="under a cap"):
        a.malloc(5, 10 * KiB)            # 8 KiB cached is too small and nothing is left to release


def test_fake_allocator_is_fed_by_the_storage_tracker():
    a = FakeCachingAllocator.scaled(1024)
    with a.tracking():
        x = torch.empty(1000, dtype=torch.float32)             # 4000 B -> a large block
        y = torch.empty(10, dtype=torch.float32)               # 40 B -> the small pool
    assert a.allocated() == a.round_size(4000) + a.round_size(40)
    assert {s.pool for s in a.segments} == {"small", "large"}
    del x, y
    assert a.allocated() == 0 and a.reserved() > 0
    a.empty_cache()
    assert a.reserved() == 0


# -------------------------------------------------------------- the interface
def test_cuda_memory_resolves_the_device_index(monkeypatch):
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    calls = []
    for name in ("memory_allocated", "memory_reserved", "max_memory_allocated", "max_memory_reserved",
                 "reset_peak_memory_stats", "mem_get_info"):
        monkeypatch.setattr(torch.cuda, name, lambda idx, _n=name: calls.append((_n, idx)) or ((7, 80) if _n == "mem_get_info" else 7))
    m = CudaMemory("cuda")
    assert m.index == 3 and m.device == torch.device("cuda", 3)
    m.allocated(), m.reserved(), m.peak_allocated(), m.peak_reserved(), m.reset_peak()
    assert m.total() == 80
    assert all(idx == 3 for _, idx in calls) and len(calls) == 6
    assert CudaMemory("cuda:1").index == 1 and cuda_index(2) == 2
    with pytest.raises(ValueError, match="not a CUDA device"):
        cuda_index("cpu")
    assert isinstance(memory_for("cpu"), TrackerMemory)


def test_expandable_segments_left_alone_when_the_user_configured_the_allocator(monkeypatch):
    import libra_opt.runtime.memory as mem

    set_to = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_allocator_backend", lambda: "native")
    monkeypatch.setattr(torch._C, "_accelerator_setAllocatorSettings", set_to.append, raising=False)
    for env, expected in ((None, "expandable_segments:True"), ("PYTORCH_CUDA_ALLOC_CONF", "user-configured"),
                          ("PYTORCH_ALLOC_CONF", "user-configured"), (mem.EXPANDABLE_ENV, "opted-out")):
        for k in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", mem.EXPANDABLE_ENV):
            monkeypatch.delenv(k, raising=False)
        if env is not None:
            monkeypatch.setenv(env, "0" if env == mem.EXPANDABLE_ENV else "garbage_collection_threshold:0.8")
        monkeypatch.setattr(mem, "_configured", None)
        set_to.clear()
        assert configure_allocator() == expected
        assert set_to == (["expandable_segments:True"] if expected.startswith("expandable") else [])
        assert configure_allocator() == expected and len(set_to) <= 1      # once per process


# ------------------------------------------------------------- the closed loop
class _Planned:
    """A stand-in optimized module: ``count`` activations of ``size`` bytes live at once."""

    def __init__(self, budget: int, size: int):
        self.size = size
        self.count = budget // size
        if self.count < 1:
            raise InfeasibleBudgetError(budget, size, "toy")
        self.plan = SimpleNamespace(peak_bytes=self.count * size, budget_bytes=budget)

    def run(self, alloc: FakeCachingAllocator):
        keys = []
        try:
            for _ in range(self.count):
                k = object()
                alloc.malloc(k, self.size)
                keys.append(k)
        finally:                             # tensors die with the step, out of memory or not
            for k in keys:
                alloc.free(k)


def _toy_allocator(cap=None):
    # 3000 B requests round to 3072: six per 20 KiB segment, 2048 B left in each
    return FakeCachingAllocator(round_bytes=512, small_size=1 * KiB, small_segment=2 * KiB, large_segment=20 * KiB,
                                min_large_alloc=10 * KiB, round_large=2 * KiB, cap=cap)


def test_loop_converges_within_its_bound_and_reports_each_iteration():
    alloc = _toy_allocator()
    budget = 100 * KiB
    plans = []

    def plan(b):
        plans.append(b)
        return _Planned(b, 3000)

    module, records = calibrate(plan, lambda m: m.run(alloc), budget, alloc, max_iterations=3, solver="toy")
    assert [r.solver_budget_bytes for r in records] == plans and records[0].solver_budget_bytes == budget
    assert len(records) >= 2 and all(isinstance(r, CalibrationStep) for r in records)
    assert not records[0].fits and records[-1].fits
    # iteration 0: 34 activations of 3000 B planned (99.6 KiB), six per 20 KiB segment: 6 segments = 120 KiB
    assert records[0].planned_peak_bytes == 34 * 3000 and records[0].measured_reserved_bytes == 120 * KiB
    assert records[0].overshoot_bytes == 20 * KiB
    assert records[1].solver_budget_bytes == 34 * 3000 - 20 * KiB
    # what the accepted plan held is within the budget, measured again
    again = measure_step(lambda: module.run(alloc), alloc)
    assert again.reserved_bytes <= budget and records[-1].measured_reserved_bytes <= budget


def test_loop_is_bounded_and_the_error_gives_the_smallest_budget_that_works():
    alloc = _toy_allocator()
    # one iteration only: the first plan is over, so the error reports it and the measured need
    with pytest.raises(CalibrationError) as e:
        calibrate(lambda b: _Planned(b, 3000), lambda m: m.run(alloc), 100 * KiB, alloc, max_iterations=1)
    assert len(e.value.records) == 1 and e.value.min_feasible_bytes == 120 * KiB
    assert isinstance(e.value, ValueError) and "iteration 0" in str(e.value) and "120.00 KiB" in str(e.value)
    # over by more than the plan uses: no budget is left to re-plan with; the need is what was measured
    with pytest.raises(CalibrationError) as e:
        calibrate(lambda b: _Planned(b, 6000), lambda m: m.run(alloc), 10 * KiB, alloc, max_iterations=3)
    assert len(e.value.records) == 1 and e.value.min_feasible_bytes == 20 * KiB
    assert "smallest measured reserved peak" in str(e.value)
    # the re-plan finds no plan: the need is estimated as the solver's minimum plus the measured overhead
    with pytest.raises(CalibrationError) as e:
        calibrate(lambda b: _Planned(b, 3000), lambda m: m.run(alloc), 22 * KiB, alloc, max_iterations=3)
    rec = e.value.records
    assert len(rec) == 1 and rec[0].planned_peak_bytes == 21000 and rec[0].measured_reserved_bytes == 40 * KiB
    assert e.value.min_feasible_bytes == 3000 + (40 * KiB - 21000)
    assert "no plan within the solver budget" in str(e.value) and "estimated need" in str(e.value)
    with pytest.raises(ValueError):
        calibrate(lambda b: _Planned(b, 1), lambda m: None, 0, alloc)


def test_a_step_that_runs_out_of_memory_counts_as_over_and_is_replanned():
    """Under a hard cap equal to the budget, the first plans run out of memory (no measurement but
    "over"): each is recorded and re-planned at least 5 % lower until one fits."""
    alloc = _toy_allocator(cap=100 * KiB)
    module, records = calibrate(lambda b: _Planned(b, 3000), lambda m: m.run(alloc), 100 * KiB, alloc,
                                max_iterations=3)
    assert [r.out_of_memory for r in records] == [True, True, False]
    assert all(r.overshoot_bytes >= 5 * KiB for r in records[:2]) and records[-1].fits
    assert records[-1].measured_reserved_bytes == 100 * KiB and module.count == 30   # five full segments
    assert "(out of memory)" in str(records[0]) and alloc.allocated() == 0
    with pytest.raises(CalibrationError, match="every measured step ran out of memory"):
        calibrate(lambda b: _Planned(b, 3000), lambda m: m.run(alloc), 100 * KiB, alloc, max_iterations=2)


def test_margin_is_left_under_the_budget_by_the_first_plan():
    alloc = _toy_allocator()
    module, records = calibrate(lambda b: _Planned(b, 3000), lambda m: m.run(alloc), 100 * KiB, alloc,
                                margin_bytes=20 * KiB)
    assert records[0].solver_budget_bytes == 80 * KiB and len(records) == 1 and records[0].fits


def test_preserved_state_restores_grads_buffers_and_rng():
    m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4), torch.nn.Dropout(0.5))
    g = torch.ones(4, 4)
    m[0].weight.grad = g
    stats = m[1].running_mean.clone()
    rng = torch.get_rng_state()
    with preserved_state(m):
        assert m[0].weight.grad is None
        m(torch.randn(8, 4)).sum().backward()
    assert m[0].weight.grad is g and m[0].bias.grad is None
    assert torch.equal(m[1].running_mean, stats) and torch.equal(torch.get_rng_state(), rng)


# ------------------------------------------------------- a real model (CPU)
@pytest.fixture(scope="module")
def tiny(one_intra_op_thread):
    from libra_opt.apps.zoo import build_model

    return build_model("gpt2-tiny", 4, 32, seed=0)


def test_tracker_memory_measures_a_step_on_the_cpu():
    mem = TrackerMemory()
    x = torch.randn(64, 64)

    def step():
        y = x @ x                        # 16 KiB, alive with z
        z = y.relu()                     # 16 KiB
        return z.sum()                   # 4 B, while z is alive

    m = measure_step(step, mem)
    assert (m.before_bytes, m.allocated_bytes, m.reserved_bytes) == (0, 2 * 64 * 64 * 4 + 4, 2 * 64 * 64 * 4 + 4)


def test_optimize_calibrate_replans_until_the_fake_allocator_fits_and_trains_like_eager(tiny, monkeypatch):
    """The storages of a real planned step (gpt2-tiny, CPU), held by a caching allocator 1/1024 of
    PyTorch's: the first plan is over the budget in reserved memory, the re-plan fits; the user's
    gradients are untouched and the module trains like eager PyTorch."""
    import libra_opt.runtime.memory as mem
    from libra_opt.optimize import optimize

    zm = tiny
    ref = copy.deepcopy(zm.model)
    kept = [torch.full_like(p, 0.5) for p in zm.model.parameters()]
    for p, g in zip(zm.model.parameters(), kept):
        p.grad = g                                    # gradients the user accumulated
    fake = FakeCachingAllocator.scaled(1024)
    monkeypatch.setattr(mem, "memory_for", lambda device: fake)
    om = optimize(zm.model, zm.args, 0.9, example_kwargs=zm.kwargs, profile=False, calibrate=True)
    rec = om.calibration
    assert not rec[0].fits and rec[-1].fits and 2 <= len(rec) <= 3
    assert rec[0].measured_reserved_bytes > rec[0].measured_allocated_bytes >= rec[0].planned_peak_bytes
    assert rec[0].overshoot_bytes == rec[0].measured_reserved_bytes - om.budget_bytes
    assert rec[1].solver_budget_bytes == min(rec[0].solver_budget_bytes, rec[0].planned_peak_bytes) - \
        rec[0].overshoot_bytes
    assert om.plan.budget_bytes == rec[-1].solver_budget_bytes < om.budget_bytes
    assert rec[-1].measured_reserved_bytes <= om.budget_bytes
    assert all(p.grad is g for p, g in zip(zm.model.parameters(), kept))     # untouched
    for p in zm.model.parameters():
        p.grad = None
    out = om(*zm.args, **zm.kwargs)
    out.loss.backward()
    ref_out = ref(*zm.args, **zm.kwargs)
    ref_out.loss.backward()
    assert torch.equal(out.loss, ref_out.loss)
    for a, b in zip(zm.model.parameters(), ref.parameters()):
        assert torch.equal(a.grad, b.grad)


def test_allocator_margin_is_planned_to_and_dropped_when_no_plan_leaves_it(caplog):
    """The margin comes off the solver budget; where no plan leaves it (keep-everything at 100 %), the
    whole budget is planned to, with a warning; a bad margin is refused before anything is captured."""
    from libra_opt.errors import LibraOptError
    from libra_opt.optimize import optimize

    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(32, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256), torch.nn.ReLU(),
                              torch.nn.Linear(256, 1))
    x = torch.randn(64, 32)
    om = optimize(mlp, x, 1.0, solver="none", profile=False, allocator_margin=0.1)
    assert om.plan.budget_bytes == om.budget_bytes and "allocator margin" in caplog.text
    om = optimize(mlp, x, 2 * om.budget_bytes, solver="none", profile=False, allocator_margin=4096)
    assert om.plan.budget_bytes == om.budget_bytes - 4096 and om.plan.peak_bytes <= om.plan.budget_bytes
    assert om.calibration == []
    with pytest.raises(LibraOptError, match="allocator_margin"):
        optimize(mlp, x, 1.0, solver="none", profile=False, allocator_margin=1.5)
