"""What the auto-planner tried: :class:`Candidate` plans and the :class:`PlanSearch` record.

A plan made with ``plan_wrap(..., bucket_numel="auto")`` carries a
:class:`PlanSearch` (``plan.search``): every candidate the search simulated
(its grouping, prefetch depth and ``reshard_after_forward`` choice, with the
predicted step time and peak memory), the baselines it was compared with,
the memory budget and which candidate was chosen. The report draws it as the
candidates chart (predicted step time against peak memory). Plain data, JSON
round trip through :meth:`PlanSearch.to_dict` / :meth:`PlanSearch.from_dict`.
With ``mesh="auto"`` it also lists every shard group size considered
(:class:`MeshCandidate`) and why the chosen one won.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["Candidate", "CandidateKind", "MeshCandidate", "PlanSearch", "candidate_label"]

#: ``"searched"``: made by the search; ``"baseline"``: a fixed plan it was compared with.
CandidateKind = Literal["searched", "baseline"]
_KINDS: tuple[str, ...] = ("searched", "baseline")


#: Up to this many groups a label lists every group's size.
_LISTED_SIZES = 6


def candidate_label(
    group_sizes: Sequence[int], prefetch: int, reshard_after_forward: Sequence[bool]
) -> str:
    """A searched candidate's label, from its settings alone: the root group (never
    resharded after forward, FSDP2's default), the groups the search made, the
    prefetch depth, which of those groups are not resharded after forward, and the
    groups' sizes in atomic units (in execution order: each size up to
    :data:`_LISTED_SIZES` groups, else runs of one size). Distinct settings give
    distinct labels.

    >>> candidate_label((2, 2), 1, (True, True))
    'root + 2 groups of 2 units, prefetch 1'
    >>> candidate_label((3, 2, 2, 1), 2, (True, False, True, True))
    'root + 4 groups, prefetch 2, no reshard: group 2 (units per group: 3, 2, 2, 1)'
    >>> candidate_label((1,) * 8, 0, (True,) * 6 + (False, False))
    'root + 8 groups of 1 unit, prefetch 0, no reshard: last 2'
    >>> candidate_label((8,) * 8 + (4, 4), 1, (False,) * 10)
    'root + 10 groups, prefetch 1, no reshard (units per group: 8 groups of 8, then 2 of 4)'
    """
    n = len(group_sizes)
    runs: list[list[int]] = []
    for size in group_sizes:
        if runs and runs[-1][0] == size:
            runs[-1][1] += 1
        else:
            runs.append([size, 1])
    kept = [i for i, flag in enumerate(reshard_after_forward) if not flag]
    if not kept:
        reshard = ""
    elif len(kept) == n:
        reshard = ", no reshard"
    elif kept == list(range(n - len(kept), n)):
        reshard = f", no reshard: last {len(kept)}"
    else:
        which = ", ".join(str(i + 1) for i in kept)
        reshard = f", no reshard: group{'s' if len(kept) > 1 else ''} {which}"
    groups = f"root + {n} group{'' if n == 1 else 's'}"
    if len(runs) == 1:
        size = runs[0][0]
        return f"{groups} of {size} unit{'' if size == 1 else 's'}, prefetch {prefetch}{reshard}"
    if n <= _LISTED_SIZES:
        sizes = ", ".join(str(s) for s in group_sizes)
    else:
        (first_size, first_count), *rest = runs
        sizes = f"{first_count} groups of {first_size}" if first_count > 1 else f"1 of {first_size}"
        sizes += "".join(f", then {c} of {s}" for s, c in rest)
    return f"{groups}, prefetch {prefetch}{reshard} (units per group: {sizes})"


@dataclass(frozen=True)
class Candidate:
    """One simulated plan: a grouping with a prefetch depth and reshard choice.

    Attributes:
        label: short readable name: a searched candidate's is
            :func:`candidate_label` of its settings (``"root + 4 groups of 3
            units, prefetch 1"``, ``"root + 3 groups, prefetch 2, no reshard (units per
            group: 2, 3, 3)"``), a baseline's names it (``"per-unit, prefetch 0"``).
        kind: ``"searched"`` or ``"baseline"``.
        group_sizes: atomic units per group, in execution order, over the
            groups the search may merge (the root and units without
            parameters, which always stay alone, are not listed).
        prefetch: prefetch depth (groups ahead, forward and backward).
        reshard_after_forward: one flag per group of ``group_sizes``.
        step_time_s: predicted step time, seconds.
        peak_memory_bytes: predicted peak memory per rank, bytes.
        fits: whether the peak is within the search's memory budget
            (always ``True`` without a budget).
        checkpointing: each group's activation checkpointing (``"none"``,
            ``"selective"``, ``"full"``), one per entry of ``group_sizes``; empty:
            none anywhere (and candidates saved before the training step was searched).
        offload: ``"none"`` or ``"cpu"`` (FSDP2's ``CPUOffloadPolicy``).
        gradient_sync: ``"every"`` or ``"last"`` micro-batch reduce-scatters.
        reshard_after_backward: whether micro-batches before the last reshard after
            their backward.
    """

    label: str
    kind: CandidateKind
    group_sizes: tuple[int, ...]
    prefetch: int
    reshard_after_forward: tuple[bool, ...]
    step_time_s: float
    peak_memory_bytes: int
    fits: bool
    checkpointing: tuple[str, ...] = ()
    offload: str = "none"
    gradient_sync: str = "every"
    reshard_after_backward: bool = True

    def __post_init__(self) -> None:
        if self.kind not in _KINDS:
            raise ValueError(f"Candidate.kind must be one of {_KINDS}, got {self.kind!r}")

    def checkpointed(self) -> int:
        """Groups with activation checkpointing (``"full"`` or ``"selective"``)."""
        return sum(1 for m in self.checkpointing if m != "none")

    @property
    def num_groups(self) -> int:
        """Groups the search may merge (the root and parameterless units excluded)."""
        return len(self.group_sizes)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (tuples as lists)."""
        return {
            "label": self.label,
            "kind": self.kind,
            "group_sizes": list(self.group_sizes),
            "prefetch": self.prefetch,
            "reshard_after_forward": list(self.reshard_after_forward),
            "step_time_s": self.step_time_s,
            "peak_memory_bytes": self.peak_memory_bytes,
            "fits": self.fits,
            "checkpointing": list(self.checkpointing),
            "offload": self.offload,
            "gradient_sync": self.gradient_sync,
            "reshard_after_backward": self.reshard_after_backward,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Candidate:
        """Inverse of :meth:`to_dict`."""
        return cls(
            label=str(data["label"]),
            kind=data["kind"],
            group_sizes=tuple(int(s) for s in data["group_sizes"]),
            prefetch=int(data["prefetch"]),
            reshard_after_forward=tuple(bool(r) for r in data["reshard_after_forward"]),
            step_time_s=float(data["step_time_s"]),
            peak_memory_bytes=int(data["peak_memory_bytes"]),
            fits=bool(data["fits"]),
            checkpointing=tuple(str(m) for m in data.get("checkpointing", ())),
            offload=str(data.get("offload", "none")),
            gradient_sync=str(data.get("gradient_sync", "every")),
            reshard_after_backward=bool(data.get("reshard_after_backward", True)),
        )


@dataclass(frozen=True)
class MeshCandidate:
    """One mesh shape the auto-planner considered (``plan_wrap(..., mesh="auto")``).

    Attributes:
        shard: ranks a parameter is sharded over (the shard group's size).
        replicate: replicas (``1``: FSDP over every data-parallel rank).
        status: ``"searched"`` (the search ran for it), ``"probed"`` (the chosen
            shape's plan and the least-memory plan simulated for it only) or
            ``"skipped"`` (no plan can fit it, or the cost model cannot price it).
        step_time_s: the best predicted step time found for it (``inf``: none).
        peak_memory_bytes: that plan's peak per rank (the least memory any plan
            needs for a skipped shape; ``0``: unknown).
        fits: whether that plan is within the budget.
        note: why it was probed or skipped, in words.
    """

    shard: int
    replicate: int
    status: str
    step_time_s: float
    peak_memory_bytes: int
    fits: bool
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (``step_time_s`` ``null`` for ``inf``)."""
        return {
            "shard": self.shard,
            "replicate": self.replicate,
            "status": self.status,
            "step_time_s": None if math.isinf(self.step_time_s) else self.step_time_s,
            "peak_memory_bytes": self.peak_memory_bytes,
            "fits": self.fits,
            "note": self.note,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MeshCandidate:
        """Inverse of :meth:`to_dict`."""
        step = data.get("step_time_s")
        return cls(
            int(data["shard"]),
            int(data["replicate"]),
            str(data["status"]),
            math.inf if step is None else float(step),
            int(data["peak_memory_bytes"]),
            bool(data["fits"]),
            str(data.get("note", "")),
        )


@dataclass(frozen=True)
class PlanSearch:
    """The auto-planner's record: what it compared and what it chose.

    Attributes:
        candidates: every simulated candidate once, in the order the search
            simulated them; the baselines (``kind="baseline"``) among them.
        chosen: index into :attr:`candidates` of the plan returned.
        memory_budget: the peak memory budget per rank in bytes, or ``None``.
        world_size: ranks the plan was made for.
        cost_model: one line naming the cost model (device, backend, source).
        seconds: wall time of the search, seconds.
        meshes: with ``mesh="auto"``: every shard group size considered
            (:class:`MeshCandidate`); the candidates above are the chosen shape's.
        mesh_reason: why the chosen shard group size, in one sentence.
    """

    candidates: tuple[Candidate, ...]
    chosen: int
    memory_budget: int | None
    world_size: int
    cost_model: str
    seconds: float = 0.0
    meshes: tuple[MeshCandidate, ...] = ()
    mesh_reason: str = ""

    def __post_init__(self) -> None:
        if self.memory_budget is not None and self.memory_budget <= 0:
            raise ValueError(
                f"PlanSearch.memory_budget must be > 0 bytes per rank or None (no limit), got "
                f"{self.memory_budget}"
            )
        if self.world_size < 1:
            raise ValueError(f"PlanSearch.world_size must be >= 1 ranks, got {self.world_size}")
        if not 0 <= self.chosen < len(self.candidates):
            raise ValueError(
                f"PlanSearch.chosen = {self.chosen} is not an index into its "
                f"{len(self.candidates)} candidate(s)"
            )

    @property
    def best(self) -> Candidate:
        """The chosen candidate."""
        return self.candidates[self.chosen]

    def baselines(self) -> list[Candidate]:
        """The baseline candidates, in order."""
        return [c for c in self.candidates if c.kind == "baseline"]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {
            "candidates": [c.to_dict() for c in self.candidates],
            "chosen": self.chosen,
            "memory_budget": self.memory_budget,
            "world_size": self.world_size,
            "cost_model": self.cost_model,
            "seconds": self.seconds,
            **(
                {}
                if not self.meshes
                else {
                    "meshes": [m.to_dict() for m in self.meshes],
                    "mesh_reason": self.mesh_reason,
                }
            ),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PlanSearch:
        """Inverse of :meth:`to_dict`.

        Raises:
            ValueError: ``data`` is malformed.
        """
        try:
            budget = data.get("memory_budget")
            return cls(
                candidates=tuple(Candidate.from_dict(c) for c in data["candidates"]),
                chosen=int(data["chosen"]),
                memory_budget=None if budget is None else int(budget),
                world_size=int(data["world_size"]),
                cost_model=str(data.get("cost_model", "")),
                seconds=float(data.get("seconds", 0.0)),
                meshes=tuple(MeshCandidate.from_dict(m) for m in data.get("meshes", [])),
                mesh_reason=str(data.get("mesh_reason", "")),
            )
        except (KeyError, TypeError) as e:
            raise ValueError(f"malformed PlanSearch dict: {e!r}") from e
