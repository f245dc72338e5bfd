"""A latency histogram with bounded relative error: log-linear (HDR-style) buckets, O(1) record.

Why not keep every sample and call `numpy.percentile`? The load generator records one value per
request at thousands of requests per second and summarises every 500 ms interval; a histogram
costs O(1) per sample, fixed memory, and merges exactly (the whole-run summary is the sum of the
interval histograms), which a sample list or a streaming quantile sketch does not give.

Buckets (the layout of HdrHistogram, Gil Tene): values are recorded as integer nanoseconds `x`.
With `s` sub-bucket bits, values below `2**s` ns each get their own bucket (exact); above, each
power-of-two range `[2**k, 2**(k+1))` (k >= s) is split into `2**s` buckets of width `2**(k-s)`: the index is
`shift * 2**s + (x >> shift)` with `shift = bit_length(x) - 1 - s`, so a bucket's width is at most
`2**-s` of its lower edge. A quantile is reported as the middle of its bucket (clamped to the exact
min and max seen), so its relative error is at most `2**-(s+1)`; `s` is the smallest number of bits
that brings this under the requested `relative_error` (default 1%: s = 6, error <= 0.79%, about
2,000 buckets up to 60 s). Quantiles use the "inverted CDF" definition (the smallest recorded value
with at least a fraction q of the samples at or below it), numpy's `method="inverted_cdf"`.

An empty histogram has no quantiles: `quantile_us` raises `NoDataError` and `summary()` returns
None. A latency is never reported as zero for want of data.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

NS_PER_US = 1000.0


class NoDataError(LookupError):
    """A quantile was asked of a histogram that holds no samples."""


@dataclass(frozen=True)
class LatencySummary:
    """The quantiles of a non-empty histogram, in microseconds.

    `overflow` counts samples above the histogram's `max_value_us`; they are kept in the top bucket
    (so quantiles that fall there are a lower bound) and `max_us` still holds the true maximum.
    """

    count: int
    p50_us: float
    p99_us: float
    p999_us: float
    min_us: float
    max_us: float
    mean_us: float
    overflow: int = 0


class LatencyHistogram:
    """Log-linear latency histogram in microseconds; see the module docstring for the layout.

    `relative_error` bounds |reported - true| / true for quantiles of values of at least 1 us
    (below that the bound is 1 ns absolute). Two histograms merge only when built with the same
    `relative_error` and `max_value_us`. Not thread-safe: one writer, or the caller locks.
    """

    __slots__ = ("_counts", "_max_ns", "_max_x", "_min_ns", "_n", "_overflow", "_sub_bits", "_sum_ns")

    def __init__(self, relative_error: float = 0.01, max_value_us: float = 60e6) -> None:
        if not (0.0 < relative_error < 0.5) or not math.isfinite(relative_error):
            raise ValueError(f"relative_error must be in (0, 0.5), got {relative_error}")
        if not (max_value_us >= 1.0) or not math.isfinite(max_value_us):
            raise ValueError(f"max_value_us must be a finite number >= 1, got {max_value_us}")
        self._sub_bits = max(1, math.ceil(math.log2(1.0 / (2.0 * relative_error))))
        self._max_x = int(max_value_us * NS_PER_US)
        self._counts = np.zeros(self._index(self._max_x) + 1, dtype=np.int64)
        self._n = 0
        self._overflow = 0
        self._sum_ns = 0
        self._min_ns = math.inf
        self._max_ns = -math.inf

    # -- layout ---------------------------------------------------------------------------------

    @property
    def relative_error(self) -> float:
        """The guaranteed bound on a quantile's relative error (<= the requested one)."""
        return 2.0 ** -(self._sub_bits + 1)

    @property
    def max_value_us(self) -> float:
        return self._max_x / NS_PER_US

    @property
    def bucket_count(self) -> int:
        return len(self._counts)

    def _index(self, x: int) -> int:
        s = self._sub_bits
        shift = x.bit_length() - 1 - s
        if shift < 0:
            return x
        return (shift << s) + (x >> shift)

    def _bucket_mid_ns(self, idx: np.ndarray | int) -> np.ndarray:
        """The middle of the integer range that bucket `idx` covers, in ns."""
        s = self._sub_bits
        idx = np.asarray(idx, dtype=np.int64)
        shift = np.maximum((idx >> s) - 1, 0)
        lower = (idx - (shift << s)) << shift
        width = np.int64(1) << shift
        return lower + (width - 1) / 2.0

    # -- recording ------------------------------------------------------------------------------

    def record_us(self, value_us: float) -> None:
        """Record one latency. Negative or non-finite values raise ValueError (a caller bug)."""
        if not (value_us >= 0.0) or value_us == math.inf:
            raise ValueError(f"latency must be a finite number >= 0 us, got {value_us}")
        x = round(value_us * NS_PER_US)
        self._n += 1
        self._sum_ns += x
        if x < self._min_ns:
            self._min_ns = x
        if x > self._max_ns:
            self._max_ns = x
        if x > self._max_x:
            self._overflow += 1
            x = self._max_x
        self._counts[self._index(x)] += 1

    def record_many_us(self, values_us: np.ndarray) -> None:
        """Record an array of latencies at once (vectorised; same result as a loop of record_us)."""
        v = np.asarray(values_us, dtype=float).ravel()
        if v.size == 0:
            return
        if not np.all(np.isfinite(v)) or np.any(v < 0):
            raise ValueError("latencies must be finite numbers >= 0 us")
        x = np.rint(v * NS_PER_US).astype(np.int64)
        self._n += int(x.size)
        self._sum_ns += int(x.sum())
        self._min_ns = min(self._min_ns, int(x.min()))
        self._max_ns = max(self._max_ns, int(x.max()))
        over = x > self._max_x
        self._overflow += int(over.sum())
        x = np.minimum(x, self._max_x)
        s = self._sub_bits
        # bit_length(x) for x >= 1 is frexp's exponent (exact: x < 2**53); 0 has bit_length 0
        bl = np.where(x > 0, np.frexp(x.astype(float))[1], 0)
        shift = bl - 1 - s
        idx = np.where(shift < 0, x, (np.maximum(shift, 0) << s) + (x >> np.maximum(shift, 0)))
        self._counts += np.bincount(idx, minlength=len(self._counts))

    # -- reading --------------------------------------------------------------------------------

    @property
    def count(self) -> int:
        return self._n

    @property
    def overflow(self) -> int:
        return self._overflow

    def __len__(self) -> int:
        return self._n

    def quantile_us(self, q: float) -> float:
        """The q-quantile (q in [0, 1]) in us; raises NoDataError when there are no samples."""
        return float(self.quantiles_us([q])[0])

    def quantiles_us(self, qs: list[float] | tuple[float, ...] | np.ndarray) -> np.ndarray:
        """Several quantiles with one pass over the buckets; raises NoDataError when empty."""
        qs_arr = np.asarray(qs, dtype=float)
        if np.any(~(qs_arr >= 0.0) | ~(qs_arr <= 1.0)):
            raise ValueError(f"quantiles must be in [0, 1], got {qs}")
        if self._n == 0:
            raise NoDataError("the histogram holds no samples: there is no latency to report")
        cum = np.cumsum(self._counts)
        rank = np.maximum(1, np.ceil(qs_arr * self._n - 1e-9)).astype(np.int64)
        idx = np.searchsorted(cum, rank, side="left")
        mid = self._bucket_mid_ns(idx)
        return np.clip(mid, self._min_ns, self._max_ns) / NS_PER_US

    def count_above_us(self, value_us: float) -> int:
        """How many samples fell in buckets wholly above `value_us` (a lower bound on the true count)."""
        x = round(value_us * NS_PER_US)
        if x >= self._max_x:
            return 0
        return int(self._counts[self._index(max(x, 0)) + 1 :].sum())

    def summary(self) -> LatencySummary | None:
        """p50/p99/p99.9 and friends, or None when there is no sample (never zeros)."""
        if self._n == 0:
            return None
        p50, p99, p999 = self.quantiles_us([0.5, 0.99, 0.999])
        return LatencySummary(
            count=self._n,
            p50_us=float(p50),
            p99_us=float(p99),
            p999_us=float(p999),
            min_us=self._min_ns / NS_PER_US,
            max_us=self._max_ns / NS_PER_US,
            mean_us=self._sum_ns / self._n / NS_PER_US,
            overflow=self._overflow,
        )

    # -- combining ------------------------------------------------------------------------------

    def merge(self, other: LatencyHistogram) -> None:
        """Add `other`'s samples to this histogram (exact: same buckets required)."""
        if other._sub_bits != self._sub_bits or other._max_x != self._max_x:
            raise ValueError(
                "cannot merge histograms with different layouts "
                f"(relative_error {other.relative_error} vs {self.relative_error}, "
                f"max_value_us {other.max_value_us} vs {self.max_value_us})"
            )
        self._counts += other._counts
        self._n += other._n
        self._overflow += other._overflow
        self._sum_ns += other._sum_ns
        self._min_ns = min(self._min_ns, other._min_ns)
        self._max_ns = max(self._max_ns, other._max_ns)

    def copy(self) -> LatencyHistogram:
        h = LatencyHistogram.__new__(LatencyHistogram)
        h._sub_bits, h._max_x = self._sub_bits, self._max_x
        h._counts = self._counts.copy()
        h._n, h._overflow, h._sum_ns = self._n, self._overflow, self._sum_ns
        h._min_ns, h._max_ns = self._min_ns, self._max_ns
        return h

    def reset(self) -> None:
        """Forget every sample (start a new interval); the layout is kept."""
        self._counts[:] = 0
        self._n = self._overflow = self._sum_ns = 0
        self._min_ns, self._max_ns = math.inf, -math.inf
