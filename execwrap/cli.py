"""The ``execwrap`` command line: ``report``, ``diff`` and ``show``.

``execwrap report`` captures a model's execution order (symbolic first,
falling back to one real forward/backward with example inputs), plans FSDP
units with a wrap policy, compares the plan with baseline policies, and writes
the report files (:func:`execwrap.report.write_report`). With no arguments it
reports on the built-in GPT-style demo model into ``./execwrap-report/``.

``execwrap diff A.json B.json`` names the first call where two saved orders
part; ``execwrap show ORDER.json`` prints a saved order and its plan.

Exit status: 0 success, 1 a finding (``diff``: the orders differ), 2 bad
usage or bad input (one ``execwrap: error: ...`` line on stderr, never a
traceback).
"""

from __future__ import annotations

import argparse
import ast
import functools
import importlib
import json
import logging
import math
import os
import re
import sys
import textwrap
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from tracing.fqn import ROOT_NAME

__all__ = ["main", "parse_input_spec", "parse_numel", "parse_policy"]

logger = logging.getLogger(__name__)

PROG = "execwrap"
DEFAULT_MODEL = "execwrap.demo_models:build_demo_model"
DEFAULT_OUT = "execwrap-report"
DEFAULT_DEMO_POLICY = "transformer:Block"
DEFAULT_DEMO_BUCKET = "100K"
DEFAULT_DEMO_INPUT = "long:2x16"

EXIT_OK = 0
EXIT_FINDING = 1
EXIT_USAGE = 2

INPUT_SPEC_HELP = """\
input SPEC: the example inputs for one forward, items separated by ';'
(quote SPEC in the shell when it has several items):
  DTYPE:SHAPE[:HIGH]   a random tensor, e.g. long:2x16, float:2x3x32, bool:4.
                       DTYPE is a torch dtype name (long, int, float, half,
                       bfloat16, float64, bool, ...); SHAPE is sizes joined by
                       'x'. Integer tensors draw from [0, HIGH); without HIGH,
                       from [0, model.config.vocab_size) when the model has
                       one, else [0, 2). Floats are standard normal. Seeded.
  NAME=ITEM            pass ITEM as keyword argument NAME of forward,
                       e.g. input_ids=long:2x16;attention_mask=long:2x16:2
  @FILE.pt             a file written by torch.save, read with
                       torch.load(FILE.pt, weights_only=True): a tensor (one
                       positional input), a list/tuple of tensors (positional
                       inputs) or a dict NAME -> tensor (keyword inputs).
  NAME=@FILE.pt        keyword argument NAME; FILE.pt must hold one tensor."""

POLICY_HELP = """\
policy: which modules become FSDP units (decided as FSDP decides it):
  always                  every module (always_wrap_policy)
  transformer:CLASS[,..]  modules of these classes (transformer_auto_wrap_policy)
  module:CLASS[,..]       modules of these classes (ModuleWrapPolicy)
  size:N                  size_based_auto_wrap_policy, min_num_params N (K/M/G ok)
  none                    only the root module
  CLASS is a class name found among the model's modules (e.g. Block,
  GPT2Block) or a PKG.MODULE:CLASS path."""

DEFAULTS_HELP = f"""\
defaults:         built-in model (no --model)   other models (--model)
  --input         {DEFAULT_DEMO_INPUT:<30}none (symbolic capture only)
  --policy        {DEFAULT_DEMO_POLICY:<30}always
  --bucket-size   {DEFAULT_DEMO_BUCKET:<30}none"""


# ----------------------------------------------------------------- errors
class CLIError(Exception):
    """Bad usage or input: printed as one ``execwrap: error: ...`` line, exit 2."""


class _Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line and exit status 2."""

    def error(self, message: str) -> NoReturn:
        hint = f" (see '{self.prog} --help')"
        self.exit(EXIT_USAGE, f"{PROG}: error: {message}{hint}\n")


# ------------------------------------------------------------ value parsers
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


@dataclass
class InputItem:
    """One parsed item of an input SPEC (see :data:`INPUT_SPEC_HELP`)."""

    name: str | None
    dtype: Any = None
    shape: tuple[int, ...] = ()
    high: int | None = None
    path: str | None = None
    text: str = ""
    """The item as written in the SPEC, for messages."""


_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_DTYPE_ALIASES = {
    "long": "int64",
    "int": "int32",
    "short": "int16",
    "float": "float32",
    "double": "float64",
    "half": "float16",
}


def _parse_dtype(name: str, item: str) -> Any:
    import torch

    resolved = getattr(torch, _DTYPE_ALIASES.get(name, name), None)
    if not isinstance(resolved, torch.dtype):
        raise ValueError(
            f"input item {item!r}: unknown dtype {name!r} (use a torch dtype such as "
            "long, int, float, half, bfloat16, bool)"
        )
    return resolved


def parse_input_spec(spec: str) -> list[InputItem]:
    """Parse an input SPEC (see :data:`INPUT_SPEC_HELP`) into items.

    Example:
        >>> [(i.name, str(i.dtype), i.shape) for i in parse_input_spec("long:2x16")]
        [(None, 'torch.int64', (2, 16))]

    Raises:
        ValueError: the spec is empty or an item is malformed; the message
            names the item and what was expected.
    """
    items: list[InputItem] = []
    for raw in spec.split(";"):
        item = raw.strip()
        if not item:
            continue
        name: str | None = None
        head, eq, rest = item.partition("=")
        if eq:
            if not _NAME_RE.match(head.strip()):
                raise ValueError(f"input item {item!r}: {head!r} is not an argument name")
            name, item_body = head.strip(), rest.strip()
        else:
            item_body = item
        if item_body.startswith("@"):
            if not item_body[1:]:
                raise ValueError(f"input item {item!r}: '@' needs a file name")
            items.append(InputItem(name=name, path=item_body[1:], text=item))
            continue
        parts = item_body.split(":")
        if len(parts) not in (2, 3) or not parts[0] or not parts[1]:
            raise ValueError(
                f"input item {item!r}: expected DTYPE:SHAPE[:HIGH] (e.g. long:2x16), "
                "NAME=DTYPE:SHAPE or @FILE.pt"
            )
        dtype = _parse_dtype(parts[0].strip(), item)
        try:
            shape = tuple(int(s) for s in parts[1].lower().split("x"))
        except ValueError:
            raise ValueError(
                f"input item {item!r}: shape {parts[1]!r} must be sizes joined by 'x', e.g. 2x16"
            ) from None
        if any(s < 0 for s in shape):
            raise ValueError(f"input item {item!r}: negative size in shape {parts[1]!r}")
        high = None
        if len(parts) == 3:
            try:
                high = int(parts[2])
            except ValueError:
                raise ValueError(
                    f"input item {item!r}: HIGH {parts[2]!r} must be an integer"
                ) from None
            if high <= 0:
                raise ValueError(f"input item {item!r}: HIGH must be > 0, got {high}")
        items.append(InputItem(name=name, dtype=dtype, shape=shape, high=high, text=item))
    if not items:
        raise ValueError(f"input spec {spec!r} has no items (e.g. long:2x16)")
    return items


def _int_high(model: Any) -> int:
    config = getattr(model, "config", None)
    vocab = getattr(config, "vocab_size", None)
    return int(vocab) if isinstance(vocab, int) and vocab > 0 else 2


def build_inputs(
    items: Sequence[InputItem], model: Any, device: str, *, seed: int = 0
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Materialise parsed input items into ``(args, kwargs)`` on ``device``.

    Raises:
        ValueError: an item cannot be built (a tensor larger than this
            machine's memory, or torch fails to allocate or convert it), or a
            file cannot be loaded or holds something other than the SPEC
            allows; the message names the item.
    """
    import torch

    gen = torch.Generator().manual_seed(seed)
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    for item in items:
        label = item.text or (f"{item.name}=" if item.name else "") + (
            f"@{item.path}" if item.path is not None else ""
        )
        if item.path is not None:
            value = _load_input_file(item.path, item.name, label)
            try:
                if isinstance(value, dict):
                    kwargs.update({k: _to_device(v, device) for k, v in value.items()})
                elif isinstance(value, (list, tuple)):
                    args.extend(_to_device(v, device) for v in value)
                elif item.name is not None:
                    kwargs[item.name] = _to_device(value, device)
                else:
                    args.append(_to_device(value, device))
            except (RuntimeError, MemoryError, ValueError) as exc:
                raise ValueError(
                    f"input item {label!r}: cannot move it to {device}: {_exc_line(exc)}"
                ) from exc
            continue
        dtype = item.dtype
        nbytes = math.prod(item.shape) * dtype.itemsize
        limit = _machine_memory_bytes()
        if device != "meta" and limit is not None and nbytes > limit:
            raise ValueError(
                f"input item {label!r}: the tensor needs {_format_bytes(nbytes)}, more than "
                f"this machine's memory ({_format_bytes(limit)}); use a smaller SHAPE"
            )
        try:
            if device == "meta":
                tensor = torch.empty(item.shape, dtype=dtype, device="meta")
            elif dtype == torch.bool:
                tensor = torch.randint(0, 2, item.shape, generator=gen).bool()
            elif dtype.is_floating_point or dtype.is_complex:
                tensor = torch.randn(item.shape, generator=gen).to(dtype)
            else:
                high = item.high or _int_high(model)
                tensor = torch.randint(0, high, item.shape, generator=gen).to(dtype)
            tensor = tensor.to(device)
        except (RuntimeError, MemoryError, ValueError) as exc:
            raise ValueError(
                f"input item {label!r}: cannot create the tensor ({_format_bytes(nbytes)}): "
                f"{_exc_line(exc)}"
            ) from exc
        if item.name is None:
            args.append(tensor)
        else:
            kwargs[item.name] = tensor
    return tuple(args), kwargs


_LOAD_HINT = "is it a file written by torch.save of a tensor or a tuple/dict of tensors?"


def _load_input_file(path: str, name: str | None, label: str) -> Any:
    """``torch.load`` an ``@FILE`` input and check it holds what the SPEC allows:
    one tensor for ``NAME=@FILE``; a tensor, a list/tuple of tensors or a dict
    NAME -> tensor for a positional ``@FILE``."""
    import torch

    if not Path(path).exists():
        raise ValueError(f"input file {path!r} does not exist")
    if not Path(path).is_file():
        raise ValueError(f"input file {path!r} is not a file")
    try:
        value = torch.load(path, weights_only=True, map_location="cpu")
    except Exception as exc:
        raise ValueError(
            f"input item {label!r}: cannot load {path!r}: {_exc_line(exc)}; {_LOAD_HINT}"
        ) from exc
    if name is not None:
        if not isinstance(value, torch.Tensor):
            raise ValueError(
                f"input item {label!r}: {path!r} holds {_a(type(value).__name__)}; "
                f"{name}=@FILE needs a file holding one tensor (for several inputs use "
                "a positional @FILE holding a tuple or dict of tensors)"
            )
        return value
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            if not isinstance(v, torch.Tensor):
                raise ValueError(
                    f"input item {label!r}: {path!r} holds a {type(value).__name__} whose "
                    f"item {i} is {_a(type(v).__name__)}; expected tensors only"
                )
        return value
    if isinstance(value, dict):
        for k, v in value.items():
            if not (isinstance(k, str) and _NAME_RE.match(k)):
                raise ValueError(
                    f"input item {label!r}: {path!r} holds a dict with key {k!r}, "
                    "which is not an argument name"
                )
            if not isinstance(v, torch.Tensor):
                raise ValueError(
                    f"input item {label!r}: {path!r} holds a dict whose entry {k!r} is "
                    f"{_a(type(v).__name__)}; expected tensors only"
                )
        return value
    raise ValueError(
        f"input item {label!r}: {path!r} holds {_a(type(value).__name__)}; expected a "
        "tensor, a list/tuple of tensors or a dict NAME -> tensor"
    )


def _to_device(value: Any, device: str) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        return value.to("meta" if device == "meta" else device)
    return value


def _machine_memory_bytes() -> int | None:
    """Physical memory of this machine in bytes, or ``None`` when unknown."""
    try:
        pages, page_size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None
    return pages * page_size if pages > 0 and page_size > 0 else None


def _format_bytes(n: int) -> str:
    from execwrap.report import format_bytes

    return format_bytes(n)


def _a(word: str) -> str:
    """``"int"`` -> ``"an int"``, ``"dict"`` -> ``"a dict"`` (for type names)."""
    vowel = word[:1].lower() in "aeiou" and not word.lower().startswith(("uni", "use", "usu"))
    return f"{'an' if vowel else 'a'} {word}"


_ANSI_RE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def _exc_line(exc: BaseException, limit: int = 120) -> str:
    """``"TypeName: first line of the message"``, shortened to ``limit`` characters."""
    lines = _ANSI_RE.sub("", str(exc)).strip().splitlines()
    first = lines[0].strip() if lines else ""
    text = f"{type(exc).__name__}: {first}" if first else type(exc).__name__
    return _shorten(text, limit)


# ----------------------------------------------------------- object paths
def import_object(path: str, what: str) -> Any:
    """Import ``PKG.MODULE:NAME`` (``NAME`` may be dotted: ``Outer.inner``).

    Args:
        path: the object path.
        what: the option it came from, for messages (e.g. ``"--model"``).

    Raises:
        CLIError: malformed path, module not importable, or no such name.
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
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.append(os.getcwd())  # as `python -m` would: modules in the current folder
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise CLIError(f"{what} {path!r}: cannot import module {module_name!r}: {exc}") from exc
    except Exception as exc:
        raise CLIError(
            f"{what} {path!r}: importing {module_name!r} raised {type(exc).__name__}: {exc}"
        ) from exc
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise CLIError(
                f"{what} {path!r}: module {module_name!r} has no attribute {attr!r}"
            ) from None
    return obj


def load_model(path: str, device: str) -> Any:
    """Build the model from ``PKG.MODULE:FACTORY`` (called with no arguments).

    On ``device="meta"`` the factory runs under ``torch.device("meta")``, so
    no memory is allocated for weights.

    Raises:
        CLIError: the factory cannot be imported, raises, or returns no module.
    """
    import torch
    import torch.nn as nn

    factory = import_object(path, "--model")
    if not callable(factory):
        raise CLIError(f"--model {path!r} is {_a(type(factory).__name__)}, not a callable factory")
    try:
        if device == "meta":
            with torch.device("meta"):
                model = factory()
        else:
            model = factory()
    except Exception as exc:
        raise CLIError(f"--model {path!r}: the factory raised {type(exc).__name__}: {exc}") from exc
    if not isinstance(model, nn.Module):
        raise CLIError(
            f"--model {path!r}: the factory returned {_a(type(model).__name__)}, "
            "expected a torch.nn.Module"
        )
    return model.to(device) if device != "meta" else model


# ------------------------------------------------------------------ policies
def _resolve_classes(names: str, model: Any, what: str) -> set[type]:
    found: dict[str, set[type]] = {}
    for module in model.modules():
        found.setdefault(type(module).__name__, set()).add(type(module))
    classes: set[type] = set()
    for name in (n.strip() for n in names.split(",")):
        if not name:
            continue
        if ":" in name:
            cls = import_object(name, what)
            if not isinstance(cls, type):
                raise CLIError(f"{what}: {name!r} is not a class")
            classes.add(cls)
            continue
        candidates = found.get(name)
        if not candidates:
            known = ", ".join(sorted(found)[:30])
            raise CLIError(
                f"{what}: no module of class {name!r} in the model; classes present: {known}"
            )
        if len(candidates) > 1:
            paths = ", ".join(sorted(f"{c.__module__}:{c.__qualname__}" for c in candidates))
            raise CLIError(
                f"{what}: class name {name!r} is ambiguous ({paths}); pass PKG.MODULE:CLASS"
            )
        classes |= candidates
    if not classes:
        raise CLIError(f"{what}: no class given")
    return classes


def _root_only_policy(module: Any, recurse: bool, nonwrapped_numel: int) -> bool:
    """Wrap nothing below the root (every parameter in the root unit)."""
    return recurse


def parse_policy(text: str, model: Any) -> Any:
    """Turn a ``--policy`` value into an FSDP init policy (see :data:`POLICY_HELP`).

    Raises:
        CLIError: an unknown kind, a class not in the model, a bad size.
    """
    from torch.distributed.fsdp.wrap import (
        ModuleWrapPolicy,
        always_wrap_policy,
        size_based_auto_wrap_policy,
        transformer_auto_wrap_policy,
    )

    kind, _, arg = text.partition(":")
    kind = kind.strip().lower()
    what = f"--policy {text!r}"
    if kind == "always" and not arg:
        return always_wrap_policy
    if kind == "none" and not arg:
        return _root_only_policy
    if kind == "transformer":
        classes = _resolve_classes(arg, model, what)
        return functools.partial(transformer_auto_wrap_policy, transformer_layer_cls=classes)
    if kind == "module":
        return ModuleWrapPolicy(_resolve_classes(arg, model, what))
    if kind == "size":
        try:
            min_num_params = parse_numel(arg)
        except ValueError as exc:
            raise CLIError(f"{what}: {exc}") from None
        return functools.partial(size_based_auto_wrap_policy, min_num_params=min_num_params)
    raise CLIError(
        f"{what}: unknown policy; use always, none, transformer:CLASS, module:CLASS,... or size:N"
    )


# ---------------------------------------------------------------- commands
def _cmd_report(args: argparse.Namespace) -> int:
    import torch
    import torch.fx

    from execwrap.errors import ExecwrapError
    from execwrap.planner import plan_wrap
    from execwrap.report import (
        REPORT_FORMATS,
        format_bytes,
        format_numel,
        short_reason,
        write_report,
    )
    from tracing import TracingConfig, TracingError, capture_execution_order

    is_demo = args.model is None
    model_path = args.model or DEFAULT_MODEL
    formats = [f.strip().lower() for f in args.format.split(",") if f.strip()]
    bad = [f for f in formats if f not in REPORT_FORMATS]
    if bad or not formats:
        raise CLIError(
            f"--format {args.format!r}: unknown format {', '.join(bad) or '(none)'}; "
            f"choose from {','.join(REPORT_FORMATS)}"
        )
    if args.prefetch < 0:
        raise CLIError(f"--prefetch must be >= 0, got {args.prefetch}")
    bucket_numel = None
    bucket_text = args.bucket_size or (DEFAULT_DEMO_BUCKET if is_demo else None)
    if bucket_text is not None and bucket_text.strip().lower() != "none":
        try:
            bucket_numel = parse_numel(bucket_text)
        except ValueError as exc:
            raise CLIError(f"--bucket-size: {exc}") from None
        if bucket_numel <= 0:
            raise CLIError(
                f"--bucket-size {bucket_text!r}: must be > 0 elements; "
                "use --bucket-size none for no bucketing"
            )
    items = None
    input_text = args.input
    if input_text is not None:
        try:
            items = parse_input_spec(input_text)
        except ValueError as exc:
            raise CLIError(f"--input: {exc}") from None
    concrete_args: dict[str, Any] = {}
    for pair in args.concrete_arg or []:
        name, eq, value = pair.partition("=")
        if not eq or not _NAME_RE.match(name.strip()):
            raise CLIError(f"--concrete-arg {pair!r}: expected NAME=VALUE, e.g. use_cache=False")
        try:
            concrete_args[name.strip()] = ast.literal_eval(value.strip())
        except (ValueError, SyntaxError):
            raise CLIError(
                f"--concrete-arg {pair!r}: VALUE must be a Python literal "
                "(True, None, 3, 'text', ...)"
            ) from None
    out_dir = Path(args.out)
    _check_out_dir(out_dir, formats)

    model = load_model(model_path, args.device)
    if items is None and is_demo:
        input_text = DEFAULT_DEMO_INPUT
        items = parse_input_spec(input_text)
    try:
        example = build_inputs(items, model, args.device) if items is not None else None
    except ValueError as exc:
        raise CLIError(f"--input: {exc}") from None

    tracer: torch.fx.Tracer
    if args.tracer:
        tracer_cls = import_object(args.tracer, "--tracer")
        if not (isinstance(tracer_cls, type) and issubclass(tracer_cls, torch.fx.Tracer)):
            raise CLIError(f"--tracer {args.tracer!r} is not a torch.fx.Tracer subclass")
        try:
            tracer = tracer_cls()
        except Exception as exc:
            raise CLIError(
                f"--tracer {args.tracer!r}: creating it raised {type(exc).__name__}: {exc}"
            ) from exc
    else:
        tracer = torch.fx.Tracer()
    config = TracingConfig(tracer=tracer, concrete_args=concrete_args or None)

    policy_text = args.policy or (DEFAULT_DEMO_POLICY if is_demo else "always")
    init_policy = parse_policy(policy_text, model)

    t0 = time.perf_counter()
    try:
        order = capture_execution_order(
            model,
            tracing_config=config,
            example_inputs=example[0] if example else None,
            example_kwargs=example[1] if example else None,
        )
    except TracingError as exc:
        message = _tracing_error_message(exc, has_input=example is not None, device=args.device)
        raise CLIError(message) from exc
    except Exception as exc:  # the model itself failed on these inputs
        where = _error_module(exc)
        raise CLIError(
            f"capture failed: running {type(model).__name__} on --input {input_text!r} raised "
            f"{_exc_line(exc)}{f' (in {where})' if where else ''}"
        ) from exc
    t_capture = time.perf_counter() - t0

    try:
        plan = plan_wrap(model, order, init_policy, bucket_numel=bucket_numel)
        baselines = _baselines(model, order, policy_text, init_policy, bucket_numel)
    except (TypeError, ValueError, ExecwrapError) as exc:
        raise CLIError(f"planning failed: {_shorten(exc, 240)}") from exc
    title = f"execwrap report: {type(model).__name__} ({model_path})"
    try:
        paths = write_report(
            plan, out_dir, formats, prefetch=args.prefetch, baselines=baselines, title=title
        )
    except OSError as exc:
        raise CLIError(f"--out {str(out_dir)!r}: cannot write the report: {exc}") from exc

    stats = plan.stats(args.prefetch)
    rows = [
        ("model", f"{type(model).__name__} ({model_path})"),
        ("parameters", f"{len(order.params)} ({format_numel(order.total_numel())} elements)"),
        ("input", input_text or "-"),
        ("capture", f"{order.method} ({t_capture:.2f} s)"),
        ("fallback reason", short_reason(order.fallback_reason) if order.fallback_reason else "-"),
        ("policy", policy_text),
        ("bucket size", "-" if bucket_numel is None else f"{format_numel(bucket_numel)} elements"),
        ("units", str(stats.num_units)),
        ("all-gathers/step", str(stats.all_gathers_per_step)),
        (f"peak unsharded (prefetch {args.prefetch})", format_bytes(stats.peak_unsharded_bytes)),
    ]
    for name, base in baselines.items():
        bst = base.stats(args.prefetch)
        rows.append(
            (
                f"baseline {name}",
                f"{bst.num_units} units, {bst.all_gathers_per_step} all-gathers/step, "
                f"peak {format_bytes(bst.peak_unsharded_bytes)}",
            )
        )
    for key, path in paths.items():
        rows.append((key, str(path)))
    _print_table(rows)
    if "html" in paths:
        print(f"open {paths['html']} in a browser to see the charts and tables")
    return EXIT_OK


def _baselines(
    model: Any,
    order: Any,
    policy_text: str,
    init_policy: Any,
    bucket_numel: int | None,
) -> dict[str, Any]:
    """Plans of the same order to compare with: the chosen policy without
    buckets (when bucketed), and always_wrap_policy (or the root alone when
    the plan is always_wrap_policy without buckets)."""
    from torch.distributed.fsdp.wrap import always_wrap_policy

    from execwrap.planner import plan_wrap

    baselines: dict[str, Any] = {}
    if bucket_numel is not None:
        baselines[f"{policy_text} (no buckets)"] = plan_wrap(model, order, init_policy)
    if policy_text == "always" and bucket_numel is None:
        baselines["none (root only)"] = plan_wrap(model, order, _root_only_policy)
    else:
        baselines["always"] = plan_wrap(model, order, always_wrap_policy)
    return baselines


def _check_out_dir(out_dir: Path, formats: Sequence[str] = ()) -> None:
    """Fail early, before capture, when ``out_dir`` cannot be a writable folder
    or a report file of ``formats`` would replace a folder there."""
    from execwrap.report import REPORT_FILES

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


def _tracing_error_message(exc: Any, *, has_input: bool, device: str) -> str:
    """One CLI line for a :class:`tracing.TracingError`: where capture failed,
    the first line of why, and the command-line options that fix it."""
    fqn = getattr(exc, "module_fqn", None)
    cls = getattr(exc, "module_class", None)
    if fqn is None:
        where = ""
    elif fqn == "":
        where = " in the root module <root>" + (f" ({cls})" if cls else "")
    else:
        where = f" in module {_shorten(fqn, 60)!r}" + (f" ({cls})" if cls else "")
    reason = getattr(exc, "reason", None) or _exc_line(exc)
    if has_input:  # runtime capture itself failed (e.g. value-dependent code on meta)
        cause = exc.__cause__
        what = _exc_line(cause, 140) if cause is not None else _shorten(reason, 140)
        if device == "meta":
            return (
                f"capture failed: running on the meta device failed{where}: {what}; code "
                "that depends on tensor values needs --device cpu (with small --input tensors)"
            )
        return f"capture failed{where}: {what}"
    return (
        f"capture failed: symbolic tracing failed{where}: {_shorten(reason, 100)}; pass "
        "--input SPEC to capture at run time, --concrete-arg NAME=VALUE or --tracer "
        "PKG.MODULE:CLASS"
    )


def _error_module(exc: BaseException) -> str | None:
    """The ``module 'fqn' (Class)`` that runtime capture's note names, if any."""
    prefix = "While recording the execution order, in "
    for note in getattr(exc, "__notes__", None) or ():
        if isinstance(note, str) and note.startswith(prefix):
            return _shorten(note[len(prefix) :], 80)
    return None


def _load_report_json(path_text: str) -> tuple[Any, Any, dict[str, Any]]:
    """Read a saved report or a bare order.

    Returns:
        ``(order, plan, plan_data)``: the :class:`~tracing.ExecutionOrder`, the
        :class:`~execwrap.plan.WrapPlan` (``None`` for a bare order) and the
        report's ``"plan"`` dict (``{}`` for a bare order).

    Raises:
        CLIError: the file is missing, not JSON, or not an order/report; the
            message names the file and what is wrong.
    """
    from execwrap.errors import ExecwrapError
    from execwrap.plan import WrapPlan
    from execwrap.report import REPORT_SCHEMA_VERSION
    from tracing import ExecutionOrder

    path = Path(path_text)
    if not path.exists():
        raise CLIError(f"{path_text}: no such file")
    if path.is_dir():
        if not (path / "report.json").is_file():
            raise CLIError(f"{path_text}: is a folder without report.json")
        path = path / "report.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise CLIError(f"{path}: cannot read: {exc}") from exc
    except json.JSONDecodeError as exc:
        raise CLIError(f"{path}: not valid JSON ({exc})") from exc
    not_ours = f"{path} is not an execwrap report or order"
    if not isinstance(data, dict):
        raise CLIError(f"{not_ours} (a JSON {type(data).__name__}, not an object)")
    plan_data: Any = None
    if "order" in data and "module_forward_order" not in data:  # a report
        version = data.get("schema_version")
        if version is None:
            raise CLIError(f"{not_ours} (an 'order' but no 'schema_version')")
        if version != REPORT_SCHEMA_VERSION:
            raise CLIError(
                f"{path}: unsupported execwrap report schema_version {version!r} (this "
                f"execwrap reads version {REPORT_SCHEMA_VERSION}); write the report again "
                "with this version's 'execwrap report'"
            )
        plan_data = data.get("plan")
        data = data["order"]
    elif "schema_version" not in data and "module_forward_order" not in data:
        raise CLIError(f"{not_ours} (no 'schema_version' / 'module_forward_order')")
    try:
        order = ExecutionOrder.from_dict(data, source=str(path))
    except ValueError as exc:
        raise CLIError(_shorten(exc, 300)) from exc
    if plan_data is None:
        return order, None, {}
    try:
        plan = WrapPlan.from_dict(plan_data, order)
    except (ValueError, TypeError, KeyError, ExecwrapError) as exc:
        raise CLIError(f"{path}: malformed report 'plan': {_shorten(exc, 240)}") from exc
    return order, plan, plan_data


def _cmd_show(args: argparse.Namespace) -> int:
    from execwrap.report import format_bytes

    order, plan, plan_data = _load_report_json(args.file)
    classes = order.module_classes
    model_class = classes.get("", "model")
    print(f"{args.file}: {model_class}, captured {order.method} (torch {order.torch_version})")
    if order.fallback_reason:
        print(f"fallback reason: {_one_line(order.fallback_reason)}")
    print(f"\nforward order ({len(order.module_forward_order)} calls):")
    width = len(str(max(len(order.module_forward_order) - 1, 0)))
    for i, fqn in enumerate(order.module_forward_order):
        unit = ""
        if plan is not None:
            index = plan.unit_of_module(fqn)
            unit = f"  [unit {'-' if index is None else index}]"
        print(f"  {i:>{width}}  {_show_call(fqn)}  ({classes.get(fqn, '?')}){unit}")
    if order.param_backward_order:
        print(f"\nbackward gradient order ({len(order.param_backward_order)} parameters):")
        for i, fqn in enumerate(order.param_backward_order):
            print(f"  {i:>{width}}  {fqn}")
    if order.shared_params:
        print("\ntied parameters:")
        for canonical, aliases in order.shared_params.items():
            print(f"  {canonical} = {', '.join(aliases)}")
    if plan is None:
        print("\nno plan (a bare order)")
        return EXIT_OK
    bucket = "-" if plan.bucket_numel is None else f"{plan.bucket_numel} elements"
    print(f"\nplan: policy {plan.policy_name or '-'}, bucket size {bucket}")
    for i, unit in enumerate(plan.units):
        mods = ", ".join(_show_call(m) for m in unit.module_fqns)
        calls = (
            "never called" if unit.first_use is None else f"calls {unit.first_use}..{unit.last_use}"
        )
        print(
            f"  unit {i}: {mods}  ({len(unit.param_fqns)} parameters, {unit.numel} elements, "
            f"{format_bytes(unit.bytes)}, {calls})"
        )
    stats = plan_data.get("stats")
    if isinstance(stats, dict):
        print(
            f"stats (prefetch {stats.get('prefetch')}): {stats.get('num_units')} units, "
            f"{stats.get('all_gathers_per_step')} all-gathers/step, peak unsharded "
            f"{format_bytes(stats.get('peak_unsharded_bytes'))}"
        )
    for note in plan.notes:
        print(f"note: {note}")
    return EXIT_OK


def _cmd_diff(args: argparse.Namespace) -> int:
    from execwrap.divergence import first_divergence

    order_a, _, _ = _load_report_json(args.a)
    order_b, _, _ = _load_report_json(args.b)
    div = first_divergence(order_a, order_b, context=args.context)
    calls_a, calls_b = order_a.module_forward_order, order_b.module_forward_order
    if div is not None:
        index = div.index
        print(
            f"orders differ: first divergence at forward call {index}: "
            f"A runs {_show_call(div.expected)}, B runs {_show_call(div.found)}"
        )
        print(f"  A = {args.a} ({len(calls_a)} calls, {order_a.method})")
        print(f"  B = {args.b} ({len(calls_b)} calls, {order_b.method})")
        lo, hi = max(0, index - args.context), index + args.context + 1
        width = max([len(_show_call(c)) for c in div.context_a] + [len("A")])
        print(f"\n  {'':>6}  {'A':<{width}}   B")
        for i in range(lo, hi):
            x = calls_a[i] if i < len(calls_a) else None
            y = calls_b[i] if i < len(calls_b) else None
            if x is None and y is None:
                break
            mark = ">>" if i == index else ("  " if x == y else "!=")
            print(f"  {mark}{i:>4}  {_show_call(x):<{width}}   {_show_call(y)}")
        return EXIT_FINDING
    param_orders = [
        ("parameter forward order", order_a.param_forward_order, order_b.param_forward_order)
    ]
    if order_a.param_backward_order and order_b.param_backward_order:
        # (symbolic capture records no backward order)
        param_orders.append(
            ("parameter backward order", order_a.param_backward_order, order_b.param_backward_order)
        )
    for label, xs, ys in param_orders:
        param_div = first_divergence(xs, ys, context=0)
        if param_div is not None:
            print(
                f"orders differ: same {len(calls_a)} module calls, but the {label} "
                f"differs at position {param_div.index}: A {_show_call(param_div.expected)}, "
                f"B {_show_call(param_div.found)}"
            )
            return EXIT_FINDING
    print(
        f"orders are the same: {len(calls_a)} module calls, "
        f"{len(order_a.param_forward_order)} parameters in the same order"
    )
    return EXIT_OK


def _show_call(fqn: str | None) -> str:
    if fqn is None:
        return "(end)"
    return fqn or ROOT_NAME


# ------------------------------------------------------------------ output
def _one_line(value: Any) -> str:
    return " ".join(str(value).split())


def _shorten(value: Any, limit: int = 160) -> str:
    text = _one_line(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _print_table(rows: Sequence[tuple[str, str]]) -> None:
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"  {key:<{width}}  {value}")


# ------------------------------------------------------------------ parser
def build_parser() -> argparse.ArgumentParser:
    """The ``execwrap`` argument parser (subcommands ``report``, ``diff``, ``show``)."""
    verbose = _Parser(add_help=False)
    verbose.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=argparse.SUPPRESS,
        help="log progress (-v: INFO, -vv: DEBUG) to stderr",
    )
    parser = _Parser(
        prog=PROG,
        description="Execution-order FSDP wrap planning: capture, plan, report.",
        epilog="exit status: 0 success, 1 a finding (diff: orders differ), 2 bad usage or input",
        parents=[verbose],
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    report = sub.add_parser(
        "report",
        parents=[verbose],
        help="capture, plan and write a report (default: the built-in GPT model)",
        description=textwrap.fill(
            "Capture a model's execution order (symbolic with torch.fx first, falling back "
            "to one real forward/backward with the --input tensors), plan FSDP units, compare "
            "with baseline policies and write the report (report.json, calls.csv, "
            "params.csv, order.graphml, report.html). With no arguments: the built-in "
            "GPT-style model into ./execwrap-report/.",
            width=79,
            break_on_hyphens=False,
        ),
        epilog=INPUT_SPEC_HELP + "\n\n" + POLICY_HELP + "\n\n" + DEFAULTS_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    report.add_argument(
        "--model",
        metavar="PKG.MODULE:FACTORY",
        help="callable returning an nn.Module (default: the built-in GPT, "
        f"{DEFAULT_MODEL}); modules in the current folder are found",
    )
    report.add_argument(
        "--input",
        metavar="SPEC",
        help=f"example inputs (see below; default: {DEFAULT_DEMO_INPUT} for the built-in "
        "model, none otherwise: symbolic capture only)",
    )
    report.add_argument(
        "--policy",
        metavar="POLICY",
        help=f"wrap policy (see below; default: {DEFAULT_DEMO_POLICY} for the built-in "
        "model, always otherwise)",
    )
    report.add_argument(
        "--bucket-size",
        metavar="N",
        help="merge consecutive units into FSDP2 groups up to N elements (K/M/G suffixes; "
        f"'none' disables; default: {DEFAULT_DEMO_BUCKET} for the built-in model, none otherwise)",
    )
    report.add_argument(
        "--tracer",
        metavar="PKG.MODULE:CLASS",
        help="torch.fx.Tracer subclass for symbolic capture (default: torch.fx.Tracer)",
    )
    report.add_argument(
        "--concrete-arg",
        metavar="NAME=VALUE",
        action="append",
        help="keep forward argument NAME concrete while tracing; VALUE is a Python "
        "literal (repeatable), e.g. use_cache=False",
    )
    report.add_argument(
        "--device",
        choices=("cpu", "meta"),
        default="cpu",
        help="build the model and inputs here; meta allocates no weights (default: cpu)",
    )
    report.add_argument(
        "--prefetch",
        type=int,
        default=1,
        metavar="N",
        help="prefetch depth for the memory prediction (default: 1)",
    )
    report.add_argument(
        "--out", default=DEFAULT_OUT, metavar="DIR", help=f"output folder (default: {DEFAULT_OUT})"
    )
    report.add_argument(
        "--format",
        default="json,csv,graphml,html",
        metavar="LIST",
        help="comma-separated formats out of json,csv,graphml,html (default: all)",
    )
    report.set_defaults(func=_cmd_report)

    diff = sub.add_parser(
        "diff",
        parents=[verbose],
        help="first divergence between two saved orders (exit 1 when they differ)",
        description=(
            "Compare two saved orders (report.json files, report folders or bare "
            "ExecutionOrder JSON): print the first forward call where they part and an "
            "aligned view around it. Exit 1 when they differ, 0 when they are the same."
        ),
    )
    diff.add_argument("a", metavar="A.json")
    diff.add_argument("b", metavar="B.json")
    diff.add_argument(
        "--context", type=int, default=3, metavar="N", help="calls shown each side (default: 3)"
    )
    diff.set_defaults(func=_cmd_diff)

    show = sub.add_parser(
        "show",
        parents=[verbose],
        help="print a saved order and its plan",
        description="Print the order and plan of a saved report.json (or a bare saved "
        "ExecutionOrder JSON, or a report folder).",
    )
    show.add_argument("file", metavar="ORDER.json")
    show.set_defaults(func=_cmd_show)
    return parser


def _configure_logging(verbosity: int) -> Callable[[], None]:
    """Send the ``execwrap`` and ``tracing`` loggers to stderr at the chosen level.

    Only :func:`main` calls this.

    Returns:
        A function that removes the handlers again and restores the levels
        (so that calling :func:`main` in-process leaves logging as it was).
    """
    level = logging.WARNING if verbosity <= 0 else logging.INFO if verbosity == 1 else logging.DEBUG
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    saved: list[tuple[logging.Logger, int]] = []
    for name in ("execwrap", "tracing"):
        log = logging.getLogger(name)
        saved.append((log, log.level))
        log.addHandler(handler)
        log.setLevel(level)

    def restore() -> None:
        for log, old_level in saved:
            log.removeHandler(handler)
            log.setLevel(old_level)

    return restore


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``execwrap`` command line.

    Args:
        argv: arguments without the program name (default: ``sys.argv[1:]``).

    Returns:
        The exit status: 0 success, 1 a finding (``diff``: orders differ), 2 bad
        usage or input (one ``execwrap: error: ...`` line printed to stderr).
    """
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help (0) or a usage error (2, already printed)
        return int(exc.code or 0) if not isinstance(exc.code, str) else EXIT_USAGE
    if getattr(args, "func", None) is None:
        print(
            f"{PROG}: error: a command is required: report, diff or show (see '{PROG} --help')",
            file=sys.stderr,
        )
        return EXIT_USAGE
    restore_logging = _configure_logging(getattr(args, "verbose", 0))
    try:
        return int(args.func(args))
    except CLIError as exc:
        logger.debug("error details", exc_info=True)
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    finally:
        restore_logging()
