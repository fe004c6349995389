"""Rebuilding PrefMatcher on CPU: the whole chain once (module fixture), then bad inputs.

The chain is real end to end, on the tiny random-weight model (its mechanics are what it checks): the
eval runner over HTTP synthesizes match data from the bundled sample (the instant-answer server plays
candidate, decomposer and teacher: a small model cannot answer in CUPID's formats, see
test_tiny_model_as_candidate_gives_no_match_data), TRL trains a LoRA on the model loaded in
bitsandbytes 4-bit NF4 (label and fine-tune through the API), `cupid train export` merges and saves the
adapter, and `cupid train check --running` serves with real vLLM on CPU: the base and the trained adapter
on the session's `tiny_server` (tests/conftest.py, shared with other files), which loads the adapter at
run time, then the merged export, the file's only vLLM start. (What `make train` does instead, a server
of its own for base and adapter, is checked on the commands it would run.) The check is asserted on what
it records (parsed answers scored, failures counted with reasons), never on agreement values. Each stage's
command refuses what comes before its stage (exit 2, one line naming the path and the command to run
first, nothing started or written).
What the fine-tune teaches needs a model that follows instructions: trained 4 steps on the chain's 4
examples, SmolLM2-135M learns PrefMatcher's answer format (its adapter's and its export's answers
parse), not good labels (tests/training/test_training_smol.py, beside this file on another worker); that
vLLM serves an adapter as PEFT computes it is shown on the chain's.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml
from click.testing import Result
from rich.console import Console
from typer.testing import CliRunner

from cupid.cli import app as cupid_app
from cupid.common.config import ConfigError
from cupid.common.errors import ServeError
from cupid.eval.benchmark import data as cupid_data
from cupid.eval.benchmark.data import DataError
from cupid.matcher import parse, prompts
from cupid.serving.endpoint import Endpoint
from cupid.serving.servers import probes, state
from cupid.serving.servers.engines import get_engine
from cupid.serving.servers.ports import free_port
from cupid.serving.servers.vllm_args import engine_env, vllm_args
from cupid.training import agreement, config, export, matchdata, pipeline, sft
from cupid.training.matchdata import LabellingError
from cupid.training.traindir import TrainDir
from tests.helpers import REPO, TINY_NAME, running_in_group, write_endpoints

TINY = REPO / "configs" / "train" / "tiny.yaml"


def _load(path: Path, **overrides) -> config.TrainConfig:
    return config.load(path, {k.replace("__", "."): v for k, v in overrides.items()})


@pytest.fixture(scope="module")
def chain(random_model_dir, tmp_path_factory, request):
    """`make train CONFIG=configs/train/tiny.yaml`, once, into a temporary run directory: label and fine-tune through
    the API (`pipeline.run`), then export and check as a user runs them (`cupid train export`, `cupid train check
    --running`: the base and the adapter on the session's tiny server, the same model directory with run-time LoRA
    loading on, asked for only then: another worker may have started it meanwhile). Returns the config, its file,
    the stages' reports (the export's and the check's as their files hold them) and the two commands' results."""
    work = tmp_path_factory.mktemp("train")
    recipe = yaml.safe_load(TINY.read_text())
    recipe |= {"base_model": str(random_model_dir), "out": str(work / "run")}
    recipe["labelling"]["cache"] = str(work / "cache.sqlite")
    path = work / "tiny.yaml"
    path.write_text(yaml.safe_dump(recipe))
    cfg = config.load(path)
    # The chain's own state directory, only while it runs: a module-long setting would be undone after the
    # session's `tiny_server` set its own (the state directory of the session server, shared by the workers).
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CUPID_HOME", str(_home(cfg)))
        reports = pipeline.run(cfg, Console(stderr=True), stages=("label", "sft"))
        exported = _invoke("train", "export", "-c", str(path))
    assert exported.exit_code == 0, exported.output
    running = request.getfixturevalue("tiny_server")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CUPID_HOME", str(_home(cfg)))
        checked = _invoke("train", "check", "-c", str(path), "--running", running["base_url"])
    assert checked.exit_code == 0, checked.output
    files = {
        "export": export.ExportReport.model_validate_json((cfg.out_dir / "export_report.json").read_text()),
        "check": agreement.AgreementReport.model_validate(json.loads((cfg.out_dir / "agreement.json").read_text())),
    }
    return Chain(cfg, path, reports.model_copy(update=files), exported, checked, running["base_url"])


@dataclass(frozen=True)
class Chain:
    cfg: config.TrainConfig
    path: Path  # the config file the commands were given
    reports: pipeline.PipelineReport
    exported: Result  # `cupid train export`
    checked: Result  # `cupid train check --running`
    running_url: str  # the session server's, where the base and the adapter were asked


runner = CliRunner()


def _invoke(*args: str) -> Result:
    result = runner.invoke(cupid_app, list(args))
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return result


def _home(cfg: config.TrainConfig) -> Path:
    return cfg.out_dir.parent / "home"


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_match_data_is_prefmatcher_chat_split_by_persona(chain):
    cfg, reports = chain.cfg, chain.reports
    report = reports.label
    assert report.runs["instant"]["n_scored"] == 6 and report.runs["instant"]["n_failed"] == 0
    # 6 instances x 2 directions; consistent and contrastive share the ground truth, so 4 prompts repeat.
    assert (report.n_examples_raw, report.n_duplicates, report.n_conflicting_duplicates) == (12, 4, 0)
    splits = {s: _rows(cfg.out_dir / "data" / f"{s}.jsonl") for s in ("train", "validation")}
    assert [len(splits["train"]), len(splits["validation"])] == [4, 4]
    personas = {s: {e["persona_id"] for e in rows} for s, rows in splits.items()}
    assert personas["train"].isdisjoint(personas["validation"])
    examples = splits["train"] + splits["validation"]
    assert len({e["id"] for e in examples}) == 8
    for e in examples:
        assert e["prompt"] == prompts.matcher(e["preference"], e["items"], "prefmatcher")
        teacher = [m["label"] for m in e["teacher_labels"]]
        assert [m.label for m in parse.matches(e["completion"][0]["content"], e["items"])] == teacher
        assert e["completion"][0]["content"].startswith("```json\n[")  # the prefmatcher dialect: a bare list
        assert (
            e["teacher_prompt"] == "fewshot" and '"results"' in e["teacher_raw"]
        )  # the teacher's own dialect, kept raw
        assert [m.label for m in parse.matches(e["teacher_raw"], e["items"])] == teacher
        assert e["candidate"] == "instant" and e["instance_key"].startswith(e["persona_id"] + "/")
    assert Counter(e["direction"] for e in examples) == {"infer_to_gt": 4, "gt_to_infer": 4}
    for split, rows in splits.items():
        counted = Counter(m["label"] for e in rows for m in e["teacher_labels"])
        assert report.splits[split]["labels"] == {label: counted.get(label, 0) for label in prompts.LABELS}
    import datasets

    loaded = datasets.load_dataset("json", data_files=str(cfg.out_dir / "data" / "train.jsonl"), split="train")
    assert loaded.num_rows == 4 and {"prompt", "completion"} <= set(loaded.column_names)


def test_qlora_training_lowers_the_loss_on_the_completion_only(chain, random_model_dir):
    cfg, reports = chain.cfg, chain.reports
    report = reports.sft
    assert report.loss_after["train"] < report.loss_before["train"]
    assert report.peak_gpu_memory_gib is None and report.gpu_memory_gib is None  # on CPU: no GPU to measure
    # On CPU Liger's kernels are off, and training (in this process) replaced nothing in the model's module.
    why = "no CUDA GPU (Liger's kernels are triton's, CUDA only)"
    assert report.liger == {"use_liger_kernel": False, "why": why, "replaced_in_module": []}
    assert "liger_kernel" not in " ".join(sys.modules)
    assert report.mean_tokens_per_s > 0
    steps = cfg.sft.max_steps
    assert [r["step"] for r in report.logged_losses] == list(range(1, steps + 1)) and report.optimizer_steps == steps
    assert all(math.isfinite(r["loss"]) for r in report.logged_losses)
    quantized = {"load_in_4bit": True, "bnb_4bit_quant_type": "nf4", "bnb_4bit_use_double_quant": True}
    assert report.quantization == quantized
    # LoRA r=8 on q,v,o (hidden->hidden, hidden->kv heads, hidden->hidden) and the MLP (hidden<->intermediate) of each
    # layer.
    model = json.loads((random_model_dir / "config.json").read_text())
    hidden, kv = model["hidden_size"], model["num_key_value_heads"] * model["head_dim"]
    per_layer = 8 * ((hidden + hidden) + (hidden + kv) + (hidden + hidden) + 3 * (hidden + model["intermediate_size"]))
    assert report.trainable_parameters == model["num_hidden_layers"] * per_layer
    # The loss covers exactly the assistant turn: prompt+completion tokens minus the prompt's (with its generation
    # prompt).
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(random_model_dir)
    expected = 0
    for e in _rows(cfg.out_dir / "data" / "train.jsonl"):
        full = tok.apply_chat_template(e["prompt"] + e["completion"], return_dict=True)["input_ids"]
        prompt = tok.apply_chat_template(e["prompt"], add_generation_prompt=True, return_dict=True)["input_ids"]
        assert full[: len(prompt)] == prompt
        expected += len(full) - len(prompt)
    assert report.completion_tokens_per_epoch == expected
    adapter = json.loads((cfg.out_dir / "adapter" / "adapter_config.json").read_text())
    assert (adapter["r"], adapter["lora_alpha"]) == (8, 16)
    assert set(adapter["target_modules"]) == set(cfg.lora.args["target_modules"])
    import torch

    args = torch.load(cfg.out_dir / "checkpoints" / f"checkpoint-{steps}" / "training_args.bin", weights_only=False)
    assert args.max_grad_norm == 0.0 and args.warmup_steps == 0 and args.max_length == 512  # no clipping


def test_export_is_a_self_contained_servable_directory(chain, random_model_dir):
    cfg, reports = chain.cfg, chain.reports
    report = reports.export
    out = Path(report.export)
    assert report.method.startswith("dequantize-then-merge")
    assert report.merge_check["max_abs_logit_diff"] < 1e-3 and report.merge_check["same_next_token"]
    model_config = json.loads((out / "config.json").read_text())
    assert "quantization_config" not in model_config
    from transformers import AutoTokenizer

    eot = AutoTokenizer.from_pretrained(out).convert_tokens_to_ids("<|im_end|>")
    assert report.end_of_turn_token == "<|im_end|>"
    assert eot in json.loads((out / "generation_config.json").read_text())["eos_token_id"]
    assert (out / "chat_template.jinja").read_text() == (Path(random_model_dir) / "chat_template.jinja").read_text()
    assert (out / "model.safetensors").is_file() and (out / "tokenizer.json").is_file()
    assert (cfg.out_dir / "adapter" / "adapter_model.safetensors").is_file()  # kept for --enable-lora serving


def test_check_counts_unparsed_answers_of_each_model_as_failures(chain):
    cfg, reports = chain.cfg, chain.reports
    report = reports.check
    answers = _rows(cfg.out_dir / "agreement_answers.jsonl")
    assert Counter(r["model"] for r in answers) == {"base": 4, "adapter": 4, "trained": 4}
    assert [row[0] for row in agreement.table(report)] == ["base", "adapter", "trained"]
    for which in ("base", "adapter", "trained"):
        block = report.block(which)
        rows = [r for r in answers if r["model"] == which]
        assert block["n_examples"] == 4 and block["n_parsed"] + block["n_failed"] == 4
        assert sum(block["failures"].values()) == block["n_failed"]
        for row in rows:
            assert isinstance(row["raw"], str)  # the served model answered; parsing is what may fail
            if row["error"] is None:
                assert len(row["labels"]) == len(row["teacher"])
            else:
                assert row["labels"] is None and row["error"]["reason"] == "parse_error"
        if block["n_parsed"] == 0:
            assert block["accuracy"] is None and block["alpha_interval"] is None and block["n_items_compared"] == 0
        else:
            assert 0.0 <= block["accuracy"] <= 1.0
            assert block["n_items_compared"] == sum(len(r["teacher"]) for r in rows if r["error"] is None)
    assert report.base["n_failed"] == 4  # the random model's answers are noise: each a parse failure, counted
    assert report.adapter["model"] == str((cfg.out_dir / "adapter").resolve())
    assert report.trained["model"] == str((cfg.out_dir / "export").resolve())
    print(
        "agreement: "
        + ", ".join(
            f"{w} {report.block(w)['n_parsed']}/4 parsed, accuracy {report.block(w)['accuracy']}, "
            f"alpha {report.block(w)['alpha_interval']}"
            for w in ("base", "adapter", "trained")
        )
    )


def test_check_uses_the_running_base_server_for_the_adapter_then_the_export(chain, monkeypatch):
    cfg, reports = chain.cfg, chain.reports
    monkeypatch.setenv("CUPID_HOME", str(_home(cfg)))  # where the check's own server had its record
    names = agreement.served_names(cfg)
    on_base, merged = reports.check.servers  # the session server (no start), then one vLLM start
    adapter = str((cfg.out_dir / "adapter").resolve())
    # What /v1/models of the base's server listed while the adapter was loaded: the base, the adapter as its child;
    # after the check, the adapter is gone again.
    assert on_base["loaded_at_run_time"] and on_base["model"] == str(Path(cfg.base_model).resolve())
    assert {"id": names["adapter"], "root": adapter, "parent": TINY_NAME} in on_base["listed"]
    assert TINY_NAME in [m["id"] for m in on_base["listed"]] and names["adapter"] not in [
        m["id"] for m in on_base["listed_after"]
    ]
    assert on_base["asked"] == {"base": TINY_NAME, "adapter": names["adapter"]}
    assert [m["id"] for m in merged["listed"]] == [names["trained"]] and merged["asked"] == {
        "trained": names["trained"]
    }
    assert merged["model"] == str((cfg.out_dir / "export").resolve())
    assert merged["command"][1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    # vLLM's CPU build, eager, fp32, a 1 GiB KV cache (tiny.yaml's agreement.serve)
    assert (merged["engine"], merged["device"], merged["env"]["VLLM_CPU_KVCACHE_SPACE"]) == ("vllm", "cpu", "1")
    assert (
        "--enforce-eager" in merged["command"]
        and merged["command"][merged["command"].index("--dtype") + 1] == "float32"
    )
    # Tied to the process that ran the check (a killed `cupid train` takes it along), and stopped with its whole
    # process group (engine core, workers) before the check returned.
    assert merged["tied_to"] == os.getpid() and merged["left_running"] == []
    assert running_in_group(merged["pid"]) == [] and not probes.alive(merged["pid"])
    assert state.find(merged["name"]) is None


def test_export_writes_a_loadable_merged_model_and_names_it(chain, random_model_dir):
    """`cupid train export` as a user runs it: stdout is the report written beside the run, as JSON (a pipe to jq
    reads it); stderr says where it went."""
    out, result = chain.cfg.out_dir, chain.exported
    export_dir = out / "export"
    for name in ("config.json", "model.safetensors", "tokenizer.json", "chat_template.jinja", "generation_config.json"):
        assert (export_dir / name).is_file(), name
    assert not (out / "export.partial").exists()
    report = json.loads((out / "export_report.json").read_text())
    assert json.loads(result.stdout) == report
    assert report["export"] == str(export_dir) and report["adapter"] == str(out / "adapter")
    assert report["base_model"] == str(random_model_dir) and report["dtype"] == "float32"
    assert report["method"].startswith("dequantize-then-merge")  # tiny.yaml trains in NF4
    assert report["merge_check"]["same_next_token"] and report["merge_check"]["max_abs_logit_diff"] < 1e-3
    assert f"-> {export_dir} (float32" in result.stderr
    assert report["serve"]["merged"] == f"vllm serve {export_dir} --served-model-name prefmatcher-tiny"
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    merged = AutoConfig.from_pretrained(export_dir)
    base = AutoConfig.from_pretrained(random_model_dir)
    assert (merged.model_type, merged.hidden_size, merged.num_hidden_layers) == (
        base.model_type,
        base.hidden_size,
        base.num_hidden_layers,
    )
    assert not hasattr(merged, "quantization_config")
    tok = AutoTokenizer.from_pretrained(export_dir)
    assert tok.convert_tokens_to_ids(report["end_of_turn_token"]) in report["eos_token_id"]
    model = AutoModelForCausalLM.from_pretrained(export_dir)  # the merged weights, plain (no peft, no bitsandbytes)
    assert model.dtype == torch.float32 and not any("lora" in name for name, _ in model.named_parameters())


def test_check_prints_the_agreement_it_writes_and_leaves_no_server(chain, monkeypatch):
    """`cupid train check --running URL`: the table printed is the file's figures, a line per failure and per server."""
    out, result = chain.cfg.out_dir, chain.checked
    report = json.loads((out / "agreement.json").read_text())
    trained = report["trained"]
    assert trained["model"] == str((out / "export").resolve()) and trained["served_as"] == "train-prefmatcher-tiny"
    # the export of 4 steps on the random-weight base, unconstrained: its noise is never the matcher's JSON
    assert (trained["n_examples"], trained["n_parsed"], trained["n_failed"]) == (4, 0, 4), trained["failures"]
    answers = [json.loads(line) for line in (out / "agreement_answers.jsonl").read_text().splitlines()]

    def fmt(v):
        return "-" if v is None else f"{v:.3f}"

    for which in ("base", "adapter", "trained"):
        block = report[which]
        assert sum(a["error"] is None for a in answers if a["model"] == which) == block["n_parsed"]
        # The printed table is the file's figures: `which  n/4  accuracy  alpha  alpha  failed`
        row = next(line for line in result.stdout.splitlines() if line.strip("│ ").startswith(which))
        cells = [c.strip() for c in row.strip("│ ").split("│")]
        assert cells == [
            which,
            f"{block['n_parsed']}/4",
            fmt(block["accuracy"]),
            fmt(block["alpha_interval"]),
            fmt(block["alpha_ordinal"]),
            str(block["n_failed"]),
        ], row
        for what, n in block["failures"].items():
            assert f"{which} failed: {n} x {what}" in " ".join(result.stdout.split())
    on_base, server = report["servers"]
    assert on_base["name"] == chain.running_url and on_base["loaded_at_run_time"]
    printed = " ".join(result.stdout.split())
    adapter = agreement.served_names(chain.cfg)["adapter"]
    assert f"server {chain.running_url} (running, adapters loaded at run time: {adapter}): served " in printed
    assert f"answered in {on_base['ask_s']}s" in printed and "started in" not in printed.split("server train-")[0]
    assert server["left_running"] == [] and server["name"] == "train-prefmatcher-tiny"
    assert (
        f"server train-prefmatcher-tiny (vllm cpu): served train-prefmatcher-tiny; started in {server['start_s']}s, "
        f"answered in {server['ask_s']}s"
    ) in " ".join(result.stdout.split())
    monkeypatch.setenv("CUPID_HOME", str(_home(chain.cfg)))
    assert _invoke("serve", "status").stdout.strip() == "no servers"  # stopped before the command returned


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


def test_check_before_export_names_the_missing_export_and_starts_no_server(chain, tmp_path, cupid_home):
    out = tmp_path / "run"
    out.mkdir()
    for part in ("data", "adapter"):  # what label and sft left, without an export
        shutil.copytree(chain.cfg.out_dir / part, out / part)
    result = _invoke("train", "check", "-c", str(chain.path), "--out", str(out))
    assert result.exit_code == 2, result.output
    assert (
        f"error: {out / 'export'}: no exported model here; run `cupid train export --config {chain.path}` first"
        in result.stderr
    )
    assert "Traceback" not in result.output and not (out / "agreement.json").exists()
    assert _invoke("serve", "status").stdout.strip() == "no servers"
    assert not (cupid_home / "servers").exists() or not any((cupid_home / "servers").glob("*.json"))


def test_check_running_names_a_server_that_does_not_answer_and_starts_nothing(chain, tmp_path, cupid_home):
    dead = f"http://127.0.0.1:{free_port()}/v1"
    out = tmp_path / "run"
    out.mkdir()
    for part in ("data", "adapter", "export"):  # all a check needs, but the server it was pointed at
        (out / part).symlink_to(chain.cfg.out_dir / part, target_is_directory=True)
    result = _invoke("train", "check", "-c", str(chain.path), "--out", str(out), "--running", dead)
    assert result.exit_code == 2, result.output
    assert f"error: {dead}/models: nothing answers" in " ".join(result.stderr.split())
    assert "Traceback" not in result.output and not (out / "agreement.json").exists()
    assert not (cupid_home / "servers").exists() or not any((cupid_home / "servers").glob("*.json"))


def test_the_check_serves_the_adapter_beside_its_base_at_the_trained_rank(chain, tmp_path):
    """What `make train` runs (no server of the base at hand): one server for base + adapter as a LoRA module, at
    --max-lora-rank of the trained adapter, then the export; each command checked as vLLM's parser reads it."""
    cfg = chain.cfg
    names = agreement.served_names(cfg)
    adapter = str((cfg.out_dir / "adapter").resolve())
    lora, merged = agreement.plan(cfg, TrainDir.of(cfg))
    assert lora.asks == {"base": names["base"], "adapter": names["adapter"]} and merged.asks == {
        "trained": names["trained"]
    }
    engine = get_engine("vllm")
    command = engine.command(lora.profile, tmp_path)
    assert command[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    rank = json.loads((cfg.out_dir / "adapter" / "adapter_config.json").read_text())["r"]
    assert command[command.index("--max-lora-rank") + 1] == str(rank) == "8" and "--enable-lora" in command
    assert command[command.index("--lora-modules") + 1] == f"{names['adapter']}={adapter}"
    exported = engine.command(merged.profile, tmp_path)
    assert exported[exported.index("--model") + 1] == str((cfg.out_dir / "export").resolve())
    for server in (lora, merged):
        profile, args = server.profile, vllm_args(server.profile)
        assert (profile.engine, profile.device, engine_env(profile)["VLLM_CPU_KVCACHE_SPACE"]) == ("vllm", "cpu", "1")
        assert "--enforce-eager" in args and args[args.index("--dtype") + 1] == "float32"
    lora.profile.check_local_files("test")  # the adapter's rank fits the server's


def test_check_refuses_a_running_server_of_another_model_before_loading_anything(chain, tiny_server):
    cfg = chain.cfg
    other = _load(TINY, out=str(cfg.out_dir), base_model=str(cfg.out_dir / "export"))
    with pytest.raises(
        ServeError, match=r"serves 'tiny-random-llama' from .*tiny-random-LlamaForCausalLM, not the base model .*export"
    ):
        agreement.check(other, TrainDir.of(other), Console(stderr=True), running=Endpoint(**tiny_server))
    listed = httpx.get(tiny_server["base_url"] + "/models").json()["data"]
    assert agreement.served_names(cfg)["adapter"] not in [m["id"] for m in listed]


def greedy_answers(model, tok, prompts: list[list[dict]], max_tokens: int) -> list[str]:
    """A transformers model's greedy answers to chat prompts, in one batch (`tok` pads on the left)."""
    import torch

    batch = tok.apply_chat_template(
        prompts, add_generation_prompt=True, return_tensors="pt", return_dict=True, padding=True
    )
    with torch.no_grad():
        out = model.eval().generate(**batch, max_new_tokens=max_tokens, do_sample=False)
    return tok.batch_decode(out[:, batch["input_ids"].shape[1] :], skip_special_tokens=True)


def test_vllm_serves_the_trained_adapter_as_peft_computes_it(chain, random_model_dir):
    """vLLM's LoRA on CPU is the adapter as trained: its greedy answers are PEFT's on the same (unquantized) base.

    (The export answers differently, and parses more often: it merges the adapter into the NF4-dequantized base
    the adapter was trained on, while `--enable-lora` puts it on the plain base.) PEFT answers all prompts in one
    left-padded batch, for as many tokens as the longest served answer plus one: an equal answer ends within
    them, a longer one shows by being cut."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cfg = chain.cfg
    served = [r["raw"] for r in _rows(cfg.out_dir / "agreement_answers.jsonl") if r["model"] == "adapter"]
    tok = AutoTokenizer.from_pretrained(random_model_dir, padding_side="left")
    base = AutoModelForCausalLM.from_pretrained(random_model_dir, dtype=torch.float32)
    model = PeftModel.from_pretrained(base, cfg.out_dir / "adapter").eval()
    prompts_ = [e["prompt"] for e in _rows(cfg.out_dir / "data" / "validation.jsonl")]
    assert len(prompts_) == len(served) == 4
    longest = max(len(tok(answer, add_special_tokens=False).input_ids) for answer in served)
    answers = greedy_answers(model, tok, prompts_, min(longest + 1, cfg.agreement.max_tokens))
    same = sum(a.strip() == s.strip() for a, s in zip(answers, served, strict=True))
    # all 4 when measured one by one on a bf16 server; greedy decoding in two implementations may break one near-tie
    # differently
    assert same >= 3


def test_training_resumes_from_the_newest_checkpoint(chain, tmp_path):
    cfg = chain.cfg
    copy = tmp_path / "run"
    for part in ("data", "checkpoints"):
        shutil.copytree(cfg.out_dir / part, copy / part)
    steps = cfg.sft.max_steps
    more = _load(TINY, out=str(copy), base_model=cfg.base_model, sft__max_steps=steps + 1, sft__measure_loss_on=[])
    report = sft.train(more, TrainDir.of(more), Console(stderr=True))
    assert report.resumed_from.endswith(f"checkpoint-{steps}")
    assert report.optimizer_steps == steps + 1 and report.logged_losses[-1]["step"] == steps + 1
    assert (copy / "checkpoints" / f"checkpoint-{steps + 1}").is_dir()


# --- agreement arithmetic ------------------------------------------------------------------------------


def test_agreement_is_computed_on_parsed_answers_only():
    rows = [
        {"teacher": ["Fully Covered", "Not Covered"], "labels": ["Fully Covered", "Not Covered"], "error": None},
        {"teacher": ["Partially Covered"], "labels": ["Not Covered"], "error": None},
        {
            "teacher": ["Not Covered", "Not Covered"],
            "labels": None,
            "error": {"reason": "parse_error", "detail": "no valid JSON in the answer"},
        },
    ]
    result = agreement.agreement(rows)
    assert (result["n_parsed"], result["n_failed"], result["n_items_compared"]) == (2, 1, 3)
    assert result["accuracy"] == round(2 / 3, 4)
    assert result["failures"] == {"parse_error: no valid JSON in the answer": 1}
    import krippendorff

    expected = krippendorff.alpha(
        reliability_data=[[1.0, 0.0, 0.5], [1.0, 0.0, 0.0]],
        level_of_measurement="interval",
        value_domain=[0.0, 0.5, 1.0],
    )
    assert result["alpha_interval"] == round(float(expected), 4)
    assert agreement.agreement([rows[2]])["accuracy"] is None


# --- bad input -----------------------------------------------------------------------------------------


def _write_config(path: Path, **sections) -> Path:
    base = yaml.safe_load(TINY.read_text())
    for key, value in sections.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            base[key].update(value)
        else:
            base[key] = value
    path.write_text(yaml.safe_dump(base))
    return path


def test_any_sft_config_argument_reaches_the_trainer(tmp_path):
    """`sft:` is TRL's SFTConfig as given: an argument the project never named reaches it."""
    from cupid.training.sft import sft_config

    extra = {
        "neftune_noise_alpha": 5,
        "lr_scheduler_type": "cosine_with_min_lr",
        "lr_scheduler_kwargs": {"min_lr_rate": 0.1},
    }
    path = _write_config(tmp_path / "more.yaml", sft=extra)
    cfg = config.load(path)
    args = sft_config(cfg, TrainDir.of(cfg), "fp32")
    assert (args.neftune_noise_alpha, args.lr_scheduler_type, args.lr_scheduler_kwargs) == (
        5,
        "cosine_with_min_lr",
        {"min_lr_rate": 0.1},
    )
    result = CliRunner().invoke(cupid_app, ["train", "run", "-c", str(path), "--dry-run"])
    assert (
        result.exit_code == 0
        and "neftune_noise_alpha=5" in result.output
        and "lr_scheduler_type=cosine_with_min_lr" in result.output
    )


def test_an_sft_argument_trl_refuses_fails_the_run_with_trls_message(tmp_path):
    """An unknown name or a value TRL refuses fails `cupid train run --dry-run` (and a run, before anything runs) with
    TRL's message."""
    from cupid.training.sft import sft_config

    cases = {
        "name": (
            {"learning_rte": 0.1},
            r"sft\.learning_rte: not an argument of TRL's SFTConfig .*unexpected keyword argument 'learning_rte'",
        ),
        "value": (
            {"lr_scheduler_type": "nonsense"},
            (
                r"sft\.lr_scheduler_type: TRL/transformers refuse it: nonsense is not a valid SchedulerType, "
                r"please select one of \[.*'cosine_with_min_lr'"
            ),
        ),
        # transformers' own check of two arguments together (the chain evaluates nothing inside the trainer)
        "combination": (
            {"load_best_model_at_end": True},
            (
                r"sft\.load_best_model_at_end: TRL/transformers refuse it: "
                r"--load_best_model_at_end requires the save and eval strategy to match"
            ),
        ),
        # SFTConfig checks no types itself; its declared ones are checked: YAML reads 2e-3 (no dot) as text
        "type": (
            {"learning_rate": "2e-3"},
            (
                r"sft\.learning_rate: TRL's SFTConfig declares float, not '2e-3' "
                r"\(YAML reads 2e-3, without a dot, as text: write 2\.0e-3\)"
            ),
        ),
    }
    for name, (given, message) in cases.items():
        bad = _write_config(tmp_path / f"{name}.yaml", sft=given)
        with pytest.raises(ConfigError, match=message):
            sft_config(config.load(bad), TrainDir(tmp_path), "fp32")
        for command in (["--dry-run"], []):  # the run refuses it before the match data are made
            result = CliRunner().invoke(
                cupid_app, ["train", "run", "-c", str(bad), *command, "--out", str(tmp_path / name)]
            )
            assert result.exit_code == 2 and re.search(f"error: {re.escape(str(bad))}: {message}", result.output), (
                name,
                result.output,
            )
            assert not (tmp_path / name).exists(), name
    two = yaml.safe_load(TINY.read_text())  # two wrong: the first in the config's order (optim), with its own message
    two["sft"] |= {"optim": "nope", "lr_scheduler_type": "nonsense"}
    with pytest.raises(
        ConfigError, match=r"sft\.optim: TRL/transformers refuse it: nope is not a valid OptimizerNames"
    ):
        sft_config(config.TrainConfig.model_validate(two), TrainDir(tmp_path), "fp32")
    with pytest.raises(ConfigError, match=r"sft.*output_dir: set by the chain itself"):
        config.load(_write_config(tmp_path / "owned.yaml", sft={"output_dir": "elsewhere"}))


def test_shipped_configs_give_the_trainer_the_recipe_they_gave_before():
    """What each shipped config gave SFTConfig when `sft:` was a copy of its fields (recorded then in
    tests/data/sft_args_before_trl_passthrough.json), it gives now as TRL's own arguments."""
    from cupid.training.sft import sft_config

    before = json.loads((REPO / "tests" / "data" / "sft_args_before_trl_passthrough.json").read_text())
    # 10 steps of 1 taught the format as 10 of 2 did, at half the cost; 4 of 1 at 6e-3 teach it as 10 of 1 at 2e-3
    changed_since = {
        "tiny": {"per_device_train_batch_size": 1, "max_steps": 4, "learning_rate": 6.0e-3, "save_steps": 2}
    }
    for name, recipe in before.items():
        cfg = config.load(REPO / "configs" / "train" / f"{name}.yaml")
        args = sft_config(cfg, TrainDir.of(cfg), "fp32")
        project = recipe.pop("_project")
        recipe.update(changed_since.get(name, {}))
        assert {k: getattr(args, k) for k in recipe} == recipe, name
        assert (cfg.sft.precision, cfg.sft.resume, cfg.sft.measure_loss_on) == (
            project["precision"],
            project["resume"],
            project["measure_loss_on"],
        )


def test_shipped_configs_give_peft_and_bitsandbytes_their_previous_arguments():
    """What each shipped config gave LoraConfig and BitsAndBytesConfig when `lora:` and `quantization:` had names of
    their own (recorded then in tests/data/lora_bnb_args_before_passthrough.json), it gives now under peft's and
    bitsandbytes' names."""
    import torch

    from cupid.training.base_model import bnb_config
    from cupid.training.sft import lora_config

    before = json.loads((REPO / "tests" / "data" / "lora_bnb_args_before_passthrough.json").read_text())
    for name, recorded in before.items():
        cfg = config.load(REPO / "configs" / "train" / f"{name}.yaml")
        lora, bnb = lora_config(cfg), bnb_config(cfg, torch.float32)

        def plain(v):
            return (
                sorted(v) if isinstance(v, set) else str(v).removeprefix("torch.") if isinstance(v, torch.dtype) else v
            )

        assert {k: plain(getattr(lora, k)) for k in recorded["LoraConfig"]} == recorded["LoraConfig"], name
        assert {k: plain(getattr(bnb, k)) for k in recorded["BitsAndBytesConfig"]} == recorded["BitsAndBytesConfig"], (
            name
        )


def test_lora_and_quantization_are_checked_by_peft_and_bitsandbytes(tmp_path):
    from cupid.training.base_model import bnb_config
    from cupid.training.sft import check, lora_config

    old = config.load(_write_config(tmp_path / "old.yaml", lora={"alpha": 16}))  # the project's old name: peft's now
    with pytest.raises(ConfigError, match=r"old\.yaml: lora: peft's LoraConfig refuses it: .*'alpha'"):
        lora_config(old)
    typo = config.load(_write_config(tmp_path / "typo.yaml", quantization={"bnb_4bit_quant_typ": "nf4"}))
    # BitsAndBytesConfig itself only logs an unknown argument and goes on: refused here, by name
    with pytest.raises(ConfigError, match=r"typo\.yaml: quantization\.bnb_4bit_quant_typ: not an argument of"):
        bnb_config(typo)
    with pytest.raises(ConfigError, match=r"lora.*task_type: set by the chain itself"):
        config.load(_write_config(tmp_path / "owned.yaml", lora={"task_type": "SEQ_CLS"}))
    with pytest.raises(ConfigError, match=r"quantization.*bnb_4bit_compute_dtype: set by the chain itself"):
        config.load(_write_config(tmp_path / "owned2.yaml", quantization={"bnb_4bit_compute_dtype": "float16"}))
    plain = config.load(_write_config(tmp_path / "plain.yaml", quantization={"load_in_4bit": False}))
    _, lora, bnb = check(plain, TrainDir.of(plain))
    assert bnb is None and lora.r == 8 and lora.lora_alpha == 16  # plain LoRA: no BitsAndBytesConfig at all
    result = CliRunner().invoke(cupid_app, ["train", "run", "--config", str(tmp_path / "typo.yaml"), "--dry-run"])
    assert result.exit_code == 2 and "quantization.bnb_4bit_quant_typ: not an argument" in result.output


def test_check_server_settings_that_cannot_work_are_refused_when_the_config_loads(tmp_path):
    with pytest.raises(ConfigError, match=r"agreement: .*serve\.port: set by the check"):
        config.load(_write_config(tmp_path / "a.yaml", agreement={"serve": {"device": "cpu", "port": 8000}}))
    with pytest.raises(ConfigError, match=r"serve: .*gpu_memory_utilization: vLLM's arguments go under `vllm:`"):
        config.load(
            _write_config(tmp_path / "b.yaml", agreement={"serve": {"device": "cpu", "gpu_memory_utilization": 0.5}})
        )
    with pytest.raises(ConfigError, match=r"serve: vllm: .*--max-num-seqs: invalid int value: 'many'"):  # vLLM's parser
        config.load(
            _write_config(
                tmp_path / "b2.yaml", agreement={"serve": {"device": "cpu", "vllm": {"max_num_seqs": "many"}}}
            )
        )
    with pytest.raises(ConfigError, match=r"--max-lora-rank: invalid choice: 12"):
        config.load(_write_config(tmp_path / "c.yaml", agreement={"max_lora_rank": 12}))
    with pytest.raises(ConfigError, match=r"agreement.max_lora_rank 8 is below lora.r 16"):
        config.load(_write_config(tmp_path / "d.yaml", lora={"r": 16}, agreement={"max_lora_rank": 8}))
    with pytest.raises(ConfigError, match=r"adapter: serving the LoRA adapter needs the vllm engine"):
        config.load(_write_config(tmp_path / "e.yaml", agreement={"serve": {"engine": "transformers"}}))
    with pytest.raises(ConfigError, match=r"agreement.engine: Extra inputs"):  # the old form, before `serve`
        config.load(_write_config(tmp_path / "f.yaml", agreement={"engine": "vllm"}))
    plain = config.load(
        _write_config(tmp_path / "g.yaml", agreement={"serve": {"engine": "transformers"}, "adapter": False})
    )
    assert [(s.asks.keys(), s.profile.engine) for s in agreement.plan(plain, TrainDir.of(plain))] == [
        ({"base"}, "transformers"),
        ({"trained"}, "transformers"),
    ]


def test_check_without_the_trained_adapter_starts_no_server(chain, tmp_path, random_model_dir, monkeypatch):
    cfg = chain.cfg
    monkeypatch.setenv("CUPID_HOME", str(tmp_path / "home"))
    copy = tmp_path / "run"
    shutil.copytree(cfg.out_dir / "data", copy / "data")
    (copy / "export").symlink_to(cfg.out_dir / "export", target_is_directory=True)  # the export, but no adapter/
    moved = _load(TINY, out=str(copy), base_model=str(random_model_dir))
    assert not TrainDir.of(moved).adapter.exists()
    with pytest.raises(
        ServeError, match=r"agreement: LoRA adapter 'train-prefmatcher-tiny-adapter' not found at .*/run/adapter"
    ):
        agreement.check(moved, TrainDir.of(moved), Console(stderr=True))
    assert state.records() == [] and not (copy / "agreement.json").exists()  # refused before any start


def test_missing_base_model_directory_fails_before_loading_anything(tmp_path):
    path = _write_config(tmp_path / "c.yaml", base_model=str(tmp_path / "no-such-model"), out=str(tmp_path / "run"),
                         labelling=None, match_data=str(tmp_path / "data"))  # fmt: skip
    cfg = config.load(path)
    with pytest.raises(ConfigError, match=r"base_model: directory .*no-such-model does not exist"):
        sft.train(cfg, TrainDir.of(cfg))
    result = CliRunner().invoke(cupid_app, ["train", "sft", "-c", str(path)])
    assert result.exit_code == 2 and "no-such-model does not exist" in result.output


def test_match_data_with_missing_fields_names_line_and_field(tmp_path, random_model_dir):
    good = {
        "id": "x", "preference": "Be brief.", "items": ["Is it brief?"],
        "prompt": prompts.matcher("Be brief.", ["Is it brief?"], "prefmatcher"),
        "completion": [{"role": "assistant", "content": "[]"}],
        "teacher_labels": [{"index": 1, "entry": "Is it brief?", "label": "Fully Covered"}],
        "direction": "gt_to_infer", "persona_id": "p", "instance_key": "p/consistent", "instance_type": "consistent",
        "setting": "standard", "candidate": "c", "teacher": "t", "teacher_prompt": "fewshot", "teacher_raw": None,
    }  # fmt: skip
    broken = {k: v for k, v in good.items() if k != "completion"}
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.jsonl").write_text(json.dumps(good) + "\n" + json.dumps(broken) + "\n")
    path = _write_config(
        tmp_path / "c.yaml",
        base_model=str(random_model_dir),
        out=str(tmp_path / "run"),
        labelling=None,
        match_data=str(data),
    )
    with pytest.raises(ConfigError) as e:
        cfg = config.load(path)
        sft.train(cfg, TrainDir.of(cfg))
    assert f"{data / 'train.jsonl'}:2: completion: Field required" in str(e.value)


def test_cupid_rows_with_missing_fields_stop_synthesis_before_anything_is_sent(tmp_path):
    rows = [json.loads(line) for line in cupid_data.SAMPLE_PATH.read_text().splitlines()[:3]]
    del rows[1]["current_checklist"]
    source = tmp_path / "cupid.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = _load(TINY, out=str(tmp_path / "run"), labelling__data=str(source), labelling__instant_server=False)
    with pytest.raises(DataError) as e:
        matchdata.label(cfg, TrainDir.of(cfg))
    assert f"{source}:2" in str(e.value) and "current_checklist: Field required" in str(e.value)
    assert not (tmp_path / "run" / "label" / "instant").exists()


def test_unreachable_teacher_fails_clearly_and_runs_nothing(tmp_path, instant_url):
    endpoints = write_endpoints(
        tmp_path / "endpoints.yaml",
        instant={"base_url": instant_url, "model": "instant"},
        closed={"base_url": f"http://127.0.0.1:{free_port()}/v1", "model": "gpt-4o", "max_retries": 0},
    )
    cfg = _load(
        TINY,
        out=str(tmp_path / "run"),
        labelling__endpoints=str(endpoints),
        labelling__instant_server=False,
        labelling__candidates=["instant"],
        labelling__decomposer="instant",
        labelling__teacher="closed",
    )
    with pytest.raises(LabellingError, match=r"endpoint 'closed' \(http://127\.0\.0\.1:\d+/v1\) cannot be reached"):
        matchdata.label(cfg, TrainDir.of(cfg))
    assert not (tmp_path / "run" / "label" / "instant").exists()


def test_benchmark_test_split_is_refused_unless_forced(tmp_path, monkeypatch):
    """`kixlab/CUPID` is refused by name; here it names a local copy (the Hub is out of reach), so the forced run is
    real."""
    local = tmp_path / "kixlab" / "CUPID"
    local.mkdir(parents=True)
    shutil.copy(cupid_data.SAMPLE_PATH, local / "test.jsonl")
    monkeypatch.chdir(tmp_path)
    path = _write_config(
        tmp_path / "c.yaml",
        out=str(tmp_path / "run"),
        labelling={"data": "kixlab/CUPID", "cache": str(tmp_path / "c.sqlite")},
    )
    refused = CliRunner().invoke(cupid_app, ["train", "label", "-c", str(path)])
    assert refused.exit_code == 2 and "allow_test_split" in refused.output and "--force" in refused.output
    assert not (tmp_path / "run" / "label").exists()
    forced = CliRunner().invoke(cupid_app, ["train", "label", "-c", str(path), "--force"])
    assert forced.exit_code == 0, forced.output
    assert len(_rows(tmp_path / "run" / "data" / "train.jsonl")) == 4


def test_tiny_model_as_candidate_gives_no_match_data(tmp_path, tiny_server, instant_url):
    """A model that cannot answer in CUPID's format as candidate (the session's random-weight one, as SmolLM2-135M):
    its answer has no `### Most Likely Preference`, the runner records the
    failure, nothing reaches the teacher, and synthesis says why instead of writing an empty data set."""
    endpoints = write_endpoints(
        tmp_path / "endpoints.yaml", tiny=tiny_server, instant={"base_url": instant_url, "model": "instant"}
    )
    cfg = _load(TINY, out=str(tmp_path / "run"), labelling__endpoints=str(endpoints), labelling__instant_server=False,
                labelling__candidates=["tiny"], labelling__limit=1, labelling__settings=["oracle"],
                labelling__cache=str(tmp_path / "cache.sqlite"))  # fmt: skip
    with pytest.raises(LabellingError) as e:
        matchdata.label(cfg, TrainDir.of(cfg))
    assert "no match data" in str(e.value) and "parse_preference: parse_error: 1" in str(e.value)
    record = _rows(tmp_path / "run" / "label" / "tiny" / "instances.jsonl")[0]
    assert record["status"] == "failed" and record["error"]["raw"]  # the raw answer is kept
    assert json.loads((tmp_path / "run" / "data" / "report.json").read_text())["error"].startswith("no scored instance")
    assert not (tmp_path / "run" / "data" / "train.jsonl").exists()


def test_the_7b_recipe_sizes_its_micro_batch_by_gpu_memory_at_one_effective_batch(tmp_path):
    """An 80 GB card takes 8 x 4 without checkpointing, a 24 GB one 16 x 2 with it, a smaller one (or none) the recipe
    as written; with Liger's kernels on, an H200 (>= 120 GiB) takes 16 x 2: 32 examples an optimizer step on every
    card, so the optimisation is the paper's. On each measured tier the micro-batch times the recipe's max_length stays
    within the padded tokens measured to fit there (8 x ~1,000 at 54.0 GiB on an H100, 42.9 with Liger on an H200;
    16 x ~1,000 with Liger at 79.3 GiB on an H200; 32 x ~1,000 ran out of memory at 77.4 GiB on an H100), and the
    peak measured is under the smallest card a tier is for."""
    cfg = config.load(REPO / "configs" / "train" / "prefmatcher-qwen2.5-7b.yaml")
    keys = ("per_device_train_batch_size", "gradient_accumulation_steps", "gradient_checkpointing")
    for gib, expected in ((79.2, (8, 4, False)), (23.6, (16, 2, True)), (15.7, (4, 8, True)), (None, (4, 8, True))):
        args = cfg.sft.for_gpu(gib)
        assert tuple(args[k] for k in keys) == expected, gib
        assert cfg.sft.effective_batch(args) == 32 and args["learning_rate"] == 3.0e-4
        assert not {"max_tokens", "peak_gib", "min_gib"} & args.keys()  # this project's own: never SFTConfig's
    chosen = cfg.sft.gpu_batch(79.2)
    max_length = cfg.sft.args["max_length"]
    assert chosen.per_device_train_batch_size * max_length <= chosen.max_tokens <= 8 * 1000 * 1.03
    assert [e.max_tokens for e in cfg.sft.by_gpu_memory] == [16384, 8192, 8192, None]
    assert chosen.line(79.2, max_length) == (
        "micro-batch 8 x 4 accumulation, without checkpointing, for a GPU of 79.2 GiB (>= 70); 8,192 padded tokens a "
        "micro-batch (x max_length 1024), 8,192 measured to fit at a peak of 54.0 GiB"
    )
    # With Liger's kernels (CUDA, liger-kernel imports): the tiers measured with them, an H200 taking 16 x 2.
    for gib, liger, line in (
        (139.8, True, ("micro-batch 16 x 2 accumulation, without checkpointing, for a GPU of 139.8 GiB (>= 120); "
         "16,384 padded tokens a micro-batch (x max_length 1024), 16,384 measured to fit at a peak of 79.3 GiB with "
         "Liger's kernels")),
        (139.8, False, ("micro-batch 8 x 4 accumulation, without checkpointing, for a GPU of 139.8 GiB (>= 70); 8,192 "
         "padded tokens a micro-batch (x max_length 1024), 8,192 measured to fit at a peak of 54.0 GiB")),
        (79.2, True, ("micro-batch 8 x 4 accumulation, without checkpointing, for a GPU of 79.2 GiB (>= 70); 8,192 "
         "padded tokens a micro-batch (x max_length 1024), 8,192 measured to fit at a peak of 42.9 GiB with Liger's "
         "kernels")),
    ):  # fmt: skip
        chosen = cfg.sft.gpu_batch(gib, liger)
        assert chosen.line(gib, max_length) == line and chosen.peak_gib < chosen.min_gib
        args = cfg.sft.for_gpu(gib, liger)
        assert cfg.sft.effective_batch(args) == 32 and not {"max_tokens", "peak_gib", "min_gib", "liger"} & args.keys()
        assert chosen.per_device_train_batch_size * max_length <= chosen.max_tokens
    assert cfg.sft.gpu_batch(23.6, True).gradient_checkpointing and cfg.sft.gpu_batch(None, True) is None
    recipe = yaml.safe_load((REPO / "configs" / "train" / "prefmatcher-qwen2.5-7b.yaml").read_text())
    # Measured, not assumed: 16 x 2 with Liger peaks at 79.3 GiB, so it is no tier for an 80 GB card (>= 70 GiB).
    crammed = {**recipe, "sft": {**recipe["sft"], "by_gpu_memory": [dict(e) for e in recipe["sft"]["by_gpu_memory"]]}}
    crammed["sft"]["by_gpu_memory"][0]["min_gib"] = 70
    (tmp_path / "crammed.yaml").write_text(yaml.safe_dump(crammed))
    with pytest.raises(ConfigError, match=r"by_gpu_memory \(min_gib 70.0\): its peak, 79.3 GiB, does not fit the "):
        config.load(tmp_path / "crammed.yaml")
    changed = {**recipe, "sft": {**recipe["sft"], "by_gpu_memory": [dict(e) for e in recipe["sft"]["by_gpu_memory"]]}}
    changed["sft"]["by_gpu_memory"][2]["gradient_accumulation_steps"] = 8  # 64 a step: another optimisation
    (tmp_path / "changed.yaml").write_text(yaml.safe_dump(changed))
    with pytest.raises(ConfigError, match=r"by_gpu_memory \(min_gib 70.0\): 8 x 8 = 64 examples a step, .* is 32"):
        config.load(tmp_path / "changed.yaml")
    # The longest batch must fit: 32 x 1 at max_length 1024, or max_length 2048 at 8 x 4, is refused at load.
    for entry, sft_args in (
        ({"per_device_train_batch_size": 32, "gradient_accumulation_steps": 1}, {}),
        ({}, {"max_length": 2048}),
    ):
        longer = {**recipe, "sft": {**recipe["sft"], **sft_args}}
        longer["sft"]["by_gpu_memory"] = [{**recipe["sft"]["by_gpu_memory"][2], **entry}]
        (tmp_path / "longer.yaml").write_text(yaml.safe_dump(longer))
        with pytest.raises(ConfigError, match=r"padded tokens, over the 8,192 measured to fit .* lower "):
            config.load(tmp_path / "longer.yaml")


def test_a_diverged_loss_is_written_nan_in_the_reports_free_form_fields_too():
    """The reports are written as json.dumps wrote their dicts: a NaN stays NaN (pydantic's JSON mode would make the
    ones inside `dict[str, Any]` fields null)."""
    import math

    from cupid.training.sft import SftReport

    fields = {name: 0 for name, f in SftReport.model_fields.items() if f.annotation is int}
    report = SftReport.model_construct(**fields, logged_losses=[{"step": 1, "loss": math.nan}], loss_before={"x": 1.0})
    text = json.dumps(report.model_dump(mode="json", include={"logged_losses", "loss_before"}))
    assert text == '{"loss_before": {"x": 1.0}, "logged_losses": [{"step": 1, "loss": NaN}]}'


def test_liger_is_chosen_only_where_it_runs(tmp_path, monkeypatch):
    """TRL's use_liger_kernel is decided in one place (`sft.choose_liger`): on CUDA where liger-kernel imports, off on
    CPU (never imported there), off where the config says false; asked for where it cannot run, refused by name. The
    choice reaches SFTConfig and picks the tier measured as the fine-tune runs."""
    from cupid.training.sft import choose_liger, liger, sft_config

    assert choose_liger(None, True, "0.8.5", "r.yaml") == (True, "CUDA, and liger-kernel 0.8.5 imports")
    assert choose_liger(False, True, "0.8.5", "r.yaml") == (False, "the config says use_liger_kernel: false")
    assert choose_liger(None, False, None, "r.yaml") == (False, "no CUDA GPU (Liger's kernels are triton's, CUDA only)")
    missing = ImportError("No module named 'triton'")
    assert choose_liger(None, True, missing, "r.yaml") == (
        False,
        "liger-kernel does not import (No module named 'triton'); the package's gpu extra brings it",
    )
    for given, cuda, found, refusal in (
        (True, False, None, r"r\.yaml: sft\.use_liger_kernel: true, but there is no CUDA GPU here"),
        (True, True, missing, r"r\.yaml: sft\.use_liger_kernel: true, but liger-kernel does not import"),
        ("yes", True, "0.8.5", r"r\.yaml: sft\.use_liger_kernel: TRL's SFTConfig declares bool, not 'yes'"),
    ):
        with pytest.raises(ConfigError, match=refusal):
            choose_liger(given, cuda, found, "r.yaml")

    # This machine: no CUDA, so off, and liger-kernel is never imported; SFTConfig is told so.
    recipe = REPO / "configs" / "train" / "prefmatcher-qwen2.5-7b.yaml"
    cfg = config.load(recipe)
    assert liger(cfg) == (False, "no CUDA GPU (Liger's kernels are triton's, CUDA only)")
    assert sft_config(cfg, TrainDir.of(cfg), "fp32").use_liger_kernel is False
    # An H200 where liger-kernel imports: on, and the >= 120 GiB tier measured with it; false in the config: off, and
    # the tier measured without it.

    def on_cuda(c):
        return choose_liger(c.sft.args.get("use_liger_kernel"), True, "0.8.5", c.source)

    monkeypatch.setattr("cupid.training.sft.liger", on_cuda)
    monkeypatch.setattr("cupid.training.sft.gpu_gib", lambda: 139.8)
    on = sft_config(cfg, TrainDir.of(cfg), "fp32")
    assert (on.use_liger_kernel, on.per_device_train_batch_size, on.gradient_accumulation_steps) == (True, 16, 2)
    off = sft_config(config.load(recipe, {"sft.use_liger_kernel": False}), TrainDir.of(cfg), "fp32")
    assert (off.use_liger_kernel, off.per_device_train_batch_size, off.gradient_accumulation_steps) == (False, 8, 4)


def test_the_dry_run_says_whether_liger_runs(tmp_path):
    path = _write_config(tmp_path / "tiny.yaml", out=str(tmp_path / "run"))
    result = CliRunner().invoke(cupid_app, ["train", "run", "-c", str(path), "--dry-run"])
    assert result.exit_code == 0, result.output
    assert "sft: Liger's kernels (use_liger_kernel) off: no CUDA GPU (Liger's kernels are triton's, CUDA only)" in (
        result.output.splitlines()
    )


def test_the_dry_run_plan_is_the_library_own(tmp_path):
    """`cupid train run --dry-run` prints what `sft.plan` builds (the CLI only heads it with the file), so a caller of
    the library gets the same lines without the command."""
    path = _write_config(tmp_path / "tiny.yaml", out=str(tmp_path / "run"))
    cfg = config.load(path)
    lines = sft.plan(cfg, TrainDir.of(cfg))
    assert [line.split(":")[0] for line in lines] == ["sft", "sft", "sft", "lora", "quantization"]
    shown = CliRunner().invoke(cupid_app, ["train", "run", "-c", str(path), "--dry-run"]).output.splitlines()
    assert shown[1:] == lines and shown[0].startswith(f"{path}: valid; stages ")


def test_liger_asked_for_on_cpu_is_refused_in_one_line(tmp_path):
    asked = _write_config(tmp_path / "liger.yaml", out=str(tmp_path / "run"), sft={"use_liger_kernel": True})
    refused = CliRunner().invoke(cupid_app, ["train", "run", "-c", str(asked), "--dry-run"])
    assert refused.exit_code == 2 and len(refused.output.strip().splitlines()) == 1, refused.output
    assert refused.output.startswith(
        f"error: {asked}: sft.use_liger_kernel: true, but there is no CUDA GPU here and Liger's kernels are triton's"
    ), refused.output
    assert "Traceback" not in refused.output and not (tmp_path / "run").exists()


def test_what_training_replaces_in_the_models_module_is_named_and_put_back():
    """Liger patches a model's transformers module process-wide: whatever the fine-tune replaced there is named in the
    report and put back, so that the export and the check in the same process load models as a fresh process does."""
    from transformers.models.llama import modeling_llama

    from cupid.training.sft import module_kept

    norm, forward = modeling_llama.LlamaRMSNorm, modeling_llama.LlamaForCausalLM.forward
    with module_kept(modeling_llama) as replaced:
        modeling_llama.LlamaRMSNorm = type("StandInRMSNorm", (), {})  # as Liger's apply_liger_kernel_to_llama does
        modeling_llama.added_by_a_patch = True
        modeling_llama.LlamaForCausalLM.forward = lambda self, **kw: None  # Liger's fused cross-entropy, by class
    assert replaced == ["LlamaRMSNorm", "added_by_a_patch", "LlamaForCausalLM.forward"]
    assert modeling_llama.LlamaRMSNorm is norm and not hasattr(modeling_llama, "added_by_a_patch")
    assert modeling_llama.LlamaForCausalLM.forward is forward
    with module_kept(modeling_llama) as replaced:
        pass
    assert replaced == []
