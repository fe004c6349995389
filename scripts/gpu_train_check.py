#!/usr/bin/env python
"""Every training path that needs no vLLM, on the GPU it is built for: the QLoRA fine-tune and its export as the
7B recipe ships them, and GRPO with a stand-in reward, on random weights in Qwen2.5-7B-Instruct's exact shape. One
prepared command for a bare CUDA machine (no registry, no Hub, no vLLM); `--shape tiny` is its CPU form, which the
suite runs.

    python scripts/gpu_train_check.py --tokenizer DIR [--out DIR]              # CUDA: the 7B shape
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

The QLoRA stage is an A/B: the fine-tune with Liger's kernels as the chain chooses them (on where CUDA and
liger-kernel are; on CUDA the stage fails when they are not chosen), then with `use_liger_kernel: false`, each in a
process of its own (Liger patches the model's classes process-wide, and a process's first steps pay its warm-up), on
the same data and micro-batch (the recipe's tier for this GPU, or with `--card-gib 79.2` an 80 GB card's on a larger
one), `--warmup-steps` then `--timed-steps` optimizer steps (2 and 8 on the 7B shape; 1 and 1 on CPU, whose two sides
both run without Liger). Each side's tokens/s is over the timed steps only; `gpu_train_check.json` holds
both, their ratio and each side's peak. The chosen side exports after training in its own process, as `cupid train
run` does; the export stage fails unless the merge check holds there and the export loaded for evaluation there gives
exactly the logits it gives in this process, where no Liger ran.

On a machine with torch, transformers, peft and accelerate but no registry: carry the package as installed (`pip
install --target DIR --no-deps` of the project's wheel and of trl, datasets, dill, multiprocess, bitsandbytes,
liger-kernel,
pydantic, pydantic-core, annotated-types, typing-inspection, tenacity and krippendorff, built for that Python), put
DIR on PYTHONPATH, and run this file from the checkout (it reads `configs/train/` there, else the package's copy).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from cupid.common.config import read_yaml
from cupid.training.grpo_memory import QWEN_7B
from cupid.training.traindir import TrainDir


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
    parameters = sum(p.numel() for p in model.parameters())
    del model
    if cuda:
        torch.cuda.empty_cache()  # the QLoRA sides train in processes of their own: this one holds nothing back
    return {"parameters": parameters}


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


def match_data(dest: TrainDir, n_examples: int, tokenizer_dir: Path, max_length: int) -> dict[str, Any]:
    """PrefMatcher examples from the sample, written as `dest`'s match data: each preference, lengthened to near
    `max_length`, against its own checklist, every item covered."""
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
    dest.data.mkdir(parents=True, exist_ok=True)
    train = [rows[i % len(rows)] for i in range(n_examples)]
    dest.split("train").write_text("".join(json.dumps(r) + "\n" for r in train))
    dest.split("validation").write_text("".join(json.dumps(r) + "\n" for r in rows[:2]))
    return {"train_examples": len(train), "max_length": max_length, "tokens": [min(lengths), max(lengths)]}


def sft_config(
    shape: str,
    model: Path,
    data: Path,
    out: Path,
    steps: int,
    *,
    liger_off: bool = False,
    batch: dict[str, Any] | None = None,
    card_gib: float | None = None,
) -> Any:
    """The shipped recipe (the 7B's, or the tiny chain's), on the made model and data, for `steps` optimizer steps,
    each logged; Liger's kernels as the chain chooses them, or off (`liger_off`); the micro-batch `batch` where given
    (the other side's), else the recipe's tier for this GPU, among those for a card of at most `card_gib` GiB."""
    from cupid.training import config

    recipe = read_yaml(f"configs/train/{recipe_name(shape)}.yaml")
    recipe |= {"name": "gpu-train-check", "out": str(out), "base_model": str(model), "match_data": str(data)}
    recipe.pop("labelling", None)
    recipe["sft"] |= {"max_steps": steps, "save_steps": 10_000, "measure_loss_on": [], "logging_steps": 1}
    if liger_off:
        recipe["sft"]["use_liger_kernel"] = False
    if batch:
        recipe["sft"] |= batch
        recipe["sft"].pop("by_gpu_memory", None)
    elif card_gib:
        recipe["sft"]["by_gpu_memory"] = [e for e in recipe["sft"].get("by_gpu_memory", []) if e["min_gib"] <= card_gib]
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
    from cupid.training import config

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
    return config.load_grpo(path)


BATCH_KEYS = ("per_device_train_batch_size", "gradient_accumulation_steps", "gradient_checkpointing")
SIDES = ("chosen", "off")  # Liger's kernels as the chain chooses them (on where CUDA and liger-kernel are), and off


def steady_tokens_per_s(throughput: list[dict[str, Any]], warmup_steps: int) -> float | None:
    """Tokens a second from the end of the warm-up steps to the last step (a ratio of sums over the timed steps; the
    first steps pay for the process's warm-up)."""
    rows = {row["step"]: row for row in throughput}
    last = max(rows, default=0)
    if warmup_steps not in rows or last <= warmup_steps:
        return None
    start, end = rows[warmup_steps], rows[last]
    return round((end["num_tokens"] - start["num_tokens"]) / (end["seconds"] - start["seconds"]), 1)


def one_side(config_path: Path, warmup_steps: int, export_too: bool) -> int:
    """One side of the A/B, in a process of its own: the fine-tune, and where asked the export after it in this same
    process (as `cupid train run` runs them), then the export loaded for evaluation here, its logits on the probe
    saved for a fresh process to compare. Writes `side.json` beside the config."""
    from cupid.training import config, export, sft

    cfg = config.load(config_path)
    run = TrainDir.of(cfg)
    report = sft.train(cfg, run)
    batch = report.hyperparameters["sft_config"]
    figures: dict[str, Any] = {
        "pid": os.getpid(),
        **report.liger,
        "tokens_per_s": steady_tokens_per_s(report.throughput, warmup_steps),
        "warmup_steps": warmup_steps,
        "timed_steps": report.optimizer_steps - warmup_steps,
        "peak_gpu_memory_gib": report.peak_gpu_memory_gib,
        "optimizer_steps": report.optimizer_steps,
        "trainable_parameters": report.trainable_parameters,
        "loss_after": report.loss_after,
        "logged_losses": report.logged_losses,
        **{
            k: batch[k]
            for k in ("per_device_train_batch_size", "gradient_accumulation_steps", "gradient_checkpointing")
        },
    }
    if export_too:
        figures["export"] = export.export(cfg, run).model_dump(mode="json")
        figures["export"]["probe_logits"] = str(evaluation_logits(cfg, run, config_path.parent / "probe_logits.pt"))
    (config_path.parent / "side.json").write_text(json.dumps(figures, indent=2, default=str))
    return 0


def evaluation_logits(cfg: Any, run: TrainDir, dest: Path | None = None) -> Any:
    """`run`'s export loaded for evaluation in this process, its logits on the first validation prompt (saved to
    `dest` where given)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from cupid.training import export
    from cupid.training.examples import read_examples

    where = run.export
    model = AutoModelForCausalLM.from_pretrained(
        where, dtype=getattr(torch, cfg.export.dtype), device_map={"": 0} if torch.cuda.is_available() else None
    )
    probe = [m.model_dump() for m in read_examples(run.split("validation"))[0].prompt]
    logits = export.probe_logits(model.eval(), AutoTokenizer.from_pretrained(where), probe)
    del model
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    if dest is not None:
        torch.save(logits, dest)
        return dest
    return logits


def run_side(side: str, cfg: Any, warmup_steps: int, export_too: bool) -> dict[str, Any]:
    """One side in a process of its own (its output in `side.log`): its figures, or its log's end as the error."""
    here = Path(cfg.source).parent
    command = [sys.executable, __file__, "--side-config", cfg.source, "--warmup-steps", str(warmup_steps)]
    done = subprocess.run(
        command + (["--side-export"] if export_too else []), capture_output=True, text=True, check=False
    )
    (here / "side.log").write_text(done.stdout + done.stderr)
    if done.returncode != 0 or not (here / "side.json").is_file():
        raise RuntimeError(f"the {side} side exited {done.returncode}: {(done.stdout + done.stderr)[-2000:]}")
    return json.loads((here / "side.json").read_text())


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
    parser.add_argument(
        "--warmup-steps",
        type=int,
        default=None,
        help="QLoRA steps left out of tokens/s; default: 2 (7B shape), 1 (tiny)",
    )
    parser.add_argument("--timed-steps", type=int, default=None, help="QLoRA steps timed; default: 8 (7B), 1 (tiny)")
    parser.add_argument(
        "--card-gib", type=float, default=None, help="time the recipe's tier for a card of this many GiB (80 GB: 79.2)"
    )
    parser.add_argument("--side-config", type=Path, default=None, help=argparse.SUPPRESS)  # one side, in its process
    parser.add_argument("--side-export", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--grpo-steps", type=int, default=None, help="default: 2 (7B shape), 1 (tiny)")
    parser.add_argument("--reward", choices=list(REWARDS), default="vowels", help="GRPO's stand-in reward")
    parser.add_argument(
        "--stages", default="sft,export,grpo", help="which of sft, export, grpo to run (the model is always made)"
    )
    a = parser.parse_args(argv)
    warmup_steps = a.warmup_steps if a.warmup_steps is not None else 1 if a.shape == "tiny" else 2
    if warmup_steps < 1 or (a.timed_steps is not None and a.timed_steps < 1):
        parser.error("--warmup-steps and --timed-steps: at least 1 (the timing starts at the end of a step)")
    if a.side_config:
        return one_side(a.side_config, warmup_steps, a.side_export)
    from cupid.serving.servers import tiny_model
    from cupid.training import grpo

    tokenizer = a.tokenizer or tiny_model.ensure_random()
    timed_steps = a.timed_steps or (1 if a.shape == "tiny" else 8)
    grpo_steps = a.grpo_steps or (1 if a.shape == "tiny" else 2)
    model_dir = a.out / "model"
    results: dict[str, Any] = {}
    wanted = set(a.stages.split(","))
    stage("model", results, lambda: make_model(a.shape, tokenizer, model_dir))
    max_length = int(read_yaml(f"configs/train/{recipe_name(a.shape)}.yaml")["sft"]["max_length"])
    if "sft" in wanted:
        made = TrainDir(a.out, a.out / "data")  # the match data both sides' configs read (`match_data`)
        stage("match_data", results, lambda: match_data(made, a.examples, tokenizer, max_length))
    sides: dict[str, Any] = {}

    def fine_tune() -> dict[str, Any]:
        """The A/B: QLoRA with Liger's kernels as chosen, then off, each in a process of its own on the same data;
        the chosen side also exports, as `cupid train run` does after training."""
        import torch

        steps, batch = warmup_steps + timed_steps, None
        for side in SIDES:  # the off side on the chosen side's micro-batch: Liger is the one difference
            cfg = sft_config(a.shape, model_dir, a.out / "data", a.out / f"sft-{side}", steps, liger_off=side == "off",
                             batch=batch, card_gib=a.card_gib)  # fmt: skip
            figures = run_side(side, cfg, warmup_steps, "export" in wanted and side == "chosen")
            sides[side] = {"cfg": cfg, "figures": figures}
            batch = {k: figures[k] for k in BATCH_KEYS}
        chosen, off = (sides[side]["figures"] for side in SIDES)
        if torch.cuda.is_available() and not chosen["use_liger_kernel"]:
            raise RuntimeError(f"Liger's kernels are not chosen on this GPU: {chosen['why']}")
        for side, figures in zip(SIDES, (chosen, off), strict=True):
            if figures["replaced_in_module"] and not figures["use_liger_kernel"]:
                raise RuntimeError(f"the {side} side ran without Liger, yet {figures['replaced_in_module']} changed")
        ratio = chosen["tokens_per_s"] / off["tokens_per_s"] if chosen["tokens_per_s"] and off["tokens_per_s"] else None
        return {
            "chosen": {k: v for k, v in chosen.items() if k != "export"},
            "off": off,
            "tokens_per_s_ratio": round(ratio, 3) if ratio else None,
        }

    if "sft" in wanted:
        stage("sft", results, fine_tune)

    def exported() -> dict[str, Any]:
        """The chosen side's export (made in its training process): its merge check holds, and the export loaded for
        evaluation there gives the logits it gives here, in a process where no Liger ran."""
        import torch

        cfg, figures = sides["chosen"]["cfg"], sides["chosen"]["figures"]["export"]
        if not figures["merge_check"].get("same_next_token"):
            raise RuntimeError(f"the merge check fails: {figures['merge_check']}")
        there, here = torch.load(figures["probe_logits"]), evaluation_logits(cfg, TrainDir.of(cfg))
        figures["logits_as_in_a_fresh_process"] = {
            "same": bool(torch.equal(there, here)),
            "max_abs_diff": float((there - here).abs().max()),
        }
        if not figures["logits_as_in_a_fresh_process"]["same"]:
            raise RuntimeError(f"the export loaded after training differs: {figures['logits_as_in_a_fresh_process']}")
        return figures

    if "export" in wanted:
        stage("export", results, exported)

    def reinforce() -> dict[str, Any]:
        cfg = grpo_config(a.shape, model_dir, a.out / "grpo", grpo_steps)
        run = TrainDir.of(cfg)
        report = grpo.train(cfg, run, funcs=[REWARDS[a.reward]])
        steps = [row for row in report.log_history if "reward" in row]
        if len(steps) < grpo_steps:
            raise RuntimeError(f"{len(steps)} of {grpo_steps} GRPO steps ran")
        if report.nothing_learnt:
            raise RuntimeError(f"nothing was learnt ({a.reward} reward): {report.nothing_learnt}")
        return {
            "steps": len(steps),
            "parameters_changed": report.parameters_changed,
            "frac_reward_zero_std": [row.get("frac_reward_zero_std") for row in steps],
            "report": str(run.report_path("grpo")),
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
