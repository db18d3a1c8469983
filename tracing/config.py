"""Symbolic tracing configuration."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch.fx

__all__ = ["TracingConfig"]


@dataclass
class TracingConfig:
    """How to trace a model symbolically with ``torch.fx``.

    The same fields and meaning as torch's 2022
    ``torch.distributed.fsdp._trace_utils.TracingConfig``.

    Args:
        tracer: any :class:`torch.fx.Tracer` instance (e.g. transformers'
            ``HFTracer``, or a subclass whose ``is_leaf_module`` hides a block).
            Each config gets its own fresh ``torch.fx.Tracer()`` by default,
            never one instance shared by every config.
        concrete_args: arguments of ``forward`` to keep concrete (not proxies),
            exactly as :meth:`torch.fx.Tracer.trace` takes them; use it to
            remove control flow on flags, e.g. ``{"use_cache": False}``.

    Raises:
        TypeError: ``tracer`` is not a ``torch.fx.Tracer`` instance, or
            ``concrete_args`` is not a dict or ``None``.

    Example:
        >>> cfg = TracingConfig(concrete_args={"flag": True})
        >>> cfg.tracer is TracingConfig().tracer
        False
    """

    tracer: torch.fx.Tracer = field(default_factory=torch.fx.Tracer)
    concrete_args: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.tracer, torch.fx.Tracer):
            hint = ""
            if isinstance(self.tracer, type) and issubclass(self.tracer, torch.fx.Tracer):
                hint = f"; pass an instance, e.g. tracer={self.tracer.__name__}()"
            raise TypeError(
                "TracingConfig.tracer must be a torch.fx.Tracer instance, "
                f"got {type(self.tracer).__name__}{hint}"
            )
        if self.concrete_args is not None and not isinstance(self.concrete_args, dict):
            raise TypeError(
                "TracingConfig.concrete_args must be a dict mapping forward argument "
                f"names to values, or None; got {type(self.concrete_args).__name__}"
            )
