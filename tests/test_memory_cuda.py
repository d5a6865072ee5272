"""Memory as the CUDA device holds it (skipped without a GPU): the closed loop
keeps ``max_memory_reserved`` within the budget, ``optimize`` releases what
profiling reserved, expandable segments are on unless the user configured the
allocator, ``memory_cap("cuda")`` caps, and ``max_batch`` measures a batch at
least eager's with its reserved peak under the cap and says what limits it."""
from __future__ import annotations

import os

import pytest
import torch

from libra_opt.optimize import optimize
from libra_opt.apps.zoo import build_model

pytestmark = pytest.mark.cuda

MiB = 1 << 20


def _reserved_peak_of_step(om, zm) -> tuple[int, int]:
    """(peak reserved, peak allocated) of one step above what is allocated before it, measured by the
    closed loop's own :func:`~libra_opt.calibrate.measure_step` on :class:`CudaMemory`."""
    from libra_opt.frontend.calibrate import measure_step
    from libra_opt.runtime.memory import CudaMemory

    for p in zm.model.parameters():
        p.grad = None                   # gradients are graph outputs of the plan

    def step():
        om(*zm.args, **zm.kwargs).backward()
        om.swap.synchronize()

    m = measure_step(step, CudaMemory("cuda"))
    for p in zm.model.parameters():
        p.grad = None
    return m.reserved_bytes, m.allocated_bytes


@pytest.mark.parametrize("name,batch,seq", [("gpt2-tiny", 32, 128), ("resnet-tiny", 256, 64)])
def test_calibrated_plan_keeps_reserved_memory_within_the_budget(name, batch, seq):
    zm = build_model(name, batch, seq, device="cuda", seed=0)
    probe = optimize(zm.model, zm.args, 1.0, solver="none", example_kwargs=zm.kwargs, loss_fn=zm.loss_fn)
    budget = int(0.6 * probe.plan.peak_bytes)
    del probe
    om = optimize(zm.model, zm.args, budget, solver="libra", example_kwargs=zm.kwargs, loss_fn=zm.loss_fn,
                  calibrate=True)
    rec = om.calibration
    assert rec and rec[-1].fits and len(rec) <= 3
    assert om.plan.budget_bytes <= budget - int(0.05 * budget)             # the allocator margin
    for _ in range(3):                                                     # steady state, not just once
        reserved, allocated = _reserved_peak_of_step(om, zm)
        assert reserved <= budget, (reserved, budget, [str(r) for r in rec])
        assert allocated <= reserved


def test_optimize_releases_what_profiling_reserved():
    zm = build_model("gpt2-tiny", 32, 128, device="cuda", seed=0)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    before = torch.cuda.memory_reserved()
    om = optimize(zm.model, zm.args, 0.6, solver="libra", example_kwargs=zm.kwargs, loss_fn=zm.loss_fn)
    torch.cuda.synchronize()
    # the unplanned step ran many times while profiling; nothing of it stays cached
    assert torch.cuda.memory_reserved() - before <= 64 * MiB, (torch.cuda.memory_reserved(), before)
    assert om.plan.schedule is not None


def test_expandable_segments_are_on_unless_the_user_configured_the_allocator():
    from libra_opt.runtime.memory import EXPANDABLE_ENV, configure_allocator

    zm = build_model("gpt2-tiny", 2, 16, device="cuda", seed=0)
    optimize(zm.model, zm.args, 1.0, solver="none", example_kwargs=zm.kwargs, profile=False)
    outcome = configure_allocator()
    if os.environ.get("PYTORCH_CUDA_ALLOC_CONF") or os.environ.get("PYTORCH_ALLOC_CONF"):
        assert outcome == "user-configured"
    elif os.environ.get(EXPANDABLE_ENV) == "0":
        assert outcome == "opted-out"
    else:
        assert outcome in ("expandable_segments:True", "backend cudaMallocAsync")
        getter = getattr(torch._C, "_accelerator_getAllocatorSettings", None)
        if getter is not None and outcome.startswith("expandable"):
            assert "expandable_segments:True" in getter() or "expandable_segments: True" in getter()


def test_memory_cap_on_the_current_device_caps_reserved_memory():
    from libra_opt.apps.max_batch import memory_cap

    with memory_cap(torch.cuda.memory_reserved() + 256 * MiB, "cuda"):
        x = torch.empty(128 * MiB, dtype=torch.uint8, device="cuda")
        with pytest.raises(torch.cuda.OutOfMemoryError):
            torch.empty(512 * MiB, dtype=torch.uint8, device="cuda")
        del x


def test_max_batch_on_the_gpu_beats_eager_within_the_cap():
    from libra_opt.apps.max_batch import max_batch

    cap = 1 << 30
    eager = max_batch("gpt2-tiny", cap, "none", seq=512, limit=2048, progress=False)
    libra = max_batch("gpt2-tiny", cap, "libra", seq=512, limit=2048, progress=False, guess=None)
    assert eager.batch > 0 and libra.batch >= eager.batch
    assert libra.reserved_peak_bytes <= cap and libra.planned_peak_bytes <= cap
    assert libra.samples_per_s > 0 and libra.limit
    assert "limited by" in libra.summary() and "measured reserved peak" in libra.summary()
    # the profiling batches were the only unplanned steps: every probe was planned and calibrated
    assert libra.calibration and libra.calibration[-1].fits
