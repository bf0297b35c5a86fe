# SPDX-License-Identifier: Apache-2.0
"""The ``sampling_free`` effect handler: run a :class:`~pyro_sdebnn.infer.SamplingFreeBNN` model by moment propagation.

Under ``sampling_free``, :meth:`~pyro_sdebnn.infer.SamplingFreeBNN.model` propagates means
and variances instead of running the network on sampled weights, and continuous latent sample sites
that have no value yet take their distribution's mean instead of a random draw (the sampling-free ELBO
only needs the variational *distributions*, for the closed-form KL). Observed sites, discrete sites and
sites whose distribution has no ``mean`` are sampled as usual.
:class:`~pyro_sdebnn.infer.SamplingFree_ELBO` installs this handler around the model and guide.
"""

from __future__ import annotations

from pyro.poutine.messenger import Messenger
from pyro.poutine.runtime import _PYRO_STACK
from pyro.poutine.util import site_is_subsample

__all__: list[str] = []


class SamplingFreeMessenger(Messenger):
    """Effect handler marking a sampling-free (moment-propagation) execution.

    >>> import pyro.distributions as dist
    >>> with sampling_free():
    ...     print(is_sampling_free(), pyro.sample("w", dist.Normal(3.0, 1.0)))
    True tensor(3.)
    """

    def _pyro_sample(self, msg) -> None:
        if msg["is_observed"] or msg["value"] is not None or site_is_subsample(msg):
            return  # a plate's subsample site (no subsample given) draws its indices as usual
        try:
            if msg["fn"].support.is_discrete:
                return  # a discrete site is sampled: its mean is no value of it (torch's Categorical.mean is NaN)
            msg["value"] = msg["fn"].mean.expand(msg["fn"].shape())
        except NotImplementedError:
            pass  # no support or no closed-form mean: the site is sampled as usual


def sampling_free(fn=None):
    """Wrap ``fn`` (or open a context) in which ``is_sampling_free`` is ``True``.

    :param callable fn: a model or guide; ``None`` returns a context manager.

    >>> sampling_free(lambda: is_sampling_free())()
    True
    """
    messenger = SamplingFreeMessenger()
    return messenger(fn) if fn is not None else messenger


def is_sampling_free() -> bool:
    """Whether the caller runs under ``sampling_free``."""
    return any(isinstance(frame, SamplingFreeMessenger) for frame in _PYRO_STACK)
