"""Execution-order capture for PyTorch models (symbolic and runtime).

``tracing`` knows torch and torch.fx, nothing of FSDP; it never imports
``execwrap``.
"""

from tracing.capture import capture_execution_order
from tracing.config import TracingConfig
from tracing.errors import TracingError
from tracing.order import SCHEMA_VERSION, ExecutionOrder, ParamInfo, ParamUse
from tracing.runtime import RuntimeRecorder, record_execution_order
from tracing.symbolic import trace_execution_order

__all__ = [
    "SCHEMA_VERSION",
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
