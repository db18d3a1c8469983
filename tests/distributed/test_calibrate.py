"""``execwrap calibrate`` on 2 spawned gloo ranks: sane numbers, the same model on every
rank, the file written and the summary and progress shown on rank 0 only.

One calibration (40-90 s on 2 cores) serves both the Python API and the command
line: each rank runs the CLI's ``main(["calibrate", ...])`` in its process (the
group is already initialised, as under a launcher that starts it), with
``CostModel.calibrate`` wrapped to keep the model it returns on that rank. The
same command under a real ``torchrun`` subprocess is
``tests/execwrap/test_cli_calibrate.py::test_calibrate_under_torchrun_writes_the_model``
(marked ``slow``: it runs this whole calibration a second time).
"""

from __future__ import annotations

import contextlib
import io
import math
import os
import re
from pathlib import Path
from typing import Any

import psutil

from tests._calibrate_phases import assert_phase_lines
from tests._dist import run_ranks


def _calibrate(rank: int, world_size: int, out_dir: str) -> dict[str, Any]:
    from execwrap.cli import main
    from execwrap.cost import CostModel

    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size))  # what torchrun sets
    models: list[dict[str, Any]] = []
    measure = CostModel.calibrate.__func__  # type: ignore[attr-defined]

    def kept(cls: type[CostModel], *args: Any, **kwargs: Any) -> CostModel:
        model = measure(cls, *args, **kwargs)
        models.append(model.to_dict())
        return model

    CostModel.calibrate = classmethod(kept)  # type: ignore[method-assign]  # this rank only
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = main(["calibrate", "--out", str(Path(out_dir) / "cost.json"), "--max-mib", "1"])
    return {
        "code": code,
        "models": models,
        "stdout": stdout.getvalue(),
        "stderr": stderr.getvalue(),
    }


def _check_output(results: list[dict[str, Any]]) -> None:
    """The summary and ``wrote`` on rank 0's stdout, a progress line per phase on its
    stderr (not a terminal); nothing of either on rank 1."""
    out, err = results[0]["stdout"], results[0]["stderr"]
    assert out.count("wrote ") == 1 and out.rstrip().endswith("cost.json"), out
    assert "fixed cost per group per collective" in out
    assert "selective checkpointing, forward / recompute" in out
    assert "wrote " not in results[1]["stdout"]
    assert not any(ln.startswith("calibrate: ") for ln in results[1]["stderr"].splitlines())
    assert_phase_lines(err)


def test_calibrate_two_gloo_ranks(tmp_path: Path) -> None:
    results = run_ranks(_calibrate, world_size=2, args=(str(tmp_path),), timeout_s=180)
    assert [r["code"] for r in results] == [0, 0]
    assert [len(r["models"]) for r in results] == [1, 1]
    assert results[0]["models"] == results[1]["models"]  # rank 0's numbers, broadcast
    data = results[0]["models"][0]
    assert (data["device_type"], data["backend"], data["world_size"]) == ("cpu", "gloo", 2)
    from execwrap.cost import CostModel

    cm = CostModel.load(tmp_path / "cost.json")  # written by rank 0 only
    assert cm.to_dict() == data
    _check_output(results)
    # measured (a dispatch mode per op, fitted from timings): the fit clamps at 0 where a
    # loaded machine's noise swamps it, so only its range is a promise here
    assert 0.0 <= cm.checkpoint_overhead.selective_forward_op_s < 1e-2
    sizes = [4096, 16384, 65536, 262144, 1048576]
    # the sweep's sizes and 8 KiB (where the in-step factors start), up to max_bytes
    assert [s["up_to_bytes"] for s in data["all_gather"]] == [
        4096,
        8192,
        16384,
        65536,
        262144,
        None,
    ]
    for curve in (cm.all_gather, cm.reduce_scatter):
        times = [curve.time(n) for n in sizes]
        assert all(0 < t < 1.0 for t in times), times
        assert times == sorted(times)  # non-decreasing in size
    assert 0.0 <= cm.overlap <= 1.0
    assert cm.copy_bytes_per_s > 1e7
    assert cm.compute.flops_per_s > 1e8 and cm.compute.memory_bytes_per_s > 1e7
    assert 0 < cm.compute.op_overhead_s < 1e-3
    assert 0 <= cm.group_overhead_s < 0.1 and 0 <= cm.optimizer_param_overhead_s < 0.1
    assert all(math.isfinite(v) for v in (cm.group_overhead_s, cm.overlap))
    assert cm.source.startswith("calibrated on 2 gloo ranks (cpu")
    # the host's memory per rank (both spawned ranks run on this host)
    assert cm.device_memory_bytes == psutil.virtual_memory().total // 2
    # the host's steal during calibration (execwrap.cost.host), as a share of the CPU time
    # and the other processes' share (execwrap.cost.host: busy CPU time minus the ranks')
    assert re.search(
        r" s, host steal \d+\.\d%, other processes \d+\.\d% of the CPU time; in-step factors: ",
        cm.source,
    ), cm.source
    # the in-step factors the curves were multiplied by, named in the source at the larger
    # stacks' sizes (their values are tested exactly in tests/execwrap/test_cost.py)
    factors = re.search(
        r"in-step factors: all-gather ([0-9.x]+), reduce-scatter ([0-9.x]+) the sweep's at "
        r"256 KiB; ",  # max_bytes=1 MiB: the 2 and 8 MiB stacks give none
        cm.source,
    )
    assert factors is not None, cm.source
    values = [float(v.rstrip("x")) for group in factors.groups() for v in group.split(" / ")]
    assert len(values) == 2 and all(0.5 <= v <= 2.5 for v in values), values
    # the wait for the slowest rank (execwrap.cost.sync_wait), named in the source after 1 ms
    wait = re.search(
        r"; a collective waits (\d+\.\d\d) ms for the slowest rank after 1 ms of "
        r"compute$",
        cm.source,
    )
    assert wait is not None, cm.source
    assert float(wait.group(1)) == round(cm.sync_jitter * 1e-3**0.5 * 1e3, 2)
    assert 0.0 <= cm.sync_jitter < 0.1
    # AdamW's size-dependent cost per tensor, 4 KiB to 16 MiB, non-decreasing in size
    assert cm.optimizer_curve is not None
    opt = [cm.optimizer_curve.time(4 * 4**k * 1024) for k in range(7)]
    assert [s["up_to_bytes"] for s in data["optimizer_curve"]] == [
        4096,
        16384,
        65536,
        262144,
        1048576,
        4194304,
        None,
    ]
    assert all(0 < t < 1.0 for t in opt), opt
    assert all(b >= a * (1 - 1e-9) for a, b in zip(opt, opt[1:], strict=False)), opt
