"""Tests for the GPU models of the presets, compute rates per dtype and the host link."""

from __future__ import annotations

import json

import pytest

from execwrap.cost import ComputeRates, CostModel
from execwrap.cost.gpus import FITTED_EFFICIENCY, GPUS, gpu_compute_rates
from execwrap.cost.host_link import HostLink


def test_rates_per_dtype_come_from_the_datasheet_peaks() -> None:
    r = gpu_compute_rates("h100-sxm5-80gb")
    assert r.rate("matmul", "bfloat16") == pytest.approx(0.75 * 989.4e12)
    assert r.rate("matmul", "float16") == pytest.approx(0.75 * 989.4e12)
    # float32 matmuls stay off the tensor cores unless TF32 is allowed (torch's default)
    assert r.rate("matmul", "float32") == pytest.approx(0.75 * 67e12)
    assert r.rate("attention", "bfloat16") == pytest.approx(0.35 * 989.4e12)
    assert r.rate("attention", "float32") == r.rate("matmul", "float32")
    assert r.memory_bytes_per_s == pytest.approx(0.75 * 3.35e12)
    a100 = gpu_compute_rates("a100-sxm4-80gb")
    assert a100.rate("attention", "bfloat16") == pytest.approx(0.60 * 312e12)


def test_the_fitted_factor_is_its_gpu_models_alone() -> None:
    assert FITTED_EFFICIENCY == {"h100-hbm2e-96gb": 0.80}
    tt = gpu_compute_rates("h100-hbm2e-96gb")
    assert tt.rate("matmul", "bfloat16") == pytest.approx(0.80 * 0.75 * 989.4e12)
    assert tt.memory_bytes_per_s == pytest.approx(0.75 * 2.4e12)
    assert tt.flops_per_s == gpu_compute_rates("h100-sxm5-80gb").flops_per_s


def test_preset_gpu_choice() -> None:
    cm = CostModel.preset("h100-nvlink-8", gpu="h100-hbm2e-96gb")
    assert cm.copy_bytes_per_s == pytest.approx(0.75 * 2.4e12 / 2)
    assert cm.all_gather == CostModel.preset("h100-nvlink-8").all_gather
    assert cm.source.startswith(
        "preset h100-nvlink-8: 8x H100 SXM in one node, NVLink/NVSwitch, GPU h100-hbm2e-96gb"
    )
    assert cm.host == HostLink(
        0.75 * 63e9, 0.75 * 63e9, 0.75 * 76.8e9, source=cm.host.source if cm.host else ""
    )
    with pytest.raises(
        ValueError, match=r"preset 'a100-nvlink-8': unknown GPU model 'h100'; choose one of"
    ):
        CostModel.preset("a100-nvlink-8", gpu="h100")
    # another family brings its own NVLink and NCCL constants
    a100_ib = CostModel.preset("h100-ib-400g", world_size=64, gpu="a100-sxm4-80gb")
    assert a100_ib.overlap == pytest.approx(1 - 8 / 108)
    assert CostModel.preset("h100-nvlink-8", gpu="a100-sxm4-80gb").all_gather == (
        CostModel.preset("a100-nvlink-8").all_gather
    )
    with pytest.raises(ValueError, match=r"unknown GPU model 'v100'; choose one of"):
        gpu_compute_rates("v100")
    assert sorted(GPUS) == [
        "a100-sxm4-80gb",
        "b200-sxm-180gb",
        "h100-hbm2e-96gb",
        "h100-sxm5-80gb",
        "h200-sxm-141gb",
    ]


def test_cost_model_with_rates_per_dtype_and_host_round_trips() -> None:
    cm = CostModel.preset("h100-ib-400g", world_size=16, gpu="h200-sxm-141gb")
    again = CostModel.from_dict(json.loads(json.dumps(cm.to_dict())), source="c.json")
    assert again == cm and again.host == cm.host
    assert again.compute.matmul_flops_per_s == cm.compute.matmul_flops_per_s
    cpu = CostModel.preset("h100-nvlink-8").replace(
        device_type="cpu", compute=ComputeRates("cpu", 1e9, 1e9), host=None
    )
    data = cpu.to_dict()
    assert "host" not in data and "matmul_flops_per_s" not in data["compute"]
    assert CostModel.from_dict(data) == cpu


def test_bad_rates_are_refused() -> None:
    with pytest.raises(
        ValueError,
        match=r"ComputeRates.matmul_flops_per_s\['bfloat16'\] must be a finite number > 0 "
        r"\(FLOP/s\) keyed by a dtype name such as 'bfloat16', got 0",
    ):
        ComputeRates("cuda", 1.0, 1.0, matmul_flops_per_s={"bfloat16": 0})
    with pytest.raises(
        ValueError, match=r"HostLink.to_host_bytes_per_s must be a finite number > 0, got -1"
    ):
        HostLink(1.0, -1, 1.0)
    data = CostModel.preset("h100-nvlink-8").to_dict()
    data["compute"]["attention_flops_per_s"] = {"bfloat16": "fast"}
    with pytest.raises(
        ValueError, match=r"field compute\.attention_flops_per_s\.bfloat16: expected"
    ):
        CostModel.from_dict(data, source="c.json")
