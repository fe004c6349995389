"""Serve profiles: the vLLM command lines they build, the multi-profile plan and its refusals, and the
clear messages where there is no CUDA or no vLLM. Nothing here starts a server."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from cupid import app
from serving import profiles
from serving.config import ConfigError
from serving.engines import ServeError, get_engine
from serving.profiles import Gpu, Plan, Profile
from tests.conftest import REPO

SERVE_DIR = REPO / "configs" / "serve"
H100 = [Gpu(0, "NVIDIA H100 80GB HBM3", 81559, 0)]
RTX = [Gpu(0, "NVIDIA GeForce RTX 4090", 24564, 300)]


def command(profile: Profile) -> list[str]:
    spec = profile.spec()
    return get_engine(spec.engine).command(spec, Path("/srv"))


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
        assert cmd[1:3] == ["-m", "vllm.entrypoints.openai.api_server"], name
        assert value(cmd, "--model") == profile.model_path(), name
        assert value(cmd, "--generation-config") == "vllm", name
        assert value(cmd, "--served-model-name") == profile.served
        assert value(cmd, "--port") == str(profile.port) and value(cmd, "--host") == "127.0.0.1"
        assert value(cmd, "--dtype") == "bfloat16"
        if profile.device == "cuda":
            assert float(value(cmd, "--gpu-memory-utilization")) == profile.gpu_memory_utilization
        else:  # on CPU the fraction would reserve RAM: the KV cache is sized by VLLM_CPU_KVCACHE_SPACE instead
            assert "--gpu-memory-utilization" not in cmd and "--tensor-parallel-size" not in cmd
            assert profile.spec().env == {"VLLM_CPU_KVCACHE_SPACE": str(profile.cpu_kvcache_space_gib)}
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
    assert profile.spec().served_models == ["prefmatcher-lora"]


def test_several_adapters_and_engine_args(tmp_path):
    path = write(
        tmp_path, "two", model="Qwen/Qwen2.5-7B-Instruct", port=8005, max_lora_rank=32,
        lora_adapters={"a": "org/adapter-a", "b": str(tmp_path / "b")},
        engine_args={"max_num_seqs": 128, "enable_chunked_prefill": False,
                     "compilation_config": {"cudagraph_mode": "PIECEWISE"}},
        enable_prefix_caching=False, enforce_eager=True,
    )  # fmt: skip
    cmd = command(profiles.load(str(path)))
    i = cmd.index("--lora-modules")
    assert cmd[i + 1 : i + 3] == ["a=org/adapter-a", f"b={tmp_path / 'b'}"]  # a Hub id stays a Hub id
    assert value(cmd, "--max-loras") == "2" and value(cmd, "--max-num-seqs") == "128"
    assert "--enforce-eager" in cmd and "--no-enable-chunked-prefill" in cmd and "--no-enable-prefix-caching" in cmd
    assert json.loads(value(cmd, "--compilation-config")) == {"cudagraph_mode": "PIECEWISE"}
    kwargs = profiles.llm_kwargs(profiles.load(str(path)))
    assert kwargs["generation_config"] == "vllm" and kwargs["enable_lora"] and kwargs["max_lora_rank"] == 32
    assert kwargs["max_num_seqs"] == 128 and kwargs["enable_prefix_caching"] is False and kwargs["enforce_eager"]


def vllm_parser():
    """vLLM's own parser for its OpenAI-compatible server, as `python -m vllm.entrypoints.openai.api_server` builds it."""
    from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = make_arg_parser(FlexibleArgumentParser(prog="api_server"))
    return parser, validate_parsed_serve_args


def test_vllm_own_parser_accepts_every_shipped_profile(shipped):
    """Every command line a shipped profile builds (the GPU ones included) goes through vLLM's argument parser
    and its checks, so a misspelt or removed flag fails here instead of on a GPU box."""
    parser, validate = vllm_parser()
    for name, profile in shipped.items():
        cmd = command(profile)
        args = parser.parse_args(cmd[3:])
        validate(args)
        assert args.model == profile.model_path() and args.served_model_name == [profile.served], name
        assert args.port == profile.port and args.generation_config == "vllm" and args.dtype == profile.dtype, name
        assert args.enforce_eager == profile.enforce_eager, name
        if profile.device == "cuda":
            assert args.gpu_memory_utilization == profile.gpu_memory_utilization, name
        if profile.lora_adapters:
            assert args.enable_lora and args.max_lora_rank == profile.max_lora_rank, name
            assert {m.name: m.path for m in args.lora_modules} == profile.adapter_paths(), name


def test_vllm_own_parser_refuses_what_vllm_would_refuse(tmp_path):
    parser, _ = vllm_parser()
    typo = command(profiles.load(str(write(tmp_path, "typo", model="m", port=8000, engine_args={"max_num_sequences": 8}))))
    with pytest.raises(SystemExit):
        parser.parse_args(typo[3:])
    fine = command(profiles.load(str(write(tmp_path, "fine", model="m", port=8000, engine_args={"max_num_seqs": 8}))))
    assert parser.parse_args(fine[3:]).max_num_seqs == 8


def test_batch_invariant_and_api_key_go_to_the_environment_not_the_command(tmp_path, monkeypatch):
    path = write(tmp_path, "keyed", model="kixlab/prefmatcher-7b", port=8009, batch_invariant=True, api_key_env="CUPID_TEST_KEY")
    spec = profiles.load(str(path)).spec()
    engine = get_engine("vllm")
    assert spec.env == {"VLLM_BATCH_INVARIANT": "1"}
    monkeypatch.delenv("CUPID_TEST_KEY", raising=False)
    with pytest.raises(ServeError, match=r"requires an API key from \$CUPID_TEST_KEY"):
        engine.preflight(spec)
    monkeypatch.setenv("CUPID_TEST_KEY", "s3cret-value")
    assert engine.env(spec, tmp_path) == {"VLLM_API_KEY": "s3cret-value"}
    recorded = json.dumps([engine.command(spec, tmp_path), spec.model_dump()])  # what records and logs may hold
    assert "s3cret-value" not in recorded and "CUPID_TEST_KEY" in recorded


def test_bad_profiles_are_refused_with_file_and_field(tmp_path):
    cases = {
        "typo": ({"model": "m", "port": 8000, "gpu_memory_utilisation": 0.5}, "gpu_memory_utilisation"),
        "norank": ({"model": "m", "port": 8000, "lora_adapters": {"a": "org/a"}}, "need max_lora_rank"),
        "oddrank": ({"model": "m", "port": 8000, "lora_adapters": {"a": "org/a"}, "max_lora_rank": 48}, "48 is not one vLLM accepts"),
        "cpu": ({"engine": "transformers", "model": "d", "port": 8011, "gpu_memory_utilization": 0.3}, "vllm engine only"),
        "cpugpu": ({"device": "cpu", "model": "d", "port": 8011, "gpu_memory_utilization": 0.3}, "GPU only"),
        "gpukv": ({"model": "d", "port": 8011, "cpu_kvcache_space_gib": 2}, "device cpu only"),
        "clash": ({"model": "m", "port": 8000, "engine_args": {"port": 9000}}, "engine_args may not set port"),
        "toomuch": ({"model": "m", "port": 8000, "gpu_memory_utilization": 1.5}, "gpu_memory_utilization"),
        "named": ({"name": "x", "model": "m", "port": 8000}, "'name' comes from the file name"),
    }
    for name, (fields, message) in cases.items():
        path = write(tmp_path, name, **fields)
        with pytest.raises(ConfigError, match=message) as e:
            profiles.load(str(path))
        assert str(path) in str(e.value)
    with pytest.raises(ConfigError, match="no serve profile 'nope'.*prefmatcher"):
        profiles.load("nope", SERVE_DIR)


def test_plan_splits_one_gpu_and_refuses_more_than_the_whole(shipped):
    pair = Plan([shipped["prefmatcher"], shipped["qwen2.5-7b-instruct"]], gpus=H100)
    assert pair.problems() == []
    assert pair.lines()[-1] == "GPU memory: 0.90 of the GPU = 71.7 GiB of NVIDIA H100 80GB HBM3"

    three = Plan([shipped["prefmatcher"], shipped["qwen2.5-7b-instruct"], shipped["prefmatcher-lora"]])
    with pytest.raises(ServeError, match=r"add up to 1\.35 \(prefmatcher 0\.45 \+ qwen2\.5-7b-instruct 0\.45 \+ prefmatcher-lora 0\.45\)"):
        three.check()

    running = [{"name": "judge", "engine": "vllm", "host": "127.0.0.1", "port": 8001, "gpu_memory_utilization": 0.6}]
    problems = Plan([shipped["prefmatcher"], shipped["qwen2.5-7b-instruct"]], running).problems()
    assert any("1.50 (judge (running) 0.6 + prefmatcher 0.45 + qwen2.5-7b-instruct 0.45)" in p for p in problems)
    assert any("port 8001 on 127.0.0.1: wanted by 'qwen2.5-7b-instruct' and by 'judge (running)'" in p for p in problems)


def test_plan_refuses_a_fraction_too_small_for_the_weights(shipped):
    problems = Plan([shipped["prefmatcher"]], gpus=RTX).problems()
    assert len(problems) == 1
    assert "0.45 of 24.0 GiB is 10.8 GiB, less than the ~15.7 GiB its weights and runtime need" in problems[0]
    assert "--gpu-memory-utilization 0.9" in problems[0]
    alone = shipped["prefmatcher"].model_copy(update={"gpu_memory_utilization": 0.9})
    assert Plan([alone], gpus=RTX).problems() == []
    wide = shipped["prefmatcher"].model_copy(update={"tensor_parallel_size": 2})
    assert Plan([wide], gpus=H100).problems() == ["'prefmatcher': tensor_parallel_size 2, but 1 GPU(s) visible"]


def test_duplicate_ports_within_a_plan(tmp_path, shipped):
    other = profiles.load(str(write(tmp_path, "other", model="org/other", port=8000, gpu_memory_utilization=0.3)))
    assert Plan([shipped["prefmatcher"], other]).problems() == ["port 8000 on 127.0.0.1: wanted by 'other' and by 'prefmatcher'"]


def test_nvidia_smi_rows():
    text = "0, NVIDIA H100 80GB HBM3, 81559, 3\n1, NVIDIA H100 80GB HBM3, 81559, 40960\n"
    gpus = profiles.parse_nvidia_smi(text)
    assert [g.index for g in gpus] == [0, 1] and gpus[1].used_mib == 40960 and round(gpus[0].total_gib, 1) == 79.6
    with pytest.raises(ServeError, match="unexpected nvidia-smi output"):
        profiles.parse_nvidia_smi("No devices were found")


def test_local_adapter_checks_use_the_adapters_own_config(tmp_path):
    from peft import LoraConfig

    adapter = tmp_path / "adapter"
    LoraConfig(r=64, lora_alpha=128, target_modules=["q_proj", "v_proj"]).save_pretrained(adapter)
    path = write(tmp_path, "mine", model="Qwen/Qwen2.5-7B-Instruct", port=8003, lora_adapters={"mine": str(adapter)}, max_lora_rank=32)
    with pytest.raises(ServeError, match="'mine' has rank 64, above max_lora_rank 32: set max_lora_rank to 64"):
        profiles.load(str(path)).check_local_files()
    missing = write(tmp_path, "gone", model="Qwen/Qwen2.5-7B-Instruct", port=8003, lora_adapters={"gone": "runs/none/adapter"}, max_lora_rank=64)
    with pytest.raises(ServeError, match=r"'gone' not found at .*runs/none/adapter .*make train"):
        profiles.load(str(missing)).check_local_files()
    ok = write(tmp_path, "ok", model="Qwen/Qwen2.5-7B-Instruct", port=8003, lora_adapters={"mine": str(adapter)}, max_lora_rank=64)
    profiles.load(str(ok)).check_local_files()


def test_requests_find_the_profile_that_serves_them():
    profile, adapter = profiles.for_model("kixlab/prefmatcher-7b", SERVE_DIR)
    assert profile.name == "prefmatcher" and adapter is None
    profile, adapter = profiles.for_model("prefmatcher-lora", SERVE_DIR)
    assert profile.name == "prefmatcher-lora" and adapter == "prefmatcher-lora"
    profile, adapter = profiles.for_model("org/unknown-7b", SERVE_DIR)
    assert profile.model == "org/unknown-7b" and profile.gpu_memory_utilization == 0.9


runner = CliRunner()


def test_cli_dry_run_prints_the_split_and_the_flags():
    result = runner.invoke(app, ["serve", "up", "--dry-run", "-p", "prefmatcher", "-p", "qwen2.5-7b-instruct", "--batch-invariant"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert "GPU memory: 0.90 of the GPU" in lines
    commands = [line for line in lines if "-m vllm.entrypoints.openai.api_server" in line]
    assert len(commands) == 2 and all(line.split(": ", 1)[1].startswith("VLLM_BATCH_INVARIANT=1 ") for line in commands)

    result = runner.invoke(app, ["serve", "up", "--dry-run", "-p", "prefmatcher", "--gpu-memory-utilization", "0.9", "--port", "8100"])
    assert "--gpu-memory-utilization 0.9 " in result.output and "--port 8100 " in result.output

    result = runner.invoke(app, ["serve", "up", "--dry-run", "-p", "prefmatcher", "-p", "qwen2.5-7b-instruct", "-p", "prefmatcher-lora"])
    assert result.exit_code == 1 and "refusing this serve plan" in result.output and "add up to 1.35" in result.output


def test_cli_without_a_profile_builds_one_from_model_and_name(tiny_model_dir):
    result = runner.invoke(app, ["serve", "up", "--dry-run", "--model", "org/m-7b", "--name", "m", "--port", "8100"])
    assert result.exit_code == 0, result.output
    assert "m: vllm (cpu) m on 127.0.0.1:8100" in result.output  # vLLM, on the build this box has
    line = next(line for line in result.output.splitlines() if "vllm.entrypoints" in line)
    assert line.startswith(
        f"m: {sys.executable} -m vllm.entrypoints.openai.api_server --model org/m-7b --served-model-name m --host 127.0.0.1 "
        "--port 8100 --generation-config vllm "
    )
    result = runner.invoke(app, ["serve", "up", "--dry-run", "--engine", "transformers", "--model", str(tiny_model_dir),
                                 "--name", "t", "--port", "8101"])  # fmt: skip
    assert result.exit_code == 0 and "t: transformers t on 127.0.0.1:8101" in result.output
    assert "serve t --host 127.0.0.1 --port 8101 --continuous-batching" in result.output
    result = runner.invoke(app, ["serve", "up", "--dry-run", "--model", "x"])
    assert result.exit_code == 1 and "give --profile NAME (see configs/serve/), or both --model and --name" in result.output


def test_cli_refusals_name_the_way_out():
    result = runner.invoke(app, ["serve", "up", "--engine", "transformers", "--profile", "prefmatcher"])
    assert result.exit_code == 1 and "profile 'prefmatcher' is for the vllm engine, not transformers" in result.output
    result = runner.invoke(app, ["serve", "up", "-p", "prefmatcher", "-p", "qwen2.5-7b-instruct", "--port", "9000"])
    assert result.exit_code == 1 and "apply to one profile" in result.output
    result = runner.invoke(app, ["serve", "up", "-p", "tiny", "--batch-invariant", "--dry-run"])
    assert result.exit_code == 1 and "batch_invariant: GPU only (this profile runs on device cpu)" in result.output


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="this machine has CUDA")
def test_without_cuda_a_gpu_profile_points_to_the_cpu_profile():
    result = runner.invoke(app, ["serve", "up", "--engine", "vllm", "--profile", "prefmatcher"])
    assert result.exit_code == 1
    assert "no CUDA device here (nvidia-smi not found)" in result.output
    assert "cupid serve up --profile tiny" in result.output

    make = subprocess.run(["make", "-s", "serve"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert make.returncode != 0
    assert "no CUDA device here" in make.stdout and "serve up --profile tiny" in make.stdout
    assert "pip install" not in make.stdout + make.stderr  # refused before installing anything
