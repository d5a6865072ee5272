"""The Inductor executor: the planned forward and backward graphs compiled by Inductor.

``optimize(..., executor="inductor")`` (the default on CUDA) keeps the whole
runtime pipeline of :mod:`libra_opt.runtime.module` (TorchDynamo, AOTAutograd,
the partition hook that lowers the plan with
:func:`~libra_opt.runtime.partition.lower_plan`) and changes only what the
forward and backward compilers return: instead of the FX graphs run op by op,
:class:`InductorCompiler` returns Inductor's compiled code for them
(``torch._inductor.compile_fx.compile_fx_inner``, the function
``torch.compile``'s own AOTAutograd path calls on the graphs its partitioner
produced).  Per graph:

1. **Swaps become operators.**  The swap steps (bound methods of
   :class:`~libra_opt.runtime.swap.SwapManager`) are rewritten into the
   side-effecting custom operators of
   :mod:`libra_opt.runtime.offload_ops` (``libra::offload`` / ``reload`` /
   ``wait`` / ``wait_offload`` / ``poll``); the plan-directed frees (:func:`release` nodes) are
   dropped (see "Memory" below).
2. **Decomposition.**  The graph is retraced with ``make_fx`` under
   Inductor's decomposition table (``select_decomp_table()``), as
   ``torch.compile`` applies it while tracing, so that e.g.
   ``native_layer_norm`` becomes fusable pointwise and reduction ops instead
   of an eager fallback.  The retrace follows the plan's instruction order.
3. **Compilation** with ``compile_fx_inner`` (static inputs: parameters and
   buffers in the forward, the saved values in the backward, as
   ``compile_fx`` marks them); with ``cuda_graphs=True`` Inductor's CUDA graph
   trees replay both graphs.

**Which graph the plan is made on.**  Plans are made on the graph the capture
produces: AOTAutograd's joint forward+backward **aten graph before Inductor's
decompositions and fusion** (the same graph the eager executor runs).  Every
node of the problem is one aten op of that graph; its measured time is that
op's eager kernel time (:mod:`libra_opt.profiling`).  Under Inductor one
planned node becomes zero or more decomposed ops (step 2), and these are
scheduled into kernels: a chain of pointwise / reduction nodes fuses into one
generated kernel, matmuls and convolutions stay library calls (``extern_kernels``),
views cost nothing.  So the map from plan costs to Inductor's kernels is
many-to-one: the sum of the planned times of a fused chain is usually
above its kernel's time (one launch and one pass over memory: a fused
pointwise chain costs about the bytes its kernel reads and writes), and a
library call costs what the planned op costs.  Recomputed nodes live in the backward graph (the partition puts them
there), so Inductor fuses a recomputed pointwise chain with its backward
consumers; pricing it as it runs fused is the cost model's job (issue 10,
item 4), not this module's.

**Memory.**  Inductor plans buffer lifetimes itself: its generated code frees
each buffer after its last use (``del buf``), and fused chains never
materialize their intermediates.  The :func:`~libra_opt.runtime.partition.release`
nodes of the eager graphs only mark frees *later* than a value's last read;
Inductor frees at the last read instead, which is never later than the plan's
``Free``, so at every point of the plan's order the live graph values are a
subset of those the plan counts.  Inductor's own passes may reorder nodes
(fusion moves a node to its fused group); the plan's peak is then not a
proof, and ``tests/test_runtime_inductor.py`` measures that the peak of a
planned step under this executor is not above the eager executor's on CPU.
That measurement uses the profiler's memory events
(:func:`step_peak_bytes`), not :class:`~libra_opt.runtime.executor.StorageTracker`:
Inductor's generated code allocates its buffers with
``empty_strided_cpu`` / ``empty_strided_cuda`` directly, below the Python
dispatcher, so a ``TorchDispatchMode`` never sees them (it sees only the
outputs of library calls and fallback ops); the profiler's allocator events
see every allocation of both executors.  On CUDA ``max_memory_allocated`` /
``max_memory_reserved`` measure it (``tests/test_runtime_cuda.py``).
With swaps, Inductor's buffer reuse and in-place kernels are switched off
(``allow_buffer_reuse=False``, ``inplace_buffers=False``) so a storage being
copied out is never overwritten; freed buffers then return to the caching
allocator as in the eager executor.

**Random ops.**  By default Inductor draws random numbers (dropout masks)
from seeds of its own per compiled graph, as ``torch.compile`` does, so a
random op recomputed in the backward graph would draw a mask other than its
forward's.  A plan that recomputes a random op (a
:func:`~libra_opt.capture_passes.replay_random` node in its graphs) is
therefore compiled with ``fallback_random=True`` (``torch._inductor.config.patch``,
for these two graphs only) and with PyTorch's RNG-state operators
(:func:`with_rng_replay`): the forward's ``libra.rng_state`` and random op
become one ``run_and_save_rng_state(op, ...)`` (the state read and the draw
in one fallback kernel, so no reordering by Inductor's scheduler, on torch
2.11 or 2.13, can put another draw between them), and each recompute a
``run_with_rng_state(state, op, ...)`` (generator set to the saved state,
``op`` run, generator restored).  Both are Inductor fallback kernels that run
aten's own random kernels, drawing from the default generator as eager
PyTorch does: the recomputed mask is the forward's, and the RNG stream
after the step is eager's.  The forward's masks are eager's too while
Inductor keeps the random ops in the graph's order, as its scheduler does for
fallback kernels (nothing but that order ties two independent random ops;
``tests/test_runtime_inductor.py`` checks it on CPU, ``tests/test_rng_recompute.py``
on CUDA).  A fallback random op is not fused: the price of replaying it.  A
saved state the plan swaps goes through ``libra::offload`` / ``reload`` like
any saved value (``run_with_rng_state`` copies a state reloaded onto a CUDA
device back to the host).  ``run_and_save_rng_state``'s fake rule returns the real state, so
tracing and compiling such a graph lets operators read real tensors
(:func:`real_rng_states`).  Inductor runs graphs holding these operators
without CUDA graphs (``FORBIDDEN_CUDAGRAPH_OPS``): with ``cuda_graphs=True``
it logs that and runs them uncaptured.  Plans that recompute no random op
keep Inductor's own random numbers.

**CUDA graphs** (``cuda_graphs=True``; only for plans without swaps: a swap
synchronizes two streams and reuses host buffers, which a replayed graph
cannot follow).  CUDA graph trees allocate every buffer of both graphs from
one private memory pool, in the same order and with the same lifetimes as
without graphs, so the pool's high-water mark is the compiled graphs' peak
(at most the plan's, as above; ``tests/test_runtime_cuda.py`` measures it
against the plan's peak plus the input copies); what is added
on top are the static copies of the inputs that are not parameters or buffers
(the batch: TorchDynamo's user inputs, copied into the pool on every replay)
and, between forward and backward, nothing else (the saved values are the
planned ones).  :attr:`InductorCompiler.cuda_graph_input_bytes` holds those
bytes; ``OptimizedModule`` adds them to the predicted peak it reports
(``predicted_peak_bytes``).

Sources: PyTorch 2 (Ansel et al., ASPLOS 2024), TorchInductor
(``torch._inductor.compile_fx.compile_fx_inner``,
``torch._inductor.decomposition.select_decomp_table``, ``config.fallback_random``,
CUDA graph trees); ``torch.fx.experimental.proxy_tensor.make_fx``;
``torch._prims.rng_prims`` (``run_and_save_rng_state`` / ``run_with_rng_state``,
as AOTAutograd's ``functionalize_rng_ops`` uses them).
"""
from __future__ import annotations

import contextlib
import itertools
import logging
import operator

import torch
import torch.fx as fx

from libra_opt.frontend.capture_passes import RNG_STATE, RNG_STATE_META, replay_random
from libra_opt.errors import ExecutorError

from . import offload_ops
from .partition import release

logger = logging.getLogger(__name__)

__all__ = ["EXECUTORS", "resolve_executor", "check_cuda_graphs", "with_swap_ops", "decompose",
           "InductorCompiler", "step_peak_bytes", "replays_random", "with_rng_replay", "real_rng_states"]

#: executors ``optimize`` accepts
EXECUTORS = ("inductor", "eager")
_graph_ids = itertools.count(1 << 20)


def resolve_executor(executor: str | None, device) -> str:
    """The executor to use: ``executor``, or ``"inductor"`` on CUDA and
    ``"eager"`` elsewhere when it is ``None``.

    Raises
    ------
    ExecutorError
        ``executor`` is not one of :data:`EXECUTORS`.
    """
    if executor is None:
        return "inductor" if torch.device(device).type == "cuda" else "eager"
    if executor not in EXECUTORS:
        raise ExecutorError(f"unknown executor {executor!r}; use one of {', '.join(map(repr, EXECUTORS))} "
                            f"(or None: 'inductor' on CUDA, 'eager' elsewhere)")
    return executor


def check_cuda_graphs(cuda_graphs: bool, executor: str, device, swaps: int) -> None:
    """Refuse ``cuda_graphs=True`` where it cannot run.

    Raises
    ------
    ExecutorError
        ``cuda_graphs`` with an executor other than ``"inductor"``, on a
        device other than CUDA, or with a plan that swaps (``swaps`` > 0
        swapped tensors).
    """
    if not cuda_graphs:
        return
    if executor != "inductor":
        raise ExecutorError(f"cuda_graphs=True needs executor='inductor' (got {executor!r}): CUDA graphs "
                            f"are Inductor's CUDA graph trees")
    if torch.device(device).type != "cuda":
        raise ExecutorError(f"cuda_graphs=True needs a CUDA model (the model is on {device}); "
                            f"drop cuda_graphs")
    if swaps:
        raise ExecutorError(f"cuda_graphs=True needs a plan without swaps (this one swaps {swaps} tensors): "
                            f"plan with a recompute-only solver (e.g. solver='checkmate-milp' or "
                            f"'checkpoint-all', or libra's policy='recompute') or drop cuda_graphs")


def with_swap_ops(gm: fx.GraphModule, swap) -> fx.GraphModule:
    """``gm`` with its swap steps as ``libra`` operators and its
    :func:`~libra_opt.runtime.partition.release` nodes removed (in place;
    returned for chaining).

    ``swap.offload(t)`` -> ``libra::offload(t, id)``;
    ``swap.reload(host, dtype, size, stride, offset, last)`` ->
    ``libra::reload(host, id, device, size, stride, last)``;
    ``swap.wait(t)`` -> ``libra::wait(t, id)`` (mutating: its users read
    ``t``); ``swap.wait_offload(host)`` -> ``libra::wait_offload(host, id)``;
    ``swap.poll()`` -> ``libra::poll(id)``.
    """
    g = gm.graph
    mid = offload_ops.register_manager(swap) if swap is not None else None
    for n in list(g.nodes):
        if n.op != "call_function":
            continue
        t = n.target
        if t is release:
            g.erase_node(n)
            continue
        if swap is None or getattr(t, "__self__", None) is not swap:
            continue
        name = t.__name__
        with g.inserting_before(n):
            if name == "offload":
                new = g.call_function(offload_ops.offload, (n.args[0], mid))
                src = n.args[0].meta.get("val")
                if isinstance(src, torch.Tensor):
                    mode = getattr(src, "fake_mode", None)
                    with mode if mode is not None else contextlib.nullcontext():
                        new.meta = dict(n.meta, val=torch.empty(src.shape, dtype=src.dtype, device="cpu"))
                    n.meta = new.meta
            elif name == "reload":
                host, _dtype, size, stride, _offset, last = n.args
                new = g.call_function(offload_ops.reload, (host, mid, swap.device, list(size), list(stride),
                                                           bool(last)))
            elif name == "wait":
                g.call_function(offload_ops.wait, (n.args[0], mid))
                new = n.args[0]
            elif name == "wait_offload":
                g.call_function(offload_ops.wait_offload, (n.args[0], mid))
                new = None
            elif name == "poll":
                g.call_function(offload_ops.poll, (mid,))
                new = None
            else:   # pragma: no cover - the partition emits only the five above
                raise ExecutorError(f"unknown swap step {name!r} in the lowered graph")
        if new is not None:
            if isinstance(new, fx.Node) and new is not n.args[0]:
                new.meta = dict(n.meta)
            n.replace_all_uses_with(new)
        g.erase_node(n)
    g.lint()
    gm.recompile()
    return gm


def decompose(gm: fx.GraphModule, example_inputs) -> fx.GraphModule:
    """Retrace ``gm`` with ``make_fx`` under Inductor's decomposition table
    (``torch._inductor.decomposition.select_decomp_table``), in its own
    order, under the fake mode of ``example_inputs`` (AOTAutograd's)."""
    from torch._guards import detect_fake_mode
    from torch._inductor.decomposition import select_decomp_table
    from torch.fx.experimental.proxy_tensor import make_fx

    interp = fx.Interpreter(gm)

    def run(*args):
        return interp.run(*args)

    mode = detect_fake_mode(example_inputs)
    with mode if mode is not None else contextlib.nullcontext(), real_rng_states(gm, mode):
        out = make_fx(run, decomposition_table=select_decomp_table())(*example_inputs)
    return out


@contextlib.contextmanager
def real_rng_states(gm: fx.GraphModule, mode):
    """While tracing or compiling ``gm`` under the fake mode ``mode``: let an
    operator read a real tensor where ``gm`` saves generator states with
    ``run_and_save_rng_state`` (its fake rule returns the real state,
    ``torch._prims.rng_prims``; a swap of that state reads it).  Sets
    ``FakeTensorMode.allow_non_fake_inputs`` and puts it back."""
    if mode is None or not any(n.target is _run_and_save_rng_state() for n in gm.graph.nodes):
        yield
        return
    allow = mode.allow_non_fake_inputs
    mode.allow_non_fake_inputs = True
    try:
        yield
    finally:
        mode.allow_non_fake_inputs = allow


def _run_and_save_rng_state():
    from torch._prims.rng_prims import run_and_save_rng_state

    return run_and_save_rng_state


def replays_random(lowered) -> bool:
    """Whether ``lowered`` (a :class:`~libra_opt.runtime.partition.LoweredPlan`)
    recomputes a random op: a :func:`~libra_opt.capture_passes.replay_random`
    node in its forward or backward graph."""
    return any(n.op == "call_function" and n.target is replay_random
               for gm in (lowered.fw, lowered.bw) for n in gm.graph.nodes)


def with_rng_replay(gm: fx.GraphModule) -> int:
    """Rewrite the random ops of ``gm`` into PyTorch's RNG-state operators
    (in place), so that Inductor replays a recomputed random op with the
    forward's random numbers:

    - a forward random op ``r = op(*a)`` whose state node ``s =
      libra.rng_state(device)`` (:data:`~libra_opt.capture_passes.RNG_STATE_META`)
      is in ``gm`` becomes ``t = run_and_save_rng_state(op, *a)``,
      ``s = t[0]``, ``r = t[1]`` at ``r``'s place: the state is read and the
      op draws in one fallback kernel, so no reordering by Inductor's
      scheduler can put another draw between them;
    - a recompute ``replay_random(s, op, *a)`` becomes
      ``run_with_rng_state(s, op, *a)`` (set the generator to ``s``, run,
      restore it): Inductor runs both as fallback kernels (calls of the
      operators in its generated code), and with ``fallback_random=True``
      ``op`` is aten's own kernel, drawing from the default generator as
      eager PyTorch does.  A state the plan swapped is reloaded onto the
      device; ``run_with_rng_state`` copies it back to the host on CUDA (and
      on a CPU it never left the host).

    Returns
    -------
    int
        Number of nodes rewritten.

    Raises
    ------
    ExecutorError
        A state node is read (e.g. swapped out) before its random op runs,
        which one fused save-and-draw cannot follow.

    Source: ``torch._prims.rng_prims`` (``run_and_save_rng_state`` /
    ``run_with_rng_state``, the pair AOTAutograd's ``functionalize_rng_ops``
    emits; Inductor lowers both to fallback kernels, ``torch._inductor.lowering``).
    """
    from torch._prims.rng_prims import run_and_save_rng_state, run_with_rng_state

    g = gm.graph
    by_name = {n.name: n for n in g.nodes}
    order = {n: i for i, n in enumerate(g.nodes)}
    done = 0
    for n in list(g.nodes):
        if n.op != "call_function":
            continue
        if n.target is replay_random:
            n.target = run_with_rng_state
            done += 1
            continue
        s = by_name.get(n.meta.get(RNG_STATE_META, ""))
        if s is None or s.target is not RNG_STATE:
            continue
        early = [u for u in s.users if u is not n and order[u] < order[n]]
        if early:
            raise ExecutorError(f"the plan reads the RNG state {s.name!r} ({early[0].name!r}) before its random op "
                                f"{n.name!r} runs; the inductor executor saves the state as the op draws: use "
                                f"executor='eager' for this plan")
        with g.inserting_before(n):
            both = g.call_function(run_and_save_rng_state, (n.target, *n.args), dict(n.kwargs))
            state = g.call_function(operator.getitem, (both, 0))
            out = g.call_function(operator.getitem, (both, 1))
        both.meta = dict(n.meta, val=(s.meta.get("val"), n.meta.get("val")))
        state.meta, out.meta = dict(s.meta), dict(n.meta)
        s.replace_all_uses_with(state)
        n.replace_all_uses_with(out)
        g.erase_node(n)
        g.erase_node(s)
        done += 1
    if done:
        g.lint()
        gm.recompile()
    return done


def _static_bw(gm: fx.GraphModule) -> list[int]:
    """Indices of the backward graph's saved-value placeholders (before the tangents)."""
    ph = [n for n in gm.graph.nodes if n.op == "placeholder"]
    return [i for i, n in enumerate(ph) if not n.name.startswith("tangents")]


class InductorCompiler:
    """Compiles one optimized module's forward and backward graphs with Inductor.

    Parameters
    ----------
    swap : SwapManager
        The module's swap manager (its steps become ``libra`` operators).
    has_swaps : bool
        The plan swaps: compile without Inductor's buffer reuse and in-place
        kernels (see the module docstring).
    cuda_graphs : bool
        Replay both graphs as CUDA graphs (checked by :func:`check_cuda_graphs`).

    Attributes
    ----------
    cuda_graph_input_bytes : int
        With ``cuda_graphs``: bytes of the forward's non-static inputs that
        CUDA graph trees copy into their pool (0 otherwise).
    compiled : dict
        ``"forward"`` / ``"backward"``: the decomposed graphs Inductor compiled.
    fallback_random : bool
        The plan recomputes a random op: both graphs are compiled with
        ``fallback_random=True`` and PyTorch's RNG-state operators
        (:func:`with_rng_replay`), set by :meth:`prepare`.

    Source: ``torch._inductor.compile_fx.compile_fx_inner`` (as ``compile_fx``'s
    ``fw_compiler_base`` / ``bw_compiler`` call it).
    """

    def __init__(self, swap, *, has_swaps: bool, cuda_graphs: bool = False):
        from torch._inductor.utils import BoxedBool

        self.swap = swap
        self.has_swaps = bool(has_swaps)
        self.cuda_graphs = bool(cuda_graphs)
        self._cudagraphs = BoxedBool(self.cuda_graphs)
        self._graph_id = next(_graph_ids)
        self._device_index = None
        self.cuda_graph_input_bytes = 0
        self.fallback_random = False
        self.compiled: dict[str, fx.GraphModule] = {}
        offload_ops.register_inductor_lowerings()

    def _config(self):
        from torch._inductor import config

        opts = {}
        if self.has_swaps:
            opts.update(allow_buffer_reuse=False, inplace_buffers=False)
        if self.fallback_random:
            opts.update(fallback_random=True)
        return config.patch(**opts) if opts else contextlib.nullcontext()

    def prepare(self, lowered) -> None:
        """Rewrite the swap steps of ``lowered`` (a
        :class:`~libra_opt.runtime.partition.LoweredPlan`) into ``libra``
        operators, in the partition hook, before AOTAutograd reads the saved
        values' metadata: a host buffer is then a contiguous CPU tensor of the
        swapped tensor's shape and dtype in both graphs.  Also decides
        :attr:`fallback_random` (whether the plan recomputes a random op)."""
        self.fallback_random = replays_random(lowered)
        fw = with_swap_ops(lowered.fw, self.swap)
        bw = with_swap_ops(lowered.bw, self.swap)
        out = next(iter(fw.graph.find_nodes(op="output")))
        saved = list(out.args[0])[lowered.num_fwd_outputs:]
        ph = [n for n in bw.graph.nodes if n.op == "placeholder"]
        for s_node, p_node in zip(saved, ph):
            if isinstance(s_node, fx.Node) and s_node.target is offload_ops.offload:
                p_node.meta = dict(p_node.meta, val=s_node.meta["val"])

    def _compile(self, gm: fx.GraphModule, example_inputs, *, is_backward: bool):
        from torch._inductor import compile_fx as cfx

        if is_backward:
            static = _static_bw(gm)
        elif hasattr(cfx, "get_static_input_idxs"):
            static = list(cfx.get_static_input_idxs(0))   # parameters and buffers (AOTAutograd's metadata)
        else:   # pragma: no cover - torch versions that lift parameters before the graph's inputs
            static = []
        if self.fallback_random:
            with_rng_replay(gm)
        with self._config():     # fallback_random also selects the decomposition table
            dgm = decompose(gm, example_inputs)
        self.compiled["backward" if is_backward else "forward"] = dgm
        if self.cuda_graphs and not is_backward:
            static_set = set(static)
            self.cuda_graph_input_bytes = sum(
                int(t.untyped_storage().nbytes()) for i, t in enumerate(example_inputs)
                if isinstance(t, torch.Tensor) and i not in static_set)
        if self._device_index is None:
            from torch._inductor.cudagraph_utils import BoxedDeviceIndex

            self._device_index = BoxedDeviceIndex(None)
        from torch._guards import detect_fake_mode

        with self._config(), real_rng_states(dgm, detect_fake_mode(example_inputs)):
            out = cfx.compile_fx_inner(dgm, example_inputs, static_input_idxs=static,
                                       cudagraphs=self._cudagraphs,
                                       is_backward=is_backward, graph_id=self._graph_id,
                                       boxed_forward_device_index=self._device_index)
        if self.cuda_graphs and not self.cuda_graphs_used:
            logger.warning("cuda_graphs=True: Inductor did not use CUDA graphs for the %s graph (see "
                           "TORCH_LOGS=perf_hints for the reason); it runs without them",
                           "backward" if is_backward else "forward")
        return out

    @property
    def cuda_graphs_used(self) -> bool:
        """Whether Inductor kept CUDA graphs for the graphs compiled so far
        (it turns them off, with a log message, for graphs it cannot capture)."""
        return bool(self._cudagraphs.value)

    def forward(self, gm: fx.GraphModule, example_inputs):
        """The compiled forward graph (boxed: call with one list)."""
        return self._compile(gm, example_inputs, is_backward=False)

    def backward(self, gm: fx.GraphModule, example_inputs):
        """The compiled backward graph (boxed: call with one list)."""
        return self._compile(gm, example_inputs, is_backward=True)


def step_peak_bytes(fn, device=None) -> tuple[int, object]:
    """Peak bytes allocated on ``device`` (default CPU) while ``fn()`` runs,
    above what was allocated when it started, from the profiler's allocation
    events (``torch.profiler.profile(profile_memory=True)``, its event tree's
    ``Allocation`` records): every allocation of the device's allocator,
    including Inductor's ``empty_strided_*`` buffers that a
    :class:`~libra_opt.runtime.executor.StorageTracker` cannot see.

    Returns
    -------
    (peak_bytes, result of fn())
    """
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile

    dev = torch.device(device or "cpu")
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    with profile(activities=acts, profile_memory=True) as prof:
        res = fn()
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    allocs = []
    while stack:
        e = stack.pop()
        stack.extend(e.children)
        if e.tag == _EventType.Allocation and e.extra_fields.device.type == dev.type:
            allocs.append((e.start_time_ns, e.extra_fields.alloc_size))
    live = peak = 0
    for _, n in sorted(allocs, key=lambda a: a[0]):
        live += n
        peak = max(peak, live)
    return peak, res
