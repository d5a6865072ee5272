"""A device setting shared by the tests of swapping planners: copy bandwidths given in no-remat steps."""
from __future__ import annotations

from libra_opt.passes.simulator import no_remat_peak


def with_bandwidth(problem, copy_steps: float, overlap: bool = True):
    """``problem`` with both copy directions at the rate that copies its
    no-remat peak in ``copy_steps`` no-remat steps, overlapping compute or not."""
    rate = no_remat_peak(problem) / (copy_steps * problem.total_compute_s)
    return problem.with_device(h2d_bytes_per_s=rate, d2h_bytes_per_s=rate, copies_overlap_compute=overlap)
