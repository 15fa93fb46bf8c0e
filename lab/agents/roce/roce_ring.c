// SPDX-License-Identifier: GPL-2.0
/*
 * roce_ring: one rank ("GPU") of a data-parallel training job whose gradients are
 * all-reduced by a ring over the software RoCEv2 transport, as NCCL's ring does over RDMA:
 * every step the rank computes (waits), then runs a ring All-Reduce of --size bytes:
 * reduce-scatter then all-gather, 2(N-1) sub-steps; in each it RDMA WRITEs a chunk of
 * size/N bytes to the next rank, and it starts the next sub-step only once the previous
 * rank's chunk of this one has arrived. That dependency is what makes one slow hop stall
 * every rank. Nothing is added up (a GPU reduces far faster than the network delivers) and
 * the payload is zeros, as in roce_bw. The JSON is the TCP ring's (lab/agents/worker.py,
 * "Ring JSON") where it applies; README.md beside this file says what differs.
 *
 * One requester QP to the next rank, one responder for the previous rank's QP, served by
 * host.c's one-thread event loop: the rank answers its previous rank while it computes, as
 * a NIC does while its GPU is busy.
 *
 * The start barrier runs over the transport itself, as the TCP ring's dissemination
 * barrier: N-1 rounds of a token, a TOKEN_BYTES RDMA WRITE, the rank's k-th leaving only
 * once the previous rank's (k-1)-th arrived, so its (N-1)-th arriving proves every rank is
 * up. The first token is the "hello": sent again every HELLO_RTO_NS until the next rank
 * answers (its program may not run yet), and the previous rank's makes the responder.
 * Then the QP carries the chunks, its PSNs continuing from the tokens'.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "host.h"
#include "qp.h"
#include "wire.h"

/* The barrier QP's retransmission timer: how often the hello goes again while the next
 * rank is not up. */
#define HELLO_RTO_NS 50000000ull
/* After the last step the rank answers its previous rank this long (plus every retry of
 * the last chunk's last packet): an ACK of ours that was lost must be sent again. */
#define LINGER_NS 500000000ull
#define CLOCK_OFFSET_ENV "FABRICLAB_CLOCK_OFFSET_S"
/* A token's size. Not zero: the responder is made by the first message only, the one at
 * ROCE_VA_BASE (message m writes at base + m * size), so a later token that overtakes a
 * lost hello is dropped, not taken for the stream's start (which would lose the hello's
 * count while the cumulative ACK told the sender it arrived). */
#define TOKEN_BYTES 4

struct opts {
	int rank, world;
	const char *next_ip, *prev_ip, *bind_ip, *out;
	uint16_t src_port;
	uint64_t size;
	uint32_t steps, warmup;
	double compute_s, rate_mbps, rto_ms, connect_timeout_s, io_timeout_s;
	int cc_dcqcn, placement_ooo;
	uint32_t mtu, tx_depth, dscp, retry_cnt, spray, reorder_pkts;
};

struct step {
	uint64_t t_start, t_compute_end, t_comm_start, t_comm_end;
	uint64_t retrans;
};

enum phase { BARRIER, COMPUTE, COMM, LINGER, DONE };

struct ring {
	struct opts o;
	struct host h;
	struct qp_requester req;   /* the barrier's QP (its tokens), then the chunks' (data_qp) */
	int data_qp;
	uint32_t next, prev, bind, qpn;
	uint64_t chunk;            /* bytes per sub-step */
	uint64_t subs;             /* sub-steps per All-Reduce: 2(N-1) */
	uint64_t tokens;           /* the start barrier's messages: N-1 */
	enum phase phase;
	uint64_t t0, t_ready, t_close;
	uint64_t deadline;         /* the phase's: compute end, a timeout, the linger's end */
	uint64_t progress_mark, last_progress;
	struct step *steps;        /* the steps done */
	uint32_t nsteps;
	struct step cur;
	uint64_t retrans0;
	double clock_offset_s;
	char why[320];
};

/* ---- options ---- */

static void usage(FILE *f)
{
	fprintf(f,
		"usage: roce_ring --rank R --world N --next IP --prev IP --bind IP --size BYTES\n"
		"                 --steps K --out FILE [--src-port P] [--warmup 1]\n"
		"                 [--compute-s 0.1] [--rate-mbps 100] [--cc dcqcn|none]\n"
		"                 [--mtu 1024] [--rto-ms 4] [--retry-cnt 7] [--tx-depth 16]\n"
		"                 [--dscp 26] [--connect-timeout-s 30] [--io-timeout-s 60]\n"
		"                 [--spray N] [--placement gbn|ooo] [--reorder-pkts 64]\n");
}

static uint32_t ip_opt(const char *name, const char *s)
{
	struct in_addr in;
	if (inet_pton(AF_INET, s, &in) != 1) {
		char why[160];
		snprintf(why, sizeof(why), "'%s' is not an IPv4 address", s);
		host_bad_opt(name, why);
	}
	return ntohl(in.s_addr);
}

static void parse_one(struct opts *o, int c)
{
	switch (c) {
	case 'r': o->rank = (int)host_int_opt("rank", optarg, 0, 4095); break;
	case 'W': o->world = (int)host_int_opt("world", optarg, 2, 4096); break;
	case 'n': o->next_ip = optarg; break;
	case 'p': o->prev_ip = optarg; break;
	case 'B': o->bind_ip = optarg; break;
	case 'P': o->src_port = (uint16_t)host_int_opt("src-port", optarg, 1, 65535); break;
	case 's': o->size = host_int_opt("size", optarg, 1, 1u << 30); break;
	case 'k': o->steps = (uint32_t)host_int_opt("steps", optarg, 1, 1e6); break;
	case 'w': o->warmup = (uint32_t)host_int_opt("warmup", optarg, 0, 1e6); break;
	case 'c': o->compute_s = host_num_opt("compute-s", optarg, 0, 3600); break;
	case 'R': o->rate_mbps = host_num_opt("rate-mbps", optarg, 0.01, 100000); break;
	case 'C':
		if (strcmp(optarg, "dcqcn") && strcmp(optarg, "none"))
			host_bad_opt("cc", "must be dcqcn or none");
		o->cc_dcqcn = !strcmp(optarg, "dcqcn");
		break;
	case 'm':
		o->mtu = (uint32_t)host_int_opt("mtu", optarg, 256, 4096);
		if (o->mtu & (o->mtu - 1))
			host_bad_opt("mtu", "must be one of 256, 512, 1024, 2048, 4096");
		break;
	case 't': o->rto_ms = host_num_opt("rto-ms", optarg, 0.01, 60000); break;
	case 'y': o->retry_cnt = (uint32_t)host_int_opt("retry-cnt", optarg, 0, 1000); break;
	case 'd': o->tx_depth = (uint32_t)host_int_opt("tx-depth", optarg, 1, 65536); break;
	case 'D': o->dscp = (uint32_t)host_int_opt("dscp", optarg, 0, 63); break;
	case 'T': o->connect_timeout_s = host_num_opt("connect-timeout-s", optarg, 0.01, 1e5);
		break;
	case 'I': o->io_timeout_s = host_num_opt("io-timeout-s", optarg, 0.01, 1e5); break;
	case 'o': o->out = optarg; break;
	default:
		host_multipath_opt(c, optarg, &o->spray, &o->placement_ooo, &o->reorder_pkts);
	}
}

/* --bind must be ours: the ICRC covers the source address, so no kernel may change it. */
static void check_bind(uint32_t addr)
{
	int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(addr)};
	if (s < 0)
		host_die("UDP socket");
	if (bind(s, (struct sockaddr *)&sa, sizeof(sa)))
		host_bad_opt("bind", errno == EADDRNOTAVAIL ? "not an address of this host" :
			     strerror(errno));
	close(s);
}

static void check_opts(const struct opts *o)
{
	if (o->rank < 0)
		host_bad_opt("rank", "is required");
	if (!o->world)
		host_bad_opt("world", "is required");
	if (!o->next_ip || !o->prev_ip || !o->bind_ip)
		host_bad_opt(!o->next_ip ? "next" : !o->prev_ip ? "prev" : "bind", "is required");
	if (!o->size)
		host_bad_opt("size", "is required");
	if (!o->steps)
		host_bad_opt("steps", "is required");
	if (!o->out)
		host_bad_opt("out", "is required");
	if (o->rank >= o->world)
		host_bad_opt("rank", "must be below --world");
	if (o->size % (uint64_t)o->world)
		host_bad_opt("size", "must be a multiple of --world (equal chunks)");
	if (o->spray > 1 && !o->src_port)
		host_bad_opt("spray", "needs --src-port: the sprayed ports are P .. P + N - 1");
	if (o->src_port && o->spray > 1 && o->src_port + o->spray - 1 > 65535)
		host_bad_opt("spray", "P + N - 1 must stay a port number");
}

static void parse_opts(int argc, char **argv, struct opts *o)
{
	static const struct option longs[] = {
		{"rank", required_argument, 0, 'r'}, {"world", required_argument, 0, 'W'},
		{"next", required_argument, 0, 'n'}, {"prev", required_argument, 0, 'p'},
		{"bind", required_argument, 0, 'B'}, {"src-port", required_argument, 0, 'P'},
		{"size", required_argument, 0, 's'}, {"steps", required_argument, 0, 'k'},
		{"warmup", required_argument, 0, 'w'}, {"compute-s", required_argument, 0, 'c'},
		{"rate-mbps", required_argument, 0, 'R'}, {"cc", required_argument, 0, 'C'},
		{"mtu", required_argument, 0, 'm'}, {"rto-ms", required_argument, 0, 't'},
		{"retry-cnt", required_argument, 0, 'y'}, {"tx-depth", required_argument, 0, 'd'},
		{"dscp", required_argument, 0, 'D'},
		{"connect-timeout-s", required_argument, 0, 'T'},
		{"io-timeout-s", required_argument, 0, 'I'}, {"out", required_argument, 0, 'o'},
		{"spray", required_argument, 0, 'Y'}, {"placement", required_argument, 0, 'O'},
		{"reorder-pkts", required_argument, 0, 'K'},
		{"help", no_argument, 0, 'h'},
		{0, 0, 0, 0}};
	*o = (struct opts){.rank = -1, .warmup = 1, .compute_s = 0.1, .rate_mbps = 100,
			   .cc_dcqcn = 1, .mtu = 1024, .rto_ms = 4, .retry_cnt = 7,
			   .tx_depth = 16, .dscp = 26, .connect_timeout_s = 30,
			   .io_timeout_s = 60, .spray = 1, .reorder_pkts = HOST_REORDER_PKTS};
	opterr = 0;
	int c, idx;
	while ((c = getopt_long(argc, argv, "", longs, &idx)) != -1) {
		if (c == 'h') {
			usage(stdout);
			exit(0);
		}
		if (c == '?' || c == ':') {
			fprintf(stderr, "roce_ring: %s: unknown option or missing value\n",
				argv[optind - 1]);
			exit(2);
		}
		parse_one(o, c);
	}
	if (optind < argc) {
		fprintf(stderr, "roce_ring: %s: unexpected argument (options only)\n",
			argv[optind]);
		exit(2);
	}
	check_opts(o);
}

/* ---- time ---- */

static double stamp(const struct ring *g, uint64_t ns)
{
	return (double)ns / 1e9 - g->clock_offset_s;
}

static uint64_t ns_of(double s)
{
	return (uint64_t)(s * 1e9);
}

/* ---- the queue pair ---- */

static struct qp_config qp_config(const struct ring *g, uint64_t msg_size, uint32_t psn)
{
	const struct opts *o = &g->o;
	return (struct qp_config){
		.mtu = o->mtu, .msg_size = msg_size, .tx_depth = o->tx_depth, .iters = 1,
		.ackreq_every = 64, .rto_ns = ns_of(o->rto_ms / 1e3), .retry_cnt = o->retry_cnt,
		.start_psn = psn, .cc_dcqcn = o->cc_dcqcn, .line_rate_bps = o->rate_mbps * 1e6,
		.burst_pkts = 4, .sport = roce_udp_sport(g->qpn, o->src_port, 0, 0),
		.spray = o->spray};
}

static void start_barrier(struct ring *g, uint64_t now)
{
	struct qp_config c = qp_config(g, TOKEN_BYTES, 0);
	c.rto_ns = HELLO_RTO_NS;
	c.retry_cnt = UINT32_MAX;  /* the connect timeout ends it, not the QP */
	c.cc_dcqcn = 0;
	c.spray = 0;               /* the tokens on the QP's own port: no reordering to wait out */
	if (qp_req_init(&g->req, &c, g->qpn, g->qpn + 1, now)) {
		fprintf(stderr, "roce_ring: out of memory\n");
		exit(1);
	}
}

/* The chunks' QP in the barrier's place: the same QPN, its PSNs continuing, the counters
 * a NIC keeps carried over (its messages count chunks only). Posts the first chunk. */
static void start_data_qp(struct ring *g, uint64_t now)
{
	struct qp_req_counters was = g->req.n;
	uint32_t psn = roce_psn_add(g->req.c.start_psn, (uint32_t)(g->req.max_sent &
								       ROCE_PSN_MASK));
	qp_req_free(&g->req);
	struct qp_config c = qp_config(g, g->chunk, psn);
	if (qp_req_init(&g->req, &c, g->qpn, g->qpn + 1, now)) {
		fprintf(stderr, "roce_ring: out of memory\n");
		exit(1);
	}
	struct qp_req_counters *n = &g->req.n;
	n->packets_sent = was.packets_sent;
	n->payload_bytes_sent = was.payload_bytes_sent;
	n->wire_bytes_sent = was.wire_bytes_sent;
	n->retransmitted_packets = was.retransmitted_packets;
	n->acks_received = was.acks_received;
	n->naks_received = was.naks_received;
	n->cnps_received = was.cnps_received;
	n->rto_events = was.rto_events;
	g->data_qp = 1;
}

/* Messages the previous rank's QP has delivered: its tokens, then its chunks. */
static uint64_t received(const struct ring *g)
{
	return g->h.npeers ? g->h.peers[0].r.n.messages_received : 0;
}

static uint64_t chunks_received(const struct ring *g)
{
	uint64_t got = received(g);
	return got > g->tokens ? got - g->tokens : 0;
}

/* ---- the phases ---- */

static void start_step(struct ring *g, uint64_t now)
{
	memset(&g->cur, 0, sizeof(g->cur));
	g->cur.t_start = now;
	g->retrans0 = g->req.n.retransmitted_packets;
	g->phase = COMPUTE;
	g->deadline = now + ns_of(g->o.compute_s);
}

/* Token k goes once the previous rank's token k-1 arrived; the barrier is done when all
 * of its tokens arrived and all of ours were acknowledged. */
static const char *barrier_check(struct ring *g, uint64_t now)
{
	uint64_t got = received(g), done = g->req.n.messages_completed;
	qp_req_post_upto(&g->req, got + 1 < g->tokens ? got + 1 : g->tokens, now);
	if (got >= g->tokens && done >= g->tokens) {
		g->t_ready = now;
		start_step(g, now);
		return NULL;
	}
	g->deadline = g->t0 + ns_of(g->o.connect_timeout_s);
	if (now < g->deadline)
		return NULL;
	int answered = done > 0, greeted = got > 0;
	if (!answered && !greeted)
		snprintf(g->why, sizeof(g->why), "neither did the next rank (%s) answer nor did "
			 "the previous rank (%s) say hello within %g s", g->o.next_ip,
			 g->o.prev_ip, g->o.connect_timeout_s);
	else if (!answered)
		snprintf(g->why, sizeof(g->why), "the next rank (%s) did not answer the hello "
			 "within %g s", g->o.next_ip, g->o.connect_timeout_s);
	else if (!greeted)
		snprintf(g->why, sizeof(g->why), "no hello from the previous rank (%s) within "
			 "%g s", g->o.prev_ip, g->o.connect_timeout_s);
	else
		snprintf(g->why, sizeof(g->why), "the start barrier did not complete within %g s "
			 "(%llu of %llu tokens from the previous rank): a rank further round the "
			 "ring is not up", g->o.connect_timeout_s, (unsigned long long)got,
			 (unsigned long long)g->tokens);
	return g->why;
}

static void start_comm(struct ring *g, uint64_t now)
{
	g->cur.t_compute_end = g->cur.t_comm_start = now;
	if (!g->data_qp)
		start_data_qp(g, now);
	else
		qp_req_post_upto(&g->req, (uint64_t)g->nsteps * g->subs + 1, now);
	g->phase = COMM;
	g->last_progress = now;
}

static void finish_step(struct ring *g, uint64_t now)
{
	g->cur.t_comm_end = now;
	g->cur.retrans = g->req.n.retransmitted_packets - g->retrans0;
	g->steps[g->nsteps++] = g->cur;
	if (g->nsteps < g->o.steps) {
		start_step(g, now);
		return;
	}
	g->phase = LINGER;
	g->deadline = now + LINGER_NS + (g->o.retry_cnt + 1) * ns_of(g->o.rto_ms / 1e3);
}

/* Sub-step k's chunk goes once the previous rank's chunk k-1 is here; the All-Reduce is
 * done when every chunk of the step arrived and every one sent was acknowledged. */
static const char *comm_check(struct ring *g, uint64_t now)
{
	uint64_t base = (uint64_t)g->nsteps * g->subs, got = chunks_received(g);
	uint64_t here = got > base ? got - base : 0;
	if (here > g->subs)
		here = g->subs;
	uint64_t acked = g->req.n.messages_completed;
	qp_req_post_upto(&g->req, base + (here < g->subs ? here + 1 : g->subs), now);
	if (got + acked != g->progress_mark) {
		g->progress_mark = got + acked;
		g->last_progress = now;
	}
	if (here == g->subs && acked >= base + g->subs) {
		finish_step(g, now);
		return NULL;
	}
	g->deadline = g->last_progress + ns_of(g->o.io_timeout_s);
	if (now < g->deadline)
		return NULL;
	if (here < g->subs)
		snprintf(g->why, sizeof(g->why), "step %u, sub-step %llu of %llu: no chunk from "
			 "the previous rank (%s) for %g s", g->nsteps, (unsigned long long)here,
			 (unsigned long long)g->subs, g->o.prev_ip, g->o.io_timeout_s);
	else
		snprintf(g->why, sizeof(g->why), "step %u: the next rank (%s) acknowledged "
			 "nothing for %g s", g->nsteps, g->o.next_ip, g->o.io_timeout_s);
	return g->why;
}

static const char *advance(struct ring *g, uint64_t now)
{
	switch (g->phase) {
	case BARRIER:
		return barrier_check(g, now);
	case COMPUTE:
		if (now >= g->deadline)
			start_comm(g, now);
		return NULL;
	case COMM:
		return comm_check(g, now);
	case LINGER:
		if (now >= g->deadline)
			g->phase = DONE;
		return NULL;
	case DONE:
		break;
	}
	return NULL;
}

/* ---- JSON ---- */

static void json_params(FILE *f, const struct ring *g)
{
	const struct opts *o = &g->o;
	fprintf(f, "  \"mode\": \"ring\", \"transport\": \"roce\", \"rank\": %d, \"world\": %d, "
		"\"size_bytes\": %llu, \"chunk_bytes\": %llu, \"buckets\": 1, \"cc\": \"%s\", "
		"\"clock\": \"monotonic\",\n", o->rank, o->world, (unsigned long long)o->size,
		(unsigned long long)g->chunk, o->cc_dcqcn ? "dcqcn" : "none");
	fprintf(f, "  \"next\": \"%s\", \"prev\": \"%s\", \"bind\": \"%s\", \"src_port\": %u, "
		"\"steps_requested\": %u, \"warmup\": %u, \"compute_s\": %g, \"epoch_steps\": 0,\n",
		o->next_ip, o->prev_ip, o->bind_ip, g->req.c.sport, o->steps, o->warmup,
		o->compute_s);
	fprintf(f, "  \"rate_mbps\": %g, \"mtu\": %u, \"rto_ms\": %g, \"retry_cnt\": %u, "
		"\"tx_depth\": %u, \"dscp\": %u, \"connect_timeout_s\": %g, "
		"\"io_timeout_s\": %g,\n", o->rate_mbps, o->mtu, o->rto_ms, o->retry_cnt,
		o->tx_depth, o->dscp, o->connect_timeout_s, o->io_timeout_s);
	fprintf(f, "  \"spray\": %u, \"placement\": \"%s\", \"reorder_pkts\": %u,\n", o->spray,
		o->placement_ooo ? "ooo" : "gbn", o->reorder_pkts);
}

static void json_steps(FILE *f, const struct ring *g)
{
	fprintf(f, "  \"steps\": [");
	for (uint32_t i = 0; i < g->nsteps; i++) {
		const struct step *s = &g->steps[i];
		double compute = (double)(s->t_compute_end - s->t_start) / 1e9;
		double comm = (double)(s->t_comm_end - s->t_comm_start) / 1e9;
		double step = (double)(s->t_comm_end - s->t_start) / 1e9;
		fprintf(f, "%s\n    {\"step\": %u, \"epoch\": 0, \"warmup\": %s, "
			"\"t_start\": %.6f, \"t_compute_end\": %.6f, \"t_comm_start\": %.6f, "
			"\"t_comm_end\": %.6f, \"t_end\": %.6f,\n     \"compute_s\": %.6f, "
			"\"comm_s\": %.6f, \"barrier_s\": 0, \"step_s\": %.6f, \"idle_s\": %.6f, "
			"\"data_wait_s\": 0, \"exposed_comm_s\": %.6f, \"retrans\": %llu}",
			i ? "," : "", i, i < g->o.warmup ? "true" : "false",
			stamp(g, s->t_start), stamp(g, s->t_compute_end),
			stamp(g, s->t_comm_start), stamp(g, s->t_comm_end),
			stamp(g, s->t_comm_end), compute, comm, step, step - compute, comm,
			(unsigned long long)s->retrans);
	}
	fprintf(f, "\n  ],\n");
}

static void json_qp(FILE *f, struct ring *g)
{
	char src[INET_ADDRSTRLEN];
	host_ip_str(g->bind, src);
	fprintf(f, "  \"connections\": [{\"epoch\": 0, \"src\": \"%s\", \"sport\": %u, "
		"\"dst\": \"%s\", \"dport\": %d, \"qpn\": %u, \"dqpn\": %u, \"t_open\": %.6f, "
		"\"t_close\": %.6f}],\n", src, g->req.c.sport, g->o.next_ip, ROCE_UDP_PORT,
		g->req.qpn, g->req.dqpn, stamp(g, g->t0), stamp(g, g->t_close));
	fprintf(f, "  \"qp\": {\"requester\":\n");
	host_json_requester(f, &g->req);
	fprintf(f, ",\n   \"responder\":");
	if (g->h.npeers) {
		fprintf(f, "\n");
		host_json_responder(f, &g->h.peers[0], g->t0);
	} else {
		fprintf(f, " null");
	}
	fprintf(f, "}\n");
}

static void write_json(struct ring *g, const char *error)
{
	char *tmp;
	FILE *f = host_json_open(g->o.out, &tmp);
	struct rusage ru;
	getrusage(RUSAGE_SELF, &ru);
	double cpu = (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 +
		     (double)ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6;
	fprintf(f, "{\n");
	json_params(f, g);
	fprintf(f, "  \"t_ready\": ");
	if (g->t_ready)
		fprintf(f, "%.6f", stamp(g, g->t_ready));
	else
		fprintf(f, "null");
	fprintf(f, ", \"cpu_s\": %.4f, \"error\": ", cpu);
	if (error)
		host_json_str(f, error);
	else
		fprintf(f, "null");
	fprintf(f, ", \"stopped_by_signal\": %s,\n  ", host_stop_signal ? "true" : "false");
	HOST_U64(f, "unknown_qp_packets", g->h.unknown_qp_packets); fprintf(f, ", ");
	HOST_U64(f, "malformed_packets", g->h.malformed_packets); fprintf(f, ", ");
	HOST_U64(f, "send_errors", g->h.send_errors); fprintf(f, ", ");
	HOST_U64(f, "tx_blocked", g->h.tx_blocked); fprintf(f, ",\n");
	HOST_U64(f, "tx_refused", g->h.tx_refused); fprintf(f, ",\n");
	json_steps(f, g);
	json_qp(f, g);
	fprintf(f, "}\n");
	host_json_close(f, tmp, g->o.out);
}

/* ---- the program ---- */

static int run(struct ring *g)
{
	const char *error = NULL;
	g->t0 = host_now_ns();
	start_barrier(g, g->t0);
	for (;;) {
		if (g->h.readable)
			host_receive(&g->h);
		uint64_t now = host_now_ns();
		qp_req_advance(&g->req, now);
		if (g->req.state == QP_ERROR) {
			snprintf(g->why, sizeof(g->why), "step %u: the QP to the next rank (%s): %s",
				 g->nsteps, g->o.next_ip, g->req.error);
			error = g->why;
			break;
		}
		if (host_stop_signal)
			break;
		error = advance(g, now);
		if (error || g->phase == DONE)
			break;
		host_send_ready(&g->h, now);
		host_flush(&g->h);
		uint64_t wake = host_next_wake(&g->h, now);
		host_wait(&g->h, g->deadline < wake ? g->deadline : wake);
	}
	host_flush(&g->h);
	g->t_close = host_now_ns();
	write_json(g, error);
	if (error) {
		fprintf(stderr, "roce_ring: %s\n", error);
		return 1;
	}
	return 0;
}

static double clock_offset(void)
{
	const char *s = getenv(CLOCK_OFFSET_ENV);
	if (!s || !*s)
		return 0;
	char *end;
	errno = 0;
	double v = strtod(s, &end);
	if (errno || *end) {
		fprintf(stderr, "roce_ring: %s: '%s' is not a number\n", CLOCK_OFFSET_ENV, s);
		exit(2);
	}
	return v;
}

int main(int argc, char **argv)
{
	static struct ring ring;
	struct ring *g = &ring;
	host_prog = "roce_ring";
	parse_opts(argc, argv, &g->o);
	g->next = ip_opt("next", g->o.next_ip);
	g->prev = ip_opt("prev", g->o.prev_ip);
	g->bind = ip_opt("bind", g->o.bind_ip);
	check_bind(g->bind);
	g->clock_offset_s = clock_offset();
	g->chunk = g->o.size / (uint64_t)g->o.world;
	g->subs = 2 * (uint64_t)(g->o.world - 1);
	g->tokens = (uint64_t)(g->o.world - 1);
	g->steps = calloc(g->o.steps, sizeof(*g->steps));
	if (!g->steps)
		host_die("calloc");
	host_process_init();
	/* The QPN from the PID, as roce_bw's: a restarted rank is a new connection. */
	g->qpn = 0x100 + (uint32_t)(getpid() % 32768) * 256;
	g->h.req = &g->req;
	g->h.nreq = 1;
	g->h.qpn_base = g->qpn;
	g->h.local_addr = g->bind;
	g->h.remote_addr = g->next;
	g->h.src_port = g->o.src_port;
	g->h.dscp = (uint8_t)g->o.dscp;
	g->h.peer_only = g->prev;
	g->h.placement_ooo = g->o.placement_ooo;
	g->h.reorder_pkts = g->o.reorder_pkts;
	host_init(&g->h, g->o.rate_mbps, 4, g->o.mtu, 100, 1);
	host_open_sockets(&g->h);
	return run(g);
}
