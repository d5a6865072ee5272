"""The runtime: executes any plan (recompute + asynchronous swap) inside an
ordinary ``loss.backward()``.

- :mod:`~libra_opt.runtime.partition`: a plan -> forward and backward FX graphs;
- :mod:`~libra_opt.runtime.swap`: transfer stream, events, pinned host buffer pool;
- :mod:`~libra_opt.runtime.module`: :class:`OptimizedModule`, the torch.compile backend;
- :mod:`~libra_opt.runtime.inductor`: the Inductor executor (the planned graphs compiled by Inductor);
- :mod:`~libra_opt.runtime.offload_ops`: swaps as ``libra::`` custom operators for compiled graphs;
- :mod:`~libra_opt.runtime.executor`: allocation tracking (peak bytes on any device).
"""
from .executor import StorageTracker, TrackedRun, measure_joint_peak, measure_step_peak
from .module import OptimizedModule
from .partition import LoweredPlan, lower_plan, run_lowered
from .swap import HostBufferPool, SwapManager

__all__ = ["OptimizedModule", "LoweredPlan", "lower_plan", "run_lowered", "SwapManager", "HostBufferPool",
           "StorageTracker", "TrackedRun", "measure_joint_peak", "measure_step_peak"]
