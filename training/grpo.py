"""`cupid train grpo`: teach a policy to infer preferences, with PrefMatcher as the reward (TRL's GRPOTrainer).

One YAML file (`configs/train/grpo-*.yaml`, read by `training.config.load_grpo` beside SFT's): the policy, `lora:`
(peft's `LoraConfig` arguments, under peft's names), the data (`cupid.reward_dataset`), `reward:` (the arguments of
`cupid.reward`) and `grpo:` (TRL's `GRPOConfig` arguments as given, checked by TRL at `--dry-run` as `sft:` is). The
run writes its adapter, then evaluates it with `cupid eval run` on held-out data, served by vLLM on the policy (and
the policy alone, the baseline), so a training run ends with a CUPID score beside the base model's.

The report is written before the evaluation starts, and the trainer's memory is released first: on one GPU the
evaluation's vLLM needs what the policy held. What changed is counted on the adapter's own weights against a copy of
them taken before training (the policy itself is never copied: a 7B policy in bf16 is ~15 GB). A run whose groups
never had varying rewards, or whose adapter did not change, learnt nothing, and says so beside its evaluation.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Iterable
from pathlib import Path
from typing import Any, NamedTuple

from pydantic import BaseModel, Field
from rich.console import Console

from cupid.common.config import ConfigError
from cupid.eval.benchmark import data as cupid_data
from cupid.eval.benchmark.records import UnitRecord
from cupid.eval.benchmark.rundir import RunDir
from cupid.eval.benchmark.runner import RunConfig
from cupid.eval.benchmark.runner import run as run_eval
from cupid.eval.benchmark.stats import Interval
from cupid.eval.benchmark.tasks import TASKS
from cupid.eval.integrations.reward import Judges, format_reward, reward, reward_dataset, value
from cupid.serving.fleet.on_demand import ServedModel
from cupid.serving.registry import require_reachable
from cupid.serving.servers import profiles
from cupid.serving.servers.vllm_args import lora_rank_for
from cupid.training import grpo_memory, trl_args
from cupid.training.base_model import load_policy, resolve_policy
from cupid.training.config import GrpoRunConfig
from cupid.training.traindir import TrainDir


class GrpoEvaluation(BaseModel):
    """The evaluation's block of `grpo_report.json`, key for key: `cupid eval run`'s figures of each model served."""

    # Per model: run, n_scored, n_failed, figure (micro F1, or the mean score), mean_reward, reward_units,
    # reward_judge_failures.
    trained: dict[str, Any]
    base: dict[str, Any] | None = Field(default=None, exclude_if=lambda v: v is None)  # none without `baseline`

    def blocks(self) -> dict[str, dict[str, Any]]:
        """Each evaluated model's figures, by label, in the order they ran."""
        return {"trained": self.trained} | ({"base": self.base} if self.base is not None else {})


class GrpoReport(BaseModel):
    """`<out>/grpo_report.json`, key for key: what training logged and changed, then the evaluation's figures."""

    adapter: str
    log_history: list[dict[str, Any]]  # TRL's, as it logged it
    parameters_changed: int  # adapter tensors that differ from their initial values
    nothing_learnt: str | None  # why the run learnt nothing (`learnt`); null: it may have
    evaluation: GrpoEvaluation | None  # null until the evaluation ran, and with it off


def grpo_config(cfg: GrpoRunConfig, run: TrainDir, track: str | None = None) -> Any:
    """TRL's `GRPOConfig` of the run, TRL checking the arguments (`trl_args.build`), its checkpoints in `run`.
    `track` (mlflow, wandb) is TRL's `report_to` (default: none)."""
    import torch
    from trl import GRPOConfig

    owned = {"output_dir": str(run.checkpoints)} | ({"report_to": track} if track else {})
    bf16 = torch.cuda.is_available() and torch.cuda.is_bf16_supported()  # GRPOConfig's own default (bf16) fails on CPU
    defaults = {"logging_steps": 1, "bf16": bf16, "report_to": "none"}
    return trl_args.build(GRPOConfig, "grpo", cfg.grpo, defaults=defaults, owned=owned, source=cfg.source)


def lora_config(cfg: GrpoRunConfig) -> Any:
    """peft's `LoraConfig` of the run, peft checking the arguments."""
    return trl_args.lora_config(cfg.lora, cfg.source)


def reward_funcs(cfg: GrpoRunConfig) -> list[Any]:
    """The judges' reward (`cupid.reward`), and the format reward beside it where the config asks for it."""
    rewarding = reward(**cfg.reward.model_dump())
    if cfg.format_reward:
        if TASKS[cfg.reward.task].answer_format is None:
            raise ConfigError(f"{cfg.source}: format_reward: a {cfg.reward.task} answer is free text, it has no form")
        return [rewarding, format_reward(rewarding)]
    return [rewarding]


class Checked(NamedTuple):
    """What `check` built on its way: TRL's GRPOConfig, peft's LoraConfig, the reward functions, the memory plan's
    lines (none for a CPU recipe)."""

    args: Any
    lora: Any
    funcs: list[Any]
    memory_plan: list[str]


def check(cfg: GrpoRunConfig, run: TrainDir, track: str | None = None, funcs: list[Any] | None = None) -> Checked:
    """Everything checked before the model loads but the data (`prompts`): TRL's and peft's arguments, the reward's
    endpoints, the memory plan. `funcs`: reward functions in place of the config's (a stand-in where no judge is
    served)."""
    args, lora = grpo_config(cfg, run, track), lora_config(cfg)
    funcs = funcs if funcs is not None else reward_funcs(cfg)
    if args.reward_weights is not None and len(args.reward_weights) != len(funcs):
        raise ConfigError(
            f"{cfg.source}: grpo.reward_weights: {len(args.reward_weights)} weights for {len(funcs)} reward functions "
            f"({', '.join(map(reward_name, funcs))})"
        )
    if args.use_vllm and (why := vllm_unsupported()):
        raise ConfigError(
            f"{cfg.source}: grpo.use_vllm: {why} TRL's generation through this vLLM fails: colocated, at its first "
            "weight sync into the engine (vLLM's load_weights: 'Parameter' object has no attribute 'weight_loader', "
            "seen with vLLM 0.32.0 and TRL 1.16.0). Set grpo.use_vllm: false (the trainer's model generates, "
            "slower than vLLM would), or train in an environment with a vLLM that TRL supports"
        )
    return Checked(args, lora, funcs, memory_plan(cfg, args, lora))


def vllm_unsupported() -> str | None:
    """TRL's own word that the installed vLLM is outside the range it supports (it warns and goes on; its
    generation then fails mid-run), or that none is installed; None where TRL has nothing to say."""
    import warnings

    from trl.import_utils import is_vllm_available

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        available = is_vllm_available()
    if not available:
        return "vLLM is not installed here."
    said = [str(w.message) for w in caught if "supports vLLM" in str(w.message)]
    return said[0] if said else None


def prompts(cfg: GrpoRunConfig, args: Any) -> Any:
    """The run's prompts (`cupid.reward_dataset`), refused when one generation batch draws more than there are: TRL
    would then train no step and say nothing."""
    dataset = reward_dataset(
        cfg.data.source, cfg.reward.task, cfg.data.setting, types=cfg.data.types, limit=cfg.data.limit
    )
    per_batch = prompts_per_generation(args)
    if len(dataset) < per_batch:
        raise ConfigError(
            f"{cfg.source}: data: {len(dataset)} prompts, fewer than the {per_batch} one generation batch draws "
            f"(grpo.generation_batch_size {args.generation_batch_size} / num_generations {args.num_generations}): "
            "TRL would train no step; give more prompts (data.limit) or a smaller batch"
        )
    return dataset


def prompts_per_generation(args: Any) -> int:
    """The prompts one generation batch draws (TRL's RepeatSampler): a dataset with fewer yields no batch, so no
    step; a remainder beyond whole batches is left out of each epoch."""
    return int(args.generation_batch_size // args.num_generations)


def memory_plan(cfg: GrpoRunConfig, args: Any, lora: Any) -> list[str]:
    """The run's GPU memory plan, checked (`grpo_memory`); none for a recipe without `memory:` (CPU)."""
    if cfg.memory is None:
        return []
    evaluated = cfg.evaluate.profile if cfg.evaluate.enabled and not cfg.evaluate.runtime_lora else None
    estimate = grpo_memory.policy_gib(cfg.memory, resolve_policy(cfg.policy), int(lora.r), args, cfg.source)
    return grpo_memory.check(cfg.memory, args, estimate, evaluated, cfg.evaluate.profiles, cfg.source)


def reward_name(func: Any) -> str:
    """A reward function's name, as TRL logs it (`cupid.reward` gives a partial of a named function)."""
    return str(getattr(func, "func", func).__name__)


def _judges_of(funcs: list[Any]) -> list[Judges]:
    """The judges the reward functions are bound to, each once (the judge reward and the format reward share theirs)."""
    held = [f.keywords["judges"] for f in funcs if "judges" in getattr(f, "keywords", {})]
    return list({id(j): j for j in held}.values())


def _named_trainable(model: Any) -> list[tuple[str, Any]]:
    return [(n, p) for n, p in model.named_parameters() if p.requires_grad]


def _trainable(model: Any) -> dict[str, Any]:
    """The adapter's weights, copied to the CPU: what training changes (a few MB to a few hundred), not the policy."""
    return {n: p.detach().to("cpu", copy=True) for n, p in _named_trainable(model)}


def learnt(log_history: list[dict[str, Any]], changed: int) -> str | None:
    """Why the run learnt nothing (None: it may have): no group had rewards that varied, or the adapter is as it
    began."""
    zero_std = [row["frac_reward_zero_std"] for row in log_history if "frac_reward_zero_std" in row]
    if zero_std and min(zero_std) >= 1.0:
        return "every group's rewards were all alike (TRL's frac_reward_zero_std 1.0 at every step): no advantage"
    if changed == 0:
        return "the adapter's weights are as they were initialised"
    return None


def train(
    cfg: GrpoRunConfig,
    run: TrainDir,
    console: Console | None = None,
    track: str | None = None,
    funcs: list[Any] | None = None,
) -> GrpoReport:
    """Train, write the adapter and the report into `run` (then the evaluations); return the report.
    `funcs`: reward functions in place of the config's (`scripts/gpu_train_check.py`'s stand-in, no judge served)."""
    console = console or Console(stderr=True)
    args, lora, funcs, _ = check(cfg, run, track, funcs)
    for judges in _judges_of(funcs):  # before the data and the policy load
        require_reachable(dict(judges.endpoints), {role: role for role, _ in judges.endpoints}, profiles.start_hint())
    dataset = prompts(cfg, args)

    from trl import GRPOTrainer

    model = load_policy(cfg.policy)
    trainer = GRPOTrainer(model=model, reward_funcs=funcs, args=args, train_dataset=dataset, peft_config=lora)
    initial = _trainable(trainer.model)
    names = " + ".join(map(reward_name, funcs))
    console.print(
        f"grpo: {cfg.policy}, LoRA r={lora.r}; {len(dataset)} prompts x {args.num_generations} generations; "
        f"reward {cfg.reward.task} {names}",
        highlight=False,
    )
    try:
        trainer.train()
    finally:
        _close_judges(trainer, funcs)
    adapter = run.adapter
    trainer.save_model(str(adapter))
    changed = sum(not bool((initial[n] == p.detach().cpu()).all()) for n, p in _named_trainable(trainer.model))
    log_history = list(trainer.state.log_history)
    report = GrpoReport(
        adapter=str(adapter),
        log_history=log_history,
        parameters_changed=changed,
        nothing_learnt=learnt(log_history, changed),
        evaluation=None,
    )
    run.write_report("grpo", report)  # before the evaluation: a failed evaluation keeps the training's report
    del trainer, model, initial
    _release_memory()
    if cfg.evaluate.enabled:
        report.evaluation = evaluate(cfg, run, lora.r, console)
        run.write_report("grpo", report)
    return report


def _close_judges(trainer: Any, funcs: list[Any]) -> None:
    """Close the judges' HTTP client on the loop TRL ran the async rewards on (its loop only stops, it never
    finalizes what was opened on it)."""
    loop = getattr(trainer, "async_loop", None)
    if loop is None or not loop.is_running():
        return
    for judges in _judges_of(funcs):
        asyncio.run_coroutine_threadsafe(judges.aclose(), loop).result(timeout=30)


def _release_memory() -> None:
    """What the trainer held, returned before the evaluation's vLLM asks for the GPU."""
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def evaluated_model(cfg: GrpoRunConfig, label: str, weights: Path | None) -> ServedModel:
    """The policy (with `weights`, an adapter) as the evaluation serves it: on the evaluation's profile at the GPU
    share the memory plan gives it (`grpo_memory.evaluation_share`), not vLLM's default. With `runtime_lora` the
    adapter rides on the profile's own server, as it runs."""
    ev = cfg.evaluate
    on_gpu = profiles.load(ev.profile, ev.profiles).on_gpu
    share = grpo_memory.evaluation_share(ev.profile, ev.profiles) if on_gpu and not ev.runtime_lora else None
    serve = {"vllm": {"gpu_memory_utilization": share}} if share is not None else {}  # vLLM's CPU build has none
    return ServedModel(
        name=f"{cfg.name}-{label}",
        model=cfg.policy,
        profile=ev.profile,
        adapter=str(weights) if weights else None,
        endpoint=ev.endpoint,
        serve=serve,
    )


def write_held_out(cfg: GrpoRunConfig, run: TrainDir) -> Path:
    """The evaluation data's instances of personas the training data does not hold, written into `run` for the
    evaluation runs to read: a policy is scored on people it never trained on. None left is a ConfigError."""
    ev = cfg.evaluate
    trained_on = {
        i.persona_id for i in cupid_data.load(cfg.data.source).filter(cfg.data.types, cfg.data.limit).instances
    }
    held_out = [
        i
        for i in cupid_data.load(ev.data.source).filter(ev.data.types, None).instances
        if i.persona_id not in trained_on
    ][: ev.data.limit]
    if not held_out:
        raise ConfigError(
            f"{cfg.source}: evaluate.data: every instance's persona is in the training data: nothing is held out"
        )
    run.held_out.parent.mkdir(parents=True, exist_ok=True)
    run.held_out.write_text("".join(i.model_dump_json() + "\n" for i in held_out))
    return run.held_out


def evaluate(cfg: GrpoRunConfig, run: TrainDir, rank: int, console: Console) -> GrpoEvaluation:
    """`cupid eval run` of `run`'s trained adapter (and the policy alone, `baseline`) on the held-out data, judged by
    the reward's judges, each served by vLLM with the evaluation's profile. With `runtime_lora` the adapter is loaded
    into the profile's server of the policy, as a night loads a LoRA candidate into a judge's server: one already
    answering (started with a `runtime_lora_rank`) is used as it is, no start of its own; else the run starts it and
    stops it. `rank`: the trained adapter's."""
    ev, r = cfg.evaluate, cfg.reward
    host = {ev.profile: {"runtime_lora_rank": lora_rank_for(rank)}} if ev.runtime_lora else {}
    if host and (served_model := profiles.load(ev.profile, ev.profiles).model) != cfg.policy:
        raise ConfigError(
            f"{cfg.source}: evaluate.runtime_lora: profile '{ev.profile}' serves {served_model}, "
            f"not the policy {cfg.policy}"
        )
    roles: dict[str, Any] = {role: getattr(r, role) for role in TASKS[r.task].roles}
    candidates = {"trained": run.adapter} | ({"base": None} if ev.baseline else {})
    data = write_held_out(cfg, run)
    out: dict[str, dict[str, Any]] = {}
    for label, weights in candidates.items():
        served = evaluated_model(cfg, label, weights)
        run_cfg = RunConfig(
            candidate=served,
            serve=host if weights else {},
            profiles=ev.profiles,
            **roles,
            data=str(data),
            tasks=[r.task],
            settings=[ev.data.setting],
            out=str(run.evaluation(label)),
            endpoints=r.endpoints_file,
        )
        result = run_eval(run_cfg, console=console)
        block = result.summary.tasks[r.task].overall
        records = list(RunDir(run.evaluation(label)).records().values())
        rewarded = mean_reward(cfg, records)
        out[label] = {
            "run": str(run.evaluation(label)),
            "n_scored": block.n_scored,
            "n_failed": block.n_failed,
            "figure": figure.estimate if (figure := headline(cfg, records)) else None,  # micro F1, or the mean score
            **rewarded,
        }
        console.print(
            f"grpo: {label}: {out[label]['figure']} ({block.n} scored/run), mean reward {rewarded['mean_reward']} "
            f"-> {out[label]['run']}",
            highlight=False,
        )
    return GrpoEvaluation(trained=out["trained"], base=out.get("base"))


def headline(cfg: GrpoRunConfig, records: list[UnitRecord]) -> Interval | None:
    """The task's first headline figure on the evaluation's scored units (inference: micro F1)."""
    spec = TASKS[cfg.reward.task]
    return spec.intervals(records).get(spec.headline[0])


def mean_reward(cfg: GrpoRunConfig, records: Iterable[UnitRecord]) -> dict[str, Any]:
    """What training optimised, on the evaluation's units: the mean of the judges' reward per unit, the candidate's
    own failures as 0 (as the reward gives them), judge failures left out (as TRL skips them)."""
    task, spec = cfg.reward.task, TASKS[cfg.reward.task]
    metric = cfg.reward.metric or spec.reward_metrics[0]
    values = [0.0 if spec.candidate_failed(r) else value(task, metric, r) for r in records if r.task == task]
    kept = [v for v in values if v is not None]
    return {
        "mean_reward": round(sum(kept) / len(kept), 4) if kept else None,
        "reward_units": len(kept),
        "reward_judge_failures": len(values) - len(kept),
    }
