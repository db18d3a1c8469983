"""Order graph (build_order_graph, order_subgraph) and first_divergence."""

from __future__ import annotations

import io

import networkx as nx
import pytest
import torch.nn as nn

from execwrap.order.divergence import Divergence, first_divergence
from execwrap.order.graph import build_order_graph, order_subgraph
from tracing.order import ExecutionOrder, ParamInfo, ParamUse, param_infos, shared_param_map


def _order(calls: list[str], **kw: object) -> ExecutionOrder:
    return ExecutionOrder(module_forward_order=list(calls), method="runtime", **kw)  # type: ignore[arg-type]


STABLE = ["", "layer0", "layer2", "layer1"]


def test_two_identical_orders_give_a_path_with_counts_2() -> None:
    g = build_order_graph(_order(STABLE), _order(STABLE))
    fwd = order_subgraph(g)
    assert list(fwd.edges(data="forward")) == [
        ("", "layer0", 2),
        ("layer0", "layer2", 2),
        ("layer2", "layer1", 2),
    ]
    # a single path: one source, one sink, every node at most one successor
    assert [n for n in fwd if fwd.in_degree(n) == 0] == [""]
    assert [n for n in fwd if fwd.out_degree(n) == 0] == ["layer1"]
    assert nx.is_directed_acyclic_graph(fwd)
    assert max(d for _, d in fwd.out_degree()) == 1
    assert g.nodes["layer2"]["call_count"] == 2
    assert g.nodes["layer2"]["first_call"] == 2
    assert g.graph["num_orders"] == 2


def test_divergent_pair_gives_exactly_one_node_with_two_successors() -> None:
    a = _order(["", "a", "b", "d"])
    b = _order(["", "a", "c", "d"])
    fwd = order_subgraph(build_order_graph(a, b))
    branching = {n: sorted(fwd.successors(n)) for n in fwd if fwd.out_degree(n) > 1}
    assert branching == {"a": ["b", "c"]}
    assert fwd.edges["", "a"]["forward"] == 2
    assert fwd.edges["a", "b"]["forward"] == 1
    assert fwd.edges["a", "c"]["forward"] == 1
    assert fwd.edges["b", "d"]["forward"] == 1


def test_first_divergence_names_index_and_modules() -> None:
    a = _order(["", "a", "b", "c", "d", "e"])
    b = _order(["", "a", "b", "x", "d", "e"])
    d = first_divergence(a, b, context=2)
    assert d == Divergence(
        index=3,
        expected="c",
        found="x",
        context_a=("a", "b", "c", "d", "e"),
        context_b=("a", "b", "x", "d", "e"),
    )
    assert "call 3" in str(d) and "'c'" in str(d) and "'x'" in str(d)
    assert first_divergence(a, a) is None
    # plain lists of FQNs work too
    assert first_divergence(["", "a"], ["", "b"], context=0) == Divergence(
        1, "a", "b", ("a",), ("b",)
    )


def test_first_divergence_prefix() -> None:
    d = first_divergence(["", "a", "b"], ["", "a"], context=1)
    assert d == Divergence(2, "b", None, ("a", "b"), ("a",))
    d = first_divergence(["", "a"], ["", "a", "b"], context=1)
    assert d is not None and (d.index, d.expected, d.found) == (2, None, "b")
    assert "<end of order>" in str(d)


def test_first_divergence_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="context must be an int >= 0"):
        first_divergence(["a"], ["a"], context=-1)
    with pytest.raises(TypeError, match="first_divergence: a must be an ExecutionOrder"):
        first_divergence("abc", ["a"])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="must hold module FQN strings"):
        first_divergence(["a"], ["a", 3])  # type: ignore[list-item]


def test_build_order_graph_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="at least one ExecutionOrder"):
        build_order_graph()
    with pytest.raises(TypeError, match="argument 1 is a list"):
        build_order_graph(_order(STABLE), STABLE)  # type: ignore[arg-type]


class Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(10, 4)
        self.body = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
        self.head = nn.Linear(4, 10, bias=False)
        self.head.weight = self.emb.weight


def _tied_order() -> ExecutionOrder:
    model = Tied()
    _, shared = shared_param_map(model)
    return ExecutionOrder(
        module_forward_order=["", "emb", "body", "body.0", "body.1", "head"],
        param_forward_order=["emb.weight", "body.0.weight", "body.0.bias"],
        param_uses=[
            ParamUse("emb", 1, ("emb.weight",)),
            ParamUse("body.0", 3, ("body.0.weight", "body.0.bias")),
            ParamUse("head", 5, ("emb.weight",)),
        ],
        module_backward_order=["head", "body.1", "body.0", "body", "emb"],
        shared_params=shared,
        params=param_infos(model),
        module_classes={f: type(m).__name__ for f, m in model.named_modules()},
        method="runtime",
    )


def test_node_and_edge_attributes() -> None:
    g = build_order_graph(_tied_order())
    assert g.nodes[""]["label"] == "<root>"
    assert g.nodes["body.0"] == {
        "kind": "module",
        "label": "body.0",
        "class_name": "Linear",
        "own_numel": 20,
        "call_count": 1,
        "backward_count": 1,
        "first_call": 3,
    }
    assert g.nodes["emb.weight"]["kind"] == "param"
    assert g.nodes["emb.weight"]["aliases"] == "head.weight"
    assert g.nodes["emb.weight"]["bytes"] == 160
    assert g.nodes["head"]["own_numel"] == 0  # the alias is counted at its canonical owner
    # containment edges, including the tied alias
    assert g.edges["", "body"]["contains"] is True
    assert g.edges["head", "emb.weight"]["contains"] is True
    assert g.edges["head", "emb.weight"]["uses"] == 1
    assert g.edges["head", "emb.weight"]["kind"] == "contains+uses"
    # "" -> emb is both a containment and a forward "runs next" edge
    assert g.edges["", "emb"]["kind"] == "contains+next"
    assert g.edges["", "emb"]["forward"] == 1
    assert g.edges["body", "body.0"]["kind"] == "contains+next"
    bwd = order_subgraph(g, "backward")
    assert sorted(bwd.edges(data="backward")) == [
        ("body", "emb", 1),
        ("body.0", "body", 1),
        ("body.1", "body.0", 1),
        ("head", "body.1", 1),
    ]
    with pytest.raises(ValueError, match="phase must be one of"):
        order_subgraph(g, "sideways")  # type: ignore[arg-type]


def test_graphml_round_trip() -> None:
    g = build_order_graph(_tied_order(), _tied_order())
    buf = io.BytesIO()
    nx.write_graphml(g, buf)
    buf.seek(0)
    back = nx.read_graphml(buf)
    assert set(back.nodes) == set(g.nodes)
    assert back.edges["emb", "body"]["forward"] == 2
    assert back.nodes["body.0"]["class_name"] == "Linear"


def test_param_only_known_from_uses_gets_a_node() -> None:
    order = _order(["", "a"], param_uses=[ParamUse("a", 1, ("a.w",))])
    order.params = {}
    g = build_order_graph(order)
    assert g.nodes["a.w"]["kind"] == "param"
    assert g.edges["a", "a.w"]["uses"] == 1
    info = ParamInfo(numel=3, dtype="float32", requires_grad=True)
    assert info.bytes == 12
