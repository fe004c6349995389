"""`scripts/gpu_train_check.py`, the GPU training check, in its CPU form: run as a user runs it (a process of its own,
the package from the checkout), every stage passes, and each reports what it measured (no GPU memory on CPU)."""

import json
import subprocess
import sys

from tests.conftest import REPO


def test_the_gpu_training_check_passes_in_its_cpu_form(tmp_path, random_model_dir):
    result = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "gpu_train_check.py"), "--shape", "tiny", "--out", str(tmp_path),
         "--tokenizer", str(random_model_dir), "--examples", "16"],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == "gpu_train_check: 5 of 5 stages passed"
    stages = json.loads((tmp_path / "gpu_train_check.json").read_text())
    assert list(stages) == ["model", "match_data", "sft", "export", "grpo"] and all(s["ok"] for s in stages.values())
    assert stages["match_data"]["train_examples"] == 16
    assert stages["sft"]["optimizer_steps"] == 2 and stages["sft"]["mean_tokens_per_s"] > 0
    assert stages["sft"]["peak_gpu_memory_gib"] is None and all(s["peak_gpu_gib"] is None for s in stages.values())
    assert stages["export"]["merge_check"]["same_next_token"] and (tmp_path / "sft" / "export" / "config.json").exists()
    assert stages["grpo"]["steps"] == 1 and (tmp_path / "grpo" / "adapter" / "adapter_config.json").exists()
    grpo_report = json.loads((tmp_path / "grpo" / "grpo_report.json").read_text())
    assert grpo_report["evaluation"] is None  # no judge, no vLLM: the evaluation is off


def test_a_failed_stage_fails_the_check(tmp_path, random_model_dir):
    (tmp_path / "not-a-tokenizer").mkdir()
    result = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "gpu_train_check.py"), "--shape", "tiny", "--out", str(tmp_path),
         "--tokenizer", str(tmp_path / "not-a-tokenizer"), "--examples", "4"],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert result.returncode == 1
    stages = json.loads((tmp_path / "gpu_train_check.json").read_text())
    assert not stages["model"]["ok"] and stages["match_data"]["ok"]  # the others still ran where they could
    assert result.stdout.strip().splitlines()[-1].startswith("gpu_train_check: 1 of 5 stages passed; failed: model")
