"""Execution-order capture for PyTorch models (symbolic and runtime).

``tracing`` knows torch and torch.fx, nothing of FSDP; it never imports
``execwrap``. Importing ``tracing`` loads nothing heavy: each name below is
imported from its module on first use (PEP 562), so that torch-free helpers
such as :mod:`tracing.fqn` and :mod:`tracing.checks` can be used without torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tracing.lazy import lazy_exports

if TYPE_CHECKING:
    from tracing.capture import capture_execution_order
    from tracing.config import TracingConfig
    from tracing.errors import TracingError
    from tracing.order import SCHEMA_VERSION, ExecutionOrder, ParamInfo, ParamUse
    from tracing.rates import ComputeRates
    from tracing.runtime import RuntimeRecorder, record_execution_order
    from tracing.symbolic import trace_execution_order

#: Public name -> module that defines it (imported on first use).
_EXPORTS: dict[str, str] = {
    "capture_execution_order": "tracing.capture",
    "TracingConfig": "tracing.config",
    "TracingError": "tracing.errors",
    "SCHEMA_VERSION": "tracing.order",
    "ExecutionOrder": "tracing.order",
    "ParamInfo": "tracing.order",
    "ParamUse": "tracing.order",
    "ComputeRates": "tracing.rates",
    "RuntimeRecorder": "tracing.runtime",
    "record_execution_order": "tracing.runtime",
    "trace_execution_order": "tracing.symbolic",
}

__all__ = [
    "SCHEMA_VERSION",
    "ComputeRates",
    "ExecutionOrder",
    "ParamInfo",
    "ParamUse",
    "RuntimeRecorder",
    "TracingConfig",
    "TracingError",
    "capture_execution_order",
    "record_execution_order",
    "trace_execution_order",
]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
