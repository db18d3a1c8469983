"""Mixed-precision policies FSDP would refuse, found before anything is wrapped.

FSDP2 takes a ``MixedPrecisionPolicy`` (``fully_shard(..., mp_policy=...)``) and FSDP1 a
``MixedPrecision`` (``FullyShardedDataParallel(..., mixed_precision=...)``). Neither
checks its dtypes when it is given one: a non-floating ``param_dtype`` fails at the
first forward ("Only Tensors of floating point and complex dtype can require
gradients"), an integer ``reduce_dtype`` in the first reduce-scatter ("torch.cat():
input types can't be cast to the desired output type Int"), a float8 dtype in the
first reduction ("sum_cpu" not implemented for 'Float8_e4m3fn'), a string where a dtype
belongs at the first cast; by then every group is wrapped. :func:`check_mixed_precision`
refuses such a policy whole, naming the field, what was found and what FSDP accepts.

What FSDP accepts, read from torch 2.13 (``_fully_shard/_fsdp_api.py``,
``fsdp/api.py``): each dtype field is ``None`` (keep the parameter's dtype) or one of
:data:`MP_DTYPES` (the floating dtypes that autograd, the collectives and the
optimizer step all support; float8 training goes through torchao's float8
conversion, not a mixed-precision policy), and ``cast_forward_inputs`` is a ``bool``.
"""

from __future__ import annotations

from typing import Any, Literal

import torch

__all__ = ["MP_DTYPES", "check_mixed_precision"]

#: The dtypes a mixed-precision policy may name: floating dtypes with autograd,
#: collective (gloo and NCCL) and optimizer support.
MP_DTYPES: tuple[torch.dtype, ...] = (torch.float16, torch.bfloat16, torch.float32, torch.float64)

#: The dtype fields of each policy class, in the order the class declares them.
_DTYPE_FIELDS = {
    "MixedPrecisionPolicy": ("param_dtype", "reduce_dtype", "output_dtype"),
    "MixedPrecision": ("param_dtype", "reduce_dtype", "buffer_dtype"),
}
_BOOL_FIELDS = {
    "MixedPrecisionPolicy": ("cast_forward_inputs",),
    "MixedPrecision": (
        "keep_low_precision_grads",
        "cast_forward_inputs",
        "cast_root_forward_inputs",
    ),
}


def check_mixed_precision(
    policy: Any,
    *,
    api: Literal["fully_shard", "FSDP"] = "fully_shard",
    where: str = "apply_fully_shard",
) -> None:
    """Refuse a mixed-precision policy that FSDP would fail on later.

    Args:
        policy: FSDP2's ``MixedPrecisionPolicy`` (``api="fully_shard"``) or FSDP1's
            ``MixedPrecision`` (``api="FSDP"``); ``None`` is accepted (no mixed precision).
        api: which FSDP the policy is for.
        where: the caller, first in the message (``"apply_fully_shard"``,
            ``"ParamExecOrderWrapPolicy"``).

    Raises:
        TypeError: ``policy`` is not the class ``api`` takes (e.g. a dict, or FSDP1's
            ``MixedPrecision`` given to ``fully_shard``); a dtype field holds something
            other than a ``torch.dtype`` or ``None``; a flag is not a ``bool``.
        ValueError: a dtype field names a dtype outside :data:`MP_DTYPES` (an integer,
            complex or float8 dtype). Messages name the field, the value and what FSDP
            accepts, and say that nothing has been wrapped.

    Example:
        >>> from torch.distributed.fsdp import MixedPrecisionPolicy
        >>> check_mixed_precision(MixedPrecisionPolicy(param_dtype=torch.bfloat16))
        >>> check_mixed_precision(MixedPrecisionPolicy(param_dtype=torch.int8))  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: apply_fully_shard: mp_policy=MixedPrecisionPolicy(param_dtype=torch.int8) has ...
    """
    if policy is None:
        return
    expected, kwarg = _expected_class(api)
    if not isinstance(policy, expected):
        other = (
            "FSDP1's MixedPrecision belongs to FullyShardedDataParallel(mixed_precision=...)"
            if api == "fully_shard"
            else "FSDP2's MixedPrecisionPolicy belongs to fully_shard(mp_policy=...)"
        )
        raise TypeError(
            f"{where}: {kwarg} must be a torch.distributed.fsdp.{expected.__name__} or None; "
            f"got {type(policy).__name__} ({other}); nothing has been wrapped"
        )
    name = expected.__name__
    shown = f"{kwarg}={_short(policy)}"
    for field in _DTYPE_FIELDS[name]:
        value = getattr(policy, field)
        if value is None:
            continue
        if not isinstance(value, torch.dtype):
            raise TypeError(
                f"{where}: {shown} has {field}={value!r}, a {type(value).__name__}; FSDP "
                f"takes a torch.dtype ({_allowed()}) or None. Pass e.g. "
                f"{field}=torch.bfloat16; nothing has been wrapped"
            )
        if value not in MP_DTYPES:
            raise ValueError(
                f"{where}: {shown} has {field}={value}, which FSDP cannot compute or reduce "
                f"gradients in ({_why(value)}); {field} must be {_allowed()} or None. "
                "Float8 training goes through torchao's float8 conversion, not mixed "
                "precision; nothing has been wrapped"
            )
    for field in _BOOL_FIELDS[name]:
        value = getattr(policy, field)
        if not isinstance(value, bool):
            raise TypeError(
                f"{where}: {shown} has {field}={value!r}, a {type(value).__name__}; it must "
                "be True or False; nothing has been wrapped"
            )


def _expected_class(api: str) -> tuple[type, str]:
    """The policy class ``api`` takes and the keyword it is passed as."""
    if api == "fully_shard":
        from torch.distributed.fsdp import MixedPrecisionPolicy

        return MixedPrecisionPolicy, "mp_policy"
    from torch.distributed.fsdp import MixedPrecision

    return MixedPrecision, "mixed_precision"


def _short(policy: Any) -> str:
    """``MixedPrecisionPolicy(param_dtype=torch.int8)``: the class and its dtype fields set."""
    name = type(policy).__name__
    parts = [
        f"{f}={getattr(policy, f)!r}" for f in _DTYPE_FIELDS[name] if getattr(policy, f) is not None
    ]
    return f"{name}({', '.join(parts)})"


def _allowed() -> str:
    return ", ".join(str(d) for d in MP_DTYPES[:-1]) + f" or {MP_DTYPES[-1]}"


def _why(dtype: torch.dtype) -> str:
    if dtype.is_complex:
        return "a complex dtype: the loss and the gradients must be real"
    if dtype.is_floating_point:
        return "a float8 dtype: no autograd, reductions or optimizer step in it"
    return "not a floating dtype: autograd needs floating parameters"
