"""Planning: from an ``init_policy`` and an execution order to a :class:`~execwrap.WrapPlan`.

Three layers, each importing only the ones below it (checked by import-linter, see
``pyproject.toml``):

* :mod:`~execwrap.planning.planner`: :func:`plan_wrap` and :func:`policy_units`, the entry
  points: validate once, then drive the steps below;
* :mod:`execwrap.planning.auto`: the auto-planner (``bucket_numel="auto"``): the search over
  groupings, prefetch depth and resharding, priced by :mod:`execwrap.simulate`;
* the units from a policy: :mod:`~execwrap.planning.auto_wrap` (an FSDP auto-wrap policy
  evaluated exactly as FSDP1 does), :mod:`~execwrap.planning.steps` (placing parameters,
  dropping units that cannot work), :mod:`~execwrap.planning.bucketing` (size-capped FSDP2
  groups in execution order) and :mod:`~execwrap.planning.stated_groups` (groups the user
  states).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tracing.lazy import lazy_exports

if TYPE_CHECKING:
    from execwrap.planning.bucketing import min_contiguous_groups
    from execwrap.planning.planner import plan_wrap, policy_units

_EXPORTS: dict[str, str] = {
    "min_contiguous_groups": "execwrap.planning.bucketing",
    "plan_wrap": "execwrap.planning.planner",
    "policy_units": "execwrap.planning.planner",
}

__all__ = ["min_contiguous_groups", "plan_wrap", "policy_units"]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
