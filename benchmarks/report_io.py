"""Report I/O: the cost of writing a report as one set, and of checking every field on load.

Writing (issue 15): ``write_report`` writes its files as one set (a new
folder of files, each fsynced, then one ``rename(2)`` of the ``current``
link; :mod:`execwrap.report.file_set`). The previous way, still the fallback
where links are missing, renamed each file into place one by one
(:func:`~execwrap.report.file_set.write_one_by_one`, no fsync). Two
measurements, the variants interleaved:

* file I/O alone: the bytes of a full report (all five files) rendered once,
  then written by each strategy: the set's extra cost in milliseconds;
* the whole ``write_report`` (render and write), set vs one by one: what a
  user of ``execwrap report`` pays, as a ratio.

Loading: ``execwrap show`` / ``diff`` check every field of the files they read
(:mod:`tracing.schema`). ``ExecutionOrder.load`` of a large order (Llama, 80
layers, traced on the meta device) and ``load_saved`` of a report are timed
against ``json.loads`` of the same text, the floor of any reader.

Usage::

    python -m benchmarks.report_io            # full run
    python -m benchmarks.report_io --quick    # < 30 s
"""

from __future__ import annotations

import argparse
import io
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch
from torch.distributed.fsdp.wrap import ModuleWrapPolicy

from benchmarks._bench import (
    add_output_args,
    fmt_ratio,
    interleaved,
    markdown_table,
    median,
    publish,
)
from execwrap.cli.saved import load_saved
from execwrap.demo_models import GPT, Block, GPTConfig, Llama, LlamaConfig
from execwrap.planning.planner import plan_wrap
from execwrap.report import file_set, write_report
from execwrap.report.context import ReportContext
from execwrap.report.writer import FILE_WRITERS
from tracing import ExecutionOrder, trace_execution_order

__all__ = ["main", "run"]


def _rendered(plan: Any) -> dict[str, bytes]:
    ctx = ReportContext(plan.order, plan, 1, {}, None)
    out: dict[str, bytes] = {}
    for name, write in (
        ("report.json", FILE_WRITERS["json"]),
        ("calls.csv", FILE_WRITERS["calls_csv"]),
        ("params.csv", FILE_WRITERS["params_csv"]),
        ("order.graphml", FILE_WRITERS["graphml"]),
        ("report.html", FILE_WRITERS["html"]),
    ):
        buf = io.BytesIO()
        write(ctx, buf)
        out[name] = buf.getvalue()
    return out


def _one_by_one(folder: Path, writers: dict[str, Any], *, known_names: Any = ()) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    file_set.write_one_by_one({folder / name: w for name, w in writers.items()})


def run(*, blocks: int, layers: int, repeats: int, workdir: Path) -> dict[str, Any]:
    """Time the write strategies and the checked loads; return medians (s) and ratios."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_blocks=blocks))
    plan = plan_wrap(model, trace_execution_order(model), ModuleWrapPolicy({Block}))
    data = _rendered(plan)
    size = sum(len(b) for b in data.values())
    writers = {name: (lambda f, b=b: f.write(b)) for name, b in data.items()}
    set_dir, flat_dir = workdir / "set", workdir / "flat"
    flat_dir.mkdir()
    io_times = interleaved(
        {
            "set": lambda: file_set.write_file_set(set_dir, writers, known_names=list(data)),
            "one_by_one": lambda: file_set.write_one_by_one(
                {flat_dir / n: w for n, w in writers.items()}
            ),
        },
        repeats=repeats,
        warmup=1,
    )
    report_dir, report_flat = workdir / "report-set", workdir / "report-flat"
    original = file_set.write_file_set

    def report_one_by_one() -> None:
        import execwrap.report.writer as writer

        writer.write_file_set = _one_by_one  # type: ignore[assignment]
        try:
            write_report(plan, report_flat)
        finally:
            writer.write_file_set = original

    full_times = interleaved(
        {"set": lambda: write_report(plan, report_dir), "one_by_one": report_one_by_one},
        repeats=max(3, repeats // 3),
        warmup=1,
    )
    big = Llama(LlamaConfig(n_layers=layers, dim=64, n_heads=4, mlp_hidden=172)).to("meta")
    order_path = trace_execution_order(big).save(workdir / "order.json")
    order_text = order_path.read_text()
    report_text = (report_dir / "report.json").read_text()
    report_path = report_dir / "report.json"
    import json

    load_times = interleaved(
        {
            "order_parse": lambda: json.loads(order_text),
            "order_load": lambda: ExecutionOrder.load(order_path),
            "report_parse": lambda: json.loads(report_text),
            "report_load": lambda: load_saved(report_path),
        },
        repeats=repeats,
        warmup=1,
    )
    med = {k: median(v) for t in (io_times, load_times) for k, v in t.wall.items()}
    full = {k: median(v) for k, v in full_times.wall.items()}
    return {
        "bytes": size,
        "io": {k: med[k] for k in ("set", "one_by_one")},
        "full": full,
        "load": {k: med[k] for k in ("order_parse", "order_load", "report_parse", "report_load")},
        "order_calls": len(json.loads(order_text)["module_forward_order"]),
        "order_kib": len(order_text) / 1024,
        "report_kib": len(report_text) / 1024,
    }


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; prints tables and writes a dated result."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_output_args(parser)
    parser.add_argument("--blocks", type=int, default=None, help="GPT blocks (default 12; quick 2)")
    parser.add_argument(
        "--layers", type=int, default=None, help="Llama layers (default 80; quick 8)"
    )
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument(
        "--workdir", type=Path, default=None, help="where files are written (default: a temp dir)"
    )
    args = parser.parse_args(argv)
    blocks = args.blocks or (2 if args.quick else 12)
    layers = args.layers or (8 if args.quick else 80)
    repeats = args.repeats or (5 if args.quick else 21)
    workdir = Path(tempfile.mkdtemp(prefix="execwrap-report-io-", dir=args.workdir))
    try:
        res = run(blocks=blocks, layers=layers, repeats=repeats, workdir=workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    io_, full, load = res["io"], res["full"], res["load"]
    table = markdown_table(
        ["measurement", "set (ms)", "one by one (ms)", "set / one by one", "set - one by one (ms)"],
        [
            [
                f"file I/O of a rendered report ({res['bytes'] / 1024:.0f} KiB, 5 files)",
                f"{io_['set'] * 1e3:.2f}",
                f"{io_['one_by_one'] * 1e3:.2f}",
                fmt_ratio(io_["set"] / io_["one_by_one"]),
                f"{(io_['set'] - io_['one_by_one']) * 1e3:.2f}",
            ],
            [
                f"write_report, GPT {blocks} blocks, all formats (render + write)",
                f"{full['set'] * 1e3:.1f}",
                f"{full['one_by_one'] * 1e3:.1f}",
                fmt_ratio(full["set"] / full["one_by_one"]),
                f"{(full['set'] - full['one_by_one']) * 1e3:.1f}",
            ],
        ],
    )
    table += "\n\n" + markdown_table(
        ["file", "size (KiB)", "json.loads (ms)", "checked load (ms)", "checked / json.loads"],
        [
            [
                f"ExecutionOrder.load, Llama {layers} layers ({res['order_calls']} calls)",
                f"{res['order_kib']:.0f}",
                f"{load['order_parse'] * 1e3:.2f}",
                f"{load['order_load'] * 1e3:.2f}",
                fmt_ratio(load["order_load"] / load["order_parse"]),
            ],
            [
                f"load_saved (show/diff), report of GPT {blocks} blocks",
                f"{res['report_kib']:.0f}",
                f"{load['report_parse'] * 1e3:.2f}",
                f"{load['report_load'] * 1e3:.2f}",
                fmt_ratio(load["report_load"] / load["report_parse"]),
            ],
        ],
    )
    note = (
        "Writing a report as one set (new set folder, each file fsynced, one rename of the "
        "`current` link) vs renaming files into place one by one (the fallback, no fsync), "
        "interleaved, medians of wall time; files under "
        f"{tempfile.gettempdir() if args.workdir is None else args.workdir} (the file system "
        "decides what an fsync costs). Loading: every field checked (`tracing.schema`) vs "
        "`json.loads` of the same text.\n"
    )
    publish("report_io", note, table, args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
