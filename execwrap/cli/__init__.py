"""The ``execwrap`` command line: ``report``, ``diff`` and ``show``.

``execwrap report`` captures a model's execution order (symbolic first,
falling back to one real forward/backward with example inputs), plans FSDP
units with a wrap policy, compares the plan with baseline policies, and writes
the report files (:func:`execwrap.report.write_report`). With no arguments it
reports on the built-in GPT-style demo model into ``./execwrap-report/``.

``execwrap diff A.json B.json`` names the first call where two saved orders
part; ``execwrap show ORDER.json`` prints a saved order and its plan.

Exit status: 0 success, 1 a finding (``diff``: the orders differ; ``fit``: the
step does not fit), 2 bad usage or bad input (one ``execwrap: error: ...`` line on
stderr, never a traceback).

How it is built, in the order a run goes through it:

* :mod:`~execwrap.cli.main`: :func:`main`: parse, check, run, exit status;
* :mod:`~execwrap.cli.parser`: the argparse table;
* :mod:`~execwrap.cli.options`: every argument checked before torch is
  imported (with :mod:`~execwrap.cli.input_spec`, the ``--input`` language, and
  :mod:`~execwrap.cli.budget`, ``--memory-budget`` sizes);
* the commands: :mod:`~execwrap.cli.report` (with
  :mod:`~execwrap.cli.loading` for ``--model``/``--tracer``/``--policy`` and
  :mod:`~execwrap.cli.inputs` for the example tensors),
  :mod:`~execwrap.cli.show` and :mod:`~execwrap.cli.diff` (both read files with
  :mod:`~execwrap.cli.saved`);
* :mod:`~execwrap.cli.errors` and :mod:`~execwrap.cli.text`: the error type,
  exit statuses, and one-line texts.
"""

from execwrap.cli.main import main

__all__ = ["main"]
