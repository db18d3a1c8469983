"""Tests for the ``execwrap`` command line.

Most cases call :func:`execwrap.cli.main` in-process (fast); a few spawn
``python -m execwrap`` to check the real exit codes and that bad input never
prints a traceback.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest
import torch

from execwrap.cli import main
from execwrap.cli.errors import CLIError
from execwrap.cli.input_spec import parse_input_spec
from execwrap.cli.inputs import build_inputs
from execwrap.cli.loading import parse_policy
from execwrap.cli.options import parse_numel
from execwrap.demo_models import Block, build_demo_model
from execwrap.report.file_set import SET_FOLDER
from tests._saved import swap_calls, swap_uses
from tracing import ExecutionOrder

REPO = Path(__file__).resolve().parents[2]
FACTORIES = "tests.execwrap.factories"
ALL_FILES = {"report.json", "calls.csv", "params.csv", "order.graphml", "report.html"}


@pytest.fixture(autouse=True)
def _repo_on_path(monkeypatch):
    # `--model tests.execwrap.factories:...` resolves from the repository root.
    monkeypatch.syspath_prepend(str(REPO))


def _err_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("execwrap: error: "), err
    return lines[0]


def _summary(out: str) -> dict[str, str]:
    """The terminal summary table: key -> its whole line."""
    rows = [line for line in out.splitlines() if line.startswith("  ")]
    return {line.split("  ")[1].strip(): line for line in rows}


@pytest.fixture(scope="module")
def demo_report(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("demo") / "r"
    assert main(["report", "--out", str(out), "--format", "json"]) == 0
    return out / "report.json"


# --------------------------------------------------------------------- report
def test_bare_report_writes_all_formats_to_default_dir(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["report"]) == 0
    out = capsys.readouterr().out
    assert {p.name for p in (tmp_path / "execwrap-report").iterdir()} == ALL_FILES | {SET_FOLDER}
    lines = _summary(out)
    assert "GPT (execwrap.demo_models:build_demo_model)" in lines["model"]
    assert lines["capture"].split()[-3] == "symbolic"
    assert lines["fallback reason"].endswith("  -")
    assert lines["policy"].endswith("transformer:Block")
    assert lines["units"].endswith("  3")
    assert lines["all-gathers/step"].endswith("  5")
    assert lines["peak unsharded (prefetch 1)"].endswith("861.50 KiB")
    assert lines["html"].endswith(os.path.join("execwrap-report", "report.html"))
    assert out.rstrip().splitlines()[-1] == (
        f"open {os.path.join('execwrap-report', 'report.html')} in a browser "
        "to see the charts and tables"
    )
    data = json.loads((tmp_path / "execwrap-report" / "report.json").read_text())
    assert data["plan"]["groups"] == [[""], ["blocks.0", "blocks.1"], ["blocks.2", "blocks.3"]]
    assert data["plan"]["bucket_numel"] == 100_000
    assert set(data["baselines"]) == {"transformer:Block (no buckets)", "always"}
    assert data["baselines"]["transformer:Block (no buckets)"]["groups"] == [
        [""],
        ["blocks.0"],
        ["blocks.1"],
        ["blocks.2"],
        ["blocks.3"],
    ]


def test_report_options(tmp_path, capsys):
    rc = main(
        [
            "report",
            "--model", f"{FACTORIES}:demo2",
            "--policy", "module:Block,execwrap.demo_models:MLP",
            "--bucket-size", "none",
            "--prefetch", "0",
            "--format", "json,csv",
            "--out", str(tmp_path),
        ]
    )  # fmt: skip
    assert rc == 0, capsys.readouterr().err
    assert {p.name for p in tmp_path.iterdir()} == {
        "report.json",
        "calls.csv",
        "params.csv",
        SET_FOLDER,
    }
    data = json.loads((tmp_path / "report.json").read_text())
    assert data["prefetch"] == 0
    assert data["plan"]["stats"]["prefetch"] == 0
    assert data["plan"]["bucket_numel"] is None
    assert data["plan"]["groups"] == [
        [""],
        ["blocks.0"],
        ["blocks.0.mlp"],
        ["blocks.1"],
        ["blocks.1.mlp"],
    ]
    assert set(data["baselines"]) == {"always"}


def test_report_always_policy_compares_with_root_only(tmp_path, capsys):
    rc = main(["report", "--model", f"{FACTORIES}:flag_model", "--concrete-arg", "flag=True",
               "--format", "json", "--out", str(tmp_path)])  # fmt: skip
    assert rc == 0, capsys.readouterr().err
    data = json.loads((tmp_path / "report.json").read_text())
    assert data["plan"]["groups"] == [[""], ["b"], ["a"]]
    assert data["baselines"]["none (root only)"]["groups"] == [[""]]


def test_report_meta_device(tmp_path, capsys):
    rc = main(["report", "--device", "meta", "--format", "json", "--out", str(tmp_path)])
    assert rc == 0, capsys.readouterr().err
    order = ExecutionOrder.load(tmp_path / "report.json")
    assert order.method == "symbolic"
    assert len(order.params) == 52
    assert order.module_forward_order[:3] == ["", "wte", "blocks.0"]


def test_report_concrete_args_and_tracer(tmp_path, capsys):
    def order_of(*extra: str) -> ExecutionOrder:
        out = tmp_path / str(len(list(tmp_path.iterdir())))
        rc = main(["report", *extra, "--format", "json", "--out", str(out)])
        assert rc == 0, capsys.readouterr().err
        return ExecutionOrder.load(out / "report.json")

    flag = f"{FACTORIES}:flag_model"
    assert order_of("--model", flag, "--concrete-arg", "flag=True").module_forward_order == [
        "",
        "b",
        "a",
    ]
    order = order_of("--model", flag, "--concrete-arg", "flag=False")
    assert order.module_forward_order == ["", "a"]
    assert order.method == "symbolic"
    leaf = order_of("--model", f"{FACTORIES}:demo2", "--tracer", f"{FACTORIES}:BlockLeafTracer")
    assert leaf.module_forward_order == ["", "wte", "blocks.0", "blocks.1", "ln_f", "lm_head"]


def test_report_with_input_keeps_unpassed_flag_at_its_default(tmp_path, capsys):
    rc = main(["report", "--model", f"{FACTORIES}:flag_model", "--input", "float:2x8",
               "--format", "json", "--out", str(tmp_path)])  # fmt: skip
    assert rc == 0, capsys.readouterr().err
    order = ExecutionOrder.load(tmp_path / "report.json")
    assert (order.capture_step, order.fallback_reason) == ("symbolic", None)
    assert order.module_forward_order == ["", "b", "a"]  # flag=True, its default


def test_report_falls_back_to_runtime_with_input(tmp_path, capsys):
    rc = main(["report", "--model", f"{FACTORIES}:shape_model", "--input", "float:2x8",
               "--format", "json", "--out", str(tmp_path)])  # fmt: skip
    out = capsys.readouterr().out
    assert rc == 0
    order = ExecutionOrder.load(tmp_path / "report.json")
    assert order.capture_step == "zero-cost runtime"
    assert order.module_forward_order == ["", "b", "a"]
    assert order.fallback_reason
    fallback = next(line for line in out.splitlines() if "fallback reason" in line)
    assert fallback.split("fallback reason", 1)[1].strip() not in ("", "-")


def test_verbose_logs_the_fallback_and_leaves_logging_as_it_was(tmp_path, capsys):
    import logging

    handlers = list(logging.getLogger("tracing").handlers)
    rc = main(["report", "-v", "--model", f"{FACTORIES}:shape_model", "--input", "float:2x8",
               "--format", "json", "--out", str(tmp_path)])  # fmt: skip
    assert rc == 0
    err = capsys.readouterr().err
    assert (
        "INFO tracing.ladder: capture fell back to zero-cost runtime: symbolic tracing failed "
        "in the root module <root> (ShapeModel)"
    ) in err
    assert "DEBUG" not in err
    assert logging.getLogger("tracing").handlers == handlers
    assert main(["report", "--format", "json", "--out", str(tmp_path)]) == 0
    assert capsys.readouterr().err == ""  # quiet without -v


def test_report_untraceable_without_input_is_bad_input(tmp_path, capsys):
    rc = main(["report", "--model", f"{FACTORIES}:flag_model", "--out", str(tmp_path)])
    assert rc == 2
    line = _err_line(capsys)
    assert line == (
        "execwrap: error: capture failed: symbolic tracing failed in the root module <root> "
        "(FlagModel): TraceError: symbolically traced variables cannot be used as inputs to "
        "control flow at tests/execw...; pass --input SPEC to capture at run time, "
        "--concrete-arg NAME=VALUE or --tracer PKG.MODULE:CLASS"
    )
    assert len(line) < 300
    assert list(tmp_path.iterdir()) == []


def test_untraceable_message_names_submodule_and_cuts_long_reasons():
    from execwrap.cli.report import _tracing_error_message
    from tracing import TracingError

    exc = TracingError(
        "long Python advice\nmore",
        module_fqn="model.layers.0.moe",
        module_class="MoE",
        reason="TraceError: " + "x" * 300,
    )
    line = _tracing_error_message(exc, has_input=False, device="cpu")
    assert line == (
        "capture failed: symbolic tracing failed in module 'model.layers.0.moe' (MoE): "
        "TraceError: " + "x" * 85 + "...; pass --input SPEC to capture at run time, "
        "--concrete-arg NAME=VALUE or --tracer PKG.MODULE:CLASS"
    )
    assert len("execwrap: error: " + line) < 300


def test_runtime_capture_failure_on_meta_uses_cli_spelling():
    from execwrap.cli.report import _tracing_error_message
    from tracing import TracingError

    try:
        try:
            raise NotImplementedError("Cannot copy out of meta tensor; no data!\nmore")
        except NotImplementedError as cause:
            raise TracingError(
                "runtime capture on the meta device failed ... capture with small real "
                "inputs on CPU.",
                module_fqn="router",
                module_class="TopK",
            ) from cause
    except TracingError as exc:
        line = _tracing_error_message(exc, has_input=True, device="meta")
    assert line == (
        "capture failed: running on the meta device failed in module 'router' (TopK): "
        "NotImplementedError: Cannot copy out of meta tensor; no data!; code that depends on "
        "tensor values needs --device cpu (with small --input tensors)"
    )


def test_report_model_raising_at_run_time_is_one_line(tmp_path, capsys):
    rc = main(["report", "--model", f"{FACTORIES}:raising_model", "--input", "float:2x8",
               "--out", str(tmp_path / "out")])  # fmt: skip
    assert rc == 2
    assert _err_line(capsys) == (
        "execwrap: error: capture failed: running RaisingModel on --input 'float:2x8' raised "
        "ModelFailure: expert routing table is empty (in module 'inner' (_Raises))"
    )
    assert not (tmp_path / "out").exists()


def test_report_summary_fallback_reason_is_short(tmp_path, capsys):
    from execwrap.report import short_reason

    rc = main(["report", "--model", f"{FACTORIES}:shape_model", "--input", "float:2x8",
               "--format", "json", "--out", str(tmp_path)])  # fmt: skip
    assert rc == 0
    reason = json.loads((tmp_path / "report.json").read_text())["order"]["fallback_reason"]
    summary = _summary(capsys.readouterr().out)["fallback reason"].split("  ")[-1]
    assert summary.endswith("...") and len(summary) <= 160
    assert reason.startswith(summary.removesuffix("...").rstrip())
    assert short_reason(reason + "\n" + "detail " * 40) == short_reason(reason)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--model", "nosuch_pkg.factories:build"], "cannot import module 'nosuch_pkg.factories'"),
        (["--model", f"{FACTORIES}:nope"], f"module '{FACTORIES}' has no attribute 'nope'"),
        (["--model", "no_colon"], "expected PKG.MODULE:NAME"),
        (
            ["--model", f"{FACTORIES}:broken"],
            "the factory raised RuntimeError: config file missing: weights.bin",
        ),
        (["--model", f"{FACTORIES}:not_a_module"], "the factory returned a dict,"),
        (["--model", f"{FACTORIES}:returns_int"], "the factory returned an int,"),
        (["--model", f"{FACTORIES}:NUMBER"], "is an int, not a callable factory"),
        (["--input", "long:2xq"], "shape '2xq' must be sizes joined by 'x'"),
        (["--input", "complex7:2"], "unknown dtype 'complex7'"),
        (["--input", "long"], "expected DTYPE:SHAPE[:HIGH]"),
        (["--input", "@missing.pt"], "input file 'missing.pt' does not exist"),
        (["--policy", "transformer:Nope"], "no module of class 'Nope' in the model"),
        (["--policy", "weird"], "unknown policy"),
        (["--policy", "size:lots"], "invalid element count 'lots'"),
        (["--bucket-size", "2Q"], "--bucket-size: invalid element count '2Q'"),
        (["--concrete-arg", "flag"], "expected NAME=VALUE"),
        (["--concrete-arg", "flag=os.system"], "VALUE must be a Python literal"),
        (["--format", "json,pdf"], "unknown format pdf"),
        (["--prefetch", "-1"], "--prefetch must be >= 0"),
        (["--prefetch", "x"], "argument --prefetch: invalid int value: 'x'"),
        (["--tracer", "execwrap.demo_models:GPT"], "is not a torch.fx.Tracer subclass"),
        (["--device", "cuda"], "argument --device: invalid choice: 'cuda'"),
    ],
)
def test_report_bad_input(args, message, tmp_path, capsys):
    rc = main(["report", *args, "--out", str(tmp_path / "out")])
    assert rc == 2
    line = _err_line(capsys)
    assert message in line
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "args, line",
    [
        (
            ["--model", f"{FACTORIES}:flag_model", "--input", "float:3"],
            "capture failed: running FlagModel on --input 'float:3' raised RuntimeError: mat1 "
            "and mat2 shapes cannot be multiplied (1x3 and 8x8) (in module 'b' (Linear))",
        ),
        (
            ["--model", f"{FACTORIES}:flag_model", "--concrete-arg", "flg=True"],
            "--concrete-arg: FlagModel.forward has no argument 'flg'; its arguments are 'x', "
            "'flag'",
        ),
        (
            ["--bucket-size", "0"],
            "--bucket-size '0': must be > 0 elements; use --bucket-size none for no bucketing",
        ),
        (
            ["--model", "./bad.py:tied"],
            "--model takes an importable module path PKG.MODULE:FACTORY, not a file path; "
            "run from the folder holding bad.py and pass bad:tied",
        ),
        (
            ["--model", "models/bad.py:tied"],
            "--model takes an importable module path PKG.MODULE:FACTORY, not a file path; "
            "run from the folder holding bad.py and pass bad:tied",
        ),
        (
            ["--tracer", "tracers.py:MyTracer"],
            "--tracer takes an importable module path PKG.MODULE:CLASS, not a file path; "
            "run from the folder holding tracers.py and pass tracers:MyTracer",
        ),
    ],
)
def test_report_bad_input_exact_line(args, line, tmp_path, capsys):
    rc = main(["report", *args, "--out", str(tmp_path / "out")])
    assert rc == 2
    assert _err_line(capsys) == f"execwrap: error: {line}"
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("error", [RuntimeError, MemoryError, ValueError])
def test_report_input_that_torch_cannot_build(error, tmp_path, capsys, monkeypatch):
    def fail(*args, **kwargs):
        raise error("[enforce fail at alloc_cpu.cpp:127] can't allocate memory\nmore detail")

    monkeypatch.setattr(torch, "randint", fail)
    rc = main(["report", "--input", "ids=long:8x16", "--out", str(tmp_path / "out")])
    assert rc == 2
    assert _err_line(capsys) == (
        "execwrap: error: --input: input item 'ids=long:8x16': cannot create the tensor "
        f"(1.00 KiB): {error.__name__}: [enforce fail at alloc_cpu.cpp:127] can't allocate memory"
    )
    assert not (tmp_path / "out").exists()


def test_report_input_larger_than_memory(tmp_path, capsys, monkeypatch):
    import execwrap.cli.inputs as cli

    monkeypatch.setattr(cli, "_machine_memory_bytes", lambda: 16 * 2**30)
    rc = main(["report", "--input", "long:100000x100000", "--out", str(tmp_path / "out")])
    assert rc == 2
    assert _err_line(capsys) == (
        "execwrap: error: --input: input item 'long:100000x100000': the tensor needs 74.51 GiB, "
        "more than this machine's memory (16.00 GiB); use a smaller SHAPE"
    )


def test_report_plan_error_is_one_line(tmp_path, capsys, monkeypatch):
    import execwrap.planning.planner as plan_mod
    from execwrap.errors import PlanError

    def fail(*args, **kwargs):
        raise PlanError("parameter 'w' is in no unit of the plan")

    monkeypatch.setattr(plan_mod, "plan_wrap", fail)
    assert main(["report", "--out", str(tmp_path / "out")]) == 2
    assert _err_line(capsys) == (
        "execwrap: error: planning failed: parameter 'w' is in no unit of the plan"
    )


def test_report_folder_in_the_way_writes_nothing(tmp_path, capsys):
    (tmp_path / "report.html").mkdir()
    assert main(["report", "--out", str(tmp_path)]) == 2
    assert _err_line(capsys) == (
        f"execwrap: error: --out '{tmp_path}': '{tmp_path / 'report.html'}' is a folder, so "
        "the report cannot write its report.html there; move it away or choose another --out"
    )
    assert [p.name for p in tmp_path.iterdir()] == ["report.html"]
    assert list((tmp_path / "report.html").iterdir()) == []
    assert main(["report", "--format", "json", "--out", str(tmp_path)]) == 0  # not in the way
    assert sorted(p.name for p in tmp_path.iterdir()) == [SET_FOLDER, "report.html", "report.json"]


def test_report_interrupted_while_writing_leaves_no_folder(tmp_path, capsys, monkeypatch):
    from execwrap.report.writer import FILE_WRITERS

    def interrupt(ctx, f):
        raise KeyboardInterrupt

    monkeypatch.setitem(FILE_WRITERS, "html", interrupt)
    assert main(["report", "--out", str(tmp_path / "a" / "b")]) == 130
    assert capsys.readouterr().err == "execwrap: interrupted\n"
    assert list(tmp_path.iterdir()) == []


def test_report_out_dir_not_writable(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert main(["report", "--out", str(blocker / "sub")]) == 2
    line = _err_line(capsys)
    assert f"--out '{blocker / 'sub'}': '{blocker}' exists and is not a folder" in line


def test_report_write_failure_is_bad_output(tmp_path, capsys, monkeypatch):
    import execwrap.report.file_set as file_set  # its open() writes every report file

    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied", str(tmp_path))

    monkeypatch.setattr(file_set, "open", refuse, raising=False)
    assert main(["report", "--format", "json", "--out", str(tmp_path)]) == 2
    assert "cannot write the report: [Errno 13] Permission denied" in _err_line(capsys)


def test_usage_errors(capsys):
    assert main([]) == 2
    assert "a command is required: report, diff, show, fit or calibrate" in _err_line(capsys)
    assert main(["frobnicate"]) == 2
    assert "invalid choice: 'frobnicate'" in _err_line(capsys)
    assert main(["report", "--nope"]) == 2
    assert "unrecognized arguments: --nope" in _err_line(capsys)


@pytest.mark.parametrize("command", [[], ["report"], ["diff"], ["show"]])
def test_help(command, capsys):
    assert main([*command, "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: execwrap{' ' + command[0] if command else ''}")
    if not command:
        assert " ".join(out.split()).endswith(
            "exit status: 0 success, 1 a finding (diff: orders differ; fit: the step does not "
            "fit; report: no plan within --memory-budget), 2 bad usage or input"
        )
    if command == ["report"]:
        assert "DTYPE:SHAPE[:HIGH]" in out and "transformer:CLASS" in out
        assert "--bucket-size" in out and "--concrete-arg" in out
        assert out.rstrip().endswith(
            "defaults:         built-in model (no --model)   other models (--model)\n"
            "  --input         long:2x16                     none (symbolic capture only)\n"
            "  --policy        transformer:Block             always\n"
            "  --bucket-size   100K                          none\n\n"
            "exit status: 0 the report is written, 1 no plan within --memory-budget (a finding,\n"
            "nothing written), 2 bad usage or input"
        )
        assert (
            "  NAME=@FILE.pt        keyword argument NAME; FILE.pt must hold one tensor.\n" in out
        )


def test_console_script_declared():
    (script,) = [e for e in entry_points(group="console_scripts") if e.name == "execwrap"]
    assert script.value == "execwrap.cli:main"


# ---------------------------------------------------------------- diff / show
def test_diff_same_and_different(demo_report, tmp_path, capsys):
    assert main(["diff", str(demo_report), str(demo_report.parent)]) == 0
    assert capsys.readouterr().out.startswith("orders are the same: 40 module calls")

    data = json.loads(demo_report.read_text())
    swap_calls(data["order"], 5, 6)
    other = tmp_path / "b.json"
    other.write_text(json.dumps(data["order"]))  # a bare order works too
    assert main(["diff", str(demo_report), str(other), "--context", "1"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0] == (
        "orders differ: first divergence at forward call 5: "
        "A runs blocks.0.attn.qkv, B runs blocks.0.attn.proj"
    )
    assert [line.split() for line in out[4:]] == [
        ["A", "B"],
        ["4", "blocks.0.attn", "blocks.0.attn"],
        [">>", "5", "blocks.0.attn.qkv", "blocks.0.attn.proj"],
        ["!=", "6", "blocks.0.attn.proj", "blocks.0.attn.qkv"],
    ]


def test_diff_prefix_and_param_order(demo_report, tmp_path, capsys):
    data = json.loads(demo_report.read_text())["order"]
    calls = data["module_forward_order"][:-1]
    uses = [u for u in data["param_uses"] if u["call_index"] < len(calls)]  # a consistent order
    depths = data["module_call_depths"][:-1]
    short = dict(data, module_forward_order=calls, param_uses=uses, module_call_depths=depths)
    (tmp_path / "short.json").write_text(json.dumps(short))
    assert main(["diff", str(demo_report), str(tmp_path / "short.json")]) == 1
    out = capsys.readouterr().out
    assert "first divergence at forward call 39: A runs lm_head, B runs (end)" in out

    swap_uses(data, 0, 1)  # wpe is now used first
    (tmp_path / "p.json").write_text(json.dumps(data))
    assert main(["diff", str(demo_report), str(tmp_path / "p.json")]) == 1
    assert "parameter forward order differs at position 0: A wte.weight, B wpe" in (
        capsys.readouterr().out
    )


def test_show_report_and_bare_order(demo_report, tmp_path, capsys):
    assert main(["show", str(demo_report)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].endswith("GPT, captured symbolic (torch " + torch.__version__ + ")")
    assert "  11  blocks.1  (Block)  [unit 1]" in out
    assert "  unit 2: blocks.2, blocks.3  (24 parameters, 99968 elements" in out
    assert (
        "figures (prefetch 1, every group but the root resharded after forward): 3 groups, 5 "
        "all-gathers/step, 3 reduce-scatters/step, peak unsharded 861.50 KiB"
    ) in out
    assert "tied parameters:\n  wte.weight = lm_head.weight" in out

    bare = tmp_path / "order.json"
    ExecutionOrder.load(demo_report).save(bare)
    assert main(["show", str(bare)]) == 0
    out = capsys.readouterr().out
    assert "  0  <root>  (GPT)\n" in out
    assert out.rstrip().endswith("no plan (a bare order)")


def test_show_a_plan_file(demo_report, tmp_path, capsys):
    """A plan.json of save_plan (as ``execwrap fit --out`` writes): the plan, and its use."""
    from execwrap import save_plan
    from execwrap.cli.saved import load_saved

    path = save_plan(load_saved(demo_report).plan, tmp_path / "plan.json")
    assert main(["show", str(path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == (
        f"{path}: a plan file (execwrap.save_plan, execwrap fit --out) for GPT, captured "
        f"symbolic (torch {torch.__version__})"
    )
    assert (
        "  unit 2: blocks.2, blocks.3  (24 parameters, 99968 elements, 390.50 KiB, calls 20..37)"
        in lines
    )
    assert lines[-1] == (
        f"to price this plan: execwrap fit MODEL --plan {path}; to train with it: "
        f"execwrap.load_plan({str(path)!r}, model) (checked against the model)"
    )


@pytest.mark.parametrize(
    "content, message",
    [
        (None, "no such file"),
        ("{not json", "not valid JSON (Expecting property name"),
        ('{"schema_version": 99}', "unsupported ExecutionOrder schema_version 99"),
        (
            '{"schema_version": 1, "order": {"schema_version": 1}}',
            "malformed ExecutionOrder: field order.method: missing",
        ),
    ],
)
def test_show_and_diff_bad_json(content, message, demo_report, tmp_path, capsys):
    path = tmp_path / "bad.json"
    if content is not None:
        path.write_text(content)
    assert main(["show", str(path)]) == 2
    line = _err_line(capsys)
    assert line.startswith(f"execwrap: error: {path}: ") and message in line
    assert main(["diff", str(demo_report), str(path)]) == 2
    assert message in _err_line(capsys)


@pytest.mark.parametrize(
    "content, message",
    [
        (
            '{"a": 1}',
            "{path} is not an execwrap report, order or plan file "
            "(no 'schema_version' / 'module_forward_order')",
        ),
        (
            "[1, 2]",
            "{path} is not an execwrap report, order or plan file (a JSON list, not an object)",
        ),
        (
            '{"order": {}, "plan": null}',
            "{path} is not an execwrap report, order or plan file (an 'order' but no 'schema_version')",
        ),
    ],
)
def test_show_not_ours(content, message, tmp_path, capsys):
    path = tmp_path / "other.json"
    path.write_text(content)
    assert main(["show", str(path)]) == 2
    assert _err_line(capsys) == "execwrap: error: " + message.format(path=path)


def test_show_and_diff_reject_unknown_report_version(demo_report, tmp_path, capsys):
    data = json.loads(demo_report.read_text())
    data["schema_version"] = 99
    path = tmp_path / "r99.json"
    path.write_text(json.dumps(data))
    expected = (
        f"execwrap: error: {path}: unsupported execwrap report schema_version 99 (this execwrap "
        "reads version 1); write the report again with this version's 'execwrap report'"
    )
    assert main(["show", str(path)]) == 2
    assert _err_line(capsys) == expected
    assert main(["diff", str(demo_report), str(path)]) == 2
    assert _err_line(capsys) == expected


def test_show_malformed_plan(demo_report, tmp_path, capsys):
    data = json.loads(demo_report.read_text())
    data["plan"]["units"] = [{"module_fqns": [""]}]
    path = tmp_path / "r.json"
    path.write_text(json.dumps(data))
    assert main(["show", str(path)]) == 2
    assert _err_line(capsys) == (
        f"execwrap: error: {path}: malformed WrapPlan: field plan.units[0].param_fqns: missing"
    )


# ---------------------------------------------------------------- value parsing
def test_parse_numel():
    assert parse_numel("25M") == 25_000_000
    assert parse_numel("25m") == 25_000_000
    assert parse_numel("1.5K") == 1500
    assert parse_numel("4096") == 4096
    assert parse_numel("2G") == 2 * 10**9
    for bad in ("", "M", "-3", "1.5", "3 MB", "0x10"):
        with pytest.raises(ValueError, match="invalid element count"):
            parse_numel(bad)


def test_parse_input_spec():
    (item,) = parse_input_spec("long:2x16")
    assert (item.name, item.dtype, item.shape, item.high, item.path) == (
        None, torch.int64, (2, 16), None, None,
    )  # fmt: skip
    a, b, c = parse_input_spec(" float:2x3x32 ; attention_mask=long:2x16:2 ;x=@in.pt")
    assert (a.dtype, a.shape) == (torch.float32, (2, 3, 32))
    assert (b.name, b.dtype, b.shape, b.high) == ("attention_mask", torch.int64, (2, 16), 2)
    assert (c.name, c.path) == ("x", "in.pt")
    assert parse_input_spec("bool:4")[0].dtype == torch.bool
    assert parse_input_spec("bfloat16:1x2")[0].dtype == torch.bfloat16
    for bad, match in [
        ("", "has no items"),
        ("long:", "expected DTYPE:SHAPE"),
        ("long:2x16:0", "HIGH must be > 0"),
        ("long:2x16:ten", "HIGH 'ten' must be an integer"),
        ("1x=long:2", "is not an argument name"),
        ("Size:2", "unknown dtype 'Size'"),
        ("@", "'@' needs a file name"),
    ]:
        with pytest.raises(ValueError, match=match):
            parse_input_spec(bad)


def test_build_inputs(tmp_path):
    model = build_demo_model(1)
    args, kwargs = build_inputs(
        parse_input_spec("long:2x16;mask=long:2x16:2;float:3"), model, "cpu"
    )
    ids, x = args
    assert ids.shape == (2, 16) and ids.dtype == torch.int64
    assert 0 <= int(ids.min()) and int(ids.max()) < 256  # model.config.vocab_size
    assert set(kwargs) == {"mask"} and set(kwargs["mask"].unique().tolist()) <= {0, 1}
    assert x.dtype == torch.float32 and x.shape == (3,)
    again, _ = build_inputs(parse_input_spec("long:2x16"), model, "cpu")
    assert torch.equal(again[0], ids)  # seeded

    meta, _ = build_inputs(parse_input_spec("long:2x16"), model, "meta")
    assert meta[0].device.type == "meta"

    torch.save({"input_ids": torch.ones(1, 4, dtype=torch.long)}, tmp_path / "kw.pt")
    torch.save((torch.zeros(2), torch.ones(3)), tmp_path / "pos.pt")
    torch.save(torch.arange(5), tmp_path / "one.pt")
    spec = f"@{tmp_path / 'kw.pt'};@{tmp_path / 'pos.pt'};y=@{tmp_path / 'one.pt'}"
    args, kwargs = build_inputs(parse_input_spec(spec), model, "cpu")
    assert [a.tolist() for a in args] == [[0.0, 0.0], [1.0, 1.0, 1.0]]
    assert kwargs["input_ids"].tolist() == [[1, 1, 1, 1]]
    assert kwargs["y"].tolist() == [0, 1, 2, 3, 4]

    (tmp_path / "junk.pt").write_bytes(b"not a torch file")
    with pytest.raises(ValueError, match="cannot load") as info:
        build_inputs(parse_input_spec(f"@{tmp_path / 'junk.pt'}"), model, "cpu")
    assert "\n" not in str(info.value)
    assert str(info.value).endswith(
        "; is it a file written by torch.save of a tensor or a tuple/dict of tensors?"
    )


def test_build_inputs_names_the_item_torch_cannot_build(monkeypatch):
    def fail(*args, **kwargs):
        raise MemoryError()

    model = build_demo_model(1)
    monkeypatch.setattr(torch, "randn", fail)
    with pytest.raises(ValueError) as info:
        build_inputs(parse_input_spec("long:2;x=float:4x4"), model, "cpu")
    assert str(info.value) == (
        "input item 'x=float:4x4': cannot create the tensor (64 B): MemoryError"
    )


def test_input_file_errors_are_one_line(tmp_path, capsys, monkeypatch):
    import pickle

    def corrupt(*args, **kwargs):
        raise pickle.UnpicklingError(
            "Weights only load failed. This file can still be loaded.\n"
            "(1) In PyTorch 2.6, we changed the default value of weights_only\n"
            "\x1b[1mWeightsUnpickler error:\x1b[0m Unsupported global"
        )

    (tmp_path / "bad.pt").write_bytes(b"x")
    monkeypatch.setattr(torch, "load", corrupt)
    rc = main(["report", "--input", f"@{tmp_path / 'bad.pt'}", "--out", str(tmp_path / "out")])
    assert rc == 2
    assert _err_line(capsys) == (
        f"execwrap: error: --input: input item '@{tmp_path / 'bad.pt'}': cannot load "
        f"'{tmp_path / 'bad.pt'}': UnpicklingError: Weights only load failed. This file can "
        "still be loaded.; is it a file written by torch.save of a tensor or a tuple/dict "
        "of tensors?"
    )


@pytest.mark.parametrize(
    "spec, value, message",
    [
        (
            "x=@f.pt",
            [torch.ones(2)],
            "input item 'x=@f.pt': 'f.pt' holds a list; x=@FILE needs a file holding one "
            "tensor (for several inputs use a positional @FILE holding a tuple or dict of "
            "tensors)",
        ),
        (
            "x=@f.pt",
            {"a": torch.ones(2)},
            "input item 'x=@f.pt': 'f.pt' holds a dict; x=@FILE needs a file holding one "
            "tensor (for several inputs use a positional @FILE holding a tuple or dict of "
            "tensors)",
        ),
        (
            "@f.pt",
            (torch.ones(2), 3),
            "input item '@f.pt': 'f.pt' holds a tuple whose item 1 is an int; "
            "expected tensors only",
        ),
        (
            "@f.pt",
            {"mask": [1, 2]},
            "input item '@f.pt': 'f.pt' holds a dict whose entry 'mask' is a list; "
            "expected tensors only",
        ),
        (
            "@f.pt",
            {0: torch.ones(1)},
            "input item '@f.pt': 'f.pt' holds a dict with key 0, which is not an argument name",
        ),
        (
            "@f.pt",
            7,
            "input item '@f.pt': 'f.pt' holds an int; expected a tensor, a list/tuple of "
            "tensors or a dict NAME -> tensor",
        ),
    ],
)
def test_input_file_contents_are_checked(spec, value, message, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    torch.save(value, "f.pt")
    with pytest.raises(ValueError) as info:
        build_inputs(parse_input_spec(spec), build_demo_model(1), "cpu")
    assert str(info.value) == message


def test_article():
    from execwrap.cli.text import article as _a

    assert [_a(w) for w in ("int", "dict", "object", "NoneType", "Linear", "unicode")] == [
        "an int", "a dict", "an object", "a NoneType", "a Linear", "a unicode",
    ]  # fmt: skip


def test_parse_policy_resolves_classes():
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy, always_wrap_policy

    model = build_demo_model(1)
    assert parse_policy("always", model) is always_wrap_policy
    policy = parse_policy("module:Block,LayerNorm", model)
    assert isinstance(policy, ModuleWrapPolicy)
    assert {c.__name__ for c in policy._module_classes} == {"Block", "LayerNorm"}
    transformer = parse_policy("transformer:execwrap.demo_models:Block", model)
    assert transformer.keywords["transformer_layer_cls"] == {Block}
    assert parse_policy("size:1K", model).keywords["min_num_params"] == 1000
    with pytest.raises(CLIError, match="classes present: .*Block"):
        parse_policy("module:Missing", model)
    with pytest.raises(CLIError, match="no class given"):
        parse_policy("module:", model)


# ------------------------------------------------------------- subprocesses
def _run(args: list[str], cwd: Path, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO), COLUMNS="100")
    return subprocess.run(
        [sys.executable, "-m", "execwrap", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_subprocess_bare_report(tmp_path):
    proc = _run(["report"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    assert {p.name for p in (tmp_path / "execwrap-report").iterdir()} == ALL_FILES | {SET_FOLDER}
    assert "capture" in proc.stdout and "symbolic" in proc.stdout


def test_subprocess_gpt2_report_falls_back_to_runtime(tmp_path):
    pytest.importorskip("transformers")
    proc = _run(
        ["report", "--model", f"{FACTORIES}:gpt2", "--input", "long:2x16",
         "--policy", "transformer:GPT2Block", "--out", str(tmp_path)],
        cwd=REPO,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    assert {p.name for p in tmp_path.iterdir()} == ALL_FILES | {SET_FOLDER}
    data = json.loads((tmp_path / "report.json").read_text())
    order = ExecutionOrder.from_dict(data["order"])
    assert order.capture_step == "zero-cost runtime"
    assert "symbolic tracing failed in module 'transformer' (GPT2Model)" in (
        order.fallback_reason or ""
    )
    assert order.param_backward_order  # runtime capture records gradients
    assert data["model_class"] == "GPT2LMHeadModel"
    assert data["plan"]["groups"] == [[""], ["transformer.h.0"], ["transformer.h.1"]]
    summary = _summary(proc.stdout)
    assert "runtime" in summary["capture"]
    assert "'transformer' (GPT2Model)" in summary["fallback reason"]
    html = (tmp_path / "report.html").read_text()
    assert "Symbolic tracing failed" in html


@pytest.mark.parametrize(
    "args, message",
    [
        (["report", "--model", "nosuch_pkg.f:g"], "cannot import module 'nosuch_pkg.f'"),
        (["report", "--model", f"{FACTORIES}:broken"], "config file missing: weights.bin"),
    ],
)
def test_subprocess_bad_input_one_line_exit_2(args, message, tmp_path):
    proc = _run(args, cwd=REPO)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("execwrap: error: ")
    assert message in proc.stderr
    assert proc.stdout == ""


def _param_edit(tmp_path: Path, data: dict, name: str, **info: object) -> Path:
    edited = json.loads(json.dumps(data))
    edited["params"][name].update(info)
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(edited))
    return path


def test_diff_reports_parameter_metadata(demo_report, tmp_path, capsys):
    data = json.loads(demo_report.read_text())["order"]
    same = "orders differ: same 40 module calls and parameter order, but "
    shape = _param_edit(tmp_path, data, "wte.weight", shape=[64, 256])  # same numel
    assert main(["diff", str(demo_report), str(shape)]) == 1
    assert capsys.readouterr().out == (
        same + "parameter 'wte.weight' differs: shape A [256, 64], B [64, 256]\n"
    )
    frozen = _param_edit(tmp_path, data, "wpe", dtype="bfloat16", requires_grad=False)
    assert main(["diff", str(frozen), str(demo_report)]) == 1
    assert capsys.readouterr().out == (
        same + "parameter 'wpe' differs: dtype A bfloat16, B float32; requires_grad A False, "
        "B True\n"
    )
    both = json.loads(frozen.read_text())
    both["params"]["blocks.0.ln1.bias"].update(numel=32, shape=[32])
    (tmp_path / "both.json").write_text(json.dumps(both))
    assert main(["diff", str(demo_report), str(tmp_path / "both.json")]) == 1
    assert capsys.readouterr().out == (
        same + "parameter 'wpe' differs: dtype A float32, B bfloat16; requires_grad A True, "
        "B False (1 more parameter differs)\n"
    )
    extra = json.loads(json.dumps(data))
    extra["params"]["extra"] = {"numel": 4, "dtype": "float32", "requires_grad": True, "shape": [4]}
    (tmp_path / "extra.json").write_text(json.dumps(extra))
    assert main(["diff", str(demo_report), str(tmp_path / "extra.json")]) == 1
    assert capsys.readouterr().out == same + "parameter 'extra' is only in B\n"
    untied = dict(data, shared_params={})
    (tmp_path / "untied.json").write_text(json.dumps(untied))
    assert main(["diff", str(demo_report), str(tmp_path / "untied.json")]) == 1
    assert capsys.readouterr().out == (
        same + "the tied names of parameter 'wte.weight' differ: A lm_head.weight, B none\n"
    )


def test_subprocess_diff_exit_1(demo_report, tmp_path):
    data = json.loads(demo_report.read_text())
    swap_calls(data["order"], 3, 4)
    other = tmp_path / "b.json"
    other.write_text(json.dumps(data))
    proc = _run(["diff", str(demo_report), str(other)], cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    assert "first divergence at forward call 3" in proc.stdout


# ------------------------------------------------------------------ fast start
#: Modules that ``--help`` and argument errors must not import (torch, and
#: what imports it: tracing's capture modules, networkx, numpy).
HEAVY = ("torch", "tracing", "networkx", "numpy")
#: tracing's torch-free modules, which the lazy package ``__init__`` files use.
TORCH_FREE = {"tracing", "tracing.lazy", "tracing.fqn", "tracing.checks"}


def _imported_modules(importtime_stderr: str) -> list[str]:
    """Module names from ``python -X importtime`` output."""
    return [
        line.split("|")[2].strip()
        for line in importtime_stderr.splitlines()
        if line.startswith("import time:") and line.count("|") == 2
    ][1:]  # (the first line is the header)


@pytest.mark.parametrize(
    "args, rc, message",
    [
        ([], 2, "a command is required"),
        (["--help"], 0, None),
        (["report", "--help"], 0, None),
        (["show", "--help"], 0, None),
        (["diff", "--help"], 0, None),
        (["report", "--nope"], 2, "unrecognized arguments: --nope"),
        (["report", "--bucket-size", "2Q"], 2, "--bucket-size: invalid element count '2Q'"),
        (["report", "--input", "long:2xq"], 2, "shape '2xq' must be sizes joined by 'x'"),
        (["report", "--input", "complex7:2"], 2, "unknown dtype 'complex7'"),
        (["report", "--input", "@missing.pt"], 2, "input file 'missing.pt' does not exist"),
        (["report", "--format", "json,pdf"], 2, "unknown format pdf"),
        (["report", "--prefetch", "-1"], 2, "--prefetch must be >= 0, got -1"),
        (["report", "--policy", "weird"], 2, "unknown policy"),
        (["report", "--policy", "size:lots"], 2, "invalid element count 'lots'"),
        (["report", "--model", "no_colon"], 2, "expected PKG.MODULE:NAME"),
        (["report", "--tracer", "tracers.py:T"], 2, "not a file path"),
        (["report", "--concrete-arg", "flag"], 2, "expected NAME=VALUE"),
        (["show", "missing.json"], 2, "missing.json: no such file"),
        (["diff", "a.json", "b.json", "--context", "-3"], 2, "--context must be >= 0, got -3"),
    ],
)
def test_help_and_argument_errors_do_not_import_torch(args, rc, message, tmp_path):
    (tmp_path / "a.json").write_text("{}")
    (tmp_path / "b.json").write_text("{}")
    env = dict(os.environ, PYTHONPATH=str(REPO), COLUMNS="100")
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "execwrap", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == rc, proc.stderr
    modules = _imported_modules(proc.stderr)
    assert "execwrap.cli.parser" in modules
    assert [m for m in modules if m.split(".")[0] in HEAVY and m not in TORCH_FREE] == []
    errors = [line for line in proc.stderr.splitlines() if not line.startswith("import time:")]
    if message is None:
        assert errors == [] and proc.stdout.startswith("usage: execwrap")
    else:
        assert len(errors) == 1 and errors[0].startswith("execwrap: error: ")
        assert message in errors[0]


def test_diff_negative_context_is_a_usage_error(demo_report, capsys):
    assert main(["diff", str(demo_report), str(demo_report), "--context", "-3"]) == 2
    assert _err_line(capsys) == "execwrap: error: --context must be >= 0, got -3"


def test_dtype_table_names_torch_dtypes():
    from execwrap.cli.input_spec import DTYPE_NAMES

    for name, attr in DTYPE_NAMES.items():
        dtype = getattr(torch, attr)
        assert isinstance(dtype, torch.dtype) and getattr(torch, name) is dtype
        assert parse_input_spec(f"{name}:2")[0].dtype is dtype
    assert {"long", "int", "float", "half", "bfloat16", "float64", "bool"} <= set(DTYPE_NAMES)


def test_a_closed_output_pipe_ends_quietly(demo_report: Path) -> None:
    """``execwrap show r.json | head``: the reader goes away; exit 141, no traceback."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "execwrap", "show", str(demo_report)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # before the command has written anything
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141
    assert err == ""


def test_an_input_the_model_cannot_take_is_one_line_on_stderr(tmp_path: Path) -> None:
    """The fake run fails inside torch's FakeTensorMode, which logs the kernel's
    traceback at ERROR before raising: that log is dropped, the error is one line."""
    proc = subprocess.run(
        [sys.executable, "-m", "execwrap", "report", "--input", "long:2x999", "--out", "r"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        "execwrap: error: capture failed: running GPT on --input 'long:2x999' raised "
        "RuntimeError: The size of tensor a (999) must match the size of tensor b (64) at "
        "non-singleton dimension 1 (in the root module <root> (GPT))"
    ]


# ------------------------------------------------------------- the current folder
HOSTILE = """import pathlib
pathlib.Path(__file__).with_name("IMPORTED").write_text("the stray tabulate.py ran")
raise ImportError("a stray tabulate.py")
"""


def _console_script() -> list[str]:
    """The installed ``execwrap`` command (not ``python -m``, which puts the current
    folder on ``sys.path`` itself), else ``python -P -m execwrap`` (3.11+)."""
    script = Path(sys.executable).with_name("execwrap")
    if script.is_file():
        return [str(script)]
    if sys.version_info < (3, 11):
        pytest.skip("no execwrap console script, and python -P needs 3.11")
    return [sys.executable, "-P", "-m", "execwrap"]


def test_report_never_imports_a_stray_module_from_the_current_folder(tmp_path):
    (tmp_path / "tabulate.py").write_text(HOSTILE)
    env = dict(os.environ, PYTHONPATH=str(REPO), COLUMNS="100")
    proc = subprocess.run(
        [*_console_script(), "report", "--format", "json"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert not (tmp_path / "IMPORTED").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["execwrap-report", "tabulate.py"]


def test_a_model_module_named_in_the_current_folder_is_found(tmp_path, monkeypatch):
    (tmp_path / "my_model_here.py").write_text(
        "import torch.nn as nn\n\ndef make():\n    return nn.Sequential(nn.Linear(4, 4))\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    out = tmp_path / "r"
    assert (
        main(["report", "--model", "my_model_here:make", "--out", str(out), "--format", "json"])
        == 0
    )
    assert sys.path[-1] == str(tmp_path)  # the folder of the module named, at the end
    assert json.loads((out / "report.json").read_text())["plan"]["groups"] == [[""], ["0"]]
    monkeypatch.delitem(sys.modules, "my_model_here")
