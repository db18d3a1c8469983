"""CPU offload, refused where there is nothing to offload from: :func:`check_offload`.

FSDP2's ``CPUOffloadPolicy`` (``fully_shard(..., offload_policy=...)``) and FSDP1's
``CPUOffload(offload_params=True)`` keep the sharded parameters, their gradients and
(with the optimizer stepping on the CPU) the optimizer state in host memory, copy each
group's shards to the accelerator before its all-gather and the reduced gradients back.
On a CPU-only device the parameters already live in host memory: there is no
accelerator to copy to. torch then fails late and without saying why: FSDP2 in
``fully_shard`` itself, halfway through the plan's groups, when it pins the shard
("Cannot access accelerator device when none is available."); FSDP1 at the first
forward. :func:`check_offload` refuses it before anything is wrapped, saying why;
:func:`check_plan_offload` does the same for a plan's CPU offload (``plan.training``),
naming the plan as where it came from, for FSDP2 and FSDP1 alike.

The device is the one FSDP would shard onto: the mesh's ``device_type`` (FSDP2),
``device_id`` (FSDP1), else the current accelerator (``torch.accelerator``), else the
CPU.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from torch.distributed.device_mesh import DeviceMesh

__all__ = ["check_offload", "check_plan_offload", "offload_device_type"]


def offload_device_type(mesh: DeviceMesh | None = None, device_id: Any = None) -> str:
    """The device type FSDP would shard onto: ``mesh.device_type``, else ``device_id``'s
    type (an int is an accelerator index), else the current accelerator's, else ``"cpu"``."""
    if mesh is not None:
        return str(mesh.device_type)
    if isinstance(device_id, torch.device):
        return device_id.type
    if isinstance(device_id, str):
        return torch.device(device_id).type
    accelerator = (
        torch.accelerator.current_accelerator() if torch.accelerator.is_available() else None
    )
    return accelerator.type if accelerator is not None else "cpu"


def check_offload(
    offload: Any,
    *,
    mesh: DeviceMesh | None = None,
    device_id: Any = None,
    api: Literal["fully_shard", "FSDP"] = "fully_shard",
    where: str = "apply_fully_shard",
) -> None:
    """Refuse CPU offload that has no accelerator to copy to, and offload of the wrong kind.

    Args:
        offload: FSDP2's ``offload_policy`` (an ``OffloadPolicy``: ``CPUOffloadPolicy()``
            offloads, the base ``OffloadPolicy()`` does not) or FSDP1's ``cpu_offload``
            (a ``CPUOffload``); ``None`` offloads nothing.
        mesh: FSDP2's mesh (its ``device_type`` is where the parameters compute).
        device_id: FSDP1's ``device_id``.
        api: which FSDP the setting is for.
        where: the caller, first in the message.

    Raises:
        TypeError: ``offload`` is not the class ``api`` takes (FSDP1's ``CPUOffload``
            given to ``fully_shard``, a bool, ...).
        ValueError: it offloads and the device FSDP shards onto is the CPU
            (:func:`offload_device_type`); the message says why and that nothing has
            been wrapped.

    Example:
        >>> check_offload(None)
    """
    if offload is None:
        return
    from torch.distributed.fsdp import CPUOffload, CPUOffloadPolicy, OffloadPolicy

    expected: type = OffloadPolicy if api == "fully_shard" else CPUOffload
    kwarg = "offload_policy" if api == "fully_shard" else "cpu_offload"
    if not isinstance(offload, expected):
        fix = (
            "pass offload_policy=CPUOffloadPolicy() (FSDP1's CPUOffload belongs to "
            "FullyShardedDataParallel(cpu_offload=...))"
            if api == "fully_shard"
            else "pass cpu_offload=CPUOffload(offload_params=True) (FSDP2's CPUOffloadPolicy "
            "belongs to fully_shard(offload_policy=...))"
        )
        raise TypeError(
            f"{where}: {kwarg} must be a torch.distributed.fsdp.{expected.__name__}; got "
            f"{type(offload).__name__}: {fix}; nothing has been wrapped"
        )
    offloads = (
        isinstance(offload, CPUOffloadPolicy)
        if api == "fully_shard"
        else bool(getattr(offload, "offload_params", False))
    )
    device = offload_device_type(mesh, device_id)
    if not offloads or device != "cpu":
        return
    setting = (
        f"offload_policy={type(offload).__name__}(pin_memory={getattr(offload, 'pin_memory', True)})"
        if api == "fully_shard"
        else "cpu_offload=CPUOffload(offload_params=True)"
    )
    raise ValueError(
        f"{where}: {setting} keeps the sharded parameters, gradients and optimizer state in "
        f"host memory and copies them to an accelerator for each all-gather, but "
        f"{_nothing_to_copy_to(mesh)}; nothing has been wrapped. Leave {kwarg} out on a "
        "CPU-only device, or shard onto an accelerator"
        + (' (init_device_mesh("cuda", ...))' if api == "fully_shard" else " (device_id=...)")
    )


def check_plan_offload(
    offload: str,
    *,
    mesh: DeviceMesh | None = None,
    device_id: Any = None,
    planned_for: str | None = None,
    api: Literal["fully_shard", "FSDP"] = "fully_shard",
    where: str = "apply_fully_shard",
) -> None:
    """Refuse a plan's CPU offload (``plan.training.offload``, applied when no
    ``offload_policy`` / ``cpu_offload`` is given) where FSDP shards onto the CPU, naming
    the plan as its source.

    Args:
        offload: the plan's training step's offload, ``"none"`` or ``"cpu"``.
        mesh: FSDP2's mesh (``None``: the device ``fully_shard`` defaults to).
        device_id: FSDP1's ``device_id`` (``None``: the device FSDP1 defaults to).
        planned_for: the cost model the plan was made with (``plan.search.cost_model``),
            named in the message; ``None`` when the plan does not record it.
        api: which FSDP applies the plan: the fix named is its own argument.
        where: the caller, first in the message.

    Raises:
        ValueError: ``offload`` is ``"cpu"`` and the device is the CPU; the message says
            where the offload came from, that nothing has been wrapped, and the two fixes
            (``offload_policy=OffloadPolicy()``, FSDP1's
            ``cpu_offload=CPUOffload(offload_params=False)``, or planning with a cost
            model of this device).

    Example:
        >>> check_plan_offload("none")
    """
    if offload != "cpu" or offload_device_type(mesh, device_id) != "cpu":
        return
    planned = "" if planned_for is None else f", planned for {planned_for}"
    fix = (
        "offload_policy=OffloadPolicy() (torch.distributed.fsdp)"
        if api == "fully_shard"
        else "FullyShardedDataParallel(..., cpu_offload=CPUOffload(offload_params=False))"
    )
    raise ValueError(
        f"{where}: the plan's training step chose CPU offload (plan.training.offload='cpu'"
        f"{planned}), which keeps the sharded parameters, gradients and optimizer state in "
        f"host memory and copies them to an accelerator for each all-gather, but "
        f"{_nothing_to_copy_to(mesh)}; nothing has been wrapped. Pass {fix} to apply the "
        "plan without offload, or plan again with a cost model of this device "
        "(CostModel.calibrate() on it)"
    )


def _nothing_to_copy_to(mesh: DeviceMesh | None) -> str:
    """Why offload cannot work on a CPU device, as the end of a sentence."""
    on = "the mesh is on 'cpu'" if mesh is not None else "the device is the CPU"
    accelerator = (
        "" if torch.accelerator.is_available() else " (torch.accelerator.is_available() is False)"
    )
    return (
        f"{on}{accelerator}: the parameters already live in host memory and there is no "
        'accelerator to copy them to (torch would fail later with "Cannot access '
        'accelerator device when none is available.")'
    )
