# SPDX-License-Identifier: Apache-2.0
"""The interface every baseline posterior approximation shares, its likelihoods and a method registry.

A baseline wraps a network (or, for ensembles, a zero-argument network factory) and a likelihood:

- ``"categorical"``: the network outputs ``C`` logits; :math:`p(y|x,w) = \\mathrm{softmax}(f_w(x))_y`.
- ``"gaussian"``: the network outputs two columns, a mean and a log-variance (heteroscedastic
  regression, Lakshminarayanan et al. [1]):

  .. math::

      -\\log p(y|x,w) = \\tfrac12\\left(\\log 2\\pi + s_w(x) + (y-\\mu_w(x))^2 e^{-s_w(x)}\\right).

``fit(x, y, *, num_epochs, lr, batch_size, weight_decay, ...)`` returns ``self`` and
``predict(x)`` returns a :class:`~pyro_sdebnn.infer.predictive.ClassificationPrediction` or
:class:`~pyro_sdebnn.infer.predictive.RegressionPrediction` whose leading dimension ``S`` counts
posterior samples (dropout masks, ensemble members, ...). :data:`METHODS` maps a short name to each
class, so benchmarks can loop over them.

``fit`` and ``predict`` also take a loader in place of the tensors (any iterable of ``(x, y)`` batches
whose ``dataset`` has a length, e.g. a :class:`torch.utils.data.DataLoader`; ``y`` omitted): an epoch is
one pass over it, batches go to the model's device one at a time, and predictions over a loader equal
those on the concatenated tensors. Every method has ``save(path)`` / ``load(path)`` and
``state_dict()`` / ``load_state_dict(sd)`` (see :mod:`pyro_sdebnn.infer.checkpoint`), and
``fit(..., resume=True)`` continues an interrupted run exactly.

**References**

1. B. Lakshminarayanan, A. Pritzel, C. Blundell (2017), *Simple and scalable predictive uncertainty
   estimation using deep ensembles*, NeurIPS.
"""

from __future__ import annotations

import math
from typing import Callable, TypeVar

import torch
from torch import Tensor, nn

from pyro_sdebnn.infer._data import (
    _data_parallel_sampler,
    _is_loader_arg,
    _is_sharded,
    _module_device_dtype,
    _network_training_data,
    _TrainingData,
)
from pyro_sdebnn.infer.predictive import ClassificationPrediction, RegressionPrediction

__all__ = [
    "LIKELIHOODS",
    "METHODS",
    "BaselineMethod",
    "negative_log_likelihood_terms",
    "outputs_to_prediction",
    "register_method",
    "train_network",
]

LIKELIHOODS = ("categorical", "gaussian")

Prediction = ClassificationPrediction | RegressionPrediction
T = TypeVar("T", bound=type)

#: Registry ``{name: class}`` of the baseline methods (filled by :func:`register_method`).
METHODS: dict[str, type] = {}


def register_method(name: str) -> Callable[[T], T]:
    """Class decorator adding a baseline to :data:`METHODS` under ``name``."""

    def decorator(cls: T) -> T:
        if name in METHODS and METHODS[name] is not cls:
            raise ValueError(f"a method named {name!r} is already registered ({METHODS[name].__name__})")
        METHODS[name] = cls
        return cls

    return decorator


def _check_likelihood(likelihood: str) -> str:
    if likelihood not in LIKELIHOODS:
        raise ValueError(f"likelihood must be one of {LIKELIHOODS}, got {likelihood!r}")
    return likelihood


def _check_outputs(outputs: Tensor, likelihood: str) -> None:
    if likelihood == "gaussian" and outputs.shape[-1] != 2:
        raise ValueError(
            "likelihood='gaussian' needs a network with 2 output columns (mean, log-variance), "
            f"got output shape {tuple(outputs.shape)}"
        )
    if likelihood == "categorical" and outputs.shape[-1] < 2:
        raise ValueError(
            "likelihood='categorical' needs a network with C >= 2 logit columns, "
            f"got output shape {tuple(outputs.shape)}"
        )


def negative_log_likelihood_terms(outputs: Tensor, y: Tensor, likelihood: str) -> Tensor:
    """Per-example negative log-likelihood :math:`-\\log p(y_n | f_n)`, shape ``outputs.shape[:-1]``.

    :param Tensor outputs: network outputs ``(..., N, C)`` (logits) or ``(..., N, 2)`` (mean, log-variance).
    :param Tensor y: labels / targets ``(N,)``.
    :param str likelihood: ``"categorical"`` or ``"gaussian"``.

    >>> negative_log_likelihood_terms(torch.zeros(3, 2), torch.tensor([0, 1, 1]), "categorical")
    tensor([0.6931, 0.6931, 0.6931])
    """
    _check_likelihood(likelihood)
    _check_outputs(outputs, likelihood)
    if likelihood == "categorical":
        logp = outputs.log_softmax(-1)
        return -logp.gather(-1, y.expand(logp.shape[:-1]).unsqueeze(-1)).squeeze(-1)
    mean, log_var = outputs.unbind(-1)
    return 0.5 * (math.log(2 * math.pi) + log_var + (y - mean).pow(2) * torch.exp(-log_var))


def outputs_to_prediction(outputs: Tensor, likelihood: str) -> Prediction:
    """Turn stacked network outputs ``(S, N, C)`` into the common prediction container.

    >>> outputs_to_prediction(torch.zeros(4, 3, 2), "categorical").probs.shape
    torch.Size([4, 3, 2])
    >>> outputs_to_prediction(torch.zeros(4, 3, 2), "gaussian").scale
    tensor([[1., 1., 1.],
            [1., 1., 1.],
            [1., 1., 1.],
            [1., 1., 1.]])
    """
    _check_likelihood(likelihood)
    _check_outputs(outputs, likelihood)
    if outputs.dim() != 3:
        raise ValueError(f"outputs must have shape (S, N, C), got {tuple(outputs.shape)}")
    if likelihood == "categorical":
        return ClassificationPrediction(outputs.softmax(-1))
    mean, log_var = outputs.unbind(-1)
    return RegressionPrediction(mean, torch.exp(0.5 * log_var))


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


_DROPOUT_TYPES = (nn.modules.dropout._DropoutNd,)  # Dropout, Dropout1d/2d/3d, AlphaDropout, FeatureAlphaDropout


def _dropout_layers(net: nn.Module) -> list[nn.Module]:
    """Every dropout module of ``net`` (active or not)."""
    return [m for m in net.modules() if isinstance(m, _DROPOUT_TYPES)]


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
        from pyro_sdebnn.infer._training import SchedulerStepper, make_torch_scheduler

        self.sampler, self.first_epoch = sampler, first_epoch
        if sampler is not None:
            from pyro_sdebnn.distributed.data_parallel import broadcast_module_

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
        from pyro_sdebnn.infer._training import clip_gradients

        net, optimizer, stepper = self.net, self.optimizer, self.stepper
        clipping = self.clip_norm is not None or self.clip_inf_norm is not None
        device, dtype = _module_device_dtype(net)
        parallel = self.sampler is not None
        if parallel:
            from pyro_sdebnn.distributed.data_parallel import average_gradients_, running_stats

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
            from pyro_sdebnn.distributed.comm import all_reduce_mean

            total_and_count = all_reduce_mean(torch.stack([total, total.new_tensor(float(count))]))
            mean_loss = float(total_and_count[0]) / float(total_and_count[1])
        else:
            mean_loss = float(total) / data.n
        _check_finite(mean_loss, desc=self.desc, epoch=epoch, lr=self.lr)
        stepper.after_epoch(mean_loss)
        return mean_loss

    def state_dict(self) -> dict:
        from pyro_sdebnn.infer.checkpoint import detached

        scheduler = self.stepper.scheduler
        return {
            "optimizer": detached(self.optimizer.state_dict()),
            "scheduler": None if scheduler is None else detached(scheduler.state_dict()),
        }


def load_optimizer_state(optimizer: torch.optim.Optimizer, scheduler, state: dict) -> None:
    """Load a ``_NetworkTrainer.state_dict()`` into a freshly built optimiser (and scheduler)."""
    from pyro_sdebnn.infer.checkpoint import detached

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
    of one process on the combined batches (without batch norm). See :mod:`pyro_sdebnn.distributed.data_parallel`.
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
        from pyro_sdebnn.distributed.comm import is_main

        progress = progress and is_main()
    history = [trainer.run_epoch(data, epoch) for epoch in _epochs(num_epochs, progress, desc)]
    return history, trainer.state_dict()


class BaselineMethod:
    """Base class of the baselines: a likelihood, ``fit``, ``predict`` and the uncertainty split.

    Subclasses implement :meth:`fit` and :meth:`predict_outputs` (stacked network outputs ``(S, N, C)``),
    from which :meth:`predict` builds the prediction container, or override :meth:`predict`. The default
    hyper-parameters of ``fit`` are those of the Two Moons study (:mod:`pyro_sdebnn.experiments.two_moons`): Adam,
    learning rate 1e-2, batch size 32, weight decay 1e-4.

    >>> from pyro_sdebnn.infer import DeepEnsemble
    >>> from pyro_sdebnn.nn import make_mlp
    >>> method = DeepEnsemble(lambda: make_mlp([2, 8, 3]), "categorical", num_members=2)
    >>> type(method).__mro__[1].__name__, method.likelihood
    ('BaselineMethod', 'categorical')
    >>> total, aleatoric, epistemic = method.uncertainty(torch.randn(4, 2))
    >>> torch.allclose(total, aleatoric + epistemic)
    True
    """

    def __init__(self, likelihood: str) -> None:
        self.likelihood = _check_likelihood(likelihood)
        self.losses: list[float] = []
        self._train_state: dict | None = None

    def fit(self, x, y: Tensor | None = None, **kwargs) -> "BaselineMethod":  # pragma: no cover - interface
        raise NotImplementedError

    # ------------------------------------------------------------------ resume and checkpoints
    @property
    def epoch(self) -> int:
        """The number of training epochs run so far (over every call of ``fit``)."""
        return len(self.losses)

    def _resume_state(self, resume: bool, loader=None) -> dict | None:
        """For ``fit(..., resume=True)``: the saved training state, with torch's random state restored."""
        from pyro_sdebnn.infer.checkpoint import set_rng_state

        if not isinstance(resume, bool):
            raise TypeError(f"resume must be True or False, got {resume!r}")
        if not resume:
            return None
        if self._train_state is None:
            raise ValueError("resume=True continues an interrupted run: call fit(...) or load(path) first")
        set_rng_state(self._train_state["rng"], loader)
        return self._train_state

    def _data_parallel_sampler(self, loader):
        """The ``DistributedSampler`` of a data-parallel ``fit`` on ``loader`` (else ``None``); remembered, so
        that :meth:`save` then writes on rank 0 only. Every rank must call it."""
        sampler = _data_parallel_sampler(loader)
        self._data_parallel = sampler is not None
        return sampler

    def _note_data_parallel(self, loader) -> None:
        """Remember whether a ``fit`` on ``loader`` is data-parallel (no collective), for :meth:`save`."""
        self._data_parallel = _is_sharded(loader)

    @staticmethod
    def _is_main() -> bool:
        from pyro_sdebnn.distributed.comm import is_main

        return is_main()

    def _fit_network(self, net: nn.Module, x, y, *, desc: str, resume: bool, **training) -> None:
        """``fit`` by :func:`train_network` of ``net`` (continuing the last run when ``resume``): the losses are
        appended to :attr:`losses` and the training state is kept for the next ``resume``. ``training`` holds
        :func:`train_network`'s keyword arguments (``num_epochs``, ``lr``, ...)."""
        loader = x if _is_loader_arg(x) else None
        state = self._resume_state(resume, loader)
        self._note_data_parallel(loader)
        history, trainer_state = _train_network(
            net, x, y, self.likelihood, desc=desc, state=None if state is None else state["trainer"],
            first_epoch=self.epoch, **training,
        )
        self.losses.extend(history)
        self._end_fit(loader, trainer=trainer_state)

    def _end_fit(self, loader=None, **training) -> None:
        """Keep what a resumed ``fit`` needs: ``training`` (optimiser states...) and the random state now."""
        from pyro_sdebnn.infer.checkpoint import rng_state

        self._train_state = {**training, "rng": rng_state(loader)}

    def _fitted_state(self) -> dict:  # pragma: no cover - interface
        raise NotImplementedError

    def _prepare_load(self, state: dict) -> Callable[[], None]:  # pragma: no cover - interface
        """Validate the method-specific part of ``state``; return a function that applies it (cannot fail)."""
        raise NotImplementedError

    def state_dict(self) -> dict:
        """Everything needed to predict with, and to resume training of, this method (tensors and plain
        containers only, so ``torch.load(path, weights_only=True)`` reads it).

        Holds the fitted state (network weights, guide parameters, curvature...), the loss of every epoch
        (``losses``; their number is the epoch reached) and the training state of the last ``fit``:
        optimiser and scheduler states and torch's random state at its end.
        """
        from pyro_sdebnn.infer.checkpoint import CHECKPOINT_FORMAT, detached

        return {
            "format": CHECKPOINT_FORMAT,
            "method": type(self).__name__,
            "likelihood": self.likelihood,
            "epoch": self.epoch,
            "losses": [float(v) for v in self.losses],
            "training": detached(self._train_state),
            **self._fitted_state(),
        }

    def load_state_dict(self, state: dict) -> "BaselineMethod":
        """Load a :meth:`state_dict` of the same method and model.

        :raises ValueError: if ``state`` is of another method, likelihood or network (parameter names or
            shapes); nothing is changed then.
        """
        from pyro_sdebnn.infer.checkpoint import check_header, detached

        check_header(state, type(self).__name__)
        if state.get("likelihood") != self.likelihood:
            raise ValueError(
                f"the checkpoint's likelihood is {state.get('likelihood')!r}, this method's {self.likelihood!r}"
            )
        losses = state.get("losses")
        if not isinstance(losses, list) or not all(isinstance(v, float) for v in losses):
            raise ValueError("the checkpoint's losses must be a list of floats")
        training = state.get("training")
        if training is not None and not (isinstance(training, dict) and isinstance(training.get("rng"), dict)):
            raise ValueError("the checkpoint's training state is malformed")
        apply = self._prepare_load(state)
        apply()
        self.losses = list(losses)
        self._train_state = detached(training)
        return self

    def save(self, path) -> None:
        """Write :meth:`state_dict` to ``path`` (``torch.load(path, weights_only=True)`` reads it back).

        After a data-parallel ``fit`` (every rank holds the same parameters) only rank 0 writes; on the other ranks
        this does nothing (call :func:`pyro_sdebnn.distributed.barrier` before they read the file).
        """
        from pyro_sdebnn.infer.checkpoint import save_checkpoint

        if getattr(self, "_data_parallel", False) and not self._is_main():
            return
        save_checkpoint(self.state_dict(), path)

    def load(self, path, map_location=None) -> "BaselineMethod":
        """Load a checkpoint written by :meth:`save` into this (freshly constructed) method; returns ``self``.

        :raises ValueError: for a truncated or corrupted file, or a checkpoint of another method or model
            (the method is left unchanged).
        """
        from pyro_sdebnn.infer.checkpoint import load_checkpoint

        return self.load_state_dict(load_checkpoint(path, map_location))

    def predict_outputs(self, x: Tensor, *args, **kwargs) -> Tensor:  # pragma: no cover - interface
        raise NotImplementedError

    def predict(self, x: Tensor, *args, **kwargs) -> Prediction:
        """The predictive built from :meth:`predict_outputs` (extra arguments, e.g. ``num_samples``, go to it)."""
        return outputs_to_prediction(self.predict_outputs(x, *args, **kwargs), self.likelihood)

    def uncertainty(self, x: Tensor):
        """``(total, aleatoric, epistemic)`` per input, with total = aleatoric + epistemic.

        Classification: predictive entropy = expected entropy + mutual information
        (:func:`pyro_sdebnn.metrics.uncertainty_decomposition`); regression: predictive variance =
        :math:`E_s[\\sigma_s^2] + \\mathrm{Var}_s[\\mu_s]`
        (:func:`pyro_sdebnn.metrics.regression_variance_decomposition`).
        """
        from pyro_sdebnn.metrics import regression_variance_decomposition, uncertainty_decomposition

        prediction = self.predict(x)
        if isinstance(prediction, ClassificationPrediction):
            return uncertainty_decomposition(prediction.probs)
        return regression_variance_decomposition(prediction)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(likelihood={self.likelihood!r})"
