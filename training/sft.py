"""The QLoRA fine-tune: TRL's SFTTrainer on the match data, PEFT LoRA on a bitsandbytes 4-bit base.

Decisions, each following the recipe (spec §5) unless the config says otherwise:
- The data is TRL's conversational prompt-completion format, so the loss is on the assistant turn
  only (its end-of-turn token included) with the model's own chat template, unpatched.
- Gradient clipping is off unless `max_grad_norm` is set (torchtune's `clip_grad_norm: null`);
  warmup is an integer number of optimizer steps (transformers reads a value below 1 as a ratio).
- The loss is normalized by the number of completion tokens over the accumulation window
  (transformers passes `num_items_in_batch`; torchtune does the same).
- Examples longer than `max_length` are counted in the report: TRL cuts them, and drops those
  left with no completion token.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from enum import Enum
from types import ModuleType
from typing import Any

from pydantic import BaseModel, ConfigDict
from rich.console import Console

from cupid.common.config import ConfigError
from cupid.training import trl_args
from cupid.training.base_model import bnb_config, load_base, resolve_base
from cupid.training.config import TrainConfig, chain_sft_args
from cupid.training.examples import read_examples
from cupid.training.traindir import TrainDir


class SftReport(BaseModel):
    """`<out>/train_report.json`, key for key: what the fine-tune ran on and measured, typed for those who read it."""

    # a NaN (a diverged loss) is written NaN, as json.dumps of the dict wrote it, also inside free-form fields
    model_config = ConfigDict(ser_json_inf_nan="constants")

    base_model: str
    adapter: str
    resumed_from: str | None
    precision: str
    quantization: dict[str, Any] | None  # the `quantization:` arguments; null: plain LoRA
    lora: dict[str, Any]
    trainable_parameters: int
    total_parameters: int
    n_train_examples: int
    n_validation_examples: int
    n_over_max_length: int
    n_dropped_no_completion_left: int
    train_tokens_per_epoch: int
    completion_tokens_per_epoch: int
    optimizer_steps: int
    max_steps: int
    loss_before: dict[str, float]  # split -> mean completion-token loss
    loss_after: dict[str, float]
    logged_losses: list[dict[str, Any]]  # {step, loss} per logged step
    throughput: list[dict[str, Any]]  # one row per log: step, loss, learning_rate, num_tokens, tokens_per_s
    mean_tokens_per_s: float | None
    peak_gpu_memory_gib: float | None  # torch.cuda.max_memory_allocated; null on CPU
    liger: dict[str, Any]  # use_liger_kernel, why, and what of the model's module training replaced (then put back)
    gpu_memory_gib: float | None
    train_runtime_s: float
    wall_s: float
    hyperparameters: dict[str, Any]  # the `sft:` section and TRL's SFTConfig as it ran


def precision(cfg: TrainConfig) -> str:
    import torch

    if cfg.sft.precision != "auto":
        return cfg.sft.precision
    return "bf16" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "fp32"


def liger(cfg: TrainConfig) -> tuple[bool, str]:
    """Whether the fine-tune runs Liger's kernels (TRL's `use_liger_kernel`), and why (`choose_liger`), from what
    this machine has: CUDA, and then whether liger-kernel imports (on CPU it is never imported)."""
    import torch

    cuda = torch.cuda.is_available()
    return choose_liger(cfg.sft.args.get("use_liger_kernel"), cuda, _liger_kernel() if cuda else None, cfg.source)


def _liger_kernel() -> str | ImportError:
    """liger-kernel's version where it imports (triton and its kernels load), else the ImportError."""
    from importlib.metadata import version

    try:
        import liger_kernel.transformers  # noqa: F401
    except ImportError as e:
        return e
    return version("liger-kernel")


def choose_liger(given: Any, cuda: bool, liger_kernel: str | ImportError | None, source: str) -> tuple[bool, str]:
    """The one decision on Liger's kernels: on CUDA where liger-kernel imports (`liger_kernel`, its version), unless
    the config's `sft:` says `use_liger_kernel: false`; never on CPU: they are triton kernels, and the CPU install has
    no triton. Asked for (`true`) where they cannot run: a ConfigError naming the file and the key.
    TRL (1.16) applies Liger's layer kernels only (RoPE, RMSNorm, SwiGLU): its own fused LM head stands where
    Liger's fused cross-entropy would, so the full logits are never materialised either way."""
    where = f"{source}: sft.use_liger_kernel"
    if given is not None and not isinstance(given, bool):
        raise ConfigError(f"{where}: TRL's SFTConfig declares bool, not {given!r}")
    if given is False:
        return False, "the config says use_liger_kernel: false"
    if not cuda:
        if given:
            raise ConfigError(
                f"{where}: true, but there is no CUDA GPU here and Liger's kernels are triton's, CUDA only: "
                "remove it (Liger is chosen where it runs) or set it to false"
            )
        return False, "no CUDA GPU (Liger's kernels are triton's, CUDA only)"
    if not isinstance(liger_kernel, str):
        if given:
            raise ConfigError(
                f"{where}: true, but liger-kernel does not import ({liger_kernel}): install the package's gpu extra"
            )
        return False, f"liger-kernel does not import ({liger_kernel}); the package's gpu extra brings it"
    return True, f"CUDA, and liger-kernel {liger_kernel} imports"


@contextmanager
def module_kept(module: ModuleType) -> Iterator[list[str]]:
    """A model's transformers module (`modeling_qwen2`) as it was before, its classes' `forward` included: Liger's
    kernels patch it process-wide (its RMSNorm, MLP and RoPE; its fused cross-entropy, the causal LM's forward), and
    the export and the agreement check that follow in this process must load their models as a fresh process does.
    Yields the names the block replaced there, each put back when it ends."""
    names = dict(vars(module))
    classes = {name: value for name, value in names.items() if isinstance(value, type)}
    forwards = {name: cls.__dict__.get("forward") for name, cls in classes.items()}
    replaced: list[str] = []
    try:
        yield replaced
    finally:
        for name in sorted(set(names) | set(vars(module))):
            if vars(module).get(name) is not names.get(name):
                replaced.append(name)
                if name in names:
                    setattr(module, name, names[name])
                else:
                    delattr(module, name)
        for name, cls in classes.items():
            if cls.__dict__.get("forward") is not forwards[name]:
                replaced.append(f"{name}.forward")
                if forwards[name] is None:
                    delattr(cls, "forward")
                else:
                    setattr(cls, "forward", forwards[name])  # noqa: B010 (a class of any shape)


def _throughput_callback(console: Console):
    from transformers import TrainerCallback

    class Throughput(TrainerCallback):
        """One line per log: step, loss, learning rate and tokens/s since the previous log; each row also holds its
        seconds since training began, so a steady-state rate can leave out the first steps."""

        def __init__(self):
            self.rows: list[dict[str, Any]] = []
            self._last: tuple[float, float] | None = None
            self._began = time.monotonic()

        def on_train_begin(self, args, state, control, **kwargs):
            self._last = None
            self._began = time.monotonic()

        def on_log(self, args, state, control, logs=None, **kwargs):
            if not logs or "loss" not in logs:
                return
            now, tokens = time.monotonic(), float(logs.get("num_tokens", 0))
            rate = None
            if self._last is not None and now > self._last[0]:
                rate = (tokens - self._last[1]) / (now - self._last[0])
            self._last = (now, tokens)
            row = {
                "step": state.global_step,
                "loss": logs["loss"],
                "learning_rate": logs.get("learning_rate"),
                "num_tokens": tokens,
                "tokens_per_s": round(rate, 1) if rate else None,
                "seconds": round(now - self._began, 3),
            }
            self.rows.append(row)
            rate_text = f"{rate:,.0f} tokens/s" if rate else "tokens/s from the next log"
            console.print(
                f"step {state.global_step}/{state.max_steps}  loss {logs['loss']:.4f}  "
                f"lr {logs.get('learning_rate', 0):.2e}  {rate_text}",
                highlight=False,
            )

    return Throughput()


def _lengths(tokenizer, examples) -> list[tuple[int, int]]:
    """Each example's tokens through the chat template: (its prompt's, with the assistant's header; the whole)."""
    out = []
    for e in examples:
        prompt = [m.model_dump() for m in e.prompt]
        whole = prompt + [m.model_dump() for m in e.completion]
        out.append(
            (
                len(
                    tokenizer.apply_chat_template(prompt, tokenize=True, add_generation_prompt=True, return_dict=True)[
                        "input_ids"
                    ]
                ),
                len(tokenizer.apply_chat_template(whole, tokenize=True, return_dict=True)["input_ids"]),
            )
        )
    return out


def check_lengths(lengths: list[tuple[int, int]], max_length: int, source: str) -> int:
    """How many examples are over `max_length` (TRL cuts them); a ConfigError when truncation would leave no example
    a completion token (TRL then drops them all and stops on an empty sampler, naming neither)."""
    over = sum(whole > max_length for _, whole in lengths)
    if lengths and all(prompt >= max_length for prompt, _ in lengths):
        longest = max(whole for _, whole in lengths)
        raise ConfigError(
            f"{source}: sft.max_length {max_length}: no training example keeps a completion token after truncation "
            f"({over} of {len(lengths)} are longer; every prompt alone reaches it; the longest example is {longest} "
            f"tokens): raise sft.max_length to at least {longest}"
        )
    return over


# The chain's own defaults of SFTConfig arguments, which a config's `sft:` may change (the recipe's are in the YAML).
CHAIN_DEFAULTS: dict[str, Any] = {
    "gradient_checkpointing_kwargs": {"use_reentrant": False},
    "dataloader_num_workers": 0,
    "disable_tqdm": False,
}


def gpu_gib() -> float | None:
    """The first CUDA device's memory in GiB (an 80 GB H100 has 79.2); None without one."""
    import torch

    return torch.cuda.get_device_properties(0).total_memory / 2**30 if torch.cuda.is_available() else None


def peak_gpu_gib() -> float | None:
    """The most memory torch held on the GPU since the process began (None on CPU)."""
    import torch

    return round(torch.cuda.max_memory_allocated() / 2**30, 2) if torch.cuda.is_available() else None


def sft_config(cfg: TrainConfig, run: TrainDir, prec: str | None = None):
    """The `trl.SFTConfig` of this run: the config's `sft:` arguments over the chain's defaults, and what the
    chain sets itself (`config.chain_sft_args`: its checkpoints in `run`). TRL and transformers check the arguments here
    (`trl_args.build`): an unknown one, a value of another type than SFTConfig declares, or a value they refuse,
    is a ConfigError that names the file and `sft.<key>` and gives their message. Nothing is written."""
    from trl import SFTConfig

    prec = prec or precision(cfg)
    use_liger, _ = liger(cfg)
    given = cfg.sft.for_gpu(gpu_gib(), use_liger) | {"use_liger_kernel": use_liger}
    defaults = {
        **CHAIN_DEFAULTS,
        "data_seed": given.get("seed", CHAIN_DEFAULTS.get("seed")),
    }  # the data order follows the seed
    chain = chain_sft_args(run.checkpoints, prec)
    return trl_args.build(SFTConfig, "sft", given, defaults=defaults, owned=chain, source=cfg.source)


def check(cfg: TrainConfig, run: TrainDir) -> tuple[Any, Any, Any]:
    """What the fine-tune is given, checked by each owner before anything loads: TRL's `SFTConfig`, peft's
    `LoraConfig`, transformers' `BitsAndBytesConfig` (None: plain LoRA)."""
    return sft_config(cfg, run), lora_config(cfg), bnb_config(cfg)


def _shown(value: Any) -> Any:
    """An argument's value as a line shows it: a str enum by its value, a set sorted."""
    return value.value if isinstance(value, Enum) else sorted(value) if isinstance(value, set) else value


def plan(cfg: TrainConfig, run: TrainDir) -> list[str]:
    """What the fine-tune would be given, as `cupid train run --dry-run` says it, once each owner accepted it
    (`check`): TRL's, peft's and bitsandbytes' arguments as built, the micro-batch this GPU gets, Liger's kernels."""
    args, lora, bnb = check(cfg, run)

    def accepts(built: Any, keys: Iterable[str]) -> str:
        return ", ".join(f"{k}={_shown(getattr(built, k))}" for k in keys)

    quantized = f"BitsAndBytesConfig accepts {accepts(bnb, cfg.quantization.args)}" if bnb else "none (plain LoRA)"
    gib = gpu_gib()
    use_liger, why_liger = liger(cfg)
    chosen = cfg.sft.gpu_batch(gib, use_liger)
    batch = (
        chosen.line(gib, args.max_length)
        if chosen and gib
        else f"micro-batch {args.per_device_train_batch_size} x {args.gradient_accumulation_steps} accumulation "
        f"as written (GPU: {f'{gib:.1f} GiB' if gib else 'none'}; no by_gpu_memory entry for it)"
    )
    return [
        f"sft: TRL's SFTConfig accepts {accepts(args, cfg.sft.args)}",
        f"sft: {batch}",
        f"sft: Liger's kernels (use_liger_kernel) {'on' if use_liger else 'off'}: {why_liger}",
        f"lora: peft's LoraConfig accepts {accepts(lora, cfg.lora.args)}",
        f"quantization: {quantized}",
    ]


def lora_config(cfg: TrainConfig):
    """peft's `LoraConfig` of the run: the config's `lora:` arguments over the chain's defaults."""
    return trl_args.lora_config(cfg.lora.args, cfg.source)


@dataclass
class Built:
    """A fine-tune ready to run: the trainer over the match data, and what its report says of them."""

    trainer: Any  # TRL's SFTTrainer, its datasets and model set (typed optional in TRL)
    tokenizer: Any
    base: str
    args: Any  # its SFTConfig
    precision: str
    n_train_examples: int
    n_validation_examples: int
    n_over_max_length: int
    throughput: Any  # the callback's rows
    model_module: Any = None
    use_liger: bool = False
    why_liger: str = ""
    replaced_in_module: list[str] = field(default_factory=list)  # what training replaced in the model's module
    trainable_parameters: int = 0
    total_parameters: int = 0
    train_tokens: int = 0
    completion_tokens: int = 0

    def losses(self, splits: Iterable[str]) -> dict[str, float]:
        """Mean completion-token loss over whole splits: the same examples before and after, so the two numbers
        compare (the logged per-step losses are over different batches)."""
        out: dict[str, float] = {}
        for split in splits:
            dataset = self.trainer.train_dataset if split == "train" else self.trainer.eval_dataset
            if dataset is not None:
                metrics = self.trainer.evaluate(eval_dataset=dataset, metric_key_prefix=split)
                out[split] = round(metrics[f"{split}_loss"], 5)
        return out


def build_trainer(cfg: TrainConfig, run: TrainDir, console: Console) -> Built:
    """TRL's SFTTrainer on the run's match data and the base model, the arguments checked first: a bad path or data
    line fails in a second, before the heavy imports and the model."""
    base = resolve_base(cfg)
    train_examples = read_examples(run.split("train"))
    val_path = run.split("validation")
    val_examples = read_examples(val_path) if val_path.is_file() else []
    prec = precision(cfg)
    use_liger, why_liger = liger(cfg)
    args = sft_config(cfg, run, prec)  # TRL checks the `sft:` arguments before the data and the model are loaded

    import datasets
    import torch
    from transformers import AutoTokenizer
    from trl import SFTTrainer

    files = {"train": str(run.split("train"))} | ({"validation": str(val_path)} if val_examples else {})
    # Only the two columns the trainer reads: provenance columns differ in type across rows (raw: null).
    data = datasets.load_dataset("json", data_files=files).select_columns(["prompt", "completion"])
    dtype = torch.bfloat16 if prec == "bf16" else torch.float32
    tokenizer = AutoTokenizer.from_pretrained(base)
    n_long = check_lengths(_lengths(tokenizer, train_examples), args.max_length, str(cfg.source))
    throughput = _throughput_callback(console)
    model = load_base(base, cfg, dtype)
    trainer = SFTTrainer(
        model=model,
        args=args,
        train_dataset=data["train"],
        eval_dataset=data["validation"] if val_examples else None,
        processing_class=tokenizer,
        peft_config=lora_config(cfg),
        callbacks=[throughput],
    )
    built = Built(trainer, tokenizer, base, args, prec, len(train_examples), len(val_examples), n_long, throughput)
    built.use_liger, built.why_liger = use_liger, why_liger
    built.model_module = sys.modules[type(model).__module__]  # what Liger's kernels patch, put back after training
    built.trainable_parameters, built.total_parameters = trainer.model.get_nb_trainable_parameters()
    built.train_tokens = sum(len(ids) for ids in trainer.train_dataset["input_ids"])
    built.completion_tokens = sum(sum(label != -100 for label in ls) for ls in trainer.train_dataset["labels"])
    q = cfg.quantization.args
    quantized = (
        f"4-bit {q['bnb_4bit_quant_type']}"
        if q["load_in_4bit"]
        else "8-bit"
        if q.get("load_in_8bit")
        else "unquantized"
    )
    console.print(
        f"[bold]sft[/bold]: {base}, {quantized} base, LoRA r={cfg.lora.r}: {built.trainable_parameters:,} trainable of "
        f"{built.total_parameters:,} parameters; {len(trainer.train_dataset)} examples ({built.train_tokens:,} tokens, "
        f"{built.completion_tokens:,} in completions), {n_long} over max_length {args.max_length}; {prec}; "
        f"Liger's kernels {'on' if use_liger else 'off'} ({why_liger})",
        highlight=False,
    )
    return built


def train(cfg: TrainConfig, run: TrainDir, console: Console | None = None) -> SftReport:
    """Fine-tune on `run`'s match data, save the adapter into it, write the fine-tune's report; return the report."""
    from transformers.trainer_utils import get_last_checkpoint

    console = console or Console(stderr=True)
    built = build_trainer(cfg, run, console)
    checkpoints = run.checkpoints
    last = get_last_checkpoint(str(checkpoints)) if cfg.sft.resume and checkpoints.is_dir() else None
    with module_kept(built.model_module) as built.replaced_in_module:
        before = built.losses(cfg.sft.measure_loss_on)
        started = time.monotonic()
        result = built.trainer.train(resume_from_checkpoint=last)
        wall = time.monotonic() - started
        after = built.losses(cfg.sft.measure_loss_on)
    built.trainer.save_model(str(run.adapter))
    built.tokenizer.save_pretrained(str(run.adapter))
    report = sft_report(cfg, run, built, last, (before, after), result.metrics.get("train_runtime", wall), wall)
    path = run.write_report("sft", report)
    if any(v is not None and not math.isfinite(v) for v in after.values()):
        raise RuntimeError(f"training diverged: loss after training is {after}; see {path}")
    return report


def sft_report(
    cfg: TrainConfig,
    run: TrainDir,
    built: Built,
    resumed_from: str | None,
    losses: tuple[dict[str, float], dict[str, float]],
    runtime_s: float,
    wall_s: float,
) -> SftReport:
    """What the fine-tune ran on and measured, from the trainer's state after training."""
    state = built.trainer.state
    steps = [row for row in state.log_history if "loss" in row]
    rates = [row["tokens_per_s"] for row in built.throughput.rows if row["tokens_per_s"]]
    return SftReport(
        base_model=built.base,
        adapter=str(run.adapter),
        resumed_from=resumed_from,
        precision=built.precision,
        quantization=cfg.quantization.args if cfg.quantization.active else None,
        lora=cfg.lora.args,
        trainable_parameters=built.trainable_parameters,
        total_parameters=built.total_parameters,
        n_train_examples=built.n_train_examples,
        n_validation_examples=built.n_validation_examples,
        n_over_max_length=built.n_over_max_length,
        n_dropped_no_completion_left=built.n_train_examples - len(built.trainer.train_dataset),
        train_tokens_per_epoch=built.train_tokens,
        completion_tokens_per_epoch=built.completion_tokens,
        optimizer_steps=state.global_step,
        max_steps=state.max_steps,
        loss_before=losses[0],
        loss_after=losses[1],
        logged_losses=[{"step": r["step"], "loss": r["loss"]} for r in steps],
        throughput=built.throughput.rows,
        mean_tokens_per_s=round(sum(rates) / len(rates), 1) if rates else None,
        peak_gpu_memory_gib=peak_gpu_gib(),
        liger={
            "use_liger_kernel": built.use_liger,
            "why": built.why_liger,
            "replaced_in_module": built.replaced_in_module,
        },
        gpu_memory_gib=round(gib, 1) if (gib := gpu_gib()) else None,
        train_runtime_s=round(runtime_s, 2),
        wall_s=round(wall_s, 2),
        hyperparameters={**cfg.sft.model_dump(), "sft_config": built.args.to_dict()},
    )
