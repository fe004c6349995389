#!/usr/bin/env python
"""Every training path that needs no vLLM, on the GPU it is built for: the QLoRA fine-tune and its export as the
7B recipe ships them, and GRPO with a stand-in reward, on random weights in Qwen2.5-7B-Instruct's exact shape. One
prepared command for a bare CUDA machine (no registry, no Hub, no vLLM); `--shape tiny` is its CPU form, which the
suite runs.

    python scripts/gpu_train_check.py --tokenizer DIR [--out DIR]              # CUDA: the 7B shape (minutes)
    python scripts/gpu_train_check.py --shape tiny                             # CPU: the tests' random-weight shape

The model is made where it trains (on the GPU: 7.62B parameters in bf16, no download) with the tokenizer of
`--tokenizer` (default: the random-weight model's, `cupid serve prepare-tiny --random`; carry that directory to a
machine without the package's data). The match data are the bundled sample's preferences against their own checklists,
labelled by a stand-in teacher (every item covered), each preference lengthened until its example is within 32 tokens
of the recipe's `max_length` (a batch is padded to its longest example: the micro-batch the recipe picks must hold
that, or this stage runs out of memory here rather than hours into a real run), repeated to `--examples`: the
fine-tune's speed and memory, not its quality. GRPO's stand-in reward is the share of vowels in an answer (no judge
is served here): it varies within a group, so a working gradient changes the adapter; `--reward constant` gives every
answer 1.0, and the stage then fails, as it must (nothing learnt). Each stage prints its time, tokens/s and peak GPU
memory; the exit status is 1 when a stage failed (the others still run where they can; GRPO fails when it took fewer
steps than asked or learnt nothing, `grpo_report.json`'s `nothing_learnt`), 0 when all passed.

On a machine with torch, transformers, peft and accelerate but no registry: carry the package as installed (`pip
install --target DIR --no-deps` of the project's wheel and of trl, datasets, dill, multiprocess, bitsandbytes,
pydantic, pydantic-core, annotated-types, typing-inspection, tenacity and krippendorff, built for that Python), put
DIR on PYTHONPATH, and run this file from the checkout (it reads `configs/train/` there, else the package's copy).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from cupid.common.config import read_yaml
from cupid.training.grpo_memory import QWEN_7B


def make_model(shape: str, tokenizer_dir: Path, dest: Path) -> dict[str, Any]:
    """Random weights in the shape, made on the GPU where there is one, saved with the tokenizer."""
    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    from cupid.serving.servers.tiny_model import RANDOM_CONFIG

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    shape_args = QWEN_7B if shape == "qwen2.5-7b" else {**RANDOM_CONFIG, "vocab_size": len(tokenizer)}
    config = Qwen2Config(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **shape_args,
    )
    cuda = torch.cuda.is_available()
    torch.manual_seed(0)
    with torch.device("cuda" if cuda else "cpu"):
        model = Qwen2ForCausalLM(config).to(torch.bfloat16 if cuda else torch.float32)
    model.save_pretrained(dest)
    tokenizer.save_pretrained(dest)
    return {"parameters": sum(p.numel() for p in model.parameters())}


FILLER = " Keep every detail of the earlier sessions in view."
MARGIN = 32  # tokens under max_length an example is lengthened to


def lengthened(preference: str, items: list[str], completion: str, tokenizer: Any, max_length: int) -> str:
    """The preference with as many filler sentences as keep its example (prompt and completion, through the chat
    template) within `MARGIN` tokens under `max_length`."""
    from cupid.matcher import prompts

    def length(k: int) -> int:
        messages = [
            *prompts.matcher(preference + FILLER * k, items, "prefmatcher"),
            {"role": "assistant", "content": completion},
        ]
        return len(tokenizer.apply_chat_template(messages, tokenize=True, return_dict=True)["input_ids"])

    low, high = 0, 1
    while length(high) <= max_length - MARGIN:
        low, high = high, 2 * high
    while high - low > 1:  # length(low) fits, length(high) does not
        middle = (low + high) // 2
        low, high = (middle, high) if length(middle) <= max_length - MARGIN else (low, middle)
    return preference + FILLER * low


def match_data(dest: Path, n_examples: int, tokenizer_dir: Path, max_length: int) -> dict[str, Any]:
    """PrefMatcher examples from the sample: each preference, lengthened to near `max_length`, against its own
    checklist, every item covered."""
    from transformers import AutoTokenizer

    from cupid.eval.benchmark import data as cupid_data
    from cupid.matcher import prompts
    from cupid.training.examples import completion_text, prompt_key

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    rows, lengths = [], []
    for instance in cupid_data.load("sample").instances:
        items = list(instance.current_checklist)
        labels = [{"index": i, "entry": e, "label": "Fully Covered"} for i, e in enumerate(items, start=1)]
        preference = lengthened(
            instance.current_contextual_preference, items, completion_text(labels), tokenizer, max_length
        )
        prompt = prompts.matcher(preference, items, "prefmatcher")
        messages = [*prompt, {"role": "assistant", "content": completion_text(labels)}]
        lengths.append(len(tokenizer.apply_chat_template(messages, tokenize=True, return_dict=True)["input_ids"]))
        rows.append(
            {
                "id": prompt_key(prompt),
                "prompt": prompt,
                "completion": [{"role": "assistant", "content": completion_text(labels)}],
                "preference": preference,
                "items": items,
                "teacher_labels": labels,
                "direction": "gt_to_infer",
                "persona_id": instance.persona_id,
                "instance_key": instance.key,
                "instance_type": instance.instance_type,
                "setting": "standard",
                "candidate": "stand-in",
                "teacher": "stand-in",
                "teacher_prompt": "prefmatcher",
                "teacher_raw": None,
            }
        )
    dest.mkdir(parents=True, exist_ok=True)
    train = [rows[i % len(rows)] for i in range(n_examples)]
    (dest / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in train))
    (dest / "validation.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:2]))
    return {"train_examples": len(train), "max_length": max_length, "tokens": [min(lengths), max(lengths)]}


def sft_config(shape: str, model: Path, data: Path, out: Path, steps: int) -> Any:
    """The shipped recipe (the 7B's, or the tiny chain's), on the made model and data, for `steps` optimizer steps."""
    from cupid.training import config

    recipe = read_yaml(f"configs/train/{recipe_name(shape)}.yaml")
    recipe |= {"name": "gpu-train-check", "out": str(out), "base_model": str(model), "match_data": str(data)}
    recipe.pop("labelling", None)
    recipe["sft"] |= {"max_steps": steps, "save_steps": 10_000, "measure_loss_on": []}
    recipe["agreement"] = {"enabled": False}
    path = out / "sft.yaml"
    out.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(recipe))
    return config.load(path)


def recipe_name(shape: str) -> str:
    return "prefmatcher-qwen2.5-7b" if shape != "tiny" else "tiny"


def vowel_share(prompts: Any = None, completions: Any = (), **_: Any) -> list[float]:
    """The share of vowels among an answer's letters: no judge is served here, and unlike the answer's graded form
    (0 for every random-weight answer) it varies within a group, so a working gradient has an advantage to follow."""
    from cupid.eval.integrations.reward import answer_of

    texts = [answer_of(c) for c in completions]
    letters = [[ch for ch in text.lower() if ch.isalpha()] for text in texts]
    return [sum(ch in "aeiou" for ch in chars) / len(chars) if chars else 0.0 for chars in letters]


def constant(prompts: Any = None, completions: Any = (), **_: Any) -> list[float]:
    """The same reward for every answer: no advantage, nothing learnt (the stage must fail on it)."""
    return [1.0 for _ in completions]


REWARDS = {"vowels": vowel_share, "constant": constant}


def grpo_config(shape: str, model: Path, out: Path, steps: int) -> Any:
    """The shipped GRPO recipe's LoRA and arguments (the 7B's, or the tiny one's) on the made model, without vLLM
    (none runs here), the evaluation off."""
    from cupid.training import grpo

    name = "grpo-qwen2.5-7b" if shape != "tiny" else "grpo-tiny"
    recipe = read_yaml(f"configs/train/{name}.yaml")
    args = {
        k: v for k, v in recipe["grpo"].items() if not k.startswith("vllm") and k not in ("use_vllm", "reward_weights")
    }
    args |= {"max_steps": steps, "save_steps": 10_000, "log_completions": False}
    if shape == "tiny":
        args |= {"per_device_train_batch_size": 4, "num_generations": 4, "max_completion_length": 16}
    cfg = {
        "name": "gpu-train-check-grpo",
        "out": str(out),
        "policy": str(model),
        "lora": recipe["lora"],
        "data": {"source": "sample", "setting": "oracle"},  # every unit: a 7B step's 4 prompts, twice over
        "grpo": args,
        "evaluate": {"enabled": False},
    }
    path = out / "grpo.yaml"
    out.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(cfg))
    return grpo.load(path)


def stage(name: str, results: dict[str, Any], work: Callable[[], dict[str, Any]]) -> None:
    """Run one stage: its time, peak GPU memory and figures, or its error; never raises."""
    import torch

    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    started = time.monotonic()
    try:
        figures = work()
        results[name] = {"ok": True, **figures}
    except Exception as e:  # noqa: BLE001 (each stage reports its own failure; the others still run)
        traceback.print_exc()
        results[name] = {"ok": False, "error": f"{type(e).__name__}: {e}"}
    results[name]["seconds"] = round(time.monotonic() - started, 1)
    results[name]["peak_gpu_gib"] = (
        round(torch.cuda.max_memory_allocated() / 2**30, 2) if torch.cuda.is_available() else None
    )
    print(f"gpu_train_check: {name}: {json.dumps(results[name])}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=["qwen2.5-7b", "tiny"], default="qwen2.5-7b")
    parser.add_argument("--tokenizer", type=Path, default=None, help="a directory with the tokenizer's files")
    parser.add_argument("--out", type=Path, default=Path("runs/gpu_train_check"))
    parser.add_argument("--examples", type=int, default=256, help="match examples (the sample's, repeated)")
    parser.add_argument("--sft-steps", type=int, default=None, help="default: 8 (7B shape), 2 (tiny)")
    parser.add_argument("--grpo-steps", type=int, default=None, help="default: 2 (7B shape), 1 (tiny)")
    parser.add_argument("--reward", choices=list(REWARDS), default="vowels", help="GRPO's stand-in reward")
    parser.add_argument(
        "--stages", default="sft,export,grpo", help="which of sft, export, grpo to run (the model is always made)"
    )
    a = parser.parse_args(argv)
    from cupid.serving.servers import tiny_model
    from cupid.training import export, grpo, sft

    tokenizer = a.tokenizer or tiny_model.ensure_random()
    sft_steps = a.sft_steps or (2 if a.shape == "tiny" else 8)
    grpo_steps = a.grpo_steps or (1 if a.shape == "tiny" else 2)
    model_dir = a.out / "model"
    results: dict[str, Any] = {}
    wanted = set(a.stages.split(","))
    stage("model", results, lambda: make_model(a.shape, tokenizer, model_dir))
    max_length = int(read_yaml(f"configs/train/{recipe_name(a.shape)}.yaml")["sft"]["max_length"])
    if "sft" in wanted:
        stage("match_data", results, lambda: match_data(a.out / "data", a.examples, tokenizer, max_length))
    train_cfg: list[Any] = []

    def fine_tune() -> dict[str, Any]:
        train_cfg.append(sft_config(a.shape, model_dir, a.out / "data", a.out / "sft", sft_steps))
        report = sft.train(train_cfg[0])
        keys = ("trainable_parameters", "mean_tokens_per_s", "peak_gpu_memory_gib", "optimizer_steps", "loss_after")
        batch = {
            k: report.hyperparameters["sft_config"][k]
            for k in ("per_device_train_batch_size", "gradient_accumulation_steps", "gradient_checkpointing")
        }
        return {k: getattr(report, k) for k in keys} | batch

    if "sft" in wanted:
        stage("sft", results, fine_tune)
    if "export" in wanted:
        stage("export", results, lambda: export.export(train_cfg[0]).model_dump(mode="json"))

    def reinforce() -> dict[str, Any]:
        cfg = grpo_config(a.shape, model_dir, a.out / "grpo", grpo_steps)
        report = grpo.train(cfg, funcs=[REWARDS[a.reward]])
        steps = [row for row in report.log_history if "reward" in row]
        if len(steps) < grpo_steps:
            raise RuntimeError(f"{len(steps)} of {grpo_steps} GRPO steps ran")
        if report.nothing_learnt:
            raise RuntimeError(f"nothing was learnt ({a.reward} reward): {report.nothing_learnt}")
        return {
            "steps": len(steps),
            "parameters_changed": report.parameters_changed,
            "frac_reward_zero_std": [row.get("frac_reward_zero_std") for row in steps],
            "report": str(a.out / "grpo" / "grpo_report.json"),
        }

    if "grpo" in wanted:
        stage("grpo", results, reinforce)
    failed = [name for name, r in results.items() if not r["ok"]]
    (a.out / "gpu_train_check.json").write_text(json.dumps(results, indent=2, default=str))
    print(
        f"gpu_train_check: {len(results) - len(failed)} of {len(results)} stages passed"
        + (f"; failed: {', '.join(failed)}" if failed else "")
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
