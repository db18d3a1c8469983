"""A plan's training step applied: its precision, offload and checkpointing (``plan.training``).

A plan that carries a :class:`~execwrap.plan.training_step.TrainingStep` (an auto plan,
``plan_wrap(..., training=...)``, or a saved one) says how its step runs. What of it
FSDP sets up is applied without being repeated:

* FSDP2 (:func:`fsdp2_step`, for :func:`execwrap.apply_fully_shard`): its precision
  as ``mp_policy=`` (``Precision.fsdp_policy()``), its offload as
  ``offload_policy=CPUOffloadPolicy()``, its checkpointing per unit as
  ``checkpointing={module FQN: mode}``; a keyword given explicitly is applied instead,
  with one WARNING when it differs from the plan's (the plan's predicted step and the
  memory budget it was planned under then no longer describe what runs). The plan's CPU
  offload on a CPU mesh is refused before anything is wrapped, naming the plan
  (:func:`~execwrap.fsdp.offload.check_plan_offload`); ``offload_policy=OffloadPolicy()``
  applies the plan without it (one INFO line: on a CPU device that is the right call);
* FSDP1 (:func:`fsdp1_step`, for :class:`execwrap.ParamExecOrderWrapPolicy`): its
  checkpointing per unit likewise. FSDP1 sets the root's ``mixed_precision`` and
  ``cpu_offload`` from ``FullyShardedDataParallel``'s own arguments, which a policy
  cannot change, so a plan's precision or offload that FSDP1 was not given is refused
  before anything is wrapped, saying what to pass; one given that differs is a WARNING.
  The plan's CPU offload where FSDP1 shards onto the CPU (``device_id``) is refused
  likewise, naming the plan (:func:`~execwrap.fsdp.offload.check_plan_offload`);
  ``cpu_offload=CPUOffload(offload_params=False)`` applies the plan without it (one
  INFO line).

The micro-batches and the gradient sync are the training loop's: pass
``sync=plan.training.gradient_sync`` to :func:`execwrap.accumulate_gradients`.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from typing import Any, cast

import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh

from execwrap.fsdp.checkpointing import Checkpointing, checkpoint_targets
from execwrap.fsdp.offload import check_offload, check_plan_offload, offload_device_type
from execwrap.fsdp.precision import check_mixed_precision
from execwrap.plan.training_step import Precision, TrainingStep
from execwrap.plan.wrap_plan import WrapPlan
from execwrap.planning.auto.options import check_training

__all__ = ["check_fsdp1_kwargs", "fsdp1_step", "fsdp2_step", "policy_choices", "policy_step"]

logger = logging.getLogger(__name__)

_STALE = "plan.estimate and the memory budget it was planned under no longer describe the step"


def fsdp2_step(
    model: nn.Module,
    plan: WrapPlan,
    fully_shard_kwargs: Mapping[str, Any],
    checkpointing: Checkpointing,
    every: int,
    mesh: DeviceMesh | None = None,
) -> tuple[dict[str, Any], Checkpointing, int]:
    """``fully_shard_kwargs`` and the checkpointing to apply, the plan's step filled in
    where not given (module docstring); a given setting that differs: one WARNING each
    (an ``offload_policy`` without offload on a CPU ``mesh``: one INFO line).

    Returns:
        ``(fully_shard_kwargs, checkpointing, every)``.

    Raises:
        ValueError: the plan's CPU offload, not overridden, on a CPU ``mesh``
            (:func:`~execwrap.fsdp.offload.check_plan_offload`).
    """
    kwargs = dict(fully_shard_kwargs)
    step = plan.training
    if step is None:
        return kwargs, checkpointing, every
    where = "apply_fully_shard"
    if "mp_policy" not in kwargs:
        if not _plain(step.precision):
            kwargs["mp_policy"] = step.precision.fsdp_policy()
    else:
        _warn_precision(kwargs["mp_policy"], step, where, "mp_policy")
    if "offload_policy" not in kwargs:
        if step.offload == "cpu":
            from torch.distributed.fsdp import CPUOffloadPolicy

            planned_for = plan.search.cost_model if plan.search is not None else None
            check_plan_offload(step.offload, mesh=mesh, planned_for=planned_for, where=where)

            kwargs["offload_policy"] = CPUOffloadPolicy()
    else:
        given = "cpu" if type(kwargs["offload_policy"]).__name__ == "CPUOffloadPolicy" else "none"
        if given == "none" and step.offload == "cpu" and offload_device_type(mesh) == "cpu":
            policy = type(kwargs["offload_policy"]).__name__
            _info_no_offload_on_cpu(f"offload_policy={policy}()", where)
        else:
            _warn_offload(given, step, where, "offload_policy")
    mine = step.checkpoint_targets(plan)
    if checkpointing is None and every == 1:
        return kwargs, cast(Checkpointing, mine or None), 1
    given_targets = checkpoint_targets(model, plan.groups, checkpointing, every=every)
    _warn_checkpointing(given_targets, mine, where)
    return kwargs, checkpointing, every


def fsdp1_step(
    model: nn.Module,
    plan: WrapPlan,
    root_kwargs: Mapping[str, Any],
    checkpointing: Checkpointing,
    every: int,
) -> tuple[Checkpointing, int]:
    """The checkpointing FSDP1 applies (the policy's own, else the plan's step's) and its
    ``every``, after checking FSDP1's ``mixed_precision`` and ``cpu_offload`` against
    the plan's step.

    Raises:
        ValueError: the plan's step has mixed precision (or CPU offload) but FSDP1 got
            no ``mixed_precision`` (no ``cpu_offload``): the message says what to pass;
            the plan's CPU offload where FSDP1 shards onto the CPU (the message names the
            plan and says how to apply it without offload:
            :func:`~execwrap.fsdp.offload.check_plan_offload`).
    """
    step = plan.training
    if step is None:
        return checkpointing, every
    where = "ParamExecOrderWrapPolicy"
    mp = root_kwargs.get("mixed_precision")
    if mp is None and not _plain(step.precision):
        raise ValueError(
            f"{where}: the plan's training step has {step.precision.describe()}, but FSDP got "
            "mixed_precision=None, and FSDP1 takes the root's precision from its own argument, "
            "which a policy cannot set: pass FullyShardedDataParallel(..., mixed_precision="
            "policy.plan.training.precision.fsdp1_policy()) (or the same MixedPrecision you "
            "planned with); nothing has been wrapped"
        )
    if mp is not None:
        _warn_precision(mp, step, where, "mixed_precision")
    offload = root_kwargs.get("cpu_offload")
    offloaded = "cpu" if getattr(offload, "offload_params", False) else "none"
    device_id = root_kwargs.get("device_id")
    if offload is None and step.offload == "cpu":
        planned_for = plan.search.cost_model if plan.search is not None else None
        check_plan_offload(
            step.offload, device_id=device_id, planned_for=planned_for, api="FSDP", where=where
        )
        raise ValueError(
            f"{where}: the plan's training step offloads to the CPU, but FSDP got no "
            "cpu_offload, and FSDP1 takes the root's offload from its own argument: pass "
            "FullyShardedDataParallel(..., cpu_offload=CPUOffload(offload_params=True)); "
            "nothing has been wrapped"
        )
    if (
        offloaded == "none"
        and step.offload == "cpu"
        and offload_device_type(None, device_id) == "cpu"
    ):
        _info_no_offload_on_cpu("cpu_offload=CPUOffload(offload_params=False)", where)
    else:
        _warn_offload(offloaded, step, where, "cpu_offload")
    mine = step.checkpoint_targets(plan)
    if checkpointing is None and every == 1:
        return cast(Checkpointing, mine or None), 1
    given = checkpoint_targets(model, plan.groups, checkpointing, every=every, where=where)
    _warn_checkpointing(given, mine, where)
    return checkpointing, every


def _plain(p: Precision) -> bool:
    """No cast anywhere (nothing for an FSDP mixed-precision policy to do)."""
    return p.is_default and p.output_dtype is None


def _warn_precision(policy: Any, step: TrainingStep, where: str, name: str) -> None:
    try:
        given = Precision.of_policy(policy)
    except (TypeError, ValueError):
        return  # check_mixed_precision words what is wrong with it
    mine = step.precision
    if (given.param_dtype, given.reduce_dtype) != (mine.param_dtype, mine.reduce_dtype):
        logger.warning(
            "%s: %s given (%s) where the plan's training step has %s: %s; leave %s out to "
            "apply the plan's",
            where,
            name,
            given.describe(),
            mine.describe(),
            _STALE,
            name,
        )


def _warn_offload(given: str, step: TrainingStep, where: str, name: str) -> None:
    if given != step.offload:
        logger.warning(
            "%s: %s given (%s) where the plan's training step has %s: %s; leave %s out to "
            "apply the plan's",
            where,
            name,
            "CPU offload" if given == "cpu" else "no offload",
            "CPU offload" if step.offload == "cpu" else "no offload",
            _STALE,
            name,
        )


def _info_no_offload_on_cpu(setting: str, where: str) -> None:
    logger.info(
        "%s: %s given on a CPU device: the plan is applied without its "
        "training step's CPU offload (plan.training.offload='cpu'), which needs an "
        "accelerator to copy to; plan.estimate and the memory budget it was planned under "
        "describe the step with offload",
        where,
        setting,
    )


def _warn_checkpointing(given: Mapping[str, str], mine: Mapping[str, str], where: str) -> None:
    if dict(given) != dict(mine):
        logger.warning(
            "%s: checkpointing given (%s) where the plan's training step checkpoints %s: "
            "%s; leave checkpointing out to apply the plan's",
            where,
            dict(given) or "nothing",
            dict(mine) or "nothing",
            _STALE,
        )


def policy_step(
    training: TrainingStep | None, mode: Checkpointing, every: int, bucket_numel: Any
) -> TrainingStep | None:
    """The step a :class:`~execwrap.ParamExecOrderWrapPolicy` plans for: ``training``
    with the policy's ``checkpointing=`` in it (``None`` when neither is set, or only
    ``checkpointing`` without ``bucket_numel="auto"``).

    Raises:
        ValueError: both set the checkpointing.
    """
    if training is None and (mode is None or bucket_numel != "auto"):
        return training
    step = check_training(training, "ParamExecOrderWrapPolicy")
    if mode is None:
        return step
    if step.checkpointing != "none" or step.unit_checkpointing or step.checkpoint_every != 1:
        raise ValueError(
            "ParamExecOrderWrapPolicy: checkpointing= and training= both set the "
            "activation checkpointing; set it in one place"
        )
    if isinstance(mode, str):
        return dataclasses.replace(step, checkpointing=mode, checkpoint_every=every)
    per_module: dict[int | str, str] = {k: v for k, v in mode.items()}
    return dataclasses.replace(step, unit_checkpointing=per_module)


def policy_choices(
    choose: Sequence[str] | None, mode: Checkpointing, bucket_numel: Any
) -> tuple[str, ...] | None:
    """What the auto-planner chooses for a policy: ``choose``, without
    ``"checkpointing"`` when the policy's ``checkpointing=`` fixes it (``None``: the
    default, which leaves out every setting the step fixes, that one included)."""
    if choose is None or mode is None or bucket_numel != "auto":
        return None if choose is None else tuple(choose)
    return tuple(c for c in choose if c != "checkpointing")


def check_fsdp1_kwargs(root_kwargs: Mapping[str, Any]) -> None:
    """FSDP1's ``mixed_precision`` and ``cpu_offload`` that it would refuse later."""
    where = "ParamExecOrderWrapPolicy"
    check_mixed_precision(root_kwargs.get("mixed_precision"), api="FSDP", where=where)
    device_id = root_kwargs.get("device_id")
    check_offload(root_kwargs.get("cpu_offload"), device_id=device_id, api="FSDP", where=where)
