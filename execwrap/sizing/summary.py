"""The answer of ``execwrap fit`` as ``(key, value)`` rows: :func:`summary_rows`.

The terminal table and the HTML page show the same rows: whether it fits, the plan's
choices, its predicted speed, and the memory per rank at the peak by category.
"""

from __future__ import annotations

from execwrap.plan.estimate import MEMORY_CATEGORIES
from execwrap.plan.wrap_plan import WrapPlan
from execwrap.sizing.result import FitResult
from execwrap.util.formatting import format_bytes

__all__ = ["memory_rows", "parameter_count", "plan_rows", "summary_rows"]


def parameter_count(n: int) -> str:
    """A parameter count as people say it: ``"8.03 B"``, ``"124.44 M"``, ``"26.78 k"``, ``"512"``.

    >>> parameter_count(8_030_261_248), parameter_count(26_784), parameter_count(512)
    ('8.03 B', '26.78 k', '512')
    """
    for div, unit in ((10**9, "B"), (10**6, "M"), (10**3, "k")):
        if n >= div:
            return f"{n / div:.2f} {unit}"
    return str(n)


def summary_rows(result: FitResult) -> list[tuple[str, str]]:
    """Every row of the answer: the question, the verdict, the plan, speed and memory."""
    budget = format_bytes(result.memory_budget)
    rows = [
        ("model", f"{result.model}, {parameter_count(result.parameters)} parameters"),
        ("cluster", f"{result.cluster.name}: {result.cluster.description}"),
        (
            "step",
            f"{result.micro_batch} x {result.sequence_length} tokens per GPU, {result.precision}",
        ),
    ]
    if result.plan is None or result.peak_memory_bytes is None:
        rows.append(("fits", f"no: no plan within {budget} per GPU"))
    else:
        peak = format_bytes(result.peak_memory_bytes)
        verdict = "yes" if result.fits else "no"
        rows.append(("fits", f"{verdict}: peak {peak} of {budget} per GPU"))
        rows += plan_rows(result.plan, given=result.given_plan)
        assert result.step_time_s is not None and result.tokens_per_s_per_gpu is not None
        rows.append(("step time", f"{result.step_time_s:.3f} s (predicted)"))
        rows.append(("tokens/s/GPU", f"{result.tokens_per_s_per_gpu:,.0f} (predicted)"))
    largest = result.largest_micro_batch
    rows.append(("largest micro-batch", str(largest) if largest else "none: not even 1 fits"))
    return rows


def plan_rows(plan: WrapPlan, *, given: bool = False) -> list[tuple[str, str]]:
    """The plan's choices: its label, groups, prefetch, resharding, checkpointing, offload."""
    label = plan.search.best.label if plan.search is not None else "the given plan"
    modes = plan.checkpoint_modes()
    counts = [f"{modes.count(m)} {m}" for m in ("full", "selective", "none") if m in modes]
    kept = ["+".join(plan.units[i].module_fqns) or "(root)" for i in plan.kept_unsharded()]
    training = plan.training
    return [
        ("plan" + (" (given)" if given else ""), label),
        ("groups", f"{len(plan.units)} (the root included)"),
        ("prefetch", str(plan.prefetch if plan.prefetch is not None else 1)),
        ("not resharded after forward", ", ".join(kept) or "none"),
        ("checkpointing per group", ", ".join(counts)),
        ("offload", training.offload if training is not None else "none"),
    ]


def memory_rows(result: FitResult) -> list[tuple[str, str]]:
    """The memory per GPU at the plan's peak, by category (FSDPMemTracker's names)."""
    memory = result.memory
    if memory is None:
        return []
    parts = memory.to_dict()
    rows = [(MEMORY_CATEGORIES[k], format_bytes(v)) for k, v in parts.items() if k != "total" and v]
    return [*rows, ("total", format_bytes(parts["total"]))]
