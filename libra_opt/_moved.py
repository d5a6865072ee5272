"""The old import paths of the modules that moved into subpackages (issue 14).

``libra_opt/`` and ``solvers/`` were flat; their modules now sit in folders
that read as the pipeline (``libra_opt.ir``, ``libra_opt.frontend``,
``libra_opt.passes``, ``libra_opt.apps``, ``libra_opt.solvers.libra``,
``libra_opt.solvers.checkmate``).  :data:`MOVED` maps every old dotted name to
the new one, and :class:`MovedModuleFinder` (put on :data:`sys.meta_path` by
``libra_opt/__init__.py``) makes ``import OLD`` (and ``from OLD import X``,
``importlib.import_module(OLD)``, ``"OLD:attr"`` strings) give the module NEW
itself: after it, ``sys.modules[OLD] is sys.modules[NEW]``, so a
``monkeypatch.setattr`` on either name patches the one module, and classes keep
one identity.  No file is left at an old path.

The finder is consulted after the ordinary ones, so it only answers for names
no file provides.  Source: PEP 451 (``ModuleSpec``; a loader's
``create_module`` returns the module object to use); the
:class:`importlib.abc.MetaPathFinder` and :class:`importlib.abc.Loader`
protocols.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys

#: old dotted name -> new dotted name (CHANGELOG.md, "Changed", lists the same moves)
MOVED: dict[str, str] = {
    # the IR: problem, plan (schedule), problem files, budgets and byte sizes
    "libra_opt.problem": "libra_opt.ir.problem",
    "libra_opt.schedule": "libra_opt.ir.schedule",
    "libra_opt.problem_io": "libra_opt.ir.problem_io",
    "libra_opt.units": "libra_opt.ir.units",
    # passes over the IR: dispatch, simulation, lowering, bounds, executor costs
    "libra_opt.interpreter": "libra_opt.passes.interpreter",
    "libra_opt.simulator": "libra_opt.passes.simulator",
    "libra_opt.lowering": "libra_opt.passes.lowering",
    "libra_opt.bounds": "libra_opt.passes.bounds",
    "libra_opt.costs": "libra_opt.passes.costs",
    # the front end: model (or file, or generator) to problem
    "libra_opt.capture": "libra_opt.frontend.capture",
    "libra_opt.capture_passes": "libra_opt.frontend.capture_passes",
    "libra_opt.profiling": "libra_opt.frontend.profiling",
    "libra_opt.calibrate": "libra_opt.frontend.calibrate",
    "libra_opt.importers": "libra_opt.frontend.importers",
    "libra_opt.generators": "libra_opt.frontend.generators",
    # applications of the library
    "libra_opt.demo": "libra_opt.apps.demo",
    "libra_opt.max_batch": "libra_opt.apps.max_batch",
    "libra_opt.batch_search": "libra_opt.apps.batch_search",
    "libra_opt.train_methods": "libra_opt.apps.train_methods",
    "libra_opt.zoo": "libra_opt.apps.zoo",
    "libra_opt.compare": "libra_opt.apps.compare",
    "libra_opt.plots": "libra_opt.apps.plots",
    "libra_opt.fuzz": "libra_opt.apps.fuzz",
    # the libra solver (libra_opt.solvers.libra, formerly libra.py, is now the package itself)
    "libra_opt.solvers.libra_refine": "libra_opt.solvers.libra.refine",
    "libra_opt.solvers.libra_finish": "libra_opt.solvers.libra.finish",
    "libra_opt.solvers.libra_estimate": "libra_opt.solvers.libra.estimate",
    "libra_opt.solvers.libra_chains": "libra_opt.solvers.libra.chains",
    "libra_opt.solvers.libra_swaps": "libra_opt.solvers.libra.swaps",
    "libra_opt.solvers.libra_reshape": "libra_opt.solvers.libra.reshape",
    "libra_opt.solvers.libra_exchange": "libra_opt.solvers.libra.exchange",
    "libra_opt.solvers.libra_explain": "libra_opt.solvers.libra.explain",
    # Checkmate's MILP / LP and the hybrid (swap) MILP built on its stages
    "libra_opt.solvers.checkmate_lp": "libra_opt.solvers.checkmate.lp",
    "libra_opt.solvers.checkmate_milp": "libra_opt.solvers.checkmate.milp",
    "libra_opt.solvers.checkmate_model": "libra_opt.solvers.checkmate.model",
    "libra_opt.solvers.checkmate_plan": "libra_opt.solvers.checkmate.plan",
    "libra_opt.solvers.coarsen": "libra_opt.solvers.checkmate.coarsen",
    "libra_opt.solvers.hybrid_model": "libra_opt.solvers.checkmate.hybrid_model",
    "libra_opt.solvers.hybrid_milp": "libra_opt.solvers.checkmate.hybrid_milp",
}


class _AliasLoader(importlib.abc.Loader):
    """Loads an old name as the module object of its new name (PEP 451 ``create_module``)."""

    def __init__(self, new_name: str):
        self.new_name = new_name
        self._spec = None

    def create_module(self, spec):
        """Import the new module and return it (so no second copy of it is made).

        Raises
        ------
        ImportError
            Whatever importing the new module raises."""
        module = importlib.import_module(self.new_name)
        self._spec = module.__spec__
        return module

    def exec_module(self, module) -> None:
        """Nothing to run (the module ran under its new name); undo the one attribute the import
        system overwrote, ``__spec__`` (``importlib._bootstrap._init_module_attrs``), so the module
        keeps its own name for ``importlib.reload`` and pickling."""
        module.__spec__ = self._spec


class MovedModuleFinder(importlib.abc.MetaPathFinder):
    """A meta path finder for the old names in :data:`MOVED`: ``import OLD`` binds ``OLD`` (in
    :data:`sys.modules` and as its parent package's attribute) to the module ``MOVED[OLD]``."""

    def find_spec(self, fullname: str, path=None, target=None):
        """A spec whose loader gives the moved module, or ``None`` for a name that did not move."""
        new_name = MOVED.get(fullname)
        if new_name is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, _AliasLoader(new_name))


def install() -> None:
    """Append one :class:`MovedModuleFinder` to :data:`sys.meta_path` (idempotent)."""
    if not any(isinstance(f, MovedModuleFinder) for f in sys.meta_path):
        sys.meta_path.append(MovedModuleFinder())
