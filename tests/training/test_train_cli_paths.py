"""`cupid train export` and `cupid train check` as a user runs them, one stage each, on the tiny recipe's outputs.

The run directory is made by the CLI as well (`cupid train label`, `cupid train sft`: the instant-answer server as
candidate, decomposer and teacher, 4 QLoRA steps) on configs/train/tiny.yaml with the random-weight model as its base
(the recipe's mechanics are what is checked, as in test_training.py, whose module fixture another file cannot share).
The check measures the export only (`agreement.baseline` and `agreement.adapter` off): one vLLM start instead of two;
base and adapter on one server are test_training.py's. Each bad input is refused with the CLI's exit code 2, one
line naming the path and the command to run first, no traceback, and nothing started or written.
"""

from __future__ import annotations

import json
import shutil

import pytest
import yaml
from typer.testing import CliRunner

from cupid.cli import app
from tests.conftest import REPO

TINY = REPO / "configs" / "train" / "tiny.yaml"
runner = CliRunner()


def _invoke(*args: str):
    result = runner.invoke(app, list(args))
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return result


@pytest.fixture(scope="module")
def trained(random_model_dir, tmp_path_factory):
    """configs/train/tiny.yaml on the random-weight base, labelled and fine-tuned through the CLI into `--out`."""
    work = tmp_path_factory.mktemp("train-cli")
    recipe = yaml.safe_load(TINY.read_text())
    recipe["base_model"] = str(random_model_dir)
    recipe["labelling"]["cache"] = str(work / "cache.sqlite")
    recipe["agreement"] |= {"baseline": False, "adapter": False}
    config = work / "tiny.yaml"
    config.write_text(yaml.safe_dump(recipe))
    out = work / "run"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CUPID_HOME", str(work / "home"))
        for stage in ("label", "sft"):
            result = _invoke("train", stage, "-c", str(config), "--out", str(out))
            assert result.exit_code == 0, result.output
    assert (out / "adapter" / "adapter_config.json").is_file() and not (out / "export").exists()
    return config, out


@pytest.fixture(scope="module")
def exported(trained):
    config, out = trained
    result = _invoke("train", "export", "-c", str(config), "--out", str(out))
    assert result.exit_code == 0, result.output
    return config, out, result


def test_export_writes_a_loadable_merged_model_and_names_it(exported, random_model_dir):
    _, out, result = exported
    export = out / "export"
    for name in ("config.json", "model.safetensors", "tokenizer.json", "chat_template.jinja", "generation_config.json"):
        assert (export / name).is_file(), name
    assert not (out / "export.partial").exists()
    # stdout is the report written beside the run, as JSON (a pipe to jq reads it); stderr says where it went
    report = json.loads((out / "export_report.json").read_text())
    assert json.loads(result.stdout) == report
    assert report["export"] == str(export) and report["adapter"] == str(out / "adapter")
    assert report["base_model"] == str(random_model_dir) and report["dtype"] == "float32"
    assert report["method"].startswith("dequantize-then-merge")  # tiny.yaml trains in NF4
    assert report["merge_check"]["same_next_token"] and report["merge_check"]["max_abs_logit_diff"] < 1e-3
    assert f"-> {export} (float32" in result.stderr
    assert report["serve"]["merged"] == f"vllm serve {export} --served-model-name prefmatcher-tiny"
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    merged = AutoConfig.from_pretrained(export)
    base = AutoConfig.from_pretrained(random_model_dir)
    assert (merged.model_type, merged.hidden_size, merged.num_hidden_layers) == (
        base.model_type,
        base.hidden_size,
        base.num_hidden_layers,
    )
    assert not hasattr(merged, "quantization_config")
    tok = AutoTokenizer.from_pretrained(export)
    assert tok.convert_tokens_to_ids(report["end_of_turn_token"]) in report["eos_token_id"]
    model = AutoModelForCausalLM.from_pretrained(export)  # the merged weights, plain (no peft, no bitsandbytes)
    assert model.dtype == torch.float32 and not any("lora" in name for name, _ in model.named_parameters())


def test_export_before_training_names_the_missing_adapter_and_writes_nothing(tmp_path):
    out = tmp_path / "run"
    result = _invoke("train", "export", "-c", str(TINY), "--out", str(out))
    assert result.exit_code == 2, result.output
    assert f"error: {out / 'adapter'}: no trained adapter here; run `cupid train sft --config {TINY}` first" in (
        result.stderr
    )
    assert result.stdout == "" and "Traceback" not in result.output
    assert not (out / "export").exists() and not (out / "export_report.json").exists()


def test_check_before_labelling_names_the_missing_match_data(tmp_path):
    out = tmp_path / "run"
    result = _invoke("train", "check", "-c", str(TINY), "--out", str(out))
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert f"error: {out / 'data' / 'validation.jsonl'}: match-data file not found (`cupid train label` makes it)" in (
        result.stderr
    )


def test_check_before_export_names_the_missing_export_and_starts_no_server(trained, tmp_path, cupid_home):
    config, trained_out = trained
    out = tmp_path / "run"
    out.mkdir()
    for part in ("data", "adapter"):  # what label and sft left, without an export
        shutil.copytree(trained_out / part, out / part)
    result = _invoke("train", "check", "-c", str(config), "--out", str(out))
    assert result.exit_code == 2, result.output
    assert f"error: {out / 'export'}: no exported model here; run `cupid train export --config {config}` first" in (
        result.stderr
    )
    assert "Traceback" not in result.output and not (out / "agreement.json").exists()
    assert _invoke("serve", "status").stdout.strip() == "no servers"
    assert not (cupid_home / "servers").exists() or not any((cupid_home / "servers").glob("*.json"))


def test_check_prints_the_agreement_it_writes_and_leaves_no_server(exported, cupid_home):
    config, out, _ = exported
    result = _invoke("train", "check", "-c", str(config), "--out", str(out))
    assert result.exit_code == 0, result.output
    report = json.loads((out / "agreement.json").read_text())
    assert set(report) & {"base", "adapter", "trained"} == {"trained"}  # baseline and adapter off
    trained = report["trained"]
    assert trained["model"] == str((out / "export").resolve()) and trained["served_as"] == "train-prefmatcher-tiny"
    # the export of 4 steps on the random-weight base, unconstrained: its noise is never the matcher's JSON
    assert (trained["n_examples"], trained["n_parsed"], trained["n_failed"]) == (4, 0, 4), trained["failures"]
    answers = [json.loads(line) for line in (out / "agreement_answers.jsonl").read_text().splitlines()]
    assert [a["model"] for a in answers] == ["trained"] * 4
    assert sum(a["error"] is None for a in answers) == trained["n_parsed"]
    # The printed table is the file's figures: `trained  n/4  accuracy  alpha  alpha  failed`
    fmt = lambda v: "-" if v is None else f"{v:.3f}"
    row = next(line for line in result.stdout.splitlines() if line.strip("│ ").startswith("trained"))
    cells = [c.strip() for c in row.strip("│ ").split("│")]
    assert cells == [
        "trained",
        f"{trained['n_parsed']}/4",
        fmt(trained["accuracy"]),
        fmt(trained["alpha_interval"]),
        fmt(trained["alpha_ordinal"]),
        str(trained["n_failed"]),
    ], row
    for what, n in trained["failures"].items():
        assert f"trained failed: {n} x {what}" in " ".join(result.stdout.split())
    (server,) = report["servers"]
    assert server["left_running"] == [] and server["name"] == "train-prefmatcher-tiny"
    assert (
        f"server train-prefmatcher-tiny (vllm cpu): served train-prefmatcher-tiny; started in {server['start_s']}s, "
        f"answered in {server['ask_s']}s"
    ) in " ".join(result.stdout.split())
    assert _invoke("serve", "status").stdout.strip() == "no servers"  # stopped before the command returned
