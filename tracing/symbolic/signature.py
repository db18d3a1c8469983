"""The root's forward, as symbolic capture calls it: inputs bound to its signature.

``torch.fx`` builds the root of a trace from the code object of
``type(model).forward``: one placeholder (a Proxy) per parameter, ``*args`` and
``**kwargs`` included. Two things go wrong with that on the models people
train:

* a forward decorated with ``functools.wraps`` (transformers 5 wraps every
  ``forward`` in ``can_return_tuple`` / ``check_model_inputs``), or one that
  takes ``**kwargs``, fails in fx before the first module runs
  (``ValueError: code: co_varnames is too small``: fx reads the parameters of
  the unwrapped function and patches the wrapper's smaller code object);
* an optional argument that is not passed (``attn_mask=None``) becomes a Proxy
  too, so ``attn_mask is not None`` is true during the trace and the trace
  takes a branch the real forward never takes, without any error.

:func:`bind_root` builds a :class:`RootCall` instead: the tensors of the
example inputs, bound to ``forward``'s signature with
:meth:`inspect.Signature.bind`, become the placeholders (every tensor inside a
list, tuple or dict too, flattened with torch's pytree); every other bound
value stays concrete, and every parameter that is not passed keeps its default
(what transformers' ``HFTracer`` did with ``input_names``). Without example
inputs every named parameter not in ``concrete_args`` becomes a placeholder, as
plain fx does, and :attr:`RootCall.proxied_optional` names the optional ones
(the trace's result warns about them). :meth:`RootCall.function` is then an
undecorated function with exactly those parameters that calls the model's
real, decorated ``forward`` with the bound arguments, so the decorators still
run and fx sees only a plain signature.
"""

from __future__ import annotations

import contextlib
import inspect
import keyword
import typing
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from types import FunctionType
from typing import Any

import torch
import torch.fx
import torch.nn as nn
import torch.utils._pytree as pytree

__all__ = [
    "RootCall",
    "as_args",
    "bind_root",
    "check_concrete_args",
    "forward_signature",
    "root_patched",
]

_VAR_KINDS = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
#: Names the generated root function uses itself.
_RESERVED = frozenset({"self", "_call"})


def as_args(example_inputs: Any) -> tuple[Any, ...]:
    """Positional example inputs as a tuple: ``None`` -> ``()``, a tuple as is,
    anything else (e.g. one tensor) as one argument."""
    if example_inputs is None:
        return ()
    if isinstance(example_inputs, tuple):
        return example_inputs
    return (example_inputs,)


def forward_signature(model: nn.Module) -> inspect.Signature:
    """The signature of ``type(model).forward`` without ``self``, as fx traces it.

    ``inspect.signature`` follows ``functools.wraps`` (``__wrapped__``), so a
    decorated forward gives the parameters of the function it wraps.

    Raises:
        TypeError: the signature cannot be read (e.g. a C-implemented forward).
    """
    forward = type(model).forward
    try:
        sig = inspect.signature(forward)
    except (TypeError, ValueError) as e:
        raise TypeError(f"cannot read the signature of {type(model).__name__}.forward: {e}") from e
    params = list(sig.parameters.values())
    return sig.replace(parameters=params[1:])


def _typed_kwargs(model: nn.Module, param: inspect.Parameter) -> frozenset[str] | None:
    """The keys of a ``**kwargs: Unpack[SomeTypedDict]`` annotation (PEP 692), else None.

    String annotations (``from __future__ import annotations``) are resolved
    with :func:`typing.get_type_hints`; one that cannot be resolved counts as
    no annotation.
    """
    annotation: Any = param.annotation
    if isinstance(annotation, str):
        try:
            hints = typing.get_type_hints(inspect.unwrap(type(model).forward), include_extras=True)
        except Exception:  # noqa: BLE001 - unresolvable names: no annotation
            return None
        annotation = hints.get(param.name)
    origin = typing.get_origin(annotation)
    if origin is None or "Unpack" not in repr(origin) or not typing.get_args(annotation):
        return None
    keys = getattr(typing.get_args(annotation)[0], "__annotations__", None)
    return frozenset(keys) if keys else None


def _display(sig: inspect.Signature) -> str:
    """``(xs, *, reverse=False)``: the signature without annotations."""
    empty = inspect.Parameter.empty
    params = [p.replace(annotation=empty) for p in sig.parameters.values()]
    return str(sig.replace(parameters=params, return_annotation=empty))


def check_concrete_args(model: nn.Module, concrete_args: Mapping[str, Any] | None) -> None:
    """Check that every ``concrete_args`` name is an argument of ``model.forward``.

    A name is valid when ``forward`` has a parameter of that name, or takes
    ``**kwargs`` (then any name goes into ``kwargs``). An undecorated forward
    whose ``**kwargs`` is annotated ``Unpack[SomeTypedDict]`` (PEP 692) takes
    only that TypedDict's keys; a decorated one may consume other names in its
    decorator (transformers' ``return_dict``), so any name is accepted there.

    Raises:
        ValueError: a name ``forward`` does not take; the message names the
            model class and lists the valid names.

    Example:
        >>> check_concrete_args(nn.Linear(2, 2), {"inputs": None})
        Traceback (most recent call last):
        ...
        ValueError: concrete_args: Linear.forward has no argument 'inputs'; its arguments are 'input'
    """
    if not concrete_args:
        return
    sig = forward_signature(model)
    named = [p.name for p in sig.parameters.values() if p.kind not in _VAR_KINDS]
    var_kw = next(
        (p for p in sig.parameters.values() if p.kind is inspect.Parameter.VAR_KEYWORD), None
    )
    typed = None
    if var_kw is not None and not _is_decorated(type(model).forward):
        typed = _typed_kwargs(model, var_kw)
    if var_kw is not None and typed is None:
        return  # any name goes into **kwargs
    valid = list(dict.fromkeys(named + sorted(typed or ())))
    unknown = [name for name in concrete_args if name not in valid]
    if unknown:
        listed = ", ".join(repr(n) for n in valid) or "(none)"
        raise ValueError(
            f"concrete_args: {type(model).__name__}.forward has no argument "
            f"{', '.join(repr(n) for n in unknown)}; its arguments are {listed}"
        )


@dataclass(frozen=True)
class RootCall:
    """How the root's ``forward`` is called during one trace.

    Attributes:
        signature: ``forward``'s signature without ``self``.
        placeholder_names: the generated function's parameters, one per traced
            input tensor (fx makes each a placeholder, i.e. a Proxy).
        proxied_optional: optional ``forward`` arguments (with a default) that
            became Proxies although nothing says they are passed: only without
            example inputs.
        bound: whether example inputs were bound (else every named argument
            not in ``concrete_args`` is a placeholder, as in plain fx).
        replaces_root: whether fx traces :meth:`function` instead of
            ``forward``: with example inputs, or for a decorated ``forward``
            (which plain fx cannot build a root from). Otherwise fx traces
            ``forward`` itself with :attr:`fx_concrete_args`, exactly as plain
            fx does (``*args``/``**kwargs`` become one Proxy each).
        fx_concrete_args: what to pass as ``concrete_args`` to ``Tracer.trace``.
    """

    signature: inspect.Signature
    placeholder_names: tuple[str, ...]
    proxied_optional: tuple[str, ...]
    bound: bool
    replaces_root: bool
    fx_concrete_args: dict[str, Any] | None
    _leaves: tuple[Any, ...]
    _slots: tuple[int, ...]
    _spec: pytree.TreeSpec
    _fixed: dict[str, Any]

    def function(self, forward: Callable[..., Any]) -> FunctionType:
        """An undecorated ``forward(self, <placeholders>)`` that calls ``forward``.

        fx reads this function's code object (plain positional parameters, no
        ``*args``/``**kwargs``, no ``__wrapped__``), so it never patches the
        decorated original; the original still runs, with every concrete value.
        """
        leaves, slots, spec, sig = self._leaves, self._slots, self._spec, self.signature
        fixed = self._fixed

        def call(module: nn.Module, values: tuple[Any, ...]) -> Any:
            filled = list(leaves)
            for slot, value in zip(slots, values, strict=True):
                filled[slot] = value
            arguments = _with_fixed(sig, pytree.tree_unflatten(filled, spec), fixed)
            bound = inspect.BoundArguments(sig, arguments)  # type: ignore[arg-type]
            return forward(module, *bound.args, **bound.kwargs)

        names = ", ".join(self.placeholder_names)
        source = f"def forward(self{', ' if names else ''}{names}):\n"
        source += f"    return _call(self, ({names}{',' if names else ''}))\n"
        namespace: dict[str, Any] = {"_call": call}
        exec(compile(source, "<tracing.symbolic root>", "exec"), namespace)  # noqa: S102
        fn: FunctionType = namespace["forward"]
        fn.__qualname__ = getattr(forward, "__qualname__", "forward")
        return fn


def _placeholder_name(base: str, taken: set[str]) -> str:
    name = "".join(c if c.isalnum() or c == "_" else "_" for c in base) or "input"
    if name[0].isdigit() or keyword.iskeyword(name) or name in _RESERVED:
        name = f"input_{name}"
    candidate, n = name, 1
    while candidate in taken:
        candidate, n = f"{name}_{n}", n + 1
    taken.add(candidate)
    return candidate


def bind_root(
    model: nn.Module,
    *,
    args: tuple[Any, ...] | None = None,
    kwargs: Mapping[str, Any] | None = None,
    concrete_args: Mapping[str, Any] | None = None,
) -> RootCall:
    """Bind the example inputs (or, without them, every argument) to ``forward``.

    Args:
        model: the root module.
        args: positional example inputs, or ``None`` (with ``kwargs`` ``None``
            too: no example inputs).
        kwargs: keyword example inputs.
        concrete_args: arguments kept concrete at the given value (they win
            over an example input of the same name).

    Returns:
        The :class:`RootCall`.

    Raises:
        ValueError: a ``concrete_args`` name ``forward`` does not take.
        TypeError: the example inputs do not fit ``forward``'s signature (the
            message shows the signature and the error of ``Signature.bind``).

    Example:
        >>> call = bind_root(nn.Linear(2, 2), args=(torch.ones(1, 2),))
        >>> call.placeholder_names, call.proxied_optional
        (('input',), ())
    """
    check_concrete_args(model, concrete_args)
    sig = forward_signature(model)
    fixed = dict(concrete_args or {})
    has_inputs = args is not None or kwargs is not None
    if has_inputs:
        arguments = _bound_arguments(model, sig, tuple(args or ()), dict(kwargs or {}))
        proxied_optional: tuple[str, ...] = ()
    else:
        arguments, proxied_optional = _all_arguments(sig, fixed)
    for name in fixed:
        arguments.pop(name, None)  # a concrete argument wins over an example input
    paths, spec = pytree.tree_flatten_with_path(arguments)
    slots: list[int] = []
    names: list[str] = []
    taken: set[str] = set()
    leaves: list[Any] = []
    for i, (path, leaf) in enumerate(paths):
        if isinstance(leaf, (torch.Tensor, _Placeholder)):
            slots.append(i)
            names.append(_placeholder_name(_path_name(path), taken))
            leaf = None
        leaves.append(leaf)
    replaces_root = has_inputs or _is_decorated(type(model).forward)
    return RootCall(
        signature=sig,
        placeholder_names=tuple(names),
        proxied_optional=proxied_optional,
        bound=has_inputs,
        replaces_root=replaces_root,
        fx_concrete_args=None
        if replaces_root
        else (dict(concrete_args) if concrete_args else None),
        _leaves=tuple(leaves),
        _slots=tuple(slots),
        _spec=spec,
        _fixed=fixed,
    )


def _is_decorated(forward: Any) -> bool:
    """Whether ``forward`` wraps another function (``functools.wraps`` sets ``__wrapped__``)."""
    return inspect.unwrap(forward) is not forward


class _Placeholder:
    """Stands for an argument that fx makes a Proxy (no example inputs)."""


def _bound_arguments(
    model: nn.Module, sig: inspect.Signature, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> dict[str, Any]:
    try:
        bound = sig.bind(*args, **kwargs)
    except TypeError as e:
        raise TypeError(
            f"the example inputs do not fit {type(model).__name__}.forward{_display(sig)}: {e}"
        ) from e
    return dict(bound.arguments)


def _all_arguments(
    sig: inspect.Signature, concrete: Mapping[str, Any]
) -> tuple[dict[str, Any], tuple[str, ...]]:
    """Every named argument not in ``concrete`` as a placeholder, and the optional ones."""
    arguments: dict[str, Any] = {}
    optional: list[str] = []
    for name, p in sig.parameters.items():
        if p.kind in _VAR_KINDS or name in concrete:
            continue
        arguments[name] = _Placeholder()
        if p.default is not inspect.Parameter.empty:
            optional.append(name)
    return arguments, tuple(optional)


def _with_fixed(
    sig: inspect.Signature, arguments: dict[str, Any], fixed: Mapping[str, Any]
) -> dict[str, Any]:
    """``arguments`` plus the concrete ones, in signature order (names that
    ``forward`` does not have by name go into its ``**kwargs``)."""
    if fixed:
        var_kw = next((p.name for p in sig.parameters.values() if p.kind is p.VAR_KEYWORD), None)
        for name, value in fixed.items():
            if name in sig.parameters and name != var_kw:
                arguments[name] = value
            elif var_kw is not None:
                arguments[var_kw] = {**arguments.get(var_kw, {}), name: value}
    return {name: arguments[name] for name in sig.parameters if name in arguments}


def _path_name(path: tuple[Any, ...]) -> str:
    """``input_ids`` for a top-level argument, ``past_0_1`` for one inside containers."""
    parts: list[str] = []
    for entry in path:
        for attr in ("key", "idx", "name"):
            if hasattr(entry, attr):
                parts.append(str(getattr(entry, attr)))
                break
    return "_".join(parts)


@contextlib.contextmanager
def root_patched(tracer: torch.fx.Tracer, root_call: RootCall) -> Iterator[None]:
    """Make ``tracer`` trace ``root_call.function(forward)`` as the root, for one trace.

    The tracer instance's ``create_args_for_root`` is wrapped (an instance
    attribute, removed or put back afterwards, also when tracing fails); the
    class's own method, e.g. a custom tracer's override, still builds the
    placeholders, from the generated function.
    """
    if not root_call.replaces_root:
        yield
        return
    had = "create_args_for_root" in vars(tracer)
    saved = vars(tracer).get("create_args_for_root")
    orig = tracer.create_args_for_root

    def create_args_for_root(
        root_fn: Callable[..., Any], is_module: bool, concrete_args: Any = None
    ) -> tuple[Any, list[Any]]:
        return orig(root_call.function(root_fn), is_module, None)

    tracer.create_args_for_root = create_args_for_root  # type: ignore[method-assign]
    try:
        yield
    finally:
        if had:
            tracer.create_args_for_root = saved  # type: ignore[method-assign,assignment]
        else:
            del tracer.create_args_for_root
