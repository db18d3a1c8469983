"""MeshShape: how a job's ranks are laid out for FSDP (replicate x shard, then tensor parallel).

A device mesh as the planner, the cost model and the simulator see it, without
torch: the data-parallel ranks split into ``replicate`` groups of ``shard``
ranks (HSDP: parameters sharded within a shard group, gradients all-reduced
across the replicas; ``replicate == 1`` is plain FSDP), times ``tp`` ranks of
tensor parallelism whose parameters FSDP sees as local shards. Ranks are laid
out row-major over ``(replicate, shard, tp)``, as ``init_device_mesh`` lays out
``("dp_replicate", "dp_shard", "tp")`` (torchtitan's order): the ``tp`` ranks
of a shard are consecutive, a shard group's ranks are ``tp`` apart and a
replicate group's ``shard * tp`` apart.

>>> MeshShape(2, 8).world_size, MeshShape(2, 8).group("replicate")
(16, (2, 8))
>>> MeshShape.of((3, 4), world_size=16, where="plan_wrap")
Traceback (most recent call last):
...
ValueError: plan_wrap: mesh shape (3, 4) holds 12 ranks but the world size is 16: pass a (replicate, shard) shape whose product is 16, e.g. (1, 16) for FSDP over all ranks or (2, 8) for shard groups of 8
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["MESH_DIMS", "MeshDim", "MeshShape", "divisors"]

#: A dimension of a :class:`MeshShape`.
MeshDim = Literal["replicate", "shard", "tp"]
#: The dimensions, outermost first (the rank layout's order).
MESH_DIMS: tuple[MeshDim, ...] = ("replicate", "shard", "tp")


def divisors(n: int) -> list[int]:
    """The divisors of ``n`` in increasing order (``n >= 1``).

    >>> divisors(16)
    [1, 2, 4, 8, 16]
    """
    small = [d for d in range(1, int(n**0.5) + 1) if n % d == 0]
    return sorted({*small, *(n // d for d in small)})


@dataclass(frozen=True)
class MeshShape:
    """The shape of a job's device mesh, as FSDP sees it (module docstring).

    Attributes:
        replicate: replicas (HSDP's outer dimension; 1: plain FSDP).
        shard: ranks each parameter is sharded over (FSDP's shard group).
        tp: tensor-parallel ranks (FSDP shards their local tensors; 1: none).

    Raises:
        TypeError: a size that is not an int.
        ValueError: a size below 1.
    """

    replicate: int = 1
    shard: int = 1
    tp: int = 1

    def __post_init__(self) -> None:
        for dim in MESH_DIMS:
            value = getattr(self, dim)
            if not isinstance(value, numbers.Integral) or isinstance(value, bool):
                raise TypeError(
                    f"MeshShape.{dim} must be an int (ranks), got {type(value).__name__} {value!r}"
                )
            if value < 1:
                raise ValueError(f"MeshShape.{dim} must be >= 1 rank, got {value}")
            object.__setattr__(self, dim, int(value))  # a NumPy integer stored as an int

    # ------------------------------------------------------------------ sizes
    @property
    def world_size(self) -> int:
        """All ranks of the mesh, ``replicate * shard * tp``."""
        return self.replicate * self.shard * self.tp

    @property
    def data_parallel(self) -> int:
        """The data-parallel ranks, ``replicate * shard``."""
        return self.replicate * self.shard

    @property
    def hybrid(self) -> bool:
        """Whether gradients are all-reduced across replicas (HSDP, ``replicate > 1``)."""
        return self.replicate > 1

    def group(self, dim: MeshDim) -> tuple[int, int]:
        """``(size, stride)`` of the process group of ``dim`` that holds rank 0: its
        ranks are ``0, stride, 2 * stride, ...`` (the layout of the module docstring)."""
        if dim == "tp":
            return self.tp, 1
        if dim == "shard":
            return self.shard, self.tp
        if dim == "replicate":
            return self.replicate, self.shard * self.tp
        raise ValueError(f"MeshShape.group: dim must be one of {list(MESH_DIMS)}, got {dim!r}")

    @property
    def sizes(self) -> tuple[int, int, int]:
        """``(replicate, shard, tp)``."""
        return self.replicate, self.shard, self.tp

    @property
    def label(self) -> str:
        """``"2x8"`` (replicate x shard), with ``", tp 4"`` when there is tensor parallelism."""
        text = f"{self.replicate}x{self.shard}"
        return text if self.tp == 1 else f"{text}, tp {self.tp}"

    # -------------------------------------------------------------- building
    @classmethod
    def flat(cls, world_size: int, tp: int = 1) -> MeshShape:
        """Plain FSDP over every data-parallel rank: ``(1, world_size // tp, tp)``."""
        return cls.with_shard(world_size, world_size // tp if tp else 0, tp=tp, where="MeshShape")

    @classmethod
    def with_shard(cls, world_size: int, shard: int, *, tp: int = 1, where: str) -> MeshShape:
        """The mesh of ``world_size`` ranks whose shard groups hold ``shard`` ranks.

        Raises:
            ValueError: ``shard * tp`` does not divide ``world_size`` (the message lists
                the shard sizes that do).
        """
        dp, rest = divmod(world_size, tp) if tp >= 1 else (0, 1)
        if tp < 1 or rest:
            raise ValueError(
                f"{where}: a tensor-parallel degree of {tp} does not divide the world size "
                f"{world_size}: pass tp as a divisor of {world_size} ({_listed(divisors(world_size))})"
            )
        if shard < 1 or dp % shard:
            raise ValueError(
                f"{where}: a shard group of {shard} rank(s) does not divide the "
                f"{dp} data-parallel rank(s) of world size {world_size}"
                + (f" with tp {tp}" if tp > 1 else "")
                + f": pass a divisor of {dp} ({_listed(divisors(dp))})"
            )
        return cls(dp // shard, shard, tp)

    @classmethod
    def of(cls, value: Any, *, world_size: int, where: str) -> MeshShape:
        """``value`` as a :class:`MeshShape` of ``world_size`` ranks.

        Args:
            value: a :class:`MeshShape`, a ``(replicate, shard)`` or
                ``(replicate, shard, tp)`` tuple of ints, or a
                ``torch.distributed.device_mesh.DeviceMesh`` (:meth:`from_device_mesh`).
            world_size: the ranks it must hold.
            where: the caller, for messages.

        Raises:
            TypeError: not one of those.
            ValueError: its ranks are not ``world_size`` (the message says which shapes are).
        """
        shape = cls.parse(value, where)
        if shape.world_size != world_size:
            dims = "(replicate, shard)" if shape.tp == 1 else "(replicate, shard, tp)"
            size = (shape.replicate, shape.shard) if shape.tp == 1 else shape.sizes
            example = (
                f"(1, {world_size}) for FSDP over all ranks"
                + (f" or (2, {world_size // 2}) for shard groups of {world_size // 2}")
                if world_size % 2 == 0 and shape.tp == 1
                else ""
            )
            raise ValueError(
                f"{where}: mesh shape {size} holds {shape.world_size} ranks but the world size "
                f"is {world_size}: pass a {dims} shape whose product is {world_size}"
                + (f", e.g. {example}" if example else "")
            )
        return shape

    @classmethod
    def parse(cls, value: Any, where: str) -> MeshShape:
        """``value`` (a :class:`MeshShape`, a tuple of 2 or 3 ints, a ``DeviceMesh``) as a
        :class:`MeshShape`, of any size (:meth:`of` checks its ranks too).

        Raises:
            TypeError: not one of those.
        """
        if isinstance(value, MeshShape):
            return value
        if isinstance(value, Sequence) and not isinstance(value, str) and len(value) in (2, 3):
            return cls(*value)
        if type(value).__name__ == "DeviceMesh":
            return cls.from_device_mesh(value, where=where)
        raise TypeError(
            f"{where}: mesh must be a MeshShape, a (replicate, shard) tuple or a DeviceMesh, got "
            f"{type(value).__name__} {value!r}"
        )

    @classmethod
    def from_device_mesh(cls, mesh: Any, *, where: str = "MeshShape.from_device_mesh") -> MeshShape:
        """The shape of a ``DeviceMesh``: 1-D is ``(1, n)``; 2-D unnamed or named
        ``(replicate, shard)`` / ``("dp_replicate", "dp_shard")`` is HSDP as FSDP2 takes
        it; a dimension named ``"tp"`` is tensor parallelism (``("dp", "tp")``,
        ``("dp_replicate", "dp_shard", "tp")``).

        Raises:
            ValueError: more than three dimensions, or names this does not know.
        """
        sizes = tuple(int(s) for s in mesh.shape)
        names = tuple(mesh.mesh_dim_names or ())
        if len(sizes) == 1:
            return cls(1, sizes[0], 1)
        tp = 1
        if names and names[-1] in _TP_NAMES:
            tp, sizes, names = sizes[-1], sizes[:-1], names[:-1]
        if len(sizes) == 1:
            return cls(1, sizes[0], tp)
        if len(sizes) == 2 and (not names or names in _HSDP_NAMES):
            return cls(sizes[0], sizes[1], tp)
        raise ValueError(
            f"{where}: cannot read a mesh of shape {tuple(mesh.shape)} with dimension names "
            f"{tuple(mesh.mesh_dim_names or ())}: name its dimensions ('dp_replicate', "
            "'dp_shard') for HSDP, ('dp', 'tp') or ('dp_replicate', 'dp_shard', 'tp') with "
            "tensor parallelism, or pass FSDP's part of it (mesh['dp'])"
        )

    # ---------------------------------------------------------------- JSON
    def to_dict(self) -> dict[str, int]:
        """``{"replicate": r, "shard": s, "tp": t}``."""
        return {"replicate": self.replicate, "shard": self.shard, "tp": self.tp}

    @classmethod
    def from_dict(cls, data: Any) -> MeshShape:
        """Inverse of :meth:`to_dict`.

        Raises:
            ValueError: not a dict of the three sizes.
        """
        if not isinstance(data, dict) or set(data) != set(MESH_DIMS):
            raise ValueError(f"expected a mesh shape {{replicate, shard, tp}}, got {data!r}")
        return cls(data["replicate"], data["shard"], data["tp"])


#: Names of a tensor-parallel mesh dimension.
_TP_NAMES = ("tp", "tensor", "tensor_parallel")
#: Names of a 2-D data-parallel mesh (replicate, shard).
_HSDP_NAMES = (
    ("dp_replicate", "dp_shard"),
    ("replicate", "shard"),
    ("dp_replicate", "dp_shard_cp"),
    ("dp_replicate", "fsdp"),
    ("ddp", "fsdp"),
)


def _listed(values: list[int]) -> str:
    return ", ".join(map(str, values))
