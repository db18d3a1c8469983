"""Hypothesis profiles for the whole suite (registered here, at the root of
``tests/``, so ``python -m pytest --hypothesis-profile=long`` works from anywhere).

* ``default``: hypothesis's usual 100 examples per test; the whole property
  suite takes about 10 s of CPU (about 50 ms per example), well under 60 s
  on 2 CI cores. The tests set no ``max_examples`` of their own, so the
  ``long`` profile can raise it;
* ``long``: 1000 examples per test, for a local soak:
  ``python -m pytest tests/property --hypothesis-profile=long -q``
  (2000 examples: 438 s wall, 100 s CPU, on a machine shared at load 9).

No deadline: capture of a tiny model takes milliseconds, but a loaded CI
machine must not turn that into a flaky failure.
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings

_COMMON = dict(
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

settings.register_profile("default", max_examples=100, **_COMMON)
settings.register_profile("long", max_examples=1000, **_COMMON)
