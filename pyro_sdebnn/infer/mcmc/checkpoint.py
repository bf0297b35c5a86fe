# SPDX-License-Identifier: Apache-2.0
"""Checkpoints of SG-MCMC runs: save a finished :class:`pyro.infer.MCMC` run and continue it later.

Pyro's ``MCMC`` has no resume API. A run is therefore continued through the kernel: :func:`save_run` writes the
kernel's :meth:`~pyro_sdebnn.infer.mcmc.resume.ResumableState.state_dict` (position, momentum, step-size schedule
position, random state, warm-up step-size factor, divergence records, minibatch position) and the samples so far
to one file; :func:`resume_run` loads it into a kernel, runs ``MCMC`` for more samples from there and returns an
``MCMC`` whose samples are the old ones followed by the new ones. With the same seed the continued run gives the
same samples as an uninterrupted one (bitwise on CPU with a fixed ``backend``, ``"fx"`` or ``"eager"``: the
default ``"auto"`` may switch to the compiled step at another point of the run)::

    pyro.set_rng_seed(0)
    mcmc = MCMC(SGHMC(model, step_size=1e-3, subsample_size=64, backend="fx"), num_samples=500, warmup_steps=500)
    mcmc.run(x, y)
    save_run(mcmc, "run.pt")
    ...                                              # another process, another day
    kernel = SGHMC(model, step_size=1e-3, subsample_size=64, backend="fx")
    mcmc = resume_run("run.pt", kernel, x, y, num_samples=500)   # 1000 samples in all

:class:`CheckpointHook` writes the same file periodically while ``MCMC`` runs (as its ``hook_fn``), so that a
pre-empted run, even in warm-up, can be resumed from its last checkpoint. The file holds only tensors, numbers,
strings, lists and dicts: it loads with ``torch.load(path, weights_only=True)``. Runs over a loader (``mcmc.run(loader)``) resume on the same loader: the epoch in progress
is made again from its recorded random state (torch's, and that of the loader's own ``torch.Generator``, given as
``DataLoader(..., generator=g)`` or to its sampler) and the batches already used are skipped. A run of several
sequential chains (``MCMC(num_chains > 1)``) cannot be checkpointed (the kernel holds the last chain only):
use ``vectorized_chains`` instead.

>>> import os, tempfile
>>> import pyro.distributions as dist
>>> from pyro.infer import MCMC
>>> from pyro_sdebnn.infer.mcmc import SGLD
>>> def model(x, y=None):
...     w = pyro.sample("w", dist.Normal(0.0, 1.0))
...     with pyro.plate("data", len(x)):
...         pyro.sample("y", dist.Normal(w * x, 1.0), obs=y)
>>> x = torch.linspace(-1, 1, 20); y = 2 * x
>>> mcmc = MCMC(SGLD(model, step_size=1e-2, subsample_size=5, backend="eager"), num_samples=5, warmup_steps=5,
...             disable_progbar=True)
>>> mcmc.run(x, y)
>>> path = os.path.join(tempfile.mkdtemp(), "run.pt")
>>> save_run(mcmc, path)
>>> kernel = SGLD(model, step_size=1e-2, subsample_size=5, backend="eager")
>>> resumed = resume_run(path, kernel, x, y, num_samples=3, disable_progbar=True)
>>> resumed.get_samples()["w"].shape
torch.Size([8])
"""

from __future__ import annotations

import os
import pickle
from typing import Any, Union

import torch
from pyro.infer import MCMC

from pyro_sdebnn.infer.mcmc.kernel import SGMCMCKernel

__all__ = ["CheckpointHook", "load_checkpoint", "resume_run", "save_run"]

_FORMAT = "pyro_sdebnn.sgmcmc_checkpoint"
_VERSION = 1
PathLike = Union[str, "os.PathLike[str]"]


def save_run(mcmc: MCMC, path: PathLike) -> None:
    """Write a finished run of an SG-MCMC kernel to ``path``: the kernel state and the samples so far.

    :param mcmc: a :class:`pyro.infer.MCMC` of an SG-MCMC kernel that has run (``mcmc.run``), with one chain
        (``num_chains=1``; ``vectorized_chains`` may be anything).
    :param path: the file to write (``torch.save``).
    :raises TypeError: if ``mcmc`` is not an ``MCMC`` of an SG-MCMC kernel.
    :raises ValueError: if it has not run, or ran several sequential chains.
    """
    if not isinstance(mcmc, MCMC) or not isinstance(mcmc.kernel, SGMCMCKernel):
        raise TypeError(f"mcmc must be a pyro.infer.MCMC of an SG-MCMC kernel, got {type(mcmc).__name__}")
    if mcmc.num_chains != 1:
        raise ValueError(
            f"save_run: the run has num_chains={mcmc.num_chains} sequential chains and the kernel holds only the "
            "last one; run several chains with vectorized_chains= to checkpoint them"
        )
    samples = getattr(mcmc, "_samples", None)
    if not samples:
        raise ValueError("save_run: the MCMC has no samples; call mcmc.run first")
    # constrained samples as MCMC keeps them: (chains, draws, *site shape), the vectorised chains as chains
    _write(path, mcmc.kernel, {k: v.detach().cpu().clone() for k, v in samples.items()})


def _write(path: PathLike, kernel: SGMCMCKernel, samples: dict[str, torch.Tensor]) -> None:
    """Write the checkpoint to a temporary file and move it into place: an interrupted write leaves the previous
    checkpoint intact."""
    num_samples = int(next(iter(samples.values())).shape[1]) if samples else 0
    checkpoint = {
        "format": _FORMAT, "version": _VERSION, "kernel": kernel.state_dict(), "samples": samples,
        "num_samples": num_samples,
    }
    tmp = f"{os.fspath(path)}.tmp"
    torch.save(checkpoint, tmp)
    os.replace(tmp, path)


class CheckpointHook:
    """A ``hook_fn`` for :class:`pyro.infer.MCMC` that checkpoints the run while it goes (for pre-emptible jobs).

    Every ``every`` calls (warm-up and sampling steps of ``MCMC`` alike) it writes the kernel state and the samples
    returned so far to ``path``, in the format of :func:`save_run`; the file is replaced atomically, so an
    interrupted write leaves the previous checkpoint. :func:`resume_run` continues from it (the warm-up left, then
    the samples). ``hook`` (optional) is called first, as ``MCMC``'s own ``hook_fn`` would be.

    :param path: the checkpoint file.
    :param int every: write every that many steps of ``MCMC`` (default 100).
    :param callable hook: another ``hook_fn(kernel, params, stage, i)`` to call.

    ::

        hook = CheckpointHook("run.pt", every=200)
        mcmc = MCMC(kernel, num_samples=5000, warmup_steps=1000, hook_fn=hook)
        mcmc.run(loader)                     # interrupted? resume_run("run.pt", kernel, loader, num_samples=...)
    """

    def __init__(self, path: PathLike, every: int = 100, hook: Any = None) -> None:
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"every must be a positive int, got {every!r}")
        if hook is not None and not callable(hook):
            raise TypeError(f"hook must be callable or None, got {type(hook).__name__}")
        self.path = path
        self.every = every
        self.hook = hook
        self.calls = 0
        self.samples: dict[str, list[torch.Tensor]] = {}

    def __call__(self, kernel: Any, params: dict[str, torch.Tensor], stage: str, i: int) -> None:
        if self.hook is not None:
            self.hook(kernel, params, stage, i)
        if not isinstance(kernel, SGMCMCKernel):
            raise TypeError(f"CheckpointHook needs an SG-MCMC kernel, got {type(kernel).__name__}")
        if "[" in stage:  # "Sample [chain]": MCMC runs several sequential chains
            raise ValueError("CheckpointHook: runs of several sequential chains (num_chains > 1) cannot be "
                             "checkpointed; use vectorized_chains")
        if stage.startswith("Sample"):
            transforms = kernel.transforms
            assert transforms is not None  # set by the kernel's setup, before MCMC calls the hook
            for name, value in params.items():  # constrained, as MCMC returns them
                self.samples.setdefault(name, []).append(transforms[name].inv(value).detach().cpu().clone())
        self.calls += 1
        if self.calls % self.every == 0:
            # the layout MCMC stores: (chains, draws, *shape), vectorised chains as chains (draws, K, ...) -> (K, draws, ...)
            vectorized = kernel.vectorized_chains > 1
            samples = {
                k: torch.stack(v).transpose(0, 1) if vectorized else torch.stack(v).unsqueeze(0)
                for k, v in self.samples.items()
            }
            _write(self.path, kernel, samples)


def load_checkpoint(path: PathLike) -> dict[str, Any]:
    """Read a checkpoint written by :func:`save_run` (``torch.load(path, weights_only=True)``) and check it.

    :raises ValueError: if the file is truncated, is not a checkpoint of this package, or has another version.
    """
    try:
        checkpoint = torch.load(path, weights_only=True, map_location="cpu")
    except FileNotFoundError:
        raise
    except (RuntimeError, EOFError, pickle.UnpicklingError, OSError, ValueError) as e:
        raise ValueError(
            f"cannot read the SG-MCMC checkpoint {os.fspath(path)!r} ({type(e).__name__}: "
            f"{str(e).splitlines()[0] if str(e) else ''}): the file is truncated or not a checkpoint of save_run"
        ) from e
    if not isinstance(checkpoint, dict) or checkpoint.get("format") != _FORMAT:
        raise ValueError(f"{os.fspath(path)!r} is not an SG-MCMC checkpoint written by save_run")
    if checkpoint.get("version") != _VERSION:
        raise ValueError(
            f"{os.fspath(path)!r} is a checkpoint of version {checkpoint.get('version')!r}; this version of the "
            f"package reads version {_VERSION}"
        )
    for key in ("kernel", "samples", "num_samples"):
        if key not in checkpoint:
            raise ValueError(f"{os.fspath(path)!r} is an incomplete SG-MCMC checkpoint (no {key!r})")
    return checkpoint


def resume_run(
    path: PathLike, kernel: SGMCMCKernel, *args: Any, num_samples: int, disable_progbar: bool = False, **kwargs: Any
) -> MCMC:
    """Continue the run saved by :func:`save_run` for ``num_samples`` more samples.

    :param path: the checkpoint.
    :param kernel: a kernel built as the saved one (same class, model and settings; the step-size schedule, for
        instance, continues from the saved inner step).
    :param args: the model's arguments, as for the saved run's ``mcmc.run`` (the same data, or the same loader).
    :param int num_samples: how many samples to add (the warm-up left in the checkpoint, if any, runs first).
    :param bool disable_progbar: passed to ``MCMC``.
    :param kwargs: the model's keyword arguments.
    :return: an ``MCMC`` that has run, whose ``get_samples()`` are the saved samples followed by the new ones.
    :raises ValueError: for a checkpoint of another model, kernel or data, or a truncated file.
    """
    if not isinstance(kernel, SGMCMCKernel):
        raise TypeError(f"kernel must be an SG-MCMC kernel (SGLD, SGHMC, ...), got {type(kernel).__name__}")
    if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 1:
        raise ValueError(f"num_samples must be a positive int, got {num_samples!r}")
    checkpoint = load_checkpoint(path)
    state = checkpoint["kernel"]
    kernel.load_state_dict(state)
    warmup_left = max(0, int(state["warmup_steps"]) - int(state["sample_count"]))
    mcmc = MCMC(kernel, num_samples=num_samples, warmup_steps=warmup_left, disable_progbar=disable_progbar)
    mcmc.run(*args, **kwargs)
    old = checkpoint["samples"]
    if not old:  # saved in warm-up: no samples yet
        return mcmc
    if set(old) != set(mcmc._samples):
        raise ValueError(f"the checkpoint's samples are of sites {sorted(old)}, the run's of {sorted(mcmc._samples)}")
    mcmc._samples = {
        k: torch.cat([old[k].to(device=v.device, dtype=v.dtype), v], dim=1) for k, v in mcmc._samples.items()
    }
    mcmc.num_samples = int(checkpoint["num_samples"]) + num_samples
    return mcmc
