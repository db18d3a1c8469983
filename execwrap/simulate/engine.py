"""A small discrete-event engine: ops on FIFO streams, with rates that depend on what overlaps.

An :class:`Op` runs on one stream (``compute``, ``all_gather``,
``reduce_scatter``) after the op before it on that stream and after its
dependencies. Its ``work_s`` is seconds at full speed; while it runs its speed
is:

* a collective (``kind="comm"``): ``1 / k`` when ``k`` collectives on its link run
  at once (they share the link fairly; HSDP's all-reduces across nodes run on
  another link than all-gathers and reduce-scatters inside a node);
* anything on the compute stream: ``overlap`` while a collective is in
  flight, else ``1`` (``overlap = 1``: communication is free beside compute;
  ``0``: compute stops while a collective runs, so the collective is fully
  exposed).

The engine advances from one start or finish to the next (a fluid model:
between events every rate is constant), and applies each op's memory events
when it starts and when it finishes, keeping the peak and the breakdown at
the peak. With ``pools`` (memory category -> the stream whose allocator pool
holds it) it also keeps each pool's own peak: PyTorch's CUDA caching
allocator reuses a freed block only for the stream it was allocated on
(``torch.Tensor.record_stream``'s documentation; "CUDA semantics", memory
management), so the memory a process reserves is at least the sum of its
streams' peaks, not the peak of their sum.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = ["EngineResult", "MemEvent", "Op", "run_ops"]


@dataclass(frozen=True)
class MemEvent:
    """Allocate (``nbytes > 0``) or free (``nbytes == 0``) the buffer ``key`` of a category."""

    category: str
    key: str
    nbytes: int = 0


@dataclass
class Op:
    """One span of work (see the module docstring).

    Attributes:
        stream: the stream it runs on.
        label: for the timeline.
        work_s: seconds at full speed (``0`` for a marker or a wait).
        kind: ``"compute"``, ``"optimizer"``, ``"copy"``, ``"overhead"``,
            ``"comm"`` or ``"wait"``.
        deps: indices of ops that must finish before it starts.
        phase: ``"forward"``, ``"backward"`` or ``"optimizer"``.
        on_start: memory events when it starts.
        on_end: memory events when it finishes.
        link: the link a collective runs on (collectives share only their own link).
    """

    stream: str
    label: str
    work_s: float
    kind: str
    deps: tuple[int, ...] = ()
    phase: str = "forward"
    on_start: tuple[MemEvent, ...] = ()
    on_end: tuple[MemEvent, ...] = ()
    link: str = ""


@dataclass
class EngineResult:
    """Start and end of every op, the makespan, and memory over time."""

    start: list[float]
    end: list[float]
    makespan: float
    peak_bytes: int
    peak_time: float
    peak_phase: str
    peak_breakdown: dict[str, int]
    memory_timeline: list[tuple[float, int]] = field(default_factory=list)
    pool_peaks: dict[str, int] = field(default_factory=dict)


class _Memory:
    """Bytes per category over time, with the peak."""

    def __init__(self, base: dict[str, int], pools: dict[str, str]) -> None:
        self.pools = pools
        self.by_pool: dict[str, int] = {}
        for category, nbytes in base.items():
            pool = pools.get(category, "compute")
            self.by_pool[pool] = self.by_pool.get(pool, 0) + nbytes
        self.pool_peaks = dict(self.by_pool)
        self.by_category = dict(base)
        self.buffers: dict[tuple[str, str], int] = {}
        self.total = sum(base.values())
        self.peak = self.total
        self.peak_time = 0.0
        self.peak_phase = "forward"
        self.peak_breakdown = dict(self.by_category)
        self.timeline: list[tuple[float, int]] = [(0.0, self.total)]

    def apply(self, events: Sequence[MemEvent], t: float, phase: str) -> None:
        for ev in events:
            key = (ev.category, ev.key)
            old = self.buffers.pop(key, 0)
            if ev.nbytes > 0:
                self.buffers[key] = ev.nbytes
            delta = ev.nbytes - old
            self.by_category[ev.category] = self.by_category.get(ev.category, 0) + delta
            self.total += delta
            pool = self.pools.get(ev.category, "compute")
            self.by_pool[pool] = self.by_pool.get(pool, 0) + delta
            if self.by_pool[pool] > self.pool_peaks.get(pool, 0):
                self.pool_peaks[pool] = self.by_pool[pool]
        if events:
            self.timeline.append((t, self.total))
            if self.total > self.peak:
                self.peak = self.total
                self.peak_time = t
                self.peak_phase = phase
                self.peak_breakdown = dict(self.by_category)


def run_ops(
    ops: Sequence[Op],
    *,
    overlap: float,
    base_memory: dict[str, int],
    pools: dict[str, str] | None = None,
) -> EngineResult:
    """Run ``ops`` (each stream in list order) and return when each started and ended.

    Args:
        ops: the program; an op's ``deps`` refer to earlier list indices.
        overlap: compute speed while a collective runs (0..1).
        base_memory: bytes per category alive for the whole step.
        pools: memory category -> allocator pool (default: one pool); a category
            not listed is in pool ``"compute"``.

    Raises:
        RuntimeError: the ops wait on each other (a cycle: a bug in the program).
    """
    queues: dict[str, deque[int]] = {}
    for i, op in enumerate(ops):
        queues.setdefault(op.stream, deque()).append(i)
    n = len(ops)
    start = [math.nan] * n
    end = [math.nan] * n
    done = [False] * n
    is_comm = [op.kind == "comm" for op in ops]
    links = [op.link for op in ops]
    tolerance = [1e-12 * max(1.0, op.work_s) for op in ops]  # work left that counts as done
    remaining: dict[int, float] = {}  # active op -> work left (seconds at full speed)
    busy: set[str] = set()  # the streams of the active ops (one op per stream)
    memory = _Memory(base_memory, pools or {})
    t = 0.0
    finished = 0
    while finished < n:
        finished += _start_ready(ops, queues, remaining, busy, done, start, end, memory, t)
        if not remaining:
            if finished < n:
                stuck = [ops[q[0]].label for q in queues.values() if q]
                raise RuntimeError(f"simulator deadlock at t={t:.6f}s; waiting: {stuck}")
            break
        rates = _rates(is_comm, links, remaining, overlap)
        dt = min([remaining[i] / r for i, r in rates if r > 0])
        t += dt
        for i, r in rates:
            remaining[i] -= r * dt
        for i in [i for i, left in remaining.items() if left <= tolerance[i]]:
            del remaining[i]
            busy.discard(ops[i].stream)
            _finish(ops[i], i, t, done, end, memory)
            finished += 1
    return EngineResult(
        start=start,
        end=end,
        makespan=t,
        peak_bytes=memory.peak,
        peak_time=memory.peak_time,
        peak_phase=memory.peak_phase,
        peak_breakdown=memory.peak_breakdown,
        memory_timeline=memory.timeline,
        pool_peaks=dict(memory.pool_peaks),
    )


def _start_ready(
    ops: Sequence[Op],
    queues: dict[str, deque[int]],
    remaining: dict[int, float],
    busy: set[str],
    done: list[bool],
    start: list[float],
    end: list[float],
    memory: _Memory,
    t: float,
) -> int:
    """Start every stream head whose stream is free (not in ``busy``) and whose
    deps are done; zero-work ops finish at once. Returns how many ops finished."""
    finished = 0
    progressed = True
    while progressed:
        progressed = False
        for stream, queue in queues.items():
            if not queue or stream in busy:
                continue
            i = queue[0]
            op = ops[i]
            if op.deps and not all(done[d] for d in op.deps):
                continue
            queue.popleft()
            start[i] = t
            if op.on_start:
                memory.apply(op.on_start, t, op.phase)
            if op.work_s <= 0:
                _finish(op, i, t, done, end, memory)
                finished += 1
            else:
                remaining[i] = op.work_s
                busy.add(stream)
            progressed = True
    return finished


def _finish(op: Op, i: int, t: float, done: list[bool], end: list[float], memory: _Memory) -> None:
    done[i] = True
    end[i] = t
    if op.on_end:
        memory.apply(op.on_end, t, op.phase)


def _rates(
    is_comm: list[bool], links: list[str], remaining: dict[int, float], overlap: float
) -> list[tuple[int, float]]:
    """``(op, speed)`` of each active op (see the module docstring)."""
    active: dict[str, int] = {}
    for i in remaining:
        if is_comm[i]:
            active[links[i]] = active.get(links[i], 0) + 1
    if not active:
        return [(i, 1.0) for i in remaining]
    return [(i, 1.0 / active[links[i]] if is_comm[i] else overlap) for i in remaining]
