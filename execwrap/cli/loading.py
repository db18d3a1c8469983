"""What ``execwrap report`` imports by name: the model factory, the tracer, the policy.

``--model PKG.MODULE:FACTORY`` and ``--tracer PKG.MODULE:CLASS`` are imported
(a module the user names that is not installed is found in the current folder,
whose path is then added to ``sys.path``; the folder is never added otherwise,
so a file there named like a module torch imports lazily is not imported);
``--policy`` becomes an FSDP init policy, its class names looked up among the
model's modules. The syntax of each was checked already
(:mod:`execwrap.cli.options`); here the imports and the model can fail, and
each failure is a :class:`~execwrap.cli.errors.CLIError` naming the option.
"""

from __future__ import annotations

import functools
import importlib
import os
import sys
from typing import Any

import torch
import torch.fx
import torch.nn as nn
from torch.distributed.fsdp.wrap import (
    ModuleWrapPolicy,
    always_wrap_policy,
    size_based_auto_wrap_policy,
    transformer_auto_wrap_policy,
)

from execwrap.cli.errors import CLIError
from execwrap.cli.options import parse_policy_spec, split_object_path
from execwrap.cli.text import article
from tracing import TracingConfig

__all__ = ["baseline_policies", "import_object", "load_model", "parse_policy", "tracing_config"]


def import_object(path: str, what: str) -> Any:
    """Import ``PKG.MODULE:NAME`` (``NAME`` may be dotted: ``Outer.inner``).

    Args:
        path: the object path.
        what: the option it came from, for messages (e.g. ``"--model"``).

    Raises:
        CLIError: malformed path, module not importable, or no such name.
    """
    module_name, attr = split_object_path(path, what)
    try:
        module = _import_named(module_name)
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


def _import_named(module_name: str) -> Any:
    """Import ``module_name`` as installed; failing that, from the current folder when
    the module the user named is a file or package there (``./NAME.py``, ``./NAME/``):
    then, and only then, that folder goes on ``sys.path`` (at its end, so installed
    modules still come first). A run that names no module of the current folder never
    puts it on ``sys.path``, so a stray file there named like a module torch imports
    lazily (``tabulate.py``) is not imported in place of the real one."""
    top = module_name.split(".")[0]
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        folder = os.getcwd()
        named_here = os.path.isfile(os.path.join(folder, f"{top}.py")) or os.path.isdir(
            os.path.join(folder, top)
        )
        if exc.name != top or not named_here or folder in sys.path:
            raise
    sys.path.append(folder)
    return importlib.import_module(module_name)


def load_model(path: str, device: str) -> nn.Module:
    """Build the model from ``PKG.MODULE:FACTORY`` (called with no arguments).

    On ``device="meta"`` the factory runs under ``torch.device("meta")``, so
    no memory is allocated for weights.

    Raises:
        CLIError: the factory cannot be imported, raises, or returns no module.
    """
    factory = import_object(path, "--model")
    if not callable(factory):
        raise CLIError(
            f"--model {path!r} is {article(type(factory).__name__)}, not a callable factory"
        )
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
            f"--model {path!r}: the factory returned {article(type(model).__name__)}, "
            "expected a torch.nn.Module"
        )
    return model.to(device) if device != "meta" else model


def tracing_config(tracer_path: str | None, concrete_args: dict[str, Any]) -> TracingConfig:
    """The :class:`~tracing.TracingConfig` of ``--tracer`` and ``--concrete-arg``.

    Raises:
        CLIError: the tracer is not a ``torch.fx.Tracer`` subclass, or creating it raised.
    """
    tracer: torch.fx.Tracer
    if tracer_path:
        tracer_cls = import_object(tracer_path, "--tracer")
        if not (isinstance(tracer_cls, type) and issubclass(tracer_cls, torch.fx.Tracer)):
            raise CLIError(f"--tracer {tracer_path!r} is not a torch.fx.Tracer subclass")
        try:
            tracer = tracer_cls()
        except Exception as exc:
            raise CLIError(
                f"--tracer {tracer_path!r}: creating it raised {type(exc).__name__}: {exc}"
            ) from exc
    else:
        tracer = torch.fx.Tracer()
    return TracingConfig(tracer=tracer, concrete_args=concrete_args or None)


def parse_policy(text: str, model: Any) -> Any:
    """Turn a ``--policy`` value into an FSDP init policy (see
    :data:`~execwrap.cli.options.POLICY_HELP`).

    Raises:
        CLIError: an unknown kind, a class not in the model, a bad size.
    """
    spec = parse_policy_spec(text)
    if spec.kind == "always":
        return always_wrap_policy
    if spec.kind == "none":  # no policy: the root alone, as asked (plan_wrap does not warn)
        return None
    if spec.kind == "size":
        return functools.partial(size_based_auto_wrap_policy, min_num_params=spec.min_num_params)
    classes = _resolve_classes(spec.class_names, model, spec.what)
    if spec.kind == "transformer":
        return functools.partial(transformer_auto_wrap_policy, transformer_layer_cls=classes)
    return ModuleWrapPolicy(classes)


def baseline_policies(
    policy_text: str, init_policy: Any, bucket_numel: int | str | None
) -> dict[str, Any]:
    """The policies a report compares its plan with, by baseline name: the
    chosen policy without buckets (when bucketed), and always_wrap_policy (or
    the root alone when the plan is always_wrap_policy without buckets)."""
    policies: dict[str, Any] = {}
    if bucket_numel is not None:
        policies[f"{policy_text} (no buckets)"] = init_policy
    if policy_text == "always" and bucket_numel is None:
        policies["none (root only)"] = None  # plan_wrap's root alone, without a warning
    else:
        policies["always"] = always_wrap_policy
    return policies


def _resolve_classes(names: tuple[str, ...], model: Any, what: str) -> set[type]:
    """The classes named: ``PKG.MODULE:CLASS`` paths, or class names among the model's modules."""
    found: dict[str, set[type]] = {}
    for module in model.modules():
        found.setdefault(type(module).__name__, set()).add(type(module))
    classes: set[type] = set()
    for name in names:
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
    return classes
