"""``execwrap fit``: will a model's training step fit a cluster (:func:`run_fit`).

Sizes the model with :func:`execwrap.fit` (``execwrap.integrations.fit``: a model id or
``config.json`` needs transformers, which only the integrations import; the command
reaches it through that one function, an exception written in the layer contract in
``pyproject.toml``). Prints the answer (:mod:`execwrap.sizing.summary`) and the recipe, or
``--json``; with ``--out DIR`` writes ``plan.json`` (:func:`execwrap.save_plan`),
``fit.json``, ``fit.html`` and ``recipe_<framework>.py``. Bad input (a model id offline, a
config transformers cannot build, a plan file for another model) is one error line and
exit status 2; a step that does not fit (no plan within the budget, or a given plan over
it) is a finding: the answer as usual, and exit status 1.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from execwrap.cli.errors import EXIT_FINDING, EXIT_OK, CLIError
from execwrap.cli.fit_args import FitOptions
from execwrap.cli.owned_files import write_owned_files
from execwrap.cli.text import echo, print_table
from execwrap.errors import PlanForAnotherModelError
from execwrap.plan.pinned import load_plan, plan_json
from execwrap.plan.wrap_plan import WrapPlan
from execwrap.sizing.page import render_fit_page
from execwrap.sizing.recipes import RECIPE_FRAMEWORKS, recipe
from execwrap.sizing.result import FitResult
from execwrap.sizing.summary import memory_rows, summary_rows

__all__ = ["run_fit"]

logger = logging.getLogger(__name__)


def run_fit(options: FitOptions) -> int:
    """Size the model of ``options`` and print (and write) the answer. Returns 0 when
    the step fits, 1 (a finding) when it does not.

    Raises:
        CLIError: what :func:`execwrap.fit` refuses (its message), an unreadable plan file,
            an ``--out`` folder that cannot be written.
    """
    from execwrap.integrations.fit import fit

    plan = _given_plan(options.plan)
    try:
        result = fit(
            _model(options.model),
            cluster=options.cluster,
            nodes=options.nodes,
            sequence_length=options.sequence_length,
            micro_batch=options.micro_batch,
            precision=options.precision,
            memory_budget=options.memory_budget,
            plan=plan,
        )
    except PlanForAnotherModelError as exc:
        raise CLIError(
            f"--plan {options.plan} {exc.finding}. Run execwrap fit without --plan to plan "
            "this model, or pass the MODEL the plan was made for"
        ) from exc
    except (ValueError, TypeError, ImportError, AttributeError) as exc:
        raise CLIError(str(exc)) from exc
    plan_path = str((options.out or Path("fit")) / "plan.json")
    if options.out is not None:
        _write(result, options.out)
    if options.json:
        print(json.dumps(result.to_dict(), indent=2))  # ASCII JSON: nothing to escape
        return _status(result)
    print_table(summary_rows(result))
    if result.memory is not None:
        echo("memory per GPU at the peak:")
        print_table(memory_rows(result))
    if result.plan is not None:
        names = RECIPE_FRAMEWORKS if options.framework == "all" else (options.framework,)
        for name in names:
            echo()
            echo(f"recipe ({name}; the plan file: --out DIR writes DIR/plan.json):")
            echo()
            for line in recipe(result, name, plan_path=plan_path).splitlines():
                echo(line)
    elif result.reason:
        echo()
        echo(f"why: {result.reason}")
    return _status(result)


def _status(result: FitResult) -> int:
    """0 when the step fits, 1 (a finding, as ``execwrap diff``'s) when it does not."""
    return EXIT_OK if result.fits else EXIT_FINDING


def _model(text: str) -> str:
    """A factory's module is found in the current folder, as ``execwrap report`` finds it."""
    head, sep, _ = text.partition(":")
    if sep and not Path(text).exists() and Path(head.replace(".", "/") + ".py").is_file():
        import sys

        if "" not in sys.path and str(Path.cwd()) not in sys.path:
            sys.path.insert(0, str(Path.cwd()))
    return text


def _given_plan(path: Path | None) -> WrapPlan | None:
    if path is None:
        return None
    try:
        return load_plan(path)
    except (OSError, ValueError) as exc:
        raise CLIError(f"--plan {str(path)!r}: {exc}") from exc


def _write(result: FitResult, out: Path) -> None:
    """The plan, the recipes, the answer and its page in ``out``; a file there that
    execwrap did not write is never replaced (:mod:`execwrap.cli.owned_files`)."""
    files: dict[str, str] = {}
    if result.plan is not None:
        files["plan.json"] = plan_json(result.plan)
        for name in RECIPE_FRAMEWORKS:
            files[f"recipe_{name}.py"] = recipe(result, name, plan_path=str(out / "plan.json"))
    files["fit.json"] = json.dumps(result.to_dict(), indent=2) + "\n"
    files["fit.html"] = render_fit_page(result)
    write_owned_files(out, files)
