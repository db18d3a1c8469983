"""FSDP2's costs inside a training step that a bare collective loop does not show.

:func:`fsdp_fixed_costs` runs on every rank of the group (it issues
collectives) and measures, from real ``fully_shard`` steps of synthetic stacks,
what :class:`~execwrap.cost.CostModel` charges on top of its collective
curves and copies:

* ``group_overhead_s``: fixed seconds per FSDP2 group per collective it
  issues (the hooks' Python path, the all-gather / reduce-scatter set-up, and
  the wake-up of a collective issued after compute: in a training step the two
  ranks do not arrive at a collective together, as they do in a loop of
  collectives behind a barrier);
* ``param_overhead_s``: seconds per parameter tensor of a group per
  collective (per-parameter views, unsharded storage, DTensor gradients:
  measured on tensors of 1 KiB and of 256 KiB, as FSDP2's per-parameter
  allocations cost more for larger tensors);
* ``optimizer_param_overhead_s``: ``AdamW.step`` seconds per DTensor
  parameter.

The stacks (:data:`STACKS`) are groups of ``k`` bias-free ``Linear(d, d)``
layers, each group its own ``fully_shard`` unit, with several group counts,
plus the same stacks unsharded, all timed in interleaved rounds (median of
:data:`ROUNDS`). For each stack the least-squares slope over the group count of
sharded minus unsharded step time is one group's cost: two all-gathers and
one reduce-scatter of its ``S`` bytes (the curves), their copies (the copy
curve), and ``3 * group + 3 * k * per_tensor``. The two
unknowns are the non-negative least-squares solution over the stacks (every
subset of unknowns tried, the best feasible one kept), so that noise cannot
make one of them negative at the expense of the others; each stack's equation
is divided by its measured slope (relative errors: a stack of 4 MiB groups
varies by milliseconds, one of 1 KiB groups by tenths of one).
"""

from __future__ import annotations

import gc
import itertools
import statistics
import time
from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist
import torch.nn as nn

from execwrap.cost.curve import CollectiveCurve

__all__ = ["ROUNDS", "STACKS", "fsdp_fixed_costs", "nonnegative_least_squares"]

#: ``(layers per group k, width d, group counts)`` of the synthetic stacks: groups
#: of 1 and 8 tensors of 1 KiB (16 x 16) and of 256 KiB (256 x 256).
STACKS: tuple[tuple[int, int, tuple[int, ...]], ...] = (
    (1, 16, (4, 12, 24)),
    (8, 16, (4, 12, 24)),
    (1, 256, (4, 12, 24)),
    (8, 256, (2, 6, 12)),
)
#: Interleaved rounds; the median round is used, as a training step's time is read
#: as the median of its steps.
ROUNDS = 15


def fsdp_fixed_costs(
    group: dist.ProcessGroup,
    dev: torch.device,
    ag: CollectiveCurve,
    rs: CollectiveCurve,
    copy: CollectiveCurve,
) -> tuple[float, float, float]:
    """Measure (module docstring) ``(group_overhead_s, param_overhead_s,
    optimizer_param_overhead_s)``.

    Args:
        group: the process group (every rank calls this).
        dev: the device FSDP2 runs on.
        ag: the all-gather curve (seconds by output bytes).
        rs: the reduce-scatter curve (seconds by input bytes).
        copy: seconds of a copy into a fresh buffer, by bytes.
    """
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    mesh = DeviceMesh.from_group(group, dev.type)
    world = dist.get_world_size(group)
    fns: dict[str, Callable[[], None]] = {}
    for k, d, counts in STACKS:
        for n in counts:
            for sharded in (True, False):
                model = nn.Sequential(
                    *[
                        nn.Sequential(*[nn.Linear(d, d, bias=False) for _ in range(k)])
                        for _ in range(n)
                    ]
                ).to(dev)
                if sharded:
                    for unit in model:
                        fully_shard(unit, mesh=mesh)
                    fully_shard(model, mesh=mesh)
                step, update = _step_fns(model, d, dev)
                fns[f"{k}/{d}/{n}/{sharded}"] = step
                if sharded and d == STACKS[1][1] and k == STACKS[1][0]:
                    fns[f"opt {n}"] = update
    times = _interleaved(fns, dev, group, rounds=ROUNDS)
    # Free the FSDP stacks now (they hold the process group in reference cycles): a gloo
    # worker thread that drops a backward-time collective while the interpreter shuts
    # down aborts the process (torch 2.13; see tests/_dist.py).
    del fns, model, step, update
    gc.collect()
    rows: list[list[float]] = []
    rhs: list[float] = []
    for k, d, counts in STACKS:
        extra = [times[f"{k}/{d}/{n}/True"] - times[f"{k}/{d}/{n}/False"] for n in counts]
        nbytes = k * d * d * 4  # one group's parameters, float32
        predicted = (
            2 * ag.time(nbytes)
            + rs.time(nbytes)
            + 2 * (copy.time(nbytes // world) + copy.time(nbytes))
            + copy.time(nbytes)
        )
        slope = statistics.linear_regression(list(counts), extra).slope
        weight = 1.0 / max(abs(slope), 1e-6)  # relative errors: noise grows with the time
        rows.append([3.0 * weight, 3.0 * k * weight])
        rhs.append((slope - predicted) * weight)
    per_group, per_tensor = nonnegative_least_squares(rows, rhs)
    k, _, counts = STACKS[1]
    opt = statistics.linear_regression(
        [k * n for n in counts], [times[f"opt {n}"] for n in counts]
    ).slope
    return per_group, per_tensor, max(0.0, opt)


def nonnegative_least_squares(rows: Sequence[Sequence[float]], rhs: Sequence[float]) -> list[float]:
    """``x >= 0`` minimising ``|A x - b|`` for a few unknowns: every subset of unknowns
    solved by least squares (the others 0), the best feasible one kept.

    >>> [round(v, 6) for v in nonnegative_least_squares([[1, 0], [0, 1], [1, 1]], [1, 2, 3])]
    [1.0, 2.0]
    >>> nonnegative_least_squares([[1.0, 1.0], [1.0, 2.0]], [1.0, -1.0])
    [0.0, 0.0]
    """
    n = len(rows[0])
    best = [0.0] * n
    best_err = sum(b * b for b in rhs)
    for size in range(1, n + 1):
        for subset in itertools.combinations(range(n), size):
            a = torch.tensor([[r[j] for j in subset] for r in rows], dtype=torch.float64)
            b = torch.tensor(list(rhs), dtype=torch.float64).unsqueeze(1)
            # columns scaled to unit norm (they may differ by orders of magnitude)
            scale = a.norm(dim=0).clamp_min(1e-30)
            sol = torch.linalg.lstsq(a / scale, b).solution.squeeze(1) / scale
            if bool((sol < 0).any()):
                continue
            x = [0.0] * n
            for j, v in zip(subset, sol.tolist(), strict=True):
                x[j] = float(v)
            err = sum(
                (sum(r[j] * x[j] for j in range(n)) - bb) ** 2
                for r, bb in zip(rows, rhs, strict=True)
            )
            if err < best_err - 1e-30:
                best, best_err = x, err
    return best


def _step_fns(
    model: nn.Module, width: int, dev: torch.device
) -> tuple[Callable[[], None], Callable[[], None]]:
    """(forward + backward, ``AdamW.step``) of ``model`` on a ``4 x width`` batch, warmed up."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(4, width, device=dev)

    def step() -> None:
        model(x).sum().backward()

    def update() -> None:  # as a training step: the next backward makes fresh gradients
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()
    update()
    return step, update


def _interleaved(
    fns: dict[str, Callable[[], None]], dev: torch.device, group: dist.ProcessGroup, *, rounds: int
) -> dict[str, float]:
    """Median seconds of each function, run in rounds (each once per round, in the same
    order on every rank: they may issue collectives), a barrier before each run."""
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(rounds):
        for k, fn in fns.items():
            dist.barrier(group=group)
            t0 = time.perf_counter()
            fn()
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            times[k].append(time.perf_counter() - t0)
    return {k: float(statistics.median(v)) for k, v in times.items()}
