"""Runtime execution-order capture with hooks (STUB: being written)."""

from __future__ import annotations

from typing import Any

import torch.nn as nn

from tracing.order import ExecutionOrder

__all__ = ["RuntimeRecorder", "record_execution_order"]


class RuntimeRecorder:
    def __init__(self, model: nn.Module) -> None:
        raise NotImplementedError


def record_execution_order(model: nn.Module, *args: Any, **kwargs: Any) -> ExecutionOrder:
    raise NotImplementedError
