"""Calibration of a :class:`~execwrap.cost.CostModel` on the live process group (work in progress)."""

from __future__ import annotations

from typing import Any

__all__ = ["calibration_fields"]


def calibration_fields(
    group: Any = None, *, device: Any = None, max_bytes: int | None = None
) -> dict[str, Any]:
    """Constructor arguments of a calibrated CostModel (not implemented yet)."""
    raise NotImplementedError("CostModel.calibrate is being written")
