"""The shard group size: the auto-planner's outer loop over mesh shapes.

``plan_wrap(..., bucket_numel="auto", mesh="auto")`` plans HSDP: each
parameter sharded over a group of ``shard`` ranks and its gradients all-reduced
across the ``world_size / shard`` replicas. :func:`search_mesh` considers every
shard group size that divides the world size and, for each, prices the mesh
with the cost model (:meth:`execwrap.cost.CostModel.for_mesh`) and runs the
inner search (:func:`~execwrap.planning.auto.search.search_checked`: grouping,
prefetch, resharding) where it may win:

1. A shape the cost model cannot price (a flat calibration without topology) is
   skipped, and so is one whose sharded parameters, gradients and optimizer state
   alone exceed the budget (unless the planner may offload them), or whose
   least-memory plan (every unit its own group, prefetch 0, resharding everywhere,
   every unit fully checkpointed and offloaded where the planner may choose so) does:
   no plan of that shape fits. The least-memory plan's step time is kept.
2. The search runs for the shape whose least-memory plan is fastest (every
   shape priced with the same plan: the cheapest collectives for this model);
   its plan is the incumbent.
3. Every other shape is probed: the incumbent's grouping, prefetch and
   resharding simulated for it. Its best step time is then at most the best
   fitting probe (real plans of that shape).
4. The search runs again for the shape whose probe beats the incumbent (the
   incumbent's own plan is faster there), best probe first, at most
   :data:`MAX_MESH_SEARCHES` searches in all: its own search can only improve
   on the probe. The other shapes keep their probes (a heuristic: a shape where
   the incumbent's plan is slower is not searched).

The choice is the least predicted step time within the budget (ties: the lower
peak, then the larger shard group). ``plan.search.meshes`` lists every shape with
what was done for it, and ``plan.search.mesh_reason`` (also a plan note) says
why the chosen size won against sharding over all ranks ("sharding over 8 ranks:
1.9x faster per step than over 128, 23.0 GiB more per rank, within the budget of
70.0 GiB"; without a ``memory_budget`` ``plan_wrap`` plans within the device's memory
less a reserve, :func:`~execwrap.cost.device_memory.default_memory_budget`).
With a fixed ``mesh`` the inner search runs for that shape alone.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from typing import TYPE_CHECKING, Any

from execwrap.errors import MemoryBudgetError
from execwrap.plan.search_record import MeshCandidate
from execwrap.plan.wrap_plan import WrapPlan
from execwrap.planning.auto.least import LEAST_PREFETCH, least_memory_step, least_reshard
from execwrap.planning.auto.options import AutoOptions
from execwrap.planning.auto.search import search_checked
from execwrap.util.formatting import format_bytes
from execwrap.util.gc_pause import gc_paused
from execwrap.util.mesh import MeshShape, divisors

if TYPE_CHECKING:
    from execwrap.cost import CostModel
    from execwrap.plan.training_step import TrainingStep
    from execwrap.simulate import StepEstimate, UnitCompute

__all__ = ["MAX_MESH_SEARCHES", "search_mesh"]

logger = logging.getLogger(__name__)

#: Most inner searches one ``mesh="auto"`` plan runs.
MAX_MESH_SEARCHES = 2


def search_mesh(
    plan: WrapPlan,
    options: AutoOptions,
    *,
    trainable_dtypes: dict[str, frozenset[str]] | None = None,
    compute: UnitCompute | None = None,
) -> WrapPlan:
    """The auto plan of ``plan``'s atomic units for ``options.mesh`` (module docstring).

    Raises:
        ValueError: a fixed mesh the cost model cannot price (the message says what
            to pass).
        MemoryBudgetError: no shape has a plan within the budget.
    """
    kwargs: dict[str, Any] = {"trainable_dtypes": trainable_dtypes, "compute": compute}
    if options.mesh is None:
        return search_checked(plan, options, **kwargs)
    with gc_paused():  # as search_checked's (execwrap.util.gc_pause)
        if isinstance(options.mesh, MeshShape):
            return _search_shape(plan, options, options.mesh, kwargs)
        return _MeshSearch(plan, options, kwargs).run()


def _search_shape(
    plan: WrapPlan, options: AutoOptions, shape: MeshShape, kwargs: dict[str, Any]
) -> WrapPlan:
    """The inner search for one mesh shape; the plan records the shape."""
    resolved = options.cost_model.for_mesh(shape)
    inner = dataclasses.replace(
        options, cost_model=resolved, world_size=resolved.world_size, mesh=None
    )
    return dataclasses.replace(search_checked(plan, inner, **kwargs), mesh=shape)


class _MeshSearch:
    """Steps 1-4 of the module docstring, and the choice."""

    def __init__(self, plan: WrapPlan, options: AutoOptions, kwargs: dict[str, Any]) -> None:
        self.plan = plan
        self.options = options
        self.kwargs = kwargs
        self.cm: CostModel = options.cost_model
        self.world = options.world_size or self.cm.world_size
        self.budget = options.memory_budget
        self.records: dict[int, MeshCandidate] = {}
        self.searched: dict[int, WrapPlan] = {}
        self.computes: dict[int, UnitCompute] = {}  # per plan simulated (kept alive by us)
        self.started = time.perf_counter()

    def run(self) -> WrapPlan:
        shapes = [
            MeshShape.with_shard(self.world, s, where="plan_wrap") for s in divisors(self.world)
        ]
        priced = [shape for shape in shapes if self._priced(shape)]
        if not priced:
            raise self._nothing_fits()
        # step 2: the shape whose least-memory plan is fastest first
        first = min(priced, key=lambda sh: (self.records[sh.shard].step_time_s, sh.shard))
        self._search(first)
        probes = sorted((self._probe(sh), sh.shard, sh) for sh in priced if sh != first)
        for probe, _, shape in probes:
            if len(self.searched) >= MAX_MESH_SEARCHES or probe >= self._best_time():
                break
            self._search(shape)
        return self._choose()

    # ------------------------------------------------------------------ steps
    def _priced(self, shape: MeshShape) -> bool:
        """Step 1: whether ``shape`` can be priced and has a plan within the budget
        (recorded as skipped if not, else as probed with its least-memory plan)."""
        try:
            self.cm.for_mesh(shape)
        except ValueError as e:
            self._record(shape, "skipped", math.inf, 0, False, f"not priced: {e}")
            return False
        state = self._state_bytes(shape)
        if self.budget is not None and state > self.budget:
            self._record(
                shape,
                "skipped",
                math.inf,
                state,
                False,
                f"the sharded parameters, gradients and optimizer state alone need "
                f"{format_bytes(state)} per rank, over the budget",
            )
            return False
        least = self._simulate(
            self.plan, shape, LEAST_PREFETCH, least_reshard(self.plan), self._least_step()
        )
        peak = int(least.peak_memory_bytes)
        if self.budget is not None and peak > self.budget:
            self._record(
                shape,
                "skipped",
                math.inf,
                peak,
                False,
                f"the least memory a plan needs, {format_bytes(peak)} per rank (per-unit "
                "groups, prefetch 0), is over the budget",
            )
            return False
        self._record(shape, "probed", float(least.step_time_s), peak, True, "least-memory plan")
        return True

    def _least_step(self) -> TrainingStep:
        """The training step of the least-memory plan (:mod:`~execwrap.planning.auto.least`):
        the one asked for, with every unit fully checkpointed and CPU offload where the
        planner may choose them."""
        choose = self.options.choose
        return least_memory_step(
            self.options.training,
            self.cm,
            checkpointing="checkpointing" in choose,
            offload="offload" in choose,
        )

    def _state_bytes(self, shape: MeshShape) -> int:
        """Bytes per rank of the sharded parameters, gradients and optimizer state
        (a lower bound of any plan's peak on ``shape``; ``0`` when they may be
        offloaded to the CPU)."""
        from execwrap.simulate import OPTIMIZERS

        if self._least_step().offload != "none":
            return 0

        states = OPTIMIZERS[self.options.optimizer][0]
        params = self.plan.order.params.values()
        total = sum(p.bytes * (1 + (1 + states) * p.requires_grad) for p in params)
        return total // shape.shard

    def _search(self, shape: MeshShape) -> None:
        """Steps 2 and 4: the inner search for ``shape`` (a shape no plan fits is kept
        as skipped)."""
        resolved = self.cm.for_mesh(shape)
        inner = dataclasses.replace(
            self.options, cost_model=resolved, world_size=resolved.world_size, mesh=None
        )
        try:
            best = search_checked(self.plan, inner, **self.kwargs)
        except MemoryBudgetError as e:
            self._record(shape, "skipped", math.inf, 0, False, f"no plan fits: {e.finding}")
            return
        est = best.estimate
        assert est is not None
        self.searched[shape.shard] = dataclasses.replace(best, mesh=shape)
        self._record(
            shape,
            "searched",
            float(est.step_time_s),
            int(est.peak_memory_bytes),
            True,
            best.search.best.label if best.search is not None else "",
        )

    def _probe(self, shape: MeshShape) -> float:
        """Step 3: the best fitting step time of the incumbent's plan and the
        least-memory plan on ``shape`` (``inf`` when neither fits)."""
        record = self.records[shape.shard]
        incumbent = self._incumbent()
        if incumbent is not None:
            est = self._simulate(
                incumbent, shape, incumbent.prefetch or 0, incumbent.reshard_after_forward
            )
            fits = self.budget is None or est.peak_memory_bytes <= self.budget
            if fits and est.step_time_s < record.step_time_s:
                self._record(
                    shape,
                    "probed",
                    float(est.step_time_s),
                    int(est.peak_memory_bytes),
                    True,
                    f"the {incumbent.mesh.shard if incumbent.mesh else '?'}-rank plan's "
                    "grouping, prefetch and resharding",
                )
        return self.records[shape.shard].step_time_s

    def _simulate(
        self,
        plan: WrapPlan,
        shape: MeshShape,
        prefetch: int,
        reshard: Any,
        training: TrainingStep | None = None,
    ) -> StepEstimate:
        """``plan`` on ``shape`` (its own training step unless ``training`` is given)."""
        from execwrap.simulate import UnitCompute, unit_compute
        from execwrap.simulate.step import step_estimate  # a probe over memory: no WARNING

        compute = self.kwargs.get("compute") if plan is self.plan else None
        if compute is None:  # as the search prices it (SearchSpace: the order's, or none)
            compute = self.computes.get(id(plan))
        if compute is None:
            has = plan.order.has_timing
            compute = unit_compute(plan) if has else UnitCompute.zeros(len(plan.units))
            self.computes[id(plan)] = compute
        return step_estimate(
            plan,
            self.cm,
            world_size=self.world,
            mesh=shape,
            prefetch=prefetch,
            reshard_after_forward=None if reshard is None else list(reshard),
            optimizer=self.options.optimizer,
            compute=compute,
            training=training,
        )

    # ---------------------------------------------------------------- choice
    def _incumbent(self) -> WrapPlan | None:
        if not self.searched:
            return None
        return min(self.searched.values(), key=_plan_key)

    def _best_time(self) -> float:
        incumbent = self._incumbent()
        return math.inf if incumbent is None else _plan_key(incumbent)[0]

    def _choose(self) -> WrapPlan:
        best = self._incumbent()
        if best is None:
            raise self._nothing_fits()
        assert best.mesh is not None and best.search is not None
        reason = self._reason(best.mesh.shard)
        meshes = tuple(self.records[s] for s in sorted(self.records))
        search = dataclasses.replace(
            best.search,
            meshes=meshes,
            mesh_reason=reason,
            seconds=time.perf_counter() - self.started,
        )
        logger.info("auto-plan: %s", reason)
        return dataclasses.replace(best, search=search, notes=[*best.notes, reason])

    def _reason(self, shard: int) -> str:
        """Why ``shard`` won, against sharding over every rank."""
        chosen = self.records[shard]
        flat = self.records.get(self.world)
        budget = (
            "no memory budget given"
            if self.budget is None
            else f"within the budget of {format_bytes(self.budget)}"
        )
        if shard == self.world:
            others = [r for r in self.records.values() if r.shard != shard and r.fits]
            if not others:
                return (
                    f"sharding over all {self.world} ranks: no smaller shard group fits the "
                    "budget" + _skipped_note(self.records.values())
                )
            runner = min(others, key=lambda r: (r.step_time_s, r.shard))
            return (
                f"sharding over all {self.world} ranks: "
                f"{runner.step_time_s / chosen.step_time_s:.2g}x faster per step than over "
                f"{runner.shard} ({runner.status}), {budget}"
            )
        if flat is None or not flat.fits:
            why = "cannot be priced" if flat is None or "priced" in flat.note else "does not fit"
            return (
                f"sharding over {shard} ranks: the fastest plan found; sharding over all "
                f"{self.world} {why}, {budget}"
            )
        more = chosen.peak_memory_bytes - flat.peak_memory_bytes
        return (
            f"sharding over {shard} ranks: {flat.step_time_s / chosen.step_time_s:.2g}x faster "
            f"per step than over {self.world} ({flat.status}), "
            f"{format_bytes(abs(more))} {'more' if more >= 0 else 'less'} per rank, {budget}"
        )

    def _nothing_fits(self) -> MemoryBudgetError:
        needs = [r for r in self.records.values() if r.peak_memory_bytes > 0]
        if not needs:
            notes = "; ".join(f"shard {r.shard}: {r.note}" for r in self.records.values())
            message = f"plan_wrap: no mesh shape could be planned ({notes})"
            return MemoryBudgetError(message, part="", finding=message)
        least = min(needs, key=lambda r: (r.peak_memory_bytes, -r.shard))
        finding = (
            f"no mesh shape fits the memory budget of {format_bytes(self.budget or 0)} per "
            f"rank: the least memory any plan needs is {format_bytes(least.peak_memory_bytes)} "
            f"(sharding over {least.shard} of {self.world} ranks)"
        )
        return MemoryBudgetError(
            f"{finding}; to fit, raise the budget or add ranks",
            part="sharded_params",
            finding=finding,
        )

    def _record(
        self, shape: MeshShape, status: str, step: float, peak: int, fits: bool, note: str
    ) -> None:
        self.records[shape.shard] = MeshCandidate(
            shape.shard, shape.replicate, status, step, peak, fits, note
        )


def _plan_key(plan: WrapPlan) -> tuple[float, int, int]:
    """Least step time, then least peak, then the larger shard group."""
    est = plan.estimate
    assert est is not None and plan.mesh is not None
    return (float(est.step_time_s), int(est.peak_memory_bytes), -plan.mesh.shard)


def _skipped_note(records: Any) -> str:
    skipped = [r for r in records if r.status == "skipped"]
    if not skipped:
        return ""
    least = min(skipped, key=lambda r: r.shard)
    return f" (over {least.shard}: {least.note})"
