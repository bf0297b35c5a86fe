# SPDX-License-Identifier: Apache-2.0
"""MC-dropout: dropout kept on at prediction time, ``T`` stochastic forward passes (Gal & Ghahramani [1]).

Training with dropout and weight decay :math:`\\lambda` maximises the ELBO of a Bernoulli variational
family (Gal & Ghahramani [1]); its predictive is the average over ``T`` fresh dropout masks

.. math::

    \\hat p(y|x,\\mathcal D) \\approx \\frac1T \\sum_{t=1}^T p(y | x, \\hat M \\operatorname{diag}(b_t)),
    \\qquad b_{t} \\sim \\mathrm{Bernoulli}(\\rho).

**References**

1. Y. Gal, Z. Ghahramani (2016), *Dropout as a Bayesian approximation: representing model
   uncertainty in deep learning*, ICML.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from pyro_sdebnn.infer.methods import (
    BaselineMethod,
    _check_data,
    _dropout_layers,
    register_method,
    train_network,
)

__all__ = ["MCDropout"]


@register_method("mc-dropout")
class MCDropout(BaselineMethod):
    """MC-dropout around a network that contains dropout layers.

    .. math::

        \\hat p(y|x) = \\frac1T \\sum_{t=1}^T p(y | f_{\\hat M \\operatorname{diag}(b_t)}(x)),
        \\qquad b_t \\sim \\mathrm{Bernoulli}(\\rho)

    **References**

    1. Y. Gal, Z. Ghahramani (2016), *Dropout as a Bayesian approximation*, ICML.

    :param nn.Module net: the network; must contain at least one ``nn.Dropout*`` module with ``p > 0``
        (e.g. ``make_mlp(sizes, dropout=0.1)``).
    :param str likelihood: ``"categorical"`` (``C`` logits) or ``"gaussian"`` (mean, log-variance).
    :param int num_samples: ``T``, the number of stochastic forward passes at prediction.

    >>> from pyro_sdebnn.nn import make_mlp
    >>> x, y = torch.randn(32, 2), torch.randint(0, 2, (32,))
    >>> method = MCDropout(make_mlp([2, 16, 2], dropout=0.2), "categorical", num_samples=8)
    >>> method.fit(x, y, num_epochs=2).predict(x[:5]).probs.shape
    torch.Size([8, 5, 2])
    """

    def __init__(self, net: nn.Module, likelihood: str = "categorical", *, num_samples: int = 50) -> None:
        super().__init__(likelihood)
        if not isinstance(net, nn.Module):
            raise TypeError(f"net must be a torch.nn.Module, got {type(net).__name__}")
        self.dropout_layers = [m for m in _dropout_layers(net) if m.p > 0]
        if not self.dropout_layers:
            raise ValueError("net has no dropout layer with p > 0; build it with e.g. make_mlp(sizes, dropout=0.1)")
        if not isinstance(num_samples, int) or num_samples < 1:
            raise ValueError(f"num_samples must be a positive integer, got {num_samples!r}")
        self.net = net
        self.num_samples = num_samples

    def fit(
        self,
        x: Tensor,
        y: Tensor,
        *,
        num_epochs: int = 200,
        lr: float = 1e-2,
        batch_size: int | None = 32,
        weight_decay: float = 1e-4,
        progress: bool = False,
        scheduler=None,
        scheduler_step: str = "epoch",
        clip_norm: float | None = None,
        clip_inf_norm: float | None = None,
    ) -> "MCDropout":
        """Train with dropout active (Adam, mean NLL, weight decay); returns ``self``.

        ``scheduler``, ``scheduler_step``, ``clip_norm`` and ``clip_inf_norm`` are those of
        :func:`~pyro_sdebnn.infer.methods.train_network`: a callable ``optimizer -> lr_scheduler``
        stepped per epoch or per step, and clipping of the whole gradient,
        :math:`g \\leftarrow g \\min(1, c/\\|g\\|_2)` and :math:`g \\leftarrow g \\min(1, c/\\|g\\|_\\infty)`.
        """
        train_network(
            self.net,
            x,
            y,
            self.likelihood,
            num_epochs=num_epochs,
            lr=lr,
            batch_size=batch_size,
            weight_decay=weight_decay,
            progress=progress,
            desc="mc-dropout",
            scheduler=scheduler,
            scheduler_step=scheduler_step,
            clip_norm=clip_norm,
            clip_inf_norm=clip_inf_norm,
        )
        return self

    @torch.no_grad()
    def predict_outputs(self, x: Tensor, num_samples: int | None = None) -> Tensor:
        """Raw outputs under ``T`` dropout masks, shape ``(T, N, C)``; other layers in eval mode."""
        _check_data(x, None, self.likelihood)
        num_samples = self.num_samples if num_samples is None else num_samples
        was_training = self.net.training
        self.net.eval()
        for layer in self.dropout_layers:
            layer.train()
        try:
            return torch.stack([self.net(x) for _ in range(num_samples)])
        finally:
            self.net.train(was_training)
