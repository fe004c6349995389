"""`cupid train ...`: rebuild PrefMatcher from one config (configs/train/*.yaml).

`run` does the whole chain; `label`, `sft`, `export` and `check` run one stage each, reading what
the stages before them left in the run directory.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from cupid.common.config import ConfigError
from cupid.common.errors import EXIT_USAGE, ServeError
from cupid.eval.benchmark.data import DataError, local_path
from cupid.serving.endpoint import Endpoint
from cupid.training import agreement, config, pipeline
from cupid.training.agreement import AgreementReport
from cupid.training.matchdata import LabellingError, LabelReport
from cupid.training.sft import SftReport
from cupid.training.traindir import TrainDir

app = typer.Typer(
    no_args_is_help=True, help="Rebuild the PrefMatcher judge: match data, QLoRA fine-tune, export, agreement."
)
console = Console()
err = Console(stderr=True, soft_wrap=True)  # errors name files and rows: never wrapped

ConfigOption = typer.Option(..., "--config", "-c", help="training config YAML (configs/train/*.yaml)")
ForceOption = typer.Option(False, "--force", help="allow kixlab/CUPID (the benchmark's test split) as input to label")
OutOption = typer.Option(None, "--out", help="run directory (overrides the config's `out`)")
RunningOption = typer.Option(
    None,
    "--running",
    help="a vLLM server of the base model that loads adapters at run time (a URL, an endpoint's name or a `cupid "
    "serve` server's): the check asks the base and the adapter there instead of starting a server of its own (on one "
    "GPU, a second copy of the base would not fit); the export is still served by the check",
)


def _load(path: str, force: bool = False, out: str | None = None) -> config.TrainConfig:
    overrides: dict[str, Any] = {}
    if force:
        overrides["labelling.allow_test_split"] = True
    if out:
        overrides["out"] = out
    return config.load(path, overrides)


def _running(spec: str | None) -> Endpoint | None:
    if spec is None:
        return None
    from cupid.api import endpoint

    return _guarded(lambda: endpoint(spec))


def _guarded(action: Callable[[], Any]) -> Any:
    try:
        return action()
    except (ConfigError, DataError, LabellingError, ServeError) as e:
        err.print(
            f"[red]error:[/red] {escape(str(e))}", highlight=False, soft_wrap=True
        )  # whole lines: paths stay greppable
        raise typer.Exit(EXIT_USAGE) from None


def _print_labelling(report: LabelReport | None) -> None:
    if report is None:
        return
    table = Table("split", "examples", "personas", "items", *agreement_labels(), title="match data (label balance)")
    for split, block in (report.splits or {}).items():
        shares = [f"{block['labels'][k]} ({(block['label_shares'][k] or 0):.0%})" for k in agreement_labels()]
        table.add_row(split, str(block["n_examples"]), str(block["n_personas"]), str(block["n_items"]), *shares)
    console.print(table)
    console.print(
        f"{report.n_examples_raw} labelled pairs, {report.n_duplicates} duplicates dropped "
        f"({report.n_conflicting_duplicates} with conflicting labels)",
        highlight=False,
    )


def agreement_labels() -> tuple[str, ...]:
    from cupid.matcher.prompts import LABELS

    return LABELS


def _print_sft(report: SftReport | None) -> None:
    if report is not None:
        console.print(
            f"sft: {report.optimizer_steps} steps; mean loss "
            + ", ".join(
                f"{split} {before} -> {report.loss_after[split]}" for split, before in report.loss_before.items()
            )
            + f"; {report.mean_tokens_per_s} tokens/s; {report.train_runtime_s}s; adapter in {report.adapter}",
            highlight=False,
        )


def _print_check(report: AgreementReport | None) -> None:
    if report is None:
        return
    table = Table(
        "model",
        "parsed",
        "accuracy",
        "alpha (interval)",
        "alpha (ordinal)",
        "failed",
        title="agreement with the teacher (validation)",
    )
    for row in agreement.table(report):
        table.add_row(*row)
    console.print(table)
    for which in agreement.MODELS:
        for what, n in (report.block(which) or {}).get("failures", {}).items():
            console.print(f"[yellow]{which} failed:[/yellow] {n} x {what}", highlight=False)
    for server in report.servers:
        listed = ", ".join(m["id"] for m in server.get("listed", []))
        # a server the check found running (`--running`) was not started by it: its adapter was loaded into it
        how = (
            f"running, adapters loaded at run time: {', '.join(server['adapters']) or 'none'}"
            if server.get("loaded_at_run_time")
            else f"{server['engine']} {server['device']}"
        )
        started = "" if server.get("loaded_at_run_time") else f"started in {server['start_s']}s, "
        console.print(
            f"server {server['name']} ({how}): served {listed}; {started}answered in {server.get('ask_s', '-')}s",
            highlight=False,
        )


@app.command()
def run(
    config_path: str = ConfigOption,
    force: bool = ForceOption,
    out: str | None = OutOption,
    skip_check: bool = typer.Option(False, "--skip-check", help="stop after the export"),
    running: str | None = RunningOption,
    dry_run: bool = typer.Option(
        False,
        "--dry-run",
        help="check the config (TRL's SFTConfig arguments included) and say what would run; run nothing",
    ),
) -> None:
    """The whole chain: label match data -> fine-tune -> export -> agreement check."""
    cfg = _guarded(lambda: _load(config_path, force, out))
    stages = pipeline.STAGES[:-1] if skip_check else pipeline.STAGES
    if dry_run:
        from cupid.training import sft as sft_stage

        lines = _guarded(lambda: sft_stage.plan(cfg, TrainDir.of(cfg)))
        console.print(
            f"{config_path}: valid; stages {', '.join(stages)} into {cfg.out}", highlight=False, soft_wrap=True
        )
        for line in lines:
            console.print(line, highlight=False, soft_wrap=True)
        return
    base = _running(running)
    reports = _guarded(lambda: pipeline.run(cfg, err, stages, running=base))
    _print_labelling(reports.label)
    _print_sft(reports.sft)
    if reports.export is not None:
        console.print(f"export: {reports.export.export} ({reports.export.method})", highlight=False)
    _print_check(reports.check)
    print(f"wall time: {json.dumps(reports.wall_s)}; results in {cfg.out}")


@app.command()
def label(config_path: str = ConfigOption, force: bool = ForceOption, out: str | None = OutOption) -> None:
    """Match data only: candidates -> decomposer -> teacher labels -> train/validation JSONL."""
    cfg = _guarded(lambda: _load(config_path, force, out))
    from cupid.training import matchdata

    _print_labelling(_guarded(lambda: matchdata.label(cfg, TrainDir.of(cfg), err)))


@app.command()
def sft(config_path: str = ConfigOption, out: str | None = OutOption) -> None:
    """The QLoRA fine-tune on the run directory's match data (resumes from the newest checkpoint)."""
    cfg = _guarded(lambda: _load(config_path, out=out))
    from cupid.training import sft as sft_stage

    _print_sft(_guarded(lambda: sft_stage.train(cfg, TrainDir.of(cfg), err)))


@app.command()
def export(config_path: str = ConfigOption, out: str | None = OutOption) -> None:
    """Merge the adapter into the base and save a directory vLLM and `transformers serve` load as is."""
    cfg = _guarded(lambda: _load(config_path, out=out))
    from cupid.training import export as export_stage

    report = _guarded(lambda: export_stage.export(cfg, TrainDir.of(cfg), err))
    # as is, the file's JSON: a console would fold long strings and read [..] as markup
    print(json.dumps(report.model_dump(mode="json"), indent=2))


@app.command()
def check(config_path: str = ConfigOption, out: str | None = OutOption, running: str | None = RunningOption) -> None:
    """Serve base and export, run each as the matcher on the validation split, compare with the teacher."""
    cfg = _guarded(lambda: _load(config_path, out=out))
    base = _running(running)
    _print_check(_guarded(lambda: agreement.check(cfg, TrainDir.of(cfg), err, base)))


@app.command()
def grpo(
    config_path: str = typer.Option(..., "--config", "-c", help="GRPO config YAML (configs/train/grpo-*.yaml)"),
    out: str | None = OutOption,
    dry_run: bool = typer.Option(
        False,
        "--dry-run",
        help="check the config (TRL's GRPOConfig and peft's LoraConfig arguments, the reward's endpoints, the memory "
        "plan; local data: enough prompts for a step); run nothing",
    ),
    track: str | None = typer.Option(
        None, "--track", help="log training to mlflow or wandb (TRL's report_to; the tracker's package installed)"
    ),
) -> None:
    """Teach a policy to infer preferences: GRPO with PrefMatcher as the reward, then `cupid eval run` of the adapter
    beside the base."""
    from cupid.eval.results.track import require as require_tracker
    from cupid.training import grpo as grpo_run

    cfg = _guarded(lambda: config.load_grpo(config_path, {"out": out} if out else None))
    if track is not None:
        _guarded(lambda: require_tracker(track))  # type: ignore[arg-type]
    if dry_run:
        args, lora, funcs, plan = _guarded(lambda: grpo_run.check(cfg, TrainDir.of(cfg), track))
        given = ", ".join(f"{k}={getattr(args, k)}" for k in cfg.grpo)
        names = " + ".join(map(grpo_run.reward_name, funcs))
        if local_path(cfg.data.source) is not None:
            n = len(_guarded(lambda: grpo_run.prompts(cfg, args)))
            data = f"{n} prompts, {n // grpo_run.prompts_per_generation(args)} generation batches an epoch"
        else:  # a Hub dataset, or data still to synthesize
            data = f"data {cfg.data.source} read when the run starts"
        console.print(
            f"{config_path}: valid; GRPO into {cfg.out}; reward {names}; LoRA r={lora.r}; {data}",
            highlight=False,
            soft_wrap=True,
        )
        console.print(f"grpo: TRL's GRPOConfig accepts {given}", highlight=False, soft_wrap=True)
        for line in plan or ["memory plan: none (a CPU recipe: no `memory:`)"]:
            console.print(line, highlight=False, soft_wrap=True)
        return
    report = _guarded(lambda: grpo_run.train(cfg, TrainDir.of(cfg), err, track))
    rewards = [row["reward"] for row in report.log_history if "reward" in row]  # TRL's weighted sum, per step
    console.print(
        f"grpo: {len(rewards)} logged steps, mean reward {rewards[0] if rewards else '-'} "
        f"-> {rewards[-1] if rewards else '-'}; adapter in {report.adapter}",
        highlight=False,
    )
    if report.nothing_learnt:
        console.print(
            f"grpo: nothing was learnt ({report.nothing_learnt}): the evaluation below is the policy as it was",
            highlight=False,
        )
    for label, block in (report.evaluation.blocks() if report.evaluation is not None else {}).items():
        console.print(
            f"eval {label}: {block['figure']} ({block['n_scored']} scored, {block['n_failed']} failed), "
            f"mean reward {block['mean_reward']} in {block['run']}",
            highlight=False,
        )
