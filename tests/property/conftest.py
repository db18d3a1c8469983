"""Hypothesis profiles for the property suite.

* ``default``: small enough that the whole property suite runs in well under
  60 s on 2 CI cores (the tests keep hypothesis's example count per test
  low through this profile, not through ``@settings``, so the ``long``
  profile can raise it);
* ``long``: 1000 examples per test, for a local soak:
  ``python -m pytest tests/property --hypothesis-profile=long -q``.

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

settings.register_profile("default", max_examples=60, **_COMMON)
settings.register_profile("long", max_examples=1000, **_COMMON)
