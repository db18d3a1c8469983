"""The step variants the joint auto-planner tries beside the default step: the other
accumulation modes of several micro-batches, and CPU offload where the budget binds
(step 4 of :mod:`execwrap.planning.auto.search`).

Each variant simulates the best configurations of the default step again
(:data:`VARIANT_TOP` of them), once its least-memory configuration fits.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING

from execwrap.planning.auto.evaluations import Evaluations, rank_key, step_suffix
from execwrap.planning.auto.least import LEAST_PREFETCH, may_offload

if TYPE_CHECKING:
    from execwrap.plan.search_record import Candidate
    from execwrap.plan.training_step import TrainingStep
    from execwrap.planning.auto.options import AutoOptions
    from execwrap.planning.auto.space import Grouping, SearchSpace

__all__ = ["ACCUMULATION_MODES", "VARIANT_TOP", "fastest_fit", "other_variants"]

logger = logging.getLogger(__name__)

#: Configurations of the default step simulated again under each other step variant.
VARIANT_TOP = 6
#: Accumulation modes of several micro-batches: ``(gradient_sync,
#: reshard_after_backward)``, FSDP2's default first.
ACCUMULATION_MODES: tuple[tuple[str, bool], ...] = (
    ("every", True),
    ("last", True),
    ("every", False),
    ("last", False),
)


def _least_memory(space: SearchSpace, evaluated: Evaluations) -> Candidate:
    """The least-memory configuration under the current variant
    (:mod:`~execwrap.planning.auto.least`: per-unit groups at prefetch 0, resharding,
    every unit it may checkpoint fully checkpointed; offload is a variant of its own)."""
    m = space.size
    per_unit = tuple((i, i + 1) for i in range(m))
    cp = space.checkpointing
    full = tuple(
        "full" if cp is not None and cp.may_checkpoint(i, j) else "none" for i, j in per_unit
    )
    label = "per-unit, prefetch 0" + (", full checkpointing" if "full" in full else "")
    label += step_suffix(evaluated.step)
    return evaluated.add(per_unit, LEAST_PREFETCH, (True,) * m, "baseline", label=label, modes=full)


def other_variants(space: SearchSpace, evaluated: Evaluations, options: AutoOptions) -> None:
    """Step 4 of the module docstring: the best configurations of the default step
    under each other accumulation mode, then with CPU offload where it may help."""
    base = evaluated.step
    order = sorted(
        range(len(evaluated.candidates)), key=lambda i: rank_key(evaluated.candidates[i])
    )
    top: list[tuple[Grouping, int, tuple[bool, ...]]] = []
    for i in order:
        _, groups, p, flags, _ = evaluated.keys[i]
        if (groups, p, flags) not in top:
            top.append((groups, p, flags))
        if len(top) == VARIANT_TOP:
            break
    steps = [base]
    if "accumulation" in options.choose and base.micro_batches > 1:
        steps += [
            dataclasses.replace(base, gradient_sync=s, reshard_after_backward=r)
            for s, r in ACCUMULATION_MODES[1:]
        ]
    for step in steps[1:]:
        _try_variant(space, evaluated, step, top)
    if "offload" in options.choose and may_offload(space.cost_model) and _budget_binds(evaluated):
        best = fastest_fit(evaluated)
        start = evaluated.steps[best] if best is not None else base
        _try_variant(space, evaluated, dataclasses.replace(start, offload="cpu"), top)
    evaluated.step = base


def _try_variant(
    space: SearchSpace,
    evaluated: Evaluations,
    step: TrainingStep,
    top: list[tuple[Grouping, int, tuple[bool, ...]]],
) -> None:
    """Simulate ``top`` under ``step`` when its least-memory configuration fits."""
    evaluated.step = step
    if not _least_memory(space, evaluated).fits:
        logger.debug("auto-plan: %s: nothing fits", step.describe())
        return
    for groups, p, flags in top:
        evaluated.add(groups, p, flags, "searched")
    evaluated.fill()


def fastest_fit(evaluated: Evaluations) -> int | None:
    """The index of the fastest fitting candidate (ties: less memory, fewer groups, first
    simulated), ``None`` when none fits."""
    cands = evaluated.candidates
    fitting = [i for i, c in enumerate(cands) if c.fits]
    if not fitting:
        return None
    return min(
        fitting,
        key=lambda i: (cands[i].step_time_s, cands[i].peak_memory_bytes, cands[i].num_groups, i),
    )


def _budget_binds(evaluated: Evaluations) -> bool:
    """Whether more memory could make the step faster: nothing fits, a faster candidate
    does not fit, or the fastest fitting one checkpoints."""
    best = fastest_fit(evaluated)
    if evaluated.budget is None:
        return False
    if best is None:
        return True
    chosen = evaluated.candidates[best]
    return chosen.checkpointed() > 0 or any(
        not c.fits and c.step_time_s < chosen.step_time_s for c in evaluated.candidates
    )
