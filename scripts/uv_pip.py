"""`uv pip install|uninstall ARGS` into the venv whose Python runs this, told what pip's configuration tells pip.

The Makefile's install goes through here because pip resolves and unpacks on one core, and uv, even from an empty
cache, installs the same versions in less than half the time (docs/performance.md). uv reads no
pip.conf and no PIP_* variable, so the indexes, find-links, constraints and certificate a machine gives pip would be
lost: they are read here from `pip config list` (pip's own reading of its files and variables) and passed on as uv's
flags. Where that configuration holds an option not translated below, or uv is missing, pip runs instead, with the
same arguments: an install must work from nothing, whatever the machine.

Usage (stdlib only: it runs before anything is installed):
    python scripts/uv_pip.py install [-q] [--no-deps] [-e] REQUIREMENT...
    python scripts/uv_pip.py uninstall [-q] PACKAGE...
"""

import ast
import os
import shutil
import subprocess
import sys

# pip's options (as `pip config list` names them) and the `uv pip install` flag each value is given to. pip's list
# options hold whitespace-separated values; each becomes one flag.
FLAGS = {
    "index-url": "--index-url",
    "extra-index-url": "--extra-index-url",
    "find-links": "--find-links",
    "constraint": "--constraint",
}
ENVIRONMENT = {"cert": "SSL_CERT_FILE", "timeout": "UV_HTTP_TIMEOUT", "default-timeout": "UV_HTTP_TIMEOUT"}
# Options that change nothing uv resolves or installs (config-file: where pip found the settings listed).
IGNORED = {"config-file", "disable-pip-version-check", "no-input", "progress-bar", "root-user-action", "retries",
           "no-cache-dir", "cache-dir", "no-color", "no-warn-script-location", "quiet", "verbose"}  # fmt: skip
# What pip needs that uv does by default: no byte-compiling at install (Python writes each module's bytecode when first
# imported, see the Makefile); no question before uninstalling.
PIP_ONLY = {"install": ["--no-compile"], "uninstall": ["-y"]}
# pip's precedence: the install command's section over [global], PIP_* variables (`:env:`) over both.
SECTIONS = ("global", "install", ":env:")


def pip_configuration() -> dict[str, str] | None:
    """pip's settings for `pip install`, merged as pip merges them; None where pip cannot list them (a broken
    pip.conf: pip itself then runs, and says what is wrong with it)."""
    listed = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, check=False
    )
    if listed.returncode != 0:
        return None
    found: dict[str, dict[str, str]] = {section: {} for section in SECTIONS}
    for line in listed.stdout.splitlines():
        key, _, value = line.partition("=")
        section, _, name = key.rpartition(".")
        if section in found:
            found[section][name] = ast.literal_eval(value)
    return {name: value for section in SECTIONS for name, value in found[section].items()}


def uv_command(args: list[str], config: dict[str, str] | None, uv: str | None) -> tuple[list[str], dict[str, str], str]:
    """The command to run for `args` (install|uninstall, then pip's own arguments), the environment variables to add,
    and why pip runs where it does ("" for uv)."""
    pip = [sys.executable, "-m", "pip", args[0], *PIP_ONLY[args[0]], *args[1:]]
    if uv is None:
        return pip, {}, "uv is not installed in this venv"
    if config is None:
        return pip, {}, "`pip config list` failed"
    untranslated = sorted(set(config) - set(FLAGS) - set(ENVIRONMENT) - IGNORED)
    if untranslated:
        return pip, {}, f"pip's configuration sets {', '.join(untranslated)}, which this does not pass on to uv"
    command = [uv, "pip", args[0], "--python", sys.executable, *args[1:]]
    environment: dict[str, str] = {}
    if args[0] == "install":
        command += ["--index-strategy", "unsafe-best-match"]  # pip's: the best version across every index
        for name, flag in FLAGS.items():
            command += [part for value in config.get(name, "").split() for part in (flag, value)]
        environment = {variable: config[name] for name, variable in ENVIRONMENT.items() if name in config}
    return command, environment, ""


def main() -> int:
    args = sys.argv[1:]
    if not args or args[0] not in PIP_ONLY:
        print(f"usage: {sys.argv[0]} install|uninstall ARGS...", file=sys.stderr)
        return 2
    uv = shutil.which("uv", path=os.path.dirname(sys.executable))
    config = pip_configuration() if args[0] == "install" else {}  # an uninstall reads no index
    command, environment, why = uv_command(args, config, uv)
    if why:
        print(f"{os.path.basename(sys.argv[0])}: running pip: {why}", file=sys.stderr)
    return subprocess.run(command, env={**os.environ, **environment}, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
