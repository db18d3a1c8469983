"""The auto-planner's activation checkpointing: what each mode of a group keeps and costs.

Per mergeable unit of the atomic plan (:class:`~execwrap.planning.auto.space.SearchSpace`),
:class:`GroupCheckpointing` holds what each checkpointing mode keeps from forward to
backward and the seconds it adds (from the atomic
:class:`~execwrap.simulate.UnitCompute`: ``activation_bytes``, ``checkpoint_bytes``,
``selective_bytes``, ``forward_s``, ``selective_saved_s``, and the host work of
``checkpoint_ops`` and ``checkpoint_regions`` in forward and recomputation, as
:func:`execwrap.simulate.unit_work.unit_work` reads them); a group's are the sums of
its units' (prefix sums). A group may be checkpointed when none of its units is inside
another non-root unit (the units :func:`execwrap.apply_checkpointing` checkpoints).

Choosing the modes of a grouping under a memory budget is a multiple-choice knapsack:
each group picks one mode, the bytes kept add up at the start of backward (when
every group's activations are alive), the recomputed seconds add up in time.
:func:`downgrade_steps` lists the steps of the greedy of that knapsack (Sinha and
Zoltners, "The multiple-choice knapsack problem", Operations Research 27(3), 1979):
per group, the modes on the lower convex hull of (bytes kept, seconds recomputed),
from ``"none"`` towards ``"full"``, each step freeing bytes at a cost in seconds;
all steps sorted by seconds per byte freed. Taking the cheapest steps until enough
bytes are freed is optimal for the relaxed problem (one step taken in part) and, for
groups alike (a transformer's blocks), takes the same mode on all but one group. The
group whose backward runs first (the last in forward) frees nothing at the peak: its
recomputation runs at once, while every activation is still alive; its steps come last.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from execwrap.cost import CheckpointOpCost
from execwrap.simulate import UnitCompute

__all__ = [
    "MODES",
    "DowngradeStep",
    "GroupCheckpointing",
    "apply_steps",
    "downgrade_steps",
    "steps_to_free",
]

#: Checkpointing modes, from the most memory kept to the least.
MODES: tuple[str, ...] = ("none", "selective", "full")


@dataclass(frozen=True)
class DowngradeStep:
    """One step of :func:`downgrade_steps`: group ``group`` from mode ``before`` to ``after``.

    Attributes:
        group: index of the group in the grouping.
        before: its mode before the step.
        after: its mode after the step (keeps less).
        freed_bytes: bytes kept from forward to backward that the step frees.
        added_s: forward seconds the step adds to the recomputation.
    """

    group: int
    before: str
    after: str
    freed_bytes: int
    added_s: float


@dataclass
class GroupCheckpointing:
    """Per mergeable unit: whether it may be checkpointed, and what each mode keeps and
    recomputes (see the module docstring).

    Attributes:
        allowed: per mergeable unit, whether it may be checkpointed.
        modes: the modes searched (``("none",)`` when the compute does not say what
            checkpointing keeps, or the planner does not choose checkpointing).
    """

    allowed: list[bool]
    modes: tuple[str, ...]
    _keep: dict[str, list[float]]
    _again: dict[str, list[float]]

    @classmethod
    def build(
        cls,
        compute: UnitCompute,
        movable: Sequence[int],
        allowed: Sequence[bool],
        search: bool,
        overhead: CheckpointOpCost | None = None,
    ) -> GroupCheckpointing:
        """From the atomic ``compute``, for the mergeable units ``movable`` (indices into
        it); ``search=False`` (or a compute without checkpointing facts) searches
        ``"none"`` only; ``overhead``: checkpointing's host work (``None``: none)."""
        known = bool(compute.checkpoint_bytes) and bool(compute.selective_bytes)
        known = known and bool(compute.selective_saved_s)
        modes = MODES if (search and known and any(allowed)) else ("none",)
        cost = overhead or CheckpointOpCost()
        keep: dict[str, list[float]] = {}
        again: dict[str, list[float]] = {}
        for mode in modes:
            kept, seconds = [], []
            for i in movable:
                if mode == "none":
                    kept.append(compute.activation_bytes[i])
                    seconds.append(0.0)
                else:
                    full = mode == "full"
                    kept.append((compute.checkpoint_bytes if full else compute.selective_bytes)[i])
                    rerun = compute.forward_s[i]
                    if not full:
                        rerun = max(0.0, rerun - compute.selective_saved_s[i])
                    ops, regions = compute.checkpoint_ops[i], compute.checkpoint_regions[i]
                    seconds.append(
                        rerun
                        + cost.forward_s(mode, ops=ops, regions=regions)
                        + cost.recompute_s(mode, ops=ops, regions=regions)
                    )
            keep[mode], again[mode] = _prefix(kept), _prefix(seconds)
        return cls(list(allowed), modes, keep, again)

    @property
    def searched(self) -> bool:
        """Whether any mode but ``"none"`` is searched."""
        return len(self.modes) > 1

    def may_checkpoint(self, i: int, j: int) -> bool:
        """Whether group ``[i, j)`` of mergeable units may be checkpointed."""
        return self.searched and all(self.allowed[i:j])

    def kept(self, i: int, j: int, mode: str) -> int:
        """Bytes group ``[i, j)`` keeps from forward to backward under ``mode``."""
        p = self._keep[mode]
        return int(round(p[j] - p[i]))

    def recompute_s(self, i: int, j: int, mode: str) -> float:
        """Seconds ``mode`` adds to group ``[i, j)``: the forward it runs again before its
        backward, and checkpointing's host work in forward and recomputation."""
        p = self._again[mode]
        return p[j] - p[i]

    def group_modes(self, i: int, j: int) -> tuple[str, ...]:
        """The modes group ``[i, j)`` may take."""
        return self.modes if self.may_checkpoint(i, j) else ("none",)

    def median_price(self, mode: str) -> float:
        """Seconds recomputed per byte freed by ``mode`` for the median checkpointable
        unit (the price of a byte at which such a unit switches to ``mode``; ``0`` when
        nothing is freed)."""
        prices = []
        for u, ok in enumerate(self.allowed):
            freed = self.kept(u, u + 1, "none") - self.kept(u, u + 1, mode)
            if ok and freed > 0:
                prices.append(self.recompute_s(u, u + 1, mode) / freed)
        prices.sort()
        return prices[len(prices) // 2] if prices else 0.0


def downgrade_steps(
    cp: GroupCheckpointing, groups: Sequence[tuple[int, int]]
) -> list[DowngradeStep]:
    """The greedy's steps for ``groups`` (see the module docstring), cheapest per byte
    first: ties go to the earlier group, the last group's steps come last.

    Example:
        >>> c = UnitCompute((1.0, 1.0, 1.0), (2.0, 2.0, 2.0), (100, 100, 100),
        ...                 checkpoint_bytes=(10, 10, 10), selective_bytes=(40, 40, 40),
        ...                 selective_saved_s=(0.5, 0.5, 0.5))
        >>> cp = GroupCheckpointing.build(c, [0, 1, 2], [True] * 3, search=True)
        >>> [(s.group, s.before, s.after, s.freed_bytes) for s in
        ...  downgrade_steps(cp, [(0, 1), (1, 2), (2, 3)])][:3]
        [(0, 'none', 'selective', 60), (1, 'none', 'selective', 60), (0, 'selective', 'full', 30)]
    """
    steps: list[tuple[tuple[bool, float, int, int], DowngradeStep]] = []
    last = len(groups) - 1
    for g, (i, j) in enumerate(groups):
        hull = _hull([(m, cp.kept(i, j, m), cp.recompute_s(i, j, m)) for m in cp.group_modes(i, j)])
        for k, ((before, b0, t0), (after, b1, t1)) in enumerate(zip(hull, hull[1:], strict=False)):
            step = DowngradeStep(g, before, after, b0 - b1, t1 - t0)
            price = float(f"{(t1 - t0) / (b0 - b1):.9g}")  # alike groups tie, float noise aside
            steps.append(((g == last, price, g, k), step))
    steps.sort(key=lambda s: s[0])
    return [s for _, s in steps]


def steps_to_free(steps: Sequence[DowngradeStep], start: int, deficit: float) -> int:
    """How many of ``steps`` (from index ``start``) to take to free at least ``deficit``
    bytes (all of them when they free less), at least one; a group's steps stay in order."""
    freed = 0.0
    k = start
    while k < len(steps) and freed < deficit:
        freed += steps[k].freed_bytes
        k += 1
    return max(k, min(start + 1, len(steps)))


def apply_steps(steps: Sequence[DowngradeStep], count: int, num_groups: int) -> tuple[str, ...]:
    """The mode of each of ``num_groups`` groups after the first ``count`` steps."""
    modes = ["none"] * num_groups
    for s in steps[:count]:
        modes[s.group] = s.after
    return tuple(modes)


def _hull(points: list[tuple[str, int, float]]) -> list[tuple[str, int, float]]:
    """The modes on the lower convex hull of (bytes kept, seconds), from the most bytes
    kept to the least: each step frees bytes at a rising price per byte; a mode that
    frees nothing or costs more than one freeing more is left out."""
    pts = sorted(points, key=lambda p: (-p[1], p[2]))
    hull: list[tuple[str, int, float]] = []
    for p in pts:
        if hull and p[1] >= hull[-1][1]:
            continue  # frees nothing over the mode before it
        while len(hull) >= 2 and _price(hull[-2], hull[-1]) >= _price(hull[-1], p):
            hull.pop()
        hull.append(p)
    return hull


def _price(a: tuple[str, int, float], b: tuple[str, int, float]) -> float:
    """Seconds per byte freed going from ``a`` to ``b``."""
    return (b[2] - a[2]) / (a[1] - b[1])


def _prefix(values: Sequence[float]) -> list[float]:
    out = [0.0]
    for v in values:
        out.append(out[-1] + v)
    return out
