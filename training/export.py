"""Export the fine-tuned matcher as one self-contained model directory.

Merge method: dequantize-then-merge. The base is loaded exactly as in training (same NF4
quantization, which is deterministic), dequantized, and the adapter is merged into it:
W = dequant(NF4(W0)) + BA, saved in `export.dtype` (bf16 by default). Why this and not W0 + BA on
the bf16 base: the adapter was trained to correct the *quantized* weights, so this export computes
the function that was trained and validated (up to bf16 rounding), and it is what the original
recipe (torchtune's QLoRA) saved for kixlab/prefmatcher-7b. The price is that the quantization
error of the base stays in the export. The other form remains available: the adapter directory
is kept, and `vllm serve <base> --enable-lora` puts it on the bf16 base (W0 + BA).

The directory holds weights, tokenizer, chat template and a generation config whose EOS includes
the chat template's end-of-turn token, so `transformers serve` and vLLM stop at the end of the
answer instead of running to max_tokens.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict
from rich.console import Console

from cupid.common.config import ConfigError
from cupid.training.base_model import load_base, resolve_base
from cupid.training.config import TrainConfig
from cupid.training.examples import read_examples
from cupid.training.traindir import TrainDir

PROBE = [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": "MARKER-7d1f"}]


class ExportReport(BaseModel):
    """`<out>/export_report.json`, key for key: where the merged model went, how it was merged and how to serve it."""

    # a NaN (a diverged loss) is written NaN, as json.dumps of the dict wrote it, also inside free-form fields
    model_config = ConfigDict(ser_json_inf_nan="constants")

    export: str
    adapter: str
    base_model: str
    method: str
    dtype: str
    end_of_turn_token: str
    eos_token_id: list[int]  # the end-of-turn token's first
    merge_check: dict[str, Any]  # max_abs_logit_diff, same_next_token; empty without validation data
    size_bytes: int
    serve: dict[str, str]  # "merged", "adapter": the vLLM command of each
    wall_s: float


def end_of_turn_token(tokenizer) -> str:
    """The special token the chat template puts right after an assistant message."""
    text = tokenizer.apply_chat_template(PROBE, tokenize=False)
    if "MARKER-7d1f" not in text:
        raise ConfigError("the chat template does not render assistant messages")
    tail = text.split("MARKER-7d1f", 1)[1]
    specials = sorted(
        {*tokenizer.all_special_tokens, *(t.content for t in tokenizer.added_tokens_decoder.values())},
        key=len,
        reverse=True,
    )
    for token in specials:
        if token and tail.startswith(token):
            return token
    if tokenizer.eos_token and tokenizer.eos_token in tail:
        return tokenizer.eos_token
    raise ConfigError(
        f"cannot find the end-of-turn token after an assistant message in the chat template (it renders {tail!r})"
    )


def _lora_rank(cfg: TrainConfig) -> int:
    """--max-lora-rank for serving the adapter: the check's, or the smallest rank vLLM accepts that fits."""
    from cupid.serving.servers.vllm_args import lora_rank_for

    if cfg.agreement.max_lora_rank >= cfg.lora.r:
        return cfg.agreement.max_lora_rank
    return lora_rank_for(cfg.lora.r)


def probe_logits(model, tokenizer, messages) -> Any:
    import torch

    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)[
        "input_ids"
    ]
    with torch.no_grad():
        return model(input_ids=ids.to(model.device)).logits.float().cpu()


def export(cfg: TrainConfig, run: TrainDir, console: Console | None = None) -> ExportReport:
    """Merge `run`'s adapter into the base and save it into `run`'s export directory; write the export's report."""
    console = console or Console(stderr=True)
    import torch
    from transformers import AutoTokenizer

    adapter = run.adapter
    if not run.has_adapter():
        raise ConfigError(f"{adapter}: no trained adapter here; run `cupid train sft --config {cfg.source}` first")
    base = resolve_base(cfg)
    dtype = getattr(torch, cfg.export.dtype)
    started = time.monotonic()
    tokenizer = AutoTokenizer.from_pretrained(adapter)
    eot = end_of_turn_token(tokenizer)
    val = run.split("validation")
    probe = [m.model_dump() for m in read_examples(val)[0].prompt] if val.is_file() else None
    model, method, check = merged_model(cfg, base, adapter, dtype, tokenizer, probe)
    model.generation_config = stopping_at_end_of_turn(model, base, tokenizer, eot)
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config

    out = run.export
    with run.writing_export() as partial:  # a half-written export never carries the final name
        model.save_pretrained(partial)
        tokenizer.save_pretrained(partial)
    if not tokenizer.chat_template or not (
        (out / "chat_template.jinja").is_file() or "chat_template" in (out / "tokenizer_config.json").read_text()
    ):
        raise RuntimeError(f"{out}: the chat template was not saved")

    eos = model.generation_config.eos_token_id
    report = ExportReport(
        export=str(out),
        adapter=str(adapter),
        base_model=base,
        method=method,
        dtype=cfg.export.dtype,
        end_of_turn_token=eot,
        eos_token_id=eos,
        merge_check=check,
        size_bytes=sum(p.stat().st_size for p in out.rglob("*") if p.is_file()),
        serve={
            "merged": f"vllm serve {out} --served-model-name {cfg.name}",
            "adapter": (
                f"vllm serve {base} --enable-lora --max-lora-rank {_lora_rank(cfg)} --lora-modules {cfg.name}={adapter}"
            ),
        },
        wall_s=round(time.monotonic() - started, 2),
    )
    run.write_report("export", report)
    console.print(f"[bold]export[/bold]: {method} -> {out} ({cfg.export.dtype}, eos {eos} = {eot})", highlight=False)
    return report


def merged_model(
    cfg: TrainConfig, base: str, adapter: Path, dtype: Any, tokenizer: Any, probe: list[dict[str, str]] | None
) -> tuple[Any, str, dict[str, Any]]:
    """The adapter merged into the base (dequantized first when training quantized it), the merge's method, and,
    given a `probe` prompt, how far the merged model's logits are from the adapter's on the base as trained."""
    from peft import PeftModel

    model = load_base(base, cfg, dtype)
    check: dict[str, Any] = {}
    if probe is not None:
        # The function that was trained: the adapter on the (quantized) base, exactly as in training.
        with_adapter = PeftModel.from_pretrained(model, adapter)
        with_adapter.eval()
        reference = probe_logits(with_adapter, tokenizer, probe)
        model = with_adapter.unload()  # the untouched base again
    method = "merge into the unquantized base"
    if cfg.quantization.active:
        model = model.dequantize(dtype=dtype)  # W' = dequant(NF4(W0)), in place of every Linear4bit
        method = "dequantize-then-merge: dequant(NF4(W0)) + BA"
    model = PeftModel.from_pretrained(model, adapter).merge_and_unload()
    model = model.to(dtype)
    model.eval()
    if probe is not None:
        merged = probe_logits(model, tokenizer, probe)
        check = {
            "max_abs_logit_diff": round(float((merged - reference).abs().max()), 5),
            "same_next_token": bool((merged[0, -1].argmax() == reference[0, -1].argmax()).item()),
        }
    return model, method, check


def stopping_at_end_of_turn(model: Any, base: str, tokenizer: Any, eot: str) -> Any:
    """The base's generation config (the model's where the base has none) with the end-of-turn token first among
    the EOS tokens, so that servers stop at the end of the answer instead of running to max_tokens."""
    from transformers import GenerationConfig

    generation = model.generation_config or GenerationConfig()
    try:
        generation = GenerationConfig.from_pretrained(base)
    except OSError:
        pass
    eos = generation.eos_token_id
    eos_ids = [eos] if isinstance(eos, int) else list(eos or [])
    eot_id = tokenizer.convert_tokens_to_ids(eot)
    generation.eos_token_id = [eot_id, *[i for i in eos_ids if i != eot_id]]
    if generation.pad_token_id is None and tokenizer.pad_token_id is not None:
        generation.pad_token_id = tokenizer.pad_token_id
    return generation
