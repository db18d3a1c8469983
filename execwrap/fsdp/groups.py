"""The ``fully_shard`` groups of a plan: which, in which order, with which kwargs.

:func:`apply_fully_shard` (:mod:`execwrap.fsdp.fsdp2`) reads the plan's non-root groups
(:func:`plan_groups`, every FQN checked against the model), orders them bottom-up
(:func:`post_order`: ``fully_shard`` must run on a module after every nested module it
should not manage), gives each its kwargs, checked before anything is wrapped
(:func:`kwargs_by_group`), and shards them, the root last (:func:`shard_groups`).
"""

from __future__ import annotations

import itertools
import logging
import sys
from collections.abc import Callable, Mapping
from typing import Any

import networkx as nx
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard

from execwrap.fsdp.offload import check_offload
from execwrap.fsdp.precision import check_mixed_precision
from execwrap.fsdp.shardable import check_uniform_dtype
from execwrap.plan.wrap_plan import WrapPlan
from tracing.fqn import ancestors, join_fqn

__all__ = ["kwargs_by_group", "plan_groups", "post_order", "shard_groups"]

logger = logging.getLogger("execwrap.fsdp.fsdp2")  # one logger for what apply_fully_shard does


def kwargs_by_group(
    model: nn.Module,
    groups: list[list[str]],
    mesh: DeviceMesh | None,
    fully_shard_kwargs: dict[str, Any],
    reshard: dict[tuple[str, ...], bool],
    group_kwargs: Callable[[list[str]], Mapping[str, Any]] | None,
    plan: WrapPlan,
) -> list[tuple[list[str], dict[str, Any]]]:
    """Each group, in post-order then the root, with its ``fully_shard`` kwargs:
    ``fully_shard_kwargs``, then the plan's ``reshard_after_forward`` for that group
    (``reshard``; the root's entry taken literally, as the simulator does), then
    ``group_kwargs(fqns)`` over both. All checked before anything is wrapped: a group
    whose trainable parameters (the plan's unit's) mix dtypes without
    an ``mp_policy`` that casts them, and a group's own ``mp_policy`` /
    ``offload_policy`` FSDP2 would refuse."""

    def kwargs_for(fqns: list[str]) -> dict[str, Any]:
        kwargs = dict(fully_shard_kwargs)
        if tuple(fqns) in reshard:
            kwargs["reshard_after_forward"] = reshard[tuple(fqns)]
        if group_kwargs is not None:
            kwargs.update(group_kwargs(list(fqns)))
        return kwargs

    params = {tuple(u.module_fqns): u.param_fqns for u in plan.units}
    ordered = [*post_order(model, groups), [""]]
    result = [(fqns, kwargs_for(fqns)) for fqns in ordered]
    for fqns, kwargs in result:
        check_uniform_dtype(model, fqns, params.get(tuple(fqns), ()), kwargs)
        check_mixed_precision(kwargs.get("mp_policy"))
        check_offload(kwargs.get("offload_policy"), mesh=mesh)
    return result


def shard_groups(
    model: nn.Module,
    sharding: list[tuple[list[str], dict[str, Any]]],
    mesh: DeviceMesh | None,
) -> None:
    """``fully_shard`` each group with its kwargs (:func:`kwargs_by_group`), the root last."""
    for fqns, kwargs in sharding[:-1]:
        modules = [model.get_submodule(f) for f in fqns]
        target: nn.Module | list[nn.Module] = modules[0] if len(modules) == 1 else modules
        logger.debug(
            "fully_shard(%s, reshard_after_forward=%s)", fqns, kwargs.get("reshard_after_forward")
        )
        try:
            fully_shard(target, mesh=mesh, **kwargs)
        except Exception as e:
            if sys.version_info >= (3, 11):
                e.add_note(f"While applying fully_shard to plan group {fqns}")
            logger.debug("fully_shard(%s) failed", fqns)
            raise
    fully_shard(model, mesh=mesh, **sharding[-1][1])


def plan_groups(model: nn.Module, plan: WrapPlan) -> list[list[str]]:
    """The plan's non-root groups, with every FQN checked against ``model``."""
    names = dict(model.named_modules())
    groups: list[list[str]] = []
    for unit in plan.units:
        fqns = list(unit.module_fqns)
        for fqn in fqns:
            if fqn not in names:
                raise ValueError(
                    f"apply_fully_shard: the plan names module {fqn!r}, which "
                    f"{type(model).__name__} does not have; was the plan made for another "
                    "model? Plan this model again."
                )
        if "" in fqns:
            if len(fqns) > 1:
                raise ValueError(
                    f"apply_fully_shard: the plan groups the root module with {fqns[1:]}; "
                    "the root must be a group of its own"
                )
            continue
        groups.append(fqns)
    return groups


def post_order(model: nn.Module, groups: list[list[str]]) -> list[list[str]]:
    """Groups in an order where each comes after every group nested in its modules.

    ``fully_shard`` must run on a module after every nested module it should
    not manage. A group's modules may enclose members of several other groups
    (with bucketing, ``[blocks.0.ln2, blocks.0.mlp]`` encloses the group
    holding ``blocks.0.mlp.fc``), so this is a topological sort of "is
    enclosed by" between groups (``networkx.lexicographical_topological_sort``),
    ties broken by the largest post-order index of the group's modules (plain
    post-order when every group is one module).

    Raises:
        ValueError: two groups enclose each other's modules (no valid order).
    """
    index: dict[str, int] = {}

    def visit(module: nn.Module, prefix: str) -> None:
        for name, child in module.named_children():
            fqn = join_fqn(prefix, name)
            if fqn not in index:
                visit(child, fqn)
        index.setdefault(prefix, len(index))

    visit(model, "")

    group_of = {fqn: i for i, fqns in enumerate(groups) for fqn in fqns}
    graph = nx.DiGraph()
    graph.add_nodes_from(range(len(groups)))
    for i, fqns in enumerate(groups):
        for fqn in fqns:
            # every group owning a module that encloses ``fqn`` comes after group i
            for parent in itertools.islice(ancestors(fqn), 1, None):
                j = group_of.get(parent)
                if j is not None and j != i:
                    graph.add_edge(i, j)
    key = [max(index[f] for f in g) for g in groups]
    try:
        return [groups[i] for i in nx.lexicographical_topological_sort(graph, key=key.__getitem__)]
    except nx.NetworkXUnfeasible:
        stuck = sorted({i for cycle in nx.simple_cycles(graph) for i in cycle})
        raise ValueError(
            f"apply_fully_shard: groups {[groups[i] for i in stuck]} enclose each other's "
            "modules, so no fully_shard order is bottom-up for all of them; plan with a "
            "smaller bucket_numel or without bucketing"
        ) from None
