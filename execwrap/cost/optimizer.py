"""The optimizer step's cost, measured on sharded (DTensor) parameters as FSDP2 gives it.

:func:`measure_optimizer` runs on every rank of the group (it builds a
:class:`~torch.distributed.device_mesh.DeviceMesh` from the group; the step
itself issues no collective) and times ``torch.optim.AdamW.step`` (torch's
default implementation for the device: a for-loop on CPU, ``foreach`` on
CUDA) over parameters that are ``DTensor`` shards (``Shard(0)``), as after
``fully_shard``, with ``DTensor`` gradients:

* ``m`` parameters of each local size of :data:`SIZES` elements (4 KiB to 16
  MiB of float32 per rank; ``m = ELEMENTS // n`` kept within 4 to 32) and
  ``m`` parameters of 16 elements, in interleaved rounds (median of
  ``9 * repeat`` after 2 warm-up steps, over the runs the host did not
  interrupt);
* the fixed cost per parameter: the step over 32 parameters of 16 elements,
  divided by 32 (the dispatch of the step's ops through ``DTensor``; the
  slope over 4, 8 and 32 parameters came out at 102 us against 235 us per
  parameter of the 32: the steps over 4 and 8 cost more per parameter, and
  a model has tens to hundreds);
* the size-dependent part per parameter, by its local bytes: the difference
  to the 16-element step over the same ``m``, divided by ``m``.

Both go into the :class:`~execwrap.cost.CostModel` (``optimizer_param_overhead_s``
and ``optimizer_curve``), which prices a plan's step as the sum over its
trainable shards. Why on ``DTensor`` parameters, 2 gloo ranks, AdamW over
the local shapes of three models' FSDP2 shards (2026-12-02): per parameter,
``DTensor`` added 92 us over plain tensors of the same shapes to 16 x 16
layers and 152-736 us to 256 x 256 to 1024 x 1024 ones (the extra grows with
the size), so plain tensors plus a fixed ``DTensor`` cost per parameter from
small layers priced the steps of *gpt*, *llama* and *wide* at 0.65x, 0.72x
and 0.85x of what they measured.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn

from execwrap.cost.curve import CollectiveCurve
from execwrap.cost.host import clean_median
from execwrap.cost.sweep import cache_evictor, timed_runs

__all__ = ["ELEMENTS", "SIZES", "measure_optimizer"]

#: Local elements per parameter of the sweep: 1 Ki to 4 Mi float32 (4 KiB to 16 MiB),
#: factor 4 (on CPU: cached tensors up to ones above glibc's mmap threshold).
SIZES = (2**10, 2**12, 2**14, 2**16, 2**18, 2**20, 2**22)
#: Local elements per size (``ELEMENTS // n`` parameters of ``n`` elements, 4 to 32):
#: enough parameters that a small size's time is not one parameter's noise.
ELEMENTS = 2**23
#: Elements of the parameters whose step is all fixed cost.
_TINY = 16


def measure_optimizer(
    group: dist.ProcessGroup, dev: torch.device, *, repeat: int = 1
) -> tuple[CollectiveCurve, float]:
    """``(optimizer_curve, optimizer_param_overhead_s)`` measured as the module docstring says.

    Args:
        group: the process group whose mesh the parameters are sharded on (every rank
            calls this).
        dev: the device of the parameters.
        repeat: ``9 * repeat`` timed rounds.

    Returns:
        The size-dependent seconds of one parameter's ``AdamW.step`` by its local
        bytes (a :class:`CollectiveCurve`, every size's time ``> 0``), and the
        fixed seconds per parameter (``>= 0``).
    """
    from torch.distributed.device_mesh import DeviceMesh

    mesh = DeviceMesh.from_group(group, dev.type)
    counts = {n: max(4, min(32, ELEMENTS // n)) for n in SIZES}
    steps: dict[tuple[int, int], Callable[[], Any]] = {}
    for n, m in [(_TINY, m) for m in sorted(set(counts.values()))] + list(counts.items()):
        steps[(n, m)] = _adamw_step(mesh, dev, n, m)
    med = _interleaved(steps, dev, rounds=2 + 9 * repeat, warmup=2)
    del steps
    most = max(counts.values())
    fixed = med[(_TINY, most)] / most
    per_tensor = [
        max((med[(n, counts[n])] - med[(_TINY, counts[n])]) / counts[n], 1e-9) for n in SIZES
    ]
    return CollectiveCurve.from_samples([4 * n for n in SIZES], per_tensor), max(0.0, fixed)


def _adamw_step(mesh: Any, dev: torch.device, n: int, m: int) -> Callable[[], Any]:
    """``AdamW.step`` over ``m`` ``DTensor`` parameters of ``n`` local elements each."""
    from torch.distributed.tensor import DTensor, Shard

    def shard(local: torch.Tensor) -> DTensor:
        return DTensor.from_local(local, mesh, [Shard(0)], run_check=False)

    params = [nn.Parameter(shard(torch.randn(n, device=dev))) for _ in range(m)]
    for p in params:
        p.grad = shard(torch.randn(n, device=dev))
    return torch.optim.AdamW(params, lr=1e-3).step


def _interleaved(
    steps: dict[tuple[int, int], Callable[[], Any]], dev: torch.device, *, rounds: int, warmup: int
) -> dict[tuple[int, int], float]:
    """Median seconds of each step over ``rounds - warmup`` interleaved rounds (the first
    ``warmup`` allocate the optimizer states), over the runs the host did not interrupt."""
    evict = cache_evictor(dev)
    samples: dict[tuple[int, int], list[float]] = {key: [] for key in steps}
    steals: dict[tuple[int, int], list[float]] = {key: [] for key in steps}
    for r in range(rounds):
        for key, step in steps.items():
            # in a training step, forward and backward have just run through the caches
            times, stolen = timed_runs(step, dev, 1, before=evict)
            if r >= warmup:
                samples[key] += times
                steals[key] += stolen
    return {key: clean_median(v, steals[key]) for key, v in samples.items()}
