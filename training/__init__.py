"""Rebuilding PrefMatcher (match data, QLoRA fine-tune, export, agreement check) and GRPO with it as the reward.

bitsandbytes, imported by the fine-tune on CPU, warns on a CPU with AVX512-BF16 that an optional kernel package
(`kernels`, from the Hub) is missing, on every training command, `--dry-run` included, though its own kernels serve.
That one message is dropped here; every other message of bitsandbytes stays.
"""

import logging


class _OptionalKernelMissing(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Failed to load CPU gemm_4bit_forward from kernels-community")


logging.getLogger("bitsandbytes.backends.cpu.ops").addFilter(_OptionalKernelMissing())
