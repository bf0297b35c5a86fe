# SPDX-License-Identifier: Apache-2.0
"""The state of an SG-MCMC chain as a checkpoint: :meth:`ResumableState.state_dict` and its restoration.

:func:`pyro_sdebnn.infer.mcmc.save_run` and :func:`pyro_sdebnn.infer.mcmc.resume_run` are built on these.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any, NamedTuple, Optional, cast

import numpy as np
import torch
from torch import Tensor

from pyro_sdebnn.infer.mcmc.diagnostics import _RECENT


if TYPE_CHECKING:
    # the kernel's attributes and methods the mixin uses (the kernel itself would be a cycle: it subclasses the mixin)
    from pyro_sdebnn.infer.mcmc.kernel import _KernelAttributes as _KernelBase
else:
    _KernelBase = object


class ResumableState(_KernelBase):
    """``state_dict`` / ``load_state_dict`` of :class:`~pyro_sdebnn.infer.mcmc.kernel.SGMCMCKernel` (a mixin)."""

    def _signature(self) -> dict[str, Any]:
        """What a checkpoint must match: the kernel, its latent sites and the data sizes."""
        return {"kernel": type(self).__name__, **self._signature_of_model()}

    def state_dict(self) -> dict[str, Any]:
        """The state of the chain after the last :meth:`~pyro_sdebnn.infer.mcmc.kernel.SGMCMCKernel.sample`, enough
        to continue it exactly.

        The position and auxiliary state (momentum, RMSprop average; unconstrained, flat), the inner step count
        (the position in the step-size schedule), the sample count, the warm-up step-size factor and divergence
        records, the energy history of the divergence check, the minibatch position (the index pass, or the loader's
        epoch and batch) and torch's random state. It holds only tensors, numbers, strings, lists and dicts, so
        ``torch.save`` / ``torch.load(path, weights_only=True)`` round-trip it. See
        :func:`pyro_sdebnn.infer.mcmc.save_run`.

        :raises ValueError: before the kernel was set up (``mcmc.run``).
        :raises TypeError: for a kernel class without checkpoints (``_checkpointable = False``).
        """
        if not self._checkpointable:
            raise TypeError(f"{self._name} does not support checkpoints (state_dict)")
        if self.potential is None or self._state is None:
            raise ValueError("state_dict: the kernel has no chain yet; run it first (mcmc.run)")

        def tensors(state: Optional[tuple]) -> Optional[list[Tensor]]:
            return None if state is None else [t.detach().clone() for t in state]

        def array(a: Optional[np.ndarray]) -> Optional[Tensor]:
            return None if a is None else torch.as_tensor(np.asarray(a, dtype=np.float64).copy())

        batch_pos = self._batch_pos
        stream = None
        if self._stream is not None:
            stream = self._stream.state_dict()
            if self._pending_batch is not None:  # the first batch was drawn but not used yet
                stream["position"] -= 1
        rng = {"cpu": torch.get_rng_state()}
        if self.potential.device.type == "cuda":
            rng["cuda"] = torch.cuda.get_rng_state(self.potential.device)
        return {
            "signature": self._signature(),
            "state": tensors(self._state),
            "healthy": tensors(self._healthy),
            "uncertified": tensors(self._uncertified),
            "last_potential": None if self._last_potential is None else self._last_potential.detach().clone(),
            "t": int(self._t),
            "sample_count": int(self._sample_count),
            "warmup_steps": int(self._warmup_steps),
            "step_scale": float(self._step_scale),
            "divergences": [int(i) for i in self._divergences],
            "divergence_log": [dict(r) for r in self.divergence_log],
            "map_steps_taken": int(self.map_steps_taken),
            "energy": {
                "all": [array(r) for r in self._energy_all],
                "recent": [array(r) for r in self._energy_recent],
                "stride": int(self._energy_stride),
                "seen": int(self._energy_seen),
                "healthy": array(self._healthy_energy),
            },
            "batches": None if self._batches is None else self._batches.clone(),
            "batch_pos": int(batch_pos),
            "loader": stream,
            "rng": rng,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Continue from :meth:`state_dict` on the next ``setup`` (the next ``mcmc.run``), which must get the same
        model and data (the same loader for a run over a loader): it restores the chain instead of drawing initial
        values, and torch's random state, so the continued chain is the one an uninterrupted run would have given
        (bitwise on CPU with a fixed ``backend``). The ``warmup_steps`` of that run must be the warm-up left in the
        checkpoint (0 once sampling began); :func:`pyro_sdebnn.infer.mcmc.resume_run` does all this.

        :raises TypeError: if ``state_dict`` is not a dict of the expected layout.
        """
        required = ("signature", "state", "t", "sample_count", "warmup_steps", "rng", "energy")
        if not self._checkpointable:
            raise TypeError(f"{self._name} does not support checkpoints (load_state_dict)")
        if not isinstance(state_dict, dict) or any(k not in state_dict for k in required):
            raise TypeError(
                "state_dict must be a dict returned by SGMCMCKernel.state_dict() (keys "
                f"{list(required)}), got {type(state_dict).__name__}"
            )
        if state_dict["signature"].get("kernel") != type(self).__name__:
            raise ValueError(
                f"the checkpoint is of a {state_dict['signature'].get('kernel')} kernel, not of {type(self).__name__}"
            )
        self._resume = state_dict

    def _restore(self, sd: dict[str, Any], warmup_steps: int) -> None:
        """Restore the chain saved by :meth:`state_dict` (called by ``setup``)."""
        self._resume = None
        U = self.potential
        assert U is not None  # setup restores after building the potential
        saved, here = sd["signature"], self._signature_of_model()
        for key in ("sites", "data_sizes", "vectorized_chains"):
            if saved.get(key) != here[key]:
                raise ValueError(
                    f"the checkpoint does not belong to this model and data: its {key} {saved.get(key)!r} differ "
                    f"from {here[key]!r}"
                )
        if (sd.get("loader") is None) != (self._stream is None):
            raise ValueError(
                "the checkpoint was taken on a run over " + ("a loader" if sd.get("loader") is not None else "tensors")
                + ": resume it on the same kind of data"
            )
        left = max(0, int(sd["warmup_steps"]) - int(sd["sample_count"]))
        if warmup_steps != left:
            raise ValueError(
                f"warmup_steps={warmup_steps} on resuming, but the checkpoint has {left} warm-up step(s) left: "
                f"run MCMC(..., warmup_steps={left}) (resume_run does)"
            )

        def tensors(ts: Optional[list]) -> Optional[tuple]:
            return None if ts is None else tuple(t.to(device=U.device, dtype=U.dtype) for t in ts)

        state = tensors(sd["state"])
        assert state is not None  # state_dict saves the chain's state (load_state_dict checked the key)
        state_type = cast("type[NamedTuple]", self._state_type)  # the kernel's NamedTuple of its chain state
        if len(state) != len(state_type._fields):
            raise ValueError("the checkpoint's chain state does not match this kernel's (e.g. preconditioned or not)")
        self._state = state
        self._healthy = tensors(sd["healthy"])
        self._uncertified = tensors(sd["uncertified"])
        last = sd.get("last_potential")
        self._last_potential = None if last is None else last.to(U.device)
        self._t = int(sd["t"])
        self._sample_count = int(sd["sample_count"])
        self._warmup_steps = int(sd["warmup_steps"])
        self._step_scale = float(sd["step_scale"])
        self._eta_tensor = None
        self._divergences = [int(i) for i in sd["divergences"]]
        self.divergence_log = [dict(r) for r in sd["divergence_log"]]
        self.map_steps_taken = int(sd["map_steps_taken"])
        energy = sd["energy"]

        def array(t: Tensor) -> np.ndarray:
            return t.numpy().copy()

        self._energy_all = [array(r) for r in energy["all"]]
        self._energy_recent = deque((array(r) for r in energy["recent"]), maxlen=_RECENT)
        self._energy_stride, self._energy_seen = int(energy["stride"]), int(energy["seen"])
        self._healthy_energy = None if energy["healthy"] is None else array(energy["healthy"])
        batches = sd.get("batches")
        self._batches = None if batches is None else batches.to(U.device)
        self._batch_pos = int(sd["batch_pos"])
        if self._stream is not None:
            self._pending_batch = None
            self._stream.restore(sd["loader"])
        torch.set_rng_state(sd["rng"]["cpu"])
        if "cuda" in sd["rng"] and U.device.type == "cuda":
            torch.cuda.set_rng_state(sd["rng"]["cuda"], U.device)
        self._initial_params = U.split(self._state[0])
        self._last_params = self._initial_params

    def _signature_of_model(self) -> dict[str, Any]:
        U = self.potential
        assert U is not None  # called once setup built it (state_dict checks)
        return {
            "sites": [[site.name, list(site.shape)] for site in U.sites],
            "data_sizes": {p: int(n) for p, n in U.data_sizes.items()},
            "vectorized_chains": int(self.vectorized_chains),
        }
