"""Saved profiles and plans, so that a restart does not profile again.

``optimize(..., cache_dir=DIR)`` (or the environment variable
``LIBRA_OPT_CACHE_DIR``) keeps two kinds of files in ``DIR``:

- **profiles**: ``profile-<hash>.json.gz``, the profiled
  :class:`~libra_opt.problem.RematProblem` in the problem file format
  (:func:`libra_opt.problem_io.save_problem`), keyed by :func:`profile_key`:
  the model's structure (a hash of the captured joint graph's ops, their
  arguments and value shapes), the parameter and input shapes and dtypes,
  the autocast dtype, the optimizer counted in the fixed memory, the device
  (type and name, and the CPU thread count), the torch and libra-opt
  versions;
- **plans**: ``plan-<hash>.json``, the :class:`~libra_opt.schedule.Schedule`
  in its own format (as ``libra-opt solve -o`` writes it), keyed by
  :func:`plan_key`: a hash of the problem it was made for (ops, times,
  storages, device, cost model; not its name or date), the solver budget in
  bytes, the solver and its options, the versions.

The key is stored inside each file (``provenance.extra["cache_key"]``, the
schedule's ``meta["cache_key"]``) and compared field by field on load: a
corrupt file, or one whose key differs (another torch version, a changed
model), is reported in a warning naming the field and made again, never used.
A loaded plan is checked by the simulator against its problem and budget
before it is used.  Files are written with :func:`libra_opt.atomic.atomic_write`
(all or nothing), so processes sharing a directory never read a half-written
file.

Source: the cache-key design of PyTorch's own compile caches
(``torch._inductor.codecache``: a hash of the graph, the inputs' metadata,
the versions and the device), with the files in libra-opt's formats.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import warnings
from pathlib import Path
from typing import Any

import torch

from .errors import LibraOptError, OutputPathError, ProblemError, ProblemFileError, ScheduleError
from .ir.problem import RematProblem

logger = logging.getLogger(__name__)

__all__ = ["CACHE_DIR_ENV", "PlanStore", "PlanCacheWarning", "graph_fingerprint", "problem_fingerprint",
           "profile_key", "plan_key", "resolve_cache_dir"]

#: environment variable naming the cache directory when ``optimize(cache_dir=None)``
CACHE_DIR_ENV = "LIBRA_OPT_CACHE_DIR"


class PlanCacheWarning(UserWarning):
    """A saved profile or plan was corrupt or stale (its key differs in the
    named field); it is made again and overwritten."""


def resolve_cache_dir(cache_dir) -> Path | None:
    """The directory saved profiles and plans go to, or ``None`` (off).

    Parameters
    ----------
    cache_dir : str, PathLike, None or False
        A directory (created if missing); ``None``: the environment variable
        :data:`CACHE_DIR_ENV` if set and not empty, else off; ``False``: off.

    Raises
    ------
    OutputPathError
        The directory cannot be created or is not a directory.
    """
    if cache_dir is False:
        return None
    if cache_dir is None:
        cache_dir = os.environ.get(CACHE_DIR_ENV) or None
        if cache_dir is None:
            return None
    path = Path(cache_dir).expanduser()
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OutputPathError(f"cache_dir {str(path)!r} cannot be created ({e}); pass a writable directory "
                              f"or cache_dir=False") from None
    if not path.is_dir():
        raise OutputPathError(f"cache_dir {str(path)!r} is not a directory")
    return path


# ------------------------------------------------------------------ keys
def _sha(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode("utf-8")).hexdigest()


def _val_meta(v) -> Any:
    if isinstance(v, torch.Tensor):
        return [list(v.shape), str(v.dtype)]
    if isinstance(v, (list, tuple)):
        return [_val_meta(x) for x in v]
    return type(v).__name__


def graph_fingerprint(joint: torch.fx.GraphModule) -> str:
    """SHA-256 of a joint graph's structure: per node its opcode, name,
    target, arguments (other nodes by name, constants by value) and the
    shape and dtype of its value.  Stack traces and code-object names are
    left out, so the same model captures to the same fingerprint in every
    process."""
    rows = []
    for n in joint.graph.nodes:
        args = torch.fx.node.map_arg((n.args, n.kwargs), lambda a: f"%{a.name}")
        rows.append([n.op, n.name, str(n.target), repr(args), _val_meta(n.meta.get("val"))])
    return _sha(rows)


def _device_description(device: torch.device) -> dict:
    if device.type == "cuda":
        from .runtime.memory import cuda_index

        return {"type": "cuda", "name": torch.cuda.get_device_name(cuda_index(device))}
    from .frontend.profiling import cpu_name

    return {"type": device.type, "name": cpu_name() if device.type == "cpu" else device.type,
            "threads": torch.get_num_threads()}


def _versions() -> dict:
    from . import __version__

    return {"torch": torch.__version__, "libra_opt": __version__}


def profile_key(step, *, optimizer: str) -> dict:
    """The key of ``step``'s profile (a :class:`~libra_opt.capture.CapturedStep`):
    JSON values only (see the module docstring)."""
    prims = [[k, list(t.shape), str(t.dtype)] for t, k in zip(step.primals, step.primal_kinds)]
    key = {"kind": "profile", "model": step.model_name, "graph": graph_fingerprint(step.joint),
           "primals": _sha(prims), "input_shapes": [list(s) for s in step.example_shapes],
           "autocast": str(step.autocast_dtype), "optimizer": optimizer,
           "device": _device_description(step.device), **_versions()}
    return json.loads(json.dumps(key))


def problem_fingerprint(problem: RematProblem) -> str:
    """SHA-256 of what a plan depends on in ``problem``: its nodes (times,
    workspace), tensors, outputs, fixed memory, device and cost model; not
    its name or provenance."""
    from .ir.problem_io import problem_to_dict

    d = problem_to_dict(problem)
    d.pop("name", None)
    d.pop("provenance", None)
    return _sha(d)


def plan_key(problem: RematProblem, budget_bytes: int, solver: str, options: dict) -> dict:
    """The key of a plan for ``problem`` at ``budget_bytes`` (the solver budget)
    by ``solver`` with ``options`` (see the module docstring)."""
    key = {"kind": "plan", "problem": problem_fingerprint(problem), "budget_bytes": int(budget_bytes),
           "solver": solver, "options": json.loads(json.dumps(options, sort_keys=True, default=repr)),
           **_versions()}
    return json.loads(json.dumps(key))


def _first_difference(stored: Any, key: dict) -> str:
    if not isinstance(stored, dict):
        return "cache_key (missing)"
    for k in sorted(set(stored) | set(key)):
        if stored.get(k) != key.get(k):
            return f"{k} (saved {stored.get(k)!r}, now {key.get(k)!r})"
    return ""


# ------------------------------------------------------------------ the store
@dataclasses.dataclass
class PlanStore:
    """Saved profiles and plans in one directory (see the module docstring).

    Attributes
    ----------
    root : Path
    hits, misses : int
        Entries found valid / made (absent, corrupt or stale) so far.
    """

    root: Path
    hits: int = 0
    misses: int = 0

    @classmethod
    def open(cls, cache_dir) -> "PlanStore | None":
        """The store of :func:`resolve_cache_dir` (``cache_dir``), or ``None`` when off."""
        root = resolve_cache_dir(cache_dir)
        return None if root is None else cls(root)

    def path(self, key: dict) -> Path:
        """The file of ``key``."""
        suffix = ".json.gz" if key["kind"] == "profile" else ".json"
        return self.root / f"{key['kind']}-{_sha(key)[:24]}{suffix}"

    def _stale(self, path: Path, why: str) -> None:
        self.misses += 1
        warnings.warn(f"libra-opt cache: {path} is {why}; making it again", PlanCacheWarning, stacklevel=4)

    # -------------------------------------------------------------- profiles
    def load_problem(self, key: dict) -> RematProblem | None:
        """The saved problem of ``key``, or ``None`` (absent; corrupt or
        stale: a :class:`PlanCacheWarning` names why)."""
        from .ir.problem_io import load_problem

        path = self.path(key)
        if not path.exists():
            self.misses += 1
            return None
        try:
            problem = load_problem(path)
        except (ProblemError, OSError) as e:
            self._stale(path, f"corrupt ({e})")
            return None
        diff = _first_difference(problem.provenance.extra.get("cache_key"), key)
        if diff:
            self._stale(path, f"stale: its key differs in {diff}")
            return None
        self.hits += 1
        logger.info("libra-opt cache: profile of %s loaded from %s (not profiled again)", key.get("model"), path)
        return problem

    def save_problem(self, key: dict, problem: RematProblem) -> None:
        """Save ``problem`` under ``key`` (atomically); a failed write warns."""
        from .ir.problem_io import save_problem

        prov = problem.provenance
        keyed = problem.replace(provenance=dataclasses.replace(prov, extra={**prov.extra, "cache_key": key}))
        try:
            save_problem(keyed, self.path(key))
        except (OutputPathError, ProblemError) as e:
            warnings.warn(f"libra-opt cache: the profile was not saved ({e})", PlanCacheWarning, stacklevel=3)

    # -------------------------------------------------------------- plans
    def solve(self, problem: RematProblem, budget, solver="libra", **options):
        """:func:`libra_opt.solve` through this store: a saved plan for the same
        key (:func:`plan_key`), checked by the simulator, is returned instead
        of solving; a new plan is saved.  A solver given as an instance (whose
        options the key cannot see) always solves.

        Returns
        -------
        SolveResult
            A loaded plan has ``solve_s == 0`` and ``message`` naming its file.

        Raises
        ------
        InfeasibleBudgetError, SolverNotFoundError, SolverUnavailableError
            As :func:`libra_opt.solve`.
        """
        from .passes.simulator import no_remat_peak
        from .solvers import solve
        from .ir.units import parse_budget

        if not isinstance(solver, str):
            return solve(problem, budget, solver, **options)
        budget_bytes = parse_budget(budget, no_remat_peak(problem))
        key = plan_key(problem, budget_bytes, solver, options)
        found = self.load_plan(key, problem)
        if found is not None:
            return found
        result = solve(problem, budget_bytes, solver, **options)
        self.save_plan(key, result)
        return result

    def load_plan(self, key: dict, problem: RematProblem):
        """The saved plan of ``key`` as a :class:`~libra_opt.solvers.SolveResult`
        (simulated on ``problem`` within the key's budget), or ``None``."""
        from .ir.schedule import Schedule
        from .passes.simulator import simulate
        from .solvers import SolveResult

        path = self.path(key)
        if not path.exists():
            self.misses += 1
            return None
        try:
            sched = Schedule.load(path)
        except (ProblemFileError, OSError) as e:
            self._stale(path, f"corrupt ({e})")
            return None
        meta = dict(sched.meta)
        diff = _first_difference(meta.pop("cache_key", None), key)
        if diff:
            self._stale(path, f"stale: its key differs in {diff}")
            return None
        try:
            sim = simulate(problem, sched, budget=key["budget_bytes"])
        except (ScheduleError, LibraOptError) as e:
            self._stale(path, f"not a valid plan for this problem ({e})")
            return None
        self.hits += 1
        logger.info("libra-opt cache: plan loaded from %s (not solved again)", path)
        saved = meta.pop("cache_result", {})
        return SolveResult(status=saved.get("status", "feasible"), schedule=sched.with_meta(meta),
                           solver=key["solver"], budget_bytes=key["budget_bytes"], peak_bytes=sim.peak_bytes,
                           time_s=sim.time_s, added_s=sim.added_s, lower_bound_s=saved.get("lower_bound_s"),
                           gap=saved.get("gap"), solve_s=0.0, message=f"loaded from {path}", simulation=sim)

    def save_plan(self, key: dict, result) -> None:
        """Save ``result``'s schedule under ``key`` (atomically); a failed write warns."""
        sched = result.schedule
        extra = {"status": result.status, "lower_bound_s": result.lower_bound_s, "gap": result.gap}
        keyed = sched.with_meta({**sched.meta, "cache_key": key, "cache_result": extra})
        try:
            keyed.save(self.path(key))
        except (OutputPathError, TypeError, ValueError) as e:
            warnings.warn(f"libra-opt cache: the plan was not saved ({e})", PlanCacheWarning, stacklevel=3)
