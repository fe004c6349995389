"""Serving in two sides: the client side (`endpoint`, `registry`, `client`, `cache`, `offline`), which talks to any
OpenAI-compatible server and knows none, and the servers this project starts (`servers/`) with the fleet that places
them for a run or a night (`fleet/`)."""
