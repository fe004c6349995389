"""The benchmark inside other tools: inspect-ai's tasks and its logs' import, PrefMatcher as a TRL reward."""

from __future__ import annotations

from typing import TYPE_CHECKING

from cupid.common.faces import lazy

# What the rest of the package uses of this room, by the module that defines it (imported on first use)
EXPORTS = {
    "FUNCTIONS": "cupid.eval.integrations.reward",
    "answer_of": "cupid.eval.integrations.reward",
    "format_reward": "cupid.eval.integrations.reward",
    "import_logs": "cupid.eval.integrations.inspect_log",
}
__all__ = ["FUNCTIONS", "answer_of", "format_reward", "import_logs"]
__getattr__, __dir__ = lazy(__name__, EXPORTS)

if TYPE_CHECKING:
    from cupid.eval.integrations.inspect_log import import_logs
    from cupid.eval.integrations.reward import FUNCTIONS, answer_of, format_reward
