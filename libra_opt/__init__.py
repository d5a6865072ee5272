"""libra-opt: train PyTorch models in less GPU memory by tensor rematerialization.

Activations saved for backward are evicted after their forward use and
regenerated before their backward use, by recomputation or by swapping to
pinned host memory.  A solver picks keep / recompute / swap for every
activation under a memory budget; a shared runtime executes the plan inside an
ordinary ``loss.backward()``.

Public API (imported lazily, so ``import libra_opt`` stays cheap):

- :func:`optimize` (model, example inputs, budget) -> a module that trains within the budget
- :func:`backend` (budget) -> a ``torch.compile`` backend that does the same:
  ``torch.compile(model, backend=libra_opt.backend(budget="60%"), dynamic=False)``
- :func:`profile` (model) -> :class:`RematProblem`; :func:`capture`
- :func:`solve`, :func:`solve_many`, :func:`register_solver`, :func:`available_solvers`
- :func:`simulate`, :class:`Schedule`, :func:`no_remat_schedule`
- :func:`load_problem`, :func:`save_problem`, :func:`load_remat_graph`,
  :func:`random_layered_graph`
- :func:`pad_to_bucket`: pad a batch to one of a few lengths (few plans)

Training loops: :mod:`libra_opt.integrations` (Hugging Face ``Trainer``:
``integrations.huggingface.LibraTrainer``; Lightning:
``integrations.lightning.LibraCallback``).
"""
from __future__ import annotations

import importlib
import types

from ._moved import install as _install_moved

__version__ = "0.1.0"

_install_moved()   # old module paths (libra_opt.zoo, libra_opt.solvers.checkmate_milp, ...): libra_opt/_moved.py

_LAZY = {
    "RematProblem": "libra_opt.ir.problem", "ProblemBuilder": "libra_opt.ir.problem", "Node": "libra_opt.ir.problem",
    "Tensor": "libra_opt.ir.problem", "FixedMemory": "libra_opt.ir.problem", "DeviceProfile": "libra_opt.ir.problem",
    "Provenance": "libra_opt.ir.problem",
    "Schedule": "libra_opt.ir.schedule", "no_remat_schedule": "libra_opt.ir.schedule",
    "Compute": "libra_opt.ir.schedule", "Free": "libra_opt.ir.schedule", "SwapOut": "libra_opt.ir.schedule",
    "SwapIn": "libra_opt.ir.schedule", "Wait": "libra_opt.ir.schedule",
    "simulate": "libra_opt.passes.simulator", "SimulationResult": "libra_opt.passes.simulator",
    "no_remat_peak": "libra_opt.passes.simulator",
    "solve": "libra_opt.solvers", "solve_many": "libra_opt.solvers", "register_solver": "libra_opt.solvers",
    "available_solvers": "libra_opt.solvers", "Solver": "libra_opt.solvers", "SolveResult": "libra_opt.solvers",
    "load_problem": "libra_opt.ir.problem_io", "save_problem": "libra_opt.ir.problem_io",
    "load_remat_graph": "libra_opt.frontend.importers",
    "capture": "libra_opt.frontend.capture", "profile": "libra_opt.frontend.profiling",
    "optimize": "libra_opt.optimize", "backend": "libra_opt.compile_backend",
    "LibraOptError": "libra_opt.errors", "InfeasibleBudgetError": "libra_opt.errors",
    "BudgetError": "libra_opt.errors", "MissingExtraError": "libra_opt.errors",
    "random_layered_graph": "libra_opt.frontend.generators",
    "CalibrationError": "libra_opt.errors",
    "pad_to_bucket": "libra_opt.plan_cache",
}

__all__ = sorted(_LAZY) + ["__version__"]


class CallableModule(types.ModuleType):
    """Type of the submodules named like the function they export
    (``libra_opt.optimize``, ``libra_opt.capture``): calling the module
    calls that function.

    ``import libra_opt.optimize`` (or ``from libra_opt.optimize import ...``)
    makes Python bind the package attribute ``libra_opt.optimize`` to the
    submodule, shadowing the lazily exported function; with this type
    ``libra_opt.optimize(model, ...)`` works whichever import ran first."""

    def __call__(self, *args, **kwargs):
        return getattr(self, self.__name__.rpartition(".")[2])(*args, **kwargs)


def __getattr__(name: str):
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'libra_opt' has no attribute {name!r}")
    value = getattr(importlib.import_module(mod), name)
    globals()[name] = value
    return value


def __dir__():
    return __all__
