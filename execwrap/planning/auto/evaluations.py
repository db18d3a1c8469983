"""The auto-planner's simulated candidates, each once, with checkpointing filled in to fit.

:class:`Evaluations` simulates a configuration (a grouping, a prefetch depth, the
groups' ``reshard_after_forward`` flags) under the current variant of the training
step (offload, gradient sync and resharding after backward: :attr:`Evaluations.step`)
and records it as a :class:`~execwrap.plan.search_record.Candidate`. Unless the
caller fixes the groups' checkpointing modes, it chooses them (:meth:`Evaluations.add`):

1. the configuration without checkpointing (the fastest: checkpointing only adds
   recomputation); if it fits the budget, or nothing may be checkpointed, done;
2. else, when it is not already slower than the fastest fitting candidate found
   (checkpointing could only make it slower still), the cheapest steps of
   :func:`~execwrap.planning.auto.checkpoint_fill.downgrade_steps` that free the
   bytes it is over by, simulated; again with more steps while over, at most
   :data:`FILL_ROUNDS` times: the simulator has the last word on the peak.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING

from execwrap.plan.search_record import Candidate, CandidateKind
from execwrap.planning.auto.checkpoint_fill import apply_steps, downgrade_steps, steps_to_free
from execwrap.util.text import plural

if TYPE_CHECKING:
    from execwrap.plan.training_step import TrainingStep
    from execwrap.planning.auto.space import Grouping, SearchSpace
    from execwrap.simulate import StepEstimate

__all__ = ["FILL_ROUNDS", "Evaluations", "Key"]

#: Simulations spent at most on choosing one configuration's checkpointing.
FILL_ROUNDS = 3

#: A candidate's identity: the step variant, grouping, prefetch, flags and the fixed
#: checkpointing modes (``None``: chosen to fit).
Key = tuple[
    tuple[str, str, bool],
    tuple[tuple[int, int], ...],
    int,
    tuple[bool, ...],
    tuple[str, ...] | None,
]


class Evaluations:
    """Simulated candidates, each once, in the order first asked for.

    Attributes:
        step: the training step variant candidates are simulated under (set by the
            search before each variant).
        candidates, estimates, keys: per candidate, its record, its estimate and its key.
        modes: per candidate, each group's checkpointing mode.
        steps: per candidate, the training step it was simulated with.
    """

    def __init__(self, space: SearchSpace, budget: int | None) -> None:
        self.space = space
        self.budget = budget
        self.step: TrainingStep = space.step
        self.candidates: list[Candidate] = []
        self.estimates: list[StepEstimate] = []
        self.keys: list[Key] = []
        self.modes: list[tuple[str, ...]] = []
        self.steps: list[TrainingStep] = []
        self._index: dict[Key, int] = {}
        self._fastest_fit = float("inf")

    def variant(self) -> tuple[str, str, bool]:
        """The current step variant: ``(offload, gradient_sync, reshard_after_backward)``."""
        s = self.step
        return (s.offload, s.gradient_sync, s.reshard_after_backward)

    def get(self, groups: Grouping, prefetch: int, flags: tuple[bool, ...]) -> Candidate:
        """The candidate already simulated for these choices (checkpointing chosen)."""
        return self.candidates[self._index[(self.variant(), groups, prefetch, flags, None)]]

    def add(
        self,
        groups: Grouping,
        prefetch: int,
        flags: tuple[bool, ...],
        kind: CandidateKind,
        *,
        label: str | None = None,
        modes: tuple[str, ...] | None = None,
    ) -> Candidate:
        """Simulate (once) and record; ``modes`` fixes each group's checkpointing, else it
        is chosen to fit (module docstring). A baseline's label and kind win over a
        searched duplicate's."""
        key: Key = (self.variant(), groups, prefetch, flags, modes)
        if key in self._index:
            i = self._index[key]
            if kind == "baseline" and label is not None:
                self.candidates[i] = dataclasses.replace(self.candidates[i], kind=kind, label=label)
            return self.candidates[i]
        estimate, chosen = self._evaluate(groups, prefetch, flags, modes)
        peak = int(estimate.peak_memory_bytes)
        s = self.step
        candidate = Candidate(
            label=label or candidate_label(groups, prefetch, flags, chosen, s),
            kind=kind,
            group_sizes=tuple(j - i for i, j in groups),
            prefetch=prefetch,
            reshard_after_forward=flags,
            step_time_s=float(estimate.step_time_s),
            peak_memory_bytes=peak,
            fits=self.budget is None or peak <= self.budget,
            checkpointing=chosen if any(m != "none" for m in chosen) else (),
            offload=s.offload,
            gradient_sync=s.gradient_sync,
            reshard_after_backward=s.reshard_after_backward,
        )
        if candidate.fits:
            self._fastest_fit = min(self._fastest_fit, candidate.step_time_s)
        self._index[key] = len(self.candidates)
        self.candidates.append(candidate)
        self.estimates.append(estimate)
        self.keys.append(key)
        self.modes.append(chosen)
        self.steps.append(s)
        return candidate

    def _evaluate(
        self,
        groups: Grouping,
        prefetch: int,
        flags: tuple[bool, ...],
        modes: tuple[str, ...] | None,
    ) -> tuple[StepEstimate, tuple[str, ...]]:
        """The estimate and the groups' modes (fixed, or chosen to fit)."""
        space, budget = self.space, self.budget
        if modes is not None:
            return space.simulate(groups, prefetch, flags, modes, self.step), modes
        chosen: tuple[str, ...] = ("none",) * len(groups)
        estimate = space.simulate(groups, prefetch, flags, None, self.step)
        cp = space.checkpointing
        if (
            budget is None
            or estimate.peak_memory_bytes <= budget
            or cp is None
            or not cp.searched
            or estimate.step_time_s >= self._fastest_fit
        ):
            return estimate, chosen
        steps = downgrade_steps(cp, groups)
        taken = 0
        for _ in range(FILL_ROUNDS):
            if not steps or taken >= len(steps):
                break
            taken = steps_to_free(steps, taken, estimate.peak_memory_bytes - budget)
            chosen = apply_steps(steps, taken, len(groups))
            estimate = space.simulate(groups, prefetch, flags, chosen, self.step)
            if estimate.peak_memory_bytes <= budget:
                break
        return estimate, chosen


def candidate_label(
    groups: Sequence[tuple[int, int]],
    prefetch: int,
    flags: Sequence[bool],
    modes: Sequence[str] = (),
    step: TrainingStep | None = None,
) -> str:
    """``"4 groups of 2 units, prefetch 1, no reshard: last 1; checkpointing: 3 full"``:
    the grouping, then what differs from FSDP2's defaults."""
    sizes = {j - i for i, j in groups}
    shape = plural(len(groups), "group")
    if len(sizes) == 1:  # all of one size: say which
        shape += f" of {plural(sizes.pop(), 'unit')}"
    kept = sum(1 for f in flags if not f)
    if kept == 0:
        reshard = ""
    elif kept == len(flags):
        reshard = ", no reshard"
    else:
        reshard = f", no reshard: last {kept}"
    text = f"{shape}, prefetch {prefetch}{reshard}"
    counts = {m: sum(1 for x in modes if x == m) for m in ("full", "selective")}
    if any(counts.values()):
        text += "; checkpointing: " + ", ".join(f"{n} {m}" for m, n in counts.items() if n)
    if step is not None:
        text += step_suffix(step)
    return text


def step_suffix(step: TrainingStep) -> str:
    """``"; sync on the last micro-batch; CPU offload"``: the step's settings that are not
    FSDP2's defaults (``""`` when none)."""
    parts = []
    if step.micro_batches > 1 and step.gradient_sync == "last":
        parts.append("sync on the last micro-batch")
    if step.micro_batches > 1 and not step.reshard_after_backward:
        parts.append("no reshard after backward")
    if step.offload == "cpu":
        parts.append("CPU offload")
    return "".join(f"; {p}" for p in parts)
