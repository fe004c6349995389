"""What every layer shares and none owns: reading and validating configuration (`config`), the project's errors
(`errors`), running async code from blocking code (`aio`), a run directory's soundness (one writer, atomic writes:
`files`), whether the Hugging Face Hub answers (`hub`) and the one-off HTTP requests, on one TLS context (`tls`).
It imports nothing else of the project."""

from __future__ import annotations

from typing import TYPE_CHECKING

from cupid.common.faces import lazy

# What the rest of the package uses of this room, by the module that defines it (imported on first use)
EXPORTS = {
    "VARIABLE": "cupid.common.verbosity",
    "quiet": "cupid.common.verbosity",
    "set_verbosity": "cupid.common.verbosity",
    "verbose": "cupid.common.verbosity",
    "ConfigError": "cupid.common.config",
    "DiskFull": "cupid.common.files",
    "LOG_TAIL": "cupid.common.errors",
    "PerLoop": "cupid.common.aio",
    "ServeError": "cupid.common.errors",
    "alive": "cupid.common.processes",
    "blocking": "cupid.common.aio",
    "describe": "cupid.common.config",
    "disk_full": "cupid.common.files",
    "failure_line": "cupid.common.errors",
    "hold": "cupid.common.files",
    "http_get": "cupid.common.tls",
    "http_post": "cupid.common.tls",
    "load_model": "cupid.common.config",
    "locate": "cupid.common.config",
    "read_json": "cupid.common.files",
    "read_yaml": "cupid.common.config",
    "state_dir": "cupid.common.files",
    "prepared_model": "cupid.common.files",
    "PREPARED": "cupid.common.files",
    "validate": "cupid.common.config",
    "write_atomic": "cupid.common.files",
}
__all__ = [
    "LOG_TAIL",
    "PREPARED",
    "VARIABLE",
    "ConfigError",
    "DiskFull",
    "PerLoop",
    "ServeError",
    "alive",
    "blocking",
    "describe",
    "disk_full",
    "failure_line",
    "hold",
    "http_get",
    "http_post",
    "load_model",
    "locate",
    "prepared_model",
    "quiet",
    "read_json",
    "read_yaml",
    "set_verbosity",
    "state_dir",
    "validate",
    "verbose",
    "write_atomic",
]
__getattr__, __dir__ = lazy(__name__, EXPORTS)

if TYPE_CHECKING:
    from cupid.common.aio import PerLoop, blocking
    from cupid.common.config import ConfigError, describe, load_model, locate, read_yaml, validate
    from cupid.common.errors import LOG_TAIL, ServeError, failure_line
    from cupid.common.files import (
        PREPARED,
        DiskFull,
        disk_full,
        hold,
        prepared_model,
        read_json,
        state_dir,
        write_atomic,
    )
    from cupid.common.processes import alive
    from cupid.common.tls import http_get, http_post
    from cupid.common.verbosity import VARIABLE, quiet, set_verbosity, verbose
