"""What each module call's ops leave behind: matmul and attention outputs, and live memory.

:class:`OpRecordMode` is a ``TorchDispatchMode`` that the runtime recorder
stacks over its roofline (:mod:`tracing.runtime.estimate`) when it estimates
a step op by op. Per forward call of a module (the innermost one running, as
:class:`~tracing.runtime.timing.CallTimer` attributes saved tensors) it
records:

* the ops an activation-checkpointing policy chooses from
  (:data:`RECORDED_OPS`: the matrix multiplies and the fused attention kernels
  that torchtitan's selective policy saves, ``torch/utils/checkpoint.py``'s
  ``create_selective_checkpoint_contexts``): their name, the bytes of their
  outputs and their estimated seconds, in execution order
  (:class:`~tracing.order.ComputeOp`);
* the number of aten ops its own forward dispatched, views included (what
  activation checkpointing's host work scales with);
* the largest transient memory while the call's own ops run, forward and
  backward: the bytes of every storage an op allocated that is still alive,
  less the storages saved for backward (counted by the call timer's
  saved-tensor hook) and less the parameters' gradients once accumulated
  (FSDP holds those in its own buffers): activations in flight, the
  gradients of activations, the loss's temporaries (an ``lm_head``'s logits
  cast to float32 and their log-softmax, the largest tensors of a language
  model's step). Ops before the first call's backward starts (the loss's
  backward) belong to the first call (the root), as the loss's saved tensors do.

Storages are followed with ``weakref.finalize`` on ``untyped_storage()``
(torch keeps one Python object per live storage), which works on the meta
device and on fake tensors alike: no byte is allocated to measure.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from tracing.order import ComputeOp

if TYPE_CHECKING:
    from tracing.runtime.timing import CallTimer, Clock

__all__ = ["ATTENTION_OPS", "MATMUL_OPS", "RECORDED_OPS", "OpRecordMode", "op_class"]

_ATEN = torch.ops.aten
#: Matrix multiplies and convolutions (priced at the matmul rate of their dtype).
MATMUL_OPS = frozenset(
    p
    for p in (
        _ATEN.mm,
        _ATEN.addmm,
        _ATEN.bmm,
        _ATEN.baddbmm,
        _ATEN.convolution,
        _ATEN.convolution_backward,
        _ATEN._grouped_mm,
    )
)
#: Fused attention kernels, forward and backward (priced at the attention rate).
ATTENTION_OPS = frozenset(
    getattr(_ATEN, name)
    for name in (
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_flash_attention_backward",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_efficient_attention_backward",
        "_scaled_dot_product_cudnn_attention",
        "_scaled_dot_product_cudnn_attention_backward",
        "_scaled_dot_product_flash_attention_for_cpu",
        "_scaled_dot_product_flash_attention_for_cpu_backward",
    )
    if hasattr(_ATEN, name)
)
#: Forward ops recorded per call for activation-checkpointing policies.
RECORDED_OPS = frozenset(
    p for p in (*MATMUL_OPS, *ATTENTION_OPS) if not str(p).endswith("backward")
)


def op_class(packet: Any) -> str:
    """``"matmul"``, ``"attention"`` or ``"other"``: how an aten op packet is priced
    (:meth:`tracing.rates.ComputeRates.rate`)."""
    if packet in MATMUL_OPS:
        return "matmul"
    if packet in ATTENTION_OPS:
        return "attention"
    return "other"


class _Live:
    """Bytes of the storages allocated under the mode that are still alive."""

    def __init__(self) -> None:
        self.bytes = 0
        self.saved = 0  # the part of ``bytes`` saved for backward
        self._sizes: dict[int, int] = {}
        self._saved: set[int] = set()
        self._finalizers: list[weakref.finalize] = []

    def track(self, t: torch.Tensor) -> int | None:
        """Follow ``t``'s storage if it is new; its key (``None`` if not followed)."""
        try:
            storage = t.untyped_storage()
            key, nbytes = storage._cdata, int(storage.nbytes())
        except (RuntimeError, NotImplementedError, TypeError):  # a wrapper subclass
            return None
        if key in self._sizes:
            return None
        self._sizes[key] = nbytes
        self.bytes += nbytes
        self._finalizers.append(weakref.finalize(storage, self._free, key))
        return key

    def saved_among(self, keys: Iterable[int]) -> int:
        """Bytes of the storages of ``keys`` saved for backward by now."""
        return sum(self._sizes.get(k, 0) for k in keys if k in self._saved)

    def _free(self, key: int) -> None:
        nbytes = self._sizes.pop(key, 0)
        self.bytes -= nbytes
        if key in self._saved:
            self._saved.discard(key)
            self.saved -= nbytes

    def mark_saved(self, key: int) -> None:
        if key in self._sizes and key not in self._saved:
            self._saved.add(key)
            self.saved += self._sizes[key]

    def forget(self, t: torch.Tensor) -> None:
        """Stop counting ``t``'s storage (a parameter's accumulated gradient)."""
        try:
            key = t.untyped_storage()._cdata
        except (RuntimeError, NotImplementedError, TypeError):
            return
        if key in self._sizes:
            self._free(key)

    def close(self) -> None:
        for f in self._finalizers:
            f.detach()
        self._finalizers.clear()


class OpRecordMode(TorchDispatchMode):
    """Record compute ops and transient memory per module call (see the module docstring).

    Args:
        timer: the recorder's call timer (which call runs; which storages are saved).
        clock: the clock the op seconds are read from (the roofline's virtual clock).

    Attributes:
        ops: the recorded :class:`~tracing.order.ComputeOp` entries, in execution order.
    """

    def __init__(self, timer: CallTimer, clock: Clock) -> None:
        super().__init__()
        self.timer = timer
        self.clock = clock
        self.ops: list[ComputeOp] = []
        self._live = _Live()
        self._forward_peak: dict[int, int] = {}
        self._backward_peak: dict[int, int] = {}
        self._forward_ops: dict[int, int] = {}
        # (peaks, call, live bytes not saved after the last op, the storages it allocated)
        self._pending: tuple[dict[int, int], int, int, list[int]] | None = None
        timer.on_saved = self._live.mark_saved

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        self._settle()
        before = self.clock.now()
        out = func(*args, **kwargs)
        backward = torch._C._current_graph_task_id() != -1
        call = self.timer.backward_call if backward else self.timer.current_call
        if not backward and call >= 0:
            self._forward_ops[call] = self._forward_ops.get(call, 0) + 1
        if getattr(func, "is_view", False):
            return out
        outs = out if isinstance(out, (list, tuple)) else (out,)
        tensors = [o for o in outs if isinstance(o, torch.Tensor)]
        keys = [k for k in (self._live.track(t) for t in tensors) if k is not None]
        if call < 0:
            return out
        peaks = self._backward_peak if backward else self._forward_peak
        # the op's outputs that autograd saves are packed after it returns: settled at the
        # next op, so that they count as saved, not transient, at their own op
        self._pending = (peaks, call, self._live.bytes - self._live.saved, keys)
        if not backward and func._overloadpacket in RECORDED_OPS:
            seconds = _elapsed(self.clock, before)
            self.ops.append(
                ComputeOp(call, func._overloadpacket.__name__, _nbytes(tensors), seconds)
            )
        return out

    def _settle(self) -> None:
        """Count the last op's transient bytes, less its outputs saved since."""
        if self._pending is None:
            return
        peaks, call, transient, keys = self._pending
        self._pending = None
        transient -= self._live.saved_among(keys)
        if transient > peaks.get(call, 0):
            peaks[call] = transient

    def gradient_ready(self, param: torch.Tensor) -> None:
        """A parameter's gradient was accumulated: it is no longer transient memory."""
        grad = param.grad if param.is_leaf else param
        if isinstance(grad, torch.Tensor):
            self._live.forget(grad)

    def close(self) -> None:
        """Count the last op and stop following storages (call after the step)."""
        self._settle()
        self._live.close()

    def fields(self, num_calls: int) -> dict[str, Any]:
        """The ``ExecutionOrder`` fields: ``compute_ops``, the forward ops and the
        transient bytes per call."""
        return {
            "compute_ops": list(self.ops),
            "forward_op_counts": [self._forward_ops.get(i, 0) for i in range(num_calls)],
            "forward_transient_bytes": [self._forward_peak.get(i, 0) for i in range(num_calls)],
            "backward_transient_bytes": [self._backward_peak.get(i, 0) for i in range(num_calls)],
        }


def _elapsed(clock: Clock, before: Any) -> float:
    seconds = clock.seconds([before, clock.now()])
    return max(0.0, float(seconds[1])) if len(seconds) == 2 else 0.0


def _nbytes(tensors: Iterable[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)
