"""The cost model: how long FSDP2's collectives, copies and bookkeeping take on one cluster.

:class:`CostModel` is plain, frozen, JSON-serialisable data: an all-gather and a
reduce-scatter :class:`~execwrap.cost.curve.CollectiveCurve` (time by buffer
size for one world size), the copy bandwidth of FSDP2's copy-in / copy-out, a
fixed cost per group per collective call, the overlap factor (how much of a
collective's time compute running beside it hides), and the device's compute
rates (:class:`tracing.rates.ComputeRates`, for estimated compute times and the
optimizer step). It is measured (:meth:`CostModel.calibrate`), a preset with cited
constants (:meth:`CostModel.preset`) or loaded (:meth:`CostModel.load`). No torch import.
"""

from __future__ import annotations

import datetime
import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from execwrap.cost.checkpoint_overhead import CheckpointOpCost
from execwrap.cost.compatibility import incompatibility
from execwrap.cost.curve import CollectiveCurve
from execwrap.cost.host_link import HostLink
from execwrap.cost.mesh import GroupCurves, mesh_fields
from execwrap.cost.model_fields import (
    COST_MODEL_FIELDS,
    checked_device_memory,
    cost_model_dict,
    cost_model_kwargs,
)
from execwrap.cost.topology import Topology
from execwrap.util.mesh import MeshShape
from tracing.atomic import atomic_write_text, refuse_folder
from tracing.checks import check_integral
from tracing.rates import ComputeRates

if TYPE_CHECKING:
    import torch
    import torch.distributed as dist

__all__ = ["COST_MODEL_KIND", "COST_MODEL_SCHEMA_VERSION", "CostModel"]

#: Layout version of :meth:`CostModel.to_dict`.
COST_MODEL_SCHEMA_VERSION = 1
#: The ``kind`` field of a saved cost model.
COST_MODEL_KIND = "execwrap-cost-model"


@dataclass(frozen=True)
class CostModel:
    """Times of FSDP2's communication and bookkeeping on one cluster, for one world size.

    Attributes:
        device_type: ``"cpu"`` or ``"cuda"`` (the device FSDP2 runs on).
        backend: the process group's backend (``"gloo"``, ``"nccl"``, ...).
        world_size: ranks in the data-parallel group the curves are for.
        all_gather: seconds of one all-gather in a training step, by output bytes
            (calibrated: the sweep of ``all_gather_single`` times the in-step factors
            measured on FSDP2 stacks).
        reduce_scatter: the same for a reduce-scatter, by input bytes.
        copy_bytes_per_s: bytes copied per second by a large device copy (FSDP2's all-gather
            copy-in / copy-out and reduce-scatter copy-in are memory-bound copies).
        copy_curve: seconds of a copy into a freshly allocated buffer, by bytes, when
            measured (caches flushed before each copy; large fresh buffers pay page faults);
            ``None``: ``copy_bytes_per_s``.
        group_overhead_s: fixed cost per FSDP2 group per collective it issues (the hooks,
            the copy-in/copy-out bookkeeping, the collective's Python path), seconds.
        param_overhead_s: fixed cost per parameter tensor of a group per collective it
            issues (FSDP2's per-parameter work: copy-in and copy-out views, unsharded
            parameter and DTensor gradient set-up), seconds.
        overlap: 0..1, the fraction of a collective's time hidden when compute runs beside
            it (compute proceeds at this fraction of its speed while a collective is in
            flight): about 0 on CPU gloo with no spare core, high on NVLink where NCCL takes
            a few SMs.
        compute: the device's achieved compute rates (roofline estimates, the
            optimizer step).
        optimizer_param_overhead_s: fixed cost of the optimizer step per parameter tensor (a
            for-loop optimizer over DTensors on CPU pays per tensor), seconds.
        optimizer_curve: seconds of the size-dependent part of one ``AdamW.step`` (7
            elementwise passes) over one tensor, by its bytes, when measured
            (:mod:`execwrap.cost.calibrate`: on CPU small tensors stay in cache while large
            ones pay the page faults of the step's fresh temporaries, e.g.
            ``exp_avg_sq.sqrt()``); ``None``: the passes at ``compute.memory_bytes_per_s``.
        sync_jitter: the wait at a collective for the slowest rank, per square root of the
            compute seconds since the rank's previous collective (seconds per square-root
            second, ``>= 0``): a collective after ``c`` seconds of compute waits
            ``sync_jitter * sqrt(c)`` seconds where collectives block the training thread
            (:attr:`synchronous_collectives`); :mod:`execwrap.cost.sync_wait`. ``0``
            (presets, models saved before it): no wait.
        checkpoint_overhead: the host work activation checkpointing adds per
            checkpointed region and per op it dispatches
            (:class:`~execwrap.cost.checkpoint_overhead.CheckpointOpCost`; measured by
            calibration; presets and models saved before it: none).
        device_memory_bytes: memory of one rank's device, bytes (a preset's GPU, or
            measured: :mod:`execwrap.cost.device_memory`); ``None``: unknown.
        host: the GPU's link to its host and the CPU optimizer's rate, for CPU
            offload (:class:`~execwrap.cost.host_link.HostLink`; ``None``: unknown).
        topology: the cluster's nodes and links (:class:`~execwrap.cost.topology.Topology`;
            every preset has one), which prices any process group of a mesh over these
            ranks (:meth:`for_mesh`); ``None``: only the measured groups.
        mesh_groups: curves measured on the process groups of a 2-D mesh
            (:class:`~execwrap.cost.mesh.GroupCurves`, ``calibrate(mesh=...)``).
        mesh: set by :meth:`for_mesh` only: the mesh this model is resolved for; then
            ``world_size``, ``all_gather`` and ``reduce_scatter`` are one shard group's.
        all_reduce: with ``mesh``: seconds of an all-reduce over a replicate group,
            by tensor bytes (``None``: no replicas).
        all_reduce_own_link: with ``mesh``: whether the all-reduces run on other
            links than the shard group's collectives (not sharing their bandwidth).
        source: how the model was obtained (calibration machine, or preset).
        created: ISO date-time of creation.
        torch_version: ``torch.__version__`` where it was measured (``""``
            for presets).

    Example:
        >>> cm = CostModel.preset("h100-nvlink-8")
        >>> cm.world_size, cm.backend, round(cm.all_gather_time(256 * 2**20) * 1e3, 3)
        (8, 'nccl', 0.667)
        >>> cm.check_compatible(world_size=8, device_type="cuda")
    """

    device_type: str
    backend: str
    world_size: int
    all_gather: CollectiveCurve
    reduce_scatter: CollectiveCurve
    copy_bytes_per_s: float
    group_overhead_s: float
    overlap: float
    compute: ComputeRates
    optimizer_param_overhead_s: float = 0.0
    param_overhead_s: float = 0.0
    copy_curve: CollectiveCurve | None = None
    optimizer_curve: CollectiveCurve | None = None
    sync_jitter: float = 0.0
    checkpoint_overhead: CheckpointOpCost = field(default_factory=CheckpointOpCost)
    device_memory_bytes: int | None = None
    host: HostLink | None = None
    topology: Topology | None = None
    mesh_groups: tuple[GroupCurves, ...] = ()
    mesh: MeshShape | None = None
    all_reduce: CollectiveCurve | None = None
    all_reduce_own_link: bool = False
    source: str = ""
    created: str = field(
        default_factory=lambda: datetime.datetime.now().isoformat(timespec="seconds")
    )
    torch_version: str = ""

    def __post_init__(self) -> None:
        ranks = check_integral(self.world_size, "CostModel.world_size", minimum=1, unit="ranks")
        object.__setattr__(self, "world_size", ranks)  # a NumPy integer stored as an int
        if not self.device_type or not isinstance(self.device_type, str):
            raise ValueError(
                f"CostModel.device_type must be e.g. 'cpu' or 'cuda', got {self.device_type!r}"
            )
        if not (0.0 <= self.overlap <= 1.0):
            raise ValueError(f"CostModel.overlap must be within [0, 1], got {self.overlap!r}")
        if not math.isfinite(self.copy_bytes_per_s) or self.copy_bytes_per_s <= 0:
            raise ValueError(
                f"CostModel.copy_bytes_per_s must be a finite number > 0, got {self.copy_bytes_per_s!r}"
            )
        seconds = ("group_overhead_s", "optimizer_param_overhead_s", "param_overhead_s")
        for name in (*seconds, "sync_jitter"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise ValueError(
                    f"CostModel.{name} must be a finite number >= 0 (seconds"
                    f"{' per square-root second' if name == 'sync_jitter' else ''}), got {value!r}"
                )
        memory = checked_device_memory(self.device_memory_bytes, "CostModel.device_memory_bytes")
        object.__setattr__(self, "device_memory_bytes", memory)
        if self.compute.device_type != self.device_type:
            raise ValueError(
                f"CostModel: compute rates are for {self.compute.device_type!r} but the model is for "
                f"{self.device_type!r}"
            )

    # ------------------------------------------------------------ times
    def all_gather_time(self, nbytes: int) -> float:
        """Seconds of one all-gather whose output (the unsharded group) has ``nbytes`` bytes."""
        return self.all_gather.time(nbytes)

    def reduce_scatter_time(self, nbytes: int) -> float:
        """Seconds of one reduce-scatter of ``nbytes`` unsharded gradient bytes."""
        return self.reduce_scatter.time(nbytes)

    def all_reduce_time(self, nbytes: int) -> float:
        """Seconds of one all-reduce of ``nbytes`` bytes across the replicate group of
        :attr:`mesh` (``0`` without replicas)."""
        return 0.0 if self.all_reduce is None else self.all_reduce.time(nbytes)

    def for_mesh(self, mesh: Any) -> CostModel:
        """This model as one shard group of ``mesh`` sees it (:mod:`execwrap.cost.mesh`):
        ``world_size``, ``all_gather`` and ``reduce_scatter`` of the shard group,
        ``all_reduce`` of the replicate group, priced from what was measured on each
        group or from :attr:`topology`. A flat mesh ``(1, world_size)`` is this model.

        Args:
            mesh: a :class:`~execwrap.util.mesh.MeshShape`, a ``(replicate, shard)`` or
                ``(replicate, shard, tp)`` tuple, or a ``DeviceMesh``, of this model's ranks.

        Raises:
            ValueError: the mesh does not hold :attr:`world_size` ranks, or a group of it
                cannot be priced (a flat calibration without topology: the message says
                to calibrate on the mesh or to use a preset).

        Example:
            >>> cm = CostModel.preset("h100-ib-400g", world_size=16)
            >>> hsdp = cm.for_mesh((2, 8))
            >>> hsdp.world_size, round(hsdp.all_gather_time(2**30) * 1e3, 3)
            (8, 2.571)
            >>> round(cm.all_gather_time(2**30) * 1e3, 3)
            25.146
        """
        shape = MeshShape.of(mesh, world_size=self.world_size, where="CostModel.for_mesh")
        if shape == MeshShape(1, self.world_size) and self.mesh is None:
            return self
        return replace(self, **mesh_fields(self, shape))

    def collective_overhead(self, tensors: int) -> float:
        """Fixed seconds a group with ``tensors`` parameter tensors spends per collective."""
        return self.group_overhead_s + tensors * self.param_overhead_s

    def sync_wait_time(self, compute_s: float) -> float:
        """Seconds a collective waits for the slowest rank after ``compute_s`` seconds of
        compute since the previous one: ``sync_jitter * sqrt(compute_s)``
        (:mod:`execwrap.cost.sync_wait`; ``0`` for ``compute_s <= 0``).

        >>> cm = CostModel.preset("h100-nvlink-8").replace(sync_jitter=0.01)
        >>> round(cm.sync_wait_time(4e-3) * 1e3, 3), cm.sync_wait_time(0.0)
        (0.632, 0.0)
        """
        return self.sync_jitter * math.sqrt(compute_s) if compute_s > 0 else 0.0

    def copy_time(self, nbytes: int) -> float:
        """Seconds to copy ``nbytes`` bytes into a new buffer (FSDP2 copy-in / copy-out)."""
        if self.copy_curve is not None:
            return self.copy_curve.time(nbytes)
        return max(0, nbytes) / self.copy_bytes_per_s

    def optimizer_time(self, passes: int, tensor_bytes: Sequence[int]) -> float:
        """Seconds of an optimizer step with ``passes`` elementwise passes per parameter
        byte over sharded trainable tensors of ``tensor_bytes`` bytes each.

        Per tensor: ``optimizer_param_overhead_s`` plus, with an
        ``optimizer_curve``, ``passes / 7`` of the curve at its bytes (the curve
        is AdamW's 7 passes), else ``passes * bytes / compute.memory_bytes_per_s``.
        ``passes == 0`` (no optimizer): 0 s.

        >>> cm = CostModel.preset("h100-nvlink-8")
        >>> cm.optimizer_time(0, [1024]), cm.optimizer_time(7, []) == 0.0
        (0.0, True)
        """
        if passes <= 0:
            return 0.0
        total = len(tensor_bytes) * self.optimizer_param_overhead_s
        if self.optimizer_curve is not None:
            curve = self.optimizer_curve
            return total + passes / 7 * sum(curve.time(max(0, b)) for b in tensor_bytes)
        return total + passes * sum(max(0, b) for b in tensor_bytes) / (
            self.compute.memory_bytes_per_s
        )

    def copy_out_time(self, param_bytes: Sequence[int]) -> float:
        """Seconds of FSDP2's all-gather copy-out into parameters of ``param_bytes`` bytes.

        FSDP2 copies the all-gather output into one unsharded storage per
        parameter (``split_with_sizes_copy`` into ``all_gather_outputs``, whose
        storages it frees at reshard and allocates again at the next unshard),
        so the copy is priced per parameter: a group of many small parameters
        reuses allocator blocks where one buffer of the group's size would,
        on CPU, page-fault fresh memory (above glibc's 32 MiB mmap threshold).

        >>> cm = CostModel.preset("h100-nvlink-8")
        >>> cm.copy_out_time([2**20, 2**20]) == 2 * cm.copy_time(2**20)
        True
        """
        return sum(self.copy_time(b) for b in param_bytes)

    def host_copy_time(self, nbytes: int, direction: str) -> float:
        """Seconds of a host-device copy (``"to_device"`` / ``"to_host"``; 0 without :attr:`host`)."""
        return 0.0 if self.host is None else self.host.copy_time(nbytes, direction)  # type: ignore[arg-type]

    @property
    def synchronous_collectives(self) -> bool:
        """Whether FSDP2's collectives block the thread that computes.

        On CPU, FSDP2 issues its all-gathers and reduce-scatters with
        ``async_op=False`` and its streams are no-ops (``torch.cpu.Stream``), so
        each collective runs to completion on the training thread where it is
        issued; on CUDA they run on their own streams.
        """
        return self.device_type == "cpu"

    @property
    def device_backend(self) -> str:
        """The backend of the collectives on :attr:`device_type`: ``backend`` itself,
        the entry for the device of a per-device list (``"cpu:gloo,cuda:nccl"``), or
        torch's default for the device where ``init_process_group()`` was called
        without one (``"undefined"``: gloo on CPU, nccl on CUDA).

        >>> cm = CostModel.preset("h100-nvlink-8")
        >>> cm.replace(backend="cpu:gloo,cuda:nccl").device_backend
        'nccl'
        >>> cm.replace(backend="undefined", device_type="cpu",
        ...            compute=ComputeRates("cpu", 1e9, 1e9)).device_backend
        'gloo'
        """
        if ":" in self.backend:
            pairs = dict(p.split(":", 1) for p in self.backend.split(",") if ":" in p)
            return pairs.get(self.device_type, self.backend)
        if self.backend == "undefined":
            return "gloo" if self.device_type == "cpu" else "nccl"
        return self.backend

    # ------------------------------------------------------------ checks
    def check_compatible(self, *, world_size: int, device_type: str) -> None:
        """Refuse to be used for another world size or device type.

        Raises:
            ValueError: naming what differs (world size, device type), what
                this model was made for, and how to get a fitting one.
        """
        message = incompatibility(self, world_size, device_type)
        if message:
            raise ValueError(message)

    # ------------------------------------------------------- constructors
    @classmethod
    def calibrate(
        cls,
        group: dist.ProcessGroup | None = None,
        *,
        device: torch.device | str | None = None,
        max_bytes: int | None = None,
        repeat: int = 1,
        mesh: Any = None,
    ) -> CostModel:
        """Measure the cost model on the live process group (collective, every rank).

        Runs, in 40-55 s on 2 gloo ranks of a 2-core CPU: a log sweep of
        all-gather, reduce-scatter and fresh-copy sizes (medians, CPU caches
        flushed before each run), a large copy, a matmul loop, a tiny-op loop,
        ``AdamW.step`` over tensors of 4 KiB to 16 MiB (the optimizer curve), a
        matmul loop alone and beside an async all-gather (the overlap factor),
        and the forward and backward of real FSDP2 steps of synthetic stacks
        (the fixed cost per group and per parameter tensor of each collective,
        and the in-step factors by size that the collective curves are
        multiplied by: :mod:`execwrap.cost.fixed_costs`) and, on CPU, spans of
        compute with and without a collective after each (the wait for the
        slowest rank: :mod:`execwrap.cost.sync_wait`). Every rank must call
        it; rank 0's numbers are broadcast, so every rank gets the same model
        and plans alike. Details: :mod:`execwrap.cost.calibrate`.

        Args:
            group: the data-parallel process group (default: the world group).
            device: the device FSDP2 runs on (default: ``cuda`` for NCCL, the
                current CUDA device, else ``cpu``).
            max_bytes: largest collective in the sweep (default: 64 MiB on
                CPU, 1 GiB on CUDA); larger sizes extrapolate the last segment.
            repeat: how many times as many runs the sweep, the optimizer loop,
                the overlap measurement and the FSDP2 stacks take (default 1);
                the time grows about in proportion. It narrows the noise of the
                samples (a 25 MiB all-gather in a step: 14.3-26.3 ms over five
                default calibrations on 2 gloo ranks, 15.1-19.6 ms over three
                ``repeat=4`` ones), not the drift of a machine's speed.
            mesh: a 2-D ``(replicate, shard)`` ``DeviceMesh`` over the world: each of its
                dimensions' groups is measured too (``mesh_groups``,
                :mod:`execwrap.cost.mesh_sweep`), so :meth:`for_mesh` prices HSDP on it.

        Returns:
            The measured :class:`CostModel`.

        Raises:
            RuntimeError: no process group is initialised; the message says
                how to start one.
            ValueError: ``max_bytes`` or ``repeat`` is out of range; ``device``
                is neither a CPU nor an available CUDA device.

        Example:
            >>> dist.init_process_group("gloo")  # doctest: +SKIP
            >>> CostModel.calibrate().save("cost.json")  # doctest: +SKIP
        """
        from execwrap.cost.calibrate import calibration_fields

        fields = calibration_fields(
            group, device=device, max_bytes=max_bytes, repeat=repeat, mesh=mesh
        )
        return cls(**fields)

    @classmethod
    def preset(
        cls, name: str, *, world_size: int | None = None, gpu: str | None = None
    ) -> CostModel:
        """A preset cluster (``"h100-nvlink-8"``, ``"h100-ib-400g"``, ``"a100-nvlink-8"``).

        Args:
            name: the preset (:data:`execwrap.cost.presets.PRESETS`).
            world_size: ranks (default: the preset's own, 8 or 16).
            gpu: its GPU model (:data:`execwrap.cost.gpus.GPUS`; default: the preset's).

        Raises:
            ValueError: unknown name (the message lists them) or a world size
                the preset does not describe.
        """
        from execwrap.cost.presets import preset_fields

        return cls(**preset_fields(name, world_size, gpu))

    # -------------------------------------------------------- serialising
    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (see :meth:`from_dict`)."""
        return {
            "kind": COST_MODEL_KIND,
            "schema_version": COST_MODEL_SCHEMA_VERSION,
            **cost_model_dict(self),
        }

    @classmethod
    def from_dict(cls, data: Any, *, source: str = "<dict>") -> CostModel:
        """Rebuild a model from :meth:`to_dict` output.

        Raises:
            ValueError: not a cost model, another schema version, or a field
                missing or invalid (a number written as a string, a negative
                time, a device type or backend execwrap does not model: see
                :mod:`execwrap.cost.model_fields`); the message names ``source``,
                the field, the value found and what is accepted.

        Example:
            >>> data = {**CostModel.preset("h100-nvlink-8").to_dict(), "backend": "mpi"}
            >>> CostModel.from_dict(data, source="cost.json")  # doctest: +ELLIPSIS
            Traceback (most recent call last):
            ...
            tracing.schema.SchemaError: cost.json: ... field backend: expected ... got str 'mpi'; ...
        """
        if not isinstance(data, dict) or data.get("kind") != COST_MODEL_KIND:
            raise ValueError(
                f"{source}: not an execwrap cost model (expected a JSON object with "
                f"kind={COST_MODEL_KIND!r}; write one with `execwrap calibrate`)"
            )
        version = data.get("schema_version")
        if version != COST_MODEL_SCHEMA_VERSION:
            raise ValueError(
                f"{source}: unsupported cost model schema_version {version!r} (this execwrap "
                f"reads {COST_MODEL_SCHEMA_VERSION}); calibrate again"
            )
        f = COST_MODEL_FIELDS.check(data, source=source, what="cost model")
        try:
            return cls(**cost_model_kwargs(f))
        except (TypeError, ValueError) as e:  # the ranges the constructors check
            raise ValueError(f"{source}: malformed cost model: {e}") from e

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the model as JSON to ``path`` atomically (temp file + rename).

        Missing folders are created; a reader of ``path`` sees the old file or the
        whole new one, never part of it.

        Returns:
            The path written.

        Raises:
            IsADirectoryError: ``path`` is a folder (nothing is written); the
                message names it and a file path to pass instead.
            OSError: the folder cannot be created or the file written.

        Example:
            >>> CostModel.preset("h100-nvlink-8").save("cost.json")  # doctest: +SKIP
            PosixPath('cost.json')
        """
        path = Path(path)
        refuse_folder(path, "CostModel.save", "cost.json")
        atomic_write_text(path, json.dumps(self.to_dict(), indent=1) + "\n")
        return path

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> CostModel:
        """Read a model written by :meth:`save` (or ``execwrap calibrate``).

        Raises:
            FileNotFoundError: the file does not exist.
            ValueError: not JSON, not a cost model, or malformed; names the file.
        """
        path = Path(path)
        text = path.read_text(encoding="utf-8")
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: not valid JSON ({e})") from e
        return cls.from_dict(data, source=str(path))

    def replace(self, **changes: Any) -> CostModel:
        """A copy with some fields changed (``dataclasses.replace``), checked again."""
        return replace(self, **changes)
