"""Record a policy's execution order during the wrapped model's first step.

A :class:`~execwrap.ParamExecOrderWrapPolicy` with nothing to capture before
wrapping (no ``order``, no ``tracing_config``, no ``example_inputs``) plans its
units from ``init_policy`` alone and records the order during the first
forward/backward of the wrapped model instead. FSDP1 (the policy's
``_run_policy``) and FSDP2 (:func:`execwrap.apply_fully_shard`) both arm that
recording through :func:`record_first_step`; :func:`is_recording` tells
whether it is still pending.

:class:`FirstStepRecording` does the recording itself: it runs a
:class:`tracing.RuntimeRecorder` over exactly one step and removes every hook
it added afterwards. Which recording belongs to which policy is kept here, in a
mapping keyed weakly by the policy (as FSDP2 keeps its per-module state), so
the policy exposes nothing for it and nothing is stored on the user's modules.
An armed recording lives as long as its policy or its hooks, whichever is
longer, and holds its policy only weakly (so the mapping never keeps a policy,
or the model the recording watches, alive).
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable
from enum import Enum, auto
from typing import TYPE_CHECKING, Any, Protocol

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.modules.module import register_module_forward_pre_hook
from torch.utils.hooks import RemovableHandle

from execwrap.fsdp.ranks import check_order_across_ranks
from tracing import RuntimeRecorder
from tracing.nested import tensors_in
from tracing.order import ExecutionOrder

if TYPE_CHECKING:
    from execwrap.plan.wrap_plan import WrapPlan

__all__ = ["FirstStepRecording", "RecordedPolicy", "is_recording", "record_first_step"]

logger = logging.getLogger(__name__)


class RecordedPolicy(Protocol):
    """What a first-step recording reads and fills of its policy (a
    :class:`~execwrap.ParamExecOrderWrapPolicy` is one): declared here so that this module
    need not import the policy class that arms it."""

    order: ExecutionOrder | None
    plan: WrapPlan | None
    check_ranks: bool


#: The armed recording of each policy (dropped with the policy).
_RECORDINGS: weakref.WeakKeyDictionary[RecordedPolicy, FirstStepRecording] = (
    weakref.WeakKeyDictionary()
)


def is_recording(policy: RecordedPolicy) -> bool:
    """Whether ``policy``'s order is still to be recorded during the first step."""
    recording = _RECORDINGS.get(policy)
    return recording is not None and recording.active


def record_first_step(
    policy: RecordedPolicy,
    root_module: nn.Module,
    *,
    on_recorded: Callable[[ExecutionOrder], None] | None = None,
    start_now: bool = False,
    group: dist.ProcessGroup | None = None,
) -> None:
    """Record ``policy``'s order during the first forward/backward of ``root_module``.

    Replaces (removes) a recording armed before for the same policy. After
    that backward, ``policy.order`` holds the recorded order and
    ``policy.plan`` the applied units re-ordered by it; then
    ``on_recorded(order)`` runs (FSDP2 sets prefetching there).

    Args:
        policy: the policy whose ``order`` and ``plan`` are filled.
        root_module: the FSDP1 root's inner module (``start_now=False``:
            recording starts at the first call of its wrapper), or the
            FSDP2-sharded model (``start_now=True``: the recorder is
            installed now).
        on_recorded: called with the order once recorded.
        start_now: install the recorder now instead of at the first call.
        group: process group for the cross-rank check (``None``: the
            default group).

    Raises:
        OrderDivergenceError: from the first ``backward()`` (the check runs
            in an autograd final callback) when ``policy.check_ranks`` is set,
            a process group is initialised and the ranks recorded different
            orders. Step 1 has then already run with them: its results are
            not to be trusted.
    """
    previous = _RECORDINGS.pop(policy, None)
    if previous is not None:
        previous.remove()
    owner = weakref.ref(policy)
    check_ranks = policy.check_ranks  # if the policy is gone by the first step

    def done(order: ExecutionOrder) -> None:
        nonlocal check_ranks
        policy = owner()
        if policy is not None:
            _RECORDINGS.pop(policy, None)
            policy.order = order
            if policy.plan is not None:
                policy.plan = policy.plan.reordered(order)
            check_ranks = policy.check_ranks
        logger.info(
            "ParamExecOrderWrapPolicy: recorded the order during the first step (%d module calls)",
            len(order.module_forward_order),
        )
        if check_ranks and dist.is_available() and dist.is_initialized():
            # Every rank reaches this callback at the end of its first
            # backward, so the collective lines up. The parameters were
            # compared before wrapping; recorded now, their sizes are shards.
            check_order_across_ranks(order, group=group, compare_params=False)
        if on_recorded is not None:
            on_recorded(order)

    _RECORDINGS[policy] = FirstStepRecording(root_module, done, start_now=start_now)


class _Phase(Enum):
    """Phases of :class:`FirstStepRecording` (like FSDP2's ``TrainingState``)."""

    ARMED = auto()  # waiting for the root's first forward (FSDP1)
    RECORDING = auto()  # recorder installed; waiting for the end of backward
    DONE = auto()


class FirstStepRecording:
    """Runs a :class:`tracing.RuntimeRecorder` over the root's first step.

    With ``start_now`` (FSDP2: the root is the sharded model itself) the
    recorder is installed at once. Otherwise (FSDP1: the root wrapper does not
    exist yet when the policy runs) a global module forward pre-hook waits for
    the first call of the wrapper whose ``_fsdp_wrapped_module`` is ``root``,
    installs the recorder on that wrapper (it strips FSDP1's prefixes; the
    inner root's own call is still ahead, so it is recorded), and removes the
    global hook. (Hooks installed from inside a module's pre-hooks miss that
    module's call in progress, so the root itself cannot be the trigger.)

    The recording ends at the end of the first backward, from an
    autograd-engine callback queued by a hook on the forward's outputs
    (FSDP1's own technique for its post-backward callback). A forward whose
    outputs need no grad (inference) ends it after forward; a forward that
    raises drops it and re-arms. Every hook is removed when done; nothing is
    stored on the user's modules.

    Args:
        root: the module whose first step is recorded (see above).
        on_done: called with the recorded order, once.
        start_now: install the recorder now instead of at the wrapper's
            first call.
    """

    def __init__(
        self,
        root: nn.Module,
        on_done: Callable[[ExecutionOrder], None],
        *,
        start_now: bool,
    ) -> None:
        self._root = root
        self._on_done = on_done
        self._start_now = start_now
        self._phase = _Phase.ARMED
        self._recorder: RuntimeRecorder | None = None
        self._queued = False
        self._handles: list[RemovableHandle] = []
        self._arm()

    @property
    def active(self) -> bool:
        """Whether the recording has neither finished nor been removed."""
        return self._phase is not _Phase.DONE

    def _arm(self) -> None:
        if self._start_now:
            self._start(self._root)
        else:
            self._phase = _Phase.ARMED
            self._handles.append(register_module_forward_pre_hook(self._global_pre_forward))

    def _start(self, module: nn.Module) -> None:
        self._recorder = RuntimeRecorder(module)
        self._phase = _Phase.RECORDING
        self._queued = False
        # Forward hooks are read after forward runs, so this one fires for the
        # call in progress too; ``always_call`` also runs it when forward raises.
        self._handles.append(module.register_forward_hook(self._post_forward, always_call=True))

    def _remove_handles(self) -> None:
        handles, self._handles = self._handles, []
        for handle in handles:
            handle.remove()

    def _global_pre_forward(self, module: nn.Module, args: Any) -> None:
        if self._phase is not _Phase.ARMED:
            return None
        # Only a wrapper: on ``root`` itself the recorder's hooks would be
        # installed too late to see this call.
        if getattr(module, "_fsdp_wrapped_module", None) is self._root:
            self._remove_handles()
            self._start(module)
        return None

    def _post_forward(self, module: nn.Module, args: Any, output: Any) -> None:
        self._remove_handles()
        if output is None:  # forward raised (always_call) or returned nothing
            recorder, self._recorder = self._recorder, None
            if recorder is not None:
                recorder.remove(failed=True)
            logger.debug("first-step recording: forward gave no output; re-armed")
            self._arm()
            return None
        tensors = [t for t in tensors_in(output) if t.requires_grad]
        if not tensors:
            self._finish()
            return None
        for t in tensors:
            self._handles.append(t.register_hook(self._on_output_grad))
        return None

    def _on_output_grad(self, grad: torch.Tensor) -> None:
        if not self._queued:
            self._queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._finish)
        return None

    def _finish(self) -> None:
        if self._phase is not _Phase.RECORDING:
            return
        self._remove_handles()
        recorder, self._recorder = self._recorder, None
        self._phase = _Phase.DONE
        assert recorder is not None
        recorder.remove()
        self._on_done(recorder.order)

    def remove(self) -> None:
        """Stop without recording (idempotent)."""
        self._remove_handles()
        recorder, self._recorder = self._recorder, None
        self._phase = _Phase.DONE
        if recorder is not None:
            recorder.remove(failed=True)
