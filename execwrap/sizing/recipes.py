"""Ready-to-paste recipes for the plan ``execwrap fit`` found: :func:`recipe`.

Each recipe trains with the plan saved by ``execwrap fit --out DIR`` (``DIR/plan.json``,
:func:`execwrap.save_plan`): its groups, prefetch depth, resharding per group, precision
and checkpointing per unit, which :func:`execwrap.apply_fully_shard` and the integrations
apply from ``plan.training`` (:mod:`execwrap.fsdp.plan_step`). The plain-FSDP2 and
transformers recipes are complete scripts for ``torchrun`` (tested on 2 gloo ranks on
CPU); the others show the lines to add to a torchtitan, accelerate or Lightning job.

* ``"fsdp2"``: ``execwrap.apply_fully_shard(model, plan, mesh=mesh, prefetch="auto")``;
* ``"transformers"``: ``from_pretrained(..., distributed_config=DistributedConfig(fsdp_size=N))``
  inside :func:`execwrap.integrations.transformers.applying_plan` (transformers' own
  ``fsdp_plan`` format has no place for prefetching or checkpointing);
* ``"torchtitan"``: :func:`execwrap.integrations.torchtitan.parallelize_fn`, planning
  torchtitan's own model (its module names differ from transformers') with the same
  cluster, budget and step;
* ``"accelerate"``: :func:`execwrap.integrations.accelerate.prepare_fully_shard`;
* ``"lightning"``: :func:`execwrap.integrations.lightning.shard_lightning_module` in
  ``configure_model``.
"""

from __future__ import annotations

from pathlib import Path

from execwrap.sizing.result import FitResult

__all__ = ["RECIPE_FRAMEWORKS", "recipe"]

#: The frameworks :func:`recipe` writes for.
RECIPE_FRAMEWORKS = ("fsdp2", "transformers", "torchtitan", "accelerate", "lightning")

_SETUP = """\
import os

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from transformers import AutoConfig, AutoModelForCausalLM

import execwrap

SEQUENCE_LENGTH, MICRO_BATCH, STEPS = {seq}, {mb}, {steps}
PLAN = {plan_path!r}  # written by: execwrap fit ... --out {plan_dir}
device_type = "cuda" if torch.cuda.is_available() else "cpu"
dist.init_process_group("nccl" if device_type == "cuda" else "gloo")
if device_type == "cuda":
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
"""

_LOOP = """\
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
# your data here: a data loader of token ids [MICRO_BATCH, SEQUENCE_LENGTH] per rank
ids = torch.randint(0, config.vocab_size, (MICRO_BATCH, SEQUENCE_LENGTH), device=device_type)
for step in range(STEPS):
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    if dist.get_rank() == 0:
        print(f"step {{step}}: loss {{loss.item():.6f}}", flush=True)
dist.destroy_process_group()
"""


def recipe(
    result: FitResult, framework: str, *, plan_path: str = "fit/plan.json", steps: int = 10
) -> str:
    """The recipe of ``result``'s plan for ``framework`` (module docstring), as Python source.

    Args:
        result: what :func:`execwrap.fit` answered (a plan that fits).
        framework: one of :data:`RECIPE_FRAMEWORKS`.
        plan_path: where the plan file is (``execwrap fit --out DIR``: ``DIR/plan.json``).
        steps: training steps of the complete scripts' loop.

    Raises:
        ValueError: an unknown framework (the message lists them); ``result`` has no
            plan (nothing fits: the message says to lower the micro-batch).
    """
    if framework not in RECIPE_FRAMEWORKS:
        raise ValueError(
            f"unknown framework {framework!r}; choose one of {list(RECIPE_FRAMEWORKS)}"
        )
    if result.plan is None:
        raise ValueError(
            "no plan fits, so there is no recipe: try --micro-batch "
            f"{max(result.largest_micro_batch, 1)} (the largest that fits) or more GPUs"
        )
    values = {
        "seq": result.sequence_length,
        "mb": result.micro_batch,
        "steps": steps,
        "plan_path": plan_path,
        "plan_dir": str(Path(plan_path).parent),
        "world": result.cluster.world_size,
        "config": _config(result),
        "pretrained": _pretrained(result),
    }
    return _WRITERS[framework](result).format(**values)


def _config(result: FitResult) -> str:
    source = result.source or {}
    return source.get("config", "path/to/config.json")


def _pretrained(result: FitResult) -> str:
    """The model id or folder ``from_pretrained`` loads: a config file's folder."""
    where = _config(result)
    return str(Path(where).parent) if where.endswith(".json") else where


def _fsdp2(result: FitResult) -> str:
    return (
        "# plain FSDP2 (torch.distributed.fsdp.fully_shard) with execwrap's plan; run with\n"
        "# torchrun --nproc-per-node {world} train.py\n"
        + _SETUP
        + """mesh = init_device_mesh(device_type, (dist.get_world_size(),))
config = AutoConfig.from_pretrained({config!r})
model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)  # or from_pretrained(...)
plan = execwrap.load_plan(PLAN, model)  # checked against the model
# groups, prefetch, resharding, precision (mp_policy) and checkpointing from the plan
execwrap.apply_fully_shard(model, plan, mesh=mesh, prefetch="auto")
"""
        + _LOOP
    )


def _transformers(result: FitResult) -> str:
    return (
        "# transformers 5's FSDP2 path (DistributedConfig) building execwrap's plan; run with\n"
        "# torchrun --nproc-per-node {world} train.py\n"
        + _SETUP
        + """from transformers.distributed import DistributedConfig

from execwrap.integrations.transformers import applying_plan

plan = execwrap.load_plan(PLAN)
# transformers' fsdp_plan holds groups and resharding only: applying_plan also applies
# the plan's prefetch, precision and checkpointing when from_pretrained shards the model
config = AutoConfig.from_pretrained({pretrained!r})
with applying_plan(plan):
    model = AutoModelForCausalLM.from_pretrained(
        {pretrained!r},  # the weights: a model id or folder
        dtype=torch.float32,
        distributed_config=DistributedConfig(fsdp_size=dist.get_world_size()),
    )
"""
        + _LOOP
    )


def _torchtitan(result: FitResult) -> str:
    training = result.plan.training if result.plan is not None else None
    step = (
        "None" if training is None else f"execwrap.TrainingStep.from_dict({training.to_dict()!r})"
    )
    return (
        (
            "# torchtitan: plan torchtitan's own model (its names differ from transformers') with\n"
            "# the settings execwrap fit used, when the trainer parallelizes it\n"
            "import execwrap\n"
            "from execwrap.integrations.torchtitan import decoder_policy, parallelize_fn\n\n"
            "def policy(model):\n"
            "    return decoder_policy(\n"
            "        model,\n"
            '        bucket_numel="auto",\n'
            f"        cost_model=execwrap.CostModel.preset({result.cluster.name!r}, world_size={result.cluster.world_size}),\n"
            f"        memory_budget={result.memory_budget},\n"
            f"        training={step},\n"
            "        example_inputs=...,  # token ids [MICRO_BATCH, SEQUENCE_LENGTH] on the meta device\n"
            "    )\n\n"
            "model_spec.parallelize_fn = parallelize_fn(policy)  # in your train spec\n"
        )
        .replace("{", "{{")
        .replace("}", "}}")
    )


def _accelerate(result: FitResult) -> str:
    return """# accelerate (FSDP2 plugin): shard with the plan before accelerator.prepare
import execwrap
from accelerate import Accelerator
from accelerate.utils import FullyShardedDataParallelPlugin
from execwrap.integrations.accelerate import prepare_fully_shard

accelerator = Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=2))
plan = execwrap.load_plan({plan_path!r}, model)
prepare_fully_shard(accelerator, model, plan, prefetch=plan.prefetch)
model, optimizer = accelerator.prepare(model, torch.optim.AdamW(model.parameters()))
"""


def _lightning(result: FitResult) -> str:
    return """# Lightning (ModelParallelStrategy, FSDP2): shard the held model in configure_model
import execwrap
from execwrap.integrations.lightning import shard_lightning_module

class Module(L.LightningModule):
    def configure_model(self):
        plan = execwrap.load_plan({plan_path!r}, self.model)
        shard_lightning_module(self, plan, module="model", prefetch=plan.prefetch)

trainer = L.Trainer(strategy=ModelParallelStrategy(data_parallel_size={world}, tensor_parallel_size=1))
"""


_WRITERS = {
    "fsdp2": _fsdp2,
    "transformers": _transformers,
    "torchtitan": _torchtitan,
    "accelerate": _accelerate,
    "lightning": _lightning,
}
