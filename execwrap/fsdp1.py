"""``ParamExecOrderWrapPolicy``: FSDP1 units that follow the real execution order.

The policy is a torch ``_Policy``, so it plugs into FSDP1 unchanged::

    policy = ParamExecOrderWrapPolicy(ModuleWrapPolicy({Block}), TracingConfig())
    model = FSDP(model, auto_wrap_policy=policy)
    policy.order, policy.plan  # what was used

It revives the API of torch's 2022 prototype
``torch.distributed.fsdp.wrap.ParamExecOrderWrapPolicy`` (PR #80294 and
#81548: ``init_policy`` plus ``tracing_config``; removed from torch in 2023),
built on :mod:`tracing` for the order and :func:`execwrap.plan.plan_wrap` for
the units. The size-based bucketing that prototype left as future work is the
plan's ``bucket_numel``.

Three ways to an order, tried in this sequence:

1. ``order=``: a saved order (e.g. ``ExecutionOrder.load(path)``) is reused.
2. ``tracing_config=`` and/or ``example_inputs=``: captured before wrapping
   with :func:`tracing.capture_execution_order` (symbolic first, runtime
   fallback with the example inputs).
3. Neither: the units come from ``init_policy`` alone and the order is
   recorded during the first forward/backward of the wrapped model by a
   :class:`tracing.RuntimeRecorder` that removes itself after that backward;
   ``policy.order`` and ``policy.plan`` are filled then.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import KW_ONLY, dataclass, field
from enum import Enum, auto
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp.wrap import _Policy, always_wrap_policy
from torch.nn.modules.module import register_module_forward_pre_hook
from torch.utils.hooks import RemovableHandle

from execwrap.plan import WrapPlan
from execwrap.planner import plan_wrap
from execwrap.ranks import check_order_across_ranks
from tracing import RuntimeRecorder, TracingConfig, capture_execution_order
from tracing.nested import tensors_in
from tracing.order import ExecutionOrder, param_infos, shared_param_map

__all__ = ["ParamExecOrderWrapPolicy"]

logger = logging.getLogger(__name__)

#: An FSDP1-style policy: a callable ``(module, recurse, nonwrapped_numel) -> bool``
#: or a torch ``_Policy`` instance (``ModuleWrapPolicy``, ``CustomPolicy``).
InitPolicy = Callable[..., bool] | _Policy


@dataclass(eq=False)
class ParamExecOrderWrapPolicy(_Policy):
    """An FSDP auto-wrap policy whose units follow the real execution order.

    ``init_policy`` decides *which* modules become units, exactly as FSDP
    decides it; the captured order decides their order, keeps tied parameters
    in one unit, drops units that never run their own forward, and (with
    ``bucket_numel``) merges consecutive units into FSDP2 groups. The same
    object drives FSDP2 through :func:`execwrap.apply_fully_shard`.

    Args:
        init_policy: which modules become units: a callable
            ``(module, recurse, nonwrapped_numel) -> bool`` such as
            ``always_wrap_policy`` or a ``functools.partial`` of
            ``size_based_auto_wrap_policy``, or a ``ModuleWrapPolicy`` /
            ``CustomPolicy`` instance.
        tracing_config: trace the order symbolically with this config
            (``torch.fx``; no inputs needed). On failure, falls back to runtime
            capture with ``example_inputs``; without them the
            :class:`tracing.TracingError` is raised.
        bucket_numel: merge consecutive units (in execution order) into groups
            of at most this many parameter elements (FSDP2 groups; FSDP1
            realises a group only when it is exactly a parent's units, see
            ``plan.notes``). ``None`` merges nothing.
        example_inputs: positional inputs for runtime capture (a tuple, or one
            tensor); one forward and backward run before wrapping.
        example_kwargs: keyword inputs for runtime capture.
        order: a saved order to reuse instead of capturing one.
        check_ranks: when a process group is initialised, compare the order
            across ranks with :func:`execwrap.check_order_across_ranks` before
            wrapping (a collective: every rank must build its model).
        forward_prefetch: FSDP1 only: pass ``forward_prefetch=True`` to every
            unit, so FSDP1 issues each unit's all-gather before the previous
            unit's forward, in the order FSDP1 records in the first iteration
            (the order this policy planned with). ``None`` keeps the root's
            kwarg.

    Attributes:
        order: after wrapping, the order used (``None`` until recorded in
            case 3). A policy keeps it: wrapping a second model with the same
            policy object reuses it as a saved order (right for an identical
            model; make a new policy for another one).
        plan: after wrapping, the :class:`execwrap.WrapPlan` used. In case 3
            the units applied came from ``init_policy`` alone; after the first
            step the plan holds those same units re-ordered by the recorded
            order (FSDP1 and FSDP2 cannot re-wrap). Under FSDP1 with
            ``use_orig_params=False`` the recorded parameter-level fields name
            each unit's ``_flat_param`` (see :class:`tracing.RuntimeRecorder`).

    Raises:
        TypeError: ``init_policy`` is not callable / not a ``_Policy``,
            ``tracing_config`` is not a :class:`TracingConfig`, ``order`` is
            not an :class:`ExecutionOrder`, or ``example_kwargs`` not a dict.
        ValueError: ``bucket_numel`` is not a positive int.

    Example:
        >>> from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        >>> policy = ParamExecOrderWrapPolicy(ModuleWrapPolicy({Block}), TracingConfig())  # doctest: +SKIP
        >>> model = FSDP(GPT(), auto_wrap_policy=policy, use_orig_params=True)  # doctest: +SKIP
        >>> policy.plan.groups  # doctest: +SKIP
        [[''], ['blocks.0'], ['blocks.1'], ['blocks.2'], ['blocks.3']]
    """

    init_policy: InitPolicy = always_wrap_policy
    tracing_config: TracingConfig | None = None
    _: KW_ONLY
    bucket_numel: int | None = None
    example_inputs: Any = None
    example_kwargs: dict[str, Any] | None = None
    order: ExecutionOrder | None = None
    check_ranks: bool = True
    forward_prefetch: bool | None = None
    plan: WrapPlan | None = field(default=None, init=False, compare=False)
    _recording: _FirstStepRecording | None = field(
        default=None, init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        if not (isinstance(self.init_policy, _Policy) or callable(self.init_policy)):
            raise TypeError(
                "ParamExecOrderWrapPolicy.init_policy must be a callable "
                "(module, recurse, nonwrapped_numel) -> bool or a torch _Policy "
                f"(ModuleWrapPolicy, CustomPolicy); got {type(self.init_policy).__name__}"
            )
        if self.tracing_config is not None and not isinstance(self.tracing_config, TracingConfig):
            raise TypeError(
                "ParamExecOrderWrapPolicy.tracing_config must be a tracing.TracingConfig "
                f"or None; got {type(self.tracing_config).__name__}"
            )
        if self.bucket_numel is not None and (
            isinstance(self.bucket_numel, bool)
            or not isinstance(self.bucket_numel, int)
            or self.bucket_numel <= 0
        ):
            raise ValueError(
                "ParamExecOrderWrapPolicy.bucket_numel must be a positive number of "
                f"parameter elements or None; got {self.bucket_numel!r}"
            )
        if self.order is not None and not isinstance(self.order, ExecutionOrder):
            raise TypeError(
                "ParamExecOrderWrapPolicy.order must be a tracing.ExecutionOrder (e.g. "
                f"ExecutionOrder.load(path)) or None; got {type(self.order).__name__}"
            )
        if self.example_kwargs is not None and not isinstance(self.example_kwargs, dict):
            raise TypeError(
                "ParamExecOrderWrapPolicy.example_kwargs must be a dict of forward keyword "
                f"arguments or None; got {type(self.example_kwargs).__name__}"
            )
        if isinstance(self.example_inputs, torch.Tensor):
            self.example_inputs = (self.example_inputs,)
        elif self.example_inputs is not None and not isinstance(self.example_inputs, tuple):
            if isinstance(self.example_inputs, list):
                self.example_inputs = tuple(self.example_inputs)
            else:
                self.example_inputs = (self.example_inputs,)

    # ---------------------------------------------------------------- planning
    @property
    def recording(self) -> bool:
        """Whether the order is still to be recorded during the first step."""
        return self._recording is not None and self._recording.active

    def build_plan(
        self,
        model: nn.Module,
        *,
        ignored_modules: Iterable[nn.Module] | None = None,
        group: dist.ProcessGroup | None = None,
    ) -> WrapPlan:
        """Get the order (saved, captured, or none yet) and plan ``model``'s units.

        Sets :attr:`order` and :attr:`plan`. Without any way to get an order
        now (no ``order``, no ``tracing_config``, no ``example_inputs``), the
        plan's units come from ``init_policy`` alone, in definition order, and
        :attr:`order` stays ``None`` until recorded (see
        :meth:`_arm_first_step_recording`).

        Args:
            model: the unwrapped model (the FSDP root).
            ignored_modules: modules FSDP ignores (not planned).
            group: process group for the cross-rank check (default ``WORLD``).

        Returns:
            The plan.

        Raises:
            tracing.TracingError: symbolic tracing failed and there are no
                example inputs to fall back to (the message names the module).
            execwrap.OrderDivergenceError: ranks captured different orders.
        """
        ignored = list(ignored_modules or ())
        order = self.order
        if order is None and (self.tracing_config is not None or self.example_inputs is not None):
            order = capture_execution_order(
                model,
                tracing_config=self.tracing_config,
                example_inputs=self.example_inputs,
                example_kwargs=self.example_kwargs,
            )
            if order.fallback_reason is not None:  # tracing logged it at INFO already
                logger.debug(
                    "ParamExecOrderWrapPolicy: symbolic tracing failed, order captured at "
                    "run time instead (%s)",
                    order.fallback_reason,
                )
        if order is not None:
            if self.check_ranks and dist.is_available() and dist.is_initialized():
                check_order_across_ranks(order, group=group)
            self.order = order
            self.plan = plan_wrap(
                model,
                order,
                self.init_policy,
                bucket_numel=self.bucket_numel,
                ignored_modules=ignored,
            )
        else:
            logger.info(
                "ParamExecOrderWrapPolicy: no order, tracing_config or example inputs; "
                "units from init_policy alone, order recorded during the first step"
            )
            self.plan = plan_wrap(
                model,
                _empty_order(model),
                self.init_policy,
                bucket_numel=None,
                ignored_modules=ignored,
            )
        return self.plan

    def _run_policy(
        self,
        root_module: nn.Module,
        ignored_modules: set[nn.Module],
        root_kwargs: dict[str, Any],
    ) -> dict[nn.Module, dict[str, Any]]:
        """FSDP1's entry point: ``{module: kwargs}`` for the plan's units.

        Called by ``FullyShardedDataParallel.__init__`` on the root module
        (which FSDP wraps itself). Each unit gets a shallow copy of
        ``root_kwargs``, as torch's own policies do, so mixed precision,
        ``use_orig_params``, ``sync_module_states`` etc. carry over.
        """
        group = root_kwargs.get("process_group")
        plan = self.build_plan(
            root_module,
            ignored_modules=ignored_modules,
            group=group if isinstance(group, dist.ProcessGroup) else None,
        )
        targets = _resolve_modules(root_module, _fsdp1_targets(plan))
        result: dict[nn.Module, dict[str, Any]] = {}
        for module in targets:
            if module in ignored_modules:
                continue
            kwargs = dict(root_kwargs)
            if self.forward_prefetch is not None:
                kwargs["forward_prefetch"] = self.forward_prefetch
            result[module] = kwargs
        if self.order is None:
            self._arm_first_step_recording(
                root_module,
                on_recorded=None,
                start_now=False,
                group=group if isinstance(group, dist.ProcessGroup) else None,
            )
        logger.debug("ParamExecOrderWrapPolicy: %d FSDP1 targets", len(result))
        return result

    def _arm_first_step_recording(
        self,
        root_module: nn.Module,
        on_recorded: Callable[[ExecutionOrder], None] | None,
        *,
        start_now: bool = False,
        group: dist.ProcessGroup | None = None,
    ) -> None:
        """Record the order during the first forward/backward of ``root_module``.

        After that backward, :attr:`order` holds the recorded order and
        :attr:`plan` the applied units re-ordered by it; then
        ``on_recorded(order)`` runs (FSDP2 sets prefetching there).

        Args:
            root_module: the FSDP1 root's inner module (``start_now=False``:
                recording starts at the first call of its wrapper), or the
                FSDP2-sharded model (``start_now=True``: the recorder is
                installed now).
            on_recorded: called with the order once recorded.
            start_now: install the recorder now instead of at the first call.
            group: process group for the cross-rank check (``None``: the
                default group).

        Raises:
            OrderDivergenceError: from the first ``backward()`` (the check runs
                in an autograd final callback) when ``check_ranks`` is set, a
                process group is initialised and the ranks recorded different
                orders. Step 1 has then already run with them: its results are
                not to be trusted.
        """
        if self._recording is not None:
            self._recording.remove()

        def done(order: ExecutionOrder) -> None:
            self._recording = None
            self.order = order
            if self.plan is not None:
                self.plan = self.plan.reordered(order)
            logger.info(
                "ParamExecOrderWrapPolicy: recorded the order during the first step "
                "(%d module calls)",
                len(order.module_forward_order),
            )
            if self.check_ranks and dist.is_available() and dist.is_initialized():
                # Every rank reaches this callback at the end of its first
                # backward, so the collective lines up.
                check_order_across_ranks(order, group=group)
            if on_recorded is not None:
                on_recorded(order)

        self._recording = _FirstStepRecording(root_module, done, start_now=start_now)


# ------------------------------------------------------------------ helpers
def _empty_order(model: nn.Module) -> ExecutionOrder:
    """An order with the model's parameters and modules but no calls."""
    _, shared = shared_param_map(model)
    return ExecutionOrder(
        method="runtime",
        params=param_infos(model),
        shared_params=shared,
        module_classes={fqn: type(m).__name__ for fqn, m in model.named_modules()},
    )


def _fsdp1_targets(plan: WrapPlan) -> list[str | nn.Module]:
    fsdp1_modules = getattr(plan, "fsdp1_modules", None)
    if callable(fsdp1_modules):
        return list(fsdp1_modules())
    # Plans without the FSDP1 view: every module of every unit.
    return [fqn for unit in plan.units for fqn in unit.module_fqns]


def _resolve_modules(root: nn.Module, targets: Iterable[str | nn.Module]) -> list[nn.Module]:
    modules: list[nn.Module] = []
    for target in targets:
        if isinstance(target, nn.Module):
            modules.append(target)
            continue
        try:
            modules.append(root.get_submodule(target))
        except AttributeError as e:
            raise ValueError(
                f"The wrap plan names module {target!r}, which the model "
                f"({type(root).__name__}) does not have; was the plan or order made for "
                "another model? Capture the order again for this model."
            ) from e
    return modules


class _Phase(Enum):
    """Phases of :class:`_FirstStepRecording` (like FSDP2's ``TrainingState``)."""

    ARMED = auto()  # waiting for the root's first forward (FSDP1)
    RECORDING = auto()  # recorder installed; waiting for the end of backward
    DONE = auto()


class _FirstStepRecording:
    """Runs a :class:`tracing.RuntimeRecorder` over the root's first step.

    With ``start_now`` (FSDP2: the root is the sharded model itself) the
    recorder is installed at once. Otherwise (FSDP1: the root wrapper does not
    exist yet when the policy runs) a global module forward pre-hook waits for
    the first call of the wrapper whose ``_fsdp_wrapped_module`` is ``root``,
    installs the recorder on that wrapper (it strips FSDP1's prefixes; the
    inner root's own call is still ahead, so it is recorded), and removes the
    global hook. (Hooks installed from inside a module's pre-hooks miss that
    module's call in progress, so the root itself cannot be the trigger.)

    The recording ends at the end of the first backward, from an
    autograd-engine callback queued by a hook on the forward's outputs
    (FSDP1's own technique for its post-backward callback). A forward whose
    outputs need no grad (inference) ends it after forward; a forward that
    raises drops it and re-arms. Every hook is removed when done; nothing is
    stored on the user's modules.
    """

    def __init__(
        self,
        root: nn.Module,
        on_done: Callable[[ExecutionOrder], None],
        *,
        start_now: bool,
    ) -> None:
        self._root = root
        self._on_done = on_done
        self._start_now = start_now
        self._phase = _Phase.ARMED
        self._recorder: RuntimeRecorder | None = None
        self._queued = False
        self._handles: list[RemovableHandle] = []
        self._arm()

    @property
    def active(self) -> bool:
        return self._phase is not _Phase.DONE

    def _arm(self) -> None:
        if self._start_now:
            self._start(self._root)
        else:
            self._phase = _Phase.ARMED
            self._handles.append(register_module_forward_pre_hook(self._global_pre_forward))

    def _start(self, module: nn.Module) -> None:
        self._recorder = RuntimeRecorder(module)
        self._phase = _Phase.RECORDING
        self._queued = False
        # Forward hooks are read after forward runs, so this one fires for the
        # call in progress too; ``always_call`` also runs it when forward raises.
        self._handles.append(module.register_forward_hook(self._post_forward, always_call=True))

    def _remove_handles(self) -> None:
        handles, self._handles = self._handles, []
        for handle in handles:
            handle.remove()

    def _global_pre_forward(self, module: nn.Module, args: Any) -> None:
        if self._phase is not _Phase.ARMED:
            return None
        # Only a wrapper: on ``root`` itself the recorder's hooks would be
        # installed too late to see this call.
        if getattr(module, "_fsdp_wrapped_module", None) is self._root:
            self._remove_handles()
            self._start(module)
        return None

    def _post_forward(self, module: nn.Module, args: Any, output: Any) -> None:
        self._remove_handles()
        if output is None:  # forward raised (always_call) or returned nothing
            recorder, self._recorder = self._recorder, None
            if recorder is not None:
                recorder.remove(failed=True)
            logger.debug("first-step recording: forward gave no output; re-armed")
            self._arm()
            return None
        tensors = [t for t in tensors_in(output) if t.requires_grad]
        if not tensors:
            self._finish()
            return None
        for t in tensors:
            self._handles.append(t.register_hook(self._on_output_grad))
        return None

    def _on_output_grad(self, grad: torch.Tensor) -> None:
        if not self._queued:
            self._queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._finish)
        return None

    def _finish(self) -> None:
        if self._phase is not _Phase.RECORDING:
            return
        self._remove_handles()
        recorder, self._recorder = self._recorder, None
        self._phase = _Phase.DONE
        assert recorder is not None
        recorder.remove()
        self._on_done(recorder.order)

    def remove(self) -> None:
        """Stop without recording (idempotent)."""
        self._remove_handles()
        recorder, self._recorder = self._recorder, None
        self._phase = _Phase.DONE
        if recorder is not None:
            recorder.remove(failed=True)
