"""The lowest layer of execwrap: sentences and numbers as people read them.

* :mod:`~execwrap.util.text`: plurals, lists of names, printable text;
* :mod:`~execwrap.util.formatting`: bytes, element counts and reasons in tables and summaries.

Nothing here imports torch or another execwrap package.
"""

from execwrap.util.formatting import byte_unit, format_bytes, format_numel, short_reason
from execwrap.util.text import listed, plural, printable

__all__ = [
    "byte_unit",
    "format_bytes",
    "format_numel",
    "listed",
    "plural",
    "printable",
    "short_reason",
]
