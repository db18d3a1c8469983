"""The training step around a plan, for the simulator: checks and keyword overrides.

The step itself (:class:`Precision`, :class:`TrainingStep`, the modes and dtypes) is
plan data, defined in :mod:`execwrap.plan.training_step` and re-exported here;
this module adds what only the simulator needs: whether a cost model and a
capture can price a step (:func:`check_priceable`) and :func:`simulate_step`'s
keywords that replace a step's fields (:func:`resolve_training`).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from execwrap.plan.training_step import (
    CHECKPOINT_MODES,
    DTYPES,
    GRADIENT_SYNCS,
    OFFLOAD_MODES,
    CheckpointMode,
    DType,
    GradientSync,
    Offload,
    Precision,
    TrainingStep,
    dtype_itemsize,
)

if TYPE_CHECKING:
    from execwrap.cost.model import CostModel
    from execwrap.plan.wrap_plan import WrapPlan

__all__ = [
    "GRADIENT_SYNCS",
    "CHECKPOINT_MODES",
    "DTYPES",
    "OFFLOAD_MODES",
    "GradientSync",
    "CheckpointMode",
    "DType",
    "Offload",
    "Precision",
    "TrainingStep",
    "check_priceable",
    "dtype_itemsize",
    "resolve_training",
]


def check_priceable(
    plan: WrapPlan, cost_model: CostModel, step: TrainingStep, *, given_compute: bool
) -> None:
    """Refuse a training step the cost model or the plan's capture cannot price:
    CPU offload on a CPU device or without the host link's rates; a compute dtype
    other than the one the plan's order was captured in (unless ``given_compute``).

    Raises:
        ValueError: naming what is missing and how to get it.
    """
    if step.offload == "cpu":
        if cost_model.device_type == "cpu":
            raise ValueError(
                "simulate_step: offload='cpu' moves shards, gradients and optimizer state "
                "from device memory to host memory, but the cost model is for CPU devices, "
                "whose memory is host memory already: there is nothing to offload; use "
                "offload='none'"
            )
        if cost_model.host is None:
            raise ValueError(
                "simulate_step: offload='cpu' needs the host link's rates, which the cost "
                "model does not have: use a GPU preset (CostModel.preset(...)) or set "
                "cost_model.replace(host=HostLink(...))"
            )
    if given_compute or not plan.order.has_timing:
        return
    own = sorted({info.dtype for info in plan.order.params.values()}) or ["float32"]
    captured = plan.order.param_dtype or "/".join(own)
    p = step.precision
    wanted = p.autocast_dtype or p.param_dtype or "/".join(own)
    if p.autocast_dtype is not None:
        raise ValueError(
            f"simulate_step: under torch.autocast ({p.autocast_dtype}) the activations are "
            "partly in each dtype, which a capture on the meta device does not reproduce yet: "
            "capture a real step under torch.autocast (record_execution_order(..., timing=True) "
            "inside the autocast context) and pass compute=unit_compute(plan)"
        )
    if captured != wanted:
        raise ValueError(
            f"simulate_step: the step computes in {wanted} but the plan's order was captured "
            f"in {captured}, so its activations and compute times are of that dtype: capture "
            f"with record_execution_order(..., param_dtype=torch.{wanted}) (free on the meta "
            f"device), pass precision=Precision(param_dtype={captured!r}) to simulate the "
            "step that was captured, or pass compute=UnitCompute(...) for this dtype"
        )


def resolve_training(
    training: TrainingStep | None,
    *,
    precision: Precision | None = None,
    checkpointing: str | None = None,
    offload: str | None = None,
    micro_batches: int | None = None,
    gradient_sync: str | None = None,
) -> TrainingStep:
    """``training`` (default: :class:`TrainingStep()`) with each given keyword replacing
    its field, checked again.

    Raises:
        TypeError: ``training`` is not a :class:`TrainingStep`.
        ValueError: a replaced field is invalid (:class:`TrainingStep`'s checks).
    """
    if training is None:
        training = TrainingStep()
    elif not isinstance(training, TrainingStep):
        raise TypeError(f"training must be a TrainingStep, got {type(training).__name__}")
    changes: dict[str, Any] = {
        k: v
        for k, v in (
            ("precision", precision),
            ("checkpointing", checkpointing),
            ("offload", offload),
            ("micro_batches", micro_batches),
            ("gradient_sync", gradient_sync),
        )
        if v is not None
    }
    return dataclasses.replace(training, **changes) if changes else training
