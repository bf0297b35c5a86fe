# SPDX-License-Identifier: Apache-2.0
"""Maximum a posteriori training of a network with Adam, the PyTorch loop behind the network baselines.

:func:`train_network` minimises the mean negative log-likelihood of :mod:`pyro_sdebnn.infer.methods`'s
likelihoods plus an L2 penalty (Adam's weight decay), one epoch at a time, with an optional learning-rate
schedule, whole-gradient clipping (:mod:`pyro_sdebnn.infer._training`), a finiteness check per epoch and, under
``torchrun``, data-parallel gradient averaging. :class:`~pyro_sdebnn.infer.MAPEstimate`'s Pyro counterpart is
SVI with a delta guide; this loop trains the networks of :class:`~pyro_sdebnn.infer.Laplace`,
:class:`~pyro_sdebnn.infer.MCDropout` and :class:`~pyro_sdebnn.infer.DeepEnsemble`, whose ``fit`` continues an
interrupted run exactly (``resume=True``) from the state this loop returns.

**References**

1. D. J. C. MacKay (1992), *A practical Bayesian framework for backpropagation networks*,
   Neural Computation 4(3).
"""

from __future__ import annotations

import math
from typing import Callable

import torch
from torch import Tensor, nn

from pyro_sdebnn._comm import all_reduce_mean, average_gradients_, broadcast_module_, is_main, running_stats
from pyro_sdebnn.infer._baseline_data import (
    _follow_module,
    _data_parallel_sampler,
    _module_device_dtype,
    _network_training_data,
    _TrainingData,
)
from pyro_sdebnn.infer._likelihoods import _check_likelihood, negative_log_likelihood_terms
from pyro_sdebnn.infer._training import SchedulerStepper, clip_gradients, make_torch_scheduler
from pyro_sdebnn.infer.checkpoint import detached

__all__ = ["train_network"]


def _epochs(num_epochs: int, progress: bool, desc: str):
    """``range(num_epochs)``, wrapped in a tqdm progress bar when ``progress``."""
    epochs = range(num_epochs)
    if progress:
        from tqdm.auto import tqdm

        return tqdm(epochs, desc=desc, leave=False)
    return epochs


def _check_finite(loss: float, *, desc: str, epoch: int, lr: float, what: str = "training loss") -> None:
    """Raise ``FloatingPointError`` when an epoch's mean loss is NaN or infinite."""
    if not math.isfinite(loss):
        raise FloatingPointError(f"{desc}: the {what} became {loss} in epoch {epoch}; try a smaller lr (now {lr})")


class _NetworkTrainer:
    """Adam (with weight decay), an optional scheduler and clipping for one network, one epoch at a time.

    :param state: a ``state_dict()`` of an interrupted run: the optimiser (and scheduler) continue from it.
    :param sampler: the ``DistributedSampler`` of a data-parallel run (:func:`_data_parallel_sampler`): rank 0's
        parameters and buffers are copied to every rank now, the gradients, losses and batch-norm running statistics
        are averaged across the ranks at every step, and ``run_epoch(data, epoch)`` sets the sampler's epoch to
        ``first_epoch + epoch``.
    """

    def __init__(self, net: nn.Module, likelihood: str, *, lr: float, weight_decay: float, scheduler=None,
                 scheduler_step: str = "epoch", clip_norm=None, clip_inf_norm=None, desc: str = "train",
                 state: dict | None = None, sampler=None, first_epoch: int = 0) -> None:
        self.sampler, self.first_epoch = sampler, first_epoch
        if sampler is not None:
            broadcast_module_(net)
        self.net, self.likelihood, self.lr, self.desc = net, likelihood, lr, desc
        self.clip_norm, self.clip_inf_norm = clip_norm, clip_inf_norm
        self.scheduler_step = scheduler_step
        self.optimizer = torch.optim.Adam(net.parameters(), lr=lr, weight_decay=weight_decay)
        self.stepper = SchedulerStepper(make_torch_scheduler(scheduler, self.optimizer), scheduler_step)
        if state is not None:
            load_optimizer_state(self.optimizer, self.stepper.scheduler, state)

    def run_epoch(self, data: _TrainingData, epoch: int) -> float:
        """One pass over ``data``; returns the mean loss per data point (checked to be finite)."""
        net, optimizer, stepper = self.net, self.optimizer, self.stepper
        clipping = self.clip_norm is not None or self.clip_inf_norm is not None
        device, dtype = _module_device_dtype(net)
        parallel = self.sampler is not None
        if parallel:
            self.sampler.set_epoch(self.first_epoch + epoch)
            params, stats = list(net.parameters()), running_stats([net])
            count = 0
        net.train()
        total = None
        for xb, yb in data.batches(device, dtype):
            loss = negative_log_likelihood_terms(net(xb), yb, self.likelihood).mean()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            step_loss = loss.detach()
            if parallel:  # the gradient (and loss) of the combined batch, before clipping; batch-norm statistics
                step_loss = average_gradients_(params, step_loss, buffers=stats)[0]
                count += xb.shape[0]
            if clipping:
                clip_gradients(net.parameters(), self.clip_norm, self.clip_inf_norm)
            optimizer.step()
            if stepper.scheduler is not None and self.scheduler_step == "step":
                stepper.after_step(float(step_loss))
            term = loss.detach().double() * xb.shape[0]
            total = term if total is None else total + term
        if total is None:
            raise ValueError("the loader yielded no batch in an epoch")
        if parallel:  # sum over the ranks' points / number of points (the shards may repeat up to W - 1 points)
            total_and_count = all_reduce_mean(torch.stack([total, total.new_tensor(float(count))]))
            mean_loss = float(total_and_count[0]) / float(total_and_count[1])
        else:
            mean_loss = float(total) / data.n
        _check_finite(mean_loss, desc=self.desc, epoch=epoch, lr=self.lr)
        stepper.after_epoch(mean_loss)
        return mean_loss

    def state_dict(self) -> dict:
        scheduler = self.stepper.scheduler
        return {
            "optimizer": detached(self.optimizer.state_dict()),
            "scheduler": None if scheduler is None else detached(scheduler.state_dict()),
        }


def load_optimizer_state(optimizer: torch.optim.Optimizer, scheduler, state: dict) -> None:
    """Load a ``_NetworkTrainer.state_dict()`` into a freshly built optimiser (and scheduler)."""
    try:
        optimizer.load_state_dict(detached(state["optimizer"]))
    except (KeyError, ValueError, TypeError) as err:
        raise ValueError(f"the saved optimiser state does not fit this network: {err}") from None
    if scheduler is not None:
        if state.get("scheduler") is None:
            raise ValueError("resume with a scheduler, but the interrupted run had none")
        scheduler.load_state_dict(detached(state["scheduler"]))


def train_network(
    net: nn.Module,
    x,
    y: Tensor | None = None,
    likelihood: str | None = None,
    *,
    num_epochs: int = 200,
    lr: float = 1e-2,
    batch_size: int | None = 32,
    weight_decay: float = 1e-4,
    progress: bool = False,
    desc: str = "train",
    scheduler: Callable | None = None,
    scheduler_step: str = "epoch",
    clip_norm: float | None = None,
    clip_inf_norm: float | None = None,
) -> list[float]:
    """Maximum a posteriori training of ``net`` with Adam: mean NLL + L2 (weight decay).

    Adam's ``weight_decay`` :math:`\\lambda` on the mean loss corresponds to a Gaussian prior of
    precision :math:`N\\lambda` on every weight: with :math:`N` data points the minimised objective
    :math:`\\frac1N\\sum_n -\\log p(y_n|x_n,w) + \\frac\\lambda2\\|w\\|^2` is, up to a constant,
    :math:`1/N` times the negative log joint under the prior :math:`\\mathcal N(0, (N\\lambda)^{-1} I)`
    (MacKay [1]). Checks every epoch that the loss is finite (a single host sync per epoch) and raises
    ``FloatingPointError`` otherwise.

    **References**

    1. D. J. C. MacKay (1992), *A practical Bayesian framework for backpropagation networks*,
       Neural Computation 4(3).

    :param x: inputs ``(N, ...)`` with targets ``y``, or a loader of ``(x, y)`` batches (then ``y`` is
        omitted, ``batch_size`` unused, and an epoch is one pass over the loader; every batch goes to
        the network's device and dtype one at a time).
    :param scheduler: ``None`` or a callable ``optimizer -> torch.optim.lr_scheduler`` object, e.g.
        ``lambda opt: torch.optim.lr_scheduler.MultiStepLR(opt, [100, 150])`` (``ReduceLROnPlateau``
        is stepped with the epoch's mean loss).
    :param str scheduler_step: ``"epoch"`` (step the scheduler after every epoch) or ``"step"`` (after
        every minibatch).
    :param clip_norm: clip the whole gradient (all parameters together) by its :math:`L_2` norm,
        :math:`g \\leftarrow g \\min(1, c/\\|g\\|_2)`, before every Adam step.
    :param clip_inf_norm: clip the whole gradient by its :math:`L_\\infty` norm,
        :math:`g \\leftarrow g \\min(1, c/\\|g\\|_\\infty)` (after ``clip_norm`` when both are given).
    :returns: the mean training loss of every epoch.
    :raises ValueError: if data-parallel (below) and the ranks' loaders take different numbers of steps.

    **Data-parallel.** Under ``torchrun`` (:func:`pyro_sdebnn.distributed.init`, :math:`W > 1` ranks), a loader
    ``x`` sharded by a :class:`~torch.utils.data.distributed.DistributedSampler` (e.g.
    :func:`pyro_sdebnn.distributed.distributed_loader`) makes the training data-parallel, as
    :class:`~torch.nn.parallel.DistributedDataParallel` would: rank 0's parameters and buffers are copied to
    every rank first, the gradients are averaged across the ranks before every Adam step (and before clipping),
    the batch-norm running statistics after every step, ``x.sampler.set_epoch(epoch)`` is called before every
    epoch (from 0 at every call) and the losses are over all the ranks' points. The ranks then hold the parameters
    of one process on the combined batches (without batch norm). See :mod:`pyro_sdebnn.distributed`.
    """
    history, _ = _train_network(
        net, x, y, likelihood, num_epochs=num_epochs, lr=lr, batch_size=batch_size, weight_decay=weight_decay,
        progress=progress, desc=desc, scheduler=scheduler, scheduler_step=scheduler_step, clip_norm=clip_norm,
        clip_inf_norm=clip_inf_norm,
    )
    return history


def _train_network(net, x, y, likelihood, *, num_epochs, lr, batch_size, weight_decay, progress=False,
                   desc="train", scheduler=None, scheduler_step="epoch", clip_norm=None, clip_inf_norm=None,
                   state: dict | None = None, first_epoch: int = 0) -> tuple[list[float], dict]:
    """:func:`train_network` that can resume from a trainer ``state``; returns the history and the new state.
    ``first_epoch``: the epochs done before (a data-parallel run's ``loader.sampler.set_epoch``)."""
    _check_likelihood(likelihood)
    x, y = _follow_module(x, y, net)
    data, _, (clip_norm, clip_inf_norm) = _network_training_data(
        x, y, likelihood, num_epochs=num_epochs, lr=lr, batch_size=batch_size, weight_decay=weight_decay,
        scheduler_step=scheduler_step, clip_norm=clip_norm, clip_inf_norm=clip_inf_norm,
    )
    sampler = _data_parallel_sampler(data.loader)
    trainer = _NetworkTrainer(
        net, likelihood, lr=lr, weight_decay=weight_decay, scheduler=scheduler, scheduler_step=scheduler_step,
        clip_norm=clip_norm, clip_inf_norm=clip_inf_norm, desc=desc, state=state, sampler=sampler,
        first_epoch=first_epoch,
    )
    net.train()
    if sampler is not None:
        progress = progress and is_main()
    history = [trainer.run_epoch(data, epoch) for epoch in _epochs(num_epochs, progress, desc)]
    return history, trainer.state_dict()
