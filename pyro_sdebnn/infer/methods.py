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

**References**

1. B. Lakshminarayanan, A. Pritzel, C. Blundell (2017), *Simple and scalable predictive uncertainty
   estimation using deep ensembles*, NeurIPS.
"""

from __future__ import annotations

import math
from typing import Callable, Iterator, TypeVar

import torch
from torch import Tensor, nn

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


def _check_data(x: Tensor, y: Tensor | None, likelihood: str) -> None:
    if not isinstance(x, Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() < 2:
        raise ValueError(f"x must have shape (N, ...) with a feature dimension, got {tuple(x.shape)}")
    if y is None:
        return
    if not isinstance(y, Tensor):
        raise TypeError(f"y must be a torch.Tensor, got {type(y).__name__}")
    if y.shape != x.shape[:1]:
        raise ValueError(f"y must have shape (N,) = {tuple(x.shape[:1])}, got {tuple(y.shape)}")
    if likelihood == "categorical" and (y.dtype.is_floating_point or y.dtype == torch.bool):
        raise TypeError(f"categorical labels y must be an integer tensor, got {y.dtype}")
    if likelihood == "gaussian" and not y.dtype.is_floating_point:
        raise TypeError(f"gaussian targets y must be a floating-point tensor, got {y.dtype}")


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


def _check_fit_args(n: int, *, num_epochs: int, lr: float, batch_size: int | None, weight_decay: float | None) -> int:
    """Validate the arguments every ``fit`` shares; return the minibatch size (``n`` for ``batch_size=None``).

    ``weight_decay=None`` is accepted (the SVI baselines then keep their prior); otherwise it must be
    non-negative.
    """
    if isinstance(num_epochs, bool) or not isinstance(num_epochs, int) or num_epochs < 0:
        raise ValueError(f"num_epochs must be a non-negative integer, got {num_epochs!r}")
    if not lr > 0:
        raise ValueError(f"lr must be positive, got {lr!r}")
    if weight_decay is not None and not weight_decay >= 0:
        raise ValueError(f"weight_decay must be non-negative, got {weight_decay!r}")
    size = n if batch_size is None else int(batch_size)
    if size < 1:
        raise ValueError(f"batch_size must be a positive integer or None, got {batch_size!r}")
    return size


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


def _minibatches(n: int, batch_size: int, device: torch.device, generator=None) -> Iterator[Tensor]:
    perm = torch.randperm(n, device=device, generator=generator)
    for start in range(0, n, batch_size):
        yield perm[start : start + batch_size]


def train_network(
    net: nn.Module,
    x: Tensor,
    y: Tensor,
    likelihood: str,
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

    :param scheduler: ``None`` or a callable ``optimizer -> torch.optim.lr_scheduler`` object, e.g.
        ``lambda opt: torch.optim.lr_scheduler.MultiStepLR(opt, [100, 150], gamma=0.1)``, applied to the
        Adam optimiser (``ReduceLROnPlateau`` gets the mean loss of the epoch, or of the step).
    :param str scheduler_step: ``"epoch"`` (step the scheduler after every epoch) or ``"step"`` (after
        every minibatch).
    :param clip_norm: clip the whole gradient (all parameters together) by its :math:`L_2` norm,
        :math:`g \\leftarrow g \\min(1, c/\\|g\\|_2)`, before every Adam step.
    :param clip_inf_norm: clip the whole gradient by its :math:`L_\\infty` norm,
        :math:`g \\leftarrow g \\min(1, c/\\|g\\|_\\infty)` (after ``clip_norm`` when both are given).
    :returns: the mean training loss of every epoch.
    """
    from pyro_sdebnn.infer._training import SchedulerStepper, check_clip, clip_gradients, make_torch_scheduler

    _check_likelihood(likelihood)
    _check_data(x, y, likelihood)
    n = x.shape[0]
    batch_size = _check_fit_args(n, num_epochs=num_epochs, lr=lr, batch_size=batch_size, weight_decay=weight_decay)
    clip_norm, clip_inf_norm = check_clip(clip_norm, clip_inf_norm)
    SchedulerStepper(None, scheduler_step)  # validates scheduler_step before any work
    optimizer = torch.optim.Adam(net.parameters(), lr=lr, weight_decay=weight_decay)
    stepper = SchedulerStepper(make_torch_scheduler(scheduler, optimizer), scheduler_step)
    clipping = clip_norm is not None or clip_inf_norm is not None
    net.train()
    history: list[float] = []
    for epoch in _epochs(num_epochs, progress, desc):
        total = torch.zeros((), device=x.device, dtype=torch.float64)
        for idx in _minibatches(n, batch_size, x.device):
            loss = negative_log_likelihood_terms(net(x[idx]), y[idx], likelihood).mean()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if clipping:
                clip_gradients(net.parameters(), clip_norm, clip_inf_norm)
            optimizer.step()
            if stepper.scheduler is not None and scheduler_step == "step":
                stepper.after_step(float(loss.detach()))
            total = total + loss.detach().double() * idx.numel()
        mean_loss = float(total) / n
        _check_finite(mean_loss, desc=desc, epoch=epoch, lr=lr)
        history.append(mean_loss)
        stepper.after_epoch(mean_loss)
    return history


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

    def fit(self, x: Tensor, y: Tensor, **kwargs) -> "BaselineMethod":  # pragma: no cover - interface
        raise NotImplementedError

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
