"""hw.feed: wire format, malformed input, staleness, UDP round trip on 127.0.0.1, file tailing."""

from __future__ import annotations

import json
import math
import os
import socket
import time

import pytest

from hw.feed import (
    MAX_FEED_APPS,
    FeedFormatError,
    FileFeed,
    FilePublisher,
    LatencyReading,
    LatencySource,
    MemoryFeed,
    UdpFeed,
    UdpPublisher,
    encode_line,
    is_stale,
    parse_line,
    publisher_from_url,
    source_from_url,
)


class FakeClock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def _line(**kw) -> bytes:
    obj = {"app": "memcached", "t": 1_700_000_000.0, "p99_us": 412.0, "rps": 4980.0}
    obj.update(kw)
    return (json.dumps({k: v for k, v in obj.items() if v is not ...}) + "\n").encode()


def _wait_for(pred, timeout_s: float = 5.0):
    """Poll `pred` until it returns something truthy (a bounded wait, not a timing assertion)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(0.005)
    return pred()


# -- parsing -----------------------------------------------------------------------------------


def test_parse_full_and_minimal_lines():
    r, t = parse_line(_line(p50_us=95.0, p999_us=1310.0, requests=2490), t_s=12.5)
    assert r == LatencyReading("memcached", 12.5, 412.0, 4980.0, 95.0, 1310.0, 2490)
    assert t == 1_700_000_000.0
    r, _ = parse_line(_line().decode(), t_s=1.0)
    assert r.app == "memcached" and r.p99_us == 412.0 and r.rps == 4980.0
    assert math.isnan(r.p50_us) and math.isnan(r.p999_us) and r.requests == 0


def test_optional_nulls_and_unknown_keys_are_accepted():
    r, _ = parse_line(_line(p50_us=None, p999_us=None, host="db1", extra={"x": 1}), t_s=0.0)
    assert math.isnan(r.p50_us) and math.isnan(r.p999_us) and r.p99_us == 412.0


@pytest.mark.parametrize(
    "line, reason",
    [
        (b"", "empty"),
        (b"   \n", "empty"),
        (b"{not json", "not JSON"),
        (b"[1, 2]", "JSON object"),
        (b"\xff\xfe{}", "UTF-8"),
        (_line(app=...), "missing"),
        (_line(p99_us=...), "missing"),
        (_line(rps=...), "missing"),
        (_line(t=...), "missing"),
        (_line(app=""), "app"),
        (_line(app=7), "app"),
        (_line(p99_us="412"), "p99_us must be a number"),
        (_line(p99_us=True), "p99_us must be a number"),
        (_line(p99_us=0), "p99_us must be finite and > 0"),
        (_line(p99_us=-5.0), "p99_us must be finite and > 0"),
        (b'{"app":"a","t":1,"p99_us":NaN,"rps":1}', "p99_us must be finite"),
        (b'{"app":"a","t":1,"p99_us":Infinity,"rps":1}', "p99_us must be finite"),
        (_line(rps=-1), "rps must be finite and >= 0"),
        (_line(p50_us=0.0), "p50_us"),
        (_line(p999_us="x"), "p999_us"),
        (_line(requests=1.5), "requests"),
        (_line(requests=-1), "requests"),
        (_line(t="yesterday"), "t must be a number"),
        (_line(sub_p99_us=412.0), "sub_p99_us must be a list"),
        (_line(sub_p99_us=[400.0, 0.0]), "sub_p99_us must be finite and > 0"),
        (_line(sub_p99_us=[400.0, "x"]), "sub_p99_us must be a number"),
        (_line(lag_p99_us=-1.0), "lag_p99_us must be finite and >= 0"),
        (_line(lag_p99_us="late"), "lag_p99_us must be a number"),
    ],
)
def test_malformed_lines_raise_with_the_reason(line, reason):
    with pytest.raises(FeedFormatError, match=reason):
        parse_line(line, t_s=0.0)


def test_encode_round_trip_and_validation():
    line = encode_line("nginx", 900.0, 2000.0, t=5.0, p50_us=100.0, requests=1000)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    obj = json.loads(line)
    assert obj == {
        "app": "nginx",
        "t": 5.0,
        "p99_us": 900.0,
        "rps": 2000.0,
        "p50_us": 100.0,
        "requests": 1000,
    }
    r, _ = parse_line(line, t_s=3.0)
    assert (r.p99_us, r.p50_us, r.requests) == (900.0, 100.0, 1000) and math.isnan(r.p999_us)
    with pytest.raises(FeedFormatError, match="p99_us"):
        encode_line("nginx", math.nan, 1.0, t=0.0)
    with pytest.raises(FeedFormatError, match="p99_us"):
        encode_line("nginx", 0.0, 1.0, t=0.0)


def test_sub_interval_p99s_travel_with_nulls_for_empty_sub_intervals():
    line = encode_line("memcached", 420.0, 5000.0, t=1.0, sub_p99_us=(398.0, math.nan, 420.0))
    assert json.loads(line)["sub_p99_us"] == [398.0, None, 420.0]
    r, _ = parse_line(line, t_s=0.0)
    assert r.sub_p99_us[0] == 398.0 and math.isnan(r.sub_p99_us[1]) and r.sub_p99_us[2] == 420.0
    assert parse_line(_line(), t_s=0.0)[0].sub_p99_us == ()  # optional: absent means none


def test_the_generators_lag_travels_and_is_nan_when_absent():
    line = encode_line("memcached", 420.0, 5000.0, t=1.0, lag_p99_us=0.0)
    assert json.loads(line)["lag_p99_us"] == 0.0  # zero lag is a reading, not an absence
    assert parse_line(line, t_s=0.0)[0].lag_p99_us == 0.0
    assert (
        parse_line(encode_line("memcached", 420.0, 5000.0, t=1.0, lag_p99_us=75.5), 0.0)[0].lag_p99_us == 75.5
    )
    assert "lag_p99_us" not in json.loads(encode_line("memcached", 420.0, 5000.0, t=1.0))
    assert math.isnan(parse_line(_line(), t_s=0.0)[0].lag_p99_us)


# -- staleness ---------------------------------------------------------------------------------


def test_is_stale():
    r = LatencyReading("a", t_s=100.0, p99_us=1.0, rps=1.0)
    assert is_stale(None, now_s=100.0, max_age_s=1.0)  # never heard from
    assert not is_stale(r, now_s=100.0, max_age_s=1.0)
    assert not is_stale(r, now_s=101.0, max_age_s=1.0)  # exactly max_age: still valid
    assert is_stale(r, now_s=101.001, max_age_s=1.0)
    assert is_stale(r, now_s=102.0, max_age_s=1.0)  # two 500 ms intervals
    with pytest.raises(ValueError, match="max_age_s"):
        is_stale(r, now_s=100.0, max_age_s=-1.0)


# -- in-process --------------------------------------------------------------------------------


def test_memory_feed_is_a_source_and_a_publisher():
    clock = FakeClock(50.0)
    feed = MemoryFeed(clock=clock)
    src: LatencySource = feed
    assert src.latest("memcached") is None
    feed.publish("memcached", 300.0, 1000.0, p50_us=50.0, requests=500)
    clock.t = 50.5
    feed.publish("memcached", 350.0, 1100.0)
    r = src.latest("memcached")
    assert r.t_s == 50.5 and r.p99_us == 350.0 and r.rps == 1100.0
    assert feed.received == 2 and feed.apps() == ("memcached",)
    with pytest.raises(FeedFormatError):
        feed.publish("memcached", math.nan, 1.0)
    assert feed.latest("memcached").p99_us == 350.0  # the bad one did not replace it


# -- UDP ---------------------------------------------------------------------------------------


def test_udp_round_trip_with_poll():
    clock = FakeClock(1000.0)
    with UdpFeed("127.0.0.1", 0, clock=clock) as feed:
        host, port = feed.address
        assert host == "127.0.0.1" and port > 0
        assert feed.latest("memcached") is None
        pub = UdpPublisher(host, port)
        pub.publish("memcached", 412.0, 4980.0, p50_us=95.0, p999_us=1310.0, requests=2490)
        pub.publish("nginx", 2000.0, 300.0)
        r = _wait_for(lambda: feed.latest("nginx"))
        assert r == LatencyReading("nginx", 1000.0, 2000.0, 300.0)
        assert feed.latest("memcached") == LatencyReading(
            "memcached", 1000.0, 412.0, 4980.0, 95.0, 1310.0, 2490
        )
        assert pub.sent == 2 and pub.send_errors == 0
        assert feed.received == 2 and feed.malformed == 0
        pub.close()


def test_udp_malformed_datagrams_are_counted_and_skipped():
    with UdpFeed() as feed:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        good = _line(p99_us=500.0)
        s.sendto(good, feed.address)
        _wait_for(lambda: feed.latest("memcached"))
        for junk in (b"hello", b"\x00\xff\x13" * 100, _line(p99_us=0), _line(p99_us=-1), b"{}", b"[]"):
            s.sendto(junk, feed.address)
        s.sendto(good.replace(b"500.0", b"700.0") + b"not json\n", feed.address)  # two lines, one bad
        _wait_for(lambda: feed.latest("memcached").p99_us == 700.0)
        r = feed.latest("memcached")
        assert r.p99_us == 700.0  # never replaced by a zero or a bad reading
        assert feed.malformed == 7 and feed.received == 2
        assert "not JSON" in feed.last_error
        s.close()


def test_udp_feed_keeps_only_its_apps_and_counts_the_others():
    with UdpFeed(apps=["memcached"]) as feed:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        for i in range(0, 500, 50):  # 500 invented names, 50 lines per datagram
            s.sendto(b"".join(_line(app=f"app{k}") for k in range(i, i + 50)), feed.address)
        s.sendto(_line(p99_us=500.0), feed.address)
        _wait_for(lambda: feed.latest("memcached"))
        _wait_for(lambda: feed.poll() == 0 and feed.dropped == 500)
        assert feed.apps() == ("memcached",) and feed.latest("app7") is None
        assert feed.dropped == 500 and feed.received == 1
        s.close()


def test_a_feed_not_told_its_apps_keeps_at_most_max_feed_apps(tmp_path):
    path = tmp_path / "feed.jsonl"
    path.touch()
    with FileFeed(path) as feed, path.open("ab") as f:
        f.write(b"".join(_line(app=f"app{k}") for k in range(MAX_FEED_APPS + 10)))
        f.flush()
        assert feed.poll() == MAX_FEED_APPS
        assert len(feed.apps()) == MAX_FEED_APPS and feed.dropped == 10
    reader = source_from_url(f"file:{path}", start_thread=False, apps=["app3"])
    with path.open("ab") as f:
        f.write(_line(app="app3") + _line(app="app4"))
    assert reader.poll() == 1 and reader.dropped == 1 and reader.apps() == ("app3",)
    reader.close()


def test_udp_background_thread_stamps_on_arrival():
    with UdpFeed() as feed:
        feed.start()
        pub = UdpPublisher(*feed.address)
        before = time.monotonic()
        pub.publish("xapian", 3000.0, 800.0)
        r = _wait_for(lambda: feed.latest("xapian"))
        after = time.monotonic()
        assert r is not None and before <= r.t_s <= after
        assert not is_stale(r, now_s=time.monotonic(), max_age_s=60.0)
        pub.close()
    assert feed.latest("xapian") == r  # still readable after close


def test_udp_bind_conflict_is_a_clear_error():
    with UdpFeed() as feed, pytest.raises(OSError, match="cannot bind the latency feed"):
        UdpFeed("127.0.0.1", feed.address[1])


# -- files -------------------------------------------------------------------------------------


def test_file_feed_tails_new_lines_only(tmp_path):
    path = tmp_path / "lat.jsonl"
    path.write_bytes(_line(p99_us=111.0))  # history before the reader started
    clock, wall = FakeClock(10.0), FakeClock(1_700_000_000.0)
    feed = FileFeed(path, clock=clock, wall_clock=wall)
    assert feed.latest("memcached") is None
    with path.open("ab") as f:
        f.write(_line(p99_us=222.0))
        f.write(b'{"app": "memcached", "t": 1700000000.0, "p99')  # a line being written
        f.flush()
        assert feed.latest("memcached").p99_us == 222.0
        f.write(b'_us": 333.0, "rps": 10}\n')
        f.flush()
    assert feed.latest("memcached").p99_us == 333.0
    assert feed.malformed == 0 and feed.received == 2
    feed.close()


def test_file_feed_dates_old_lines_by_the_writer_clock(tmp_path):
    path = tmp_path / "lat.jsonl"
    path.write_bytes(_line(t=1_700_000_000.0) + b"garbage\n")
    clock, wall = FakeClock(500.0), FakeClock(1_700_000_100.0)  # the line is 100 s old
    with FileFeed(path, from_start=True, clock=clock, wall_clock=wall) as feed:
        r = feed.latest("memcached")
        assert r.t_s == pytest.approx(400.0)
        assert is_stale(r, now_s=clock(), max_age_s=1.0)
        assert feed.malformed == 1


def test_file_feed_survives_truncation_rotation_and_a_late_file(tmp_path):
    path = tmp_path / "lat.jsonl"
    feed = FileFeed(path)  # does not exist yet
    assert feed.latest("memcached") is None and feed.malformed == 0
    path.write_bytes(_line(p99_us=1.0) + _line(p99_us=2.0))
    assert feed.latest("memcached").p99_us == 2.0
    path.write_bytes(_line(p99_us=3.0))  # truncated and rewritten (shorter)
    assert feed.latest("memcached").p99_us == 3.0
    os.rename(path, tmp_path / "lat.jsonl.1")  # rotated
    path.write_bytes(_line(p99_us=4.0))
    assert feed.latest("memcached").p99_us == 4.0
    feed.close()


def test_file_publisher_and_feed_round_trip(tmp_path):
    path = tmp_path / "feed.jsonl"
    reader = FileFeed(path)
    pub = FilePublisher(path)
    for i in range(5):
        pub.publish("moses", 1000.0 + i, 50.0, p999_us=5000.0, requests=25)
    pub.close()
    r = reader.latest("moses")
    assert (r.p99_us, r.rps, r.p999_us, r.requests) == (1004.0, 50.0, 5000.0, 25)
    assert reader.received == 5 and pub.sent == 5
    assert len(path.read_text().splitlines()) == 5
    reader.close()


def test_file_feed_thread(tmp_path):
    path = tmp_path / "feed.jsonl"
    with FileFeed(path).start(period_s=0.01) as reader:
        pub = FilePublisher(path)
        pub.publish("sphinx", 2e6, 1.0)
        r = _wait_for(lambda: reader.latest("sphinx"))
        assert r.p99_us == 2e6
        pub.close()


def test_file_publisher_needs_an_existing_directory(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        FilePublisher(tmp_path / "nope" / "feed.jsonl")
    with pytest.raises(ValueError, match="directory"):
        FileFeed(tmp_path)


# -- URLs --------------------------------------------------------------------------------------


def test_urls(tmp_path):
    src = source_from_url("udp://127.0.0.1:0", start_thread=False)
    assert isinstance(src, UdpFeed)
    pub = publisher_from_url(src.url)
    assert isinstance(pub, UdpPublisher)
    pub.publish("a", 1.0, 2.0)
    assert _wait_for(lambda: src.latest("a")).rps == 2.0
    pub.close()
    src.close()

    fsrc = source_from_url(f"file:{tmp_path}/f.jsonl")
    fpub = publisher_from_url(f"file:{tmp_path}/f.jsonl")
    assert isinstance(fsrc, FileFeed) and isinstance(fpub, FilePublisher)
    fpub.publish("b", 3.0, 4.0)
    assert _wait_for(lambda: fsrc.latest("b")).p99_us == 3.0
    fpub.close()
    fsrc.close()

    for bad in ("tcp://127.0.0.1:1", "udp://127.0.0.1", "udp://:99", "file:", "/just/a/path"):
        with pytest.raises(ValueError, match="feed URL"):
            publisher_from_url(bad)


# -- latency histograms ------------------------------------------------------------------------


def _hist(values_us=(100.0, 200.0, 300.0, 5000.0)):
    from env.histogram import LatencyHistogram

    return LatencyHistogram.of_values_us(list(values_us))


def test_a_histogram_travels_in_hdrhistograms_encoded_form():
    h = _hist()
    r, _ = parse_line(encode_line("memcached", 5000.0, 8.0, t=1.0, histogram=h), t_s=2.0)
    assert r.histogram == h and r.requests == 4  # requests default to the histogram's count
    line = json.loads(encode_line("memcached", 5000.0, 8.0, t=1.0, histogram=h))
    assert line["histogram"].startswith("HISTF") and line["histogram_unit"] == "ns"
    feed = MemoryFeed(FakeClock(3.0))
    feed.publish("memcached", 5000.0, 8.0, histogram=h)
    assert feed.latest("memcached").histogram == h


def test_a_histogram_defaults_to_microseconds_as_wrk2_writes_it():
    from hdrh.histogram import HdrHistogram

    ref = HdrHistogram(1, 60_000_000, 3)  # wrk2's layout, values in us
    for v in (100, 200, 300, 5000):
        ref.record_value(v)
    r, _ = parse_line(_line(histogram=ref.encode().decode(), requests=4), t_s=0.0)
    assert r.histogram.count == 4 and r.histogram.quantile_us(0.99) == pytest.approx(5000.0, rel=0.005)


def test_a_reading_without_a_histogram_still_works():
    r, _ = parse_line(_line(requests=10), t_s=0.0)
    assert r.histogram is None and r.requests == 10 and r.p99_us == 412.0


@pytest.mark.parametrize(
    "extra, reason",
    [
        ({"histogram": "not a histogram"}, "HdrHistogram"),
        ({"histogram": "SGVsbG8gd29ybGQ="}, "HdrHistogram"),
        ({"histogram": 42}, "must be a string"),
        ({"histogram_unit": "parsecs"}, "histogram_unit"),
        ({"requests": 5}, "differs from the histogram's count"),
    ],
)
def test_bad_histograms_are_rejected_with_the_reason(extra, reason):
    obj = {"histogram": _hist().encode(), "histogram_unit": "ns", **extra}
    with pytest.raises(FeedFormatError, match=reason):
        parse_line(_line(**obj), t_s=0.0)


def test_a_writer_finds_a_histogram_that_contradicts_its_requests_at_once():
    with pytest.raises(FeedFormatError, match="differs from the histogram's count"):
        encode_line("memcached", 300.0, 8.0, t=0.0, requests=5, histogram=_hist())


def test_a_udp_feed_counts_a_bad_histogram_as_malformed_and_keeps_the_last_good_reading():
    with UdpFeed("127.0.0.1", 0, clock=FakeClock(1.0)) as feed:
        pub = UdpPublisher(*feed.address)
        pub.publish("memcached", 300.0, 8.0, histogram=_hist())
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.sendto(_line(histogram="HISTFbroken"), feed.address)
        _wait_for(lambda: (feed.poll(), feed.malformed == 1 and feed.received == 1)[1])
        assert feed.malformed == 1 and "HdrHistogram" in (feed.last_error or "")
        assert feed.latest("memcached").histogram == _hist()
        pub.close()
