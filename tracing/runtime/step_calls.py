"""The calls of the step: recorded calls in another mode than training are kept out.

A recording can see more than the training step it is meant to capture: a
``generate`` loop run under ``torch.no_grad()``, or an evaluation pass
(``model.eval()``) made inside the recorded function or the recorded first
step. Their calls are not part of the step FSDP will run each iteration, and
merged into the order they would repeat the modules, shift first uses and
skew the timing the planner reads.

A *top-level* call is a recorded forward call that no other recorded call
encloses; it and the calls it makes form one tree. Its mode is taken when it
starts: whether autograd is on (``torch.is_grad_enabled()``) and the called
module's ``training`` flag. A tree with both is a training tree. When the
recording holds at least one training tree, the trees in another mode are
left out of the order (their module calls, parameter uses and timing entries;
first uses are recomputed from the uses kept), and ``order.warnings`` says
how many calls were left out and in which mode. A recording without any
training tree (an inference capture: ``torch.no_grad()``, ``model.eval()``)
keeps every call, and the order records its mode (``training``,
``grad_enabled``).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn

from tracing.fqn import module_phrase
from tracing.order import ParamUse

__all__ = ["NO_AUTOGRAD_WARNING", "CallMode", "StepCalls", "keep_calls"]

#: ``order.warnings`` entry of an order recorded with autograd off.
NO_AUTOGRAD_WARNING = (
    "recorded without autograd (under torch.no_grad() or torch.inference_mode()): no backward "
    "ran, so the order has no backward order (param_backward_order is empty and backward "
    "prefetching follows the reverse forward order); record with autograd on for one"
)

#: Per-call timing fields, filtered with the calls they describe.
_PER_CALL = ("forward_times_s", "forward_start_s", "backward_start_s", "saved_activation_bytes")


@dataclass(frozen=True)
class CallMode:
    """The mode a top-level call starts in.

    Attributes:
        grad_enabled: ``torch.is_grad_enabled()`` then.
        training: the called module's ``training`` flag then.
    """

    grad_enabled: bool
    training: bool

    @property
    def is_training(self) -> bool:
        """Autograd on and training mode: a call of a training step."""
        return self.grad_enabled and self.training

    def describe(self) -> str:
        """``"in eval mode"``, ``"without autograd"``, or both, joined."""
        parts = ([] if self.training else ["in eval mode"]) + (
            [] if self.grad_enabled else ["without autograd"]
        )
        return " ".join(parts) or "in training mode with autograd"


class StepCalls:
    """The top-level calls of a recording, and which calls the order keeps."""

    def __init__(self) -> None:
        #: ``(index of the call in module_forward_order, module FQN, mode)`` per tree.
        self.trees: list[tuple[int, str, CallMode]] = []

    def top_level(self, index: int, fqn: str, module: nn.Module) -> None:
        """A top-level call of ``module`` starts; it is call ``index`` of the recording."""
        self.trees.append((index, fqn, CallMode(torch.is_grad_enabled(), module.training)))

    def kept(self, n_calls: int) -> list[bool] | None:
        """Per call, whether the order keeps it; ``None`` when it keeps every call."""
        if not any(mode.is_training for _, _, mode in self.trees):
            return None
        if all(mode.is_training for _, _, mode in self.trees):
            return None
        keep = [True] * n_calls
        for k, (start, _, mode) in enumerate(self.trees):
            end = self.trees[k + 1][0] if k + 1 < len(self.trees) else n_calls
            if not mode.is_training:
                keep[start:end] = [False] * (end - start)
        return keep

    def mode(self) -> CallMode | None:
        """The mode of the calls kept: training when any tree is, else the first tree's."""
        modes = [mode for _, _, mode in self.trees]
        return next((m for m in modes if m.is_training), modes[0] if modes else None)

    def left_out_note(self, n_calls: int) -> str | None:
        """The ``order.warnings`` sentence on the trees left out, or ``None``."""
        keep = self.kept(n_calls)
        if keep is None:
            return None
        counts = Counter(
            (fqn, mode.describe()) for _, fqn, mode in self.trees if not mode.is_training
        )
        kinds = "; ".join(
            f"{module_phrase(fqn)} called {how} ({n} time{'s' if n > 1 else ''})"
            for (fqn, how), n in counts.items()
        )
        left = keep.count(False)
        return (
            f"{left} forward call(s) outside the training step were left out of the order "
            f"(a generate loop or an evaluation pass, say): {kinds}. The order holds the "
            f"{n_calls - left} call(s) made in training mode with autograd on"
        )


def keep_calls(fields: dict[str, Any], keep: list[bool]) -> dict[str, Any]:
    """``fields`` (``ExecutionOrder`` keyword arguments) with only the calls ``keep``
    marks: module calls, call depths, parameter uses (their ``call_index``
    renumbered), first uses recomputed from the uses kept, and the per-call
    timing entries, with times counted from the first call kept."""
    new_index: dict[int, int] = {}
    for i, k in enumerate(keep):
        if k:
            new_index[i] = len(new_index)
    out = dict(fields)
    out["module_forward_order"] = [
        f for f, k in zip(fields["module_forward_order"], keep, strict=True) if k
    ]
    if fields.get("module_call_depths"):
        out["module_call_depths"] = [
            d for d, k in zip(fields["module_call_depths"], keep, strict=True) if k
        ]
    uses: list[ParamUse] = [
        ParamUse(u.module_fqn, new_index[u.call_index], u.param_fqns, u.op)
        for u in fields["param_uses"]
        if u.call_index in new_index
    ]
    out["param_uses"] = uses
    out["param_forward_order"] = list(dict.fromkeys(p for u in uses for p in u.param_fqns))
    if fields.get("forward_times_s"):
        for name in _PER_CALL:
            out[name] = [v for v, k in zip(fields[name], keep, strict=True) if k]
        origin = out["forward_start_s"][0] if out["forward_start_s"] else 0.0
        out["forward_start_s"] = [t - origin for t in out["forward_start_s"]]
        out["backward_start_s"] = [
            None if t is None else t - origin for t in out["backward_start_s"]
        ]
        if fields.get("backward_end_s") is not None:
            out["backward_end_s"] = fields["backward_end_s"] - origin
    return out
