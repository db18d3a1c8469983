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
from typing import NamedTuple

__all__ = ["EngineResult", "MemEvent", "Op", "run_ops"]


class MemEvent(NamedTuple):
    """Allocate (``nbytes > 0``) or free (``nbytes == 0``) the buffer ``key`` of a category.

    (A named tuple, as :class:`Op`: a program of an 80-layer model with several
    micro-batches makes thousands of each, and a tuple is the cheapest to create.)
    """

    category: str
    key: str
    nbytes: int = 0


class Op(NamedTuple):
    """One span of work (see the module docstring); immutable.

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

    def __init__(self, base: dict[str, int], pools: dict[str, str], timeline: bool) -> None:
        self.pools = pools
        self.keep_timeline = timeline
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
        buffers, by_category, by_pool, peaks = (
            self.buffers,
            self.by_category,
            self.by_pool,
            self.pool_peaks,
        )
        for ev in events:
            category, nbytes = ev.category, ev.nbytes
            key = (category, ev.key)
            old = buffers.pop(key, 0)
            if nbytes > 0:
                buffers[key] = nbytes
            delta = nbytes - old
            by_category[category] = by_category.get(category, 0) + delta
            self.total += delta
            pool = self.pools.get(category, "compute")
            in_pool = by_pool.get(pool, 0) + delta
            by_pool[pool] = in_pool
            if in_pool > peaks.get(pool, 0):
                peaks[pool] = in_pool
        if events:
            if self.keep_timeline:
                self.timeline.append((t, self.total))
            if self.total > self.peak:
                self.peak = self.total
                self.peak_time = t
                self.peak_phase = phase
                self.peak_breakdown = dict(by_category)


def run_ops(
    ops: Sequence[Op],
    *,
    overlap: float,
    base_memory: dict[str, int],
    pools: dict[str, str] | None = None,
    timeline: bool = True,
) -> EngineResult:
    """Run ``ops`` (each stream in list order) and return when each started and ended.

    Args:
        ops: the program; an op's ``deps`` refer to earlier list indices.
        overlap: compute speed while a collective runs (0..1).
        base_memory: bytes per category alive for the whole step.
        pools: memory category -> allocator pool (default: one pool); a category
            not listed is in pool ``"compute"``.
        timeline: keep the memory timeline (``False``: only its first point; the
            peak, its time and breakdown are the same either way).

    Raises:
        RuntimeError: the ops wait on each other (a cycle: a bug in the program).
    """
    state = _State(ops)
    memory = _Memory(base_memory, pools or {}, timeline)
    is_comm = [op.kind == "comm" for op in ops]
    links = [op.link for op in ops]
    tolerance = [1e-12 * max(1.0, op.work_s) for op in ops]  # work left that counts as done
    remaining: dict[int, float] = {}  # active op -> work left (seconds at full speed)
    t = 0.0
    n = len(ops)
    finished = 0
    while finished < n:
        finished += state.start_ready(remaining, memory, t)
        if not remaining:
            if finished < n:
                stuck = [ops[q[0]].label for q in state.queues if q]
                raise RuntimeError(f"simulator deadlock at t={t:.6f}s; waiting: {stuck}")
            break
        if any(is_comm[i] for i in remaining):
            rates = _rates(is_comm, links, remaining, overlap)
            dt = min([remaining[i] / r for i, r in rates if r > 0])
            t += dt
            for i, r in rates:
                remaining[i] -= r * dt
        else:  # every active op at full speed (the same arithmetic as rate 1.0)
            dt = min(remaining.values())
            t += dt
            for i in remaining:
                remaining[i] -= dt
        for i in [i for i, left in remaining.items() if left <= tolerance[i]]:
            del remaining[i]
            state.finish(i, t, memory)
            finished += 1
    return EngineResult(
        start=state.start,
        end=state.end,
        makespan=t,
        peak_bytes=memory.peak,
        peak_time=memory.peak_time,
        peak_phase=memory.peak_phase,
        peak_breakdown=memory.peak_breakdown,
        memory_timeline=memory.timeline,
        pool_peaks=dict(memory.pool_peaks),
    )


class _State:
    """The streams' queues and which ops wait on what.

    Each op counts its unfinished dependencies, and a stream is looked at again only
    when something that could let its head start happened (the stream's op finished,
    or one its head depends on): the same ops start in the same order as passes over
    every stream would give, in a fraction of the work.
    """

    def __init__(self, ops: Sequence[Op]) -> None:
        self.ops = ops
        by_name: dict[str, deque[int]] = {}
        for i, op in enumerate(ops):
            by_name.setdefault(op.stream, deque()).append(i)
        index = {name: k for k, name in enumerate(by_name)}
        self.queues = list(by_name.values())  # in order of first appearance
        self.stream_of = [index[op.stream] for op in ops]
        n = len(ops)
        self.waiting = [len(op.deps) for op in ops]  # unfinished deps (repeats count twice)
        self.dependents: dict[int, list[int]] = {}
        for i, op in enumerate(ops):
            for d in op.deps:
                self.dependents.setdefault(d, []).append(i)
        self.busy = [False] * len(self.queues)
        self.dirty = [True] * len(self.queues)
        self.start = [math.nan] * n
        self.end = [math.nan] * n

    def start_ready(self, remaining: dict[int, float], memory: _Memory, t: float) -> int:
        """Start every stream head whose stream is free and whose deps are done, in
        passes over the streams in order until one starts nothing; zero-work ops finish
        at once. Returns how many ops finished."""
        ops, queues, busy, dirty, waiting = (
            self.ops,
            self.queues,
            self.busy,
            self.dirty,
            self.waiting,
        )
        finished = 0
        progressed = True
        while progressed:
            progressed = False
            for k, queue in enumerate(queues):
                if not dirty[k] or busy[k] or not queue:
                    continue
                i = queue[0]
                if waiting[i]:
                    dirty[k] = False  # until a dep of its head finishes
                    continue
                queue.popleft()
                op = ops[i]
                self.start[i] = t
                if op.on_start:
                    memory.apply(op.on_start, t, op.phase)
                if op.work_s <= 0:
                    self.finish(i, t, memory)
                    finished += 1
                else:
                    remaining[i] = op.work_s
                    busy[k] = True
                progressed = True
        return finished

    def finish(self, i: int, t: float, memory: _Memory) -> None:
        """Op ``i`` ends at ``t``: its memory events, its stream free, its dependents told."""
        op = self.ops[i]
        self.end[i] = t
        if op.on_end:
            memory.apply(op.on_end, t, op.phase)
        k = self.stream_of[i]
        self.busy[k] = False
        self.dirty[k] = True
        for j in self.dependents.get(i, ()):
            self.waiting[j] -= 1
            self.dirty[self.stream_of[j]] = True


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
