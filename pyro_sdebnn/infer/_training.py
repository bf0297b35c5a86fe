# SPDX-License-Identifier: Apache-2.0
"""Learning-rate schedules and whole-gradient clipping shared by every ``fit`` of the package.

Two pieces, used by the SVI loop (:func:`~pyro_sdebnn.infer.train_svi`, which also runs the ``fit`` of
the SVI baselines and :meth:`~pyro_sdebnn.infer.SamplingFreeBNN.fit`) and the plain PyTorch loops
(:func:`~pyro_sdebnn.infer.map_training.train_network` and the methods built on it):

* :class:`SchedulerStepper` steps a learning-rate scheduler once per epoch (default) or once per
  optimisation step. It accepts a Pyro :class:`~pyro.optim.PyroLRScheduler` (the object passed to
  :class:`~pyro.infer.SVI` in place of an optimiser) or a ``torch.optim.lr_scheduler`` object;
  ``ReduceLROnPlateau`` is stepped with the mean loss of the epoch (or the loss of the step).
* :func:`clip_gradients` clips the gradient of *all* parameters together, between the backward pass
  and the optimiser step. With :math:`g` the concatenation of every parameter gradient and
  :math:`c` the threshold,

  .. math::

      g \\leftarrow g \\cdot \\min\\Bigl(1, \\frac{c_2}{\\|g\\|_2}\\Bigr) \\quad (\\texttt{clip_norm}),
      \\qquad
      g \\leftarrow g \\cdot \\min\\Bigl(1, \\frac{c_\\infty}{\\|g\\|_\\infty}\\Bigr)
      \\quad (\\texttt{clip_inf_norm}).

  Both rescale the whole gradient by one factor, so its direction is kept; Pyro's own
  ``clip_args={"clip_norm": c}`` instead clips every parameter tensor separately, which changes the
  direction whenever only some tensors exceed :math:`c`. When both thresholds are given, the
  :math:`L_2` clipping is applied first and the :math:`L_\\infty` one second (the result satisfies
  both bounds, since the second only shrinks the gradient further). :func:`svi_update` does one
  :meth:`pyro.infer.SVI.step` with this clipping inserted between ``loss_and_grads`` and the optimiser (and
  no update on a NaN loss); with nothing to clip it updates exactly as ``SVI.step`` does.

**References**

[1] `On the difficulty of training recurrent neural networks`,
Razvan Pascanu, Tomas Mikolov, Yoshua Bengio. ICML 2013.
"""

from __future__ import annotations

import math
from typing import Iterable

import pyro
import torch
from pyro import poutine
from pyro.infer.util import torch_item
from pyro.optim import PyroLRScheduler
from torch import Tensor


SCHEDULER_STEPS = ("epoch", "step")

_TORCH_SCHEDULERS = (torch.optim.lr_scheduler.LRScheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)


def _check_threshold(value, name: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) and not (
        isinstance(value, Tensor) and value.numel() == 1
    ):
        raise TypeError(f"{name} must be a positive finite number or None, got {value!r}")
    value = float(value)
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a positive finite number or None, got {value!r}")
    return value


def check_clip(clip_norm=None, clip_inf_norm=None) -> tuple[float | None, float | None]:
    """Validate the clipping thresholds; returns them as floats (or ``None``).

    :raises ValueError: if a threshold is zero, negative, NaN or infinite.
    :raises TypeError: if a threshold is not a number.
    """
    return _check_threshold(clip_norm, "clip_norm"), _check_threshold(clip_inf_norm, "clip_inf_norm")


def clip_gradients(
    params: Iterable[Tensor], clip_norm: float | None = None, clip_inf_norm: float | None = None
) -> None:
    """Clip the gradient of all ``params`` together, in place, by one common factor.

    ``clip_norm``: :math:`g \\leftarrow g \\min(1, c/\\|g\\|_2)` over the concatenated gradient;
    ``clip_inf_norm``: :math:`g \\leftarrow g \\min(1, c/\\|g\\|_\\infty)`. Parameters without a
    gradient are ignored. Does nothing when both are ``None``.
    """
    clip_norm, clip_inf_norm = check_clip(clip_norm, clip_inf_norm)
    if clip_norm is None and clip_inf_norm is None:
        return
    grads = [p for p in params if p.grad is not None]
    if not grads:
        return
    if clip_norm is not None:
        torch.nn.utils.clip_grad_norm_(grads, clip_norm, norm_type=2.0)
    if clip_inf_norm is not None:
        torch.nn.utils.clip_grad_norm_(grads, clip_inf_norm, norm_type=math.inf)


def clip_gradients_batched(params: Iterable[Tensor], clip_norm: float | None = None,
                           clip_inf_norm: float | None = None) -> None:
    """:func:`clip_gradients` for ``K`` models stacked along the first dimension of every parameter.

    Each model ``k`` gets its own factor from the norm of its own gradient (the slices ``p.grad[k]``),
    exactly as :func:`torch.nn.utils.clip_grad_norm_` would give it when trained alone.
    """
    clip_norm, clip_inf_norm = check_clip(clip_norm, clip_inf_norm)
    grads = [p.grad for p in params if p.grad is not None]
    if not grads or (clip_norm is None and clip_inf_norm is None):
        return
    for threshold, norm_type in ((clip_norm, 2.0), (clip_inf_norm, math.inf)):
        if threshold is None:
            continue
        with torch.no_grad():
            if norm_type == 2.0:
                norms = torch.stack([g.flatten(1).pow(2).sum(1) for g in grads]).sum(0).sqrt()
            else:
                norms = torch.stack([g.flatten(1).abs().amax(1) for g in grads]).amax(0)
            coef = (threshold / (norms + 1e-6)).clamp(max=1.0)  # the same factor as clip_grad_norm_
            for g in grads:
                g.mul_(coef.reshape(-1, *([1] * (g.dim() - 1))).to(g.dtype))


def svi_update(svi: pyro.infer.SVI, args: tuple = (), kwargs: dict | None = None, *, clip_norm: float | None = None,
               clip_inf_norm: float | None = None, where: str = "this step") -> tuple[float, list[str]]:
    """One :meth:`pyro.infer.SVI.step` with :func:`clip_gradients` between the gradient and the update; a NaN or
    infinite loss raises before any parameter changes.

    Mirrors ``SVI.step``: the loss and gradients come from ``svi.loss_and_grads`` under a
    ``poutine.trace(param_only=True)``; the unconstrained parameters of that trace, in the order of their names
    (a fixed order: the clipping norm sums the gradients the same way every run, so the same seed gives bitwise
    the same run), are clipped together, updated by ``svi.optim`` and their gradients zeroed. ``args`` and
    ``kwargs`` go to the model and guide.

    :param str where: where in the run this step is, for the error message (e.g. ``"epoch 3, batch 7"``).
    :returns: the loss estimate and the names of the parameters updated.
    :raises FloatingPointError: if the loss is NaN or infinite (the gradients are zeroed, nothing is updated), or
        the step fails on a parameter that an earlier update made NaN or infinite (naming it).
    :raises TypeError: if the loss returns a tuple (several losses) instead of one number.
    """
    try:
        with poutine.trace(param_only=True) as capture:
            loss = svi.loss_and_grads(svi.model, svi.guide, *args, **(kwargs or {}))
    except (ValueError, RuntimeError) as err:
        # a parameter an earlier update made NaN or infinite fails here inside Pyro ("Expected parameter loc ...
        # found invalid values"), far from its cause: name it (read on this error path only)
        bad = sorted(name for name, value in pyro.get_param_store().named_parameters()
                     if not bool(torch.isfinite(value).all()))
        if bad:
            raise FloatingPointError(
                f"the SVI parameters {bad} are NaN or infinite at {where}: an earlier update diverged (try a smaller "
                f"learning rate or clip_norm). The step failed with: {err}"
            ) from err
        raise
    sites = sorted(capture.trace.nodes.values(), key=lambda site: str(site["name"]))
    names = [str(site["name"]) for site in sites]
    params = [site["value"].unconstrained() for site in sites]  # type: ignore[union-attr]  # a param site's value
    if isinstance(loss, tuple):  # the epoch means and the scheduler need one number per step
        pyro.infer.util.zero_grads(params)
        raise TypeError(f"svi_update needs a loss that returns one number, got a tuple of {len(loss)}")
    loss = torch_item(loss)
    if not math.isfinite(loss):
        pyro.infer.util.zero_grads(params)
        raise FloatingPointError(f"the SVI loss became {loss} at {where}; the parameters were not updated "
                                 "(try a smaller learning rate, clip_norm, or check the data for NaN)")
    clip_gradients(params, clip_norm, clip_inf_norm)
    svi.optim(params)
    pyro.infer.util.zero_grads(params)
    return loss, names


class SchedulerStepper:
    """Steps a learning-rate scheduler once per epoch or once per optimisation step.

    :param scheduler: a :class:`pyro.optim.PyroLRScheduler` (e.g. ``pyro.optim.MultiStepLR``), a
        ``torch.optim.lr_scheduler`` object, or ``None`` (nothing is stepped; anything else, such as a
        plain :class:`~pyro.optim.PyroOptim`, is also left alone).
    :param str scheduler_step: ``"epoch"`` (step after every pass over the data) or ``"step"``
        (after every optimisation step).
    :raises ValueError: if ``scheduler_step`` is neither.

    >>> import torch, pyro
    >>> sched = pyro.optim.ExponentialLR({"optimizer": torch.optim.SGD, "optim_args": {"lr": 1.0}, "gamma": 0.5})
    >>> stepper = SchedulerStepper(sched, "epoch")
    >>> stepper.after_step(1.0)  # "epoch": nothing happens after a step
    >>> stepper.after_epoch(1.0)  # steps every per-parameter scheduler that SVI has created
    """

    def __init__(self, scheduler, scheduler_step: str = "epoch") -> None:
        if scheduler_step not in SCHEDULER_STEPS:
            raise ValueError(f"scheduler_step must be one of {SCHEDULER_STEPS}, got {scheduler_step!r}")
        if isinstance(scheduler, PyroLRScheduler):
            self._plateau = issubclass(scheduler.pt_scheduler_constructor, torch.optim.lr_scheduler.ReduceLROnPlateau)
        elif isinstance(scheduler, _TORCH_SCHEDULERS):
            self._plateau = isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)
        else:
            scheduler, self._plateau = None, False
        self.scheduler = scheduler
        self.scheduler_step = scheduler_step

    def _step(self, loss: float) -> None:
        if self.scheduler is None:
            return
        if self._plateau:
            self.scheduler.step(loss)
        else:
            self.scheduler.step()

    def after_step(self, loss: float) -> None:
        """Call after every optimisation step with its loss."""
        if self.scheduler_step == "step":
            self._step(loss)

    def after_epoch(self, loss: float) -> None:
        """Call after every epoch with its mean loss."""
        if self.scheduler_step == "epoch":
            self._step(loss)


def make_torch_scheduler(scheduler, optimizer: torch.optim.Optimizer):
    """Build the scheduler of a plain PyTorch loop: ``scheduler`` is ``None`` or ``optimizer -> LRScheduler``.

    :raises TypeError: for a Pyro scheduler (these loops use a ``torch.optim`` optimiser; pass e.g.
        ``lambda opt: torch.optim.lr_scheduler.MultiStepLR(opt, [10, 20])``) or a non-callable.
    """
    if scheduler is None:
        return None
    if isinstance(scheduler, pyro.optim.PyroOptim) or isinstance(scheduler, _TORCH_SCHEDULERS):
        raise TypeError(
            "scheduler must be a callable optimizer -> torch.optim.lr_scheduler object (e.g. "
            f"lambda opt: torch.optim.lr_scheduler.MultiStepLR(opt, [10, 20])), got {type(scheduler).__name__}"
        )
    if not callable(scheduler):
        raise TypeError(f"scheduler must be a callable optimizer -> torch.optim.lr_scheduler object, got {scheduler!r}")
    built = scheduler(optimizer)
    if not isinstance(built, _TORCH_SCHEDULERS):
        raise TypeError(
            f"scheduler(optimizer) must return a torch.optim.lr_scheduler object, got {type(built).__name__}"
        )
    return built
