"""hw.loadgen: the arrival process, the protocol parsers, the engine against in-test fake servers
(coordinated omission, timeouts, reconnects, traces, publishing), the CLI, and real memcached and
nginx from Debian (marked `linux`, skipped with the reason when the binary is missing)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from env.config import ConfigError
from env.sim.traces import Constant, Ramp, Step
from hw.feed import FileFeed, MemoryFeed, UdpFeed, publisher_from_url
from hw.loadgen import (
    ERROR,
    MISS,
    OK,
    ArrivalSchedule,
    LoadGenConfig,
    LoadGenerator,
    ProtocolError,
    Target,
    ZipfKeys,
    _HttpParser,
    _MemcachedParser,
    main,
)
from hw.sweep import generator_bound

REPO = Path(__file__).resolve().parents[2]


# -- the arrival process -----------------------------------------------------------------------


def _schedule(trace, rate_rps: float, seed: int) -> ArrivalSchedule:
    return ArrivalSchedule(trace.build(np.random.default_rng(0)), rate_rps, np.random.default_rng(seed))


def test_constant_rate_arrivals_are_poisson():
    rate = 2000.0
    t = _schedule(Constant("constant", 1.0), rate, seed=42).until(20.0)
    gaps = np.diff(np.concatenate(([0.0], t)))
    assert np.all(gaps >= 0)
    assert len(t) / 20.0 == pytest.approx(rate, rel=0.02)
    # inter-arrival times are exponential with mean 1/rate (KS test, fixed seed)
    assert stats.kstest(gaps, "expon", args=(0.0, 1.0 / rate)).pvalue > 0.01
    # ... which a regular (evenly spaced) schedule at the same rate is not: the test has power
    even = np.full(len(gaps), 1.0 / rate)
    assert stats.kstest(even, "expon", args=(0.0, 1.0 / rate)).pvalue < 1e-6
    # counts in disjoint windows: Poisson, so variance ~ mean
    counts = np.histogram(t, bins=np.arange(0.0, 20.0 + 1e-9, 0.05))[0]
    assert counts.var() / counts.mean() == pytest.approx(1.0, abs=0.1)


def test_schedule_is_deterministic_under_a_seed():
    a = _schedule(Constant("constant", 1.0), 500.0, seed=1).until(3.0)
    b = _schedule(Constant("constant", 1.0), 500.0, seed=1).until(3.0)
    c = _schedule(Constant("constant", 1.0), 500.0, seed=2).until(3.0)
    np.testing.assert_array_equal(a, b)
    assert len(a) != len(c) or not np.array_equal(a, c)


def test_schedule_follows_a_step_trace():
    trace = Step("step", ((0.0, 0.5), (2.0, 2.0), (4.0, 0.0), (5.0, 1.0)))
    t = _schedule(trace, 1000.0, seed=7).until(7.0)
    assert np.all(np.diff(t) >= 0)
    n = lambda lo, hi: int(np.count_nonzero((t >= lo) & (t < hi)))  # noqa: E731
    assert n(0, 2) == pytest.approx(1000, rel=0.1)  # 500/s for 2 s
    assert n(2, 4) == pytest.approx(4000, rel=0.1)  # 2000/s
    assert n(4.001, 4.999) == 0  # load 0 sends nothing
    assert n(5, 7) == pytest.approx(2000, rel=0.1)


def test_schedule_follows_a_ramp():
    t = _schedule(Ramp("ramp", ((0.0, 0.0), (10.0, 1.0))), 1000.0, seed=3).until(10.0)
    first, second = np.count_nonzero(t < 5.0), np.count_nonzero(t >= 5.0)
    assert first == pytest.approx(1250, rel=0.1) and second == pytest.approx(3750, rel=0.1)


def test_zipf_keys():
    rng = np.random.default_rng(5)
    n, s = 100, 0.99
    ranks = ZipfKeys(n, s, rng).sample(200_000)
    assert ranks.min() >= 0 and ranks.max() <= n - 1
    p = 1.0 / np.arange(1, n + 1) ** s
    p /= p.sum()
    freq = np.bincount(ranks, minlength=n) / len(ranks)
    np.testing.assert_allclose(freq[:5], p[:5], rtol=0.05)
    uniform = np.bincount(ZipfKeys(10, 0.0, rng).sample(100_000), minlength=10) / 100_000
    np.testing.assert_allclose(uniform, 0.1, rtol=0.05)


# -- parsers -----------------------------------------------------------------------------------

MC_STREAM = (
    b"VALUE key:1 0 3\r\nabc\r\nEND\r\n"
    b"END\r\n"
    b"STORED\r\n"
    b"SERVER_ERROR out of memory storing object\r\n"
    b"VALUE key:2 5 6\r\na\r\nbcd\r\nEND\r\n"  # a value that holds CRLF
    b"ERROR\r\n"
)
MC_OUTCOMES = [OK, MISS, OK, ERROR, OK, ERROR]


def _feed_bytewise(parser, data: bytes) -> list[int]:
    out: list[int] = []
    for i in range(len(data)):
        out += parser.feed(data[i : i + 1])
    return out


def test_memcached_parser():
    assert _MemcachedParser().feed(MC_STREAM) == MC_OUTCOMES
    assert _feed_bytewise(_MemcachedParser(), MC_STREAM) == MC_OUTCOMES
    p = _MemcachedParser()
    assert p.feed(b"VALUE key:1 0 10\r\nabc") == []  # incomplete: waits
    assert p.feed(b"defghij\r\nEND\r\n") == [OK]
    with pytest.raises(ProtocolError, match="unexpected memcached response"):
        _MemcachedParser().feed(b"HELLO\r\n")
    with pytest.raises(ProtocolError, match="END"):
        _MemcachedParser().feed(b"VALUE k 0 1\r\nx\r\nXXXXX")


HTTP_STREAM = (
    b"HTTP/1.1 100 Continue\r\n\r\n"
    b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Type: text/plain\r\n\r\nhello"
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3;ext=1\r\nabc\r\n2\r\nde\r\n0\r\nX-Trailer: 1\r\n\r\n"
    b"HTTP/1.1 404 Not Found\r\ncontent-length: 3\r\n\r\nnop"
    b"HTTP/1.1 204 No Content\r\n\r\n"
    b"HTTP/1.1 503 Busy\r\nContent-Length: 0\r\n\r\n"
)
HTTP_OUTCOMES = [OK, OK, ERROR, OK, ERROR]


def test_http_parser():
    p = _HttpParser()
    assert p.feed(HTTP_STREAM) == HTTP_OUTCOMES and not p.server_closing
    assert _feed_bytewise(_HttpParser(), HTTP_STREAM) == HTTP_OUTCOMES
    p = _HttpParser()
    closing = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"
    assert p.feed(closing + b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n") == [OK]  # nothing after a close
    assert p.server_closing
    with pytest.raises(ProtocolError, match="status line"):
        _HttpParser().feed(b"SSH-2.0-OpenSSH\r\n\r\n")
    with pytest.raises(ProtocolError, match="Content-Length or chunked"):
        _HttpParser().feed(b"HTTP/1.1 200 OK\r\n\r\nbody")


# -- configuration -----------------------------------------------------------------------------


def test_target_parse():
    assert Target.parse("memcached://127.0.0.1:11211") == Target("memcached", "127.0.0.1", 11211, "/")
    assert Target.parse("memcached://localhost").port == 11211
    assert Target.parse("http://127.0.0.1:8080/a/b?x=1") == Target("http", "127.0.0.1", 8080, "/a/b?x=1")
    assert Target.parse("http://127.0.0.1:8080").url == "http://127.0.0.1:8080/"
    for bad in ("ftp://h:1", "memcached://:11211", "http://h:99999", "memcached://h:1/path", "h:1"):
        with pytest.raises(ConfigError, match="target"):
            Target.parse(bad)


@pytest.mark.parametrize(
    "kw, msg",
    [
        ({"max_load_rps": 0.0}, "max_load_rps"),
        ({"duration_s": -1.0}, "duration_s"),
        ({"connections": 0}, "connections"),
        ({"pipeline_depth": 0}, "pipeline_depth"),
        ({"timeout_s": 0.0}, "timeout_s"),
        ({"interval_s": 0.001}, "interval_s"),
        ({"set_fraction": 1.5}, "set_fraction"),
        ({"keys": 0}, "keys"),
        ({"sub_interval_s": 0.3}, "sub_interval_s"),
    ],
)
def test_config_rejects_bad_values(kw, msg):
    base = {"target": Target.parse("memcached://127.0.0.1:1"), "max_load_rps": 100.0}
    base.update(kw)
    with pytest.raises(ConfigError, match=msg):
        LoadGenConfig(**base)


def test_config_defaults_per_protocol():
    mc = LoadGenConfig(Target.parse("memcached://127.0.0.1:1"), 100.0)
    http = LoadGenConfig(Target.parse("http://127.0.0.1:1/"), 100.0, app="nginx")
    assert (mc.app, mc.n_connections, mc.depth) == ("memcached", 4, 64)
    assert (http.app, http.n_connections, http.depth) == ("nginx", 16, 1)


def test_randomness_is_injected_once():
    cfg = LoadGenConfig(Target.parse("memcached://127.0.0.1:1"), 100.0, seed=3)
    with pytest.raises(ValueError, match=r"either rng or config\.seed"):
        LoadGenerator(cfg, rng=np.random.default_rng(3))


# -- fake servers (in-test, in a thread) --------------------------------------------------------

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class FakeServer:
    """An asyncio TCP server on 127.0.0.1 in its own thread, one `handler` task per connection."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.port = 0
        self.connections = 0
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._main, daemon=True)

    def _main(self) -> None:
        asyncio.set_event_loop(self._loop)

        async def on_conn(r, w):
            self.connections += 1
            with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
                await self.handler(r, w)
            w.close()

        server = self._loop.run_until_complete(asyncio.start_server(on_conn, "127.0.0.1", 0))
        self.port = server.sockets[0].getsockname()[1]
        self._started.set()
        self._loop.run_forever()
        server.close()
        for t in asyncio.all_tasks(self._loop):
            t.cancel()
        with contextlib.suppress(Exception):
            self._loop.run_until_complete(asyncio.sleep(0.01))
        self._loop.close()

    def __enter__(self) -> FakeServer:
        self._thread.start()
        assert self._started.wait(10)
        return self

    def __exit__(self, *exc) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


class HttpState:
    def __init__(
        self,
        stall_after: int | None = None,
        stall_s: float = 0.0,
        close_every: int | None = None,
        reset_on_close: bool = False,
    ):
        self.stall_after, self.stall_s, self.close_every = stall_after, stall_s, close_every
        self.reset_on_close = reset_on_close  # close with RST (SO_LINGER 0), after the response is read
        self.served = 0


def http_handler(state: HttpState) -> Handler:
    async def handle(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        on_conn = 0
        while True:
            await r.readuntil(b"\r\n\r\n")
            state.served += 1
            on_conn += 1
            if state.served == state.stall_after:
                await asyncio.sleep(state.stall_s)
            close = state.close_every is not None and on_conn % state.close_every == 0
            extra = b"Connection: close\r\n" if close else b""
            w.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n" + extra + b"\r\nok")
            if close:
                await w.drain()
                if state.reset_on_close:
                    await asyncio.sleep(0.005)
                    sock = w.get_extra_info("socket")
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    w.transport.abort()
                return

    return handle


class McState:
    def __init__(self) -> None:
        self.gets: Counter[bytes] = Counter()
        self.sets = 0


def memcached_handler(state: McState) -> Handler:
    """Answers get with a miss (END) and set with STORED."""

    async def handle(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        while True:
            line = await r.readuntil(b"\r\n")
            if line.startswith(b"get "):
                state.gets[line[4:-2]] += 1
                w.write(b"END\r\n")
            elif line.startswith(b"set "):
                await r.readexactly(int(line.split()[4]) + 2)
                state.sets += 1
                w.write(b"STORED\r\n")
            else:
                w.write(b"ERROR\r\n")

    return handle


async def silent_handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
    while await r.read(65536):
        pass


def _cfg(port: int, protocol: str = "http", **kw) -> LoadGenConfig:
    target = Target.parse(f"{protocol}://127.0.0.1:{port}" + ("/" if protocol == "http" else ""))
    kw.setdefault("seed", 1)
    kw.setdefault("max_load_rps", 300.0)
    return LoadGenConfig(target=target, **kw)


@contextlib.contextmanager
def _refusing_port():
    """A port bound but not listening: connecting to it is refused, and nobody else can take it."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield s.getsockname()[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- the engine against fake servers ------------------------------------------------------------


def test_latency_runs_from_the_intended_send_time():
    """A 300 ms server stall on one connection without pipelining: a closed-loop generator would
    see one slow request; every request scheduled during the stall waited, and says so."""
    state = HttpState(stall_after=300, stall_s=0.3)
    with FakeServer(http_handler(state)) as srv:
        cfg = _cfg(
            srv.port, max_load_rps=400.0, duration_s=2.0, connections=1, pipeline_depth=1, timeout_s=2.0
        )
        gen = LoadGenerator(cfg)
        summary = gen.run_sync()
    assert summary.errors == 0 and summary.timeouts == 0
    assert summary.completed == summary.scheduled == summary.sent
    hist = gen.total_histogram()
    # ~120 requests arrive during the stall, ~80 of them >= 100 ms before it ends
    assert hist.count_above_us(100_000) >= 40
    assert summary.latency.p99_us >= 150_000
    assert summary.latency.p50_us < 50_000  # the rest were quick


def test_unanswered_requests_are_timeouts_and_enter_the_histogram():
    feed = MemoryFeed()
    with FakeServer(silent_handler) as srv:
        cfg = _cfg(
            srv.port,
            "memcached",
            max_load_rps=200.0,
            duration_s=0.6,
            interval_s=0.2,
            timeout_s=0.1,
            warmup=False,
        )
        summary = LoadGenerator(cfg, publishers=[feed]).run_sync()
    assert summary.completed == 0 and summary.errors == 0
    assert summary.scheduled > 60 and summary.timeouts == summary.scheduled == summary.sent
    assert summary.latency.p50_us == pytest.approx(100_000, rel=0.01)  # recorded at the timeout
    r = feed.latest("memcached")
    assert r.p99_us == pytest.approx(100_000, rel=0.01)
    # the interval's histogram travels with its p99: every request of it, at the timeout
    assert r.histogram is not None and r.histogram.count == r.requests > 0
    assert r.histogram.quantile_us(0.5) == pytest.approx(100_000, rel=0.01)
    # and the generator's own lateness, so a reader can tell a late generator from a slow server
    assert r.lag_p99_us == summary.intervals[-1].lag_p99_us >= 0.0


def test_with_timeouts_left_out_an_interval_without_responses_is_not_published():
    feed, seen = MemoryFeed(), []
    with FakeServer(silent_handler) as srv:
        cfg = _cfg(
            srv.port,
            "memcached",
            max_load_rps=200.0,
            duration_s=0.4,
            interval_s=0.2,
            timeout_s=0.1,
            warmup=False,
            record_timeouts=False,
        )
        summary = LoadGenerator(cfg, publishers=[feed], on_interval=seen.append).run_sync()
    assert summary.timeouts == summary.scheduled > 0
    assert summary.latency is None
    assert seen and all(iv.p99_us is None and iv.samples == 0 for iv in seen)
    assert feed.latest("memcached") is None  # silence, not a zero


@pytest.mark.parametrize("reset", [False, True], ids=["fin", "rst"])
def test_server_closing_keepalive_connections_loses_nothing(reset):
    """nginx closes a keep-alive connection after `keepalive_requests`; requests pipelined behind
    the closing response are re-sent on a new connection, not lost, whether the close comes as a
    FIN or as a reset (a server closing with unread requests in its socket sends RST)."""
    state = HttpState(close_every=7, reset_on_close=reset)
    with FakeServer(http_handler(state)) as srv:
        cfg = _cfg(srv.port, max_load_rps=400.0, duration_s=1.0, connections=2, pipeline_depth=4)
        gen = LoadGenerator(cfg)
        summary = gen.run_sync()
        assert srv.connections > summary.scheduled / 7 - 5
    assert summary.errors == 0 and summary.timeouts == 0
    assert summary.completed == summary.scheduled > 300


def test_memcached_mix_and_key_popularity():
    state = McState()
    with FakeServer(memcached_handler(state)) as srv:
        cfg = _cfg(srv.port, "memcached", max_load_rps=1000.0, duration_s=1.0, keys=50, set_fraction=0.2)
        summary = LoadGenerator(cfg).run_sync()
    n_get = sum(state.gets.values())
    assert state.sets == 50 + summary.scheduled - n_get  # the warm-up set every key once
    assert (state.sets - 50) / summary.scheduled == pytest.approx(0.2, abs=0.05)
    assert summary.misses == n_get  # the fake server never hits
    assert summary.completed == summary.scheduled
    assert state.gets.most_common(1)[0][0] == b"key:0"  # Zipf: rank 0 is the most popular


def test_intervals_follow_a_step_trace_and_are_published():
    feed = MemoryFeed()
    trace = Step("step", ((0.0, 0.25), (1.0, 1.0)))
    with FakeServer(memcached_handler(McState())) as srv:
        cfg = _cfg(
            srv.port, "memcached", max_load_rps=1600.0, duration_s=2.0, trace=trace, warmup=False, app="mc1"
        )
        gen = LoadGenerator(cfg, publishers=[feed])
        summary = gen.run_sync()
    ivs = summary.intervals
    assert len(ivs) == 4 and [iv.index for iv in ivs] == [0, 1, 2, 3]
    assert [iv.target_rps for iv in ivs] == [400.0, 400.0, 1600.0, 1600.0]
    for iv in ivs:
        assert iv.duration_s == pytest.approx(0.5, abs=0.1)
        assert iv.scheduled_rps == pytest.approx(iv.target_rps, rel=0.3)
        assert iv.completed_rps == pytest.approx(iv.target_rps, rel=0.3)
        assert iv.p50_us <= iv.p99_us <= iv.p999_us <= iv.max_us
    assert summary.completed == summary.scheduled == sum(iv.completed for iv in ivs)
    low = sum(iv.scheduled for iv in ivs[:2])
    high = sum(iv.scheduled for iv in ivs[2:])
    assert high / low == pytest.approx(4.0, rel=0.2)
    r = feed.latest("mc1")
    assert r.p99_us == ivs[-1].p99_us and r.rps == pytest.approx(ivs[-1].scheduled_rps)
    assert r.requests == ivs[-1].samples


def test_sub_interval_p99s_show_a_stall_inside_the_interval():
    """A 150 ms stall early in the first interval: its 100 ms sub-intervals show the stall where
    the delayed responses arrive and a quick server elsewhere (PARTIES' code reads 100 ms p99s,
    manager/PARTIES.py:20); the feed carries them."""
    feed = MemoryFeed()
    state = HttpState(stall_after=40, stall_s=0.15)
    with FakeServer(http_handler(state)) as srv:
        cfg = _cfg(
            srv.port, max_load_rps=400.0, duration_s=1.0, connections=1, pipeline_depth=1, sub_interval_s=0.1
        )
        summary = LoadGenerator(cfg, publishers=[feed]).run_sync()
    first, last = summary.intervals[0], summary.intervals[-1]
    assert len(first.sub_p99_us) == len(last.sub_p99_us) == 5
    assert max(first.sub_p99_us) >= 100_000 and min(first.sub_p99_us) < 30_000
    assert max(last.sub_p99_us) < 30_000  # no stall in the second interval
    assert feed.latest("http").sub_p99_us == last.sub_p99_us


def test_background_thread_start_stop_and_callback_errors_are_contained():
    calls = []

    def cb(iv):
        calls.append(iv)
        raise RuntimeError("a buggy sink")

    with FakeServer(http_handler(HttpState())) as srv:
        gen = LoadGenerator(_cfg(srv.port, interval_s=0.2), on_interval=cb).start()
        deadline = time.monotonic() + 10
        while len(gen.intervals) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert gen.wait(0.01) is None  # no duration: still running
        summary = gen.stop()
    assert len(calls) >= 2 and summary.publish_errors == len(calls)
    assert summary.completed > 0 and summary.errors == 0
    assert summary.completed == summary.scheduled


def test_falling_behind_the_schedule_is_reported_not_hidden():
    """Block the generator's loop for 150 ms (a slow callback): the sends due meanwhile go late,
    the interval says so, and their latency includes the lag."""

    def block_once(iv):
        if iv.index == 1:
            time.sleep(0.15)

    with FakeServer(http_handler(HttpState())) as srv:
        cfg = _cfg(srv.port, max_load_rps=300.0, duration_s=1.2, interval_s=0.3)
        summary = LoadGenerator(cfg, on_interval=block_once).run_sync()
    iv = summary.intervals[2]  # the interval that started with the block
    assert iv.behind_schedule and iv.lag_max_us >= 100_000
    assert iv.p99_us >= 50_000 and iv.max_us >= 100_000
    assert summary.intervals_behind >= 1 and summary.lag.max_us >= 100_000
    assert summary.completed == summary.scheduled  # late, but sent: nothing dropped


def test_run_as_a_task_on_the_callers_loop():
    async def main_task():
        with FakeServer(http_handler(HttpState())) as srv:
            gen = LoadGenerator(_cfg(srv.port, max_load_rps=200.0))
            task = asyncio.create_task(gen.run())
            await asyncio.sleep(0.6)
            gen.request_stop()
            summary = await task
            with pytest.raises(RuntimeError, match="runs once"):
                await gen.run()
            return summary

    summary = asyncio.run(main_task())
    assert len(summary.intervals) >= 1 and summary.completed == summary.scheduled > 50


def test_connection_refused_is_a_clear_error():
    with (
        _refusing_port() as port,
        pytest.raises(ConnectionError, match=f"cannot connect to http://127.0.0.1:{port}/"),
    ):
        LoadGenerator(_cfg(port, duration_s=1.0)).start()


# -- command line ------------------------------------------------------------------------------


def test_cli_help(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for word in ("--target", "--rate", "--trace", "--duration-s", "--publish", "--app", "Exit status"):
        assert word in out


@pytest.mark.parametrize(
    "args, msg",
    [
        (["--target", "ftp://127.0.0.1:1", "--rate", "10"], "target"),
        (["--target", "memcached://127.0.0.1:1", "--rate", "-5"], "max_load_rps"),
        (
            ["--target", "memcached://127.0.0.1:1", "--rate", "5", "--trace", "{kind: nope}"],
            "unknown trace kind",
        ),
        (
            ["--target", "memcached://127.0.0.1:1", "--rate", "5", "--trace", "/no/such/trace.yaml"],
            "no such file",
        ),
        (
            ["--target", "memcached://127.0.0.1:1", "--rate", "5", "--trace", "{kind: constant, load: -0.5}"],
            "load -0.5",
        ),
        (["--target", "memcached://127.0.0.1:1", "--rate", "5", "--publish", "tcp://x:1"], "feed URL"),
    ],
)
def test_cli_bad_arguments_exit_2(args, msg, capsys):
    assert main(args) == 2
    assert msg in capsys.readouterr().err


def test_cli_missing_rate_exits_2(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--target", "memcached://127.0.0.1:1"])
    assert e.value.code == 2


def test_cli_unreachable_target_exits_1(capsys):
    with _refusing_port() as port:
        assert main(["--target", f"memcached://127.0.0.1:{port}", "--rate", "10", "--duration-s", "1"]) == 1
    assert "cannot connect" in capsys.readouterr().err


def test_cli_run_publishes_to_a_file(tmp_path):
    feed_path = tmp_path / "feed.jsonl"
    with FakeServer(http_handler(HttpState())) as srv:
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "hw.loadgen",
                "--target",
                f"http://127.0.0.1:{srv.port}/",
                "--rate",
                "200",
                "--duration-s",
                "1",
                "--trace",
                "{kind: step, steps: [[0, 0.5], [0.5, 1.0]]}",
                "--publish",
                f"file:{feed_path}",
                "--app",
                "web",
                "--seed",
                "3",
            ],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["app"] == "web" and summary["errors"] == 0 and summary["completed"] > 100
    assert summary["n_intervals"] == 2
    progress = [ln for ln in proc.stderr.splitlines() if ln.startswith("t=")]
    assert len(progress) == 2 and "p99" in progress[0]
    reader = FileFeed(feed_path, from_start=True)
    r = reader.latest("web")
    assert reader.received == 2 and reader.malformed == 0
    assert r.p99_us > 0 and r.rps == pytest.approx(200, rel=0.4)


# -- real servers ------------------------------------------------------------------------------


def _wait_listening(port: int, proc: subprocess.Popen, what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
            pytest.fail(f"{what} exited with {proc.returncode} at start: {err}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return
        time.sleep(0.02)
    pytest.fail(f"{what} did not listen on 127.0.0.1:{port} within {timeout_s} s")


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


@pytest.fixture
def memcached_server():
    """A fresh memcached (Debian's) on a free localhost port: 2 threads, 64 MB."""
    exe = shutil.which("memcached")
    if exe is None:
        pytest.skip("memcached is not installed (apt-get install -y memcached)")
    port = _free_port()
    cmd = [exe, "-l", "127.0.0.1", "-p", str(port), "-U", "0", "-t", "2", "-m", "64"]
    if os.geteuid() == 0:
        cmd += ["-u", "root"]  # memcached refuses to run as root without -u
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        _wait_listening(port, proc, "memcached")
        yield Target("memcached", "127.0.0.1", port)
    finally:
        _stop(proc)


NGINX_CONF = """
daemon off;
worker_processes 1;
pid {d}/nginx.pid;
error_log {d}/error.log warn;
events {{ worker_connections 1024; }}
http {{
  access_log off;
  client_body_temp_path {d}/body;
  proxy_temp_path {d}/proxy;
  fastcgi_temp_path {d}/fastcgi;
  uwsgi_temp_path {d}/uwsgi;
  scgi_temp_path {d}/scgi;
  keepalive_requests 100000;
  # one shared bucket of 100 requests/s; `burst` queues (delays) the excess instead of refusing it
  limit_req_zone $server_addr zone=slow:1m rate=100r/s;
  server {{
    listen 127.0.0.1:{port};
    location / {{ return 200 "hello from nginx\\n"; }}
    # limit_req acts before the content phase, so this location serves content (empty_gif), not `return`
    location /slow {{ limit_req zone=slow burst=100000; empty_gif; }}
  }}
}}
"""


@pytest.fixture
def nginx_server(tmp_path):
    """Debian's nginx on a free localhost port from a temp config: `/` answers at once, `/slow`
    serves at most 100 requests/s (a server with a fixed capacity, to saturate)."""
    exe = shutil.which("nginx") or next((p for p in ("/usr/sbin/nginx",) if os.access(p, os.X_OK)), None)
    if exe is None:
        pytest.skip("nginx is not installed (apt-get install -y nginx)")
    port = _free_port()
    conf = tmp_path / "nginx.conf"
    conf.write_text(NGINX_CONF.format(d=tmp_path, port=port))
    proc = subprocess.Popen(
        [exe, "-p", str(tmp_path), "-c", str(conf), "-e", str(tmp_path / "error.log")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        _wait_listening(port, proc, "nginx")
        yield port
    finally:
        _stop(proc)


def _check_steady_run(summary, rate_rps: float) -> None:
    assert summary.errors == 0 and summary.timeouts == 0
    assert summary.completed == summary.sent == summary.scheduled
    assert summary.completed_rps == pytest.approx(rate_rps, rel=0.1)
    assert len(summary.intervals) == 6
    for iv in summary.intervals:
        assert iv.completed_rps == pytest.approx(rate_rps, rel=0.3), iv
        assert 5.0 < iv.p50_us <= iv.p99_us <= iv.p999_us <= iv.max_us, iv
        assert iv.samples == iv.completed


def _check_loopback_latency(summary) -> None:
    """Loopback latencies are microseconds to milliseconds, in the intervals that measured the
    server. A latency runs from the intended send time, so it includes the generator's own lateness;
    an interval where that lateness is a large part of the p99 (`hw.sweep.generator_bound`, the
    profiler's rule) measured a stall of this machine. Skips when fewer than half measured the server."""
    measured = [iv for iv in summary.intervals if not generator_bound(iv.lag_p99_us or 0.0, iv.p99_us)]
    if 2 * len(measured) < len(summary.intervals):
        lags = ", ".join(f"{iv.lag_p99_us or 0.0:.0f}" for iv in summary.intervals)
        pytest.skip(f"the generator was late in most intervals (lag p99s {lags} us): this machine stalled")
    for iv in measured:
        assert iv.p50_us < 10_000 and iv.p99_us < 100_000, iv


@pytest.mark.linux
def test_real_memcached_at_2000_rps(memcached_server, tmp_path):
    udp = UdpFeed().start()
    file_path = tmp_path / "feed.jsonl"
    pubs = [publisher_from_url(udp.url), publisher_from_url(f"file:{file_path}")]
    cfg = LoadGenConfig(memcached_server, 2000.0, app="memcached", duration_s=3.0, seed=11)
    try:
        gen = LoadGenerator(cfg, publishers=pubs).start()
        summary = gen.wait(30)
    finally:
        for p in pubs:
            p.close()
    assert summary is not None
    _check_steady_run(summary, 2000.0)
    assert summary.misses == 0  # the warm-up set every key
    last = summary.intervals[-1]
    r = None
    deadline = time.monotonic() + 5
    while (r is None or r.p99_us != last.p99_us) and time.monotonic() < deadline:
        r = udp.latest("memcached")
        time.sleep(0.01)
    udp.close()
    assert r.p99_us == last.p99_us and r.requests == last.samples and udp.malformed == 0
    assert FileFeed(file_path, from_start=True).latest("memcached").p99_us == last.p99_us
    assert len(file_path.read_text().splitlines()) == 6
    _check_loopback_latency(summary)


@pytest.mark.linux
def test_real_memcached_without_warmup_misses(memcached_server):
    cfg = LoadGenConfig(memcached_server, 500.0, duration_s=1.0, warmup=False, set_fraction=0.0, seed=2)
    summary = LoadGenerator(cfg).run_sync()
    assert summary.completed == summary.scheduled > 0
    assert summary.misses == summary.completed  # a fresh memcached holds no key


@pytest.mark.linux
def test_real_nginx_at_2000_rps(nginx_server):
    cfg = LoadGenConfig(
        Target.parse(f"http://127.0.0.1:{nginx_server}/"), 2000.0, app="nginx", duration_s=3.0, seed=5
    )
    summary = LoadGenerator(cfg).run_sync()
    _check_steady_run(summary, 2000.0)
    _check_loopback_latency(summary)


@pytest.mark.linux
def test_saturating_nginx_raises_p99(nginx_server):
    """/slow serves 100 requests/s: offered 40/s it keeps up; offered 200/s its queue grows and so
    does p99, while the reported offered rate stays honest and the completed rate caps at ~100/s."""
    target = Target.parse(f"http://127.0.0.1:{nginx_server}/slow")
    light = LoadGenerator(LoadGenConfig(target, 40.0, duration_s=1.5, seed=1)).run_sync()
    heavy = LoadGenerator(LoadGenConfig(target, 200.0, duration_s=1.5, timeout_s=5.0, seed=1)).run_sync()
    assert light.errors == heavy.errors == 0 and light.timeouts == heavy.timeouts == 0
    assert heavy.latency.p99_us > 200_000
    assert heavy.latency.p99_us > 4 * light.latency.p99_us
    mid = heavy.intervals[1]
    assert mid.scheduled_rps == pytest.approx(200, rel=0.35)
    assert mid.completed_rps < 140  # the server's capacity, not the offered load
    assert mid.p99_us > heavy.intervals[0].p99_us  # the queue builds interval by interval
