"""``execwrap report --out DIR``: refused, before capture, where a report file would replace
or remove a file execwrap did not write, or one changed since it wrote it.

The rule is :mod:`execwrap.report.ownership`'s (the report's own writer checks it again,
:func:`execwrap.report.writer.write_report`); this module words it for the command line,
naming the files and a new ``--out``, as ``execwrap fit --out`` does
(:mod:`execwrap.cli.owned_files`). It imports no torch: argument errors answer before
torch is imported.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from execwrap.cli.errors import CLIError
from execwrap.report.files import REPORT_FILES
from execwrap.report.ownership import changed_files, foreign_files, refusal_fix, refusal_phrase

__all__ = ["check_report_out", "report_refusal"]


def check_report_out(out_dir: Path, names: Sequence[str]) -> None:
    """Refuse the existing folder ``out_dir`` for a report writing ``names`` when one of
    them is a file execwrap did not write, or a report file there (also one this run would
    only remove) was changed since execwrap wrote it.

    Raises:
        CLIError: :func:`report_refusal`, naming the files and a new ``--out``.
    """
    known = {n for files in REPORT_FILES.values() for n in files.values()}
    changed = changed_files(out_dir, sorted(known | set(names)))
    foreign = sorted(set(foreign_files(out_dir, names)) | set(changed))
    if foreign:
        raise CLIError(report_refusal(out_dir, foreign, changed))


def report_refusal(out_dir: Path, names: Sequence[str], changed: Sequence[str] = ()) -> str:
    """The refusal to write over (or remove) ``names`` in ``out_dir``, with a new ``--out``
    to use; ``changed``: those of ``names`` changed since execwrap wrote them."""
    new = next(
        p
        for k in range(1, 1000)
        if not (p := out_dir / ("execwrap-report" if k == 1 else f"execwrap-report-{k}")).exists()
    )
    what = refusal_phrase(list(names), list(changed), " there")
    return (
        f"--out {str(out_dir)!r}: {what}, and execwrap never replaces or deletes files it did "
        f"not write{' or that were changed since' if changed else ''}: choose a new folder, "
        f"e.g. --out {str(new)}, or {refusal_fix(list(changed))}"
    )
