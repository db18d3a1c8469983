"""One computation of a plan's figures (:mod:`execwrap.plan.figures`): the terminal,
the HTML page, ``report.json`` and ``execwrap show`` give the same all-gathers and
peak for the same auto plan; every candidate's label is made from its settings;
``WrapPlan.summary()`` and a short ``repr``; notes sorted warnings first."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import pytest
from torch.distributed.fsdp.wrap import ModuleWrapPolicy

from execwrap.cli import main
from execwrap.demo_models import Block, build_demo_model
from execwrap.plan.figures import note_severity, notes_by_severity
from execwrap.plan.search_record import candidate_label
from execwrap.plan.wrap_plan import WrapPlan
from execwrap.planning.planner import plan_wrap, root_only_note
from tracing import trace_execution_order

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _repo_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO))


@pytest.fixture(scope="module")
def auto_report(tmp_path_factory) -> tuple[Path, str]:
    """An auto plan that chose prefetch 0 and no reshard while the report's prefetch is 1."""
    out = tmp_path_factory.mktemp("figures") / "r"
    args = ["--model", "tests.execwrap.factories:llama8", "--device", "meta"]
    args += ["--input", "long:1x256", "--policy", "transformer:LlamaBlock"]
    args += ["--bucket-size", "auto", "--cost-model", "h100-nvlink-8"]
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(REPO))
        import io
        from contextlib import redirect_stdout

        buffer = io.StringIO()
        with redirect_stdout(buffer):
            assert main(["report", *args, "--out", str(out), "--format", "json,html"]) == 0
    return out, buffer.getvalue()


def _rows(text: str) -> dict[str, str]:
    return {
        line.split("  ")[1].strip(): line.split("  ", 2)[2].strip()
        for line in text.splitlines()
        if line.startswith("  ") and len(line.split("  ")) > 2
    }


def test_terminal_html_json_and_show_agree(auto_report, capsys) -> None:
    out, terminal = auto_report
    data = json.loads((out / "report.json").read_text())
    figures = data["figures"]
    assert (data["plan"]["prefetch"], data["prefetch"]) == (0, 1)  # chosen 0, report 1
    assert data["plan"]["reshard_after_forward"] == [False] * 4
    assert figures["chosen"] is True and figures["prefetch"] == 0
    gathers, peak = figures["all_gathers_per_step"], figures["peak_unsharded_bytes"]
    assert (gathers, peak) == (data["plan"]["estimate"]["all_gathers"], 673_255_424)
    stats = data["plan"]["stats"]  # resharding everywhere: not what runs, not shown
    assert (stats["all_gathers_per_step"], stats["peak_unsharded_bytes"]) == (7, 416_313_344)
    rows = _rows(terminal)
    assert rows["all-gathers/step"] == f"{gathers} (the auto plan's choices)"
    assert rows["peak unsharded (prefetch 0, as chosen)"] == "642.07 MiB"
    page = (out / "report.html").read_text()
    cells = dict(re.findall(r"<tr><th>(.*?)</th><td>(.*?)</td></tr>", page))
    assert cells["All-gathers per step (the auto plan&#x27;s choices)"] == str(gathers)
    assert html.unescape(cells["Peak unsharded bytes (prefetch 0, as chosen)"]) == (
        f"642.07 MiB ({peak} B)"
    )
    assert "All-gathers per step (no reshard after forward)" not in cells
    capsys.readouterr()
    assert main(["show", str(out)]) == 0
    shown = capsys.readouterr().out
    assert (
        "figures (prefetch 0 (chosen), 3 groups besides the root not resharded after forward): "
        f"4 groups, {gathers} all-gathers/step, 4 reduce-scatters/step, peak unsharded 642.07 MiB"
    ) in shown


def test_show_refuses_figures_that_the_plan_does_not_give(auto_report, tmp_path, capsys) -> None:
    out, _ = auto_report
    data = json.loads((out / "report.json").read_text())
    data["figures"]["all_gathers_per_step"] += 1
    path = tmp_path / "report.json"
    path.write_text(json.dumps(data))
    assert main(["show", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"execwrap: error: {path}: malformed report: field ")
    assert err.endswith("(derived from plan, not read)")


def test_every_candidate_label_is_made_from_its_settings(auto_report) -> None:
    out, _ = auto_report
    search = json.loads((out / "report.json").read_text())["plan"]["search"]
    labels = [c["label"] for c in search["candidates"]]
    assert len(set(labels)) == len(labels)  # distinct settings, distinct labels
    for c in search["candidates"]:
        sizes, p, flags = c["group_sizes"], c["prefetch"], c["reshard_after_forward"]
        # the training step's choices follow the grouping's label (joint_label)
        modes = c.get("checkpointing") or ()
        counts = {m: sum(1 for x in modes if x == m) for m in ("full", "selective")}
        step = "; checkpointing: " + ", ".join(f"{n} {m}" for m, n in counts.items() if n)
        if c["kind"] == "searched":
            own = candidate_label(sizes, p, flags)
            assert c["label"] == (own + step if any(counts.values()) else own)
            assert c["label"].startswith(f"root + {len(sizes)} group")
            assert f"prefetch {p}" in c["label"]
        elif c["label"].startswith("per-unit"):
            full = ", full checkpointing" if counts["full"] else ""
            assert (c["label"], set(sizes), set(flags)) == (
                f"per-unit, prefetch {p}{full}",
                {1},
                {True},
            )
        else:
            assert (c["label"], p, set(flags)) == ("fewest groups, prefetch 1", 1, {True})
    assert search["candidates"][search["chosen"]]["label"] == (
        "root + 3 groups, prefetch 0, no reshard (units per group: 2, 3, 3)"
    )


@pytest.mark.parametrize(
    ("sizes", "prefetch", "flags", "label"),
    [
        ((2, 2), 1, (True, True), "root + 2 groups of 2 units, prefetch 1"),
        ((1, 1, 1), 0, (False,) * 3, "root + 3 groups of 1 unit, prefetch 0, no reshard"),
        ((1, 1, 1), 1, (True, False, True), "root + 3 groups of 1 unit, prefetch 1, no reshard: group 2"),
        ((1, 1, 1), 1, (False, True, False), "root + 3 groups of 1 unit, prefetch 1, no reshard: groups 1, 3"),
        ((1, 1, 1), 1, (True, False, False), "root + 3 groups of 1 unit, prefetch 1, no reshard: last 2"),
        ((2, 1), 2, (True, True), "root + 2 groups, prefetch 2 (units per group: 2, 1)"),
        ((1, 2), 2, (True, True), "root + 2 groups, prefetch 2 (units per group: 1, 2)"),
        ((3,) * 7, 1, (True,) * 7, "root + 7 groups of 3 units, prefetch 1"),
        ((3,) * 6 + (1,), 1, (False,) * 7, "root + 7 groups, prefetch 1, no reshard (units per group: 6 groups of 3, then 1 of 1)"),
        ((1,) + (3,) * 6, 1, (True,) * 7, "root + 7 groups, prefetch 1 (units per group: 1 of 1, then 6 of 3)"),
    ],
)  # fmt: skip
def test_candidate_label(sizes, prefetch, flags, label) -> None:
    assert candidate_label(sizes, prefetch, flags) == label


@pytest.fixture(scope="module")
def plan() -> WrapPlan:
    model = build_demo_model(n_blocks=4)
    return plan_wrap(
        model, trace_execution_order(model), ModuleWrapPolicy({Block}), bucket_numel=100_000
    )


def test_summary_and_a_short_repr(plan) -> None:
    assert plan.summary() == (
        "WrapPlan of GPT: 3 FSDP groups from 5 policy units (policy ModuleWrapPolicy({Block}), "
        "bucket size 100K)\n"
        "  prefetch 1, every group but the root resharded after forward\n"
        "  per step: 5 all-gathers, 3 reduce-scatters, peak unsharded parameters 861.50 KiB\n"
        "  2 notes (0 warnings) in plan.notes; first: Tied parameter 'wte.weight' (also "
        "'lm_head.weight') is used by modules 'wte' and 'lm_head'; it stay…"
    )
    assert str(plan) == plan.summary()
    assert repr(plan) == "WrapPlan(GPT, policy ModuleWrapPolicy({Block}), 3 groups, 2 notes)"
    assert plan.summary(prefetch=0).splitlines()[2] == (
        "  per step: 5 all-gathers, 3 reduce-scatters, peak unsharded parameters 471.00 KiB"
    )


def test_notes_warnings_first() -> None:
    warning = root_only_note("always_wrap_policy", "GPT")
    info = "Tied parameter 'a' (also 'b') stays in unit <root>."
    over = "The chosen plan's ... by 1 GiB: this step would run out of memory"
    assert [note_severity(n) for n in (warning, info, over)] == ["warning", "info", "warning"]
    assert notes_by_severity([info, warning, over]) == [
        ("warning", warning),
        ("warning", over),
        ("info", info),
    ]


def test_the_cli_prints_notes_warnings_first_and_caps_them(tmp_path, capsys) -> None:
    out = tmp_path / "r"
    args = ["report", "--model", "tests.execwrap.factories:many_notes", "--out", str(out)]
    assert main([*args, "--format", "json,html"]) == 0
    text = capsys.readouterr().out
    notes = text[text.index("notes (") :].splitlines()
    saved = json.loads((out / "report.json").read_text())["plan"]["notes"]
    assert saved[-1].startswith("Parameter 'scale' is 0-dim")  # last in plan.notes
    assert notes[0] == "notes (7):"
    assert notes[1].startswith("  warning: Parameter 'scale' is 0-dim (a scalar): FSDP1 and")
    assert [n[:33] for n in notes[2:6]] == [
        f"  info: Module 'unused{i}' (Linear)" for i in range(4)
    ]
    page = (out / "report.html").read_text()
    items = re.findall(r"<li( class=\"warning\")?>(.{0,60})", page)
    assert items[0] == (
        ' class="warning"',
        "<strong>Warning:</strong> Parameter &#x27;scale&#x27; is 0-d",
    )
    assert [cls for cls, _ in items] == [' class="warning"'] + [""] * 6
    assert notes[6:] == [
        "  2 more in report.html",
        f"open {out / 'report.html'} in a browser to see the charts and tables",
    ]
