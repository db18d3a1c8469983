"""The FSDP2 step simulator: predicted step time, exposed communication and peak memory of a plan.

Modules, one job each:

* :mod:`~execwrap.simulate.step`: :func:`simulate_step`, the model and its assumptions;
* :mod:`~execwrap.simulate.schedule`: FSDP2's step as a program of ops, hook by hook;
* :mod:`~execwrap.simulate.engine`: the discrete-event engine (streams, rates, memory);
* :mod:`~execwrap.simulate.compute`: :class:`UnitCompute` and :func:`unit_compute`;
* :mod:`~execwrap.simulate.facts`: what simulating reads of a plan's order and of each
  plan, computed once (``SimulationFacts``, kept by the auto-planner for its search);
* :mod:`~execwrap.plan.estimate`: :class:`StepEstimate`, :class:`MemoryBreakdown`,
  :class:`StreamEvent`.
"""

from execwrap.plan.estimate import MemoryBreakdown, StepEstimate, StreamEvent
from execwrap.simulate.compute import UnitCompute, unit_compute
from execwrap.simulate.step import OPTIMIZERS, simulate_step

__all__ = [
    "OPTIMIZERS",
    "MemoryBreakdown",
    "StepEstimate",
    "StreamEvent",
    "UnitCompute",
    "simulate_step",
    "unit_compute",
]
