"""Where a framework holds a policy object that it will ignore (no framework imported).

:func:`ignored_by` looks at frameworks that are already imported (through
``sys.modules``, never importing one) for a place that holds ``obj`` and will
not call it: accelerate's FSDP2 plugin (``auto_wrap_policy=policy``:
accelerate's FSDP2 path knows only ``transformer_auto_wrap_policy`` and
``size_based_auto_wrap_policy`` and leaves the blocks unsharded otherwise;
the HF Trainer builds its plugin from that same accelerate state). The
never-silent warning (:mod:`execwrap.watch.registry`) and the integrations use it
to say exactly which path ignored a policy.
"""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["ignored_by"]


def ignored_by(obj: Any) -> str | None:
    """A sentence naming the framework path that holds ``obj`` and ignores it, or ``None``."""
    state_module = sys.modules.get("accelerate.state")
    state_cls = getattr(state_module, "AcceleratorState", None)
    shared = getattr(state_cls, "_shared_state", None)
    plugin = shared.get("fsdp_plugin") if isinstance(shared, dict) else None
    if plugin is None or getattr(plugin, "auto_wrap_policy", None) is not obj:
        return None
    if getattr(plugin, "fsdp_version", 1) != 2:
        return None
    return (
        "accelerate's FSDP2 plugin holds it as auto_wrap_policy, and accelerate's FSDP2 "
        "preparation ignores policy objects (it knows only transformer_auto_wrap_policy and "
        "size_based_auto_wrap_policy), so the blocks were left unsharded; apply it with "
        "execwrap.integrations.accelerate.prepare_fully_shard(accelerator, model, policy) "
        "before accelerator.prepare (with the HF Trainer: "
        "execwrap.integrations.hf_trainer.ExecwrapTrainer(wrap_policy=policy))"
    )
