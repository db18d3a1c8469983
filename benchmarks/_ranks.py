"""One benchmark job on fresh rank processes: both sides of the spawn, in one place.

The parent calls :func:`spawn_ranks` with a module-level ``entry(rank, world,
tmpdir, job)`` (importable by name, so ``torch.multiprocessing.spawn`` can
pickle it also when the benchmark runs as a script); the entry calls
:func:`rank_main` with the benchmark's body. :func:`rank_main` initialises the
process group (gloo on CPU, NCCL on CUDA; a file rendezvous in ``tmpdir``)
and a 1-D device mesh, runs ``body(rank, device, mesh, job)``, and pickles
``("ok", result)`` or ``("error", traceback)`` to ``tmpdir/rank{N}.pkl``,
which the parent collects.

Each rank leaves with ``os._exit(0)`` once its result is written: gloo's
worker threads can abort interpreter finalisation after
``destroy_process_group`` (torch 2.13; see ``tests/_dist.py``).

Example (a job dict needs ``threads``, ``device`` and ``timeout_s``)::

    def _entry(rank, world, tmpdir, job):
        rank_main(rank, world, tmpdir, job, _body)

    results = spawn_ranks(_entry, {"threads": 1, "device": "cpu", "timeout_s": 300}, 2,
                          name="fsdp_step")
"""

from __future__ import annotations

import datetime
import os
import pickle
import tempfile
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

__all__ = ["barrier", "rank_main", "read_rank_results", "spawn_ranks"]

Body = Callable[[int, torch.device, Any, dict[str, Any]], Any]
Entry = Callable[[int, int, str, dict[str, Any]], None]


def barrier(device: torch.device) -> None:
    """All ranks meet; on CUDA after this rank's queued kernels have finished."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        dist.barrier(device_ids=[device.index])
    else:
        dist.barrier()


def rank_main(rank: int, world: int, tmpdir: str, job: dict[str, Any], body: Body) -> None:
    """Rank process: init the group and mesh, run ``body``, pickle its result, exit.

    Args:
        rank, world: this rank and the number of ranks.
        tmpdir: the rendezvous and result folder (:func:`spawn_ranks` makes it).
        job: ``threads`` (torch intra-op threads), ``device`` (``"cpu"`` or
            ``"cuda"``; rank ``r`` uses ``cuda:r``), ``timeout_s`` (collective
            timeout, seconds), and whatever ``body`` reads.
        body: ``body(rank, device, mesh, job)``; its return value is the
            rank's result (picklable).
    """
    from torch.distributed.device_mesh import init_device_mesh

    torch.set_num_threads(job["threads"])
    # Denormal floats flushed to zero. A GPT of benchmarks/_autoplan_models.py makes
    # float32 gradients and AdamW states below 1.2e-38 (9,196 gradient and 48k state
    # elements after 12 steps); Intel CPUs compute those through microcode assists, and
    # its forward and backward ran up to 4.4x slower, varying from step to step (GPUs
    # compute denormals at full speed; execwrap's cost model prices no such slowdown): its
    # bfloat16 steps measured 0.65-0.94x its float32 steps from one run to the next.
    torch.set_flush_denormal(True)
    # torch warns for every Linear whose output is a view; the benchmark models
    # make no in-place change to module outputs, so the warning is noise here.
    warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view tensor")
    cuda = job["device"] == "cuda"
    if cuda:
        torch.cuda.set_device(rank)
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    payload: tuple[str, Any] = ("error", f"rank {rank}: did not finish")
    try:
        dist.init_process_group(
            "nccl" if cuda else "gloo",
            init_method=f"file://{tmpdir}/rendezvous",
            rank=rank,
            world_size=world,
            timeout=datetime.timedelta(seconds=job["timeout_s"]),
        )
        mesh = init_device_mesh(device.type, (world,))
        payload = ("ok", body(rank, device, mesh, job))
    except BaseException as e:  # noqa: BLE001 - reported to the parent
        payload = ("error", f"rank {rank}: {type(e).__name__}: {e}\n{traceback.format_exc()}")
    finally:
        if dist.is_initialized():
            try:
                if payload[0] == "ok":
                    barrier(device)
            finally:
                dist.destroy_process_group()
    with open(Path(tmpdir) / f"rank{rank}.pkl", "wb") as f:
        pickle.dump(payload, f)
    os._exit(0)  # see the module docstring: gloo worker threads and finalisation


def read_rank_results(tmpdir: str, world: int) -> tuple[list[Any], list[str]]:
    """``(results, errors)`` from the ``rank{N}.pkl`` files the ranks wrote in
    ``tmpdir``: each ``("ok", value)`` payload's value in rank order, and each
    failing rank's traceback (or ``"rank N: no result written"``). Shared with
    the tests' ``run_ranks`` (``tests/_dist.py``)."""
    results: list[Any] = []
    errors: list[str] = []
    for rank in range(world):
        path = Path(tmpdir) / f"rank{rank}.pkl"
        if not path.exists():
            errors.append(f"rank {rank}: no result written")
            continue
        with open(path, "rb") as f:
            status, value = pickle.load(f)
        (results if status == "ok" else errors).append(value)
    return results, errors


def spawn_ranks(entry: Entry, job: dict[str, Any], world: int, *, name: str) -> list[Any]:
    """Run ``entry`` on ``world`` fresh rank processes; return each rank's result.

    ``OMP_NUM_THREADS``/``MKL_NUM_THREADS`` are set to ``job["threads"]`` for
    the children and restored afterwards.

    Raises:
        RuntimeError: a rank failed or wrote no result (``name`` and each
            failing rank's traceback are in the message).
    """
    saved = {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = str(job["threads"])
    try:
        with tempfile.TemporaryDirectory(prefix=f"execwrap-{name}-") as tmpdir:
            mp.spawn(entry, args=(world, tmpdir, job), nprocs=world, join=True)
            results, errors = read_rank_results(tmpdir, world)
            if errors:
                raise RuntimeError(f"{name}: a rank failed:\n" + "\n".join(errors))
            return results
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
