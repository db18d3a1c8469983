"""Symbolic execution-order capture with torch.fx (STUB: being written)."""

from __future__ import annotations

import torch.nn as nn

from tracing.config import TracingConfig
from tracing.order import ExecutionOrder

__all__ = ["trace_execution_order"]


def trace_execution_order(model: nn.Module, config: TracingConfig | None = None) -> ExecutionOrder:
    raise NotImplementedError
