"""What FSDP refuses to shard, found before anything is wrapped: :func:`check_shardable`.

FSDP1 and FSDP2 refuse a 0-dim (scalar) parameter, such as CLIP's
``logit_scale``, when they meet it while wrapping a unit
(``torch.distributed.fsdp._init_utils._verify_managed_params``: "FSDP doesn't
support scalar parameters. Change NAME to a 1D tensor with numel equal to 1.";
``_fully_shard/_fsdp_init.py::_verify_managed_param`` says the same for
``fully_shard``). By then the units nested deeper are already wrapped and the
model is half converted. :func:`apply_fully_shard` and
:class:`ParamExecOrderWrapPolicy` call :func:`check_shardable` first, so the
model is refused whole, untouched, with torch's remedy and the other one
(keep the parameter unsharded on every rank).

:func:`check_uniform_dtype` finds the other thing FSDP2 refuses late: a group
whose trainable parameters mix dtypes with no ``mp_policy`` casting them
("FSDP expects uniform original parameter dtype", raised at the first forward
without naming the module).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

import torch.nn as nn

from execwrap.util.text import listed

if TYPE_CHECKING:
    from execwrap.plan.wrap_plan import WrapPlan

__all__ = [
    "check_shardable",
    "check_uniform_dtype",
    "check_uniform_requires_grad",
    "scalar_params",
]


def scalar_params(model: nn.Module, ignored: Iterable[nn.Parameter] = ()) -> list[str]:
    """FQNs of ``model``'s 0-dim parameters that are not in ``ignored``
    (canonical names, ``named_parameters()`` order)."""
    skip = {id(p) for p in ignored}
    return [fqn for fqn, p in model.named_parameters() if p.dim() == 0 and id(p) not in skip]


def check_shardable(
    model: nn.Module,
    *,
    ignored_params: Iterable[nn.Parameter] = (),
    api: Literal["fully_shard", "FSDP"] = "fully_shard",
) -> None:
    """Refuse a model FSDP cannot shard, before anything is wrapped.

    Args:
        model: the unwrapped model.
        ignored_params: parameters FSDP leaves alone (FSDP2 ``ignored_params``,
            FSDP1 ``ignored_states`` and the parameters of ignored modules).
        api: which FSDP will shard it, for the message.

    Raises:
        ValueError: ``model`` has a 0-dim parameter outside ``ignored_params``;
            the message names every such parameter and both remedies.

    Example:
        >>> import torch
        >>> m = nn.Module()
        >>> m.logit_scale = nn.Parameter(torch.tensor(2.0))
        >>> check_shardable(m, ignored_params=[m.logit_scale])  # left unsharded: accepted
        >>> check_shardable(m)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: apply_fully_shard: Module has 1 0-dim (scalar) parameter, 'logit_scale', ...
    """
    scalars = scalar_params(model, ignored_params)
    if not scalars:
        return
    first = scalars[0]
    if api == "fully_shard":
        who, torch_says = "apply_fully_shard", "fully_shard doesn't support scalar parameters."
        keep = f"apply_fully_shard(model, ..., ignored_params={{model.get_parameter({first!r})}})"
    else:
        who, torch_says = "ParamExecOrderWrapPolicy", "FSDP doesn't support scalar parameters."
        keep = f"FSDP(model, ..., ignored_states=[model.get_parameter({first!r})])"
    listed = ", ".join(repr(s) for s in scalars[:5]) + (", ..." if len(scalars) > 5 else "")
    plural = "parameters" if len(scalars) > 1 else "parameter"
    raise ValueError(
        f"{who}: {type(model).__name__} has {len(scalars)} 0-dim (scalar) {plural}, {listed}, "
        f'which {api} refuses (torch: "{torch_says} Change {first} to a 1D tensor with numel '
        'equal to 1."); nothing has been wrapped. Make each a 1-D parameter of one element '
        "(e.g. nn.Parameter(t.reshape(1)), read as p[0]), or keep it unsharded on every rank: "
        f"{keep}"
    )


def check_uniform_dtype(
    model: nn.Module,
    fqns: list[str],
    param_fqns: Sequence[str],
    kwargs: Mapping[str, Any],
) -> None:
    """Refuse a group whose trainable parameters mix dtypes, unless its
    ``mp_policy`` casts them to one ``param_dtype`` (FSDP2 otherwise fails at
    the first forward with ``AssertionError: FSDP expects uniform original
    parameter dtype``, naming no module). ``kwargs``: the group's ``fully_shard``
    kwargs."""
    policy = kwargs.get("mp_policy")
    if policy is not None and getattr(policy, "param_dtype", None) is not None:
        return
    ignored = {id(p) for p in (kwargs.get("ignored_params") or ())}
    dtypes: dict[str, str] = {}
    for name in param_fqns:
        try:
            param = model.get_parameter(name)
        except AttributeError:
            continue
        if param.requires_grad and id(param) not in ignored:
            dtypes.setdefault(str(param.dtype).removeprefix("torch."), name)
    if len(dtypes) > 1:
        shown = ", ".join(f"{d} ({n})" for d, n in sorted(dtypes.items()))
        group = "the root group" if fqns == [""] else f"group {fqns}"
        raise ValueError(
            f"apply_fully_shard: {group} mixes trainable parameter dtypes: {shown}; FSDP2 "
            "needs one dtype per group. Pass mp_policy=MixedPrecisionPolicy(param_dtype=...), "
            "cast the module to one dtype, or plan with a finer init_policy that puts them "
            "in different groups"
        )


def check_uniform_requires_grad(root: nn.Module, plan: WrapPlan) -> None:
    """FSDP1 with ``use_orig_params=False``: every unit one ``requires_grad``."""
    trainable = {fqn: p.requires_grad for fqn, p in root.named_parameters()}
    mixed = []
    for unit in plan.units:
        flags = {trainable[p] for p in unit.param_fqns if p in trainable}
        if len(flags) > 1:
            n = sum(trainable.get(p, False) for p in unit.param_fqns)
            mixed.append(f"{unit.label} ({n} of {len(unit.param_fqns)} parameters trainable)")
    if mixed:
        raise ValueError(
            f"ParamExecOrderWrapPolicy: FSDP1 with use_orig_params=False flattens each unit "
            f"into one flat parameter with one requires_grad, but {len(mixed)} of "
            f"{len(plan.units)} units mix frozen and trainable parameters: "
            f"{listed(mixed, 5)}. Pass use_orig_params=True to FSDP, or use an init_policy "
            "that wraps the trainable modules separately (for PEFT models: "
            "peft.utils.other.fsdp_auto_wrap_policy(model))"
        )
