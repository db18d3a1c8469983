"""Compare execution orders across ranks (the cause of FSDP collective hangs).

FSDP issues one all-gather per unit in the order the units run. When two
ranks run their modules in different orders (a data-dependent branch, a
rank-dependent ``if``), their collectives pair up wrongly: the step hangs
until the process group times out, or worse, mixes parameters of different
units. :func:`check_order_across_ranks` finds that before the first step.

Ranks whose models differ in a parameter's shape, dtype or ``requires_grad``
(a width read from a rank-local config, a dtype cast on one rank) run the same
modules in the same order, and FSDP's first all-gather then pairs buffers of
different sizes: gloo aborts ("Received data size doesn't match expected
size"), NCCL hangs or reads garbage. So the check compares the parameter
table too: each parameter's FQN, shape, numel, dtype and ``requires_grad``,
in ``named_parameters()`` order, from the model when it is given (else from
``order.params``).

Algorithm: every rank hashes its order and its parameter table (SHA-256 over
their JSON, :func:`order_fingerprint`) and the hashes are exchanged with one
``all_gather_object``. Only when they differ is a second ``all_gather_object``
of the full orders and tables made, on every rank (each rank sees every hash,
so all ranks take the same branch and the same collectives), to name, each
rank against the lowest rank, first the parameter that differs (one that only
one rank has, by FQN, else a shape, dtype or ``requires_grad``: a missing
parameter also shifts the parameter order, and naming it says what to fix),
else the first divergent call (:func:`execwrap.order.graph.first_divergence`). Both
collectives run under the process group's own timeout, so a rank that never
arrives fails the call instead of hanging it forever.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh

from execwrap.distributed.status import describe_error, raise_failures
from execwrap.errors import OrderDivergenceError, ParamMismatchError, PlanError
from execwrap.order.divergence import Divergence, first_divergence
from tracing.order import ExecutionOrder, ParamInfo, param_infos

if TYPE_CHECKING:
    from execwrap.plan.wrap_plan import WrapPlan

__all__ = [
    "check_order_across_ranks",
    "check_plan_across_ranks",
    "check_plan_before_sharding",
    "order_fingerprint",
    "param_table",
]

logger = logging.getLogger(__name__)

#: Calls of context shown on each side of a divergence in error messages.
_CONTEXT = 3
#: The step named when a rank fails to build its part of the order check.
_PHASE = "the cross-rank order check (building its order digest and parameter table)"

#: One parameter as the ranks compare it: ``(FQN, shape, numel, dtype, requires_grad)``.
ParamEntry = tuple[str, tuple[int, ...], int, str, bool]

#: One rank's ``(global rank, module_forward_order, param_forward_order, parameter table)``.
_RankOrder = tuple[int, list[str], list[str], list[ParamEntry]]


def param_table(
    order: ExecutionOrder, model: nn.Module | None = None, *, compare_params: bool = True
) -> list[ParamEntry]:
    """The parameters that decide FSDP's buffers, in ``named_parameters()`` order.

    Args:
        order: its ``params`` are used when ``model`` is ``None``.
        model: the unwrapped model on this rank (what FSDP will shard).
        compare_params: ``False``: an empty table (nothing to compare).

    Returns:
        ``(FQN, shape, numel, dtype, requires_grad)`` per canonical parameter.
    """
    if not compare_params:
        return []
    infos: dict[str, ParamInfo] = param_infos(model) if model is not None else order.params
    return [
        (fqn, tuple(info.shape), info.numel, info.dtype, info.requires_grad)
        for fqn, info in infos.items()
    ]


def order_fingerprint(
    order: ExecutionOrder, *, model: nn.Module | None = None, compare_params: bool = True
) -> str:
    """A SHA-256 hex digest of what decides collectives: the order and the parameters.

    Covers ``module_forward_order`` (every call, repeats kept),
    ``param_forward_order`` and the :func:`param_table` (of ``model`` when
    given); not capture metadata (method, torch version), which may differ
    between ranks without harm.

    Args:
        order: the order to hash.
        model: this rank's unwrapped model, for the parameter table.
        compare_params: ``False`` leaves the parameter table out.

    Returns:
        64 hex characters; equal orders and tables give equal digests.

    Example:
        >>> a = ExecutionOrder(module_forward_order=["", "fc"])
        >>> order_fingerprint(a) == order_fingerprint(ExecutionOrder(module_forward_order=["", "fc"]))
        True
    """
    return _digest(order, param_table(order, model, compare_params=compare_params))


def _digest(order: ExecutionOrder, table: list[ParamEntry]) -> str:
    """:func:`order_fingerprint` given the parameter table already built."""
    payload = json.dumps(
        [list(order.module_forward_order), list(order.param_forward_order), table],
        separators=(",", ":"),
    )
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()


def _context(divergence: Divergence, side: tuple[str, ...]) -> str:
    start = max(0, divergence.index - _CONTEXT)
    parts = [
        f"[{start + k}] {fqn!r}" + (" <--" if start + k == divergence.index else "")
        for k, fqn in enumerate(side)
    ]
    if start + len(side) <= divergence.index:
        parts.append(f"[{divergence.index}] <end of order> <--")
    return ", ".join(parts)


def check_order_across_ranks(
    order: ExecutionOrder,
    group: dist.ProcessGroup | None = None,
    *,
    model: nn.Module | None = None,
    compare_params: bool = True,
) -> None:
    """Check that every rank of ``group`` captured the same execution order
    and holds the same parameters.

    Collective: every rank of ``group`` must call it (with its own order).
    Compares the parameter table first (:func:`param_table`: the FQNs one
    rank has and another lacks, then each parameter's shape, numel, dtype and
    ``requires_grad``), then ``module_forward_order``, then
    ``param_forward_order``. Without an initialised process group,
    or with a group of one rank, there is nothing to compare and it returns at
    once.

    Args:
        order: this rank's order.
        group: the process group (default: the default group, ``WORLD``).
        model: this rank's unwrapped model: its parameters are compared (else
            ``order.params``, which capture took from the model).
        compare_params: ``False`` compares the orders only: for an order
            recorded after wrapping, whose parameter sizes are each rank's
            shards (the model was compared before wrapping).

    Raises:
        OrderDivergenceError: on every rank when any two ranks differ. Its
            ``ranks`` are ``(reference rank, first differing rank)`` as global
            ranks (the reference is the lowest rank), ``index`` is the first
            divergent call index in ``module_forward_order`` (or in
            ``param_forward_order`` when only that differs), ``expected`` /
            ``found`` the module (parameter) FQNs on each side, ``None`` where
            an order ended early. A :class:`ParamMismatchError` (a subclass)
            when the parameters differ: a parameter only one rank has (the
            message names it and the rank that has it; ``expected`` or
            ``found`` is ``None`` on the side that lacks it; ``index`` is its
            position in ``named_parameters()`` order on the rank that has it),
            else the first parameter whose shape, dtype or ``requires_grad``
            differs (named with both ranks' values).
        RankFailure: on every other rank, when one rank cannot build its
            digest (its parameter table raised), naming that rank and its
            exception; that rank raises its own exception.
        RuntimeError: from ``torch.distributed`` when a rank does not take
            part before the process group's timeout (it never hangs longer).

    Example:
        >>> # on every rank, after capturing `order`:
        >>> check_order_across_ranks(order)  # doctest: +SKIP
    """
    if not (dist.is_available() and dist.is_initialized()):
        logger.debug("check_order_across_ranks: no process group; nothing to compare")
        return
    world = dist.get_world_size(group)
    if world == 1:
        return
    my_rank = dist.get_rank()  # global rank, for messages
    error: Exception | None = None
    try:
        table = param_table(order, model, compare_params=compare_params)
        digest = _digest(order, table)  # = order_fingerprint(order, model=model, ...), one walk
    except Exception as e:  # sent with the digests, so that every rank names this one
        error, table, digest = e, [], ""
    digests: list[tuple[int, str, str | None] | None] = [None] * world
    status = (my_rank, digest, None if error is None else describe_error(error))
    dist.all_gather_object(digests, status, group=group)
    got = [d for d in digests if d is not None]
    failures = tuple(sorted((r, text) for r, _, text in got if text))
    raise_failures(_PHASE, failures, error)
    if len({d for _, d, _ in got}) == 1:
        logger.debug("check_order_across_ranks: %d ranks agree (%s)", world, digest[:12])
        return
    # Orders differ: every rank saw it, so every rank gathers the full orders.
    full: list[_RankOrder | None] = [None] * world
    mine = (my_rank, list(order.module_forward_order), list(order.param_forward_order), table)
    dist.all_gather_object(full, mine, group=group)
    _raise_first_divergence(sorted((e for e in full if e is not None), key=lambda e: e[0]))


def _raise_first_divergence(entries: list[_RankOrder]) -> None:
    """Raise :class:`OrderDivergenceError` for the first rank (by rank) whose
    order differs from the lowest rank's; return if none does."""
    ref_rank, ref_modules, ref_params, ref_table = entries[0]
    differing = sorted(r for r, *rest in entries if rest != [ref_modules, ref_params, ref_table])
    for other_rank, modules, params, table in entries[1:]:
        # The parameters first: a parameter one rank lacks also shifts the
        # parameter order, and naming the parameter tells the user what to fix.
        if table != ref_table:
            raise _param_mismatch(ref_rank, ref_table, other_rank, table, differing)
        what = "module"
        divergence = first_divergence(ref_modules, modules, context=_CONTEXT)
        if divergence is None:
            what = "parameter"
            divergence = first_divergence(ref_params, params, context=_CONTEXT)
        if divergence is None:
            continue  # equal lists cannot have different digests; be safe
        raise OrderDivergenceError(
            _message(divergence, what, ref_rank, other_rank, differing),
            ranks=(ref_rank, other_rank),
            index=divergence.index,
            expected=divergence.expected,
            found=divergence.found,
        )


def _message(
    divergence: Divergence, what: str, ref_rank: int, other_rank: int, differing: list[int]
) -> str:
    """The error message: where the ranks part, with context, and how to fix it."""
    index, expected, found = divergence.index, divergence.expected, divergence.found
    kind = "forward call" if what == "module" else "first parameter use"
    return (
        f"Ranks {ref_rank} and {other_rank} executed the model in different orders "
        f"(ranks differing from rank {ref_rank}: {differing}). First divergence at "
        f"{kind} {index}: rank {ref_rank} ran {what} {expected!r}, rank {other_rank} "
        f"ran {what} {found!r}.\n"
        f"  rank {ref_rank}: {_context(divergence, divergence.context_a)}\n"
        f"  rank {other_rank}: {_context(divergence, divergence.context_b)}\n"
        "FSDP all-gathers each unit when it runs, so these ranks would issue "
        "mismatched collectives and hang (or mix parameters). Fix: make control "
        "flow the same on every rank (branch on values all ranks share, e.g. after "
        "an all_reduce), give every rank inputs that take the same path, or capture "
        "the order symbolically with a TracingConfig whose concrete_args fix the branch."
    )


def _describe(entry: ParamEntry) -> str:
    fqn, shape, numel, dtype, requires_grad = entry
    elements = f"{numel} element{'' if numel == 1 else 's'}"
    return f"{fqn!r} of shape {shape} ({elements}), {dtype}, requires_grad={requires_grad}"


def _param_mismatch(
    ref_rank: int,
    ref_table: list[ParamEntry],
    other_rank: int,
    table: list[ParamEntry],
    differing: list[int],
) -> ParamMismatchError:
    """The error naming the first parameter the two tables disagree on: one
    that only one rank has (the reference rank's first missing one, else the
    other rank's first extra one), else the first (in the reference rank's
    order) whose shape, numel, dtype or ``requires_grad`` differs, else the
    first position where the two orders of the same parameters part."""
    by_name = {e[0]: e for e in table}
    ref_by_name = {e[0]: e for e in ref_table}
    head = (
        f"Ranks {ref_rank} and {other_rank} hold different parameters (ranks differing from "
        f"rank {ref_rank}: {differing}). "
    )
    lacking = [(i, e, ref_rank, other_rank) for i, e in enumerate(ref_table) if e[0] not in by_name]
    lacking += [
        (i, e, other_rank, ref_rank) for i, e in enumerate(table) if e[0] not in ref_by_name
    ]
    if lacking:
        index, entry, has, lacks = lacking[0]
        counts = (
            f"rank {ref_rank} has {len(ref_table)} parameters, rank {other_rank} has {len(table)}"
        )
        message = (
            f"{head}Parameter {_describe(entry)} (parameter {index} in named_parameters() order "
            f"on rank {has}) is on rank {has} but not on rank {lacks} ({counts}).\n"
        )
        a = entry if has == ref_rank else None
        b = entry if has == other_rank else None
    else:
        index = next(
            (i for i, e in enumerate(ref_table) if by_name[e[0]] != e),
            next(i for i, (x, y) in enumerate(zip(ref_table, table, strict=True)) if x != y),
        )
        a = ref_table[index]
        b = by_name[a[0]] if by_name[a[0]] != a else table[index]
        message = (
            f"{head}First difference at parameter {index} in named_parameters() order: rank "
            f"{ref_rank} has {_describe(a)}, rank {other_rank} has {_describe(b)}.\n"
        )
    message += (
        "FSDP flattens, shards and all-gathers each unit's parameters by shape and dtype on "
        "every rank, so these ranks would exchange buffers of different sizes and fail (gloo: "
        '"Received data size doesn\'t match expected size") or hang. Fix: build the same model '
        "on every rank (the same config, widths, dtype, bias and frozen parameters) before "
        "wrapping."
    )
    return ParamMismatchError(
        message,
        ranks=(ref_rank, other_rank),
        index=index,
        expected=None if a is None else a[0],
        found=None if b is None else b[0],
        expected_param=None if a is None else (a[1], a[3], a[4]),
        found_param=None if b is None else (b[1], b[3], b[4]),
    )


#: What :func:`check_plan_across_ranks` compares, per rank: ``(global rank, groups,
#: prefetch, per-group reshard_after_forward or None, the kwargs' reshard_after_forward)``.
_RankPlan = tuple[int, list[list[str]], int, list[bool] | None, str]


def check_plan_across_ranks(
    groups: list[list[str]],
    prefetch: int,
    reshard: list[bool] | None,
    group: dist.ProcessGroup | None = None,
    *,
    reshard_kwarg: object = None,
) -> None:
    """Check that every rank is about to apply the same FSDP2 groups, prefetch depth
    and ``reshard_after_forward`` choices.

    Collective: every rank of ``group`` calls it, with one ``all_gather_object``
    of the (small) plan description. Ranks that apply different groups or prefetch
    lists issue their all-gathers in different orders and sizes: the first step
    hangs until the process group's timeout or aborts in gloo. An auto plan
    depends on each rank's own timings and budget, so ranks that planned apart
    can disagree. Without an initialised process group, or with one rank,
    it returns at once.

    Args:
        groups: the ``fully_shard`` groups (module FQNs), root included.
        prefetch: the explicit prefetch depth.
        reshard: per group, the plan's ``reshard_after_forward`` (``None``: none).
        group: the process group (default: ``WORLD``).
        reshard_kwarg: a ``reshard_after_forward`` passed for every group.

    Raises:
        PlanError: on every rank, naming the lowest rank whose plan differs from
            the lowest rank's, the first thing that differs and how to fix it.

    Example:
        >>> check_plan_across_ranks([[""], ["blocks.0"]], 1, None)  # no process group: no-op
    """
    if not (dist.is_available() and dist.is_initialized()):
        return
    world = dist.get_world_size(group)
    if world == 1:
        return
    mine: _RankPlan = (dist.get_rank(), groups, prefetch, reshard, repr(reshard_kwarg))
    gathered: list[_RankPlan | None] = [None] * world
    dist.all_gather_object(gathered, mine, group=group)
    entries = sorted((e for e in gathered if e is not None), key=lambda e: e[0])
    ref = entries[0]
    for other in entries[1:]:
        if other[1:] != ref[1:]:
            raise PlanError(
                f"apply_fully_shard: rank {other[0]} would apply another plan than rank "
                f"{ref[0]}: {_plan_difference(ref, other)}; FSDP2 would pair the ranks' "
                "collectives wrongly and hang. Plan on one rank and send it to the others "
                "(torch.distributed.broadcast_object_list([plan], src=0)), or give every rank "
                "the same order, memory_budget and cost model"
            )
    logger.debug("check_plan_across_ranks: %d ranks agree", world)


def _plan_difference(ref: _RankPlan, other: _RankPlan) -> str:
    """The first difference between two ranks' plans, in words."""
    a, b = ref[0], other[0]
    ga, gb = ref[1], other[1]
    if ga != gb:
        if len(ga) != len(gb):
            head = f"{len(ga)} groups on rank {a}, {len(gb)} on rank {b}"
        else:
            head = f"{len(ga)} groups on both"
        i = next((i for i, (x, y) in enumerate(zip(ga, gb, strict=False)) if x != y), None)
        if i is None:
            return head
        return f"{head}; group {i} is {ga[i]} on rank {a} and {gb[i]} on rank {b}"
    if ref[2] != other[2]:
        return f"prefetch is {ref[2]} on rank {a} and {other[2]} on rank {b}"
    ra, rb = ref[3], other[3]
    if ra != rb:
        if ra is None or rb is None:
            return f"per-group reshard_after_forward on rank {a if ra is not None else b} only"
        i = next(i for i, (x, y) in enumerate(zip(ra, rb, strict=True)) if x != y)
        return (
            f"reshard_after_forward of group {ga[i]} is {ra[i]} on rank {a} and {rb[i]} on rank {b}"
        )
    return f"reshard_after_forward={ref[4]} on rank {a} and {other[4]} on rank {b}"


def check_plan_before_sharding(
    plan: WrapPlan,
    prefetch: int,
    reshard: Mapping[tuple[str, ...], bool],
    mesh: DeviceMesh | None,
    fully_shard_kwargs: Mapping[str, Any],
) -> None:
    """``apply_fully_shard``'s checks before wrapping: one WARNING for an auto plan made
    for another world size, then :func:`check_plan_across_ranks` over the mesh's group
    (``reshard``: group -> the plan's ``reshard_after_forward`` as applied, empty when
    the plan's per-group flags are not used)."""
    _warn_if_planned_for_other_ranks(plan, mesh)
    spans, group = check_group(mesh)
    if not spans:
        logger.debug("apply_fully_shard: an n-D mesh over part of the world; ranks not compared")
        return
    check_plan_across_ranks(
        [list(u.module_fqns) for u in plan.units],
        prefetch,
        list(plan.reshard_after_forward or ()) if reshard else None,
        group,
        reshard_kwarg=fully_shard_kwargs.get("reshard_after_forward"),
    )


def check_group(mesh: DeviceMesh | None) -> tuple[bool, dist.ProcessGroup | None]:
    """``(compare?, group)``: the ranks that must apply the same plan: a 1-D mesh's
    group, the default group for no mesh or an n-D mesh over the whole world; an
    n-D mesh over part of it (one pipeline stage's) is not compared."""
    if mesh is None:
        return True, None
    if mesh.ndim == 1:
        return True, mesh.get_group()
    whole = dist.is_available() and dist.is_initialized() and mesh.size() == dist.get_world_size()
    return whole, None


def _warn_if_planned_for_other_ranks(plan: WrapPlan, mesh: DeviceMesh | None) -> None:
    """One WARNING when an auto plan's world size is not the mesh's (or the world's)."""
    if plan.estimate is None:
        return
    if mesh is not None and plan.mesh is None:
        ranks = mesh.size()
    elif dist.is_available() and dist.is_initialized():
        ranks = dist.get_world_size()
    else:
        ranks = 1
    if plan.estimate.world_size != ranks:
        logger.warning(
            "apply_fully_shard: the plan was made for %d ranks and is applied on %d; its "
            "grouping, prefetch, resharding and memory were chosen for %d. Plan again with "
            "world_size=%d (and a cost model for these ranks)",
            plan.estimate.world_size,
            ranks,
            plan.estimate.world_size,
            ranks,
        )
