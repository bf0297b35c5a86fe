# SPDX-License-Identifier: Apache-2.0
"""Functional SGHMC (fSGHMC): SGHMC with a Gaussian-process prior on the network's outputs (Wu, Xuan & Lu, 2024)."""

from __future__ import annotations

from typing import Any, Callable, Union

from pyro_sdebnn.infer.mcmc.functional_kernel import FunctionalKernelMixin
from pyro_sdebnn.infer.mcmc.schedules import StepSizeSchedule
from pyro_sdebnn.infer.mcmc.sghmc import SGHMC

__all__ = ["FSGHMC"]


class FSGHMC(FunctionalKernelMixin, SGHMC):
    """Functional stochastic-gradient HMC [1]: SGHMC on the functional-prior potential of
    :class:`~pyro_sdebnn.infer.mcmc.FSGLD`.

    .. math::

        v \\leftarrow (1 - \\eta c) v - \\eta \\nabla \\tilde U(w) + \\sqrt{2 \\eta (c - \\hat B) T}\\, \\xi,
        \\qquad w \\leftarrow w + \\eta v

    Momentum resampling every ``resample_momentum_every`` returned samples follows the paper's Alg. 2 (which
    resamples at each outer iteration). Arguments: those of :class:`~pyro_sdebnn.infer.mcmc.FSGLD` (functional
    prior, measurement points, output site) and of :class:`~pyro_sdebnn.infer.mcmc.SGHMC` (friction, noise
    estimate). Loaders (``mcmc.run(loader)``, with ``measurement_points=``) and checkpoints work as for
    :class:`~pyro_sdebnn.infer.mcmc.FSGLD`.

    *A collapsed chain is not a divergence.* With too little friction for the step size the chain can stay finite
    and still be useless: on Two Moons (2-50-50-1 ReLU network, RBF prior, 3000 steps) step 3e-4 with friction 0.1
    ends at a constant function (accuracy 0.5) with kinetic temperature 7.8 instead of :math:`T = 1` (the
    potential energy released from the initial point is dissipated only over :math:`1/(\\eta c) \\approx 33000`
    steps), most hidden ReLUs dead and their weights drifting, unopposed since the weight prior is dropped;
    ``resample_momentum_every=1`` gives 1.01 (accuracy 0.83), friction 10 at step 1e-3 gives 1.02. Nothing in it
    is non-finite, so it is detected by diagnostics, not by the divergence check: ``diagnostics()["kinetic
    temperature"]`` (see :class:`~pyro_sdebnn.infer.mcmc.SGHMC`, remedies there) and function-space diagnostics
    (the predictive at a few probe inputs per draw, its trace and ESS).

    **References**

    [1] Mengjing Wu, Junyu Xuan, Jie Lu (2024). "Functional Stochastic Gradient MCMC for Bayesian Neural
        Networks". arXiv:2409.16632.

    >>> import pyro.contrib.gp as gp
    >>> from pyro.infer import MCMC
    >>> from pyro_sdebnn.infer.mcmc import BayesianMLP
    >>> x = torch.linspace(-1, 1, 20).unsqueeze(-1); y = torch.sin(3 * x[:, 0])
    >>> model = BayesianMLP([1, 10, 1], noise_scale=0.1)
    >>> kernel = FSGHMC(model, gp_prior=gp.kernels.RBF(1), step_size=1e-4, friction=10.0, num_steps=2,
    ...                 subsample_size=10, num_measurement_data=5, num_measurement_box=5)
    >>> mcmc = MCMC(kernel, num_samples=5, warmup_steps=5, disable_progbar=True)
    >>> mcmc.run(x, y)
    >>> mcmc.get_samples()["layers.1.bias"].shape
    torch.Size([5, 1])
    """

    _name = "fSGHMC"

    def __init__(self, model: Callable, *, step_size: Union[float, StepSizeSchedule] = 1e-4, **kwargs: Any) -> None:
        super().__init__(model, step_size=step_size, **kwargs)
