"""transformers 5's own FSDP2 path (``from_pretrained(..., distributed_config=...)``) and execwrap's plans.

* :mod:`~execwrap.integrations.transformers.resolve`: :func:`resolve_fsdp_plan`, the
  groups transformers builds, resolved by its own code;
* :mod:`~execwrap.integrations.transformers.fsdp_plan`: :func:`load_fsdp_plan` (a
  model's own plan as a :class:`~execwrap.WrapPlan`), :func:`to_fsdp_plan` (a plan
  as an ``fsdp_plan`` dict), :func:`distributed_config_for`, :func:`model_order`;
* :mod:`~execwrap.integrations.transformers.apply`: :func:`applying_plan` (any plan
  through ``from_pretrained``), :func:`set_prefetch`;
* :mod:`~execwrap.integrations.transformers.pretrained`: :func:`plan_from_pretrained`
  and :func:`plan_from_config`, one call from a model id, folder or config, planned
  for its ``DistributedConfig``'s mesh (:func:`config_mesh`: HSDP's replicas, TP).

Importing this package imports transformers.
"""

from __future__ import annotations

from execwrap.integrations.transformers.apply import AppliedPlans, applying_plan, set_prefetch
from execwrap.integrations.transformers.fsdp_plan import (
    distributed_config_for,
    load_fsdp_plan,
    model_order,
    to_fsdp_plan,
)
from execwrap.integrations.transformers.pretrained import (
    TransformersPlan,
    config_mesh,
    plan_from_config,
    plan_from_pretrained,
)
from execwrap.integrations.transformers.resolve import ResolvedFsdpPlan, resolve_fsdp_plan

__all__ = [
    "AppliedPlans",
    "ResolvedFsdpPlan",
    "TransformersPlan",
    "applying_plan",
    "config_mesh",
    "distributed_config_for",
    "load_fsdp_plan",
    "model_order",
    "plan_from_config",
    "plan_from_pretrained",
    "resolve_fsdp_plan",
    "set_prefetch",
    "to_fsdp_plan",
]
