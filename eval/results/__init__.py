"""What is read from finished runs: the report, the viewer, comparisons, the tracker, the nightly and its leaderboard,
meta-evaluation."""
