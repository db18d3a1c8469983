"""What ``execwrap calibrate`` prints on stderr as it goes (rank 0, not a terminal): a line
per phase with its seconds, then the total. Shared by the calibrate tests."""

from __future__ import annotations

import re

#: The phases, in order, as regular expressions.
PHASES = [
    "the sweep of collectives and copies",
    "compute rates",
    "the optimizer step",
    "activation checkpointing's host work",
    "compute beside a collective \\(overlap\\)",
    "FSDP2 steps of synthetic stacks \\(fixed costs, in-step factors\\)",
    "the wait for the slowest rank",
]


def assert_phase_lines(stderr: str) -> None:
    """Every ``calibrate: `` line of ``stderr`` is the next phase's, then the total."""
    phases = [ln for ln in stderr.splitlines() if ln.startswith("calibrate: ")]
    n = len(PHASES)
    patterns = [rf"calibrate: {i}/{n} {p} \(\d+ s\)" for i, p in enumerate(PHASES, 1)]
    patterns.append(r"calibrate: measured in \d+ s")
    assert len(phases) == len(patterns), stderr[-4000:]
    assert all(re.fullmatch(p, ln) for p, ln in zip(patterns, phases, strict=True)), phases
