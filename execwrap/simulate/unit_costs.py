"""Each unit's copy and collective seconds, computed once per step program.

:class:`~execwrap.simulate.schedule.StepProgram` needs the same few prices of a unit in
every micro-batch and in both passes (the copy-out alone sums one copy per parameter
tensor, :meth:`~execwrap.cost.CostModel.copy_out_time`); this table prices each unit
once from its :class:`~execwrap.simulate.unit_spec.UnitSpec`. Seconds, the cost
model's own numbers: nothing is approximated.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from execwrap.cost.model import CostModel
from execwrap.simulate.unit_spec import UnitSpec

__all__ = ["UnitCosts"]


@dataclass(frozen=True)
class UnitCosts:
    """Per unit (indexed like the specs), seconds.

    Attributes:
        gather_overhead_s: FSDP2's fixed work per all-gather (``collective_overhead``
            of the unit's parameter tensors).
        copy_in_s: the all-gather copy-in (``copy_time(copy_in_bytes)``).
        all_gather_s: the all-gather (``all_gather_time(nbytes)``).
        copy_out_s: the copy-out into the parameters (``copy_out_time(param_bytes)``).
        reduce_overhead_s: fixed work per reduce-scatter (its trainable tensors).
        reduce_copy_s: the reduce-scatter copy-in (``copy_time(reduce_copy_bytes)``).
        reduce_scatter_s: the reduce-scatter (``reduce_scatter_time(grad_bytes)``).
    """

    gather_overhead_s: tuple[float, ...]
    copy_in_s: tuple[float, ...]
    all_gather_s: tuple[float, ...]
    copy_out_s: tuple[float, ...]
    reduce_overhead_s: tuple[float, ...]
    reduce_copy_s: tuple[float, ...]
    reduce_scatter_s: tuple[float, ...]

    @classmethod
    def of(cls, specs: Sequence[UnitSpec], cm: CostModel) -> UnitCosts:
        """The table of ``specs`` priced by ``cm``."""
        return cls(
            gather_overhead_s=tuple(cm.collective_overhead(s.tensors) for s in specs),
            copy_in_s=tuple(cm.copy_time(s.copy_in_bytes) for s in specs),
            all_gather_s=tuple(cm.all_gather_time(s.nbytes) for s in specs),
            copy_out_s=tuple(cm.copy_out_time(s.param_bytes) for s in specs),
            reduce_overhead_s=tuple(cm.collective_overhead(s.grad_tensors) for s in specs),
            reduce_copy_s=tuple(cm.copy_time(s.reduce_copy_bytes) for s in specs),
            reduce_scatter_s=tuple(cm.reduce_scatter_time(s.grad_bytes) for s in specs),
        )
