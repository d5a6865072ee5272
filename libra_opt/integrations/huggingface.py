"""Hugging Face ``Trainer`` with a plan: :class:`LibraTrainer`.

Use::

    from libra_opt.integrations.huggingface import LibraTrainer

    trainer = LibraTrainer(model=model, args=args, train_dataset=train_dataset, budget="60%")
    trainer.train()
    trainer.save_model()

Why a ``Trainer`` subclass (and not the optimized module passed as
``Trainer(model=om)``): the ``Trainer`` decides much from the class of
``trainer.model`` (``isinstance(model, PreTrainedModel)`` in ``save_model``:
``save_pretrained`` with tied weights and the config, or a bare safetensors
file otherwise; ``inspect.signature(model.forward)`` for
``remove_unused_columns``; ``accepts_loss_kwargs`` for
``num_items_in_batch``).  :class:`LibraTrainer` leaves ``trainer.model`` the
user's model, so all of that stays as without libra-opt, and overrides one
method, ``compute_loss``: in training (grad enabled, training mode) the
forward it calls is the optimized module's.  The plan is made at the first
such call, with that call's keyword inputs as the example: the collated batch
on its device, plus ``num_items_in_batch`` (a 0-d tensor, an input of shape
``()`` whose value changes from batch to batch) when the Trainer passes it;
under ``bf16=True`` / ``fp16=True`` the autocast dtype is ``torch.bfloat16`` /
``torch.float16`` (:func:`autocast_dtype_of`).  Evaluation and prediction run
the model as the ``Trainer`` does.

Works with ``transformers`` 4.40 and later (tested with 5.x): only
``compute_loss(model, inputs, return_outputs, ...)`` is overridden, whose
signature is stable.  Subclasses of ``Trainer`` (e.g. TRL's ``SFTTrainer``)
get the same behaviour from ``class MyTrainer(LibraTrainerMixin, SFTTrainer)``.

Not supported, each with an :class:`~libra_opt.errors.IntegrationError` that
says what to change: ``gradient_checkpointing=True`` /
``activation_checkpointing=True`` (the plan already recomputes activations to
fit the budget; Hugging Face's checkpointing would change the graph the plan
was made for), ``torch_compile=True``, and more than one process (DDP, FSDP,
DeepSpeed: the model is wrapped).  The plan is made for the first batch's
shapes; a batch of another shape (the short last batch, another padded
length) gets a plan of its own, priced from the first one's profile (see
``optimize(max_shapes=)``).

Source: ``transformers.Trainer.compute_loss`` (the hook Hugging Face documents
for subclassing); :func:`libra_opt.integrations.plan_at_call`.
"""
from __future__ import annotations

import torch
from torch import nn

from ..errors import IntegrationError
from ..extras import require
from . import check_optimize_options, plan_at_call, prepare_model

transformers = require("transformers", "huggingface", "libra_opt.integrations.huggingface")
require("accelerate", "huggingface", "transformers.Trainer")

__all__ = ["LibraTrainer", "LibraTrainerMixin", "autocast_dtype_of", "prepare_model"]


def autocast_dtype_of(args) -> torch.dtype | None:
    """The autocast dtype of a ``transformers.TrainingArguments``:
    ``torch.bfloat16`` for ``bf16=True``, ``torch.float16`` for ``fp16=True``,
    ``None`` otherwise (full precision)."""
    if getattr(args, "bf16", False):
        return torch.bfloat16
    if getattr(args, "fp16", False):
        return torch.float16
    return None


class _PlannedForward(nn.Module):
    """What :meth:`LibraTrainerMixin.compute_loss` calls in training: the
    optimized module, made at the first call from its inputs.  Not a parent
    of the model (the Trainer never sees it outside ``compute_loss``);
    ``_get_name`` is the model's, which ``compute_loss`` reads for its label
    smoother (causal LMs shift labels).  A ``num_items_in_batch`` given as a
    Python int becomes a 0-d tensor on the Trainer's device: TorchDynamo
    specializes on an int's value, so each batch's count would be traced
    anew (and hit the recompile limit); a tensor is a graph input whose value
    may change."""

    def __init__(self, trainer: "LibraTrainerMixin"):
        super().__init__()
        self.__dict__["_trainer"] = trainer     # not a submodule

    def forward(self, *args, **kwargs):
        t = self._trainer
        n = kwargs.get("num_items_in_batch")
        if isinstance(n, int):  # some transformers versions pass a Python int: one graph per value otherwise
            kwargs["num_items_in_batch"] = torch.tensor(n, device=t.args.device)
        if t.optimized_model is None or t.optimized_model.model is not t.model:   # first step, or a new model_init
            t.optimized_model = plan_at_call(t.model, args, kwargs, t.libra_budget,
                                             autocast_dtype=autocast_dtype_of(t.args), options=t.optimize_options)
        return t.optimized_model(*args, **kwargs)

    def _get_name(self) -> str:
        return self._trainer.model._get_name()


class LibraTrainerMixin:
    """``compute_loss`` of a ``transformers.Trainer`` (or subclass) with the
    training forward run under a rematerialization plan; see the module
    docstring.  Put it first: ``class MyTrainer(LibraTrainerMixin, Trainer)``.

    Parameters
    ----------
    *args, **kwargs
        The ``Trainer``'s own arguments.
    budget : int, float or str
        The graph-memory budget (``DESIGN.md``, "The budget contract"):
        bytes, ``"12GiB"``, ``"60%"`` or a fraction of the no-remat peak.
        Checked here, before the Trainer is built.
    optimize_options : dict, optional
        More :func:`libra_opt.optimize` keyword arguments (``solver``,
        ``executor``, ``profile``, ``calibrate``, ...).

    Attributes
    ----------
    optimized_model : OptimizedModule or None
        The optimized module (``.plan`` holds the plan), after the first
        training step; it shares the parameters of ``trainer.model``.

    Raises
    ------
    BudgetError
        ``budget`` breaks the budget contract.
    IntegrationError
        ``gradient_checkpointing`` / ``activation_checkpointing`` or
        ``torch_compile`` is set, ``model`` is already an optimized module,
        ``optimize_options`` sets what the Trainer decides
        (``example_kwargs``, ``autocast_dtype``), or (at the first step) the
        model is wrapped for more than one process.
    """

    def __init__(self, *args, budget, optimize_options: dict | None = None, **kwargs):
        from ..ir.units import check_budget

        check_budget(budget)
        self.optimize_options = check_optimize_options(optimize_options, type(self).__name__)
        self.libra_budget = budget
        self.optimized_model = None
        super().__init__(*args, **kwargs)
        from ..runtime.module import OptimizedModule

        if isinstance(self.model, OptimizedModule):
            raise IntegrationError(f"{type(self).__name__}(model=...) takes the model itself (it plans at the first "
                                   f"step): pass the optimized module's .model, or the model you gave optimize()")
        a = self.args
        if getattr(a, "activation_checkpointing", False) or getattr(a, "gradient_checkpointing", False):
            raise IntegrationError(
                f"{type(self).__name__}: set gradient_checkpointing=False (activation_checkpointing=False): "
                f"libra-opt's plan already recomputes activations to fit the budget, and Hugging Face's "
                f"checkpointing would change the graph the plan is made for")
        if getattr(a, "torch_compile", False):
            raise IntegrationError(f"{type(self).__name__}: set torch_compile=False: the optimized module "
                                   f"compiles the training step itself (with its own torch.compile backend)")
        self._planned_forward = _PlannedForward(self)

    def compute_loss(self, model, inputs, return_outputs=False, **kwargs):
        """``Trainer.compute_loss`` with ``model`` replaced by the optimized
        module while training (grad enabled, training mode); evaluation and
        prediction get ``model`` itself.

        Raises
        ------
        IntegrationError
            ``model`` is wrapped (DDP, FSDP, DeepSpeed: more than one process).
        ShapeMismatchError
            A batch of another shape than the first one (the plan's).
        """
        if torch.is_grad_enabled() and self.model.training:
            if model is not self.model:
                raise IntegrationError(
                    f"{type(self).__name__} trains in one process; the Trainer wrapped the model in "
                    f"{type(model).__name__}: run without torchrun / accelerate launch")
            model = self._planned_forward
        return super().compute_loss(model, inputs, return_outputs=return_outputs, **kwargs)


class LibraTrainer(LibraTrainerMixin, transformers.Trainer):
    """A ``transformers.Trainer`` whose training steps run under a
    rematerialization plan for ``budget``: ``LibraTrainer(model=model,
    args=args, train_dataset=ds, budget="60%")``.  See
    :class:`LibraTrainerMixin` for the parameters and the module docstring
    for what it changes (one method, ``compute_loss``) and why."""
