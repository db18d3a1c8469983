"""``execwrap show FILE``: print a saved order and its plan (a report, a bare order, or a
plan file of :func:`execwrap.save_plan` / ``execwrap fit --out``)."""

from __future__ import annotations

from typing import Any

from execwrap.cli.errors import EXIT_OK
from execwrap.cli.options import ShowOptions
from execwrap.cli.saved import SavedReport, call_label, load_saved
from execwrap.cli.text import echo, one_line
from execwrap.plan.figures import notes_by_severity, plan_figures
from execwrap.plan.wrap_plan import WrapPlan
from execwrap.util.formatting import format_bytes

__all__ = ["run_show"]


def run_show(options: ShowOptions) -> int:
    """Print the order (forward calls with their units, gradient order, tied
    parameters), then the plan (units, stats, notes); for a plan file, how to use it.
    Returns 0.

    Raises:
        CLIError: the file is not a readable execwrap report, order or plan file.
    """
    saved = load_saved(options.path)
    _print_order(options.file, saved)
    if saved.plan is None:
        echo()
        echo("no plan (a bare order)")
    else:
        _print_plan(saved.plan, saved.plan_stats)
    if saved.pinned:
        echo()
        echo(
            f"to price this plan: execwrap fit MODEL --plan {options.file}; to train with it: "
            f"execwrap.load_plan({options.file!r}, model) (checked against the model)"
        )
    return EXIT_OK


def _print_order(file: str, saved: SavedReport) -> None:
    order, plan = saved.order, saved.plan
    classes = order.module_classes
    kind = "a plan file (execwrap.save_plan, execwrap fit --out) for " if saved.pinned else ""
    echo(
        f"{file}: {kind}{classes.get('', 'model')}, captured {order.method} "
        f"(torch {order.torch_version})"
    )
    if order.fallback_reason:
        echo(f"fallback reason: {one_line(order.fallback_reason)}")
    echo()
    echo(f"forward order ({len(order.module_forward_order)} calls):")
    width = len(str(max(len(order.module_forward_order) - 1, 0)))
    for i, fqn in enumerate(order.module_forward_order):
        unit = ""
        if plan is not None:
            index = plan.unit_of_module(fqn)
            unit = f"  [unit {'-' if index is None else index}]"
        echo(f"  {i:>{width}}  {call_label(fqn)}  ({classes.get(fqn, '?')}){unit}")
    if order.param_backward_order:
        echo()
        echo(f"backward gradient order ({len(order.param_backward_order)} parameters):")
        for i, fqn in enumerate(order.param_backward_order):
            echo(f"  {i:>{width}}  {fqn}")
    if order.shared_params:
        echo()
        echo("tied parameters:")
        for canonical, aliases in order.shared_params.items():
            echo(f"  {canonical} = {', '.join(aliases)}")


def _print_plan(plan: WrapPlan, stats: dict[str, Any] | None) -> None:
    if plan.search is not None:
        bucket = "auto"
    else:
        bucket = "-" if plan.bucket_numel is None else f"{plan.bucket_numel} elements"
    echo()
    echo(f"plan: policy {plan.policy_name or '-'}, bucket size {bucket}")
    fig = plan_figures(plan, stats["prefetch"] if stats is not None else 1)
    if fig.chosen and fig.step_time_s is not None and fig.peak_memory_bytes is not None:
        budget = "" if fig.memory_budget is None else f" (budget {format_bytes(fig.memory_budget)})"
        echo(
            f"auto plan: {fig.settings}, predicted step {fig.step_time_s * 1e3:.3f} ms, peak "
            f"{format_bytes(fig.peak_memory_bytes)} per rank on {fig.world_size} ranks{budget}"
        )
    if plan.training is not None:
        echo(f"training step: {plan.training.describe()}")
    modes = plan.checkpoint_modes()
    for i, unit in enumerate(plan.units):
        mods = ", ".join(call_label(m) for m in unit.module_fqns)
        calls = (
            "never called" if unit.first_use is None else f"calls {unit.first_use}..{unit.last_use}"
        )
        checkpointed = "" if modes[i] == "none" else f", {modes[i]} checkpointing"
        echo(
            f"  unit {i}: {mods}  ({len(unit.param_fqns)} parameters, {unit.numel} elements, "
            f"{format_bytes(unit.bytes)}, {calls}{checkpointed})"
        )
    # the figures `execwrap report` prints, the HTML shows and report.json holds
    echo(
        f"figures ({fig.settings}): {fig.groups} groups, {fig.all_gathers_per_step} "
        f"all-gathers/step, {fig.reduce_scatters_per_step} reduce-scatters/step, peak "
        f"unsharded {format_bytes(fig.peak_unsharded_bytes)}"
    )
    for severity, note in notes_by_severity(list(plan.notes)):
        echo(f"{severity}: {note}")
