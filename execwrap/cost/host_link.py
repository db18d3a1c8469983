"""The link between a GPU and its host: what CPU offload pays for.

FSDP2's ``CPUOffloadPolicy`` keeps the sharded parameters, their gradients
and the optimizer state in (pinned) host memory: each all-gather first copies
its shard to the device, each reduce-scatter's gradient shard is copied back,
and the optimizer steps on the CPU. :class:`HostLink` holds the rates that
prices those: the host-to-device and device-to-host bandwidths of one GPU's
PCIe link and the memory traffic one rank's CPU optimizer step achieves. The
GPU presets give cited values (:mod:`execwrap.cost.gpus`); a CPU cost model
has none (there is no device memory to offload from).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Literal

__all__ = ["HostLink"]


@dataclass(frozen=True)
class HostLink:
    """Host-device copy rates and the CPU optimizer's rate of one rank.

    Attributes:
        to_device_bytes_per_s: host-to-device copy bandwidth (pinned memory), bytes/s.
        to_host_bytes_per_s: device-to-host copy bandwidth, bytes/s.
        optimizer_bytes_per_s: memory traffic of the optimizer step on the CPU,
            bytes read plus written per second (AdamW moves 7 bytes per
            parameter byte: :data:`execwrap.simulate.OPTIMIZERS`).
        source: where the figures come from.

    Example:
        >>> link = HostLink(50e9, 50e9, 60e9)
        >>> link.copy_time(10**9, "to_device"), round(link.optimizer_time(7, [10**9]), 4)
        (0.02, 0.1167)
    """

    to_device_bytes_per_s: float
    to_host_bytes_per_s: float
    optimizer_bytes_per_s: float
    source: str = ""

    def __post_init__(self) -> None:
        for name in ("to_device_bytes_per_s", "to_host_bytes_per_s", "optimizer_bytes_per_s"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise ValueError(f"HostLink.{name} must be a finite number > 0, got {value!r}")

    def copy_time(self, nbytes: int, direction: Literal["to_device", "to_host"]) -> float:
        """Seconds to copy ``nbytes`` bytes between host and device."""
        rate = self.to_device_bytes_per_s if direction == "to_device" else self.to_host_bytes_per_s
        return max(0, nbytes) / rate

    def optimizer_time(self, passes: int, tensor_bytes: list[int]) -> float:
        """Seconds of an optimizer step on the CPU with ``passes`` passes per parameter
        byte over shards of ``tensor_bytes`` bytes."""
        return passes * sum(max(0, b) for b in tensor_bytes) / self.optimizer_bytes_per_s

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return asdict(self)
