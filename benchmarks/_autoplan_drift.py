"""How fast the machine ran during a model's steps, against during the calibration.

A cost model is a measurement of the machine at one moment; ``benchmarks/autoplan.py``
times the plans minutes later. On a shared VM the speed moves in between (a 1.6x
slower AdamW step in one run of 2026-12-03, with no steal the guest could see during
the calibration). :class:`SpeedProbe` runs a small fixed workload right after the
calibration and once per round of the timed steps, so that each model's result
says how much faster or slower the machine was while its steps ran: a measured
figure next to the prediction errors, not a guess. It changes no prediction.
The reference is a snapshot of a moment right after the calibration, not of the
minute the calibration measured: on 2026-12-03 13:34 *wide* was predicted 12.8%
slow while the probe said its steps ran on a machine 1.15-1.38x slower than at the
reference, so the probe explains some misses and not others.

The workload, three parts timed apart (each a few milliseconds on the 2-vCPU
development VM; the device synchronised around each on CUDA):

* ``compute``: 8 products of two 256 x 256 float32 matrices (bound by arithmetic,
  like the models' matmuls);
* ``dispatch``: 400 in-place additions on 16-element tensors (bound by the cost of
  launching an op, like a for-loop optimizer over many small shards);
* ``all-gather``: ``all_gather_single`` (as the calibration times it) of 2 MiB
  per rank on the default group, after a barrier (like a block's all-gather).

Example (one rank, no process group needed for the local parts)::

    probe = SpeedProbe(torch.device("cpu"), collective=False)
    probe.set_reference(5)   # right after the calibration: median of 5 runs
    probe.record()           # once per round of timed steps
    probe.drift()            # {"compute": ~1.0, "dispatch": ~1.0}; starts a new model
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence

import torch
import torch.distributed as dist

from benchmarks._ranks import barrier
from execwrap.cost.sweep import timed_runs

__all__ = ["PARTS", "SpeedProbe", "describe", "merge"]

#: The parts of the workload, in the order :meth:`SpeedProbe.sample` times them.
PARTS = ("compute", "dispatch", "all-gather")
_MATMULS = 8
_SIDE = 256
_OPS = 400
_GATHER_ELEMENTS = 2**19  # 2 MiB of float32 per rank


class SpeedProbe:
    """A fixed workload, timed part by part (see the module docstring).

    Args:
        device: where the tensors live (``cpu`` or a CUDA device).
        collective: time the all-gather too (every rank of the default group must
            call :meth:`sample` the same number of times).
    """

    def __init__(self, device: torch.device, *, collective: bool = True) -> None:
        gen = torch.Generator().manual_seed(0)
        self.device = device
        self.collective = collective
        self.a = torch.randn(_SIDE, _SIDE, generator=gen).to(device)
        self.b = torch.randn(_SIDE, _SIDE, generator=gen).to(device)
        self.small = [torch.zeros(16, device=device) for _ in range(8)]
        self.send = torch.ones(_GATHER_ELEMENTS, device=device)
        world = dist.get_world_size() if collective else 1
        self.recv = torch.empty(world * _GATHER_ELEMENTS, device=device)
        #: Median seconds of each part at the calibration (:meth:`set_reference`).
        self.reference: dict[str, float] = {}
        #: Runs since the last :meth:`drift` (:meth:`record`).
        self.during: list[dict[str, float]] = []

    def _timed(self, fn: Callable[[], None], before: Callable[[], None] | None = None) -> float:
        """Seconds of one run of ``fn`` (``timed_runs``: the device synchronised around it)."""
        return timed_runs(fn, self.device, 1, before=before)[0][0]

    def _compute(self) -> None:
        out = self.a
        for _ in range(_MATMULS):
            out = torch.mm(out, self.b).tanh_()

    def _dispatch(self) -> None:
        for i in range(_OPS):
            self.small[i % len(self.small)].add_(1.0)

    def _gather(self) -> None:
        dist.all_gather_single(self.recv, self.send)

    def sample(self) -> dict[str, float]:
        """Seconds of each part of one run of the workload (``PARTS``; without the
        all-gather when ``collective`` is false)."""
        out = {"compute": self._timed(self._compute), "dispatch": self._timed(self._dispatch)}
        if self.collective:
            out["all-gather"] = self._timed(self._gather, before=lambda: barrier(self.device))
        return out

    def set_reference(self, runs: int) -> None:
        """Take the reference: the median of each part over ``runs`` runs (after one
        untimed run); forgets the runs :meth:`record` kept."""
        self.sample()
        self.reference = merge([self.sample() for _ in range(runs)])
        self.during = []

    def record(self) -> None:
        """Time one run and keep it for :meth:`drift`."""
        self.during.append(self.sample())

    def drift(self) -> dict[str, float]:
        """Each part's median over the recorded runs divided by its reference
        (``> 1``: the machine was slower than at the reference; ``{}`` with no
        reference or no run); forgets the recorded runs."""
        during, self.during = merge(self.during), []
        ref = self.reference
        return {k: during[k] / ref[k] for k in ref if k in during and ref[k] > 0}


def merge(samples: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Median seconds of each part over ``samples`` (``{}`` for none)."""
    if not samples:
        return {}
    return {k: statistics.median(s[k] for s in samples) for k in samples[0]}


def describe(ratios: Mapping[str, float]) -> str:
    """``"compute 1.02x, dispatch 1.31x, all-gather 0.97x"``: each part's time during
    the steps over its time at the calibration (``"-"`` for none).

    >>> describe({"compute": 1.0, "dispatch": 1.314, "all-gather": 0.97})
    'compute 1.00x, dispatch 1.31x, all-gather 0.97x'
    """
    parts = [f"{k} {ratios[k]:.2f}x" for k in PARTS if k in ratios]
    return ", ".join(parts) if parts else "-"
