"""The case table: each hard model kind with its exact expected orders.

Every list below was derived by reading the model in models.py, not copied
from a capture:

* ``module_forward_order``: the root ``""`` then each module's forward call in
  program order (a leaf module such as ``nn.Linear`` or
  ``nn.MultiheadAttention`` counts, the modules it uses internally without
  calling them do not).
* ``param_forward_order``: the first use of each canonical parameter, in
  program order; within one call, in argument order (``F.linear(x, w, b)``:
  weight, bias; ``F.multi_head_attention_forward``: ``in_proj_weight``,
  ``in_proj_bias``, ``out_proj.weight``, ``out_proj.bias``).
* ``param_backward_order``: autograd runs the ready node with the highest
  sequence number first, and an ``AccumulateGrad`` node as soon as all its
  inputs are in. For ``y = F.linear(x, W, b)`` on 2-D ``x`` the graph is
  ``addmm(b, x, W.t())``, so ``b``'s gradient is ready first, then ``W``'s
  (through ``TBackward``, created after the previous layer's ops); a
  parameter used twice is ready after its last (earliest in forward) use.
  ``LayerNorm``: weight then bias. Frozen parameters never appear.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn as nn

from tests.cases import models as m

__all__ = ["CASES", "PLANS", "Case", "PlanCase", "build", "inputs"]

X = torch.tensor([[0.5, 1.0, 1.5, 2.0], [0.25, -0.5, 0.75, 1.0]])
IDS = torch.tensor([0, 3, 5, 1])


@dataclass(frozen=True)
class Case:
    """One hard model kind and what capture must report for it.

    Attributes:
        make: builds the model (called under a fixed seed by :func:`build`).
        make_inputs: the example inputs (a tuple of positional arguments).
        module_forward_order, param_forward_order, param_backward_order:
            the exact expected orders (backward: runtime capture only).
        param_uses: ``(module_fqn, call_index, param_fqns)`` per group.
        shared_params: canonical FQN -> aliases.
        recompute_order: module calls re-run by activation checkpointing.
        symbolic_error: ``(module_fqn, module_class, error type name)`` when
            plain ``torch.fx`` tracing must fail, else ``None``.
        module_call_depths: the expected depth of each call (``None``: not
            checked): how many calls it runs inside.
        traces_with_inputs: symbolic tracing fails without inputs but works
            with the example inputs bound to ``forward`` (``*args`` of a known
            length), so the capture ladder stays symbolic.
    """

    make: Callable[[], nn.Module]
    make_inputs: Callable[[], tuple[torch.Tensor, ...]]
    module_forward_order: list[str]
    param_forward_order: list[str]
    param_backward_order: list[str]
    param_uses: list[tuple[str, int, tuple[str, ...]]]
    shared_params: dict[str, list[str]] = field(default_factory=dict)
    recompute_order: list[str] = field(default_factory=list)
    symbolic_error: tuple[str, str, str] | None = None
    traces_with_inputs: bool = False
    module_call_depths: list[int] | None = None


def build(case: Case, seed: int = 0) -> nn.Module:
    """The case's model, built under ``seed`` (RNG state restored afterwards)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return case.make()


def inputs(case: Case) -> tuple[torch.Tensor, ...]:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1)
        return case.make_inputs()


def _x() -> tuple[torch.Tensor, ...]:
    return (X.clone(),)


def _ids() -> tuple[torch.Tensor, ...]:
    return (IDS.clone(),)


def _factory_case(kind: str) -> Case:
    return Case(
        make=lambda: m.FactoryModel(kind),
        make_inputs=_x,
        module_forward_order=["", "block", "block.fc", "head"],
        param_forward_order=["block.fc.weight", "block.fc.bias", "head.weight", "head.bias"],
        param_backward_order=["head.bias", "head.weight", "block.fc.bias", "block.fc.weight"],
        param_uses=[
            ("block.fc", 2, ("block.fc.weight", "block.fc.bias")),
            ("head", 3, ("head.weight", "head.bias")),
        ],
        symbolic_error=("block", "FactoryBlock", "RuntimeError" if kind == "len" else "TypeError"),
    )


# The two checkpointed variants: same model, same expected orders. The tied
# weight block0.fc1.weight (alias block1.fc1.weight) gets its gradient from
# block1 first and from block0 last; it is ready, once, after block0.fc1.bias.
_CKPT_FORWARD = [
    "", "inp",
    "block0", "block0.fc1", "block0.act", "block0.fc2",
    "block1", "block1.fc1", "block1.act", "block1.fc2",
    "head",
]  # fmt: skip
_CKPT = dict(
    make_inputs=_x,
    module_forward_order=_CKPT_FORWARD,
    param_forward_order=[
        "inp.weight",
        "inp.bias",
        "block0.fc1.weight",
        "block0.fc1.bias",
        "block0.fc2.weight",
        "block0.fc2.bias",
        "block1.fc1.bias",
        "block1.fc2.weight",
        "block1.fc2.bias",
        "head.weight",
        "head.bias",
    ],  # fmt: skip
    param_backward_order=[
        "head.bias",
        "head.weight",
        "block1.fc2.bias",
        "block1.fc2.weight",
        "block1.fc1.bias",
        "block0.fc2.bias",
        "block0.fc2.weight",
        "block0.fc1.bias",
        "block0.fc1.weight",
        "inp.bias",
        "inp.weight",
    ],  # fmt: skip
    param_uses=[
        ("inp", 1, ("inp.weight", "inp.bias")),
        ("block0.fc1", 3, ("block0.fc1.weight", "block0.fc1.bias")),
        ("block0.fc2", 5, ("block0.fc2.weight", "block0.fc2.bias")),
        ("block1.fc1", 7, ("block0.fc1.weight", "block1.fc1.bias")),
        ("block1.fc2", 9, ("block1.fc2.weight", "block1.fc2.bias")),
        ("head", 10, ("head.weight", "head.bias")),
    ],
    shared_params={"block0.fc1.weight": ["block1.fc1.weight"]},
    # backward reaches block1 first, so it is recomputed first
    recompute_order=[
        "block1",
        "block1.fc1",
        "block1.act",
        "block1.fc2",
        "block0",
        "block0.fc1",
        "block0.act",
        "block0.fc2",
    ],  # fmt: skip
)


CASES: dict[str, Case] = {
    "data_dependent_if": Case(
        make=m.DataDependentIf,
        make_inputs=_x,  # X.sum() > 0: block.pos runs, block.neg never does
        module_forward_order=["", "block", "block.pos", "post"],
        param_forward_order=["block.pos.weight", "block.pos.bias", "post.weight", "post.bias"],
        param_backward_order=["post.bias", "post.weight", "block.pos.bias", "block.pos.weight"],
        param_uses=[
            ("block.pos", 2, ("block.pos.weight", "block.pos.bias")),
            ("post", 3, ("post.weight", "post.bias")),
        ],
        symbolic_error=("block", "Branch", "TraceError"),
    ),
    **{f"factory_{kind}": _factory_case(kind) for kind in m.FACTORY_KINDS},
    "loop_over_args": Case(
        make=m.LoopOverArgs,
        make_inputs=lambda: (torch.randn(2, 4), torch.randn(2, 4), torch.randn(2, 4)),
        module_forward_order=["", "layers.2", "layers.1", "layers.0"],
        param_forward_order=[
            "layers.2.weight",
            "layers.2.bias",
            "layers.1.weight",
            "layers.0.weight",
            "layers.0.bias",
        ],  # fmt: skip
        # stack's backward feeds all three at once: the last created runs first
        param_backward_order=[
            "layers.0.bias",
            "layers.0.weight",
            "layers.1.weight",
            "layers.2.bias",
            "layers.2.weight",
        ],  # fmt: skip
        param_uses=[
            ("layers.2", 1, ("layers.2.weight", "layers.2.bias")),
            ("layers.1", 2, ("layers.1.weight",)),
            ("layers.0", 3, ("layers.0.weight", "layers.0.bias")),
        ],
        symbolic_error=("", "LoopOverArgs", "TraceError"),
        traces_with_inputs=True,  # bound inputs: three placeholders, not one *args Proxy
    ),
    "root_params": Case(
        make=m.RootParams,
        make_inputs=_x,
        module_forward_order=["", "fc"],
        param_forward_order=["fc.weight", "fc.bias", "w1", "w2", "proj", "scale"],
        # mul (scale) -> linear(proj) -> linear(cat(w1, w2)) -> fc
        param_backward_order=["scale", "proj", "w1", "w2", "fc.bias", "fc.weight"],
        param_uses=[
            ("fc", 1, ("fc.weight", "fc.bias")),
            ("", 0, ("w1", "w2")),
            ("", 0, ("proj",)),
            ("", 0, ("scale",)),
        ],
    ),
    "called_twice": Case(
        make=m.CalledTwice,
        make_inputs=_x,
        module_forward_order=["", "shared", "mid", "shared", "out"],
        param_forward_order=[
            "shared.weight",
            "shared.bias",
            "mid.weight",
            "out.weight",
            "out.bias",
        ],
        # shared's gradients are ready only after its first call's backward
        param_backward_order=[
            "out.bias",
            "out.weight",
            "mid.weight",
            "shared.bias",
            "shared.weight",
        ],
        param_uses=[
            ("shared", 1, ("shared.weight", "shared.bias")),
            ("mid", 2, ("mid.weight",)),
            ("shared", 3, ("shared.weight", "shared.bias")),
            ("out", 4, ("out.weight", "out.bias")),
        ],
        module_call_depths=[0, 1, 1, 1, 1],
    ),
    "called_outside_block": Case(
        make=m.CalledOutsideBlock,
        make_inputs=_x,
        module_forward_order=[
            "",
            "block0",
            "block0.fc1",
            "block0.act",
            "block0.fc2",
            "block1",
            "block1.fc1",
            "block1.act",
            "block1.fc2",
            "block0.fc2",  # from the root, after block0 returned
        ],
        module_call_depths=[0, 1, 2, 2, 2, 1, 2, 2, 2, 1],
        param_forward_order=[
            "block0.fc1.weight",
            "block0.fc1.bias",
            "block0.fc2.weight",
            "block0.fc2.bias",
            "block1.fc1.weight",
            "block1.fc1.bias",
            "block1.fc2.weight",
            "block1.fc2.bias",
        ],
        # block0.fc2's gradients are ready only after its first call's backward
        param_backward_order=[
            "block1.fc2.bias",
            "block1.fc2.weight",
            "block1.fc1.bias",
            "block1.fc1.weight",
            "block0.fc2.bias",
            "block0.fc2.weight",
            "block0.fc1.bias",
            "block0.fc1.weight",
        ],
        param_uses=[
            ("block0.fc1", 2, ("block0.fc1.weight", "block0.fc1.bias")),
            ("block0.fc2", 4, ("block0.fc2.weight", "block0.fc2.bias")),
            ("block1.fc1", 6, ("block1.fc1.weight", "block1.fc1.bias")),
            ("block1.fc2", 8, ("block1.fc2.weight", "block1.fc2.bias")),
            ("block0.fc2", 9, ("block0.fc2.weight", "block0.fc2.bias")),
        ],
    ),
    "embed_read_by_head": Case(
        make=m.EmbedReadByHead,
        make_inputs=_ids,
        module_forward_order=["", "embed", "body", "head", "head.norm"],
        param_forward_order=[
            "embed.weight",
            "body.weight",
            "body.bias",
            "head.norm.weight",
            "head.norm.bias",
        ],  # fmt: skip
        param_backward_order=[
            "head.norm.weight",
            "head.norm.bias",
            "body.bias",
            "body.weight",
            "embed.weight",
        ],  # fmt: skip
        param_uses=[
            ("embed", 1, ("embed.weight",)),
            ("body", 2, ("body.weight", "body.bias")),
            ("head.norm", 4, ("head.norm.weight", "head.norm.bias")),
            ("head", 3, ("embed.weight",)),  # F.linear after head.norm returned
        ],
    ),
    "tied_embedding": Case(
        make=m.TiedLM,
        make_inputs=_ids,
        module_forward_order=["", "embed", "block", "norm", "lm_head"],
        param_forward_order=[
            "embed.weight",
            "block.weight",
            "block.bias",
            "norm.weight",
            "norm.bias",
        ],
        param_backward_order=[
            "norm.weight",
            "norm.bias",
            "block.bias",
            "block.weight",
            "embed.weight",
        ],
        param_uses=[
            ("embed", 1, ("embed.weight",)),
            ("block", 2, ("block.weight", "block.bias")),
            ("norm", 3, ("norm.weight", "norm.bias")),
            ("lm_head", 4, ("embed.weight",)),
        ],
        shared_params={"embed.weight": ["lm_head.weight"]},
    ),
    "multihead_attention": Case(
        make=m.MHAModel,
        make_inputs=lambda: (torch.randn(2, 3, 4),),
        module_forward_order=["", "inp", "attn", "out"],  # never attn.out_proj
        param_forward_order=[
            "inp.weight",
            "inp.bias",
            "attn.in_proj_weight",
            "attn.in_proj_bias",
            "attn.out_proj.weight",
            "attn.out_proj.bias",
            "out.weight",
            "out.bias",
        ],  # fmt: skip
        param_backward_order=[
            "out.bias",
            "out.weight",
            "attn.out_proj.bias",
            "attn.out_proj.weight",
            "attn.in_proj_bias",
            "attn.in_proj_weight",
            "inp.bias",
            "inp.weight",
        ],  # fmt: skip
        param_uses=[
            ("inp", 1, ("inp.weight", "inp.bias")),
            (
                "attn",
                2,
                (
                    "attn.in_proj_weight",
                    "attn.in_proj_bias",
                    "attn.out_proj.weight",
                    "attn.out_proj.bias",
                ),
            ),
            ("out", 3, ("out.weight", "out.bias")),
        ],
    ),
    "lora": Case(
        make=m.LoRAModel,
        make_inputs=_x,
        module_forward_order=[
            "",
            "l0",
            "l0.base",
            "l0.lora_a",
            "l0.lora_b",
            "act",
            "l1",
            "l1.base",
            "l1.lora_a",
            "l1.lora_b",
        ],  # fmt: skip
        param_forward_order=[
            "l0.base.weight",
            "l0.base.bias",
            "l0.lora_a.weight",
            "l0.lora_b.weight",
            "l1.base.weight",
            "l1.base.bias",
            "l1.lora_a.weight",
            "l1.lora_b.weight",
        ],  # fmt: skip
        # frozen base weights never get a gradient
        param_backward_order=[
            "l1.lora_b.weight",
            "l1.lora_a.weight",
            "l0.lora_b.weight",
            "l0.lora_a.weight",
        ],
        param_uses=[
            ("l0.base", 2, ("l0.base.weight", "l0.base.bias")),
            ("l0.lora_a", 3, ("l0.lora_a.weight",)),
            ("l0.lora_b", 4, ("l0.lora_b.weight",)),
            ("l1.base", 7, ("l1.base.weight", "l1.base.bias")),
            ("l1.lora_a", 8, ("l1.lora_a.weight",)),
            ("l1.lora_b", 9, ("l1.lora_b.weight",)),
        ],
    ),
    "never_called": Case(
        make=m.WithUnused,
        make_inputs=_x,
        module_forward_order=["", "fc1", "fc2"],
        param_forward_order=["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"],
        param_backward_order=["fc2.bias", "fc2.weight", "fc1.bias", "fc1.weight"],
        param_uses=[("fc1", 1, ("fc1.weight", "fc1.bias")), ("fc2", 2, ("fc2.weight", "fc2.bias"))],
    ),
    "inplace_relu": Case(
        make=m.InplaceAfterLinear,
        make_inputs=_x,
        module_forward_order=["", "fc1", "act", "fc2"],
        param_forward_order=["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"],
        param_backward_order=["fc2.bias", "fc2.weight", "fc1.bias", "fc1.weight"],
        param_uses=[("fc1", 1, ("fc1.weight", "fc1.bias")), ("fc2", 3, ("fc2.weight", "fc2.bias"))],
    ),
    "checkpoint_reentrant": Case(make=lambda: m.CheckpointedBlocks(use_reentrant=True), **_CKPT),
    "checkpoint_non_reentrant": Case(
        make=lambda: m.CheckpointedBlocks(use_reentrant=False), **_CKPT
    ),
}


# ----------------------------------------------------------------- plans
@dataclass(frozen=True)
class PlanCase:
    """The plan expected for a case under one init policy.

    Attributes:
        policy: builds the init policy (``None``: torch's ``always_wrap_policy``,
            which wraps every module, parameter-less ones included).
        units: ``(module_fqns, param_fqns, first_use, last_use)`` per unit,
            in execution order (by first call; ``first_use``/``last_use``
            index ``module_forward_order``: ``last_use`` is the last call of
            the unit's module or of a module nested in it, or the last use of
            one of its parameters; the root's is the last call of forward).
        notes: for each expected note, fragments that must all appear in it;
            the plan has exactly this many notes.
    """

    case: str
    units: list[tuple[tuple[str, ...], tuple[str, ...], int | None, int | None]]
    notes: list[tuple[str, ...]] = field(default_factory=list)
    policy: Callable[[], object] | None = None


def _block_policy() -> object:
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    return ModuleWrapPolicy({m.MLPBlock})


def _lora_policy() -> object:
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    return ModuleWrapPolicy({m.LoRALinear})


_FACTORY_UNITS = [
    (("",), (), 0, 3),
    (("block",), (), 1, 2),  # FactoryBlock owns no parameter directly; block.fc runs inside
    (("block.fc",), ("block.fc.weight", "block.fc.bias"), 2, 2),
    (("head",), ("head.weight", "head.bias"), 3, 3),
]
_CKPT_UNITS = [
    # the tied weight's names lie in block0.fc1 and block1.fc1: every unit
    # enclosing one of them (block0, block0.fc1, block1, block1.fc1) is
    # dropped, and the root holds what those would have held
    (("",), ("block0.fc1.weight", "block0.fc1.bias", "block1.fc1.bias"), 0, 10),
    (("inp",), ("inp.weight", "inp.bias"), 1, 1),
    (("block0.act",), (), 4, 4),
    (("block0.fc2",), ("block0.fc2.weight", "block0.fc2.bias"), 5, 5),
    (("block1.act",), (), 8, 8),
    (("block1.fc2",), ("block1.fc2.weight", "block1.fc2.bias"), 9, 9),
    (("head",), ("head.weight", "head.bias"), 10, 10),
]
_CKPT_NOTES = [
    (
        "Tied parameter 'block0.fc1.weight'",
        "'block1.fc1.weight'",
        "it goes to unit <root>, which encloses both",
        "'block0.fc1'",
        "'block0'",
        "'block1.fc1'",
        "'block1'",
    )
]

PLANS: dict[str, PlanCase] = {
    "data_dependent_if": PlanCase(
        "data_dependent_if",
        units=[
            (("",), (), 0, 3),
            # block.neg never runs: not a unit, its weight stays in block's unit
            (("block",), ("block.neg.weight",), 1, 2),
            (("block.pos",), ("block.pos.weight", "block.pos.bias"), 2, 2),
            (("post",), ("post.weight", "post.bias"), 3, 3),
        ],
        notes=[("'block.neg'", "never called with the example inputs", "stay in unit 'block'")],
    ),
    **{
        f"factory_{kind}": PlanCase(f"factory_{kind}", units=_FACTORY_UNITS)
        for kind in m.FACTORY_KINDS
    },
    "loop_over_args": PlanCase(
        "loop_over_args",
        units=[
            (("",), (), 0, 3),
            (("layers.2",), ("layers.2.weight", "layers.2.bias"), 1, 1),
            (("layers.1",), ("layers.1.weight",), 2, 2),
            (("layers.0",), ("layers.0.weight", "layers.0.bias"), 3, 3),
        ],
        # the ModuleList is a policy unit whose forward never runs
        notes=[("'layers'", "ModuleList", "never runs its own forward")],
    ),
    "root_params": PlanCase(
        "root_params",
        units=[
            (("",), ("w1", "w2", "proj", "scale"), 0, 1),  # forward order, not definition
            (("fc",), ("fc.weight", "fc.bias"), 1, 1),
        ],
        notes=[("Parameter 'scale' is 0-dim (a scalar)", "refuse this model before wrapping")],
    ),
    "called_outside_block": PlanCase(
        "called_outside_block",
        units=[
            # the root's call of block0.fc2 runs outside every call of block0:
            # block0 is not wrapped and the root holds its parameters
            (
                ("",),
                ("block0.fc1.weight", "block0.fc1.bias", "block0.fc2.weight", "block0.fc2.bias"),
                0,
                9,
            ),
            (
                ("block1",),
                tuple(f"block1.fc{i}.{k}" for i in (1, 2) for k in ("weight", "bias")),
                5,
                8,
            ),
        ],
        notes=[
            (
                "Module 'block0.fc2' (call 9, called from <root>) uses parameter "
                "'block0.fc2.weight' outside every call of 'block0' (MLPBlock)",
                "Not wrapped; its parameters (4 parameters, 40 elements) go to unit <root>.",
            )
        ],
        policy=_block_policy,
    ),
    "called_twice": PlanCase(
        "called_twice",
        units=[
            (("",), (), 0, 4),
            (("shared",), ("shared.weight", "shared.bias"), 1, 3),
            (("mid",), ("mid.weight",), 2, 2),
            (("out",), ("out.weight", "out.bias"), 4, 4),  # defined first, runs last
        ],
    ),
    "embed_read_by_head": PlanCase(
        "embed_read_by_head",
        units=[
            # head reads embed.weight after embed's unit resharded it: embed
            # is not wrapped and the root holds the weight
            (("",), ("embed.weight",), 0, 4),
            (("body",), ("body.weight", "body.bias"), 2, 2),
            (("head",), (), 3, 4),  # head.norm runs inside head
            (("head.norm",), ("head.norm.weight", "head.norm.bias"), 4, 4),
        ],
        notes=[("'embed.weight'", "'head'", "goes to unit <root>", "'embed' is not wrapped")],
    ),
    "tied_embedding": PlanCase(
        "tied_embedding",
        units=[
            (("",), ("embed.weight",), 0, 4),
            (("block",), ("block.weight", "block.bias"), 2, 2),
            (("norm",), ("norm.weight", "norm.bias"), 3, 3),
        ],
        notes=[
            (
                "Tied parameter 'embed.weight'",
                "'lm_head.weight'",
                "goes to unit <root>, which encloses both",
                "'embed' and 'lm_head' are not wrapped because of the tie",
            )
        ],
    ),
    "multihead_attention": PlanCase(
        "multihead_attention",
        units=[
            (("",), (), 0, 3),
            (("inp",), ("inp.weight", "inp.bias"), 1, 1),
            # never a unit of its own for attn.out_proj
            (
                ("attn",),
                (
                    "attn.in_proj_weight",
                    "attn.in_proj_bias",
                    "attn.out_proj.weight",
                    "attn.out_proj.bias",
                ),
                2,
                2,
            ),
            (("out",), ("out.weight", "out.bias"), 3, 3),
        ],
        notes=[("'attn.out_proj'", "never runs its own forward", "used by 'attn'", "unit 'attn'")],
    ),
    "lora": PlanCase(
        "lora",
        policy=_lora_policy,
        units=[
            (("",), (), 0, 9),
            (
                ("l0",),
                ("l0.base.weight", "l0.base.bias", "l0.lora_a.weight", "l0.lora_b.weight"),
                1,
                4,  # l0.base, l0.lora_a, l0.lora_b run inside l0 (calls 2-4)
            ),
            (
                ("l1",),
                ("l1.base.weight", "l1.base.bias", "l1.lora_a.weight", "l1.lora_b.weight"),
                6,
                9,
            ),
        ],
        notes=[
            ("mixes requires_grad", "'l0.base.weight'", "'l0.base.bias'", "use_orig_params=True"),
            ("mixes requires_grad", "'l1.base.weight'", "'l1.base.bias'", "use_orig_params=True"),
        ],
    ),
    "lora_always_wrap": PlanCase(
        "lora",  # every Linear its own unit: no unit mixes requires_grad
        units=[
            (("",), (), 0, 9),
            (("l0",), (), 1, 4),
            (("l0.base",), ("l0.base.weight", "l0.base.bias"), 2, 2),
            (("l0.lora_a",), ("l0.lora_a.weight",), 3, 3),
            (("l0.lora_b",), ("l0.lora_b.weight",), 4, 4),
            (("act",), (), 5, 5),
            (("l1",), (), 6, 9),
            (("l1.base",), ("l1.base.weight", "l1.base.bias"), 7, 7),
            (("l1.lora_a",), ("l1.lora_a.weight",), 8, 8),
            (("l1.lora_b",), ("l1.lora_b.weight",), 9, 9),
        ],
    ),
    "never_called": PlanCase(
        "never_called",
        units=[
            (("",), ("unused.weight", "unused.bias"), 0, 2),
            (("fc1",), ("fc1.weight", "fc1.bias"), 1, 1),
            (("fc2",), ("fc2.weight", "fc2.bias"), 2, 2),
        ],
        notes=[("'unused'", "never called", "stay in unit <root>")],
    ),
    "inplace_relu": PlanCase(
        "inplace_relu",
        units=[
            (("",), (), 0, 3),
            (("fc1",), ("fc1.weight", "fc1.bias"), 1, 1),
            (("act",), (), 2, 2),
            (("fc2",), ("fc2.weight", "fc2.bias"), 3, 3),
        ],
    ),
    "checkpoint_reentrant": PlanCase("checkpoint_reentrant", _CKPT_UNITS, _CKPT_NOTES),
    "checkpoint_non_reentrant": PlanCase("checkpoint_non_reentrant", _CKPT_UNITS, _CKPT_NOTES),
}
