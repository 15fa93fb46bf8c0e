// SPDX-License-Identifier: GPL-2.0
/*
 * One RC queue pair's requester and responder: see qp.h. Written from the InfiniBand
 * Architecture Specification's RC rules (C9-*), simplified where the README says.
 */
#include "qp.h"

#include <stdlib.h>
#include <string.h>

/* ---- pacer ---- */

void pacer_init(struct pacer *p, double rate_bps, double burst_bytes, uint64_t now_ns)
{
	p->rate_bps = rate_bps;
	p->burst = burst_bytes;
	p->tokens = 0;
	p->last_ns = now_ns;
}

void pacer_refill(struct pacer *p, uint64_t now_ns)
{
	if (now_ns > p->last_ns) {
		p->tokens += (double)(now_ns - p->last_ns) * p->rate_bps / 8e9;
		if (p->tokens > p->burst)
			p->tokens = p->burst;
	}
	p->last_ns = now_ns;
}

uint64_t pacer_ready_at(const struct pacer *p, double bytes, uint64_t now_ns)
{
	if (p->tokens >= bytes)
		return now_ns;
	if (p->rate_bps <= 0)
		return UINT64_MAX;
	/* Round up: waking a nanosecond early would find the bucket still short. */
	return now_ns + (uint64_t)((bytes - p->tokens) * 8e9 / p->rate_bps) + 1;
}

void pacer_take(struct pacer *p, double bytes)
{
	p->tokens -= bytes;
}

/* ---- requester ---- */

uint16_t roce_udp_sport(uint32_t qpn, uint16_t base, uint64_t seq, uint32_t spray)
{
	uint32_t entropy = spray > 1 ? (uint32_t)(seq % spray) : 0;
	if (base)
		return (uint16_t)(base + entropy);
	/* A multiplicative hash spreads consecutive QPNs (and a sprayed QP's entropy values)
	 * over the dynamic port range, so a switch's ECMP hash sees them as different flows,
	 * as an RNIC's per-QP entropy does. */
	uint32_t h = ((qpn & ROCE_QPN_MASK) + entropy * 0x10001u) * 2654435761u;
	return (uint16_t)(49152 + (h >> 18));
}

/* A message's last packet: its completion at the requester, its MSN at the responder. */
static int ends_message(uint8_t opcode)
{
	return opcode == ROCE_OP_WRITE_LAST || opcode == ROCE_OP_WRITE_ONLY;
}

static uint32_t seq_psn(const struct qp_requester *q, uint64_t seq)
{
	return roce_psn_add(q->c.start_psn, (uint32_t)(seq & ROCE_PSN_MASK));
}

/* The unwrapped sequence number of a PSN an ACK/NAK carries, taken as the nearest one to
 * una: a responder only ever names packets within the window we sent. -1 for a PSN before
 * the QP's first packet, which no answer to this QP names: a late answer to an earlier QP
 * that used the same QPN (roce_ring's hello). */
static int psn_seq(const struct qp_requester *q, uint32_t psn, uint64_t *seq)
{
	int32_t d = roce_psn_diff(psn, seq_psn(q, q->una));
	if (d < 0 && (uint64_t)(-(int64_t)d) > q->una)
		return -1;
	*seq = (uint64_t)((int64_t)q->una + d);
	return 0;
}

static uint64_t posted_end(const struct qp_requester *q)
{
	return q->n.messages_posted * q->pkts_per_msg;
}

static void post_messages(struct qp_requester *q, uint64_t now_ns)
{
	while (q->posting && q->n.messages_posted - q->n.messages_completed < q->c.tx_depth &&
	       (q->c.iters == 0 || q->n.messages_posted < q->c.iters)) {
		q->post_ns[q->n.messages_posted % q->c.tx_depth] = now_ns;
		q->n.messages_posted++;
	}
}

int qp_req_init(struct qp_requester *q, const struct qp_config *c, uint32_t qpn,
		uint32_t dqpn, uint64_t now_ns)
{
	memset(q, 0, sizeof(*q));
	q->c = *c;
	q->qpn = qpn & ROCE_QPN_MASK;
	q->dqpn = dqpn & ROCE_QPN_MASK;
	q->state = QP_RTS;
	q->pkts_per_msg = (uint32_t)((c->msg_size + c->mtu - 1) / c->mtu);
	if (q->pkts_per_msg == 0)
		q->pkts_per_msg = 1;
	q->posting = 1;
	q->start_ns = now_ns;
	q->post_ns = calloc(c->tx_depth, sizeof(*q->post_ns));
	q->samples = calloc(QP_MAX_SAMPLES, sizeof(*q->samples));
	if (!q->post_ns || !q->samples) {
		qp_req_free(q);
		return -1;
	}
	struct dcqcn_params p;
	dcqcn_default_params(&p, c->line_rate_bps);
	dcqcn_init(&q->cc, &p, now_ns);
	size_t full = ROCE_IPV4_LEN + ROCE_UDP_LEN + ROCE_BTH_LEN + ROCE_RETH_LEN + c->mtu +
		      ROCE_ICRC_LEN + ROCE_ETH_OVERHEAD;
	pacer_init(&q->pace, qp_req_rate_bps(q), (double)(c->burst_pkts * full), now_ns);
	q->next_sample_ns = now_ns;
	post_messages(q, now_ns);
	return 0;
}

void qp_req_free(struct qp_requester *q)
{
	free(q->post_ns);
	free(q->samples);
	free(q->lat_ns);
	q->post_ns = NULL;
	q->samples = NULL;
	q->lat_ns = NULL;
}

void qp_req_stop_posting(struct qp_requester *q)
{
	q->posting = 0;
}

void qp_req_post_upto(struct qp_requester *q, uint64_t iters, uint64_t now_ns)
{
	if (q->c.iters && iters > q->c.iters) {
		q->c.iters = iters;
		post_messages(q, now_ns);
	}
}

int qp_req_done(const struct qp_requester *q)
{
	if (q->state == QP_ERROR)
		return 1;
	if (q->n.messages_completed < q->n.messages_posted)
		return 0;
	return !q->posting || (q->c.iters && q->n.messages_completed >= q->c.iters);
}

double qp_req_rate_bps(const struct qp_requester *q)
{
	return q->c.cc_dcqcn ? q->cc.rc_bps : q->c.line_rate_bps;
}

/* Opcode and payload of packet seq: WRITE First/Middle/Last, or Only for a one-packet
 * message; every packet but a message's last carries a full MTU. */
static uint8_t pkt_shape(const struct qp_requester *q, uint64_t seq, size_t *payload)
{
	uint32_t k = (uint32_t)(seq % q->pkts_per_msg);
	uint32_t last = q->pkts_per_msg - 1;
	*payload = k < last ? q->c.mtu : (size_t)(q->c.msg_size - (uint64_t)last * q->c.mtu);
	if (last == 0)
		return ROCE_OP_WRITE_ONLY;
	return k == 0 ? ROCE_OP_WRITE_FIRST : k == last ? ROCE_OP_WRITE_LAST :
							 ROCE_OP_WRITE_MIDDLE;
}

static size_t ip_len_of(uint8_t opcode, size_t payload)
{
	return ROCE_IPV4_LEN + ROCE_UDP_LEN + ROCE_BTH_LEN + (size_t)roce_ext_len(opcode) +
	       payload + ((4 - payload % 4) % 4) + ROCE_ICRC_LEN;
}

size_t qp_req_next_len(const struct qp_requester *q)
{
	if (q->state != QP_RTS || q->send_seq >= posted_end(q))
		return 0;
	if (q->c.max_unacked && q->send_seq >= q->una + q->c.max_unacked)
		return 0;
	size_t payload;
	uint8_t op = pkt_shape(q, q->send_seq, &payload);
	return ip_len_of(op, payload);
}

uint64_t qp_req_ready_at(struct qp_requester *q, uint64_t now_ns)
{
	size_t len = qp_req_next_len(q);
	if (!len)
		return UINT64_MAX;
	q->pace.rate_bps = qp_req_rate_bps(q);
	pacer_refill(&q->pace, now_ns);
	return pacer_ready_at(&q->pace, (double)(len + ROCE_ETH_OVERHEAD), now_ns);
}

size_t qp_req_take(struct qp_requester *q, struct roce_hdr *h, size_t *payload_len,
		   uint64_t now_ns)
{
	if (!qp_req_next_len(q))
		return 0;
	uint64_t seq = q->send_seq;
	size_t payload;
	uint8_t op = pkt_shape(q, seq, &payload);
	uint64_t msg = seq / q->pkts_per_msg;
	int last = ends_message(op);

	memset(h, 0, sizeof(*h));
	h->opcode = op;
	h->pad = (uint8_t)((4 - payload % 4) % 4);
	h->pkey = ROCE_PKEY_DEFAULT;
	h->dqpn = q->dqpn;
	/* AckReq on each message's last packet (its completion) and every Nth packet, so a
	 * long message is acknowledged, and its retransmission timer restarted, as it goes. */
	h->ackreq = last || (q->c.ackreq_every && (seq + 1) % q->c.ackreq_every == 0);
	h->psn = seq_psn(q, seq);
	if (op == ROCE_OP_WRITE_FIRST || op == ROCE_OP_WRITE_ONLY) {
		h->va = ROCE_VA_BASE + msg * q->c.msg_size;
		h->rkey = ROCE_RKEY;
		h->dma_len = (uint32_t)q->c.msg_size;
	}
	*payload_len = payload;

	size_t len = ip_len_of(op, payload);
	size_t wire = len + ROCE_ETH_OVERHEAD;
	q->send_seq++;
	q->n.packets_sent++;
	q->n.payload_bytes_sent += payload;
	q->n.wire_bytes_sent += wire;
	if (seq < q->max_sent)
		q->n.retransmitted_packets++;
	else
		q->max_sent = seq + 1;
	if (h->ackreq) {
		if (seq + 1 > q->last_ackreq)
			q->last_ackreq = seq + 1;
		if (!q->rto_deadline)
			q->rto_deadline = now_ns + q->c.rto_ns;
	}
	q->pace.rate_bps = qp_req_rate_bps(q);
	pacer_refill(&q->pace, now_ns);
	pacer_take(&q->pace, (double)wire);
	if (q->c.cc_dcqcn)
		dcqcn_on_sent(&q->cc, wire, now_ns);
	return len;
}

static void record_latency(struct qp_requester *q, uint64_t ns)
{
	if (q->lat_len == q->lat_cap) {
		if (q->lat_cap >= QP_MAX_LATENCIES)
			return;
		size_t cap = q->lat_cap ? q->lat_cap * 2 : 1024;
		uint64_t *p = realloc(q->lat_ns, cap * sizeof(*p));
		if (!p)
			return;
		q->lat_ns = p;
		q->lat_cap = cap;
	}
	q->lat_ns[q->lat_len++] = ns;
}

/* Everything before new_una is acknowledged: complete the messages it covers, post more,
 * restart the timer while AckReq packets are still out. */
static void acknowledge(struct qp_requester *q, uint64_t new_una, uint64_t now_ns)
{
	if (new_una <= q->una)
		return;
	q->una = new_una;
	q->retries = 0;
	while (q->n.messages_completed < q->n.messages_posted &&
	       (q->n.messages_completed + 1) * q->pkts_per_msg <= q->una) {
		uint64_t posted = q->post_ns[q->n.messages_completed % q->c.tx_depth];
		record_latency(q, now_ns - posted);
		q->n.messages_completed++;
		q->retry_started = 0;
	}
	if (q->send_seq < q->una)
		q->send_seq = q->una;
	q->rto_deadline = q->last_ackreq > q->una ? now_ns + q->c.rto_ns : 0;
	post_messages(q, now_ns);
}

static void fail(struct qp_requester *q, const char *why)
{
	q->state = QP_ERROR;
	q->error = why;
	q->rto_deadline = 0;
}

void qp_req_on_packet(struct qp_requester *q, const struct roce_hdr *h, uint64_t now_ns)
{
	if (h->opcode == ROCE_OP_CNP) {
		q->n.cnps_received++;
		if (q->c.cc_dcqcn)
			dcqcn_on_cnp(&q->cc, now_ns);
		return;
	}
	uint64_t seq;
	if (h->opcode != ROCE_OP_ACK || q->state != QP_RTS || psn_seq(q, h->psn, &seq))
		return;
	if (ROCE_AETH_IS_NAK(h->syndrome)) {
		q->n.naks_received++;
		if ((h->syndrome & 0x1f) != 0) {
			fail(q, "the responder answered with a NAK other than PSN sequence error");
			return;
		}
		/* A PSN sequence error names the PSN the responder expects: all before it
		 * arrived; go back N and send again from it. */
		if (seq < q->una || seq > q->max_sent)
			return;
		acknowledge(q, seq, now_ns);
		if (q->c.nak_once_per_retry && q->retry_started) {
			q->n.naks_ignored++;
			return;
		}
		q->retry_started = 1;
		q->send_seq = seq;
		if (++q->retries > q->c.retry_cnt)
			fail(q, "retry count exceeded (PSN sequence errors)");
		return;
	}
	q->n.acks_received++;
	if (seq + 1 <= q->max_sent)
		acknowledge(q, seq + 1, now_ns);
}

void qp_req_advance(struct qp_requester *q, uint64_t now_ns)
{
	if (q->rto_deadline && now_ns >= q->rto_deadline && q->state == QP_RTS) {
		/* No ACK progress for rto_ns after an AckReq went out: the packet or its ACK
		 * was lost where no later packet could reveal the gap. Go back to una. */
		q->n.rto_events++;
		q->rto_deadline = 0;
		q->retry_started = 1;
		q->send_seq = q->una;
		if (++q->retries > q->c.retry_cnt)
			fail(q, "retry count exceeded (transport retry timeouts)");
	}
	if (q->c.cc_dcqcn)
		dcqcn_advance(&q->cc, now_ns);
	while (now_ns >= q->next_sample_ns && q->n_samples < QP_MAX_SAMPLES) {
		struct qp_rate_sample *s = &q->samples[q->n_samples++];
		s->t_s = (double)(q->next_sample_ns - q->start_ns) / 1e9;
		s->rc_bps = qp_req_rate_bps(q);
		s->rt_bps = q->c.cc_dcqcn ? q->cc.rt_bps : q->c.line_rate_bps;
		s->alpha = q->c.cc_dcqcn ? q->cc.alpha : 0;
		q->next_sample_ns += QP_SAMPLE_NS;
	}
}

uint64_t qp_req_next_timer(const struct qp_requester *q)
{
	uint64_t t = UINT64_MAX;
	if (q->rto_deadline)
		t = q->rto_deadline;
	if (q->c.cc_dcqcn) {
		uint64_t c = dcqcn_next_event_ns(&q->cc);
		if (c < t)
			t = c;
	}
	if (q->n_samples < QP_MAX_SAMPLES && q->next_sample_ns < t)
		t = q->next_sample_ns;
	return t;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return (x > y) - (x < y);
}

double qp_req_latency_pct(struct qp_requester *q, double pct)
{
	if (!q->lat_len)
		return -1;
	qsort(q->lat_ns, q->lat_len, sizeof(*q->lat_ns), cmp_u64);
	/* Linear interpolation between order statistics, as the lab's one percentile. */
	double pos = (double)(q->lat_len - 1) * pct / 100;
	size_t lo = (size_t)pos;
	size_t hi = lo + 1 < q->lat_len ? lo + 1 : lo;
	return (double)q->lat_ns[lo] + ((double)q->lat_ns[hi] - (double)q->lat_ns[lo]) *
					       (pos - (double)lo);
}

/* ---- responder ---- */

void qp_resp_init(struct qp_responder *r, uint32_t qpn, uint32_t peer_qpn, uint32_t epsn,
		  uint64_t cnp_interval_ns)
{
	memset(r, 0, sizeof(*r));
	r->qpn = qpn & ROCE_QPN_MASK;
	r->peer_qpn = peer_qpn & ROCE_QPN_MASK;
	r->epsn = epsn & ROCE_PSN_MASK;
	r->cnp_interval_ns = cnp_interval_ns;
}

void qp_resp_set_placement(struct qp_responder *r, int ooo, uint32_t reorder_pkts)
{
	r->ooo = ooo;
	r->reorder_pkts = reorder_pkts;
}

static int bit(const uint64_t *map, uint32_t psn)
{
	uint32_t i = psn % QP_OOO_WINDOW;
	return (int)(map[i / 64] >> (i % 64) & 1);
}

static void set_bit(uint64_t *map, uint32_t psn, int on)
{
	uint32_t i = psn % QP_OOO_WINDOW;
	if (on)
		map[i / 64] |= 1ull << (i % 64);
	else
		map[i / 64] &= ~(1ull << (i % 64));
}

static void complete_in_order(struct qp_responder *r, int last)
{
	r->epsn = roce_psn_add(r->epsn, 1);
	r->nak_outstanding = 0;
	r->nak_pending = 0;
	r->past_gap = 0;
	if (last) {
		r->msn = (r->msn + 1) & ROCE_PSN_MASK;
		r->n.messages_received++;
	}
}

/* A packet ahead of epsn, placed: remembered, counted once; after a gap's NAK threshold
 * the NAK names epsn (go-back-N resends from it; what was placed arrives as duplicates). */
static void place_ahead(struct qp_responder *r, const struct roce_hdr *h, size_t payload_len)
{
	if (bit(r->placed, h->psn)) {
		r->n.duplicates++;
		r->ack_pending = 1;
		return;
	}
	set_bit(r->placed, h->psn, 1);
	set_bit(r->last, h->psn, ends_message(h->opcode));
	r->n.payload_bytes_received += payload_len;
	r->n.placed_out_of_order++;
	if (h->ackreq)
		r->ack_pending = 1;
	if (++r->past_gap >= r->reorder_pkts && !r->nak_outstanding) {
		r->nak_outstanding = 1;
		r->nak_pending = 1;
	}
}

void qp_resp_on_data(struct qp_responder *r, const struct roce_hdr *h, size_t payload_len,
		     size_t wire_len, int ce, uint64_t now_ns)
{
	if (!r->n.packets_received)
		r->first_ns = now_ns;
	r->last_ns = now_ns;
	r->n.packets_received++;
	r->n.wire_bytes_received += wire_len;
	if (ce) {
		r->n.ce_received++;
		/* The notification point: at most one CNP per QP per interval, however many
		 * marked packets arrive (mlx5's min_time_between_cnps). */
		if (!r->cnp_ever || now_ns - r->last_cnp_ns >= r->cnp_interval_ns) {
			r->cnp_ever = 1;
			r->last_cnp_ns = now_ns;
			r->cnp_pending = 1;
		}
	}
	int32_t d = roce_psn_diff(h->psn, r->epsn);
	if (d == 0) {
		r->n.payload_bytes_received += payload_len;
		complete_in_order(r, ends_message(h->opcode));
		if (h->ackreq)
			r->ack_pending = 1;
		/* then over what was placed ahead, and one ACK says how far */
		if (r->ooo && bit(r->placed, r->epsn)) {
			while (bit(r->placed, r->epsn)) {
				int last = bit(r->last, r->epsn);
				set_bit(r->placed, r->epsn, 0);
				complete_in_order(r, last);
			}
			r->ack_pending = 1;
		}
	} else if (r->ooo && d < QP_OOO_WINDOW) {
		place_ahead(r, h, payload_len);
	} else if (d > 0) {
		/* A gap: a packet was lost. Drop this one (go-back-N will send it again) and
		 * say which PSN is expected, once, until that PSN arrives. */
		r->n.out_of_sequence++;
		if (!r->nak_outstanding) {
			r->nak_outstanding = 1;
			r->nak_pending = 1;
		}
	} else {
		/* A duplicate (a go-back resent what had arrived): drop it; the ACK of the
		 * latest PSN tells the requester where it stands. */
		r->n.duplicates++;
		r->ack_pending = 1;
	}
}

int qp_resp_response(struct qp_responder *r, struct roce_hdr *h)
{
	if (!r->ack_pending && !r->nak_pending)
		return 0;
	memset(h, 0, sizeof(*h));
	h->opcode = ROCE_OP_ACK;
	h->pkey = ROCE_PKEY_DEFAULT;
	h->dqpn = r->peer_qpn;
	h->msn = r->msn;
	if (r->nak_pending) {
		/* A NAK acknowledges everything before the PSN it names. */
		h->syndrome = ROCE_AETH_NAK_PSN_SEQ;
		h->psn = r->epsn;
		r->n.naks_sent++;
	} else {
		h->syndrome = ROCE_AETH_ACK_NO_CREDITS;
		h->psn = roce_psn_add(r->epsn, ROCE_PSN_MASK);  /* epsn - 1 */
		r->n.acks_sent++;
	}
	r->ack_pending = r->nak_pending = 0;
	return 1;
}

int qp_resp_cnp(struct qp_responder *r, struct roce_hdr *h)
{
	if (!r->cnp_pending)
		return 0;
	memset(h, 0, sizeof(*h));
	h->opcode = ROCE_OP_CNP;
	h->pkey = ROCE_PKEY_DEFAULT;
	h->dqpn = r->peer_qpn;
	r->cnp_pending = 0;
	r->n.cnps_sent++;
	return 1;
}
