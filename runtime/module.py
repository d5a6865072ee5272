"""The optimized module: a model that trains under a rematerialization plan.

:class:`OptimizedModule` wraps the model in ``torch.compile(fullgraph=True,
dynamic=False)`` with a backend of our own: AOTAutograd
(``torch._dynamo.backends.common.aot_autograd``) whose partition hook lowers
the plan to a forward and a backward FX graph
(:func:`libra_opt.runtime.partition.lower_plan`).  The forward and backward
compilers pick the executor: ``"eager"`` runs the graph modules themselves op by
op (bitwise equal to eager PyTorch on CPU), ``"inductor"`` compiles them with
Inductor (:mod:`libra_opt.runtime.inductor`; swaps as ``libra::`` custom
operators, optionally CUDA graphs).  The
result is called like the model (outputs keep their structure: a
``transformers`` ``ModelOutput`` stays one), a loss is computed on it, and
``loss.backward()`` / ``optimizer.step()`` work as usual.

Shapes: the first plan is made for the example inputs' shapes.  Each call
is keyed by :func:`libra_opt.plan_cache.call_key` (input shapes, dtypes, the
autocast dtype); a key other than the example's gets a plan of its own from
the module's :class:`~libra_opt.plan_cache.ShapePlanner` (captured at the new
shape, priced from the profiled problem, solved under the same budget) and a
compiled step of its own (a fresh code object, so TorchDynamo never reaches
its recompile limit).  Without a planner, or past ``max_shapes`` plans, a new
shape raises :class:`~libra_opt.errors.ShapeMismatchError`.  Under
``torch.no_grad()`` the model runs eagerly (AOTAutograd's inference graph;
there are no activations to plan).

Sources: PyTorch 2 (Ansel et al., ASPLOS 2024): TorchDynamo backends and
AOTAutograd's ``partition_fn`` / ``fw_compiler`` / ``bw_compiler`` hooks.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import warnings

import torch
from torch import nn

from libra_opt.frontend.capture import autocast_context, check_example_shapes, example_input_shapes, step_function
from libra_opt.frontend.capture_passes import apply_graph_passes, apply_joint_passes
from libra_opt.errors import InputMismatchError, LibraOptError, RuntimeExecutionError
from libra_opt.ir.problem import RematProblem

from .inductor import InductorCompiler, check_cuda_graphs, resolve_executor
from .partition import LoweredPlan, lower_plan
from .swap import SwapManager

logger = logging.getLogger(__name__)

__all__ = ["OptimizedModule", "eager_boxed"]


def eager_boxed(gm, example_inputs):
    """An AOTAutograd compiler that runs ``gm`` as it is: ``gm.forward``
    wrapped for the boxed calling convention (inputs as one list, cleared by
    the callee; ``functorch.compile.make_boxed_func``).  Used for the
    inference graph of an optimized module (no plan runs without grad) and for
    the pieces :func:`~libra_opt.runtime.split.capture_pieces` compiles while
    capturing.  ``example_inputs`` is unused (the compiler signature)."""
    from functorch.compile import make_boxed_func

    return make_boxed_func(gm.forward)


def _skipped_by_outer_compile(fn):
    """``torch.compiler.disable(fn)`` with the reason TorchDynamo gives when
    an outer ``torch.compile(..., fullgraph=True)`` reaches it (``reason=``
    is taken by torch >= 2.8)."""
    reason = ("an OptimizedModule runs its plan under a torch.compile of its own; compile the plain model "
              "with torch.compile(model, backend=libra_opt.backend(budget=...)) instead")
    try:
        return torch.compiler.disable(fn, reason=reason)
    except TypeError:   # pragma: no cover - torch < 2.8
        return torch.compiler.disable(fn)


@dataclasses.dataclass
class ShapePlan:
    """The plan of one call key other than the example's (see
    :mod:`libra_opt.plan_cache`): its problem and
    :class:`~libra_opt.solvers.SolveResult`, the autocast dtype it runs
    under, and its runtime (compiled step, Inductor compiler, lowered graphs
    after the first training call)."""

    key: tuple
    problem: RematProblem
    plan: object
    autocast_dtype: torch.dtype | None
    compiled: object = None
    inductor: InductorCompiler | None = None
    lowered: LoweredPlan | None = None


class OptimizedModule(nn.Module):
    """A model that executes a rematerialization plan in every training step.

    Parameters
    ----------
    model : torch.nn.Module
        The model the plan was made for (its parameters are shared, not copied).
    problem : RematProblem
        The captured problem the plan refers to.
    plan : SolveResult
        From :func:`libra_opt.solvers.solve`; ``plan.schedule`` is executed.
    example_shapes : list of tuple
        Shapes of the example tensor inputs (see
        :func:`libra_opt.capture.example_input_shapes`).
    autocast_dtype : torch.dtype, optional
        Each call runs the forward and the loss under ``torch.autocast`` with
        this dtype (the backward outside it), as captured.
    loss_fn : callable, optional
        If the plan was made for ``loss_fn(model(...))``, calls return the loss.
    device : torch.device, optional
        The compute device (default: the first parameter's).
    executor : {"eager", "inductor"} or None
        How the planned graphs run: op by op (``"eager"``, the default here)
        or compiled by Inductor (see :mod:`libra_opt.runtime.inductor`);
        ``None``: ``"inductor"`` on CUDA, ``"eager"`` elsewhere.
    cuda_graphs : bool
        Replay the Inductor-compiled graphs as CUDA graphs (CUDA,
        ``executor="inductor"`` and a plan without swaps only).
    example_key : tuple, optional
        :func:`libra_opt.plan_cache.call_key` of the example (its inputs and
        autocast dtype).  With ``planner``, calls with another key get plans
        of their own.
    planner : ShapePlanner, optional
        Plans a new key (:class:`libra_opt.plan_cache.ShapePlanner`);
        ``None``: a new shape raises :class:`~libra_opt.errors.ShapeMismatchError`.
    follow_autocast : bool
        The autocast of each call is the one active around it (``torch.autocast``;
        part of the key); default: when ``autocast_dtype`` is None.  Otherwise
        every call runs under ``autocast_dtype``.

    Raises
    ------
    RuntimeExecutionError
        The plan has no schedule.
    ExecutorError
        Unknown ``executor``, or ``cuda_graphs`` where it cannot apply.

    Attributes
    ----------
    plan : SolveResult
        Schedule, predicted peak bytes (``plan.peak_bytes``) and step time
        (``plan.time_s``).
    problem : RematProblem
    lowered : LoweredPlan or None
        The forward/backward graphs, after the first training call.
    swap : SwapManager
        Transfer stream, host buffer pool and copy counters.
    executor : str
        ``"eager"`` or ``"inductor"``.
    inductor : InductorCompiler or None
        The Inductor compiler of the two graphs (``executor="inductor"``).
    shape_plans : dict
        :class:`ShapePlan` per call key other than the example's, planned so far.
    """

    def __init__(self, model: nn.Module, problem: RematProblem, plan, *, example_shapes,
                 autocast_dtype: torch.dtype | None = None, loss_fn=None, device=None,
                 executor: str | None = "eager", cuda_graphs: bool = False, example_key: tuple | None = None,
                 planner=None, follow_autocast: bool | None = None):
        super().__init__()
        self.problem = problem
        sched = plan.schedule
        if sched is None:
            raise RuntimeExecutionError(f"the plan has no schedule (status {plan.status!r}): {plan.message}")
        self._settings(model, plan, example_shapes, autocast_dtype, loss_fn, device, executor, cuda_graphs,
                       swaps=len(sched.swapped_tensors()))
        self.example_key = example_key
        self.planner = planner
        self.follow_autocast = autocast_dtype is None if follow_autocast is None else bool(follow_autocast)
        self._build_runtime()

    def _settings(self, model, plan, example_shapes, autocast_dtype, loss_fn, device, executor, cuda_graphs, *,
                  swaps: int) -> None:
        """Set the model, plan and settings (``swaps``: tensors the plan swaps,
        for the CUDA-graph check); raises :class:`ExecutorError` as ``__init__``."""
        self.model = model
        self.plan = plan
        self.autocast_dtype = autocast_dtype
        self.loss_fn = loss_fn
        if device is None:
            device = next((p.device for p in model.parameters()), torch.device("cpu"))
        self.device = torch.device(device)
        self.example_shapes = [tuple(s) for s in example_shapes]
        self.executor = resolve_executor(executor, self.device)
        self.cuda_graphs = bool(cuda_graphs)
        check_cuda_graphs(self.cuda_graphs, self.executor, self.device, swaps)
        self._eval_warned = False

    # ------------------------------------------------------------ runtime state, copy and pickle
    #: attributes rebuilt, never copied or pickled: they hold the compiled
    #: callable (whose closure names the model), the lowered graphs (bound to
    #: this module's swap manager) and CUDA streams, events and pinned buffers
    _RUNTIME_ATTRS = ("_compiled", "swap", "inductor", "lowered", "_ran", "_tracker", "shape_plans")

    def _compile(self):
        """The training step (model, then ``loss_fn``) under ``torch.compile``
        with this module's backend; a fresh code object per module (see
        :func:`libra_opt.capture.step_function`)."""
        fn = step_function(self.model, self.loss_fn, autocast_dtype=self.autocast_dtype, device=self.device)
        return torch.compile(fn, backend=self._backend, fullgraph=True, dynamic=False)

    def _build_runtime(self) -> None:
        """Create what executes the plan for **this** module's model: the swap
        manager (host pool reserved for the plan's swapped storages, bytes), no
        lowered graphs yet, the Inductor compiler of the executor (or
        ``None``), and the compiled step."""
        self.swap = SwapManager(self.device)
        swapped = self.plan.schedule.swapped_tensors()
        self.swap.pool.reserve_buffers(self.problem.tensors[t].nbytes for t in swapped)
        self.inductor = (InductorCompiler(self.swap, has_swaps=bool(swapped), cuda_graphs=self.cuda_graphs)
                         if self.executor == "inductor" else None)
        self.lowered: LoweredPlan | None = None
        self._ran = False
        self._tracker = None
        self._compiled = self._compile()
        self.shape_plans: dict[tuple, ShapePlan] = {}     # other call keys: planned on first use

    def __getstate__(self) -> dict:
        """State for :mod:`copy` / :mod:`pickle` / ``torch.save``: the model,
        problem, plan and settings; the runtime attributes
        (:attr:`_RUNTIME_ATTRS`) are left out and rebuilt by :meth:`__setstate__`."""
        state = super().__getstate__()
        for k in self._RUNTIME_ATTRS:
            state.pop(k, None)
        return state

    def __setstate__(self, state: dict) -> None:
        """Restore a copied or unpickled module and rebuild its runtime for
        its own model: a ``copy.deepcopy`` trains its copy of the parameters
        and buffers, never the original's, and recompiles on its first call."""
        super().__setstate__(state)
        self.__dict__.setdefault("_eval_warned", False)
        for k, v in (("example_key", None), ("planner", None), ("follow_autocast", self.autocast_dtype is None)):
            self.__dict__.setdefault(k, v)    # pickled before plans per shape: the example's shapes only
        self._build_runtime()

    # ------------------------------------------------------------ state dict
    def state_dict(self, *args, destination=None, prefix: str = "", keep_vars: bool = False):
        """The model's state dict, with the model's own keys (no ``model.``
        prefix): a checkpoint of the optimized module loads into the plain
        model and the other way round, under ``strict=True``, also when the
        optimized module is a submodule.

        ``named_parameters()`` / ``named_modules()`` still describe the
        module tree (``model.<name>``), so that ``get_parameter`` and
        ``torch.func.functional_call`` resolve them.  Same pattern as
        ``torch.distributed``'s ``checkpoint_wrapper`` (state-dict hooks that
        strip its wrapper prefix); source: ``torch.nn.Module.state_dict``.
        """
        out = super().state_dict(*args, destination=destination, prefix=prefix, keep_vars=keep_vars)
        if len(args) > 1:  # the deprecated positional form (destination, prefix, keep_vars)
            prefix = args[1]
        inner = prefix + "model."
        for k in [k for k in out if k.startswith(inner)]:
            out[prefix + k[len(inner):]] = out.pop(k)
        meta = getattr(out, "_metadata", None)
        if meta is not None:
            for k in [k for k in meta if k == inner[:-1] or k.startswith(inner)]:
                meta[prefix[:-1] if k == inner[:-1] else prefix + k[len(inner):]] = meta.pop(k)
        return out

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        """Load a state dict with the model's own keys (as :meth:`state_dict`
        writes them, and as the plain model's ``state_dict()`` has them) into
        the model; returns ``torch.nn.Module.load_state_dict``'s result (keys
        without a prefix).  A state dict saved from an optimized module by
        libra-opt before this convention has keys under ``model.``: strip
        them first with
        ``torch.nn.modules.utils.consume_prefix_in_state_dict_if_present(sd, "model.")``.

        Raises
        ------
        RuntimeError
            ``strict`` and the keys differ (``torch.nn.Module.load_state_dict``).
        """
        return self.model.load_state_dict(state_dict, strict=strict, assign=assign)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        """As a submodule being loaded: the keys under ``prefix`` are the
        model's, so put them under ``prefix + "model."`` (where the model
        is) before ``torch.nn.Module`` loads them."""
        for k in [k for k in state_dict if k.startswith(prefix)]:
            state_dict[prefix + "model." + k[len(prefix):]] = state_dict.pop(k)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)

    # ------------------------------------------------------------ the model's own attributes
    def __getattr__(self, name: str):
        """Parameters, buffers and submodules as ``torch.nn.Module`` finds
        them, then the wrapped model's public attributes: for a
        ``transformers`` model ``om.config``, ``om.generate(...)``,
        ``om.can_generate()``, ``om.save_pretrained(path)`` (tied weights,
        the model's own keys) work as on the model (generation runs without
        the plan, under ``torch.no_grad()``).  Names starting with ``_`` are
        not forwarded.  Source: ``torch.nn.Module.__getattr__`` (called only
        when ordinary lookup fails, so the optimized module's own attributes
        come first).

        Raises
        ------
        AttributeError
            Neither the optimized module nor its model has ``name``.
        """
        try:
            return super().__getattr__(name)
        except AttributeError:
            model = self.__dict__.get("_modules", {}).get("model")
            if model is None or name.startswith("_"):
                raise
        try:
            return getattr(model, name)
        except AttributeError:
            raise AttributeError(f"'{type(self).__name__}' object and its model ({type(model).__name__}) have no "
                                 f"attribute '{name}'") from None

    def gradient_checkpointing_enable(self, *args, **kwargs):
        """Refused: the plan already recomputes activations to fit the budget,
        and the model's own checkpointing (``transformers``'
        ``gradient_checkpointing_enable``, called by
        ``TrainingArguments(gradient_checkpointing=True)``) would change the
        graph the plan is made for.

        Raises
        ------
        IntegrationError
            Always; the message says what to change.
        """
        from libra_opt.errors import IntegrationError

        raise IntegrationError(
            "gradient_checkpointing_enable on an optimized module: libra-opt's plan already recomputes (and "
            "swaps) activations to fit the budget; drop the call (TrainingArguments(gradient_checkpointing="
            "False)) and lower the budget to save more memory")

    activation_checkpointing_enable = gradient_checkpointing_enable

    # ------------------------------------------------------------ backend
    def _backend(self, gm, example_inputs, shape_plan: ShapePlan | None = None):
        """TorchDynamo backend of the example's step (``shape_plan`` None) or
        of another call key's (its :class:`ShapePlan`)."""
        from functools import partial

        from torch._dynamo.backends.common import aot_autograd

        if shape_plan is None:
            check_example_shapes(example_input_shapes(self.model, example_inputs), self.example_shapes)
        apply_graph_passes(gm)          # the capture's passes, so the graphs match the plan's
        return aot_autograd(fw_compiler=partial(self._fw_compiler, shape_plan=shape_plan),
                            bw_compiler=partial(self._bw_compiler, shape_plan=shape_plan),
                            partition_fn=partial(self._partition, shape_plan=shape_plan),
                            inference_compiler=eager_boxed)(gm, example_inputs)

    def _partition(self, joint, joint_inputs, *, num_fwd_outputs, shape_plan: ShapePlan | None = None, **kwargs):
        apply_joint_passes(joint, num_fwd_outputs)
        target = self if shape_plan is None else shape_plan     # both hold problem, plan, lowered, inductor
        lowered = lower_plan(joint, num_fwd_outputs, target.problem, target.plan.schedule, self.swap)
        target.lowered = lowered
        if target.inductor is not None:
            target.inductor.prepare(lowered)
        logger.info("plan lowered: %d saved values, %d recomputed nodes, %d swapped tensors",
                    len(lowered.saved), len(lowered.recomputed), len(lowered.swapped))
        return lowered.fw, lowered.bw

    def _boxed(self, gm, *, forward: bool):
        """``gm`` as a boxed callable that runs eagerly, under the tracker when
        one is installed; a forward run marks the module as having run."""
        def run(args):
            if forward:
                self._ran = True
            if self._tracker is not None:
                with self._tracker:
                    return gm(args)
            return gm(args)

        run._boxed_call = True
        return run

    def _fw_compiler(self, gm, example_inputs, shape_plan: ShapePlan | None = None):
        inductor = self.inductor if shape_plan is None else shape_plan.inductor
        if inductor is not None:
            gm = inductor.forward(gm, example_inputs)
        return self._boxed(gm, forward=True)

    def _bw_compiler(self, gm, example_inputs, shape_plan: ShapePlan | None = None):
        inductor = self.inductor if shape_plan is None else shape_plan.inductor
        if inductor is not None:
            gm = inductor.backward(gm, example_inputs)
        return self._boxed(gm, forward=False)

    @contextlib.contextmanager
    def tracking(self, tracker):
        """Run the forward and backward graphs under ``tracker`` (a
        :class:`~libra_opt.runtime.executor.StorageTracker`) while in this
        context.  TorchDynamo does not run compiled code under a Python
        dispatch mode, so a tracker cannot simply wrap the call; see
        :func:`~libra_opt.runtime.executor.measure_step_peak`."""
        old, self._tracker = self._tracker, tracker
        try:
            yield tracker
        finally:
            self._tracker = old

    # ------------------------------------------------------------ call
    def forward(self, *args, **kwargs):
        """Run the model (then ``loss_fn``) under the plan; without it (eagerly,
        any shape) under ``torch.no_grad()`` or in eval mode.

        Raises
        ------
        ShapeMismatchError
            An input's shape differs from the example's the plan was made for.
        InputMismatchError
            Arguments missing or extra for the model's ``forward``, or another
            number of input tensors than the example's.
        RuntimeExecutionError
            The model traced to a different graph (e.g. another autocast
            dtype or ``requires_grad`` of parameters), or TorchDynamo did not
            run the compiled plan.

        Notes
        -----
        Under an outer ``torch.compile(optimized_module)`` the call runs as
        without it, with a warning (:meth:`_outside_outer_compile`).
        """
        import torch._dynamo

        if torch.compiler.is_compiling():   # traced by an outer torch.compile: leave its graph here
            return self._outside_outer_compile(*args, **kwargs)
        if not torch.is_grad_enabled() or not self.model.training:
            return self._run_without_plan(args, kwargs)
        compiled = self._compiled_for(args, kwargs)
        self._ran = False
        try:
            with self._ddp_context(), self._outside_ambient_autocast():
                out = compiled(*args, **kwargs)     # autocast (if any) is inside: forward and loss only
        except torch._dynamo.exc.BackendCompilerFailed as e:
            inner = getattr(e, "inner_exception", None) or e.__cause__
            if isinstance(inner, LibraOptError):
                raise inner.with_traceback(None) from None
            raise
        except torch._dynamo.exc.TorchDynamoException:
            self._check_arguments(args, kwargs)
            raise
        if not self._ran and any(p.requires_grad for p in self.model.parameters()):  # grad is on (above)
            raise RuntimeExecutionError(
                "the compiled plan did not run (TorchDynamo fell back to eager, e.g. after hitting "
                "torch._dynamo.config.recompile_limit); re-create the optimized module")
        return out

    @_skipped_by_outer_compile
    def _outside_outer_compile(self, *args, **kwargs):
        """The call, run outside an outer ``torch.compile`` of this module
        (TorchDynamo breaks its graph here and runs this eagerly:
        ``torch.compiler.disable``), with a warning once per module.

        The module already runs its plan under a ``torch.compile`` of its own
        (AOTAutograd with the plan's partition hook, graphs run by its
        executor); an outer compile's backend receives TorchDynamo graphs of
        the model without the plan and cannot execute one, so compiling
        through would either drop the plan (and its memory bound) or run two
        compilers on one step.  The outer compile is skipped for this module
        and the plan runs as planned; Inductor's kernels come from
        ``optimize(..., executor="inductor")`` or from
        ``torch.compile(model, backend=libra_opt.backend(budget=...))``
        (source: ``torch.compiler.disable``).  Under
        ``torch.compile(..., fullgraph=True)`` TorchDynamo raises
        ``torch._dynamo.exc.Unsupported`` at this graph break instead, with
        the reason of :func:`_skipped_by_outer_compile`."""
        if not getattr(self, "_outer_compile_warned", False):
            self._outer_compile_warned = True
            warnings.warn(
                f"torch.compile of an OptimizedModule does not compile through its plan: the module already runs "
                f"the plan under its own torch.compile (executor={self.executor!r}), so the outer torch.compile "
                f"is skipped for it (its backend is not called). For Inductor kernels use "
                f"libra_opt.optimize(..., executor='inductor'), or compile the plain model with "
                f"torch.compile(model, backend=libra_opt.backend(budget=...), dynamic=False)", stacklevel=2)
        return self.forward(*args, **kwargs)

    def _ddp_context(self):
        """Context of the compiled call: a warning under DDP (see
        :func:`libra_opt.runtime.split.unsplit_under_ddp`)."""
        from .split import unsplit_under_ddp

        return unsplit_under_ddp(self)

    def _run_without_plan(self, args, kwargs):
        """The model (then ``loss_fn``) run eagerly under the captured
        autocast: under ``torch.no_grad()`` / ``inference_mode()`` (no
        activations are saved, so there is nothing to plan) and in eval mode
        (the plan is for the training-mode graph), at any input shape.  In
        eval mode with grad enabled it warns once: nothing bounds the memory
        of that backward."""
        if torch.is_grad_enabled() and not self._eval_warned:
            self._eval_warned = True
            warnings.warn("OptimizedModule in eval mode with grad enabled runs the model without the plan "
                          "(the plan is for training mode): its memory is not bounded by the budget; call "
                          ".train(), or optimize the model in eval mode", stacklevel=3)
        with autocast_context(self.device, None if self.follow_autocast else self.autocast_dtype):
            out = self.model(*args, **kwargs)
            return out if self.loss_fn is None else self.loss_fn(out)

    # ------------------------------------------------------------ plans per shape (libra_opt.plan_cache)
    def _compiled_for(self, args, kwargs):
        """The compiled step for this call's key: the example's, or the
        :class:`ShapePlan`'s of another key (planned by :attr:`planner` on
        first use).

        Raises
        ------
        ShapeMismatchError
            A new key without a planner, or past the planner's ``max_shapes``.
        InfeasibleBudgetError
            No plan fits the budget at the new shape (the message names it).
        """
        from libra_opt.plan_cache import ambient_autocast, call_key, describe_key, same_structure

        if self.example_key is None:
            return self._compiled          # no key known: the backend checks the shapes
        dtype = ambient_autocast(self.device) if self.follow_autocast else self.autocast_dtype
        key = call_key(args, kwargs, dtype)
        if key == self.example_key or not same_structure(key, self.example_key):
            return self._compiled          # another structure (an extra argument): the backend says so
        sp = self.shape_plans.get(key)
        if sp is None:
            if self.planner is None or (self.planner.max_shapes is not None
                                        and len(self.shape_plans) + 1 >= self.planner.max_shapes):
                from libra_opt.errors import ShapeMismatchError

                why = ("new shapes are not planned (optimize(..., max_shapes=1))" if self.planner is None
                       or self.planner.max_shapes == 1 else
                       f"this module already has max_shapes={self.planner.max_shapes} plans")
                self._check_arguments(args, kwargs)
                raise ShapeMismatchError(
                    f"called with {describe_key(key)} but the plan was made for {describe_key(self.example_key)} "
                    f"and {why}: pad or bucket the inputs (libra_opt.plan_cache.pad_to_bucket), or raise "
                    f"max_shapes")
            self._check_arguments(args, kwargs)
            sp = self._plan_shape(key, args, kwargs, dtype)
        return sp.compiled

    def _outside_ambient_autocast(self):
        """With :attr:`follow_autocast`, the ambient ``torch.autocast`` of the
        device turned off around the compiled step, which applies the same
        dtype inside (forward and loss only; see
        :func:`libra_opt.capture.step_function`); else a null context."""
        if self.follow_autocast and torch.is_autocast_enabled(self.device.type):
            return torch.autocast(self.device.type, enabled=False)
        return contextlib.nullcontext()

    def _plan_shape(self, key: tuple, args, kwargs, dtype) -> ShapePlan:
        """Plan ``key`` with :attr:`planner` and build its runtime: host
        buffers for its swaps, its Inductor compiler, its compiled step."""
        from functools import partial

        with self._outside_ambient_autocast():
            problem, plan = self.planner.plan(self.model, args, kwargs, dtype, key)
        swapped = plan.schedule.swapped_tensors()
        check_cuda_graphs(self.cuda_graphs, self.executor, self.device, len(swapped))
        self.swap.pool.reserve_buffers(problem.tensors[t].nbytes for t in swapped)
        sp = ShapePlan(key, problem, plan, dtype)
        if self.executor == "inductor":
            sp.inductor = InductorCompiler(self.swap, has_swaps=bool(swapped), cuda_graphs=self.cuda_graphs)
        fn = step_function(self.model, self.loss_fn, autocast_dtype=dtype, device=self.device)
        sp.compiled = torch.compile(fn, backend=partial(self._backend, shape_plan=sp), fullgraph=True,
                                    dynamic=False)
        self.shape_plans[key] = sp
        return sp

    def _check_arguments(self, args, kwargs) -> None:
        """Raise :class:`~libra_opt.errors.InputMismatchError` if ``args`` /
        ``kwargs`` do not fit the model's ``forward`` signature (a missing or
        extra argument), which TorchDynamo reports as an unsupported trace
        (``inspect.Signature.bind``)."""
        import inspect

        try:
            sig = inspect.signature(self.model.forward)
        except (TypeError, ValueError):  # pragma: no cover - builtins without a signature
            return
        try:
            sig.bind(*args, **kwargs)
        except TypeError as e:
            raise InputMismatchError(
                f"{type(self.model).__name__}.forward{sig} called with {len(args)} positional and "
                f"{len(kwargs)} keyword argument(s): {e}; call the optimized module with the inputs of the "
                f"example given to libra_opt.optimize") from None

    @property
    def predicted_peak_bytes(self) -> int:
        """The plan's peak (``plan.peak_bytes``) plus, with CUDA graphs, the
        bytes of the inputs CUDA graph trees copy into their pool
        (:attr:`~libra_opt.runtime.inductor.InductorCompiler.cuda_graph_input_bytes`,
        known after the first training call)."""
        extra = self.inductor.cuda_graph_input_bytes if self.inductor is not None else 0
        return int(self.plan.peak_bytes) + int(extra)

    def extra_repr(self) -> str:
        """The plan in ``repr(module)``: solver, budget and predicted peak (bytes) and step (s)."""
        p = self.plan
        return (f"solver={p.solver!r}, budget={p.budget_bytes} B, predicted peak={p.peak_bytes} B, "
                f"predicted step={p.time_s:.6f} s, executor={self.executor!r}"
                + (", cuda_graphs=True" if self.cuda_graphs else ""))
