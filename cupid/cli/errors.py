"""What every `cupid` command shares about errors: a user's mistake that reaches the root group is one line on stderr
and exit 2 (`CupidGroup`); a traceback is for bugs, or asked for (`cupid --debug`, `CUPID_DEBUG=1`)."""

import errno
import os

import click
import typer
from typer.core import TyperGroup

from cupid.common import install
from cupid.common.errors import EXIT_FAILED, EXIT_USAGE, NotInstalled, ServeError, failure_line


def user_errors() -> tuple[type[Exception], ...]:
    """The errors that are a user's mistake. Imported when an error reaches the root, not at every start: `cupid
    --version` loads none of the library."""
    from cupid.common.config import ConfigError
    from cupid.eval.benchmark.data import DataError
    from cupid.eval.benchmark.records import RecordError

    return (ConfigError, RecordError, DataError, OSError)


def user_error_line(e: BaseException) -> str:
    """One line for a user's mistake: what and where, and what to do where the system says."""
    from cupid.common.config import ConfigError

    if isinstance(e, OSError) and not isinstance(e, ConfigError):
        where = f"{e.filename}: " if e.filename else ""
        what = e.strerror or str(e)
        hint = {
            errno.EADDRINUSE: ": the port is taken; pick another with --port",
            errno.EACCES: ": not writable here; choose another path",
            errno.ENOENT: "",
            errno.EROFS: ": a read-only place; choose another path",
        }.get(e.errno or 0, "")
        return f"{where}{what}{hint}"
    return str(e)


# The extra that brings each optional library (pyproject.toml): a command that needs one that is missing says which
# extra to install, in one line (`CupidGroup`), instead of an import's traceback.
EXTRA_OF = {
    "trl": "train",
    "peft": "train",
    "bitsandbytes": "train",
    "accelerate": "train",
    "vllm": "cpu",
    "torch": "cpu",
    "transformers": "cpu",
    "gguf": "cpu",  # or gpu on a CUDA box
    "mlflow": "track",
    "wandb": "track",
    "inspect_ai": "inspect",
}


def missing_extra_line(e: ModuleNotFoundError) -> str | None:
    """`needs <module>, which the <extra> extra installs: pip install 'cupid-eval[<extra>]'` (the checkout's command
    in a checkout), for a library an extra brings; None for any other missing module (a bug, or a broken install: its
    traceback)."""
    top = (e.name or "").split(".")[0]
    if top not in EXTRA_OF:
        return None
    extra = EXTRA_OF[top]
    box = " ([gpu] on a CUDA box)" if extra == "cpu" else ""
    return f"this command needs {top}, which the [{extra}] extra installs: {install.pip_install(extra)}{box}"


def torch_mismatch_line(e: BaseException) -> str | None:
    """The fix, where an import failed on torch's companions built for another torch (`install.torch_mismatch`): the
    error, or one it came from, names torchvision (`operator torchvision::nms does not exist`)."""
    chain, seen = [], e
    while seen is not None and len(chain) < 20:
        chain.append(seen)
        seen = seen.__cause__ or seen.__context__
    if not any("torchvision" in str(x) or "torchaudio" in str(x) for x in chain):
        return None
    return install.mismatch_line()


def debugging() -> bool:
    return os.environ.get("CUPID_DEBUG", "") not in ("", "0")


class CupidGroup(TyperGroup):
    """The root group: a user's mistake that reached it is one line and exit 2 (`--debug`: the traceback)."""

    def invoke(self, ctx: click.Context):  # type: ignore[no-untyped-def]
        try:
            return super().invoke(ctx)
        except user_errors() as e:
            if debugging():
                raise
            typer.echo(f"error: {user_error_line(e)}", err=True)
            raise typer.Exit(EXIT_USAGE) from None
        except NotInstalled as e:
            if debugging():
                raise
            typer.echo(f"error: {e}", err=True)
            raise typer.Exit(EXIT_USAGE) from None
        except ServeError as e:  # a server that did not start, a model the offline executor could not load
            if debugging():
                raise
            typer.echo(f"error: {failure_line(e)}", err=True)
            raise typer.Exit(EXIT_FAILED) from None
        except ModuleNotFoundError as e:
            if debugging() or (line := missing_extra_line(e) or torch_mismatch_line(e)) is None:
                raise
            typer.echo(f"error: {line}", err=True)
            raise typer.Exit(EXIT_USAGE) from None
        except (ImportError, RuntimeError) as e:
            if debugging() or (line := torch_mismatch_line(e)) is None:
                raise
            typer.echo(f"error: {line}", err=True)
            raise typer.Exit(EXIT_USAGE) from None
