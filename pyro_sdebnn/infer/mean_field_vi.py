# SPDX-License-Identifier: Apache-2.0
"""Mean-field Gaussian VI (Bayes by backprop) on a Bayesian copy of the network (Gaussian priors on every weight).

Guide :math:`q(w) = \\prod_j \\mathcal N(w_j; m_j, s_j^2)` (Pyro's ``AutoNormal``), trained on

.. math::

    \\mathcal L(q) = \\mathbb E_q[\\log p(\\mathcal D|w)] - \\mathrm{KL}(q \\,\\|\\, p)

with the KL in closed form (``TraceMeanField_ELBO``) and the likelihood estimated on subsampled
minibatches. The guide's means start at the network's own initial weights and its scales at
``init_scale``.

**References**

1. C. Blundell, J. Cornebise, K. Kavukcuoglu, D. Wierstra (2015), *Weight uncertainty in neural
   networks*, ICML.
"""

from __future__ import annotations

from pyro.infer import TraceMeanField_ELBO
from pyro.infer.autoguide import AutoNormal, init_to_value
from torch import nn

from pyro_sdebnn.infer.methods import register_method
from pyro_sdebnn.infer._svi_baseline import SVIBaseline

__all__ = ["MeanFieldVI"]


@register_method("mfvi")
class MeanFieldVI(SVIBaseline):
    """Mean-field Gaussian variational inference (``AutoNormal`` + ``TraceMeanField_ELBO``).

    .. math::

        q(w) = \\prod_j \\mathcal N(w_j; m_j, s_j^2), \\qquad
        \\max_q \\; \\mathbb E_q[\\log p(\\mathcal D|w)] - \\mathrm{KL}(q \\,\\|\\, \\mathcal N(0, \\sigma_p^2 I))

    **References**

    1. C. Blundell, J. Cornebise, K. Kavukcuoglu, D. Wierstra (2015), *Weight uncertainty in neural
       networks*, ICML.

    :param nn.Module net: the network (copied); its initial weights initialise the guide means.
    :param str likelihood: ``"categorical"`` or ``"normal"``.
    :param float prior_scale: :math:`\\sigma_p` of the Gaussian weight prior.
    :param float init_scale: initial standard deviation of every guide factor.

    After ``fit`` Pyro's param store holds the guide's parameters (``"AutoNormal..."``), as after
    :class:`pyro.infer.SVI`: save them with ``pyro.get_param_store().save(path)``, and in a new process build
    ``MeanFieldVI(net, likelihood)`` as for the fit, ``pyro.get_param_store().load(path)`` and ``predict``
    (see :class:`~pyro_sdebnn.infer.MAPEstimate`).

    >>> from torch import nn
    >>> x, y = torch.randn(20, 2), torch.randint(0, 2, (20,))
    >>> net = nn.Sequential(nn.Linear(2, 8), nn.ReLU(), nn.Linear(8, 2))
    >>> vi = MeanFieldVI(net, "categorical").fit(x, y, num_epochs=3, batch_size=10)
    >>> vi.predict(x[:3], num_samples=7).probs.shape
    torch.Size([7, 3, 2])
    """

    def __init__(
        self,
        net: nn.Module,
        likelihood: str = "categorical",
        *,
        prior_scale: float = 1.0,
        init_scale: float = 1e-2,
    ) -> None:
        if not init_scale > 0:
            raise ValueError(f"init_scale must be positive, got {init_scale!r}")
        self.init_scale = float(init_scale)
        super().__init__(net, likelihood, prior_scale=prior_scale)

    def _make_guide(self):
        return AutoNormal(
            self.model, init_loc_fn=init_to_value(values=self.model.init_values), init_scale=self.init_scale
        )

    def _make_elbo(self, num_particles: int):
        return TraceMeanField_ELBO(num_particles=num_particles)
