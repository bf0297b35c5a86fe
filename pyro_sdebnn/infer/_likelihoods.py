# SPDX-License-Identifier: Apache-2.0
"""The likelihoods of the baselines: their names, the check of the network outputs and the per-example NLL.

- ``"categorical"``: the network outputs ``C`` logits; :math:`p(y|x,w) = \\mathrm{softmax}(f_w(x))_y`.
- ``"normal"``: the network outputs two columns, a mean and a log-variance :math:`s_w(x)` (heteroscedastic
  regression, Lakshminarayanan et al. (2017), *Simple and scalable predictive uncertainty estimation using deep
  ensembles*, NeurIPS), :math:`-\\log p(y|x,w) = \\tfrac12(\\log 2\\pi + s_w(x) + (y-\\mu_w(x))^2 e^{-s_w(x)})`.

:mod:`pyro_sdebnn.infer.methods` re-exports them; the training loops (:mod:`pyro_sdebnn.infer.map_training`) import
them from here, below the method classes.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from pyro_sdebnn._likelihoods import check_likelihood


#: The likelihoods of the baselines (Pyro's distribution names).
LIKELIHOODS = ("normal", "categorical")


def _check_likelihood(likelihood: str) -> str:
    return check_likelihood(likelihood, LIKELIHOODS)


def _check_outputs(outputs: Tensor, likelihood: str) -> None:
    if likelihood == "normal" and outputs.shape[-1] != 2:
        raise ValueError(
            "likelihood='normal' needs a network with 2 output columns (mean, log-variance), "
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
    :param str likelihood: ``"categorical"`` or ``"normal"``.
    :raises ValueError: if a label is not in ``0..C-1`` (on the CPU; on a GPU torch's gather asserts on the device).

    >>> negative_log_likelihood_terms(torch.zeros(3, 2), torch.tensor([0, 1, 1]), "categorical")
    tensor([0.6931, 0.6931, 0.6931])
    """
    _check_likelihood(likelihood)
    _check_outputs(outputs, likelihood)
    if likelihood == "categorical":
        logp = outputs.log_softmax(-1)
        try:
            picked = logp.gather(-1, y.expand(logp.shape[:-1]).unsqueeze(-1))
        except (IndexError, RuntimeError) as err:  # a label outside 0..C-1 (checked by torch's gather on the CPU)
            if "out of bounds" not in str(err):
                raise
            raise ValueError(
                f"y: categorical labels must be class indices in [0, {outputs.shape[-1] - 1}] for a network with "
                f"{outputs.shape[-1]} logit columns ({err})"
            ) from None
        return -picked.squeeze(-1)
    mean, log_var = outputs.unbind(-1)
    return 0.5 * (math.log(2 * math.pi) + log_var + (y - mean).pow(2) * torch.exp(-log_var))
