"""Compute rates of one device: what turns FLOPs and bytes into seconds.

:class:`ComputeRates` is plain data (no torch import) shared by the roofline
estimate of :mod:`tracing.runtime.estimate` (compute times of a model on the
meta device or under fake tensors) and by :class:`execwrap.cost.CostModel`,
which measures them (``CostModel.calibrate``) or takes them from a cited
preset.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["ComputeRates"]


@dataclass(frozen=True)
class ComputeRates:
    """Achieved compute rates of one device, for roofline estimates.

    An op's estimated time is ``max(flops / flops_per_s, bytes /
    memory_bytes_per_s) + op_overhead_s`` (the roofline of
    ``torch.distributed._tools.runtime_estimator.RuntimeEstimator``'s
    ``operator-level-cost-model`` mode, plus a fixed per-op cost that
    dominates small ops in eager mode on a CPU).

    Attributes:
        device_type: the device these rates describe (``"cpu"``, ``"cuda"``).
        flops_per_s: achieved matrix-multiply rate, FLOP/s (a multiply-add is
            2 FLOPs, as ``torch.utils.flop_counter`` counts).
        memory_bytes_per_s: achieved memory traffic, bytes read plus bytes
            written per second.
        op_overhead_s: fixed cost per op (dispatch, kernel launch), seconds.

    Example:
        >>> rates = ComputeRates("cpu", flops_per_s=1e11, memory_bytes_per_s=1e10)
        >>> rates.op_time(flops=2e9, nbytes=1e6)
        0.02
    """

    device_type: str
    flops_per_s: float
    memory_bytes_per_s: float
    op_overhead_s: float = 0.0

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

    def op_time(self, *, flops: float, nbytes: float) -> float:
        """Estimated seconds of one op with ``flops`` FLOPs moving ``nbytes`` bytes."""
        return max(flops / self.flops_per_s, nbytes / self.memory_bytes_per_s) + self.op_overhead_s

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return asdict(self)

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
            )
        except KeyError as e:
            raise ValueError(f"ComputeRates: missing field {e}") from e
        except (TypeError, ValueError) as e:
            raise ValueError(f"ComputeRates: {e}") from e


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
