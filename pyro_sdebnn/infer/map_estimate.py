# SPDX-License-Identifier: Apache-2.0
"""The point estimate: ``AutoDelta`` MAP weights of a Bayesian copy of the network (Gaussian priors on every weight).

.. math::

    \\hat w = \\arg\\max_w\\; \\log p(\\mathcal D | w) + \\log \\mathcal N(w; 0, \\sigma_p^2 I),

which is weight-decay training with :math:`\\lambda = 1/(N\\sigma_p^2)` (MacKay [1]). With an
``AutoDelta`` guide the ELBO is the negative log joint, so SVI is (minibatch) gradient ascent on it.
:meth:`MAPEstimate.laplace_approximation` turns the fit into Pyro's full-Hessian Laplace
approximation (``AutoLaplaceApproximation``), practical for small networks.

**References**

1. D. J. C. MacKay (1992), *A practical Bayesian framework for backpropagation networks*,
   Neural Computation.
"""

from __future__ import annotations

import pyro
import torch
from pyro.infer import Trace_ELBO
from pyro.infer.autoguide import AutoDelta, AutoLaplaceApproximation, init_to_value
from torch import Tensor

from pyro_sdebnn.infer.methods import register_method
from pyro_sdebnn.infer._svi_baseline import SVIBaseline

__all__ = ["MAPEstimate"]


def _check_single_sample(name: str, value: int) -> None:
    if value != 1:
        raise ValueError(f"MAPEstimate is a point estimate: {name} must be 1, got {value!r}")


@register_method("map")
class MAPEstimate(SVIBaseline):
    """Maximum a posteriori network (``AutoDelta`` guide); the predictive has ``S = 1``.

    .. math::

        \\hat w = \\arg\\max_w \\log p(\\mathcal D|w) + \\log \\mathcal N(w; 0, \\sigma_p^2 I),
        \\qquad \\hat p(y|x) = p(y | f_{\\hat w}(x))

    **References**

    1. D. J. C. MacKay (1992), *A practical Bayesian framework for backpropagation networks*,
       Neural Computation.

    :param nn.Module net: the network (copied); its initial weights initialise the guide.
    :param str likelihood: ``"categorical"`` or ``"normal"``.
    :param float prior_scale: :math:`\\sigma_p` of the Gaussian weight prior.

    After ``fit`` Pyro's param store holds the guide's parameters (``"AutoDelta..."``), as after
    :class:`pyro.infer.SVI`: save them with ``pyro.get_param_store().save(path)``, and in a new process build
    ``MAPEstimate(net, likelihood)`` as for the fit, ``pyro.get_param_store().load(path)`` and ``predict``
    (see :class:`~pyro_sdebnn.infer.MeanFieldVI` for the fitted state in the param store).

    >>> from torch import nn
    >>> x, y = torch.randn(20, 2), torch.randint(0, 2, (20,))
    >>> net = nn.Sequential(nn.Linear(2, 8), nn.ReLU(), nn.Linear(8, 2))
    >>> map_fit = MAPEstimate(net, "categorical").fit(x, y, num_epochs=3, batch_size=10)
    >>> map_fit.predict(x[:3]).probs.shape
    torch.Size([1, 3, 2])
    """

    def _make_guide(self):
        return AutoDelta(self.model, init_loc_fn=init_to_value(values=self.model.init_values))

    def _make_elbo(self, num_particles: int):
        # The AutoDelta guide is a point mass: more particles would only average over more minibatches.
        _check_single_sample("num_particles", num_particles)
        return Trace_ELBO(num_particles=1)

    def predict_outputs(self, x: Tensor, num_samples: int = 1) -> Tensor:
        """Outputs of the MAP network, shape ``(1, N, C)``; ``num_samples`` must be 1 (a point mass)."""
        _check_single_sample("num_samples", num_samples)
        return super().predict_outputs(x, num_samples=1)

    @torch.no_grad()
    def map_weights(self) -> dict[str, Tensor]:
        """The MAP weights by sample-site name (``"net.0.weight"``, ...)."""
        with pyro.get_param_store().scope(self._store_state):
            return {name: value.detach().clone() for name, value in self.guide.median().items()}

    def laplace_approximation(self, x: Tensor, y: Tensor):
        """Pyro's full-Hessian Laplace approximation around the MAP, on the full data.

        Builds an :class:`~pyro.infer.autoguide.AutoLaplaceApproximation` at the MAP weights and
        returns its :meth:`laplace_approximation` (an ``AutoMultivariateNormal`` with covariance
        :math:`H^{-1}`, :math:`H = -\\nabla^2 \\log p(\\mathcal D, w)`). Raises a ``ValueError`` if the
        Hessian is not positive definite (then use :class:`~pyro_sdebnn.infer.laplace.Laplace`, whose
        GGN curvature is positive semi-definite by construction).
        """
        weights = self.map_weights()
        with pyro.get_param_store().scope(self._store_state):
            guide = AutoLaplaceApproximation(self.model, init_loc_fn=init_to_value(values=weights))
            guide(x, y)  # initialise the guide's loc at the MAP
            try:
                return guide.laplace_approximation(x, y)
            except (RuntimeError, torch.linalg.LinAlgError) as err:
                raise ValueError(
                    "the Hessian of the negative log joint is not positive definite at these weights "
                    f"({err}); train longer, use a tighter prior, or use Laplace(..., curvature='ggn')"
                ) from None
