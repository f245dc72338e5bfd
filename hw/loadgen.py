"""An open-loop load generator for memcached (text protocol) and HTTP/1.1 servers.

Open loop: the send times are a Poisson process at `max_load_rps x trace(t)` (an `env.sim.traces`
spec, the same load shapes the simulator uses), drawn in advance from an injected seed and never
held back by responses. Each request's latency runs from its *intended* send time to its response,
so a stalled server shows up as the queue it really builds, not as one slow request (no
"coordinated omission", Gil Tene; the fix wrk2 and mutilate's open-loop mode make).

Requests go over a pool of TCP connections, pipelined up to a depth per connection (memcached
answers in order; HTTP/1.1 keep-alive with depth 1 by default, like browsers). A request that finds
every connection at its depth waits in a client-side queue; its wait counts in its latency. A
request without a response after `timeout_s` is a drop (`timeouts`); by default it also enters the
latency histogram at `timeout_s`, a lower bound of its latency, so an overloaded server's p99
rises instead of vanishing. A late response to a dropped request is discarded (`late`).

Every interval (500 ms by default) the generator summarises: p50/p99/p99.9 from a log-linear
histogram (`env.histogram`, <= 0.4% error), rps scheduled/sent/completed, errors and timeouts, and its
own *schedule lag* (how late it sent compared with the schedule). With `sub_interval_s` (e.g. 0.1,
the sampling period of PARTIES' own code) it also rolls a histogram per sub-interval inside the
interval and reports each sub-interval's p99 (`sub_p99_us`). The interval goes to a callback
and to feed publishers (`hw.feed`: UDP, a JSONL file, or in-process), which is how the LinuxNode
sees the app's latency; the feed's `rps` is the offered rate (arrivals scheduled in the interval,
what the app was asked to serve), which stays honest when a saturated server falls behind. An
interval with no latency sample is not published: the feed goes silent and its consumer marks the
sample invalid, never zero.

Timing: the run uses its own event loop over `select()` (microsecond timeouts; the default epoll
loop rounds every timer up to a whole millisecond) and sets the thread's timer slack to 1 ns, so a
sleep ends within ~40 us here. Any lag past that is part of the measured latency and is reported
(`lag_p99_us`; `behind_schedule` when it exceeds `max_lag_us`), not hidden.

Throughput, measured on the project's 2-core VM (Python 3.11, Debian's memcached 1.6 with 2
threads on the same VM, defaults: 4 connections x 64 pipelined, 10% sets, 5 s runs, while other
work kept the CPUs 50-90% busy): every request of 2k-30k rps was sent and answered with a median
schedule lag of 65-90 us (30k rps used ~75% of one core); at 35k rps the median lag grew to
~140 us and at 40k to ~1 ms, with every interval flagged: about 30,000 rps is the most one
generator sustains here. The lag's tail (p99 3-6 ms at any rate, 0.55 ms in a quiet moment at
30k) comes from the CPU contention, not the rate. Run more generator processes for more load, and
give them their own core (taskset) for a clean tail.

Use it as a library (`LoadGenerator(config).start()` ... `.stop()` in a background thread, or
`await LoadGenerator(config).run()` as an asyncio task) or from the command line:

    python -m hw.loadgen --target memcached://127.0.0.1:11211 --rate 5000 --duration-s 10 \\
        --publish udp://127.0.0.1:9999 --app memcached
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import json
import logging
import math
import selectors
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

import numpy as np
import yaml

from env.config import EXIT_BAD_INPUT, ConfigError
from env.histogram import HistogramRecorder, LatencyHistogram, LatencySummary
from env.sim.traces import Constant, Trace, TraceSpec, parse_trace
from hw.feed import LatencyPublisher, publisher_from_url

log = logging.getLogger(__name__)

OK, MISS, ERROR = 0, 1, 2
GET, SET = 0, 1
MAX_CONNECTIONS = 512  # select() handles descriptors < 1024
MAX_RETRIES = 3  # re-sends of a request left unanswered behind a server-announced close


# -- configuration -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """Where the load goes: `memcached://HOST:PORT` or `http://HOST:PORT/PATH`."""

    protocol: Literal["memcached", "http"]
    host: str
    port: int
    path: str = "/"

    @classmethod
    def parse(cls, url: str) -> Target:
        parts = urlsplit(url)
        protocol: Literal["memcached", "http"]
        if parts.scheme == "memcached":
            protocol = "memcached"
        elif parts.scheme == "http":
            protocol = "http"
        else:
            raise ConfigError(f"target {url!r}: expected memcached://HOST:PORT or http://HOST:PORT/PATH")
        try:
            port = parts.port
        except ValueError:
            raise ConfigError(f"target {url!r}: the port is not a number in 0..65535") from None
        host = parts.hostname
        if not host:
            raise ConfigError(f"target {url!r}: no host")
        if port is None:
            port = 11211 if parts.scheme == "memcached" else 80
        if not (1 <= port <= 65535):
            raise ConfigError(f"target {url!r}: port must be in 1..65535")
        if parts.scheme == "memcached" and parts.path not in ("", "/"):
            raise ConfigError(f"target {url!r}: a memcached target has no path")
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        return cls(protocol, host, port, path)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        if self.protocol == "memcached":
            return f"memcached://{host}:{self.port}"
        return f"http://{host}:{self.port}{self.path}"


@dataclass(frozen=True)
class LoadGenConfig:
    """One load generator run. Rates in requests per second, times in seconds.

    `trace` scales `max_load_rps` over time (None = constant 1.0); `duration_s` None runs until
    `stop()`. `connections`/`pipeline_depth` None take the protocol's default (memcached 4 x 64,
    HTTP 16 x 1). The memcached workload: `keys` keys with Zipfian popularity (exponent
    `zipf_s`), a fraction `set_fraction` of sets of `value_bytes` bytes, and a `warmup` that sets
    every key first so gets hit. `seed` None draws fresh entropy (the run is then not repeatable).
    """

    target: Target
    max_load_rps: float
    app: str = ""
    trace: TraceSpec | None = None
    duration_s: float | None = None
    connections: int | None = None
    pipeline_depth: int | None = None
    timeout_s: float = 1.0
    interval_s: float = 0.5
    keys: int = 10_000
    zipf_s: float = 0.99
    set_fraction: float = 0.1
    value_bytes: int = 64
    warmup: bool = True
    seed: int | None = None
    record_timeouts: bool = True
    max_lag_us: float = 1000.0
    keep_intervals: int = 7200
    sub_interval_s: float | None = None  # also report the p99 of each sub-interval this long

    def __post_init__(self) -> None:
        def need(ok: bool, msg: str) -> None:
            if not ok:
                raise ConfigError(f"loadgen: {msg}")

        need(isinstance(self.target, Target), "target must be a Target (use Target.parse(url))")
        need(math.isfinite(self.max_load_rps) and self.max_load_rps > 0, "max_load_rps must be > 0")
        need(
            self.duration_s is None or (math.isfinite(self.duration_s) and self.duration_s > 0),
            "duration_s must be > 0",
        )
        need(
            self.connections is None or 1 <= self.connections <= MAX_CONNECTIONS,
            f"connections must be in 1..{MAX_CONNECTIONS}",
        )
        need(self.pipeline_depth is None or self.pipeline_depth >= 1, "pipeline_depth must be >= 1")
        need(math.isfinite(self.timeout_s) and self.timeout_s > 0, "timeout_s must be > 0")
        need(math.isfinite(self.interval_s) and self.interval_s >= 0.01, "interval_s must be >= 0.01")
        need(self.keys >= 1, "keys must be >= 1")
        need(math.isfinite(self.zipf_s) and self.zipf_s >= 0, "zipf_s must be >= 0 (0 = uniform)")
        need(0.0 <= self.set_fraction <= 1.0, "set_fraction must be in [0, 1]")
        need(1 <= self.value_bytes <= 1_000_000, "value_bytes must be in 1..1000000")
        need(self.max_lag_us > 0, "max_lag_us must be > 0")
        need(self.keep_intervals >= 1, "keep_intervals must be >= 1")
        need(self.sub_intervals >= 1, "sub_interval_s must divide interval_s evenly")
        if not self.app:
            object.__setattr__(self, "app", self.target.protocol)

    @property
    def sub_intervals(self) -> int:
        """Sub-intervals per interval (1 without `sub_interval_s`; 0 when it does not divide it)."""
        if self.sub_interval_s is None:
            return 1
        n = round(self.interval_s / self.sub_interval_s) if self.sub_interval_s > 0 else 0
        return n if n >= 1 and abs(n * self.sub_interval_s - self.interval_s) < 1e-9 * self.interval_s else 0

    @property
    def n_connections(self) -> int:
        return self.connections or (4 if self.target.protocol == "memcached" else 16)

    @property
    def depth(self) -> int:
        return self.pipeline_depth or (64 if self.target.protocol == "memcached" else 1)


# -- the arrival process -----------------------------------------------------------------------


class ArrivalSchedule:
    """Send times (s since the run's start) of a Poisson process with rate `max_load_rps x trace(t)`.

    Time rescaling: unit-rate exponential gaps in the integrated rate Lambda(t), mapped back to
    time through Lambda on a fine grid (`grid_s`, linear in between), chunk by chunk so a run can
    last as long as it likes. With a constant trace the gaps are exactly exponential. A rate of
    zero (load 0) sends nothing. Deterministic for a given generator state.
    """

    def __init__(
        self,
        trace: Trace,
        max_load_rps: float,
        rng: np.random.Generator,
        *,
        chunk_s: float = 0.25,
        grid_s: float = 0.001,
    ) -> None:
        if not (max_load_rps > 0):
            raise ValueError(f"max_load_rps must be > 0, got {max_load_rps}")
        self._trace, self._rate, self._rng = trace, float(max_load_rps), rng
        self._n = max(1, round(chunk_s / grid_s))
        self._grid_s = grid_s
        self._t0 = 0.0
        self._carry = float(rng.exponential())  # Lambda-distance from the chunk start to the next arrival

    @property
    def next_chunk_start_s(self) -> float:
        return self._t0

    def rate_rps(self, t_s: np.ndarray | float) -> np.ndarray:
        return (
            np.maximum(np.asarray(self._trace.values(np.asarray(t_s, dtype=float)), dtype=float), 0.0)
            * self._rate
        )

    def next_chunk(self) -> np.ndarray:
        """The arrivals in the next `chunk_s` of schedule time, ascending."""
        t = self._t0 + self._grid_s * np.arange(self._n + 1)
        lam = self.rate_rps(t)
        big_l = np.concatenate(([0.0], np.cumsum((lam[1:] + lam[:-1]) * (self._grid_s / 2.0))))
        total = float(big_l[-1])
        us: list[np.ndarray] = []
        u = self._carry
        while u <= total:
            m = total - u
            draws = self._rng.exponential(size=int(m + 5.0 * math.sqrt(m) + 16))
            cs = u + np.concatenate(([0.0], np.cumsum(draws)))
            inside = cs <= total
            k = int(np.count_nonzero(inside))
            us.append(cs[:k])
            u = float(cs[k]) if k < len(cs) else float(cs[-1]) + float(self._rng.exponential())
        self._carry = u - total
        self._t0 = float(t[-1])
        if not us:
            return np.empty(0)
        arr = np.concatenate(us)
        idx = np.clip(np.searchsorted(big_l, arr, side="left"), 1, self._n)
        lo, hi = big_l[idx - 1], big_l[idx]
        frac = np.where(hi > lo, (arr - lo) / np.where(hi > lo, hi - lo, 1.0), 0.0)
        return t[idx - 1] + frac * self._grid_s

    def until(self, end_s: float) -> np.ndarray:
        """Every arrival before `end_s` (from the current position); for tests and planning."""
        parts = []
        while self._t0 < end_s:
            c = self.next_chunk()
            parts.append(c[c < end_s])
        return np.concatenate(parts) if parts else np.empty(0)


class ZipfKeys:
    """Key ranks 0..n-1 with P(rank k) proportional to 1/(k+1)**s (s = 0: uniform)."""

    def __init__(self, n_keys: int, s: float, rng: np.random.Generator) -> None:
        if n_keys < 1:
            raise ValueError("n_keys must be >= 1")
        w = 1.0 / np.arange(1, n_keys + 1, dtype=float) ** s
        self._cdf = np.cumsum(w) / w.sum()
        self._cdf[-1] = 1.0
        self._rng = rng

    def sample(self, n: int) -> np.ndarray:
        return np.minimum(np.searchsorted(self._cdf, self._rng.random(n), side="right"), len(self._cdf) - 1)


# -- protocols ---------------------------------------------------------------------------------


class ProtocolError(Exception):
    """The server's byte stream cannot be parsed: the connection is dropped."""


class _MemcachedParser:
    server_closing = False

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[int]:
        buf = self._buf
        buf += data
        out: list[int] = []
        pos = 0
        while True:
            le = buf.find(b"\r\n", pos)
            if le < 0:
                break
            if buf.startswith(b"VALUE ", pos):
                parts = bytes(buf[pos:le]).split()
                try:
                    n = int(parts[3])
                except (IndexError, ValueError):
                    raise ProtocolError(f"bad memcached VALUE line {bytes(buf[pos:le])[:80]!r}") from None
                end = le + 2 + n + 2
                if len(buf) < end + 5:
                    break
                if buf[end : end + 5] != b"END\r\n":
                    raise ProtocolError("memcached VALUE not followed by END")
                out.append(OK)
                pos = end + 5
                continue
            line = bytes(buf[pos:le])
            if line == b"END":
                out.append(MISS)
            elif line in (b"STORED", b"NOT_STORED", b"EXISTS", b"NOT_FOUND"):
                out.append(OK)
            elif line == b"ERROR" or line.startswith((b"CLIENT_ERROR", b"SERVER_ERROR")):
                out.append(ERROR)
            else:
                raise ProtocolError(f"unexpected memcached response {line[:80]!r}")
            pos = le + 2
        del buf[:pos]
        return out


class _HttpParser:
    def __init__(self) -> None:
        self._buf = bytearray()
        self.server_closing = False

    @staticmethod
    def _chunked_end(buf: bytearray, i: int) -> int | None:
        while True:
            le = buf.find(b"\r\n", i)
            if le < 0:
                return None
            try:
                size = int(bytes(buf[i:le]).split(b";")[0].strip(), 16)
            except ValueError:
                raise ProtocolError(f"bad chunk size line {bytes(buf[i:le])[:40]!r}") from None
            i = le + 2
            if size == 0:
                if buf[i : i + 2] == b"\r\n":
                    return i + 2
                te = buf.find(b"\r\n\r\n", i)
                return None if te < 0 else te + 4
            i += size + 2
            if i > len(buf):
                return None

    def feed(self, data: bytes) -> list[int]:
        buf = self._buf
        buf += data
        out: list[int] = []
        pos = 0
        while True:
            hend = buf.find(b"\r\n\r\n", pos)
            if hend < 0:
                break
            lines = bytes(buf[pos:hend]).split(b"\r\n")
            status = lines[0].split(b" ", 2)
            if len(status) < 2 or not status[0].startswith(b"HTTP/1."):
                raise ProtocolError(f"not an HTTP/1.x status line: {lines[0][:80]!r}")
            try:
                code = int(status[1])
            except ValueError:
                raise ProtocolError(f"bad HTTP status {status[1][:20]!r}") from None
            clen: int | None = None
            chunked = False
            close = status[0] == b"HTTP/1.0"
            for h in lines[1:]:
                name, _, value = h.partition(b":")
                name, value = name.strip().lower(), value.strip().lower()
                if name == b"content-length":
                    try:
                        clen = int(value)
                    except ValueError:
                        raise ProtocolError(f"bad Content-Length {value[:20]!r}") from None
                elif name == b"transfer-encoding":
                    chunked = b"chunked" in value
                elif name == b"connection":
                    close = b"close" in value or (close and b"keep-alive" not in value)
            start = hend + 4
            if 100 <= code < 200:
                pos = start
                continue
            if code in (204, 304):
                end: int | None = start
            elif chunked:
                end = self._chunked_end(buf, start)
            elif clen is not None:
                end = start + clen if len(buf) >= start + clen else None
            else:
                raise ProtocolError("HTTP response without Content-Length or chunked body (cannot pipeline)")
            if end is None:
                break
            out.append(OK if code < 400 else ERROR)
            pos = end
            if close:
                self.server_closing = True
                break
        del buf[:pos]
        return out


class _Codec:
    """Request bytes and response parsers of one protocol."""

    def __init__(self, cfg: LoadGenConfig) -> None:
        self.protocol = cfg.target.protocol
        self._value = b"v" * cfg.value_bytes
        t = cfg.target
        host = f"[{t.host}]" if ":" in t.host else t.host
        self._http = (
            f"GET {t.path} HTTP/1.1\r\nHost: {host}:{t.port}\r\nUser-Agent: coloc-loadgen\r\n\r\n".encode()
        )

    def request(self, op: int, key: int) -> bytes:
        if self.protocol == "http":
            return self._http
        if op == SET:
            return b"set key:%d 0 0 %d\r\n%b\r\n" % (key, len(self._value), self._value)
        return b"get key:%d\r\n" % key

    def parser(self) -> _MemcachedParser | _HttpParser:
        return _HttpParser() if self.protocol == "http" else _MemcachedParser()


# -- results -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class IntervalStats:
    """One reporting interval. Latency fields are None when the interval has no latency sample.

    `start_s` is schedule time (s since the run's first intended send). `scheduled` counts the
    arrivals the generator handled in the interval, `sent` those written to a connection,
    `completed` the responses received (hits, misses and HTTP < 400), `errors` error responses and
    requests lost with a connection, `timeouts` the drops. `lag_*` is how late the generator itself
    was against its schedule; `behind_schedule` flags lag p99 over the configured `max_lag_us`.
    """

    app: str
    index: int
    start_s: float
    duration_s: float
    t_wall_s: float
    target_rps: float
    scheduled: int
    sent: int
    completed: int
    errors: int
    timeouts: int
    misses: int
    samples: int
    p50_us: float | None
    p99_us: float | None
    p999_us: float | None
    max_us: float | None
    lag_p99_us: float | None
    lag_max_us: float | None
    behind_schedule: bool
    pending: int
    inflight: int
    connections_up: int
    histogram: LatencyHistogram | None = field(default=None, repr=False, compare=False)  # the latencies
    sub_p99_us: tuple[float, ...] = ()  # p99 of each sub-interval (NaN: no sample); () without them

    @property
    def sent_rps(self) -> float:
        return self.sent / self.duration_s if self.duration_s > 0 else 0.0

    @property
    def completed_rps(self) -> float:
        return self.completed / self.duration_s if self.duration_s > 0 else 0.0

    @property
    def scheduled_rps(self) -> float:
        return self.scheduled / self.duration_s if self.duration_s > 0 else 0.0

    @property
    def drops(self) -> int:
        return self.timeouts

    def to_json(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "histogram"}
        d.update(sent_rps=self.sent_rps, completed_rps=self.completed_rps, scheduled_rps=self.scheduled_rps)
        d["histogram"] = None if self.histogram is None else self.histogram.encode()
        d["sub_p99_us"] = [None if math.isnan(x) else x for x in self.sub_p99_us]
        return d


@dataclass(frozen=True)
class RunSummary:
    """A whole run: totals, the latency over all intervals, and the intervals kept."""

    app: str
    target: str
    duration_s: float
    scheduled: int
    sent: int
    completed: int
    errors: int
    timeouts: int
    late: int
    misses: int
    latency: LatencySummary | None
    lag: LatencySummary | None
    intervals_behind: int
    publish_errors: int
    intervals: tuple[IntervalStats, ...] = field(repr=False)

    @property
    def completed_rps(self) -> float:
        return self.completed / self.duration_s if self.duration_s > 0 else 0.0

    @property
    def sent_rps(self) -> float:
        return self.sent / self.duration_s if self.duration_s > 0 else 0.0

    def to_json(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "intervals"}
        d.update(latency=_plain(self.latency), lag=_plain(self.lag))
        d.update(completed_rps=self.completed_rps, sent_rps=self.sent_rps, n_intervals=len(self.intervals))
        return d


def _plain(summary: LatencySummary | None) -> dict | None:
    return None if summary is None else asdict(summary)


# -- the engine --------------------------------------------------------------------------------


class _Req:
    __slots__ = ("expired", "intended_s", "payload", "retries")

    def __init__(self, intended_s: float, payload: bytes) -> None:
        self.intended_s = intended_s
        self.payload = payload
        self.expired = False
        self.retries = 0


class _Conn(asyncio.Protocol):
    """One pooled connection: a FIFO of requests awaiting responses (both protocols answer in order)."""

    def __init__(self, gen: LoadGenerator, slot: int) -> None:
        self.gen, self.slot = gen, slot
        self.transport: asyncio.Transport | None = None
        self.fifo: deque[_Req] = deque()
        self.parser = gen._codec.parser()
        self.up = False
        self.closing = False  # the server said it will close, or we are dropping it
        self.outbuf: list[bytes] = []  # requests of the current burst, written by LoadGenerator._flush

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)  # create_connection(): a stream transport
        self.transport = transport
        self.up = True

    def data_received(self, data: bytes) -> None:
        now = time.monotonic()
        try:
            outcomes = self.parser.feed(data)
        except ProtocolError as e:
            self.gen._abort(self, f"protocol error: {e}")
            return
        gen = self.gen
        for o in outcomes:
            if not self.fifo:
                gen._abort(self, "a response arrived with no request outstanding")
                return
            gen._complete(self.fifo.popleft(), o, now)
        if self.parser.server_closing:
            self.closing = True
        if gen._pending:
            gen._drain_pending()

    def connection_lost(self, exc: Exception | None) -> None:
        self.up = False
        self.gen._lost(self, exc)


def precise_event_loop() -> asyncio.AbstractEventLoop:
    """An asyncio loop over select(): its timeouts have microsecond resolution (epoll's: 1 ms)."""
    return asyncio.SelectorEventLoop(selectors.SelectSelector())


def set_timer_slack_ns(ns: int = 1) -> bool:
    """Tighten this thread's timer slack (Linux prctl PR_SET_TIMERSLACK) so sleeps end on time."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(29, ns, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


class LoadGenerator:
    """Drives one target with open-loop load; see the module docstring.

    `publishers` receive each interval with latency (`hw.feed`); `on_interval` receives every
    interval (called on the generator's event loop: keep it quick). Exceptions from either are
    logged and counted (`publish_errors`), never allowed to stop the load. Randomness comes from
    `rng` or, without it, from `config.seed`.
    """

    def __init__(
        self,
        config: LoadGenConfig,
        *,
        publishers: Sequence[LatencyPublisher] = (),
        on_interval: Callable[[IntervalStats], None] | None = None,
        rng: np.random.Generator | None = None,
    ) -> None:
        self.config = config
        self._publishers = tuple(publishers)
        self._on_interval = on_interval
        self._codec = _Codec(config)
        # independent streams for arrivals, request mix and trace, from `rng` or `config.seed`
        if rng is not None and config.seed is not None:
            raise ValueError("give either rng or config.seed, not both")
        children = rng.spawn(3) if rng is not None else np.random.SeedSequence(config.seed).spawn(3)
        self._rng_sched, self._rng_ops, self._rng_trace = (np.random.default_rng(c) for c in children)
        spec = config.trace if config.trace is not None else Constant("constant", 1.0)
        self._trace = spec.build(self._rng_trace)
        self._keys = ZipfKeys(config.keys, config.zipf_s, self._rng_ops)
        # run state
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop_requested = False
        self._stop_event: asyncio.Event | None = None
        self._conns: list[_Conn | None] = [None] * config.n_connections
        self._rr = 0
        self._pending: deque[_Req] = deque()
        self._dirty: list[_Conn] = []
        self._t0 = 0.0
        self._running = False
        self._tasks: list[asyncio.Task] = []
        # interval counters
        self._hist = HistogramRecorder()
        self._sub = HistogramRecorder() if config.sub_interval_s is not None else None
        self._sub_p99s: list[float] = []
        self._lag = HistogramRecorder()
        self._total = HistogramRecorder()
        self._total_lag = HistogramRecorder()
        self._c = dict.fromkeys(("scheduled", "sent", "completed", "errors", "timeouts", "misses"), 0)
        self._totals = dict.fromkeys(("scheduled", "sent", "completed", "errors", "timeouts", "misses"), 0)
        self.late = 0
        self.connect_errors = 0
        self.publish_errors = 0
        self._intervals: deque[IntervalStats] = deque(maxlen=config.keep_intervals)
        self._intervals_lock = threading.Lock()
        self._interval_index = 0
        self._last_roll_s = 0.0
        self._intervals_behind = 0
        # thread mode
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._summary: RunSummary | None = None

    # -- public API --------------------------------------------------------------------------

    @property
    def intervals(self) -> tuple[IntervalStats, ...]:
        """The intervals reported so far (the last `keep_intervals`)."""
        with self._intervals_lock:
            return tuple(self._intervals)

    def total_histogram(self) -> LatencyHistogram:
        """The whole run's latency histogram (the completed intervals)."""
        return self._total.snapshot()

    async def run(self) -> RunSummary:
        """Connect, warm up, send until `duration_s` or `request_stop()`, drain, summarise.

        Runs on the caller's event loop; on the default (epoll) loop timers are rounded up to 1 ms,
        which shows as ~1 ms schedule lag: `start()`, `run_sync()` and the CLI use
        `precise_event_loop()`. One run per instance. Raises ConnectionError when no connection to
        the target can be opened at start.
        """
        if self._running or self._t0:
            raise RuntimeError("a LoadGenerator runs once; make a new one for another run")
        self._running = True
        self._loop = asyncio.get_running_loop()
        self._stop_event = asyncio.Event()
        if self._stop_requested:
            self._stop_event.set()
        try:
            await self._connect_all()
            if self.config.warmup and self.config.target.protocol == "memcached":
                await self._warmup()
            self._t0 = time.monotonic() + 0.005
            self._last_roll_s = self._t0
            self._ready.set()
            sender = asyncio.create_task(self._send_loop())
            self._tasks += [asyncio.create_task(self._report_loop()), asyncio.create_task(self._sweep_loop())]
            stop_wait = asyncio.create_task(self._stop_event.wait())
            await asyncio.wait({sender, stop_wait}, return_when=asyncio.FIRST_COMPLETED)
            for t in (sender, stop_wait):
                t.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sender  # re-raises the sender's own error, if it had one
            await self._drain()
            for t in self._tasks:
                t.cancel()
            for t in self._tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await t
            self._roll(time.monotonic(), final=True)
        finally:
            self._running = False  # no reconnects from here on
            for t in self._tasks:
                t.cancel()
            for c in self._conns:
                if c is not None and c.transport is not None:
                    c.closing = True
                    c.transport.close()
        return self._make_summary()

    def run_sync(self) -> RunSummary:
        """`run()` to completion in this thread, on a precise event loop (needs `duration_s`, or a
        `request_stop()` from another thread)."""
        set_timer_slack_ns(1)
        with asyncio.Runner(loop_factory=precise_event_loop) as runner:
            return runner.run(self.run())

    def request_stop(self) -> None:
        """Ask the run to stop sending, drain and return (thread-safe; idempotent)."""
        self._stop_requested = True
        loop, ev = self._loop, self._stop_event
        if loop is not None and ev is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(ev.set)

    def start(self) -> LoadGenerator:
        """Run in a background thread; returns once the load has started (or raises its start-up error)."""
        if self._thread is not None:
            raise RuntimeError("already started")
        self._thread = threading.Thread(
            target=self._thread_main, name=f"loadgen-{self.config.app}", daemon=True
        )
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            self._thread.join()
            raise self._error
        return self

    def wait(self, timeout_s: float | None = None) -> RunSummary | None:
        """Wait for a background run to end by itself (duration reached); None if still running."""
        if self._thread is None:
            raise RuntimeError("not started")
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            return None
        if self._error is not None:
            raise self._error
        return self._summary

    def stop(self, timeout_s: float = 30.0) -> RunSummary:
        """Stop a background run and return its summary."""
        if self._thread is None:
            raise RuntimeError("not started")
        self.request_stop()
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            raise TimeoutError(f"the load generator did not stop within {timeout_s} s")
        if self._error is not None:
            raise self._error
        assert self._summary is not None
        return self._summary

    def __enter__(self) -> LoadGenerator:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        if self._thread is not None and self._thread.is_alive():
            self.stop()

    def _thread_main(self) -> None:
        set_timer_slack_ns(1)
        try:
            with asyncio.Runner(loop_factory=precise_event_loop) as runner:
                self._summary = runner.run(self.run())
        except BaseException as e:
            self._error = e
        finally:
            self._ready.set()

    # -- connections -------------------------------------------------------------------------

    async def _open(self, slot: int) -> _Conn:
        t = self.config.target
        loop = asyncio.get_running_loop()
        _, conn = await asyncio.wait_for(
            loop.create_connection(lambda: _Conn(self, slot), t.host, t.port),
            timeout=self.config.timeout_s + 1.0,
        )
        self._conns[slot] = conn
        return conn

    async def _connect_all(self) -> None:
        results = await asyncio.gather(
            *(self._open(i) for i in range(len(self._conns))), return_exceptions=True
        )
        errs = [r for r in results if isinstance(r, BaseException)]
        if len(errs) == len(results):
            raise ConnectionError(f"cannot connect to {self.config.target.url}: {errs[0]!r}")
        for i, r in enumerate(results):
            if isinstance(r, BaseException):
                self.connect_errors += 1
                self._reconnect_later(i)

    def _reconnect_later(self, slot: int) -> None:
        if self._stop_requested or not self._running:
            return
        self._tasks.append(asyncio.ensure_future(self._reconnect(slot)))

    async def _reconnect(self, slot: int) -> None:
        backoff_s = 0.05
        while not self._stop_requested:
            try:
                await self._open(slot)
                if self._pending:
                    self._drain_pending()
                return
            except (TimeoutError, OSError) as e:
                self.connect_errors += 1
                log.debug("reconnect to %s failed: %r", self.config.target.url, e)
                await asyncio.sleep(backoff_s)
                backoff_s = min(1.0, backoff_s * 2)

    def _abort(self, conn: _Conn, reason: str) -> None:
        log.warning("%s: dropping a connection: %s", self.config.target.url, reason)
        conn.closing = True
        if conn.transport is not None:
            conn.transport.abort()

    def _lost(self, conn: _Conn, exc: Exception | None) -> None:
        """A connection closed. When the server had announced it (`Connection: close`, nginx's
        `keepalive_requests`), the requests pipelined behind that response were never served:
        they are re-sent on another connection (up to `MAX_RETRIES` times each). The close may come
        as a reset rather than a FIN: a server closing with unread requests in its socket makes
        the kernel send RST. Any other loss counts the outstanding requests as errors."""
        graceful = conn.parser.server_closing
        retry: list[_Req] = []
        for req in conn.fifo:
            if req.expired:
                continue
            if graceful and req.retries < MAX_RETRIES:
                req.retries += 1
                retry.append(req)
            else:
                self._c["errors"] += 1
        conn.fifo.clear()
        self._pending.extendleft(reversed(retry))
        if self._conns[conn.slot] is conn:
            self._conns[conn.slot] = None
            if self._running:
                self._reconnect_later(conn.slot)

    # -- sending -----------------------------------------------------------------------------

    def _pick(self) -> _Conn | None:
        conns, n, depth = self._conns, len(self._conns), self.config.depth
        for i in range(n):
            j = (self._rr + i) % n
            c = conns[j]
            if c is not None and c.up and not c.closing and len(c.fifo) < depth:
                self._rr = j + 1
                return c
        return None

    def _write(self, conn: _Conn, req: _Req) -> None:
        """Queue `req` on `conn`; `_flush()` sends the queued bytes (one syscall per connection per burst)."""
        if not conn.outbuf:
            self._dirty.append(conn)
        conn.outbuf.append(req.payload)
        conn.fifo.append(req)
        self._c["sent"] += 1

    def _flush(self) -> None:
        for conn in self._dirty:
            if conn.transport is not None and not conn.transport.is_closing():
                conn.transport.write(b"".join(conn.outbuf))
            conn.outbuf.clear()
        self._dirty.clear()

    def _drain_pending(self) -> None:
        pending = self._pending
        while pending:
            c = self._pick()
            if c is None:
                break
            self._write(c, pending.popleft())
        self._flush()

    async def _send_loop(self) -> None:
        cfg = self.config
        sched = ArrivalSchedule(self._trace, cfg.max_load_rps, self._rng_sched)
        end_s = cfg.duration_s if cfg.duration_s is not None else math.inf
        t0, timeout_s, codec = self._t0, cfg.timeout_s, self._codec
        c = self._c
        while sched.next_chunk_start_s < end_s and not self._stop_requested:
            offs = sched.next_chunk()
            offs = offs[offs < end_s]
            n = len(offs)
            is_set = self._rng_ops.random(n) < cfg.set_fraction
            keys = self._keys.sample(n)
            for off, op_set, key in zip(offs.tolist(), is_set.tolist(), keys.tolist(), strict=True):
                due = t0 + off
                now = time.monotonic()
                if due > now:
                    self._flush()
                    await asyncio.sleep(due - now)
                    if self._stop_requested:
                        return
                    now = time.monotonic()
                lag_s = now - due
                self._lag.record_us(lag_s * 1e6)
                c["scheduled"] += 1
                if lag_s > timeout_s:  # hopelessly late already: a drop, not a send
                    self._timeout(lag_s)
                    continue
                req = _Req(due, codec.request(SET if op_set else GET, key))
                if self._pending:
                    self._pending.append(req)
                    self._drain_pending()
                else:
                    conn = self._pick()
                    if conn is None:
                        self._pending.append(req)
                    else:
                        self._write(conn, req)
            self._flush()
        self._flush()
        # wait for the schedule's end so the last interval is whole
        if end_s < math.inf and not self._stop_requested:
            await asyncio.sleep(max(0.0, t0 + end_s - time.monotonic()))

    # -- responses and timeouts --------------------------------------------------------------

    def _complete(self, req: _Req, outcome: int, now: float) -> None:
        if req.expired:
            self.late += 1
            return
        c = self._c
        if outcome == ERROR:
            c["errors"] += 1
            return
        c["completed"] += 1
        if outcome == MISS:
            c["misses"] += 1
        self._record_us((now - req.intended_s) * 1e6)

    def _record_us(self, latency_us: float) -> None:
        self._hist.record_us(latency_us)
        if self._sub is not None:
            self._sub.record_us(latency_us)

    def _timeout(self, age_s: float) -> None:
        self._c["timeouts"] += 1
        if self.config.record_timeouts:
            self._record_us(age_s * 1e6)

    def _sweep(self, now: float) -> None:
        timeout_s = self.config.timeout_s
        cutoff = now - timeout_s
        pending = self._pending
        while pending and pending[0].intended_s < cutoff:
            pending.popleft()
            self._timeout(timeout_s)
        for conn in self._conns:
            if conn is None:
                continue
            for req in conn.fifo:
                if req.intended_s >= cutoff:
                    break
                if not req.expired:
                    req.expired = True
                    self._timeout(timeout_s)
            if (
                conn.fifo
                and conn.fifo[0].expired
                and now - conn.fifo[0].intended_s > timeout_s + max(timeout_s, 1.0)
            ):
                self._abort(conn, f"no response for {now - conn.fifo[0].intended_s:.1f} s")

    async def _sweep_loop(self) -> None:
        period_s = min(0.05, self.config.timeout_s / 4)
        while True:
            await asyncio.sleep(period_s)
            self._sweep(time.monotonic())

    def _outstanding(self) -> int:
        n = len(self._pending)
        for conn in self._conns:
            if conn is not None:
                n += sum(1 for r in conn.fifo if not r.expired)
        return n

    async def _drain(self) -> None:
        """After the last send: wait for the answers, or until everything outstanding timed out."""
        deadline = time.monotonic() + self.config.timeout_s + 0.1
        while self._outstanding() and time.monotonic() < deadline:
            await asyncio.sleep(0.002)
        self._sweep(time.monotonic() + self.config.timeout_s + 1e-3)  # whatever is left is a drop

    # -- intervals ---------------------------------------------------------------------------

    async def _report_loop(self) -> None:
        cfg = self.config
        end_s = cfg.duration_s if cfg.duration_s is not None else math.inf
        n_sub = cfg.sub_intervals
        step_s = cfg.interval_s / n_sub
        k = 1
        while k * step_s < end_s - 1e-9:
            due = self._t0 + k * step_s
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            self._roll_sub()
            if k % n_sub == 0:
                self._roll(time.monotonic())
            k += 1

    def _roll_sub(self) -> None:
        """Close one sub-interval: its p99 (NaN without a sample) joins the interval's list."""
        if self._sub is None:
            return
        s = self._sub.snapshot().summary()
        self._sub_p99s.append(s.p99_us if s else math.nan)
        self._sub.reset()

    def _roll(self, now: float, final: bool = False) -> None:
        cfg = self.config
        start, dur = self._last_roll_s, max(now - self._last_roll_s, 0.0)
        if final and dur <= 0.0:
            return
        if final and self._sub is not None and self._sub.count:
            self._roll_sub()  # the last, partial sub-interval
        subs, self._sub_p99s = tuple(self._sub_p99s), []
        self._last_roll_s = now
        c = dict(self._c)
        for k in self._c:  # reset in place: the sender holds a reference to the dict
            self._c[k] = 0
        hist, lag = self._hist.snapshot(), self._lag.snapshot()
        self._hist.reset()
        self._lag.reset()
        for k, v in c.items():
            self._totals[k] += v
        self._total.add(hist)
        self._total_lag.add(lag)
        s, ls = hist.summary(), lag.summary()
        mid_s = start - self._t0 + dur / 2
        conns = [x for x in self._conns if x is not None and x.up]
        st = IntervalStats(
            app=cfg.app,
            index=self._interval_index,
            start_s=start - self._t0,
            duration_s=dur,
            t_wall_s=time.time(),
            target_rps=float(self._trace.values(np.array([max(mid_s, 0.0)]))[0]) * cfg.max_load_rps,
            scheduled=c["scheduled"],
            sent=c["sent"],
            completed=c["completed"],
            errors=c["errors"],
            timeouts=c["timeouts"],
            misses=c["misses"],
            samples=hist.count,
            p50_us=s.p50_us if s else None,
            p99_us=s.p99_us if s else None,
            p999_us=s.p999_us if s else None,
            max_us=s.max_us if s else None,
            lag_p99_us=ls.p99_us if ls else None,
            lag_max_us=ls.max_us if ls else None,
            behind_schedule=bool(ls and ls.p99_us > cfg.max_lag_us),
            pending=len(self._pending),
            inflight=sum(len(x.fifo) for x in conns),
            connections_up=len(conns),
            histogram=hist,
            sub_p99_us=subs,
        )
        self._interval_index += 1
        if st.behind_schedule:
            if self._intervals_behind % 20 == 0:  # the first time, then every 20th: visible, not a flood
                log.warning(
                    "%s: behind schedule in interval %d (lag p99 %.0f us, max %.0f us); latencies include it",
                    cfg.app,
                    st.index,
                    st.lag_p99_us,
                    st.lag_max_us,
                )
            self._intervals_behind += 1
        with self._intervals_lock:
            self._intervals.append(st)
        self._publish(st)

    def _publish(self, st: IntervalStats) -> None:
        if st.p99_us is not None:
            for p in self._publishers:
                try:
                    p.publish(
                        st.app,
                        st.p99_us,
                        st.scheduled_rps,
                        # set together with p99_us (one histogram summary); NaN is the feed's "absent"
                        p50_us=math.nan if st.p50_us is None else st.p50_us,
                        p999_us=math.nan if st.p999_us is None else st.p999_us,
                        requests=st.samples,
                        histogram=st.histogram,
                        sub_p99_us=st.sub_p99_us,
                        lag_p99_us=math.nan if st.lag_p99_us is None else st.lag_p99_us,
                    )
                except Exception as e:
                    self.publish_errors += 1
                    log.warning("publishing interval %d to %r failed: %r", st.index, p, e)
        if self._on_interval is not None:
            try:
                self._on_interval(st)
            except Exception as e:
                self.publish_errors += 1
                log.warning("on_interval callback failed on interval %d: %r", st.index, e)

    def _make_summary(self) -> RunSummary:
        t = self._totals
        ivs = self.intervals
        return RunSummary(
            app=self.config.app,
            target=self.config.target.url,
            duration_s=sum(i.duration_s for i in ivs),
            scheduled=t["scheduled"],
            sent=t["sent"],
            completed=t["completed"],
            errors=t["errors"],
            timeouts=t["timeouts"],
            late=self.late,
            misses=t["misses"],
            latency=self._total.summary(),
            lag=self._total_lag.summary(),
            intervals_behind=self._intervals_behind,
            publish_errors=self.publish_errors,
            intervals=ivs,
        )

    # -- memcached warm-up -------------------------------------------------------------------

    async def _warmup(self) -> None:
        """Set every key once (pipelined batches on one connection) so the run's gets hit."""
        cfg = self.config
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(cfg.target.host, cfg.target.port), timeout=cfg.timeout_s + 1.0
        )
        try:
            batch = 256
            for lo in range(0, cfg.keys, batch):
                keys = range(lo, min(lo + batch, cfg.keys))
                writer.write(b"".join(self._codec.request(SET, k) for k in keys))
                for _ in keys:
                    line = await asyncio.wait_for(reader.readline(), timeout=max(cfg.timeout_s, 5.0))
                    if line != b"STORED\r\n":
                        raise ConnectionError(
                            f"memcached warm-up: set answered {line[:80]!r}, expected STORED"
                        )
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()


# -- command line ------------------------------------------------------------------------------


def _load_trace(arg: str) -> TraceSpec:
    """A trace from a YAML/JSON file path or inline YAML/JSON text."""
    p = Path(arg)
    try:
        is_file = p.is_file()
    except OSError:
        is_file = False
    if is_file:
        text, where = p.read_text(), str(p)
    else:
        text, where = arg, "--trace"
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"{where}: not valid YAML/JSON: {e}") from None
    if isinstance(data, str):
        raise ConfigError(
            f"{where}: no such file, and not an inline trace spec (e.g. '{{kind: constant, load: 0.5}}')"
        )
    return parse_trace(data, where)


def _fmt_us(v: float | None) -> str:
    if v is None:
        return "   -  "
    return f"{v:6.0f}us" if v < 10_000 else f"{v / 1000:6.1f}ms"


def _progress_line(st: IntervalStats) -> str:
    line = (
        f"t={st.start_s + st.duration_s:7.1f}s target {st.target_rps:7.0f}/s sent {st.sent_rps:7.0f}/s "
        f"done {st.completed_rps:7.0f}/s p50 {_fmt_us(st.p50_us)} p99 {_fmt_us(st.p99_us)} "
        f"p99.9 {_fmt_us(st.p999_us)} err {st.errors} drop {st.timeouts}"
    )
    if st.behind_schedule:
        line += f"  BEHIND SCHEDULE (lag p99 {_fmt_us(st.lag_p99_us).strip()})"
    return line


def build_parser() -> argparse.ArgumentParser:
    """The command line of `python -m hw.loadgen` (its --help)."""
    ap = argparse.ArgumentParser(
        prog="python -m hw.loadgen",
        description=(
            "Open-loop load generator: Poisson arrivals at --rate (times an optional load trace) to a "
            "memcached or HTTP/1.1 server; latency from each request's intended send time; per-interval "
            "p50/p99/p99.9 printed to stderr and published to a latency feed. The run's summary is "
            "printed to stdout as JSON. Exit status: 0 done, 1 the target could not be reached, 2 bad arguments."
        ),
        epilog=(
            "Examples:\n"
            "  python -m hw.loadgen --target memcached://127.0.0.1:11211 --rate 5000 --duration-s 10\n"
            "  python -m hw.loadgen --target http://127.0.0.1:8080/ --rate 2000 \\\n"
            "      --trace '{kind: step, steps: [[0, 0.5], [5, 1.0]]}' --duration-s 10 \\\n"
            "      --publish udp://127.0.0.1:9999 --app nginx\n"
            "--trace takes a file or inline YAML/JSON with the keys of env/sim/traces.py "
            "(constant, step, ramp, sinusoid, diurnal, bursty, csv); the load is a fraction of --rate."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--target", required=True, help="memcached://HOST:PORT or http://HOST:PORT/PATH")
    ap.add_argument("--rate", type=float, required=True, help="max load in requests/s (the trace scales it)")
    ap.add_argument(
        "--trace", help="load trace spec: a YAML/JSON file or inline text (default: constant 1.0)"
    )
    ap.add_argument("--duration-s", type=float, help="stop after this many seconds (default: until Ctrl-C)")
    ap.add_argument(
        "--publish",
        action="append",
        default=[],
        metavar="URL",
        help="latency feed: udp://HOST:PORT or file:/PATH.jsonl (repeatable)",
    )
    ap.add_argument("--app", default="", help="app name in the feed (default: the protocol name)")
    ap.add_argument("--connections", type=int, help="connection pool size (default memcached 4, http 16)")
    ap.add_argument(
        "--pipeline", type=int, help="max requests in flight per connection (default memcached 64, http 1)"
    )
    ap.add_argument(
        "--timeout-s", type=float, default=1.0, help="a request unanswered this long is a drop (1.0)"
    )
    ap.add_argument("--interval-s", type=float, default=0.5, help="reporting interval (0.5)")
    ap.add_argument(
        "--sub-interval-s", type=float, help="also report the p99 of each sub-interval this long (e.g. 0.1)"
    )
    ap.add_argument("--keys", type=int, default=10_000, help="memcached: number of keys (10000)")
    ap.add_argument(
        "--zipf", type=float, default=0.99, help="memcached: Zipf exponent of key popularity (0.99)"
    )
    ap.add_argument("--set-fraction", type=float, default=0.1, help="memcached: fraction of sets (0.1)")
    ap.add_argument("--value-bytes", type=int, default=64, help="memcached: value size of sets (64)")
    ap.add_argument("--no-warmup", action="store_true", help="memcached: do not set every key before the run")
    ap.add_argument("--seed", type=int, help="seed of the arrivals and keys (default: fresh entropy)")
    ap.add_argument(
        "--max-lag-us", type=float, default=1000.0, help="flag intervals whose schedule lag p99 exceeds this"
    )
    ap.add_argument("--quiet", action="store_true", help="no per-interval progress lines")
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m hw.loadgen`: exit 0 when done, 1 when the target could not be reached, 2 on bad arguments."""
    ap = build_parser()
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    publishers = []
    try:
        cfg = LoadGenConfig(
            target=Target.parse(args.target),
            max_load_rps=args.rate,
            app=args.app,
            trace=_load_trace(args.trace) if args.trace else None,
            duration_s=args.duration_s,
            connections=args.connections,
            pipeline_depth=args.pipeline,
            timeout_s=args.timeout_s,
            interval_s=args.interval_s,
            sub_interval_s=args.sub_interval_s,
            keys=args.keys,
            zipf_s=args.zipf,
            set_fraction=args.set_fraction,
            value_bytes=args.value_bytes,
            warmup=not args.no_warmup,
            seed=args.seed,
            max_lag_us=args.max_lag_us,
        )
        if cfg.trace is not None:
            cfg.trace.build(np.random.default_rng(0))  # validate the values now, not mid-run
        publishers = [publisher_from_url(u) for u in args.publish]
    except (ConfigError, ValueError, OSError) as e:
        ap.print_usage(sys.stderr)
        print(f"{ap.prog}: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT

    if not args.quiet:
        log.setLevel(logging.ERROR)  # the progress lines already flag late intervals

    def progress(st: IntervalStats) -> None:
        if not args.quiet:
            print(_progress_line(st), file=sys.stderr, flush=True)

    gen = LoadGenerator(cfg, publishers=publishers, on_interval=progress)

    async def _main() -> RunSummary:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, gen.request_stop)
        return await gen.run()

    set_timer_slack_ns(1)
    try:
        with asyncio.Runner(loop_factory=precise_event_loop) as runner:
            summary = runner.run(_main())
    except (ConnectionError, OSError) as e:
        print(f"{ap.prog}: error: {e}", file=sys.stderr)
        return 1
    finally:
        for p in publishers:
            p.close()
    print(json.dumps(summary.to_json(), default=float))
    if summary.intervals_behind:
        print(
            f"{ap.prog}: warning: behind schedule in {summary.intervals_behind} of {len(summary.intervals)} "
            f"intervals (lag p99 {_fmt_us(summary.lag.p99_us if summary.lag else None).strip()}): "
            "it ran late against its schedule (CPU contention, or a rate above what it sustains here); "
            "the latencies include that lag",
            file=sys.stderr,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
