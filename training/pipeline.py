"""The whole chain from one config: label match data -> fine-tune -> export -> agreement check.

Every stage writes its own report into the run directory and can be run alone (`cupid train label`,
`sft`, `export`, `check`); the chain is those stages in order, timed.
"""

from __future__ import annotations

import time
from typing import Any

from pydantic import BaseModel
from rich.console import Console

from cupid.serving.endpoint import Endpoint
from cupid.training import agreement, export, matchdata, sft
from cupid.training.agreement import AgreementReport
from cupid.training.config import TrainConfig
from cupid.training.export import ExportReport
from cupid.training.matchdata import LabelReport
from cupid.training.sft import SftReport
from cupid.training.traindir import TrainDir

STAGES = ("label", "sft", "export", "check")


class PipelineReport(BaseModel):
    """The chain's stage reports, for the CLI to print: a stage not run, or off in the config, has None."""

    label: LabelReport | None = None
    sft: SftReport | None = None
    export: ExportReport | None = None
    check: AgreementReport | None = None
    wall_s: dict[str, float]  # stage -> seconds, and their "total" (also in `<out>/chain.json`)


def run(
    cfg: TrainConfig, console: Console | None = None, stages: tuple[str, ...] = STAGES, running: Endpoint | None = None
) -> PipelineReport:
    """The stages asked, in order, over the config's one run directory: each reads what the one before it wrote there.
    `running`: a vLLM server of the base model for the check (see `agreement.check`)."""
    console = console or Console(stderr=True)
    out = TrainDir.of(cfg)
    if "sft" in stages:
        sft.check(cfg, out)  # TRL, peft, transformers refuse a wrong argument now, not after the match data are made
    steps = {
        "label": lambda: matchdata.label(cfg, out, console) if cfg.labelling is not None else None,
        "sft": lambda: sft.train(cfg, out, console),
        "export": lambda: export.export(cfg, out, console),
        "check": lambda: agreement.check(cfg, out, console, running) if cfg.agreement.enabled else None,
    }
    reports: dict[str, Any] = {}
    wall: dict[str, float] = {}
    for stage in stages:
        started = time.monotonic()
        reports[stage] = steps[stage]()
        wall[stage] = round(time.monotonic() - started, 2)
        _release_memory()
    wall_s = {**wall, "total": round(sum(wall.values()), 2)}
    out.write_report("chain", {"config": cfg.source, "stages": list(stages), "wall_s": wall_s})
    return PipelineReport(**reports, wall_s=wall_s)


def _release_memory() -> None:
    """Stages return reports, never models: collect what they held so that the next stage (or the
    vLLM server the check starts, a separate process) finds the GPU memory free."""
    import gc
    import sys

    gc.collect()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.empty_cache()
