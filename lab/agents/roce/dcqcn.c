// SPDX-License-Identifier: GPL-2.0
/*
 * DCQCN's reaction point: one QP's sending rate, cut on a CNP and recovered by a timer and a
 * byte counter (Zhu et al., "Congestion Control for Large-Scale RDMA Deployments", SIGCOMM
 * 2015, with the knobs of a ConnectX NIC; docs/roce.md says which value comes from where).
 *
 * Why pure arithmetic: the functions read no clock, sleep on nothing and allocate nothing;
 * every time and byte count is an argument. The transport passes its monotonic clock and what
 * it put on the wire; a unit test passes a hand-computed trace and gets the same answers on
 * any machine, however loaded. dcqcn_advance fires the events due by `now` one at a time in
 * time order, each at its own due time, so a transport that wakes late (a loaded 2-core
 * machine) gets exactly the rates it would have had waking at every event.
 *
 * The events and their order at equal times: the rate timer, then alpha's decay, then a
 * pending cut; dcqcn_on_cnp and dcqcn_on_sent first fire everything due at or before their
 * `now`, then act.
 */
#include "dcqcn.h"

#define NEVER UINT64_MAX

static uint64_t sum(uint64_t t, uint64_t ns)
{
	return t > NEVER - ns ? NEVER : t + ns;
}

/* When a timer of period_ns started at t fires: a zero period disables the timer. */
static uint64_t after(uint64_t t, uint64_t period_ns)
{
	return period_ns == 0 ? NEVER : sum(t, period_ns);
}

/* s = 40e9 / line rate: the paper's 40 Gbit/s times stretched by s, in whole ns. */
static uint64_t scaled_ns(double paper_ns, double s)
{
	double ns = paper_ns * s + 0.5;

	return ns >= 1.8e19 ? NEVER - 1 : (uint64_t)ns;
}

void dcqcn_default_params(struct dcqcn_params *p, double line_rate_bps)
{
	/*
	 * The one scaling rule: the paper tuned DCQCN at 40 Gbit/s. At line rate R = 40e9/s a
	 * packet takes s times as long, so every time is stretched by s and every rate divided
	 * by s, and byte counts stay: each event then sees the same number of packets, the
	 * queue the same bytes, and every rate step the same share of the line rate.
	 */
	const double s = 40e9 / line_rate_bps;

	*p = (struct dcqcn_params){
		.line_rate_bps = line_rate_bps,
		.min_rate_bps = 1e6 / s,                     /* mlx5 rpg_min_rate 1 Mbit/s */
		.g = 1.0 / 256,                              /* paper */
		.alpha_period_ns = scaled_ns(55e3, s),       /* paper K = 55 us */
		.timer_ns = scaled_ns(55e3, s),              /* paper T = 55 us */
		.byte_counter = 10000000,                    /* paper B = 10 MB: bytes, unscaled */
		.fast_recovery_steps = 5,                    /* paper F = 5 */
		.ai_rate_bps = 40e6 / s,                     /* paper R_AI = 40 Mbit/s */
		.hai_rate_bps = 50e6 / s,                    /* mlx5 rpg_hai_rate 50 Mbit/s */
		.rate_reduce_period_ns = scaled_ns(4e3, s),  /* mlx5 rate_reduce_monitor_period */
		.min_dec_factor = 0.5,                       /* mlx5 rpg_min_dec_fac 50 */
		.cnp_interval_ns = scaled_ns(50e3, s),       /* paper N = 50 us */
	};
}

void dcqcn_init(struct dcqcn_state *s, const struct dcqcn_params *p, uint64_t now_ns)
{
	(void)now_ns;   /* nothing runs before the first CNP: its time starts the timers */
	*s = (struct dcqcn_state){
		.p = *p,
		.rc_bps = p->line_rate_bps,     /* no slow start: a QP begins at line rate */
		.rt_bps = p->line_rate_bps,
		.alpha = 1.0,                   /* mlx5 initial_alpha_value 1023/1024 */
		.next_timer_ns = NEVER,         /* nothing to recover until the first cut */
		.next_alpha_ns = NEVER,
	};
}

static uint64_t pending_cut_ns(const struct dcqcn_state *s)
{
	return s->cut_pending ? sum(s->last_cut_ns, s->p.rate_reduce_period_ns) : NEVER;
}

uint64_t dcqcn_next_event_ns(const struct dcqcn_state *s)
{
	uint64_t t = s->next_timer_ns;
	uint64_t cut = pending_cut_ns(s);

	if (s->next_alpha_ns < t)
		t = s->next_alpha_ns;
	return cut < t ? cut : t;
}

/*
 * A rate decrease (the paper's equation 1, with mlx5's two floors):
 *   Rt = Rc; Rc = max(min_rate, Rc * max(1 - alpha/2, min_dec_factor)); alpha = (1-g)*alpha + g
 * then the increase stages start over: T = BC = 0, and the rate timer, byte counter and alpha
 * timer restart from this cut.
 */
static void cut(struct dcqcn_state *s, uint64_t now_ns)
{
	const struct dcqcn_params *p = &s->p;
	double rc = s->rc_bps * (1.0 - s->alpha / 2.0);

	if (rc < s->rc_bps * p->min_dec_factor)
		rc = s->rc_bps * p->min_dec_factor;
	if (rc < p->min_rate_bps)
		rc = p->min_rate_bps;
	if (rc > p->line_rate_bps)
		rc = p->line_rate_bps;
	s->rt_bps = s->rc_bps;
	s->rc_bps = rc;
	s->alpha = (1.0 - p->g) * s->alpha + p->g;
	s->timer_events = 0;
	s->byte_events = 0;
	s->bytes_since_event = 0;
	s->next_timer_ns = after(now_ns, p->timer_ns);
	s->next_alpha_ns = after(now_ns, p->alpha_period_ns);
	s->last_cut_ns = now_ns;
	s->cut_pending = 0;
	s->cuts++;
}

/*
 * One rate-increase event, after the timer (T) or the byte counter (BC) has counted it: the
 * rule of the paper's RP state machine (its figure of the RP algorithm, after QCN):
 *   max(T, BC) < F:  fast recovery    Rc = (Rt + Rc) / 2
 *   min(T, BC) > F:  hyper increase   Rt += i * R_HAI, i = min(T, BC) - F;  Rc = (Rt + Rc) / 2
 *   otherwise:       additive         Rt += R_AI;                           Rc = (Rt + Rc) / 2
 * with Rt and Rc never above the line rate.
 */
static void increase(struct dcqcn_state *s)
{
	const struct dcqcn_params *p = &s->p;
	uint32_t hi = s->timer_events > s->byte_events ? s->timer_events : s->byte_events;
	uint32_t lo = s->timer_events < s->byte_events ? s->timer_events : s->byte_events;

	if (hi < p->fast_recovery_steps)
		;                               /* fast recovery: Rt stays */
	else if (lo > p->fast_recovery_steps)
		s->rt_bps += (double)(lo - p->fast_recovery_steps) * p->hai_rate_bps;
	else
		s->rt_bps += p->ai_rate_bps;
	if (s->rt_bps > p->line_rate_bps)
		s->rt_bps = p->line_rate_bps;
	s->rc_bps = (s->rt_bps + s->rc_bps) / 2.0;
	if (s->rc_bps > p->line_rate_bps)
		s->rc_bps = p->line_rate_bps;
}

static void count(uint32_t *events)
{
	if (*events < UINT32_MAX)
		(*events)++;
}

void dcqcn_advance(struct dcqcn_state *s, uint64_t now_ns)
{
	for (;;) {
		uint64_t t = dcqcn_next_event_ns(s);

		if (t == NEVER || t > now_ns)
			return;
		if (t == s->next_timer_ns) {            /* the rate timer: T++, an increase */
			s->next_timer_ns = after(t, s->p.timer_ns);
			count(&s->timer_events);
			increase(s);
		} else if (t == s->next_alpha_ns) {     /* a period K with no CNP */
			s->next_alpha_ns = after(t, s->p.alpha_period_ns);
			s->alpha *= 1.0 - s->p.g;
		} else {                                /* rate_reduce_period ended: the cut */
			cut(s, t);
		}
	}
}

void dcqcn_on_cnp(struct dcqcn_state *s, uint64_t now_ns)
{
	dcqcn_advance(s, now_ns);
	s->cnps++;
	if (s->cuts > 0 && now_ns < sum(s->last_cut_ns, s->p.rate_reduce_period_ns)) {
		/*
		 * rate_reduce_monitor_period: at most one cut per period; the CNPs within it
		 * make one cut when it ends. A CNP is feedback, so alpha does not decay for
		 * a period K after it even while its cut waits.
		 */
		s->cut_pending = 1;
		s->next_alpha_ns = after(now_ns, s->p.alpha_period_ns);
		return;
	}
	cut(s, now_ns);
}

void dcqcn_on_sent(struct dcqcn_state *s, uint64_t bytes, uint64_t now_ns)
{
	dcqcn_advance(s, now_ns);
	if (s->cuts == 0 || s->p.byte_counter == 0)
		return;                         /* at line rate since the start: nothing to recover */
	s->bytes_since_event += bytes;
	while (s->bytes_since_event >= s->p.byte_counter) {
		s->bytes_since_event -= s->p.byte_counter;
		count(&s->byte_events);
		increase(s);
	}
}
