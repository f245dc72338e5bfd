"""A generic latency feed: any client reports its latency, the LinuxNode reads it (DESIGN §3, §6.5).

Wire format: one JSON object per line (UTF-8), over UDP (one or more lines per datagram) or
appended to a file:

    {"app": "memcached", "t": 1732200000.25, "p99_us": 412.0, "rps": 4980.0,
     "p50_us": 95.0, "p999_us": 1310.0, "requests": 2490,
     "histogram": "HISTFAAAAC54nJNpmSzMwMDAzwABTFCaEUQwT25nsP8AETjOKHKUUWQmkGQWOcgiAgCicAe+",
     "histogram_unit": "us", "sub_p99_us": [398.0, 405.5, null, 420.0, 401.0], "lag_p99_us": 60.0}

| key        | required | meaning                                                                  |
|------------|----------|--------------------------------------------------------------------------|
| `app`      | yes      | the LC app's name, as in the node config                                 |
| `t`        | yes      | the writer's Unix time (`time.time()`, seconds) at the end of the interval |
| `p99_us`   | yes      | p99 latency over the interval, microseconds, > 0                         |
| `rps`      | yes      | requests per second the app was sent over the interval, >= 0             |
| `p50_us`   | no       | median latency, us, > 0                                                  |
| `p999_us`  | no       | p99.9 latency, us, > 0                                                   |
| `requests` | no       | how many latency samples the quantiles come from (integer >= 0)          |
| `histogram`| no       | the interval's latencies: HdrHistogram's encoded form ("HISTF...", the V2 compressed base64 of wrk2 and the HdrHistogram interval logs) |
| `histogram_unit` | no | the unit of the histogram's values: "ns", "us" (default, wrk2's), "ms" or "s" |
| `sub_p99_us` | no   | the p99 of each equal sub-interval of the interval, in order (us, > 0; null: no response in it) |
| `lag_p99_us` | no   | an open-loop generator's own lateness against its send schedule, p99 over the interval (us, >= 0): the latencies include it, so a lag near the p99 means the generator, not the service, set it |

Other keys are ignored (room for extensions). A line that is not such an object (bad JSON, a
missing or mistyped key, a latency <= 0, NaN, a histogram that does not decode, a `requests` that
differs from the histogram's count) is counted in `malformed` and skipped: a broken writer makes
the feed go silent, and a silent feed becomes an invalid sample for its consumer, never a zero
latency. Without `histogram` a reading still works: the consumer has the interval's p99 only, and
window metrics approximate that interval (`env.metrics`, "window tail"); with it, `requests`
defaults to the histogram's count.

`LatencyReading.t_s` is when the reading reached the reader, on the reader's monotonic clock, so
the consumer can judge freshness (the LinuxNode treats readings older than two intervals as
invalid; `is_stale` is the helper). UDP readings are stamped when drained; run the background
thread (`start()`) or `poll()` at least once per interval to keep that honest. A file can hold
lines written long before they are read, so `FileFeed` stamps a line with the writer's `t` mapped
onto the monotonic clock when that is earlier than the read time (same host, same wall clock).

A reader keeps the latest reading of the apps it is told to expect (`apps`; the LinuxNode passes its
LC apps' feed names), or of the first `MAX_FEED_APPS` names it hears when not told: readings of
any other app are counted in `dropped` and not kept, so a sender inventing names cannot grow the
reader's memory.

Writers: `UdpPublisher`, `FilePublisher` and `MemoryFeed` (in-process, also a source) share the
`LatencyPublisher` protocol the load generator (`hw.loadgen`) publishes through.
`publisher_from_url` / `source_from_url` build them from `udp://HOST:PORT` or `file:/PATH`.
"""

from __future__ import annotations

import abc
import contextlib
import dataclasses
import json
import math
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Protocol
from urllib.parse import urlsplit

from env.histogram import UNIT_NS, LatencyHistogram

MonotonicClock = Callable[[], float]
WallClock = Callable[[], float]
MAX_DATAGRAM_BYTES = 65507
MAX_FEED_APPS = 256  # apps a reader keeps readings of when not told which (module docstring)


@dataclass(frozen=True)
class LatencyReading:
    """One interval's latency of one app, as the feed's reader saw it."""

    app: str
    t_s: float  # receive time on the reader's monotonic clock, seconds
    p99_us: float
    rps: float
    p50_us: float = math.nan
    p999_us: float = math.nan
    requests: int = 0
    histogram: LatencyHistogram | None = None  # the interval's latencies, when the writer sent them
    sub_p99_us: tuple[float, ...] = ()  # p99 per sub-interval (NaN: none in it), when the writer sent them
    lag_p99_us: float = math.nan  # the generator's schedule lag p99 (module docstring), when it sent it


class LatencySource(Protocol):
    """Where the LinuxNode gets each LC app's latency from."""

    def latest(self, app: str) -> LatencyReading | None: ...  # None = never heard from


class LatencyPublisher(Protocol):
    """Where a client (the load generator) sends each interval's latency."""

    def publish(
        self,
        app: str,
        p99_us: float,
        rps: float,
        *,
        p50_us: float = math.nan,
        p999_us: float = math.nan,
        requests: int = 0,
        histogram: LatencyHistogram | None = None,
        sub_p99_us: tuple[float, ...] = (),
        lag_p99_us: float = math.nan,
    ) -> None: ...


class FeedFormatError(ValueError):
    """A feed line that does not follow the wire format; the message says what is wrong."""


def is_stale(reading: LatencyReading | None, now_s: float, max_age_s: float) -> bool:
    """True when there is no reading or it is older than `max_age_s` at `now_s` (monotonic s)."""
    if not (max_age_s >= 0.0):
        raise ValueError(f"max_age_s must be >= 0, got {max_age_s}")
    return reading is None or now_s - reading.t_s > max_age_s


# -- encoding and parsing ----------------------------------------------------------------------


def encode_line(
    app: str,
    p99_us: float,
    rps: float,
    *,
    t: float,
    p50_us: float = math.nan,
    p999_us: float = math.nan,
    requests: int = 0,
    histogram: LatencyHistogram | None = None,
    sub_p99_us: tuple[float, ...] = (),
    lag_p99_us: float = math.nan,
) -> bytes:
    """One wire-format line (with its newline). Optional values that are NaN (or None) are left
    out; a histogram goes in HdrHistogram's encoded form with values in ns; a NaN sub-interval p99
    is written as null.

    Raises FeedFormatError for values a reader would reject, so a writer finds its bug at once.
    """
    obj: dict[str, object] = {"app": app, "t": t, "p99_us": p99_us, "rps": rps}
    if not math.isnan(p50_us):
        obj["p50_us"] = p50_us
    if not math.isnan(p999_us):
        obj["p999_us"] = p999_us
    if requests:
        obj["requests"] = requests
    if histogram is not None:
        obj["histogram"] = histogram.encode()
        obj["histogram_unit"] = "ns"
    if sub_p99_us:
        obj["sub_p99_us"] = [None if math.isnan(x) else x for x in sub_p99_us]
    if not math.isnan(lag_p99_us):
        obj["lag_p99_us"] = lag_p99_us
    line = json.dumps(obj, allow_nan=True, separators=(",", ":"))
    _validate(obj, line)
    return line.encode() + b"\n"


def _number(obj: dict, key: str, line: str, *, positive: bool) -> float:
    v = obj[key]
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise FeedFormatError(f"{key} must be a number, got {v!r} in {line[:200]!r}")
    v = float(v)
    if not math.isfinite(v) or (v <= 0.0 if positive else v < 0.0):
        need = "> 0" if positive else ">= 0"
        raise FeedFormatError(f"{key} must be finite and {need}, got {v} in {line[:200]!r}")
    return v


def _histogram(obj: dict, line: str) -> LatencyHistogram | None:
    text = obj.get("histogram")
    if text is None:
        return None
    unit = obj.get("histogram_unit", "us")
    if unit not in UNIT_NS:
        raise FeedFormatError(
            f"histogram_unit must be one of {sorted(UNIT_NS)}, got {unit!r} in {line[:200]!r}"
        )
    if not isinstance(text, str):
        raise FeedFormatError(f"histogram must be a string (HdrHistogram's encoded form) in {line[:200]!r}")
    try:
        return LatencyHistogram.decode(text, unit)
    except ValueError as e:
        raise FeedFormatError(f"histogram: {e} in {line[:200]!r}") from None


def _sub_p99s(obj: dict, line: str) -> tuple[float, ...]:
    subs = obj.get("sub_p99_us")
    if subs is None:
        return ()
    if not isinstance(subs, list):
        raise FeedFormatError(
            f"sub_p99_us must be a list of numbers or nulls, got {subs!r} in {line[:200]!r}"
        )
    return tuple(
        math.nan if x is None else _number({"sub_p99_us": x}, "sub_p99_us", line, positive=True) for x in subs
    )


def _validate(
    obj: object, line: str
) -> tuple[str, float, float, float, float, float, int, LatencyHistogram | None, tuple[float, ...], float]:
    if not isinstance(obj, dict):
        raise FeedFormatError(f"expected a JSON object, got {type(obj).__name__} in {line[:200]!r}")
    missing = [k for k in ("app", "t", "p99_us", "rps") if k not in obj]
    if missing:
        raise FeedFormatError(f"missing required key(s) {missing} in {line[:200]!r}")
    app = obj["app"]
    if not isinstance(app, str) or not app.strip():
        raise FeedFormatError(f"app must be a non-empty string, got {app!r} in {line[:200]!r}")
    t = _number(obj, "t", line, positive=False)
    p99 = _number(obj, "p99_us", line, positive=True)
    rps = _number(obj, "rps", line, positive=False)
    p50 = _number(obj, "p50_us", line, positive=True) if obj.get("p50_us") is not None else math.nan
    p999 = _number(obj, "p999_us", line, positive=True) if obj.get("p999_us") is not None else math.nan
    requests = obj.get("requests", 0)
    if isinstance(requests, bool) or not isinstance(requests, int) or requests < 0:
        raise FeedFormatError(f"requests must be an integer >= 0, got {requests!r} in {line[:200]!r}")
    hist = _histogram(obj, line)
    if hist is not None:
        if "requests" in obj and requests != hist.count:
            raise FeedFormatError(
                f"requests ({requests}) differs from the histogram's count ({hist.count}) in {line[:200]!r}"
            )
        requests = hist.count
    lag = _number(obj, "lag_p99_us", line, positive=False) if obj.get("lag_p99_us") is not None else math.nan
    return app, t, p99, rps, p50, p999, requests, hist, _sub_p99s(obj, line), lag


def parse_line(line: str | bytes, t_s: float) -> tuple[LatencyReading, float]:
    """Parse one wire-format line received at monotonic time `t_s`.

    Returns the reading (stamped `t_s`) and the writer's `t` (its Unix time). Raises
    FeedFormatError with the reason for anything else, including blank lines.
    """
    if isinstance(line, bytes):
        try:
            line = line.decode()
        except UnicodeDecodeError as e:
            raise FeedFormatError(f"not UTF-8: {e}") from None
    text = line.strip()
    if not text:
        raise FeedFormatError("empty line")
    try:
        obj = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as e:
        raise FeedFormatError(f"not JSON ({e}) in {text[:200]!r}") from None
    app, t, p99, rps, p50, p999, requests, hist, subs, lag = _validate(obj, text)
    return LatencyReading(app, t_s, p99, rps, p50, p999, requests, hist, subs, lag), t


# -- readers -----------------------------------------------------------------------------------


class _Store:
    """Latest reading per app plus counters, shared by the readers (thread-safe)."""

    def __init__(self, apps: Iterable[str] | None = None) -> None:
        self._lock = threading.Lock()
        self._latest: dict[str, LatencyReading] = {}
        self._apps = None if apps is None else frozenset(apps)
        self.received = 0
        self.malformed = 0
        self.dropped = 0  # valid readings of apps not kept (module docstring)
        self.last_error: str | None = None

    def put(self, reading: LatencyReading) -> bool:
        """The last reading received wins (arrival order: a file's line order, a socket's datagram
        order); False, and counted in `dropped`, for an app this store does not keep."""
        with self._lock:
            known = reading.app in self._latest
            if (self._apps is not None and reading.app not in self._apps) or (
                self._apps is None and not known and len(self._latest) >= MAX_FEED_APPS
            ):
                self.dropped += 1
                return False
            self.received += 1
            self._latest[reading.app] = reading
            return True

    def bad(self, err: str) -> None:
        with self._lock:
            self.malformed += 1
            self.last_error = err

    def get(self, app: str) -> LatencyReading | None:
        with self._lock:
            return self._latest.get(app)

    def apps(self) -> tuple[str, ...]:
        with self._lock:
            return tuple(sorted(self._latest))


class _ReaderBase(abc.ABC):
    """Counters and `latest` over a `_Store`; subclasses implement `poll()`."""

    def __init__(self, clock: MonotonicClock, apps: Iterable[str] | None = None) -> None:
        self._clock = clock
        self._store = _Store(apps)
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    @property
    def received(self) -> int:
        """Valid readings accepted so far."""
        return self._store.received

    @property
    def malformed(self) -> int:
        """Lines skipped because they broke the wire format (see `last_error`)."""
        return self._store.malformed

    @property
    def dropped(self) -> int:
        """Valid readings of apps this reader does not keep (module docstring)."""
        return self._store.dropped

    @property
    def last_error(self) -> str | None:
        return self._store.last_error

    def apps(self) -> tuple[str, ...]:
        """The apps heard from so far."""
        return self._store.apps()

    @abc.abstractmethod
    def poll(self) -> int:
        """Take in whatever arrived since the last call without blocking; returns the valid readings taken."""

    def latest(self, app: str) -> LatencyReading | None:
        """The newest reading of `app`, or None if never heard from. Polls first when no thread runs."""
        if self._thread is None:
            self.poll()
        return self._store.get(app)

    def _ingest(self, line: bytes, t_s: float, wall_now: float | None = None) -> bool:
        try:
            reading, t = parse_line(line, t_s)
        except FeedFormatError as e:
            self._store.bad(str(e))
            return False
        if wall_now is not None:
            # a line's age by the writer's clock (same host); only ever makes it older
            age_s = wall_now - t
            if age_s > 0:
                reading = dataclasses.replace(reading, t_s=t_s - age_s)
        return self._store.put(reading)

    def start(self, period_s: float = 0.05) -> _ReaderBase:
        """Poll in a daemon thread every `period_s` (UdpFeed blocks on the socket instead)."""
        if self._thread is not None:
            return self
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._run, args=(period_s,), name=f"{type(self).__name__}", daemon=True
        )
        self._thread.start()
        return self

    def _run(self, period_s: float) -> None:
        while not self._stop.is_set():
            try:
                self.poll()
            except Exception as e:  # keep the thread alive; the error is visible in last_error
                self._store.bad(f"{type(e).__name__}: {e}")
            self._stop.wait(period_s)

    def close(self) -> None:
        """Stop the thread (if any) and release resources; idempotent."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2.0)
            self._thread = None

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class UdpFeed(_ReaderBase):
    """Binds a UDP socket and keeps the latest reading per app.

    Use `poll()` (drains the socket without blocking; `latest()` calls it when no thread runs) or
    `start()` for a background thread that stamps each datagram as it arrives. `port=0` picks a
    free port; `address` tells which.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        clock: MonotonicClock = time.monotonic,
        apps: Iterable[str] | None = None,
    ) -> None:
        super().__init__(clock, apps)
        if not (0 <= port <= 65535):
            raise ValueError(f"UDP port must be in 0..65535, got {port}")
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._sock = socket.socket(family, socket.SOCK_DGRAM)
        try:
            self._sock.bind((host, port))
        except OSError as e:
            self._sock.close()
            raise OSError(
                e.errno, f"cannot bind the latency feed to udp://{host}:{port}: {e.strerror}"
            ) from None
        self._sock.setblocking(False)
        self._closed = False

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._sock.getsockname()[:2]
        return host, port

    @property
    def url(self) -> str:
        host, port = self.address
        return f"udp://{host}:{port}"

    def poll(self) -> int:
        """Drain every datagram waiting now; returns how many valid readings were taken."""
        n = 0
        while not self._closed:
            try:
                data = self._sock.recv(MAX_DATAGRAM_BYTES)
            except (BlockingIOError, InterruptedError):
                break
            except OSError as e:  # e.g. ECONNREFUSED bounced from an earlier send: skip it
                if self._closed:
                    break
                self._store.bad(f"recv: {e}")
                continue
            n += self._datagram(data)
        return n

    def _datagram(self, data: bytes) -> int:
        t_s = self._clock()
        n = 0
        for line in data.split(b"\n"):
            if line.strip():
                n += self._ingest(line, t_s)
        return n

    def _run(self, period_s: float) -> None:
        import selectors

        with selectors.DefaultSelector() as sel:
            sel.register(self._sock, selectors.EVENT_READ)
            while not self._stop.is_set():
                if sel.select(timeout=period_s):
                    self.poll()

    def close(self) -> None:
        super().close()
        if not self._closed:
            self._closed = True
            self._sock.close()


class FileFeed(_ReaderBase):
    """Tails a JSONL file: each `poll()` reads the complete lines appended since the last one.

    By default it starts at the end of the file (history is not news); `from_start=True` reads
    what is there, each line stamped by its writer's `t` so old lines are old. A file that does
    not exist yet is waited for; one that is truncated or replaced (rotation) is read anew.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        from_start: bool = False,
        clock: MonotonicClock = time.monotonic,
        wall_clock: WallClock = time.time,
        apps: Iterable[str] | None = None,
    ) -> None:
        super().__init__(clock, apps)
        self.path = Path(path)
        if self.path.is_dir():
            raise ValueError(f"latency feed file {self.path} is a directory")
        self._wall = wall_clock
        self._lock = threading.Lock()
        self._f: BinaryIO | None = None
        self._inode: tuple[int, int] | None = None
        self._pos = 0
        self._partial = b""
        self._from_start = from_start
        self._open(initial=True)

    def _open(self, initial: bool) -> bool:
        try:
            f = self.path.open("rb")
        except FileNotFoundError:
            return False
        st = os.fstat(f.fileno())
        if self._f is not None:
            self._f.close()
        self._f, self._inode, self._partial = f, (st.st_dev, st.st_ino), b""
        self._pos = st.st_size if (initial and not self._from_start) else 0
        f.seek(self._pos)  # writers append whole lines, so the end is a line boundary
        return True

    def _reopen_if_rotated(self) -> None:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return
        if (st.st_dev, st.st_ino) != self._inode:
            self._open(initial=False)
        elif st.st_size < self._pos:  # truncated
            assert self._f is not None  # the inode matched: the file is open
            self._pos, self._partial = 0, b""
            self._f.seek(0)

    def poll(self) -> int:
        """Read the lines appended since the last poll; returns how many valid readings were taken."""
        with self._lock:
            if self._f is None and not self._open(initial=False):
                return 0
            self._reopen_if_rotated()
            f = self._f
            assert f is not None  # opened above; reopening keeps the old file when the new one is missing
            f.seek(self._pos)
            data = f.read()
            if not data:
                return 0
            self._pos += len(data)
            data = self._partial + data
            lines = data.split(b"\n")
            self._partial = lines.pop()  # an incomplete last line waits for its newline
            t_s, wall = self._clock(), self._wall()
            return sum(self._ingest(line, t_s, wall) for line in lines if line.strip())

    def close(self) -> None:
        super().close()
        with self._lock:
            if self._f is not None:
                self._f.close()
                self._f = None


class MemoryFeed:
    """In-process feed: a publisher and a `LatencySource` in one (tests, or a co-located generator).

    `publish` stamps the reading with this feed's monotonic clock, as a reader would on receipt.
    """

    def __init__(self, clock: MonotonicClock = time.monotonic) -> None:
        self._clock = clock
        self._store = _Store()

    def publish(
        self,
        app: str,
        p99_us: float,
        rps: float,
        *,
        p50_us: float = math.nan,
        p999_us: float = math.nan,
        requests: int = 0,
        histogram: LatencyHistogram | None = None,
        sub_p99_us: tuple[float, ...] = (),
        lag_p99_us: float = math.nan,
    ) -> None:
        line = encode_line(
            app,
            p99_us,
            rps,
            t=0.0,
            p50_us=p50_us,
            p999_us=p999_us,
            requests=requests,
            histogram=histogram,
            sub_p99_us=sub_p99_us,
            lag_p99_us=lag_p99_us,
        )
        reading, _ = parse_line(line, self._clock())  # same validation as the wire
        self._store.put(reading)

    def latest(self, app: str) -> LatencyReading | None:
        return self._store.get(app)

    @property
    def received(self) -> int:
        return self._store.received

    def apps(self) -> tuple[str, ...]:
        return self._store.apps()

    def close(self) -> None:
        """Nothing to release; present so every feed closes alike."""


# -- writers -----------------------------------------------------------------------------------


class _LinePublisher(abc.ABC):
    """One reading = one encoded line handed to `_send`; send errors are counted, never raised (the
    feed is best effort)."""

    def __init__(self, wall_clock: WallClock) -> None:
        self._wall = wall_clock
        self.sent = 0
        self.send_errors = 0

    def publish(
        self,
        app: str,
        p99_us: float,
        rps: float,
        *,
        p50_us: float = math.nan,
        p999_us: float = math.nan,
        requests: int = 0,
        histogram: LatencyHistogram | None = None,
        sub_p99_us: tuple[float, ...] = (),
        lag_p99_us: float = math.nan,
    ) -> None:
        line = encode_line(
            app,
            p99_us,
            rps,
            t=self._wall(),
            p50_us=p50_us,
            p999_us=p999_us,
            requests=requests,
            histogram=histogram,
            sub_p99_us=sub_p99_us,
            lag_p99_us=lag_p99_us,
        )
        try:
            self._send(line)
            self.sent += 1
        except OSError:
            self.send_errors += 1

    @abc.abstractmethod
    def _send(self, line: bytes) -> None:
        """Write one whole line to the transport; OSError is counted by `publish`."""


class UdpPublisher(_LinePublisher):
    """Sends each reading as one datagram. Send errors are counted, never raised (the feed is best effort)."""

    def __init__(self, host: str, port: int, *, wall_clock: WallClock = time.time) -> None:
        if not (1 <= port <= 65535):
            raise ValueError(f"UDP port must be in 1..65535, got {port}")
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)
        if not infos:  # pragma: no cover - getaddrinfo raises instead
            raise ValueError(f"cannot resolve {host}")
        family, _, _, _, addr = infos[0]
        self._addr = addr
        self._sock = socket.socket(family, socket.SOCK_DGRAM)
        super().__init__(wall_clock)

    def _send(self, line: bytes) -> None:
        self._sock.sendto(line, self._addr)

    def close(self) -> None:
        self._sock.close()


class FilePublisher(_LinePublisher):
    """Appends each reading as one line (one `write` of a whole line, flushed, so a tail never sees half)."""

    def __init__(self, path: str | Path, *, wall_clock: WallClock = time.time) -> None:
        self.path = Path(path)
        if not self.path.parent.is_dir():
            raise ValueError(
                f"cannot write the latency feed {self.path}: directory {self.path.parent} does not exist"
            )
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        super().__init__(wall_clock)

    def _send(self, line: bytes) -> None:
        os.write(self._fd, line)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self._fd)


# -- URLs --------------------------------------------------------------------------------------


def _split_url(url: str) -> tuple[str, str, int | None, str]:
    parts = urlsplit(url)
    if parts.scheme == "udp":
        if not parts.hostname or parts.port is None:
            raise ValueError(f"feed URL {url!r}: expected udp://HOST:PORT")
        return "udp", parts.hostname, parts.port, ""
    if parts.scheme == "file":
        path = parts.path or parts.netloc
        if not path:
            raise ValueError(f"feed URL {url!r}: expected file:/PATH")
        return "file", "", None, path
    raise ValueError(f"feed URL {url!r}: expected udp://HOST:PORT or file:/PATH")


def publisher_from_url(url: str) -> UdpPublisher | FilePublisher:
    """`udp://HOST:PORT` or `file:/PATH` (a relative `file:PATH` is relative to the working directory)."""
    kind, host, port, path = _split_url(url)
    if kind == "udp":
        return UdpPublisher(host, port or 0)
    return FilePublisher(path)


def source_from_url(
    url: str, *, start_thread: bool = True, apps: Iterable[str] | None = None
) -> UdpFeed | FileFeed:
    """A reader for `udp://HOST:PORT` (binds it) or `file:/PATH` (tails it), optionally polling in a
    thread, keeping readings of `apps` only (module docstring)."""
    kind, host, port, path = _split_url(url)
    feed: UdpFeed | FileFeed = (
        UdpFeed(host, port or 0, apps=apps) if kind == "udp" else FileFeed(path, apps=apps)
    )
    if start_thread:
        feed.start()
    return feed
