"""A small spawn helper for multi-rank tests: gloo on CPU, file:// rendezvous.

Usage (the worker must be a module-level function so that ``spawn`` can
pickle it)::

    def _worker(rank: int, world_size: int, out: dict) -> dict: ...
    results = run_ranks(_worker, world_size=2, args=(...,))
    # results[rank] is what _worker returned on that rank

Each rank runs ``fn(rank, world_size, *args)`` inside an initialised gloo
process group (timeout ``timeout_s``), then a barrier, then
``destroy_process_group``. Return values travel back through pickled files in
a temp dir; an exception on any rank fails the test with that rank's
traceback.

A rank ends with ``os._exit(0)`` once its result file is written, skipping
interpreter finalization. gloo's worker threads (``ProcessGroupGloo::runLoop``)
outlive ``destroy_process_group`` while anything still references the group,
and a worker drops each finished collective itself. In torch 2.13 every
``backward()`` stashes a ``contextvars.Context`` in the thread-local state
(pytorch/pytorch#173568), which a collective issued during backward (FSDP's
reduce-scatters) captures, so dropping that work needs the GIL.
When the main thread has already begun finalizing, CPython 3.11 ends the
worker with ``pthread_exit`` from ``take_gil``; the forced unwind reaches
``noexcept`` destructors (``~AsyncWork``) and ``std::terminate`` aborts the rank
("terminate called without an active exception", SIGABRT; seen about once in
five runs of tests/tracing/test_runtime_fsdp.py::test_fsdp1_flat_params on a
loaded machine). Exiting without finalization leaves no thread to take the GIL.
"""

from __future__ import annotations

import datetime
import os
import pickle
import sys
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from benchmarks._ranks import read_rank_results

__all__ = ["run_ranks"]


def _entry(
    rank: int,
    fn: Callable[..., Any],
    world_size: int,
    tmpdir: str,
    args: tuple[Any, ...],
    timeout_s: float,
) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    result_path = Path(tmpdir) / f"rank{rank}.pkl"
    try:
        dist.init_process_group(
            "gloo",
            init_method=f"file://{tmpdir}/rendezvous",
            rank=rank,
            world_size=world_size,
            timeout=datetime.timedelta(seconds=timeout_s),
        )
        out = fn(rank, world_size, *args)
        payload: tuple[str, Any] = ("ok", out)
    except BaseException as e:  # noqa: BLE001 - reported to the parent
        payload = ("error", f"rank {rank}: {type(e).__name__}: {e}\n{traceback.format_exc()}")
    finally:
        if dist.is_initialized():
            try:
                if payload[0] == "ok":
                    dist.barrier()
            finally:
                dist.destroy_process_group()
    with open(result_path, "wb") as f:
        pickle.dump(payload, f)
    # No interpreter finalization (see the module docstring): flush what
    # Python buffers, then end the process; the parent reads the result file.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def run_ranks(
    fn: Callable[..., Any],
    *,
    world_size: int = 2,
    args: tuple[Any, ...] = (),
    timeout_s: float = 60.0,
) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` spawned gloo ranks.

    Returns:
        ``[result of rank 0, result of rank 1, ...]``.

    Raises:
        AssertionError: a rank raised; the message holds every failing rank's
            traceback.
    """
    with tempfile.TemporaryDirectory(prefix="execwrap-dist-") as tmpdir:
        mp.spawn(
            _entry,
            args=(fn, world_size, tmpdir, args, timeout_s),
            nprocs=world_size,
            join=True,
        )
        results, errors = read_rank_results(tmpdir, world_size)
        if errors:
            raise AssertionError("\n".join(errors))
        return results
