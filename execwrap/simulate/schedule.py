"""FSDP2's step as a program of ops: what ``apply_fully_shard`` sets up, hook by hook.

:class:`StepProgram` turns a plan, its :class:`~execwrap.simulate.compute.UnitCompute` and a
:class:`~execwrap.cost.CostModel` into the ops of :mod:`execwrap.simulate.engine`, following torch
2.13's ``torch/distributed/fsdp/_fully_shard`` (``FSDPParamGroup.unshard`` / ``wait_for_unshard`` /
``reshard`` / ``pre_backward`` / ``post_backward``, ``FSDPState._pre_forward`` / ``_pre_backward``
and the root's final callback, ``foreach_all_gather`` / ``foreach_reduce``), as
:func:`execwrap.simulate.simulate_step`'s docstring writes out; prefetch lists from
:func:`~execwrap.simulate.facts.prefetch_lists`, sizes from :mod:`~execwrap.simulate.unit_spec`,
each unit's prices from :mod:`~execwrap.simulate.unit_costs`, checkpointing and transient memory
from :mod:`~execwrap.simulate.unit_work`.
"""

from __future__ import annotations

from collections.abc import Sequence

from execwrap.cost.model import CostModel
from execwrap.simulate.compute import UnitCompute
from execwrap.simulate.engine import MemEvent, Op
from execwrap.simulate.facts import prefetch_lists
from execwrap.simulate.unit_costs import UnitCosts
from execwrap.simulate.unit_spec import UnitSpec
from execwrap.simulate.unit_work import UnitWork

__all__ = ["StepProgram", "UnitSpec", "prefetch_lists"]

COMPUTE, ALL_GATHER, REDUCE_SCATTER = "compute", "all_gather", "reduce_scatter"
ALL_REDUCE = "all_reduce"


class StepProgram:
    """Builds the ops of one training step (see :func:`execwrap.simulate.simulate_step`).

    Args:
        specs: one :class:`UnitSpec` per plan unit.
        compute: per-unit compute.
        cost_model: times of collectives, copies and bookkeeping.
        world_size: ranks.
        root: index of the root unit.
        forward_order: units that run forward, in plan (first use) order, root first.
        forward_prefetch: explicit forward prefetch lists.
        backward_prefetch: explicit backward prefetch lists.
        work: per-unit checkpointing and transient memory (default: none, the
            activations of ``compute``).
        offload: shards in host memory: a host-to-device copy of each shard
            before its all-gather, the gradient shards copied back after their
            reduce-scatter (FSDP2's ``CPUOffloadPolicy``).

    Each :meth:`forward` / :meth:`backward` pair is one micro-batch; set
    :attr:`reduce_grads` and :attr:`reshard_after_backward` before a backward
    (FSDP2's ``set_requires_gradient_sync`` / ``set_reshard_after_backward``).

    Attributes:
        ops: the program, in issue order.
        all_gathers: all-gathers issued.
        reduce_scatters: reduce-scatters issued.
        all_reduces: HSDP all-reduces issued (a cost model for a mesh with replicas).
    """

    def __init__(
        self,
        specs: Sequence[UnitSpec],
        compute: UnitCompute,
        cost_model: CostModel,
        world_size: int,
        root: int,
        forward_order: Sequence[int],
        forward_prefetch: dict[int, list[int]],
        backward_prefetch: dict[int, list[int]],
        *,
        work: UnitWork | None = None,
        offload: bool = False,
    ) -> None:
        self.specs = specs
        self.compute = compute
        self.cm = cost_model
        self.costs = UnitCosts.of(specs, cost_model)
        self.world_size = world_size
        self.root = root
        self.forward_order = list(forward_order)
        self.forward_prefetch = forward_prefetch
        self.backward_prefetch = backward_prefetch
        self.sync = cost_model.synchronous_collectives
        self.ops: list[Op] = []
        self.all_gathers = 0
        self.reduce_scatters = 0
        self.all_reduces = 0
        self._last_compute: int | None = None
        self._since_collective = 0.0  # compute-stream seconds since the last collective
        self._pending: dict[int, int] = {}  # unit -> its issued, not yet waited all-gather
        self._unsharded: set[int] = set()
        self._ag_wait: int | None = None  # the copy-out the all-gather streams wait on
        self._deferred: tuple[int, int] | None = None  # (unit, copy-out op) of the kept AG buffer
        self._post_forward: list[int] = []  # FSDP2's comm_ctx.post_forward_order (param groups)
        self._closed: list[int] = []  # every unit, in post-forward order
        self._last_rs: tuple[int, int] | None = None  # (unit, reduce-scatter op)
        self._all_rs: list[int] = []
        n = len(specs)
        zeros = (0,) * n
        self.work = work or UnitWork(
            ("none",) * n, compute.activation_bytes, (0.0,) * n, zeros, zeros, zeros
        )
        self.offload = offload
        self.reduce_grads = True
        self.reshard_after_backward = True
        self._accumulated: set[int] = set()  # units holding unsharded accumulated gradients

    # ------------------------------------------------------------ primitives
    def _add(self, op: Op) -> int:
        self.ops.append(op)
        index = len(self.ops) - 1
        if op.stream == COMPUTE:
            self._last_compute = index
        return index

    def _on_compute(
        self,
        label: str,
        seconds: float,
        phase: str,
        kind: str = "compute",
        *,
        deps: tuple[int, ...] = (),
        on_start: tuple[MemEvent, ...] = (),
        on_end: tuple[MemEvent, ...] = (),
    ) -> int:
        seconds = seconds if seconds > 0.0 else 0.0
        self._since_collective += seconds
        return self._add(Op(COMPUTE, label, seconds, kind, deps, phase, on_start, on_end))

    def _collective(
        self,
        stream: str,
        label: str,
        seconds: float,
        deps: tuple[int, ...],
        phase: str,
        on_end: tuple[MemEvent, ...] = (),
        on_start: tuple[MemEvent, ...] = (),
    ) -> int:
        """A collective on its stream; on CPU the training thread waits for it right away,
        after waiting for the slowest rank to reach it (:meth:`CostModel.sync_wait_time`
        of the compute since the previous collective)."""
        if self.sync:
            wait = self.cm.sync_wait_time(self._since_collective)
            if wait > 0:
                self._add(Op(COMPUTE, f"wait for ranks {label}", wait, "wait", (), phase))
            self._since_collective = 0.0
            if self._last_compute is not None:
                deps = (*deps, self._last_compute)
        op = self._add(Op(stream, label, seconds, "comm", deps, phase, on_start, on_end))
        if self.sync:
            self._on_compute(f"wait {label}", 0.0, phase, "wait", deps=(op,))
        return op

    # ------------------------------------------------------- FSDPParamGroup
    def unshard(self, i: int, phase: str) -> None:
        """``FSDPParamGroup.unshard``: copy-in and all-gather (no-op if issued or unsharded)."""
        spec = self.specs[i]
        if spec.nbytes <= 0 or i in self._unsharded or i in self._pending:
            return
        self.all_gathers += 1
        label = spec.label
        overhead = self.costs.gather_overhead_s[i]
        if overhead > 0:
            self._on_compute(f"FSDP overhead {label}", overhead, phase, "overhead")
        buffer = (MemEvent("all_gather_buffers", label, spec.nbytes),)
        copy_s = self.costs.copy_in_s[i]
        if self.sync:
            copy = self._on_compute(f"copy-in {label}", copy_s, phase, "copy", on_start=buffer)
        else:
            deps = () if self._ag_wait is None else (self._ag_wait,)
            if self.offload:  # FSDPParam.all_gather_inputs: the shard to the device first
                h2d = self.cm.host_copy_time(spec.shard_bytes, "to_device")
                self._add(Op(ALL_GATHER, f"host-to-device {label}", h2d, "copy", deps, phase))
            copy = self._add(
                Op(ALL_GATHER, f"copy-in {label}", copy_s, "copy", deps, phase, buffer)
            )
        ag = self._collective(
            ALL_GATHER, f"all-gather {label}", self.costs.all_gather_s[i], (copy,), phase
        )
        self._pending[i] = ag

    def wait_for_unshard(self, i: int, phase: str) -> None:
        """``FSDPParamGroup.wait_for_unshard``: copy-out into the unsharded parameters.

        In forward the all-gather output is kept until the end of the next group's
        copy-out (FSDP2's ``all_gather_state``, which ``wait_for_unshard`` drops at
        its start but holds in a local until it returns); in backward it is freed
        at the end of its own copy-out.
        """
        ag = self._pending.pop(i, None)
        if ag is None:
            return
        label = self.specs[i].label
        on_start = (MemEvent("unsharded_params", label, self.specs[i].nbytes),)
        freed: tuple[MemEvent, ...] = ()
        if phase == "forward" and self._deferred is not None:
            # wait_for_unshard drops the kept state at its start, but its local
            # ``prev_all_gather_state`` holds the output until it returns
            prev, prev_copy = self._deferred
            freed = (MemEvent("all_gather_buffers", self.specs[prev].label),)
            self._ag_wait = prev_copy
            self._deferred = None
        elif phase != "forward":
            freed = (MemEvent("all_gather_buffers", label),)
        copy = self._on_compute(
            f"copy-out {label}",
            self.costs.copy_out_s[i],
            phase,
            "copy",
            deps=(ag,),
            on_start=on_start,
            on_end=freed,
        )
        if phase == "forward":
            self._deferred = (i, copy)
        else:
            self._ag_wait = copy
        self._unsharded.add(i)

    def reshard(self, i: int, phase: str) -> None:
        """``FSDPParamGroup.reshard``: free the unsharded parameters."""
        if i in self._unsharded:
            self._unsharded.discard(i)
            label = self.specs[i].label
            self._on_compute(
                f"reshard {label}",
                0.0,
                phase,
                "wait",
                on_start=(MemEvent("unsharded_params", label),),
            )

    def post_backward(self, i: int) -> None:
        """``FSDPParamGroup.post_backward``: reshard, recycle the previous reduce-scatter
        buffer, copy the gradients in and reduce-scatter them."""
        spec = self.specs[i]
        if self.reduce_grads or self.reshard_after_backward:
            self.reshard(i, "backward")
        if spec.grad_bytes <= 0:
            return
        label = spec.label
        if not self.reduce_grads:
            self._accumulate(i)
            return
        if self._last_rs is not None:  # reduce_scatter_max_input_buffers = 1
            prev, rs_prev = self._last_rs
            self._on_compute(
                f"wait reduce-scatter {self.specs[prev].label}",
                0.0,
                "backward",
                "wait",
                deps=(rs_prev,),
                on_start=(MemEvent("reduce_scatter_buffers", self.specs[prev].label),),
            )
        self.reduce_scatters += 1
        overhead = self.costs.reduce_overhead_s[i]
        if overhead > 0:
            self._on_compute(f"FSDP overhead {label}", overhead, "backward", "overhead")
        # FSDP2's post_backward holds the unsharded gradients in a list until
        # foreach_reduce returns: on CUDA right after it issues the reduce-scatter, on
        # CPU (gloo, synchronous) after the reduce-scatter, whose output it allocated first
        grads_freed: tuple[MemEvent, ...] = (
            MemEvent("unsharded_grads", label),
            MemEvent("unsharded_grads", f"{label} (head)"),
        )
        if i in self._accumulated:  # the last micro-batch adds into the accumulated ones
            self._accumulated.discard(i)
            grads_freed = (*grads_freed, MemEvent("unsharded_grads", f"{label} (accumulated)"))
        copy = self._on_compute(
            f"reduce-scatter copy-in {label}",
            self.costs.reduce_copy_s[i],
            "backward",
            "copy",
            on_start=(MemEvent("reduce_scatter_buffers", label, spec.grad_bytes),),
            on_end=() if self.sync else grads_freed,
        )
        # with offload the gradient shards live in host memory
        shard: tuple[MemEvent, ...] = (
            () if self.offload else (MemEvent("sharded_grads", label, spec.grad_shard_bytes),)
        )
        rs = self._collective(
            REDUCE_SCATTER,
            f"reduce-scatter {label}",
            self.costs.reduce_scatter_s[i],
            (copy,),
            "backward",
            on_end=grads_freed if self.sync else shard,
            on_start=shard if self.sync else (),
        )
        self._last_rs = (i, rs)
        self._all_rs.append(rs)
        last, stream = rs, REDUCE_SCATTER
        if self.cm.all_reduce is not None:  # HSDP: foreach_reduce's all-reduce of the shard
            last, stream = self._all_reduce(spec, rs), ALL_REDUCE
            self._all_rs.append(last)
        if self.offload:  # foreach_reduce: the reduced shard to the host, after the reduction
            d2h = self.cm.host_copy_time(spec.grad_shard_bytes, "to_host")
            self._all_rs.append(
                self._add(Op(stream, f"device-to-host {label}", d2h, "copy", (last,), "backward"))
            )

    def _all_reduce(self, spec: UnitSpec, rs: int) -> int:
        """HSDP's all-reduce (``foreach_reduce``): the reduce-scatter's output, the
        shard of the gradients in ``reduce_dtype`` (``grad_bytes / shard``), all-reduced
        across the replicate group after the reduce-scatter, on its own stream (on CPU
        on the training thread), in place: no memory of its own."""
        self.all_reduces += 1
        label = f"all-reduce {spec.label}"
        seconds = self.cm.all_reduce_time(spec.grad_bytes // self.world_size)
        if self.sync:
            return self._collective(ALL_REDUCE, label, seconds, (rs,), "backward")
        link = "replicate" if self.cm.all_reduce_own_link else ""
        return self._add(Op(ALL_REDUCE, label, seconds, "comm", (rs,), "backward", link=link))

    def _accumulate(self, i: int) -> None:
        """No gradient sync: FSDP2's ``post_backward`` keeps the unsharded gradients,
        in ``reduce_dtype`` (``to_accumulated_grad_if_needed``), adding them up over
        micro-batches (``accumulate_unsharded_grad_if_needed``)."""
        spec, grads = self.specs[i], "unsharded_grads"
        label = spec.label
        first = i not in self._accumulated
        cast = spec.unsharded_grad_bytes != spec.grad_bytes
        self._accumulated.add(i)
        self._on_compute(
            f"accumulate gradients {label}",
            self.costs.reduce_copy_s[i] if (cast or not first) else 0.0,
            "backward",
            "copy",
            on_start=(MemEvent(grads, f"{label} (accumulated)", spec.grad_bytes),),
            on_end=(MemEvent(grads, label), MemEvent(grads, f"{label} (head)")),
        )

    # ------------------------------------------------------------- forward
    def forward(self) -> None:
        """Root pre-forward, every unit in plan order (nested units inside their
        parents), root post-forward (one micro-batch)."""
        self._post_forward, self._closed = [], []
        self._last_rs, self._all_rs = None, []
        r = self.root
        self._pre_forward(r)
        stack = [r]
        for u in self.forward_order:
            if u == r:
                continue
            while stack[-1] not in self.specs[u].enclosing:
                self._close_forward(stack.pop())
            self._pre_forward(u)
            stack.append(u)
        while len(stack) > 1:
            self._close_forward(stack.pop())
        self._close_forward(r)
        if self._deferred is not None:  # the root's post-forward frees the last kept AG output
            unit, copy = self._deferred
            self._on_compute(
                "free all-gather output",
                0.0,
                "forward",
                "wait",
                on_start=(MemEvent("all_gather_buffers", self.specs[unit].label),),
            )
            self._ag_wait = copy
            self._deferred = None

    def _pre_forward(self, u: int) -> None:
        self.unshard(u, "forward")
        self.wait_for_unshard(u, "forward")
        for t in self.forward_prefetch.get(u, []):
            self.unshard(t, "forward")
        c = self.compute
        label = self.specs[u].label
        kept = self.work.activation_bytes[u] - self.work.tail_bytes[u]  # the tail's: later
        acts = (MemEvent("activations", label, kept),) if kept else ()
        seconds = c.forward_s[u] - c.forward_tail_s[u] + self.work.forward_overhead_s[u]
        self._transient(f"forward {label}", seconds, "forward", u, acts)

    # fmt: off
    def _transient(
        self, label: str, seconds: float, phase: str, u: int,
        on_start: tuple[MemEvent, ...] = (), *, like: str = "", on_end: tuple[MemEvent, ...] = (),
    ) -> None:
        # fmt: on
        """A compute op of unit ``u`` in ``phase``, with the unit's transient memory of
        ``like`` (default ``phase``: ``"forward"`` or ``"backward"``) alive while it runs."""
        w = self.work
        like = like or phase
        temp = (w.forward_transient_bytes if like == "forward" else w.backward_transient_bytes)[u]
        key = self.specs[u].label
        if temp > 0:
            on_start = (*on_start, MemEvent("temporaries", key, temp))
        on_end = (*on_end, MemEvent("temporaries", key)) if temp > 0 else on_end
        self._on_compute(label, seconds, phase, on_start=on_start, on_end=on_end)

    def _close_forward(self, v: int) -> None:
        c = self.compute
        label = self.specs[v].label
        tail = self.work.tail_bytes[v]  # what the tail saves, from its start
        made = (MemEvent("activations", f"{label} (tail)", tail),) if tail else ()
        if c.forward_tail_s[v] > 0 or made:
            self._transient(f"forward {label} (tail)", c.forward_tail_s[v], "forward", v, made)
        if self.specs[v].reshard:
            self.reshard(v, "forward")
        self._closed.append(v)
        if self.specs[v].nbytes > 0:
            self._post_forward.append(v)

    # ------------------------------------------------------------ backward
    def backward(self) -> None:
        """Pre-backward in reverse post-forward order, post-backward when a unit's
        inputs have their gradients, then the root's final callback."""
        r = self.root
        visit = [r] + [u for u in self._backward_visits() if u != r]
        stack: list[int] = []
        for u in visit:
            while stack and stack[-1] not in self.specs[u].enclosing:
                self._close_backward(stack.pop())
            self._pre_backward(u)
            stack.append(u)
        while stack:
            self._close_backward(stack.pop())
        for i in range(len(self.specs)):  # groups autograd skipped: post_backward at the end
            if i not in visit and i in self._unsharded:
                self.reshard(i, "backward")
        if self._all_rs:  # finalize_backward: wait for every reduce-scatter
            prev = self.specs[self._last_rs[0]].label if self._last_rs else ""
            self._on_compute(
                "wait reduce-scatters",
                0.0,
                "backward",
                "wait",
                deps=tuple(self._all_rs),
                on_end=(MemEvent("reduce_scatter_buffers", prev),),
            )

    def _backward_visits(self) -> list[int]:
        """Units in the order their pre-backward runs: reverse post-forward order,
        units that run backward only (call :meth:`forward` first)."""
        return [u for u in reversed(self._closed) if self.specs[u].runs_backward]

    def _pre_backward(self, u: int) -> None:
        self.unshard(u, "backward")
        self.wait_for_unshard(u, "backward")
        targets = self.backward_prefetch.get(u, [])
        if not targets and u in self._post_forward:  # FSDPParamGroup._backward_prefetch
            k = len(self._post_forward) - 1 - self._post_forward[::-1].index(u)
            targets = [self._post_forward[k - 1]] if k > 0 else []
        for t in targets:
            if self.specs[t].runs_backward:
                self.unshard(t, "backward")
        c = self.compute
        label = self.specs[u].label
        w = self.work
        if w.modes[u] != "none":  # the checkpoint's recomputation, in forward's dtype and memory
            again = MemEvent("activations", f"{label} (recomputed)", w.recompute_bytes[u])
            self._transient(
                f"recompute {label}", w.recompute_s[u], "backward", u, (again,), like="forward"
            )
        # the gradients of the parameters used in the forward tail come first, the
        # others (head_grad_share) with the backward of the forward's head, at the end
        first = round(self.specs[u].unsharded_grad_bytes * (1 - w.head_grad_share[u]))
        grads = (MemEvent("unsharded_grads", label, first),) if self.specs[u].grad_bytes else ()
        tail_freed = (MemEvent("activations", f"{label} (tail)"),) if w.tail_bytes[u] else ()
        self._transient(
            f"backward {label}",
            c.backward_s[u] - c.backward_tail_s[u],
            "backward",
            u,
            grads,
            on_end=tail_freed,
        )

    def _close_backward(self, v: int) -> None:
        c = self.compute
        label = self.specs[v].label
        spec = self.specs[v]
        rest = spec.unsharded_grad_bytes - round(
            spec.unsharded_grad_bytes * (1 - self.work.head_grad_share[v])
        )
        late = (MemEvent("unsharded_grads", f"{label} (head)", rest),) if spec.grad_bytes else ()
        if c.backward_tail_s[v] > 0 or (rest and late):
            self._transient(f"backward {label} (tail)", c.backward_tail_s[v], "backward", v, late)
        if self.work.activation_bytes[v] or self.work.modes[v] != "none":
            self._on_compute(
                f"free activations {label}",
                0.0,
                "backward",
                "wait",
                on_start=(
                    MemEvent("activations", label),
                    MemEvent("activations", f"{label} (recomputed)"),
                    MemEvent("activations", f"{label} (tail)"),
                ),
            )
        self.post_backward(v)

    def optimizer(self, seconds: float) -> None:
        """The optimizer step on the compute stream, after every reduce-scatter."""
        self._on_compute("optimizer step", seconds, "optimizer", "optimizer")
