"""The gate's test: a betting e-value against a drop in the mean of bounded persona-level changes.

Each persona's change is bounded: B's figure on the persona's units minus A's, both in [0, 1] once the figure is
mapped from its range (`TaskSpec.bounds`), so the change lies in [-1, 1]. To test "the personas' mean change is at
least -margin" (no drop beyond the margin) against a drop, a gambler bets, persona after persona, a fixed fraction
lambda of its wealth that the change falls short of -margin: wealth x (1 + lambda (-margin - change)). Under the
null each factor has mean at most 1, whatever the law of the changes (sparse, skewed, heavy-tailed, discrete), as long
as personas are drawn independently: the final wealth is an e-value (its expectation is at most 1), and by Markov's
inequality it reaches 1/alpha with probability at most alpha. The level holds by construction, not by a
simulation of laws like the data's (Waudby-Smith & Ramdas, "Estimating means of bounded random variables by
betting", JRSS-B 2023; Vovk & Wang, "E-values: calibration, combination and applications", AoS 2021).

The bet is not tuned on the data under test: the e-value is the average of the wealths of `BETS` constant bets over
every fraction the bound allows (a mixture of e-values is an e-value; Cover's universal portfolio), their prior's
density growing as the bet squared: a drop the gate must see is small beside the bound, and its best bet then lies
near the largest allowed. A constant bet's wealth is a product over personas, so the e-value does not depend on the
order the personas are read in, and the same units give the same e-value. Its price against the best constant bet in
hindsight is the prior's mass near that bet: about a factor 1.3-1.4 in the smallest drop found, against a test tuned
to the law.

A family of tests (the tasks of a comparison, every headline of a night) is stepped down by Holm on p = 1/e, which
holds its family-wise level under any dependence between the tests (Vovk & Wang's e-Holm is at least as strict).

`detectable` is this test's own: the smallest drop it finds `POWER` of the time at the family's threshold, the persona
changes as observed (centred) taken as the law of the noise (bench/gate_level.py measures its power against it).
"""

from __future__ import annotations

import numpy as np
from scipy.special import ndtri

BETS = 32  # constant bets mixed over (0, the largest the bound allows), denser toward the largest


def _fractions(margin: float) -> np.ndarray:
    """The mixture's bets: fractions of wealth staked on each persona. A persona whose change is +1 (the figure
    went from its lowest to its highest) costs a bet lambda x (1 + margin), which must stay under the wealth."""
    return ((np.arange(BETS) + 0.5) / BETS) ** (1 / 3) / (1 + margin)


def log_e_values(changes: np.ndarray, margin: float = 0.0) -> np.ndarray:
    """log e against "mean change >= -margin" from persona changes in [-1, 1] (the last axis: personas; any leading
    axes are separate tests). `margin` in the same [0, 1] units."""
    changes = np.clip(np.asarray(changes, dtype=float), -1.0, 1.0)
    shortfall = -margin - changes  # the gambler's gain per unit staked: positive where the persona dropped
    lam = _fractions(margin)
    log_wealth = np.log1p(shortfall[..., None, :] * lam[:, None]).sum(axis=-1)  # (..., BETS)
    top = log_wealth.max(axis=-1, keepdims=True)
    return (top[..., 0] + np.log(np.exp(log_wealth - top).mean(axis=-1))).astype(float)


def e_value(changes: np.ndarray, margin: float = 0.0) -> float:
    """The e-value against "mean change >= -margin" (see `log_e_values`)."""
    return float(np.exp(min(float(log_e_values(changes, margin)), 700.0)))


def p_value(e: float) -> float:
    """The p-value an e-value gives, min(1, 1/e): P(p <= alpha) <= alpha under the null (Markov)."""
    return 1.0 if e <= 1 else 1 / e


def detectable(changes: np.ndarray, margin: float, alpha: float, power: float) -> float | None:
    """The drop below -margin (in the changes' [0, 1] units) that the test at level `alpha` (the family's smallest
    Holm threshold) finds `power` of the time, with these personas' changes, centred, as the law of the noise; None
    where no drop within the bound is found that often, or no persona changed. Each bet's log-wealth is a sum over
    personas, taken as normal (its mean and variance from the changes); the bets' wealths move together (one sum's
    noise), so the mixture at its `1 - power` quantile is the mixture of their quantiles."""
    changes = np.asarray(changes, dtype=float)
    n = changes.size
    if n < 2 or not np.any(changes != changes[0]):
        return None
    centred = changes - changes.mean()
    lam = _fractions(margin)[:, None]
    z = float(ndtri(power))
    threshold = np.log(1 / alpha)

    def found(drop: float) -> bool:
        shortfall = -margin - np.clip(centred - margin - drop, -1.0, 1.0)
        logs = np.log1p(lam * shortfall)  # (BETS, n)
        quantile = n * logs.mean(axis=1) - z * np.sqrt(n * logs.var(axis=1, ddof=1))
        top = quantile.max()
        return bool(top + np.log(np.exp(quantile - top).mean()) >= threshold)

    low, high = 0.0, 1.0 + margin
    if not found(high):
        return None
    for _ in range(20):  # to 1e-6 of the figure's range
        mid = (low + high) / 2
        low, high = (low, mid) if found(mid) else (mid, high)
    return high


def statement(tests: int, personas: int, alpha: float, horizon: int = 0) -> str:
    """The sentence a gate's verdict is read by: what is tested and what is bounded, in words a user can check.
    `horizon`: a night's family, held at `alpha` / `horizon` so that `horizon` nights together stay within `alpha`
    (0: a comparison, no nights)."""
    tested = (
        f"{tests} headline test(s) on {personas} personas, each a betting e-value on the personas' mean change of "
        "the figure (each persona's figure on its own units: for micro F1, persona-averaged), Holm across them"
    )
    bound = "whatever the law of the persona-level changes, as long as personas are drawn independently"
    if not horizon:
        return f"{tested}: a false REGRESSION among them at most {alpha:.1%} of the time, {bound}."
    if horizon == 1:
        return (
            f"{tested}: a false REGRESSION tonight at most {alpha:.1%} of the time, {bound}; a rate per night, so "
            f"over 30 nights at most {30 * alpha:.2f} nights with one are expected (`horizon:` bounds any over "
            "several nights)."
        )
    return (
        f"{tested}: a false REGRESSION tonight at most {alpha / horizon:.2%} of the time, so any over {horizon} "
        f"nights at most {alpha:.1%}, {bound}."
    )
