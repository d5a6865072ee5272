"""The default solver ``libra``: greedy refinement of a hybrid recompute + swap plan.

:mod:`.solver` holds :class:`LibraSolver`, :class:`LibraOptions` and the portfolio (the
algorithm is described there); the engine's parts are the estimate (:mod:`.estimate`, with
:mod:`.chains`, :mod:`.swaps`, :mod:`.reshape`), the greedy refinement (:mod:`.refine`), the
finish step (:mod:`.finish`), exchange moves (:mod:`.exchange`) and decision records
(:mod:`.explain`).  This package re-exports what ``libra_opt.solvers.libra`` offered as one
module.
"""
from .solver import (ALWAYS_COMPARED, POLICY_MODES, PORTFOLIO_BASELINES, REACH_BASELINES,
                     RECOMPUTE_BASELINES, SWAP_BASELINES, WINDOW_MODES, LibraOptions, LibraSolver)

__all__ = ["LibraSolver", "LibraOptions"]
