"""FSDP2's costs inside a training step that a bare collective loop does not show.

:func:`fsdp_fixed_costs` runs on every rank of the group (it issues
collectives) and measures, from real ``fully_shard`` steps of synthetic stacks,
what :class:`~execwrap.cost.CostModel` charges on top of its collective
curves and copies (an :class:`InStepCosts`):

* ``all_gather_factor`` and ``reduce_scatter_factor``: how much slower a
  collective runs inside a step than in the calibration's loop of
  collectives behind a barrier. In a step its buffers are cold in the
  caches (a 3 MiB reduce-scatter after an 8 MiB write took 4.9 ms against
  2.9 ms in the loop, 2 gloo ranks) and the ranks arrive at different
  times; the calibrated curves are multiplied by these factors;
* ``group_overhead_s``: fixed seconds per FSDP2 group per collective it
  issues (the hooks' Python path, the all-gather / reduce-scatter set-up);
* ``param_overhead_s``: seconds per parameter tensor of a group per
  collective (per-parameter views, unsharded storage, DTensor gradients);
* ``optimizer_param_overhead_s``: ``AdamW.step`` seconds per DTensor
  parameter.

The stacks (:data:`STACKS`) are groups of ``k`` bias-free ``Linear(d, d)``
layers, each group its own ``fully_shard`` unit, with several group counts,
plus the same stacks unsharded, all timed in interleaved rounds (median of
:data:`ROUNDS`), forward and backward apart. For each stack and phase the
least-squares slope over the group count of sharded minus unsharded time is
one group's cost in that phase, which the simulator prices as

* forward: ``a * AG(S) + copy(S / W) + k * copy(S / k) + (g + k t)``;
* backward: ``a * AG(S) + b * RS(S) + copy(S / W) + k * copy(S / k) +
  copy(S) + 2 (g + k t)`` (the all-gather again, the gradients' copy-in and
  reduce-scatter),

with ``S`` the group's bytes, ``AG``/``RS``/``copy`` the calibrated curves.
The four unknowns ``a - 1, b - 1, g, t`` are the non-negative least-squares solution
over both phases of every stack (every subset of unknowns tried, the best
feasible one kept), each equation divided by its measured slope (relative
errors: a stack of 8 MiB groups varies by milliseconds, one of 1 KiB groups
by tenths of one). Stacks of 1 KiB tensors fix ``g`` and ``t``; those of
2 and 8 MiB groups the factors.
"""

from __future__ import annotations

import gc
import itertools
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn

from execwrap.cost.curve import CollectiveCurve

__all__ = [
    "ROUNDS",
    "STACKS",
    "InStepCosts",
    "fit_in_step",
    "fsdp_fixed_costs",
    "nonnegative_least_squares",
]

#: ``(layers per group k, width d, group counts)`` of the synthetic stacks: groups
#: of 1 and 8 tensors of 1 KiB (16 x 16), of 1 and 8 tensors of 256 KiB
#: (256 x 256: 256 KiB and 2 MiB groups) and of 2 tensors of 4 MiB (8 MiB groups).
STACKS: tuple[tuple[int, int, tuple[int, ...]], ...] = (
    (1, 16, (4, 12, 24)),
    (8, 16, (4, 12, 24)),
    (1, 256, (4, 12, 24)),
    (8, 256, (2, 6, 12)),
    (2, 1024, (1, 2, 4)),
)
#: Interleaved rounds; the median round is used, as a training step's time is read
#: as the median of its steps.
ROUNDS = 15
#: Rows of a stack's input batch. (256 rows, so that the ranks arrive at the
#: collectives apart after some compute, as in a step, raised the factors to
#: 1.69x / 1.43x and lowered the fixed cost per group to 0.45 ms: per-block plans
#: were then predicted 9-16% too slow and always-wrap ones 22-30% too fast.)
_BATCH = 4


@dataclass(frozen=True)
class InStepCosts:
    """What :func:`fsdp_fixed_costs` measured (see the module docstring).

    Attributes:
        all_gather_factor: in-step all-gather time over the loop curve's (>= 1).
        reduce_scatter_factor: the same for reduce-scatters.
        group_overhead_s: seconds per group per collective.
        param_overhead_s: seconds per parameter tensor per collective.
        optimizer_param_overhead_s: ``AdamW.step`` seconds per DTensor parameter.
    """

    all_gather_factor: float
    reduce_scatter_factor: float
    group_overhead_s: float
    param_overhead_s: float
    optimizer_param_overhead_s: float


def fsdp_fixed_costs(
    group: dist.ProcessGroup,
    dev: torch.device,
    ag: CollectiveCurve,
    rs: CollectiveCurve,
    copy: CollectiveCurve,
) -> InStepCosts:
    """Measure (module docstring) the in-step factors and fixed costs.

    Args:
        group: the process group (every rank calls this).
        dev: the device FSDP2 runs on.
        ag: the all-gather curve (seconds by output bytes), from the loop sweep.
        rs: the reduce-scatter curve (seconds by input bytes), from the loop sweep.
        copy: seconds of a copy into a fresh buffer, by bytes.

    Returns:
        The :class:`InStepCosts` (rank 0's and every other rank's may differ;
        the caller broadcasts rank 0's).
    """
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    mesh = DeviceMesh.from_group(group, dev.type)
    world = dist.get_world_size(group)
    fns: dict[str, Callable[[], tuple[float, ...]]] = {}
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

    def slope(k: int, d: int, counts: Sequence[int], phase: int) -> float:
        """Seconds one more group adds to ``phase`` (0 forward, 1 backward)."""
        extra = [
            times[f"{k}/{d}/{n}/True"][phase] - times[f"{k}/{d}/{n}/False"][phase] for n in counts
        ]
        return statistics.linear_regression(list(counts), extra).slope

    slopes = {(k, d): (slope(k, d, c, 0), slope(k, d, c, 1)) for k, d, c in STACKS}
    a, b, per_group, per_tensor = fit_in_step(slopes, ag, rs, copy, world)
    k, _, counts = STACKS[1]
    opt = statistics.linear_regression(
        [k * n for n in counts], [times[f"opt {n}"][0] for n in counts]
    ).slope
    return InStepCosts(a, b, per_group, per_tensor, max(0.0, opt))


def fit_in_step(
    slopes: dict[tuple[int, int], tuple[float, float]],
    ag: CollectiveCurve,
    rs: CollectiveCurve,
    copy: CollectiveCurve,
    world: int,
) -> tuple[float, float, float, float]:
    """``(all_gather_factor, reduce_scatter_factor, group_overhead_s, param_overhead_s)``
    from one group's measured forward and backward seconds per stack (module docstring).

    Args:
        slopes: ``(k, d) -> (forward, backward)`` seconds one more group of ``k``
            ``d x d`` float32 layers adds to a step.
        ag, rs, copy: the loop curves (seconds by bytes).
        world: ranks.

    Returns:
        Factors ``>= 1`` and fixed costs ``>= 0`` (non-negative least squares of the
        relative errors).

    Slopes made from known values (copies free) give those values back:

    >>> ag = CollectiveCurve.from_samples([1024, 2**20], [1e-4, 1e-3])
    >>> rs, copy = ag.scaled(2.0), ag.scaled(1e-9)
    >>> def slope(k, d, a=1.5, b=1.2, g=2e-4, t=1e-5):
    ...     gather, scatter = a * ag.time(k * d * d * 4), b * rs.time(k * d * d * 4)
    ...     return (gather + g + k * t, gather + scatter + 2 * (g + k * t))
    >>> slopes = {(k, d): slope(k, d) for k, d in [(1, 16), (8, 16), (1, 256), (8, 256)]}
    >>> [round(v, 6) for v in fit_in_step(slopes, ag, rs, copy, 2)]
    [1.5, 1.2, 0.0002, 1e-05]
    """
    rows: list[list[float]] = []
    rhs: list[float] = []
    for (k, d), (fwd, bwd) in slopes.items():
        nbytes = k * d * d * 4  # one group's parameters, float32
        gather, scatter = ag.time(nbytes), rs.time(nbytes)
        copies = copy.time(nbytes // world) + k * copy.time(d * d * 4)  # copy-in, copy-out
        # the factors as 1 + a', 1 + b' with a', b' >= 0: a loop behind a barrier is a
        # collective's best case, noise only adds time
        for slope, row, fixed in (
            (fwd, [gather, 0.0, 1.0, float(k)], copies + gather),
            (bwd, [gather, scatter, 2.0, 2.0 * k], copies + copy.time(nbytes) + gather + scatter),
        ):
            weight = 1.0 / max(abs(slope), 1e-6)  # relative errors: noise grows with the time
            rows.append([v * weight for v in row])
            rhs.append((slope - fixed) * weight)
    a, b, per_group, per_tensor = nonnegative_least_squares(rows, rhs)
    return 1.0 + a, 1.0 + b, per_group, per_tensor


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
) -> tuple[Callable[[], tuple[float, ...]], Callable[[], tuple[float, ...]]]:
    """(forward and backward, ``AdamW.step``) of ``model`` on a ``_BATCH x width``
    batch, warmed up; each returns its phases' seconds."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(_BATCH, width, device=dev)

    def step() -> tuple[float, ...]:
        t0 = time.perf_counter()
        loss = model(x).sum()
        _sync(dev)
        t1 = time.perf_counter()
        loss.backward()
        _sync(dev)
        return (t1 - t0, time.perf_counter() - t1)

    def update() -> tuple[float, ...]:  # as a training step: the next backward makes fresh grads
        t0 = time.perf_counter()
        opt.step()
        _sync(dev)
        t1 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        return (t1 - t0,)

    step()
    update()
    return step, update


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _interleaved(
    fns: dict[str, Callable[[], tuple[float, ...]]],
    dev: torch.device,
    group: dist.ProcessGroup,
    *,
    rounds: int,
) -> dict[str, tuple[float, ...]]:
    """Median seconds of each phase of each function, run in rounds (each once per
    round, in the same order on every rank: they may issue collectives), a barrier
    before each run."""
    times: dict[str, list[tuple[float, ...]]] = {k: [] for k in fns}
    for _ in range(rounds):
        for k, fn in fns.items():
            dist.barrier(group=group)
            _sync(dev)
            times[k].append(fn())
    return {
        k: tuple(float(statistics.median(phase)) for phase in zip(*v, strict=True))
        for k, v in times.items()
    }
