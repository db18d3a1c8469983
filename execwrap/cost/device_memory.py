"""Device memory: what one rank's device holds, and how much of it a plan may use.

A :class:`~execwrap.cost.CostModel` knows its device's memory
(``device_memory_bytes``): the presets from the GPU's published capacity, a
calibrated model from the device it ran on (:func:`execwrap.cost.calibrate.measure_device_memory`).
Without a ``memory_budget`` the auto-planner plans within
:func:`default_memory_budget`: the device's memory minus a reserve for what
the simulator does not count (:func:`memory_reserve`), and says so in the
plan's notes. A predicted peak over the device's memory is named with its
overshoot (:func:`overshoot_message`) wherever a plan is predicted.

Figures and their sources:

* A preset's GPU memory is its GPU model's (:data:`execwrap.cost.gpus.GPUS`,
  each from the NVIDIA datasheet: "80 GB" for the H100 SXM5 and the A100 SXM4
  80GB, read as 80e9 bytes). That is the conservative reading: the CUDA driver
  reports more (NVML's total: 81,559 MiB, 85.5e9 bytes, on an H100 SXM5 80GB;
  81,920 MiB on an A100 80GB; "Why does an NVIDIA H100 80GB card offer 85.52
  GB?", Modal, https://thundergolfer.com/blog/nvidia-gpu-memory-capacity).
* The reserve on CUDA: the CUDA context, kernel images and library workspaces
  (cuBLAS, cuDNN): :data:`CUDA_RUNTIME_BYTES`, 1 GiB (assumed, not measured
  here: a PyTorch process with CUDA's lazy module loading holds several
  hundred MiB to about 1 GiB outside its allocator); NCCL's buffers:
  ``NCCL_BUFFSIZE`` (4 MiB by default, NCCL's environment-variable
  documentation) for each of the 3 protocols (LL, LL128, Simple), on each of
  a ring's 2 connections (send, receive), on each channel (16 on Hopper, 8 on
  Ampere: ``torch/_inductor/comm_analysis.py``'s ``_GPU_NCHANNELS``, as the
  presets use): 384 MiB on Hopper, 192 MiB on Ampere, 384 MiB for a
  calibrated CUDA model; the caching allocator's fragmentation:
  :data:`FRAGMENTATION_SHARE` of the device's memory (assumed, not measured:
  PyTorch's allocator rounds blocks and keeps freed blocks cached, and the
  ZeRO paper saw training run out of memory "with over 30% of memory still
  available" in extreme cases, Rajbhandari et al. 2020, section 3.2).
* On CPU, a rank's device memory is the host's memory divided among the ranks
  on the host (``psutil.virtual_memory().total // LOCAL_WORLD_SIZE``); the
  reserve is the Python runtime (:data:`CPU_RUNTIME_BYTES`, 512 MiB: a rank
  held 223 MiB resident after importing torch and execwrap and joining a gloo
  group, torch 2.13 here) and the same fragmentation share.

Importing this module loads no torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from execwrap.errors import MemoryBudgetError
from execwrap.util.formatting import format_bytes

if TYPE_CHECKING:
    from execwrap.cost.model import CostModel

__all__ = [
    "DEFAULT_BUDGET_PHRASE",
    "CPU_RUNTIME_BYTES",
    "CUDA_RUNTIME_BYTES",
    "FRAGMENTATION_SHARE",
    "MemoryReserve",
    "default_memory_budget",
    "memory_reserve",
    "overshoot_message",
    "refused_within_default",
]

#: CUDA context, kernel images and library workspaces per process, bytes (assumed).
CUDA_RUNTIME_BYTES = 2**30
#: The Python runtime of a CPU rank, bytes (about twice the 223 MiB measured here).
CPU_RUNTIME_BYTES = 512 * 2**20
#: Share of the device's memory held back for the allocator's fragmentation (assumed).
FRAGMENTATION_SHARE = 0.10
#: NCCL's default ``NCCL_BUFFSIZE``, bytes (NCCL documentation).
_NCCL_BUFFSIZE = 4 * 2**20
#: NCCL channels per GPU generation (``comm_analysis._GPU_NCHANNELS``); a calibrated
#: CUDA model, whose GPU is not named, is counted at the larger one.
_NCCL_CHANNELS = {"hopper": 16, "ampere": 8}


class MemoryReserve(NamedTuple):
    """What a plan leaves free of the device's memory, bytes per rank.

    Attributes:
        runtime: the CUDA context and libraries, or a CPU rank's Python runtime.
        communication: NCCL's buffers (0 on CPU).
        fragmentation: the allocator's fragmentation.
    """

    runtime: int
    communication: int
    fragmentation: int

    @property
    def total(self) -> int:
        """The whole reserve, bytes."""
        return self.runtime + self.communication + self.fragmentation

    def describe(self) -> str:
        """One phrase naming each part, e.g. ``"CUDA runtime 1 GiB, NCCL buffers 384 MiB,
        allocator fragmentation 10% (7.97 GiB)"``."""
        runtime = "CUDA runtime" if self.communication else "Python runtime"
        parts = [f"{runtime} {format_bytes(self.runtime)}"]
        if self.communication:
            parts.append(f"NCCL buffers {format_bytes(self.communication)}")
        parts.append(
            f"allocator fragmentation {FRAGMENTATION_SHARE:.0%} "
            f"({format_bytes(self.fragmentation)})"
        )
        return ", ".join(parts)


def memory_reserve(cost_model: CostModel) -> MemoryReserve | None:
    """The reserve of ``cost_model``'s device (see the module docstring), or
    ``None`` when the model does not know its device's memory."""
    total = cost_model.device_memory_bytes
    if total is None:
        return None
    fragmentation = int(total * FRAGMENTATION_SHARE)
    if cost_model.device_type != "cuda":
        return MemoryReserve(CPU_RUNTIME_BYTES, 0, fragmentation)
    gpu = "ampere" if "a100" in cost_model.source.lower() else "hopper"
    nccl = _NCCL_BUFFSIZE * 3 * 2 * _NCCL_CHANNELS[gpu]
    return MemoryReserve(CUDA_RUNTIME_BYTES, nccl, fragmentation)


def default_memory_budget(cost_model: CostModel) -> tuple[int, str] | None:
    """The memory budget per rank without a ``memory_budget``: the device's memory
    minus :func:`memory_reserve`, with the sentence saying so (for the plan's
    notes); ``None`` when the cost model does not know its device's memory.

    >>> from execwrap.cost import CostModel
    >>> budget, why = default_memory_budget(CostModel.preset("h100-nvlink-8"))
    >>> budget, why.split(":")[0]
    (70523604992, 'No memory_budget given')
    """
    reserve = memory_reserve(cost_model)
    total = cost_model.device_memory_bytes
    if reserve is None or total is None:
        return None
    budget = max(1, total - reserve.total)
    return budget, (
        f"No memory_budget given: planned within {format_bytes(budget)} per rank, the "
        f"device's {format_bytes(total)} ({_origin(cost_model)}) minus a reserve "
        f"of {format_bytes(reserve.total)} ({reserve.describe()}); pass memory_budget= "
        "(--memory-budget) to plan within another figure."
    )


#: What a refusal under the default budget adds to the finding.
DEFAULT_BUDGET_PHRASE = "no memory_budget given: the device's memory minus a reserve"


def refused_within_default(error: MemoryBudgetError, note: str) -> MemoryBudgetError:
    """``error`` (no plan fits the default budget) saying that the budget was the
    default one and how it was made (``note``, :func:`default_memory_budget`'s)."""
    finding = f"{error.finding} ({DEFAULT_BUDGET_PHRASE})"
    rest = str(error).removeprefix(error.finding)
    return MemoryBudgetError(f"{finding}{rest}. {note}", part=error.part, finding=finding)


def overshoot_message(peak_bytes: int, cost_model: CostModel, what: str) -> str | None:
    """The sentence naming how far ``peak_bytes`` (a predicted peak per rank) is over
    the device's memory, or ``None`` when it fits or the memory is unknown.

    Args:
        peak_bytes: the predicted peak memory per rank, bytes.
        cost_model: the model the prediction was made with.
        what: what was predicted, e.g. ``"simulate_step: the plan"``.
    """
    total = cost_model.device_memory_bytes
    if total is None or peak_bytes <= total:
        return None
    return (
        f"{what}'s predicted peak of {format_bytes(peak_bytes)} per rank is over the device's "
        f"memory of {format_bytes(total)} ({_origin(cost_model)}) by "
        f"{format_bytes(peak_bytes - total)}: this step would run out of memory"
    )


def _origin(cost_model: CostModel) -> str:
    """Where the device memory figure comes from, in a few words: ``"preset
    h100-nvlink-8"``, ``"calibrated on 2 gloo ranks"``."""
    origin = cost_model.source.split(";")[0].split(":")[0].split(" (")[0].strip()
    origin = origin or "the cost model"
    return origin if len(origin) <= 40 else origin[:39] + "…"
