"""Any module name survives every report format (hypothesis).

Names are drawn from every Unicode category, lone surrogates and control
characters included; the model is a real ``nn.ModuleDict`` of those names,
traced symbolically. GraphML must round-trip each name through
``networkx.read_graphml`` (with :func:`graphml_unescape`), CSV must read back
to the name after the quote rule, and the terminal text must be printable.
"""

from __future__ import annotations

import csv
import io

import networkx as nx
import torch
import torch.nn as nn
from hypothesis import given
from hypothesis import strategies as st

from execwrap.cli.text import terminal_safe
from execwrap.report.context import ReportContext
from execwrap.report.csv_files import write_calls_csv
from execwrap.report.graphml_file import graphml_unescape, write_graphml
from tracing import trace_execution_order

_RESERVED = set(dir(nn.ModuleDict()))

names = st.text(
    st.characters(blacklist_categories=(), blacklist_characters="."), min_size=1, max_size=8
).filter(lambda n: n not in _RESERVED)


class _Named(nn.ModuleDict):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.values():
            x = layer(x)
        return x


@given(st.lists(names, min_size=1, max_size=4, unique=True))
def test_every_name_survives_graphml_csv_and_terminal(fqns: list[str]) -> None:
    model = _Named({n: nn.Linear(1, 1) for n in fqns})
    order = trace_execution_order(model)
    assert order.module_forward_order == ["", *fqns]
    ctx = ReportContext(order, None, 1, {}, None)

    buf = io.BytesIO()
    write_graphml(ctx, buf)
    graph = nx.read_graphml(io.BytesIO(buf.getvalue()))
    assert {graphml_unescape(n) for n in graph} == {"", *fqns, *order.params}

    buf = io.BytesIO()
    write_calls_csv(ctx, buf)
    rows = list(csv.DictReader(io.StringIO(buf.getvalue().decode("utf-8"), newline="")))
    cells = [r["fqn"] for r in rows]
    restored = [c[1:] if c.startswith("'") else c for c in cells]
    expected = ["", *fqns]
    assert restored == [n.encode("utf-8", "backslashreplace").decode("utf-8") for n in expected]

    for n in fqns:
        assert all(c.isprintable() or c == " " for c in terminal_safe(n))
