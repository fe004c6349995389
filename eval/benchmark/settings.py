"""The settings (spec §1): what the candidate is shown of the user's past. `standard` shows all prior sessions,
`oracle` only those holding the current preference, `summary` each session's summary, and `oracle-preference` the
ground-truth preference instead of any history. Which settings a task runs in is the task's (`TaskSpec.settings`);
how each log is built is `history`'s.
"""

from __future__ import annotations

from typing import Literal, get_args

Setting = Literal["standard", "oracle", "oracle-preference", "summary"]
SETTINGS: tuple[str, ...] = get_args(Setting)  # in the order tables and pages show them
SUMMARY_PROMPTS = ("summarizer",)  # the prompts the summary setting adds to a run's, whatever the task
