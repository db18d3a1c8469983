"""The auto-planner's options, checked once where they enter: :class:`AutoOptions`.

``plan_wrap``, ``ParamExecOrderWrapPolicy`` and ``search_plan`` take ``cost_model``,
``world_size``, ``memory_budget``, ``optimizer``, the training step (``training``: the
user's precision and micro-batch count) and what of the step the planner chooses
(``choose``) from the user; each checks them here, once, at its entry
(:func:`check_auto_options`), and passes the checked :class:`AutoOptions` down: the
search, its search space and the simulator's facts read checked values and never
check them again.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from execwrap.plan.training_step import TrainingStep
from execwrap.util.mesh import MeshShape
from tracing.checks import check_integral, check_size

if TYPE_CHECKING:
    from execwrap.cost import CostModel

__all__ = [
    "STEP_CHOICES",
    "AutoOptions",
    "check_auto_options",
    "check_choose",
    "check_memory_budget",
    "check_mesh",
    "check_training",
    "check_world_size",
]

#: What of the training step the auto-planner may choose (``choose=``): activation
#: checkpointing per unit, CPU offload, and the accumulation mode (``gradient_sync`` and
#: ``reshard_after_backward`` of the micro-batches). Precision and the micro-batch
#: count are the user's (they change the numerics).
STEP_CHOICES: tuple[str, ...] = ("checkpointing", "offload", "accumulation")


@dataclass(frozen=True)
class AutoOptions:
    """The auto-planner's inputs, checked (made only by :func:`check_auto_options`).

    Attributes:
        cost_model: the :class:`~execwrap.cost.CostModel` that prices every candidate.
        world_size: ranks planned for (``None``: the cost model's own world size); the cost
            model was checked to fit it.
        memory_budget: peak memory per rank in bytes, or ``None`` (``plan_wrap`` then
            plans within the device's memory less a reserve; ``search_plan`` alone:
            no limit).
        optimizer: the optimizer whose state the memory model counts
            (:data:`execwrap.simulate.OPTIMIZERS`; ``"adamw"`` when not given).
        mesh: the mesh planned for (:class:`~execwrap.util.mesh.MeshShape` of the
            ranks), ``"auto"`` (the shard group size is chosen:
            :mod:`execwrap.planning.auto.mesh`) or ``None`` (FSDP over every rank).
        training: the training step to plan for: its precision and micro-batch count
            are kept; of the settings in ``choose``, the planner chooses (they are at
            their defaults here), the others are kept as given.
        choose: the settings of :data:`STEP_CHOICES` the planner chooses.
    """

    cost_model: CostModel
    world_size: int | None
    memory_budget: int | None
    optimizer: str
    mesh: MeshShape | Literal["auto"] | None = None
    training: TrainingStep = field(default_factory=TrainingStep)
    choose: frozenset[str] = frozenset(STEP_CHOICES)


def check_memory_budget(memory_budget: Any, where: str) -> int | None:
    """``memory_budget`` (bytes per rank, or ``None``), checked and returned as an ``int``.

    A whole number of bytes: an int, a NumPy integer or a float with no
    fractional part (``40e9``).

    Raises:
        TypeError: not a whole number (a bool, a string, ``1.5``) nor ``None``.
        ValueError: zero or negative.
    """
    if memory_budget is None:
        return None
    try:
        return check_size(
            memory_budget, f"{where}: memory_budget", minimum=1, unit="bytes per rank"
        )
    except TypeError as e:
        raise TypeError(
            f"{where}: memory_budget must be a whole number of bytes per rank or None, got "
            f"{type(memory_budget).__name__} {memory_budget!r}"
        ) from e
    except ValueError as e:
        raise ValueError(
            f"{where}: memory_budget must be > 0 bytes per rank, got {memory_budget!r}; pass "
            "None to plan within the device's memory"
        ) from e


def check_world_size(world_size: Any, where: str) -> int | None:
    """``world_size`` (ranks, or ``None`` for the cost model's), checked and returned as an ``int``.

    An int or a NumPy integer (``np.int64(8)`` plans, and is saved, as ``8``).

    Raises:
        TypeError: not an integer (a bool, a float, a string) nor ``None``.
        ValueError: zero or negative.

    >>> check_world_size(8, "plan_wrap"), check_world_size(None, "plan_wrap")
    (8, None)
    """
    if world_size is None:
        return None
    return check_integral(world_size, f"{where}: world_size", minimum=1, unit="ranks")


def check_mesh(mesh: Any, world_size: int, where: str) -> MeshShape | Literal["auto"]:
    """``mesh`` (``"auto"``, a :class:`~execwrap.util.mesh.MeshShape`, a tuple or a
    ``DeviceMesh``) checked against ``world_size`` ranks.

    Raises:
        TypeError: not one of those.
        ValueError: another string, or a shape whose ranks are not ``world_size``.
    """
    if isinstance(mesh, str):
        if mesh != "auto":
            raise ValueError(
                f'{where}: mesh must be "auto", a (replicate, shard) shape or a DeviceMesh, '
                f"got {mesh!r}"
            )
        return "auto"
    return MeshShape.of(mesh, world_size=world_size, where=where)


def check_auto_options(
    where: str,
    bucket_numel: Any,
    cost_model: Any,
    world_size: Any,
    memory_budget: Any,
    *,
    optimizer: Any = None,
    mesh: Any = None,
    training: Any = None,
    choose: Any = None,
) -> AutoOptions | None:
    """Check the auto-planner's keywords of ``plan_wrap`` / ``ParamExecOrderWrapPolicy``, once.

    Returns:
        The checked :class:`AutoOptions` with ``bucket_numel="auto"``, else ``None`` (after
        checking that none of the auto-planner's keywords was given).

    Raises:
        ValueError: ``bucket_numel="auto"`` without a cost model, or with a
            ``world_size`` the cost model is not for (``CostModel.check_compatible``'s
            message); a cost model, world size, budget, optimizer or ``choose`` without
            ``bucket_numel="auto"``; a world size or budget that is not positive; an
            unknown optimizer; ``choose`` naming an unknown setting or one ``training``
            fixes (:func:`check_choose`).
        TypeError: a world size that is not an integer, a budget not a whole number; a
            cost model not a :class:`~execwrap.cost.CostModel` (a path or preset name: the
            message says how to load one); ``training`` not a :class:`~execwrap.TrainingStep`.
    """
    from execwrap.cost import CostModel
    from execwrap.simulate.step import OPTIMIZERS

    budget = check_memory_budget(memory_budget, where)
    step = check_training(training, where)
    ranks = check_world_size(world_size, where)
    if cost_model is not None and not isinstance(cost_model, CostModel):
        raise TypeError(
            f"{where}: cost_model must be an execwrap.CostModel, got "
            f"{type(cost_model).__name__} {cost_model!r}: load a file with "
            'CostModel.load(path), or take a preset with CostModel.preset("h100-nvlink-8")'
        )
    if optimizer is not None and optimizer not in OPTIMIZERS:
        raise ValueError(
            f"{where}: optimizer must be one of {sorted(OPTIMIZERS)}, got {optimizer!r}"
        )
    if bucket_numel == "auto":
        if cost_model is None:
            raise ValueError(
                f'{where}: bucket_numel="auto" needs cost_model= (execwrap.cost.CostModel: '
                'CostModel.calibrate() on the live process group, or CostModel.preset("...")) '
                "to predict step times"
            )
        if ranks is not None:  # the device is known only from the order's compute
            cost_model.check_compatible(world_size=ranks, device_type=cost_model.device_type)
        shape = None if mesh is None else check_mesh(mesh, ranks or cost_model.world_size, where)
        chosen = check_choose(choose, step, where)
        return AutoOptions(
            cost_model, ranks, budget, optimizer or "adamw", shape, training=step, choose=chosen
        )
    given = [
        name
        for name, value in (
            ("cost_model", cost_model),
            ("world_size", world_size),
            ("memory_budget", memory_budget),
            ("optimizer", optimizer),
            ('mesh="auto"', mesh if isinstance(mesh, str) else None),
            ("choose", choose),
        )
        if value is not None
    ]
    if given:
        verb = "applies" if len(given) == 1 else "apply"
        raise ValueError(
            f'{where}: {", ".join(given)} only {verb} with bucket_numel="auto" (got '
            f"bucket_numel={bucket_numel!r}); to predict a fixed plan's step call "
            "execwrap.simulate_step(plan, cost_model, world_size=...)"
        )
    return None


def check_training(training: Any, where: str) -> TrainingStep:
    """``training`` (``None``: :class:`TrainingStep()`), checked to be a :class:`TrainingStep`.

    Raises:
        TypeError: anything else (the message says how to make one).
    """
    if training is None:
        return TrainingStep()
    if not isinstance(training, TrainingStep):
        raise TypeError(
            f"{where}: training must be an execwrap.TrainingStep (e.g. TrainingStep("
            "precision=Precision(param_dtype='bfloat16', reduce_dtype='float32'), "
            f"micro_batches=4)) or None, got {type(training).__name__}"
        )
    return training


def check_choose(choose: Any, training: TrainingStep, where: str) -> frozenset[str]:
    """``choose`` as a set, each setting in it left to the planner by ``training``.

    ``None`` (``choose=`` not given): :data:`STEP_CHOICES` less the settings ``training``
    fixes (a checkpointing, offload or accumulation setting other than the default), which
    the plan keeps as given.

    Raises:
        TypeError: ``choose`` is a single string or not an iterable of strings.
        ValueError: an unknown setting, or one that ``training`` fixes in an explicit
            ``choose``: the message gives the ``choose=`` that keeps the setting.

    Example:
        >>> sorted(check_choose(("offload",), TrainingStep(), "plan_wrap"))
        ['offload']
        >>> sorted(check_choose(None, TrainingStep(offload="cpu"), "plan_wrap"))
        ['accumulation', 'checkpointing']
    """
    fixed = {
        "checkpointing": training.checkpointing != "none"
        or training.checkpoint_every != 1
        or bool(training.unit_checkpointing),
        "offload": training.offload != "none",
        "accumulation": training.gradient_sync != "every" or not training.reshard_after_backward,
    }
    if choose is None:
        return frozenset(n for n in STEP_CHOICES if not fixed[n])
    if isinstance(choose, str) or not isinstance(choose, Iterable):
        raise TypeError(
            f"{where}: choose must be an iterable of {list(STEP_CHOICES)} (e.g. "
            f"('checkpointing',)), got {choose!r}"
        )
    names = frozenset(choose)
    unknown = sorted(str(n) for n in names - set(STEP_CHOICES))
    if unknown:
        raise ValueError(
            f"{where}: choose names {unknown}; the planner chooses among {list(STEP_CHOICES)}"
        )
    clash = [n for n in STEP_CHOICES if n in names and fixed[n]]
    if clash:
        keep = tuple(n for n in STEP_CHOICES if n in names and not fixed[n])
        raise ValueError(
            f"{where}: training fixes {', '.join(clash)} but choose={tuple(sorted(names, key=STEP_CHOICES.index))!r} "
            f"leaves {'it' if len(clash) == 1 else 'them'} to the planner: pass "
            f"choose={keep!r} (or leave choose= out: it defaults to {STEP_CHOICES!r} less "
            "what training fixes) to keep training's setting, or leave "
            f"{'it' if len(clash) == 1 else 'them'} at the default in training for the "
            "planner to choose"
        )
    return names
