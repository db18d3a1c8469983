"""``execwrap fit`` on a transformers config: the answer, the files, the recipes that
train, a step that does not fit (exit status 1), and bad input (exit status 2, one
error line).

The plain-FSDP2 and transformers recipes are run as written, by ``torchrun`` on 2 gloo
ranks on CPU, from the files ``execwrap fit --out`` wrote for a tiny Llama.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from execwrap.cli import main
from tests.integrations._frameworks import tiny_llama

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """A tiny Llama's weights and config.json (what from_pretrained loads)."""
    path = tmp_path_factory.mktemp("tiny")
    tiny_llama().save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def out(folder: Path, tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("fit")
    argv = ["fit", str(folder / "config.json"), "--sequence-length", "16", "--micro-batch", "2"]
    stdout = _run_main([*argv, "--out", str(out), "--json"])
    return out, json.loads(stdout)


def _run_main(argv: list[str]) -> str:
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(argv) == 0
    return buf.getvalue()


def test_fit_answers_and_writes_the_files(out: tuple[Path, dict]) -> None:
    folder, data = out
    assert (data["fits"], data["micro_batch"], data["sequence_length"]) == (True, 2, 16)
    assert (data["precision"], data["cluster"]["world_size"], data["parameters"]) == (
        "bf16",
        8,
        2 * 128 * 32 + 2 * (4 * 32 * 32 - 2 * 32 * 16 + 3 * 32 * 64 + 2 * 32) + 32,
    )  # embeddings and lm_head, two layers (q, k, v, o; the MLP; two norms), the norm
    assert data["plan"]["groups"][0] == [""]
    assert data["tokens_per_s_per_gpu"] == 2 * 16 / data["step_time_s"]
    names = sorted(p.name for p in folder.iterdir())
    assert names == [
        ".execwrap-written.json", "fit.html", "fit.json", "plan.json", "recipe_accelerate.py", "recipe_fsdp2.py",
        "recipe_lightning.py", "recipe_torchtitan.py", "recipe_transformers.py",
    ]  # fmt: skip
    assert json.loads((folder / "fit.json").read_text()) == data


@pytest.mark.parametrize("framework", ["fsdp2", "transformers"])
def test_recipe_trains_on_two_ranks(out: tuple[Path, dict], framework: str) -> None:
    folder, _ = out
    script = folder / f"recipe_{framework}.py"
    text = script.read_text().replace("STEPS = 16, 2, 10", "STEPS = 16, 2, 3")
    assert text != script.read_text()
    run = folder / f"run_{framework}.py"
    run.write_text(text)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
           "--master-port", str(_free_port()), str(run)]  # fmt: skip
    done = subprocess.run(cmd, cwd=folder, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    losses = [float(x) for x in re.findall(r"^step \d: loss (\S+)$", done.stdout, re.M)]
    assert len(losses) == 3, done.stdout
    assert losses[2] < losses[1] < losses[0]  # the same batch three times: it trains


#: The Llama-3.1-8B-shaped config of docs/guide/fit.md (the model's own numbers).
LLAMA_8B = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
    "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
    "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 128256,
    "max_position_embeddings": 131072, "rms_norm_eps": 1e-05, "rope_theta": 500000.0,
    "tie_word_embeddings": False, "hidden_act": "silu",
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
}  # fmt: skip


@pytest.fixture(scope="module")
def llama_8b(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("llama-8b") / "config.json"
    path.write_text(json.dumps(LLAMA_8B))
    return path


def test_a_plan_is_priced_in_the_asked_precision(
    folder: Path, out: tuple[Path, dict], tmp_path: Path, capsys
) -> None:
    """``--plan`` made in bf16 with ``--precision fp32``: the plan's groups and step, its
    order recorded and priced in fp32 (as the plan searched in fp32 is); without
    ``--precision`` a plan is priced in its own precision."""
    config = str(folder / "config.json")
    argv = ["fit", config, "--sequence-length", "16", "--micro-batch", "2", "--json"]
    status, text = _status(
        [*argv, "--plan", str(out[0] / "plan.json"), "--precision", "fp32"], capsys
    )
    priced = json.loads(text)
    assert (status, priced["precision"], priced["given_plan"]) == (0, "fp32", True)
    assert priced["plan"]["training"]["precision"]["param_dtype"] is None  # fp32: no casts
    assert priced["plan"]["groups"] == out[1]["plan"]["groups"]
    status, text = _status([*argv, "--precision", "fp32", "--out", str(tmp_path)], capsys)
    searched = json.loads(text)
    assert (status, searched["peak_memory_bytes"]) == (0, priced["peak_memory_bytes"])
    assert priced["peak_memory_bytes"] > out[1]["peak_memory_bytes"]  # fp32 weighs more
    status, text = _status([*argv, "--plan", str(tmp_path / "plan.json")], capsys)
    again = json.loads(text)
    assert (status, again["precision"], again["peak_memory_bytes"]) == (
        0, "fp32", priced["peak_memory_bytes"],
    )  # fmt: skip


def _status(argv: list[str], capsys) -> tuple[int, str]:
    status = main(argv)
    return status, capsys.readouterr().out


def test_fit_at_the_least_memory_plan_reports_its_micro_batch(llama_8b: Path, capsys) -> None:
    """In 10 GiB the planner fits micro-batch 1 only with its least-memory plan (per-unit,
    prefetch 0, full checkpointing, CPU offload, the root not resharded after forward, as
    FSDP2 leaves it); the largest micro-batch is priced from that same plan, so it is 1,
    not "none" (it was when the root was priced as resharded too: 11100373012 bytes)."""
    status, out = _status(["fit", str(llama_8b), "--memory-budget", "10GiB", "--json"], capsys)
    data = json.loads(out)
    assert status == 0
    assert (data["micro_batch"], data["fits"], data["peak_memory_bytes"]) == (1, True, 10664116244)
    plan = data["plan"]
    assert (plan["label"], plan["prefetch"], plan["reshard_after_forward"]) == (
        "per-unit, prefetch 0, full checkpointing; CPU offload",
        0,
        [False] + [True] * 32,
    )  # the root, then the 32 layers
    assert data["largest_micro_batch"] == 1
    assert data["tried"] == [[1, 10664116244], [2, 18176196620]]
    assert data["largest_micro_batch"] >= data["micro_batch"]  # fits at m: largest >= m


def test_a_step_that_does_not_fit_exits_1(llama_8b: Path, capsys) -> None:
    """A finding, as ``execwrap diff``'s: the answer as usual, exit status 1."""
    status, out = _status(["fit", str(llama_8b), "--memory-budget", "5GiB"], capsys)
    assert status == 1
    lines = out.splitlines()
    assert "  fits                 no: no plan within 5.00 GiB per GPU" in lines
    assert "  largest micro-batch  none: not even 1 fits" in lines
    assert lines[-1].startswith(
        "why: no plan fits the memory budget of 5.00 GiB (5368709120 bytes) per rank: the "
        "smallest peak any candidate reaches is 9.93 GiB (10664116244 bytes)"
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _error(argv: list[str], capsys) -> str:
    assert main(argv) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and err[0].startswith("execwrap: error: "), err
    return err[0]


def test_unknown_model_id_offline(capsys, monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    line = _error(["fit", "no-such-org/no-such-model"], capsys)
    assert line.startswith(
        "execwrap: error: model id 'no-such-org/no-such-model': its config.json is not in the "
        "Hugging Face cache and could not be fetched (cannot resolve huggingface.co: this "
        "machine is offline). Only config.json is needed, no weights: download "
        "https://huggingface.co/no-such-org/no-such-model/resolve/main/config.json on a "
        "machine that is online and pass its path (execwrap fit path/to/config.json)"
    )


@pytest.mark.parametrize(
    ("model", "why"),
    [
        ("nosuchdir/", "it ends with '/'"),
        ("./nosuchdir", "it starts with './'"),
        ("../nosuchdir", "it starts with '../'"),
        ("/no/such/dir", "it starts with '/'"),
        ("~nosuchuser", "it starts with '~'"),
        ("nosuch.json", "it ends in '.json'"),
        ("a/b/c", "it has more than one '/'"),
    ],
)
def test_a_path_that_does_not_exist(model: str, why: str, capsys, monkeypatch) -> None:
    """Clearly a path: no such file or folder, never a Hub download of it as a model id."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert _error(["fit", model], capsys) == (
        f"execwrap: error: no such file or folder: {model!r} (read as a path: {why}; a "
        "Hugging Face model id looks like 'org/name'); pass an existing config.json or the "
        "folder holding it"
    )


def test_config_transformers_cannot_build(folder: Path, tmp_path: Path, capsys) -> None:
    config = json.loads((folder / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "hidden_act": "no-such-act"}))
    line = _error(["fit", str(tmp_path / "config.json")], capsys)
    assert line == (
        "execwrap: error: transformers cannot build AutoModelForCausalLM from this LlamaConfig "
        "(model_type 'llama'): KeyError: 'no-such-act'"
    )


def test_config_file_that_is_not_a_config(tmp_path: Path, capsys) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 64}))
    line = _error(["fit", str(tmp_path / "config.json")], capsys)
    assert line.startswith(
        f"execwrap: error: transformers cannot read the config '{tmp_path}/config.json'"
    )


def test_plan_file_for_another_model(
    folder: Path, out: tuple[Path, dict], tmp_path: Path, capsys
) -> None:
    config = json.loads((folder / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 3}))
    line = _error(
        ["fit", str(tmp_path / "config.json"), "--plan", str(out[0] / "plan.json")], capsys
    )
    assert line == (
        f"execwrap: error: --plan {out[0] / 'plan.json'} was made for another model than this "
        "LlamaForCausalLM: the first module that differs is 'model.layers.2', which only "
        "LlamaForCausalLM has. Run execwrap fit without --plan to plan this model, or pass the "
        "MODEL the plan was made for"
    )


def test_missing_plan_file_and_bad_counts(capsys) -> None:
    line = _error(["fit", "x/config.json", "--plan", "no-such-plan.json"], capsys)
    assert (
        line
        == "execwrap: error: --plan 'no-such-plan.json': no such file (a plan.json from execwrap.save_plan)"
    )
    assert _error(["fit", "x/config.json", "--micro-batch", "0"], capsys) == (
        "execwrap: error: --micro-batch must be >= 1, got 0"
    )


def test_a_config_without_transformers_installed(capsys, monkeypatch) -> None:
    """transformers missing (as after the README's first set-up): one line saying what to
    install, exit 2."""
    for name in list(sys.modules):
        if name == "transformers" or name.startswith("execwrap.integrations.transformers"):
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "transformers", None)  # import raises ModuleNotFoundError
    assert _error(["fit", "x/config.json"], capsys) == (
        "execwrap: error: fit: 'x/config.json' is read as a transformers model id or "
        "config.json, and building a model from it needs transformers, which is not "
        "installed: pip install 'transformers>=5.0' (or pip install -e '.[integrations]'); "
        "or pass a factory 'module:function' that returns your nn.Module"
    )
