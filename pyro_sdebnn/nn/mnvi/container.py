# SPDX-License-Identifier: Apache-2.0
r"""Containers for building moment-propagating networks (LeNet, All-CNN, ResNet-style).

:class:`MNSequential` chains layers; :class:`MNResidualBlock` adds a main branch and a shortcut;
:class:`MNConcat` runs branches side by side on the same input (e.g. separate mean and log-variance heads).
All pass plain tensors (the deterministic / sampled-weight network) or
:class:`~pyro_sdebnn.ops.Moments` (sampling-free propagation) through unchanged in kind.

.. warning:: In a residual block the two branches see the same input, so their outputs are
    correlated; like every layer here the sum adds variances as if they were independent
    (Assumption 3 of [1]), :math:`v' = v_\text{main} + v_\text{shortcut}`.

**References**

1. Jannik Schmitt, Stefan Roth (2021). "Sampling-free Variational Inference for Neural Networks with
   Multiplicative Activation Noise". DAGM German Conference on Pattern Recognition (GCPR) 2021.
   arXiv:2103.08497.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from pyro_sdebnn.nn.mnvi._moment_inputs import as_moments, checked, is_own, vouching
from pyro_sdebnn.ops.moments import Moments

__all__ = ["MNConcat", "MNResidualBlock", "MNSequential"]


#: torch modules that pass ``Moments`` through (containers run their children; ``Identity`` returns its input).
_PASS_THROUGH = (nn.Identity, nn.Sequential, nn.ModuleList, nn.ModuleDict)


_TORCH_LAYERS: dict[type, bool] = {}


def _is_torch_layer(cls: type) -> bool:
    """Whether every class of ``cls`` comes from torch and it does not pass ``Moments`` through: not a subclass of one
    of ours or of the user's (a parametrised ``MNLinear`` is a torch-made subclass of ``MNLinear``). Cached per type:
    containers ask at every forward."""
    known = _TORCH_LAYERS.get(cls)
    if known is None:
        plain = all(c is object or c.__module__.startswith("torch.") for c in cls.__mro__)
        known = _TORCH_LAYERS[cls] = plain and not issubclass(cls, _PASS_THROUGH)
    return known


def _check_takes_moments(module: nn.Module, where: str) -> None:
    """Raise ``TypeError`` if ``module`` is a plain ``torch.nn`` layer, which cannot take :class:`Moments` (torch's
    own error, e.g. "relu(): argument 'input' must be Tensor, not Moments", names neither the layer nor the fix)."""
    if _is_torch_layer(type(module)):
        name = type(module).__name__
        raise TypeError(
            f"{where} is torch.nn.{name}, which cannot propagate Moments: use its moment version "
            f"(e.g. MNReLU for ReLU, MNLinear for Linear) or convert the plain network with to_mnvi(...)"
        )


class MNSequential(nn.Sequential):
    """:class:`torch.nn.Sequential` for layers that accept tensors or :class:`Moments`.

    Feed ``Moments(x, None)`` for the sampling-free pass and ``x`` for the deterministic pass.

    >>> from pyro_sdebnn.nn.mnvi import MNLinear, MNReLU
    >>> net = MNSequential(MNLinear(4, 8), MNReLU(), MNLinear(8, 2))
    >>> out = net(Moments(torch.randn(3, 4), None))
    >>> out.mean.shape, bool((out.var > 0).all())
    (torch.Size([3, 2]), True)
    """

    def forward(self, input: Tensor | Moments) -> Tensor | Moments:
        as_moments(input)
        vouch = vouching()
        passed = input if vouch else None  # the input just checked, then the outputs of this package's modules
        for index, module in enumerate(self):
            if vouch and isinstance(input, Moments):  # under Pyro validation, as the other checks of values
                _check_takes_moments(module, f"MNSequential: module {index}")
            with checked(passed):
                input = module(input)
            passed = input if vouch and is_own(module) else None
        return input


def _add(a: Tensor | Moments, b: Tensor | Moments) -> Tensor | Moments:
    if not (isinstance(a, Moments) and isinstance(b, Moments)):
        if isinstance(a, Moments) or isinstance(b, Moments):
            raise TypeError("MNResidualBlock: both branches must return the same kind (tensor or Moments)")
        return a + b
    if a.mean.shape != b.mean.shape:
        raise ValueError(f"MNResidualBlock: branch shapes differ, {tuple(a.mean.shape)} vs {tuple(b.mean.shape)}")
    if a.var is None and b.var is None:
        var = None
    elif a.var is None or b.var is None:
        var = a.var if b.var is None else b.var
    else:
        var = a.var + b.var
    return Moments(a.mean + b.mean, var)


class MNResidualBlock(nn.Module):
    r"""Residual block :math:`y = f(\mathrm{main}(x) + \mathrm{shortcut}(x))`.

    :param nn.Module main: the residual branch (e.g. conv-bn-relu-conv-bn).
    :param shortcut: the skip branch (e.g. a strided 1x1 conv and batch norm); ``None`` is the identity.
    :param activation: applied after the sum (e.g. :class:`~pyro_sdebnn.nn.mnvi.MNReLU`), or ``None``.

    >>> from pyro_sdebnn.nn.mnvi import MNConv2d, MNReLU
    >>> block = MNResidualBlock(MNSequential(MNConv2d(2, 2, 3, padding=1), MNReLU(), MNConv2d(2, 2, 3, padding=1)),
    ...                         activation=MNReLU())
    >>> block(Moments(torch.randn(1, 2, 5, 5), None)).var.shape
    torch.Size([1, 2, 5, 5])
    """

    def __init__(self, main: nn.Module, shortcut: nn.Module | None = None, activation: nn.Module | None = None) -> None:
        super().__init__()
        for name, value in (("main", main), ("shortcut", shortcut), ("activation", activation)):
            if value is not None and not isinstance(value, nn.Module):
                raise TypeError(f"{name} must be an nn.Module or None, got {type(value).__name__}")
        if main is None:
            raise TypeError("main must be an nn.Module, got None")
        self.main = main
        self.shortcut = shortcut
        self.activation = activation

    def forward(self, input: Tensor | Moments) -> Tensor | Moments:
        """The block on a tensor or on :class:`Moments` (the sum adds means and, as independent terms, variances)."""
        as_moments(input)
        vouch = vouching()
        with checked(input if vouch else None):
            skip = input if self.shortcut is None else self.shortcut(input)
            out = _add(self.main(input), skip)
        if self.activation is None:
            return out
        if vouch and isinstance(out, Moments):
            _check_takes_moments(self.activation, "MNResidualBlock: the activation")
        own = vouch and is_own(self.main) and (self.shortcut is None or is_own(self.shortcut))
        with checked(out if own else None):
            return self.activation(out)


class MNConcat(nn.Module):
    r"""Branches applied to the same input, outputs concatenated along the feature dimension ``dim``.

    .. math::

        \mathbb E[y] = [\mathbb E[f_1(x)], \dots, \mathbb E[f_K(x)]],\qquad
        \mathbb V[y] = [\mathbb V[f_1(x)], \dots, \mathbb V[f_K(x)]].

    With one :class:`~pyro_sdebnn.nn.mnvi.MNLinear` per output (``MNConcat(MNLinear(50, 1), MNLinear(50, 1))``)
    every head has its own noise variances :math:`\alpha`, as the regression networks of Schmitt & Roth (2021)
    have for the mean and the log-variance. A branch whose output has no variance contributes zeros.

    :param nn.Module branches: one or more modules that accept tensors or :class:`Moments`.
    :param int dim: the dimension to concatenate along (default ``-1``, the features of a dense layer).

    >>> from pyro_sdebnn.nn.mnvi import MNLinear
    >>> heads = MNConcat(MNLinear(4, 1), MNLinear(4, 1))
    >>> out = heads(Moments(torch.randn(3, 4), None))
    >>> out.mean.shape, out.var.shape, heads(torch.randn(3, 4)).shape
    (torch.Size([3, 2]), torch.Size([3, 2]), torch.Size([3, 2]))
    """

    def __init__(self, *branches: nn.Module, dim: int = -1) -> None:
        super().__init__()
        if not branches:
            raise ValueError("MNConcat needs at least one branch")
        for i, branch in enumerate(branches):
            if not isinstance(branch, nn.Module):
                raise TypeError(f"branch {i} must be an nn.Module, got {type(branch).__name__}")
        if isinstance(dim, bool) or not isinstance(dim, int):
            raise TypeError(f"dim must be an int, got {type(dim).__name__}")
        self.branches = nn.ModuleList(branches)
        self.dim = dim

    def forward(self, input: Tensor | Moments) -> Tensor | Moments:
        """The outputs of the branches concatenated along ``dim``: tensors, or :class:`Moments` when the branches
        return them."""
        as_moments(input)
        with checked(input if vouching() else None):
            outs = [branch(input) for branch in self.branches]
        kinds = {isinstance(out, Moments) for out in outs}
        if len(kinds) > 1:
            raise TypeError("MNConcat: every branch must return the same kind (tensor or Moments)")
        if not isinstance(outs[0], Moments):
            return torch.cat(outs, dim=self.dim)
        mean = torch.cat([out.mean for out in outs], dim=self.dim)
        if all(out.var is None for out in outs):
            return Moments(mean, None)
        var = torch.cat([torch.zeros_like(out.mean) if out.var is None else out.var for out in outs], dim=self.dim)
        return Moments(mean, var)
