"""Local, cost-free evaluation for the CUPID benchmark (COLM 2025) with a vLLM-served PrefMatcher judge.

The Python API (`cupid.api`): `PrefMatcher` (the judge as an object to call), `evaluate` (a whole run, giving a
`RunResult`), `compare` (two runs, paired by unit: a `Comparison`), `reward` and `reward_dataset` (PrefMatcher as a TRL
reward), `load_dataset`, `endpoint`, and the types their signatures name. Subpackages: `cupid.matcher` (the metric),
`cupid.serving` (vLLM servers, the batched client, the request cache), `cupid.eval` (the benchmark), `cupid.training`
(rebuilding PrefMatcher).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

# the API, and the types its signatures name: the one export list (`cupid.api` names these)
__all__ = [
    "Comparison",
    "ConfigError",
    "Dataset",
    "Endpoint",
    "Labels",
    "MatchItem",
    "PrefMatcher",
    "RunResult",
    "Scoring",
    "ServedModel",
    "StageError",
    "StageFailed",
    "Summary",
    "aevaluate",
    "compare",
    "endpoint",
    "evaluate",
    "format_reward",
    "load_dataset",
    "reward",
    "reward_dataset",
]

if TYPE_CHECKING:
    from cupid.api import PrefMatcher, aevaluate, endpoint, evaluate, load_dataset
    from cupid.common.config import ConfigError
    from cupid.eval.benchmark.data import Dataset
    from cupid.eval.benchmark.records import Labels, Scoring, StageError
    from cupid.eval.benchmark.runner import RunResult
    from cupid.eval.benchmark.stages import StageFailed
    from cupid.eval.benchmark.summary import Summary
    from cupid.eval.integrations.reward import format_reward, reward, reward_dataset
    from cupid.eval.results.compare import Comparison, compare
    from cupid.matcher.parse import MatchItem
    from cupid.serving.endpoint import Endpoint
    from cupid.serving.fleet.on_demand import ServedModel


def __getattr__(name: str) -> Any:
    """The API is imported on first use, so `import cupid.serving...` in a server process stays light."""
    if name == "Endpoint":
        from cupid.serving.endpoint import Endpoint

        return Endpoint
    if name in __all__:
        from cupid import api

        return getattr(api, name)
    raise AttributeError(f"module 'cupid' has no attribute {name!r}")


def __dir__() -> list[str]:
    """The API's names with the module's own, so that tab completion finds them before their first use."""
    return sorted({*globals(), *__all__})
