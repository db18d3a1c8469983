"""The training step around a plan, as plan data: :class:`Precision` and :class:`TrainingStep`.

A :class:`TrainingStep` is the one description of how a step runs besides its
FSDP groups, shared by what predicts it (:func:`execwrap.simulate.simulate_step`),
what applies it (``MixedPrecisionPolicy``, checkpointing, ``CPUOffloadPolicy``,
``set_requires_gradient_sync``), what searches it (the auto-planner) and the plan
that carries it (:attr:`execwrap.WrapPlan.training`, saved with the plan):

* :class:`Precision` (:mod:`execwrap.plan.precision`): FSDP2's ``MixedPrecisionPolicy`` (``param_dtype``,
  ``reduce_dtype``, ``output_dtype``, ``cast_forward_inputs``) and
  ``torch.autocast``'s dtype;
* activation checkpointing per plan unit: ``"none"``, ``"full"`` (the unit's
  input is kept and its forward runs again in backward: torch's
  ``checkpoint_wrapper``) or ``"selective"`` (torchtitan's op-level policy: the
  outputs of the attention kernels and of every other ``mm`` are kept, the
  rest runs again; :mod:`execwrap.simulate.checkpointing`), for every unit but
  the root, every ``checkpoint_every``-th of them (torchtitan's per-layer
  option), or per unit by index or module FQN;
* CPU offload (FSDP2's ``CPUOffloadPolicy``: shards, gradients and optimizer
  state in host memory, the optimizer step on the CPU);
* ``micro_batches`` per optimizer step, each reduce-scattering its gradients
  (``gradient_sync="every"``) or only the last one (``"last"``:
  ``set_requires_gradient_sync(False)`` before the others, which keep unsharded
  gradients in ``reduce_dtype``; :func:`execwrap.accumulate_gradients`' ``sync``), and whether the
  parameters are resharded after the backward of the micro-batches before the
  last (``set_reshard_after_backward``).

Every choice is validated when the object is made; the defaults (float32, no
checkpointing, no offload, one micro-batch) are the step
:func:`~execwrap.simulate.simulate_step` predicted before these choices existed.
The step lives with the plan data (below the cost model and the simulator, which
import it): :mod:`execwrap.simulate.training` re-exports it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, get_args

from execwrap.plan.precision import (
    DTYPES,
    PRECISIONS,
    DType,
    Precision,
    dtype_itemsize,
    named_precision,
)
from execwrap.plan.unit import WrapUnit, enclosing_units

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
    "dtype_itemsize",
]


class _Plan(Protocol):
    """What a step reads of a plan (a :class:`~execwrap.plan.wrap_plan.WrapPlan` is one)."""

    @property
    def units(self) -> Sequence[WrapUnit]: ...

    @property
    def root_index(self) -> int: ...


#: Activation checkpointing of one unit.
CheckpointMode = Literal["none", "full", "selective"]
#: Where sharded state lives: on the device, or in host memory (``CPUOffloadPolicy``).
Offload = Literal["none", "cpu"]
#: When the gradients of several micro-batches are reduced across ranks: after every
#: micro-batch, or after the last (the values of :func:`execwrap.accumulate_gradients`' ``sync``).
GradientSync = Literal["every", "last"]

CHECKPOINT_MODES: tuple[str, ...] = get_args(CheckpointMode)
OFFLOAD_MODES: tuple[str, ...] = get_args(Offload)
GRADIENT_SYNCS: tuple[str, ...] = get_args(GradientSync)


@dataclass(frozen=True)
class TrainingStep:
    """How one optimizer step runs around a plan (see the module docstring).

    Attributes:
        precision: the step's dtypes (:class:`Precision`); a name of
            :data:`~execwrap.plan.precision.PRECISIONS` (``"bf16"``, ``"bf16-reduce"``,
            ``"fp32"``, as the command line takes them) is converted to its
            ``Precision`` when the step is made, so the field is always a ``Precision``.
        checkpointing: the mode of every outermost unit but the root (``"none"``,
            ``"full"``, ``"selective"``; a unit inside another non-root unit is
            left to it), subject to ``checkpoint_every``: the units
            :func:`execwrap.apply_checkpointing` checkpoints for one mode.
        checkpoint_every: apply ``checkpointing`` to every ``n``-th of those units,
            counted from 1 in plan order (torchtitan's per-layer option: ``2``
            checkpoints the 2nd, 4th, ... unit).
        unit_checkpointing: per-unit modes that replace the above, keyed by
            plan unit index or by a module FQN of the unit.
        offload: ``"none"`` or ``"cpu"`` (FSDP2's ``CPUOffloadPolicy``).
        micro_batches: forward/backward passes per optimizer step (each on the
            captured batch), ``>= 1``.
        gradient_sync: ``"every"`` (every micro-batch reduce-scatters) or ``"last"``
            (only the last; the others keep unsharded gradients).
        reshard_after_backward: whether micro-batches before the last reshard
            their parameters after backward (FSDP2's default ``True``;
            ``False`` keeps them unsharded until the last micro-batch).

    Example:
        >>> step = TrainingStep(precision=Precision("bfloat16", "float32"),
        ...                     checkpointing="selective", micro_batches=4)
        >>> step.precision.compute_dtype, step.micro_batches, step.is_default
        ('bfloat16', 4, False)
        >>> TrainingStep(checkpointing="some")
        Traceback (most recent call last):
        ...
        ValueError: TrainingStep.checkpointing must be one of ['none', 'full', 'selective'], got 'some'
    """

    precision: Precision = field(default_factory=Precision)
    checkpointing: str = "none"
    checkpoint_every: int = 1
    unit_checkpointing: Mapping[int | str, str] = field(default_factory=dict, hash=False)
    offload: str = "none"
    micro_batches: int = 1
    gradient_sync: str = "every"
    reshard_after_backward: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.precision, str):
            object.__setattr__(
                self, "precision", named_precision(self.precision, "TrainingStep.precision")
            )
        if not isinstance(self.precision, Precision):
            raise TypeError(
                "TrainingStep.precision must be a Precision (e.g. Precision(param_dtype="
                f'"bfloat16", reduce_dtype="float32")) or one of {sorted(PRECISIONS)}, got '
                f"{type(self.precision).__name__}"
            )
        _choice("checkpointing", self.checkpointing, CHECKPOINT_MODES)
        _choice("offload", self.offload, OFFLOAD_MODES)
        _choice("gradient_sync", self.gradient_sync, GRADIENT_SYNCS)
        for name in ("checkpoint_every", "micro_batches"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"TrainingStep.{name} must be an int >= 1, got {value!r}")
        if not isinstance(self.reshard_after_backward, bool):
            raise TypeError(
                "TrainingStep.reshard_after_backward must be a bool, got "
                f"{self.reshard_after_backward!r}"
            )
        if not isinstance(self.unit_checkpointing, Mapping):
            raise TypeError(
                "TrainingStep.unit_checkpointing must map unit indices or module FQNs to modes, "
                f"got {type(self.unit_checkpointing).__name__}"
            )
        for key, mode in self.unit_checkpointing.items():
            if isinstance(key, bool) or not isinstance(key, (int, str)):
                raise TypeError(
                    f"TrainingStep.unit_checkpointing keys must be unit indices (int) or module "
                    f"FQNs (str), got {key!r}"
                )
            _choice(f"unit_checkpointing[{key!r}]", mode, CHECKPOINT_MODES)
        object.__setattr__(self, "unit_checkpointing", dict(self.unit_checkpointing))

    @property
    def is_default(self) -> bool:
        """Whether this is the plain step (float32, no checkpointing, no offload, one
        micro-batch): what :func:`~execwrap.simulate.simulate_step` models by default."""
        return (
            self.precision.is_default
            and self.offload == "none"
            and self.micro_batches == 1
            and not any(m != "none" for m in self.unit_checkpointing.values())
            and self.checkpointing == "none"
        )

    def checkpoint_targets(self, plan: _Plan) -> dict[str, str]:
        """``{module FQN: mode}`` of the checkpointed units' modules, for
        ``apply_fully_shard(..., checkpointing=...)`` (:meth:`checkpoint_modes`).

        Example:
            >>> import torch.nn as nn
            >>> from execwrap import ModuleWrapPolicy, plan_wrap
            >>> from tracing import trace_execution_order
            >>> model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2), nn.Linear(2, 2))
            >>> plan = plan_wrap(model, trace_execution_order(model), ModuleWrapPolicy({nn.Linear}))
            >>> TrainingStep(checkpointing="full", checkpoint_every=2).checkpoint_targets(plan)
            {'1': 'full'}
        """
        modes = self.checkpoint_modes(plan)
        return {
            f: m
            for u, m in zip(plan.units, modes, strict=True)
            if m != "none"
            for f in u.module_fqns
        }

    def checkpoint_modes(self, plan: _Plan) -> tuple[str, ...]:
        """The checkpointing mode of each unit of ``plan`` (in ``plan.units`` order).

        Raises:
            ValueError: a ``unit_checkpointing`` key names no unit of the plan (an
                index out of range, an FQN of no unit's module), or a mode other
                than ``"none"`` is asked of the root unit (it holds the loss and
                the model's outermost calls; checkpoint the blocks inside it).
        """
        n = len(plan.units)
        root = plan.root_index
        modes = ["none"] * n
        enclosing = enclosing_units(plan.units)
        outermost = [i for i in range(n) if i != root and not enclosing[i] - {root}]
        for k, i in enumerate(outermost, start=1):
            if k % self.checkpoint_every == 0:
                modes[i] = self.checkpointing
        by_fqn = {fqn: i for i, u in enumerate(plan.units) for fqn in u.module_fqns}
        for key, mode in self.unit_checkpointing.items():
            if isinstance(key, int):
                if not 0 <= key < n:
                    raise ValueError(
                        f"TrainingStep.unit_checkpointing: unit index {key} is out of range: the "
                        f"plan has {n} units (0..{n - 1})"
                    )
                index = key
            elif key in by_fqn:
                index = by_fqn[key]
            else:
                raise ValueError(
                    f"TrainingStep.unit_checkpointing: {key!r} is no module of a plan unit; "
                    "name a unit's module FQN (plan.units[i].module_fqns) or give its index"
                )
            modes[index] = mode
        if modes[root] != "none":
            raise ValueError(
                f"TrainingStep: the root unit {plan.units[root].label!r} cannot be checkpointed "
                f"({modes[root]!r}): it holds the loss and the model's outermost calls; "
                "checkpoint the units inside it"
            )
        return tuple(modes)

    def for_plan(self, plan: _Plan) -> TrainingStep:
        """This step with its checkpointing written out per unit of ``plan``: one entry of
        :attr:`unit_checkpointing` per checkpointed unit, keyed by the unit's first module
        FQN (``checkpointing="none"``, ``checkpoint_every=1``): what a plan carries, valid
        wherever the plan's units are (a saved plan, another process).

        Raises:
            ValueError: from :meth:`checkpoint_modes` (a key of no unit, the root).

        Example:
            >>> import torch.nn as nn
            >>> from execwrap import ModuleWrapPolicy, plan_wrap
            >>> from tracing import trace_execution_order
            >>> model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2), nn.Linear(2, 2))
            >>> plan = plan_wrap(model, trace_execution_order(model), ModuleWrapPolicy({nn.Linear}))
            >>> TrainingStep(checkpointing="full", checkpoint_every=2).for_plan(plan).unit_checkpointing
            {'1': 'full'}
        """
        modes = self.checkpoint_modes(plan)
        per_unit: dict[int | str, str] = {
            u.module_fqns[0]: m for u, m in zip(plan.units, modes, strict=True) if m != "none"
        }
        return dataclasses.replace(
            self, checkpointing="none", checkpoint_every=1, unit_checkpointing=per_unit
        )

    def describe(self) -> str:
        """One line of the step's settings besides checkpointing, e.g. ``"bfloat16
        parameters, float32 reduction; 4 micro-batches, gradient sync on the last only;
        no offload"``."""
        parts = [self.precision.describe()]
        if self.micro_batches > 1:
            sync = "every micro-batch" if self.gradient_sync == "every" else "the last only"
            text = f"{self.micro_batches} micro-batches, gradient sync on {sync}"
            if not self.reshard_after_backward:
                text += ", no reshard after backward"
            parts.append(text)
        else:
            parts.append("1 micro-batch")
        parts.append("CPU offload" if self.offload == "cpu" else "no offload")
        return "; ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict; ``unit_checkpointing`` as ``[key, mode]`` pairs (a key keeps
        its type: a unit index or a module FQN, even an FQN such as ``"3"``)."""
        return {
            "precision": self.precision.to_dict(),
            "checkpointing": self.checkpointing,
            "checkpoint_every": self.checkpoint_every,
            "unit_checkpointing": [[k, m] for k, m in self.unit_checkpointing.items()],
            "offload": self.offload,
            "micro_batches": self.micro_batches,
            "gradient_sync": self.gradient_sync,
            "reshard_after_backward": self.reshard_after_backward,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TrainingStep:
        """Inverse of :meth:`to_dict` (checked as the constructor checks; absent fields
        take their defaults).

        Raises:
            ValueError, TypeError: an unknown field, a malformed ``unit_checkpointing``,
                or a value the constructor refuses.
        """
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ValueError(f"TrainingStep: unknown field(s) {unknown}")
        kwargs = dict(data)
        if "precision" in kwargs:
            kwargs["precision"] = Precision.from_dict(kwargs["precision"])
        pairs = kwargs.get("unit_checkpointing", [])
        if not isinstance(pairs, list) or not all(
            isinstance(p, list) and len(p) == 2 for p in pairs
        ):
            raise ValueError(
                f"TrainingStep.unit_checkpointing must be a list of [key, mode] pairs, got {pairs!r}"
            )
        kwargs["unit_checkpointing"] = {k: m for k, m in pairs}
        return cls(**kwargs)


def _choice(name: str, value: Any, allowed: tuple[str, ...]) -> None:
    if value not in allowed or not isinstance(value, str):
        raise ValueError(f"TrainingStep.{name} must be one of {list(allowed)}, got {value!r}")
