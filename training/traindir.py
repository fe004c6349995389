"""A training run's directory (a config's `out`), beside the evaluation's `RunDir` and the synthesis's `SynthesisDir`:
the one owner of its files' names. Every stage asks it where to read and write, so that a file's name is spelled
here alone; a stage that needs another's output (the export needs the adapter) finds it by asking the same object.

    data/           the match data: train.jsonl, validation.jsonl and the labelling's report.json (or the
                    config's `match_data` directory, when the data were made elsewhere)
    label/          the labelling's input, endpoints and one evaluation run per candidate
    checkpoints/    the trainer's (TRL's `output_dir`), resumed from by a rerun
    adapter/        the trained LoRA adapter and its tokenizer
    export/         the merged model vLLM serves, written as export.partial/ and renamed when whole
    eval/           GRPO's held-out instances and one evaluation run per model
    *_report.json   each stage's typed report; chain.json the chain's stages and times
"""

from __future__ import annotations

import contextlib
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol, TypeVar

from pydantic import BaseModel

from cupid.common.config import ConfigError

Report = TypeVar("Report", bound=BaseModel)

# Each stage's report, by the stage that writes it.
REPORTS = {
    "sft": "train_report.json",
    "export": "export_report.json",
    "check": "agreement.json",
    "grpo": "grpo_report.json",
    "chain": "chain.json",
}


class _Configured(Protocol):
    @property
    def out_dir(self) -> Path: ...


class TrainDir:
    """A training run's files (see the module docstring)."""

    def __init__(self, path: str | Path, match_data: str | Path | None = None):
        self.path = Path(path)
        self.data = Path(match_data) if match_data else self.path / "data"
        self.labelling = self.path / "label"
        self.checkpoints = self.path / "checkpoints"
        self.adapter = self.path / "adapter"
        self.export = self.path / "export"
        self.evaluations = self.path / "eval"

    @classmethod
    def of(cls, cfg: _Configured) -> TrainDir:
        """The directory of a training config (its `out`, and its `match_data` where it gives one)."""
        return cls(cfg.out_dir, getattr(cfg, "match_data", None))

    # -- match data and labelling --------------------------------------------------------------

    def split(self, name: str) -> Path:
        """A split of the match data (`train`, `validation`)."""
        return self.data / f"{name}.jsonl"

    @property
    def label_report(self) -> Path:
        return self.data / "report.json"

    @property
    def label_input(self) -> Path:
        return self.labelling / "input.jsonl"

    @property
    def label_endpoints(self) -> Path:
        return self.labelling / "endpoints.yaml"

    def label_run(self, candidate: str) -> Path:
        """The labelling's evaluation run of one candidate (its name made a directory name)."""
        return self.labelling / "".join(c if c.isalnum() or c in "._-" else "_" for c in candidate)

    # -- the trained adapter and the export ----------------------------------------------------

    def has_adapter(self) -> bool:
        return (self.adapter / "adapter_config.json").is_file()

    def has_export(self) -> bool:
        return (self.export / "config.json").is_file()

    @contextlib.contextmanager
    def writing_export(self) -> Iterator[Path]:
        """The directory to write the export into: `export.partial/`, renamed `export/` when the block ends without
        an error, so that a half-written export never carries the final name."""
        partial = self.export.with_name(self.export.name + ".partial")
        if partial.exists():
            shutil.rmtree(partial)
        yield partial
        if self.export.exists():
            shutil.rmtree(self.export)
        partial.rename(self.export)

    # -- the check's answers and GRPO's evaluations ----------------------------------------------

    @property
    def agreement_answers(self) -> Path:
        return self.path / "agreement_answers.jsonl"

    @property
    def held_out(self) -> Path:
        return self.evaluations / "held_out.jsonl"

    def evaluation(self, label: str) -> Path:
        """GRPO's evaluation run of one model (`trained`, `base`)."""
        return self.evaluations / label

    # -- reports ----------------------------------------------------------------------------------

    def report_path(self, stage: str) -> Path:
        return self.label_report if stage == "label" else self.path / REPORTS[stage]

    def write_report(self, stage: str, report: BaseModel | dict[str, Any]) -> Path:
        """A stage's report as indented JSON. Written with json.dumps, not model_dump_json, so the file keeps its
        bytes: non-ASCII escaped, a diverged NaN loss written NaN, and what JSON cannot hold (a value in TRL's log
        history) written as its str."""
        path = self.report_path(stage)
        path.parent.mkdir(parents=True, exist_ok=True)
        data = report.model_dump(mode="json", fallback=str) if isinstance(report, BaseModel) else report
        path.write_text(json.dumps(data, indent=2, default=str))
        return path

    def read_report(self, stage: str, model: type[Report]) -> Report | None:
        """A stage's report as its type; None when the stage has not written it. A file its type refuses is a
        ConfigError naming the file."""
        path = self.report_path(stage)
        if not path.is_file():
            return None
        try:
            return model.model_validate(json.loads(path.read_text(encoding="utf-8")))
        except ValueError as e:
            raise ConfigError(f"{path}: not a {model.__name__}: {e}") from None
