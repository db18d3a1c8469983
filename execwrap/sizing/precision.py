"""The precisions a job is sized in: :data:`PRECISIONS`, named as people say them.

``--precision bf16`` is what torchtitan and transformers' FSDP2 path train in:
bfloat16 parameters all-gathered and computed in, float32 master weights (the shards,
the optimizer) and gradients reduced in float32 (torchtitan's
``mixed_precision_reduce = "float32"``). ``bf16-reduce`` also reduces in bfloat16
(half the reduce-scatter bytes); ``fp32`` is no mixed precision. The table lives with
the plan data (:mod:`execwrap.plan.precision`), so ``TrainingStep(precision="bf16")``
takes the same names.
"""

from __future__ import annotations

from execwrap.plan import precision as plan_precision
from execwrap.plan.precision import Precision

__all__ = ["PRECISIONS", "precision_of"]

#: Name -> the :class:`~execwrap.Precision` the step is planned and applied with (the
#: table of :mod:`execwrap.plan.precision`, which ``TrainingStep(precision=...)`` takes too).
PRECISIONS: dict[str, Precision] = plan_precision.PRECISIONS


def precision_of(precision: str | Precision) -> tuple[str, Precision]:
    """``(name, Precision)`` of a name in :data:`PRECISIONS` or a :class:`~execwrap.Precision`
    (named as in :data:`PRECISIONS` when it is one of them, else by its description).

    Raises:
        ValueError: an unknown name (the message lists the names).
        TypeError: neither a string nor a ``Precision``.

    >>> precision_of("bf16")[1].describe()
    'bfloat16 parameters, float32 reduction'
    >>> precision_of(Precision(param_dtype="bfloat16", reduce_dtype="float32"))[0]
    'bf16'
    """
    if isinstance(precision, Precision):
        names = [name for name, known in PRECISIONS.items() if known == precision]
        return (names[0] if names else precision.describe()), precision
    if not isinstance(precision, str):
        raise TypeError(
            f"precision must be one of {sorted(PRECISIONS)} or an execwrap.Precision; got "
            f"{type(precision).__name__}"
        )
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; choose one of {sorted(PRECISIONS)}")
    return precision, PRECISIONS[precision]
