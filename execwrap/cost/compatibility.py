"""Whether a cost model fits the world size and device it is asked to price.

:func:`incompatibility` is the message of :meth:`~execwrap.cost.CostModel.check_compatible`:
what differs, what the model was made for, and how to get one that fits.
"""

from __future__ import annotations

from typing import Any

from execwrap.util.text import plural

__all__ = ["incompatibility"]


def incompatibility(cost_model: Any, world_size: int, device_type: str) -> str:
    """The error message when ``cost_model`` does not fit ``world_size`` ranks on
    ``device_type``, else ``""``.

    Args:
        cost_model: a :class:`~execwrap.cost.CostModel`.
        world_size: the ranks it is asked to price (a shard group's, for a model
            resolved for a mesh).
        device_type: the device of the compute it is used with.
    """
    cm = cost_model
    problems = []
    if world_size != cm.world_size:
        held = plural(cm.world_size, "rank")
        if cm.mesh is not None:
            held = f"one shard group of {held} of mesh {cm.mesh.label}"
        problems.append(f"world size {world_size} (this cost model is for {held})")
    if device_type != cm.device_type:
        problems.append(f"device type {device_type!r} (this cost model is for {cm.device_type!r})")
    if not problems:
        return ""
    origin = cm.source.split(";")[0].strip() or "unnamed"
    if len(origin) > 100:
        origin = origin[:99] + "…"
    remedies = []
    if world_size != cm.world_size:
        remedy = (
            f"calibrate on the target's {plural(world_size, 'rank')} (`execwrap calibrate` "
            "under torchrun)"
        )
        if world_size >= 2:  # presets describe 2 or more GPUs
            remedy += (
                " or use a preset that describes them (CostModel.preset(name, "
                f"world_size={world_size}): the NVLink presets one node of 2-8 GPUs, "
                "h100-ib-400g 2 or more whole nodes of 8)"
            )
        remedies.append(remedy)
    if device_type != cm.device_type:
        remedies.append(
            f"the order's compute times are for {device_type!r}: time it on the cost "
            "model's device, or estimate it (record_execution_order on the meta device "
            f"with timing=cost_model.compute), or use a cost model for {device_type!r}"
        )
    return (
        f"cost model ({origin}) does not fit "
        + " and ".join(problems)
        + ": "
        + "; and ".join(remedies)
    )
