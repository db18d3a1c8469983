"""Pinned plans: the plan a job trained with, saved beside its checkpoint and read back.

A restarted job can plan again (a new calibration, a new budget, a new world
size give another grouping) or keep the plan it started with. :func:`save_plan`
writes a :class:`~execwrap.plan.wrap_plan.WrapPlan` with its order to ``plan.json``
(atomically: a temp file renamed, so a job killed while saving leaves the old
file or the new one, never half of one); :func:`load_plan` reads it back,
byte for byte the same plan (``save_plan(load_plan(p))`` writes the same bytes),
and checks it against the model it is for (:func:`check_plan_fits`: the first
module or parameter that differs is named). :func:`plan_changes` says what a
re-planned job changed against the pinned plan, in lines a log can hold.

Layout of ``plan.json``: ``{"kind": "execwrap-pinned-plan", "version": 1,
"plan": WrapPlan.to_dict(), "order": ExecutionOrder.to_dict()}`` (the order's
and the plan's own layouts and checks; ``tracing.ExecutionOrder.load`` reads
the order of such a file as it reads a report's).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import torch.nn as nn

from execwrap.errors import PlanForAnotherModelError
from execwrap.plan.compare import compare_plans
from execwrap.plan.wrap_plan import WrapPlan
from tracing.atomic import atomic_write_text
from tracing.fqn import quoted
from tracing.order import ExecutionOrder, param_infos
from tracing.order_fields import parse_json

__all__ = [
    "plan_json",
    "is_pinned_dict",
    "plan_from_pinned_dict",
    "PINNED_KIND",
    "PINNED_VERSION",
    "PLAN_FILE",
    "check_pinned_options",
    "check_plan_fits",
    "load_plan",
    "plan_changes",
    "plan_path",
    "save_plan",
]

logger = logging.getLogger(__name__)

#: The file name of a pinned plan inside a checkpoint folder.
PLAN_FILE = "plan.json"
#: ``"kind"`` of a pinned-plan file.
PINNED_KIND = "execwrap-pinned-plan"
#: Layout version of a pinned-plan file.
PINNED_VERSION = 1


def plan_path(path: str | os.PathLike[str]) -> Path:
    """``path`` itself when it names a ``.json`` file, else ``path / "plan.json"``
    (a checkpoint folder)."""
    path = Path(path)
    return path if path.suffix == ".json" else path / PLAN_FILE


def plan_json(plan: WrapPlan) -> str:
    """The text :func:`save_plan` writes for ``plan``: its plan and order, as JSON."""
    document = {
        "kind": PINNED_KIND,
        "version": PINNED_VERSION,
        "plan": plan.to_dict(),
        "order": plan.order.to_dict(),
    }
    return json.dumps(document, indent=1)


def save_plan(plan: WrapPlan, path: str | os.PathLike[str], *, overwrite: bool = False) -> Path:
    """Write ``plan`` and its order to ``path`` (a ``.json`` file, or a checkpoint
    folder: ``<folder>/plan.json``), atomically.

    Args:
        plan: the plan the job trains with.
        path: the file, or the folder to write ``plan.json`` in (created if needed).
        overwrite: replace the file when it exists already (``False``: refuse, so
            that neither a saved plan nor a file of the user's is lost silently).

    Returns:
        The file written.

    Raises:
        TypeError: ``plan`` is not a :class:`WrapPlan`.
        FileExistsError: the file exists and ``overwrite`` is false (the message names
            it, says whether it holds a saved plan, and the fix); nothing is written.
        IsADirectoryError: the ``.json`` path is a folder.
        OSError: the file cannot be written.

    Example:
        >>> save_plan(plan, "checkpoints/step-1000")  # doctest: +SKIP
        PosixPath('checkpoints/step-1000/plan.json')
    """
    if not isinstance(plan, WrapPlan):
        raise TypeError(f"save_plan: plan must be a WrapPlan, got {type(plan).__name__}")
    target = plan_path(path)
    check_plan_target(target, "save_plan", overwrite, " or a checkpoint folder")
    atomic_write_text(target, plan_json(plan))
    logger.debug("save_plan: %d groups to %s", len(plan.units), target)
    return target


def check_plan_target(target: Path, caller: str, overwrite: bool, folder_hint: str = "") -> None:
    """Refuse ``target`` as a new plan file: a folder, or a file there already (unless
    ``overwrite``). The messages name ``caller``, the path, what is there and the fix.

    Raises:
        IsADirectoryError: ``target`` is a folder.
        FileExistsError: ``target`` exists and ``overwrite`` is false.
    """
    if target.is_dir():
        raise IsADirectoryError(
            f"{caller}: {target} is a folder; pass the path of a .json file{folder_hint}"
        )
    if overwrite or not os.path.lexists(target):
        return
    try:
        data = json.loads(target.read_text(encoding="utf-8"))
        saved = is_pinned_dict(data) or (isinstance(data, dict) and "execwrap_plan_file" in data)
    except (OSError, ValueError):
        saved = False
    what = "holds a plan saved before" if saved else "exists and is not a plan execwrap saved"
    raise FileExistsError(
        f"{caller}: {target} {what}; save to another path, or pass overwrite=True to replace it"
    )


def load_plan(path: str | os.PathLike[str], model: nn.Module | None = None) -> WrapPlan:
    """Read a plan written by :func:`save_plan`, checked field by field and, when
    ``model`` is given, against it (:func:`check_plan_fits`).

    Args:
        path: the file, or the checkpoint folder holding ``plan.json``.
        model: the unwrapped model the plan is for.

    Returns:
        The plan, with its order (the same bytes again through :func:`save_plan`).

    Raises:
        FileNotFoundError: no such file, or no ``plan.json`` in the folder (the message
            names it).
        ValueError: not a pinned plan, another layout version, a malformed
            field (naming the file and the field), or a plan for another model
            (naming the first module or parameter that differs).
        PlanError: the plan fails its own check against ``model``.
    """
    source = plan_path(path)
    if not source.is_file() and source == Path(path):  # a file named, not a folder
        raise FileNotFoundError(
            f"load_plan: no such file: {source} (save_plan(plan, {str(source)!r}) writes one)"
        )
    if not source.is_file():
        raise FileNotFoundError(
            f"load_plan: no pinned plan at {source} (save_checkpoint(..., plan=plan) or "
            "save_plan(plan, folder) writes one)"
        )
    data = parse_json(source.read_text(encoding="utf-8"), str(source))
    return plan_from_pinned_dict(data, model, source=str(source))


def is_pinned_dict(data: Any) -> bool:
    """Whether a parsed JSON object is a pinned plan (:func:`save_plan`'s layout)."""
    return isinstance(data, dict) and data.get("kind") == PINNED_KIND


def plan_from_pinned_dict(
    data: Any, model: nn.Module | None = None, *, source: str = "<dict>"
) -> WrapPlan:
    """:func:`load_plan` of an already parsed JSON object (``source`` names it in errors).

    Raises:
        ValueError, PlanError: as :func:`load_plan`.
    """
    if not is_pinned_dict(data):
        raise ValueError(
            f'{source}: not a pinned execwrap plan (no "kind": {PINNED_KIND!r}); write one '
            "with execwrap.save_plan"
        )
    if data.get("version") != PINNED_VERSION:
        raise ValueError(
            f"{source}: pinned-plan layout version {data.get('version')!r}; this execwrap "
            f"reads version {PINNED_VERSION}"
        )
    order = ExecutionOrder.from_dict(data.get("order"), source=source, prefix="order")
    plan = WrapPlan.from_dict(data.get("plan"), order, source=source, prefix="plan")
    if model is not None:
        check_plan_fits(plan, model, source=source)
    return plan


def check_plan_fits(plan: WrapPlan, model: nn.Module, *, source: str = "the plan") -> None:
    """Check that ``plan`` was made for ``model``: the same modules (names and
    classes, in ``named_modules()`` order) and parameters (names, shapes, dtypes,
    ``requires_grad``), then the plan's own check (:meth:`WrapPlan.check`).

    Args:
        plan: the pinned plan.
        model: the unwrapped model.
        source: where the plan came from, for the message.

    Raises:
        PlanForAnotherModelError: a ``ValueError``: the first module or parameter that
            differs, named, with what the plan's model and ``model`` have there.
        PlanError: from :meth:`WrapPlan.check`.
    """
    name = type(model).__name__
    planned = plan.order.module_classes.get("")
    problem: str | None
    if planned is not None and planned != name:  # another class at the root: say that first
        problem = f"a {planned} (the root module {quoted('')}), but the model passed is a {name}"
        finding = f"was made for another model: {problem}"
    else:
        problem = _first_module_difference(plan.order, model, name) or _first_param_difference(
            plan.order, model, name
        )
        finding = f"was made for another model than this {name}: {problem}"
    if problem is not None:
        raise PlanForAnotherModelError(
            f"{source} {finding}. Plan this model again (plan_wrap(model, "
            "capture_execution_order(model, ...), ...)), or build the model the plan was made for",
            source=source,
            finding=finding,
        )
    plan.check(model)


def _first_module_difference(order: ExecutionOrder, model: nn.Module, name: str) -> str | None:
    if not order.module_classes:
        return None  # a hand-built order records no modules
    theirs = list(order.module_classes.items())
    mine = [(fqn, type(m).__name__) for fqn, m in model.named_modules()]
    for (a, class_a), (b, class_b) in zip(theirs, mine, strict=False):
        if a != b:
            only_model = b not in order.module_classes
            missing, where = (b, name) if only_model else (a, "the plan's model")
            return f"the first module that differs is {quoted(missing)}, which only {where} has"
        if class_a != class_b:
            return (
                f"module {quoted(a)} is a {class_a} in the model the plan was made for, but a "
                f"{class_b} in this {name}"
            )
    if len(theirs) != len(mine):
        longer, owner = (theirs, "the plan's model") if len(theirs) > len(mine) else (mine, name)
        fqn = longer[min(len(theirs), len(mine))][0]
        return f"the first module that differs is {quoted(fqn)}, which only {owner} has"
    return None


def _first_param_difference(order: ExecutionOrder, model: nn.Module, name: str) -> str | None:
    if not order.params:
        return None
    mine = param_infos(model)
    for fqn, info in order.params.items():
        have = mine.get(fqn)
        if have is None:
            return f"the first parameter that differs is {fqn!r}, which only the plan's model has"
        if (info.shape, info.dtype, info.requires_grad) != (
            have.shape,
            have.dtype,
            have.requires_grad,
        ):
            return (
                f"the first parameter that differs is {fqn!r}: shape {info.shape}, "
                f"{info.dtype}, requires_grad={info.requires_grad} in the plan; shape "
                f"{have.shape}, {have.dtype}, requires_grad={have.requires_grad} in {name}"
            )
    extra = next((fqn for fqn in mine if fqn not in order.params), None)
    if extra is not None:
        return f"the first parameter that differs is {extra!r}, which only {name} has"
    return None


def check_pinned_options(pinned_plan: Any, **options: Any) -> None:
    """``ParamExecOrderWrapPolicy(pinned_plan=...)``: a :class:`WrapPlan`, given alone.

    Args:
        pinned_plan: the policy's ``pinned_plan`` (``None``: nothing to check).
        **options: the policy's options that a pinned plan replaces, by name.

    Raises:
        TypeError: ``pinned_plan`` is not a :class:`WrapPlan`.
        ValueError: one of ``options`` is given too (they would be ignored).
    """
    if pinned_plan is None:
        return
    if not isinstance(pinned_plan, WrapPlan):
        raise TypeError(
            "ParamExecOrderWrapPolicy.pinned_plan must be a WrapPlan (e.g. "
            f"execwrap.plan.pinned.load_plan(folder)) or None; got {type(pinned_plan).__name__}"
        )
    given = [name for name, value in options.items() if value is not None]
    if given:
        raise ValueError(
            "ParamExecOrderWrapPolicy: pinned_plan is applied as it is (no capture, no "
            f"planning), so {', '.join(given)} would be ignored; pass pinned_plan alone, or "
            "leave it out to capture and plan again"
        )


def plan_changes(pinned: WrapPlan, plan: WrapPlan) -> list[str]:
    """What ``plan`` changes against ``pinned``, one line each (``[]``: the same plan).

    Compared: the groups (their number, then the first that differs), the auto
    planner's prefetch depth and ``reshard_after_forward`` choices, and the cost
    rows of :func:`execwrap.compare_plans` (all-gathers per step, peak unsharded
    bytes at prefetch 1), then the predicted step time when both plans have one.

    Example:
        >>> plan_changes(plan, plan)  # doctest: +SKIP
        []
    """
    lines: list[str] = []
    a, b = pinned.groups, plan.groups
    if a != b:
        i = next(
            (k for k, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
        )
        was = a[i] if i < len(a) else "none"
        now = b[i] if i < len(b) else "none"
        lines.append(f"groups: {len(a)} -> {len(b)}; group {i} was {was}, is now {now}")
    if pinned.prefetch != plan.prefetch:
        lines.append(f"prefetch: {pinned.prefetch} -> {plan.prefetch}")
    if pinned.reshard_after_forward != plan.reshard_after_forward:
        lines.append(
            f"reshard_after_forward: {_flags(pinned.reshard_after_forward)} -> "
            f"{_flags(plan.reshard_after_forward)}"
        )
    if not lines:
        return []
    old, new = compare_plans({"pinned": pinned, "new": plan})
    for key in ("all_gathers_per_step", "peak_unsharded_bytes"):
        if old[key] != new[key]:
            lines.append(f"{key.replace('_', ' ')}: {old[key]} -> {new[key]}")
    if pinned.estimate is not None and plan.estimate is not None:
        lines.append(
            f"predicted step: {pinned.estimate.step_time_s:.4g} s -> "
            f"{plan.estimate.step_time_s:.4g} s"
        )
    return lines


def _flags(flags: Any) -> str:
    return "FSDP2's default" if flags is None else str(list(flags))
