# SPDX-License-Identifier: Apache-2.0
"""Convert a plain ``torch.nn`` network into its moment-propagating twin.

:func:`to_mnvi` (MNVI layers) and :func:`to_mean_field` (sampling-free MFVI layers) walk the module
tree and replace each supported module by its counterpart, copying the trained weights as the
posterior means (and batch-norm statistics as they are), so a pretrained deterministic network is
a natural initialisation. Supported: ``Linear``, ``Conv2d`` (zero padding), ``ReLU``, element-wise
activations (``Tanh``, ``Sigmoid``, ``GELU``, ``SiLU``, ``ELU``, ``LeakyReLU``, ``Softplus``; by Taylor
moments), ``BatchNorm1d/2d``, ``MaxPool2d``, ``AvgPool2d``, ``AdaptiveAvgPool2d(1)``, ``Flatten``,
``Dropout``/``Dropout1d/2d/3d`` (become no-ops), ``Identity``, ``Sequential``, torchvision's ``BasicBlock`` and
``ResNet`` (as a sequential network). Modules whose ``forward`` is arbitrary Python cannot be
converted automatically: register a converter for them with :func:`register_converter`.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import cast

from torch import nn

from pyro_sdebnn.nn.mnvi.activations import MNActivation, MNReLU
from pyro_sdebnn.nn.mnvi.container import MNResidualBlock, MNSequential
from pyro_sdebnn.nn.mnvi.layers import RHO_INIT, MNConv2d, MNLinear
from pyro_sdebnn.nn.mnvi.mean_field import MF_RHO_INIT, MFConv2d, MFLinear
from pyro_sdebnn.nn.mnvi.normalization import MNBatchNorm1d, MNBatchNorm2d
from pyro_sdebnn.nn.mnvi.pooling import MNAdaptiveAvgPool2d, MNAvgPool2d, MNDropout, MNFlatten, MNIdentity, MNMaxPool2d

__all__ = ["register_converter", "to_mean_field", "to_mnvi"]

#: ``Converter(module, convert, kind, rho_init) -> module``; ``convert`` converts children.
Converter = Callable[[nn.Module, Callable[[nn.Module], nn.Module], str, float], nn.Module]
_CONVERTERS: dict[type, Converter] = {}
_ELEMENTWISE = (nn.Tanh, nn.Sigmoid, nn.GELU, nn.SiLU, nn.ELU, nn.LeakyReLU, nn.Softplus)
_MOMENT_MODULES = (
    MNLinear, MNConv2d, MFLinear, MFConv2d, MNReLU, MNActivation, MNBatchNorm1d, MNBatchNorm2d, MNMaxPool2d,
    MNAvgPool2d, MNAdaptiveAvgPool2d, MNFlatten, MNIdentity, MNSequential, MNResidualBlock,
)


def register_converter(module_type: type) -> Callable[[Converter], Converter]:
    """Register ``fn(module, convert, kind, rho_init)`` as the converter of ``module_type``.

    ``kind`` is ``"mn"`` or ``"mf"``; call ``convert(child)`` to convert sub-modules.

    >>> class Block(nn.Module):
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.fc = nn.Linear(2, 2)
    ...     def forward(self, x):
    ...         return x + self.fc(x)
    >>> @register_converter(Block)
    ... def _(module, convert, kind, rho_init):
    ...     return MNResidualBlock(convert(module.fc))
    >>> to_mnvi(nn.Sequential(Block()))[0].main
    MNLinear(in_features=2, out_features=2, bias=True)
    """
    if not isinstance(module_type, type) or not issubclass(module_type, nn.Module):
        raise TypeError(f"module_type must be an nn.Module subclass, got {module_type!r}")

    def decorator(fn: Converter) -> Converter:
        _CONVERTERS[module_type] = fn
        return fn

    return decorator


def _copy_parameters(target: nn.Linear | nn.Conv2d, source: nn.Linear | nn.Conv2d) -> nn.Module:
    target.weight.data.copy_(source.weight.data)
    if source.bias is not None:
        assert target.bias is not None  # the converters give target a bias exactly when source has one
        target.bias.data.copy_(source.bias.data)
    return target


@register_converter(nn.Linear)
def _linear(module: nn.Module, convert, kind: str, rho_init: float) -> nn.Module:
    assert isinstance(module, nn.Linear)  # registered for nn.Linear: _convert dispatches on the type
    cls = MNLinear if kind == "mn" else MFLinear
    new = cls(module.in_features, module.out_features, module.bias is not None, rho_init=rho_init,
              device=module.weight.device, dtype=module.weight.dtype)
    return _copy_parameters(new, module)


@register_converter(nn.Conv2d)
def _conv2d(module: nn.Module, convert, kind: str, rho_init: float) -> nn.Module:
    assert isinstance(module, nn.Conv2d)  # registered for nn.Conv2d: _convert dispatches on the type
    if module.padding_mode != "zeros":
        raise TypeError(f"cannot convert Conv2d with padding_mode={module.padding_mode!r}; only 'zeros' is supported")
    cls = MNConv2d if kind == "mn" else MFConv2d
    # Conv2d stores kernel_size, stride, padding and dilation as pairs (padding may also be a string)
    new = cls(module.in_channels, module.out_channels, cast("tuple[int, int]", module.kernel_size),
              cast("tuple[int, int]", module.stride), cast("tuple[int, int] | str", module.padding),
              cast("tuple[int, int]", module.dilation), module.groups, module.bias is not None, rho_init=rho_init,
              device=module.weight.device, dtype=module.weight.dtype)
    return _copy_parameters(new, module)


@register_converter(nn.ReLU)
def _relu(module, convert, kind, rho_init):
    return MNReLU()


def _elementwise(module, convert, kind, rho_init):
    return MNActivation(copy.deepcopy(module))


for _cls in _ELEMENTWISE:
    register_converter(_cls)(_elementwise)


def _batchnorm(cls):
    def fn(module, convert, kind, rho_init):
        ref = module.weight if module.affine else module.running_mean
        factory = {} if ref is None else {"device": ref.device, "dtype": ref.dtype}
        new = cls(module.num_features, module.eps, module.momentum, module.affine, module.track_running_stats,
                  **factory)
        new.load_state_dict(module.state_dict())
        return new

    return fn


register_converter(nn.BatchNorm1d)(_batchnorm(MNBatchNorm1d))
register_converter(nn.BatchNorm2d)(_batchnorm(MNBatchNorm2d))


@register_converter(nn.MaxPool2d)
def _maxpool(module, convert, kind, rho_init):
    return MNMaxPool2d(module.kernel_size, module.stride, module.padding, module.dilation,
                       ceil_mode=module.ceil_mode)


@register_converter(nn.AvgPool2d)
def _avgpool(module, convert, kind, rho_init):
    return MNAvgPool2d(module.kernel_size, module.stride, module.padding, module.ceil_mode, module.count_include_pad,
                       module.divisor_override)


@register_converter(nn.AdaptiveAvgPool2d)
def _adaptive_avgpool(module, convert, kind, rho_init):
    return MNAdaptiveAvgPool2d(module.output_size)


@register_converter(nn.Flatten)
def _flatten(module, convert, kind, rho_init):
    return MNFlatten(module.start_dim, module.end_dim)


def _dropout(module, convert, kind, rho_init):
    return MNDropout(module.p)


for _dropout_cls in (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d):
    register_converter(_dropout_cls)(_dropout)


@register_converter(nn.Identity)
def _identity(module, convert, kind, rho_init):
    return MNIdentity()


@register_converter(nn.Sequential)
def _sequential(module, convert, kind, rho_init):
    return MNSequential(*(convert(child) for child in module))


def _register_torchvision_converters() -> None:
    """Converters for torchvision's residual networks (``BasicBlock``, ``ResNet``), registered when the first
    torchvision module is converted: importing torchvision takes seconds, and a user converting one has imported it
    already."""
    from torchvision.models.resnet import BasicBlock, ResNet

    if ResNet in _CONVERTERS:
        return

    @register_converter(BasicBlock)
    def _basic_block(module, convert, kind, rho_init):
        main = MNSequential(convert(module.conv1), convert(module.bn1), MNReLU(), convert(module.conv2),
                            convert(module.bn2))
        shortcut = None if module.downsample is None else convert(module.downsample)
        return MNResidualBlock(main, shortcut, MNReLU())

    @register_converter(ResNet)
    def _resnet(module, convert, kind, rho_init):
        parts = [module.conv1, module.bn1, module.relu, module.maxpool, module.layer1, module.layer2, module.layer3,
                 module.layer4, module.avgpool]
        return MNSequential(*(convert(p) for p in parts), MNFlatten(), convert(module.fc))


def _convert(module: nn.Module, kind: str, rho_init: float) -> nn.Module:
    def convert(child: nn.Module) -> nn.Module:
        if isinstance(child, _MOMENT_MODULES):
            return copy.deepcopy(child)
        if type(child).__module__.startswith("torchvision."):
            _register_torchvision_converters()
        for cls in type(child).__mro__:
            if cls in _CONVERTERS:
                return _CONVERTERS[cls](child, convert, kind, rho_init)
        raise TypeError(
            f"cannot convert {type(child).__name__} to a moment-propagating module; supported: "
            f"{sorted(c.__name__ for c in _CONVERTERS)}, torchvision's BasicBlock and ResNet (register more with "
            "register_converter)"
        )

    if not isinstance(module, nn.Module):
        raise TypeError(f"module must be an nn.Module, got {type(module).__name__}")
    new = convert(module)
    new.train(module.training)
    return new


def to_mnvi(module: nn.Module, *, rho_init: float = RHO_INIT) -> nn.Module:
    """The MNVI twin of a plain network: weights become posterior means, ``rho`` starts at ``rho_init``.

    :param nn.Module module: the deterministic network (not modified).
    :param float rho_init: initial noise parameter (``alpha = softplus(rho_init)``).
    :raises TypeError: for a module without a registered converter.

    >>> net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Dropout(0.1), nn.Linear(8, 3))
    >>> twin = to_mnvi(net)
    >>> x = torch.randn(2, 4)
    >>> torch.allclose(twin.eval()(x), net.eval()(x))
    True
    """
    return _convert(module, "mn", rho_init)


def to_mean_field(module: nn.Module, *, rho_init: float = MF_RHO_INIT) -> nn.Module:
    """The sampling-free mean-field (MFVI) twin of a plain network; see :func:`to_mnvi`.

    >>> twin = to_mean_field(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3)))
    >>> type(twin[0]).__name__
    'MFLinear'
    """
    return _convert(module, "mf", rho_init)
