"""A :class:`~execwrap.cost.CostModel` on disk: its JSON fields and the checks on load.

:data:`COST_MODEL_FIELDS` says how each field of ``CostModel.to_dict()`` is
checked (one pass, strict JSON types, one-line errors naming the file and the
field; see :mod:`tracing.schema`): times and rates are JSON numbers, never
strings (``"1e-4"``); fixed costs and the curves' times are ``>= 0``; the
device type is one execwrap calibrates on (``"cpu"``, ``"cuda"``) and the
backend one FSDP2 runs its collectives on (:data:`BACKENDS`). Value ranges the
:class:`~execwrap.cost.CostModel` constructor checks itself (``overlap <= 1``,
rates ``> 0``, compute rates for the model's device) are left to it.

>>> segment = {"up_to_bytes": None, "latency_s": "1e-4", "seconds_per_byte": 1e-9}
>>> COST_MODEL_FIELDS.fields["all_gather"].check([segment], "all_gather")
Traceback (most recent call last):
...
tracing.schema.SchemaError: <dict>: field all_gather[0].latency_s: expected a finite number, got str '1e-4'
"""

from __future__ import annotations

from typing import Any

from execwrap.cost.checkpoint_overhead import CheckpointOpCost
from execwrap.cost.curve import CollectiveCurve, CurveSegment
from execwrap.cost.host_link import HostLink
from execwrap.cost.mesh import GroupCurves
from execwrap.cost.topology import FAMILIES, NETWORKS, Topology
from execwrap.util.mesh import MeshShape
from tracing.checks import check_integral
from tracing.rates import ComputeRates
from tracing.schema import (
    Check,
    Field,
    Record,
    SchemaError,
    boolean,
    dict_of,
    field_path,
    integer,
    list_of,
    number,
    one_of,
    optional,
    string,
    type_and_value,
)

__all__ = [
    "BACKENDS",
    "COST_MODEL_FIELDS",
    "DEVICE_TYPES",
    "checked_device_memory",
    "cost_model_dict",
    "cost_model_kwargs",
]

#: Devices a cost model can describe: the ones calibration times on and presets describe.
DEVICE_TYPES = ("cpu", "cuda")
#: Process-group backends a cost model can describe (FSDP2's collectives run on them).
#: A calibration records ``dist.get_backend(group)``, which is also a per-device list
#: of these (``"cpu:gloo,cuda:nccl"``) or ``"undefined"`` (torch's name for the backend
#: of ``init_process_group()`` called without one), so those load as well.
BACKENDS = ("gloo", "nccl")

_SEGMENT = Record(
    {
        "up_to_bytes": Field(optional(integer(1, what="bytes"))),
        "latency_s": Field(number(None)),
        "seconds_per_byte": Field(number(0.0)),
    }
)


def _curve() -> Check:
    """A :class:`CollectiveCurve` (``to_dict``'s list of segments): in increasing size
    order, only the last open-ended, and never a negative time where a segment starts."""
    segments = list_of(_SEGMENT)

    def check(value: Any, path: str) -> CollectiveCurve:
        checked = segments(value, path)
        if not checked:
            raise SchemaError(path, "expected at least one curve segment, got an empty list")
        start = 0
        for i, seg in enumerate(checked):
            where = field_path(path, i)
            up_to, latency, slope = seg["up_to_bytes"], seg["latency_s"], seg["seconds_per_byte"]
            if (up_to is None) != (i == len(checked) - 1) or (up_to is not None and up_to <= start):
                raise SchemaError(
                    field_path(where, "up_to_bytes"),
                    f"expected increasing sizes, null on the last segment only, got {up_to!r}",
                )
            at_start = latency + start * slope
            if at_start < -1e-9 * (abs(latency) + start * slope):  # rounding of a fitted line
                found = (
                    f"{latency!r}"
                    if not start
                    else f"latency_s {latency!r} + {start} x seconds_per_byte {slope!r} = "
                    f"{at_start:.6g} s"
                )
                raise SchemaError(
                    field_path(where, "latency_s"),
                    f"expected a time >= 0 s where the segment starts ({start} bytes), got {found}",
                )
            start = up_to if up_to is not None else start
        return CollectiveCurve(
            tuple(
                CurveSegment(s["up_to_bytes"], s["latency_s"], s["seconds_per_byte"])
                for s in checked
            )
        )

    return check


def _device_type(value: Any, path: str) -> str:
    if value not in DEVICE_TYPES or not isinstance(value, str):
        raise SchemaError(
            path,
            f"expected {' or '.join(map(repr, DEVICE_TYPES))} (the devices execwrap calibrates "
            f"and simulates FSDP2 on), got {type_and_value(value)}",
        )
    return value


def _backend(value: Any, path: str) -> str:
    parts = [p.partition(":")[2] or p for p in value.split(",")] if isinstance(value, str) else []
    if value != "undefined" and not (parts and all(p in BACKENDS for p in parts)):
        raise SchemaError(
            path,
            f"expected the process group's backend, {' or '.join(map(repr, BACKENDS))} (or a "
            "per-device list of them such as 'cpu:gloo,cuda:nccl', or 'undefined': "
            "init_process_group() without a backend), got "
            f"{type_and_value(value)}; execwrap models FSDP2 on gloo and nccl only",
        )
    return value


_COMPUTE = Record(
    {
        "device_type": Field(string()),
        "flops_per_s": Field(number(None)),
        "memory_bytes_per_s": Field(number(None)),
        "op_overhead_s": Field(number(0.0), required=False, default=0.0),
        "matmul_flops_per_s": Field(dict_of(number(None)), required=False, default={}),
        "attention_flops_per_s": Field(dict_of(number(None)), required=False, default={}),
    }
)

_HOST = Record(
    {
        "to_device_bytes_per_s": Field(number(None)),
        "to_host_bytes_per_s": Field(number(None)),
        "optimizer_bytes_per_s": Field(number(None)),
        "source": Field(string(), required=False, default=""),
    }
)

#: :class:`~execwrap.cost.checkpoint_overhead.CheckpointOpCost`: seconds >= 0 each
#: (absent: none, as in models saved before it was measured).
_CHECKPOINT_OVERHEAD = Record(
    {name: Field(number(0.0), required=False, default=0.0) for name in CheckpointOpCost().to_dict()}
)

_TOPOLOGY = Record(
    {
        "gpus_per_node": Field(integer(1, what="GPUs")),
        "family": Field(one_of(*FAMILIES)),
        "intra_node_bytes_per_s": Field(number(None)),
        "inter_node_bytes_per_s": Field(optional(number(None))),
        "network": Field(one_of("", *NETWORKS), required=False, default=""),
        "source": Field(string(), required=False, default=""),
    }
)

_GROUP = Record(
    {
        "dim": Field(one_of("shard", "replicate")),
        "size": Field(integer(1, what="ranks")),
        "stride": Field(integer(1, what="ranks")),
        "all_gather": Field(optional(_curve()), required=False),
        "reduce_scatter": Field(optional(_curve()), required=False),
        "all_reduce": Field(optional(_curve()), required=False),
    }
)

_MESH = Record(
    {
        "replicate": Field(integer(1, what="ranks")),
        "shard": Field(integer(1, what="ranks")),
        "tp": Field(integer(1, what="ranks")),
    }
)

#: How each field of a saved cost model is checked (``kind`` and ``schema_version``
#: are read before: :meth:`~execwrap.cost.CostModel.from_dict`).
COST_MODEL_FIELDS = Record(
    {
        "device_type": Field(_device_type),
        "backend": Field(_backend),
        "world_size": Field(integer(1, what="ranks")),
        "all_gather": Field(_curve()),
        "reduce_scatter": Field(_curve()),
        "copy_bytes_per_s": Field(number(None)),
        "group_overhead_s": Field(number(0.0)),
        "param_overhead_s": Field(number(0.0), required=False, default=0.0),
        "copy_curve": Field(optional(_curve()), required=False),
        "overlap": Field(number(0.0)),
        "compute": Field(_COMPUTE),
        "optimizer_param_overhead_s": Field(number(0.0), required=False, default=0.0),
        "optimizer_curve": Field(optional(_curve()), required=False),
        "sync_jitter": Field(number(0.0), required=False, default=0.0),
        "checkpoint_overhead": Field(optional(_CHECKPOINT_OVERHEAD), required=False),
        "device_memory_bytes": Field(optional(integer(1, what="bytes")), required=False),
        "host": Field(optional(_HOST), required=False),
        "topology": Field(optional(_TOPOLOGY), required=False),
        "mesh_groups": Field(list_of(_GROUP), required=False, default=[]),
        "mesh": Field(optional(_MESH), required=False),
        "all_reduce": Field(optional(_curve()), required=False),
        "all_reduce_own_link": Field(boolean(), required=False, default=False),
        "source": Field(string(), required=False, default=""),
        "created": Field(string(), required=False, default=""),
        "torch_version": Field(string(), required=False, default=""),
    }
)


def cost_model_dict(cm: Any) -> dict[str, Any]:
    """The fields of :meth:`execwrap.cost.CostModel.to_dict` after ``kind`` and
    ``schema_version`` (optional ones only when set, so older readers see what they know)."""

    def curve(c: CollectiveCurve | None) -> Any:
        return None if c is None else c.to_dict()

    out: dict[str, Any] = {
        "device_type": cm.device_type,
        "backend": cm.backend,
        "world_size": cm.world_size,
        "all_gather": cm.all_gather.to_dict(),
        "reduce_scatter": cm.reduce_scatter.to_dict(),
        "copy_bytes_per_s": cm.copy_bytes_per_s,
        "group_overhead_s": cm.group_overhead_s,
        "param_overhead_s": cm.param_overhead_s,
        "copy_curve": curve(cm.copy_curve),
        "overlap": cm.overlap,
        "compute": cm.compute.to_dict(),
        "optimizer_param_overhead_s": cm.optimizer_param_overhead_s,
        "optimizer_curve": curve(cm.optimizer_curve),
        "sync_jitter": cm.sync_jitter,
        "device_memory_bytes": cm.device_memory_bytes,
    }
    if not cm.checkpoint_overhead.is_zero:
        out["checkpoint_overhead"] = cm.checkpoint_overhead.to_dict()
    if cm.host is not None:
        out["host"] = cm.host.to_dict()
    if cm.topology is not None:
        out["topology"] = cm.topology.to_dict()
    if cm.mesh_groups:
        out["mesh_groups"] = [g.to_dict() for g in cm.mesh_groups]
    if cm.mesh is not None:
        out.update(
            mesh=cm.mesh.to_dict(),
            all_reduce=curve(cm.all_reduce),
            all_reduce_own_link=cm.all_reduce_own_link,
        )
    out.update(source=cm.source, created=cm.created, torch_version=cm.torch_version)
    return out


def cost_model_kwargs(f: dict[str, Any]) -> dict[str, Any]:
    """:class:`execwrap.cost.CostModel`'s constructor arguments from the fields
    :data:`COST_MODEL_FIELDS` checked."""
    nested = ("compute", "host", "topology", "mesh_groups", "mesh", "checkpoint_overhead")
    overhead = f["checkpoint_overhead"]
    return {
        **{k: f[k] for k in COST_MODEL_FIELDS.fields if k not in nested},
        "checkpoint_overhead": CheckpointOpCost()
        if overhead is None
        else CheckpointOpCost(**overhead),
        "compute": ComputeRates(**f["compute"]),
        "host": None if f["host"] is None else HostLink(**f["host"]),
        "topology": None if f["topology"] is None else Topology(**f["topology"]),
        "mesh_groups": tuple(
            GroupCurves(
                g["dim"],
                g["size"],
                g["stride"],
                g["all_gather"],
                g["reduce_scatter"],
                g["all_reduce"],
            )
            for g in f["mesh_groups"]
        ),
        "mesh": None if f["mesh"] is None else MeshShape(**f["mesh"]),
    }


def checked_device_memory(value: Any, name: str) -> int | None:
    """``value`` (bytes, or ``None``: unknown) as an ``int >= 1`` (a NumPy integer too).

    Raises:
        TypeError, ValueError: not a whole number of bytes >= 1 (naming ``name``).
    """
    if value is None:
        return None
    return check_integral(value, name, minimum=1, unit="bytes")
