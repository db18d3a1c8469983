"""Cyclic garbage collection paused while a search simulates many steps.

The auto-planner's search builds and drops hundreds of thousands of small objects (the
simulator's ops and memory events), almost none in reference cycles: reference counting
frees them. Their allocations still trigger CPython's cyclic collector, whose older
generations walk every tracked object of the process (torch and the model: 320,000
objects in a process that planned the 80-layer Llama-70B shape). Measured there
(``benchmarks/joint_plan.py``'s search, 4 micro-batches, one process): the collector
took about 40% of the search's CPU time (3.7 s with it, 2.4 s without), and the search
left 969 objects in cycles behind (collected once the collector runs again, at the next
allocation threshold after the search).
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

__all__ = ["gc_paused"]


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Disable CPython's cyclic garbage collector inside the block, if it is enabled,
    and enable it again on the way out (also on an exception). Nested blocks and a
    collector the caller disabled are left as they are. Reference counting still frees
    every object not in a cycle at once."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
