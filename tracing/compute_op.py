"""One op an activation-checkpointing policy chooses from, as the capture recorded it.

:class:`ComputeOp` is plain data in :attr:`tracing.ExecutionOrder.compute_ops`:
a matrix multiply or a fused attention kernel of a forward call (see
:mod:`tracing.runtime.op_record`), with the bytes of its outputs and its
estimated seconds. A selective checkpointing policy (torchtitan's saves the
outputs of the attention kernels and of every other ``mm`` of a block) keeps
the outputs of the ops it saves and runs the rest of the block again in
backward; these entries give both sides of that trade.
"""

from __future__ import annotations

from typing import Any, NamedTuple

__all__ = ["ComputeOp"]


class ComputeOp(NamedTuple):
    """One recorded forward op.

    Attributes:
        call_index: the forward call it ran in (the innermost one), an index into
            :attr:`~tracing.ExecutionOrder.module_forward_order`.
        op: the aten op's name, e.g. ``"mm"``, ``"_scaled_dot_product_flash_attention"``.
        output_bytes: bytes of its output tensors.
        seconds: its estimated time (``0.0`` where it was not estimated).

    Example:
        >>> ComputeOp.from_dict(ComputeOp(3, "mm", 4096, 1e-5).to_dict())
        ComputeOp(call_index=3, op='mm', output_bytes=4096, seconds=1e-05)
    """

    call_index: int
    op: str
    output_bytes: int
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return self._asdict()

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ComputeOp:
        """Inverse of :meth:`to_dict` (of checked fields)."""
        return cls(
            int(data["call_index"]),
            str(data["op"]),
            int(data["output_bytes"]),
            float(data.get("seconds", 0.0)),
        )
