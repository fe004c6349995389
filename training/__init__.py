"""Rebuilding PrefMatcher (match data, QLoRA fine-tune, export, agreement check) and GRPO with it as the reward.

bitsandbytes, imported by the fine-tune on CPU, warns on a CPU with AVX512-BF16 that an optional kernel package
(`kernels`, from the Hub) is missing, on every training command, `--dry-run` included, though its own kernels serve.
That one message is dropped here; every other message of bitsandbytes stays.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from cupid.common.faces import lazy


class _OptionalKernelMissing(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Failed to load CPU gemm_4bit_forward from kernels-community")


logging.getLogger("bitsandbytes.backends.cpu.ops").addFilter(_OptionalKernelMissing())


# What the rest of the package uses of this room, by the module that defines it (imported on first use)
EXPORTS = {
    "AgreementReport": "cupid.training.agreement",
    "LabelReport": "cupid.training.matchdata",
    "LabellingError": "cupid.training.matchdata",
    "QWEN_7B": "cupid.training.grpo_memory",
    "SftReport": "cupid.training.sft",
    "bnb_config": "cupid.training.sft",
    "check": "cupid.training.sft",
    "completion_text": "cupid.training.matchdata",
    "learnt": "cupid.training.grpo",
    "lora_config": "cupid.training.sft",
    "policy_estimate": "cupid.training.grpo_memory",
    "prompt_key": "cupid.training.matchdata",
    "sft_config": "cupid.training.sft",
}
__all__ = [
    "QWEN_7B",
    "AgreementReport",
    "LabelReport",
    "LabellingError",
    "SftReport",
    "bnb_config",
    "check",
    "completion_text",
    "learnt",
    "lora_config",
    "policy_estimate",
    "prompt_key",
    "sft_config",
]
__getattr__, __dir__ = lazy(__name__, EXPORTS)

if TYPE_CHECKING:
    from cupid.training.agreement import AgreementReport
    from cupid.training.grpo import learnt
    from cupid.training.grpo_memory import QWEN_7B, policy_estimate
    from cupid.training.matchdata import LabellingError, LabelReport, completion_text, prompt_key
    from cupid.training.sft import SftReport, bnb_config, check, lora_config, sft_config
