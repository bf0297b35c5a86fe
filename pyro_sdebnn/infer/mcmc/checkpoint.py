# SPDX-License-Identifier: Apache-2.0
"""Checkpoints of SG-MCMC runs: save a finished :class:`pyro.infer.MCMC` run and continue it later.

Pyro's ``MCMC`` has no resume API, so a run is continued through the kernel, which owns the state of its chain as an
optimiser does (:meth:`~pyro_sdebnn.infer.mcmc.kernel.SGMCMCKernel.state_dict`: position, momentum, schedule
position, random state, warm-up state, divergence records, minibatch position); this module, above it, adds the file,
the samples and the checks of which run and rank wrote them. :func:`save_run` writes the state and the samples so far
to one checkpoint of kind ``"sgmcmc"`` (:mod:`pyro_sdebnn.infer.checkpoint`; it loads with
``torch.load(path, weights_only=True)``); :func:`resume_run` loads it into a kernel, runs ``MCMC`` on from there and
returns a :class:`ResumedMCMC`, whose samples are the old ones followed by the new ones; :class:`CheckpointHook` writes
the same file periodically as ``MCMC``'s ``hook_fn``, so that a pre-empted run, even in warm-up, resumes from its last
checkpoint. With the same seed the continued run gives the samples of an uninterrupted one, bitwise on CPU with a fixed
``backend`` (``"auto"`` may switch to the compiled step at another point) and, for a finished run extended, a fixed
``map_steps`` (the automatic warm start is bounded by 10 % of the run's own length). A run over a loader resumes on
the same loader (another size, batch size, ``drop_last`` or sampler is a ``ValueError``): the epoch in progress is
made again from its recorded random state and the batches already used are skipped. Sequential chains
(``MCMC(num_chains > 1)``) cannot be checkpointed (the kernel holds the last chain only): use ``vectorized_chains``.
The SG-MCMC page of the documentation shows a run saved and resumed in another process.

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
from typing import Any, Union

import torch
import torch.distributed as dist
from pyro.infer import MCMC
from pyro.infer.mcmc.util import diagnostics, print_summary, select_samples

from pyro_sdebnn.infer.checkpoint import load_checkpoint, save_checkpoint
from pyro_sdebnn.infer.mcmc.kernel import SGMCMCKernel

__all__ = ["CheckpointHook", "resume_run", "save_run"]

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
    samples = mcmc.get_samples(group_by_chain=True)  # None before mcmc.run
    if not samples:
        raise ValueError("save_run: the MCMC has no samples; call mcmc.run first")
    # constrained samples as MCMC keeps them: (chains, draws, *site shape), the vectorised chains as chains
    _write(path, mcmc.kernel, {k: v.detach().cpu().clone() for k, v in samples.items()})


def _rank_and_world() -> tuple[int, int]:
    """This process's rank and the world size under ``torch.distributed`` (0 and 1 without a process group)."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _write(path: PathLike, kernel: SGMCMCKernel, samples: dict[str, torch.Tensor]) -> None:
    """Write the checkpoint (atomically: an interrupted write leaves the previous checkpoint intact)."""
    num_samples = int(next(iter(samples.values())).shape[1]) if samples else 0
    # the rank that wrote it: under torchrun every rank runs its own chains (its own file), see resume_run
    rank, world = _rank_and_world()
    where = {"rank": rank, "world_size": world}
    save_checkpoint("sgmcmc", {"kernel": kernel.state_dict(), "samples": samples, "num_samples": num_samples,
                               **where}, path)


class CheckpointHook:
    """A ``hook_fn`` for :class:`pyro.infer.MCMC` that checkpoints the run while it goes (for pre-emptible jobs).

    Every ``every`` calls (warm-up and sampling steps of ``MCMC`` alike) it writes the kernel state and the samples
    returned so far to ``path``, in the format of :func:`save_run`; the file is replaced atomically, so an
    interrupted write leaves the previous checkpoint. :func:`resume_run` continues from it (the warm-up left, then
    ``num_samples`` more samples: the planned number less the ``"num_samples"`` the file holds, which
    :func:`~pyro_sdebnn.infer.checkpoint.load_checkpoint` reads). ``hook`` (optional) is called first, as
    ``MCMC``'s own ``hook_fn`` would be. Given to :func:`resume_run` as ``hook_fn``, the hook keeps checkpointing
    the resumed run: it starts from the checkpoint's samples, so its file holds all the samples so far and a run
    pre-empted again resumes the same way.

    :param path: the checkpoint file.
    :param int every: write every that many steps of ``MCMC`` (default 100).
    :param callable hook: another ``hook_fn(kernel, params, stage, i)`` to call.

    ::

        hook = CheckpointHook("run.pt", every=200)
        mcmc = MCMC(kernel, num_samples=5000, warmup_steps=1000, hook_fn=hook)
        mcmc.run(loader)                     # interrupted? then, with a kernel built as this one:
        done = load_checkpoint("run.pt", "sgmcmc")["num_samples"]
        mcmc = resume_run("run.pt", kernel, loader, num_samples=5000 - done,
                          hook_fn=CheckpointHook("run.pt", every=200))   # and checkpoint the rest
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
            # the layout MCMC stores: (chains, draws, *shape); vectorised chains as chains: (draws, K, ...) -> (K,
            # draws, ...)
            vectorized = kernel.vectorized_chains > 1
            samples = {
                k: torch.stack(v).transpose(0, 1) if vectorized else torch.stack(v).unsqueeze(0)
                for k, v in self.samples.items()
            }
            _write(self.path, kernel, samples)

    def _start_from(self, saved: dict[str, torch.Tensor], vectorized: bool) -> None:
        """Hold the samples of a checkpoint, ``{site: (chains, draws, *shape)}``, as the draws returned so far (the
        samples of an earlier use of this hook, past its last write, are dropped: the checkpoint is the run)."""
        self.samples = {k: [v[:, d] if vectorized else v[0, d] for d in range(v.shape[1])] for k, v in saved.items()}


def resume_run(
    path: PathLike,
    kernel: SGMCMCKernel,
    *args: Any,
    num_samples: int,
    disable_progbar: bool = False,
    hook_fn: Any = None,
    **kwargs: Any,
) -> "ResumedMCMC":
    """Continue the run saved by :func:`save_run` for ``num_samples`` more samples.

    :param path: the checkpoint.
    :param kernel: a kernel built as the saved one (same class, model and settings; the step-size schedule, for
        instance, continues from the saved inner step).
    :param args: the model's arguments, as for the saved run's ``mcmc.run`` (the same data, or the same loader).
    :param int num_samples: how many samples to add (the warm-up left in the checkpoint, if any, runs first).
    :param bool disable_progbar: passed to ``MCMC``.
    :param hook_fn: passed to ``MCMC``; a :class:`CheckpointHook` (a new one, or the interrupted run's) first takes
        the checkpoint's samples, so that the files it writes hold the saved samples followed by the new ones and
        the resumed run can itself be pre-empted and resumed.
    :param kwargs: the model's keyword arguments.
    :return: a :class:`ResumedMCMC` that has run, whose ``get_samples()`` are the saved samples followed by the new
        ones.
    :raises ValueError: for a checkpoint of another model, kernel or data, or a truncated file; under ``torchrun``,
        for the file of another rank (each rank runs its own chains and must resume from its own file, e.g.
        ``f"run{torch.distributed.get_rank()}.pt"``; a data-parallel chain, the same on every rank, resumes anywhere).
    """
    if not isinstance(kernel, SGMCMCKernel):
        raise TypeError(f"kernel must be an SG-MCMC kernel (SGLD, SGHMC, ...), got {type(kernel).__name__}")
    if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 1:
        raise ValueError(f"num_samples must be a positive int, got {num_samples!r}")
    if hook_fn is not None and not callable(hook_fn):
        raise TypeError(f"hook_fn must be callable or None, got {type(hook_fn).__name__}")
    checkpoint = load_checkpoint(path, "sgmcmc", map_location="cpu")
    for key in ("kernel", "samples", "num_samples"):
        if key not in checkpoint:
            raise ValueError(f"{os.fspath(path)!r} is an incomplete SG-MCMC checkpoint (no {key!r})")
    written_by = checkpoint.get("rank")  # absent from the files of earlier versions
    shared = getattr(kernel, "_chain_shared_by_ranks", False)  # DataParallelSGLD / SGHMC: one chain on every rank
    rank, world = _rank_and_world()
    if world > 1 and not shared and written_by is not None and int(written_by) != rank:
        raise ValueError(f"{os.fspath(path)!r} holds the chains of rank {int(written_by)} (of "
                         f"{int(checkpoint.get('world_size', 0))}), this process is rank {rank}: every rank "
                         "runs its own chains, so give each its own checkpoint file, e.g. "
                         "f'run{torch.distributed.get_rank()}.pt'")
    state = checkpoint["kernel"]
    kernel.load_state_dict(state)
    warmup_left = max(0, int(state["warmup_steps"]) - int(state["sample_count"]))
    if isinstance(hook_fn, CheckpointHook):
        hook_fn._start_from(checkpoint["samples"], int(kernel.vectorized_chains) > 1)
    mcmc = ResumedMCMC(checkpoint["samples"], kernel, num_samples=num_samples, warmup_steps=warmup_left,
                       disable_progbar=disable_progbar, **({} if hook_fn is None else {"hook_fn": hook_fn}))
    mcmc.run(*args, **kwargs)
    return mcmc


class ResumedMCMC(MCMC):
    """A :class:`pyro.infer.MCMC` that continues earlier samples: its ``get_samples``, ``diagnostics`` and
    ``summary`` see the ``saved`` samples followed by those of its own :meth:`run` (:func:`resume_run` builds it).

    Only public parts of ``MCMC`` are used: the new samples are read with ``MCMC.get_samples(group_by_chain=True)``
    and concatenated along the draws; ``num_samples`` counts all of them (what ``arviz.from_pyro`` reads).

    :param dict saved: the earlier samples, ``{site: (chains, draws, *shape)}`` as ``get_samples(group_by_chain=True)``
        returns them (empty for a run saved in warm-up).
    :param args: the arguments of :class:`pyro.infer.MCMC` (``num_samples``: the new samples).
    """

    def __init__(self, saved: dict[str, torch.Tensor], *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.saved = dict(saved)
        self.new_samples = self.num_samples
        self._all: dict[str, torch.Tensor] = {}

    def run(self, *args: Any, **kwargs: Any) -> None:
        """``MCMC.run`` for the new samples; afterwards ``num_samples`` counts the saved ones too."""
        self.num_samples = self.new_samples
        super().run(*args, **kwargs)
        new = super().get_samples(group_by_chain=True)
        if self.saved and set(self.saved) != set(new):
            raise ValueError(f"the checkpoint's samples are of sites {sorted(self.saved)}, the run's of {sorted(new)}")
        self._all = {k: torch.cat([self.saved[k].to(device=v.device, dtype=v.dtype), v], dim=1) if self.saved else v
                     for k, v in new.items()}
        self.num_samples = self.new_samples + (int(next(iter(self.saved.values())).shape[1]) if self.saved else 0)

    def get_samples(self, num_samples: int | None = None, group_by_chain: bool = False) -> dict[str, torch.Tensor]:
        """The saved samples followed by the new ones (see :meth:`pyro.infer.MCMC.get_samples`)."""
        return select_samples(self._all, num_samples, group_by_chain)

    def diagnostics(self) -> dict:
        """``MCMC.diagnostics`` with the sample statistics (ESS, R-hat) over all the samples; the kernel's
        diagnostics (divergences, ...) are those of the new run."""
        diag = super().diagnostics()
        diag.update(diagnostics(self._all))
        return diag

    def summary(self, prob: float = 0.9) -> None:
        """``MCMC.summary`` over all the samples (the divergences: those of the new run)."""
        print_summary(self._all, prob=prob)
        divergences = self.diagnostics().get("divergences")
        if divergences is not None:
            print(f"Number of divergences: {sum(len(v) for v in divergences.values())}")
