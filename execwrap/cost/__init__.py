"""The cost model of FSDP2 communication on one cluster: calibrated, preset, saved as JSON.

Modules, one job each:

* :mod:`~execwrap.cost.model`: :class:`CostModel` (times, compatibility checks, JSON), with
  :mod:`~execwrap.cost.model_fields` (the saved JSON's fields, checked on load);
* :mod:`~execwrap.cost.curve`: :class:`CollectiveCurve`, piecewise latency + bytes / bandwidth;
* :mod:`~execwrap.cost.presets`: cited presets for common GPU clusters, each with its
  :mod:`~execwrap.cost.topology` (nodes, NVLink, network: NCCL's time over any group);
* :mod:`~execwrap.cost.mesh`: the model over a 2-D mesh (:meth:`CostModel.for_mesh`),
  with :mod:`~execwrap.cost.mesh_sweep` (each mesh dimension's group measured);
* :mod:`~execwrap.cost.calibrate`: the measurement on the live process group, with
  :mod:`~execwrap.cost.sweep` (bare collectives and copies by size),
  :mod:`~execwrap.cost.fixed_costs` (FSDP2's costs inside a step), :mod:`~execwrap.cost.fit`
  (the least-squares fits), :mod:`~execwrap.cost.host` (steal time on virtual machines)
  and :mod:`~execwrap.cost.checkpoint_timing` (activation checkpointing's host work,
  :class:`CheckpointOpCost` of :mod:`~execwrap.cost.checkpoint_overhead`).

Importing this package loads no torch (the calibration imports it when it runs).
"""

from execwrap.cost.checkpoint_overhead import CheckpointOpCost
from execwrap.cost.curve import CollectiveCurve, CurveSegment
from execwrap.cost.mesh import GroupCurves
from execwrap.cost.model import CostModel
from execwrap.cost.presets import PRESETS
from execwrap.cost.topology import Topology
from tracing.rates import ComputeRates

__all__ = [
    "PRESETS",
    "CheckpointOpCost",
    "CollectiveCurve",
    "ComputeRates",
    "CostModel",
    "CurveSegment",
    "GroupCurves",
    "Topology",
]
