"""Compute rates of one device: what turns FLOPs and bytes into seconds.

:class:`ComputeRates` is plain data (no torch import) shared by the roofline
estimate of :mod:`tracing.runtime.estimate` (compute times of a model on the
meta device or under fake tensors) and by :class:`execwrap.cost.CostModel`,
which measures them (``CostModel.calibrate``) or takes them from a cited
preset.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["ComputeRates", "OpClass"]

#: How an op is priced: ``"matmul"`` (matrix multiplies and convolutions, at the rate of
#: their dtype), ``"attention"`` (fused attention kernels), ``"other"`` (``flops_per_s``).
OpClass = str


@dataclass(frozen=True)
class ComputeRates:
    """Achieved compute rates of one device, for roofline estimates.

    An op's estimated time is ``max(flops / rate, bytes /
    memory_bytes_per_s) + op_overhead_s`` (the roofline of
    ``torch.distributed._tools.runtime_estimator.RuntimeEstimator``'s
    ``operator-level-cost-model`` mode, plus a fixed per-op cost that
    dominates small ops in eager mode on a CPU). The rate is the op's class
    and dtype's (:meth:`rate`): a GPU multiplies bfloat16 matrices on its tensor
    cores an order of magnitude faster than float32 ones, and its fused
    attention kernels reach a lower fraction of that peak than its matrix
    multiplies; one ``flops_per_s`` serves every op where no rate per dtype is
    given (a CPU's calibration measures one).

    Attributes:
        device_type: the device these rates describe (``"cpu"``, ``"cuda"``).
        flops_per_s: achieved matrix-multiply rate, FLOP/s (a multiply-add is
            2 FLOPs, as ``torch.utils.flop_counter`` counts).
        memory_bytes_per_s: achieved memory traffic, bytes read plus bytes
            written per second.
        op_overhead_s: fixed cost per op (dispatch, kernel launch), seconds.
        matmul_flops_per_s: dtype name (``"bfloat16"``, ``"float16"``,
            ``"float32"``, ...) -> achieved FLOP/s of matrix multiplies and
            convolutions on that dtype; a dtype not listed runs at ``flops_per_s``.
        attention_flops_per_s: dtype name -> achieved FLOP/s of the fused
            attention kernels (``scaled_dot_product_attention``'s flash,
            memory-efficient and cuDNN kernels); a dtype not listed runs at its
            matmul rate.

    Example:
        >>> rates = ComputeRates("cpu", flops_per_s=1e11, memory_bytes_per_s=1e10)
        >>> rates.op_time(flops=2e9, nbytes=1e6)
        0.02
        >>> gpu = ComputeRates("cuda", 5e13, 2e12, matmul_flops_per_s={"bfloat16": 7e14})
        >>> gpu.rate("matmul", "bfloat16"), gpu.rate("matmul", "float32"), gpu.rate("other")
        (700000000000000.0, 50000000000000.0, 50000000000000.0)
    """

    device_type: str
    flops_per_s: float
    memory_bytes_per_s: float
    op_overhead_s: float = 0.0
    matmul_flops_per_s: Mapping[str, float] = field(default_factory=dict, hash=False)
    attention_flops_per_s: Mapping[str, float] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        if not isinstance(self.device_type, str) or not self.device_type:
            raise ValueError(
                f"ComputeRates.device_type must be a device type such as 'cpu' or 'cuda', got "
                f"{self.device_type!r}"
            )
        for name in ("flops_per_s", "memory_bytes_per_s"):
            value = getattr(self, name)
            if not _finite(value) or value <= 0:
                raise ValueError(f"ComputeRates.{name} must be a finite number > 0, got {value!r}")
        if not _finite(self.op_overhead_s) or self.op_overhead_s < 0:
            raise ValueError(
                f"ComputeRates.op_overhead_s must be a finite number >= 0 (seconds), got "
                f"{self.op_overhead_s!r}"
            )
        for name in ("matmul_flops_per_s", "attention_flops_per_s"):
            table = getattr(self, name)
            if not isinstance(table, Mapping):
                raise ValueError(
                    f"ComputeRates.{name} must map dtype names to FLOP/s, got "
                    f"{type(table).__name__}"
                )
            for dtype, value in table.items():
                if not isinstance(dtype, str) or not _finite(value) or value <= 0:
                    raise ValueError(
                        f"ComputeRates.{name}[{dtype!r}] must be a finite number > 0 (FLOP/s) "
                        f"keyed by a dtype name such as 'bfloat16', got {value!r}"
                    )
            object.__setattr__(self, name, {k: float(v) for k, v in table.items()})

    def rate(self, op_class: OpClass, dtype: str = "") -> float:
        """Achieved FLOP/s of an op of class ``op_class`` (``"matmul"``, ``"attention"``
        or ``"other"``) on tensors of dtype ``dtype`` (a name such as ``"bfloat16"``)."""
        if op_class == "attention" and dtype in self.attention_flops_per_s:
            return self.attention_flops_per_s[dtype]
        if op_class in ("matmul", "attention"):
            return self.matmul_flops_per_s.get(dtype, self.flops_per_s)
        return self.flops_per_s

    def op_time(self, *, flops: float, nbytes: float, flops_per_s: float | None = None) -> float:
        """Estimated seconds of one op with ``flops`` FLOPs moving ``nbytes`` bytes, its
        FLOPs at ``flops_per_s`` (default: :attr:`flops_per_s`; see :meth:`rate`)."""
        rate = self.flops_per_s if flops_per_s is None else flops_per_s
        return max(flops / rate, nbytes / self.memory_bytes_per_s) + self.op_overhead_s

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (the rates per dtype only when there are some, so that a
        file written without them reads the same)."""
        data = asdict(self)
        for name in ("matmul_flops_per_s", "attention_flops_per_s"):
            data[name] = dict(data[name])
            if not data[name]:
                del data[name]
        return data

    @classmethod
    def from_dict(cls, data: Any) -> ComputeRates:
        """Inverse of :meth:`to_dict`.

        Raises:
            ValueError: a field is missing or invalid.
        """
        if not isinstance(data, dict):
            raise ValueError(f"ComputeRates: expected a JSON object, got {type(data).__name__}")
        try:
            return cls(
                device_type=str(data["device_type"]),
                flops_per_s=float(data["flops_per_s"]),
                memory_bytes_per_s=float(data["memory_bytes_per_s"]),
                op_overhead_s=float(data.get("op_overhead_s", 0.0)),
                matmul_flops_per_s=_rates_by_dtype(data.get("matmul_flops_per_s", {})),
                attention_flops_per_s=_rates_by_dtype(data.get("attention_flops_per_s", {})),
            )
        except KeyError as e:
            raise ValueError(f"ComputeRates: missing field {e}") from e
        except (TypeError, ValueError) as e:
            raise ValueError(f"ComputeRates: {e}") from e


def _rates_by_dtype(value: Any) -> dict[str, float]:
    if not isinstance(value, dict):
        raise TypeError(f"rates per dtype must be a JSON object, got {type(value).__name__}")
    return {str(k): float(v) for k, v in value.items()}


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
