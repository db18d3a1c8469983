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
"""

from __future__ import annotations

import datetime
import os
import pickle
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

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
        results: list[Any] = []
        errors: list[str] = []
        for rank in range(world_size):
            path = Path(tmpdir) / f"rank{rank}.pkl"
            if not path.exists():
                errors.append(f"rank {rank}: no result written")
                continue
            with open(path, "rb") as f:
                status, value = pickle.load(f)
            if status == "error":
                errors.append(value)
            results.append(value)
        if errors:
            raise AssertionError("\n".join(errors))
        return results
