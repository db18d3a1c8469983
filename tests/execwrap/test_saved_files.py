"""Malformed saved files: ``show`` and ``diff`` exit 2 with one line naming the file and the field.

Each case damages a valid ``report.json`` the way the adversarial review did
(issue 15); the one-line message is asserted exactly. The same checks guard
:meth:`ExecutionOrder.load`, which raises ``ValueError`` with the same text.
"""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from torch.distributed.fsdp import FSDPModule
from torch.distributed.fsdp.wrap import ModuleWrapPolicy

from execwrap import PlanError, WrapPlan, apply_fully_shard, plan_wrap
from execwrap.cli import main
from execwrap.demo_models import Block, build_demo_model
from tracing import ExecutionOrder

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("saved") / "r"
    assert main(["report", "--out", str(out), "--format", "json"]) == 0
    return out / "report.json"


def _set(path: tuple[Any, ...], value: Any) -> Callable[[dict], None]:
    def edit(data: dict) -> None:
        node = data
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value

    return edit


def _param_field(field: str, value: Any) -> Callable[[dict], None]:
    def edit(data: dict) -> None:
        data["order"]["params"]["wte.weight"][field] = value

    return edit


# (id, edit of the parsed report or None, raw text replacement or None, message after the path)
CASES: list[tuple[str, Any, Any, str]] = [
    (
        "nested-100000-deep",
        None,
        "[" * 100_000 + "]" * 100_000,
        "not valid JSON (nested too deeply to read)",
    ),
    (
        "int-over-digit-limit",
        None,
        "1" * 5000,
        "not valid JSON (Exceeds the limit (4300 digits) for integer string conversion: "
        "value has 5000 digits; use sys.set_int_max_str_digits() to increase the limit)",
    ),
    (
        "numel-1e999",
        _param_field("numel", "INF"),
        None,
        "malformed ExecutionOrder: field order.params['wte.weight'].numel: expected an int "
        ">= 0 (elements), got float inf",
    ),
    (
        "bucket-size-1e999",
        _set(("plan", "bucket_numel"), "INF"),
        None,
        "malformed WrapPlan: field plan.bucket_numel: expected an int >= 1 (elements), "
        "got float inf",
    ),
    (
        "string-in-stats",
        _set(("plan", "stats", "peak_unsharded_bytes"), "big"),
        None,
        "malformed WrapPlan: field plan.stats.peak_unsharded_bytes: expected an int >= 0 "
        "(bytes), got str 'big'",
    ),
    (
        "report-schema-version-true",
        _set(("schema_version",), True),
        None,
        "unsupported execwrap report schema_version True (this execwrap reads version 1); "
        "write the report again with this version's 'execwrap report'",
    ),
    (
        "report-schema-version-1.0",
        _set(("schema_version",), 1.0),
        None,
        "unsupported execwrap report schema_version 1.0 (this execwrap reads version 1); "
        "write the report again with this version's 'execwrap report'",
    ),
    (
        "plan-schema-version-true",
        _set(("plan", "schema_version"), True),
        None,
        "unsupported WrapPlan schema_version True (this execwrap reads 1, 2, 3); build the plan "
        "again with plan_wrap",
    ),
    (
        "order-schema-version-1.0",
        _set(("order", "schema_version"), 1.0),
        None,
        "malformed ExecutionOrder: field order.schema_version: expected an int layout version "
        "(1, 2 or 3), got float 1.0",
    ),
    (
        "order-schema-version-true",
        _set(("order", "schema_version"), True),
        None,
        "malformed ExecutionOrder: field order.schema_version: expected an int layout version "
        "(1, 2 or 3), got bool True",
    ),
    (
        "negative-numel",
        _param_field("numel", -5),
        None,
        "malformed ExecutionOrder: field order.params['wte.weight'].numel: expected an int "
        ">= 0 (elements), got int -5",
    ),
    (
        "unknown-dtype",
        _param_field("dtype", "float33"),
        None,
        "malformed ExecutionOrder: field order.params['wte.weight'].dtype: unknown dtype "
        "'float33' (expected a torch dtype name such as 'float32')",
    ),
    (
        "bool-requires-grad-as-int",
        _param_field("requires_grad", 1),
        None,
        "malformed ExecutionOrder: field order.params['wte.weight'].requires_grad: expected "
        "true or false, got int 1",
    ),
    (
        "call-index-past-the-end",
        _set(("order", "param_uses", 0, "call_index"), 999),
        None,
        "malformed ExecutionOrder: field order.param_uses[0].call_index: call 999 is past the "
        "end of module_forward_order (40 calls)",
    ),
    (
        "plan-unit-names-unknown-module",
        _set(("plan", "units", 1, "module_fqns"), ["ghost"]),
        None,
        "malformed WrapPlan: field plan.units[1].module_fqns[0]: names module 'ghost', which "
        "the order does not have",
    ),
    (
        "plan-unit-names-unknown-parameter",
        _set(("plan", "units", 0, "param_fqns"), ["wte.weight", "ghost.weight"]),
        None,
        "malformed WrapPlan: field plan.units[0].param_fqns[1]: names parameter 'ghost.weight', "
        "which the order does not have",
    ),
    (
        "unit-last-use-past-the-end",
        _set(("plan", "units", 0, "last_use"), 40),
        None,
        "malformed WrapPlan: field plan.units[0].last_use: call 40 is past the end of the "
        "order's module_forward_order (40 calls)",
    ),
    (
        "unit-use-range-half-null",
        _set(("plan", "units", 0, "first_use"), None),
        None,
        "malformed WrapPlan: field plan.units[0].first_use: first_use None and last_use 39 are "
        "not a range of calls (both null, or first_use <= last_use)",
    ),
    (
        "call-name-not-a-string",
        _set(("order", "module_forward_order", 3), 7),
        None,
        "malformed ExecutionOrder: field order.module_forward_order[3]: expected a string, "
        "got int 7",
    ),
    (
        "nan-prefetch",
        _set(("prefetch",), "NAN"),
        None,
        "malformed report: field prefetch: expected an int >= 0 (units ahead), got float nan",
    ),
    (
        "stats-list-of-strings",
        _set(("plan", "stats", "bytes_per_all_gather"), ["1"]),
        None,
        "malformed WrapPlan: field plan.stats.bytes_per_all_gather[0]: expected an int >= 0 "
        "(bytes), got str '1'",
    ),
    (
        "baseline-groups-not-lists",
        _set(("baselines", "transformer:Block (no buckets)", "groups"), "x"),
        None,
        "malformed report: field baselines['transformer:Block (no buckets)'].groups: expected "
        "a list, got str 'x'",
    ),
    # ---- fields that contradict each other (issue: saved plans that contradict themselves)
    (
        "same-parameters-in-two-units",
        lambda d: d["plan"]["units"][1].update(param_fqns=d["plan"]["units"][2]["param_fqns"]),
        None,
        "malformed WrapPlan: field plan.units[2].param_fqns[0]: names parameter "
        "'blocks.2.ln1.weight', which plan.units[1] holds too; a parameter is in at most one unit",
    ),
    (
        "parameter-twice-in-one-unit",
        lambda d: d["plan"]["units"][0]["param_fqns"].append("wpe"),
        None,
        "malformed WrapPlan: field plan.units[0].param_fqns[4]: names parameter 'wpe', which "
        "plan.units[0] holds too; a parameter is in at most one unit",
    ),
    (
        "module-in-two-units",
        _set(("plan", "units", 2, "module_fqns"), ["blocks.1", "blocks.2", "blocks.3"]),
        None,
        "malformed WrapPlan: field plan.units[2].module_fqns[0]: names module 'blocks.1', which "
        "plan.units[1] has too; a module is in at most one unit",
    ),
    (
        "unit-numel-not-its-parameters",
        _set(("plan", "units", 1, "numel"), 5),
        None,
        "malformed WrapPlan: field plan.units[1].numel: 5 elements, but its 24 parameters have "
        "99968 (order.params)",
    ),
    (
        "unit-bytes-not-its-parameters",
        _set(("plan", "units", 1, "bytes"), 7),
        None,
        "malformed WrapPlan: field plan.units[1].bytes: 7 bytes, but its 24 parameters have "
        "399872 (order.params)",
    ),
    (
        "unit-first-use-not-the-orders",
        _set(("plan", "units", 1, "first_use"), 3),
        None,
        "malformed WrapPlan: field plan.units[1].first_use: calls 3..19, but the order's calls "
        "of its modules and uses of its parameters span 2..19",
    ),
    (
        "no-root-unit",
        lambda d: d["plan"]["units"].pop(0),
        None,
        "malformed WrapPlan: field plan.units: has no root unit (module ''); every plan has one",
    ),
    (
        "empty-unit",
        _set(("plan", "units", 1, "module_fqns"), []),
        None,
        "malformed WrapPlan: field plan.units[1].module_fqns: is empty; a unit wraps a module",
    ),
    (
        "atomic-unit-missing-a-parameter",
        lambda d: d["plan"]["atomic_units"][1]["param_fqns"].pop(),
        None,
        "malformed WrapPlan: field plan.atomic_units[1].numel: 49984 elements, but its 11 "
        "parameters have 49920 (order.params)",
    ),
    (
        "atomic-unit-of-no-unit",
        lambda d: d["plan"]["atomic_units"][1].update(module_fqns=["blocks.0.mlp"], first_use=8),
        None,
        "malformed WrapPlan: field plan.atomic_units[1].module_fqns[0]: names module "
        "'blocks.0.mlp', which no unit of plan.units has",
    ),
    (
        "policy-fqn-unknown",
        lambda d: d["plan"]["policy_fqns"].append("ghost"),
        None,
        "malformed WrapPlan: field plan.policy_fqns[5]: names module 'ghost', which the order "
        "does not have",
    ),
    (
        "stats-num-units-99",
        _set(("plan", "stats", "num_units"), 99),
        None,
        "malformed WrapPlan: field plan.stats.num_units: is 99, but the plan's units give 3 "
        "(derived from plan.units, not read)",
    ),
    (
        "stats-peak-edited",
        _set(("plan", "stats", "peak_unsharded_bytes"), 1),
        None,
        "malformed WrapPlan: field plan.stats.peak_unsharded_bytes: is 1, but the plan's units "
        "give 882176 (derived from plan.units, not read)",
    ),
    (
        "groups-edited",
        _set(("plan", "groups", 1), ["blocks.0"]),
        None,
        "malformed WrapPlan: field plan.groups: is [[''], ['blocks.0'], ['blocks.2', 'blocks.3']], "
        "but the plan's units give [[''], ['blocks.0', 'blocks.1'], ['blocks.2', 'blocks.3']] "
        "(derived from plan.units, not read)",
    ),
    (
        "fsdp1-modules-edited",
        _set(("plan", "fsdp1_modules"), [""]),
        None,
        "malformed WrapPlan: field plan.fsdp1_modules: is [''], but the plan's units give "
        "['', 'blocks.0', 'blocks.1', 'blocks.2', 'blocks.3'] (derived from plan.units, not read)",
    ),
    (
        "forward-call-of-unknown-module",
        _set(("order", "module_forward_order", 3), "ghost"),
        None,
        "malformed ExecutionOrder: field order.module_forward_order[3]: names module 'ghost', "
        "which order.module_classes does not have",
    ),
    (
        "use-of-unknown-parameter",
        _set(("order", "param_uses", 2, "param_fqns", 1), "ghost.bias"),
        None,
        "malformed ExecutionOrder: field order.param_uses[2].param_fqns[1]: names parameter "
        "'ghost.bias', which order.params does not have",
    ),
    (
        "use-not-of-its-call",
        _set(("order", "param_uses", 0, "module_fqn"), "blocks.0"),
        None,
        "malformed ExecutionOrder: field order.param_uses[0].module_fqn: names module "
        "'blocks.0', but call 1 of order.module_forward_order is 'wte'",
    ),
    (
        "param-forward-order-not-the-first-uses",
        _set(("order", "param_forward_order", 0), "wpe"),
        None,
        "malformed ExecutionOrder: field order.param_forward_order[0]: is 'wpe', but the first "
        "uses in order.param_uses give 'wte.weight' there (each parameter's first use, in order)",
    ),
    (
        "numel-not-the-shapes",
        _param_field("numel", 5),
        None,
        "malformed ExecutionOrder: field order.params['wte.weight'].numel: 5 elements, but its "
        "shape [256, 64] has 16384",
    ),
    (
        "tied-to-another-shape",
        _set(("order", "shared_params", "wte.weight"), ["blocks.0.attn.qkv.weight"]),
        None,
        "malformed ExecutionOrder: field order.shared_params['wte.weight'][0]: ties 'wte.weight' "
        "(shape [256, 64], float32) to 'blocks.0.attn.qkv.weight', a parameter of shape "
        "[192, 64], float32; tied names are one tensor, of one shape and dtype",
    ),
    (
        "tied-to-a-parameter-of-its-own",
        _set(("order", "shared_params", "blocks.0.ln1.weight"), ["blocks.0.ln1.bias"]),
        None,
        "malformed ExecutionOrder: field order.shared_params['blocks.0.ln1.weight'][0]: names "
        "'blocks.0.ln1.bias', which order.params lists as a parameter of its own; an alias of "
        "a tied parameter is not a canonical FQN",
    ),
    (
        "tied-to-unknown-parameter",
        _set(("order", "shared_params"), {"ghost.weight": ["lm_head.weight"]}),
        None,
        "malformed ExecutionOrder: field order.shared_params['ghost.weight']: names parameter "
        "'ghost.weight', which order.params does not have",
    ),
    (
        "alias-of-two-parameters",
        _set(("order", "shared_params", "wpe"), ["lm_head.weight"]),
        None,
        "malformed ExecutionOrder: field order.shared_params.wpe[0]: names 'lm_head.weight', "
        "which order.shared_params['wte.weight'] names too; a name is an alias of one parameter",
    ),
    (
        "model-class-not-the-orders",
        _set(("model_class",), "Llama"),
        None,
        "malformed report: field model_class: is 'Llama', but order.module_classes[''] is 'GPT'",
    ),
    (
        "plan-stats-at-another-prefetch",
        _set(("plan", "stats", "prefetch"), 2),
        None,
        "malformed report: field plan.stats.prefetch: is 2, but the report's prefetch is 1",
    ),
    (
        "baseline-stats-at-another-prefetch",
        _set(("baselines", "always", "stats", "prefetch"), 0),
        None,
        "malformed report: field baselines.always.stats.prefetch: is 0, but the report's "
        "prefetch is 1",
    ),
    (
        "baseline-group-of-unknown-module",
        _set(("baselines", "always", "groups", 1), ["ghost"]),
        None,
        "malformed report: field baselines.always.groups[1][0]: names module 'ghost', which the "
        "order does not have",
    ),
]


def _write(report: Path, tmp_path: Path, edit: Any, raw: Any) -> Path:
    if raw is None:
        data = json.loads(report.read_text())
        edit(data)
        text = json.dumps(data).replace('"INF"', "1e999").replace('"NAN"', "NaN")
    else:
        text = raw
    path = tmp_path / "bad.json"
    path.write_text(text)
    return path


@pytest.mark.parametrize("edit, raw, message", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_malformed_file_exits_2_with_one_line(report, tmp_path, capsys, edit, raw, message):
    path = _write(report, tmp_path, edit, raw)
    expected = f"execwrap: error: {path}: {message}\n"
    assert main(["show", str(path)]) == 2
    assert capsys.readouterr() == ("", expected)
    assert main(["diff", str(report), str(path)]) == 2
    assert capsys.readouterr() == ("", expected)


def test_load_gives_the_same_message(report, tmp_path):
    path = _write(report, tmp_path, _param_field("dtype", "float33"), None)
    with pytest.raises(ValueError) as info:
        ExecutionOrder.load(path)
    assert str(info.value) == (
        f"{path}: malformed ExecutionOrder: field order.params['wte.weight'].dtype: unknown "
        "dtype 'float33' (expected a torch dtype name such as 'float32')"
    )
    path.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ValueError, match=r"bad\.json: not valid JSON \(nested too deeply"):
        ExecutionOrder.load(path)
    path.write_bytes(b'{"schema_version": 1, "method": "\xff"}')
    with pytest.raises(ValueError, match=r"bad\.json: not UTF-8 text \(invalid start byte at"):
        ExecutionOrder.load(path)


def test_negative_context_is_a_usage_error(report, capsys):
    assert main(["diff", str(report), str(report), "--context", "-3"]) == 2
    assert capsys.readouterr().err == "execwrap: error: --context must be >= 0, got -3\n"


def test_not_utf8(report, tmp_path, capsys):
    path = tmp_path / "latin1.json"
    path.write_bytes(b'{"schema_version": 1, "title": "caf\xe9"}')
    assert main(["show", str(path)]) == 2
    assert capsys.readouterr().err == (
        f"execwrap: error: {path}: not UTF-8 text (invalid continuation byte at byte 35)\n"
    )


def test_no_traceback_in_a_real_process(report, tmp_path):
    path = _write(report, tmp_path, None, "[" * 100_000 + "]" * 100_000)
    proc = subprocess.run(
        [sys.executable, "-m", "execwrap", "show", str(path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == f"execwrap: error: {path}: not valid JSON (nested too deeply to read)\n"


def test_from_dict_gives_the_same_message_and_apply_fully_shard_refuses(report):
    data = json.loads(report.read_text())
    order = ExecutionOrder.from_dict(data["order"], prefix="order")
    units = data["plan"]["units"]
    units[1]["param_fqns"] = units[2]["param_fqns"]
    with pytest.raises(ValueError) as info:
        WrapPlan.from_dict(data["plan"], order, source="r.json", prefix="plan")
    assert str(info.value) == (
        "r.json: malformed WrapPlan: field plan.units[2].param_fqns[0]: names parameter "
        "'blocks.2.ln1.weight', which plan.units[1] holds too; a parameter is in at most one unit"
    )
    # a plan built in memory with the same overlap: refused before anything is wrapped
    model = build_demo_model()
    plan = plan_wrap(model, order, ModuleWrapPolicy({Block}), bucket_numel=100_000)
    bad = dataclasses.replace(
        plan,
        units=[
            plan.units[0],
            dataclasses.replace(plan.units[1], param_fqns=plan.units[2].param_fqns),
            plan.units[2],
        ],
    )
    message = (
        "apply_fully_shard: parameter 'blocks.2.ln1.weight' is in two units (blocks.0+blocks.1 "
        "and blocks.2+blocks.3) of the plan; FSDP would shard it twice. Build the plan again "
        "with plan_wrap (a saved plan was edited?)"
    )
    with pytest.raises(PlanError, match=re.escape(message)):
        apply_fully_shard(model, bad)
    assert not isinstance(model, FSDPModule)
