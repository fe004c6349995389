"""Workflows over the packages they join: a night (`nightly`: the fleet's servers, a run per candidate, the comparison
with the last night and the leaderboard) and a logged run (`logged_run`: a run, then its tracker). Above benchmark,
results and the fleet; nothing below imports them."""
