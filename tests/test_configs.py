"""Every shipped run config is valid and names endpoints that exist."""

from pathlib import Path

import pytest

from cupid.common.config import read_yaml, validate
from cupid.eval.benchmark.runner import RunConfig
from cupid.serving.registry import load_endpoints

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("path", sorted((REPO / "configs" / "eval").glob("*.yaml")), ids=lambda p: p.name)
def test_run_configs_are_valid(path):
    raw = read_yaml(path)
    if "models" in raw:  # a nightly suite: its shared `run` block plus each model as candidate
        raw = {**raw["run"], "candidate": raw["models"][0]}
    cfg = validate(RunConfig, raw, str(path))
    endpoints = load_endpoints(REPO / cfg.endpoints)
    for name in [*cfg.roles().bound().values(), cfg.reference]:
        assert name is None or name in endpoints, f"{path.name}: no endpoint '{name}'"
