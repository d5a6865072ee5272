"""The optimized module: a model that trains under a rematerialization plan.

:class:`OptimizedModule` wraps the model in ``torch.compile(fullgraph=True,
dynamic=False)`` with a backend of our own: AOTAutograd
(``torch._dynamo.backends.common.aot_autograd``) whose partition hook lowers
the plan to a forward and a backward FX graph
(:func:`libra_opt.runtime.partition.lower_plan`), run eagerly (the forward and
backward compilers return the graph modules themselves; no inductor).  The
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

import torch
from torch import nn

from libra_opt.capture_passes import apply_graph_passes, apply_joint_passes
from libra_opt.capture import check_example_shapes, example_input_shapes, step_function
from libra_opt.errors import LibraOptError, RuntimeExecutionError
from libra_opt.problem import RematProblem

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
    """

    def __init__(self, model: nn.Module, problem: RematProblem, plan, *, example_shapes,
                 autocast_dtype: torch.dtype | None = None, loss_fn=None, device=None):
        super().__init__()
        self.model = model
        self.problem = problem
        self.plan = plan
        self.autocast_dtype = autocast_dtype
        self.loss_fn = loss_fn
        if device is None:
            device = next((p.device for p in model.parameters()), torch.device("cpu"))
        self.device = torch.device(device)
        self.example_shapes = [tuple(s) for s in example_shapes]
        self.swap = SwapManager(self.device)
        sched = plan.schedule
        if sched is None:
            raise RuntimeExecutionError(f"the plan has no schedule (status {plan.status!r}): {plan.message}")
        self.swap.pool.reserve(sum(_align(problem.tensors[t].nbytes) for t in sched.swapped_tensors()))
        self.lowered: LoweredPlan | None = None
        self._ran = False
        self._tracker = None
        fn = step_function(model, loss_fn, autocast_dtype=autocast_dtype, device=self.device)
        self._compiled = torch.compile(fn, backend=self._backend, fullgraph=True, dynamic=False)

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
        return self._boxed(gm, forward=True)

    def _bw_compiler(self, gm, example_inputs):
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
        """Run the model (then ``loss_fn``) under the plan.

        Raises
        ------
        ShapeMismatchError
            An input's shape differs from the example's the plan was made for.
        RuntimeExecutionError
            The model traced to a different graph (e.g. another train/eval
            mode under grad), or TorchDynamo did not run the compiled plan.
        """
        import torch._dynamo

        self._ran = False
        try:
            out = self._compiled(*args, **kwargs)     # autocast (if any) is inside: forward and loss only
        except torch._dynamo.exc.BackendCompilerFailed as e:
            inner = getattr(e, "inner_exception", None) or e.__cause__
            if isinstance(inner, LibraOptError):
                raise inner.with_traceback(None) from None
            raise
        if (torch.is_grad_enabled() and not self._ran
                and any(p.requires_grad for p in self.model.parameters())):
            raise RuntimeExecutionError(
                "the compiled plan did not run (TorchDynamo fell back to eager, e.g. after hitting "
                "torch._dynamo.config.recompile_limit); re-create the optimized module")
        return out

    def extra_repr(self) -> str:
        """The plan in ``repr(module)``: solver, budget and predicted peak (bytes) and step (s)."""
        p = self.plan
        return (f"solver={p.solver!r}, budget={p.budget_bytes} B, predicted peak={p.peak_bytes} B, "
                f"predicted step={p.time_s:.6f} s")
