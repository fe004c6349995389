"""`python -m cupid`: the same command as `cupid`."""

from cupid.cli import app

app()
