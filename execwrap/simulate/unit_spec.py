"""What the step program needs of one plan unit: its bytes in each dtype FSDP2 moves them in.

:class:`UnitSpec` holds, per plan unit, the bytes of its parameters as FSDP2
pads them for the world size (:func:`~execwrap.simulate.facts.padded_bytes`),
and :meth:`UnitSpec.with_precision` sizes them for a
:class:`~execwrap.Precision` as FSDP2's
``MixedPrecisionPolicy`` moves them (torch 2.13,
``_fully_shard/_fsdp_param.py`` and ``_fsdp_collectives.py``):

* the all-gather's copy-in reads each shard in its own dtype and writes it in
  ``param_dtype`` (``foreach_all_gather``'s cast); the all-gather output, the
  unsharded parameters and their gradients are in ``param_dtype``;
* the reduce-scatter's copy-in reads the unsharded gradients and writes them
  in ``reduce_dtype`` (``foreach_reduce_scatter_copy_in``); the reduce-scatter
  moves ``reduce_dtype`` bytes;
* the sharded parameters, the sharded gradients (cast back to the parameters'
  dtype after the reduction) and the optimizer state stay in the parameters' dtype.

A copy that reads ``r`` bytes and writes ``w`` is priced as a copy of
``(r + w) / 2`` bytes (:meth:`execwrap.cost.CostModel.copy_time` prices a copy
of ``n`` bytes, which reads and writes ``n`` each).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from execwrap.simulate.training import DTYPES, Precision, dtype_itemsize

__all__ = ["UnitSpec"]


@dataclass(frozen=True)
class UnitSpec:
    """What the program needs of one plan unit.

    Attributes:
        label: the unit's label.
        nbytes: all-gather output bytes (parameters padded as FSDP2 pads, in the
            dtype they are gathered in).
        grad_bytes: reduce-scatter input bytes (the trainable parameters, padded,
            in the dtype they are reduced in).
        runs_forward: whether a module of the unit is called in forward.
        runs_backward: whether autograd runs backward through it.
        reshard: whether it reshards after forward.
        enclosing: indices of the units enclosing it.
        tensors: its parameter tensors.
        grad_tensors: its trainable parameter tensors.
        param_bytes: padded unsharded bytes of each parameter tensor as gathered
            (the copy-out is priced per parameter, ``CostModel.copy_out_time``);
            ``nbytes`` is their sum.
        shard_bytes: this rank's shard of the parameters, in their own dtype
            (``-1``: ``nbytes // world_size`` of a world the caller knows).
        copy_in_bytes: the all-gather copy-in, as a copy of this many bytes
            (``-1``: ``shard_bytes``).
        unsharded_grad_bytes: the unsharded gradients (in the compute dtype;
            ``-1``: ``grad_bytes``).
        reduce_copy_bytes: the reduce-scatter copy-in, as a copy of this many bytes
            (``-1``: ``grad_bytes``).
        grad_shard_bytes: this rank's gradient shard in the parameters' dtype
            (``-1``: ``grad_bytes // world_size``).
        param_dtypes: each parameter's own dtype name (empty: float32).
        trainable: whether each parameter is trainable (empty: all).
    """

    label: str
    nbytes: int
    grad_bytes: int
    runs_forward: bool
    runs_backward: bool
    reshard: bool
    enclosing: frozenset[int]
    tensors: int = 0
    grad_tensors: int = 0
    param_bytes: tuple[int, ...] = ()
    shard_bytes: int = -1
    copy_in_bytes: int = -1
    unsharded_grad_bytes: int = -1
    reduce_copy_bytes: int = -1
    grad_shard_bytes: int = -1
    param_dtypes: tuple[str, ...] = ()
    trainable: tuple[bool, ...] = ()

    def resolved(self, world_size: int) -> UnitSpec:
        """This spec with every ``-1`` size filled in for ``world_size`` ranks."""
        shard = self.nbytes // world_size if self.shard_bytes < 0 else self.shard_bytes
        return dataclasses.replace(
            self,
            shard_bytes=shard,
            copy_in_bytes=shard if self.copy_in_bytes < 0 else self.copy_in_bytes,
            unsharded_grad_bytes=(
                self.grad_bytes if self.unsharded_grad_bytes < 0 else self.unsharded_grad_bytes
            ),
            reduce_copy_bytes=(
                self.grad_bytes if self.reduce_copy_bytes < 0 else self.reduce_copy_bytes
            ),
            grad_shard_bytes=(
                self.grad_bytes // world_size
                if self.grad_shard_bytes < 0
                else self.grad_shard_bytes
            ),
        )

    def with_precision(self, precision: Precision, world_size: int) -> UnitSpec:
        """This unit's sizes under ``precision`` (see the module docstring); the sizes
        of a spec in its parameters' own dtypes (as :class:`SimulationFacts` builds them).

        Example:
            >>> spec = UnitSpec("b", 64, 64, True, True, True, frozenset(), 1, 1, (64,),
            ...                 param_dtypes=("float32",), trainable=(True,))
            >>> bf16 = spec.with_precision(Precision("bfloat16", "float32"), 2)
            >>> bf16.nbytes, bf16.grad_bytes, bf16.unsharded_grad_bytes, bf16.copy_in_bytes
            (32, 64, 32, 24)
        """
        own = self.resolved(world_size)
        if precision.is_default:
            return own
        dtypes = self.param_dtypes or ("float32",) * len(self.param_bytes)
        trainable = self.trainable or (True,) * len(self.param_bytes)
        gathered, reduced, shard = [], 0, 0
        for nbytes, dtype, grad in zip(self.param_bytes, dtypes, trainable, strict=True):
            size = dtype_itemsize(dtype) if dtype in DTYPES else 0
            g = _resized(nbytes, size, precision.gather_dtype(dtype) if size else dtype)
            gathered.append(g)
            shard += nbytes // world_size
            if grad:
                reduced += _resized(
                    nbytes, size, precision.reduce_dtype_for(dtype) if size else dtype
                )
        gather_total = sum(gathered)
        grads_gathered = sum(g for g, t in zip(gathered, trainable, strict=True) if t)
        return dataclasses.replace(
            own,
            nbytes=gather_total,
            param_bytes=tuple(gathered),
            grad_bytes=reduced,
            shard_bytes=shard,
            copy_in_bytes=(shard + gather_total // world_size) // 2,
            unsharded_grad_bytes=grads_gathered,
            reduce_copy_bytes=(grads_gathered + reduced) // 2,
        )


def _resized(nbytes: int, itemsize: int, dtype: str) -> int:
    """``nbytes`` of elements of ``itemsize`` bytes, in ``dtype`` instead."""
    if itemsize <= 0 or dtype not in DTYPES:
        return nbytes
    return nbytes // itemsize * dtype_itemsize(dtype)
