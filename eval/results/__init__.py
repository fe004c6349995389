"""What is read from finished runs: the report, the viewer, comparisons, the tracker, the leaderboard of nights,
meta-evaluation. Nothing here starts a run or a server (that is `eval.workflows`)."""
