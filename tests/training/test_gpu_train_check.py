"""`scripts/gpu_train_check.py`, the GPU training check, in its CPU form: every stage passes, and each reports what it
measured (no GPU memory on CPU): the fine-tune's A/B on examples at the recipe's max_length (Liger's kernels as chosen,
then off, each side a process of its own), the export made after training in the chosen side's process, GRPO changing
the adapter under a reward that varies. With a constant reward the GRPO stage fails: nothing was learnt. The check's
own stages run through the script's `main` in this process (what is checked is its verdict and its files; a process
of their own would import torch, transformers and TRL again, ~8 s of a core each); that it starts as a user starts it
(a process of its own, the package from the checkout, its options parsed) is checked by its `--help`, and by its two
QLoRA sides."""

import json
import os
import re
import runpy
import subprocess
import sys

import yaml

from cupid.training.traindir import TrainDir
from tests.helpers import REPO

SCRIPT = REPO / "scripts" / "gpu_train_check.py"


def check_here(capsys, *args: str) -> tuple[int, str]:
    """The script's `main` with `args`, in this process: its exit status and what it printed."""
    code = runpy.run_path(str(SCRIPT))["main"](list(args))
    return code, capsys.readouterr().out


def test_the_script_starts_as_a_user_starts_it():
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.startswith("usage: gpu_train_check.py") and "--shape" in result.stdout, result.stdout


def test_the_gpu_training_check_passes_in_its_cpu_form(tmp_path, random_model_dir, capsys):
    code, out = check_here(capsys, "--shape", "tiny", "--out", str(tmp_path), "--tokenizer", str(random_model_dir),
                           "--examples", "16")  # fmt: skip
    assert code == 0, out[-3000:] + (tmp_path / "gpu_train_check.json").read_text()[-3000:]  # each stage's error
    assert out.strip().splitlines()[-1] == "gpu_train_check: 5 of 5 stages passed"
    stages = json.loads((tmp_path / "gpu_train_check.json").read_text())
    assert list(stages) == ["model", "match_data", "sft", "export", "grpo"] and all(s["ok"] for s in stages.values())
    assert stages["match_data"]["train_examples"] == 16
    low, high = stages["match_data"]["tokens"]  # every example at the recipe's longest (the tiny recipe's 512)
    assert stages["match_data"]["max_length"] == 512 and 512 - 64 <= low <= high <= 512 - 32
    # The A/B: each side a process of its own (neither this one), on the same data, its tokens/s over the timed step
    # only; on CPU Liger is off on both sides, and neither training replaced anything in the model's module.
    sft = stages["sft"]
    chosen, off = sft["chosen"], sft["off"]
    assert len({chosen["pid"], off["pid"], os.getpid()}) == 3
    keys = ("per_device_train_batch_size", "gradient_accumulation_steps", "gradient_checkpointing")
    assert [chosen[k] for k in keys] == [off[k] for k in keys] == [1, 1, False]  # the tiny recipe's, on both sides
    for side in (chosen, off):
        assert (side["optimizer_steps"], side["warmup_steps"], side["timed_steps"]) == (2, 1, 1)
        assert side["use_liger_kernel"] is False and side["replaced_in_module"] == []
        assert side["tokens_per_s"] > 0 and side["peak_gpu_memory_gib"] is None
    assert chosen["why"] == "no CUDA GPU (Liger's kernels are triton's, CUDA only)"
    assert off["why"] == "the config says use_liger_kernel: false"
    assert sft["tokens_per_s_ratio"] == round(chosen["tokens_per_s"] / off["tokens_per_s"], 3)
    assert all(s["peak_gpu_gib"] is None for s in stages.values())
    # The export, made in the chosen side's training process: the merge holds, and the export loaded for evaluation
    # there gives the logits a process that never trained gives.
    assert stages["export"]["merge_check"]["same_next_token"] and (tmp_path / "sft-chosen" / "export").is_dir()
    assert stages["export"]["logits_as_in_a_fresh_process"] == {"same": True, "max_abs_diff": 0.0}
    assert stages["grpo"]["steps"] == 1 and (tmp_path / "grpo" / "adapter" / "adapter_config.json").exists()
    grpo_report = json.loads((tmp_path / "grpo" / "grpo_report.json").read_text())
    assert grpo_report["evaluation"] is None  # no judge, no vLLM: the evaluation is off
    assert stages["grpo"]["parameters_changed"] > 0 and grpo_report["nothing_learnt"] is None
    assert stages["grpo"]["frac_reward_zero_std"] == [0.0]  # the vowels' share varies within every group


def test_tokens_per_s_leaves_out_the_warm_up_steps():
    """The steady state: the tokens of the timed steps over their time, from the end of the last warm-up step."""
    steady = runpy.run_path(str(SCRIPT))["steady_tokens_per_s"]
    rows = [
        {"step": 1, "num_tokens": 1000.0, "seconds": 9.0},  # the first step pays for the process's warm-up
        {"step": 2, "num_tokens": 2000.0, "seconds": 10.0},
        {"step": 3, "num_tokens": 3000.0, "seconds": 10.5},
        {"step": 4, "num_tokens": 4000.0, "seconds": 11.0},
    ]
    assert steady(rows, 2) == 2000.0 and steady(rows, 1) == 1500.0
    assert steady(rows, 4) is None and steady(rows[:1], 1) is None  # no timed step


def test_a_grpo_stage_that_learns_nothing_fails_the_check(tmp_path, random_model_dir, capsys):
    code, out = check_here(capsys, "--shape", "tiny", "--out", str(tmp_path), "--tokenizer", str(random_model_dir),
                           "--stages", "grpo", "--reward", "constant")  # fmt: skip
    assert code == 1, out[-3000:]
    stages = json.loads((tmp_path / "gpu_train_check.json").read_text())
    assert list(stages) == ["model", "grpo"] and not stages["grpo"]["ok"]
    assert "nothing was learnt (constant reward): every group's rewards were all alike" in stages["grpo"]["error"]
    assert out.strip().splitlines()[-1] == "gpu_train_check: 1 of 2 stages passed; failed: grpo"


def test_a_failed_stage_fails_the_check(tmp_path, random_model_dir, capsys):
    (tmp_path / "not-a-tokenizer").mkdir()
    code, out = check_here(capsys, "--shape", "tiny", "--out", str(tmp_path), "--tokenizer",
                           str(tmp_path / "not-a-tokenizer"), "--examples", "4")  # fmt: skip
    assert code == 1
    stages = json.loads((tmp_path / "gpu_train_check.json").read_text())
    # Every stage ran as far as it could and recorded its own reason (the match data need the tokenizer too).
    assert list(stages) == ["model", "match_data", "sft", "export", "grpo"] and not any(
        s["ok"] for s in stages.values()
    )
    assert all(s["error"] for s in stages.values())
    assert out.strip().splitlines()[-1].startswith("gpu_train_check: 0 of 5 stages passed; failed: model")


def test_a_max_length_that_leaves_no_completion_is_refused_by_name(tmp_path, random_model_dir):
    """Examples whose prompts alone reach sft.max_length keep no completion token: `cupid train sft` says so, with the
    count and the longest example, and exits 2 before the model loads (TRL would drop them all and stop on an empty
    sampler, naming neither)."""
    from typer.testing import CliRunner

    from cupid.cli import app

    check = runpy.run_path(str(SCRIPT))
    made = check["match_data"](TrainDir(tmp_path, tmp_path / "data"), 4, random_model_dir, 512)
    cfg = check["sft_config"]("tiny", random_model_dir, tmp_path / "data", tmp_path / "sft", 1)
    config_path = tmp_path / "sft" / "sft.yaml"
    recipe = yaml.safe_load(config_path.read_text())
    recipe["sft"]["max_length"] = 64
    config_path.write_text(yaml.safe_dump(recipe))
    result = CliRunner().invoke(app, ["train", "sft", "--config", str(config_path)])
    assert result.exit_code == 2, result.output
    line = " ".join(result.output.split())
    assert f"{config_path}: sft.max_length 64: no training example keeps a completion token after truncation" in line
    longest = re.search(
        r"\(4 of 4 are longer; every prompt alone reaches it; the longest example is (\d+) tokens\)", line
    )
    assert longest and made["tokens"][0] - 8 <= int(longest.group(1)) <= 512, line  # as the chat template counts it
    assert "Traceback" not in result.output and cfg.sft.args["max_length"] == 512
