"""Randomly damaged report files never give a traceback (hypothesis).

A valid ``report.json`` (the built-in demo model with a bucketed plan and its
baselines) is mutated at a random place of its JSON tree (a key deleted, a
value replaced by any JSON value, a list cut or an item repeated) or of its
text (cut short, one character replaced), then fed to ``execwrap show`` and
``execwrap diff`` in-process. ``show`` must exit 0 or 2 and ``diff`` 0, 1 (the
orders differ) or 2, with exactly one ``execwrap: error:`` line on stderr when
it exits 2 and nothing on stderr otherwise. An exception escaping ``main`` (a
traceback) fails the test.
"""

from __future__ import annotations

import atexit
import contextlib
import io
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import event, given, note
from hypothesis import strategies as st

from execwrap.cli import main

_JSON_LEAVES = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=6)
    | st.sampled_from(["", "wte.weight", "blocks.0", "float32", "runtime", "\x1b[2J"])
)
json_values = st.recursive(
    _JSON_LEAVES,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=6,
)

_DIR = Path(tempfile.mkdtemp(prefix="execwrap-saved-"))
atexit.register(shutil.rmtree, _DIR, ignore_errors=True)
_VALID = _DIR / "valid" / "report.json"


def _valid_report() -> str:
    if not _VALID.exists():
        with contextlib.redirect_stdout(io.StringIO()):
            rc = main(["report", "--out", str(_VALID.parent), "--format", "json"])
        assert rc == 0
    return _VALID.read_text()


def _mutate_tree(data: Any, draw: Any) -> Any:
    """Walk down a random path, then change what is there."""
    if not isinstance(data, (dict, list)) or not data or draw(st.integers(0, 4)) == 0:
        return draw(json_values)
    if isinstance(data, dict):
        key = draw(st.sampled_from(sorted(data)))
        op = draw(st.sampled_from(["descend", "descend", "descend", "delete"]))
        if op == "delete":
            del data[key]
        else:
            data[key] = _mutate_tree(data[key], draw)
        return data
    index = draw(st.integers(0, len(data) - 1))
    op = draw(st.sampled_from(["descend", "descend", "cut", "repeat"]))
    if op == "cut":
        return data[:index]
    if op == "repeat":
        return [*data[: index + 1], data[index], *data[index + 1 :]]
    data[index] = _mutate_tree(data[index], draw)
    return data


@st.composite
def damaged_reports(draw: Any) -> str:
    text = _valid_report()
    kind = draw(st.sampled_from(["tree", "tree", "tree", "cut", "char"]))
    if kind == "cut":
        return text[: draw(st.integers(0, len(text) - 1))]
    if kind == "char":
        i = draw(st.integers(0, len(text) - 1))
        return text[:i] + draw(st.characters()) + text[i + 1 :]
    data = _mutate_tree(json.loads(text), draw)
    return json.dumps(data)


def _run(argv: list[str]) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(argv)
    return rc, err.getvalue()


@given(damaged_reports())
def test_show_and_diff_never_give_a_traceback(text: str) -> None:
    path = _DIR / "damaged.json"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    for argv, allowed in (
        (["show", str(path)], {0, 2}),
        (["diff", str(_VALID), str(path)], {0, 1, 2}),
    ):
        rc, err = _run(argv)
        note(f"{argv[0]}: exit {rc}, stderr {err!r}")
        event(f"{argv[0]} exit {rc}")
        assert rc in allowed
        if rc == 2:
            assert err.count("\n") == 1 and err.startswith("execwrap: error: ")
        else:
            assert err == ""
