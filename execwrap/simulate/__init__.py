"""The FSDP2 step simulator: predicted step time, exposed communication and peak memory of a plan.

Modules, one job each:

* :mod:`~execwrap.simulate.step`: :func:`simulate_step`, the model and its assumptions;
* :mod:`~execwrap.simulate.schedule`: FSDP2's step as a program of ops, hook by hook;
* :mod:`~execwrap.simulate.engine`: the discrete-event engine (streams, rates, memory);
* :mod:`~execwrap.simulate.compute`: :class:`UnitCompute` and :func:`unit_compute`;
* :mod:`~execwrap.simulate.facts`: what simulating reads of a plan's order and of each
  plan, computed once (``SimulationFacts``, kept by the auto-planner for its search);
* :mod:`~execwrap.plan.estimate`: :class:`StepEstimate`, :class:`MemoryBreakdown`,
  :class:`StreamEvent`;
* :mod:`~execwrap.simulate.training`: :class:`TrainingStep` and :class:`Precision`, the
  training step around a plan (mixed precision, activation checkpointing, CPU offload,
  gradient accumulation), with :mod:`~execwrap.simulate.unit_spec` (bytes per dtype),
  :mod:`~execwrap.simulate.checkpointing` (what each checkpointing mode keeps) and
  :mod:`~execwrap.simulate.unit_work` (per-unit recomputation and memory).
"""

from execwrap.plan.estimate import MemoryBreakdown, StepEstimate, StreamEvent
from execwrap.simulate.compute import UnitCompute, unit_compute
from execwrap.simulate.step import OPTIMIZERS, simulate_step
from execwrap.simulate.training import Precision, TrainingStep

__all__ = [
    "OPTIMIZERS",
    "MemoryBreakdown",
    "Precision",
    "StepEstimate",
    "StreamEvent",
    "TrainingStep",
    "UnitCompute",
    "simulate_step",
    "unit_compute",
]
