"""What the auto-planner tried: :class:`Candidate` plans and the :class:`PlanSearch` record.

A plan made with ``plan_wrap(..., bucket_numel="auto")`` carries a
:class:`PlanSearch` (``plan.search``): every candidate the search simulated
(its grouping, prefetch depth and ``reshard_after_forward`` choice, with the
predicted step time and peak memory), the baselines it was compared with,
the memory budget and which candidate was chosen. The report draws it as the
candidates chart (predicted step time against peak memory). Plain data, JSON
round trip through :meth:`PlanSearch.to_dict` / :meth:`PlanSearch.from_dict`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["Candidate", "CandidateKind", "PlanSearch"]

#: ``"searched"``: made by the search; ``"baseline"``: a fixed plan it was compared with.
CandidateKind = Literal["searched", "baseline"]
_KINDS: tuple[str, ...] = ("searched", "baseline")


@dataclass(frozen=True)
class Candidate:
    """One simulated plan: a grouping with a prefetch depth and reshard choice.

    Attributes:
        label: short readable name, e.g. ``"4 groups of 3 units, prefetch 1"`` or
            ``"per-block"`` for a baseline.
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
    """

    candidates: tuple[Candidate, ...]
    chosen: int
    memory_budget: int | None
    world_size: int
    cost_model: str
    seconds: float = 0.0

    def __post_init__(self) -> None:
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
            )
        except (KeyError, TypeError) as e:
            raise ValueError(f"malformed PlanSearch dict: {e!r}") from e
