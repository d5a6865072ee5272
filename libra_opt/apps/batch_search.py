"""OOM-safe search for the largest batch that fits.

:func:`search_max_batch` probes batch sizes with exponential growth (1, 2, 4,
...) until a batch fails, then binary-searches between the last batch that fit
and the first that did not.  Given a ``guess`` (a prediction, e.g. from the
simulator), it brackets the answer around it instead, in steps of 5 %, 10 %,
20 %, ... of the guess, then bisects the bracket: about half the probes of a
search from 1 when the guess is good (each probe is a compiled training step
on the GPU).  It assumes "fits" is monotone in the batch (a bigger batch never
needs less memory).  :func:`oom_safe` turns a training step
into the predicate: it catches ``torch.OutOfMemoryError`` (and a solver's
:class:`~libra_opt.errors.InfeasibleBudgetError`), drops every reference to
the failed step, runs ``gc`` and ``torch.cuda.empty_cache``
(:func:`free_device_memory`) and reports "does not fit", so the search
continues.  Each probe is a :class:`Trial`; the outcome a
:class:`SearchResult`.

Sources: ``torch.OutOfMemoryError``, ``torch.cuda.empty_cache``; the PyTorch
FAQ on CUDA out-of-memory errors; the max-batch experiment of Checkmate (Jain
et al., MLSys 2020, sec. 6.3).
"""
from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from typing import Any, Callable, Iterable

import torch

from ..errors import InfeasibleBudgetError

logger = logging.getLogger(__name__)

__all__ = ["Trial", "SearchResult", "search_max_batch", "best_so_far", "oom_safe", "free_device_memory"]

#: exceptions a training step raises when it does not fit (besides OOM)
_NO_FIT_ERRORS = (InfeasibleBudgetError,)


@dataclass(frozen=True)
class Trial:
    """One probe of the search: ``batch`` did (``fits``) or did not fit;
    ``reason`` says why not (e.g. ``"CUDA out of memory"``); ``info`` holds
    whatever the step function returned (e.g. its peak bytes)."""

    batch: int
    fits: bool
    reason: str = ""
    info: Any = None


@dataclass(frozen=True)
class SearchResult:
    """Outcome of :func:`search_max_batch`.

    Attributes
    ----------
    batch : int
        Largest batch that fit; 0 if not even ``start`` (nor any smaller
        batch) fit.
    trials : tuple of Trial
        Every probe, in the order made.
    limit_reached : bool
        True if the search stopped at ``limit`` with that batch fitting (the
        true maximum may be larger).
    """

    batch: int
    trials: tuple[Trial, ...]
    limit_reached: bool = False

    @property
    def first_failure(self) -> int | None:
        """Smallest batch that did not fit (``None`` if every probe fit)."""
        bad = [t.batch for t in self.trials if not t.fits]
        return min(bad) if bad else None

    def trial(self, batch: int) -> Trial | None:
        """The probe of ``batch`` (``None`` if it was not probed)."""
        for t in self.trials:
            if t.batch == batch:
                return t
        return None


def search_max_batch(try_batch: Callable[[int], "bool | Trial"], *, start: int = 1, limit: int | None = None,
                     growth: int = 2, guess: int | None = None, progress: bool | Any = False,
                     desc: str = "max-batch") -> SearchResult:
    """Largest batch for which ``try_batch`` succeeds: exponential growth, then
    binary search.

    Parameters
    ----------
    try_batch : callable
        ``try_batch(batch) -> bool`` (True: it fits) or a :class:`Trial`.
        Wrap a step that may run out of memory with :func:`oom_safe`.  Must be
        monotone: if ``b`` fits, every smaller batch fits.
    start : int
        First batch probed (>= 1).
    limit : int, optional
        Never probe above this batch (>= ``start``).
    growth : int
        Factor of the exponential phase (>= 2).
    guess : int, optional
        A predicted maximum (>= 1): probe it first, then move away from it
        in steps of 5 %, 10 %, 20 %, ... of the guess (at least 1 batch)
        up if it fit, down if not, until the answer is bracketed; then bisect.
        ``start`` is then ignored (``limit`` still caps every probe).
    progress : bool or tqdm
        Show a ``tqdm`` bar (True), or update the given bar, one tick per probe.
    desc : str
        Bar label.

    Returns
    -------
    SearchResult
        The largest fitting batch and every probe.  Probes: ``start``,
        ``start * growth``, ... until one fails (or ``limit``), then a binary
        search in the open interval between the last success and the first
        failure: about ``2 log2(max batch)`` probes.  If ``start`` fails, the
        binary search runs on ``[1, start)``.

    Raises
    ------
    ValueError
        ``start < 1``, ``growth < 2``, ``limit < start`` or ``guess < 1``.
    """
    start, growth = int(start), int(growth)
    if start < 1 or growth < 2:
        raise ValueError(f"need start >= 1 and growth >= 2, got start={start}, growth={growth}")
    if guess is not None and int(guess) < 1:
        raise ValueError(f"guess must be >= 1, got {guess}")
    if limit is not None and int(limit) < (start if guess is None else 1):
        raise ValueError(f"limit ({limit}) must be >= start ({start})")
    bar = _bar(progress, desc)
    trials: list[Trial] = []

    def probe(b: int) -> bool:
        got = try_batch(b)
        t = got if isinstance(got, Trial) else Trial(b, bool(got))
        if t.batch != b:
            t = Trial(b, t.fits, t.reason, t.info)
        trials.append(t)
        logger.info("batch %d: %s%s", b, "fits" if t.fits else "does not fit",
                    f" ({t.reason})" if t.reason else "")
        if bar is not None:
            bar.update(1)
            bar.set_postfix_str(f"batch {b} {'ok' if t.fits else 'fail'}; best {best_so_far(trials)}")
        return t.fits

    try:
        lo, hi = 0, None          # lo fits (0 = nothing yet), hi does not fit
        b = start
        limit_reached = False
        if guess is not None:
            lo, hi, limit_reached = _bracket(probe, int(guess), None if limit is None else int(limit))
        while guess is None:
            if probe(b):
                lo = b
                if limit is not None and b >= limit:
                    limit_reached = True
                    break
                b = b * growth if limit is None else min(b * growth, int(limit))
            else:
                hi = b
                break
        if hi is not None:
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if probe(mid):
                    lo = mid
                else:
                    hi = mid
    finally:
        if bar is not None and progress is True:
            bar.close()
    return SearchResult(batch=lo, trials=tuple(trials), limit_reached=limit_reached)


def _bracket(probe: Callable[[int], bool], guess: int, limit: int | None) -> tuple[int, int | None, bool]:
    """``(lo, hi, limit_reached)``: ``lo`` fits (0: nothing does), ``hi`` does
    not (``None``: the limit fits), found by stepping away from ``guess`` by
    5 %, 10 %, 20 %, ... of it (at least 1)."""
    b = guess if limit is None else min(guess, limit)
    step = max(1, guess // 20)
    if probe(b):
        lo = b
        while limit is None or lo < limit:
            b = lo + step if limit is None else min(lo + step, limit)
            if not probe(b):
                return lo, b, False
            lo, step = b, step * 2
        return lo, None, True
    hi = b
    while hi > 1:
        b = max(1, hi - step)
        if probe(b):
            return b, hi, False
        hi, step = b, step * 2
    return 0, hi, False


def best_so_far(trials: Iterable[Trial]) -> int:
    """Largest fitting batch among ``trials`` (0 if none)."""
    return max((t.batch for t in trials if t.fits), default=0)


def _bar(progress, desc: str):
    if progress is True:
        from tqdm.auto import tqdm

        return tqdm(desc=desc, unit="try", leave=True, disable=None)  # None: off when stderr is no terminal
    if progress:
        return progress
    return None


def free_device_memory() -> None:
    """Collect garbage and return cached CUDA blocks to the driver
    (:func:`libra_opt.runtime.memory.release_cached`), so the next probe
    starts clean."""
    from ..runtime.memory import release_cached

    release_cached()


def oom_safe(step: Callable[[int], Any]) -> Callable[[int], Trial]:
    """Wrap ``step(batch)`` so that running out of memory means "does not fit".

    Parameters
    ----------
    step : callable
        ``step(batch)`` runs a training step at that batch (building what it
        needs) and returns anything (kept as :attr:`Trial.info`).  It should
        hold no reference to its tensors after returning or raising.

    Returns
    -------
    callable
        ``fits(batch) -> Trial``: ``fits=True`` when ``step`` returned;
        ``fits=False`` with the reason when it raised
        ``torch.OutOfMemoryError`` (or a CUDA "out of memory" /
        ``CUBLAS_STATUS_ALLOC_FAILED`` ``RuntimeError``) or
        :class:`~libra_opt.errors.InfeasibleBudgetError` (the solver found no
        plan within the budget).  Any other exception propagates.  Memory is
        freed after every failed probe, and after every probe when CUDA is
        available (:func:`free_device_memory`), outside the ``except`` block
        so the traceback's frames, which hold the failed step's tensors, are
        gone first.

    Notes
    -----
    Source: the PyTorch FAQ "my model reports cuda runtime error(2): out of
    memory" (free the references, then ``torch.cuda.empty_cache``).
    """

    @functools.wraps(step)
    def fits(batch: int) -> Trial:
        reason = None
        info = None
        try:
            info = step(batch)
        except _NO_FIT_ERRORS as e:
            reason = f"no plan: {e}"
        except Exception as e:  # noqa: BLE001 - re-raised unless it is an OOM
            from ..runtime.memory import is_out_of_memory

            if not is_out_of_memory(e):
                raise
            reason = "out of memory: " + (str(e).splitlines() or [""])[0][:160]
        if reason is not None or torch.cuda.is_available():
            free_device_memory()
        return Trial(batch, reason is None, reason or "", info)

    return fits
