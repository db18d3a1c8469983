"""Per-call compute times and saved-activation bytes at run time.

:class:`CallTimer` is installed through the recorder's
:class:`~tracing.runtime.hooks.HookSet` (or its own) and times one or more
forward/backward passes without changing them:

* forward: a clock reading in each module's forward pre-hook and post-hook
  (inclusive time of the call, nested calls included), in call order; calls
  of wrapper modules and activation-checkpointing recomputations (a module
  call while autograd runs backward) are not forward calls and are skipped,
  so the calls line up with the recorder's ``module_forward_order``;
* backward: in the post-hook, ``torch.autograd.graph.register_multi_grad_hook``
  (``mode="any"``) on the call's outputs that require grad: it fires when the
  first gradient with respect to one of them has been computed, the moment
  the call's backward begins. It is a tensor hook that returns ``None``: the
  autograd graph and the gradients stay as they are (unlike module full
  backward hooks, which wrap outputs in a ``BackwardHookFunction`` and break
  on outputs that are views modified in place). The first such hook of a
  backward queues an autograd-engine callback that reads the clock when the
  backward pass ends;
* saved activations: ``torch.autograd.graph.saved_tensors_hooks`` is active
  while the outermost call runs; its pack hook (which returns the tensor
  itself) adds the bytes of each saved tensor's storage, once per storage,
  to the innermost running call; parameters (and views of them) are not
  activations. Under non-reentrant activation checkpointing the checkpoint's
  own hooks take over inside the checkpointed region, whose activations are
  then not kept (and not counted);
* the bytes of each call's activation inputs (floating-point tensor arguments
  that are not parameters, once per storage): what full activation
  checkpointing of that call keeps for backward instead of its saved tensors.

Clocks (:class:`PerfClock`, :class:`CudaClock`, :class:`VirtualClock`):
``time.perf_counter_ns`` on CPU; CUDA events on GPU (read after one
synchronisation at the end); on the meta device or under fake tensors a
virtual clock that :class:`~tracing.runtime.estimate.RooflineMode` advances
by each op's estimated time.

Times are seconds from the first call's start. A call's inclusive backward
time (``backward_times_s``) runs from its backward start to the end of the
last backward segment of it or of a call nested in it, a segment lasting from
one call's backward start to the next one's (or the end of backward).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch
import torch.nn as nn

from tracing.nested import tensors_in
from tracing.runtime.hooks import HookSet

__all__ = ["CallTimer", "Clock", "CudaClock", "PerfClock", "VirtualClock", "is_param_tensor"]


class Clock(Protocol):
    """Reads time as opaque tokens, turned into seconds all at once at the end."""

    #: the ``timing_device`` of the times ("cpu", "cuda").
    device_type: str

    def now(self) -> Any:
        """A token for the current moment."""

    def seconds(self, tokens: Sequence[Any]) -> list[float]:
        """Seconds of each token from the first one."""


class PerfClock:
    """``time.perf_counter_ns`` (CPU)."""

    device_type = "cpu"

    def now(self) -> int:
        return time.perf_counter_ns()

    def seconds(self, tokens: Sequence[Any]) -> list[float]:
        if not tokens:
            return []
        origin = tokens[0]
        return [(t - origin) / 1e9 for t in tokens]


class CudaClock:
    """CUDA events on the current stream, read after one ``torch.cuda.synchronize()``."""

    device_type = "cuda"

    def now(self) -> torch.cuda.Event:
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def seconds(self, tokens: Sequence[Any]) -> list[float]:
        if not tokens:
            return []
        torch.cuda.synchronize()
        origin = tokens[0]
        return [origin.elapsed_time(t) / 1e3 for t in tokens]


class VirtualClock:
    """Estimated time: advanced by :class:`~tracing.runtime.estimate.RooflineMode` per op.

    Args:
        device_type: the device the estimate is for.
    """

    def __init__(self, device_type: str) -> None:
        self.device_type = device_type
        self.t = 0.0

    def advance(self, seconds: float) -> None:
        """Add ``seconds`` of estimated work."""
        self.t += seconds

    def now(self) -> float:
        return self.t

    def seconds(self, tokens: Sequence[Any]) -> list[float]:
        if not tokens:
            return []
        origin = tokens[0]
        return [float(t - origin) for t in tokens]


def is_param_tensor(t: torch.Tensor) -> bool:
    """Whether ``t`` is a parameter or a view of one (not an activation)."""
    return isinstance(t, nn.Parameter) or isinstance(getattr(t, "_base", None), nn.Parameter)


class CallTimer:
    """Times module calls and counts saved activations (see the module docstring).

    Args:
        modules: ``(fqn, module, is_wrapper)`` per module (a
            :class:`~tracing.runtime.param_map.ParamMap`'s ``modules``).
        clock: where time comes from.
        hooks: the hook set to install into (default: a new one, removed by
            :meth:`remove`).
        is_param: whether a saved tensor is a parameter (not counted).
    """

    def __init__(
        self,
        modules: Sequence[tuple[str, nn.Module, bool]],
        clock: Clock,
        *,
        hooks: HookSet | None = None,
        is_param: Callable[[torch.Tensor], bool] = is_param_tensor,
    ) -> None:
        self.clock = clock
        self._own_hooks = hooks is None
        self._hooks = HookSet() if hooks is None else hooks
        self._is_param = is_param
        self.fqns: list[str] = []
        self._start: list[Any] = []
        self._end: list[Any] = []
        self._parent: list[int] = []
        self._bwd: list[Any] = []
        self._bwd_end: Any = None
        self._callback_task: int | None = None
        self.saved_bytes: list[int] = []
        self.input_bytes: list[int] = []
        #: called with the storage key of each tensor saved for backward (once per storage).
        self.on_saved: Callable[[int], None] | None = None
        self._backward_call = -1  # the call whose backward started last
        self._stack: list[int] = []  # running calls (-1: a recompute, not timed)
        self._storages: set[int] = set()
        self._saved_hooks: torch.autograd.graph.saved_tensors_hooks | None = None
        self._hooks.add_forward_hooks(
            [(f, m, w) for f, m, w in modules if not w],
            pre_forward=self._pre,
            pre_wrapper=self._pre,
            post_forward=self._post,
        )

    # ----------------------------------------------------------------- forward
    def _pre(self, fqn: str, module: nn.Module, args: Any) -> None:
        if torch._C._current_graph_task_id() != -1:  # recomputation under checkpointing
            self._stack.append(-1)
            return
        index = len(self._start)
        self.fqns.append(fqn)
        self._parent.append(next((i for i in reversed(self._stack) if i >= 0), -1))
        self._end.append(None)
        self._bwd.append(None)
        self.saved_bytes.append(0)
        self.input_bytes.append(self._activation_bytes(args))
        if not self._stack:
            self._saved_hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, _unpack)
            self._saved_hooks.__enter__()
        self._stack.append(index)
        self._start.append(self.clock.now())

    def _post(self, fqn: str, module: nn.Module, args: Any, output: Any) -> None:
        if not self._stack:
            return
        index = self._stack.pop()
        if index < 0:
            return
        self._end[index] = self.clock.now()
        if not self._stack:
            self._exit_saved_hooks()
        grads = [t for t in tensors_in(output) if t.requires_grad]
        if grads and torch.is_grad_enabled():
            handle = torch.autograd.graph.register_multi_grad_hook(
                grads, lambda _grad, i=index: self._on_backward(i), mode="any"
            )
            self._hooks.keep(handle)

    def _activation_bytes(self, args: Any) -> int:
        """Bytes of the floating-point tensors in ``args`` that are not parameters."""
        seen: set[int] = set()
        total = 0
        for t in tensors_in(args):
            if not t.is_floating_point() or self._is_param(t):
                continue
            try:
                storage = t.untyped_storage()
                key, nbytes = storage._cdata, storage.nbytes()
            except (RuntimeError, NotImplementedError, TypeError):  # a wrapper subclass
                key, nbytes = id(t), t.numel() * t.element_size()
            if key not in seen:
                seen.add(key)
                total += int(nbytes)
        return total

    @property
    def current_call(self) -> int:
        """The innermost forward call running (``0``, the first call, once they all
        ended: the loss; ``-1`` before the first call or in a recomputation)."""
        if not self._stack:
            return 0 if self._start else -1
        return self._stack[-1]

    @property
    def backward_call(self) -> int:
        """The call whose backward started last (``0`` before any: the loss's backward)."""
        return self._backward_call if self._backward_call >= 0 else (0 if self._start else -1)

    def _exit_saved_hooks(self) -> None:
        if self._saved_hooks is not None:
            hooks, self._saved_hooks = self._saved_hooks, None
            hooks.__exit__(None, None, None)

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        if self._is_param(t):
            return t
        try:
            storage = t.untyped_storage()
            key, nbytes = storage._cdata, storage.nbytes()
        except (RuntimeError, NotImplementedError, TypeError):  # a wrapper subclass
            key, nbytes = id(t), t.numel() * t.element_size()
        if key not in self._storages:
            self._storages.add(key)
            owner = next((i for i in reversed(self._stack) if i >= 0), 0)
            if self.saved_bytes:
                self.saved_bytes[owner] += int(nbytes)
            if self.on_saved is not None:
                self.on_saved(key)
        return t

    def count_saved(self) -> torch.autograd.graph.saved_tensors_hooks:
        """A context counting tensors saved outside any call (the loss) for the root call."""
        return torch.autograd.graph.saved_tensors_hooks(self._pack, _unpack)

    # ---------------------------------------------------------------- backward
    def _on_backward(self, index: int) -> None:
        self._backward_call = index
        if self._bwd[index] is None:
            self._bwd[index] = self.clock.now()
        task = torch._C._current_graph_task_id()
        if self._callback_task != task:
            self._callback_task = task
            torch.autograd.Variable._execution_engine.queue_callback(self._on_backward_end)

    def _on_backward_end(self) -> None:
        self._bwd_end = self.clock.now()

    # ----------------------------------------------------------------- results
    @property
    def num_calls(self) -> int:
        """Forward calls timed so far."""
        return len(self._start)

    def remove(self) -> None:
        """Leave the saved-tensor hooks (if a call is still open) and remove the hooks."""
        self._exit_saved_hooks()
        self._stack.clear()
        if self._own_hooks:
            self._hooks.remove()

    def fields(self, method: str) -> dict[str, Any]:
        """The ``ExecutionOrder`` timing fields (seconds from the first call's start).

        Args:
            method: ``"measured"`` or ``"estimated"``.
        """
        n = self.num_calls
        if n == 0:
            return {}
        ends = [e if e is not None else s for s, e in zip(self._start, self._end, strict=True)]
        bwd_tokens = [b for b in self._bwd if b is not None]
        tail = [self._bwd_end] if self._bwd_end is not None else []
        seconds = self.clock.seconds([*self._start, *ends, *bwd_tokens, *tail])
        starts, ends_s = seconds[:n], seconds[n : 2 * n]
        bwd_s = iter(seconds[2 * n : 2 * n + len(bwd_tokens)])
        backward = [None if b is None else next(bwd_s) for b in self._bwd]
        end = seconds[-1] if tail else None
        return {
            "forward_times_s": [max(0.0, e - s) for s, e in zip(starts, ends_s, strict=True)],
            "forward_start_s": starts,
            "backward_start_s": backward,
            "backward_end_s": end,
            "backward_times_s": _inclusive_backward(self.fqns, self._parent, backward, end),
            "saved_activation_bytes": list(self.saved_bytes),
            "input_activation_bytes": list(self.input_bytes),
            "timing_device": self.clock.device_type,
            "timing_method": method,
        }


def _unpack(t: torch.Tensor) -> torch.Tensor:
    return t


def _inclusive_backward(
    fqns: Sequence[str], parent: Sequence[int], starts: Sequence[float | None], end: float | None
) -> dict[str, float]:
    """Module FQN -> inclusive backward seconds of its last call (see the module docstring)."""
    events = sorted((t, i) for i, t in enumerate(starts) if t is not None)
    if not events:
        return {}
    stop = end if end is not None else events[-1][0]
    seg_end: dict[int, float] = {}
    for k, (t, i) in enumerate(events):
        seg_end[i] = events[k + 1][0] if k + 1 < len(events) else max(stop, t)
    latest = dict(seg_end)
    for i in range(len(fqns) - 1, -1, -1):  # children come after their parent
        p = parent[i]
        if p >= 0 and i in latest:
            latest[p] = max(latest.get(p, latest[i]), latest[i])
    out: dict[str, float] = {}
    for i, fqn in enumerate(fqns):
        s = starts[i]
        if s is not None and i in latest:
            out[fqn] = max(0.0, latest[i] - s)
    return out
