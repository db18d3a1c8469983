"""What the step simulator returns: :class:`StepEstimate`, its memory breakdown and timeline.

Plain frozen data, JSON-ready through ``to_dict``: the predicted step time and
how it splits (compute, copies and bookkeeping, exposed communication, the
optimizer), the predicted peak memory with its breakdown at the peak (named
like the categories of ``torch.distributed._tools.fsdp2_mem_tracker``), and
the per-stream timeline of :class:`StreamEvent`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, Literal, NamedTuple

from execwrap.util.mesh import MeshShape

__all__ = ["MEMORY_CATEGORIES", "MemoryBreakdown", "StepEstimate", "Stream", "StreamEvent"]

#: The three streams of the model.
Stream = Literal["compute", "all_gather", "reduce_scatter", "all_reduce"]


class StreamEvent(NamedTuple):
    """One span of work on one stream of the simulated step.

    Attributes:
        stream: ``"compute"``, ``"all_gather"`` or ``"reduce_scatter"``.
        label: what ran, e.g. ``"forward blocks.0"``, ``"all-gather blocks.1"``,
            ``"copy-out blocks.1"``, ``"wait all-gather blocks.1"``.
        start_s: start, seconds from the start of the step.
        end_s: end, seconds from the start of the step.
    """

    stream: str
    label: str
    start_s: float
    end_s: float


#: MemoryBreakdown field -> the FSDPMemTracker category it corresponds to.
MEMORY_CATEGORIES: dict[str, str] = {
    "sharded_params": "Sharded Param",
    "sharded_grads": "Sharded Grad",
    "optimizer_state": "OptState",
    "unsharded_params": "Unsharded Param",
    "unsharded_grads": "Unsharded Grad",
    "activations": "Activation",
    "all_gather_buffers": "All Gather",
    "reduce_scatter_buffers": "Reduce Scatter",
    "temporaries": "Temp",
}


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes per category at one moment of the step (one rank).

    Attributes:
        sharded_params: this rank's parameter shards (padded as FSDP2 pads).
        sharded_grads: gradient shards already reduced.
        optimizer_state: optimizer state of this rank's shards.
        unsharded_params: parameters of the groups unsharded now.
        unsharded_grads: unsharded gradients not yet copied into a
            reduce-scatter buffer.
        activations: tensors saved for backward and not yet freed.
        all_gather_buffers: all-gather outputs alive (issued, not yet freed
            after their copy-out).
        reduce_scatter_buffers: reduce-scatter inputs alive.
        temporaries: what the running op's unit has alive beyond what it saves
            (activations in flight, their gradients, the loss's temporaries),
            when the capture recorded it.
    """

    sharded_params: int = 0
    sharded_grads: int = 0
    optimizer_state: int = 0
    unsharded_params: int = 0
    unsharded_grads: int = 0
    activations: int = 0
    all_gather_buffers: int = 0
    reduce_scatter_buffers: int = 0
    temporaries: int = 0

    @property
    def total(self) -> int:
        """Bytes over every category."""
        return sum(getattr(self, f.name) for f in fields(self))

    @property
    def dominant(self) -> str:
        """The largest category's field name; of equal ones, the first in field order."""
        best = max(fields(self), key=lambda f: getattr(self, f.name))
        return best.name

    def to_dict(self) -> dict[str, int]:
        """JSON-ready dict, with ``total``."""
        return {**asdict(self), "total": self.total}


@dataclass(frozen=True)
class StepEstimate:
    """The simulator's prediction for one training step of a plan (one rank).

    ``step_time_s = compute_time_s + overhead_time_s + exposed_comm_s`` where
    overhead is copies and per-group bookkeeping on the compute stream and
    exposed communication is the time the compute stream waits for (or, on
    CPU, runs) collectives, or is slowed by the ones beside it.

    Attributes:
        step_time_s: predicted seconds of forward, backward and optimizer step.
        compute_time_s: model compute (forward, backward, optimizer step).
        exposed_comm_s: communication not hidden behind compute.
        peak_memory_bytes: predicted peak bytes on one rank.
        memory: the breakdown at the peak.
        timeline: every span on every stream, in start order.
        overhead_time_s: copy-in/copy-out/reduce-scatter copies and the fixed
            cost per group on the compute stream.
        optimizer_time_s: the optimizer step (part of ``compute_time_s``).
        comm_time_s: total collective time (exposed or not), each collective at its
            cost model time alone: on CUDA, concurrent collectives that share the link
            take longer on the timeline than this sum says.
        all_gathers: all-gathers per step.
        reduce_scatters: reduce-scatters per step.
        peak_time_s: when the peak happens, seconds from the step's start.
        peak_phase: ``"forward"``, ``"backward"`` or ``"optimizer"``.
        prefetch: the prefetch depth simulated.
        reshard_after_forward: per unit, whether it reshards after forward.
        world_size: ranks.
        memory_timeline: ``(seconds, total bytes)`` after each change.
        forward_end_s: when the forward ends: the last forward span on the compute
            stream (the loss is ready), seconds from the step's start.
        backward_end_s: when the backward ends: the last backward span on any
            stream (FSDP2 waits for the last reduce-scatter before the optimizer
            step); the forward, backward and optimizer phases of a measured step
            compare with ``forward_end_s``, ``backward_end_s - forward_end_s`` and
            ``step_time_s - backward_end_s``. With several micro-batches, these are
            the last micro-batch's forward and backward ends.
        reserved_memory_bytes: the memory PyTorch's CUDA caching allocator reserves:
            the sum of the peaks of the streams' pools (compute, all-gather,
            reduce-scatter; :mod:`execwrap.simulate.engine`); on CPU the peak.
        micro_batches: forward/backward passes in the step.
        all_reduces: HSDP's all-reduces of gradient shards across replicas per step.
        mesh: the mesh simulated (:class:`~execwrap.util.mesh.MeshShape`; ``world_size``
            is then all its ranks, the shard group ``mesh.shard``); ``None``: FSDP over
            ``world_size`` ranks.
    """

    step_time_s: float
    compute_time_s: float
    exposed_comm_s: float
    peak_memory_bytes: int
    memory: MemoryBreakdown
    timeline: tuple[StreamEvent, ...]
    overhead_time_s: float = 0.0
    optimizer_time_s: float = 0.0
    comm_time_s: float = 0.0
    all_gathers: int = 0
    reduce_scatters: int = 0
    peak_time_s: float = 0.0
    peak_phase: str = "forward"
    prefetch: int = 1
    reshard_after_forward: tuple[bool, ...] = ()
    world_size: int = 1
    memory_timeline: tuple[tuple[float, int], ...] = ()
    forward_end_s: float = 0.0
    backward_end_s: float = 0.0
    reserved_memory_bytes: int = 0
    micro_batches: int = 1
    all_reduces: int = 0
    mesh: MeshShape | None = None

    def phase_times_s(self) -> dict[str, float]:
        """Seconds of each phase: ``{"forward": ..., "backward": ..., "optimizer": ...}``
        (from :attr:`forward_end_s` and :attr:`backward_end_s`; they sum to
        :attr:`step_time_s`)."""
        return {
            "forward": self.forward_end_s,
            "backward": self.backward_end_s - self.forward_end_s,
            "optimizer": self.step_time_s - self.backward_end_s,
        }

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (the timeline as lists of ``[stream, label, start_s, end_s]``)."""
        return {
            "step_time_s": self.step_time_s,
            "compute_time_s": self.compute_time_s,
            "exposed_comm_s": self.exposed_comm_s,
            "overhead_time_s": self.overhead_time_s,
            "optimizer_time_s": self.optimizer_time_s,
            "comm_time_s": self.comm_time_s,
            "all_gathers": self.all_gathers,
            "reduce_scatters": self.reduce_scatters,
            "peak_memory_bytes": self.peak_memory_bytes,
            "peak_time_s": self.peak_time_s,
            "peak_phase": self.peak_phase,
            "memory": self.memory.to_dict(),
            "prefetch": self.prefetch,
            "reshard_after_forward": list(self.reshard_after_forward),
            "world_size": self.world_size,
            "timeline": [list(e) for e in self.timeline],
            "memory_timeline": [list(p) for p in self.memory_timeline],
            "forward_end_s": self.forward_end_s,
            "backward_end_s": self.backward_end_s,
            "reserved_memory_bytes": self.reserved_memory_bytes,
            "micro_batches": self.micro_batches,
            **(
                {}
                if self.mesh is None
                else {"all_reduces": self.all_reduces, "mesh": self.mesh.to_dict()}
            ),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StepEstimate:
        """Inverse of :meth:`to_dict` (``total`` in ``memory`` is recomputed)."""
        memory = {k: int(v) for k, v in dict(data["memory"]).items() if k != "total"}
        return cls(
            step_time_s=float(data["step_time_s"]),
            compute_time_s=float(data["compute_time_s"]),
            exposed_comm_s=float(data["exposed_comm_s"]),
            peak_memory_bytes=int(data["peak_memory_bytes"]),
            memory=MemoryBreakdown(**memory),
            timeline=tuple(
                StreamEvent(str(a), str(b), float(c), float(d)) for a, b, c, d in data["timeline"]
            ),
            overhead_time_s=float(data.get("overhead_time_s", 0.0)),
            optimizer_time_s=float(data.get("optimizer_time_s", 0.0)),
            comm_time_s=float(data.get("comm_time_s", 0.0)),
            all_gathers=int(data.get("all_gathers", 0)),
            reduce_scatters=int(data.get("reduce_scatters", 0)),
            peak_time_s=float(data.get("peak_time_s", 0.0)),
            peak_phase=str(data.get("peak_phase", "forward")),
            prefetch=int(data.get("prefetch", 1)),
            reshard_after_forward=tuple(bool(b) for b in data.get("reshard_after_forward", [])),
            world_size=int(data.get("world_size", 1)),
            memory_timeline=tuple((float(t), int(b)) for t, b in data.get("memory_timeline", [])),
            forward_end_s=float(data.get("forward_end_s", 0.0)),
            backward_end_s=float(data.get("backward_end_s", 0.0)),
            reserved_memory_bytes=int(data.get("reserved_memory_bytes", 0)),
            micro_batches=int(data.get("micro_batches", 1)),
            all_reduces=int(data.get("all_reduces", 0)),
            mesh=None if data.get("mesh") is None else MeshShape.from_dict(data["mesh"]),
        )
