"""Tests for execwrap.cost: curves, presets, JSON round trip, refusals, calibration errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from execwrap.cost import PRESETS, CollectiveCurve, ComputeRates, CostModel, CurveSegment
from execwrap.cost.calibrate import NO_PROCESS_GROUP_HINT
from execwrap.cost.sweep import sweep_sizes


def _model(**changes: object) -> CostModel:
    curve = CollectiveCurve.from_samples([4096, 65536, 1048576], [1e-4, 2e-4, 1.2e-3])
    fields: dict[str, object] = {
        "device_type": "cpu",
        "backend": "gloo",
        "world_size": 2,
        "all_gather": curve,
        "reduce_scatter": curve,
        "copy_bytes_per_s": 5e9,
        "group_overhead_s": 1e-3,
        "overlap": 0.0,
        "compute": ComputeRates("cpu", 1e11, 1e10, 2e-6),
        "optimizer_param_overhead_s": 8e-5,
        "source": "test",
        "created": "2026-12-01T10:00:00",
        "torch_version": "2.13.0",
    }
    fields.update(changes)
    return CostModel(**fields)  # type: ignore[arg-type]


def test_curve_from_samples_is_piecewise_linear_and_monotone() -> None:
    curve = CollectiveCurve.from_samples([1024, 4096, 2048], [2e-4, 1e-4, 1.5e-4])
    # times made non-decreasing by the suffix minimum (noise only adds time):
    # 1024 -> 1e-4, 2048 -> 1e-4, 4096 -> 1e-4 (flat)
    assert [curve.time(n) for n in (1, 1024, 3000, 4096)] == [1e-4] * 4
    # one disturbed point in the middle does not spread to larger sizes
    curve = CollectiveCurve.from_samples([1024, 2048, 4096, 8192], [1e-4, 9e-4, 2e-4, 3e-4])
    assert [curve.time(n) for n in (1024, 2048, 4096, 8192)] == [1e-4, 2e-4, 2e-4, 3e-4]
    curve = CollectiveCurve.from_samples([1024, 2048, 4096], [1e-4, 1.5e-4, 2.5e-4])
    assert curve.time(1536) == pytest.approx(1.25e-4)
    assert curve.time(8192) == pytest.approx(4.5e-4)  # the last segment continues
    assert curve.time(0) == 0.0
    assert curve.latency_s == pytest.approx(1e-4)
    assert curve.bandwidth_bytes_per_s == pytest.approx(2048 / 1e-4)
    with pytest.raises(ValueError, match="two or more"):
        CollectiveCurve.from_samples([1], [1.0])


def test_bandwidth_line_fits_one_line_by_relative_error() -> None:
    from execwrap.cost.fit import bandwidth_line

    # in-range samples (2, 2), (3, 2), (4, 4); weights 1/t^2 = 1/4, 1/4, 1/16:
    # slope = (S Sxy - Sx Sy) / (S Sxx - Sx^2) = (0.5625 * 3.5 - 1.5 * 1.25) / (0.5625 * 4.25
    # - 1.5^2) = 2/3, latency = (Sy - slope Sx) / S = 0.25 / 0.5625 = 4/9
    wobbly = CollectiveCurve.from_samples([1, 2, 3, 4, 8], [1.0, 2.0, 2.0, 4.0, 30.0])
    line = bandwidth_line(wobbly, [1, 2, 3, 4, 8], 2, 8)
    assert [line.time(n) for n in (2, 3, 4)] == pytest.approx([16 / 9, 22 / 9, 28 / 9])
    assert (line.time(1), line.time(8)) == (1.0, 30.0)  # outside the range: kept
    # relative, not absolute, error: one 100x disturbed time barely moves the line (an
    # unweighted least-squares line would price the 10-byte size at -27 s and 40 at 186)
    steep = CollectiveCurve.from_samples([10, 20, 40], [1.0, 2.0, 200.0])
    fitted = bandwidth_line(steep, [10, 20, 40], 10, 41)
    assert [fitted.time(n) for n in (10, 20, 40)] == pytest.approx(
        [1.0098, 2.0196, 4.0392], abs=1e-4
    )
    # fewer than two sizes in the range: unchanged
    assert bandwidth_line(wobbly, [1, 2, 3, 4, 8], 5, 8) is wobbly
    # a negative intercept is not allowed: the line goes through the origin, slope Sxy / Sxx
    concave = CollectiveCurve.from_samples([100, 200], [1.0, 5.0])
    through_origin = bandwidth_line(concave, [100, 200], 100, 201)
    # weights 1 and 1/25: Sxy = 100 + 200 * 5 / 25 = 140, Sxx = 100^2 + 200^2 / 25 = 11600
    assert through_origin.time(100) == pytest.approx(100 * 140 / 11600)
    assert through_origin.time(200) == pytest.approx(200 * 140 / 11600)


def test_curve_lower_envelope_picks_the_best_line() -> None:
    # (latency, seconds per byte): cheap start, faster for large messages
    curve = CollectiveCurve.lower_envelope([(1.0, 1.0), (3.0, 0.5), (10.0, 0.1)])
    assert curve.segments == (
        CurveSegment(4, 1.0, 1.0),  # 1 + x = 3 + x/2 at x = 4
        CurveSegment(17, 3.0, 0.5),  # 3 + x/2 = 10 + x/10 at x = 17.5
        CurveSegment(None, 10.0, 0.1),
    )
    assert curve.time(2) == pytest.approx(3.0) and curve.time(100) == pytest.approx(20.0)


def test_json_round_trip(tmp_path: Path) -> None:
    cm = _model(copy_curve=CollectiveCurve.from_samples([4096, 2**20], [1e-6, 1e-4]))
    assert cm.copy_time(2**20) == pytest.approx(1e-4)
    assert _model().copy_time(10**9) == pytest.approx(0.2)  # 1 GB at 5 GB/s
    path = cm.save(tmp_path / "sub" / "cost.json")
    assert CostModel.load(path) == cm
    data = json.loads(path.read_text())
    assert data["kind"] == "execwrap-cost-model" and data["schema_version"] == 1
    assert data["all_gather"][0] == {
        "up_to_bytes": 4096,
        "latency_s": 1e-4,
        "seconds_per_byte": 0.0,
    }
    assert [p.name for p in path.parent.iterdir()] == ["cost.json"]
    assert CostModel.from_dict(cm.to_dict()) == cm


def test_sync_jitter_round_trips_and_defaults_to_no_wait() -> None:
    cm = _model(sync_jitter=0.01)
    assert cm.to_dict()["sync_jitter"] == 0.01
    assert CostModel.from_dict(cm.to_dict()) == cm
    assert cm.sync_wait_time(4e-3) == pytest.approx(0.01 * 4e-3**0.5)
    assert (cm.sync_wait_time(0.0), cm.sync_wait_time(-1.0)) == (0.0, 0.0)
    older = {k: v for k, v in cm.to_dict().items() if k != "sync_jitter"}  # saved before it
    assert CostModel.from_dict(older).sync_jitter == 0.0
    assert CostModel.preset("h100-nvlink-8").sync_jitter == 0.0
    with pytest.raises(
        ValueError,
        match=r"^CostModel.sync_jitter must be a finite number >= 0 \(seconds per square-root "
        r"second\), got -0.001$",
    ):
        _model(sync_jitter=-1e-3)
    with pytest.raises(ValueError, match=r"cost.json: .*sync_jitter"):
        CostModel.from_dict({**cm.to_dict(), "sync_jitter": "0.01"}, source="cost.json")


def test_checkpointing_host_work_round_trips_and_defaults_to_none() -> None:
    from execwrap.cost import CheckpointOpCost

    ac = CheckpointOpCost(selective_forward_op_s=3.5e-5, selective_forward_region_s=3.2e-4)
    cm = _model(checkpoint_overhead=ac)
    assert cm.to_dict()["checkpoint_overhead"]["selective_forward_op_s"] == 3.5e-5
    assert CostModel.from_dict(cm.to_dict()) == cm
    assert ac.forward_s("selective", ops=30, regions=2) == pytest.approx(30 * 3.5e-5 + 2 * 3.2e-4)
    assert ac.recompute_s("selective", ops=30, regions=2) == 0.0
    assert ac.forward_s("none", ops=30, regions=2) == 0.0
    assert "checkpoint_overhead" not in _model().to_dict()  # none: not written
    older = {k: v for k, v in cm.to_dict().items() if k != "checkpoint_overhead"}
    assert CostModel.from_dict(older).checkpoint_overhead.is_zero
    assert CostModel.preset("h100-nvlink-8").checkpoint_overhead == CheckpointOpCost()
    with pytest.raises(
        ValueError, match=r"^CheckpointOpCost.full_forward_op_s must be seconds >= 0, got -1.0$"
    ):
        CheckpointOpCost(full_forward_op_s=-1.0)
    bad = {**cm.to_dict(), "checkpoint_overhead": {"full_forward_op_s": "1e-5"}}
    with pytest.raises(ValueError, match=r"cost.json: .*checkpoint_overhead.full_forward_op_s"):
        CostModel.from_dict(bad, source="cost.json")


def test_save_to_a_folder_names_it(tmp_path: Path) -> None:
    folder = tmp_path / "models"
    folder.mkdir()
    with pytest.raises(IsADirectoryError) as info:
        _model().save(folder)
    assert str(info.value) == (
        f"CostModel.save: {str(folder)!r} is a folder; pass the path of the file to write, "
        f"e.g. {str(folder / 'cost.json')!r}"
    )
    assert list(folder.iterdir()) == [] and sorted(tmp_path.iterdir()) == [folder]
    assert CostModel.load(_model().save(folder / "cost.json")) == _model()


def test_optimizer_time_per_tensor() -> None:
    # no curve: 7 passes over the bytes at the memory rate (1e10 B/s) + 80 us per tensor
    cm = _model()
    assert cm.optimizer_time(7, [10**6, 10**6]) == pytest.approx(7 * 2e6 / 1e10 + 2 * 8e-5)
    assert cm.optimizer_time(0, [10**6]) == 0.0
    # the calibrated curve is AdamW's 7 passes per tensor by its bytes; SGD (3 passes) 3/7 of it
    curve = CollectiveCurve.from_samples([4096, 2**20], [1e-5, 1e-3])
    cm = _model(optimizer_curve=curve)
    assert cm.optimizer_time(7, [4096, 2**20]) == pytest.approx(1e-5 + 1e-3 + 2 * 8e-5)
    assert cm.optimizer_time(3, [2**20]) == pytest.approx(3 / 7 * 1e-3 + 8e-5)
    assert cm.optimizer_time(7, [2048]) == pytest.approx(1e-5 + 8e-5)  # the floor below 4 KiB
    assert CostModel.from_dict(cm.to_dict()) == cm
    assert cm.to_dict()["optimizer_curve"][0] == {
        "up_to_bytes": 4096,
        "latency_s": 1e-5,
        "seconds_per_byte": 0.0,
    }
    old = cm.to_dict()
    del old["optimizer_curve"]  # a file written before the curve existed
    assert CostModel.from_dict(old).optimizer_curve is None


def test_copy_out_time_sums_parameters() -> None:
    cm = _model(copy_curve=CollectiveCurve.from_samples([4096, 2**20], [1e-6, 1e-4]))
    assert cm.copy_out_time([2**20, 4096]) == pytest.approx(1e-4 + 1e-6)
    assert cm.copy_out_time([]) == 0.0


def test_nonnegative_least_squares() -> None:
    from execwrap.cost.fit import nonnegative_least_squares

    # exact solution inside the feasible set
    assert nonnegative_least_squares([[3, 3], [3, 24]], [3.0, 10.0]) == pytest.approx(
        [2 / 3, 1 / 3]
    )
    # the free solution has a negative per-group cost: the best with it at 0 instead
    x = nonnegative_least_squares([[3, 6], [3, 48]], [1.0, 20.0])
    assert x[0] == 0.0 and x[1] == pytest.approx((6 * 1 + 48 * 20) / (6**2 + 48**2))


def _stack_slopes(
    ag: CollectiveCurve,
    rs: CollectiveCurve,
    copy: CollectiveCurve,
    factors: dict[tuple[int, int], tuple[float, float]],
    g: float,
    t: float,
    world: int = 2,
) -> dict[tuple[int, int], tuple[float, float]]:
    """What the fit's equations say one group of each ``(k, d)`` stack costs (forward,
    backward), with the in-step factors of ``factors`` (1 for the stacks not in it)."""
    out = {}
    for k, d in [(1, 16), (8, 16), (1, 256), (8, 256), (2, 1024)]:
        layer = -(-d // world) * world * d * 4  # dim 0 padded as FSDP2 pads it
        nbytes = k * layer
        a, b = factors.get((k, d), (1.0, 1.0))
        copies = copy.time(nbytes // world) + k * copy.time(layer)
        fwd = a * ag.time(nbytes) + copies + g + k * t
        bwd = (
            a * ag.time(nbytes) + b * rs.time(nbytes) + copies + copy.time(nbytes) + 2 * (g + k * t)
        )
        out[(k, d)] = (fwd, bwd)
    return out


_AG = CollectiveCurve.from_samples([1024, 2**20, 2**23], [2e-4, 7e-4, 6e-3])
_RS = CollectiveCurve.from_samples([1024, 2**20, 2**23], [3e-4, 1.05e-3, 9e-3])
_COPY = CollectiveCurve.from_samples([1024, 2**23], [1e-6, 1e-3])


@pytest.mark.parametrize("world", [2, 3])
def test_fit_in_step_recovers_the_costs_it_was_made_from(world: int) -> None:
    from execwrap.cost.fixed_costs import fit_in_step

    made = {(1, 256): (0.9, 0.6), (8, 256): (2.0, 1.1), (2, 1024): (1.0, 0.95)}
    slopes = _stack_slopes(_AG, _RS, _COPY, made, 6e-4, 4e-5, world)
    factors, g, t = fit_in_step(slopes, _AG, _RS, _COPY, world)
    padded = -(-256 // world) * world * 256 * 4
    assert [n for n, _, _ in factors] == [
        padded,
        8 * padded,
        2 * (-(-1024 // world) * world) * 4096,
    ]
    assert [v for _, a, b in factors for v in (a, b)] == pytest.approx(
        [0.9, 0.6, 2.0, 1.1, 1.0, 0.95]
    )
    assert (g, t) == pytest.approx((6e-4, 4e-5))
    # stacks larger than the sweep are not run, so give no factor (its curves are
    # extrapolated there)
    from execwrap.cost.fixed_costs import stacks_within

    kept = {(k, d) for k, d, _ in stacks_within(2**20, world)}
    within, _, _ = fit_in_step(
        {key: v for key, v in slopes.items() if key in kept}, _AG, _RS, _COPY, world
    )
    assert [n for n, _, _ in within] == [padded]


def test_fit_in_step_keeps_the_factors_in_range(caplog: pytest.LogCaptureFixture) -> None:
    from execwrap.cost.fixed_costs import fit_in_step

    # a disturbed stack cannot price a size at 5x or at 0: the factors stay in range, logged
    slopes = _stack_slopes(_AG, _RS, _COPY, {(1, 256): (9.0, 0.01)}, 6e-4, 4e-5)
    with caplog.at_level("WARNING", logger="execwrap.cost.fixed_costs"):
        factors, _, _ = fit_in_step(slopes, _AG, _RS, _COPY, 2)
    assert factors[0] == (2**18, 2.5, 0.5)
    assert caplog.messages == [
        "calibrate: the in-step factors of 262144-byte groups (9.00x all-gather, 0.01x "
        "reduce-scatter) were kept within (0.5, 2.5): a disturbed stack; calibrate again on a "
        "quiet machine"
    ]
    caplog.clear()
    # one factor outside the range: only it is named
    slopes = _stack_slopes(_AG, _RS, _COPY, {(1, 256): (1.5, 0.01)}, 6e-4, 4e-5)
    with caplog.at_level("WARNING", logger="execwrap.cost.fixed_costs"):
        factors, _, _ = fit_in_step(slopes, _AG, _RS, _COPY, 2)
    assert factors[0] == (2**18, pytest.approx(1.5), 0.5)
    assert caplog.messages == [
        "calibrate: the in-step factor of 262144-byte groups (0.01x reduce-scatter) was kept "
        "within (0.5, 2.5): a disturbed stack; calibrate again on a quiet machine"
    ]
    with pytest.raises(ValueError, match="no stack of at most 8192 bytes per group"):
        fit_in_step({(1, 256): (1e-3, 2e-3)}, _AG, _RS, _COPY, 2)


def test_in_step_curve_interpolates_the_factors_in_log_size() -> None:
    from execwrap.cost.fixed_costs import in_step_curve

    sweep = CollectiveCurve.from_samples([2**10, 2**30], [1e-3, 1e-3 + 2**30 * 1e-12])
    sizes = [2**15, 2**20, 2**26]
    curve = in_step_curve(sweep, sizes, [(2**18, 2.0), (2**21, 2.5), (2**23, 3.0)])
    # 1 up to 8 KiB; from 8 KiB to 256 KiB linear in log-size (32 KiB is 2 / 5 of the way
    # to 2.0); between the points likewise (1 MiB: 2 / 3 of the way from 2.0 to 2.5); the
    # last point's beyond it (64 MiB: 3.0); linear interpolation in size would give 1.09
    # at 32 KiB and 2.43 at 1 MiB
    want = {2**13: 1.0, 2**15: 1.4, 2**18: 2.0, 2**20: 2 + 2 / 3 * 0.5, 2**21: 2.5, 2**26: 3.0}
    assert {n: curve.time(n) / sweep.time(n) for n in want} == pytest.approx(want)


def test_in_step_curve_never_prices_below_the_latency() -> None:
    from execwrap.cost.fixed_costs import in_step_curve

    flat = CollectiveCurve.from_samples([2**10, 2**30], [1e-3, 1e-3])
    curve = in_step_curve(flat, [2**16, 2**26], [(2**18, 0.5), (2**21, 2.0)])
    # the 0.5x at 256 KiB would pull 8 KiB and below to 0.5 ms: floored at the sweep's 1 ms
    assert [round(curve.time(n) * 1e3, 6) for n in (2**10, 2**13, 2**18, 2**21, 2**26)] == [
        1.0,
        1.0,
        1.0,
        2.0,
        2.0,
    ]


def test_load_errors_name_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match=r"bad\.json: not valid JSON"):
        CostModel.load(bad)
    bad.write_text(json.dumps({"kind": "execwrap-report"}))
    with pytest.raises(
        ValueError, match=r"bad\.json: not an execwrap cost model .*execwrap calibrate"
    ):
        CostModel.load(bad)
    data = _model().to_dict()
    data["schema_version"] = 7
    bad.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=r"unsupported cost model schema_version 7"):
        CostModel.load(bad)
    del data["overlap"]
    data["schema_version"] = 1
    bad.write_text(json.dumps(data))
    with pytest.raises(
        ValueError, match=r"bad\.json: malformed cost model: field overlap: missing"
    ):
        CostModel.load(bad)
    bad.write_text(json.dumps({**_model().to_dict(), "world_size": "2"}))
    with pytest.raises(
        ValueError,
        match=r"bad\.json: malformed cost model: field world_size: expected an int >= 1 "
        r"\(ranks\), got str '2'$",
    ):
        CostModel.load(bad)


@pytest.mark.parametrize(
    "change, message",
    [
        (
            {"all_gather": [{"up_to_bytes": None, "latency_s": "1e-4", "seconds_per_byte": 0}]},
            "field all_gather[0].latency_s: expected a finite number, got str '1e-4'",
        ),
        (
            {"reduce_scatter": [{"up_to_bytes": None, "latency_s": 0, "seconds_per_byte": "1"}]},
            "field reduce_scatter[0].seconds_per_byte: expected a finite number >= 0.0, got "
            "str '1'",
        ),
        (
            {"all_gather": [{"up_to_bytes": None, "latency_s": -1e-4, "seconds_per_byte": 0}]},
            "field all_gather[0].latency_s: expected a time >= 0 s where the segment starts "
            "(0 bytes), got -0.0001",
        ),
        (
            {
                "copy_curve": [
                    {"up_to_bytes": 4096, "latency_s": 1e-4, "seconds_per_byte": 0.0},
                    {"up_to_bytes": None, "latency_s": -1e-3, "seconds_per_byte": 1e-9},
                ]
            },
            "field copy_curve[1].latency_s: expected a time >= 0 s where the segment starts "
            "(4096 bytes), got latency_s -0.001 + 4096 x seconds_per_byte 1e-09 = "
            "-0.000995904 s",
        ),
        (
            {"copy_bytes_per_s": "5e9"},
            "field copy_bytes_per_s: expected a finite number, got str '5e9'",
        ),
        (
            {"group_overhead_s": -1e-3},
            "field group_overhead_s: expected a finite number >= 0.0, got -0.001",
        ),
        (
            {"optimizer_param_overhead_s": "8e-5"},
            "field optimizer_param_overhead_s: expected a finite number >= 0.0, got str '8e-5'",
        ),
        (
            {"backend": "mpi"},
            "field backend: expected the process group's backend, 'gloo' or 'nccl' (or a "
            "per-device list of them such as 'cpu:gloo,cuda:nccl', or 'undefined': "
            "init_process_group() without a backend), got str 'mpi'; execwrap models FSDP2 on "
            "gloo and nccl only",
        ),
        (
            {"device_type": "tpu"},
            "field device_type: expected 'cpu' or 'cuda' (the devices execwrap calibrates and "
            "simulates FSDP2 on), got str 'tpu'",
        ),
        (
            {"compute": {"device_type": "cpu", "flops_per_s": "1e11", "memory_bytes_per_s": 1}},
            "field compute.flops_per_s: expected a finite number, got str '1e11'",
        ),
    ],
)
def test_load_refuses_invalid_content(
    tmp_path: Path, change: dict[str, object], message: str
) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**_model().to_dict(), **change}))
    with pytest.raises(ValueError) as info:
        CostModel.load(bad)
    assert str(info.value) == f"{bad}: malformed cost model: {message}"


def test_load_takes_every_preset_and_calibration_shape(tmp_path: Path) -> None:
    """What the presets and a calibration write loads back: every preset at its world
    sizes, the backends ``dist.get_backend`` names, and a curve through steep medians
    (its later segments' lines cross zero before they start: not a negative time)."""
    models = [
        CostModel.preset(name, world_size=w)
        for name in sorted(PRESETS)
        for w in ((16, 32) if PRESETS[name].inter_node else (2, 4, 8))
    ]
    steep = CollectiveCurve.from_samples([1024, 2**20, 2**21, 2**25], [1e-4, 1.1e-4, 5e-2, 0.06])
    assert steep.segments[2].latency_s < 0
    models += [
        _model(all_gather=steep, reduce_scatter=steep, copy_curve=steep, optimizer_curve=steep)
    ]
    models += [_model(backend=b) for b in ("nccl", "undefined", "cpu:gloo", "cpu:gloo,cuda:nccl")]
    for i, cm in enumerate(models):
        assert CostModel.load(cm.save(tmp_path / f"{i}.json")) == cm


def test_refuses_other_world_size_or_device() -> None:
    cm = _model()
    cm.check_compatible(world_size=2, device_type="cpu")
    with pytest.raises(ValueError) as info:
        cm.check_compatible(world_size=8, device_type="cpu")
    assert str(info.value) == (
        "cost model (test) does not fit world size 8 (this cost model is for 2 ranks): calibrate "
        "on the target's 8 ranks (`execwrap calibrate` under torchrun) or use a preset that "
        "describes them (CostModel.preset(name, world_size=8): the NVLink presets one node of "
        "2-8 GPUs, h100-ib-400g 2 or more whole nodes of 8)"
    )
    # a calibration's long description is cut at its first ";"
    described = _model(source="calibrated on 2 gloo ranks; in-step factors: " + "x" * 300)
    with pytest.raises(ValueError, match=r"^cost model \(calibrated on 2 gloo ranks\) does not"):
        described.check_compatible(world_size=8, device_type="cpu")
    with pytest.raises(ValueError) as info:
        cm.check_compatible(world_size=2, device_type="cuda")
    assert str(info.value) == (
        "cost model (test) does not fit device type 'cuda' (this cost model is for 'cpu'): the "
        "order's compute times are for 'cuda': time it on the cost model's device, or estimate "
        "it (record_execution_order on the meta device with timing=cost_model.compute), or use "
        "a cost model for 'cuda'"
    )
    with pytest.raises(ValueError, match=r"world size 4 .* and device type 'cuda'"):
        cm.check_compatible(world_size=4, device_type="cuda")


def test_invalid_fields() -> None:
    with pytest.raises(ValueError, match=r"overlap must be within \[0, 1\], got 1.5"):
        _model(overlap=1.5)
    with pytest.raises(ValueError, match=r"world_size must be an int >= 1"):
        _model(world_size=0)
    with pytest.raises(
        ValueError, match=r"compute rates are for 'cuda' but the model is for 'cpu'"
    ):
        _model(compute=ComputeRates("cuda", 1e12, 1e12))
    with pytest.raises(ValueError, match=r"flops_per_s must be a finite number > 0"):
        ComputeRates("cpu", 0.0, 1.0)


def test_presets() -> None:
    assert {"a100-nvlink-8", "h100-ib-400g", "h100-nvlink-8"} <= set(PRESETS)
    nv = CostModel.preset("h100-nvlink-8")
    assert (nv.device_type, nv.backend, nv.world_size) == ("cuda", "nccl", 8)
    # NCCL ring LL: 6.6 us base + 7 hops x 0.6 us; Simple at large sizes: 370 GB/s bus bandwidth
    assert nv.all_gather.latency_s == pytest.approx(10.8e-6)
    assert nv.all_gather.bandwidth_bytes_per_s == pytest.approx(370e9 * 8 / 7)
    assert nv.overlap == pytest.approx(1 - 16 / 132)
    assert nv.compute.flops_per_s == pytest.approx(0.75 * 989.4e12)
    ib = CostModel.preset("h100-ib-400g")
    assert ib.world_size == 16
    assert ib.all_gather_time(2**30) > 5 * nv.all_gather_time(2**30)
    assert CostModel.preset("h100-ib-400g", world_size=64).world_size == 64
    with pytest.raises(ValueError, match=r"unknown cost-model preset 'tpu'; choose one of"):
        CostModel.preset("tpu")
    with pytest.raises(
        ValueError, match=r"describes one node of 8 GPUs; world_size 16 spans nodes"
    ):
        CostModel.preset("h100-nvlink-8", world_size=16)
    with pytest.raises(ValueError, match=r"multiple of 8 and >= 16, got 12"):
        CostModel.preset("h100-ib-400g", world_size=12)


def test_sweep_sizes() -> None:
    large = [2**20 * m for m in (1.5, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)]
    assert sweep_sizes(64 * 2**20, 2) == [4096 * 4**k for k in range(5)] + [int(n) for n in large]
    assert sweep_sizes(2**20, 3) == [4104, 16392, 65544, 262152, 1048584]


def test_calibrate_without_process_group_says_how_to_start_one() -> None:
    with pytest.raises(RuntimeError, match=r"init_process_group\('gloo'\).*torchrun"):
        CostModel.calibrate()
    assert "torchrun --nproc_per_node=2 -m execwrap calibrate" in NO_PROCESS_GROUP_HINT


@pytest.mark.parametrize("repeat", [0, -1, 1.5, True])
def test_calibrate_refuses_a_bad_repeat_before_anything_else(repeat: object) -> None:
    with pytest.raises(ValueError, match=rf"repeat must be an int >= 1, got {repeat!r}"):
        CostModel.calibrate(repeat=repeat)  # type: ignore[arg-type]


def test_cost_model_loads_without_torch(tmp_path: Path) -> None:
    path = CostModel.preset("h100-nvlink-8").save(tmp_path / "c.json")
    code = (
        "import sys; from execwrap.cost import CostModel; "
        f"cm = CostModel.load({str(path)!r}); assert cm.world_size == 8; "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run(
        [sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[2]
    )


@pytest.mark.parametrize(
    ("device", "message"),
    [
        ("meta", r"calibrate: device must be a CPU or CUDA device, got 'meta'"),
        ("cuda", r"calibrate: device 'cuda', but CUDA is not available here; pass device='cpu'"),
    ],
)
def test_calibrate_refuses_a_device_it_cannot_time_on(device: str, message: str) -> None:
    import torch

    if device == "cuda" and torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    with pytest.raises(ValueError, match=message):
        CostModel.calibrate(device=device)
