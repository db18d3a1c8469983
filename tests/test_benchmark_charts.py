"""benchmarks/charts.py reads result files back exactly and draws the docs' charts."""

from __future__ import annotations

import datetime
from pathlib import Path

import pytest

from benchmarks.charts import (
    CHARTS_DIR,
    RESULTS_DIR,
    PlanResult,
    draw_for_result,
    markdown_tables,
    parse_number,
    read_autoplan,
    read_estimate,
    result_files,
    write_autoplan_charts,
    write_charts,
)

pytest.importorskip("matplotlib", reason="drawing needs matplotlib: pip install -e '.[report]'")

_PNG = b"\x89PNG\r\n\x1a\n"

AUTOPLAN = """# autoplan

Date: 2026-12-03 13:34:31

- torch: 2.13.0+cpu

Notes.

| model | Spearman (>= 0.9) | median abs. error (<= 10%) | auto / best of grid (<= 1.03x) | auto / per-block | auto / always-wrap | budget: measured peak / budget (<= 1) | all met |
|---|---|---|---|---|---|---|---|
| wide | 0.986 | 12.8% | 0.976x (buckets of 2, no reshard) | 0.700x | 0.556x | 181.1 MiB / 184.2 MiB = 0.983 | no |
| gpt | 0.937 | 4.6% | 1.017x (buckets of 2, no reshard) | 0.702x | 0.339x | 110.0 MiB / 114.8 MiB = 0.959 | yes |

### wide: wide MLP blocks (dim 512)

| plan | groups | prefetch | not resharded | predicted step (ms) | measured step (ms): median [p25, p75] | error | predicted peak | measured peak (tracker) | error | last loss |
|---|---|---|---|---|---|---|---|---|---|---|
| per-block, prefetch 0 | 9 | 0 | 0 | 444.8 | 423.2 [397.2, 438.5] | +5.1% | 156.5 MiB | 155.4 MiB | +0.7% | 0.00000 |
| auto | 4 | 2 | 3 | 329.2 | 293.4 [281.2, 309.7] | +12.2% | 211.9 MiB | 211.9 MiB † | -0.0% | 0.00000 |

### gpt: execwrap.demo_models.GPT

| plan | groups | prefetch | not resharded | predicted step (ms) | measured step (ms): median [p25, p75] | error | predicted peak | measured peak (tracker) | error | last loss |
|---|---|---|---|---|---|---|---|---|---|---|
| auto | 3 | 2 | 2 | 292.2 | 309.9 [278.0, 321.6] | -5.7% | 1.13 GiB | 137.8 MiB † | +0.4% | 0.00252 |

Mode: full; 1-minute load average at the start of the run: 1.38, at the end: 2.21.
"""

ESTIMATE = """# estimate

Date: 2026-12-01 11:20:00

| model | params | units | forward measured (ms) | forward estimated (ms) | ratio | backward measured (ms) | backward estimated (ms) | ratio |
|---|---|---|---|---|---|---|---|---|
| GPT 8x256 | 6.88M | 9 | 129.1 | 106.1 | 0.82x | 201.3 | 196.4 | 0.98x |

Mode: full; 1-minute load average at the start of the run: 5.55, at the end: 5.49.
"""


def _results(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "autoplan-2026-12-03_133431.md").write_text(AUTOPLAN, encoding="utf-8")
    earlier = AUTOPLAN.replace("13:34:31", "12:40:30").replace("| 0.986 |", "| 0.979 |")
    (folder / "autoplan-2026-12-03_124030.md").write_text(earlier, encoding="utf-8")
    quick = AUTOPLAN.replace("Mode: full", "Mode: quick").replace("13:34:31", "14:00:00")
    (folder / "autoplan-2026-12-03_140000.md").write_text(quick, encoding="utf-8")
    (folder / "estimate-2026-12-01_112000.md").write_text(ESTIMATE, encoding="utf-8")
    return folder


@pytest.mark.parametrize(
    "cell,value",
    [
        ("423.2 [397.2, 438.5]", 423.2),
        ("12.8%", 12.8),
        ("0.976x (buckets of 2, no reshard)", 0.976),
        ("181.1 MiB / 184.2 MiB = 0.983", 0.983),
        ("1.13 GiB", 1157.12),
        ("512 KiB", 0.5),
        ("179.7 MiB †", 179.7),
        ("-5.7%", -5.7),
    ],
)
def test_parse_number(cell: str, value: float) -> None:
    assert parse_number(cell) == pytest.approx(value, rel=1e-12)


def test_parse_number_refuses_a_cell_without_a_number() -> None:
    with pytest.raises(ValueError, match=r"no number in result table cell 'yes'"):
        parse_number("yes")


def test_markdown_tables_keeps_the_heading_above_each_table() -> None:
    text = "# t\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n### m: x\n\n| c |\n|---|\n| 3 |\n| 4 |\n"
    assert markdown_tables(text) == [
        ("t", ["a", "b"], [["1", "2"]]),
        ("m: x", ["c"], [["3"], ["4"]]),
    ]


def test_read_autoplan(tmp_path: Path) -> None:
    run = read_autoplan(_results(tmp_path) / "autoplan-2026-12-03_133431.md")
    assert run.date == datetime.datetime(2026, 12, 3, 13, 34, 31)
    assert run.claims["wide"] == {
        "Spearman": 0.986,
        "median abs. error": 12.8,
        "auto / best of grid": 0.976,
        "auto / per-block": 0.7,
        "auto / always-wrap": 0.556,
        "budget": 0.983,
    }
    assert run.plans["wide"] == [
        PlanResult("per-block, prefetch 0", 444.8, 423.2, 156.5, 155.4),
        PlanResult("auto", 329.2, 293.4, 211.9, 211.9),
    ]
    assert run.plans["gpt"] == [PlanResult("auto", 292.2, 309.9, 1157.12, 137.8)]


def test_read_autoplan_names_what_is_missing(tmp_path: Path) -> None:
    path = tmp_path / "autoplan-x.md"
    path.write_text("# autoplan\n\nno date\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"autoplan-x.md: no 'Date: YYYY-MM-DD HH:MM:SS' line"):
        read_autoplan(path)
    path.write_text("Date: 2026-12-03 13:34:31\n\n| a |\n|---|\n| 1 |\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"no claims table .*: not an autoplan result"):
        read_autoplan(path)


def test_read_estimate(tmp_path: Path) -> None:
    run = read_estimate(_results(tmp_path) / "estimate-2026-12-01_112000.md")
    assert run.phases == {"GPT 8x256": {"forward": (129.1, 106.1), "backward": (201.3, 196.4)}}


def test_result_files_leave_quick_runs_out(tmp_path: Path) -> None:
    names = [p.name for p in result_files(_results(tmp_path), "autoplan")]
    assert names == ["autoplan-2026-12-03_124030.md", "autoplan-2026-12-03_133431.md"]


def test_charts_are_pngs_and_the_same_bytes_each_time(tmp_path: Path) -> None:
    results = _results(tmp_path / "results")
    first = write_charts(results, tmp_path / "a")
    second = write_charts(results, tmp_path / "b")
    assert [p.name for p in first] == [
        "autoplan-predicted-vs-measured.png",
        "autoplan-claims-over-runs.png",
        "estimate-predicted-vs-measured.png",
    ]
    for a, b in zip(first, second, strict=True):
        assert a.read_bytes().startswith(_PNG)
        assert a.read_bytes() == b.read_bytes()


def test_no_results_no_charts(tmp_path: Path) -> None:
    assert write_autoplan_charts(tmp_path, tmp_path / "out") == []
    assert not (tmp_path / "out").exists()


def test_draw_for_result_draws_beside_a_result_written_elsewhere(tmp_path: Path) -> None:
    results = _results(tmp_path / "results")
    assert draw_for_result(None, None) == []
    written = draw_for_result(results / "autoplan-2026-12-03_133431.md", tmp_path / "out")
    assert {p.parent for p in written} == {tmp_path / "out"}


def test_the_committed_results_parse_and_their_charts_are_in_the_docs() -> None:
    runs = [read_autoplan(p) for p in result_files(RESULTS_DIR, "autoplan")]
    assert all(sorted(run.claims) == ["gpt", "llama", "wide"] for run in runs)
    latest = read_autoplan(RESULTS_DIR / "autoplan-2026-12-03_133431.md")
    assert [len(plans) for plans in latest.plans.values()] == [12, 12, 12]
    assert latest.plans["wide"][10] == PlanResult("auto", 329.2, 293.4, 211.9, 211.9)
    page = (CHARTS_DIR.parents[1] / "benchmarks" / "autoplan.md").read_text(encoding="utf-8")
    for chart in ("autoplan-predicted-vs-measured.png", "autoplan-claims-over-runs.png"):
        assert (CHARTS_DIR / chart).read_bytes().startswith(_PNG)
        assert f"_static/benchmarks/{chart}" in page
