"""The README and the guide (docs/) run as written: every shell and Python block is either run here, as a reader runs
it, or carries a visible line just above it that says why not (`*Not run by tests/test_readme.py: <reason>.*`, a
reason from `REASONS`). A change that breaks an example, or adds a block with neither, fails `make test`. Each
example is in one document only, so it runs once.

A reader's directory is made for the blocks: the repository's configs, its endpoints file with the tiny model's
entries pointing at the suite's own vLLM server (the random-weight model, where a reader has SmolLM2 on :8011), and
the runs the examples name (`runs/a`, `runs/b`, `runs/model-a`, `runs/model-b`, `runs/demo`: the instant server's
answers on 16 personas, the same answers under two names). Shell blocks run with `bash -e` and `cupid` on PATH,
Python blocks with the project's interpreter; each must exit 0, and say nothing of bitsandbytes' optional kernel; the
GRPO dry runs (run nowhere else in the suite) must each print their recipe's verdict, the first first."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.helpers import REPO, sample_copies, write_endpoints

MARKER = re.compile(r"^\*Not run by tests/test_readme\.py: (?P<why>.+)\.\*$")
REASONS = (
    "needs a GPU",
    "needs the Hugging Face Hub",
    "needs an API key",
    "a reference of commands and options, with placeholders",
    "the test suite itself",
    "starts a vLLM server of its own",
    "needs the package index",
)
RUNS = ("a", "b", "model-a", "model-b", "demo")


def documents() -> list[Path]:
    """The README and every page of the guide (the generated references hold no shell or Python block)."""
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


@dataclass(frozen=True)
class Block:
    source: str  # the document, relative to the repository
    line: int  # of its opening fence
    language: str
    code: str
    skipped: str | None  # why not run, from the marker above it

    @property
    def name(self) -> str:
        first = next((c for c in self.code.splitlines() if c.strip() and not c.startswith("#")), "")
        return f"{self.source}:{self.line} ({self.language}: {first.strip()[:60]})"


def all_blocks() -> list[Block]:
    return [b for path in documents() for b in blocks(path.read_text(), str(path.relative_to(REPO)))]


def blocks(text: str, source: str = "README.md") -> list[Block]:
    """Every fenced shell and Python block, with the marker line above it (blank lines between allowed)."""
    lines, out, i = text.splitlines(), [], 0
    while i < len(lines):
        fence = re.match(r"^```(\w*)\s*$", lines[i])
        if not fence:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        above = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        marker = MARKER.match(above)
        if fence.group(1) in ("bash", "python"):
            code = "\n".join(lines[i + 1 : end])
            out.append(Block(source, i + 1, fence.group(1), code, marker.group("why") if marker else None))
        i = end + 1
    return out


def test_every_block_is_accounted_for():
    found = all_blocks()
    assert len(found) >= 15 and {b.source for b in found} >= {"README.md", "docs/getting-started.md"}
    unknown = [f"{b.name}: {b.skipped!r}" for b in found if b.skipped and not b.skipped.startswith(REASONS)]
    assert not unknown, f"a reason not among {REASONS}: {unknown}"
    assert [b for b in found if b.skipped is None], "no block runs"


@pytest.fixture(scope="module")
def reader(tmp_path_factory, instant_url, tiny_server, session_home):
    """A reader's directory: the configs, the tiny model's endpoints on the suite's server, the runs the examples
    name."""
    from cupid.eval.benchmark.runner import RunConfig, run

    home = tmp_path_factory.mktemp("reader")
    shutil.copytree(REPO / "configs", home / "configs")
    shutil.copytree(REPO / "tests" / "data", home / "tests" / "data")
    shipped = yaml.safe_load((REPO / "configs" / "endpoints.yaml").read_text())
    served = {"base_url": tiny_server["base_url"], "model": tiny_server["model"]}
    shipped["tiny"] |= served
    shipped["tiny-constrained"] |= served
    (home / "configs" / "endpoints.yaml").write_text(yaml.safe_dump(shipped))
    endpoints = write_endpoints(
        home / "instant.yaml",
        instant={"base_url": instant_url, "model": "instant"},
        again={"base_url": instant_url, "model": "instant-again"},
        pm={"base_url": instant_url, "model": "local-prefmatcher"},
    )
    data = sample_copies(home / "personas.jsonl", 20)  # 80 personas: enough for the gate's verdict
    common = {"endpoints": str(endpoints), "data": str(data), "decomposer": "instant", "matcher": "pm",
              "settings": ["standard", "oracle"], "cache": str(home / "cache.sqlite")}  # fmt: skip
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CUPID_HOME", str(session_home))
        for name in RUNS:
            run(
                RunConfig(
                    **common,
                    candidate="again" if name in ("b", "model-b") else "instant",
                    out=str(home / "runs" / name),
                )
            )
    return home, session_home


def run_block(block: Block, home: Path, cupid_home: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "CUPID_HOME": str(cupid_home), "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    command = (
        ["bash", "-e", "-o", "pipefail", "-c", block.code]
        if block.language == "bash"
        else [sys.executable, "-c", block.code]
    )
    return subprocess.run(command, cwd=home, env=env, capture_output=True, text=True, timeout=600, check=False)


def test_each_runnable_block_runs_as_written(reader, capsys):
    home, cupid_home = reader
    found = all_blocks()
    ran, failed = [], []
    for block in found:
        if block.skipped is not None:
            continue
        done = run_block(block, home, cupid_home)
        ran.append(block)
        if done.returncode != 0:
            failed.append(f"{block.name}: exit {done.returncode}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
        # On a CPU with AVX512-BF16 bitsandbytes warns, on every training command, that the Hub's `kernels` package
        # is missing though its own kernels serve (training/__init__.py drops that one message): the GRPO dry runs
        # import it. On another CPU it never says it, and this holds nothing more than the lines below.
        if "kernels-community" in done.stdout + done.stderr:
            failed.append(f"{block.name}: bitsandbytes' warning about an optional kernel reached the reader")
        # A count of no unit (`0/0`) printed by a Python example is a figure its own `limit` left out: an example
        # that shows nothing but its shape.
        if block.language == "python" and re.search(r"(?<![\d/])0/0(?![\d/])", done.stdout):
            failed.append(f"{block.name}: prints 0/0, a group of no unit\n{done.stdout[-2000:]}")
        said = done.stdout.splitlines()
        recipes = re.findall(r"^cupid train grpo --config (\S+) --dry-run", block.code, re.MULTILINE)
        if recipes and not (said and said[0].startswith(f"{recipes[0]}: valid")):  # nothing before its verdict
            failed.append(f"{block.name}: the first line is not '{recipes[0]}: valid'\n{done.stdout[-2000:]}")
        if missing := [r for r in recipes if not any(line.startswith(f"{r}: valid") for line in said)]:
            failed.append(f"{block.name}: no '{missing[0]}: valid' line\n{done.stdout[-2000:]}")
    skipped = [b for b in found if b.skipped is not None]
    with capsys.disabled():
        reasons = sorted({b.skipped for b in skipped})
        counts = "; ".join(f"{sum(b.skipped == r for b in skipped)} {r}" for r in reasons)
        print(f"\nREADME and docs/ blocks: {len(found)}: {len(ran)} run, {len(skipped)} not run ({counts})")
    assert len(ran) + len(skipped) == len(found)
    assert not failed, "\n\n".join(failed)
    # what the examples made is there
    assert (home / "runs" / "a-b" / "view.html").exists() and (home / "runs" / "demo" / "report" / "view.html").exists()
