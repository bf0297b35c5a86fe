# SPDX-License-Identifier: Apache-2.0
"""The interface every baseline posterior approximation shares, its likelihoods and a method registry.

A baseline wraps a network (or, for ensembles, a zero-argument network factory) and a likelihood:

- ``"categorical"``: the network outputs ``C`` logits; :math:`p(y|x,w) = \\mathrm{softmax}(f_w(x))_y`.
- ``"normal"``: the network outputs two columns, a mean and a log-variance (heteroscedastic
  regression, Lakshminarayanan et al. [1]):

  .. math::

      -\\log p(y|x,w) = \\tfrac12\\left(\\log 2\\pi + s_w(x) + (y-\\mu_w(x))^2 e^{-s_w(x)}\\right).

``fit(x, y, *, num_epochs, lr, batch_size, weight_decay, ...)`` returns ``self`` and
``predict(x)`` returns a :class:`~pyro_sdebnn.predictive.ClassificationPrediction` or
:class:`~pyro_sdebnn.predictive.RegressionPrediction` whose leading dimension ``S`` counts
posterior samples (dropout masks, ensemble members, ...). ``METHODS`` maps a short name to each
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

from typing import Any, Callable, TypeVar

import torch
from torch import Tensor, nn

from pyro_sdebnn._comm import all_gather_objects, is_main, rank, world_size
from pyro_sdebnn.data.loaders import rng_state, set_rng_state
from pyro_sdebnn.infer._baseline_data import (
    _data_parallel_sampler,
    _is_loader_arg,
    _is_sharded,
)
from pyro_sdebnn.infer._likelihoods import (
    LIKELIHOODS,
    _check_likelihood,
    _check_outputs,
    negative_log_likelihood_terms,
)
from pyro_sdebnn.infer.checkpoint import (
    check_envelope,
    detached,
    envelope,
    load_checkpoint,
    save_checkpoint,
)
from pyro_sdebnn.infer.map_training import _train_network
from pyro_sdebnn.metrics import regression_variance_decomposition, uncertainty_decomposition
from pyro_sdebnn.predictive import ClassificationPrediction, RegressionPrediction

__all__ = ["BaselineMethod"]

Prediction = ClassificationPrediction | RegressionPrediction
T = TypeVar("T", bound=type)

#: Registry ``{name: class}`` of the baseline methods (filled by ``register_method``).
METHODS: dict[str, type] = {}


def register_method(name: str) -> Callable[[T], T]:
    """Class decorator adding a baseline to ``METHODS`` under ``name``."""

    def decorator(cls: T) -> T:
        if name in METHODS and METHODS[name] is not cls:
            raise ValueError(f"a method named {name!r} is already registered ({METHODS[name].__name__})")
        METHODS[name] = cls
        return cls

    return decorator


def outputs_to_prediction(outputs: Tensor, likelihood: str) -> Prediction:
    """Turn stacked network outputs ``(S, N, C)`` into the common prediction container.

    >>> outputs_to_prediction(torch.zeros(4, 3, 2), "categorical").probs.shape
    torch.Size([4, 3, 2])
    >>> outputs_to_prediction(torch.zeros(4, 3, 2), "normal").scale
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


_DROPOUT_TYPES = (nn.modules.dropout._DropoutNd,)  # Dropout, Dropout1d/2d/3d, AlphaDropout, FeatureAlphaDropout


def _dropout_layers(net: nn.Module) -> list[nn.modules.dropout._DropoutNd]:
    """Every dropout module of ``net`` (active or not)."""
    return [m for m in net.modules() if isinstance(m, _DROPOUT_TYPES)]


def _valid_rngs(training: dict) -> bool:
    """Whether a training state holds one random state per rank (a non-empty list of dicts, as many as its
    ``"world_size"``), or a single random state (a dict), which every rank restores."""
    rngs = training.get("rng")
    if isinstance(rngs, dict):
        return True
    return (isinstance(rngs, list) and len(rngs) > 0 and all(isinstance(r, dict) for r in rngs)
            and training.get("world_size") == len(rngs))


class BaselineMethod:
    """Base class of the baselines: a likelihood, ``fit``, ``predict`` and the uncertainty split.

    Subclasses implement :meth:`fit` and :meth:`predict_outputs` (stacked network outputs ``(S, N, C)``),
    from which :meth:`predict` builds the prediction container, or override :meth:`predict`. The default
    hyper-parameters of ``fit`` are those of the Two Moons study (:mod:`pyro_sdebnn.experiments.two_moons`): Adam,
    learning rate 1e-2, batch size 32, weight decay 1e-4.

    >>> from pyro_sdebnn.infer import DeepEnsemble
    >>> from torch import nn
    >>> def net():
    ...     return nn.Sequential(nn.Linear(2, 8), nn.ReLU(), nn.Linear(8, 3))
    >>> method = DeepEnsemble(net, "categorical", num_members=2)
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

    def fit(self, *args: Any, **kwargs: Any) -> "BaselineMethod":  # pragma: no cover - interface: fit(x, y, ...)
        raise NotImplementedError

    # ------------------------------------------------------------------ resume and checkpoints
    @property
    def epoch(self) -> int:
        """The number of training epochs run so far (over every call of ``fit``)."""
        return len(self.losses)

    def _resume_state(self, resume: bool, loader=None) -> dict | None:
        """For ``fit(..., resume=True)``: the saved training state, with torch's random state restored."""
        if not isinstance(resume, bool):
            raise TypeError(f"resume must be True or False, got {resume!r}")
        if not resume:
            self._unfinished = True  # until _end_fit: the parameters move away from the kept training state
            return None
        if getattr(self, "_unfinished", False):
            raise ValueError("resume=True: the last fit did not finish (interrupted, or it raised), so the parameters "
                             "are no longer those its training state belongs to and the run cannot continue exactly; "
                             "load(path) a checkpoint saved after a finished fit, or fit without resume")
        if self._train_state is None:
            raise ValueError("resume=True continues an interrupted run: call fit(...) or load(path) first (a "
                             "checkpoint saved after a finished fit)")
        set_rng_state(self._rank_rng(self._train_state["rng"], loader), loader)
        self._unfinished = True
        return self._train_state

    @staticmethod
    def _rank_rng(rngs, loader) -> dict:
        """This rank's random state among ``rngs``, those of every rank of the last ``fit`` in rank order (one for a
        fit in one process, or not data-parallel); a single random state (a dict, not a list) goes to every rank."""
        if isinstance(rngs, dict):
            return rngs
        ranks, this_rank = (world_size(), rank()) if _is_sharded(loader) else (1, 0)
        if len(rngs) != ranks:
            raise ValueError(f"resume=True: the last fit ran on {len(rngs)} data-parallel rank(s) and its training "
                             f"state holds their random states, this fit runs on {ranks} (data-parallel ranks of a "
                             f"sharded loader, or 1): resume on {len(rngs)} rank(s) to continue the run exactly, or "
                             "fit without resume")
        return rngs[this_rank]

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
        return is_main()

    def _fit_network(self, net: nn.Module, x, y, *, desc: str, resume: bool, **training) -> None:
        """``fit`` by :func:`~pyro_sdebnn.infer.map_training.train_network` of ``net`` (continuing the last run
        when ``resume``): the losses are appended to :attr:`losses` and the training state is kept for the next
        ``resume``. ``training`` holds ``train_network``'s keyword arguments (``num_epochs``, ``lr``, ...)."""
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
        """Keep what a resumed ``fit`` needs: ``training`` (optimiser states...) and the random state now, that of
        every rank after a data-parallel fit (gathered, so every rank must call it, as it does the fit)."""
        state = rng_state(loader)
        rngs = all_gather_objects(state) if getattr(self, "_data_parallel", False) else [state]
        self._train_state = {**training, "rng": rngs, "world_size": len(rngs)}
        self._unfinished = False

    def _fitted_state(self) -> dict:  # pragma: no cover - interface
        raise NotImplementedError

    def _prepare_load(self, state: dict) -> Callable[[], None]:  # pragma: no cover - interface
        """Validate the method-specific part of ``state``; return a function that applies it (cannot fail)."""
        raise NotImplementedError

    def state_dict(self) -> dict:
        """Everything needed to predict with, and to resume training of, this method (tensors and plain
        containers only, so ``torch.load(path, weights_only=True)`` reads it).

        Holds the fitted state (network weights, guide parameters, curvature...), the loss of every epoch
        (``losses``; their number is the epoch reached) and the training state of the last ``fit`` (``None`` if it did
        not finish: an interrupted run cannot be resumed exactly):
        optimiser and scheduler states and the random state at its end (``"rng"``, a list with that of every rank
        of a data-parallel fit in rank order, each rank resuming from its own, and ``"world_size"``, its length).
        """
        return {
            **envelope("baseline"),
            "method": type(self).__name__,
            "likelihood": self.likelihood,
            "epoch": self.epoch,
            "losses": [float(v) for v in self.losses],
            # after a fit that did not finish, the kept training state is not that of these parameters: left out
            "training": None if getattr(self, "_unfinished", False) else detached(self._train_state),
            **self._fitted_state(),
        }

    def load_state_dict(self, state: dict) -> "BaselineMethod":
        """Load a :meth:`state_dict` of the same method and model.

        :raises ValueError: if ``state`` is of another method, likelihood or network (parameter names or
            shapes); nothing is changed then.
        """
        check_envelope(state, "baseline")
        if state.get("method") != type(self).__name__:
            method = state.get("method")
            raise ValueError(f"the checkpoint is of a {method!r}, not of a {type(self).__name__!r}")
        if state.get("likelihood") != self.likelihood:
            raise ValueError(
                f"the checkpoint's likelihood is {state.get('likelihood')!r}, this method's {self.likelihood!r}"
            )
        losses = state.get("losses")
        if not isinstance(losses, list) or not all(isinstance(v, float) for v in losses):
            raise ValueError("the checkpoint's losses must be a list of floats")
        training = state.get("training")
        if training is not None and not (isinstance(training, dict) and _valid_rngs(training)):
            raise ValueError("the checkpoint's training state is malformed")
        apply = self._prepare_load(state)
        apply()
        self.losses = list(losses)
        self._train_state = detached(training)
        self._unfinished = False
        return self

    def save(self, path) -> None:
        """Write :meth:`state_dict` to ``path`` (``torch.load(path, weights_only=True)`` reads it back).

        After a data-parallel ``fit`` (every rank holds the same parameters and every rank's random state) only
        rank 0 writes; on the other ranks this does nothing (call :func:`torch.distributed.barrier` before they read
        the file). ``load`` then ``fit(..., resume=True)`` on as many ranks gives each rank its own random state.
        """
        if getattr(self, "_data_parallel", False) and not self._is_main():
            return
        save_checkpoint("baseline", self.state_dict(), path)

    def load(self, path, map_location=None) -> "BaselineMethod":
        """Load a checkpoint written by :meth:`save` into this (freshly constructed) method; returns ``self``.

        :param map_location: passed to :func:`torch.load`: ``"cpu"`` reads a checkpoint saved on a GPU on a machine
            without one.
        :raises ValueError: for a truncated or corrupted file, a GPU checkpoint on a machine without CUDA (the message
            names ``map_location``), or a checkpoint of another method or model (the method is left unchanged).
        """
        return self.load_state_dict(load_checkpoint(path, "baseline", map_location))

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
        prediction = self.predict(x)
        if isinstance(prediction, ClassificationPrediction):
            return uncertainty_decomposition(prediction.probs)
        return regression_variance_decomposition(prediction)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(likelihood={self.likelihood!r})"
