# SPDX-License-Identifier: Apache-2.0
"""Stream SG-MCMC samples to disk, so that the samples of large networks need not fit in memory."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Union

import torch
from torch import Tensor

__all__ = ["SampleWriter", "load_samples"]


class SampleWriter:
    """Write the post-warm-up samples of a kernel to ``directory`` in chunks of ``chunk_size`` samples.

    Pass it as ``sample_writer=`` to an SG-MCMC kernel, and ``save_params=[]`` to :class:`pyro.infer.MCMC` so that
    nothing is also kept in memory; read the samples back with :func:`load_samples`. Every chain (every
    ``setup``, also in worker processes) writes its own files ``chain-<pid>-<k>-<chunk>.pt`` of constrained values,
    moved to the CPU.

    :param directory: output folder (created if needed).
    :param int chunk_size: samples per file.

    >>> import tempfile, pyro.distributions as dist
    >>> from pyro.infer import MCMC
    >>> from pyro_sdebnn.infer.mcmc import SGLD
    >>> def model():
    ...     pyro.sample("z", dist.LogNormal(0.0, 1.0))
    >>> folder = tempfile.mkdtemp()
    >>> mcmc = MCMC(SGLD(model, step_size=0.1, sample_writer=SampleWriter(folder, chunk_size=4)), num_samples=10,
    ...             warmup_steps=2, save_params=[], disable_progbar=True)
    >>> mcmc.run()
    >>> samples = load_samples(folder)
    >>> samples["z"].shape, bool((samples["z"] > 0).all())
    (torch.Size([1, 10]), True)
    """

    def __init__(self, directory: Union[str, Path], chunk_size: int = 100) -> None:
        if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
            raise ValueError(f"chunk_size must be a positive int, got {chunk_size!r}")
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.chunk_size = chunk_size
        self._chains = 0
        self._buffer: list[dict[str, Tensor]] = []
        self._chunk = 0
        self._prefix = ""

    def start_chain(self) -> None:
        self.flush()
        self._prefix = f"chain-{os.getpid()}-{self._chains:04d}"
        self._chains += 1
        self._chunk = 0

    def write(self, sample: dict[str, Tensor]) -> None:
        self._buffer.append({k: v.detach().to("cpu", copy=True) for k, v in sample.items()})
        if len(self._buffer) >= self.chunk_size:
            self.flush()

    def flush(self) -> None:
        if not self._buffer:
            return
        stacked = {k: torch.stack([s[k] for s in self._buffer]) for k in self._buffer[0]}
        torch.save(stacked, self.directory / f"{self._prefix}-{self._chunk:06d}.pt")
        self._chunk += 1
        self._buffer = []


def load_samples(directory: Union[str, Path]) -> dict[str, Tensor]:
    """Read the samples written by :class:`SampleWriter`: ``(chains, draws, *shape)`` per site.

    (Vectorised chains keep their chain dimension after ``draws``.)
    """
    directory = Path(directory)
    files = sorted(directory.glob("chain-*.pt"))
    if not files:
        raise ValueError(f"no sample files in {directory}")
    chains: dict[str, list[dict[str, Tensor]]] = {}
    for f in files:
        chains.setdefault(f.name.rsplit("-", 1)[0], []).append(torch.load(f, weights_only=True))
    per_chain = [{k: torch.cat([c[k] for c in chunks]) for k in chunks[0]} for _, chunks in sorted(chains.items())]
    return {k: torch.stack([c[k] for c in per_chain]) for k in per_chain[0]}
