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
dispatch mode it sees backward too. These are estimates. Compared with
measured times (``benchmarks/estimate.py``, 2026-12-01, CPU, one thread, a
loaded 2-core machine, rates measured in the same process; four GPT and Llama
models of 2.5M to 14M parameters): the whole step within 8% (0.92x to
1.07x), forward alone 0.82x to 1.13x, one block-level unit 11% to 25% off
(median); small ops' fixed cost and cache effects are what the roofline
misses. The README carries the latest table.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import flop_registry

from tracing.rates import ComputeRates
from tracing.runtime.timing import VirtualClock

__all__ = ["RooflineMode", "tensor_traffic_bytes"]


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
        formula: Callable[..., int] | None = flop_registry.get(func._overloadpacket)
        if formula is not None:
            flops = int(formula(*args, **kwargs, out_val=out))
        nbytes = tensor_traffic_bytes((*args, *kwargs.values())) + tensor_traffic_bytes(outs)
        self.ops += 1
        self.flops += flops
        self.clock.advance(self.rates.op_time(flops=flops, nbytes=nbytes))
        return out
