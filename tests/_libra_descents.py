"""A ``libra`` test double shared by the libra tests: the solver with an
attribute set on every descent of its portfolio (``variant_bounds=False``:
every descent ordered by the plain recomputation's cost; ``missed_by=None``:
every descent run for every budget)."""
from __future__ import annotations

from libra_opt.solvers.libra.solver import LibraSolver


def libra_with_descents(attrs: dict, **options) -> LibraSolver:
    """``LibraSolver(**options)`` whose descents (``LibraSolver._refiners``)
    each get ``attrs`` (attribute name -> value) set."""

    class _WithDescents(LibraSolver):
        def _refiners(self, problem):
            refs = super()._refiners(problem)
            for ref in refs:
                for name, value in attrs.items():
                    setattr(ref, name, value)
            return refs

    return _WithDescents(**options)
