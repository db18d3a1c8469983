"""Order drift: check later iterations against the captured execution order.

A plan is only as good as the order it came from. If a later iteration calls
modules in another order (a data-dependent branch, a routed expert, a
different sequence length bucket), the plan's grouping and prefetching no
longer match what runs, and on several ranks a different order can hang
collectives. :class:`OrderMonitor` watches every forward of the model at low
cost and warns once when the order changes.
"""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn

from tracing.fqn import clean_fqn
from tracing.order import ExecutionOrder

__all__ = ["DriftEvent", "OrderMonitor", "Phase"]

logger = logging.getLogger(__name__)

# Polynomial rolling hash over module ids (Rabin-Karp): h' = (h * BASE + id) mod MOD.
# MOD is the Mersenne prime 2**61 - 1, so collisions are ~1e-18 per comparison.
_MOD = (1 << 61) - 1
_BASE = 1_000_003


class Phase(enum.Enum):
    """Kind of forward pass: training (grad enabled and ``model.training``) or eval."""

    TRAIN = "train"
    EVAL = "eval"


@dataclass(frozen=True)
class DriftEvent:
    """One change of order seen by :class:`OrderMonitor`.

    Attributes:
        iteration: 0-based count of the model's root forward calls.
        phase: ``"train"`` or ``"eval"``.
        index: position of the first divergent call within that forward.
        expected: module FQN the reference order has there (``None``: the
            reference ended, the iteration made extra calls).
        found: module FQN actually called (``None``: the iteration ended early).
    """

    iteration: int
    phase: str
    index: int
    expected: str | None
    found: str | None

    def describe(self) -> str:
        """A human sentence naming the iteration, phase and divergent call."""
        exp = "<end of order>" if self.expected is None else repr(self.expected)
        fnd = "<end of forward>" if self.found is None else repr(self.found)
        return (
            f"execution order drift at iteration {self.iteration} ({self.phase} forward): "
            f"call {self.index} expected module {exp}, found {fnd}"
        )


class _Reference:
    """Prefix hashes of one reference sequence of module ids."""

    def __init__(self, ids: list[int], fqns: list[str]) -> None:
        self.fqns = fqns
        self.prefix = [0] * (len(ids) + 1)
        h = 0
        for i, mid in enumerate(ids):
            h = (h * _BASE + mid) % _MOD
            self.prefix[i + 1] = h


class OrderMonitor:
    """Check each forward of ``model`` against a captured order, cheaply.

    One forward pre-hook per module updates a rolling hash of the calls so
    far and compares it with the reference's prefix hash at the same position:
    O(1) work and no list copy per call. On the first deviation in a forward,
    one WARNING names the iteration, the phase and the first divergent call
    (expected vs found); the same deviation in later iterations stays quiet
    until the order changes again (another deviation, or back to the
    reference, which is logged at INFO only). Every WARNING's drift is kept
    in :attr:`events`; the return to the reference is not an event.

    Eval passes (``torch.no_grad()`` or ``model.eval()``) are their own phase:
    the first one becomes the eval reference and is never reported as drift
    against the training order.

    Args:
        model: the model whose ``order`` was captured (wrapped by FSDP or not:
            FQNs are compared without wrapper prefixes).
        order: the reference order; its ``module_forward_order`` is compared.

    Attributes:
        events: the drift of every WARNING so far, in order.
        iterations: forwards finished since monitoring began (an event during
            the first forward has iteration 0).

    Raises:
        ValueError: ``order`` has no module calls.

    Example:
        >>> monitor = OrderMonitor(model, order)   # doctest: +SKIP
        >>> for batch in data: train_step(model, batch)   # doctest: +SKIP
        >>> monitor.events, monitor.remove()   # doctest: +SKIP
    """

    def __init__(self, model: nn.Module, order: ExecutionOrder) -> None:
        if not order.module_forward_order:
            raise ValueError(
                "OrderMonitor needs an order with module calls; "
                "capture one with tracing.capture_execution_order first"
            )
        self.events: list[DriftEvent] = []
        self.iterations = 0
        self._model = model
        self._fqn_to_id: dict[str, int] = {}
        self._handles: list[torch.utils.hooks.RemovableHandle] = []
        self._refs: dict[Phase, _Reference] = {
            Phase.TRAIN: self._reference(order.module_forward_order)
        }
        self._eval_calls: list[str] | None = None
        # per-forward state
        self._phase = Phase.TRAIN
        self._ref: _Reference | None = None
        self._hash = 0
        self._pos = 0
        self._diverged = False
        self._last_event: dict[Phase, tuple[int, str | None, str | None] | None] = {
            Phase.TRAIN: None,
            Phase.EVAL: None,
        }
        # A wrapper (FSDP1, checkpoint wrapper) and the module it wraps clean to
        # the same FQN; hook only the innermost (named_modules lists it last).
        by_name: dict[str, nn.Module] = {}
        for fqn, module in model.named_modules():
            by_name[clean_fqn(fqn)] = module
        for name, module in by_name.items():
            mid = self._id(name)
            if name == "":
                self._handles.append(module.register_forward_pre_hook(self._root_pre_hook))
                self._handles.append(module.register_forward_hook(self._root_post_hook))
            else:
                self._handles.append(module.register_forward_pre_hook(self._make_hook(mid, name)))

    # ---------------------------------------------------------------- public
    def remove(self) -> None:
        """Remove every hook the monitor installed (idempotent)."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def __enter__(self) -> OrderMonitor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()

    # --------------------------------------------------------------- helpers
    def _id(self, fqn: str) -> int:
        return self._fqn_to_id.setdefault(fqn, len(self._fqn_to_id) + 1)

    def _reference(self, fqns: list[str]) -> _Reference:
        return _Reference([self._id(clean_fqn(f)) for f in fqns], [clean_fqn(f) for f in fqns])

    def _make_hook(self, mid: int, fqn: str) -> Any:
        def hook(module: nn.Module, args: Any) -> None:
            self._step(mid, fqn)

        return hook

    def _step(self, mid: int, fqn: str) -> None:
        if self._eval_calls is not None:
            self._eval_calls.append(fqn)
            return
        pos = self._pos
        self._pos = pos + 1
        if self._diverged or self._ref is None:
            return
        self._hash = (self._hash * _BASE + mid) % _MOD
        prefix = self._ref.prefix
        if pos + 1 >= len(prefix) or prefix[pos + 1] != self._hash:
            expected = self._ref.fqns[pos] if pos < len(self._ref.fqns) else None
            self._diverge(pos, expected, fqn)

    def _diverge(self, index: int, expected: str | None, found: str | None) -> None:
        self._diverged = True
        key = (index, expected, found)
        if self._last_event[self._phase] == key:
            return
        self._last_event[self._phase] = key
        event = DriftEvent(self.iterations, self._phase.value, index, expected, found)
        self.events.append(event)
        logger.warning("%s", event.describe())

    def _root_pre_hook(self, module: nn.Module, args: Any) -> None:
        training = module.training and torch.is_grad_enabled()
        self._phase = Phase.TRAIN if training else Phase.EVAL
        self._ref = self._refs.get(self._phase)
        self._eval_calls = [] if self._ref is None else None
        self._hash = (0 * _BASE + self._fqn_to_id[""]) % _MOD
        self._pos = 1
        self._diverged = False
        if self._ref is not None and (
            len(self._ref.prefix) < 2 or self._ref.prefix[1] != self._hash
        ):
            self._diverge(0, self._ref.fqns[0] if self._ref.fqns else None, "")

    def _root_post_hook(self, module: nn.Module, args: Any, output: Any) -> None:
        if self._eval_calls is not None:
            # First forward of this phase: it becomes the phase's reference.
            self._refs[self._phase] = self._reference(["", *self._eval_calls])
            logger.debug(
                "OrderMonitor: %s reference has %d calls",
                self._phase.value,
                len(self._eval_calls) + 1,
            )
            self._eval_calls = None
        elif self._ref is not None and not self._diverged:
            if self._pos < len(self._ref.fqns):
                self._diverge(self._pos, self._ref.fqns[self._pos], None)
            elif self._last_event[self._phase] is not None:
                logger.info(
                    "execution order back to the reference at iteration %d (%s forward)",
                    self.iterations,
                    self._phase.value,
                )
                self._last_event[self._phase] = None
        self.iterations += 1
