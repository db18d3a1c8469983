"""Activation checkpointing per unit, applied before sharding: :func:`apply_checkpointing`.

A checkpointed module saves only its inputs in forward and runs its forward again in
backward, when its gradients are computed. Three modes per module
(:data:`CHECKPOINT_MODES`):

* ``"none"``: every activation its ops save for backward is kept;
* ``"full"``: nothing inside the module is kept; all of its forward runs again;
* ``"selective"``: torchtitan's op-level selective checkpointing
  (``torchtitan/distributed/activation_checkpoint.py::SelectiveAC``, torchtitan 0.3):
  the outputs of compute-intensive ops (matmuls, attention) and of communication ops
  are kept, except every second matmul (``aten.mm``/``aten.linear``), whose output is
  recomputed with everything cheap (:func:`selective_checkpoint_policy`, through
  ``torch.utils.checkpoint.create_selective_checkpoint_contexts``).

Checkpointing is given as one mode for every unit of the plan, or as a mapping
``{module FQN: mode}``. One mode applies to each non-root unit that no other non-root
unit encloses (a group of several modules: to each of them), and with ``every=N`` to
every N-th of those units in the plan's order (counted from 1: ``every=2``
checkpoints the 2nd, 4th, ...; torchtitan's per-layer selective checkpointing,
``selective_ac_option="2"``). The plan's order is the execution order; for a policy
that records its order during the first step it is still the definition order when
checkpointing is applied, before that step.

How it is applied: the module's ``forward`` runs under non-reentrant
``torch.utils.checkpoint.checkpoint`` (:class:`CheckpointedForward`, set as the
module's ``forward``; the hooks on the module stay outside it). This is what the
other two ways of torch do inside, without what breaks a plan:

* ``checkpoint_wrapper`` / ``apply_activation_checkpointing`` put a ``CheckpointWrapper``
  above the module and insert ``_checkpoint_wrapped_module`` into every FQN below it,
  which the plan, the cross-rank checks and ``named_parameters()`` then see (only
  ``state_dict`` hides it);
* torch's composable ``checkpoint`` (``torch.distributed._composable``) keeps the FQNs,
  but recomputes by calling the module with its hooks: FSDP2's pre-forward hook then
  runs inside the recomputation, and under a ``MixedPrecisionPolicy`` its input cast
  (a ``record_function`` op) fails selective checkpointing ("encountered during
  backward but not found in storage", torch 2.13).

So the module FQNs, parameter names, ``state_dict`` keys and the plan's units stay
those of the unwrapped model. It is applied before sharding, the same way for FSDP1
and FSDP2: FSDP's own hooks (FSDP2) or wrapper (FSDP1) stay outside the recomputed
region, as with ``fully_shard(checkpoint_wrapper(block))``: the all-gather is not
recomputed, and the same ops run as with a ``checkpoint_wrapper``, so the losses are
equal (tests/distributed/test_training_step.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, get_args

import torch.nn as nn

from execwrap.util.selective_policy import selective_checkpoint_policy, selective_contexts
from execwrap.util.text import fqn_and_list
from tracing.fqn import ancestors, is_within, module_phrase, quoted

__all__ = [
    "CHECKPOINT_MODES",
    "CheckpointedForward",
    "CheckpointMode",
    "Checkpointing",
    "apply_checkpointing",
    "check_checkpointing",
    "checkpoint_targets",
    "checkpoint_modules",
    "selective_checkpoint_policy",
]

logger = logging.getLogger(__name__)

#: A module's activation checkpointing.
CheckpointMode = Literal["none", "full", "selective"]
#: The modes, in order of the memory they keep (most first).
CHECKPOINT_MODES: tuple[str, ...] = get_args(CheckpointMode)
#: The name of ``every`` in the callers that say it otherwise than ``checkpoint_every``
#: (:func:`apply_checkpointing`'s own parameter), so that a message names the caller's own.
_EVERY_NAMES = {"apply_checkpointing": "every"}

#: What ``checkpointing=`` takes: one mode for every unit, ``{module FQN: mode}``, or ``None``.
Checkpointing = CheckpointMode | Mapping[str, CheckpointMode] | None


def check_checkpointing(
    checkpointing: Any,
    *,
    every: Any = 1,
    model: nn.Module | None = None,
    where: str = "apply_fully_shard",
) -> None:
    """Refuse a checkpointing setting before anything is wrapped (or checkpointed).

    Args:
        checkpointing: one of :data:`CHECKPOINT_MODES`, a mapping ``{module FQN: mode}``,
            or ``None``.
        every: checkpoint every N-th unit (an int >= 1); only with one mode.
        model: when given, each FQN of a mapping must name one of its modules, not the
            root, and none may enclose another.
        where: the caller, first in the message.

    Raises:
        TypeError: ``checkpointing`` is neither a str, a mapping nor ``None``; a key is
            not a str; ``every`` is not an int.
        ValueError: an unknown mode (the message names the module FQN, or "every unit",
            and lists the modes); ``every`` < 1, or ``every`` with a mapping; a mapping
            key that ``model`` does not have, that is the root, or that encloses another
            key.

    Example:
        >>> check_checkpointing({"blocks.0": "ful"})
        Traceback (most recent call last):
        ...
        ValueError: apply_fully_shard: checkpointing['blocks.0'] = 'ful' is not a checkpointing mode; the modes are 'none', 'full' and 'selective'
    """
    name = _EVERY_NAMES.get(where, "checkpoint_every")
    if isinstance(every, bool) or not isinstance(every, int):
        raise TypeError(
            f"{where}: {name} must be an int (checkpoint every N-th unit); got "
            f"{type(every).__name__}"
        )
    if every < 1:
        raise ValueError(
            f"{where}: {name}={every}; it must be 1 (every unit) or more (every "
            "N-th unit, counted from 1 in the plan's order)"
        )
    if checkpointing is None:
        return
    if isinstance(checkpointing, str):
        _check_mode(checkpointing, f"checkpointing={checkpointing!r} (for every unit)", where)
        return
    if not isinstance(checkpointing, Mapping):
        raise TypeError(
            f"{where}: checkpointing must be one of {_modes()}, a mapping "
            f"{{module FQN: mode}} or None; got {type(checkpointing).__name__}"
        )
    if every != 1:
        raise ValueError(
            f"{where}: {name}={every} counts the units that one mode applies to; "
            "with a mapping {module FQN: mode} leave it at 1 and list the modules to checkpoint"
        )
    for fqn, mode in checkpointing.items():
        if not isinstance(fqn, str):
            raise TypeError(
                f"{where}: checkpointing keys are module FQNs (str); got {fqn!r} "
                f"({type(fqn).__name__})"
            )
        _check_mode(mode, f"checkpointing[{fqn!r}] = {mode!r}", where)
    if model is not None:
        _check_fqns(model, [f for f, m in checkpointing.items() if m != "none"], where)


def checkpoint_targets(
    model: nn.Module,
    units: Sequence[Sequence[str]],
    checkpointing: Checkpointing,
    *,
    every: int = 1,
    where: str = "apply_fully_shard",
) -> dict[str, CheckpointMode]:
    """The modules to checkpoint and their modes (``"none"`` left out); nothing applied.

    Args:
        model: the model, not yet checkpointed or sharded.
        units: the plan's units as lists of module FQNs, in the plan's order
            (``plan.groups``; the root ``[""]`` is skipped).
        checkpointing: see :func:`apply_checkpointing`.
        every: see :func:`apply_checkpointing`.
        where: the caller, first in messages.

    Returns:
        ``{module FQN: mode}`` in the plan's order (a mapping: in its own order).

    Raises:
        TypeError, ValueError: from :func:`check_checkpointing`; a target, a module
            inside it or one enclosing it is already checkpointed (torch's
            ``CheckpointWrapper``, or composable ``checkpoint``): it would recompute twice.
    """
    check_checkpointing(checkpointing, every=every, model=model, where=where)
    if checkpointing is None:
        return {}
    if isinstance(checkpointing, str):
        targets = _unit_targets(units, checkpointing, every)
    else:
        targets = {f: m for f, m in checkpointing.items() if m != "none"}
    _check_not_checkpointed(model, targets, where)
    return targets


class CheckpointedForward:
    """A module's own ``forward`` run under non-reentrant ``torch.utils.checkpoint``.

    Set as the module's ``forward`` by :func:`checkpoint_modules`; ``nn.Module.__call__``
    runs the module's hooks (FSDP's among them) around it, and backward recomputes the
    class's ``forward`` alone (or a ``forward`` set on the instance before, which is
    kept). Deep copies and pickles of the module keep it, bound to the copy.

    Args:
        module: the module checkpointed.
        mode: ``"full"`` or ``"selective"`` (:func:`selective_checkpoint_policy`).
    """

    def __init__(self, module: nn.Module, mode: CheckpointMode) -> None:
        self.module = module
        self.mode = mode
        #: a ``forward`` set on the instance before (kept, called as it is), else ``None``
        self.own: Callable[..., Any] | None = module.__dict__.get("forward")
        self.function = type(module).forward

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from torch.utils.checkpoint import checkpoint, noop_context_fn

        first = () if self.own is not None else (self.module,)
        return checkpoint(
            self.own if self.own is not None else self.function,
            *first,
            *args,
            use_reentrant=False,
            context_fn=selective_contexts if self.mode == "selective" else noop_context_fn,
            **kwargs,
        )

    def __repr__(self) -> str:
        return f"CheckpointedForward({type(self.module).__name__}, {self.mode!r})"


def checkpoint_modules(model: nn.Module, targets: Mapping[str, CheckpointMode]) -> None:
    """Checkpoint each target (as checked by :func:`checkpoint_targets`): its ``forward``
    becomes a :class:`CheckpointedForward`."""
    for fqn, mode in targets.items():
        module = model.get_submodule(fqn)
        module.forward = CheckpointedForward(module, mode)  # type: ignore[method-assign]
    if targets:
        logger.info("activation checkpointing: %s", dict(targets))


def apply_checkpointing(
    model: nn.Module,
    units: Any,
    checkpointing: Checkpointing,
    *,
    every: int = 1,
) -> dict[str, CheckpointMode]:
    """Checkpoint ``model``'s units before it is sharded (the algorithm: module docstring).

    :func:`execwrap.apply_fully_shard` (``checkpointing=``) and
    :class:`execwrap.ParamExecOrderWrapPolicy` (``checkpointing=``, FSDP1) call this
    before wrapping; call it yourself to checkpoint a model you shard otherwise.

    Args:
        model: the unwrapped model, checkpointed in place; its module FQNs, parameter
            names and ``state_dict`` keys do not change.
        units: the plan's units: a :class:`execwrap.WrapPlan` (its ``groups``) or lists
            of module FQNs in the plan's order.
        checkpointing: ``"none"``, ``"full"`` or ``"selective"`` for every unit, or a
            mapping ``{module FQN: mode}`` (any modules of the model but the root, none
            inside another), or ``None`` (nothing).
        every: with one mode, checkpoint every N-th unit only (counted from 1).

    Returns:
        ``{module FQN: mode}`` of the modules checkpointed.

    Raises:
        TypeError, ValueError: see :func:`check_checkpointing` and
            :func:`checkpoint_targets`; raised before any module is checkpointed.

    Example:
        >>> from execwrap.demo_models import GPT, GPTConfig
        >>> model = GPT(GPTConfig(n_blocks=4))
        >>> apply_checkpointing(model, [["blocks.0"], ["blocks.1"], ["blocks.2"], ["blocks.3"]],
        ...                     "full", every=2)
        {'blocks.1': 'full', 'blocks.3': 'full'}
    """
    groups = units.groups if hasattr(units, "groups") else units
    targets = checkpoint_targets(
        model, groups, checkpointing, every=every, where="apply_checkpointing"
    )
    checkpoint_modules(model, targets)
    return targets


# ------------------------------------------------------------------ helpers
def _modes() -> str:
    return ", ".join(repr(m) for m in CHECKPOINT_MODES[:-1]) + f" and {CHECKPOINT_MODES[-1]!r}"


def _check_mode(mode: Any, shown: str, where: str) -> None:
    if not isinstance(mode, str) or mode not in CHECKPOINT_MODES:
        raise ValueError(f"{where}: {shown} is not a checkpointing mode; the modes are {_modes()}")


def _check_fqns(model: nn.Module, fqns: list[str], where: str) -> None:
    """Every FQN a module of ``model``, none the root, none inside another."""
    names = {n for n, _ in model.named_modules()}
    for fqn in fqns:
        if fqn == "":
            raise ValueError(
                f"{where}: checkpointing names the root module <root>; checkpointing the whole "
                "model saves nothing FSDP can free: name the units inside it (e.g. the blocks)"
            )
        if fqn not in names:
            raise ValueError(
                f"{where}: checkpointing names {module_phrase(fqn)}, which "
                f"{type(model).__name__} does not have; name modules as named_modules() does"
            )
    for fqn in fqns:
        outer = [a for a in fqns if a != fqn and is_within(fqn, a)]
        if outer:
            raise ValueError(
                f"{where}: checkpointing names {quoted(fqn)} inside {fqn_and_list(outer)}; "
                "a module inside a checkpointed one would run its forward three times: "
                "keep only the outer one or the inner ones"
            )


def _unit_targets(
    units: Sequence[Sequence[str]], mode: str, every: int
) -> dict[str, CheckpointMode]:
    """One mode for every N-th outermost non-root unit (all of its modules)."""
    if mode == "none":
        return {}
    unit_modules = {f for unit in units for f in unit if f}
    outermost: list[Sequence[str]] = []
    for unit in units:
        modules = [f for f in unit if f]
        if modules and not any(
            a in unit_modules and a not in modules for f in modules for a in ancestors(f) if a
        ):
            outermost.append(modules)
    chosen = [u for i, u in enumerate(outermost, start=1) if i % every == 0]
    return {f: mode for unit in chosen for f in unit}  # type: ignore[misc]


def _checkpointed(module: nn.Module) -> str | None:
    """How ``module`` is already checkpointed (``None``: it is not)."""
    from torch.distributed._composable import _get_registry
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper

    if isinstance(module, CheckpointWrapper):
        return "torch's CheckpointWrapper"
    if "checkpoint" in (_get_registry(module) or {}):
        return "torch.distributed._composable.checkpoint"
    if isinstance(module.__dict__.get("forward"), CheckpointedForward):
        return "execwrap's checkpointing"
    return None


def _check_not_checkpointed(model: nn.Module, targets: Mapping[str, str], where: str) -> None:
    """No target, nothing inside one and nothing enclosing one already checkpointed."""
    for fqn, module in model.named_modules():
        how = _checkpointed(module)
        if how is None:
            continue
        hit = next((t for t in targets if is_within(fqn, t) or is_within(t, fqn)), None)
        if hit is not None:
            raise ValueError(
                f"{where}: {module_phrase(fqn)} is already checkpointed ({how}) and "
                f"checkpointing= would checkpoint {quoted(hit)} too: its forward would be "
                "recomputed twice in backward. Drop one of the two; nothing has been "
                "checkpointed or wrapped"
            )
