"""Runtime execution-order capture: one real forward/backward under hooks.

Symbolic tracing fails on most real models (data-dependent branches, tensor
factories with traced sizes, iteration over proxies). Runtime capture runs the
model instead and records:

* module calls, from forward pre-hooks on every module (repeats kept);
* parameter uses, from a :class:`torch.overrides.TorchFunctionMode` that is
  active only while a module's forward runs and sees every torch call with its
  arguments, so parameters used functionally at any depth (root-level
  ``F.linear(x, self.weight)``, ``self.wpe[:n]``, parameters inside lists or
  passed by keyword) are found as well as those of leaf modules;
* gradient-ready order, from ``register_post_accumulate_grad_hook`` on each
  parameter (a tensor hook on the unsharded view for FSDP1);
* recomputation under activation checkpointing: a module call made while
  autograd runs a backward pass (``torch._C._current_graph_task_id() != -1``)
  is a recompute, kept apart from the forward order.

Nothing is stored on the user's modules or parameters: every handle lives on
the :class:`RuntimeRecorder` and is removed in ``finally``.

Modules, one job each:

* :mod:`~tracing.runtime.recorder`: :class:`RuntimeRecorder`, its life cycle
  and what it records per event;
* :mod:`~tracing.runtime.hooks`: installing and removing the hooks;
* :mod:`~tracing.runtime.param_map`: tensor -> canonical FQN of the original model;
* :mod:`~tracing.runtime.use_mode`: the ``TorchFunctionMode`` that finds uses;
* :mod:`~tracing.runtime.call_stack`: the running module calls and the mode's target;
* :mod:`~tracing.runtime.backward`: gradient-ready and module backward order;
* :mod:`~tracing.runtime.record`: :func:`record_execution_order`, a
  self-contained capture that restores gradients, buffers and RNG states;
* :mod:`~tracing.runtime.shadow`: :func:`record_zero_cost`, the same recording
  on a fake shadow of the model (no compute, no weight copy).
"""

from tracing.runtime.record import record_execution_order
from tracing.runtime.recorder import RecorderState, RuntimeRecorder
from tracing.runtime.shadow import record_zero_cost

__all__ = ["RecorderState", "RuntimeRecorder", "record_execution_order", "record_zero_cost"]
