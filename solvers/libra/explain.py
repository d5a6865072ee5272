"""Decision records and explanations of the ``libra`` solver.

Every eviction the greedy refinement makes is recorded with why it was made:
which peak it lowered, how many bytes it took off that peak, the time it adds,
and why the storage is swapped rather than recomputed (or the reverse).  The
records go to ``SolveResult.extras["decisions"]`` and to
``schedule.meta["libra"]["decisions"]`` as plain JSON-ready dicts; ``libra-opt
solve --explain`` prints them with :func:`format_decisions`.

Source: Libra (Wang, NTHU 2024), the per-decision bookkeeping of the greedy
refinement (peak position, memory reduction, added time).
"""
from __future__ import annotations

from dataclasses import dataclass, fields

from libra_opt.ir.problem import RematProblem
from libra_opt.ir.units import format_bytes, format_seconds

#: reasons a decision can carry (``Decision.reason``)
REASON_CHEAPEST = "cheapest"            #: the chosen policy adds the least time
REASON_ONLY_POLICY = "only-policy"      #: the solver runs a single-policy mode
REASON_NEW_PEAK = "chain-new-peak"      #: recomputing (its chain) would push another point to the peak
REASON_NOT_RECOMPUTABLE = "not-recomputable"  #: the producer is a random or mutating op
REASON_REPAIR = "repair"                #: added against the simulated timeline after estimate drift
REASON_SWAP_NO_GAIN = "swap-no-gain"    #: the swap would not lower the peak (its transfer window misses it)
REASON_SWITCH = "switch"                #: an earlier decision changes policy to cover a new peak
REASON_EXCHANGE = "exchange"            #: taken instead of a costlier decision given back (exchange move)
REASON_REVERSE = "reverse"              #: kept from the store-nothing plan, which the budget needs (reverse greedy)


@dataclass(frozen=True)
class Decision:
    """Why one storage was evicted.

    Attributes
    ----------
    step : int
        Refinement step (0-based) at which the decision was made.
    storage : int
        Storage (base tensor) id.
    tensor : str
        Its name.
    after, before : int
        The eviction window (eager positions): evicted after ``after``,
        regenerated for ``before``.
    policy : {"recompute", "swap"}
    bytes : int
        Storage size (bytes).
    peak_bytes : int
        The (estimated) peak this decision lowered (bytes).
    peak_node : str
        Name of the node at which that peak occurred.
    removed_bytes : int
        Bytes the decision took off that peak point (bytes).
    added_s : float
        Estimated added step time of the decision, its chain and the queue
        contention it causes included (s).
    recompute_s, swap_s : float or None
        Estimated added time of each policy (``None``: not possible or not
        evaluated).
    reason : str
        One of the ``REASON_*`` constants.
    detail : str
        One sentence for people.
    """

    step: int
    storage: int
    tensor: str
    after: int
    before: int
    policy: str
    bytes: int
    peak_bytes: int
    peak_node: str
    removed_bytes: int
    added_s: float
    recompute_s: float | None
    swap_s: float | None
    reason: str
    detail: str

    def to_dict(self) -> dict:
        """A JSON-ready dict of every field."""
        return {f: getattr(self, f) for f in _FIELDS}

    def ending_before(self, before: int) -> "Decision":
        """This decision with its window ending before position ``before``
        (a moved window end: segment-wise regeneration, a merged or a
        repaired window), everything else as it is: ``dataclasses.replace(self,
        before=before)`` without its per-field introspection (20 us; the
        finish moves thousands of window ends on a 20k-op sweep)."""
        new = object.__new__(Decision)
        new.__dict__.update(self.__dict__)
        object.__setattr__(new, "before", int(before))
        return new


_FIELDS = tuple(f.name for f in fields(Decision))


def explain(problem: RematProblem, *, step: int, storage: int, after: int, before: int, policy: str,
            nbytes: int, peak_bytes: int, peak_pos: int, removed_bytes: int, added_s: float,
            recompute_s: float | None, swap_s: float | None, reason: str,
            raised_pos: int | None = None, raised_bytes: int | None = None,
            early_from: int | None = None) -> Decision:
    """Build a :class:`Decision` with its sentence.

    Parameters are the fields of :class:`Decision` (``nbytes`` for ``bytes``,
    positions instead of names); ``raised_pos`` / ``raised_bytes`` name the
    point recomputation would have pushed to the peak (for
    ``REASON_NEW_PEAK``); ``early_from`` is the storage's use when it is
    regenerated early, before ``before``.
    """
    name = problem.tensors[storage].name
    node = problem.nodes[peak_pos].name
    what = f"{policy} {name} ({format_bytes(nbytes)}) between {problem.nodes[after].name} and " \
           f"{problem.nodes[before].name}: -{format_bytes(removed_bytes)} at the peak of " \
           f"{format_bytes(peak_bytes)} at {node}, +{format_seconds(max(added_s, 0.0))}"
    if reason == REASON_NEW_PEAK:
        where = problem.nodes[raised_pos].name if raised_pos is not None and raised_pos >= 0 else "another point"
        why = (f"recomputing it would raise {where} to {format_bytes(raised_bytes or 0)}, "
               f"not below the peak; the swap does not")
    elif reason == REASON_NOT_RECOMPUTABLE:
        why = "its producer is not recomputable (random or mutating op)"
    elif reason == REASON_ONLY_POLICY:
        why = f"{policy}-only mode"
    elif reason == REASON_SWAP_NO_GAIN:
        why = "a swap would not lower this peak (the storage must be back on the device by then)"
    elif reason == REASON_SWITCH:
        why = (f"switched to {policy}: the earlier decision no longer covers the peak "
               f"(recompute {_t(recompute_s)}, swap {_t(swap_s)})")
    elif reason == REASON_EXCHANGE:
        why = ("taken in an exchange: a costlier decision was given back and the budget covered again "
               "by cheaper evictions")
    elif reason == REASON_REVERSE:
        why = ("kept from the plan that recomputes every activation (the descents stopped above the budget); "
               "the budget does not allow giving it back")
    elif reason == REASON_REPAIR:
        why = "added against the simulated timeline (the estimate was under the budget, the simulation was not)"
    elif policy == "swap":
        why = f"the transfer costs less than recomputing ({_t(swap_s)} vs {_t(recompute_s)})"
    else:
        why = f"recomputing costs no more than swapping ({_t(recompute_s)} vs {_t(swap_s)})"
    if early_from is not None and early_from != before:
        why += (f"; regenerated early, before {problem.nodes[before].name}, because its chain at the use "
                f"({problem.nodes[early_from].name}) would raise a new peak")
    return Decision(step=step, storage=storage, tensor=name, after=after, before=before, policy=policy,
                    bytes=int(nbytes), peak_bytes=int(peak_bytes), peak_node=node,
                    removed_bytes=int(removed_bytes), added_s=float(added_s),
                    recompute_s=None if recompute_s is None else float(recompute_s),
                    swap_s=None if swap_s is None else float(swap_s), reason=reason,
                    detail=f"{what}: {why}")


def _t(x: float | None) -> str:
    return "n/a" if x is None else "+" + format_seconds(max(x, 0.0))


def format_decisions(decisions: list[dict], n: int | None = 10) -> str:
    """The top ``n`` decisions (most bytes removed at a peak first) as text.

    Parameters
    ----------
    decisions : list of dict
        ``SolveResult.extras["decisions"]`` (dicts of :class:`Decision` fields).
    n : int or None
        How many to show; ``None`` for all.
    """
    if not decisions:
        return "no evictions: the plan keeps every activation"
    ranked = sorted(decisions, key=lambda d: (-d["removed_bytes"], d["step"]))
    shown = ranked if n is None else ranked[:n]
    lines = [f"{len(decisions)} evictions ({sum(d['policy'] == 'recompute' for d in decisions)} recompute, "
             f"{sum(d['policy'] == 'swap' for d in decisions)} swap); top {len(shown)} by bytes removed at a peak:"]
    for d in shown:
        lines.append(f"  [{d['step']:>4}] {d['detail']}")
    return "\n".join(lines)
