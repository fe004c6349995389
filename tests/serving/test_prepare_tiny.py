"""`cupid serve prepare-tiny` (and `--random`) as a user runs it, in a state directory of its own (CUPID_HOME).

The SmolLM2-135M conversion from its GGUF costs ~40 s of a core: here the SmolLM2 form is run on a state directory
that already holds a converted copy (each file a link to the suite's `smol_model_dir`), which it must report without
converting again; the `--random` form is built in full (from that copy's tokenizer, as after a `prepare-tiny`), then
run again, which must not build it again.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from cupid.serving.servers import tiny_model

CUPID = [sys.executable, "-m", "cupid"]


def _prepare(home: Path, cwd: Path, *args: str) -> tuple[Path, float]:
    started = time.monotonic()
    done = subprocess.run(
        [*CUPID, "serve", "prepare-tiny", *args],
        cwd=cwd,
        env={**os.environ, "CUPID_HOME": str(home)},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    took = time.monotonic() - started
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 1, done.stdout  # the directory, alone on its line: `cupid serve prepare-tiny` in scripts
    return Path(lines[0]), took


def _files(directory: Path) -> dict[str, tuple[int, int]]:
    return {p.name: (p.lstat().st_ino, p.lstat().st_mtime_ns) for p in sorted(directory.iterdir())}


def test_prepare_tiny_reports_a_converted_directory_without_converting_it_again(smol_model_dir, cupid_home, tmp_path):
    converted = cupid_home / "models" / tiny_model.DIR_NAME
    converted.mkdir(parents=True)
    for f in smol_model_dir.iterdir():
        (converted / f.name).symlink_to(f)
    before = _files(converted)
    reported, took = _prepare(cupid_home, tmp_path)
    assert reported == converted.resolve()
    assert _files(converted) == before  # the same links: nothing written, nothing replaced
    assert sorted(p.name for p in converted.parent.iterdir()) == [tiny_model.DIR_NAME]  # no partial conversion
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(reported)
    assert config.model_type == "llama" and not hasattr(config, "quantization_config")
    assert json.loads((reported / "config.json").read_text())["dtype"] == "bfloat16"
    print(f"prepare-tiny on a converted directory: {took:.1f}s")


def test_prepare_tiny_random_builds_the_random_model_once(smol_model_dir, random_model_dir, cupid_home, tmp_path):
    converted = cupid_home / "models" / tiny_model.DIR_NAME
    converted.mkdir(parents=True)
    for f in smol_model_dir.iterdir():
        (converted / f.name).symlink_to(f)
    built, first_s = _prepare(cupid_home, tmp_path, "--random")
    assert built == (cupid_home / "models" / tiny_model.RANDOM_DIR_NAME).resolve()
    assert sorted(p.name for p in built.parent.iterdir()) == sorted([tiny_model.DIR_NAME, tiny_model.RANDOM_DIR_NAME])
    from transformers import AutoConfig, AutoTokenizer

    config = AutoConfig.from_pretrained(built)
    assert config.model_type == "llama" and config.architectures == ["LlamaForCausalLM"]
    assert {k: getattr(config, k) for k in tiny_model.RANDOM_CONFIG} == tiny_model.RANDOM_CONFIG
    tokenizer = AutoTokenizer.from_pretrained(built)
    assert config.vocab_size == len(tokenizer) and tokenizer.chat_template  # SmolLM2's tokenizer and chat template
    # Seeded: the same weights as the directory the suite serves, wherever it is built
    from safetensors.torch import load_file

    ours, suite = load_file(built / "model.safetensors"), load_file(random_model_dir / "model.safetensors")
    assert ours.keys() == suite.keys() and all(ours[k].equal(suite[k]) for k in ours)

    before = _files(built)
    again, again_s = _prepare(cupid_home, tmp_path, "--random")
    assert again == built and _files(built) == before  # reported, not built again
    print(f"prepare-tiny --random: built in {first_s:.1f}s, found in {again_s:.1f}s")
