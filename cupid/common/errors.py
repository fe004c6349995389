"""The project's errors beyond a config's (`config.ConfigError`): a server that cannot be started, found or reached,
with what to do about it, and the one line such a failure is shown as in tables and records."""

# The exit codes, each a bit no other outcome uses, so that a script can branch on them and a night's code is the sum
# of its outcomes (README's table); here, below every layer that returns one.
EXIT_FAILED = 1  # the work failed: failed units, a server that did not start
EXIT_USAGE = 2  # typer's own code for a bad option; also a config or an input the user must fix
EXIT_REGRESSION = 4  # a comparison's headline dropped (or B left too many more units unanswered)
EXIT_NO_VERDICT = 8  # a comparison that cannot decide: a gate fails closed

LOG_TAIL = "\n--- last lines of "  # where a server's failure message goes on to its log's last lines


class ServeError(RuntimeError):
    pass


class NotInstalled(ServeError):
    """What a command needs is not installed: the user's to install (a usage error, exit 2), not a failure of the
    work."""


def failure_line(error: BaseException) -> str:
    """A failure in one line (what happened, root cause, likely cause: the message a server's start failure
    writes, without its log's last lines), for tables and records."""
    text = str(error).split(LOG_TAIL, 1)[0]
    return "; ".join(line.strip() for line in text.splitlines() if line.strip())
