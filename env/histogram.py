"""Latency histograms: bucket counts with bounded relative error that merge exactly by addition
(DESIGN §3, §5).

A load generator reports the tail of *all requests of a run* (PARTIES Sec. 3.2, 5.1: one minute
of open-loop load, the p99 of every request), which no per-interval p99 can give: quantiles do not
average. So every interval's latency travels as a histogram, and a window's tail is read off the
sum of its intervals' histograms.

Layout: HdrHistogram's (Gil Tene), for values in integer nanoseconds with a lowest discernible
value of 1 ns and 2 significant decimal digits (`HdrHistogram(1, HIGHEST_NS, 2)`), so that our
counts *are* an HdrHistogram's counts array and its encoded form (`encode`/`decode`, the V2
compressed form of wrk2 and the HdrHistogram interval logs) converts exactly. Values below 256 ns
each have their own bucket; above, each power-of-two range [2^k, 2^(k+1)) is split into 128
buckets of width 2^(k-7). Bucket index of x: with b = bit_length(x | 255) - 8,
`index = ((b + 1) << 7) + (x >> b) - 128`. Values above `HIGHEST_NS` (one hour) are kept in the
top bucket and counted in `overflow`.

A quantile is reported at the middle of its bucket ("median equivalent value"), so its relative
error is at most 2^-8 (0.39%) for values of at least 256 ns (exact below). The q-quantile of N
values is the value of rank floor(q N + 1/2) (at least 1; `quantile_rank`), the rank the papers'
load generators report (PARTIES Sec. 3.2 names them): wrk2's HdrHistogram (C; also the `hdrh`
package) takes `count_at_percentile = (int64_t)(q N + 0.5)`, and Tailbench's latency script
(`utilities/parselats.py`, `scipy.stats.scoreatpercentile`) interpolates at the 0-based position
q (N - 1), i.e. between ranks around q N + 0.01, which round to the same rank unless q N lies within
0.01 below a half. For N <= 50 the p99 is the largest value; for 51 <= N <= 100 the second largest
(a ceil(q N) rank would take the largest up to N = 100, so a window of Sphinx's ~84 requests at 10%
load would be judged by its slowest one); for large N the rules agree to within one rank.
`count_above_us(x)` counts the values whose reported value exceeds x, consistently:
`quantile_us(q) > x` exactly when more than N - quantile_rank(q, N) values are above x.

`LatencyHistogram` is a frozen value (counts of a contiguous run of buckets from `offset`);
`HistogramRecorder` is the mutable recorder a load generator writes per request. An empty
histogram has no quantiles (`NoDataError`): a latency is never reported as zero for want of data.
"""

from __future__ import annotations

import binascii
import math
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
from hdrh.histogram import HdrHistogram

SUB_BITS = 7  # HdrHistogram's sub_bucket_half_count_magnitude for 2 significant digits
_HALF = 1 << SUB_BITS  # 128
_MASK = (_HALF << 1) - 1  # 255: HdrHistogram's sub_bucket_mask (unit magnitude 0)
HIGHEST_NS = 3_600 * 10**9  # one hour: the largest value with its own bucket
SIGNIFICANT_DIGITS = 2
RELATIVE_ERROR = 2.0 ** -(SUB_BITS + 1)  # of a quantile reported at its bucket's middle
NS_PER_US = 1000.0
UNIT_NS = {"ns": 1, "us": 1_000, "ms": 1_000_000, "s": 1_000_000_000}
MAX_ENCODED_CHARS = 200_000  # a histogram of this layout encodes in a few kB at most


class NoDataError(LookupError):
    """A quantile was asked of a histogram that holds no values."""


def bucket_index(x_ns: np.ndarray | int) -> np.ndarray:
    """Bucket index of each (integer, ns) value; values are clipped to [0, HIGHEST_NS]."""
    x = np.clip(np.asarray(x_ns, dtype=np.int64), 0, HIGHEST_NS)
    # bit_length of a value < 2**53 is frexp's exponent
    b = np.frexp((x | _MASK).astype(float))[1].astype(np.int64) - (SUB_BITS + 1)
    return ((b + 1) << SUB_BITS) + (x >> b) - _HALF


# whole sub-bucket runs up to the one holding HIGHEST_NS: HdrHistogram(1, HIGHEST_NS, 2).counts_len
N_BUCKETS = ((int(bucket_index(HIGHEST_NS)) >> SUB_BITS) + 1) << SUB_BITS


def _bucket_range(
    index: np.ndarray | int, sub_bits: int, unit_magnitude: int
) -> tuple[np.ndarray, np.ndarray]:
    """(smallest value, number of values) of each bucket of an HdrHistogram layout."""
    i = np.asarray(index, dtype=np.int64)
    half = 1 << sub_bits
    b = (i >> sub_bits) - 1
    sub = np.where(b < 0, i & (half - 1), (i & (half - 1)) + half)
    shift = np.maximum(b, 0) + unit_magnitude
    return sub << shift, np.int64(1) << shift


def bucket_lower_ns(index: np.ndarray | int) -> np.ndarray:
    """Smallest value of each bucket (ns, int64)."""
    return _bucket_range(index, SUB_BITS, 0)[0]


def bucket_width_ns(index: np.ndarray | int) -> np.ndarray:
    """Number of integer values each bucket holds (ns, int64)."""
    return _bucket_range(index, SUB_BITS, 0)[1]


def bucket_mid_ns(index: np.ndarray | int) -> np.ndarray:
    """The value a bucket is reported at: the middle of its integer range (ns, float)."""
    return bucket_lower_ns(index) + (bucket_width_ns(index) - 1) / 2.0


def quantile_rank(q: float | np.ndarray, n: float | np.ndarray) -> np.ndarray:
    """The rank (1-based) of the q-quantile (0 <= q <= 1) of n values: floor(q n + 1/2), which is at
    most n, and at least 1 (module docstring). Vectorised over `q` and `n`; for n < 1, 1. On the
    simulator's hot path (every interval's p99 draw), hence no clip."""
    return np.maximum(np.floor(np.multiply(q, n) + 0.5), 1.0)


@dataclass(frozen=True)
class LatencySummary:
    """The quantiles of a non-empty histogram, in microseconds. `overflow` counts values above
    `HIGHEST_NS` (kept in the top bucket, so quantiles that fall there are lower bounds)."""

    count: int
    p50_us: float
    p99_us: float
    p999_us: float
    min_us: float
    max_us: float
    mean_us: float
    overflow: int = 0


@dataclass(frozen=True, eq=False)
class LatencyHistogram:
    """Counts of the buckets `offset .. offset + len(counts) - 1` (module docstring for the layout).

    `sum_ns`, `min_ns` and `max_ns` are the exact sum, smallest and largest value where the
    histogram was recorded value by value, else bucket-middle estimates; `overflow` counts values
    above `HIGHEST_NS`. Two histograms add exactly (`a + b`, `merge`): counts by addition.
    """

    offset: int
    counts: np.ndarray  # int64, read-only
    sum_ns: float = 0.0
    min_ns: float = math.inf
    max_ns: float = -math.inf
    overflow: int = 0

    def __post_init__(self) -> None:
        c = np.asarray(self.counts, dtype=np.int64)
        if c.ndim != 1 or (c.size and int(c.min()) < 0):
            raise ValueError("histogram counts must be a 1-d array of integers >= 0")
        if self.offset < 0 or self.offset + c.size > N_BUCKETS:
            raise ValueError(f"buckets {self.offset}..{self.offset + c.size - 1} outside 0..{N_BUCKETS - 1}")
        if c is self.counts and c.flags.writeable:
            c = c.copy()
        c.flags.writeable = False
        object.__setattr__(self, "counts", c)

    # ---- construction --------------------------------------------------------------------------
    @classmethod
    def empty(cls) -> LatencyHistogram:
        return _EMPTY

    @classmethod
    def trusted(
        cls, offset: int, counts: np.ndarray, *, sum_ns: float, min_ns: float, max_ns: float
    ) -> LatencyHistogram:
        """A histogram from counts the caller guarantees valid (an int64 array of counts >= 0
        inside the layout, handed over: it is made read-only, not copied). The simulator's fast
        path: it builds one per app per interval."""
        h = object.__new__(cls)
        counts.flags.writeable = False
        for k, v in (("offset", offset), ("counts", counts), ("sum_ns", sum_ns), ("min_ns", min_ns)):
            object.__setattr__(h, k, v)
        object.__setattr__(h, "max_ns", max_ns)
        object.__setattr__(h, "overflow", 0)
        return h

    @classmethod
    def from_buckets(cls, offset: int, counts: np.ndarray, overflow: int = 0) -> LatencyHistogram:
        """A histogram from bucket counts alone (sum, min and max estimated from the buckets)."""
        c = np.asarray(counts, dtype=np.int64)
        nz = np.flatnonzero(c)
        if nz.size == 0:
            return cls.empty()
        c = c[nz[0] : nz[-1] + 1]
        off = offset + int(nz[0])
        idx = np.arange(off, off + c.size)
        return cls(
            off,
            c,
            sum_ns=float(np.dot(c, bucket_mid_ns(idx))),
            min_ns=float(bucket_lower_ns(off)),
            max_ns=float(bucket_lower_ns(off + c.size - 1) + bucket_width_ns(off + c.size - 1) - 1),
            overflow=overflow,
        )

    @classmethod
    def of_values_us(cls, values_us: np.ndarray | Sequence[float]) -> LatencyHistogram:
        """The histogram of a set of latencies (us; finite and >= 0, else ValueError)."""
        rec = HistogramRecorder()
        rec.record_many_us(np.asarray(values_us, dtype=float))
        return rec.snapshot()

    # ---- reading -------------------------------------------------------------------------------
    @property
    def count(self) -> int:
        return int(self.counts.sum())

    def __len__(self) -> int:
        return self.count

    def __bool__(self) -> bool:
        return self.count > 0

    def __eq__(self, other: object) -> bool:
        """Same counts in the same buckets (zero buckets at either end do not matter)."""
        if not isinstance(other, LatencyHistogram):
            return NotImplemented
        (a, ca), (b, cb) = self._trimmed(), other._trimmed()
        return a == b and np.array_equal(ca, cb) and self.overflow == other.overflow

    def _trimmed(self) -> tuple[int, np.ndarray]:
        nz = np.flatnonzero(self.counts)
        if nz.size == 0:
            return 0, self.counts[:0]
        return self.offset + int(nz[0]), self.counts[nz[0] : nz[-1] + 1]

    __hash__ = None  # type: ignore[assignment]

    def quantiles_us(self, qs: Sequence[float] | np.ndarray) -> np.ndarray:
        """Several quantiles (q in [0, 1]) in us, each at its bucket's middle clamped to the known
        min and max; raises NoDataError when the histogram is empty."""
        q = np.asarray(qs, dtype=float)
        if np.any(~(q >= 0.0) | ~(q <= 1.0)):
            raise ValueError(f"quantiles must be in [0, 1], got {qs}")
        n = self.count
        if n == 0:
            raise NoDataError("the histogram holds no values: there is no latency to report")
        rank = quantile_rank(q, n).astype(np.int64)
        k = np.searchsorted(np.cumsum(self.counts), rank, side="left")
        mid = bucket_mid_ns(self.offset + k)
        return np.clip(mid, self.min_ns, self.max_ns) / NS_PER_US

    def quantile_us(self, q: float) -> float:
        return float(self.quantiles_us([q])[0])

    def count_above_us(self, x_us: float) -> int:
        """How many values are reported above `x_us` (their bucket's middle exceeds it): the count
        that decides whether a quantile exceeds x (module docstring)."""
        if self.counts.size == 0:
            return 0
        mid = bucket_mid_ns(np.arange(self.offset, self.offset + self.counts.size))
        k = int(np.searchsorted(mid, x_us * NS_PER_US, side="right"))
        return int(self.counts[k:].sum())

    def summary(self) -> LatencySummary | None:
        """p50/p99/p99.9 and friends, or None when the histogram is empty (never zeros)."""
        n = self.count
        if n == 0:
            return None
        p50, p99, p999 = self.quantiles_us([0.5, 0.99, 0.999])
        return LatencySummary(
            count=n,
            p50_us=float(p50),
            p99_us=float(p99),
            p999_us=float(p999),
            min_us=self.min_ns / NS_PER_US,
            max_us=self.max_ns / NS_PER_US,
            mean_us=self.sum_ns / n / NS_PER_US,
            overflow=self.overflow,
        )

    # ---- combining -----------------------------------------------------------------------------
    def __add__(self, other: LatencyHistogram) -> LatencyHistogram:
        return merge([self, other])

    # ---- the HdrHistogram encoded form ---------------------------------------------------------
    def encode(self) -> str:
        """HdrHistogram's V2 compressed, base64 form ("HISTF..."), values in ns."""
        h = HdrHistogram(1, HIGHEST_NS, SIGNIFICANT_DIGITS)
        n = self.count
        if n:
            dense = np.ctypeslib.as_array(h.counts)
            dense[self.offset : self.offset + self.counts.size] = self.counts
            h.set_internal_tacking_values(self.offset, self.offset + self.counts.size - 1, n)
        return h.encode().decode("ascii")

    @classmethod
    def decode(cls, text: str, unit: str = "ns") -> LatencyHistogram:
        """A histogram from HdrHistogram's encoded form whose values are in `unit` ("ns", "us",
        "ms" or "s"). Exact when the source has this layout and unit ns; otherwise each source
        bucket's count goes to the bucket of its middle value (adding at most the source's own
        bucket error). Raises ValueError for anything that is not such an encoding."""
        if unit not in UNIT_NS:
            raise ValueError(f"histogram unit must be one of {sorted(UNIT_NS)}, got {unit!r}")
        if not isinstance(text, str) or not text:
            raise ValueError("an encoded histogram must be a non-empty string")
        if len(text) > MAX_ENCODED_CHARS:
            raise ValueError(f"encoded histogram of {len(text)} characters (at most {MAX_ENCODED_CHARS})")
        try:
            src = HdrHistogram.decode(text.encode("ascii"))
        except (ValueError, TypeError, UnicodeError, binascii.Error, zlib.error, MemoryError) as e:
            raise ValueError(f"not an HdrHistogram encoding ({type(e).__name__}: {e})") from None
        except Exception as e:  # hdrh's own HdrCookieException / HdrLengthException
            raise ValueError(f"not an HdrHistogram encoding ({type(e).__name__}: {e})") from None
        dense = np.ctypeslib.as_array(src.counts).astype(np.int64)
        nz = np.flatnonzero(dense)
        if nz.size == 0:
            return cls.empty()
        scale = UNIT_NS[unit]
        same = (
            scale == 1
            and src.unit_magnitude == 0
            and src.sub_bucket_half_count_magnitude == SUB_BITS
            and dense.size <= N_BUCKETS
        )
        if same:
            return cls.from_buckets(0, dense)
        lo, width = _bucket_range(nz, src.sub_bucket_half_count_magnitude, src.unit_magnitude)
        mid_ns = (lo + (width - 1) / 2.0) * scale
        over = int(dense[nz][mid_ns > HIGHEST_NS].sum())
        idx = bucket_index(np.rint(np.minimum(mid_ns, HIGHEST_NS)).astype(np.int64))
        out = np.bincount(idx - idx.min(), weights=dense[nz]).astype(np.int64)
        return cls.from_buckets(int(idx.min()), out, overflow=over)


_EMPTY = LatencyHistogram(0, np.zeros(0, dtype=np.int64))


def merge(hists: Iterable[LatencyHistogram]) -> LatencyHistogram:
    """The histogram of all values of `hists` (exact: counts add)."""
    hs = [h for h in hists if h.counts.size]
    if not hs:
        return LatencyHistogram.empty()
    lo = min(h.offset for h in hs)
    hi = max(h.offset + h.counts.size for h in hs)
    acc = np.zeros(hi - lo, dtype=np.int64)
    for h in hs:
        acc[h.offset - lo : h.offset - lo + h.counts.size] += h.counts
    return LatencyHistogram(
        lo,
        acc,
        sum_ns=sum(h.sum_ns for h in hs),
        min_ns=min(h.min_ns for h in hs),
        max_ns=max(h.max_ns for h in hs),
        overflow=sum(h.overflow for h in hs),
    )


class HistogramRecorder:
    """Records latencies one by one (or an array at a time) into the layout of `LatencyHistogram`;
    `snapshot()` is the frozen histogram of what was recorded. O(1) per value, fixed memory. Not
    thread-safe: one writer, or the caller locks."""

    __slots__ = ("_counts", "_max_ns", "_min_ns", "_overflow", "_sum_ns")

    def __init__(self) -> None:
        self._counts = np.zeros(N_BUCKETS, dtype=np.int64)
        self.reset()

    def reset(self) -> None:
        """Forget every value (start a new interval)."""
        self._counts[:] = 0
        self._sum_ns: float = 0.0
        self._overflow = 0
        self._min_ns: float = math.inf
        self._max_ns: float = -math.inf

    @property
    def count(self) -> int:
        return int(self._counts.sum())

    def record_us(self, value_us: float) -> None:
        """Record one latency. Negative or non-finite values raise ValueError (a caller bug)."""
        if not (value_us >= 0.0) or value_us == math.inf:
            raise ValueError(f"latency must be a finite number >= 0 us, got {value_us}")
        x = round(value_us * NS_PER_US)
        self._sum_ns += x
        self._min_ns = min(self._min_ns, x)
        self._max_ns = max(self._max_ns, x)
        if x > HIGHEST_NS:
            self._overflow += 1
        self._counts[int(bucket_index(x))] += 1

    def record_many_us(self, values_us: np.ndarray) -> None:
        """Record an array of latencies at once (the same result as a loop of `record_us`)."""
        v = np.asarray(values_us, dtype=float).ravel()
        if v.size == 0:
            return
        if not np.all(np.isfinite(v)) or np.any(v < 0):
            raise ValueError("latencies must be finite numbers >= 0 us")
        x = np.rint(v * NS_PER_US).astype(np.int64)
        self._sum_ns += int(x.sum())
        self._min_ns = min(self._min_ns, int(x.min()))
        self._max_ns = max(self._max_ns, int(x.max()))
        self._overflow += int((x > HIGHEST_NS).sum())
        self._counts += np.bincount(bucket_index(x), minlength=N_BUCKETS)

    def add(self, hist: LatencyHistogram) -> None:
        """Add a frozen histogram's values (exact)."""
        if hist.counts.size == 0:
            return
        self._counts[hist.offset : hist.offset + hist.counts.size] += hist.counts
        self._sum_ns += hist.sum_ns
        self._min_ns = min(self._min_ns, hist.min_ns)
        self._max_ns = max(self._max_ns, hist.max_ns)
        self._overflow += hist.overflow

    def snapshot(self) -> LatencyHistogram:
        nz = np.flatnonzero(self._counts)
        if nz.size == 0:
            return LatencyHistogram.empty()
        return LatencyHistogram(
            int(nz[0]),
            self._counts[nz[0] : nz[-1] + 1].copy(),
            sum_ns=float(self._sum_ns),
            min_ns=float(self._min_ns),
            max_ns=float(self._max_ns),
            overflow=self._overflow,
        )

    def summary(self) -> LatencySummary | None:
        return self.snapshot().summary()
