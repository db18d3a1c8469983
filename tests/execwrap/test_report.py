"""Tests for execwrap.report: every format written and read back."""

from __future__ import annotations

import csv
import dataclasses
import json
import sys
from html.parser import HTMLParser
from pathlib import Path

import networkx as nx
import pytest
from torch.distributed.fsdp.wrap import ModuleWrapPolicy, always_wrap_policy

from execwrap.demo_models import Block, build_demo_model
from execwrap.plan.wrap_plan import WrapPlan
from execwrap.planning.planner import plan_wrap
from execwrap.report import (
    NO_CHARTS_LINE,
    REPORT_SCHEMA_VERSION,
    format_bytes,
    format_numel,
    unsharded_timeline,
    write_report,
)
from execwrap.report import context as report_mod
from execwrap.report.file_set import SET_FOLDER
from execwrap.report.html_page import timeline_caption
from execwrap.report.writer import FILE_WRITERS
from tracing import ExecutionOrder, trace_execution_order

ALL_FILES = {"report.json", "calls.csv", "params.csv", "order.graphml", "report.html"}


@pytest.fixture(scope="module")
def model():
    return build_demo_model(2)


@pytest.fixture(scope="module")
def order(model):
    return trace_execution_order(model)


@pytest.fixture(scope="module")
def plan(model, order):
    return plan_wrap(model, order, ModuleWrapPolicy({Block}))


@pytest.fixture(scope="module")
def baseline(model, order):
    return plan_wrap(model, order, always_wrap_policy)


@pytest.fixture(scope="module")
def written(plan, baseline, tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    paths = write_report(plan, out, prefetch=1, baselines={"always": baseline}, title="T <&>")
    return out, paths


def _stats_dict(stats) -> dict:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(stats).items()}


# ---------------------------------------------------------------------- files
def test_writes_every_format_and_nothing_else(written):
    out, paths = written
    assert set(paths) == {"json", "calls_csv", "params_csv", "graphml", "html"}
    assert {p.name for p in out.iterdir()} == ALL_FILES | {SET_FOLDER}
    assert all(p.parent == out for p in paths.values())
    assert (out / "report.json").stat().st_mode & 0o044  # readable like open() makes it


def test_formats_subset(plan, tmp_path):
    paths = write_report(plan, tmp_path, formats=("csv",))
    assert set(paths) == {"calls_csv", "params_csv"}
    assert {p.name for p in tmp_path.iterdir()} == {"calls.csv", "params.csv", SET_FOLDER}


# ----------------------------------------------------------------------- JSON
def test_json_round_trip(written, order, plan, baseline):
    out, paths = written
    data = json.loads(paths["json"].read_text())
    assert data["schema_version"] == REPORT_SCHEMA_VERSION == 1
    assert data["kind"] == "execwrap-report"
    assert data["title"] == "T <&>"
    assert data["model_class"] == "GPT"
    assert data["prefetch"] == 1
    assert data["order"] == order.to_dict()
    assert ExecutionOrder.from_dict(data["order"]) == order
    assert ExecutionOrder.load(paths["json"]) == order
    p = data["plan"]
    assert p == plan.to_dict()  # to_dict's stats are at prefetch 1, as this report's
    assert WrapPlan.from_dict(p, ExecutionOrder.from_dict(data["order"])) == plan
    assert [u["module_fqns"] for u in p["units"]] == [[""], ["blocks.0"], ["blocks.1"]]
    assert p["groups"] == plan.groups == [[""], ["blocks.0"], ["blocks.1"]]
    assert p["notes"] == list(plan.notes)
    assert p["policy_name"] == plan.policy_name
    assert p["bucket_numel"] is None
    assert p["stats"] == _stats_dict(plan.stats(1))
    assert p["stats"]["num_units"] == 3
    assert set(data["baselines"]) == {"always"}
    assert data["baselines"]["always"]["stats"] == _stats_dict(baseline.stats(1))
    assert data["baselines"]["always"]["groups"] == baseline.groups


def test_json_of_order_only(order, tmp_path):
    paths = write_report(order, tmp_path, formats=["json"])
    data = json.loads(paths["json"].read_text())
    assert data["order"] == order.to_dict()
    assert data["plan"] is None
    assert data["baselines"] == {}


def test_prefetch_changes_stats(plan, tmp_path):
    paths = write_report(plan, tmp_path, formats=["json"], prefetch=0)
    data = json.loads(paths["json"].read_text())
    assert data["prefetch"] == 0
    assert data["plan"]["stats"] == _stats_dict(plan.stats(0))


# ------------------------------------------------------------------------ CSV
def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def test_calls_csv(written, order):
    _, paths = written
    rows = _rows(paths["calls_csv"])
    n_calls = (
        len(order.module_forward_order)
        + len(order.module_backward_order)
        + len(order.recompute_order)
    )
    assert len(rows) == n_calls == 22
    assert list(rows[0]) == ["index", "phase", "fqn", "class", "unit", "own_numel"]
    assert rows[0] == {
        "index": "0",
        "phase": "forward",
        "fqn": "",
        "class": "GPT",
        "unit": "0",
        "own_numel": str(64 * 64),  # wpe (max_seq_len x dim)
    }
    by_fqn = {r["fqn"]: r for r in rows}
    assert by_fqn["blocks.0.attn.qkv"] == {
        "index": "5",
        "phase": "forward",
        "fqn": "blocks.0.attn.qkv",
        "class": "Linear",
        "unit": "1",
        "own_numel": str(64 * 192 + 192),
    }
    assert by_fqn["blocks.1.mlp.proj"]["unit"] == "2"
    assert by_fqn["lm_head"]["unit"] == "0"
    # The tied output weight is counted under its canonical owner (wte) only.
    assert by_fqn["lm_head"]["own_numel"] == "0"


def test_params_csv(written, order):
    _, paths = written
    rows = _rows(paths["params_csv"])
    assert len(rows) == len(order.params) == 28
    assert [r["fqn"] for r in rows] == list(order.params)
    by_fqn = {r["fqn"]: r for r in rows}
    assert by_fqn["wte.weight"] == {
        "fqn": "wte.weight",
        "forward_index": "0",
        "first_forward_call": "1",
        "backward_index": "",  # symbolic capture records no backward order
        "unit": "0",
        "numel": str(256 * 64),
        "dtype": "float32",
        "shape": "256x64",
        "requires_grad": "True",
        "shared_with": "lm_head.weight",
    }
    assert by_fqn["blocks.1.mlp.fc.weight"]["unit"] == "2"
    assert by_fqn["blocks.1.mlp.fc.weight"]["shared_with"] == ""


# -------------------------------------------------------------------- GraphML
def test_graphml_loads_with_typed_attributes(written, order):
    _, paths = written
    g = nx.read_graphml(paths["graphml"])
    assert isinstance(g, nx.DiGraph)
    qkv = g.nodes["blocks.0.attn.qkv"]
    assert qkv["kind"] == "module"
    assert qkv["class_name"] == "Linear"
    assert type(qkv["own_numel"]) is int and qkv["own_numel"] == 64 * 192 + 192
    assert type(qkv["unit"]) is int and qkv["unit"] == 1
    assert g.nodes["wte.weight"]["unit"] == 0
    assert type(g.nodes["wte.weight"]["requires_grad"]) is bool
    assert g.nodes["blocks"]["first_call"] == -1  # ModuleList: never called
    edge = g.edges["blocks.0.attn.qkv", "blocks.0.attn.proj"]
    assert type(edge["forward"]) is int and edge["forward"] == 1
    # the whole forward order is a path of "runs next" edges
    calls = order.module_forward_order
    assert all(g.edges[u, v]["forward"] >= 1 for u, v in zip(calls[:-1], calls[1:], strict=True))
    assert g.graph["model_class"] == "GPT"
    assert g.nodes[""]["class_name"] == "GPT" and g.nodes[""]["unit"] == 0  # the root


def test_graphml_one_type_per_key(written):
    _, paths = written
    text = paths["graphml"].read_text()
    keys = [
        line
        for line in text.splitlines()
        if line.strip().startswith("<key ") and 'for="node"' in line
    ]
    names = [line.split('attr.name="')[1].split('"')[0] for line in keys]
    assert len(names) == len(set(names))


# ----------------------------------------------------------------------- HTML
class _Structure(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.stack: list[str] = []
        self.table_classes: list[str] = []
        self.ids: list[str] = []
        self.resources: list[str] = []
        self.text: list[str] = []
        self.title = ""

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.tags.append(tag)
        self.stack.append(tag)
        if tag == "table":
            self.table_classes.append(attrs.get("class", ""))
        if tag == "section":
            self.ids.append(attrs.get("id", ""))
        for key in ("src", "href", "xlink:href", "data"):
            if attrs.get(key):
                self.resources.append(attrs[key])

    def handle_startendtag(self, tag, attrs):
        self.handle_starttag(tag, attrs)
        self.stack.pop()

    def handle_endtag(self, tag):
        if self.stack and self.stack[-1] == tag:
            self.stack.pop()

    def handle_data(self, data):
        if self.stack and self.stack[-1] == "title":
            self.title += data
        self.text.append(data)


def _parse(path: Path) -> tuple[_Structure, str]:
    text = path.read_text(encoding="utf-8")
    parser = _Structure()
    parser.feed(text)
    parser.close()
    return parser, text


def test_html_structure_and_charts(written, plan):
    pytest.importorskip("matplotlib")
    _, paths = written
    doc, text = _parse(paths["html"])
    assert text.startswith("<!DOCTYPE html>")
    assert doc.title == "T <&>"  # escaped in the file, unescaped by the parser
    assert "T &lt;&amp;&gt;" in text
    assert doc.ids == ["summary", "charts", "units", "baselines", "notes", "calls", "params"]
    assert doc.table_classes == ["summary", "units", "baselines", "calls", "params"]
    assert doc.tags.count("svg") == 2
    assert doc.tags.count("tr") == (
        15  # summary rows with a plan
        + 1
        + len(plan.units)  # units header + rows
        + 1
        + 2  # baselines header + plan + one baseline
        + 1
        + 22  # calls
        + 1
        + 28  # params
    )
    # self-contained: no scripts, no links, every reference is in-page
    assert "script" not in doc.tags and "link" not in doc.tags and "img" not in doc.tags
    assert all(r.startswith("#") for r in doc.resources)
    assert "http://" not in text and "https://" not in text
    body = " ".join(doc.text)
    assert "symbolic" in body and "Peak unsharded bytes (prefetch 1)" in body
    assert NO_CHARTS_LINE not in body


def test_html_without_matplotlib(plan, baseline, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    monkeypatch.delitem(sys.modules, "execwrap.report.charts", raising=False)
    paths = write_report(plan, tmp_path, formats=["html"], baselines={"always": baseline})
    doc, text = _parse(paths["html"])
    assert doc.tags.count("svg") == 0
    assert doc.table_classes == ["summary", "units", "baselines", "calls", "params"]
    assert text.count(NO_CHARTS_LINE.replace("'", "&#x27;")) == 1
    assert "pip install &#x27;execwrap[report]&#x27;" in text


def test_html_of_order_only_has_no_plan_tables(order, tmp_path):
    paths = write_report(order, tmp_path, formats=["html"])
    doc, text = _parse(paths["html"])
    assert doc.table_classes == ["summary", "calls", "params"]
    assert doc.tags.count("svg") == 0
    assert "No plan" in text


def test_html_escapes_every_text(order, tmp_path):
    evil = dataclasses.replace(
        order,
        module_classes={**order.module_classes, "": "<script>alert(1)</script>"},
        fallback_reason="a < b & c > d",
        method="runtime",
    )
    paths = write_report(evil, tmp_path, formats=["html"])
    doc, text = _parse(paths["html"])
    assert "script" not in doc.tags
    assert "&lt;script&gt;" in text
    assert "a &lt; b &amp; c &gt; d" in text


# --------------------------------------------------------------- atomic writes
def test_interrupted_write_leaves_no_file(plan, tmp_path, monkeypatch):
    def rows_then_fail(ctx):
        yield ["wte.weight"] + [""] * 9
        raise RuntimeError("disk on fire")

    monkeypatch.setattr("execwrap.report.tables.params_rows", rows_then_fail)
    with pytest.raises(RuntimeError, match="disk on fire"):
        write_report(plan, tmp_path)
    assert list(tmp_path.iterdir()) == []  # no partial file, no temp file


def test_interrupted_rewrite_keeps_previous_report(plan, tmp_path, monkeypatch):
    write_report(plan, tmp_path, formats=["json", "csv"])
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.name != SET_FOLDER}

    def boom(ctx, f):
        f.write(b"<!DOCTYPE html><html><body>half")
        raise KeyboardInterrupt

    monkeypatch.setitem(FILE_WRITERS, "html", boom)
    with pytest.raises(KeyboardInterrupt):
        write_report(plan, tmp_path, formats=["json", "csv", "html"], prefetch=0)
    after = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.name != SET_FOLDER}
    assert after == before
    assert len(list((tmp_path / SET_FOLDER).iterdir())) == 2  # current and its set: no leftover


def test_unwritable_out_dir_raises_and_leaves_nothing(plan, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(OSError):
        write_report(plan, blocker / "out")
    assert [p.name for p in tmp_path.iterdir()] == ["file"]


# ---------------------------------------------------------------- bad input
def test_bad_arguments(order, plan, baseline, tmp_path):
    with pytest.raises(ValueError, match="unknown format 'pdf'"):
        write_report(plan, tmp_path, formats=["json", "pdf"])
    with pytest.raises(ValueError, match="prefetch must be an int >= 0"):
        write_report(plan, tmp_path, prefetch=-1)
    with pytest.raises(ValueError, match="baselines need a plan"):
        write_report(order, tmp_path, baselines={"always": baseline})
    with pytest.raises(TypeError, match="expected an ExecutionOrder or a WrapPlan, got dict"):
        write_report({}, tmp_path)
    with pytest.raises(TypeError, match="baseline 'x' must be a WrapPlan"):
        write_report(plan, tmp_path, baselines={"x": order})
    other = trace_execution_order(build_demo_model(1))
    with pytest.raises(ValueError, match="planned from another execution order"):
        write_report(plan, tmp_path, baselines={"b1": plan_wrap(build_demo_model(1), other)})
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------- helpers
def test_unsharded_timeline_matches_stats(plan, baseline):
    root, block = 20608 * 4, 49984 * 4  # bytes: wte+wpe+ln_f; one Block
    assert unsharded_timeline(plan, 0) == [
        root, root + block, root + block, root + block, root + block, root,
    ]  # fmt: skip
    assert unsharded_timeline(plan, 1) == [
        root + block, root + 2 * block, root + block,  # forward: root, blocks.0, blocks.1
        root + 2 * block, root + block, root,  # backward: blocks.1, blocks.0, root
    ]  # fmt: skip
    for p in (plan, baseline):
        for prefetch in (0, 1, 2):
            timeline = unsharded_timeline(p, prefetch)
            assert len(timeline) == 2 * len(p.units)
            assert max(timeline) == p.stats(prefetch).peak_unsharded_bytes


def test_formatters():
    assert format_bytes(None) == "-"
    assert format_bytes(1023) == "1023 B"
    assert format_bytes(1536) == "1.50 KiB"
    assert format_bytes(3 * 2**20) == "3.00 MiB"
    assert format_numel(999) == "999"
    assert format_numel(220_544) == "220.54K"
    assert format_numel(25_000_000) == "25M"
    assert format_numel(1500) == "1.5K"


def test_byte_unit_and_short_reason():
    from execwrap.report import byte_unit, short_reason

    assert [byte_unit(n) for n in (0, 1023, 1024, 482_304, 3 * 2**20, 2**40 * 5000)] == [
        ("B", 1), ("B", 1), ("KiB", 1024), ("KiB", 1024), ("MiB", 2**20), ("TiB", 2**40),
    ]  # fmt: skip
    assert format_bytes(482_304) == "471.00 KiB"
    assert short_reason(None) == "-"
    assert short_reason("one line") == "one line"
    assert short_reason("first\nsecond") == "first ..."
    assert short_reason("x" * 200) == "x" * 157 + "..."
    assert short_reason("ab cd", limit=4) == "a..."


# ------------------------------------------------------- HTML review fixes
def _summary_cells(text: str) -> dict[str, str]:
    import html as html_mod
    import re

    rows = re.findall(r"<tr><th>(.*?)</th><td>(.*?)</td></tr>", text)
    return {html_mod.unescape(k): html_mod.unescape(v) for k, v in rows}


def test_html_summary_shortens_long_fallback_reason(order, plan, tmp_path):
    reason = "symbolic tracing failed in module 'h.0' (Block): " + "word " * 60 + "\nline 2"
    runtime = dataclasses.replace(order, fallback_reason=reason, method="runtime")
    paths = write_report(runtime, tmp_path, formats=["html", "json"])
    text = paths["html"].read_text()
    expected = (reason.splitlines()[0])[:157].rstrip() + "..."
    assert _summary_cells(text)["Fallback reason"] == expected
    assert len(expected) == 160
    assert json.loads(paths["json"].read_text())["order"]["fallback_reason"] == reason
    assert "word " * 60 in text  # the notes keep the full text
    # the label column never wraps; long values do
    assert "table.summary th{background:#f8f8f8;font-weight:600;\nwhite-space:nowrap;" in text
    assert "table.summary td{white-space:normal;overflow-wrap:anywhere}" in text


def test_timeline_caption_says_how_backward_is_drawn(order, plan):
    ctx = report_mod.ReportContext(order, plan, 1, {}, None)
    assert timeline_caption(ctx.order) == (
        "Units over one step: each forward bar spans the forward calls of a unit's modules "
        "(and their submodules); backward is drawn mirrored (this capture recorded no "
        "gradient-ready order)."
    )
    recorded = dataclasses.replace(
        order, param_backward_order=list(reversed(order.param_forward_order)), method="runtime"
    )
    ctx = report_mod.ReportContext(recorded, plan, 1, {}, None)
    assert timeline_caption(ctx.order) == (
        "Units over one step: each forward bar spans the forward calls of a unit's modules "
        "(and their submodules); each backward bar spans the unit's parameters in the "
        "gradient-ready order recorded by runtime capture."
    )


def _bars(ax) -> list[tuple[float, float, str]]:
    """``(x, width, color)`` of every broken_barh rectangle, by unit row then x."""
    from matplotlib.colors import to_hex

    out = []
    for coll in ax.collections:
        for path in coll.get_paths():
            xs = [v[0] for v in path.vertices]
            ys = [v[1] for v in path.vertices]
            out.append((round(min(ys) + 0.4), min(xs), max(xs) - min(xs),
                        to_hex(coll.get_facecolor()[0])))  # fmt: skip
    return [b[1:] for b in sorted(out)]


def test_units_timeline_backward_from_recorded_order(order, plan):
    pytest.importorskip("matplotlib")
    from execwrap.report import charts as _charts

    n = len(order.module_forward_order)  # 22
    fig = _charts.units_timeline_figure(plan)
    (ax,) = fig.axes
    assert ax.get_xlabel() == "module call index (forward | backward, mirrored)"
    assert [t.get_text() for t in ax.get_yticklabels()] == [
        "#0 <root>", "#1 blocks.0", "#2 blocks.1",
    ]  # fmt: skip
    assert {t.get_fontsize() for t in ax.get_yticklabels()} == {8.0}
    fwd, bwd = "#4c72b0", "#dd8452"
    mirrored = _bars(ax)
    assert mirrored[:2] == [(0.0, float(n), fwd), (float(n), float(n), bwd)]  # root: whole step

    # Gradients ready in reverse forward order: the root's wte/wpe last, ln_f first.
    grads = list(reversed(order.param_forward_order))
    recorded = dataclasses.replace(order, param_backward_order=grads, method="runtime")
    runtime_plan = dataclasses.replace(plan, order=recorded)
    ax = _charts.units_timeline_figure(runtime_plan).axes[0]
    assert ax.get_xlabel() == (
        "module call index (forward) | gradient-ready parameter order (backward)"
    )
    unit_of = {p: i for i, u in enumerate(plan.units) for p in u.param_fqns}
    first = {u: min(k for k, p in enumerate(grads) if unit_of.get(p) == u) for u in range(3)}
    last = {u: max(k for k, p in enumerate(grads) if unit_of.get(p) == u) for u in range(3)}
    scale = n / len(grads)
    backward = [b for b in _bars(ax) if b[2] == bwd]
    assert backward == [
        (pytest.approx(n + first[u] * scale), pytest.approx((last[u] - first[u] + 1) * scale), bwd)
        for u in range(3)
    ]
    assert [(first[u], last[u]) for u in range(3)] == [(0, 27), (14, 25), (2, 13)]


def test_unit_tick_labels_thin_out():
    pytest.importorskip("matplotlib")
    from execwrap.report.charts import MAX_UNIT_LABELS, unit_tick_indices

    assert MAX_UNIT_LABELS == 60
    assert unit_tick_indices(0) == []
    assert unit_tick_indices(60) == list(range(60))
    assert unit_tick_indices(61) == list(range(0, 61, 2))
    assert unit_tick_indices(500) == list(range(0, 500, 9))


def test_memory_chart_unit_matches_tables(plan, baseline):
    pytest.importorskip("matplotlib")
    from execwrap.report import charts as _charts

    timelines = {"plan": unsharded_timeline(plan), "always": unsharded_timeline(baseline)}
    peaks = {"plan": plan.stats(1).peak_unsharded_bytes}
    fig = _charts.memory_figure(timelines, peaks, prefetch=1)
    assert fig.axes[0].get_ylabel() == "unsharded parameters (KiB)"
    assert fig.axes[0].get_title() == f"plan\n3 units, peak {format_bytes(peaks['plan'])}"
    assert format_bytes(peaks["plan"]) == "471.00 KiB"
    line = fig.axes[0].lines[0]
    assert list(line.get_ydata())[:3] == [v / 1024 for v in timelines["plan"][:3]]
    big = _charts.memory_figure({"p": [3 * 2**30]}, {"p": 3 * 2**30}, prefetch=0)
    assert big.axes[0].get_ylabel() == "unsharded parameters (GiB)"


def test_folder_in_the_way_is_found_before_writing(plan, tmp_path):
    (tmp_path / "params.csv").mkdir()
    with pytest.raises(IsADirectoryError) as info:
        write_report(plan, tmp_path)
    assert info.value.filename == str(tmp_path / "params.csv")
    assert [p.name for p in tmp_path.iterdir()] == ["params.csv"]


def test_interrupted_write_removes_the_folders_it_created(plan, tmp_path, monkeypatch):
    def boom(ctx, f):
        raise KeyboardInterrupt

    monkeypatch.setitem(FILE_WRITERS, "html", boom)
    with pytest.raises(KeyboardInterrupt):
        write_report(plan, tmp_path / "new" / "deeper")
    assert list(tmp_path.iterdir()) == []
