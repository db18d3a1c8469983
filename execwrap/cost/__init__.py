"""The cost model of FSDP2 communication on one cluster: calibrated, preset, saved as JSON.

Modules, one job each:

* :mod:`~execwrap.cost.model`: :class:`CostModel` (times, compatibility checks, JSON);
* :mod:`~execwrap.cost.curve`: :class:`CollectiveCurve`, piecewise latency + bytes / bandwidth;
* :mod:`~execwrap.cost.presets`: cited presets for common GPU clusters;
* :mod:`~execwrap.cost.calibrate`: the measurement on the live process group.

Importing this package loads no torch (the calibration imports it when it runs).
"""

from execwrap.cost.curve import CollectiveCurve, CurveSegment
from execwrap.cost.model import CostModel
from execwrap.cost.presets import PRESETS
from tracing.rates import ComputeRates

__all__ = ["PRESETS", "CollectiveCurve", "ComputeRates", "CostModel", "CurveSegment"]
