"""Every architecture of transformers' causal-LM, masked-LM, seq2seq and image-classification
mappings: captured without computing, planned, and predicted next to transformers' own plan.

For each class (:mod:`benchmarks._architectures`): built under fake tensors from a
small config made generically from its config class, its order captured by
``capture_execution_order``'s zero-cost step on example inputs derived from the
config, execwrap's plan (``plan_wrap(..., bucket_numel="auto")`` over the model's
blocks) and transformers' own (``load_fsdp_plan``), each predicted by
``simulate_step`` for one training step on the ``h100-nvlink-8`` preset (8 ranks).
The table says, per class, the config level it was built from, the capture step,
the groups and the predicted step time and peak memory per rank of both plans; a
class that failed is listed with the stage and the reason.

Writes the page ``docs/benchmarks/architectures.md`` (full runs only) and a dated
result file in ``benchmarks/results/``.

Usage::

    python -m benchmarks.architectures            # every class (~20 min on 2 loaded cores)
    python -m benchmarks.architectures --quick    # four classes, no page
    python -m benchmarks.architectures --only LlamaForCausalLM T5ForConditionalGeneration
"""

from __future__ import annotations

import argparse
import datetime
import sys
from collections.abc import Sequence
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._architectures import (
    MAPPINGS,
    PRESET,
    SAMPLE,
    WORLD_SIZE,
    Row,
    run_class,
    suite_entries,
)
from benchmarks._bench import add_output_args, machine_line, markdown_table, publish

__all__ = ["PAGE", "QUICK", "main", "page", "summary"]

PAGE = Path(__file__).resolve().parent.parent / "docs" / "benchmarks" / "architectures.md"
#: The ``--quick`` classes.
QUICK = (
    "LlamaForCausalLM",
    "T5ForConditionalGeneration",
    "BertForMaskedLM",
    "ViTForImageClassification",
)
_SHORT = {m: m.removeprefix("for_") for m in MAPPINGS}


def summary(rows: Sequence[Row]) -> list[tuple[str, int, int]]:
    """``(mapping, captured, classes)`` per mapping, then ``("all", ...)``."""
    out = []
    for mapping in MAPPINGS:
        inside = [r for r in rows if _SHORT[mapping] in r.mappings]
        out.append((_SHORT[mapping], sum(r.ok for r in inside), len(inside)))
    out.append(("all", sum(r.ok for r in rows), len(rows)))
    return out


def _ms(x: float) -> str:
    return f"{x * 1e3:.3f}"


def _mib(x: int) -> str:
    return f"{x / 2**20:.1f}"


def _plan_cells(plan: tuple[int, float, int] | None, reason: str) -> list[str]:
    if plan is None:
        return [reason or "-", "", ""]
    groups, step, peak = plan
    return [str(groups), _ms(step), _mib(peak)]


def tables(rows: Sequence[Row]) -> str:
    """The summary, the captured classes and the others, as markdown."""
    head = markdown_table(
        ["mapping", "captured, planned and predicted", "classes", "share"],
        [[m, ok, n, f"{ok / n:.1%}" if n else "-"] for m, ok, n in summary(rows)],
    )
    done = markdown_table(
        [
            "architecture",
            "family",
            "config",
            "capture step",
            "execwrap groups",
            "execwrap step (ms)",
            "execwrap peak (MiB)",
            "transformers groups",
            "transformers step (ms)",
            "transformers peak (MiB)",
        ],
        [
            [r.name, r.family, r.level, r.capture_step]
            + _plan_cells(r.ours, "")
            + _plan_cells(r.theirs, r.theirs_reason)
            for r in rows
            if r.ok
        ],
    )
    failed = markdown_table(
        ["architecture", "mappings", "stage", "reason"],
        [
            [r.name, ", ".join(r.mappings), r.failed, r.reason.replace("|", "\\|")]
            for r in rows
            if not r.ok
        ],
    )
    notes = sorted({f"{r.name}: {n}" for r in rows for n in r.notes})
    noted = "\n".join(f"- {n}" for n in notes) if notes else "None."
    return (
        f"{head}\n\n### Captured, planned and predicted\n\n{done}\n\n"
        f"### Not captured\n\n{failed}\n\n### Capture notes\n\n{noted}\n"
    )


_INTRO = """# Every architecture

Every class of transformers' causal-LM, masked-LM, seq2seq and image-classification
auto mappings, built from a small config made generically from its config class
(shrunk layers, hidden sizes, heads, experts, vocabulary and image size; no config
written by hand), under fake tensors (no weights). For each: its order captured
without computing (`capture_execution_order`'s zero-cost step: a fake run on example
inputs derived from the config; only the masks and indices fixed by the config and
the inputs' shapes are computed), execwrap's plan (`plan_wrap(..., bucket_numel="auto")`
over the model's blocks: groups, prefetch and resharding chosen with the simulator),
and one training step of it and of transformers' own `fsdp_plan` (`load_fsdp_plan`)
predicted by `simulate_step` on the `{preset}` preset ({world} ranks, float32, AdamW).

The models are tiny (64-wide, two layers, or the fewest that keep every kind of layer),
so the predicted steps are a fraction of a millisecond and dominated by collective
latency: the columns compare the two plans' structure (execwrap merges the blocks into
fewer groups), not the cost of the full-size models. The config column says which
level of the generic shrink built and captured: `shrunk`; `filled` (a size the class
leaves at `None` given its shrunk value, and choices it leaves open that its config
fixes); `counts` (layers and experts shrunk, widths kept, where the shrunk widths break
a size the class ties to another); `widths` (widths and experts shrunk, every layer kept,
where the class ties its layer counts or per-layer lists together). A class that no level
builds says why (a library that is not installed, or transformers' own default config of
the class failing too).

Rerun: `python -m benchmarks.architectures` (writes this page and
`benchmarks/results/architectures-*.md`); the default test run checks a sample of
{sample} classes (`tests/integrations/test_architectures.py`), the full sweep is `slow`.
"""


def page(rows: Sequence[Row], when: str, result_file: str, machine: str) -> str:
    """The documentation page for a full run."""
    import transformers

    intro = _INTRO.format(preset=PRESET, world=WORLD_SIZE, sample=len(SAMPLE))
    return (
        f"{intro}\n## {when} (latest)\n\ntransformers {transformers.__version__}; {machine}; "
        f"`{result_file}`; the predictions do not "
        f"depend on the machine.\n\n{tables(rows)}"
    )


def _transformers_version() -> str:
    import transformers

    return str(transformers.__version__)


def main(argv: Sequence[str] | None = None) -> None:
    """Run the suite (``--quick``: :data:`QUICK`; ``--only``: the classes named)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_output_args(parser)
    parser.add_argument("--only", nargs="+", default=None, help="these classes only (no page)")
    args = parser.parse_args(argv)
    entries = {e.class_name: e for e in suite_entries()}
    names = args.only or (QUICK if args.quick else sorted(entries))
    unknown = sorted(set(names) - set(entries))
    if unknown:
        parser.error(f"not a class of the suite's mappings: {', '.join(unknown)}")
    rows = []
    for name in names:
        row = run_class(entries[name])
        rows.append(row)
        print(f"{name}: {row.failed or 'ok'} ({row.seconds:.1f} s)", flush=True)
    when = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    note = (
        "# Architectures: captured without computing, planned, predicted\n\n"
        f"{len(rows)} classes; transformers {_transformers_version()}; "
        f"predictions on `{PRESET}` ({WORLD_SIZE} ranks). "
        f"Wall time {sum(r.seconds for r in rows):.0f} s (under load, not a benchmark of speed)."
    )
    path = publish("architectures", note, tables(rows), args)
    if not (args.quick or args.only or args.no_write or args.out):
        result = path.relative_to(PAGE.parents[2]) if path is not None else "-"
        PAGE.write_text(page(rows, when, str(result), machine_line()))
        print(f"wrote {PAGE}")


if __name__ == "__main__":
    main()
