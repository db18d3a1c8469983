"""Errors raised by order capture."""

from __future__ import annotations

__all__ = ["TracingError"]


class TracingError(RuntimeError):
    """Capturing the execution order failed.

    Attributes:
        module_fqn: FQN of the innermost module being traced or run when the
            failure happened (``""`` is the root), or ``None`` if unknown.
        module_class: that module's class name, or ``None``.
        reason: what failed, in one line, without advice (e.g.
            ``"TraceError: symbolically traced variables cannot be used as
            inputs to control flow"``), or ``None``.
        advice: what to do about it, in one short clause, or ``None``.
    """

    def __init__(
        self,
        message: str,
        *,
        module_fqn: str | None = None,
        module_class: str | None = None,
        reason: str | None = None,
        advice: str | None = None,
    ) -> None:
        super().__init__(message)
        self.module_fqn = module_fqn
        self.module_class = module_class
        self.reason = reason
        self.advice = advice
