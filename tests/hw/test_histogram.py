"""hw.histogram: quantiles within the relative-error bound of exact percentiles, merge, reset, no data."""

from __future__ import annotations

import math

import numpy as np
import pytest

from hw.histogram import LatencyHistogram, NoDataError

QS = [0.0, 0.001, 0.1, 0.5, 0.9, 0.99, 0.999, 0.9999, 1.0]


def _samples(kind: str, n: int, seed: int) -> np.ndarray:
    """Latency-like distributions in us, all >= 1 us (the range the relative bound covers)."""
    rng = np.random.default_rng(seed)
    if kind == "lognormal":  # a typical service: median ~150 us, long right tail
        return 1.0 + rng.lognormal(5.0, 1.0, n)
    if kind == "exponential":
        return 1.0 + rng.exponential(200.0, n)
    if kind == "pareto":  # heavy tail up to seconds
        return 20.0 * (1.0 + rng.pareto(1.2, n))
    if kind == "bimodal":  # cache hits and misses
        return np.where(rng.random(n) < 0.95, rng.normal(80.0, 5.0, n), rng.normal(5000.0, 500.0, n)).clip(
            1.0
        )
    raise ValueError(kind)


def _exact(v: np.ndarray, qs) -> np.ndarray:
    """The inverted-CDF quantile: the ceil(q n)-th smallest sample (numpy's method="inverted_cdf",
    without its float rounding of q n at exact ranks)."""
    s = np.sort(v)
    ranks = np.maximum(np.ceil(np.asarray(qs) * len(v) - 1e-9).astype(int), 1)
    return s[ranks - 1]


def test_reference_matches_numpy_away_from_exact_ranks():
    v = _samples("lognormal", 1001, seed=5)
    qs = [0.1234, 0.5, 0.98765]
    np.testing.assert_array_equal(_exact(v, qs), np.percentile(v, np.array(qs) * 100, method="inverted_cdf"))


@pytest.mark.parametrize("kind", ["lognormal", "exponential", "pareto", "bimodal"])
def test_quantiles_within_relative_error_of_exact_percentiles(kind):
    v = _samples(kind, 100_000, seed=7)
    h = LatencyHistogram(relative_error=0.01)
    h.record_many_us(v)
    got = h.quantiles_us(QS)
    exact = _exact(v, QS)
    rel = np.abs(got - exact) / exact
    assert h.relative_error <= 0.01
    assert np.all(rel <= h.relative_error + 1e-6), dict(zip(QS, rel, strict=True))
    s = h.summary()
    assert s is not None and s.count == len(v)
    assert s.min_us == pytest.approx(v.min(), abs=1e-3) and s.max_us == pytest.approx(v.max(), abs=1e-3)
    assert s.mean_us == pytest.approx(v.mean(), rel=1e-6)
    assert s.p50_us <= s.p99_us <= s.p999_us


def test_a_tighter_bound_is_honoured():
    v = _samples("lognormal", 50_000, seed=3)
    h = LatencyHistogram(relative_error=0.001)
    h.record_many_us(v)
    exact = _exact(v, [0.5, 0.99, 0.999])
    got = h.quantiles_us([0.5, 0.99, 0.999])
    assert np.all(np.abs(got - exact) / exact <= 0.001)
    assert h.bucket_count > LatencyHistogram(relative_error=0.01).bucket_count


def test_record_one_by_one_equals_vectorised():
    v = _samples("pareto", 5_000, seed=11)
    a, b = LatencyHistogram(), LatencyHistogram()
    for x in v:
        a.record_us(float(x))
    b.record_many_us(v)
    assert a.count == b.count == len(v)
    np.testing.assert_array_equal(a.quantiles_us(QS), b.quantiles_us(QS))
    assert a.summary() == b.summary()


def test_merge_equals_histogram_of_all_samples():
    x, y = _samples("lognormal", 20_000, seed=1), _samples("bimodal", 30_000, seed=2)
    hx, hy, hall = LatencyHistogram(), LatencyHistogram(), LatencyHistogram()
    hx.record_many_us(x)
    hy.record_many_us(y)
    hall.record_many_us(np.concatenate([x, y]))
    hx.merge(hy)
    assert hx.count == 50_000
    np.testing.assert_array_equal(hx.quantiles_us(QS), hall.quantiles_us(QS))
    assert hx.summary() == hall.summary()
    assert hy.count == 30_000  # the merged-in one is untouched


def test_merge_refuses_a_different_layout():
    with pytest.raises(ValueError, match="different layouts"):
        LatencyHistogram(relative_error=0.01).merge(LatencyHistogram(relative_error=0.001))
    with pytest.raises(ValueError, match="different layouts"):
        LatencyHistogram(max_value_us=1e6).merge(LatencyHistogram(max_value_us=1e7))


def test_empty_histogram_has_no_data_not_zero():
    h = LatencyHistogram()
    assert h.count == 0 and len(h) == 0
    assert h.summary() is None
    with pytest.raises(NoDataError, match="no samples"):
        h.quantile_us(0.99)
    with pytest.raises(NoDataError):
        h.quantiles_us([0.5])


def test_reset_starts_a_new_interval():
    h = LatencyHistogram()
    h.record_many_us(np.full(1000, 5000.0))
    assert h.quantile_us(0.5) == pytest.approx(5000.0, rel=0.01)
    h.reset()
    assert h.count == 0 and h.summary() is None
    h.record_many_us(np.full(10, 100.0))
    s = h.summary()
    assert s.count == 10 and s.max_us == 100.0 and s.p99_us == pytest.approx(100.0, rel=0.01)


def test_copy_is_independent():
    h = LatencyHistogram()
    h.record_us(100.0)
    c = h.copy()
    h.record_us(1e6)
    assert c.count == 1 and c.summary().max_us == 100.0
    assert h.count == 2


def test_quantile_definition_small_sample():
    """Inverted CDF: the smallest value with at least q of the samples at or below it."""
    h = LatencyHistogram()
    for v in (10.0, 20.0, 30.0, 40.0):
        h.record_us(v)
    assert h.quantile_us(0.25) == pytest.approx(10.0, rel=0.01)
    assert h.quantile_us(0.26) == pytest.approx(20.0, rel=0.01)
    assert h.quantile_us(0.5) == pytest.approx(20.0, rel=0.01)
    assert h.quantile_us(0.99) == pytest.approx(40.0, rel=0.01)
    assert h.quantile_us(0.0) == pytest.approx(10.0, rel=0.01)
    assert h.quantile_us(1.0) == 40.0  # clamped to the exact max


def test_values_below_the_linear_range_are_exact():
    h = LatencyHistogram()
    h.record_many_us(np.array([0.0, 0.001, 0.017, 0.05]))  # 0, 1, 17, 50 ns
    np.testing.assert_allclose(h.quantiles_us([0.25, 0.5, 0.75, 1.0]), [0.0, 0.001, 0.017, 0.05])


def test_overflow_is_counted_and_the_true_max_kept():
    h = LatencyHistogram(max_value_us=1000.0)
    h.record_many_us(np.array([10.0, 20.0, 5e6]))
    s = h.summary()
    assert s.overflow == 1 and h.overflow == 1
    assert s.max_us == 5e6
    assert s.p999_us <= 1000.0 * 1.01  # the top bucket: a lower bound, not an invented value


def test_count_above():
    h = LatencyHistogram()
    h.record_many_us(np.concatenate([np.full(900, 100.0), np.full(100, 50_000.0)]))
    assert h.count_above_us(1000.0) == 100
    assert h.count_above_us(60_000.0) == 0
    assert h.count_above_us(10.0) == 1000


@pytest.mark.parametrize("bad", [-1.0, math.nan, math.inf])
def test_bad_values_are_rejected(bad):
    h = LatencyHistogram()
    with pytest.raises(ValueError, match="latenc"):
        h.record_us(bad)
    with pytest.raises(ValueError, match="latenc"):
        h.record_many_us(np.array([1.0, bad]))
    assert h.count == 0


def test_bad_arguments():
    with pytest.raises(ValueError, match="relative_error"):
        LatencyHistogram(relative_error=0.0)
    with pytest.raises(ValueError, match="max_value_us"):
        LatencyHistogram(max_value_us=0.5)
    h = LatencyHistogram()
    h.record_us(1.0)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        h.quantile_us(1.5)
