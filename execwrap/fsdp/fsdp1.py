"""``ParamExecOrderWrapPolicy``: FSDP1 units that follow the real execution order.

The policy is a torch ``_Policy``, so it plugs into FSDP1 unchanged::

    policy = ParamExecOrderWrapPolicy(ModuleWrapPolicy({Block}), TracingConfig())
    model = FSDP(model, auto_wrap_policy=policy)
    policy.order, policy.plan  # what was used

It revives the API of torch's 2022 prototype
``torch.distributed.fsdp.wrap.ParamExecOrderWrapPolicy`` (PR #80294 and
#81548: ``init_policy`` plus ``tracing_config``; removed from torch in 2023),
built on :mod:`tracing` for the order and :func:`execwrap.planning.planner.plan_wrap` for
the units. The size-based bucketing that prototype left as future work is the
plan's ``bucket_numel``.

Three ways to an order, tried in this sequence:

1. ``order=``: a saved order (e.g. ``ExecutionOrder.load(path)``) is reused.
2. ``tracing_config=`` and/or ``example_inputs=``: captured before wrapping
   with :func:`tracing.capture_execution_order` (symbolic first, runtime
   fallback with the example inputs).
3. Neither: the units come from ``init_policy`` alone and the order is
   recorded during the first forward/backward of the wrapped model by a
   :class:`tracing.RuntimeRecorder` that removes itself after that backward
   (:mod:`execwrap.fsdp.first_step`); ``policy.order`` and ``policy.plan`` are
   filled then.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import KW_ONLY, dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp.wrap import _Policy, always_wrap_policy

from execwrap.distributed.status import fail_together, is_distributed
from execwrap.fsdp.checkpointing import (
    Checkpointing,
    check_checkpointing,
    checkpoint_modules,
    checkpoint_targets,
)
from execwrap.fsdp.first_step import is_recording, record_first_step
from execwrap.fsdp.fsdp1_groups import check_fsdp1_builds
from execwrap.fsdp.fsdp1_targets import empty_order, fsdp1_targets, resolve_modules
from execwrap.fsdp.mesh import check_fsdp1_hybrid
from execwrap.fsdp.plan_step import check_fsdp1_kwargs, fsdp1_step, policy_choices, policy_step
from execwrap.fsdp.policy_helpers import short_repr
from execwrap.fsdp.ranks import check_order_across_ranks
from execwrap.fsdp.shardable import check_shardable, check_uniform_requires_grad
from execwrap.plan.pinned import check_pinned_options, check_plan_fits
from execwrap.plan.training_step import TrainingStep
from execwrap.plan.wrap_plan import WrapPlan
from execwrap.planning.auto.options import (
    check_auto_options,
)
from execwrap.planning.auto_wrap import policy_name
from execwrap.planning.planner import FSDPTarget, plan_wrap_unwatched
from execwrap.watch.registry import mark_applied, unwatched_if_refused, watch
from tracing import TracingConfig, capture_execution_order
from tracing.checks import check_size
from tracing.order import ExecutionOrder

if TYPE_CHECKING:
    from execwrap.cost import CostModel

__all__ = ["ParamExecOrderWrapPolicy"]

logger = logging.getLogger(__name__)

_NO_OP = contextlib.nullcontext()

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
            of at most this many parameter elements (FSDP2 groups). FSDP1
            wraps one module per unit: it builds a group only when one module
            holds exactly its units, and a plan with any other group is refused
            under FSDP1. ``None`` merges nothing. ``"auto"``: the
            auto-planner chooses the groups, the prefetch depth and
            ``reshard_after_forward`` per group from ``cost_model``
            (see :func:`execwrap.plan_wrap`; its choices are FSDP2's: use
            the policy with :func:`execwrap.apply_fully_shard` and
            ``prefetch="auto"``; FSDP1 refuses it). Needs an
            order before wrapping (``order``, ``tracing_config`` or
            ``example_inputs``).
        cost_model: an :class:`execwrap.cost.CostModel` (calibrated or a
            preset) for ``bucket_numel="auto"``.
        world_size: ranks to plan for, an int or a NumPy integer, kept as an int
            (default: the cost model's).
        memory_budget: peak memory per rank the auto plan must stay within,
            bytes, a whole number (``40e9`` is accepted; ``None``: the device's
            memory minus a reserve, :mod:`execwrap.cost.device_memory`).
        optimizer: the optimizer the auto plan is priced with (its state in
            memory, its step in time; :data:`execwrap.simulate.OPTIMIZERS`;
            ``None``: ``"adamw"``).
        example_inputs: positional inputs for runtime capture (a tuple, or one
            tensor); one forward and backward run before wrapping.
        example_kwargs: keyword inputs for runtime capture.
        order: a saved order to reuse instead of capturing one.
        check_ranks: when a process group is initialised, compare the order
            and the model's parameters (shapes, dtypes, ``requires_grad``)
            across ranks with :func:`execwrap.check_order_across_ranks` before
            wrapping (a collective: every rank must build its model).
        forward_prefetch: FSDP1 only: ``forward_prefetch=True`` for every unit, so FSDP1
            issues each unit's all-gather before the previous unit's forward, in the order
            it records in the first iteration (this plan's). ``None`` keeps the root's kwarg.
        groups: stated groups, lists of module FQNs that each form one FSDP
            group (``[["norm", "lm_head"]]``; see :func:`execwrap.plan_wrap`).
        checkpointing: activation checkpointing of the units, applied before
            wrapping (FSDP1 and :func:`execwrap.apply_fully_shard` alike):
            ``"full"``/``"selective"``/``"none"`` for every unit or
            ``{module FQN: mode}`` (:func:`execwrap.fsdp.checkpointing.apply_checkpointing`).
        checkpoint_every: with one mode, checkpoint every N-th unit only.
        mesh: the mesh to plan for (``plan_wrap``'s ``mesh``: a ``(replicate, shard)``
            shape, or ``"auto"`` with ``bucket_numel="auto"``); under FSDP1 with
            ``HYBRID_SHARD`` / ``_HYBRID_SHARD_ZERO2`` its process groups must match it.
        training: the :class:`execwrap.TrainingStep` to plan for (``plan.training``):
            with ``"auto"``, its precision and micro-batch count are planned for and the
            planner chooses the rest (``choose``); ``checkpointing`` above is part of it.
            Its checkpointing is applied; FSDP1 must be given its precision and offload.
        choose: ``"auto"`` only: what of the step the planner chooses (see
            :func:`execwrap.plan_wrap`).
        pinned_plan: a plan to apply as it is, with its order (a restart:
            ``execwrap.plan.pinned.load_plan(checkpoint_folder)``): no capture, no planning;
            checked against the model when wrapping (the first difference named). Not
            combined with ``order``, ``tracing_config``, ``example_inputs``,
            ``bucket_numel``, ``groups``, ``mesh`` or the auto-planner's options.

    FSDP1's own ``mixed_precision`` and ``cpu_offload`` reach every unit (each
    gets the root's kwargs) and are checked before anything is wrapped
    (:mod:`execwrap.fsdp.precision`, :mod:`execwrap.fsdp.offload`).

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

    Never silent: a policy that no FSDP1 wrap and no ``apply_fully_shard``
    has applied by the first optimizer step of the process is named in a
    WARNING then (:mod:`execwrap.watch.registry`).

    Raises:
        TypeError: ``init_policy`` is not callable / not a ``_Policy``,
            ``tracing_config`` is not a :class:`TracingConfig`, ``order`` is
            not an :class:`ExecutionOrder`, or ``example_kwargs`` not a dict.
        ValueError: ``bucket_numel`` is not a positive whole number (an int, a
            NumPy integer or a float such as ``1e8``, kept as an int), ``None`` or
            ``"auto"``; ``"auto"`` without a ``cost_model``; ``cost_model``,
            ``world_size`` or ``memory_budget`` without ``"auto"``; a
            ``memory_budget`` or ``world_size`` that is not positive;
            ``groups`` with ``"auto"``; an unknown ``checkpointing`` mode (naming
            the module FQN) or ``checkpoint_every`` < 1. From FSDP1
            (``_run_policy``), before anything is checkpointed or wrapped:
            ``bucket_numel="auto"``, or bucketed groups no single module holds (the
            message names them and what to use instead); units mix frozen and
            trainable parameters and ``use_orig_params`` is ``False``; a
            ``mixed_precision`` FSDP would refuse; CPU offload on a CPU device; a
            ``checkpointing`` FQN the model lacks.

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
    bucket_numel: int | Literal["auto"] | None = None
    example_inputs: Any = None
    example_kwargs: dict[str, Any] | None = None
    order: ExecutionOrder | None = None
    check_ranks: bool = True
    forward_prefetch: bool | None = None
    groups: Sequence[Sequence[str]] | None = None
    cost_model: CostModel | None = None
    world_size: int | None = None
    memory_budget: int | None = None
    optimizer: str | None = None
    checkpointing: Checkpointing = None
    checkpoint_every: int = 1
    mesh: Any = None
    training: TrainingStep | None = None
    choose: Sequence[str] | None = None
    pinned_plan: WrapPlan | None = None
    plan: WrapPlan | None = field(default=None, init=False, compare=False)

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
        if self.bucket_numel is not None and not (
            isinstance(self.bucket_numel, str) and self.bucket_numel == "auto"
        ):
            try:  # an int, a NumPy integer or a whole float (1e8), kept as an int
                self.bucket_numel = check_size(self.bucket_numel, "bucket_numel")
            except (TypeError, ValueError) as e:
                raise ValueError(
                    "ParamExecOrderWrapPolicy.bucket_numel must be a positive number of "
                    f'parameter elements, "auto" or None; got {self.bucket_numel!r}'
                ) from e
        check_checkpointing(
            self.checkpointing, every=self.checkpoint_every, where="ParamExecOrderWrapPolicy"
        )
        auto = check_auto_options(
            "ParamExecOrderWrapPolicy",
            self.bucket_numel,
            self.cost_model,
            self.world_size,
            self.memory_budget,
            optimizer=self.optimizer,
            mesh=self.mesh,
            training=self.planned_step(),
            choose=self._choices(),
        )
        if auto is not None:  # keep the checked values (an int budget for 40e9)
            self.world_size, self.memory_budget = auto.world_size, auto.memory_budget
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
        check_pinned_options(
            self.pinned_plan,
            order=self.order,
            tracing_config=self.tracing_config,
            example_inputs=self.example_inputs,
            bucket_numel=self.bucket_numel,
            groups=self.groups,
            cost_model=self.cost_model,
            mesh=self.mesh,
        )
        if isinstance(self.example_inputs, list):
            self.example_inputs = tuple(self.example_inputs)
        elif self.example_inputs is not None and not isinstance(self.example_inputs, tuple):
            self.example_inputs = (self.example_inputs,)  # one tensor, or any one input
        watch(self, f"ParamExecOrderWrapPolicy({policy_name(self.init_policy)})")

    def __repr__(self) -> str:
        """The fields not at their defaults, large ones in short (the cost model by its
        origin and ranks, the order and the plan by their sizes), e.g.
        ``ParamExecOrderWrapPolicy(init_policy=always_wrap_policy, bucket_numel='auto',
        cost_model=CostModel(preset h100-nvlink-8, cuda, nccl, 8 ranks))``.
        """
        parts = [f"init_policy={policy_name(self.init_policy)}"]
        for f in dataclasses.fields(self)[1:]:
            value = getattr(self, f.name)
            if f.repr and value is not (None if f.default is dataclasses.MISSING else f.default):
                parts.append(f"{f.name}={short_repr(value)}")
        return f"{type(self).__name__}({', '.join(parts)})"

    def _use_pinned(self, model: nn.Module, group: dist.ProcessGroup | None) -> WrapPlan:
        """:meth:`build_plan` for a pinned plan: checked against ``model`` (and the
        order and parameters across ranks), then used as it is."""
        plan = self.pinned_plan
        assert plan is not None
        with fail_together("reading the pinned plan", group=group) if self.check_ranks else _NO_OP:
            check_plan_fits(plan, model, source="ParamExecOrderWrapPolicy.pinned_plan")
        if self.check_ranks and dist.is_available() and dist.is_initialized():
            check_order_across_ranks(plan.order, group=group, model=model)
        self.order, self.plan = plan.order, plan
        return plan

    # ---------------------------------------------------------------- planning
    def planned_step(self) -> TrainingStep | None:
        """The training step planned for: :attr:`training` with :attr:`checkpointing`
        in it (:func:`~execwrap.fsdp.plan_step.policy_step`).

        Raises:
            ValueError: both set the checkpointing.
        """
        return policy_step(
            self.training, self.checkpointing, self.checkpoint_every, self.bucket_numel
        )

    def _choices(self) -> tuple[str, ...] | None:
        """:attr:`choose`, without ``"checkpointing"`` when :attr:`checkpointing` fixes it."""
        return policy_choices(self.choose, self.checkpointing, self.bucket_numel)

    @property
    def recording(self) -> bool:
        """Whether the order is still to be recorded during the first step."""
        return is_recording(self)

    def build_plan(
        self,
        model: nn.Module,
        *,
        ignored_modules: Iterable[nn.Module] | None = None,
        group: dist.ProcessGroup | None = None,
        target: FSDPTarget | None = None,
    ) -> WrapPlan:
        """Get the order (saved, captured, or none yet) and plan ``model``'s units.

        Sets :attr:`order` and :attr:`plan`. With no way to an order now, the units
        come from ``init_policy`` alone, in definition order, and :attr:`order` stays
        ``None`` until recorded (:func:`execwrap.fsdp.first_step.record_first_step`).

        Args:
            model: the unwrapped model (the FSDP root).
            ignored_modules: modules FSDP ignores (not planned).
            group: process group for the cross-rank check (default ``WORLD``).
            target: ``"fsdp1"`` / ``"fsdp2"``: notes for that target only
                (FSDP1's ``_run_policy`` and ``apply_fully_shard`` pass it).

        Returns:
            The plan (building it does not count as applying the policy).

        Raises:
            tracing.TracingError: symbolic tracing failed and there are no
                example inputs to fall back to (the message names the module).
            execwrap.OrderDivergenceError: ranks captured different orders;
                :class:`execwrap.ParamMismatchError` (a subclass): ranks hold
                parameters of another shape, dtype or ``requires_grad``
                (checked before wrapping, also when the order is recorded
                during the first step).
            execwrap.RankFailure: another rank failed to capture or to plan (named,
                with its exception; :mod:`execwrap.distributed.status`).
        """
        if self.pinned_plan is not None:
            return self._use_pinned(model, group)
        ranks = self.check_ranks and is_distributed(group)
        if self.order is not None:
            order: ExecutionOrder | None = self.order
        elif ranks:  # a rank that fails to capture is named on the others
            with fail_together("capture (ParamExecOrderWrapPolicy)", group=group):
                order = self._capture(model)
        else:
            order = self._capture(model)
        if order is None and self.bucket_numel == "auto":
            raise ValueError(
                'ParamExecOrderWrapPolicy(bucket_numel="auto") plans from the execution order '
                "before wrapping, but there is none: pass order=, tracing_config= or "
                "example_inputs= (runtime capture with timing gives the planner compute times)"
            )
        if order is None:
            logger.info(
                "ParamExecOrderWrapPolicy: no order, tracing_config or example inputs; "
                "units from init_policy alone, order recorded during the first step"
            )
        planned = order if order is not None else empty_order(model)
        if self.check_ranks and dist.is_available() and dist.is_initialized():
            # the order, and this rank's parameters (shapes, dtypes, requires_grad); an
            # order recorded during the first step is checked after that step
            check_order_across_ranks(planned, group=group, model=model)
        self.order = order
        self.plan = plan_wrap_unwatched(
            model,
            planned,
            self.init_policy,
            bucket_numel=self.bucket_numel if order is not None else None,
            ignored_modules=list(ignored_modules or ()),
            groups=self.groups,
            target=target,
            cost_model=self.cost_model,
            world_size=self.world_size,
            memory_budget=self.memory_budget,
            optimizer=self.optimizer,
            mesh=self.mesh,
            training=self.planned_step(),
            choose=self._choices(),
            group=group,
            across_ranks=ranks,
        )
        return self.plan

    def _capture(self, model: nn.Module) -> ExecutionOrder | None:
        """Capture ``model``'s order from the tracing config / example inputs
        (``None`` when there is neither: it is recorded during the first step)."""
        if self.tracing_config is None and self.example_inputs is None:
            return None
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
        return order

    @unwatched_if_refused("self")
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

        Raises:
            ValueError: ``use_orig_params`` is ``False`` and units mix frozen
                and trainable parameters (a flat parameter has one
                ``requires_grad``); or the model has a 0-dim parameter FSDP
                would refuse (:func:`execwrap.fsdp.shardable.check_shardable`);
                a ``mixed_precision`` or ``cpu_offload`` FSDP1 would fail on;
                a ``checkpointing`` FQN the model lacks. All raised before
                anything is checkpointed or wrapped, naming what to fix.
            TypeError: ``mixed_precision`` or ``cpu_offload`` of the wrong class.

        The plan's units are checkpointed (``checkpointing``) here, before FSDP1
        wraps them.
        """
        group = root_kwargs.get("process_group")
        pg = group if isinstance(group, dist.ProcessGroup) else None
        plan = self.build_plan(
            root_module, ignored_modules=ignored_modules, group=pg, target="fsdp1"
        )
        # a rank whose local checks fail is named on the others, before FSDP1 wraps
        with fail_together("FSDP1's checks of the plan", group=pg) if self.check_ranks else _NO_OP:
            check_fsdp1_builds(self.bucket_numel, plan)
            if not root_kwargs.get("use_orig_params", False):
                check_uniform_requires_grad(root_module, plan)
            ignored_params = root_kwargs.get("ignored_states") or ()  # FSDP passes its set
            check_shardable(root_module, ignored_params=ignored_params, api="FSDP")
            check_fsdp1_kwargs(root_kwargs)
            check_fsdp1_hybrid(plan.mesh, root_kwargs)
            checkpointing, every = fsdp1_step(
                root_module, plan, root_kwargs, self.checkpointing, self.checkpoint_every
            )
            where = "ParamExecOrderWrapPolicy"
            targets = checkpoint_targets(
                root_module, plan.groups, checkpointing, every=every, where=where
            )
        checkpoint_modules(root_module, targets)
        mark_applied(self)
        result: dict[nn.Module, dict[str, Any]] = {}
        for module in resolve_modules(root_module, fsdp1_targets(plan)):
            if module in ignored_modules:
                continue
            kwargs = dict(root_kwargs)
            if self.forward_prefetch is not None:
                kwargs["forward_prefetch"] = self.forward_prefetch
            result[module] = kwargs
        if self.order is None:
            record_first_step(self, root_module, start_now=False, group=pg)
        logger.debug("ParamExecOrderWrapPolicy: %d FSDP1 targets", len(result))
        return result
