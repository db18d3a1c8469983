"""Symbolic execution-order capture with ``torch.fx`` (no inputs, no compute).

* :mod:`~tracing.symbolic.trace`: :func:`trace_execution_order`, the public
  verb: validates the config, runs one trace, restores tracer and model, and
  turns a tracer failure into a :class:`~tracing.errors.TracingError` naming
  the module;
* :mod:`~tracing.symbolic.recorder`: what is recorded while fx builds its
  graph (module calls, parameter uses) and how the tracer is wrapped;
* :mod:`~tracing.symbolic.signature`: the root's arguments, bound to
  ``forward``'s signature (example inputs, defaults, ``concrete_args``);
* :mod:`~tracing.symbolic.diagnosis`: why a trace failed (a branch on an
  argument, a shape or a value).
"""

from tracing.symbolic.signature import check_concrete_args
from tracing.symbolic.trace import trace_execution_order

__all__ = ["check_concrete_args", "trace_execution_order"]
