"""Random module trees for the property suite, built from plain-data specs.

A :class:`ModelSpec` is drawn by hypothesis (:func:`model_specs`) and turned
into a model by :func:`build_model`, deterministically (weights from a fixed
seed), so a failing example shrinks to a small spec that rebuilds the same
model.

Every module maps ``(B, D)`` floats to ``(B, D)`` floats, so any child can be
called any number of times in any order:

* leaves: ``nn.Linear(D, D)`` (bias or not), ``nn.Embedding(V, D)`` (looked up
  with the calling node's ``ids`` buffer and added to the hidden state),
  ``nn.LayerNorm(D)`` (affine or not);
* nodes (:class:`Node`) call their children in a drawn order, with repeats
  (reuse) and omissions (registered modules never called);
* the root (:class:`Root`) calls the tree's top node, plus root-level ops:
  its own parameters used functionally (``F.linear``, by keyword, ``*``,
  ``torch.cat([...])``), a leaf's weight read functionally at the root, a
  leaf called again from the root (module reuse across the tree);
* tied weights (``b.weight = a.weight`` for leaves of equal weight shape),
  frozen leaves, and optionally a leaf registered a second time at the root
  (a module with two FQNs).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from hypothesis import strategies as st

__all__ = [
    "B",
    "D",
    "V",
    "LeafSpec",
    "ModelSpec",
    "NodeSpec",
    "Root",
    "build_model",
    "example_input",
    "leaf_paths",
    "model_specs",
]

D = 4  # hidden size
V = 4  # embedding rows: Embedding weights are (V, D) == Linear weights (D, D)
B = 2  # batch
MAX_DEPTH = 4
MAX_FAN_OUT = 4

LEAF_KINDS = ("linear", "embedding", "layernorm")


@dataclass(frozen=True)
class LeafSpec:
    kind: str  # one of LEAF_KINDS
    flag: bool  # linear: bias; layernorm: elementwise_affine; embedding: unused


@dataclass(frozen=True)
class NodeSpec:
    children: tuple[LeafSpec | NodeSpec, ...]
    calls: tuple[int, ...]  # child indices in call order: repeats and omissions allowed


@dataclass(frozen=True)
class RootOp:
    """One root-level op, before or after the tree.

    kind: ``"linear"`` (``F.linear(h, p)``), ``"linear_kw"``
    (``F.linear(h, weight=p)``), ``"mul"`` (``h * p``), ``"cat"``
    (``F.linear(h, torch.cat([p[:2], q[2:]]))``), ``"leaf_weight"`` (a leaf's
    weight read at the root), ``"call_leaf"`` (a leaf called from the root).
    """

    kind: str
    index: int  # root parameter index, or leaf index
    before: bool  # run before the tree (else after)


@dataclass(frozen=True)
class ModelSpec:
    tree: NodeSpec
    root_ops: tuple[RootOp, ...]
    ties: tuple[tuple[int, int], ...]  # (source leaf, target leaf): target.weight = source.weight
    frozen: tuple[int, ...]  # leaf indices whose parameters are frozen
    alias_leaf: int | None  # leaf registered a second time at the root as ``alias``
    seed: int


# ------------------------------------------------------------------ modules
class Node(nn.Module):
    """Calls its children ``c0 .. c{n-1}`` in the order ``calls``."""

    def __init__(self, children: list[nn.Module], calls: tuple[int, ...]) -> None:
        super().__init__()
        for i, child in enumerate(children):
            self.add_module(f"c{i}", child)
        self.calls = calls
        self.register_buffer("ids", torch.arange(B) % V)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        for i in self.calls:
            child = getattr(self, f"c{i}")
            if isinstance(child, nn.Embedding):
                h = h + child(self.ids)
            else:
                h = child(h)
        return h


class Root(nn.Module):
    """The tree's top node as ``body`` plus root-level parameters and ops."""

    def __init__(self, body: Node, leaves: list[nn.Module], ops: tuple[RootOp, ...]) -> None:
        super().__init__()
        self.body = body
        self.mats = nn.ParameterList()  # (D, D), for linear / cat
        self.vecs = nn.ParameterList()  # (D,), for mul
        self.ops = ops
        self.register_buffer("ids", (torch.arange(B) + 1) % V)
        # leaves reachable from the root's forward, without registering them again
        self._leaf_paths = [_path_of(self, leaf) for leaf in leaves]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x
        for op in self.ops:
            if op.before:
                h = self._apply(op, h)
        h = self.body(h)
        for op in self.ops:
            if not op.before:
                h = self._apply(op, h)
        return h

    def _apply(self, op: RootOp, h: torch.Tensor) -> torch.Tensor:
        if op.kind == "linear":
            return F.linear(h, self.mats[op.index])
        if op.kind == "linear_kw":
            return F.linear(input=h, weight=self.mats[op.index])
        if op.kind == "mul":
            return h * self.vecs[op.index]
        if op.kind == "cat":
            other = self.mats[(op.index + 1) % len(self.mats)]
            return F.linear(h, torch.cat([self.mats[op.index][:2], other[2:]]))
        leaf = self.get_submodule(self._leaf_paths[op.index])
        if op.kind == "call_leaf":
            if isinstance(leaf, nn.Embedding):
                return h + leaf(self.ids)
            return leaf(h)
        assert op.kind == "leaf_weight"
        w = leaf.weight  # a leaf's weight read at the root, its module not called
        if isinstance(leaf, nn.LayerNorm):  # (D,); decided by type: w is a proxy under fx
            return h * w
        return F.linear(h, w)


def _path_of(root: nn.Module, target: nn.Module) -> str:
    for name, mod in root.named_modules():
        if mod is target:
            return name
    raise AssertionError("leaf not in the tree")


def _make_leaf(spec: LeafSpec) -> nn.Module:
    if spec.kind == "linear":
        return nn.Linear(D, D, bias=spec.flag)
    if spec.kind == "embedding":
        return nn.Embedding(V, D)
    return nn.LayerNorm(D, elementwise_affine=spec.flag)


def _make_tree(spec: NodeSpec, leaves: list[nn.Module]) -> Node:
    children: list[nn.Module] = []
    for child in spec.children:
        if isinstance(child, LeafSpec):
            leaf = _make_leaf(child)
            leaves.append(leaf)
            children.append(leaf)
        else:
            children.append(_make_tree(child, leaves))
    return Node(children, spec.calls)


def leaf_specs(tree: NodeSpec) -> list[LeafSpec]:
    """Leaves in build order (depth-first, children in index order)."""
    out: list[LeafSpec] = []
    for child in tree.children:
        if isinstance(child, LeafSpec):
            out.append(child)
        else:
            out.extend(leaf_specs(child))
    return out


def has_weight(leaf: LeafSpec) -> bool:
    return leaf.kind != "layernorm" or leaf.flag


def weight_shape(leaf: LeafSpec) -> tuple[int, ...]:
    return (D,) if leaf.kind == "layernorm" else (D, D)


def num_root_params(ops: tuple[RootOp, ...]) -> tuple[int, int]:
    mats = max((op.index + 1 for op in ops if op.kind in ("linear", "linear_kw", "cat")), default=0)
    if any(op.kind == "cat" for op in ops):
        mats = max(mats, 2)
    vecs = max((op.index + 1 for op in ops if op.kind == "mul"), default=0)
    return mats, vecs


def build_model(spec: ModelSpec) -> Root:
    """The model of ``spec``, with weights from ``spec.seed`` (RNG state kept)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec.seed)
        leaves: list[nn.Module] = []
        body = _make_tree(spec.tree, leaves)
        model = Root(body, leaves, spec.root_ops)
        mats, vecs = num_root_params(spec.root_ops)
        for _ in range(mats):
            model.mats.append(nn.Parameter(torch.randn(D, D) * 0.5))
        for _ in range(vecs):
            model.vecs.append(nn.Parameter(torch.randn(D)))
        for src, dst in spec.ties:
            leaves[dst].weight = leaves[src].weight
        for i in spec.frozen:
            leaves[i].requires_grad_(False)
        if spec.alias_leaf is not None:
            model.alias = leaves[spec.alias_leaf]
    return model


def leaf_paths(model: Root) -> list[str]:
    return list(model._leaf_paths)


def example_input(spec: ModelSpec) -> torch.Tensor:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec.seed + 1)
        return torch.randn(B, D)


# --------------------------------------------------------------- strategies
@st.composite
def leaf_spec(draw: st.DrawFn) -> LeafSpec:
    return LeafSpec(draw(st.sampled_from(LEAF_KINDS)), draw(st.booleans()))


@st.composite
def node_spec(draw: st.DrawFn, depth: int = 1) -> NodeSpec:
    n = draw(st.integers(1, MAX_FAN_OUT))
    children: list[LeafSpec | NodeSpec] = []
    for _ in range(n):
        # a subtree in about one child of three while depth allows
        if depth < MAX_DEPTH - 1 and draw(st.integers(0, 2)) == 0:
            children.append(draw(node_spec(depth + 1)))
        else:
            children.append(draw(leaf_spec()))
    calls = draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=min(n + 1, 4)))
    return NodeSpec(tuple(children), tuple(calls))


@st.composite
def model_specs(draw: st.DrawFn) -> ModelSpec:
    """A random model: tree (root node at depth 1, leaves down to depth 4), ties,
    frozen leaves, root-level ops, optional second registration of a leaf."""
    tree = draw(node_spec())
    leaves = leaf_specs(tree)
    n = len(leaves)
    leaf_idx = st.integers(0, n - 1)

    weighted = [i for i, leaf in enumerate(leaves) if has_weight(leaf)]
    ties: list[tuple[int, int]] = []
    if len(weighted) >= 2:
        pairs = draw(
            st.lists(
                st.tuples(st.sampled_from(weighted), st.sampled_from(weighted)),
                max_size=2,
            )
        )
        tied_targets: set[int] = set()
        for src, dst in pairs:
            if (
                src != dst
                and weight_shape(leaves[src]) == weight_shape(leaves[dst])
                and dst not in tied_targets
                and src not in tied_targets
            ):
                ties.append((src, dst))
                tied_targets.add(dst)

    ops: list[RootOp] = []
    for kind in draw(
        st.lists(
            st.sampled_from(("linear", "linear_kw", "mul", "cat", "leaf_weight", "call_leaf")),
            max_size=3,
        )
    ):
        before = draw(st.booleans())
        if kind in ("linear", "linear_kw", "cat", "mul"):
            ops.append(RootOp(kind, draw(st.integers(0, 1)), before))
        elif kind == "leaf_weight":
            if weighted:
                ops.append(RootOp(kind, draw(st.sampled_from(weighted)), before))
        else:
            ops.append(RootOp(kind, draw(leaf_idx), before))

    frozen = tuple(sorted(draw(st.sets(leaf_idx, max_size=n))))
    alias = draw(st.one_of(st.none(), leaf_idx)) if draw(st.integers(0, 3)) == 0 else None
    seed = draw(st.integers(0, 2**16))
    return ModelSpec(tree, tuple(ops), tuple(ties), frozen, alias, seed)
