"""The simulator: the single judge of every plan.

It replays a :class:`~libra_opt.schedule.Schedule` on one compute stream plus
one copy queue per direction and accounts memory per storage
(``DESIGN.md``, "The plan IR and the simulator"):

- an op's outputs are allocated when it starts; its workspace is transient;
- a swapped-out storage is released only when its device-to-host copy has
  finished (a ``Free`` before that defers the release; a later ``SwapIn`` or
  recompute of it allocates a fresh buffer);
- a swapped-in storage is allocated when the ``SwapIn`` is issued (the runtime
  allocates it on the compute stream at that point) and usable after ``Wait``;
- a ``Wait`` on a tensor whose swap-out is in flight (no swap-in of it
  pending; see :func:`~libra_opt.schedule.wait_kinds`) stalls the compute
  stream until that copy ends; a storage freed before it is released then;
- time: compute is serial; a first computation costs the node's ``time_s``,
  a recompute its ``problem.recompute_time`` (the executor's cost model,
  :mod:`libra_opt.costs`: equal to ``time_s`` for the eager executor); each copy starts when issued and its queue is free
  (a swap-in also waits for the swap-out of the same storage); ``Wait`` stalls
  the compute stream until the copy it waits for has ended (``stall_s``, either
  direction).  On a device whose copies do
  not overlap compute (a CPU), every copy occupies the compute timeline.

Invalid plans are rejected with a :class:`~libra_opt.errors.ScheduleError`
naming the instruction: use before compute, use after free, use before wait,
recompute of a non-recomputable op, freeing an output, a missing output at the
end, a swap of a view, budget exceeded.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass, field

import numpy as np

from ..errors import BudgetExceededError, ScheduleError
from .interpreter import ScheduleInterpreter
from ..ir.problem import INPUT, RematProblem
from ..ir.schedule import Schedule
from ..ir.units import format_bytes


@dataclass(frozen=True)
class SimulationResult:
    """What the simulator measured for one schedule.

    Attributes
    ----------
    peak_bytes : int
        Peak of graph memory (activations, gradients, workspace), bytes; the
        quantity budgets constrain.
    total_peak_bytes : int
        ``peak_bytes`` plus the fixed memory resident all step (parameters,
        buffers, optimizer state, inputs), bytes.
    peak_index : int
        Instruction at which the peak was first reached.
    time_s : float
        Step time: until the compute stream and both copy queues are idle (s).
    compute_s, recompute_s, stall_s : float
        Total compute, compute beyond each node's first run, and compute-stream
        time spent waiting for copies: swap-ins, and swap-outs a ``Wait``
        waits for (s).
    added_s : float
        ``time_s`` minus the problem's compute time without remat (s).
    d2h_bytes, h2d_bytes : int
        Bytes copied to and from the host.
    host_peak_bytes : int
        Peak of host (pinned) memory holding swapped storages.
    timeline_t, timeline_bytes : ndarray, shape (num_instructions,)
        Compute-stream time (s) and graph memory (bytes, workspace included)
        at each instruction, for plots.
    """

    peak_bytes: int
    total_peak_bytes: int
    peak_index: int
    time_s: float
    compute_s: float
    recompute_s: float
    stall_s: float
    added_s: float
    d2h_bytes: int
    h2d_bytes: int
    host_peak_bytes: int
    timeline_t: np.ndarray = field(repr=False)
    timeline_bytes: np.ndarray = field(repr=False)

    def summary(self) -> str:
        """Two lines for people."""
        return (f"peak {format_bytes(self.peak_bytes)} (with fixed memory {format_bytes(self.total_peak_bytes)}), "
                f"step {self.time_s * 1e3:.3f} ms (+{self.added_s * 1e3:.3f} ms: recompute "
                f"{self.recompute_s * 1e3:.3f} ms, stalls {self.stall_s * 1e3:.3f} ms)\n"
                f"swapped {format_bytes(self.d2h_bytes)} out, {format_bytes(self.h2d_bytes)} in; "
                f"host peak {format_bytes(self.host_peak_bytes)}")


class Simulator(ScheduleInterpreter):
    """Replays a schedule; see the module docstring for the semantics.

    Parameters
    ----------
    problem : RematProblem
    budget_bytes : int, optional
        Reject the plan (:class:`~libra_opt.errors.BudgetExceededError`) at the
        first instruction that takes graph memory over this.
    """

    def __init__(self, problem: RematProblem, budget_bytes: int | None = None):
        super().__init__(problem)
        self.budget = budget_bytes
        p = problem
        tab = p.tables   # per-problem lists, built once (libra_opt.ir.tables)
        self._nbytes, self._storage, self._is_input = tab.t_nbytes, tab.t_storage, tab.t_input
        self._node_facts, self._recompute_time = tab.n_facts, tab.n_rtime
        self._overlap = p.device.copies_overlap_compute
        self._outputs = p.output_set
        self._h2d = float(p.device.h2d_bytes_per_s)
        self._d2h = float(p.device.d2h_bytes_per_s)

    # ----------------------------------------------------------- lifecycle
    def start(self) -> None:
        self.resident: set[int] = set()
        self.produced: set[int] = set()
        self.arriving: dict[int, float] = {}
        self.refs: dict[int, int] = {}          # storage -> resident/arriving tensors on it
        self.allocated: set[int] = set()        # storages occupying device memory
        self.d2h_end: dict[int, float] = {}     # storage -> end of its last swap-out
        self.outgoing: set[int] = set()         # storages whose swap-out no Wait or SwapIn has followed
        self.host: dict[int, float] = {}        # storage -> time its host copy is complete
        self.pending: list[tuple[float, int]] = []   # (copy end, bytes) released then
        self.computed: set[int] = set()
        self.t = 0.0
        self.d2h_free = 0.0
        self.h2d_free = 0.0
        self.mem = 0
        self.peak = 0
        self.peak_index = 0
        self.host_mem = 0
        self.host_peak = 0
        self.compute_s = 0.0
        self.recompute_s = 0.0
        self.stall_s = 0.0
        self.d2h_bytes = 0
        self.h2d_bytes = 0
        self.tl_t: list[float] = []
        self.tl_b: list[int] = []
        for t in self.problem.tensors:  # input storages: always resident, never counted
            if self._is_input[t.id] and t.storage == t.id:
                self.refs[t.id] = 1
                self.allocated.add(t.id)

    def _note(self, mem: int) -> None:
        if mem > self.peak:
            self.peak = mem
            self.peak_index = self.index
            if self.budget is not None and mem > self.budget:
                self.fail(f"memory reaches {format_bytes(mem)} ({mem} bytes), over the budget of "
                          f"{format_bytes(self.budget)} ({self.budget} bytes)", BudgetExceededError)

    def _release_done(self) -> None:
        while self.pending and self.pending[0][0] <= self.t:
            _, nbytes = heapq.heappop(self.pending)
            self.mem -= nbytes

    def _name(self, tid: int) -> str:
        return repr(self.problem.tensors[tid].name)

    def _check_usable(self, tid: int, user: str) -> None:
        if self._is_input[tid] or tid in self.resident:
            return
        if tid in self.arriving:
            self.fail(f"{user} uses tensor {self._name(tid)} before Wait({self.problem.tensors[tid].name}): "
                      f"add a Wait after its SwapIn")
        if tid in self.produced:
            self.fail(f"{user} uses tensor {self._name(tid)} after it was freed: recompute or swap it in first")
        prod = self.problem.tensors[tid].producer
        self.fail(f"{user} uses tensor {self._name(tid)} before it is computed "
                  f"(Compute({self.problem.nodes[prod].name}) must come first)")

    # ---------------------------------------------------------- instructions
    def compute(self, nid: int) -> None:
        if self.pending and self.pending[0][0] <= self.t:
            self._release_done()
        inputs, outputs, recomputable, time_s, transient = self._node_facts[nid]
        resident, is_input = self.resident, self._is_input
        for tid in inputs:
            if not (is_input[tid] or tid in resident):
                self._check_usable(tid, f"node {self.problem.nodes[nid].name!r}")
        computed = self.computed
        if nid in computed:
            if not recomputable:
                node = self.problem.nodes[nid]
                self.fail(f"node {node.name!r} ({node.target}) is not recomputable (random or mutating op) "
                          f"but is computed again: keep or swap its outputs instead")
            time_s = self._recompute_time[nid]  # the executor's cost model (libra_opt.costs)
            self.recompute_s += time_s
        else:
            computed.add(nid)
        start = self.t if self._overlap else max(self.t, self.d2h_free, self.h2d_free)
        storage, nbytes, refs, allocated, produced = self._storage, self._nbytes, self.refs, self.allocated, self.produced
        for tid in outputs:
            s = storage[tid]
            if tid in resident:
                transient += nbytes[tid]
                continue
            if tid in self.arriving:
                self.fail(f"node {self.problem.nodes[nid].name!r} recomputes {self._name(tid)} while its "
                          f"swap-in is in flight")
            resident.add(tid)
            produced.add(tid)
            refs[s] = refs.get(s, 0) + 1
            if s not in allocated:
                if s != tid:
                    self.fail(f"node {self.problem.nodes[nid].name!r} makes view {self._name(tid)} of storage "
                              f"{self._name(s)} which is not resident")
                allocated.add(s)
                self.mem += nbytes[s]
        mem = self.mem + transient
        if mem > self.peak:
            self._note(mem)
        self.tl_t.append(start)
        self.tl_b.append(mem)
        self.t = start + time_s
        self.compute_s += time_s

    def free(self, tid: int) -> None:
        if self.pending and self.pending[0][0] <= self.t:
            self._release_done()
        if tid in self._outputs:
            self.fail(f"frees {self._name(tid)}, an output of the step (loss, model output or gradient), "
                      f"which must stay resident to the end")
        if self._is_input[tid]:
            self.fail(f"frees graph input {self._name(tid)}; inputs and parameters are fixed memory")
        resident = self.resident
        if tid not in resident:
            if tid in self.arriving:
                self.fail(f"frees {self._name(tid)} before Wait on its swap-in")
            self.fail(f"frees {self._name(tid)}, which is not resident (never computed or already freed)")
        resident.discard(tid)
        # the storage's reference goes; its bytes when it was the last (once a copy out reading it ends)
        s = self._storage[tid]
        refs = self.refs
        refs[s] -= 1
        if refs[s] == 0:
            self.allocated.discard(s)
            end = self.d2h_end.get(s, 0.0)
            if end > self.t:  # the copy out still reads it: release when the copy ends
                heapq.heappush(self.pending, (end, self._nbytes[s]))
            else:
                self.mem -= self._nbytes[s]
        self.tl_t.append(self.t)
        self.tl_b.append(self.mem)

    def swap_out(self, tid: int) -> None:
        self._release_done()
        if self._storage[tid] != tid:
            base = self.problem.tensors[self._storage[tid]].name
            self.fail(f"swaps out view {self._name(tid)}; views are never swapped on their own: "
                      f"swap its base {base!r}")
        if self._is_input[tid]:
            self.fail(f"swaps out graph input {self._name(tid)}; only activations are swapped")
        if self.refs.get(tid, 0) == 0 or tid in self.arriving:
            self.fail(f"swaps out {self._name(tid)}, whose storage is not resident")
        nbytes = self._nbytes[tid]
        start = max(self.t, self.d2h_free)
        end = start + nbytes / self._d2h
        self.d2h_free = end
        self.d2h_end[tid] = end
        if tid not in self.host:
            self.host_mem += nbytes
            self.host_peak = max(self.host_peak, self.host_mem)
        self.host[tid] = end
        self.outgoing.add(tid)
        self.d2h_bytes += nbytes
        if not self._overlap:
            self.t = end
        self._record()

    def swap_in(self, tid: int) -> None:
        self._release_done()
        if self._storage[tid] != tid:
            self.fail(f"swaps in view {self._name(tid)}; swap in its base "
                      f"{self.problem.tensors[self._storage[tid]].name!r} and recompute the view")
        if tid not in self.host:
            self.fail(f"swaps in {self._name(tid)}, which has no host copy: SwapOut it first")
        if tid in self.allocated:
            self.fail(f"swaps in {self._name(tid)}, whose storage is still resident on the device")
        nbytes = self._nbytes[tid]
        self.outgoing.discard(tid)
        self.allocated.add(tid)
        self.mem += nbytes
        self.refs[tid] = self.refs.get(tid, 0) + 1
        self._note(self.mem)
        start = max(self.t, self.h2d_free, self.host[tid])
        end = start + nbytes / self._h2d
        self.h2d_free = end
        self.arriving[tid] = end
        self.h2d_bytes += nbytes
        if not self._overlap:
            self.t = end
        self._record()

    def wait(self, tid: int) -> None:
        self._release_done()
        if tid in self.arriving:   # for its swap-in: the tensor becomes usable
            end = self.arriving.pop(tid)
            if end > self.t:
                self.stall_s += end - self.t
                self.t = end
            self.resident.add(tid)
            self.produced.add(tid)
        elif tid in self.outgoing:   # for its swap-out: a freed storage is released when the copy ends
            self.outgoing.discard(tid)
            end = self.d2h_end[tid]
            if end > self.t:
                self.stall_s += end - self.t
                self.t = end
                self._release_done()
        else:
            what = ("whose swap-out was already waited for or followed by a SwapIn"
                    if tid in self.host else "which was never swapped out or in")
            self.fail(f"waits for {self._name(tid)}, which has no copy in flight ({what}): a Wait must follow "
                      f"a SwapIn of the tensor, or a SwapOut of it not yet waited for")
        self._record()

    def _record(self) -> None:
        self.tl_t.append(self.t)
        self.tl_b.append(self.mem)

    def finish(self) -> SimulationResult:
        p = self.problem
        for o in p.outputs:
            if p.tensors[o].kind == INPUT:
                continue
            if o not in self.resident:
                what = "never computed" if o not in self.produced else "not resident at the end"
                raise ScheduleError(f"output {p.tensors[o].name!r} (loss, model output or gradient) is {what}")
        time_s = max(self.t, self.d2h_free, self.h2d_free)
        return SimulationResult(
            peak_bytes=int(self.peak), total_peak_bytes=int(self.peak + p.fixed.resident_bytes),
            peak_index=int(self.peak_index), time_s=time_s, compute_s=self.compute_s,
            recompute_s=self.recompute_s, stall_s=self.stall_s, added_s=time_s - p.total_compute_s,
            d2h_bytes=int(self.d2h_bytes), h2d_bytes=int(self.h2d_bytes), host_peak_bytes=int(self.host_peak),
            timeline_t=np.asarray(self.tl_t, dtype=np.float64), timeline_bytes=np.asarray(self.tl_b, dtype=np.int64))


def simulate(problem: RematProblem, schedule: Schedule | None = None, budget: int | None = None) -> SimulationResult:
    """Simulate ``schedule`` (the no-remat plan if ``None``) on ``problem``.

    Parameters
    ----------
    problem : RematProblem
    schedule : Schedule, optional
    budget : int, optional
        Graph-memory budget, bytes.

    Returns
    -------
    SimulationResult

    Raises
    ------
    ScheduleError
        The plan is invalid; the message names the instruction.
    BudgetExceededError
        The plan goes over ``budget``.
    """
    if schedule is None:
        from ..ir.schedule import no_remat_schedule

        schedule = no_remat_schedule(problem)
    return Simulator(problem, budget).run(schedule)


def resident_at(problem: RematProblem, schedule: Schedule, index: int) -> set[int]:
    """Tensor ids resident on the device just after instruction ``index``
    (e.g. ``result.peak_index`` to see what is live at the peak)."""
    sim = Simulator(problem)
    sim.run(schedule, stop=index + 1)
    return set(sim.resident)


def no_remat_peak(problem: RematProblem) -> int:
    """Peak graph memory of the no-remat plan (bytes): the reference that
    relative budgets refer to.  Simulated once per problem and kept with its
    tables (:meth:`~libra_opt.ir.tables.ProblemTables.memo`: a problem is
    immutable)."""
    return problem.tables.memo("simulator.no_remat_peak", lambda: simulate(problem).peak_bytes)
