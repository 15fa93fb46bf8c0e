"""The viewer's player model, the wire format and the receive-side bookkeeping, on synthetic data.

Expected numbers are derived by hand in the comments (fps 25: one frame per 40 ms; startup
1000 ms = 25 frames; rebuffer 500 ms = 13 whole frames) and, for the irregular traces, checked
against a deliberately naive millisecond-tick re-implementation of the same rules.
"""

from __future__ import annotations

import random

import pytest

from lab.agents import playout as streams
from lab.agents.playout import simulate_playout

FPS = 25.0
P = 1 / FPS  # 40 ms


def paced(n: int, delay: float = 0.0, every: float = P) -> list[tuple[int, float]]:
    return [(k, k * every + delay) for k in range(n)]


# --- a naive oracle: integer milliseconds, one tick at a time ---------------------------------

def oracle(arrivals_ms: dict[int, int], n: int, period_ms: int, need_start: int,
           need_rebuf: int) -> tuple[int, int, int]:
    """(stalls, stall ms, frames played), by stepping a clock 1 ms at a time."""
    eos = max(arrivals_ms.values())
    k, state, next_play, stall_from = 0, "startup", 0, 0
    stalls = stall_ms = played = 0
    t = min(arrivals_ms.values())

    def buffered(now: int) -> int:
        return sum(1 for j, a in arrivals_ms.items() if j >= k and a <= now)

    while k < n:
        if state == "startup" and (buffered(t) >= need_start or t >= eos):
            state, next_play = "playing", t
        if state == "stalled" and (buffered(t) >= need_rebuf or t >= eos):
            state, next_play = "playing", t
            stall_ms += t - stall_from
        if state == "playing" and t == next_play:
            a = arrivals_ms.get(k)
            later = any(j > k and x <= t for j, x in arrivals_ms.items())
            future = any(j >= k for j in arrivals_ms)
            if a is not None and a <= t:
                played += 1
            elif not later and not future and t >= eos:
                break
            elif not later:
                state, stall_from = "stalled", t
                stalls += 1
                continue  # same tick: may not resume before something arrives
            k += 1
            next_play = t + period_ms
        t += 1
    return stalls, stall_ms, played


def as_ms(arrivals: list[tuple[int, float]]) -> dict[int, int]:
    return {seq: round(t * 1000) for seq, t in arrivals}


# --- the player model -------------------------------------------------------------------------

def test_perfectly_paced_arrivals_never_stall():
    s = simulate_playout(paced(250, delay=0.007), FPS, 1000, 500)
    assert (s.stalls, s.stall_s, s.frames_played, s.frames_late, s.frames_lost) == (0, 0, 250, 0, 0)
    # 25 frames are buffered when frame 24 arrives, 24 frame periods after the first.
    assert s.startup_delay_s == pytest.approx(24 * P)
    assert s.play_end_s == pytest.approx(24 * P + 250 * P)
    states = [p.state for p in s.timeline]
    assert states[0] == "startup" and states[-1] == "ended" and "stalled" not in states
    steady = [p.buffer_s for p in s.timeline if p.state == "playing"]
    assert all(0.9 <= b <= 1.0 for b in steady), steady


def test_two_second_gap_gives_one_stall_of_the_gap_minus_the_buffer_plus_the_refill():
    # Frames 0..49 paced; from frame 50 on everything arrives 2 s later than it would have.
    arrivals = [(k, k * P + (2.0 if k >= 50 else 0.0)) for k in range(250)]
    s = simulate_playout(arrivals, FPS, 1000, 500)
    # Playback starts at 0.96 s, so frame 50 is due at 0.96 + 50·0.04 = 2.96 s. It arrives at
    # 4.00 s; playback resumes when 13 frames (50..62) are there: 62·0.04 + 2 = 4.48 s.
    # Stall = 4.48 − 2.96 = 1.52 s = gap (2.0) − media buffered (1.0 s) + refill (0.52 s).
    assert s.stalls == 1
    assert s.stall_s == pytest.approx(1.52)
    (e,) = s.stall_events
    assert (e.seq, e.start_s) == (50, pytest.approx(2.96))
    assert 2.0 - 1.0 <= s.stall_s <= 2.0 - 1.0 + 0.5 + 2 * P
    # The frame that made it stall arrived after it was needed: late, not lost.
    assert (s.frames_late, s.frames_lost, s.frames_played) == (1, 0, 250)
    by_t = {p.t: p for p in s.timeline}
    assert by_t[3.0].state == "stalled" and by_t[3.0].buffer_s == 0
    assert by_t[4.0].stalled and by_t[4.0].buffer_s == pytest.approx(P)
    assert by_t[5.0].state == "playing"
    assert oracle(as_ms(arrivals), 250, 40, 25, 13) == (1, 1520, 250)


def test_steady_arrival_at_80_percent_of_the_frame_rate_stalls_again_and_again():
    # 20 frames/s arrive for 25 frames/s played. Start: frame 24 at 1.2 s. Frame j is due at
    # 1.2 + 0.04·j and arrives at 0.05·j: the first stall is at j = 121 (6.04 s, it arrives
    # 6.05 s); resume when 121..133 are there, at 6.65 s: 0.61 s. From a resume with 13 frames
    # the buffer lasts 61 more frames (0.01 s lost per frame against a 0.6 s lead), so stalls
    # hit frames 121, 182, 243, each 0.61 s; the 57 frames after 243 play through.
    arrivals = paced(300, every=0.05)
    s = simulate_playout(arrivals, FPS, 1000, 500)
    assert s.stalls == 3
    assert [e.seq for e in s.stall_events] == [121, 182, 243]
    assert s.stall_s == pytest.approx(3 * 0.61)
    # Accounting identity: playout time = startup + one period per frame + stalls.
    assert s.play_end_s == pytest.approx(s.startup_delay_s + 300 * P + s.stall_s)
    stalls, stall_ms, played = oracle(as_ms(arrivals), 300, 40, 25, 13)
    assert (s.stalls, round(s.stall_s * 1000), s.frames_played) == (stalls, stall_ms, played)


@pytest.mark.parametrize("seed", range(6))
def test_random_jittery_traces_agree_with_the_naive_oracle(seed):
    rng = random.Random(seed)
    n, t, arrivals = 200, 0, []
    for k in range(n):
        t += rng.choice([20, 40, 40, 60, 0, 300 if rng.random() < 0.03 else 40])
        if rng.random() > 0.05:  # 5 % of frames lost
            arrivals.append((k, t / 1000))
    s = simulate_playout(arrivals, FPS, 1000, 500, total_frames=n)
    stalls, stall_ms, played = oracle(as_ms(arrivals), n, 40, 25, 13)
    assert (s.stalls, round(s.stall_s * 1000), s.frames_played) == (stalls, stall_ms, played)
    assert s.frames_lost == n - len(arrivals)


def test_udp_loss_is_counted_and_skipped_without_stalling():
    arrivals = [(k, t) for k, t in paced(250) if k % 10 != 3]
    s = simulate_playout(arrivals, FPS, 1000, 500, total_frames=250)
    assert (s.frames_lost, s.frames_skipped, s.frames_played) == (25, 25, 225)
    assert (s.stalls, s.frames_late) == (0, 0)
    # Startup counts frames that are there: the 25th arrives as frame 27, at 1.08 s. The
    # skipped slots still take a frame period each: the playout clock follows the media.
    assert s.startup_delay_s == pytest.approx(27 * P)
    assert s.play_end_s == pytest.approx(27 * P + 250 * P)


def test_lost_tail_frames_end_the_stream_instead_of_stalling_forever():
    s = simulate_playout(paced(230), FPS, 1000, 500, total_frames=250)
    assert (s.frames_lost, s.frames_played, s.stalls) == (20, 230, 0)
    assert s.timeline[-1].state == "ended"


def test_a_stream_that_completes_no_more_frames_is_frozen_until_it_ends():
    # UDP over a saturated queue: fragments keep coming, but from frame 50 on every frame
    # misses one. The end-of-stream marker arrives at 6.0 s: frozen from 2.96 s until then.
    s = simulate_playout(paced(50), FPS, 1000, 500, total_frames=150, eos_time=6.0)
    assert (s.stalls, s.frames_played, s.frames_lost) == (1, 50, 100)
    assert s.stall_s == pytest.approx(6.0 - 2.96)
    assert s.timeline[-1].state == "ended"


def test_a_burst_loss_with_an_empty_buffer_stalls_once_then_skips_the_hole():
    # Frames 50..79 never arrive. At 2.96 s frame 50 is due with nothing buffered: stall until
    # 13 frames (80..92) are there at 92·0.04 = 3.68 s; then 30 slots are skipped.
    arrivals = [(k, t) for k, t in paced(250) if not 50 <= k < 80]
    s = simulate_playout(arrivals, FPS, 1000, 500, total_frames=250)
    assert (s.stalls, s.frames_lost, s.frames_skipped, s.frames_late) == (1, 30, 30, 0)
    assert s.stall_s == pytest.approx(3.68 - 2.96)


def test_a_frame_that_comes_after_it_was_skipped_is_late_not_lost():
    arrivals = [(k, k * P + (3.0 if k == 60 else 0.0)) for k in range(250)]
    s = simulate_playout(arrivals, FPS, 1000, 500)
    assert (s.frames_late, s.frames_lost, s.frames_skipped, s.stalls) == (1, 0, 1, 0)


def test_duplicates_count_once_at_their_first_arrival():
    arrivals = paced(100) + [(k, k * P + 5.0) for k in range(100)]
    s = simulate_playout(arrivals, FPS, 1000, 500)
    assert (s.frames_arrived, s.frames_played, s.stalls) == (100, 100, 0)


def test_a_stream_shorter_than_the_startup_buffer_plays_when_it_ends():
    s = simulate_playout(paced(10), FPS, 1000, 500, eos_time=0.5)
    assert s.startup_delay_s == pytest.approx(0.5)
    assert (s.frames_played, s.stalls) == (10, 0)


def test_nothing_arrived_means_never_started_and_everything_lost():
    s = simulate_playout([], FPS, total_frames=50)
    assert (s.started, s.frames_lost, s.stalls, s.startup_delay_s) == (False, 50, 0, None)


def test_startup_and_rebuffer_thresholds_are_whole_frames():
    # 1000 ms at 30 fps = 30 frames; 0 ms still needs one frame.
    s = simulate_playout(paced(100, every=1 / 30), 30.0, 1000, 500)
    assert s.startup_delay_s == pytest.approx(29 / 30)
    s0 = simulate_playout(paced(100), FPS, 0, 0)
    assert s0.startup_delay_s == 0


@pytest.mark.parametrize("kw", [{"fps": 0}, {"fps": 25, "startup_ms": -1}])
def test_bad_parameters_are_refused(kw):
    with pytest.raises(ValueError):
        simulate_playout(paced(5), **kw)


# --- statistics -------------------------------------------------------------------------------

def test_percentile_interpolates():
    assert streams.percentile([4, 1, 3, 2], 50) == 2.5
    assert streams.percentile([1, 2, 3, 4, 5], 100) == 5
    assert streams.percentile(list(range(101)), 99) == 99
    assert streams.percentile([], 50) is None


def test_rfc3550_jitter():
    assert streams.rfc3550_jitter([(k, k + 0.1) for k in range(50)]) == pytest.approx(0)
    # One step of 10 ms: J = 10/16 ms.
    assert streams.rfc3550_jitter([(0, 0.1), (1, 1.11)]) == pytest.approx(0.010 / 16)
    # Transit alternating 0 / 10 ms: |D| = 10 ms every time; J → 10 ms · (1 − (15/16)^n).
    samples = [(k, k + (0.01 if k % 2 else 0)) for k in range(101)]
    assert streams.rfc3550_jitter(samples) == pytest.approx(0.010 * (1 - (15 / 16) ** 100))
    assert streams.rfc3550_jitter([(0, 1)]) is None


# --- wire format and reassembly ---------------------------------------------------------------

def test_frame_sizes_are_constant_bitrate_without_drift():
    sizes = streams.frame_sizes(2.5e6, 30, 300)  # 10416.67 bytes per frame
    assert set(sizes) == {10416, 10417}
    assert sum(sizes) == 2.5e6 / 8 * 10
    assert streams.frame_sizes(2.5e6, 25, 3) == [12500] * 3
    with pytest.raises(ValueError):
        streams.frame_sizes(100, 25, 1)


def test_fragments_fit_a_1400_byte_datagram():
    sizes = streams.fragment_sizes(12500)
    assert sum(sizes) == 12500
    assert all(s + streams.DGRAM_HEADER.size <= 1400 for s in sizes)
    assert len(sizes) == -(-12500 // streams.DGRAM_PAYLOAD)


def test_tcp_framing_survives_any_split_of_the_byte_stream():
    rng = random.Random(3)
    frames = [(k, rng.randrange(1, 5000)) for k in range(40)]
    wire = b"".join(streams.pack_frame_header(7, k, 1000 + k, n, 25) + bytes(n)
                    for k, n in frames)
    wire += streams.pack_frame_header(7, 40, 9999, 0, 25, end=True)
    parser, got, pos, now = streams.FrameParser(), [], 0, 0
    while pos < len(wire):
        step = rng.choice([1, 3, 24, 100, 4096, 20000])
        now += 1
        got += [(h.seq, h.length, h.end, now) for h in parser.feed(wire[pos:pos + step], now)]
        pos += step
    assert [(s, n) for s, n, end, _ in got if not end] == frames
    assert got[-1][:3] == (40, 0, True)
    assert not parser.partial
    # A frame is "arrived" when its last byte is: the times never go backwards.
    assert [t for *_, t in got] == sorted(t for *_, t in got)


def test_tcp_parser_rejects_a_stream_that_lost_its_framing():
    with pytest.raises(ValueError):
        streams.FrameParser().feed(b"XX" + bytes(40), 0)


def test_udp_reassembly_counts_whole_frames_only():
    rec = streams.StreamRecord(5, "udp")
    sizes = streams.fragment_sizes(5000)  # 4 fragments
    base = 1_000_000_000

    def dgram(seq, i, end=False):
        h = streams.pack_datagram_header(5, seq, base + seq * 40_000_000, 5000, 25, i,
                                         0 if end else len(sizes), end=end)
        return streams.unpack_datagram(h + bytes(0 if end else sizes[i]))

    now = base
    for seq in range(10):
        order = [3, 1, 0, 2] if seq % 2 else [0, 1, 2, 3]
        if seq == 4:
            order = [0, 1, 3]  # fragment 2 lost: the frame is lost
        if seq == 6:
            order = [0, 1, 1, 2, 3]  # a duplicate fragment
        for i in order:
            now += 1_000_000
            h, n = dgram(seq, i)
            rec.add_fragment(h, n, now + seq * 40_000_000)
    h, n = dgram(10, 0, end=True)
    rec.add_fragment(h, n, now + 500_000_000)
    rec.end("end-marker", now + 500_000_000)
    assert sorted(rec.frames) == [0, 1, 2, 3, 5, 6, 7, 8, 9]
    assert (rec.frames_sent, rec.duplicates, rec.fragments_missing()) == (10, 1, 1)
    out = rec.summarize(1000, 500)
    assert (out["frames_expected"], out["frames_lost"], out["lost_pct"]) == (10, 1, 10.0)
    assert out["fragments_missing"] == 1 and out["datagrams"] == 40 + 1
    assert out["delay_ms"]["p50"] > 0 and out["jitter_ms"] is not None
    assert out["goodput_bps"] > 0 and out["stalls"] == 0


def test_stream_totals_sum_over_streams():
    summary = {"streams": [
        {"frames_expected": 100, "frames_lost": 10, "stalls": 2, "stall_s": 1.5},
        {"frames_expected": 300, "frames_lost": 0, "stalls": 1, "stall_s": 0.5}]}
    assert streams.stream_totals(summary) == {"stream_count": 2, "stalls": 3, "stall_s": 2.0,
                                              "streams_lost_pct": 2.5}


def test_read_summary_refuses_another_tool_or_schema(tmp_path):
    f = tmp_path / "s.json"
    f.write_text('{"schema": 1, "tool": "send"}')
    assert streams.read_summary(f, "send")["tool"] == "send"
    with pytest.raises(ValueError):
        streams.read_summary(f, "play")
    f.write_text('{"schema": 99, "tool": "send"}')
    with pytest.raises(ValueError):
        streams.read_summary(f)
