"""Lightning with a plan: :class:`LibraCallback`.

Use::

    import lightning as L
    from libra_opt.integrations.lightning import LibraCallback

    trainer = L.Trainer(max_steps=100, precision="bf16-mixed", callbacks=[LibraCallback(budget="60%")])
    trainer.fit(lit_module, train_dataloader)

The callback optimizes one submodule of the ``LightningModule``
(``attribute``, default ``"model"``: ``lit_module.model``), the module the
``training_step`` calls.  At fit start (``on_fit_start``: after
``configure_model``, the device placement and ``configure_optimizers``) it
puts a placeholder in its place that, at the first call in training (grad
enabled, training mode), makes the plan with that call's inputs as the
example (so the example inputs come from the first batch, as the
``training_step`` turns it into the submodule's inputs) and then replaces
itself with the :class:`~libra_opt.runtime.OptimizedModule`.  Validation
(also the sanity check before training) runs the submodule without a plan.
The autocast dtype comes from the Trainer's ``precision``
(:func:`autocast_dtype_of`: ``"bf16-mixed"`` -> ``torch.bfloat16``,
``"16-mixed"`` -> ``torch.float16``).  The optimized module's state dict has
the model's own keys, so checkpoints load into the LightningModule with or
without the callback.

Until that first training call the placeholder holds the submodule as its
child ``model``, so ``lit_module.state_dict()`` keys have one more ``model.``
level in that window only; Lightning restores a ``ckpt_path`` before
``on_fit_start`` on one device and under DDP (strategies that restore after
setup, DeepSpeed and FSDP, are not supported).

Why a callback (and not ``lit_module.model = optimize(...)`` by hand): the
example inputs and the precision are the Trainer's, known only once ``fit``
runs.  The plan is made for the first batch's shapes; a
batch of another shape (the short last batch, another sequence length) gets a
plan of its own, priced from the first one's profile (see
``optimize(max_shapes=)``).

Source: Lightning's ``Callback.on_fit_start`` hook and ``Trainer.precision``;
:func:`libra_opt.integrations.plan_at_call`.
"""
from __future__ import annotations

import torch
from torch import nn

from ..errors import IntegrationError
from ..extras import require
from . import check_optimize_options, plan_at_call

L = require("lightning", "lightning", "libra_opt.integrations.lightning")

__all__ = ["LibraCallback", "autocast_dtype_of"]

#: Lightning precision setting -> autocast dtype (the ``-true`` settings run without autocast)
_MIXED = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}


def autocast_dtype_of(precision) -> torch.dtype | None:
    """The autocast dtype of a Lightning ``precision`` setting:
    ``torch.bfloat16`` for ``"bf16-mixed"``, ``torch.float16`` for
    ``"16-mixed"``, ``None`` for the others (``"32-true"``, ``"bf16-true"``,
    ...: no autocast).  Source: Lightning's ``MixedPrecision`` plugin."""
    return _MIXED.get(str(precision))


class _PlanAtFirstCall(nn.Module):
    """The placeholder :class:`LibraCallback` puts in place of the submodule:
    the submodule itself until the first training call, which plans, puts the
    optimized module in its place and runs it."""

    def __init__(self, model: nn.Module, parent: nn.Module, name: str, callback: "LibraCallback",
                 autocast_dtype: torch.dtype | None):
        super().__init__()
        self.model = model
        self.__dict__.update(_parent=parent, _name=name, _callback=callback, _autocast_dtype=autocast_dtype)

    def forward(self, *args, **kwargs):
        if not (torch.is_grad_enabled() and self.training):
            return self.model(*args, **kwargs)
        cb = self._callback
        om = plan_at_call(self.model, args, kwargs, cb.budget, autocast_dtype=self._autocast_dtype,
                          options=cb.optimize_options)
        setattr(self._parent, self._name, om)
        cb.optimized_model = om
        return om(*args, **kwargs)


class LibraCallback(L.pytorch.Callback):
    """Train a submodule of the ``LightningModule`` under a rematerialization
    plan for ``budget``; see the module docstring.

    Parameters
    ----------
    budget : int, float or str
        The graph-memory budget (``DESIGN.md``, "The budget contract"):
        bytes, ``"12GiB"``, ``"60%"`` or a fraction of the no-remat peak.
    attribute : str
        The submodule to optimize, as a dotted path from the LightningModule
        (default ``"model"``).
    optimize_options : dict, optional
        Passed on to :func:`libra_opt.optimize`, e.g.
        ``{"solver": "checkmate-lp", "calibrate": True}``.

    Attributes
    ----------
    optimized_model : OptimizedModule or None
        After the first training step (``.plan`` holds the plan).

    Raises
    ------
    BudgetError
        ``budget`` breaks the budget contract (here, at construction).
    IntegrationError
        ``attribute`` names no submodule (at fit start), or
        ``optimize_options`` sets what the Trainer decides.
    """

    def __init__(self, budget, *, attribute: str = "model", optimize_options: dict | None = None):
        from ..ir.units import check_budget

        check_budget(budget)
        self.budget = budget
        self.attribute = attribute
        self.optimize_options = check_optimize_options(optimize_options, "LibraCallback")
        self.optimized_model = None

    def _parent_and_name(self, pl_module: nn.Module) -> tuple[nn.Module, str]:
        path = self.attribute.split(".")
        try:
            parent = pl_module.get_submodule(".".join(path[:-1]))
            child = getattr(parent, path[-1])
        except AttributeError:
            child = None
        if not isinstance(child, nn.Module):
            kids = ", ".join(n for n, _ in pl_module.named_children()) or "none"
            raise IntegrationError(
                f"LibraCallback(attribute={self.attribute!r}): {type(pl_module).__name__} has no submodule "
                f"{self.attribute!r} (its children: {kids}); pass attribute= the submodule training_step calls")
        return parent, path[-1]

    def on_fit_start(self, trainer, pl_module) -> None:
        """Put the placeholder (:class:`_PlanAtFirstCall`) in place of the submodule."""
        from ..runtime.module import OptimizedModule

        parent, name = self._parent_and_name(pl_module)
        model = getattr(parent, name)
        if isinstance(model, (OptimizedModule, _PlanAtFirstCall)):   # a second fit: planned already
            return
        setattr(parent, name, _PlanAtFirstCall(model, parent, name, self, autocast_dtype_of(trainer.precision)))

    def teardown(self, trainer, pl_module, stage: str) -> None:
        """Put the submodule back if no training call planned it (a fit that
        stopped before its first step)."""
        try:
            parent, name = self._parent_and_name(pl_module)
        except IntegrationError:
            return
        lazy = getattr(parent, name)
        if isinstance(lazy, _PlanAtFirstCall):
            setattr(parent, name, lazy.model)
