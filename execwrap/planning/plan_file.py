"""Plan files: a plan as a small JSON recipe keyed by module FQN, checked against the model on load.

A plan file says which modules form each FSDP2 group, whether each group reshards
after forward, and the explicit prefetch depth; nothing else (no order, no sizes),
so people can read it, edit it, keep it next to a training script and reuse it on
any model with those modules. Its rules are transformers' ``fsdp_plan``
(:mod:`execwrap.planning.rules`: ``*`` for a layer number, the two styles), with the
groups of several modules listed apart (JSON keys cannot be tuples)::

    {
      "execwrap_plan_file": 1,
      "model": "LlamaForCausalLM",
      "fsdp_plan": {"model.embed_tokens": "free_full_weight",
                    "model.layers.*": "free_full_weight"},
      "groups": [{"modules": ["model.norm", "lm_head"], "style": "keep_full_weight"}],
      "prefetch": 1
    }

The root is never named: it is always the last group. :func:`load_plan_file` reads a
file for one model: every rule must name modules of it (the first that does not is
named in the error, with the class the file was written for) and the groups are laid
out as FSDP2 builds them (:func:`~execwrap.planning.given_groups.plan_from_groups`);
the result is a :class:`~execwrap.plan.wrap_plan.WrapPlan` that
:func:`execwrap.apply_fully_shard` and the integrations take as any other.
``execwrap report --plan FILE`` reports one (exit 2 when it is for another model).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch.nn as nn

from execwrap.plan.pinned import check_plan_target, is_pinned_dict, plan_from_pinned_dict
from execwrap.plan.wrap_plan import WrapPlan
from execwrap.planning.given_groups import plan_from_groups, tables_order
from execwrap.planning.rules import STYLES, expand_rules, group_rules
from tracing.atomic import atomic_write_text
from tracing.order import ExecutionOrder
from tracing.order_fields import parse_json
from tracing.schema import (
    Field,
    Record,
    SchemaError,
    dict_of,
    field_path,
    integer,
    list_of,
    one_of,
    optional,
    string,
)

__all__ = [
    "PLAN_FILE_FIELDS",
    "PLAN_FILE_VERSION",
    "load_plan_file",
    "plan_file_dict",
    "save_plan_file",
]

#: Layout version written in ``"execwrap_plan_file"``.
PLAN_FILE_VERSION = 1

_STYLE = one_of(*STYLES)

#: The fields of a plan file and how each is checked on load.
PLAN_FILE_FIELDS = Record(
    {
        "execwrap_plan_file": Field(one_of(PLAN_FILE_VERSION)),
        "model": Field(string(), required=False),
        "fsdp_plan": Field(dict_of(_STYLE)),
        "groups": Field(
            list_of(Record({"modules": Field(list_of(string())), "style": Field(_STYLE)})),
            required=False,
        ),
        "prefetch": Field(optional(integer(what="groups ahead")), required=False),
    }
)


def plan_file_dict(plan: WrapPlan, model: nn.Module) -> dict[str, Any]:
    """``plan`` as a plan file's JSON object (see the module docstring).

    Args:
        plan: a plan for ``model``.
        model: the model (its module names make the wildcards).

    Returns:
        The JSON-ready dict; ``prefetch`` is the plan's own depth (``null``: none chosen).

    Raises:
        ValueError: the plan names a module ``model`` does not have.
    """
    names = [n for n, _ in model.named_modules()]
    known = set(names)
    flags = plan.reshard_after_forward or tuple(not u.is_root for u in plan.units)
    groups = []
    for unit, flag in zip(plan.units, flags, strict=True):
        missing = [m for m in unit.module_fqns if m not in known]
        if missing:
            raise ValueError(
                f"plan_file_dict: the plan names module {missing[0]!r}, which "
                f"{type(model).__name__} does not have; was it made for another model?"
            )
        if not unit.is_root:
            groups.append((unit.module_fqns, bool(flag)))
    rules = group_rules(groups, names)
    return {
        "execwrap_plan_file": PLAN_FILE_VERSION,
        "model": type(model).__name__,
        "fsdp_plan": {k: v for k, v in rules.items() if isinstance(k, str)},
        "groups": [
            {"modules": list(k), "style": v} for k, v in rules.items() if isinstance(k, tuple)
        ],
        "prefetch": plan.prefetch,
    }


def save_plan_file(
    plan: WrapPlan, path: str | Path, model: nn.Module, *, overwrite: bool = False
) -> Path:
    """Write ``plan`` as a plan file at ``path`` (:func:`plan_file_dict`), atomically.

    Args:
        plan: the plan.
        path: the ``.json`` file to write.
        model: the model the plan is for (its class is recorded).
        overwrite: replace the file when it exists already (``False``: refuse, so that
            neither a saved plan nor a file of the user's is lost silently).

    Returns:
        ``Path(path)``.

    Raises:
        FileExistsError: the file exists and ``overwrite`` is false (the message names
            it, says whether it holds a saved plan, and the fix); nothing is written.
        IsADirectoryError: ``path`` is a folder.
        OSError: the file cannot be written.
    """
    path = Path(path)
    check_plan_target(path, "save_plan_file", overwrite)
    atomic_write_text(path, json.dumps(plan_file_dict(plan, model), indent=2) + "\n")
    return path


def load_plan_file(
    path: str | Path, model: nn.Module, *, order: ExecutionOrder | None = None
) -> WrapPlan:
    """Read a plan file for ``model``, checked against it.

    Args:
        path: the file.
        model: the model it is for (the meta device is fine).
        order: the model's order (for explicit prefetching and simulation);
            ``None``: an order without calls (:func:`~execwrap.planning.given_groups.tables_order`).

    A pinned plan (``plan.json`` of :func:`execwrap.save_plan`: the whole plan and its order)
    is read too, as :func:`execwrap.load_plan` reads it (``order`` is then its own).

    Returns:
        A plan with one unit per group and the root's, ``reshard_after_forward`` per
        unit from the styles (the root ``False``), ``prefetch`` from the file.

    Raises:
        ValueError: the file cannot be read, is not JSON, is of another layout or
            version, or a field is malformed (a :class:`~tracing.schema.SchemaError`
            naming the file and the field); a rule names no module of ``model`` (the
            first such rule, the module names near it and the class the file was
            written for); a module is named twice; a group nests its own modules.
    """
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise ValueError(f"{source}: cannot read the plan file: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise ValueError(f"{source}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    data = parse_json(text, source)
    if is_pinned_dict(data):  # a whole plan (execwrap.save_plan's plan.json), not a recipe
        return plan_from_pinned_dict(data, model, source=source)
    return plan_from_file_dict(data, model, order=order, source=source)


def plan_from_file_dict(
    data: Any, model: nn.Module, *, order: ExecutionOrder | None = None, source: str = "<dict>"
) -> WrapPlan:
    """:func:`load_plan_file` of an already parsed JSON object."""
    if not isinstance(data, dict) or "execwrap_plan_file" not in data:
        raise SchemaError(
            "",
            "not an execwrap plan file (no 'execwrap_plan_file' field; write one with "
            "execwrap.planning.plan_file.save_plan_file)",
            source,
        )
    f = PLAN_FILE_FIELDS.check(data, source=source, what="plan file")
    rules: dict[Any, str] = dict(f["fsdp_plan"])
    for i, group in enumerate(f["groups"] or []):
        key = tuple(group["modules"])
        if not key:
            raise SchemaError(
                field_path(f"groups[{i}]", "modules"), "is empty", source, "plan file"
            )
        rules[key] = group["style"]
    written_for = f["model"]
    model_name = type(model).__name__
    if written_for and written_for != model_name:
        model_name = f"{model_name} (the file was written for {written_for})"
    names = [n for n, _ in model.named_modules()]
    expanded = expand_rules(names, rules, where=source, model_name=model_name)
    return plan_from_groups(
        model,
        order if order is not None else tables_order(model),
        [g.modules for g in expanded],
        reshard_after_forward=[g.reshard_after_forward for g in expanded],
        prefetch=f["prefetch"],
        policy_name=f"plan file {Path(source).name}",
    )
