"""The dtypes of a training step: :class:`Precision`, and :data:`PRECISIONS` by name.

:class:`Precision` is FSDP2's ``MixedPrecisionPolicy`` (``param_dtype``, ``reduce_dtype``,
``output_dtype``, ``cast_forward_inputs``) and ``torch.autocast``'s dtype, as plan data
(:class:`~execwrap.plan.training_step.TrainingStep` carries one). :data:`PRECISIONS`
names the ones people train in, as the command line and :func:`execwrap.fit` take them:
``bf16`` is what torchtitan and transformers' FSDP2 path train in (bfloat16 parameters
all-gathered and computed in, float32 master weights and gradients reduced in float32:
torchtitan's ``mixed_precision_reduce = "float32"``); ``bf16-reduce`` also reduces in
bfloat16 (half the reduce-scatter bytes); ``fp32`` is no mixed precision.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, get_args

__all__ = ["DTYPES", "PRECISIONS", "DType", "Precision", "dtype_itemsize", "named_precision"]

#: Floating-point dtypes a step can compute, gather or reduce in (torch names).
DType = Literal["float32", "bfloat16", "float16"]

DTYPES: tuple[str, ...] = get_args(DType)
_ITEMSIZE = {"float32": 4, "bfloat16": 2, "float16": 2, "float64": 8}


def dtype_itemsize(name: str) -> int:
    """Bytes per element of a dtype name (``"bfloat16"`` -> 2).

    Raises:
        ValueError: a dtype this module does not size.
    """
    try:
        return _ITEMSIZE[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; expected one of {sorted(_ITEMSIZE)}") from None


def _dtype_name(value: Any, where: str) -> str | None:
    """``value`` (a dtype name, a ``torch.dtype`` or ``None``) as a name of :data:`DTYPES`."""
    if value is None:
        return None
    name = value if isinstance(value, str) else str(value).removeprefix("torch.")
    if name not in DTYPES:
        raise ValueError(
            f"{where} must be None or one of {list(DTYPES)} (a name or the torch.dtype), "
            f"got {value!r}"
        )
    return name


@dataclass(frozen=True)
class Precision:
    """The dtypes of a step: FSDP2's ``MixedPrecisionPolicy`` and ``torch.autocast``.

    Each dtype is a name of :data:`DTYPES` or the ``torch.dtype`` (stored as
    the name). ``None`` everywhere (the default) is float32 throughout.

    Attributes:
        param_dtype: the dtype FSDP all-gathers parameters in and the forward
            and backward compute in (``None``: the parameters' own).
        reduce_dtype: the dtype gradients are reduce-scattered in (``None``:
            ``param_dtype``'s, as FSDP2 does).
        output_dtype: the dtype FSDP2 casts a unit's forward outputs to
            (applied, not simulated: capture the loss as it will run).
        cast_forward_inputs: FSDP2 casts floating-point forward inputs to
            ``param_dtype`` (the default, as FSDP2's).
        autocast_dtype: ``torch.autocast``'s dtype (``None``: no autocast); the
            parameters stay in their dtype and are all-gathered in it.

    Example:
        >>> p = Precision(param_dtype="bfloat16", reduce_dtype="float32")
        >>> p.compute_dtype, p.gather_dtype("float32"), p.reduce_dtype_for("float32")
        ('bfloat16', 'bfloat16', 'float32')
        >>> Precision(param_dtype="int8")
        Traceback (most recent call last):
        ...
        ValueError: Precision.param_dtype must be None or one of ['float32', 'bfloat16', 'float16'] (a name or the torch.dtype), got 'int8'
    """

    param_dtype: str | None = None
    reduce_dtype: str | None = None
    output_dtype: str | None = None
    cast_forward_inputs: bool = True
    autocast_dtype: str | None = None

    def __post_init__(self) -> None:
        for name in ("param_dtype", "reduce_dtype", "output_dtype", "autocast_dtype"):
            object.__setattr__(self, name, _dtype_name(getattr(self, name), f"Precision.{name}"))
        if not isinstance(self.cast_forward_inputs, bool):
            raise TypeError(
                f"Precision.cast_forward_inputs must be a bool, got {self.cast_forward_inputs!r}"
            )

    @property
    def compute_dtype(self) -> str:
        """The dtype matmuls and activations are in (autocast's, else ``param_dtype``,
        else float32)."""
        return self.autocast_dtype or self.param_dtype or "float32"

    def gather_dtype(self, own: str) -> str:
        """The dtype a parameter of dtype ``own`` is all-gathered (and unsharded) in."""
        return self.param_dtype or own

    def reduce_dtype_for(self, own: str) -> str:
        """The dtype the gradient of a parameter of dtype ``own`` is reduce-scattered in."""
        return self.reduce_dtype or self.param_dtype or own

    def fsdp_policy(self) -> Any:
        """FSDP2's ``MixedPrecisionPolicy`` of these dtypes (autocast is not FSDP's: apply
        it around the forward yourself), for ``apply_fully_shard(..., mp_policy=...)``."""
        import torch
        from torch.distributed.fsdp import MixedPrecisionPolicy

        def dtype(name: str | None) -> Any:
            return None if name is None else getattr(torch, name)

        return MixedPrecisionPolicy(
            param_dtype=dtype(self.param_dtype),
            reduce_dtype=dtype(self.reduce_dtype),
            output_dtype=dtype(self.output_dtype),
            cast_forward_inputs=self.cast_forward_inputs,
        )

    def fsdp1_policy(self) -> Any:
        """FSDP1's ``MixedPrecision`` of these dtypes (``param_dtype``, ``reduce_dtype``,
        ``cast_forward_inputs``), for ``FullyShardedDataParallel(..., mixed_precision=...)``."""
        import torch
        from torch.distributed.fsdp import MixedPrecision

        def dtype(name: str | None) -> Any:
            return None if name is None else getattr(torch, name)

        return MixedPrecision(
            param_dtype=dtype(self.param_dtype),
            reduce_dtype=dtype(self.reduce_dtype),
            cast_forward_inputs=self.cast_forward_inputs,
        )

    @classmethod
    def of_policy(cls, policy: Any) -> Precision:
        """The :class:`Precision` of FSDP2's ``MixedPrecisionPolicy`` or FSDP1's
        ``MixedPrecision`` (``None``: float32 throughout); fields the object lacks
        keep their defaults.

        Raises:
            ValueError: a dtype other than those of :data:`DTYPES`.
        """
        if policy is None:
            return cls()
        return cls(
            param_dtype=getattr(policy, "param_dtype", None),
            reduce_dtype=getattr(policy, "reduce_dtype", None),
            output_dtype=getattr(policy, "output_dtype", None),
            cast_forward_inputs=bool(getattr(policy, "cast_forward_inputs", True)),
        )

    def describe(self) -> str:
        """One phrase: ``"float32"``, ``"bfloat16 parameters, float32 reduction"``."""
        if self.is_default:
            return "float32" if self.output_dtype is None else f"output in {self.output_dtype}"
        parts = []
        if self.autocast_dtype is not None:
            parts.append(f"autocast to {self.autocast_dtype}")
        if self.param_dtype is not None:
            parts.append(f"{self.param_dtype} parameters")
        if self.reduce_dtype is not None:
            parts.append(f"{self.reduce_dtype} reduction")
        return ", ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (dtype names, ``None`` where unset)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Precision:
        """Inverse of :meth:`to_dict` (checked as the constructor checks).

        Raises:
            ValueError, TypeError: an unknown key, dtype or a non-bool ``cast_forward_inputs``.
        """
        unknown = sorted(set(data) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise ValueError(f"Precision: unknown field(s) {unknown}")
        return cls(**data)

    @property
    def is_default(self) -> bool:
        """Whether every dtype is the parameters' own (no cast anywhere)."""
        return (
            self.param_dtype is None and self.reduce_dtype is None and (self.autocast_dtype is None)
        )


#: Name -> the :class:`Precision` a step is planned and applied with.
PRECISIONS: dict[str, Precision] = {
    "bf16": Precision(param_dtype="bfloat16", reduce_dtype="float32"),
    "bf16-reduce": Precision(param_dtype="bfloat16", reduce_dtype="bfloat16"),
    "fp32": Precision(),
}


def named_precision(name: str, where: str) -> Precision:
    """The :class:`Precision` of a name of :data:`PRECISIONS`.

    Raises:
        ValueError: an unknown name; the message lists the names and how to build one.
    """
    if name not in PRECISIONS:
        raise ValueError(
            f"{where} {name!r} is not a precision name; choose one of {sorted(PRECISIONS)} "
            'or pass a Precision (e.g. Precision(param_dtype="bfloat16", '
            'reduce_dtype="float32"))'
        )
    return PRECISIONS[name]
