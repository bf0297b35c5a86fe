# SPDX-License-Identifier: Apache-2.0
"""Functional SGLD (fSGLD): SGLD with a Gaussian-process prior on the network's outputs (Wu, Xuan & Lu, 2024)."""

from __future__ import annotations

from typing import Any, Callable, Union

from pyro_sdebnn.infer.mcmc.functional_kernel import FunctionalKernelMixin
from pyro_sdebnn.infer.mcmc.schedules import StepSizeSchedule
from pyro_sdebnn.infer.mcmc.sgld import SGLD

__all__ = ["FSGLD"]


class FSGLD(FunctionalKernelMixin, SGLD):
    """Functional stochastic-gradient Langevin dynamics [1]: SGLD on the functional-prior potential.

    .. math::

        \\tilde U(w) = \\frac{N}{b} \\sum_{i \\in B} -\\log p(y_i | f(x_i; w))
            + \\tfrac12 (f_M - m_M)^\\top (K + \\delta I)^{-1} (f_M - m_M),
        \\qquad w \\leftarrow w - \\frac{\\eta_t}{2} \\nabla \\tilde U(w) + \\sqrt{\\eta_t T}\\, \\xi

    with :math:`f_M = f(X_M; w)` at measurement points :math:`X_M` (training inputs plus uniform box points,
    redrawn every step by default) and a GP prior :math:`\\mathcal{GP}(m, k)`. The weight-space prior of the model
    is dropped (no weight prior, as in [1]); keep the priors of other latent sites with ``prior_sites`` and add a
    weak isotropic weight prior with ``weight_prior_scale`` (a deviation from [1], off by default).

    The prior is on the network outputs, read from a deterministic site (default ``"f"``)::

        with pyro.plate("data", len(x)) as idx:
            f = pyro.deterministic("f", net(x[idx]))
            pyro.sample("obs", dist.Normal(f, sigma), obs=None if y is None else y[idx])

    or, for a model written as for NUTS without that site, from its likelihood: the ``loc`` of a ``Normal``, the
    ``logits`` of a ``Bernoulli`` or ``Categorical`` at its one observed site in the data plate (for ``Categorical``
    normalised to log-probabilities; :func:`~pyro_sdebnn.infer.mcmc.functional.likelihood_outputs`). The kernel evaluates it at :math:`X_M` in the same pass as the minibatch: the model runs once on the
    concatenated inputs :math:`[x_B; X_M]` (one forward/backward pass) when that reproduces the
    two-pass potential at set-up; otherwise it runs ``model(X_M)`` (or ``measurement_args(X_M)``) separately, or
    calls a user function ``output_fn(values, X_M)``.
    All options of :class:`~pyro_sdebnn.infer.mcmc.SGLD` apply.

    *Loaders and checkpoints.* ``mcmc.run(loader)`` takes the likelihood term of each inner step from the loader's
    next ``(x, y)`` batch (scaled by :math:`N/b`, as for SGLD) and the prior term from the measurement points; the
    concatenated pass then runs on :math:`[x_B; X_M]`. A loader does not hold the training inputs, so it needs
    ``measurement_points=`` (a :class:`~pyro_sdebnn.infer.mcmc.MeasurementPoints` over a subset of the inputs on the
    model's device, e.g. ``MeasurementPoints(next(iter(loader))[0])``) or a
    :class:`~pyro_sdebnn.distributions.GPFunctionalPrior` as ``gp_prior``; without either it is a ``ValueError``.
    :meth:`state_dict` holds the measurement-set stream as well (current set, unused prefetched sets, the sampler's
    generator), so :func:`~pyro_sdebnn.infer.mcmc.resume_run` continues a run bitwise on CPU (with a fixed
    ``backend``).

    :param callable model: the Pyro model.
    :param gp_prior: a ``pyro.contrib.gp`` kernel (``RBF``, ``Matern52``, :class:`~pyro_sdebnn.kernels.NNGP`, ...;
        fit it with :func:`pyro_sdebnn.distributions.fit_gp_kernel`), or a
        :class:`~pyro_sdebnn.distributions.GPFunctionalPrior` on fixed measurement points (its cached Cholesky
        factor is reused).
    :param measurement_points: a :class:`~pyro_sdebnn.infer.mcmc.MeasurementPoints` sampler; by default
        ``num_measurement_data`` training inputs (the model's first argument) plus ``num_measurement_box`` box points,
        redrawn every step. Required over a loader (unless ``gp_prior`` is a ``GPFunctionalPrior``).
    :param gp_mean: GP mean: ``None`` (zero), a tensor or a callable of :math:`X_M`.
    :param float jitter: relative jitter :math:`\\delta/\\sigma_f^2` (default 1e-4, raised at set-up if needed).
    :param str output_site: deterministic site with the network outputs, or a likelihood site whose distribution
        gives them; without a site of the default name ``"f"``, the model's one likelihood site in the data plate.
    :param prior_sites: latent sites whose priors are kept (e.g. ``("sigma",)``).
    :param float weight_prior_scale: optional weak weight prior scale.
    :param callable measurement_args: ``X_M -> (args, kwargs)`` of the model.
    :param callable output_fn: alternatively ``output_fn(values, X_M) -> f(X_M)`` from the constrained latent values
        (dict by site name), instead of running the model on :math:`X_M`.
    :param concatenate_inputs: ``None`` (default): evaluate the network once on :math:`[x_B; X_M]` (one trace, one
        forward/backward pass) when that reproduces the two-trace potential and gradient at set-up, else trace the
        model twice per step; ``True`` requires the single pass; ``False`` always traces twice
        (see :class:`~pyro_sdebnn.infer.mcmc.FunctionalPotential`).

    **References**

    [1] Mengjing Wu, Junyu Xuan, Jie Lu (2024). "Functional Stochastic Gradient MCMC for Bayesian Neural
        Networks". arXiv:2409.16632.

    >>> import pyro.contrib.gp as gp
    >>> from pyro.infer import MCMC
    >>> from pyro_sdebnn.infer.mcmc import BayesianMLP
    >>> x = torch.linspace(-1, 1, 20).unsqueeze(-1); y = torch.sin(3 * x[:, 0])
    >>> model = BayesianMLP([1, 10, 1], noise_scale=0.1)
    >>> kernel = FSGLD(model, gp_prior=gp.kernels.RBF(1), step_size=1e-5, num_steps=2, subsample_size=10,
    ...                num_measurement_data=5, num_measurement_box=5)
    >>> mcmc = MCMC(kernel, num_samples=5, warmup_steps=5, disable_progbar=True)
    >>> mcmc.run(x, y)
    >>> mcmc.get_samples()["layers.0.weight"].shape
    torch.Size([5, 10, 1])
    """

    _name = "fSGLD"

    def __init__(self, model: Callable, *, step_size: Union[float, StepSizeSchedule] = 1e-5, **kwargs: Any) -> None:
        super().__init__(model, step_size=step_size, **kwargs)
