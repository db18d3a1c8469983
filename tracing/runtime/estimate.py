"""Estimated compute time for models on the meta device or under fake tensors: a roofline per op.

torch has an estimator, ``torch.distributed._tools.runtime_estimator.RuntimeEstimator``,
but in torch 2.13 it cannot serve here: its roofline mode
(``operator-level-cost-model``) asserts CUDA ("Roofline estimation needs to
access CUDA capabilities to make estimations"; on a CPU-only build that
assertion, raised inside the dispatcher under ``FakeTensorMode``, aborts the
whole process with ``terminate called after throwing an instance of
'python_error'``) and reads the GPU's peak FLOP/s and bandwidth from
``torch._inductor.utils``; its benchmark mode runs every op for real on a GPU. Its FLOP-to-time conversion
(``torch.utils._runtime_estimation.flops_to_ns``) also halves the FLOP count
("converts FLOPs to MACs") before dividing by a peak quoted in FLOP/s, which
makes matmuls look twice as fast as the peak allows.

:class:`RooflineMode` is the same roofline with calibrated, device-neutral
rates (:class:`tracing.rates.ComputeRates`): a ``TorchDispatchMode`` that,
for every aten op that is not a view, advances a
:class:`~tracing.runtime.timing.VirtualClock` by ``max(flops /
flops_per_s, bytes / memory_bytes_per_s) + op_overhead_s``, with FLOPs from
``torch.utils.flop_counter``'s formulas (``flop_registry``: matmuls,
convolutions, attention) and bytes read and written as
``RuntimeEstimator`` counts them (broadcast dimensions counted once). Being a
dispatch mode it sees backward too. An op's FLOPs run at the rate of its class
and dtype (:meth:`tracing.rates.ComputeRates.rate`: matmuls and convolutions
at the matmul rate of their first input's dtype, the fused attention kernels
at the attention rate of the query's). torch's formulas count attention as if
it were not causal ("NB: We aren't accounting for causal attention here");
the flash and memory-efficient kernels skip the blocks a causal mask hides,
so a causal call's FLOPs are scaled by the fraction of the score matrix it
keeps, ``(s + 1) / (2 s)`` for ``s`` queries and keys (:func:`causal_fraction`;
FlashAttention-2, Dao 2023, arXiv:2307.08691, counts causal attention's FLOPs
as half the full ones). These are estimates. Compared with
measured times (``benchmarks/estimate.py``, 2026-12-01, CPU, one thread, a
loaded 2-core machine, rates measured in the same process; four GPT and Llama
models of 2.5M to 14M parameters): the whole step within 8% (0.92x to
1.07x), forward alone 0.82x to 1.13x, one block-level unit 11% to 25% off
(median); small ops' fixed cost and cache effects are what the roofline
misses. The README carries the latest table.

:class:`FusedAttentionMode` keeps attention fused on the meta device: there
``F.scaled_dot_product_attention`` has no fused kernel to choose and runs its
math decomposition (``bmm``, ``_safe_softmax``, ``bmm``), which saves the
``S x S`` attention matrix for backward, while on CPU and CUDA the same call
runs a fused kernel that saves only its inputs, output and log-sum-exp. On
meta tensors the mode asks torch which kernel a CPU would choose for the same
call (``torch._fused_sdp_choice`` on stand-in CPU tensors of the same shapes,
dtypes and last-dimension strides, one row of storage each) and, where that is
the fused one, calls it (``aten._scaled_dot_product_flash_attention_for_cpu``,
whose meta function and backward exist), so that saved activations and the
roofline are those of the kernel a real device runs (an HF Llama layer at 1024
tokens, dim 256, 8 heads: 52.7 MB saved on meta before, 19.2 MB on CPU; now the
same on both). Where the CPU would run the math path (attention dropout in
training, as in BERT), so does meta.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils.flop_counter import flop_registry

from tracing.rates import ComputeRates
from tracing.runtime.op_record import op_class
from tracing.runtime.timing import VirtualClock

__all__ = ["FusedAttentionMode", "RooflineMode", "causal_fraction", "tensor_traffic_bytes"]

_ATEN = torch.ops.aten
#: The CPU's fused attention ops, priced with the FLOP formulas torch registers for
#: the CUDA flash kernels (same arguments up to the value / log-sum-exp).
_FLOP_ALIASES: dict[Any, Any] = {
    _ATEN._scaled_dot_product_flash_attention_for_cpu: (_ATEN._scaled_dot_product_flash_attention),
    _ATEN._scaled_dot_product_flash_attention_for_cpu_backward: (
        _ATEN._scaled_dot_product_flash_attention_backward
    ),
}


def tensor_traffic_bytes(values: Iterable[Any]) -> int:
    """Bytes a kernel reads or writes for these values: each tensor's elements
    (a dimension of stride 0, a broadcast, counted once) times its element size."""
    total = 0
    for t in values:
        if isinstance(t, torch.Tensor):
            n = 1
            for size, stride in zip(t.shape, t.stride(), strict=True):
                if stride != 0:
                    n *= int(size)
            total += n * t.element_size()
        elif isinstance(t, (list, tuple)):
            total += tensor_traffic_bytes(t)
    return total


class RooflineMode(TorchDispatchMode):
    """Advance ``clock`` by each op's roofline time (see the module docstring).

    Args:
        rates: the device's compute rates.
        clock: the virtual clock to advance.

    Attributes:
        ops: aten ops counted.
        flops: FLOPs counted.
    """

    def __init__(self, rates: ComputeRates, clock: VirtualClock) -> None:
        super().__init__()
        self.rates = rates
        self.clock = clock
        self.ops = 0
        self.flops = 0

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if getattr(func, "is_view", False) or func is torch.ops.aten.detach.default:
            return out
        outs = out if isinstance(out, (list, tuple)) else (out,)
        if not any(isinstance(o, torch.Tensor) for o in outs):
            return out
        flops = 0
        packet = func._overloadpacket
        formula: Callable[..., int] | None = flop_registry.get(_FLOP_ALIASES.get(packet, packet))
        kind = op_class(packet)
        if formula is not None:
            flops = int(formula(*args, **kwargs, out_val=out))
            if kind == "attention":
                flops = int(flops * causal_fraction(func, args, kwargs))
        nbytes = tensor_traffic_bytes((*args, *kwargs.values())) + tensor_traffic_bytes(outs)
        self.ops += 1
        self.flops += flops
        rate = self.rates.rate(kind, _dtype_of(args)) if flops else None
        self.clock.advance(self.rates.op_time(flops=flops, nbytes=nbytes, flops_per_s=rate))
        return out


def _dtype_of(args: tuple[Any, ...]) -> str:
    """The dtype name of the first tensor argument (``""`` if none)."""
    for a in args:
        if isinstance(a, torch.Tensor):
            return str(a.dtype).removeprefix("torch.")
    return ""


def causal_fraction(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> float:
    """The fraction of an attention call's score matrix a causal mask keeps: ``1.0``
    unless the call is causal (its ``is_causal`` argument), else ``(s + 1) / (2 s)``
    for ``s`` queries and keys (query ``i`` sees keys ``0..i``); with fewer queries than
    keys (the mask aligned to the top left, as torch's ``is_causal``) the kept
    fraction of the ``s_q x s_k`` matrix.

    >>> q = torch.empty(1, 1, 4, 8, device="meta")
    >>> op = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
    >>> causal_fraction(op, (q, q, q, 0.0, True), {}), causal_fraction(op, (q, q, q), {})
    (0.625, 1.0)
    """
    causal = _argument(func, args, kwargs, "is_causal")
    query = _argument(func, args, kwargs, "query")
    key = _argument(func, args, kwargs, "key")
    if (
        causal is not True
        or not isinstance(query, torch.Tensor)
        or not isinstance(key, torch.Tensor)
    ):
        return 1.0
    s_q, s_k = int(query.shape[-2]), int(key.shape[-2])
    if s_q <= 0 or s_k <= 0:
        return 1.0
    return _kept(s_q, s_k) / (s_q * s_k)


def _argument(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], name: str) -> Any:
    """The value of ``func``'s argument ``name`` in a call (its default, else ``None``)."""
    for i, a in enumerate(func._schema.arguments):
        if a.name == name:
            if name in kwargs:
                return kwargs[name]
            if i < len(args) and not a.kwarg_only:
                return args[i]
            return a.default_value if a.has_default_value() else None
    return None


def _kept(s_q: int, s_k: int) -> int:
    """``sum(min(i + 1, s_k) for i in range(s_q))`` in closed form."""
    n = min(s_q, s_k)
    return n * (n + 1) // 2 + (s_q - n) * s_k


class FusedAttentionMode(TorchFunctionMode):
    """Run ``F.scaled_dot_product_attention`` on meta tensors as a fused kernel.

    See the module docstring. Other calls, and attention on any other
    device, pass through unchanged; so do calls the fused kernel cannot take
    (inputs that are not 4-D ``(batch, heads, tokens, head_dim)``) or
    would not take on CPU (attention dropout, for one).

    Example:
        >>> q = torch.empty(1, 2, 16, 8, device="meta", requires_grad=True)
        >>> with FusedAttentionMode():
        ...     out = F.scaled_dot_product_attention(q, q, q, is_causal=True)
        >>> out.grad_fn.name()
        'ScaledDotProductFlashAttentionForCpuBackward0'
    """

    def __torch_function__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            fused = _fused_attention(*args, **kwargs)
            if fused is not None:
                return fused
        return func(*args, **kwargs)


def _fused_attention(
    query: Any,
    key: Any,
    value: Any,
    attn_mask: Any = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> torch.Tensor | None:
    """The fused kernel's output for meta 4-D inputs; ``None`` where it does not apply."""
    tensors = (query, key, value)
    if not all(isinstance(t, torch.Tensor) and t.device.type == "meta" for t in tensors):
        return None
    if any(t.dim() != 4 for t in tensors):
        return None
    if not _cpu_would_fuse(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa):
        return None
    # grouped-query attention (fewer key/value heads) the kernel takes as it is, as on CPU
    out: torch.Tensor = _ATEN._scaled_dot_product_flash_attention_for_cpu(
        query, key, value, dropout_p, is_causal, attn_mask=attn_mask, scale=scale
    )[0]
    return out


def _cpu_would_fuse(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: Any,
    dropout_p: float,
    is_causal: bool,
    scale: float | None,
    enable_gqa: bool,
) -> bool:
    """Whether torch picks the fused (flash) kernel on CPU for tensors like these."""

    def stand_in(t: Any) -> Any:
        if not isinstance(t, torch.Tensor):
            return t
        last = t.stride(-1) if t.dim() else 1
        storage = torch.empty(max((t.size(-1) - 1) * last + 1, 1) if t.dim() else 1, dtype=t.dtype)
        return storage.as_strided(t.shape, [0] * (t.dim() - 1) + [last] if t.dim() else [])

    try:
        # the stand-ins are no ops of the model: made and asked outside every dispatch
        # mode (the roofline's clock among them)
        with _disable_current_modes():
            choice = torch._fused_sdp_choice(
                stand_in(query),
                stand_in(key),
                stand_in(value),
                attn_mask=stand_in(attn_mask),
                dropout_p=dropout_p,
                is_causal=is_causal,
                scale=scale,
                enable_gqa=enable_gqa,
            )
    except (RuntimeError, TypeError, ValueError):
        return False
    return bool(choice == int(SDPBackend.FLASH_ATTENTION.value))
