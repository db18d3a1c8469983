"""Symbolic capture with runtime fallback (STUB: being written)."""

from __future__ import annotations

from typing import Any

import torch.nn as nn

from tracing.order import ExecutionOrder

__all__ = ["capture_execution_order"]


def capture_execution_order(model: nn.Module, *args: Any, **kwargs: Any) -> ExecutionOrder:
    raise NotImplementedError
