"""``execwrap report``: capture, plan, compare with baselines, write, summarise.

:func:`run_report` takes the checked :class:`~execwrap.cli.options.ReportOptions`
and runs the steps in order: build the model, build the example inputs, make
the tracing config and the policy, capture the order (symbolic first, falling
back to one real forward/backward with the inputs), plan it and its
baselines, write the report files, print the summary table. A failing step is
one :class:`~execwrap.cli.errors.CLIError` line that says which step failed
and how to fix it.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import torch.nn as nn

import execwrap.planning.planner as planning  # plan_wrap is looked up at call time (tests replace it)
from execwrap.cli.errors import EXIT_OK, CLIError
from execwrap.cli.inputs import build_inputs
from execwrap.cli.loading import baseline_policies, load_model, parse_policy, tracing_config
from execwrap.cli.options import ReportOptions
from execwrap.cli.report_out import report_refusal
from execwrap.cli.summary import print_notes, summary_rows
from execwrap.cli.text import echo, exc_line, print_table, shorten
from execwrap.errors import ExecwrapError, PlanForAnotherModelError
from execwrap.plan.wrap_plan import WrapPlan
from execwrap.report.ownership import ForeignFilesError
from execwrap.report.writer import write_report
from tracing import ExecutionOrder, TracingConfig, TracingError, capture_execution_order
from tracing.fqn import module_phrase
from tracing.symbolic import check_concrete_args

__all__ = ["run_report"]

logger = logging.getLogger(__name__)

#: ``(args, kwargs)`` of one forward, or ``None`` for symbolic capture only.
_Example = tuple[tuple[Any, ...], dict[str, Any]] | None


def run_report(options: ReportOptions) -> int:
    """Capture, plan and write the report of ``options``; print the summary. Returns 0.

    Raises:
        CLIError: a step failed (the model, the inputs, the tracer or policy,
            capture, planning, or writing the files).
    """
    logger.info("building the model %s on %s", options.model_path, options.device)
    model = load_model(options.model_path, options.device)
    try:
        check_concrete_args(model, options.concrete_args)
    except ValueError as exc:
        raise CLIError(f"--concrete-arg: {str(exc).removeprefix('concrete_args: ')}") from None
    if options.plan_file is not None:
        _load_plan_file(model, None, options)  # a file for another model: before any capture
    example = _example_inputs(options, model)
    config = tracing_config(options.tracer_path, options.concrete_args)
    init_policy = parse_policy(options.policy.text, model)
    t0 = time.perf_counter()
    logger.info(
        "capturing the execution order of %s (%s)",
        type(model).__name__,
        "symbolic trace, inputs " + str(options.input_text) if example else "symbolic trace",
    )
    order = _capture(model, config, example, options)
    logger.info(
        "captured %d module calls, %d parameters (%s) in %.2f s",
        len(order.module_forward_order),
        len(order.params),
        order.method,
        time.perf_counter() - t0,
    )
    device_memory = None
    if options.bucket_numel == "auto":  # the auto-planner weighs compute too
        from execwrap.cli.auto_plan import load_cost_model, timed_order

        cost_model = load_cost_model(str(options.cost_model), options.world_size)
        device_memory = cost_model.device_memory_bytes
        order = timed_order(
            model, order, example, cost_model, lambda: load_model(options.model_path, "meta")
        )
    capture_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    logger.info(
        "planning with policy %s, bucket size %s", options.policy.text, options.bucket_numel
    )
    plan, baselines = _plan(model, order, init_policy, options)
    logger.info(
        "planned %d groups and %d baseline(s) in %.2f s%s",
        len(plan.units),
        len(baselines),
        time.perf_counter() - t1,
        "" if plan.search is None else f" ({len(plan.search.candidates)} candidates simulated)",
    )
    t2 = time.perf_counter()
    paths = _write(model, plan, baselines, options)
    logger.info(
        "wrote %s in %.2f s", ", ".join(str(p) for p in paths.values()), time.perf_counter() - t2
    )
    rows = summary_rows(model, order, capture_s, plan, baselines, options, device_memory)
    print_table(rows + [(key, str(path)) for key, path in paths.items()])
    print_notes(plan, "html" in paths)
    if "html" in paths:
        echo(f"open {paths['html']} in a browser to see the charts and tables")
    return EXIT_OK


def _example_inputs(options: ReportOptions, model: nn.Module) -> _Example:
    if options.items is None:
        return None
    try:
        return build_inputs(options.items, model, options.device)
    except ValueError as exc:
        raise CLIError(f"--input: {exc}") from None


def _capture(
    model: nn.Module, config: TracingConfig, example: _Example, options: ReportOptions
) -> ExecutionOrder:
    try:
        return capture_execution_order(
            model,
            tracing_config=config,
            example_inputs=example[0] if example else None,
            example_kwargs=example[1] if example else None,
        )
    except TracingError as exc:
        message = _tracing_error_message(exc, has_input=example is not None, device=options.device)
        raise CLIError(message) from exc
    except Exception as exc:  # the model itself failed on these inputs
        where = _error_module(exc)
        raise CLIError(
            f"capture failed: running {type(model).__name__} on --input {options.input_text!r} "
            f"raised {exc_line(exc)}{f' (in {where})' if where else ''}"
        ) from exc


def _plan(
    model: nn.Module, order: ExecutionOrder, init_policy: Any, options: ReportOptions
) -> tuple[WrapPlan, dict[str, WrapPlan]]:
    """The plan, and the baselines to compare it with (see :func:`_baselines`)."""
    if options.bucket_numel == "auto":  # the auto-planner and the cost model's estimates
        from execwrap.cli.auto_plan import estimate_baselines, plan_auto

        plan, cm = plan_auto(model, order, init_policy, options)
        try:
            baselines = _baselines(model, order, init_policy, options)
            baselines = estimate_baselines(baselines, cm, options.world_size, options.prefetch)
        except (TypeError, ValueError, ExecwrapError) as exc:
            raise CLIError(f"planning the baselines failed: {shorten(exc, 240)}") from exc
        return plan, baselines
    if options.plan_file is not None:
        return _load_plan_file(model, order, options), _baselines(
            model, order, init_policy, options
        )
    try:
        plan = planning.plan_wrap(model, order, init_policy, bucket_numel=options.bucket_numel)
        baselines = _baselines(model, order, init_policy, options)
    except (TypeError, ValueError, ExecwrapError) as exc:
        raise CLIError(f"planning failed: {shorten(exc, 240)}") from exc
    return plan, baselines


def _load_plan_file(
    model: nn.Module, order: ExecutionOrder | None, options: ReportOptions
) -> WrapPlan:
    """The ``--plan`` file's plan for ``model`` (on ``order``; ``None``: the model's tables)."""
    from execwrap.planning.plan_file import load_plan_file

    assert options.plan_file is not None
    try:
        return load_plan_file(options.plan_file, model, order=order)
    except PlanForAnotherModelError as exc:
        raise CLIError(
            f"--plan {options.plan_file} {shorten(exc.finding, 300)}. Run execwrap report "
            "without --plan to plan this model, or pass the --model the plan was made for"
        ) from exc
    except ValueError as exc:  # the file's own message names it, and the rule
        raise CLIError(f"--plan: {shorten(exc, 400)}") from exc


def _baselines(
    model: nn.Module, order: ExecutionOrder, init_policy: Any, options: ReportOptions
) -> dict[str, WrapPlan]:
    """Plans of the same order with the :func:`~execwrap.cli.loading.baseline_policies`."""
    policies = baseline_policies(options.policy.text, init_policy, options.bucket_numel)
    return {name: planning.plan_wrap(model, order, policy) for name, policy in policies.items()}


def _write(
    model: nn.Module, plan: WrapPlan, baselines: dict[str, WrapPlan], options: ReportOptions
) -> dict[str, Path]:
    title = f"execwrap report: {type(model).__name__} ({options.model_path})"
    try:
        return write_report(
            plan,
            options.out_dir,
            options.formats,
            prefetch=options.prefetch,
            baselines=baselines,
            title=title,
        )
    except ForeignFilesError as exc:  # written there since the options were checked
        raise CLIError(report_refusal(options.out_dir, exc.names, exc.changed)) from exc
    except OSError as exc:
        raise CLIError(f"--out {str(options.out_dir)!r}: cannot write the report: {exc}") from exc


def _tracing_error_message(exc: Any, *, has_input: bool, device: str) -> str:
    """One CLI line for a :class:`tracing.TracingError`: where capture failed,
    the first line of why, and the command-line options that fix it."""
    fqn = getattr(exc, "module_fqn", None)
    cls = getattr(exc, "module_class", None)
    where = ""
    if fqn is not None:
        where = f" in {module_phrase(shorten(fqn, 60))}" + (f" ({cls})" if cls else "")
    reason = getattr(exc, "reason", None) or exc_line(exc)
    if has_input:  # runtime capture itself failed (e.g. value-dependent code on meta)
        cause = exc.__cause__
        what = exc_line(cause, 140) if cause is not None else shorten(reason, 140)
        if device == "meta":
            return (
                f"capture failed: running on the meta device failed{where}: {what}; code "
                "that depends on tensor values needs --device cpu (with small --input tensors)"
            )
        return f"capture failed{where}: {what}"
    return (
        f"capture failed: symbolic tracing failed{where}: {shorten(reason, 100)}; pass "
        "--input SPEC to capture at run time, --concrete-arg NAME=VALUE or --tracer "
        "PKG.MODULE:CLASS"
    )


def _error_module(exc: BaseException) -> str | None:
    """The ``module 'fqn' (Class)`` that runtime capture's note names, if any."""
    prefix = "While recording the execution order, in "
    for note in getattr(exc, "__notes__", None) or ():
        if isinstance(note, str) and note.startswith(prefix):
            return shorten(note[len(prefix) :], 80)
    return None
