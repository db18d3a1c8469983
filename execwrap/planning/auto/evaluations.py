"""The auto-planner's simulated candidates, each once, with checkpointing filled in to fit.

:class:`Evaluations` simulates a configuration (a grouping, a prefetch depth, the
groups' ``reshard_after_forward`` flags and checkpointing modes) under the current
variant of the training step (offload, gradient sync and resharding after backward:
:attr:`Evaluations.step`) and records it as a
:class:`~execwrap.plan.search_record.Candidate`. The search simulates configurations
without checkpointing (the fastest: checkpointing only adds recomputation); then
:meth:`Evaluations.fill` gives checkpointing to those over the budget, fastest first:

1. a configuration no faster than the fastest fitting candidate found is left alone
   (checkpointing could only make it slower still), and so is every one after it;
   so is one over the budget by more than checkpointing all of it would free (the
   peak drops by at most the bytes no longer kept);
2. else the cheapest steps of
   :func:`~execwrap.planning.auto.checkpoint_fill.downgrade_steps` that free the
   bytes it is over by are simulated; again with more steps while over, at most
   :data:`FILL_ROUNDS` times: the simulator has the last word on the peak. The
   result is a candidate of its own.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING

from execwrap.plan.search_record import Candidate, CandidateKind, candidate_label
from execwrap.planning.auto.checkpoint_fill import apply_steps, downgrade_steps, steps_to_free

if TYPE_CHECKING:
    from execwrap.plan.training_step import TrainingStep
    from execwrap.planning.auto.space import Grouping, SearchSpace
    from execwrap.simulate import StepEstimate

__all__ = ["FILL_ROUNDS", "Evaluations", "Key", "joint_label", "rank_key", "step_suffix"]

#: Simulations spent at most on choosing one configuration's checkpointing.
FILL_ROUNDS = 3

#: A candidate's identity: the step variant, grouping, prefetch, flags and the groups'
#: checkpointing modes.
Key = tuple[
    tuple[str, str, bool],
    tuple[tuple[int, int], ...],
    int,
    tuple[bool, ...],
    tuple[str, ...],
]


class Evaluations:
    """Simulated candidates, each once, in the order first asked for.

    Attributes:
        step: the training step variant candidates are simulated under (set by the
            search before each variant).
        candidates, estimates, keys: per candidate, its record, its estimate and its key.
        steps: per candidate, the training step it was simulated with.
    """

    def __init__(self, space: SearchSpace, budget: int | None) -> None:
        self.space = space
        self.budget = budget
        self.step: TrainingStep = space.step
        self.candidates: list[Candidate] = []
        self.estimates: list[StepEstimate] = []
        self.keys: list[Key] = []
        self.steps: list[TrainingStep] = []
        self._index: dict[Key, int] = {}
        self._filled: set[int] = set()
        self._filled_from: dict[int, list[int]] = {}
        self._fastest_fit = float("inf")

    def variant(self) -> tuple[str, str, bool]:
        """The current step variant: ``(offload, gradient_sync, reshard_after_backward)``."""
        s = self.step
        return (s.offload, s.gradient_sync, s.reshard_after_backward)

    def best_of(self, groups: Grouping, prefetch: int, flags: tuple[bool, ...]) -> Candidate:
        """Of the candidates simulated for this configuration under the current variant
        (without checkpointing, and with what :meth:`fill` gave it), the best: fitting
        ones by time, then the others by peak."""
        plain = self._index[(self.variant(), groups, prefetch, flags, ("none",) * len(groups))]
        found = [plain, *(i for i in self._filled_from.get(plain, ()))]
        return min((self.candidates[i] for i in found), key=rank_key)

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
        """Simulate (once) and record ``groups`` checkpointed as ``modes`` (default: none).
        A baseline's label and kind win over a searched duplicate's."""
        modes = modes or ("none",) * len(groups)
        key: Key = (self.variant(), groups, prefetch, flags, modes)
        if key in self._index:
            i = self._index[key]
            if kind == "baseline" and label is not None:
                self.candidates[i] = dataclasses.replace(self.candidates[i], kind=kind, label=label)
            return self.candidates[i]
        estimate = self.space.simulate(groups, prefetch, flags, modes, self.step)
        return self._record(key, estimate, kind, label)

    def _record(
        self, key: Key, estimate: StepEstimate, kind: CandidateKind, label: str | None
    ) -> Candidate:
        _, groups, prefetch, flags, modes = key
        peak = int(estimate.peak_memory_bytes)
        s = self.step
        candidate = Candidate(
            label=label or joint_label(groups, prefetch, flags, modes, s),
            kind=kind,
            group_sizes=tuple(j - i for i, j in groups),
            prefetch=prefetch,
            reshard_after_forward=flags,
            step_time_s=float(estimate.step_time_s),
            peak_memory_bytes=peak,
            fits=self.budget is None or peak <= self.budget,
            checkpointing=modes if any(m != "none" for m in modes) else (),
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
        self.steps.append(s)
        return candidate

    def fill(self) -> None:
        """Checkpointing for the candidates without it that are over the budget, fastest
        first, under the current variant (module docstring)."""
        cp = self.space.checkpointing
        if self.budget is None or cp is None or not cp.searched:
            return
        variant = self.variant()
        waiting = sorted(
            (
                i
                for i, (c, k) in enumerate(zip(self.candidates, self.keys, strict=True))
                if not c.fits
                and i not in self._filled
                and k[0] == variant
                and all(m == "none" for m in k[4])
            ),
            key=lambda i: (self.candidates[i].step_time_s, i),
        )
        for i in waiting:
            if self.candidates[i].step_time_s >= self._fastest_fit:
                break
            self._filled.add(i)
            self._filled_from.setdefault(i, []).extend(self._fill_one(i))

    def _fill_one(self, i: int) -> list[int]:
        """Candidates of configuration ``i`` with checkpointing, until one fits."""
        _, groups, prefetch, flags, _ = self.keys[i]
        assert self.space.checkpointing is not None and self.budget is not None
        steps = downgrade_steps(self.space.checkpointing, groups)
        peak = self.candidates[i].peak_memory_bytes
        if peak - sum(s.freed_bytes for s in steps) > self.budget:
            return []  # the peak cannot drop by more than the bytes checkpointing frees
        taken = 0
        made: list[int] = []
        for _ in range(FILL_ROUNDS):
            if not steps or taken >= len(steps):
                break
            taken = steps_to_free(steps, taken, peak - self.budget)
            modes = apply_steps(steps, taken, len(groups))
            c = self.add(groups, prefetch, flags, "searched", modes=modes)
            made.append(self._index[(self.variant(), groups, prefetch, flags, modes)])
            peak = c.peak_memory_bytes
            if c.fits:
                break
        return made


def rank_key(c: Candidate) -> tuple[int, float]:
    """Fitting candidates by step time, before the others by peak."""
    return (0, c.step_time_s) if c.fits else (1, float(c.peak_memory_bytes))


def joint_label(
    groups: Sequence[tuple[int, int]],
    prefetch: int,
    flags: Sequence[bool],
    modes: Sequence[str] = (),
    step: TrainingStep | None = None,
) -> str:
    """``"root + 4 groups of 2 units, prefetch 1, no reshard: last 1; checkpointing: 3
    full"``: :func:`~execwrap.plan.search_record.candidate_label` of the grouping, then
    what of the training step differs from FSDP2's defaults."""
    text = candidate_label([j - i for i, j in groups], prefetch, flags)
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
