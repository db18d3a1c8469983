"""Compare execution orders across ranks (the cause of FSDP collective hangs).

FSDP issues one all-gather per unit in the order the units run. When two
ranks run their modules in different orders (a data-dependent branch, a
rank-dependent ``if``), their collectives pair up wrongly: the step hangs
until the process group times out, or worse, mixes parameters of different
units. :func:`check_order_across_ranks` finds that before the first step.

Algorithm: every rank hashes its order (SHA-256 over the JSON of
``module_forward_order`` and ``param_forward_order``) and the hashes are
exchanged with one ``all_gather_object``. Only when they differ is a second
``all_gather_object`` of the full orders made, on every rank (each rank sees
every hash, so all ranks take the same branch and the same collectives), to
name the first divergent call (:func:`execwrap.graph.first_divergence`, each
rank against the lowest rank). Both collectives run under the process group's
own timeout, so a rank that never arrives fails the call instead of hanging
it forever.
"""

from __future__ import annotations

import hashlib
import json
import logging

import torch.distributed as dist

from execwrap.divergence import Divergence, first_divergence
from execwrap.errors import OrderDivergenceError
from tracing.order import ExecutionOrder

__all__ = ["check_order_across_ranks", "order_fingerprint"]

logger = logging.getLogger(__name__)

#: Calls of context shown on each side of a divergence in error messages.
_CONTEXT = 3

#: One rank's ``(global rank, module_forward_order, param_forward_order)``.
_RankOrder = tuple[int, list[str], list[str]]


def order_fingerprint(order: ExecutionOrder) -> str:
    """A SHA-256 hex digest of the parts of ``order`` that decide collectives.

    Covers ``module_forward_order`` (every call, repeats kept) and
    ``param_forward_order``; not capture metadata (method, torch version),
    which may differ between ranks without harm.

    Args:
        order: the order to hash.

    Returns:
        64 hex characters; equal orders give equal digests.

    Example:
        >>> a = ExecutionOrder(module_forward_order=["", "fc"])
        >>> order_fingerprint(a) == order_fingerprint(ExecutionOrder(module_forward_order=["", "fc"]))
        True
    """
    payload = json.dumps(
        [list(order.module_forward_order), list(order.param_forward_order)],
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


def check_order_across_ranks(order: ExecutionOrder, group: dist.ProcessGroup | None = None) -> None:
    """Check that every rank of ``group`` captured the same execution order.

    Collective: every rank of ``group`` must call it (with its own order).
    Compares ``module_forward_order`` first, then ``param_forward_order``.
    Without an initialised process group, or with a group of one rank, there
    is nothing to compare and it returns at once.

    Args:
        order: this rank's order.
        group: the process group (default: the default group, ``WORLD``).

    Raises:
        OrderDivergenceError: on every rank when any two ranks differ. Its
            ``ranks`` are ``(reference rank, first differing rank)`` as global
            ranks (the reference is the lowest rank), ``index`` is the first
            divergent call index in ``module_forward_order`` (or in
            ``param_forward_order`` when only that differs), ``expected`` /
            ``found`` the module (parameter) FQNs on each side, ``None`` where
            an order ended early.
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
    digest = order_fingerprint(order)
    digests: list[tuple[int, str] | None] = [None] * world
    dist.all_gather_object(digests, (my_rank, digest), group=group)
    got = [d for d in digests if d is not None]
    if len({d for _, d in got}) == 1:
        logger.debug("check_order_across_ranks: %d ranks agree (%s)", world, digest[:12])
        return
    # Orders differ: every rank saw it, so every rank gathers the full orders.
    full: list[_RankOrder | None] = [None] * world
    dist.all_gather_object(
        full,
        (my_rank, list(order.module_forward_order), list(order.param_forward_order)),
        group=group,
    )
    _raise_first_divergence(sorted((e for e in full if e is not None), key=lambda e: e[0]))


def _raise_first_divergence(entries: list[_RankOrder]) -> None:
    """Raise :class:`OrderDivergenceError` for the first rank (by rank) whose
    order differs from the lowest rank's; return if none does."""
    ref_rank, ref_modules, ref_params = entries[0]
    for other_rank, modules, params in entries[1:]:
        what = "module"
        divergence = first_divergence(ref_modules, modules, context=_CONTEXT)
        if divergence is None:
            what = "parameter"
            divergence = first_divergence(ref_params, params, context=_CONTEXT)
        if divergence is None:
            continue  # equal lists cannot have different digests; be safe
        differing = sorted(r for r, m, p in entries if (m, p) != (ref_modules, ref_params))
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
