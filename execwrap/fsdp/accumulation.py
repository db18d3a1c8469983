"""Gradient accumulation over micro-batches of a sharded model: :func:`accumulate_gradients`.

One optimizer step over N micro-batches, each a forward and a backward, in one of two
ways (:data:`GRADIENT_SYNCS`):

* ``sync="every"``: FSDP reduce-scatters the gradients after every micro-batch's
  backward and adds them to the sharded gradients: N reduce-scatters per step, sharded
  gradient memory only (FSDP's default; nothing is set).
* ``sync="last"``: no reduction until the last micro-batch. FSDP2:
  ``set_requires_gradient_sync(False)`` before the others, ``True`` before the last
  (torch: "This can be used to implement gradient accumulation without communication
  ... the equivalence of ``no_sync`` in FSDP1"); the unsharded gradients are kept
  between micro-batches (in ``reduce_dtype`` under mixed precision), one
  reduce-scatter per step. FSDP1: the micro-batches but the last run inside
  ``no_sync()`` of each root.

With ``reshard_after_backward=False`` (FSDP2 only), the parameters all-gathered for a
micro-batch's backward stay unsharded until the next forward, which then needs no
all-gather (``set_reshard_after_backward(False)`` before all micro-batches but the last,
``True`` before the last, as torch's own accumulation test sets both flags:
``test/distributed/_composable/fsdp/test_fully_shard_training.py``,
``test_gradient_accumulation``): more memory, fewer all-gathers.

The flags are set before each micro-batch is handed out, so the forward and the
backward of that micro-batch must run inside the loop body, and are restored to FSDP's
defaults (sync, reshard) after the last one, also when the loop ends early.

The loss is the user's: FSDP averages gradients over ranks, not over micro-batches, so
divide each micro-batch's loss by N (or by the step's token count) to train like one
batch N times as large.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable, Iterator
from typing import Literal, TypeVar, get_args

import torch.nn as nn

__all__ = ["GRADIENT_SYNCS", "GradientSync", "accumulate_gradients"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: When the gradients are reduced across ranks: after every micro-batch, or after the last.
GradientSync = Literal["every", "last"]
#: The values of ``sync``: reduce after every micro-batch, or after the last.
GRADIENT_SYNCS: tuple[str, ...] = get_args(GradientSync)


def accumulate_gradients(
    model: nn.Module,
    micro_batches: Iterable[T],
    *,
    sync: GradientSync = "every",
    reshard_after_backward: bool = True,
) -> Iterator[T]:
    """Hand out the micro-batches of one optimizer step, FSDP's gradient sync set for each.

    Args:
        model: the sharded model: an FSDP2 model (``fully_shard`` /
            :func:`execwrap.apply_fully_shard`) or an FSDP1 ``FullyShardedDataParallel``,
            or a module holding one (e.g. a LightningModule); the flags are set on every
            outermost FSDP module in it.
        micro_batches: the step's micro-batches, any iterable (a list, a slice of a data
            loader); it is read one item ahead, to know which micro-batch is the last.
        sync: ``"every"`` (reduce-scatter after each micro-batch) or ``"last"`` (only
            after the last; FSDP2 ``set_requires_gradient_sync``, FSDP1 ``no_sync``).
        reshard_after_backward: ``False`` keeps the parameters unsharded from a
            micro-batch's backward to the next forward (FSDP2 only).

    Returns:
        An iterator over ``micro_batches``: run the forward and the backward of each in
        the loop body; call ``optimizer.step()`` after the loop.

    Raises:
        TypeError: ``model`` holds no FSDP module, or both FSDP1 and FSDP2 modules;
            ``sync`` is not a str; ``reshard_after_backward`` is not a bool.
        ValueError: ``sync`` is not one of :data:`GRADIENT_SYNCS`;
            ``reshard_after_backward=False`` with FSDP1 (it has no such setting);
            (on iteration) ``micro_batches`` is empty.

    Example:
        >>> for x, y in accumulate_gradients(model, zip(xs, ys), sync="last"):  # doctest: +SKIP
        ...     loss_fn(model(x), y).div(len(xs)).backward()
        >>> optimizer.step(); optimizer.zero_grad()  # doctest: +SKIP
    """
    if not isinstance(sync, str) or sync not in GRADIENT_SYNCS:
        raise ValueError(
            f"accumulate_gradients: sync={sync!r}; it must be 'every' (reduce-scatter after "
            "every micro-batch) or 'last' (only after the last micro-batch)"
        )
    if not isinstance(reshard_after_backward, bool):
        raise TypeError(
            "accumulate_gradients: reshard_after_backward must be True or False; got "
            f"{type(reshard_after_backward).__name__}"
        )
    api, roots = _fsdp_roots(model)
    if api == "FSDP" and not reshard_after_backward:
        raise ValueError(
            "accumulate_gradients: reshard_after_backward=False is FSDP2's "
            "set_reshard_after_backward; FSDP1 has no such setting (its no_sync() keeps the "
            "unsharded gradients, not the parameters). Leave it True with FSDP1"
        )
    return _micro_batches(api, roots, micro_batches, sync, reshard_after_backward)


def _micro_batches(
    api: str, roots: list[nn.Module], batches: Iterable[T], sync: str, reshard: bool
) -> Iterator[T]:
    it = iter(batches)
    try:
        current = next(it)
    except StopIteration:
        raise ValueError(
            "accumulate_gradients: micro_batches is empty; an optimizer step needs at least "
            "one micro-batch"
        ) from None
    index = 0
    try:
        while True:
            try:
                following = next(it)
                last = False
            except StopIteration:
                last = True
            with _settings(api, roots, sync=last or sync == "every", reshard=last or reshard):
                logger.debug("accumulate_gradients: micro-batch %d (last: %s)", index, last)
                yield current
            if last:
                return
            current, index = following, index + 1
    finally:
        if api == "fully_shard":
            _set_fsdp2(roots, sync=True, reshard=True)


@contextlib.contextmanager
def _settings(api: str, roots: list[nn.Module], *, sync: bool, reshard: bool) -> Iterator[None]:
    """FSDP's flags for one micro-batch: FSDP2's set now, FSDP1's ``no_sync`` entered."""
    if api == "fully_shard":
        _set_fsdp2(roots, sync=sync, reshard=reshard)
        yield
        return
    with contextlib.ExitStack() as stack:
        if not sync:
            for root in roots:
                stack.enter_context(root.no_sync())  # type: ignore[operator]
        yield


def _set_fsdp2(roots: list[nn.Module], *, sync: bool, reshard: bool) -> None:
    for root in roots:
        root.set_requires_gradient_sync(sync)  # type: ignore[operator]
        root.set_reshard_after_backward(reshard)  # type: ignore[operator]


def _fsdp_roots(model: nn.Module) -> tuple[str, list[nn.Module]]:
    """``("fully_shard" | "FSDP", the outermost FSDP modules of model)``."""
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    found: dict[str, list[nn.Module]] = {"fully_shard": [], "FSDP": []}

    def visit(module: nn.Module) -> None:
        kind = (
            "fully_shard"
            if isinstance(module, FSDPModule)
            else "FSDP"
            if isinstance(module, FSDP)
            else None
        )
        if kind is not None:
            found[kind].append(module)
            return
        for child in module.children():
            visit(child)

    visit(model)
    kinds = [k for k, v in found.items() if v]
    if len(kinds) != 1:
        what = "no FSDP module" if not kinds else "both FSDP1 and FSDP2 modules"
        raise TypeError(
            f"accumulate_gradients: {type(model).__name__} holds {what}; pass the model "
            "after apply_fully_shard / fully_shard (FSDP2) or FullyShardedDataParallel (FSDP1)"
        )
    return kinds[0], found[kinds[0]]
