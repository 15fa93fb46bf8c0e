"""DCQCN's reaction point (``lab/agents/roce/dcqcn.c``) held to traces computed by hand.

Why by hand: the C file is the only implementation of the rule, so a second implementation in
Python would share its misreadings. Every expected rate below is a literal worked out from the
rule in dcqcn.c's comments, with the arithmetic beside it; the parameters are small round
numbers (100 Mbit/s, g = 1/4, F = 2) so that every value is exact in binary and the
comparisons are ``==``. Rates are in Mbit/s, times in ms.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from pathlib import Path

import pytest

from controllers import cbuild
from lab.agents import roce
from tests.unit.cmirror import layout_mismatch

ROCE = roce.DIR
MS = 1_000_000          # ns
MBIT = 1e6              # bit/s
NEVER = 2**64 - 1       # dcqcn_next_event_ns when nothing is pending


class Params(ctypes.Structure):
    """``struct dcqcn_params``, field by field as in dcqcn.h (checked against the compiler)."""

    _fields_ = [
        ("line_rate_bps", ctypes.c_double),
        ("min_rate_bps", ctypes.c_double),
        ("g", ctypes.c_double),
        ("alpha_period_ns", ctypes.c_uint64),
        ("timer_ns", ctypes.c_uint64),
        ("byte_counter", ctypes.c_uint64),
        ("fast_recovery_steps", ctypes.c_uint32),
        ("ai_rate_bps", ctypes.c_double),
        ("hai_rate_bps", ctypes.c_double),
        ("rate_reduce_period_ns", ctypes.c_uint64),
        ("min_dec_factor", ctypes.c_double),
        ("cnp_interval_ns", ctypes.c_uint64),
    ]


class State(ctypes.Structure):
    """``struct dcqcn_state``, field by field as in dcqcn.h (checked against the compiler)."""

    _fields_ = [
        ("p", Params),
        ("rc_bps", ctypes.c_double),
        ("rt_bps", ctypes.c_double),
        ("alpha", ctypes.c_double),
        ("timer_events", ctypes.c_uint32),
        ("byte_events", ctypes.c_uint32),
        ("bytes_since_event", ctypes.c_uint64),
        ("next_timer_ns", ctypes.c_uint64),
        ("next_alpha_ns", ctypes.c_uint64),
        ("last_cut_ns", ctypes.c_uint64),
        ("cut_pending", ctypes.c_int),
        ("cnps", ctypes.c_uint64),
        ("cuts", ctypes.c_uint64),
    ]



@pytest.fixture(scope="module")
def lib(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    """dcqcn.c built as the transport builds it (clang, -Wall -Wextra -Werror), once."""
    so = cbuild.build("dcqcn", [ROCE / "dcqcn.c"], shared=True,
                      build_dir=tmp_path_factory.mktemp("dcqcn"))
    dl = ctypes.CDLL(str(so))
    state, u64 = ctypes.POINTER(State), ctypes.c_uint64
    dl.dcqcn_default_params.argtypes = [ctypes.POINTER(Params), ctypes.c_double]
    dl.dcqcn_default_params.restype = None
    dl.dcqcn_init.argtypes = [state, ctypes.POINTER(Params), u64]
    dl.dcqcn_init.restype = None
    dl.dcqcn_on_cnp.argtypes = [state, u64]
    dl.dcqcn_on_cnp.restype = None
    dl.dcqcn_on_sent.argtypes = [state, u64, u64]
    dl.dcqcn_on_sent.restype = None
    dl.dcqcn_advance.argtypes = [state, u64]
    dl.dcqcn_advance.restype = None
    dl.dcqcn_next_event_ns.argtypes = [state]
    dl.dcqcn_next_event_ns.restype = u64
    return dl


def ns(ms: float) -> int:
    """A trace time in ms as the library's ns (every trace time is a whole number of ns)."""
    return round(ms * MS)


class QP:
    """One QP's DCQCN state driven in ms and read in Mbit/s, so the traces read like the rule."""

    def __init__(self, lib: ctypes.CDLL, params: Params) -> None:
        self.lib, self.s = lib, State()
        lib.dcqcn_init(ctypes.byref(self.s), ctypes.byref(params), 0)

    def cnp(self, ms: float) -> QP:
        self.lib.dcqcn_on_cnp(ctypes.byref(self.s), ns(ms))
        return self

    def sent(self, nbytes: int, ms: float) -> QP:
        self.lib.dcqcn_on_sent(ctypes.byref(self.s), nbytes, ns(ms))
        return self

    def advance(self, ms: float) -> QP:
        self.lib.dcqcn_advance(ctypes.byref(self.s), ns(ms))
        return self

    def next_event_ms(self) -> float | None:
        t = self.lib.dcqcn_next_event_ns(ctypes.byref(self.s))
        return None if t == NEVER else t / MS

    @property
    def rates(self) -> tuple[float, float, float]:
        """(Rc, Rt, alpha): what every step of a trace is checked on."""
        return self.s.rc_bps / MBIT, self.s.rt_bps / MBIT, self.s.alpha

    @property
    def counts(self) -> tuple[int, int, int]:
        """(T, BC, bytes towards the next byte-counter event)."""
        return self.s.timer_events, self.s.byte_events, self.s.bytes_since_event


def params(**over: float) -> Params:
    """The traces' round parameters: 100 Mbit/s, g = 1/4, F = 2, R_AI = 5, R_HAI = 10 Mbit/s,
    a 1 ms rate timer, a 10 000 B byte counter, K = 4 ms, no cut period, no floors but 1 Mbit/s.
    """
    p = dict(line_rate_bps=100 * MBIT, min_rate_bps=1 * MBIT, g=0.25, alpha_period_ns=4 * MS,
             timer_ns=1 * MS, byte_counter=10_000, fast_recovery_steps=2, ai_rate_bps=5 * MBIT,
             hai_rate_bps=10 * MBIT, rate_reduce_period_ns=0, min_dec_factor=0.0,
             cnp_interval_ns=0)
    p.update(over)
    return Params(**p)


def test_the_structs_are_laid_out_as_the_compiler_lays_them(tmp_path: Path) -> None:
    """A mirror that drifts from dcqcn.h would read the wrong bytes silently: the compiler is
    asked each field's type (_Generic: a wrong name or type does not compile), offset and the
    structs' sizes."""
    assert layout_mismatch(ROCE / "dcqcn.h", [("dcqcn_params", Params), ("dcqcn_state", State)],
                           tmp_path, {Params: "struct dcqcn_params"}) == []


def test_the_hand_computed_trace(lib: ctypes.CDLL) -> None:
    """Cuts, alpha's decay, fast recovery, additive and hyper increase, the line-rate clamp and
    a later CNP starting the stages over, step by step as worked out from the rule."""
    qp = QP(lib, params())
    # Before the first CNP: line rate, alpha 1, no timer, and sent bytes count for nothing.
    qp.sent(25_000, 1)
    assert qp.rates == (100, 100, 1) and qp.counts == (0, 0, 0)
    assert qp.next_event_ms() is None

    qp.cnp(5)           # Rt = 100; Rc = 100*(1 - 1/2) = 50; alpha = (3/4)*1 + 1/4 = 1
    assert qp.rates == (50, 100, 1)
    assert qp.next_event_ms() == 6             # the rate timer: 5 + 1
    qp.cnp(5.25)        # Rt = 50; Rc = 50*(1 - 1/2) = 25; alpha stays 1
    assert qp.rates == (25, 50, 1)
    qp.cnp(5.5)         # Rt = 25; Rc = 12.5; timers restart: rate 6.5, alpha 5.5 + 4 = 9.5
    assert qp.rates == (12.5, 25, 1)
    assert (qp.s.cnps, qp.s.cuts) == (3, 3) and qp.next_event_ms() == 6.5
    assert qp.s.next_alpha_ns == ns(9.5)

    qp.advance(6.5)     # T = 1: max(1, 0) < 2: fast recovery, Rc = (25 + 12.5)/2 = 18.75
    assert qp.rates == (18.75, 25, 1) and qp.counts == (1, 0, 0)
    qp.advance(7.5)     # T = 2: max = 2, min = 0: additive, Rt = 30, Rc = (30 + 18.75)/2 = 24.375
    assert qp.rates == (24.375, 30, 1)
    qp.sent(15_000, 7.7)    # BC = 1, 5 000 B carried: additive, Rt = 35,
    assert qp.rates == (29.6875, 35, 1) and qp.counts == (2, 1, 5_000)  # Rc = (35+24.375)/2
    qp.sent(5_000, 7.8)     # BC = 2: additive, Rt = 40, Rc = (40 + 29.6875)/2 = 34.84375
    assert qp.rates == (34.84375, 40, 1) and qp.counts == (2, 2, 0)
    qp.sent(10_000, 7.9)    # BC = 3 but min(T=2, 3) = 2, not > 2: additive, Rt = 45,
    assert qp.rates == (39.921875, 45, 1)                 # Rc = (45 + 34.84375)/2 = 39.921875
    qp.advance(8.5)     # T = 3: min(3, 3) = 3 > 2: hyper, i = 1: Rt = 45 + 10 = 55,
    assert qp.rates == (47.4609375, 55, 1)                # Rc = (55 + 39.921875)/2
    qp.sent(20_000, 9)  # BC = 4: i = min(3, 4) - 2 = 1: Rt = 65, Rc = (65 + 47.4609375)/2
    #                     BC = 5: i = min(3, 5) - 2 = 1: Rt = 75, Rc = (75 + 56.23046875)/2
    assert qp.rates == (65.615234375, 75, 1) and qp.counts == (3, 5, 0)
    qp.advance(9.5)     # T = 4: i = min(4, 5) - 2 = 2: Rt = 75 + 2*10 = 95,
    #                     Rc = (95 + 65.615234375)/2 = 80.3076171875; then at the same instant
    #                     alpha's first period without a CNP (5.5 + 4): alpha = (3/4)*1 = 0.75
    assert qp.rates == (80.3076171875, 95, 0.75) and qp.counts == (4, 5, 0)
    qp.advance(10.5)    # T = 5: i = 3: Rt = 95 + 30 = 125, clamped to the line's 100;
    assert qp.rates == (90.15380859375, 100, 0.75)        # Rc = (100 + 80.3076171875)/2
    qp.sent(3_000, 10.6)
    assert qp.counts == (5, 5, 3_000)

    qp.cnp(10.75)       # Rt = 90.15380859375; Rc = Rt*(1 - 0.75/2) = Rt*0.625
    #                     = 56.25 + 0.15380859375*0.625 = 56.34613037109375;
    #                     alpha = (3/4)*0.75 + 1/4 = 0.8125; T, BC and the byte count start over
    assert qp.rates == (56.34613037109375, 90.15380859375, 0.8125)
    assert qp.counts == (0, 0, 0) and (qp.s.cnps, qp.s.cuts) == (4, 4)
    assert (qp.s.next_timer_ns, qp.s.next_alpha_ns) == (ns(11.75), ns(14.75))
    qp.advance(11.75)   # T = 1 again: fast recovery, Rc = (90.15380859375 + 56.34613037109375)/2
    assert qp.rates == (73.249969482421875, 90.15380859375, 0.8125)

    qp.advance(1000)    # a second with no CNP: back to the line and never above it
    rc, rt, alpha = qp.rates
    assert rt == 100 and 99.999 < rc <= 100 and alpha < 1e-20


def test_cnps_within_the_rate_reduce_period_make_one_cut_when_it_ends(lib: ctypes.CDLL) -> None:
    """mlx5's rate_reduce_monitor_period: one cut per period, the CNPs inside it make one cut
    at its end, and a CNP still counts as feedback for alpha (no decay for K after it)."""
    qp = QP(lib, params(rate_reduce_period_ns=ns(1.5), alpha_period_ns=1 * MS))
    qp.cnp(5)           # the first cut: Rt = 100, Rc = 50, alpha = 1; timers at 6
    assert qp.rates == (50, 100, 1)
    qp.cnp(5.5)         # 0.5 ms after the cut < 1.5: pending until 5 + 1.5 = 6.5
    assert qp.rates == (50, 100, 1) and (qp.s.cnps, qp.s.cuts, qp.s.cut_pending) == (2, 1, 1)
    assert qp.next_event_ms() == 6 and qp.s.next_alpha_ns == ns(6.5)   # alpha: 5.5 + 1
    qp.advance(6)       # T = 1: fast recovery, Rc = (100 + 50)/2 = 75; no alpha decay at 6
    assert qp.rates == (75, 100, 1)
    qp.cnp(6.2)         # still inside the period: the same pending cut; alpha now at 7.2
    qp.advance(6.499)
    assert qp.rates == (75, 100, 1) and (qp.s.cnps, qp.s.cuts) == (3, 1)
    assert qp.next_event_ms() == 6.5
    qp.advance(6.5)     # the period ends: Rt = 75, Rc = 75*(1 - 1/2) = 37.5, alpha = 1
    assert qp.rates == (37.5, 75, 1) and (qp.s.cnps, qp.s.cuts, qp.s.cut_pending) == (3, 2, 0)
    assert qp.counts == (0, 0, 0) and qp.s.last_cut_ns == ns(6.5)
    qp.advance(7.5)     # T = 1: Rc = (75 + 37.5)/2 = 56.25; alpha's period: (3/4)*1 = 0.75
    assert qp.rates == (56.25, 75, 0.75)
    qp.cnp(8)           # exactly 1.5 ms after the last cut: cut now, Rt = 56.25,
    #                     Rc = 56.25*(1 - 0.75/2) = 35.15625, alpha = (3/4)*0.75 + 1/4 = 0.8125
    assert qp.rates == (35.15625, 56.25, 0.8125) and (qp.s.cnps, qp.s.cuts) == (4, 3)


def test_events_due_at_one_instant_fire_timer_then_alpha_then_cut(lib: ctypes.CDLL) -> None:
    """The three do not commute, so their order at equal times is part of the contract
    (dcqcn.c's header): each sees the state the one before left."""
    qp = QP(lib, params(rate_reduce_period_ns=1 * MS, alpha_period_ns=ns(0.75)))
    qp.cnp(5)           # Rt = 100, Rc = 50, alpha = 1; rate timer at 6, alpha's at 5.75
    qp.cnp(5.25)        # pending until 5 + 1 = 6; alpha's period restarts: 5.25 + 0.75 = 6
    assert qp.rates == (50, 100, 1) and qp.s.next_alpha_ns == ns(6)
    qp.advance(6)       # timer: T = 1, Rc = (100 + 50)/2 = 75; alpha: (3/4)*1 = 0.75;
    #                     cut: Rt = 75, Rc = 75*(1 - 0.75/2) = 46.875, alpha = 0.5625 + 0.25
    assert qp.rates == (46.875, 75, 0.8125) and qp.counts == (0, 0, 0)
    assert (qp.s.next_timer_ns, qp.s.next_alpha_ns) == (ns(7), ns(6.75))


def test_one_cut_never_leaves_less_than_min_dec_factor(lib: ctypes.CDLL) -> None:
    """rpg_min_dec_fac: a cut keeps at least that share of Rc, whatever alpha says."""
    qp = QP(lib, params(min_dec_factor=0.75, alpha_period_ns=1 * MS))
    qp.cnp(5)           # alpha/2 would halve: Rc = max(100*0.5, 100*0.75) = 75; Rt = 100
    assert qp.rates == (75, 100, 1)
    qp.advance(6)       # T = 1: Rc = (100 + 75)/2 = 87.5; alpha = 0.75
    qp.advance(7)       # T = 2: additive, Rt = 105 -> 100, Rc = (100 + 87.5)/2 = 93.75;
    assert qp.rates == (93.75, 100, 0.5625)               # alpha = 0.75*0.75 = 0.5625
    qp.cnp(7)           # 1 - 0.5625/2 = 0.71875 < 0.75: Rc = 93.75*0.75 = 70.3125;
    assert qp.rates == (70.3125, 93.75, 0.671875)  # alpha = (3/4)*0.5625 + 1/4 = 0.671875


def test_a_cut_never_goes_below_the_min_rate(lib: ctypes.CDLL) -> None:
    """rpg_min_rate: the floor under every cut."""
    qp = QP(lib, params(min_rate_bps=30 * MBIT))
    qp.cnp(5)           # Rc = 100/2 = 50
    assert qp.rates == (50, 100, 1)
    qp.cnp(5.1)         # Rc = max(30, 50/2 = 25) = 30; Rt = 50
    assert qp.rates == (30, 50, 1)
    qp.cnp(5.2)         # Rc = max(30, 15) = 30; Rt = 30
    assert qp.rates == (30, 30, 1)


Step = Callable[[QP], object]
SCENARIO: list[tuple[float, Step]] = [
    (5.0, lambda qp: qp.cnp(5.0)),
    (5.5, lambda qp: qp.cnp(5.5)),             # pending: the cut comes at 6.5
    (7.3, lambda qp: qp.sent(25_000, 7.3)),
    (9.1, lambda qp: qp.cnp(9.1)),
    (12.0, lambda qp: qp.sent(45_000, 12.0)),
    (13.0, lambda qp: qp.cnp(13.0)),
    (40.0, lambda qp: qp.advance(40.0)),
]


def run(lib: ctypes.CDLL, wake: Callable[[QP, float, float], None]) -> QP:
    """The scenario with `wake(qp, since, until)` between its steps: how often the transport
    woke between them."""
    qp = QP(lib, params(rate_reduce_period_ns=ns(1.5), alpha_period_ns=ns(2.5)))
    since = 0.0
    for at, step in SCENARIO:
        wake(qp, since, at)
        step(qp)
        since = at
    return qp


def never(qp: QP, since: float, until: float) -> None:
    """Sleep through everything: each step's own call fires what is due."""


def every_event(qp: QP, since: float, until: float) -> None:
    """Wake at each event's own time, as a transport that never oversleeps would."""
    while (t := qp.next_event_ms()) is not None and t <= until:
        qp.advance(t)


def every_10_us(qp: QP, since: float, until: float) -> None:
    """Wake every 10 us: many calls with nothing due."""
    for k in range(1, round((until - since) * 100)):
        qp.advance(since + k / 100)


def fields(qp: QP) -> dict[str, float]:
    """Every field of the state but the (unchanging) parameters, for an exact comparison."""
    return {name: getattr(qp.s, name) for name, _ in State._fields_ if name != "p"}


def test_one_long_advance_equals_waking_at_every_event(lib: ctypes.CDLL) -> None:
    """A late wake-up (the transport on a loaded machine) must not change the rates: events
    fire at their own times, in order, however few the calls."""
    late = run(lib, never)
    assert late.s.cuts == 4 and late.s.timer_events > 20      # the scenario exercises them
    assert fields(run(lib, every_event)) == fields(late)
    assert fields(run(lib, every_10_us)) == fields(late)


def test_defaults_are_the_papers_at_40_gbits(lib: ctypes.CDLL) -> None:
    """At the paper's own rate the scaling is the identity: the table in docs/roce.md."""
    p = Params()
    lib.dcqcn_default_params(ctypes.byref(p), 40e9)
    assert (p.line_rate_bps, p.g, p.fast_recovery_steps, p.byte_counter) == (
        40e9, 1 / 256, 5, 10_000_000)
    assert (p.timer_ns, p.alpha_period_ns, p.cnp_interval_ns, p.rate_reduce_period_ns) == (
        55_000, 55_000, 50_000, 4_000)
    assert (p.ai_rate_bps, p.hai_rate_bps, p.min_rate_bps, p.min_dec_factor) == (
        40e6, 50e6, 1e6, 0.5)


@pytest.mark.parametrize("line_bps, timer_ns, rr_ns, ai_bps, hai_bps, min_bps", [
    (100e6, 22_000_000, 1_600_000, 100e3, 125e3, 2_500),   # s = 400
    (1e9, 2_200_000, 160_000, 1e6, 1.25e6, 25_000),        # s = 40
])
def test_the_lab_rates_scale_by_the_one_rule(lib: ctypes.CDLL, line_bps: float, timer_ns: int,
                                             rr_ns: int, ai_bps: float, hai_bps: float,
                                             min_bps: float) -> None:
    """s = 40e9 / line rate: times x s, rates / s, byte counts as they are (the table's lab
    columns)."""
    p = Params()
    lib.dcqcn_default_params(ctypes.byref(p), line_bps)
    assert (p.timer_ns, p.alpha_period_ns, p.rate_reduce_period_ns) == (timer_ns, timer_ns, rr_ns)
    assert p.cnp_interval_ns == timer_ns * 50 // 55
    assert (p.ai_rate_bps, p.hai_rate_bps, p.min_rate_bps) == (ai_bps, hai_bps, min_bps)
    assert (p.byte_counter, p.fast_recovery_steps, p.g, p.min_dec_factor) == (
        10_000_000, 5, 1 / 256, 0.5)


def test_100_mbits_is_1_gbits_ten_times_slower(lib: ctypes.CDLL) -> None:
    """The rule between any two lab rates: every time x10, every rate /10, bytes equal."""
    slow, fast = Params(), Params()
    lib.dcqcn_default_params(ctypes.byref(slow), 100e6)
    lib.dcqcn_default_params(ctypes.byref(fast), 1e9)
    for name in ("alpha_period_ns", "timer_ns", "rate_reduce_period_ns", "cnp_interval_ns"):
        assert getattr(slow, name) == 10 * getattr(fast, name), name
    for name in ("line_rate_bps", "min_rate_bps", "ai_rate_bps", "hai_rate_bps"):
        assert getattr(slow, name) * 10 == pytest.approx(getattr(fast, name), rel=1e-12), name
    for name in ("byte_counter", "fast_recovery_steps", "g", "min_dec_factor"):
        assert getattr(slow, name) == getattr(fast, name), name
