"""What ``execwrap fit`` answers: :class:`FitResult`.

Plain data, JSON-ready through :meth:`FitResult.to_dict` (``execwrap fit --json``): whether
the step fits, the fastest plan that fits with its predicted step time, throughput and
memory per rank, and the largest micro-batch that fits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from execwrap.plan.estimate import MemoryBreakdown
from execwrap.plan.wrap_plan import WrapPlan
from execwrap.sizing.cluster import Cluster

__all__ = ["FIT_SCHEMA_VERSION", "FitResult"]

#: Version of :meth:`FitResult.to_dict`'s layout.
FIT_SCHEMA_VERSION = 1


@dataclass(frozen=True)
class FitResult:
    """Whether a training step fits a cluster, and how fast its best plan runs.

    Attributes:
        model: the model's name (its class, and where it came from).
        parameters: parameter elements of the model.
        cluster: the cluster the step was sized for.
        sequence_length: tokens per sequence.
        micro_batch: sequences per rank per step.
        precision: the precision's name (``"bf16"``) or description.
        memory_budget: bytes per rank the plan had to stay within.
        fits: whether some plan's predicted peak is within ``memory_budget``.
        plan: the fastest plan that fits (``None`` when none does): its groups,
            ``prefetch``, ``reshard_after_forward``, ``training`` (checkpointing per unit,
            offload) and ``estimate``.
        largest_micro_batch: the largest micro-batch for which some plan fits (0: not
            even one sequence).
        tried: each micro-batch tried for ``largest_micro_batch``, with the predicted peak
            in bytes per rank of its least-memory plan.
        reason: why nothing fits (the planner's message, naming what dominates), or
            ``None``.
        source: how the model was given, for the recipes: ``{"kind": "transformers",
            "config": path or model id}`` or ``{"kind": "factory", "factory":
            "module:function"}`` or ``{"kind": "module"}``.
        given_plan: the plan was given (``--plan``) and priced, not searched.
    """

    model: str
    parameters: int
    cluster: Cluster
    sequence_length: int
    micro_batch: int
    precision: str
    memory_budget: int
    fits: bool
    plan: WrapPlan | None
    largest_micro_batch: int
    tried: tuple[tuple[int, int], ...]
    reason: str | None = None
    source: dict[str, str] | None = None
    given_plan: bool = False

    @property
    def step_time_s(self) -> float | None:
        """The predicted seconds of one training step of the plan (``None``: nothing fits)."""
        return (
            None
            if self.plan is None or self.plan.estimate is None
            else self.plan.estimate.step_time_s
        )

    @property
    def tokens_per_s_per_gpu(self) -> float | None:
        """The predicted tokens per second per GPU, ``micro_batch x sequence_length /
        step_time_s`` (each rank trains its own micro-batch)."""
        step = self.step_time_s
        return None if step is None else self.micro_batch * self.sequence_length / step

    @property
    def peak_memory_bytes(self) -> int | None:
        """The predicted peak bytes per rank of the plan."""
        return (
            None
            if self.plan is None or self.plan.estimate is None
            else int(self.plan.estimate.peak_memory_bytes)
        )

    @property
    def memory(self) -> MemoryBreakdown | None:
        """The plan's memory per rank at its peak, by category."""
        return (
            None if self.plan is None or self.plan.estimate is None else self.plan.estimate.memory
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (``execwrap fit --json``; the plan as its settings, not its order)."""
        return {
            "kind": "execwrap-fit",
            "schema_version": FIT_SCHEMA_VERSION,
            "model": self.model,
            "parameters": self.parameters,
            "cluster": self.cluster.to_dict(),
            "sequence_length": self.sequence_length,
            "micro_batch": self.micro_batch,
            "precision": self.precision,
            "memory_budget": self.memory_budget,
            "fits": self.fits,
            "reason": self.reason,
            "step_time_s": self.step_time_s,
            "tokens_per_s_per_gpu": self.tokens_per_s_per_gpu,
            "peak_memory_bytes": self.peak_memory_bytes,
            "memory": None if self.memory is None else self.memory.to_dict(),
            "plan": None if self.plan is None else plan_settings(self.plan),
            "given_plan": self.given_plan,
            "largest_micro_batch": self.largest_micro_batch,
            "tried": [list(t) for t in self.tried],
            "source": self.source,
        }


def plan_settings(plan: WrapPlan) -> dict[str, Any]:
    """A plan's choices as JSON: groups (module FQNs), prefetch, resharding per group,
    checkpointing per group, the training step and the search's label."""
    training = plan.training
    modes = list(plan.checkpoint_modes()) if training is not None else ["none"] * len(plan.units)
    flags = plan.reshard_after_forward
    return {
        "label": plan.search.best.label if plan.search is not None else None,
        "groups": [list(u.module_fqns) for u in plan.units],
        "prefetch": plan.prefetch,
        "reshard_after_forward": None if flags is None else [bool(f) for f in flags],
        "checkpointing": modes,
        "training": None if training is None else training.to_dict(),
    }
