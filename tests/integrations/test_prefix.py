"""A submodule's order and plan, renamed into its parent (no framework needed)."""

from __future__ import annotations

import torch.nn as nn
from torch.distributed.fsdp.wrap import ModuleWrapPolicy

from execwrap.demo_models import Block, build_demo_model
from execwrap.integrations import lift_order, lift_plan, submodule_prefix
from execwrap.planning.planner import plan_wrap
from tracing import trace_execution_order


class Holder(nn.Module):
    """Holds a model as ``self.model`` and never runs a forward of its own (a LightningModule)."""

    def __init__(self) -> None:
        super().__init__()
        self.model = build_demo_model(n_blocks=2)


def test_lifted_plan_is_the_parents_plan_with_the_lifted_order() -> None:
    holder = Holder()
    assert submodule_prefix(holder, holder.model) == "model"
    plan = plan_wrap(holder.model, trace_execution_order(holder.model), ModuleWrapPolicy({Block}))
    lifted = lift_plan(plan, "model", holder)
    native = plan_wrap(holder, lift_order(plan.order, "model", holder), ModuleWrapPolicy({Block}))
    assert lifted.groups == native.groups == [[""], ["model.blocks.0"], ["model.blocks.1"]]
    assert lifted.units == native.units
    assert (
        lifted.notes[0]
        == native.notes[0]
        == (
            "Tied parameter 'model.wte.weight' (also 'model.lm_head.weight') is used by modules "
            "'model.wte' and 'model.lm_head'; it stays in unit <root>, which encloses both."
        )
    )
    lifted.check(holder)
    assert lifted.stats(1) == plan.stats(1)
    order = lift_order(plan.order, "model", holder)
    assert order.module_forward_order[:3] == ["", "model", "model.wte"]
    assert order.module_classes[""] == "Holder"
    assert list(order.params) == [n for n, _ in holder.named_parameters()]
