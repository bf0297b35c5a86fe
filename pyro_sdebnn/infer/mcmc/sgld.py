# SPDX-License-Identifier: Apache-2.0
"""Stochastic-gradient Langevin dynamics (SGLD) as a Pyro MCMC kernel, with an RMSprop-preconditioned variant."""

from __future__ import annotations

from typing import Any, Callable, Optional, Union, cast

from torch import Tensor

from pyro_sdebnn.infer.mcmc.base import SGMCMCKernel
from pyro_sdebnn.infer.mcmc.schedules import StepSizeSchedule
from pyro_sdebnn.ops.sgmcmc import PreconditionedSGLDState, SGLDState, preconditioned_sgld_step, sgld_step

__all__ = ["SGLD"]


class SGLD(SGMCMCKernel):
    """Stochastic-gradient Langevin dynamics [1] on a minibatched Pyro model, run by :class:`pyro.infer.MCMC`.

    Every call of :meth:`sample` takes ``num_steps`` inner steps (thinning), each on a fresh minibatch of
    ``subsample_size`` data points drawn without replacement within an epoch:

    .. math::

        w \\leftarrow w - \\frac{\\eta_t}{2} \\hat g + \\sqrt{\\eta_t T}\\, \\xi, \\qquad
        \\hat g = -\\frac{N}{b} \\sum_{i \\in B} \\nabla \\log p(y_i | x_i, w) - \\nabla \\log p(w)

    in the unconstrained space of the latent sites (eq. (4) of [1]). By default the warm-up adapts a diagonal mass
    matrix :math:`M` (the posterior variance of every coordinate, estimated in Stan's windows [3], then frozen) and
    the chain samples with :math:`w \\leftarrow w - \\frac{\\epsilon}{2} M^{-1} \\hat g + \\sqrt{\\epsilon T
    M^{-1}}\\, \\xi`, a step :math:`\\epsilon` in standardised units (:mod:`~pyro_sdebnn.infer.mcmc.adaptation`;
    a constant :math:`M` keeps the target stationary [4]). With ``preconditioned=True`` the step is instead scaled
    per coordinate by a running RMSprop estimate :math:`G = 1/(\\epsilon + \\sqrt V)` (pSGLD [2]).
    At the end of ``MCMC.run`` a :class:`~pyro_sdebnn.infer.mcmc.SamplerWarning` names each problem found
    (split R-hat above 1.1, a chain stuck at a support boundary, divergences; :mod:`~pyro_sdebnn.infer.mcmc.run_checks`).

    The model is a plain Pyro model over the *full* data, as written for NUTS: the likelihood sits in a plate over
    the data (``with pyro.plate("data", len(x)): ... obs=y``) and the weights are sampled outside that plate, so that
    ``MCMC.run(x, y)``, :class:`~pyro.infer.Predictive` and :func:`~pyro_sdebnn.infer.mcmc.from_pyro` all see the
    full data. The data come in one of two ways:

    - *tensors*, ``mcmc.run(x, y)`` with ``subsample_size=b``: each inner step slices every argument whose leading
      dimension is the plate's size :math:`N` by the minibatch indices and scales the data plate by :math:`N/b` (a
      model that indexes the data with the plate's indices, ``with pyro.plate("data", len(x)) as idx: ...
      obs=y[idx]``, gets the indices as the plate's subsample instead);
    - *a loader*, ``mcmc.run(loader)`` (e.g. a :class:`~torch.utils.data.DataLoader` of ``(x, y)`` batches; keep
      ``subsample_size=None``): each inner step calls ``model(x_b, y_b)`` on the next batch, moved to the model's
      device one batch at a time, with the data plate scaled by :math:`N/b`, :math:`N` = ``len(loader.dataset)``;
      the loader is iterated afresh at each epoch (shuffling and augmentation apply).

    The kernel state can be saved and a run resumed: :func:`~pyro_sdebnn.infer.mcmc.save_run`,
    :func:`~pyro_sdebnn.infer.mcmc.resume_run` (built on :meth:`state_dict` / :meth:`load_state_dict`).

    :param callable model: the Pyro model.
    :param step_size: :math:`\\eta` (float) or a :class:`~pyro_sdebnn.infer.mcmc.schedules.StepSizeSchedule`
        over inner steps (e.g. :class:`~pyro_sdebnn.infer.mcmc.schedules.PolynomialDecay`); with the mass-matrix
        adaptation, the step of the unit-mass phase before the first estimate (the first 15 % of the warm-up).
    :param bool adapt_mass_matrix: ``None`` (default): adapt a diagonal mass matrix in warm-up when the step size is
        a constant and ``preconditioned`` is off; warm-ups of fewer than 1000 inner steps keep the unit mass.
        ``False``: unit mass and ``step_size`` throughout. ``kernel.inverse_mass_matrix`` holds the estimate.
    :param float adapted_step_size: the step :math:`\\epsilon` in standardised units once :math:`M` is adapted
        (default 0.1), capped at :math:`1/\\lambda` for the largest eigenvalue :math:`\\lambda` of the
        preconditioned Hessian averaged over minibatches (a quarter of the stability limit :math:`4/\\lambda`: the
        stationary variance of the discretised chain along a direction of curvature :math:`h` is
        :math:`1/(h(1 - \\epsilon h/4))`, at most 4/3 of the target's there); ``diagnostics()["step size"]`` gives
        the one used.
    :param int num_steps: inner gradient steps per returned sample (thinning), default 1.
    :param int subsample_size: minibatch size :math:`b` with tensors; ``None`` for full-batch gradients, and with a
        loader (whose batch size is :math:`b`).
    :param str data_plate: name of the plate over the data (default: the plate containing all observed sites).
    :param float temperature: :math:`T`; samples :math:`\\propto \\exp(-U/T)` (cold posterior for ``T < 1``).
    :param bool preconditioned: use the RMSprop preconditioner of [2].
    :param float precond_decay: :math:`\\alpha` of the running average of :math:`\\hat g^2`.
    :param float precond_eps: :math:`\\epsilon` of the preconditioner.
    :param callable init_strategy: Pyro init strategy for the initial values. Default
        :func:`~pyro_sdebnn.infer.mcmc.init_to_robust`: real-valued sites (weights) start at a prior draw,
        constrained ones (scales such as ``Gamma(0.5, 1)`` or ``Uniform(0, 10)``, whose prior draws can lie close to 0
        where the first step diverges) at their prior median.
    :param int map_steps: ``None`` (default): an automatic warm start of Adam steps on the minibatch potential, at
        most one epoch (no epoch bound for passes shorter than 50 steps, e.g. full-batch gradients), 10 % of the
        run's inner steps and 500,
        stopped once the mean potential over 50 steps improves by less than :math:`0.01 (D + 1)`
        (``kernel.map_steps_taken`` and ``diagnostics()["warm start steps"]`` say how many ran; the progress bar
        shows it), run only when the kernel draws the initial values itself
        (``MCMC(..., initial_params=...)`` is left where it is); a positive int: that many Adam steps, always;
        ``0``: no warm start (the chain starts at the initial values).
    :param float map_lr: learning rate of the warm start (default ``0.1``).
    :param int vectorized_chains: run ``K`` chains at once in this process (a leading chain dimension).
    :param str on_divergence: ``"raise"`` (default) stops with a :class:`~pyro_sdebnn.infer.mcmc.SamplerDivergenceError`
        naming the step when the potential or gradient is not finite, a state coordinate is non-finite or its square
        overflows the dtype, or an op of the step raises on such a state (e.g. a distribution's argument validation,
        chained as ``__cause__``), or the chain leaves the typical set (below); ``"continue"`` records the divergence
        (``diagnostics()["divergence log"]``: sample, chain, inner step, step size, measured cause) and restarts that
        chain only, from its last healthy state with zero momentum / RMSprop average. Checked once per returned
        sample, per chain, on values the step already computed (one host synchronisation per sample).
    :param bool adapt_step_size: in warm-up, halve the step size (at most 30 times) whenever a chain diverges and
        restart it from its last healthy state, instead of raising; the step size found is kept for sampling
        (``diagnostics()["step size"]``). Default ``False``.
    :param str backend: ``"auto"``, ``"eager"`` (per-step Pyro trace; any model), ``"fx"`` (step traced once into
        an FX graph) or ``"compile"`` (that graph compiled with ``torch.compile``).
    :param sample_writer: optional :class:`~pyro_sdebnn.infer.mcmc.streaming.SampleWriter` streaming the
        post-warm-up samples to disk (combine with ``MCMC(..., save_params=[])`` to keep nothing in memory).
    :param dict transforms: optional ``{site: transform}`` from constrained to unconstrained space (as for
        ``HMC``); the kernel samples in that space and exposes it as ``kernel.transforms`` for ``MCMC``.

    :param int compile_after: with ``backend="auto"``, inner steps with the eager graph after which the step graph is
        compiled (default 10000; a number of steps, not seconds, so that the same seed gives the same chain).

    ``backend="compile"`` sets ``torch._inductor.config.fallback_random = True`` (on CPU the compiler's own
    random-number generation is very slow). ``backend="auto"`` (default) runs the traced graph eagerly (built in
    well under a second) and compiles it once the chain has taken ``compile_after`` inner steps with it (short runs
    never pay the compilation, which takes a few seconds to a minute; long runs get the compiled step). The switch
    depends on the step count only, never on measured time, so the same seed gives the same chain.
    ``kernel.backend_used`` and ``diagnostics()["backend"]`` say which step ran last. Models that cannot be traced
    fall back to ``"eager"`` with a ``RuntimeWarning``.

    *Leaving the typical set.* A step size above the stability limit (:math:`\\eta > 4/\\lambda_{\\max}` for SGLD on
    a potential with largest Hessian eigenvalue :math:`\\lambda_{\\max}`) makes the chain grow geometrically, long
    before it overflows. The kernel therefore watches the energy :math:`E` of each chain (the potential of the last inner
    step; :math:`U + \\|v\\|^2/2` for SGHMC) and flags a chain when

    .. math::

        E > m + 20\\, s + T (D + 10) + 10^{-3} (|m| + 1),

    with :math:`m` the smaller of the medians of its last 32 and of all its healthy energies (kept decimated to 128)
    and :math:`s` the smaller of their median absolute deviations times 1.4826; before 8 samples, when
    :math:`E > m + 100 (|m| + T (D + 10) + 1)` with :math:`m` the lowest energy so far. :math:`T (D + 10)` is twice
    the mean excess :math:`T D / 2` of the energy over its minimum in a Gaussian posterior of dimension :math:`D`, so
    a chain in the typical set does not trip it; the test suite's healthy runs (all temperatures, minibatch sizes and
    functional priors) never do. The energy of a sample is the potential at the start of its last inner step, which
    certifies the state the *previous* sample returned: a restart goes back to the last certified state.

    **References**

    [1] Max Welling, Yee Whye Teh (2011). "Bayesian Learning via Stochastic Gradient Langevin Dynamics". ICML 2011.

    [2] Chunyuan Li, Changyou Chen, David Carlson, Lawrence Carin (2016). "Preconditioned Stochastic Gradient
        Langevin Dynamics for Deep Neural Networks". AAAI 2016.

    [3] Bob Carpenter, Andrew Gelman, Matthew D. Hoffman, Daniel Lee, Ben Goodrich, Michael Betancourt, Marcus
        Brubaker, Jiqiang Guo, Peter Li, Allen Riddell (2017). "Stan: A Probabilistic Programming Language".
        Journal of Statistical Software 76(1).

    [4] Yi-An Ma, Tianqi Chen, Emily B. Fox (2015). "A Complete Recipe for Stochastic Gradient MCMC". NeurIPS 2015.

    >>> import pyro.distributions as dist
    >>> from pyro.infer import MCMC
    >>> def model(x, y=None):
    ...     w = pyro.sample("w", dist.Normal(0.0, 1.0))
    ...     with pyro.plate("data", len(x)) as idx:
    ...         pyro.sample("y", dist.Normal(w * x[idx], 1.0), obs=None if y is None else y[idx])
    >>> x = torch.linspace(-1, 1, 20); y = 2 * x
    >>> kernel = SGLD(model, step_size=1e-2, num_steps=5, subsample_size=10)
    >>> mcmc = MCMC(kernel, num_samples=20, warmup_steps=10, disable_progbar=True)
    >>> mcmc.run(x, y)
    >>> mcmc.get_samples()["w"].shape
    torch.Size([20])

    The same model written without plate indices, over a loader:

    >>> from torch.utils.data import DataLoader, TensorDataset
    >>> def plain(x, y=None):
    ...     w = pyro.sample("w", dist.Normal(0.0, 1.0))
    ...     with pyro.plate("data", len(x)):
    ...         pyro.sample("y", dist.Normal(w * x, 1.0), obs=y)
    >>> loader = DataLoader(TensorDataset(x, y), batch_size=10, shuffle=True)
    >>> mcmc = MCMC(SGLD(plain, step_size=1e-2, num_steps=5), num_samples=20, warmup_steps=10, disable_progbar=True)
    >>> mcmc.run(loader)
    >>> mcmc.get_samples()["w"].shape
    torch.Size([20])
    """

    _name = "SGLD"

    def __init__(
        self,
        model: Callable,
        *,
        step_size: Union[float, StepSizeSchedule] = 1e-3,
        num_steps: int = 1,
        subsample_size: int | None = None,
        preconditioned: bool = False,
        precond_decay: float = 0.99,
        precond_eps: float = 1e-5,
        **kwargs: Any,
    ) -> None:
        if not 0.0 <= precond_decay < 1.0:
            raise ValueError(f"precond_decay must be in [0, 1), got {precond_decay!r}")
        if not precond_eps > 0:
            raise ValueError(f"precond_eps must be positive, got {precond_eps!r}")
        self.preconditioned = bool(preconditioned)
        self.precond_decay = float(precond_decay)
        self.precond_eps = float(precond_eps)
        self._state_type = PreconditionedSGLDState if self.preconditioned else SGLDState
        if self.preconditioned:  # RMSprop's running estimate and a warm-up-adapted mass matrix: one or the other
            if kwargs.get("adapt_mass_matrix"):
                raise ValueError("adapt_mass_matrix=True and preconditioned=True exclude each other: pick one")
            kwargs["adapt_mass_matrix"] = False
        super().__init__(model, step_size=step_size, num_steps=num_steps, subsample_size=subsample_size, **kwargs)

    def _init_state(self, position: Tensor) -> tuple:
        if self.preconditioned:
            return (position, position.new_zeros(position.shape))
        return (position,)

    def _update(
        self, noise: Tensor, state: tuple, grad: Tensor, step_size: Tensor, precond: Optional[Tensor] = None
    ) -> tuple:
        # the step hands the state as a _state_type, the NamedTuple set in __init__
        if self.preconditioned:
            return preconditioned_sgld_step(
                noise, cast(PreconditionedSGLDState, state), grad, step_size, self.temperature,
                alpha=self.precond_decay, eps=self.precond_eps,
            )
        return sgld_step(noise, cast(SGLDState, state), grad, step_size, self.temperature,
                         None if self._unit_mass else precond)
