"""What the fine-tune teaches: a test that needs a model that follows instructions (a random one learns no format
from 4 examples), so it runs on SmolLM2-135M, the chain's mechanics being tests/test_training.py's on the random-weight
model. Trained 10 steps on 4 examples (configs/train/tiny.yaml), the 135M model learns PrefMatcher's answer format:
its adapter's and its merged export's greedy answers to the held-out prompts parse. A file of its own so that it
runs beside the chain, on another worker."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rich.console import Console

from cupid.matcher import parse
from cupid.training import config, pipeline
from tests.conftest import REPO

TINY = REPO / "configs" / "train" / "tiny.yaml"


def _load(path: Path, **overrides) -> config.TrainConfig:
    return config.load(path, {k.replace("__", "."): v for k, v in overrides.items()})


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def smol_trained(smol_model_dir, tmp_path_factory):
    """The chain's recipe (configs/train/tiny.yaml: QLoRA, 10 steps) on SmolLM2-135M: match data labelled by the
    instant server, trained and exported (the loss is read from the logged steps: the before/after passes are the
    random model's chain, tests/test_training.py)."""
    work = tmp_path_factory.mktemp("smol")
    smol = _load(TINY, out=str(work / "run"), base_model=str(smol_model_dir), labelling__cache=str(work / "cache.sqlite"),
                 sft__measure_loss_on=[])  # fmt: skip
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CUPID_HOME", str(work / "home"))
        reports = pipeline.run(smol, Console(stderr=True), stages=("label", "sft", "export"))
    return smol, reports["sft"], reports["export"]


def _greedy_answers(model, model_dir: Path, examples: list[dict], max_tokens: int) -> list[str]:
    """The model's greedy answers to the examples' prompts, one left-padded batch."""
    import torch
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir, padding_side="left")
    batch = tok.apply_chat_template([e["prompt"] for e in examples], add_generation_prompt=True, return_tensors="pt",
                                    return_dict=True, padding=True)  # fmt: skip
    with torch.no_grad():
        out = model.eval().generate(**batch, max_new_tokens=max_tokens, do_sample=False)
    return tok.batch_decode(out[:, batch["input_ids"].shape[1] :], skip_special_tokens=True)


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
    """The adapter on the fp32 base, as vLLM serves it (PEFT computes what vLLM serves: tests/test_training.py), answers the
    held-out prompts in PrefMatcher's format: the format is learnt (train loss ~1.0 -> ~0.05), not good labels."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    smol, trained, _ = smol_trained
    losses = [r["loss"] for r in trained["logged_losses"]]
    assert losses[-1] < losses[0] / 4
    base = AutoModelForCausalLM.from_pretrained(smol_model_dir, dtype=torch.float32)
    examples = _rows(smol.out_dir / "data" / "validation.jsonl")
    model = PeftModel.from_pretrained(base, smol.out_dir / "adapter")
    _assert_prefmatcher_answers(_greedy_answers(model, smol_model_dir, examples, smol.agreement.max_tokens), examples)


def test_the_135m_models_merged_export_answers_in_prefmatchers_format(smol_trained, smol_model_dir):
    import torch
    from transformers import AutoModelForCausalLM

    smol, _, exported = smol_trained
    assert exported["merge_check"]["same_next_token"]
    examples = _rows(smol.out_dir / "data" / "validation.jsonl")
    model = AutoModelForCausalLM.from_pretrained(exported["export"], dtype=torch.float32)
    _assert_prefmatcher_answers(_greedy_answers(model, Path(exported["export"]), examples, smol.agreement.max_tokens), examples)
