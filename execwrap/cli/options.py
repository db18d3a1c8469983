"""Every command's arguments, checked before anything heavy is imported.

:func:`report_options`, :func:`show_options` and :func:`diff_options` turn the
parsed arguments into small frozen dataclasses, resolving the defaults and
raising :class:`~execwrap.cli.errors.CLIError` for every mistake that can be
seen without the model: element counts, formats, the input SPEC and its
files, ``--concrete-arg`` literals, the syntax of ``--model``/``--tracer``
paths and of ``--policy``, the output folder, and the saved files of ``show``
and ``diff``. This module imports no torch, so those mistakes are answered
at once; what needs the model (a class name in ``--policy``, a factory that
raises) is checked when the command runs.
"""

from __future__ import annotations

import argparse
import ast
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from execwrap.cli.budget import memory_budget_option
from execwrap.cli.errors import CLIError
from execwrap.cli.input_spec import InputItem, check_input_file, is_arg_name, parse_input_spec
from execwrap.cli.report_out import check_report_out
from execwrap.report.files import REPORT_FILES, REPORT_FORMATS

__all__ = [
    "DEFAULT_DEMO_BUCKET",
    "DEFAULT_DEMO_INPUT",
    "DEFAULT_DEMO_POLICY",
    "DEFAULT_MODEL",
    "DEFAULT_OUT",
    "POLICY_HELP",
    "DiffOptions",
    "PolicySpec",
    "ReportOptions",
    "ShowOptions",
    "check_out_dir",
    "diff_options",
    "locate_saved",
    "parse_concrete_args",
    "parse_numel",
    "parse_policy_spec",
    "report_options",
    "show_options",
    "split_object_path",
]

DEFAULT_MODEL = "execwrap.demo_models:build_demo_model"
DEFAULT_OUT = "execwrap-report"
DEFAULT_DEMO_POLICY = "transformer:Block"
DEFAULT_DEMO_BUCKET = "100K"
DEFAULT_DEMO_INPUT = "long:2x16"

POLICY_HELP = """\
policy: which modules become FSDP units (decided as FSDP decides it):
  always                  every module (always_wrap_policy)
  transformer:CLASS[,..]  modules of these classes (transformer_auto_wrap_policy)
  module:CLASS[,..]       modules of these classes (ModuleWrapPolicy)
  size:N                  size_based_auto_wrap_policy, min_num_params N (K/M/G ok)
  none                    only the root module
  CLASS is a class name found among the model's modules (e.g. Block,
  GPT2Block) or a PKG.MODULE:CLASS path."""


# ------------------------------------------------------------------ values
_NUMEL_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kKmMgGtT]?)\s*$")
_SUFFIX = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}


def parse_numel(text: str) -> int:
    """Parse an element count with an optional decimal suffix.

    ``"25M"`` -> ``25_000_000``; ``"1.5K"`` -> ``1500``; ``"4096"`` -> ``4096``.
    Suffixes K, M, G, T (case-insensitive) are powers of 1000 (elements, not
    bytes).

    Raises:
        ValueError: not a non-negative number with an optional suffix.
    """
    match = _NUMEL_RE.match(text)
    if not match:
        raise ValueError(
            f"invalid element count {text!r}: expected a number with an optional "
            "K/M/G suffix, e.g. 25M"
        )
    value = float(match.group(1)) * _SUFFIX[match.group(2).lower()]
    if value != int(value):
        raise ValueError(f"invalid element count {text!r}: not a whole number of elements")
    return int(value)


def split_object_path(path: str, what: str) -> tuple[str, str]:
    """Split ``PKG.MODULE:NAME`` into ``(module, name)`` without importing anything.

    Args:
        path: the object path (``NAME`` may be dotted: ``Outer.inner``).
        what: the option it came from, for messages (e.g. ``"--model"``).

    Raises:
        CLIError: no ``:``, an empty part, or a file path instead of a module path.
    """
    module_name, colon, attr = path.partition(":")
    if not colon or not module_name or not attr:
        raise CLIError(f"{what} {path!r}: expected PKG.MODULE:NAME, e.g. mypkg.factories:build")
    if "/" in module_name or "\\" in module_name or module_name.endswith(".py"):
        file = Path(module_name)
        stem = file.stem if file.suffix == ".py" else file.name
        noun = "FACTORY" if what == "--model" else "CLASS"
        raise CLIError(
            f"{what} takes an importable module path PKG.MODULE:{noun}, not a file path; run "
            f"from the folder holding {file.name} and pass {stem}:{attr}"
        )
    return module_name, attr


@dataclass(frozen=True)
class PolicySpec:
    """A ``--policy`` value, checked (see :data:`POLICY_HELP`).

    Attributes:
        text: the value as given.
        kind: ``"always"``, ``"none"``, ``"transformer"``, ``"module"`` or ``"size"``.
        class_names: the CLASS names (``transformer``/``module``), as given.
        min_num_params: N of ``size:N`` (elements).
    """

    text: str
    kind: str
    class_names: tuple[str, ...] = ()
    min_num_params: int = 0

    @property
    def what(self) -> str:
        """How messages name the option: ``--policy 'transformer:Block'``."""
        return f"--policy {self.text!r}"


def parse_policy_spec(text: str) -> PolicySpec:
    """Check a ``--policy`` value's syntax (the classes are found in the model later).

    Raises:
        CLIError: an unknown kind, no class, a malformed class path, or a bad size.
    """
    kind, _, arg = text.partition(":")
    kind = kind.strip().lower()
    what = f"--policy {text!r}"
    if kind in ("always", "none") and not arg:
        return PolicySpec(text, kind)
    if kind in ("transformer", "module"):
        names = tuple(n for n in (n.strip() for n in arg.split(",")) if n)
        if not names:
            raise CLIError(f"{what}: no class given")
        for name in names:
            if ":" in name:
                split_object_path(name, what)
        return PolicySpec(text, kind, class_names=names)
    if kind == "size":
        try:
            return PolicySpec(text, kind, min_num_params=parse_numel(arg))
        except ValueError as exc:
            raise CLIError(f"{what}: {exc}") from None
    raise CLIError(
        f"{what}: unknown policy; use always, none, transformer:CLASS, module:CLASS,... or size:N"
    )


def parse_concrete_args(pairs: Sequence[str]) -> dict[str, Any]:
    """``["use_cache=False"]`` -> ``{"use_cache": False}`` (VALUE: a Python literal).

    Raises:
        CLIError: a pair is not ``NAME=VALUE`` or VALUE is not a literal.
    """
    concrete_args: dict[str, Any] = {}
    for pair in pairs:
        name, eq, value = pair.partition("=")
        if not eq or not is_arg_name(name.strip()):
            raise CLIError(f"--concrete-arg {pair!r}: expected NAME=VALUE, e.g. use_cache=False")
        try:
            concrete_args[name.strip()] = ast.literal_eval(value.strip())
        except (ValueError, SyntaxError):
            raise CLIError(
                f"--concrete-arg {pair!r}: VALUE must be a Python literal "
                "(True, None, 3, 'text', ...)"
            ) from None
    return concrete_args


def _check_count(value: int, option: str) -> int:
    if value < 0:
        raise CLIError(f"{option} must be >= 0, got {value}")
    return value


# ------------------------------------------------------------------ report
@dataclass(frozen=True)
class ReportOptions:
    """The ``report`` command's arguments, checked, with the defaults resolved.

    Attributes:
        model_path: ``PKG.MODULE:FACTORY`` (:data:`DEFAULT_MODEL` when not given).
        is_demo: no ``--model`` was given (the built-in model and its defaults).
        input_text: the input SPEC as given (or the demo's), for messages.
        items: the parsed SPEC; ``None``: no inputs (symbolic capture only).
        policy: the checked ``--policy``.
        bucket_numel: FSDP2 group size cap (elements); ``None``: no buckets;
            ``"auto"``: the auto-planner.
        tracer_path: ``PKG.MODULE:CLASS`` of a ``torch.fx.Tracer``, or ``None``.
        concrete_args: forward arguments kept concrete while tracing.
        device: ``"cpu"`` or ``"meta"``.
        prefetch: prefetch depth for the memory prediction.
        out_dir: output folder.
        formats: report formats, in the order given.
        cost_model: ``--cost-model`` (a file path or a preset name), or ``None``.
        world_size: ``--world-size``, or ``None`` (the cost model's).
        memory_budget: ``--memory-budget`` in bytes, or ``None`` (the device's memory).
        plan_file: ``--plan``: a plan file reported instead of planning, or ``None``.
    """

    model_path: str
    is_demo: bool
    input_text: str | None
    items: list[InputItem] | None
    policy: PolicySpec
    bucket_numel: int | Literal["auto"] | None
    tracer_path: str | None
    concrete_args: dict[str, Any]
    device: str
    prefetch: int
    out_dir: Path
    formats: tuple[str, ...]
    cost_model: str | None = None
    world_size: int | None = None
    memory_budget: int | None = None
    plan_file: Path | None = None


def report_options(args: argparse.Namespace) -> ReportOptions:
    """Check the ``report`` arguments and resolve the defaults (no torch).

    Raises:
        CLIError: the first bad argument, in the order of the fields of
            :class:`ReportOptions`.
    """
    is_demo = args.model is None
    formats = _formats(args.format)
    prefetch = _check_count(1 if args.prefetch is None else args.prefetch, "--prefetch")
    bucket_numel = _bucket_numel(args.bucket_size or (DEFAULT_DEMO_BUCKET if is_demo else None))
    if bucket_numel == "auto" and args.prefetch is not None:
        raise CLIError(
            f"--prefetch {args.prefetch}: with --bucket-size auto the auto-planner chooses the "
            "prefetch depth (0, 1 or 2) and reshard_after_forward; leave --prefetch out (the "
            "baselines are then predicted at prefetch 1)"
        )
    cost_model, world_size, memory_budget = _auto_options(args, bucket_numel)
    plan_file = getattr(args, "plan", None)
    if plan_file is not None:
        if args.bucket_size is not None:
            raise CLIError(
                f"--plan {plan_file!r} with --bucket-size {args.bucket_size}: the plan file "
                "holds the groups; leave --bucket-size out"
            )
        bucket_numel = None
    input_text = DEFAULT_DEMO_INPUT if args.input is None and is_demo else args.input
    items = _input_items(input_text) if input_text is not None else None
    concrete_args = parse_concrete_args(args.concrete_arg or [])
    model_path = args.model or DEFAULT_MODEL
    split_object_path(model_path, "--model")
    if args.tracer:
        split_object_path(args.tracer, "--tracer")
    policy = parse_policy_spec(args.policy or (DEFAULT_DEMO_POLICY if is_demo else "always"))
    if not args.out.strip():
        raise CLIError(
            "--out '' is empty: name the report folder, e.g. --out execwrap-report (or --out . "
            "for the current folder)"
        )
    out_dir = Path(args.out)
    check_out_dir(out_dir, formats)
    return ReportOptions(
        model_path=model_path,
        is_demo=is_demo,
        input_text=input_text,
        items=items,
        policy=policy,
        bucket_numel=bucket_numel,
        tracer_path=args.tracer or None,
        concrete_args=concrete_args,
        device=args.device,
        prefetch=prefetch,
        out_dir=out_dir,
        formats=formats,
        cost_model=cost_model,
        world_size=world_size,
        memory_budget=memory_budget,
        plan_file=None if plan_file is None else Path(plan_file),
    )


def _refuse_preset_and_file(name: str) -> None:
    """A file in the current folder named like a preset: which one is meant is not clear.

    Raises:
        CLIError: ``name`` is a preset too (naming both and how to choose).
    """
    from execwrap.cost.presets import PRESETS  # only when such a file exists: start-up stays light

    if name in PRESETS:
        raise CLIError(
            f"--cost-model {name!r} names both the preset {name} and the file ./{name} in the "
            f"current folder: pass --cost-model ./{name} for the file, or rename or move the "
            "file for the preset"
        )


def _auto_options(
    args: argparse.Namespace, bucket_numel: int | str | None
) -> tuple[str | None, int | None, int | None]:
    """``--cost-model``, ``--world-size`` and ``--memory-budget``, checked: they
    go with ``--bucket-size auto``, which needs ``--cost-model``."""
    cost_model = getattr(args, "cost_model", None)
    world_size = getattr(args, "world_size", None)
    budget_text = getattr(args, "memory_budget", None)
    if bucket_numel != "auto":
        given = [
            option
            for option, value in (
                ("--cost-model", cost_model),
                ("--world-size", world_size),
                ("--memory-budget", budget_text),
            )
            if value is not None
        ]
        if given:
            verb = "applies" if len(given) == 1 else "apply"
            raise CLIError(f"{', '.join(given)} only {verb} with --bucket-size auto")
        return None, None, None
    if cost_model is not None and not cost_model.strip():
        from execwrap.cost.presets import PRESETS

        raise CLIError(
            f"--cost-model {cost_model!r} is empty: pass a cost model file from 'execwrap "
            f"calibrate' or a preset ({', '.join(sorted(PRESETS))})"
        )
    if not cost_model:
        raise CLIError(
            "--bucket-size auto needs --cost-model FILE|PRESET (a JSON file from "
            "'execwrap calibrate', or a preset such as h100-nvlink-8)"
        )
    looks_like_file = "/" in cost_model or "\\" in cost_model or cost_model.endswith(".json")
    if looks_like_file and not Path(cost_model).is_file():
        what = "a folder, not a cost model file" if Path(cost_model).is_dir() else "no such file"
        raise CLIError(f"--cost-model {cost_model!r}: {what}")
    if not looks_like_file and Path(cost_model).is_file():
        _refuse_preset_and_file(cost_model)
    if world_size is not None and world_size < 1:
        raise CLIError(f"--world-size must be >= 1, got {world_size}")
    memory_budget = None if budget_text is None else memory_budget_option(budget_text)
    return cost_model, world_size, memory_budget


def _formats(text: str) -> tuple[str, ...]:
    formats = [f.strip().lower() for f in text.split(",") if f.strip()]
    bad = [f for f in formats if f not in REPORT_FORMATS]
    if bad or not formats:
        raise CLIError(
            f"--format {text!r}: unknown format {', '.join(bad) or '(none)'}; "
            f"choose from {','.join(REPORT_FORMATS)}"
        )
    return tuple(formats)


def _bucket_numel(text: str | None) -> int | Literal["auto"] | None:
    if text is None or text.strip().lower() == "none":
        return None
    if text.strip().lower() == "auto":
        return "auto"
    try:
        bucket_numel = parse_numel(text)
    except ValueError as exc:
        raise CLIError(f"--bucket-size: {exc}") from None
    if bucket_numel <= 0:
        raise CLIError(
            f"--bucket-size {text!r}: must be > 0 elements; use --bucket-size none for no bucketing"
        )
    return bucket_numel


def _input_items(text: str) -> list[InputItem]:
    try:
        items = parse_input_spec(text)
        for item in items:
            if item.path is not None:
                check_input_file(item.path)
    except ValueError as exc:
        raise CLIError(f"--input: {exc}") from None
    return items


def check_out_dir(out_dir: Path, formats: Sequence[str] = ()) -> None:
    """Fail early, before capture, when ``out_dir`` cannot be a writable folder
    or a report file of ``formats`` would replace a folder there, or a file that
    execwrap did not write or that was changed since (:mod:`execwrap.report.ownership`).

    Raises:
        CLIError: naming ``out_dir`` and what is in the way.
    """
    probe = out_dir
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if probe.exists() and not probe.is_dir():
        raise CLIError(f"--out {str(out_dir)!r}: {str(probe)!r} exists and is not a folder")
    if probe.exists() and not os.access(probe, os.W_OK | os.X_OK):
        raise CLIError(f"--out {str(out_dir)!r}: folder {str(probe)!r} is not writable")
    for fmt in formats:
        for name in REPORT_FILES.get(fmt, {}).values():
            target = out_dir / name
            if target.is_dir():
                raise CLIError(
                    f"--out {str(out_dir)!r}: {str(target)!r} is a folder, so the report "
                    f"cannot write its {name} there; move it away or choose another --out"
                )
    names = [n for fmt in formats for n in REPORT_FILES.get(fmt, {}).values()]
    if out_dir.is_dir():
        check_report_out(out_dir, names)


# -------------------------------------------------------------- show, diff
def locate_saved(path_text: str) -> Path:
    """The ``report.json`` or bare order file that ``show``/``diff`` read.

    ``path_text`` is a file, or a report folder holding ``report.json``.

    Raises:
        CLIError: no such file, or a folder without ``report.json``.
    """
    path = Path(path_text)
    if not path.exists():
        raise CLIError(f"{path_text}: no such file")
    if path.is_dir():
        if not (path / "report.json").is_file():
            raise CLIError(f"{path_text}: is a folder without report.json")
        path = path / "report.json"
    return path


@dataclass(frozen=True)
class ShowOptions:
    """``show FILE``: the name as given and the file to read."""

    file: str
    path: Path


@dataclass(frozen=True)
class DiffOptions:
    """``diff A B``: the names as given, the files to read, calls shown each side."""

    a: str
    path_a: Path
    b: str
    path_b: Path
    context: int


def show_options(args: argparse.Namespace) -> ShowOptions:
    """Check the ``show`` arguments (no torch). Raises :class:`CLIError`."""
    return ShowOptions(file=args.file, path=locate_saved(args.file))


def diff_options(args: argparse.Namespace) -> DiffOptions:
    """Check the ``diff`` arguments (no torch). Raises :class:`CLIError`."""
    return DiffOptions(
        a=args.a,
        path_a=locate_saved(args.a),
        b=args.b,
        path_b=locate_saved(args.b),
        context=_check_count(args.context, "--context"),
    )
