from __future__ import annotations

from typing import TYPE_CHECKING

from cupid.common.faces import lazy

# What the rest of the package uses of this room, by the module that defines it (imported on first use)
EXPORTS = {
    "LABELS": "cupid.matcher.prompts",
    "MatchCounts": "cupid.matcher.scores",
    "MatchItem": "cupid.matcher.parse",
    "MatcherDialect": "cupid.matcher.prompts",
    "PREFERENCE_HEADER": "cupid.matcher.parse",
    "PRF": "cupid.matcher.scores",
    "ParseError": "cupid.matcher.parse",
    "macro": "cupid.matcher.scores",
    "micro": "cupid.matcher.scores",
}
__all__ = [
    "LABELS",
    "PREFERENCE_HEADER",
    "PRF",
    "MatchCounts",
    "MatchItem",
    "MatcherDialect",
    "ParseError",
    "macro",
    "micro",
]
__getattr__, __dir__ = lazy(__name__, EXPORTS)

if TYPE_CHECKING:
    from cupid.matcher.parse import PREFERENCE_HEADER, MatchItem, ParseError
    from cupid.matcher.prompts import LABELS, MatcherDialect
    from cupid.matcher.scores import PRF, MatchCounts, macro, micro
