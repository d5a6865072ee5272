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

Shapes: the plan is made for the example inputs' shapes.  TorchDynamo
recompiles when it sees other shapes and calls the backend again; the backend
then raises :class:`~libra_opt.errors.ShapeMismatchError`.  Under
``torch.no_grad()`` the model runs eagerly (AOTAutograd's inference graph;
there are no activations to plan).

Sources: PyTorch 2 (Ansel et al., ASPLOS 2024): TorchDynamo backends and
AOTAutograd's ``partition_fn`` / ``fw_compiler`` / ``bw_compiler`` hooks.
"""
from __future__ import annotations

import contextlib
import logging
import warnings

import torch
from torch import nn

from libra_opt.capture import autocast_context, check_example_shapes, example_input_shapes, step_function
from libra_opt.capture_passes import apply_graph_passes, apply_joint_passes
from libra_opt.errors import InputMismatchError, LibraOptError, RuntimeExecutionError
from libra_opt.problem import RematProblem

from .inductor import InductorCompiler, check_cuda_graphs, resolve_executor
from .partition import LoweredPlan, lower_plan
from .swap import SwapManager, _align

logger = logging.getLogger(__name__)

__all__ = ["OptimizedModule"]


def _eager_boxed(gm, example_inputs):
    from functorch.compile import make_boxed_func

    return make_boxed_func(gm.forward)


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
    """

    def __init__(self, model: nn.Module, problem: RematProblem, plan, *, example_shapes,
                 autocast_dtype: torch.dtype | None = None, loss_fn=None, device=None,
                 executor: str | None = "eager", cuda_graphs: bool = False):
        super().__init__()
        self.problem = problem
        sched = plan.schedule
        if sched is None:
            raise RuntimeExecutionError(f"the plan has no schedule (status {plan.status!r}): {plan.message}")
        self._settings(model, plan, example_shapes, autocast_dtype, loss_fn, device, executor, cuda_graphs,
                       swaps=len(sched.swapped_tensors()))
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
    _RUNTIME_ATTRS = ("_compiled", "swap", "inductor", "lowered", "_ran", "_tracker")

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
        self.swap.pool.reserve(sum(_align(self.problem.tensors[t].nbytes) for t in swapped))
        self.inductor = (InductorCompiler(self.swap, has_swaps=bool(swapped), cuda_graphs=self.cuda_graphs)
                         if self.executor == "inductor" else None)
        self.lowered: LoweredPlan | None = None
        self._ran = False
        self._tracker = None
        self._compiled = self._compile()

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

    # ------------------------------------------------------------ backend
    def _backend(self, gm, example_inputs):
        from torch._dynamo.backends.common import aot_autograd

        check_example_shapes(example_input_shapes(self.model, example_inputs), self.example_shapes)
        apply_graph_passes(gm)          # the capture's passes, so the graphs match the plan's
        return aot_autograd(fw_compiler=self._fw_compiler, bw_compiler=self._bw_compiler,
                            partition_fn=self._partition, inference_compiler=_eager_boxed)(gm, example_inputs)

    def _partition(self, joint, joint_inputs, *, num_fwd_outputs, **kwargs):
        apply_joint_passes(joint, num_fwd_outputs)
        lowered = lower_plan(joint, num_fwd_outputs, self.problem, self.plan.schedule, self.swap)
        self.lowered = lowered
        if self.inductor is not None:
            self.inductor.prepare(lowered)
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

    def _fw_compiler(self, gm, example_inputs):
        if self.inductor is not None:
            gm = self.inductor.forward(gm, example_inputs)
        return self._boxed(gm, forward=True)

    def _bw_compiler(self, gm, example_inputs):
        if self.inductor is not None:
            gm = self.inductor.backward(gm, example_inputs)
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
        """
        import torch._dynamo

        if not torch.is_grad_enabled() or not self.model.training:
            return self._run_without_plan(args, kwargs)
        self._ran = False
        try:
            with self._ddp_context():
                out = self._compiled(*args, **kwargs)     # autocast (if any) is inside: forward and loss only
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
        with autocast_context(self.device, self.autocast_dtype):
            out = self.model(*args, **kwargs)
            return out if self.loss_fn is None else self.loss_fn(out)

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
