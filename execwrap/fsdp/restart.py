"""Checkpoints across plans: a model and its optimizer saved under one plan, loaded under another.

The recipe is torch's. :func:`torch.distributed.checkpoint.state_dict.get_state_dict`
gives the model's and the optimizer's state keyed by the original FQNs, the
same for FSDP2 and for FSDP1 (``SHARDED_STATE_DICT``), whatever the grouping;
:mod:`torch.distributed.checkpoint` (DCP) saves each rank's shards with every
tensor's global shape and each shard's place in it, and on load reads the
pieces each rank's new shards need. So a checkpoint saved under one plan loads
under another: per-block and bucketed and auto groupings, another prefetch
depth or ``reshard_after_forward``, FSDP2 and FSDP1 either way, HSDP, another
world size (all checked in ``tests/distributed/test_checkpoint.py``:
training goes on with the losses of an uninterrupted run).

:func:`save_checkpoint` and :func:`load_checkpoint` are that recipe in one
call each, plus the plan (``plan.json`` beside the checkpoint,
:mod:`execwrap.plan.pinned`) and two refusals where DCP would go on with wrong values:

* tensors that are not sharded and differ between ranks. DCP takes a tensor
  that is neither a ``DTensor`` nor a ``ShardedTensor`` for a replica, equal
  on every rank, and saves one copy. A parameter a plan leaves unsharded and
  unsynchronised (FSDP2's ``ignored_params``) is trained apart on each rank,
  so a restart would hand every rank one rank's values. :func:`save_checkpoint`
  compares a digest of each such tensor across ranks and refuses, naming the
  first.
* a checkpoint of another model. DCP raises on an entry the checkpoint lacks
  or a shape that differs, and skips an entry the model lacks without a word.
  :func:`load_checkpoint` compares the checkpoint's metadata with the model's
  state dict first and names the first entry that differs, either way.

:func:`restart_fully_shard` is the restart from a pinned plan in one call.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Literal

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn as nn
from torch.distributed._shard.sharded_tensor import ShardedTensor
from torch.distributed.checkpoint.metadata import TensorStorageMetadata
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor

from execwrap.distributed.status import fail_together, is_distributed
from execwrap.fsdp.fsdp2 import apply_fully_shard
from execwrap.plan.pinned import load_plan, plan_changes, plan_path, save_plan
from execwrap.plan.wrap_plan import WrapPlan

__all__ = ["load_checkpoint", "restart_fully_shard", "save_checkpoint"]

logger = logging.getLogger(__name__)


def save_checkpoint(
    path: str | os.PathLike[str],
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    *,
    plan: WrapPlan | None = None,
    check_replicas: bool = True,
) -> Path:
    """Save ``model`` (and ``optimizer``) with DCP to folder ``path``; ``plan`` beside them.

    Collective: every rank of the default process group calls it (DCP's own
    collectives, and one ``all_gather_object`` of digests when ``check_replicas``).

    Args:
        path: the checkpoint folder (created).
        model: the sharded model (FSDP2, FSDP1, or not sharded).
        optimizer: its optimizer, or ``None`` to save the model only.
        plan: the plan the model was sharded with: written to
            ``path/plan.json`` (:func:`execwrap.plan.pinned.save_plan`, atomically,
            by rank 0, replacing the one of a folder saved into again) for
            :func:`restart_fully_shard`.
        check_replicas: compare every tensor that is not sharded across ranks
            first (a SHA-256 of its bytes; ``False`` skips it: for a large
            model kept whole on every rank, such as DDP's).

    Returns:
        ``Path(path)``.

    Raises:
        ValueError: on every rank, before anything is written, when a tensor
            that is not sharded differs between ranks (named, with the fix),
            or the ranks hold different plans.

    Example:
        >>> save_checkpoint("checkpoints/step-1000", model, optimizer, plan=plan)  # doctest: +SKIP
    """
    state = _state(model, optimizer)
    if check_replicas and is_distributed():
        _check_replicas(state, plan)
    if plan is not None and (not _initialised() or dist.get_rank() == 0):
        # a checkpoint folder saved again: its plan.json goes with its shards, which DCP replaces
        save_plan(
            plan, path, overwrite=True
        )  # before DCP's last collective: every rank returns after it
    dcp.save(state, checkpoint_id=path)
    logger.debug("save_checkpoint: %d model entries to %s", len(state["model"]), path)
    return Path(path)


def load_checkpoint(
    path: str | os.PathLike[str],
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    *,
    plan: WrapPlan | None = None,
) -> WrapPlan | None:
    """Load a :func:`save_checkpoint` folder into ``model`` (and ``optimizer``), under any plan.

    Call it after sharding the model (with any plan) and creating the optimizer
    on the sharded parameters. Collective (DCP's collectives, and one status
    exchange after the checks, :mod:`execwrap.distributed.status`).

    Args:
        path: the checkpoint folder.
        model: the model, sharded with the plan it trains with now.
        optimizer: its optimizer (the checkpoint must hold one), or ``None``.
        plan: the plan ``model`` was sharded with now: when the folder holds a
            pinned plan that differs, what changed is logged at INFO
            (:func:`execwrap.plan.pinned.plan_changes`).

    Returns:
        The pinned plan of the folder (``path/plan.json``), or ``None``.

    Raises:
        ValueError: the checkpoint lacks an entry of the model (or any
            optimizer state), holds an entry the model lacks, or holds a tensor
            of another shape: the first such entry named, before anything is
            loaded.
        RankFailure: that happened on another rank.
        FileNotFoundError: ``path`` holds no DCP checkpoint.
    """
    state = _state(model, optimizer)
    with fail_together("load_checkpoint: the checkpoint's entries against the model's"):
        _check_entries(dcp.FileSystemReader(path).read_metadata().state_dict_metadata, state, path)
    dcp.load(state, checkpoint_id=path)
    if optimizer is None:
        set_model_state_dict(model, state["model"])
    else:
        set_state_dict(
            model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"]
        )
    pinned = load_plan(path) if plan_path(path).is_file() else None
    if plan is not None and pinned is not None:
        changes = plan_changes(pinned, plan)
        if changes:
            logger.info(
                "load_checkpoint: the model trains on under another plan than the one pinned "
                "at %s: %s",
                plan_path(path),
                "; ".join(changes),
            )
        else:
            logger.info("load_checkpoint: the plan is the one pinned at %s", plan_path(path))
    return pinned


def restart_fully_shard(
    model: nn.Module,
    path: str | os.PathLike[str],
    *,
    mesh: DeviceMesh | None = None,
    prefetch: int | Literal["auto"] | None = None,
    **fully_shard_kwargs: Any,
) -> WrapPlan:
    """Shard ``model`` with the plan pinned in checkpoint folder ``path``, in one call.

    Reads ``path/plan.json`` (:func:`execwrap.plan.pinned.load_plan`), checks it
    against ``model`` (the first module or parameter that differs is named; a
    rank whose model does not fit is named on the others) and applies it with
    :func:`execwrap.apply_fully_shard`, whose cross-rank check confirms every
    rank applies the same groups. Then create the optimizer and call
    :func:`load_checkpoint`.

    Args:
        model: the unwrapped model (the one the plan was made for).
        path: the checkpoint folder (or the ``plan.json`` file).
        mesh: FSDP2's mesh (see :func:`execwrap.apply_fully_shard`).
        prefetch: ``None``: the auto plan's depth (``"auto"``) when it has
            one, else 1; or a depth / ``"auto"`` as ``apply_fully_shard`` takes it.
        **fully_shard_kwargs: passed to ``apply_fully_shard``.

    Returns:
        The plan applied (the pinned one).

    Raises:
        FileNotFoundError: no ``plan.json``.
        ValueError: the plan is for another model (naming the first FQN that
            differs), or malformed; what ``apply_fully_shard`` raises.
        RankFailure: that happened on another rank.

    Example:
        >>> plan = restart_fully_shard(model, "checkpoints/step-1000")  # doctest: +SKIP
        >>> optimizer = torch.optim.AdamW(model.parameters())  # doctest: +SKIP
        >>> load_checkpoint("checkpoints/step-1000", model, optimizer)  # doctest: +SKIP
    """
    with fail_together("restart_fully_shard: reading the pinned plan"):
        plan = load_plan(path, model)
    if prefetch is None:
        prefetch = "auto" if plan.prefetch is not None else 1
    logger.info("restart_fully_shard: %d groups pinned at %s", len(plan.units), plan_path(path))
    return apply_fully_shard(model, plan, mesh=mesh, prefetch=prefetch, **fully_shard_kwargs)


# ------------------------------------------------------------------ helpers
def _initialised() -> bool:
    return dist.is_available() and dist.is_initialized()


def _state(model: nn.Module, optimizer: torch.optim.Optimizer | None) -> dict[str, Any]:
    """``{"model": ..., "optim": ...}``: the FQN-keyed state dicts DCP saves and loads."""
    if optimizer is None:
        return {"model": get_model_state_dict(model)}
    model_sd, optim_sd = get_state_dict(model, optimizer)
    return {"model": model_sd, "optim": optim_sd}


def _is_plain(value: Any) -> bool:
    """A tensor that is not sharded (DCP takes it for a replica)."""
    return isinstance(value, torch.Tensor) and not isinstance(value, (DTensor, ShardedTensor))


def _plain_tensors(state: Mapping[str, Any]) -> Iterator[tuple[str, torch.Tensor]]:
    """``(DCP key, tensor)`` of every tensor in ``state`` that is not sharded."""
    for fqn, value in state["model"].items():
        if _is_plain(value):
            yield f"model.{fqn}", value
    for fqn, entries in state.get("optim", {}).get("state", {}).items():
        for name, value in entries.items():
            if _is_plain(value):
                yield f"optim.state.{fqn}.{name}", value


def _digest(t: torch.Tensor) -> str:
    data = t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
    return hashlib.sha256(data).hexdigest()


def _check_replicas(state: Mapping[str, Any], plan: WrapPlan | None) -> None:
    """Refuse, on every rank, a tensor that is not sharded and differs between ranks,
    or plans that differ (one ``all_gather_object`` of digests)."""
    mine = {key: _digest(t) for key, t in _plain_tensors(state)}
    plan_digest = None if plan is None else hashlib.sha256(repr(plan.groups).encode()).hexdigest()
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, (dist.get_rank(), mine, plan_digest))
    ranks = sorted((g for g in gathered if g is not None), key=lambda g: g[0])
    ref_rank, ref, ref_plan = ranks[0]
    for rank, digests, other_plan in ranks[1:]:
        key = next((k for k in ref if digests.get(k) != ref[k]), None)
        if key is not None:
            raise ValueError(
                f"save_checkpoint: {key!r} is not sharded (a plain tensor, not a DTensor: "
                "FSDP2's ignored_params, or a module no FSDP unit manages) and its values differ "
                f"between rank {ref_rank} and rank {rank}. DCP saves one copy of a tensor that "
                "is not sharded (it takes it for a replica), so a restart would give every rank "
                f"rank {ref_rank}'s values and training would not go on as it was. Shard it "
                "(leave it out of ignored_params), or keep it equal on every rank (all-reduce "
                "its gradient); save_checkpoint(..., check_replicas=False) skips this check"
            )
        if other_plan != ref_plan:
            raise ValueError(
                f"save_checkpoint: rank {rank} holds another plan than rank {ref_rank}; the "
                "plan pinned beside the checkpoint must be every rank's. Pass the plan every "
                "rank applied (apply_fully_shard's return value)"
            )


def _check_entries(metadata: Mapping[str, Any], state: Mapping[str, Any], path: Any) -> None:
    """The checkpoint's entries against the model's: every model entry present with
    its global shape, no model entry the model lacks, optimizer state when needed."""
    for fqn, value in state["model"].items():
        key = f"model.{fqn}"
        saved = metadata.get(key)
        if saved is None:
            raise ValueError(
                f"load_checkpoint: the checkpoint at {path} has no entry for {fqn!r} of the "
                "model; it was saved from another model (or before the model changed). Load "
                "it into the model it was saved from"
            )
        if isinstance(saved, TensorStorageMetadata) and isinstance(value, torch.Tensor):
            if tuple(saved.size) != tuple(value.shape):
                raise ValueError(
                    f"load_checkpoint: {fqn!r} has shape {tuple(saved.size)} in the checkpoint "
                    f"at {path} and {tuple(value.shape)} in the model; it was saved from "
                    "another model. Load it into the model it was saved from"
                )
    model_keys = {f"model.{fqn}" for fqn in state["model"]}
    extra = next((k for k in metadata if k.startswith("model.") and k not in model_keys), None)
    if extra is not None:
        raise ValueError(
            f"load_checkpoint: the checkpoint at {path} holds {extra.removeprefix('model.')!r}, "
            "which the model does not have (DCP would skip it without a word); it was saved "
            "from another model. Load it into the model it was saved from"
        )
    if "optim" in state and not any(k.startswith("optim.") for k in metadata):
        raise ValueError(
            f"load_checkpoint: the checkpoint at {path} holds no optimizer state (saved "
            "with optimizer=None); pass optimizer=None, or save the optimizer with the model"
        )
