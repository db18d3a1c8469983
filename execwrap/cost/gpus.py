"""GPU models for the presets: peak rates per dtype from datasheets, and achieved fractions.

Each :class:`Gpu` gives a GPU's dense (no sparsity) peak FLOP/s per dtype, its
memory bandwidth and capacity, and its host link, each from the source named
beside it. :func:`gpu_compute_rates` turns them into the achieved rates of a
:class:`~tracing.rates.ComputeRates`:

* matrix multiplies at :data:`MATMUL_EFFICIENCY` of the dtype's peak
  (``float32`` at the FP32 peak of the CUDA cores: torch's default
  ``torch.backends.cuda.matmul.allow_tf32 = False`` keeps float32 matmuls off
  the tensor cores);
* fused attention at :data:`ATTENTION_EFFICIENCY` of the peak, per GPU
  family (torch's ``scaled_dot_product_attention`` flash kernel is
  FlashAttention-2's, which does not use Hopper's tensor-memory accelerator);
* memory-bound ops at :data:`MEMORY_EFFICIENCY` of the memory bandwidth;
* times :data:`FITTED_EFFICIENCY` of the GPU model, the one factor per GPU
  model fitted on published runs (named there); 1 where none was fitted.

These are estimates for eager PyTorch; measure your own GPUs where you can.
"""

from __future__ import annotations

from dataclasses import dataclass

from tracing.rates import ComputeRates

__all__ = [
    "ATTENTION_EFFICIENCY",
    "FITTED_EFFICIENCY",
    "GPUS",
    "MATMUL_EFFICIENCY",
    "MEMORY_EFFICIENCY",
    "Gpu",
    "gpu_compute_rates",
]

#: Achieved fraction of the datasheet peak of a large matrix multiply: torch's own
#: estimator assumes 75% (``torch/utils/_runtime_estimation.py``, ``flops_to_ns``).
MATMUL_EFFICIENCY = 0.75
#: Achieved fraction of the memory bandwidth of memory-bound ops (the same 75%, an
#: assumption of this module; STREAM-like copies reach 80-90% on HBM).
MEMORY_EFFICIENCY = 0.75
#: Achieved fraction of the tensor-core peak of FlashAttention-2 kernels, per GPU family:
#: A100: "50-73% of the theoretical maximum FLOPs/s" (Dao, FlashAttention-2, arXiv:2307.08691,
#: abstract; the middle of the range, 0.6, for training's backward-heavy mix);
#: H100: "FlashAttention-2 achieves only 35% utilization on H100 GPUs" (Shah et al.,
#: FlashAttention-3, arXiv:2407.08608, abstract).
#: Blackwell: assumed, not sourced: torch's flash kernel is FlashAttention-2's, which uses
#: neither Hopper's nor Blackwell's new tensor-core paths; taken as Hopper's 35%.
ATTENTION_EFFICIENCY = {"ampere": 0.60, "hopper": 0.35, "blackwell": 0.35}
#: Assumed, not sourced: the per-op launch gap once kernels are queued (GPU-bound steps).
OP_OVERHEAD_S = 2e-6


@dataclass(frozen=True)
class Gpu:
    """One GPU model.

    Attributes:
        name: the key in :data:`GPUS`.
        family: ``"ampere"``, ``"hopper"`` or ``"blackwell"`` (NCCL's tables, attention
            efficiency).
        peak_flops: dtype name -> dense peak FLOP/s (``"tfloat32"``: float32 on the
            tensor cores).
        memory_bytes_per_s: peak memory bandwidth, bytes/s.
        memory_bytes: device memory, bytes.
        pcie_bytes_per_s: host link bandwidth per direction, bytes/s.
        host_memory_bytes_per_s: host DRAM bandwidth per GPU (the node's sockets'
            bandwidth shared by its GPUs), bytes/s.
        source: where the figures come from.
    """

    name: str
    family: str
    peak_flops: dict[str, float]
    memory_bytes_per_s: float
    memory_bytes: int
    pcie_bytes_per_s: float
    host_memory_bytes_per_s: float
    source: str


_H100_SXM_PEAK = {
    "float64": 67e12,
    "float32": 67e12,
    "tfloat32": 494.7e12,
    "bfloat16": 989.4e12,
    "float16": 989.4e12,
}
#: PCIe 5.0 x16: 32 GT/s x 16 lanes x 128/130 = 63.0 GB/s per direction (PCI-SIG); 4.0: half.
_PCIE5, _PCIE4 = 63.0e9, 31.5e9
#: DGX H100: 2x Xeon Platinum 8480C, 8 DDR5-4800 channels each (8 x 38.4 GB/s), for 8 GPUs.
_DGX_H100_HOST = 2 * 8 * 38.4e9 / 8
#: DGX A100: 2x EPYC 7742, 8 DDR4-3200 channels each (8 x 25.6 GB/s), for 8 GPUs.
_DGX_A100_HOST = 2 * 8 * 25.6e9 / 8
#: DGX B200: 2x Xeon Platinum 8570, 8 DDR5-5600 channels each (8 x 44.8 GB/s), for 8 GPUs.
_DGX_B200_HOST = 2 * 8 * 44.8e9 / 8

#: GPU name -> :class:`Gpu`.
GPUS: dict[str, Gpu] = {
    g.name: g
    for g in (
        Gpu(
            "h100-sxm5-80gb",
            "hopper",
            _H100_SXM_PEAK,
            3.35e12,
            80 * 10**9,
            _PCIE5,
            _DGX_H100_HOST,
            "NVIDIA H100 Tensor Core GPU datasheet (SXM5: FP32 67 TFLOP/s, TF32 494.7, BF16/FP16 "
            "989.4 dense; HBM3 80 GB, 3.35 TB/s; PCIe Gen5); DGX H100 datasheet (2x Xeon 8480C)",
        ),
        Gpu(
            "h100-hbm2e-96gb",
            "hopper",
            _H100_SXM_PEAK,
            2.4e12,
            96 * 10**9,
            _PCIE5,
            _DGX_H100_HOST,
            "torchtitan benchmarks/llama3_h100_202412_torchtitan.md (Grand Teton: H100 SXM with "
            "96 GB HBM2e at 2.4 TB/s, 500 W power limit; peak FLOP/s 'between SXM and NVL', taken "
            "as SXM's as torchtitan's MFU does); host as DGX H100",
        ),
        Gpu(
            "h200-sxm-141gb",
            "hopper",
            _H100_SXM_PEAK,
            4.8e12,
            141 * 10**9,
            _PCIE5,
            _DGX_H100_HOST,
            "NVIDIA H200 Tensor Core GPU datasheet (SXM: the H100's compute; HBM3e 141 GB, "
            "4.8 TB/s; PCIe Gen5); host as DGX H100",
        ),
        Gpu(
            "a100-sxm4-80gb",
            "ampere",
            {
                "float64": 19.5e12,
                "float32": 19.5e12,
                "tfloat32": 156e12,
                "bfloat16": 312e12,
                "float16": 312e12,
            },
            2.039e12,
            80 * 10**9,
            _PCIE4,
            _DGX_A100_HOST,
            "NVIDIA A100 Tensor Core GPU datasheet (SXM4 80GB: FP32 19.5 TFLOP/s, TF32 156, "
            "BF16/FP16 312 dense; HBM2e 2,039 GB/s; PCIe Gen4); DGX A100 datasheet (2x EPYC 7742)",
        ),
        Gpu(
            "b200-sxm-180gb",
            "blackwell",
            {
                "float64": 37e12,
                "float32": 75e12,
                "tfloat32": 1.1e15,
                "bfloat16": 2.25e15,
                "float16": 2.25e15,
            },
            8.0e12,
            180 * 10**9,
            _PCIE5,
            _DGX_B200_HOST,
            "NVIDIA HGX B200 datasheet, per GPU (FP64 37, FP32 75 TFLOP/s; TF32 2.2, BF16/FP16 "
            "4.5 PFLOP/s with sparsity, half of it dense; HBM3e 180 GB, 8 TB/s; PCIe Gen5); "
            "DGX B200 datasheet (2x Xeon Platinum 8570)",
        ),
    )
}

#: The one achieved-efficiency factor per GPU model fitted on published runs (multiplies the
#: matmul and attention rates); GPU models not listed use 1. Fitted rows:
#: ``h100-hbm2e-96gb``: torchtitan's Table 1 FSDP row alone (Llama 3.1 8B, 8 GPUs, selective
#: op-level AC, local batch 2, sequence 8192: 5,762 tokens/s/GPU; ``python -m
#: benchmarks.published --fit`` gives 0.8046, rounded to 0.80). It is that GPU model's
#: (the 500 W power-limited Grand Teton part), not every H100's.
FITTED_EFFICIENCY: dict[str, float] = {"h100-hbm2e-96gb": 0.80}


def gpu_compute_rates(name: str) -> ComputeRates:
    """The achieved :class:`~tracing.rates.ComputeRates` of GPU model ``name``.

    ``flops_per_s`` (the rate of any dtype not listed) is the bfloat16 matmul rate
    without the fitted factor, as the presets gave before rates per dtype.

    Raises:
        ValueError: an unknown GPU model (the message lists them).

    Example:
        >>> r = gpu_compute_rates("a100-sxm4-80gb")
        >>> r.rate("matmul", "bfloat16") / 1e12, r.rate("matmul", "float32") / 1e12
        (234.0, 14.625)
    """
    if name not in GPUS:
        raise ValueError(f"unknown GPU model {name!r}; choose one of {sorted(GPUS)}")
    gpu = GPUS[name]
    fitted = FITTED_EFFICIENCY.get(name, 1.0)
    attention = ATTENTION_EFFICIENCY[gpu.family]
    low = ("bfloat16", "float16")
    return ComputeRates(
        "cuda",
        MATMUL_EFFICIENCY * gpu.peak_flops["bfloat16"],
        MEMORY_EFFICIENCY * gpu.memory_bytes_per_s,
        OP_OVERHEAD_S,
        matmul_flops_per_s={
            d: fitted * MATMUL_EFFICIENCY * gpu.peak_flops[d] for d in ("float32", *low)
        },
        attention_flops_per_s={d: fitted * attention * gpu.peak_flops[d] for d in low},
    )
