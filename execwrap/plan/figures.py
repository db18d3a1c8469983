"""A plan's headline figures, computed once: :func:`plan_figures`.

Every place that shows a plan's numbers reads them from here, so they never
disagree: the terminal summary of ``execwrap report``, the HTML page's
summary, ``report.json``'s ``"figures"``, ``execwrap show`` and
:meth:`execwrap.WrapPlan.summary`.

The figures are taken at the settings the plan will run with: an auto plan
(``plan_wrap(..., bucket_numel="auto")``) at its own prefetch depth and
per-group ``reshard_after_forward`` (all-gathers as the simulator counts them,
:attr:`~execwrap.simulate.StepEstimate.all_gathers`; the peak of unsharded
parameters with its flags); any other plan at the prefetch depth asked for,
every group but the root resharded after forward (FSDP2's default).

Notes are told apart by what they mean for the run (:func:`note_severity`):
warnings (a plan that will be refused, run out of memory, or shard nothing
per block) come before the rest wherever notes are listed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

from execwrap.plan.stats import chosen_collectives, plan_stats
from execwrap.util.formatting import format_bytes, format_numel

__all__ = [
    "WARNING_MARKERS",
    "PlanFigures",
    "note_severity",
    "notes_by_severity",
    "plan_figures",
    "plan_summary",
]

#: Text that marks a note as a WARNING: each is part of one note that changes
#: whether or how the plan runs (see the functions named).
WARNING_MARKERS: tuple[str, ...] = (
    " chose no module of ",  # planning.planner.root_only_note: one unit, the model
    "FSDP1 and FSDP2 refuse to shard scalar parameters",  # plan.notes.scalar_param_notes
    " mixes requires_grad=True ",  # plan.notes.mixed_requires_grad_notes
    "this step would run out of memory",  # cost.device_memory.overshoot_message
)


def note_severity(note: str) -> Literal["warning", "info"]:
    """``"warning"`` for a note that changes whether or how the plan runs
    (:data:`WARNING_MARKERS`), else ``"info"``."""
    return "warning" if any(m in note for m in WARNING_MARKERS) else "info"


def notes_by_severity(notes: Sequence[str]) -> list[tuple[str, str]]:
    """``(severity, note)`` pairs, warnings first, each kind in its own order."""
    tagged: list[tuple[str, str]] = [(note_severity(n), n) for n in notes]
    return [t for t in tagged if t[0] == "warning"] + [t for t in tagged if t[0] == "info"]


@dataclass(frozen=True)
class PlanFigures:
    """The numbers a plan is summarised by (see the module docstring).

    Attributes:
        groups: FSDP groups (``plan.units``: ``fully_shard`` calls, FSDP1 units), the
            root's included.
        policy_units: the init policy's units before merging (``plan.atomic_units``).
        prefetch: the prefetch depth the figures are for.
        chosen: whether they are an auto plan's own choices.
        kept_unsharded: labels of the groups besides the root that are not
            resharded after forward.
        all_gathers_per_step: parameter all-gathers in one step.
        reduce_scatters_per_step: gradient reduce-scatters in one step.
        peak_unsharded_bytes: peak of unsharded parameter bytes in the step.
        step_time_s: the predicted step time, seconds (``None``: no estimate).
        peak_memory_bytes: the predicted peak memory per rank, bytes (``None``: no estimate).
        world_size: ranks the estimate is for (``None``: no estimate).
        memory_budget: the auto plan's budget per rank, bytes (``None``: none).
        warnings: notes that are warnings (:func:`note_severity`).
        infos: the other notes.
    """

    groups: int
    policy_units: int
    prefetch: int
    chosen: bool
    kept_unsharded: tuple[str, ...]
    all_gathers_per_step: int
    reduce_scatters_per_step: int
    peak_unsharded_bytes: int
    step_time_s: float | None
    peak_memory_bytes: int | None
    world_size: int | None
    memory_budget: int | None
    warnings: int
    infos: int

    @property
    def settings(self) -> str:
        """The prefetch depth and resharding the figures are for, e.g.
        ``"prefetch 1 (chosen), 1 group besides the root not resharded after forward"``."""
        head = f"prefetch {self.prefetch}{' (chosen)' if self.chosen else ''}"
        kept = len(self.kept_unsharded)
        if kept == 0:
            return f"{head}, every group but the root resharded after forward"
        return (
            f"{head}, {kept} group{'' if kept == 1 else 's'} besides the root not resharded "
            "after forward"
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (``report.json``'s ``"figures"``)."""
        data = asdict(self)
        data["kept_unsharded"] = list(self.kept_unsharded)
        return data


def plan_figures(plan: Any, prefetch: int = 1) -> PlanFigures:
    """The figures of ``plan`` (see the module docstring).

    Args:
        plan: the :class:`~execwrap.plan.wrap_plan.WrapPlan` (not imported here: the
            plan's own :meth:`summary` reads this module).
        prefetch: the prefetch depth for a plan that did not choose one (an auto
            plan's own depth wins).

    Raises:
        TypeError, ValueError: ``prefetch`` is not an int ``>= 0``.
    """
    stats = plan_stats(plan, prefetch)
    chosen = chosen_collectives(plan)
    if chosen is not None:
        assert plan.prefetch is not None
        prefetch, (gathers, peak) = plan.prefetch, chosen
        kept = tuple(plan.units[i].label for i in plan.kept_unsharded())
    else:
        gathers, peak, kept = stats.all_gathers_per_step, stats.peak_unsharded_bytes, ()
    estimate, search = plan.estimate, plan.search
    severities = [note_severity(n) for n in plan.notes]
    return PlanFigures(
        groups=len(plan.units),
        policy_units=len(plan.atomic_units or plan.units),
        prefetch=prefetch,
        chosen=chosen is not None,
        kept_unsharded=kept,
        all_gathers_per_step=int(gathers),
        reduce_scatters_per_step=stats.reduce_scatters_per_step,
        peak_unsharded_bytes=int(peak),
        step_time_s=None if estimate is None else float(estimate.step_time_s),
        peak_memory_bytes=None if estimate is None else int(estimate.peak_memory_bytes),
        world_size=None if estimate is None else int(estimate.world_size),
        memory_budget=None if search is None else search.memory_budget,
        warnings=severities.count("warning"),
        infos=severities.count("info"),
    )


def plan_summary(plan: Any, prefetch: int = 1) -> str:
    """A few lines on ``plan`` (:meth:`execwrap.WrapPlan.summary`): its groups, the
    prefetch depth and resharding, collectives and the unsharded peak per step, the
    predicted step and peak memory, the training step it carries, and the notes
    (warnings first)."""
    f = plan_figures(plan, prefetch)
    model = plan.order.module_classes.get("", "") or "a model"
    if plan.search is not None:
        bucket = "auto"
    else:
        bucket = "none" if plan.bucket_numel is None else format_numel(plan.bucket_numel)
    lines = [
        f"WrapPlan of {model}: {f.groups} FSDP group{'' if f.groups == 1 else 's'} from "
        f"{f.policy_units} policy unit{'' if f.policy_units == 1 else 's'} (policy "
        f"{plan.policy_name or '-'}, bucket size {bucket})",
        f"  {f.settings}",
        f"  per step: {f.all_gathers_per_step} all-gathers, {f.reduce_scatters_per_step} "
        f"reduce-scatters, peak unsharded parameters {format_bytes(f.peak_unsharded_bytes)}",
    ]
    if f.step_time_s is not None and f.peak_memory_bytes is not None:
        budget = "" if f.memory_budget is None else f", budget {format_bytes(f.memory_budget)}"
        lines.append(
            f"  predicted: step {f.step_time_s * 1e3:.3f} ms, peak "
            f"{format_bytes(f.peak_memory_bytes)} per rank on {f.world_size} ranks{budget}"
        )
    if plan.training is not None:
        modes = plan.checkpoint_modes()
        counts = [f"{modes.count(m)} {m}" for m in ("full", "selective") if m in modes]
        checkpointed = ", ".join(counts) if counts else "none"
        lines.append(
            f"  training step: {plan.training.describe()}; groups checkpointed: {checkpointed}"
        )
    notes = f.warnings + f.infos
    if notes:
        first = notes_by_severity(list(plan.notes))[0]
        lines.append(
            f"  {notes} note{'' if notes == 1 else 's'} ({f.warnings} warning"
            f"{'' if f.warnings == 1 else 's'}) in plan.notes; first: {_cut(first[1], 100)}"
        )
    return "\n".join(lines)


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"
