"""Statistics of a sweep over seeds: mean +- standard error, paired differences with t-intervals.

Pure functions on plain lists of floats (no numpy, no scipy). For one row's values over seeds
``x_1..x_n``::

    mean = sum(x) / n
    se   = sd(x) / sqrt(n),   sd with n - 1 in the denominator (undefined for n = 1)

A paired difference of a row against the baseline row uses only the seeds both have finished,
``d_s = x_row,s - x_base,s``, and the two-sided 95% t-interval ``mean(d) +- t_{0.975, n-1} * se(d)``
(pairing by seed removes the seed-to-seed variation both rows share, e.g. the SFT start point).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

# t_{0.975, df}: the two-sided 95% quantile of Student's t, df = 1..30 (6 decimals, as scipy.stats.t.ppf)
_T975 = (12.706205, 4.302653, 3.182446, 2.776445, 2.570582, 2.446912, 2.364624, 2.306004, 2.262157, 2.228139,
         2.200985, 2.178813, 2.160369, 2.144787, 2.131450, 2.119905, 2.109816, 2.100922, 2.093024, 2.085963,
         2.079614, 2.073873, 2.068658, 2.063899, 2.059539, 2.055529, 2.051831, 2.048407, 2.045230, 2.042272)


def t975(df: int) -> float:
    """The 0.975 quantile of Student's t with ``df`` degrees of freedom (table to 30, then the
    Cornish-Fisher expansion around the normal quantile, within 1e-5 of the exact value)."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}.")
    if df <= len(_T975):
        return _T975[df - 1]
    z = NormalDist().inv_cdf(0.975)
    return (z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)
            + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * df**3))


@dataclass(frozen=True)
class Summary:
    """Mean and standard error of one row's values over ``n`` seeds (se is nan when n < 2)."""

    mean: float
    se: float
    n: int


@dataclass(frozen=True)
class PairedDiff:
    """Row minus baseline over the ``n`` seeds both finished: mean, standard error and the 95%
    t-interval [lo, hi] (all nan when n < 2, mean too when n = 0)."""

    mean: float
    se: float
    lo: float
    hi: float
    n: int


def summarize(values: list[float]) -> Summary:
    n = len(values)
    if n == 0:
        return Summary(math.nan, math.nan, 0)
    mean = sum(values) / n
    if n < 2:
        return Summary(mean, math.nan, 1)
    var = sum((v - mean) ** 2 for v in values) / (n - 1)
    return Summary(mean, math.sqrt(var / n), n)


def paired_difference(row: dict[int, float], base: dict[int, float]) -> PairedDiff:
    """``row`` and ``base`` map seed -> value; the difference is paired by seed."""
    seeds = sorted(set(row) & set(base))
    s = summarize([row[k] - base[k] for k in seeds])
    if s.n < 2:
        return PairedDiff(s.mean, math.nan, math.nan, math.nan, s.n)
    half = t975(s.n - 1) * s.se
    return PairedDiff(s.mean, s.se, s.mean - half, s.mean + half, s.n)
