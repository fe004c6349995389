"""What the fine-tune teaches: a test that needs a model that follows instructions (a random one learns no format
from 4 examples), so it runs on SmolLM2-135M, the chain's mechanics being tests/training/test_training.py's on the
random-weight model. Trained 4 steps on 4 examples (configs/train/tiny.yaml), the 135M model learns PrefMatcher's
answer format: its adapter's and its merged export's greedy answers to the held-out prompts parse. A file of its own
so that it runs beside the chain, on another worker."""

from __future__ import annotations

import pytest
from rich.console import Console

from cupid.matcher import parse
from cupid.training import pipeline
from tests.training.test_training import TINY, _load, _rows, greedy_answers


@pytest.fixture(scope="module")
def smol_trained(smol_model_dir, tmp_path_factory):
    """The chain's recipe (configs/train/tiny.yaml: QLoRA, 4 steps) on SmolLM2-135M: match data labelled by the
    instant server, then trained (the loss is read from the logged steps: the before/after passes are the random
    model's chain, tests/training/test_training.py). The export is a fixture of its own, `smol_exported`, as it is a
    stage of its own: each test waits for what it reads."""
    work = tmp_path_factory.mktemp("smol")
    smol = _load(
        TINY,
        out=str(work / "run"),
        base_model=str(smol_model_dir),
        labelling__cache=str(work / "cache.sqlite"),
        sft__measure_loss_on=[],
    )
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CUPID_HOME", str(work / "home"))
        reports = pipeline.run(smol, Console(stderr=True), stages=("label", "sft"))
    return smol, reports.sft


@pytest.fixture(scope="module")
def smol_exported(smol_trained):
    smol, _ = smol_trained
    return pipeline.run(smol, Console(stderr=True), stages=("export",)).export


def _assert_prefmatcher_answers(answers: list[str], examples: list[dict]) -> None:
    """Every answer in PrefMatcher's dialect, a fenced JSON list, and some parse with a label for each item."""
    assert all(a.startswith("```json\n[") for a in answers), answers
    parsed = 0
    for answer, e in zip(answers, examples, strict=True):
        try:
            parsed += len(parse.matches(answer, e["items"])) == len(e["items"])
        except parse.ParseError:
            pass
    assert parsed >= 1, answers


def test_the_fine_tune_teaches_the_135m_models_adapter_prefmatchers_answer_format(smol_trained, smol_model_dir):
    """The adapter on the fp32 base, as vLLM serves it (PEFT computes what vLLM serves:
    tests/training/test_training.py), answers the held-out prompts in PrefMatcher's format: the format is learnt
    (train loss ~1.0 -> ~0.15), not good labels. The adapter is merged into the fp32 base in fp32 (the same function
    to rounding: PEFT's unmerged layers gave the same greedy answers, in 1.4x the time)."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    smol, trained = smol_trained
    losses = [r["loss"] for r in trained.logged_losses]
    assert losses[-1] < losses[0] / 4
    base = AutoModelForCausalLM.from_pretrained(smol_model_dir, dtype=torch.float32)
    examples = _rows(smol.out_dir / "data" / "validation.jsonl")
    model = PeftModel.from_pretrained(base, smol.out_dir / "adapter").merge_and_unload()
    tok = AutoTokenizer.from_pretrained(smol_model_dir, padding_side="left")
    prompts = [e["prompt"] for e in examples]
    _assert_prefmatcher_answers(greedy_answers(model, tok, prompts, smol.agreement.max_tokens), examples)


def test_the_135m_models_merged_export_answers_in_prefmatchers_format(smol_trained, smol_exported):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    smol, exported = smol_trained[0], smol_exported
    assert exported.merge_check["same_next_token"]
    examples = _rows(smol.out_dir / "data" / "validation.jsonl")
    model = AutoModelForCausalLM.from_pretrained(exported.export, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(exported.export, padding_side="left")
    prompts = [e["prompt"] for e in examples]
    _assert_prefmatcher_answers(greedy_answers(model, tok, prompts, smol.agreement.max_tokens), examples)
