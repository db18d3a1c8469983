"""The timer's own cost, taken off the forward times it measured on CPU.

:class:`~tracing.runtime.timing.CallTimer` runs Python in every module call's forward
pre-hook (bookkeeping, then the clock reading) and post-hook (the clock reading, then
a gradient hook registered on the call's outputs), and the module's call takes torch's
slower path for modules with hooks. On CPU that work runs on the model's own thread,
inside the inclusive time of every call that encloses it: a 192-wide, 4-block GPT of
``benchmarks/training_step.py`` measured its forward 1.25x as long under the timer as
without it (a Llama of the same size 1.22x; their backwards only 1.03x and 1.02x, their
gradient hooks being few). A full activation checkpoint's recomputation runs without
the timer, so forward times that carry it price every recomputation about a quarter
too dear.

:func:`without_hook_cost` takes the hooks' cost off, measured in the same step: the
shortest stretch from one call's end to the next call's start (nothing but the first
call's post-hook, the return into the caller and the second call's pre-hook) is the
cost ``h`` of one call's hooks, and the shortest from one call's start to a nested
call's start is the part ``a`` before a start reading (the rest, ``b = h - a``, comes
after an end reading; ``b`` no longer than the shortest stretch after an end, so
that no time runs backwards). Then a call's inclusive time loses ``h`` per call
nested in it (its exclusive time ``h`` per direct child), its start moves earlier by
the costs paid before it, and the backward times (all after the forward) by the
whole forward's. Backward durations are kept; the saved-tensor hooks' cost, paid
inside the calls' compute, stays where it is. Both numbers are the least of many
stretches of one step, so a busy machine inflates them little; a model whose calls
never follow one another gives ``h = 0`` (nothing changed).
"""

from __future__ import annotations

from typing import Any

__all__ = ["without_hook_cost"]


def without_hook_cost(fields: dict[str, Any]) -> tuple[dict[str, Any], float]:
    """``fields`` (a :meth:`CallTimer.fields` dict) with the timer's cost per call taken
    off its forward times, and that cost (seconds per call; ``0.0``: nothing changed).

    Args:
        fields: ``forward_start_s`` and ``forward_times_s`` (seconds, one per call in
            call order, the root first, calls nested as their intervals say),
            ``backward_start_s`` (seconds or ``None`` per call) and ``backward_end_s``
            (seconds or ``None``).

    Returns:
        ``(new_fields, h)``; ``fields`` itself is not changed.

    A root whose two calls follow one another 1 ms apart, the first starting 0.4 ms
    into the root:

    >>> f = {"forward_start_s": [0.0, 0.0004, 0.0044], "forward_times_s": [0.010, 0.003, 0.003],
    ...      "backward_start_s": [0.013, 0.016, 0.014], "backward_end_s": 0.02}
    >>> new, h = without_hook_cost(f)
    >>> round(h, 9), [round(t, 9) for t in new["forward_times_s"]]
    (0.001, [0.008, 0.003, 0.003])
    >>> [round(t, 9) for t in new["forward_start_s"]], round(new["backward_end_s"], 9)
    ([0.0, 0.0, 0.003], 0.0174)
    """
    starts = [float(s) for s in fields["forward_start_s"]]
    times = [float(t) for t in fields["forward_times_s"]]
    n = len(times)
    events, depth, inside = _events(starts, times)
    pairs = list(zip(events, events[1:]))
    end_to_start = [t1 - t0 for (t0, e0), (t1, e1) in pairs if e0 and not e1]
    if not end_to_start:
        return dict(fields), 0.0
    h = max(min(end_to_start), 0.0)
    a = min([h, *(t1 - t0 for (t0, e0), (t1, e1) in pairs if not e0 and not e1)])
    after_end = [t1 - t0 for (t0, e0), (t1, e1) in pairs if e0 and e1]
    first_backward = [float(b) for b in fields["backward_start_s"] if b is not None]
    if first_backward:  # the root's own post-hook runs before the loss and backward
        after_end.append(min(first_backward) - (starts[0] + times[0]))
    b = max(min([h - a, *after_end]), 0.0)
    h = a + b
    if h <= 0.0:
        return dict(fields), 0.0
    shift = h * n - a  # every call's hooks, less the root's pre-hook (before time 0)
    new = dict(fields)
    new["forward_start_s"] = [s - a * k - b * (k - depth[k]) for k, s in enumerate(starts)]
    new["forward_times_s"] = [t - h * inside[k] for k, t in enumerate(times)]
    new["backward_start_s"] = [
        None if t is None else float(t) - shift for t in fields["backward_start_s"]
    ]
    end = fields.get("backward_end_s")
    new["backward_end_s"] = None if end is None else float(end) - shift
    return new, h


def _events(
    starts: list[float], times: list[float]
) -> tuple[list[tuple[float, bool]], list[int], list[int]]:
    """The calls' clock readings in the order they were taken (``(seconds, is_end)``),
    and per call its depth and the number of calls nested in it, from the calls'
    intervals (a call ends before the next one at its depth starts)."""
    n = len(times)
    depth, inside, parent = [0] * n, [0] * n, [-1] * n
    events: list[tuple[float, bool]] = []
    stack: list[int] = []
    for k in range(n):
        while stack and starts[stack[-1]] + times[stack[-1]] <= starts[k]:
            j = stack.pop()
            events.append((starts[j] + times[j], True))
        depth[k] = len(stack)
        parent[k] = stack[-1] if stack else -1
        stack.append(k)
        events.append((starts[k], False))
    while stack:
        j = stack.pop()
        events.append((starts[j] + times[j], True))
    for k in range(n - 1, 0, -1):  # children come after their parent
        if parent[k] >= 0:
            inside[parent[k]] += inside[k] + 1
    return events, depth, inside
