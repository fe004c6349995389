"""Workflows over the packages they join: a night (`nightly`: the fleet's servers, a run per candidate, the comparison
with the last night and the leaderboard), a logged run (`logged_run`: a run, then its tracker) and the demo (`demo`:
the tiny model served, a run, the server stopped). Above benchmark, results and the fleet; nothing below imports
them."""
