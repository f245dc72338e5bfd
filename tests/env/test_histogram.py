"""env.histogram: HdrHistogram's layout, quantiles within the bound, exact merges, the encoded form."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hdrh.histogram import HdrHistogram

from env.histogram import (
    HIGHEST_NS,
    N_BUCKETS,
    RELATIVE_ERROR,
    HistogramRecorder,
    LatencyHistogram,
    NoDataError,
    bucket_index,
    bucket_lower_ns,
    bucket_width_ns,
    merge,
    quantile_rank,
)

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
    """The q-quantile as a load generator reports it: the floor(q n + 1/2)-th smallest sample (at
    least the first), written out here independently of `quantile_rank`."""
    s = np.sort(v)
    ranks = np.clip(np.floor(np.asarray(qs) * len(v) + 0.5).astype(int), 1, len(v))
    return s[ranks - 1]


def test_the_layout_is_hdrhistograms_with_two_significant_digits():
    ref = HdrHistogram(1, HIGHEST_NS, 2)
    assert ref.counts_len == N_BUCKETS
    rng = np.random.default_rng(0)
    xs = np.unique(np.concatenate([np.arange(0, 3000), rng.integers(0, HIGHEST_NS, 5000), [HIGHEST_NS]]))
    idx = bucket_index(xs)
    np.testing.assert_array_equal(idx, [ref._counts_index_for(int(x)) for x in xs])
    lo = bucket_lower_ns(idx)
    np.testing.assert_array_equal(lo, [ref.get_value_from_index(int(i)) for i in idx])
    assert np.all((lo <= xs) & (xs < lo + bucket_width_ns(idx)))
    assert RELATIVE_ERROR == 2.0**-8


@pytest.mark.parametrize("n", [1, 7, 50, 51, 84, 100, 101, 1001, 20_000])
def test_the_quantile_is_the_one_hdrhistogram_reports(n):
    """wrk2's HdrHistogram (C, and the `hdrh` package) counts floor(q n + 1/2) values up to the
    percentile; our quantile falls in the bucket of the value it reports."""
    v = _samples("lognormal", n, seed=5)
    ref = HdrHistogram(1, HIGHEST_NS, 2)
    for x in v:
        ref.record_value(round(x * 1000))
    h = LatencyHistogram.of_values_us(np.round(v * 1000) / 1000)
    for q in (0.1234, 0.5, 0.9, 0.98765, 0.99, 0.999):
        want = ref.get_value_at_percentile(q * 100)
        assert bucket_index(round(h.quantile_us(q) * 1000)) == bucket_index(want), (n, q)


def test_the_rank_is_the_one_tailbench_interpolates_at():
    """Tailbench's latency script (scipy.stats.scoreatpercentile) interpolates at the 1-based
    position q (n - 1) + 1; the rank is the one nearest to it wherever that is unambiguous."""
    for n in range(1, 3000):
        pos = 0.99 * (n - 1) + 1
        if abs(pos % 1 - 0.5) > 0.011:
            assert quantile_rank(0.99, n) == round(pos), n


def test_a_small_window_p99_is_its_second_largest_value_from_51_requests():
    """A p99 of 50 requests or fewer is their largest; of 51-100, the second largest (Sphinx at 10%
    of its max load sees ~84 requests in a minute: one slow request does not decide its p99)."""
    for n in (2, 50, 51, 84, 100):
        v = np.arange(1.0, n + 1.0) * 1000.0
        h = LatencyHistogram.of_values_us(v)
        want = n if n <= 50 else n - 1
        assert h.quantile_us(0.99) == pytest.approx(1000.0 * want, rel=RELATIVE_ERROR), n
        assert int(quantile_rank(0.99, n)) == want
    assert int(quantile_rank(0.99, 101)) == 100 and int(quantile_rank(0.99, 0)) == 1


@pytest.mark.parametrize("kind", ["lognormal", "exponential", "pareto", "bimodal"])
def test_quantiles_within_relative_error_of_exact_percentiles(kind):
    v = _samples(kind, 100_000, seed=7)
    h = LatencyHistogram.of_values_us(v)
    got = h.quantiles_us(QS)
    exact = _exact(v, QS)
    rel = np.abs(got - exact) / exact
    assert np.all(rel <= RELATIVE_ERROR + 1e-9), dict(zip(QS, rel, strict=True))
    s = h.summary()
    assert s is not None and s.count == len(v)
    assert s.min_us == pytest.approx(v.min(), abs=1e-3) and s.max_us == pytest.approx(v.max(), abs=1e-3)
    assert s.mean_us == pytest.approx(v.mean(), rel=1e-6)
    assert s.p50_us <= s.p99_us <= s.p999_us


def test_record_one_by_one_equals_vectorised():
    v = _samples("pareto", 5_000, seed=11)
    a, b = HistogramRecorder(), HistogramRecorder()
    for x in v:
        a.record_us(float(x))
    b.record_many_us(v)
    assert a.count == b.count == len(v)
    assert a.snapshot() == b.snapshot() and a.summary() == b.summary()


def test_two_intervals_merged_are_one_histogram_of_both():
    x, y = _samples("lognormal", 20_000, seed=1), _samples("bimodal", 30_000, seed=2)
    hx, hy = LatencyHistogram.of_values_us(x), LatencyHistogram.of_values_us(y)
    hall = LatencyHistogram.of_values_us(np.concatenate([x, y]))
    both = hx + hy
    assert both == hall and both.count == 50_000
    np.testing.assert_array_equal(both.counts, hall.counts)
    np.testing.assert_array_equal(both.quantiles_us(QS), hall.quantiles_us(QS))
    assert both.summary() == hall.summary()
    assert merge([hx, LatencyHistogram.empty(), hy]) == hall and merge([]) == LatencyHistogram.empty()
    rec = HistogramRecorder()
    rec.add(hx)
    rec.add(hy)
    assert rec.snapshot() == hall


def test_a_histogram_is_a_frozen_value():
    h = LatencyHistogram.of_values_us([10.0, 20.0])
    with pytest.raises(ValueError):
        h.counts[0] = 5
    with pytest.raises(AttributeError):
        h.offset = 3  # type: ignore[misc]
    with pytest.raises(ValueError, match="outside"):
        LatencyHistogram(N_BUCKETS - 1, np.array([1, 1]))
    with pytest.raises(ValueError, match=">= 0"):
        LatencyHistogram(5, np.array([1, -1]))


def test_empty_histogram_has_no_data_not_zero():
    h = LatencyHistogram.empty()
    assert h.count == 0 and len(h) == 0 and not h
    assert h.summary() is None
    with pytest.raises(NoDataError, match="no values"):
        h.quantile_us(0.99)
    assert HistogramRecorder().snapshot() == h


def test_reset_starts_a_new_interval():
    h = HistogramRecorder()
    h.record_many_us(np.full(1000, 5000.0))
    assert h.snapshot().quantile_us(0.5) == pytest.approx(5000.0, rel=0.01)
    h.reset()
    assert h.count == 0 and h.summary() is None
    h.record_many_us(np.full(10, 100.0))
    s = h.summary()
    assert s.count == 10 and s.max_us == 100.0 and s.p99_us == pytest.approx(100.0, rel=0.01)


def test_quantile_definition_small_sample():
    """The value of rank floor(q n + 1/2): of four values, q < 0.375 gives the first."""
    h = LatencyHistogram.of_values_us([10.0, 20.0, 30.0, 40.0])
    assert h.quantile_us(0.25) == pytest.approx(10.0, rel=0.01)
    assert h.quantile_us(0.37) == pytest.approx(10.0, rel=0.01)
    assert h.quantile_us(0.375) == pytest.approx(20.0, rel=0.01)
    assert h.quantile_us(0.5) == pytest.approx(20.0, rel=0.01)
    assert h.quantile_us(0.99) == pytest.approx(40.0, rel=0.01)
    assert h.quantile_us(0.0) == pytest.approx(10.0, rel=0.01)
    assert h.quantile_us(1.0) == 40.0  # clamped to the exact max


def test_values_below_256_ns_are_exact():
    h = LatencyHistogram.of_values_us([0.0, 0.001, 0.017, 0.25])
    np.testing.assert_allclose(h.quantiles_us([0.25, 0.5, 0.75, 1.0]), [0.0, 0.001, 0.017, 0.25])


def test_overflow_is_counted_and_the_true_max_kept():
    h = LatencyHistogram.of_values_us([10.0, 20.0, 2 * HIGHEST_NS / 1000.0])
    s = h.summary()
    assert s.overflow == 1 and h.overflow == 1
    assert s.max_us == 2 * HIGHEST_NS / 1000.0
    assert s.p999_us <= HIGHEST_NS / 1000.0 * (1 + RELATIVE_ERROR)  # the top bucket: a lower bound


def test_count_above_decides_the_quantile():
    h = LatencyHistogram.of_values_us(np.concatenate([np.full(900, 100.0), np.full(100, 50_000.0)]))
    assert h.count_above_us(1000.0) == 100
    assert h.count_above_us(60_000.0) == 0
    assert h.count_above_us(10.0) == 1000
    # quantile(q) > x exactly when more than n - quantile_rank(q, n) values are above x
    v = _samples("exponential", 2_000, seed=4)
    g = LatencyHistogram.of_values_us(v)
    for x in np.quantile(v, [0.5, 0.98, 0.99, 0.995]):
        assert (g.quantile_us(0.99) > x) == (g.count_above_us(x) > g.count - quantile_rank(0.99, g.count))


def test_encoded_form_round_trips_and_reads_other_layouts():
    v = _samples("lognormal", 10_000, seed=8)
    h = LatencyHistogram.of_values_us(v)
    text = h.encode()
    assert text.startswith("HISTF") and len(text) < 4000
    assert LatencyHistogram.decode(text) == h
    # wrk2 records microseconds with 3 significant digits: re-bucketed, within both bucket errors
    ref = HdrHistogram(1, 60_000_000, 3)
    for x in v:
        ref.record_value(round(x))
    g = LatencyHistogram.decode(ref.encode().decode(), unit="us")
    assert g.count == len(v)
    exact = _exact(np.round(v), [0.5, 0.99, 0.999])
    assert np.all(np.abs(g.quantiles_us([0.5, 0.99, 0.999]) - exact) / exact <= RELATIVE_ERROR + 1e-3)
    assert LatencyHistogram.decode(LatencyHistogram.empty().encode()) == LatencyHistogram.empty()


@pytest.mark.parametrize(
    "bad", ["", "HISTFAAAA", "not base64 at all!", "SGVsbG8gd29ybGQ=", "HISTF" + "A" * 300_000]
)
def test_decode_rejects_what_is_not_an_encoded_histogram(bad):
    with pytest.raises(ValueError):
        LatencyHistogram.decode(bad)


def test_decode_rejects_an_unknown_unit():
    with pytest.raises(ValueError, match="unit"):
        LatencyHistogram.decode(LatencyHistogram.empty().encode(), unit="parsecs")


@pytest.mark.parametrize("bad", [-1.0, math.nan, math.inf])
def test_bad_values_are_rejected(bad):
    h = HistogramRecorder()
    with pytest.raises(ValueError, match="latenc"):
        h.record_us(bad)
    with pytest.raises(ValueError, match="latenc"):
        h.record_many_us(np.array([1.0, bad]))
    assert h.count == 0


def test_bad_quantile_is_rejected():
    h = LatencyHistogram.of_values_us([1.0])
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        h.quantile_us(1.5)
