// SPDX-License-Identifier: GPL-2.0
/*
 * roce_bw: RDMA WRITE bandwidth over a software RoCEv2 transport, like perftest's
 * ib_write_bw. The server answers any client's QPs; the client runs N RC QPs of fixed-size
 * messages, paced per QP (DCQCN or the line rate) and per port (the line rate), and both
 * write their counters as JSON. README.md beside this file says what is real.
 *
 * Why one thread and an event loop: the lab's hosts share 2 cores; a thread per QP would
 * cost a context switch per packet. ppoll sleeps until the next packet may go or the next
 * timer is due, with the timer slack at 1 ns so the wake is where the pacer asked.
 *
 * Why a raw socket to send: the ICRC covers the IPv4 header (its ID too), so the program
 * must write every field itself; the kernel fills in none that we set (a non-zero ID is
 * kept, the checksum is rewritten to the same value). Receiving goes through a plain UDP
 * socket on 4791, with IP_RECVTOS for the ECN bits.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <math.h>  /* isfinite: a macro, no libm needed */
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "dcqcn.h"
#include "qp.h"
#include "wire.h"

#define BATCH 64
#define MAX_QPS 128
#define MAX_RESPONDERS 4096
#define BUF_LEN (ROCE_MAX_PKT + 64)

struct opts {
	int server;
	const char *server_ip;
	const char *out;
	int qps;
	uint64_t size, iters;
	double duration_s;
	uint32_t tx_depth, mtu, dscp, ack_every, retry_cnt, burst_pkts, start_psn;
	double rate_mbps, rto_ms, drain_s, wake_us;
	int cc_dcqcn;
	uint16_t src_port;
};

/* A client's QP as the server knows it: found by (client address, QPN). */
struct peer {
	uint32_t addr;          /* the client, host order */
	uint32_t local;         /* our address it wrote to: the source of our answers */
	uint8_t dscp;           /* the data's DSCP, which our ACKs travel with */
	struct qp_responder r;
	int touched;
};

struct app {
	struct opts o;
	int rx, tx;
	uint32_t local_addr, server_addr;
	struct qp_requester req[MAX_QPS];
	int nreq, rr;
	uint32_t qpn_base;
	struct peer *peers;
	int npeers;
	int touched[BATCH];
	int ntouched;
	uint64_t unknown_qp_packets, malformed_packets, send_errors;
	uint64_t cnp_interval_ns;
	struct pacer port;
	uint16_t ip_id;
	/* packets queued for one sendmmsg */
	struct mmsghdr txm[BATCH];
	struct iovec txv[BATCH];
	struct sockaddr_in txa[BATCH];
	uint8_t (*txbuf)[BUF_LEN];
	int ntx;
	/* one recvmmsg's buffers */
	struct mmsghdr rxm[BATCH];
	struct iovec rxv[BATCH];
	struct sockaddr_in rxa[BATCH];
	uint8_t (*rxbuf)[BUF_LEN];
	uint8_t rxctl[BATCH][128];
	uint64_t t0, t_last_completion;
	uint64_t wake_ns, last_send_ns;  /* the pacer's shortest sleep, and its last send */
};

static volatile sig_atomic_t stop_signal;

static void on_signal(int sig)
{
	stop_signal = sig;
}

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void usage(FILE *f)
{
	fprintf(f,
		"usage: roce_bw --server --out FILE.json [--duration S] [--rate-mbps R]\n"
		"       roce_bw --client SERVER_IP --out FILE.json [--qps N] [--size BYTES]\n"
		"               (--iters N | --duration S) [--tx-depth D] [--mtu M]\n"
		"               [--rate-mbps R] [--cc dcqcn|none] [--dscp D] [--src-port P]\n"
		"               [--ack-every N] [--rto-ms MS] [--retry-cnt N] [--burst PKTS]\n"
		"               [--psn START] [--drain-s S] [--wake-us US]\n");
}

/* A bad option: one line naming it, exit 2 (as argparse does). */
static void bad_opt(const char *name, const char *why)
{
	fprintf(stderr, "roce_bw: --%s: %s\n", name, why);
	exit(2);
}

static double num_opt(const char *name, const char *s, double lo, double hi)
{
	char *end;
	errno = 0;
	double v = strtod(s, &end);
	if (errno || end == s || *end || !isfinite(v) || v < lo || v > hi) {
		char why[160];
		snprintf(why, sizeof(why), "'%s' is not a number in %g..%g", s, lo, hi);
		bad_opt(name, why);
	}
	return v;
}

static uint64_t int_opt(const char *name, const char *s, double lo, double hi)
{
	double v = num_opt(name, s, lo, hi);
	if (v != (double)(uint64_t)v) {  /* lo >= 0 for every whole-number option */
		char why[160];
		snprintf(why, sizeof(why), "'%s' is not a whole number", s);
		bad_opt(name, why);
	}
	return (uint64_t)v;
}

static void parse_opts(int argc, char **argv, struct opts *o)
{
	static const struct option longs[] = {
		{"server", no_argument, 0, 'S'},   {"client", required_argument, 0, 'c'},
		{"out", required_argument, 0, 'o'}, {"qps", required_argument, 0, 'q'},
		{"size", required_argument, 0, 's'}, {"iters", required_argument, 0, 'n'},
		{"duration", required_argument, 0, 'D'}, {"tx-depth", required_argument, 0, 't'},
		{"mtu", required_argument, 0, 'm'}, {"rate-mbps", required_argument, 0, 'r'},
		{"cc", required_argument, 0, 'C'}, {"dscp", required_argument, 0, 'd'},
		{"src-port", required_argument, 0, 'p'}, {"ack-every", required_argument, 0, 'a'},
		{"rto-ms", required_argument, 0, 'R'}, {"retry-cnt", required_argument, 0, 'y'},
		{"burst", required_argument, 0, 'b'}, {"psn", required_argument, 0, 'P'},
		{"drain-s", required_argument, 0, 'x'}, {"wake-us", required_argument, 0, 'w'},
		{"help", no_argument, 0, 'h'},
		{0, 0, 0, 0}};
	*o = (struct opts){.qps = 1, .size = 65536, .tx_depth = 16, .mtu = 1024, .dscp = 26,
			   .ack_every = 64, .retry_cnt = 7, .burst_pkts = 4, .rate_mbps = 100,
			   .rto_ms = 4, .drain_s = -1, .wake_us = 100, .cc_dcqcn = 1};
	opterr = 0;
	int c, idx;
	while ((c = getopt_long(argc, argv, "", longs, &idx)) != -1) {
		switch (c) {
		case 'S': o->server = 1; break;
		case 'c': o->server_ip = optarg; break;
		case 'o': o->out = optarg; break;
		case 'q': o->qps = (int)int_opt("qps", optarg, 1, MAX_QPS); break;
		case 's': o->size = int_opt("size", optarg, 1, 1u << 30); break;
		case 'n': o->iters = int_opt("iters", optarg, 1, 1e12); break;
		case 'D': o->duration_s = num_opt("duration", optarg, 0.001, 1e6); break;
		case 't': o->tx_depth = (uint32_t)int_opt("tx-depth", optarg, 1, 65536); break;
		case 'm': {
			o->mtu = (uint32_t)int_opt("mtu", optarg, 256, 4096);
			if (o->mtu & (o->mtu - 1))
				bad_opt("mtu", "must be one of 256, 512, 1024, 2048, 4096");
			break;
		}
		case 'r': o->rate_mbps = num_opt("rate-mbps", optarg, 0.01, 100000); break;
		case 'C':
			if (strcmp(optarg, "dcqcn") && strcmp(optarg, "none"))
				bad_opt("cc", "must be dcqcn or none");
			o->cc_dcqcn = !strcmp(optarg, "dcqcn");
			break;
		case 'd': o->dscp = (uint32_t)int_opt("dscp", optarg, 0, 63); break;
		case 'p': o->src_port = (uint16_t)int_opt("src-port", optarg, 1, 65535); break;
		case 'a': o->ack_every = (uint32_t)int_opt("ack-every", optarg, 1, 1 << 20); break;
		case 'R': o->rto_ms = num_opt("rto-ms", optarg, 0.01, 60000); break;
		case 'y': o->retry_cnt = (uint32_t)int_opt("retry-cnt", optarg, 0, 1000); break;
		case 'b': o->burst_pkts = (uint32_t)int_opt("burst", optarg, 1, BATCH); break;
		case 'P': o->start_psn = (uint32_t)int_opt("psn", optarg, 0, ROCE_PSN_MASK); break;
		case 'x': o->drain_s = num_opt("drain-s", optarg, 0, 3600); break;
		case 'w': o->wake_us = num_opt("wake-us", optarg, 0, 100000); break;
		case 'h': usage(stdout); exit(0);
		default: {
			const char *arg = argv[optind - 1];
			fprintf(stderr, "roce_bw: %s: unknown option or missing value\n", arg);
			usage(stderr);
			exit(2);
		}
		}
	}
	if (optind < argc)
		bad_opt("client", "unexpected argument (options only)");
	if (o->server == !!o->server_ip)
		bad_opt("server", "give exactly one of --server and --client SERVER_IP");
	if (!o->out)
		bad_opt("out", "is required");
	if (!o->server && !o->iters == !(o->duration_s > 0))
		bad_opt("iters", "a client needs exactly one of --iters and --duration");
	if (o->src_port && o->src_port + o->qps - 1 > 65535)
		bad_opt("src-port", "P + qps - 1 must stay a port number");
	if (o->drain_s < 0)  /* long enough for every retry of the last messages */
		o->drain_s = 1.0 + o->rto_ms * (o->retry_cnt + 1) / 1000.0;
}

static void die(const char *what)
{
	fprintf(stderr, "roce_bw: %s: %s\n", what, strerror(errno));
	exit(1);
}

static void open_sockets(struct app *a)
{
	int one = 1, big = 4 << 20;
	a->rx = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (a->rx < 0)
		die("UDP socket");
	setsockopt(a->rx, SOL_SOCKET, SO_RCVBUF, &big, sizeof(big));
	if (setsockopt(a->rx, IPPROTO_IP, IP_RECVTOS, &one, sizeof(one)) ||
	    setsockopt(a->rx, IPPROTO_IP, IP_PKTINFO, &one, sizeof(one)))
		die("IP_RECVTOS/IP_PKTINFO");
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(ROCE_UDP_PORT)};
	if (bind(a->rx, (struct sockaddr *)&sa, sizeof(sa)))
		die("bind UDP 4791 (is another RoCE endpoint running in this namespace?)");
	/* IPPROTO_RAW implies IP_HDRINCL: we write the whole IPv4 header. */
	a->tx = socket(AF_INET, SOCK_RAW | SOCK_CLOEXEC, IPPROTO_RAW);
	if (a->tx < 0)
		die("raw socket (needs CAP_NET_RAW)");
	big = 1 << 20;
	setsockopt(a->tx, SOL_SOCKET, SO_SNDBUF, &big, sizeof(big));
}

/* The client's own address towards the server: the ICRC covers it, so we must know it
 * before the first packet (the kernel would only fill a zero one in after us). */
static uint32_t route_source(uint32_t dst)
{
	int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(ROCE_UDP_PORT),
				 .sin_addr.s_addr = htonl(dst)};
	socklen_t len = sizeof(sa);
	if (s < 0 || connect(s, (struct sockaddr *)&sa, sizeof(sa)) ||
	    getsockname(s, (struct sockaddr *)&sa, &len))
		die("no route to the server");
	close(s);
	return ntohl(sa.sin_addr.s_addr);
}

static void flush_tx(struct app *a)
{
	int done = 0;
	while (done < a->ntx) {
		int n = sendmmsg(a->tx, a->txm + done, (unsigned)(a->ntx - done), 0);
		if (n > 0) {
			done += n;
			continue;
		}
		if (errno == EINTR)
			continue;
		if (errno == EMSGSIZE) {
			fprintf(stderr, "roce_bw: a %zu-byte packet exceeds the path's MTU: use a "
				"smaller --mtu\n", a->txv[done].iov_len);
			exit(1);
		}
		/* The packet is lost as if on the wire: go-back-N or the timer recovers it. */
		a->send_errors++;
		done++;
	}
	a->ntx = 0;
}

static void queue_pkt(struct app *a, uint32_t saddr, uint32_t daddr, uint16_t sport,
		      uint8_t tos, const struct roce_hdr *h, size_t payload)
{
	if (a->ntx == BATCH)
		flush_tx(a);
	if (++a->ip_id == 0)
		a->ip_id = 1;
	struct roce_ip ip = {.saddr = saddr, .daddr = daddr, .sport = sport, .ip_id = a->ip_id,
			     .tos = tos, .ttl = 64};
	int i = a->ntx;
	size_t len = roce_build(a->txbuf[i], BUF_LEN, &ip, h, payload);
	if (!len) {
		fprintf(stderr, "roce_bw: internal error: opcode 0x%02x did not build\n",
			h->opcode);
		exit(1);
	}
	a->txa[i] = (struct sockaddr_in){.sin_family = AF_INET, .sin_addr.s_addr = htonl(daddr)};
	a->txv[i] = (struct iovec){.iov_base = a->txbuf[i], .iov_len = len};
	a->txm[i].msg_hdr = (struct msghdr){.msg_name = &a->txa[i],
					    .msg_namelen = sizeof(a->txa[i]),
					    .msg_iov = &a->txv[i], .msg_iovlen = 1};
	a->ntx++;
}

static struct peer *find_peer(struct app *a, uint32_t addr, uint32_t qpn, int *index)
{
	for (int i = 0; i < a->npeers; i++)
		if (a->peers[i].r.qpn == qpn && a->peers[i].addr == addr) {
			*index = i;
			return &a->peers[i];
		}
	return NULL;
}

/* Implicit connection set-up: a client's QP is known from its first message's first
 * packet (a WRITE First/Only at the buffer's base); its requester is QPN - 1. */
static struct peer *new_peer(struct app *a, uint32_t addr, uint32_t local,
			     const struct roce_hdr *h, int *index)
{
	if (a->npeers == MAX_RESPONDERS)
		return NULL;
	struct peer *p = &a->peers[a->npeers];
	memset(p, 0, sizeof(*p));
	p->addr = addr;
	p->local = local;
	qp_resp_init(&p->r, h->dqpn, h->dqpn - 1, h->psn, a->cnp_interval_ns);
	*index = a->npeers++;
	return p;
}

static void on_data(struct app *a, const struct sockaddr_in *src, uint32_t local,
		    uint8_t tos, const struct roce_hdr *h, size_t payload, size_t udp_len,
		    uint64_t now)
{
	uint32_t addr = ntohl(src->sin_addr.s_addr);
	int idx;
	struct peer *p = find_peer(a, addr, h->dqpn, &idx);
	if (!p && (h->opcode == ROCE_OP_WRITE_FIRST || h->opcode == ROCE_OP_WRITE_ONLY) &&
	    h->va == ROCE_VA_BASE)
		p = new_peer(a, addr, local, h, &idx);
	if (!p) {
		a->unknown_qp_packets++;
		return;
	}
	p->dscp = tos >> 2;
	size_t wire = udp_len + ROCE_IPV4_LEN + ROCE_UDP_LEN + ROCE_ETH_OVERHEAD;
	qp_resp_on_data(&p->r, h, payload, wire, (tos & 3) == ROCE_ECN_CE, now);
	if (!p->touched && a->ntouched < BATCH) {
		p->touched = 1;
		a->touched[a->ntouched++] = idx;
	}
}

/* ACKs, NAKs and CNPs owed after a batch of received packets: one ACK per QP per batch,
 * carrying the latest PSN (coalescing, as a NIC does). */
static void answer_touched(struct app *a)
{
	struct roce_hdr h;
	for (int i = 0; i < a->ntouched; i++) {
		struct peer *p = &a->peers[a->touched[i]];
		uint16_t sport = roce_udp_sport(p->r.qpn, 0, 0);
		p->touched = 0;
		if (qp_resp_cnp(&p->r, &h))
			queue_pkt(a, p->local, p->addr, sport, ROCE_DSCP_CNP << 2 | ROCE_ECN_NOT_ECT,
				  &h, 0);
		if (qp_resp_response(&p->r, &h))
			queue_pkt(a, p->local, p->addr, sport, (uint8_t)(p->dscp << 2), &h, 0);
	}
	a->ntouched = 0;
}

static struct qp_requester *requester_of(struct app *a, uint32_t qpn)
{
	uint32_t d = (qpn - a->qpn_base) & ROCE_QPN_MASK;
	if (d % 2 || d / 2 >= (uint32_t)a->nreq)
		return NULL;
	return &a->req[d / 2];
}

static void read_cmsgs(struct msghdr *m, uint8_t *tos, uint32_t *local)
{
	*tos = 0;
	*local = 0;
	for (struct cmsghdr *c = CMSG_FIRSTHDR(m); c; c = CMSG_NXTHDR(m, c)) {
		if (c->cmsg_level != IPPROTO_IP)
			continue;
		if (c->cmsg_type == IP_TOS)
			*tos = *(uint8_t *)CMSG_DATA(c);
		else if (c->cmsg_type == IP_PKTINFO) {
			struct in_pktinfo pi;
			memcpy(&pi, CMSG_DATA(c), sizeof(pi));
			*local = ntohl(pi.ipi_addr.s_addr);
		}
	}
}

/* Drain the receive socket (a bounded number of batches, so sending is not starved). */
static void receive(struct app *a)
{
	for (int round = 0; round < 8; round++) {
		for (int i = 0; i < BATCH; i++) {
			a->rxv[i] = (struct iovec){.iov_base = a->rxbuf[i], .iov_len = BUF_LEN};
			a->rxm[i].msg_hdr = (struct msghdr){
				.msg_name = &a->rxa[i], .msg_namelen = sizeof(a->rxa[i]),
				.msg_iov = &a->rxv[i], .msg_iovlen = 1,
				.msg_control = a->rxctl[i], .msg_controllen = sizeof(a->rxctl[i])};
		}
		int n = recvmmsg(a->rx, a->rxm, BATCH, MSG_DONTWAIT, NULL);
		if (n <= 0)
			return;
		uint64_t now = now_ns();
		for (int i = 0; i < n; i++) {
			struct roce_hdr h;
			size_t payload, len = a->rxm[i].msg_len;
			uint8_t tos;
			uint32_t local;
			if (roce_parse(a->rxbuf[i], len, &h, &payload)) {
				a->malformed_packets++;
				continue;
			}
			read_cmsgs(&a->rxm[i].msg_hdr, &tos, &local);
			if (roce_has_payload(h.opcode)) {
				on_data(a, &a->rxa[i], local, tos, &h, payload, len, now);
			} else {
				struct qp_requester *q = requester_of(a, h.dqpn);
				if (q)
					qp_req_on_packet(q, &h, now);
				else
					a->unknown_qp_packets++;
			}
		}
		answer_touched(a);
		if (n < BATCH)
			return;
	}
}

/* Send what the pacers allow: one packet per QP per round (round-robin, as a NIC's
 * scheduler shares the port), each QP within its own rate, all within the port's. */
static void send_ready(struct app *a, uint64_t now)
{
	pacer_refill(&a->port, now);
	for (int progress = 1; progress;) {
		progress = 0;
		int start = a->rr;
		for (int k = 0; k < a->nreq; k++) {
			int i = (start + k) % a->nreq;
			struct qp_requester *q = &a->req[i];
			size_t len = qp_req_next_len(q);
			if (!len || qp_req_ready_at(q, now) > now)
				continue;
			double wire = (double)(len + ROCE_ETH_OVERHEAD);
			if (pacer_ready_at(&a->port, wire, now) > now)
				return;
			struct roce_hdr h;
			size_t payload;
			uint64_t seq = q->send_seq;
			qp_req_take(q, &h, &payload, now);
			pacer_take(&a->port, wire);
			uint16_t sport = roce_udp_sport(q->qpn, a->o.src_port ?
					(uint16_t)(a->o.src_port + i) : 0, seq);
			queue_pkt(a, a->local_addr, a->server_addr, sport,
				  (uint8_t)(a->o.dscp << 2 | ROCE_ECN_ECT0), &h, payload);
			/* The next QP goes first next time, even when the port stops us here. */
			a->rr = (i + 1) % a->nreq;
			a->last_send_ns = now;
			progress = 1;
		}
	}
}

/* When the loop must wake next: the first packet a pacer lets go, but not sooner than
 * wake_ns after the last packet sent (the bucket keeps the tokens meanwhile, so the rate
 * holds and packets leave in pairs or threes at high rates: a wake costs more CPU than a
 * packet), and every QP's next timer. */
static uint64_t next_wake(struct app *a, uint64_t now)
{
	uint64_t send = UINT64_MAX, timers = UINT64_MAX;
	for (int i = 0; i < a->nreq; i++) {
		struct qp_requester *q = &a->req[i];
		size_t len = qp_req_next_len(q);
		if (len) {
			uint64_t r = qp_req_ready_at(q, now);
			uint64_t p = pacer_ready_at(&a->port, (double)(len + ROCE_ETH_OVERHEAD), now);
			if (p > r)
				r = p;
			if (r < send)
				send = r;
		}
		uint64_t timer = qp_req_next_timer(q);
		if (timer < timers)
			timers = timer;
	}
	if (send != UINT64_MAX && send < a->last_send_ns + a->wake_ns)
		send = a->last_send_ns + a->wake_ns;
	return send < timers ? send : timers;
}

static void start_client(struct app *a, uint64_t now)
{
	struct in_addr in;
	if (inet_pton(AF_INET, a->o.server_ip, &in) != 1)
		bad_opt("client", "not an IPv4 address");
	a->server_addr = ntohl(in.s_addr);
	a->local_addr = route_source(a->server_addr);
	/* QPNs from the PID: a restarted client is a new connection to a running server. */
	a->qpn_base = 0x100 + (uint32_t)(getpid() % 32768) * 256;
	struct qp_config c = {
		.mtu = a->o.mtu, .msg_size = a->o.size, .tx_depth = a->o.tx_depth,
		.iters = a->o.iters, .ackreq_every = a->o.ack_every,
		.rto_ns = (uint64_t)(a->o.rto_ms * 1e6), .retry_cnt = a->o.retry_cnt,
		.start_psn = a->o.start_psn, .cc_dcqcn = a->o.cc_dcqcn,
		.line_rate_bps = a->o.rate_mbps * 1e6, .burst_pkts = a->o.burst_pkts};
	for (int i = 0; i < a->o.qps; i++) {
		uint32_t qpn = a->qpn_base + 2 * (uint32_t)i;
		c.sport = roce_udp_sport(qpn, a->o.src_port ? (uint16_t)(a->o.src_port + i) : 0, 0);
		if (qp_req_init(&a->req[i], &c, qpn, qpn + 1, now)) {
			fprintf(stderr, "roce_bw: out of memory\n");
			exit(1);
		}
		a->nreq++;
	}
}

static int clients_done(struct app *a)
{
	for (int i = 0; i < a->nreq; i++)
		if (!qp_req_done(&a->req[i]))
			return 0;
	return 1;
}

static void write_json(struct app *a, uint64_t end, const char *error);

static int run(struct app *a)
{
	uint64_t now = now_ns();
	a->t0 = now;
	uint64_t t_end = a->o.duration_s > 0 ? now + (uint64_t)(a->o.duration_s * 1e9) :
					       UINT64_MAX;
	uint64_t t_drain = UINT64_MAX;
	if (!a->o.server)
		start_client(a, now);
	sigset_t during;
	sigprocmask(SIG_BLOCK, NULL, &during);
	sigdelset(&during, SIGINT);
	sigdelset(&during, SIGTERM);
	const char *error = NULL;
	char why[256];
	struct pollfd pfd = {.fd = a->rx, .events = POLLIN, .revents = POLLIN};
	for (;;) {
		if (pfd.revents)  /* a timer's wake need not ask the socket (a system call) */
			receive(a);
		now = now_ns();
		for (int i = 0; i < a->nreq; i++) {
			uint64_t before = a->req[i].n.messages_completed;
			qp_req_advance(&a->req[i], now);
			if (a->req[i].n.messages_completed != before)
				a->t_last_completion = now;
			if (a->req[i].state == QP_ERROR && !error) {
				snprintf(why, sizeof(why), "QP 0x%06x: %s", a->req[i].qpn,
					 a->req[i].error);
				error = why;
			}
		}
		if (error || stop_signal)
			break;
		if (now >= t_end && t_drain == UINT64_MAX) {
			if (a->o.server)
				break;
			for (int i = 0; i < a->nreq; i++)
				qp_req_stop_posting(&a->req[i]);
			t_drain = now + (uint64_t)(a->o.drain_s * 1e9);
		}
		if (!a->o.server && clients_done(a))
			break;
		if (now >= t_drain) {
			uint64_t left = 0;
			for (int i = 0; i < a->nreq; i++)
				left += a->req[i].n.messages_posted - a->req[i].n.messages_completed;
			snprintf(why, sizeof(why), "%llu messages not completed %.1f s after the end",
				 (unsigned long long)left, a->o.drain_s);
			error = why;
			break;
		}
		send_ready(a, now);
		flush_tx(a);
		uint64_t wake = next_wake(a, now);
		if (t_end < wake && t_drain == UINT64_MAX)
			wake = t_end;
		if (t_drain < wake)
			wake = t_drain;
		now = now_ns();
		/* Sleep at most 100 ms: nothing is lost by looking around now and then. */
		uint64_t dt = wake <= now ? 0 : wake - now;
		if (dt > 100000000ull)
			dt = 100000000ull;
		struct timespec ts = {.tv_sec = (time_t)(dt / 1000000000ull),
				      .tv_nsec = (long)(dt % 1000000000ull)};
		pfd.revents = 0;
		if (ppoll(&pfd, 1, &ts, &during) < 0 && errno != EINTR)
			die("ppoll");
	}
	flush_tx(a);
	uint64_t end = now_ns();
	if (!a->o.server && !stop_signal && !error)
		end = a->t_last_completion ? a->t_last_completion : end;
	write_json(a, end, error);
	if (error) {
		fprintf(stderr, "roce_bw: %s\n", error);
		return 1;
	}
	return 0;
}

static void ip_str(uint32_t addr, char *buf)
{
	struct in_addr in = {.s_addr = htonl(addr)};
	inet_ntop(AF_INET, &in, buf, INET_ADDRSTRLEN);
}

#define U64(f, name, v) fprintf(f, "\"%s\": %llu", name, (unsigned long long)(v))

static void json_str(FILE *f, const char *s)
{
	fputc('"', f);
	for (; *s; s++) {
		if (*s == '"' || *s == '\\')
			fputc('\\', f);
		if ((unsigned char)*s >= 0x20)
			fputc(*s, f);
	}
	fputc('"', f);
}

static void json_cpu(FILE *f)
{
	struct rusage ru;
	getrusage(RUSAGE_SELF, &ru);
	fprintf(f, "\"cpu\": {\"user_s\": %.6f, \"sys_s\": %.6f}",
		(double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6,
		(double)ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6);
}

static void json_latency(FILE *f, struct qp_requester *q)
{
	fprintf(f, "\"latency_us\": ");
	if (!q->lat_len) {
		fprintf(f, "null");
		return;
	}
	fprintf(f, "{\"p50\": %.3f, \"p99\": %.3f, \"max\": %.3f, \"samples\": %zu}",
		qp_req_latency_pct(q, 50) / 1e3, qp_req_latency_pct(q, 99) / 1e3,
		qp_req_latency_pct(q, 100) / 1e3, q->lat_len);
}

static void json_requester(FILE *f, struct qp_requester *q)
{
	const struct qp_req_counters *n = &q->n;
	fprintf(f, "    {\"qpn\": %u, \"dqpn\": %u, \"udp_sport\": %u, \"state\": \"%s\", ",
		q->qpn, q->dqpn, q->c.sport, q->state == QP_RTS ? "RTS" : "ERROR");
	fprintf(f, "\"error\": ");
	if (q->error)
		json_str(f, q->error);
	else
		fprintf(f, "null");
	fprintf(f, ",\n     ");
	U64(f, "packets_sent", n->packets_sent); fprintf(f, ", ");
	U64(f, "payload_bytes_sent", n->payload_bytes_sent); fprintf(f, ", ");
	U64(f, "wire_bytes_sent", n->wire_bytes_sent); fprintf(f, ", ");
	U64(f, "retransmitted_packets", n->retransmitted_packets); fprintf(f, ",\n     ");
	U64(f, "acks_received", n->acks_received); fprintf(f, ", ");
	U64(f, "naks_received", n->naks_received); fprintf(f, ", ");
	U64(f, "cnps_received", n->cnps_received); fprintf(f, ", ");
	U64(f, "rto_events", n->rto_events); fprintf(f, ", ");
	U64(f, "messages_posted", n->messages_posted); fprintf(f, ", ");
	U64(f, "messages_completed", n->messages_completed); fprintf(f, ",\n     ");
	json_latency(f, q);
	fprintf(f, ",\n     \"dcqcn\": {\"cuts\": %llu, \"cnps\": %llu, \"rc_bps\": %.0f, "
		"\"rt_bps\": %.0f, \"alpha\": %.6f},\n     \"rate_samples\": [",
		(unsigned long long)q->cc.cuts, (unsigned long long)q->cc.cnps, q->cc.rc_bps,
		q->cc.rt_bps, q->cc.alpha);
	for (size_t i = 0; i < q->n_samples; i++) {
		const struct qp_rate_sample *s = &q->samples[i];
		fprintf(f, "%s[%.3f, %.0f, %.0f, %.6f]", i ? ", " : "", s->t_s, s->rc_bps,
			s->rt_bps, s->alpha);
	}
	fprintf(f, "]}");
}

static void json_responder(FILE *f, const struct peer *p, uint64_t t0)
{
	const struct qp_resp_counters *n = &p->r.n;
	char ip[INET_ADDRSTRLEN];
	ip_str(p->addr, ip);
	fprintf(f, "    {\"client\": \"%s\", \"qpn\": %u, \"peer_qpn\": %u, ", ip, p->r.qpn,
		p->r.peer_qpn);
	U64(f, "packets_received", n->packets_received); fprintf(f, ", ");
	U64(f, "payload_bytes_received", n->payload_bytes_received); fprintf(f, ", ");
	U64(f, "wire_bytes_received", n->wire_bytes_received); fprintf(f, ",\n     ");
	U64(f, "messages_received", n->messages_received); fprintf(f, ", ");
	U64(f, "duplicates", n->duplicates); fprintf(f, ", ");
	U64(f, "out_of_sequence", n->out_of_sequence); fprintf(f, ", ");
	U64(f, "acks_sent", n->acks_sent); fprintf(f, ", ");
	U64(f, "naks_sent", n->naks_sent); fprintf(f, ", ");
	U64(f, "cnps_sent", n->cnps_sent); fprintf(f, ", ");
	U64(f, "ce_received", n->ce_received); fprintf(f, ",\n     ");
	fprintf(f, "\"first_s\": %.6f, \"last_s\": %.6f}",
		(double)(p->r.first_ns - t0) / 1e9, (double)(p->r.last_ns - t0) / 1e9);
}

static void json_client(FILE *f, struct app *a, double elapsed)
{
	const struct opts *o = &a->o;
	char local[INET_ADDRSTRLEN];
	ip_str(a->local_addr, local);
	fprintf(f, "  \"server\": \"%s\", \"local\": \"%s\",\n", o->server_ip, local);
	fprintf(f, "  \"config\": {\"qps\": %d, \"size\": %llu, \"iters\": %llu, "
		"\"duration_s\": %g, \"tx_depth\": %u, \"mtu\": %u, \"rate_mbps\": %g, "
		"\"cc\": \"%s\", \"dscp\": %u, \"ack_every\": %u, \"rto_ms\": %g, "
		"\"retry_cnt\": %u, \"burst_pkts\": %u, \"start_psn\": %u, \"wake_us\": %.3f},\n",
		o->qps, (unsigned long long)o->size, (unsigned long long)o->iters, o->duration_s,
		o->tx_depth, o->mtu, o->rate_mbps, o->cc_dcqcn ? "dcqcn" : "none", o->dscp,
		o->ack_every, o->rto_ms, o->retry_cnt, o->burst_pkts, o->start_psn,
		(double)a->wake_ns / 1e3);
	struct qp_req_counters t = {0};
	for (int i = 0; i < a->nreq; i++) {
		const struct qp_req_counters *n = &a->req[i].n;
		t.packets_sent += n->packets_sent;
		t.payload_bytes_sent += n->payload_bytes_sent;
		t.wire_bytes_sent += n->wire_bytes_sent;
		t.retransmitted_packets += n->retransmitted_packets;
		t.naks_received += n->naks_received;
		t.cnps_received += n->cnps_received;
		t.rto_events += n->rto_events;
		t.messages_completed += n->messages_completed;
	}
	double good = elapsed > 0 ? (double)t.messages_completed * (double)o->size * 8 /
					    elapsed / 1e6 : 0;
	fprintf(f, "  \"goodput_mbps\": %.3f,\n  \"totals\": {", good);
	U64(f, "packets_sent", t.packets_sent); fprintf(f, ", ");
	U64(f, "payload_bytes_sent", t.payload_bytes_sent); fprintf(f, ", ");
	U64(f, "wire_bytes_sent", t.wire_bytes_sent); fprintf(f, ", ");
	U64(f, "retransmitted_packets", t.retransmitted_packets); fprintf(f, ", ");
	U64(f, "naks_received", t.naks_received); fprintf(f, ", ");
	U64(f, "cnps_received", t.cnps_received); fprintf(f, ", ");
	U64(f, "rto_events", t.rto_events); fprintf(f, ", ");
	U64(f, "messages_completed", t.messages_completed);
	fprintf(f, "},\n  \"qps\": [\n");
	for (int i = 0; i < a->nreq; i++) {
		json_requester(f, &a->req[i]);
		fprintf(f, "%s\n", i + 1 < a->nreq ? "," : "");
	}
	fprintf(f, "  ]");
}

static void json_server(FILE *f, struct app *a)
{
	fprintf(f, "  \"config\": {\"rate_mbps\": %g, \"cnp_interval_us\": %.3f},\n",
		a->o.rate_mbps, (double)a->cnp_interval_ns / 1e3);
	struct qp_resp_counters t = {0};
	for (int i = 0; i < a->npeers; i++) {
		const struct qp_resp_counters *n = &a->peers[i].r.n;
		t.packets_received += n->packets_received;
		t.payload_bytes_received += n->payload_bytes_received;
		t.wire_bytes_received += n->wire_bytes_received;
		t.naks_sent += n->naks_sent;
		t.cnps_sent += n->cnps_sent;
		t.ce_received += n->ce_received;
		t.messages_received += n->messages_received;
	}
	fprintf(f, "  \"totals\": {");
	U64(f, "packets_received", t.packets_received); fprintf(f, ", ");
	U64(f, "payload_bytes_received", t.payload_bytes_received); fprintf(f, ", ");
	U64(f, "wire_bytes_received", t.wire_bytes_received); fprintf(f, ", ");
	U64(f, "messages_received", t.messages_received); fprintf(f, ", ");
	U64(f, "naks_sent", t.naks_sent); fprintf(f, ", ");
	U64(f, "cnps_sent", t.cnps_sent); fprintf(f, ", ");
	U64(f, "ce_received", t.ce_received);
	fprintf(f, "},\n  \"qps\": [\n");
	for (int i = 0; i < a->npeers; i++) {
		json_responder(f, &a->peers[i], a->t0);
		fprintf(f, "%s\n", i + 1 < a->npeers ? "," : "");
	}
	fprintf(f, "  ]");
}

/* The JSON goes to FILE.tmp, then is renamed: a reader never sees half of it. */
static void write_json(struct app *a, uint64_t end, const char *error)
{
	size_t n = strlen(a->o.out) + 8;
	char *tmp = malloc(n);
	if (!tmp)
		die("malloc");
	snprintf(tmp, n, "%s.tmp", a->o.out);
	FILE *f = fopen(tmp, "w");
	if (!f)
		die(tmp);
	double elapsed = (double)(end - a->t0) / 1e9;
	fprintf(f, "{\n  \"role\": \"%s\", \"elapsed_s\": %.6f, \"error\": ",
		a->o.server ? "server" : "client", elapsed);
	if (error)
		json_str(f, error);
	else
		fprintf(f, "null");
	fprintf(f, ", \"stopped_by_signal\": %s,\n  ", stop_signal ? "true" : "false");
	json_cpu(f);
	fprintf(f, ",\n  ");
	U64(f, "unknown_qp_packets", a->unknown_qp_packets); fprintf(f, ", ");
	U64(f, "malformed_packets", a->malformed_packets); fprintf(f, ", ");
	U64(f, "send_errors", a->send_errors); fprintf(f, ",\n");
	if (a->o.server)
		json_server(f, a);
	else
		json_client(f, a, elapsed);
	fprintf(f, "\n}\n");
	if (fflush(f) || ferror(f) || fclose(f))
		die(tmp);
	if (rename(tmp, a->o.out))
		die(a->o.out);
	free(tmp);
}

int main(int argc, char **argv)
{
	static struct app app;
	struct app *a = &app;
	parse_opts(argc, argv, &a->o);
	/* Wake where the pacer asked: the default 50 us slack is 25 packets at 200 Mbit/s. */
	prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
	struct sigaction sa = {.sa_handler = on_signal};
	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	sigset_t block;
	sigemptyset(&block);
	sigaddset(&block, SIGINT);
	sigaddset(&block, SIGTERM);
	sigprocmask(SIG_BLOCK, &block, NULL);  /* delivered only inside ppoll: no lost wake */

	a->txbuf = calloc(BATCH, BUF_LEN);
	a->rxbuf = calloc(BATCH, BUF_LEN);
	a->peers = calloc(MAX_RESPONDERS, sizeof(*a->peers));
	if (!a->txbuf || !a->rxbuf || !a->peers)
		die("calloc");
	a->ip_id = (uint16_t)(getpid() * 7919u);
	struct dcqcn_params p;
	dcqcn_default_params(&p, a->o.rate_mbps * 1e6);
	a->cnp_interval_ns = p.cnp_interval_ns;
	double full = ROCE_IPV4_LEN + ROCE_UDP_LEN + ROCE_BTH_LEN + ROCE_RETH_LEN + a->o.mtu +
		      ROCE_ICRC_LEN + ROCE_ETH_OVERHEAD;
	pacer_init(&a->port, a->o.rate_mbps * 1e6, a->o.burst_pkts * full, now_ns());
	/* The shortest sleep, at most what the bucket holds beyond one packet: longer, and
	 * tokens would overflow the bucket while we sleep and the rate would fall. */
	double most_ns = (a->o.burst_pkts - 1) * full * 8e9 / (a->o.rate_mbps * 1e6);
	double wake_ns = a->o.wake_us * 1e3;
	a->wake_ns = (uint64_t)(wake_ns < most_ns ? wake_ns : most_ns);
	open_sockets(a);
	return run(a);
}
