"""The `cupid` command (`cupid` and `python -m cupid`): the CLI, with a Ctrl-C at any moment, its start (the
imports) included, one line and exit 130, never a traceback."""

import sys


def main() -> None:
    try:
        from cupid.cli import app

        app()
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        raise SystemExit(130) from None


if __name__ == "__main__":
    main()
