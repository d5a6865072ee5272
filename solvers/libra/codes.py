"""Shared constants of the ``libra`` estimate: the integer codes its arrays and
hot loops store, in one place that every module of the estimate imports (and
that imports none of them).

- Window policies ``KEEP``, ``REC``, ``SWAP``: :attr:`Policy.code
  <libra_opt.passes.lowering.Policy.code>` of the one policy enum, as ints for
  the ``int8`` policy array and the list mirror the chain replay reads.
- ``NEG``: "no value" for memory points (bytes), below any real value, so a
  ``max`` over positions ignores it (an effect's ``raised_max`` where no point goes up).
- Tensor states before a regeneration point's chain (``LIVE``, ``MISSING``,
  ``ARRIVING``): resident; off the device (to regenerate); swapped and its
  swap-in already issued (the chain waits for it, it is allocated already).

Sources: the lowering's policies and regeneration (:mod:`libra_opt.passes.lowering`);
Libra (Wang, NTHU 2024) for the hybrid keep / recompute / swap decision per window.
"""
from __future__ import annotations

from libra_opt.passes.lowering import Policy

#: window policies of the estimate, as ints (:attr:`Policy.code`) for its int8 arrays and hot loops
KEEP, REC, SWAP = Policy.KEEP.code, Policy.RECOMPUTE.code, Policy.SWAP.code

#: "no memory point" (bytes): below every real value, ignored by a max over positions
NEG = -(1 << 62)

#: tensor states just before a regeneration point's chain: resident / off the device / swap-in in flight
LIVE, MISSING, ARRIVING = 0, 1, 2

__all__ = ["KEEP", "REC", "SWAP", "NEG", "LIVE", "MISSING", "ARRIVING"]
