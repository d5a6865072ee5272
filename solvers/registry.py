"""Solver registry: names -> :class:`~libra_opt.solvers.base.Solver` classes.

Built-ins are listed in a table and imported lazily (a missing optional
backend never breaks ``import libra_opt``).  ``@register_solver("name")``
adds a solver; third-party packages may also register through the entry-point
group ``libra_opt.solvers``.  A plug-in cannot shadow a built-in name.
"""
from __future__ import annotations

import importlib
import logging
from importlib.metadata import entry_points

from libra_opt.errors import SolverError, SolverNotFoundError

from .base import Solver

log = logging.getLogger("libra_opt.solvers")

#: name -> "module:Class", imported on first use.
BUILTIN_SOLVERS: dict[str, str] = {
    "libra": "libra_opt.solvers.libra:LibraSolver",
    "checkmate-milp": "libra_opt.solvers.checkmate.milp:CheckmateMILPSolver",
    "checkmate-lp": "libra_opt.solvers.checkmate.lp:CheckmateLPSolver",
    "hybrid-milp": "libra_opt.solvers.checkmate.hybrid_milp:HybridMILPSolver",
    "none": "libra_opt.solvers.baselines:NoRematSolver",
    "checkpoint-all": "libra_opt.solvers.baselines:CheckpointAllSolver",
    "chen-sqrt": "libra_opt.solvers.baselines:ChenSqrtSolver",
    "chen-greedy": "libra_opt.solvers.baselines:ChenGreedySolver",
    "swap-all": "libra_opt.solvers.baselines:SwapAllSolver",
}

_registered: dict[str, type[Solver]] = {}
_entry_points_loaded = False


def register_solver(name: str):
    """Class decorator: register a :class:`Solver` subclass under ``name``.

    Raises
    ------
    SolverError
        ``name`` is a built-in, or already registered to another class.
    TypeError
        The decorated object is not a Solver subclass.
    """

    def deco(cls):
        if not (isinstance(cls, type) and issubclass(cls, Solver)):
            raise TypeError(f"@register_solver({name!r}) needs a Solver subclass, got {cls!r}")
        _add(name, cls, builtin_ok=cls.__module__.startswith("libra_opt.solvers"))
        if not cls.name:
            cls.name = name
        return cls

    return deco


def _add(name: str, cls: type[Solver], builtin_ok: bool = False) -> None:
    if name in BUILTIN_SOLVERS and not builtin_ok:
        raise SolverError(f"cannot register {name!r}: it is a built-in solver name; choose another name")
    old = _registered.get(name)
    if old is not None and old is not cls and not builtin_ok:
        raise SolverError(f"solver name {name!r} is already registered to {old.__module__}.{old.__qualname__}")
    _registered[name] = cls


def _load_entry_points() -> None:
    global _entry_points_loaded
    if _entry_points_loaded:
        return
    _entry_points_loaded = True
    for ep in entry_points(group="libra_opt.solvers"):
        if ep.name in BUILTIN_SOLVERS:
            log.warning("ignoring plug-in solver %r from %s: it would shadow a built-in", ep.name, ep.value)
            continue
        try:
            _add(ep.name, ep.load())
        except Exception as e:  # a broken plug-in must not break the library
            log.warning("could not load plug-in solver %r (%s): %s", ep.name, ep.value, e)


def available_solvers() -> list[str]:
    """Every known solver name: built-ins, then registered and plug-in ones."""
    _load_entry_points()
    return list(BUILTIN_SOLVERS) + sorted(n for n in _registered if n not in BUILTIN_SOLVERS)


def solver_class(name: str) -> type[Solver]:
    """The class registered under ``name``.

    Raises
    ------
    SolverNotFoundError
        Unknown name; the message lists the known ones.
    """
    if name in BUILTIN_SOLVERS:
        if name not in _registered:
            mod, cls = BUILTIN_SOLVERS[name].split(":")
            _registered[name] = getattr(importlib.import_module(mod), cls)
        return _registered[name]
    _load_entry_points()
    if name in _registered:
        return _registered[name]
    raise SolverNotFoundError(f"unknown solver {name!r}; known solvers: {', '.join(available_solvers())}")


def get_solver(solver, **options) -> Solver:
    """A :class:`Solver` instance from a name, a Solver class, or an instance
    (``options`` must then be empty)."""
    if isinstance(solver, Solver):
        if options:
            raise TypeError("options were given together with a Solver instance; set them on the instance")
        return solver
    if isinstance(solver, type) and issubclass(solver, Solver):
        return solver(**options)
    if isinstance(solver, str):
        return solver_class(solver)(**options)
    raise TypeError(f"solver must be a name, a Solver class or instance, got {solver!r}")
