"""Untrusted names in every output format: one escaping rule per format, applied at its writer.

The model (:class:`tests.execwrap.factories.HostileNames`) has modules named
like spreadsheet formulas, with characters XML 1.0 cannot carry, terminal
escape sequences, a bidirectional override and a lone surrogate.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import networkx as nx
import pytest

from execwrap.cli import main
from execwrap.cli.text import echo, terminal_safe
from execwrap.planning.planner import plan_wrap
from execwrap.report import write_report
from execwrap.report.csv_files import csv_cell
from execwrap.report.graphml_file import graphml_escape, graphml_unescape
from execwrap.report.html_page import html_text
from tests._saved import swap_calls
from tests.execwrap.factories import HOSTILE_NAMES, HostileNames
from tracing import ExecutionOrder, trace_execution_order

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def order() -> ExecutionOrder:
    return trace_execution_order(HostileNames())


@pytest.fixture(scope="module")
def out(order, tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("hostile")
    write_report(plan_wrap(HostileNames(), order), folder)
    return folder


def _csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


# --------------------------------------------------------------------- CSV
def test_csv_rule():
    assert [csv_cell(c) for c in ("=1+2", "+a", "-b", "@c", "\td", "\re", "'f", "g=h", "")] == [
        "'=1+2",
        "'+a",
        "'-b",
        "'@c",
        "'\td",
        "'\re",
        "''f",
        "g=h",
        "",
    ]
    assert [csv_cell(c) for c in (-1, 0, 2.5, True, None)] == [-1, 0, 2.5, True, None]


def test_csv_cells_starting_a_formula_are_neutralised(out, order):
    assert order.module_forward_order == ["", *HOSTILE_NAMES]
    calls = [r["fqn"] for r in _csv(out / "calls.csv") if r["phase"] == "forward"]
    assert calls[1:8] == ["'=HYPERLINK(1)", "'+x", "'-y", "'@z", "'\tt", "'\rr", "''q"]
    # the rule is reversible: strip one leading quote
    restored = [c[1:] if c.startswith("'") else c for c in calls]
    surrogate = HOSTILE_NAMES.index("s\ud800")
    assert restored[1 + surrogate] == "s\\ud800"  # not UTF-8: written as its escape
    expected = ["", *HOSTILE_NAMES]
    expected[1 + surrogate] = "s\\ud800"
    assert restored == expected
    params = [r["fqn"] for r in _csv(out / "params.csv")]
    assert params[:2] == ["'=HYPERLINK(1).weight", "'=HYPERLINK(1).bias"]
    assert all(not p.startswith(("=", "+", "-", "@", "\t", "\r")) for p in params)


# ----------------------------------------------------------------- GraphML
def test_graphml_rule():
    assert graphml_escape("a\x0bb\\c\rd\te\nf\ud800\ufffe\x7f") == (
        "a\\x0bb\\\\c\\x0dd\te\nf\\ud800\\ufffe\x7f"
    )
    for text in ("", "blocks.0", "\\x0b", "\\\\", "a\x00\x1f\ud8ff\uffff\\u1234"):
        assert graphml_unescape(graphml_escape(text)) == text


def test_graphml_round_trips_every_name(out, order):
    graph = nx.read_graphml(out / "order.graphml")
    modules = {graphml_unescape(n) for n, d in graph.nodes(data=True) if d["kind"] == "module"}
    assert modules == {"", *HOSTILE_NAMES}
    params = {
        graphml_unescape(n): graphml_unescape(d["owner"])
        for n, d in graph.nodes(data=True)
        if d["kind"] == "param"
    }
    assert params == {fqn: fqn.rsplit(".", 1)[0] for fqn in order.params}


# ------------------------------------------------------------ JSON and HTML
def test_json_keeps_exact_names(out, order):
    text = (out / "report.json").read_text(encoding="utf-8")
    assert text.isascii()  # every non-ASCII and control character as a JSON escape
    assert ExecutionOrder.load(out / "report.json") == order


def test_html_shows_escapes(out):
    page = (out / "report.html").read_bytes().decode("utf-8")  # strict: valid UTF-8
    assert "\x1b" not in page and "\u202e" not in page and "\x0b" not in page
    assert "\\x1b[31mred" in page and "\\u202eevil" in page and "s\\ud800" in page
    assert html_text('<a href="x">\x1b') == "&lt;a href=&quot;x&quot;&gt;\\x1b"


# ---------------------------------------------------------------- terminal
def test_terminal_rule():
    assert terminal_safe("blocks.0") == "blocks.0"
    assert terminal_safe("\x1b[2J\r\x07\x7f\x9b\u202e\u2028\xa0\ud800 \\x") == (
        "\\x1b[2J\\x0d\\x07\\x7f\\x9b\\u202e\\u2028\\xa0\\ud800 \\x"
    )
    assert terminal_safe(terminal_safe("\x1b")) == "\\x1b"  # applying it twice is harmless


def test_echo_writes_what_the_stream_can_encode(tmp_path):
    path = tmp_path / "out.txt"
    with open(path, "w", encoding="ascii") as f:
        echo("é\x1b", file=f)
    assert path.read_text(encoding="ascii") == "\\xe9\\x1b\n"


def _all_printable(text: str) -> bool:
    return all(c.isprintable() or c in " \n" for c in text)


def test_show_prints_controls_escaped(out, capsys):
    assert main(["show", str(out)]) == 0
    text = capsys.readouterr().out
    assert _all_printable(text)
    lines = text.splitlines()
    assert "   9  \\x1b[31mred  (Linear)  [unit 9]" in lines
    assert "  14  \\x00nul  (Linear)  [unit 14]" in lines
    assert "   5  \\x09t  (Linear)  [unit 5]" in lines


def test_diff_prints_controls_escaped(out, order, tmp_path, capsys):
    data = order.to_dict()
    swap_calls(data, 9, 10)
    other = tmp_path / "other.json"
    other.write_text(json.dumps(data))
    assert main(["diff", str(out), str(other), "--context", "1"]) == 1
    text = capsys.readouterr().out
    assert _all_printable(text)
    assert text.splitlines()[0] == (
        "orders differ: first divergence at forward call 9: A runs \\x1b[31mred, B runs \\u202eevil"
    )


def test_errors_print_controls_escaped(tmp_path, capsys):
    path = tmp_path / "bad\x1b[2J.json"
    path.write_text('{"schema_version": 1, "module_forward_order": ["\\u001b"], "method": 3}')
    assert main(["show", str(path)]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"execwrap: error: {tmp_path}/bad\\x1b[2J.json: malformed ExecutionOrder: "
        "field method: expected one of 'symbolic', 'runtime', got int 3\n"
    )


def test_report_command_on_hostile_names(tmp_path, capsys, monkeypatch):
    monkeypatch.syspath_prepend(str(REPO))
    model = "tests.execwrap.factories:hostile_names"
    assert main(["report", "--model", model, "--out", str(tmp_path / "r")]) == 0
    assert _all_printable(capsys.readouterr().out)
