"""What activation checkpointing keeps and recomputes, per plan unit, from the capture.

Activation checkpointing wraps each module of a unit (a transformer block) in
a region whose saved tensors are dropped after its forward and made again in
backward. Per unit of a plan, from an order captured with estimated timing
(:attr:`tracing.ExecutionOrder.input_activation_bytes` and
:attr:`~tracing.ExecutionOrder.compute_ops`):

* full checkpointing (torch's ``checkpoint_wrapper``) keeps each region's
  inputs (its floating-point tensor arguments) and runs its whole forward
  again: what it keeps is :attr:`CheckpointFacts.input_bytes`;
* selective checkpointing, torchtitan's op-level policy as
  :func:`execwrap.fsdp.checkpointing.selective_checkpoint_policy` applies it
  (torchtitan 0.3's ``SelectiveAC``, through
  ``torch.utils.checkpoint.create_selective_checkpoint_contexts``): in each
  region, the outputs of the compute-intensive ops (the fused attention
  kernels, ``addmm``, ``bmm``, convolutions) and of every other ``aten.mm``
  (the 1st, 3rd, ... of the region) are kept, everything else runs again. It
  keeps the region's inputs and those outputs
  (:attr:`CheckpointFacts.selective_bytes`) and runs again all of the forward
  but the kept ops (:attr:`CheckpointFacts.selective_saved_s` is their time).
  For a bias-free transformer (matmuls and attention only) this is also the
  December 2024 policy of torchtitan's published benchmarks (``_save_list``:
  ``mm`` and the attention kernels). The CPU's fused attention kernel is not
  on the list (a CPU step recomputes it); an order captured for another
  device (``timing_device``) stands for the CUDA kernel, which is.

Both modes add host work per op of a region (:attr:`CheckpointFacts.region_ops`,
from :attr:`~tracing.ExecutionOrder.forward_op_counts`): selective checkpointing's
dispatch modes see every op of the forward and of the recomputation, full
checkpointing's saved-tensor hooks pack and unpack what the ops save. The cost
model prices it (:attr:`~execwrap.cost.CostModel.checkpoint_overhead`), per op and
per region call (:attr:`CheckpointFacts.regions`).

Regions are the calls of the unit's own modules (``plan.units[i].module_fqns``);
an op belongs to the region of the nearest enclosing such call.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from execwrap.plan.wrap_plan import WrapPlan

__all__ = ["SELECTIVE_ALTERNATE_OPS", "SELECTIVE_SAVE_OPS", "CheckpointFacts", "checkpoint_facts"]

#: Ops whose outputs the selective policy saves (aten names: torch's partitioner's
#: compute-intensive ops of the recorded kinds, and the attention kernels torchtitan adds).
SELECTIVE_SAVE_OPS = frozenset(
    {
        "mm",
        "addmm",
        "bmm",
        "convolution",
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention",
    }
)
#: The CPU's fused attention kernel, which a capture on the meta device records: saved when
#: the order is for another device (it stands for the CUDA kernel there).
_CPU_ATTENTION = "_scaled_dot_product_flash_attention_for_cpu"
#: Of :data:`SELECTIVE_SAVE_OPS`, the ones saved every other time in a region (the 1st, 3rd, ...).
SELECTIVE_ALTERNATE_OPS = frozenset({"mm"})


@dataclass(frozen=True)
class CheckpointFacts:
    """Per plan unit (in ``plan.units`` order): what each checkpointing mode keeps.

    Attributes:
        input_bytes: bytes of the inputs of the unit's regions (full checkpointing).
        selective_bytes: ``input_bytes`` plus the outputs selective checkpointing keeps.
        selective_saved_s: forward seconds of the ops whose outputs selective
            checkpointing keeps (they do not run again).
        region_ops: aten ops the unit's regions dispatch in one forward (empty: the
            order did not count them).
        regions: the unit's region calls in one forward.
    """

    input_bytes: tuple[int, ...]
    selective_bytes: tuple[int, ...]
    selective_saved_s: tuple[float, ...]
    region_ops: tuple[int, ...] = ()
    regions: tuple[int, ...] = ()


def checkpoint_facts(plan: WrapPlan, calls: list[int]) -> CheckpointFacts | None:
    """The :class:`CheckpointFacts` of ``plan`` from its order.

    Args:
        plan: the plan.
        calls: the unit of each forward call (as :func:`~execwrap.simulate.unit_compute`
            attributes them).

    Returns:
        ``None`` when the order did not record region inputs (a capture without
        estimated timing, or saved before they were recorded).
    """
    order = plan.order
    n_calls = len(order.module_forward_order)
    if len(order.input_activation_bytes) != n_calls or n_calls == 0:
        return None
    n = len(plan.units)
    region = _regions(plan, calls)
    inputs = [0] * n
    counted = len(order.forward_op_counts) == n_calls
    ops = [0] * n
    starts = [0] * n
    for c in range(n_calls):
        if region[c] == c:
            inputs[calls[c]] += int(order.input_activation_bytes[c])
            starts[calls[c]] += 1
        if counted and region[c] >= 0:
            ops[calls[c]] += int(order.forward_op_counts[c])
    kept = list(inputs)
    saved_s = [0.0] * n
    counts: dict[int, int] = {}
    save = SELECTIVE_SAVE_OPS | ({_CPU_ATTENTION} if order.timing_device != "cpu" else set())
    for op in order.compute_ops:
        if not 0 <= op.call_index < n_calls or op.op not in save:
            continue
        r = region[op.call_index]
        if op.op in SELECTIVE_ALTERNATE_OPS:
            counts[r] = counts.get(r, 0) + 1
            if counts[r] % 2 == 0:
                continue
        u = calls[op.call_index]
        kept[u] += int(op.output_bytes)
        saved_s[u] += float(op.seconds)
    return CheckpointFacts(
        tuple(inputs), tuple(kept), tuple(saved_s), tuple(ops) if counted else (), tuple(starts)
    )


def _regions(plan: WrapPlan, calls: list[int]) -> list[int]:
    """For each call, the call that starts its checkpoint region: the nearest enclosing
    call (itself included) of a module of the call's unit (``-1``: none)."""
    order = plan.order
    fqns = order.module_forward_order
    parents = order.enclosing_calls() or [-1] * len(fqns)
    own = [set(u.module_fqns) for u in plan.units]
    region = [-1] * len(fqns)
    for c, fqn in enumerate(fqns):
        if fqn in own[calls[c]]:
            region[c] = c
        else:
            p = parents[c]
            region[c] = region[p] if p >= 0 and calls[p] == calls[c] else -1
    return region
