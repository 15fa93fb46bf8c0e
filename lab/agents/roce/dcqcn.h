/* SPDX-License-Identifier: GPL-2.0 */
/*
 * DCQCN's reaction point (the sender's rate limiter), as one QP's state: the algorithm of
 * Zhu et al., "Congestion Control for Large-Scale RDMA Deployments" (SIGCOMM 2015), with the
 * knobs a ConnectX NIC exposes (mlx5's roce_rp/roce_np names in the comments).
 *
 * Pure arithmetic on the times and byte counts the transport passes in: no clock, no I/O,
 * so a unit test can drive it with a hand-computed trace and the transport with real time.
 * Times are nanoseconds on any monotonic clock; rates are bit/s.
 */
#ifndef FABRICLAB_DCQCN_H
#define FABRICLAB_DCQCN_H

#include <stdint.h>

struct dcqcn_params {
	double line_rate_bps;          /* the NIC's rate: a QP starts here and never exceeds it */
	double min_rate_bps;           /* rpg_min_rate: a cut never goes below this */
	double g;                      /* alpha's gain (1 - dce_tcp_g/1024; the paper's 1/256) */
	uint64_t alpha_period_ns;      /* K (dce_tcp_rtt): alpha decays once per K without a CNP */
	uint64_t timer_ns;             /* T (rpg_time_reset): the rate-increase timer */
	uint64_t byte_counter;         /* B (rpg_byte_reset): an increase event every B bytes sent */
	                               /* (K, T or B of 0 switches that timer or counter off) */
	uint32_t fast_recovery_steps;  /* F (rpg_threshold): increase events of fast recovery */
	double ai_rate_bps;            /* R_AI (rpg_ai_rate): additive increase step */
	double hai_rate_bps;           /* R_HAI (rpg_hai_rate): hyper increase step */
	uint64_t rate_reduce_period_ns;/* rate_reduce_monitor_period: at most one cut per period
	                                  (0: every CNP cuts at once) */
	double min_dec_factor;         /* rpg_min_dec_fac: one cut leaves at least this share */
	uint64_t cnp_interval_ns;      /* N (min_time_between_cnps): the NP's one CNP per QP per N */
};

/* The parameters for a NIC of line_rate_bps, scaled from the paper's 40 Gbit/s by the one
 * rule documented in dcqcn.c (and docs): times stretch by 40e9/line_rate, rates shrink by
 * it, byte counts stay. */
void dcqcn_default_params(struct dcqcn_params *p, double line_rate_bps);

struct dcqcn_state {
	struct dcqcn_params p;
	double rc_bps;                 /* current rate: what the transport paces at */
	double rt_bps;                 /* target rate */
	double alpha;
	uint32_t timer_events;         /* T count since the last cut */
	uint32_t byte_events;          /* BC count since the last cut */
	uint64_t bytes_since_event;    /* towards the next byte-counter event */
	uint64_t next_timer_ns;        /* when the rate timer next fires */
	uint64_t next_alpha_ns;        /* when alpha next decays */
	uint64_t last_cut_ns;          /* last rate decrease (rate_reduce_period_ns) */
	int cut_pending;               /* a CNP came within rate_reduce_period_ns of the last cut */
	uint64_t cnps;                 /* CNPs handled */
	uint64_t cuts;                 /* rate decreases made */
};

/* Rc = Rt = line rate, alpha = 1, no timer running: they start at the first CNP. */
void dcqcn_init(struct dcqcn_state *s, const struct dcqcn_params *p, uint64_t now_ns);
/* A CNP arrived for this QP (after firing every event due at or before now_ns). */
void dcqcn_on_cnp(struct dcqcn_state *s, uint64_t now_ns);
/* The QP put `bytes` on the wire (payload and headers as the NIC counts them), after firing
 * every event due at or before now_ns. Before the first CNP bytes count for nothing. */
void dcqcn_on_sent(struct dcqcn_state *s, uint64_t bytes, uint64_t now_ns);
/* Fire every timer (rate timer, alpha decay, a pending cut) due at or before now_ns, each at
 * its own due time, in time order; at one instant: rate timer, alpha decay, pending cut. */
void dcqcn_advance(struct dcqcn_state *s, uint64_t now_ns);
/* When dcqcn_advance next has work: the transport sleeps no longer than this. */
uint64_t dcqcn_next_event_ns(const struct dcqcn_state *s);

#endif
