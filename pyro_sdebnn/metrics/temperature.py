# SPDX-License-Identifier: Apache-2.0
"""Temperature scaling: one scalar :math:`T > 0` dividing the logits, fitted on validation data."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ._validation import _check_labels, _float_tensor, _sum_tolerance, _value_precision

__all__ = ["fit_temperature", "temperature_scale"]


def _check_logits(logits) -> Tensor:
    logits = _float_tensor("logits", logits)
    if logits.dim() not in (1, 2) or (logits.dim() == 2 and logits.shape[1] < 2):
        raise ValueError(
            f"logits must have shape (N, C) with C >= 2, or (N,) binary logits, got {tuple(logits.shape)}"
        )
    if logits.shape[0] == 0:
        raise ValueError("logits is empty: need at least one validation point")
    finite = torch.isfinite(logits)
    if logits.dim() == 1 and not finite.all():
        raise ValueError("logits must be finite, got NaN or infinite values")
    # (N, C): -inf is the log of a probability that underflowed to 0 (often in float16), as softmax treats it
    if logits.dim() == 2 and (logits.isnan().any() or (logits == math.inf).any() or not finite.any(-1).all()):
        raise ValueError("logits must be finite or -inf (the log of a zero probability) with a finite entry in every "
                         "row, got NaN, +inf or a row without a finite entry")
    if logits.dim() == 2 and _look_like_probabilities(logits):
        raise ValueError(
            "logits look like probabilities (every row in [0, 1] and summing to 1): temperature scaling divides "
            "logits, so pass log-probabilities instead, e.g. probs.log() (a zero probability's -inf is accepted)"
        )
    return logits


def _look_like_probabilities(logits: Tensor) -> bool:
    """Whether ``(N, C)`` "logits" are in fact probabilities: every entry in [0, 1], every row summing to 1 (within
    the tolerance the probability metrics use), and not all rows uniform (equal logits, for which :math:`T` does not
    matter). Real logits pass this test with probability zero; probabilities given by mistake (``pred.mean_probs``)
    would otherwise yield a meaningless :math:`T` without a word."""
    if (logits < 0).any() or (logits > 1).any():
        return False
    if ((logits.sum(-1) - 1).abs() > _sum_tolerance(_value_precision(logits))).any():
        return False
    return bool((logits != logits[:, :1]).any())


def _check_temperature(temperature) -> Tensor:
    temperature = _float_tensor("temperature", temperature)
    if temperature.numel() != 1 or not torch.isfinite(temperature).all() or (temperature <= 0).any():
        raise ValueError(f"temperature must be one positive finite number, got {temperature}")
    return temperature.reshape(())


def _nll(logits: Tensor, labels: Tensor, inverse_temperature: float) -> Tensor:
    scaled = logits * inverse_temperature
    if logits.dim() == 1:
        return torch.nn.functional.binary_cross_entropy_with_logits(scaled, labels.to(logits.dtype))
    return torch.nn.functional.cross_entropy(scaled, labels)


def fit_temperature(logits, labels, *, bounds: tuple[float, float] = (0.01, 100.0), tol: float = 1e-6) -> Tensor:
    """Fit the temperature :math:`T` that minimises the validation negative log-likelihood.

    .. math::

        \\hat T = \\arg\\min_{T > 0} -\\frac1N \\sum_{i=1}^N \\log \\operatorname{softmax}(z_i / T)_{y_i}

    (sigmoid of :math:`z_i / T` for binary ``(N,)`` logits). The NLL is convex in :math:`1/T`, so it
    is unimodal in :math:`\\log T`; the 1-D minimum over :math:`\\log T \\in [\\log T_\\min,
    \\log T_\\max]` is found by bounded Brent search (``scipy.optimize.minimize_scalar``), with the
    NLL evaluated in float64. Dividing by :math:`T > 0` never changes the predicted class. An
    over-confident model gets :math:`\\hat T > 1`. If the validation data are perfectly separated the
    NLL decreases towards 0 as :math:`T \\to 0` and the result is near the lower bound.

    :param logits: ``(N, C)`` validation logits, or ``(N,)`` binary logits (log-odds of class 1). For the
        predictive of a Bayesian model pass the log of its mean probabilities (a probability that underflowed to 0
        gives ``-inf``, accepted in ``(N, C)`` logits); probabilities themselves (rows in [0, 1] summing to 1) raise
        a ``ValueError``.
    :param labels: ``(N,)`` integer labels (``{0, 1}`` for binary logits).
    :param bounds: search interval :math:`(T_\\min, T_\\max)`, positive.
    :param float tol: absolute tolerance on :math:`\\log T`.
    :return: 0-dim tensor :math:`\\hat T` (dtype and device of ``logits``, float32 for half-precision
        logits); apply it with
        :func:`temperature_scale`.

    **References**

    [1] C. Guo, G. Pleiss, Y. Sun, K. Q. Weinberger (2017), "On calibration of modern neural
    networks", ICML.

    >>> logits = torch.tensor([[4.0, 0.0], [4.0, 0.0], [0.0, 4.0], [4.0, 0.0]])
    >>> temperature = fit_temperature(logits, torch.tensor([0, 1, 1, 0]))
    >>> round(float(temperature), 3)  # sigmoid(4 / T) = 3/4, the accuracy: T = 4 / log 3
    3.641
    """
    from scipy.optimize import minimize_scalar

    logits = _check_logits(logits)
    num_classes = 2 if logits.dim() == 1 else logits.shape[1]
    labels = _check_labels(labels, logits.shape[0], num_classes, logits.device)
    low, high = (float(b) for b in bounds)
    if not (0 < low < high and math.isfinite(high)):
        raise ValueError(f"bounds must be (T_min, T_max) with 0 < T_min < T_max < inf, got {bounds!r}")
    z = logits.detach().double()

    def objective(log_t: float) -> float:
        return float(_nll(z, labels, math.exp(-log_t)))

    result = minimize_scalar(
        objective, bounds=(math.log(low), math.log(high)), method="bounded", options={"xatol": tol}
    )
    if not math.isfinite(result.fun):
        raise ValueError("the validation NLL is not finite for any temperature in bounds; check logits and labels")
    return torch.tensor(math.exp(result.x), dtype=logits.dtype, device=logits.device)


def temperature_scale(logits, temperature) -> Tensor:
    """Calibrated probabilities :math:`\\operatorname{softmax}(z / T)` (sigmoid for binary ``(N,)`` logits).

    :param logits: ``(N, C)`` logits (``-inf`` entries allowed, each row with a finite one) or ``(N,)`` binary
        logits.
    :param temperature: positive scalar (e.g. from :func:`fit_temperature`).
    :return: ``(N, C)`` probabilities, or ``(N,)`` positive-class probabilities for binary logits, in the
        dtype of ``logits`` (float32 for float16/bfloat16 logits).

    >>> temperature_scale(torch.tensor([[2.0, 0.0]]), 2.0)
    tensor([[0.7311, 0.2689]])
    """
    logits = _check_logits(logits)
    temperature = _check_temperature(temperature).to(logits)
    scaled = logits / temperature
    return torch.sigmoid(scaled) if logits.dim() == 1 else torch.softmax(scaled, dim=-1)
