"""Runtime execution-order capture: one real forward/backward under hooks.

Symbolic tracing fails on most real models (data-dependent branches, tensor
factories with traced sizes, iteration over proxies). Runtime capture runs the
model instead and records:

* module calls, from forward pre-hooks on every module (repeats kept);
* parameter uses, from a :class:`torch.overrides.TorchFunctionMode` that is
  active only while a module's forward runs and sees every torch call with its
  arguments, so parameters used functionally at any depth (root-level
  ``F.linear(x, self.weight)``, ``self.wpe[:n]``, parameters inside lists or
  passed by keyword) are found as well as those of leaf modules;
* gradient-ready order, from ``register_post_accumulate_grad_hook`` on each
  parameter (a tensor hook on the unsharded view for FSDP1);
* recomputation under activation checkpointing: a module call made while
  autograd runs a backward pass (``torch._C._current_graph_task_id() != -1``)
  is a recompute, kept apart from the forward order.

Nothing is stored on the user's modules or parameters: every handle lives on
the :class:`RuntimeRecorder` and is removed in ``finally``.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import logging
import math
import sys
from collections.abc import Callable, Iterable
from types import TracebackType
from typing import Any, NamedTuple

import torch
import torch.nn as nn
from torch.overrides import TorchFunctionMode
from torch.utils.hooks import RemovableHandle

from tracing.errors import TracingError
from tracing.fqn import clean_fqn, is_wrapper_module, join_fqn, original_class_name, owner_fqn
from tracing.nested import default_loss, tensors_in
from tracing.order import ExecutionOrder, ParamInfo, ParamUse, param_info
from tracing.uses import METADATA_METHODS

__all__ = [
    "RecorderState",
    "RuntimeRecorder",
    "record_execution_order",
]

logger = logging.getLogger(__name__)

_METADATA_ATTRIBUTES = frozenset(
    {
        "shape",
        "dtype",
        "device",
        "requires_grad",
        "is_leaf",
        "grad",
        "grad_fn",
        "ndim",
        "layout",
        "is_cuda",
        "is_meta",
        "is_cpu",
        "is_sparse",
        "is_quantized",
        "names",
        "_version",
        "_base",
        "itemsize",
        "nbytes",
        "data",
    }
)
_CONTAINERS = (list, tuple)


class RecorderState(enum.Enum):
    """Life cycle of a :class:`RuntimeRecorder` (like FSDP2's ``TrainingState``)."""

    #: Hooks installed, recording every forward/backward that runs.
    RECORDING = "recording"
    #: Hooks removed; :attr:`RuntimeRecorder.order` is available.
    FINISHED = "finished"
    #: Hooks removed after the recorded block raised; no order.
    FAILED = "failed"


class _CallKind(enum.Enum):
    """Why a module's forward runs."""

    FORWARD = "forward"
    #: re-run during backward by activation checkpointing.
    RECOMPUTE = "recompute"
    #: a wrapper's own forward (FSDP1 unshard/reshard, checkpointing): its
    #: tensor calls outside the wrapped module are not the model's.
    WRAPPER = "wrapper"


class _Frame(NamedTuple):
    """One running module call on the recorder's stack."""

    module: nn.Module
    #: (module FQN, call index) whose torch calls are uses; None unless FORWARD.
    target: tuple[str, int] | None
    #: this frame pushed the TorchFunctionMode (the outermost frame).
    pushed_mode: bool


class _ParamUseMode(TorchFunctionMode):
    """Sees every torch call during forward and reports parameter arguments.

    Per call it does one attribute read when no module forward is being
    recorded, else one ``dict`` lookup of ``id(arg)`` per argument (lists and
    tuples are looked into); only calls that have a parameter among their
    arguments do more work.
    """

    def __init__(self, recorder: RuntimeRecorder) -> None:
        super().__init__()
        self._recorder = recorder
        self._param_of = recorder._param_of

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Iterable[type],
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        if kwargs is None:
            kwargs = {}
        if self._recorder._target is not None:
            get = self._param_of.get
            found = _scan(args, get, None)
            if kwargs:
                found = _scan(kwargs.values(), get, found)
            if found is not None:
                self._recorder._on_param_op(func, found)
        return func(*args, **kwargs)


def _scan(
    values: Iterable[Any], get: Callable[[int], str | None], found: list[str] | None
) -> list[str] | None:
    """Append the FQN of every parameter in ``values`` (lists/tuples looked into)."""
    for a in values:
        fqn = get(id(a))
        if fqn is not None:
            if found is None:
                found = [fqn]
            else:
                found.append(fqn)
        elif type(a) in _CONTAINERS:
            found = _scan(a, get, found)
    return found


def _op_name(func: Callable[..., Any]) -> str | None:
    """A readable op name, or ``None`` for metadata reads (not uses)."""
    name = getattr(func, "__name__", None) or type(func).__name__
    if name == "__get__":  # property getter: Tensor.T, Tensor.shape, ...
        attr = getattr(getattr(func, "__self__", None), "__name__", "__get__")
        return None if attr in _METADATA_ATTRIBUTES else attr
    if name in METADATA_METHODS:
        return None
    if name.startswith("__") and name.endswith("__") and len(name) > 4:
        return name[2:-2]  # __getitem__ -> getitem, like operator.getitem
    return name


class RuntimeRecorder:
    """Record a model's execution order while it really runs.

    Creating the recorder installs forward pre-/post-hooks on every module and
    gradient-ready hooks on every trainable parameter; every forward and
    backward that runs until :meth:`remove` (or the end of the ``with`` block)
    is recorded. While a module's forward runs, a
    :class:`torch.overrides.TorchFunctionMode` reports every torch call that
    takes a parameter (at any nesting depth, by keyword, inside lists or
    tuples). The mode is pushed when the outermost recorded module starts and
    popped when it ends, so backward and code outside the model run without it.

    Names are those of the original model: on a model wrapped by FSDP1
    (``FullyShardedDataParallel``), ``CheckpointWrapper`` or ``torch.compile``
    the wrappers are skipped and their prefixes (``_fsdp_wrapped_module.``,
    ``_checkpoint_wrapped_module.``, ``_orig_mod.``) removed; FSDP2
    (``fully_shard``) keeps names, and its ``FSDP<Name>`` classes are reported
    as ``<Name>``. Parameters that a wrapper swaps in during forward (FSDP2's
    unsharded parameters, FSDP1's unsharded views with ``use_orig_params=True``)
    are recognised by module and attribute name when the module is called.
    A wrapper's own tensor calls (FSDP1's unshard/reshard around the wrapped
    module) are not recorded as uses. With FSDP1 ``use_orig_params=True`` the
    gradient-ready order comes from tensor hooks on the unsharded views, which
    autograd runs in the views' creation order: it is exact per FSDP unit, but
    inside a unit it can differ from the unwrapped model's order.
    With FSDP1 ``use_orig_params=False`` the original parameters no longer
    exist as tensors of their own: ``params`` and the backward order name the
    ``FlatParameter`` of each unit (``<unit>._flat_param``), and forward uses
    of the original parameters are not seen.

    The recorder never changes the model and does not touch ``.grad`` or the
    RNG (use :func:`record_execution_order` for a self-contained capture that
    restores them).

    Args:
        model: the model (wrapped or not); any ``nn.Module``.

    Attributes:
        state: the recorder's :class:`RecorderState`.

    Example:
        >>> model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
        >>> with RuntimeRecorder(model) as rec:
        ...     model(torch.randn(3, 4)).sum().backward()
        >>> rec.order.module_forward_order
        ['', '0', '1', '2']
        >>> rec.order.param_backward_order
        ['2.bias', '2.weight', '0.bias', '0.weight']
    """

    def __init__(self, model: nn.Module) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"RuntimeRecorder needs an nn.Module, got {type(model).__name__}")
        self._model = model
        self.state = RecorderState.RECORDING
        self._handles: list[RemovableHandle] = []
        self._order: ExecutionOrder | None = None

        # id(tensor) -> canonical clean FQN; tensors kept alive in _keep so
        # that an id can never be reused by another object while recording.
        self._param_of: dict[int, str] = {}
        self._keep: list[torch.Tensor] = []
        # id(module) -> [(attribute name, canonical FQN)] of its direct params.
        self._direct: dict[int, list[tuple[str, str]]] = {}

        self._module_forward_order: list[str] = []
        self._param_forward_order: list[str] = []
        self._seen_params: set[str] = set()
        self._param_uses: list[ParamUse] = []
        self._param_backward_order: list[str] = []
        # canonical FQN -> id() of the tensor whose gradient was recorded ready
        self._bwd_seen: dict[str, int] = {}
        self._recompute_order: list[str] = []
        self._stack: list[_Frame] = []
        #: (module FQN, call index) whose ops are being recorded, else None.
        self._target: tuple[str, int] | None = None
        #: innermost module an exception unwound through: (fqn, class, exc).
        self._error: tuple[str, str, BaseException] | None = None

        self._build_param_maps(model)
        self._mode = _ParamUseMode(self)
        try:
            self._install_hooks()
        except BaseException:
            self._remove_handles()
            raise

    # ----------------------------------------------------------------- setup
    def _build_param_maps(self, model: nn.Module) -> None:
        """One pass over the modules: canonical names, tied names, classes."""
        id_to_canonical: dict[int, str] = {}
        shared: dict[str, list[str]] = {}
        #: (clean FQN, canonical FQN) of every parameter name, tied ones included.
        self._names: list[tuple[str, str]] = []
        #: canonical FQN -> the parameter tensor at install time.
        self._param_tensors: dict[str, torch.Tensor] = {}
        #: canonical FQN -> shape of the tensor a wrapper swapped in.
        self._live_shapes: dict[str, tuple[int, ...]] = {}
        self._module_classes: dict[str, str] = {}
        self._modules: list[tuple[str, nn.Module, bool]] = []
        seen_modules: set[int] = set()
        for name, module in model.named_modules(remove_duplicate=False):
            wrapper = is_wrapper_module(module)
            fqn = clean_fqn(name)
            if id(module) not in seen_modules:  # like named_modules(): first name only
                seen_modules.add(id(module))
                self._modules.append((fqn, module, wrapper))
                if not wrapper and fqn not in self._module_classes:
                    self._module_classes[fqn] = original_class_name(module)
            direct: list[tuple[str, str]] = []
            for pname, p in module._parameters.items():
                if p is None:
                    continue
                pfqn = join_fqn(fqn, pname)
                canonical = id_to_canonical.setdefault(id(p), pfqn)
                if canonical == pfqn:
                    self._param_tensors[canonical] = p
                elif pfqn not in shared.get(canonical, ()):
                    shared.setdefault(canonical, []).append(pfqn)
                self._names.append((pfqn, canonical))
                direct.append((pname, canonical))
            if direct:
                self._direct[id(module)] = direct
        self._shared = shared
        for canonical, p in self._param_tensors.items():
            self._map_tensor(p, canonical)

    def _install_hooks(self) -> None:
        for fqn, module, wrapper in self._modules:
            pre = self._pre_wrapper if wrapper else self._pre_forward
            self._handles.append(module.register_forward_pre_hook(functools.partial(pre, fqn)))
            self._handles.append(
                module.register_forward_hook(
                    functools.partial(self._post_forward, fqn), always_call=True
                )
            )

    def _map_tensor(self, t: torch.Tensor, fqn: str) -> None:
        """Know ``t`` as parameter ``fqn`` and hook its gradient.

        Called once per tensor: every caller skips tensors already in
        ``_param_of``, so a tensor is never hooked twice.
        """
        self._param_of[id(t)] = fqn
        self._keep.append(t)
        if not t.requires_grad:
            return
        if t.is_leaf:
            self._handles.append(
                t.register_post_accumulate_grad_hook(functools.partial(self._on_grad_ready, fqn))
            )
        else:  # a view swapped in by a wrapper (FSDP1 use_orig_params=True)
            self._handles.append(t.register_hook(functools.partial(self._on_grad_ready, fqn)))

    # ----------------------------------------------------------------- hooks
    def _push(self, module: nn.Module, kind: _CallKind, target: tuple[str, int] | None) -> None:
        pushed = not self._stack and kind is not _CallKind.RECOMPUTE
        if pushed:
            self._mode.__enter__()
        self._stack.append(_Frame(module, target, pushed))
        self._target = target

    def _pre_wrapper(self, fqn: str, module: nn.Module, args: Any) -> None:
        self._push(module, _CallKind.WRAPPER, None)

    def _pre_forward(self, fqn: str, module: nn.Module, args: Any) -> None:
        self._target = None  # the recorder's own tensor calls below are no uses
        direct = self._direct.get(id(module))
        if direct is not None:
            self._refresh(module, direct)
        if torch._C._current_graph_task_id() != -1:
            self._recompute_order.append(fqn)
            self._push(module, _CallKind.RECOMPUTE, None)
            return
        target = (fqn, len(self._module_forward_order))
        self._module_forward_order.append(fqn)
        self._push(module, _CallKind.FORWARD, target)

    def _post_forward(self, fqn: str, module: nn.Module, args: Any, output: Any) -> None:
        if self._error is None:
            exc = sys.exc_info()[1]
            if exc is not None and not is_wrapper_module(module):
                self._error = (fqn, original_class_name(module), exc)
        stack = self._stack
        if stack and stack[-1].module is module:
            if stack.pop().pushed_mode:
                self._pop_mode()
        else:  # a hook that ran before ours raised: drop the frames above this call
            for i in range(len(stack) - 1, -1, -1):
                if stack[i].module is module:
                    for frame in reversed(stack[i:]):
                        if frame.pushed_mode:
                            self._pop_mode()
                    del stack[i:]
                    break
        self._target = stack[-1].target if stack else None

    def _refresh(self, module: nn.Module, direct: list[tuple[str, str]]) -> None:
        """Map the tensors a wrapper swapped in for ``module``'s parameters."""
        params = module._parameters
        attrs = module.__dict__
        for name, fqn in direct:
            t = params.get(name)
            if t is None:
                t = attrs.get(name)
            if t is None or id(t) in self._param_of or not isinstance(t, torch.Tensor):
                continue
            self._map_tensor(t, fqn)
            self._live_shapes[fqn] = tuple(t.shape)

    def _on_param_op(self, func: Callable[..., Any], fqns: list[str]) -> None:
        op = _op_name(func)
        if op is None:
            return
        target = self._target
        assert target is not None
        if len(fqns) > 1:
            fqns = list(dict.fromkeys(fqns))
        for fqn in fqns:
            if fqn not in self._seen_params:
                self._seen_params.add(fqn)
                self._param_forward_order.append(fqn)
        self._param_uses.append(ParamUse(target[0], target[1], tuple(fqns), op))

    def _on_grad_ready(self, fqn: str, param: torch.Tensor) -> None:
        # Also the tensor hook of a view a wrapper swapped in (FSDP1
        # use_orig_params=True), which passes the gradient as `param`.
        # The same leaf can accumulate more than once per backward (a tied
        # weight under reentrant checkpointing: one accumulation per inner
        # backward); it is ready at its *last* accumulation, so move it there.
        # A hook fired again for another tensor of the same parameter (FSDP2
        # runs the sharded parameter's hooks after its reduce-scatter, once the
        # unsharded one has fired) is not a new accumulation: ignore it.
        seen = self._bwd_seen.get(fqn)
        if seen is None:
            self._bwd_seen[fqn] = id(param)
        elif seen == id(param):
            self._param_backward_order.remove(fqn)
        else:
            return
        self._param_backward_order.append(fqn)

    def _pop_mode(self) -> None:
        stack = torch.overrides._get_current_function_mode_stack()
        if stack and stack[-1] is self._mode:
            self._mode.__exit__(None, None, None)
        elif any(m is self._mode for m in stack):
            logger.warning(
                "RuntimeRecorder: another TorchFunctionMode was left active above the "
                "recorder's mode; the recorder's mode stays on the stack"
            )

    # ------------------------------------------------------------ life cycle
    def __enter__(self) -> RuntimeRecorder:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.remove(failed=exc is not None)

    def remove(self, *, failed: bool = False) -> None:
        """Remove every hook and mode; build :attr:`order` unless ``failed``.

        Safe to call more than once.

        Args:
            failed: the recorded code raised; no order is built.
        """
        if self.state is not RecorderState.RECORDING:
            return
        try:
            while self._stack:
                frame = self._stack.pop()
                if frame.pushed_mode:
                    self._pop_mode()
            self._target = None
        finally:
            self._remove_handles()
            self._keep.clear()
            self._param_of.clear()
        if failed:
            self.state = RecorderState.FAILED
            return
        self._order = self._build_order()
        self.state = RecorderState.FINISHED

    def _remove_handles(self) -> None:
        handles, self._handles = self._handles, []
        for h in handles:
            h.remove()

    @property
    def order(self) -> ExecutionOrder:
        """The recorded order (available after :meth:`remove` / the ``with`` block).

        Raises:
            RuntimeError: still recording, or the recorded block raised.
        """
        if self._order is None:
            if self.state is RecorderState.FAILED:
                raise RuntimeError(
                    "RuntimeRecorder has no order: the recorded forward/backward raised"
                )
            raise RuntimeError(
                "RuntimeRecorder.order is available after the `with` block ends or "
                "remove() is called"
            )
        return self._order

    def error_location(self, exc: BaseException) -> tuple[str, str] | None:
        """``(module FQN, class name)`` of the innermost module ``exc`` unwound through.

        Returns ``None`` if ``exc`` (or an exception it chains to) was not
        raised inside a recorded module's forward.
        """
        if self._error is None:
            return None
        fqn, cls, err = self._error
        seen: set[int] = set()
        e: BaseException | None = exc
        while e is not None and id(e) not in seen:
            if e is err:
                return fqn, cls
            seen.add(id(e))
            e = e.__cause__ or e.__context__
        return None

    def _build_order(self) -> ExecutionOrder:
        return ExecutionOrder(
            module_forward_order=list(self._module_forward_order),
            param_forward_order=list(self._param_forward_order),
            param_uses=list(self._param_uses),
            param_backward_order=list(self._param_backward_order),
            module_backward_order=self._module_backward_order(),
            recompute_order=list(self._recompute_order),
            shared_params={k: list(v) for k, v in self._shared.items()},
            params=self._param_infos(),
            module_classes=dict(self._module_classes),
            method="runtime",
        )

    def _param_infos(self) -> dict[str, ParamInfo]:
        """ParamInfo per canonical FQN; full shapes of tensors a wrapper swapped in."""
        infos: dict[str, ParamInfo] = {}
        for fqn, p in self._param_tensors.items():
            info = param_info(p)
            shape = self._live_shapes.get(fqn)
            if shape is not None and shape != info.shape:
                info = dataclasses.replace(info, numel=math.prod(shape), shape=shape)
            infos[fqn] = info
        return infos

    def _module_backward_order(self) -> list[str]:
        """Modules in the order their backward finished.

        A module's backward is finished when the gradients of all its
        trainable parameters (recursively, tied ones included) are ready: the
        point where FSDP can reduce-scatter it. Ties (a parent and its last
        child, or modules sharing a tied weight) put the deeper module first,
        then the one called later in forward. Modules without a gradient are
        left out. Derived this way, no backward hook changes the autograd graph.
        """
        ready = {fqn: i for i, fqn in enumerate(self._param_backward_order)}
        first_call: dict[str, int] = {}
        for i, fqn in enumerate(self._module_forward_order):
            first_call.setdefault(fqn, i)
        # module FQN -> latest ready index over its parameters (recursively)
        finish: dict[str, int] = {}
        for pfqn, canonical in self._names:
            step = ready.get(canonical)
            if step is None:
                continue
            owner = pfqn
            while owner:
                owner = owner_fqn(owner)
                if owner in self._module_classes and finish.get(owner, -1) < step:
                    finish[owner] = step
        keyed = [
            (step, -(fqn.count(".") + 1 if fqn else 0), -first_call.get(fqn, -1), fqn)
            for fqn, step in finish.items()
        ]
        keyed.sort()
        return [k[3] for k in keyed]


# --------------------------------------------------------- record_execution_order
class _RngState:
    """CPU (and initialised CUDA) RNG states, restored on :meth:`restore`."""

    def __init__(self) -> None:
        self.cpu = torch.get_rng_state()
        self.cuda: list[torch.Tensor] | None = None
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            self.cuda = torch.cuda.get_rng_state_all()

    def restore(self) -> None:
        torch.set_rng_state(self.cpu)
        if self.cuda is not None:
            torch.cuda.set_rng_state_all(self.cuda)


def _is_meta(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    if any(p.is_meta for p in model.parameters()):
        return True
    return any(t.is_meta for t in tensors_in((args, kwargs)))


def record_execution_order(
    model: nn.Module,
    *args: Any,
    backward: bool = True,
    loss_fn: Callable[[Any], torch.Tensor] | None = None,
    **kwargs: Any,
) -> ExecutionOrder:
    """Capture the execution order by running one forward (and backward).

    Runs ``model(*args, **kwargs)`` once under a :class:`RuntimeRecorder`,
    then, when ``backward``, ``loss_fn(output).backward()``. Afterwards the
    model is as before: hooks removed, ``.grad`` of every parameter exactly
    what it was (``None`` stays ``None``; existing gradients keep their tensor
    and values), buffers (e.g. BatchNorm statistics) restored, and the CPU and
    CUDA RNG states restored so the user's random stream does not shift. The
    training flag and ``requires_grad`` are never touched.

    Runs on the meta device too (meta model and meta inputs): no memory is
    allocated for weights or activations, provided the model's control flow
    depends on shapes only.

    Args:
        model: the model; may be wrapped by FSDP1/FSDP2 (see
            :class:`RuntimeRecorder`).
        *args: positional inputs of ``model``.
        backward: also run one backward pass and record gradient-ready order,
            module backward order and checkpoint recomputation.
        loss_fn: maps the output to a scalar loss; default: the sum of every
            floating-point tensor in the output (nested tuples, lists, dicts,
            dataclasses, ``ModelOutput``).
        **kwargs: keyword inputs of ``model``.

    Returns:
        An :class:`ExecutionOrder` with ``method == "runtime"``.

    Raises:
        TracingError: on the meta device, an op needed tensor values
            (``.item()``, a tensor-valued ``if``); the message names the module.
        TypeError: ``loss_fn`` did not return a tensor.
        Exception: whatever the model raises otherwise, unchanged (with a
            note naming the innermost module).

    Example:
        >>> model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
        >>> order = record_execution_order(model, torch.randn(3, 4))
        >>> order.param_forward_order
        ['0.weight', '0.bias', '1.weight', '1.bias']
    """
    params = list(model.parameters())  # each tensor once, tied ones included
    saved_grads = [(p, p.grad) for p in params]
    saved_buffers = [
        (module, name, b, b.detach().clone())
        for module in model.modules()
        for name, b in module._buffers.items()
        if b is not None
    ]
    rng = _RngState()
    recorder: RuntimeRecorder | None = None
    try:
        if backward:
            for p in params:
                p.grad = None  # fresh grads; the originals are put back below
        recorder = RuntimeRecorder(model)
        with recorder, torch.set_grad_enabled(backward or torch.is_grad_enabled()):
            output = model(*args, **kwargs)
            if backward:
                loss = (loss_fn or default_loss)(output)
                if loss is not None and not isinstance(loss, torch.Tensor):
                    raise TypeError(
                        f"loss_fn must return a torch.Tensor, got {type(loss).__name__}"
                    )
                if loss is None or not loss.requires_grad:
                    logger.debug("runtime capture: the loss needs no grad; skipping backward")
                else:
                    (loss if loss.dim() == 0 else loss.sum()).backward()
            del output
    except Exception as e:
        where = recorder.error_location(e) if recorder is not None else None
        if _is_meta(model, args, kwargs) and not isinstance(e, TypeError):
            fqn, cls = where if where is not None else (None, None)
            loc = f"module {fqn!r} ({cls})" if fqn is not None else "the model"
            raise TracingError(
                f"runtime capture on the meta device failed in {loc}: {e}. Meta execution "
                "needs shape-only control flow: a value-dependent op (e.g. .item(), "
                "`if tensor:`, nonzero) cannot run on meta tensors. Make that control "
                "flow depend on shapes only, or capture with small real inputs on CPU.",
                module_fqn=fqn,
                module_class=cls,
            ) from e
        if where is not None and hasattr(e, "add_note"):
            e.add_note(f"While recording the execution order, in module {where[0]!r} ({where[1]})")
        raise
    finally:
        with torch.no_grad():
            for module, name, b, saved in saved_buffers:
                module._buffers[name] = b
                b.copy_(saved)
        for p, g in saved_grads:
            p.grad = g
        rng.restore()
    return recorder.order
