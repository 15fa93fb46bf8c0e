// SPDX-License-Identifier: GPL-2.0
/*
 * A host on the transport, shared by the programs: see host.h.
 */
#define _GNU_SOURCE
#include "host.h"

#include <arpa/inet.h>
#include <errno.h>
#include <math.h>  /* isfinite: a macro, no libm needed */
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "dcqcn.h"

const char *host_prog = "roce";
volatile sig_atomic_t host_stop_signal;
/* The signal mask inside ppoll: SIGINT and SIGTERM let through. */
static sigset_t wait_mask;

static void on_signal(int sig)
{
	host_stop_signal = sig;
}

uint64_t host_now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void host_bad_opt(const char *name, const char *why)
{
	fprintf(stderr, "%s: --%s: %s\n", host_prog, name, why);
	exit(2);
}

double host_num_opt(const char *name, const char *s, double lo, double hi)
{
	char *end;
	errno = 0;
	double v = strtod(s, &end);
	if (errno || end == s || *end || !isfinite(v) || v < lo || v > hi) {
		char why[160];
		snprintf(why, sizeof(why), "'%s' is not a number in %g..%g", s, lo, hi);
		host_bad_opt(name, why);
	}
	return v;
}

uint64_t host_int_opt(const char *name, const char *s, double lo, double hi)
{
	double v = host_num_opt(name, s, lo, hi);
	if (v != (double)(uint64_t)v) {  /* lo >= 0 for every whole-number option */
		char why[160];
		snprintf(why, sizeof(why), "'%s' is not a whole number", s);
		host_bad_opt(name, why);
	}
	return (uint64_t)v;
}

int host_multipath_opt(int c, const char *arg, uint32_t *spray, int *placement_ooo,
		       uint32_t *reorder_pkts)
{
	switch (c) {
	case 'Y':
		*spray = (uint32_t)host_int_opt("spray", arg, 1, 4096);
		return 1;
	case 'O':
		if (strcmp(arg, "gbn") && strcmp(arg, "ooo"))
			host_bad_opt("placement", "must be gbn or ooo");
		*placement_ooo = !strcmp(arg, "ooo");
		return 1;
	case 'K':
		*reorder_pkts = (uint32_t)host_int_opt("reorder-pkts", arg, 1, QP_OOO_WINDOW - 1);
		return 1;
	}
	return 0;
}

void host_die(const char *what)
{
	fprintf(stderr, "%s: %s: %s\n", host_prog, what, strerror(errno));
	exit(1);
}

void host_process_init(void)
{
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
	/* delivered only inside ppoll: no lost wake */
	sigprocmask(SIG_BLOCK, &block, &wait_mask);
	sigdelset(&wait_mask, SIGINT);
	sigdelset(&wait_mask, SIGTERM);
}

void host_init(struct host *h, double rate_mbps, uint32_t burst_pkts, uint32_t mtu,
	       double wake_us, int max_peers)
{
	h->txbuf = calloc(HOST_BATCH, HOST_BUF_LEN);
	h->rxbuf = calloc(HOST_BATCH, HOST_BUF_LEN);
	h->peers = calloc((size_t)max_peers, sizeof(*h->peers));
	if (!h->txbuf || !h->rxbuf || !h->peers)
		host_die("calloc");
	h->max_peers = max_peers;
	h->readable = 1;  /* look at the socket on the first round */
	h->ip_id = (uint16_t)(getpid() * 7919u);
	struct dcqcn_params p;
	dcqcn_default_params(&p, rate_mbps * 1e6);
	h->cnp_interval_ns = p.cnp_interval_ns;
	double full = ROCE_IPV4_LEN + ROCE_UDP_LEN + ROCE_BTH_LEN + ROCE_RETH_LEN + mtu +
		      ROCE_ICRC_LEN + ROCE_ETH_OVERHEAD;
	pacer_init(&h->port, rate_mbps * 1e6, burst_pkts * full, host_now_ns());
	/* The shortest sleep, at most what the bucket holds beyond one packet: longer, and
	 * tokens would overflow the bucket while we sleep and the rate would fall. */
	double most_ns = (burst_pkts - 1) * full * 8e9 / (rate_mbps * 1e6);
	double wake_ns = wake_us * 1e3;
	h->wake_ns = (uint64_t)(wake_ns < most_ns ? wake_ns : most_ns);
}

void host_open_sockets(struct host *h)
{
	int one = 1, big = 4 << 20;
	h->rx = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (h->rx < 0)
		host_die("UDP socket");
	setsockopt(h->rx, SOL_SOCKET, SO_RCVBUF, &big, sizeof(big));
	if (setsockopt(h->rx, IPPROTO_IP, IP_RECVTOS, &one, sizeof(one)) ||
	    setsockopt(h->rx, IPPROTO_IP, IP_PKTINFO, &one, sizeof(one)))
		host_die("IP_RECVTOS/IP_PKTINFO");
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(ROCE_UDP_PORT)};
	if (bind(h->rx, (struct sockaddr *)&sa, sizeof(sa)))
		host_die("bind UDP 4791 (is another RoCE endpoint running in this namespace?)");
	/* IPPROTO_RAW implies IP_HDRINCL: we write the whole IPv4 header. */
	h->tx = socket(AF_INET, SOCK_RAW | SOCK_CLOEXEC, IPPROTO_RAW);
	if (h->tx < 0)
		host_die("raw socket (needs CAP_NET_RAW)");
	int queue = HOST_NIC_QUEUE_BYTES;
	if (setsockopt(h->tx, SOL_SOCKET, SO_SNDBUF, &queue, sizeof(queue)))
		host_die("SO_SNDBUF");
	/* Without it a raw socket reports a packet its port's qdisc dropped on entry as sent
	 * (ENOBUFS is swallowed): a queue smaller than SO_SNDBUF would lose packets in the
	 * host, which a NIC never does. With it the send fails and the packet waits. */
	if (setsockopt(h->tx, IPPROTO_IP, IP_RECVERR, &one, sizeof(one)))
		host_die("IP_RECVERR");
}

uint32_t host_route_source(uint32_t dst, const char *why)
{
	int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(ROCE_UDP_PORT),
				 .sin_addr.s_addr = htonl(dst)};
	socklen_t len = sizeof(sa);
	if (s < 0 || connect(s, (struct sockaddr *)&sa, sizeof(sa)) ||
	    getsockname(s, (struct sockaddr *)&sa, &len))
		host_die(why);
	close(s);
	return ntohl(sa.sin_addr.s_addr);
}

void host_flush(struct host *h)
{
	int done = 0;
	while (done < h->ntx) {
		int n = sendmmsg(h->tx, h->txm + done, (unsigned)(h->ntx - done), MSG_DONTWAIT);
		if (n > 0) {
			done += n;
			continue;
		}
		if (errno == EINTR)
			continue;
		if (errno == EAGAIN || errno == EWOULDBLOCK || errno == ENOBUFS) {
			/* The NIC queue is full: the rest waits, in order, for it to drain. */
			if (!h->blocked)
				h->tx_blocked++;
			h->blocked = 1;
			h->retry_ns = 0;
			if (errno == ENOBUFS) {
				h->tx_refused++;
				h->retry_ns = host_now_ns() + HOST_REFUSED_RETRY_NS;
			}
			int left = h->ntx - done;
			for (int i = 0; i < left; i++) {
				memcpy(h->txbuf[i], h->txbuf[done + i], h->txv[done + i].iov_len);
				h->txa[i] = h->txa[done + i];
				h->txv[i] = (struct iovec){.iov_base = h->txbuf[i],
							   .iov_len = h->txv[done + i].iov_len};
				h->txm[i].msg_hdr = (struct msghdr){
					.msg_name = &h->txa[i], .msg_namelen = sizeof(h->txa[i]),
					.msg_iov = &h->txv[i], .msg_iovlen = 1};
			}
			h->ntx = left;
			return;
		}
		if (errno == EMSGSIZE) {
			fprintf(stderr, "%s: a %zu-byte packet exceeds the path's MTU: use a "
				"smaller --mtu\n", host_prog, h->txv[done].iov_len);
			exit(1);
		}
		/* The packet is lost as if on the wire: go-back-N or the timer recovers it. */
		h->send_errors++;
		done++;
	}
	h->ntx = 0;
	h->blocked = 0;
	h->retry_ns = 0;
}

void host_queue(struct host *h, uint32_t saddr, uint32_t daddr, uint16_t sport, uint8_t tos,
		const struct roce_hdr *hdr, size_t payload)
{
	if (h->ntx == HOST_BATCH)
		host_flush(h);
	if (h->ntx == HOST_BATCH) {
		/* Still full (only answers are made while blocked): this one is lost as on a
		 * wire, and the requester's go-back-N or timer recovers it. */
		h->send_errors++;
		return;
	}
	if (++h->ip_id == 0)
		h->ip_id = 1;
	struct roce_ip ip = {.saddr = saddr, .daddr = daddr, .sport = sport, .ip_id = h->ip_id,
			     .tos = tos, .ttl = 64};
	int i = h->ntx;
	size_t len = roce_build(h->txbuf[i], HOST_BUF_LEN, &ip, hdr, payload);
	if (!len) {
		fprintf(stderr, "%s: internal error: opcode 0x%02x did not build\n", host_prog,
			hdr->opcode);
		exit(1);
	}
	h->txa[i] = (struct sockaddr_in){.sin_family = AF_INET, .sin_addr.s_addr = htonl(daddr)};
	h->txv[i] = (struct iovec){.iov_base = h->txbuf[i], .iov_len = len};
	h->txm[i].msg_hdr = (struct msghdr){.msg_name = &h->txa[i],
					    .msg_namelen = sizeof(h->txa[i]),
					    .msg_iov = &h->txv[i], .msg_iovlen = 1};
	h->ntx++;
}

static struct host_peer *find_peer(struct host *h, uint32_t addr, uint32_t qpn, int *index)
{
	for (int i = 0; i < h->npeers; i++)
		if (h->peers[i].r.qpn == qpn && h->peers[i].addr == addr) {
			*index = i;
			return &h->peers[i];
		}
	return NULL;
}

/* Implicit connection set-up: a requester's QP is known from its first message's first
 * packet (a WRITE First/Only at the buffer's base); its requester is QPN - 1. */
static struct host_peer *new_peer(struct host *h, uint32_t addr, uint32_t local,
				  const struct roce_hdr *hdr, int *index)
{
	if (h->npeers == h->max_peers || (h->peer_only && addr != h->peer_only))
		return NULL;
	struct host_peer *p = &h->peers[h->npeers];
	memset(p, 0, sizeof(*p));
	p->addr = addr;
	p->local = local;
	qp_resp_init(&p->r, hdr->dqpn, hdr->dqpn - 1, hdr->psn, h->cnp_interval_ns);
	qp_resp_set_placement(&p->r, h->placement_ooo, h->reorder_pkts);
	*index = h->npeers++;
	return p;
}

static void on_data(struct host *h, const struct sockaddr_in *src, uint32_t local,
		    uint8_t tos, const struct roce_hdr *hdr, size_t payload, size_t udp_len,
		    uint64_t now)
{
	uint32_t addr = ntohl(src->sin_addr.s_addr);
	int idx;
	struct host_peer *p = find_peer(h, addr, hdr->dqpn, &idx);
	if (!p && (hdr->opcode == ROCE_OP_WRITE_FIRST || hdr->opcode == ROCE_OP_WRITE_ONLY) &&
	    hdr->va == ROCE_VA_BASE)
		p = new_peer(h, addr, local, hdr, &idx);
	if (!p) {
		h->unknown_qp_packets++;
		return;
	}
	p->dscp = tos >> 2;
	p->reply_port = ntohs(src->sin_port);
	size_t wire = udp_len + ROCE_IPV4_LEN + ROCE_UDP_LEN + ROCE_ETH_OVERHEAD;
	qp_resp_on_data(&p->r, hdr, payload, wire, (tos & 3) == ROCE_ECN_CE, now);
	if (!p->touched && h->ntouched < HOST_BATCH) {
		p->touched = 1;
		h->touched[h->ntouched++] = idx;
	}
}

/* ACKs, NAKs and CNPs owed after a batch of received packets: one ACK per QP per batch,
 * carrying the latest PSN (coalescing, as a NIC does). */
static void answer_touched(struct host *h)
{
	struct roce_hdr hdr;
	for (int i = 0; i < h->ntouched; i++) {
		struct host_peer *p = &h->peers[h->touched[i]];
		uint16_t sport = p->reply_port ? p->reply_port : roce_udp_sport(p->r.qpn, 0, 0, 0);
		p->touched = 0;
		if (qp_resp_cnp(&p->r, &hdr))
			host_queue(h, p->local, p->addr, sport,
				   ROCE_DSCP_CNP << 2 | ROCE_ECN_NOT_ECT, &hdr, 0);
		if (qp_resp_response(&p->r, &hdr))
			host_queue(h, p->local, p->addr, sport, (uint8_t)(p->dscp << 2), &hdr, 0);
	}
	h->ntouched = 0;
}

static struct qp_requester *requester_of(struct host *h, uint32_t qpn)
{
	uint32_t d = (qpn - h->qpn_base) & ROCE_QPN_MASK;
	if (d % 2 || d / 2 >= (uint32_t)h->nreq)
		return NULL;
	return &h->req[d / 2];
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

static void on_packet(struct host *h, int i, uint64_t now)
{
	struct roce_hdr hdr;
	size_t payload, len = h->rxm[i].msg_len;
	uint8_t tos;
	uint32_t local;
	if (roce_parse(h->rxbuf[i], len, &hdr, &payload)) {
		h->malformed_packets++;
		return;
	}
	read_cmsgs(&h->rxm[i].msg_hdr, &tos, &local);
	if (roce_has_payload(hdr.opcode)) {
		on_data(h, &h->rxa[i], local, tos, &hdr, payload, len, now);
		return;
	}
	struct qp_requester *q = requester_of(h, hdr.dqpn);
	if (q)
		qp_req_on_packet(q, &hdr, now);
	else
		h->unknown_qp_packets++;
}

void host_receive(struct host *h)
{
	for (int round = 0; round < 8; round++) {
		for (int i = 0; i < HOST_BATCH; i++) {
			h->rxv[i] = (struct iovec){.iov_base = h->rxbuf[i], .iov_len = HOST_BUF_LEN};
			h->rxm[i].msg_hdr = (struct msghdr){
				.msg_name = &h->rxa[i], .msg_namelen = sizeof(h->rxa[i]),
				.msg_iov = &h->rxv[i], .msg_iovlen = 1,
				.msg_control = h->rxctl[i], .msg_controllen = sizeof(h->rxctl[i])};
		}
		int n = recvmmsg(h->rx, h->rxm, HOST_BATCH, MSG_DONTWAIT, NULL);
		if (n <= 0)
			return;
		uint64_t now = host_now_ns();
		for (int i = 0; i < n; i++)
			on_packet(h, i, now);
		answer_touched(h);
		if (n < HOST_BATCH)
			return;
	}
}

void host_send_ready(struct host *h, uint64_t now)
{
	pacer_refill(&h->port, now);
	if (h->blocked)         /* a paused NIC makes no packets: they would wait unsent */
		return;
	for (int progress = 1; progress;) {
		progress = 0;
		int start = h->rr;
		for (int k = 0; k < h->nreq; k++) {
			int i = (start + k) % h->nreq;
			struct qp_requester *q = &h->req[i];
			size_t len = qp_req_next_len(q);
			if (!len || qp_req_ready_at(q, now) > now)
				continue;
			double wire = (double)(len + ROCE_ETH_OVERHEAD);
			if (pacer_ready_at(&h->port, wire, now) > now)
				return;
			struct roce_hdr hdr;
			size_t payload;
			uint64_t seq = q->send_seq;
			qp_req_take(q, &hdr, &payload, now);
			pacer_take(&h->port, wire);
			uint16_t sport = roce_udp_sport(q->qpn, h->src_port ?
					(uint16_t)(h->src_port + i) : 0, seq, q->c.spray);
			host_queue(h, h->local_addr, h->remote_addr, sport,
				   (uint8_t)(h->dscp << 2 | ROCE_ECN_ECT0), &hdr, payload);
			/* The next QP goes first next time, even when the port stops us here. */
			h->rr = (i + 1) % h->nreq;
			h->last_send_ns = now;
			progress = 1;
		}
	}
}

/* The send wake is not sooner than wake_ns after the last packet sent: the bucket keeps
 * the tokens meanwhile, so the rate holds and packets leave in pairs or threes at high
 * rates (a wake costs more CPU than a packet). */
uint64_t host_next_wake(struct host *h, uint64_t now)
{
	uint64_t send = UINT64_MAX, timers = UINT64_MAX;
	for (int i = 0; i < h->nreq; i++) {
		struct qp_requester *q = &h->req[i];
		size_t len = qp_req_next_len(q);
		if (len && !h->blocked) {   /* blocked: the NIC queue's POLLOUT wakes us */
			uint64_t r = qp_req_ready_at(q, now);
			uint64_t p = pacer_ready_at(&h->port, (double)(len + ROCE_ETH_OVERHEAD), now);
			if (p > r)
				r = p;
			if (r < send)
				send = r;
		}
		uint64_t timer = qp_req_next_timer(q);
		if (timer < timers)
			timers = timer;
	}
	if (send != UINT64_MAX && send < h->last_send_ns + h->wake_ns)
		send = h->last_send_ns + h->wake_ns;
	return send < timers ? send : timers;
}

void host_wait(struct host *h, uint64_t wake)
{
	uint64_t now = host_now_ns();
	/* Sleep at most 100 ms: nothing is lost by looking around now and then. */
	if (h->retry_ns && h->retry_ns < wake)     /* set only while blocked */
		wake = h->retry_ns;
	uint64_t dt = wake <= now ? 0 : wake - now;
	if (dt > 100000000ull)
		dt = 100000000ull;
	struct timespec ts = {.tv_sec = (time_t)(dt / 1000000000ull),
			      .tv_nsec = (long)(dt % 1000000000ull)};
	struct pollfd pfd[2] = {{.fd = h->rx, .events = POLLIN}, {.fd = h->tx, .events = POLLOUT}};
	/* POLLOUT only for a full socket buffer: after a refusal the buffer has room */
	int nfd = h->blocked && !h->retry_ns ? 2 : 1;
	if (ppoll(pfd, (nfds_t)nfd, &ts, &wait_mask) < 0 && errno != EINTR)
		host_die("ppoll");
	/* a timer's wake need not ask the socket (a system call) */
	h->readable = pfd[0].revents != 0;
}

void host_ip_str(uint32_t addr, char *buf)
{
	struct in_addr in = {.s_addr = htonl(addr)};
	inet_ntop(AF_INET, &in, buf, INET_ADDRSTRLEN);
}

void host_json_str(FILE *f, const char *s)
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

void host_json_cpu(FILE *f)
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

void host_json_requester(FILE *f, struct qp_requester *q)
{
	const struct qp_req_counters *n = &q->n;
	fprintf(f, "    {\"qpn\": %u, \"dqpn\": %u, \"udp_sport\": %u, \"state\": \"%s\", ",
		q->qpn, q->dqpn, q->c.sport, q->state == QP_RTS ? "RTS" : "ERROR");
	fprintf(f, "\"error\": ");
	if (q->error)
		host_json_str(f, q->error);
	else
		fprintf(f, "null");
	fprintf(f, ",\n     ");
	HOST_U64(f, "packets_sent", n->packets_sent); fprintf(f, ", ");
	HOST_U64(f, "payload_bytes_sent", n->payload_bytes_sent); fprintf(f, ", ");
	HOST_U64(f, "wire_bytes_sent", n->wire_bytes_sent); fprintf(f, ", ");
	HOST_U64(f, "retransmitted_packets", n->retransmitted_packets); fprintf(f, ",\n     ");
	HOST_U64(f, "acks_received", n->acks_received); fprintf(f, ", ");
	HOST_U64(f, "naks_received", n->naks_received); fprintf(f, ", ");
	HOST_U64(f, "cnps_received", n->cnps_received); fprintf(f, ", ");
	HOST_U64(f, "rto_events", n->rto_events); fprintf(f, ", ");
	HOST_U64(f, "naks_ignored", n->naks_ignored); fprintf(f, ", ");
	HOST_U64(f, "messages_posted", n->messages_posted); fprintf(f, ", ");
	HOST_U64(f, "messages_completed", n->messages_completed); fprintf(f, ",\n     ");
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

void host_json_responder(FILE *f, const struct host_peer *p, uint64_t t0)
{
	const struct qp_resp_counters *n = &p->r.n;
	char ip[INET_ADDRSTRLEN];
	host_ip_str(p->addr, ip);
	fprintf(f, "    {\"client\": \"%s\", \"qpn\": %u, \"peer_qpn\": %u, ", ip, p->r.qpn,
		p->r.peer_qpn);
	HOST_U64(f, "packets_received", n->packets_received); fprintf(f, ", ");
	HOST_U64(f, "payload_bytes_received", n->payload_bytes_received); fprintf(f, ", ");
	HOST_U64(f, "wire_bytes_received", n->wire_bytes_received); fprintf(f, ",\n     ");
	HOST_U64(f, "messages_received", n->messages_received); fprintf(f, ", ");
	HOST_U64(f, "duplicates", n->duplicates); fprintf(f, ", ");
	HOST_U64(f, "out_of_sequence", n->out_of_sequence); fprintf(f, ", ");
	HOST_U64(f, "placed_out_of_order", n->placed_out_of_order); fprintf(f, ", ");
	HOST_U64(f, "acks_sent", n->acks_sent); fprintf(f, ", ");
	HOST_U64(f, "naks_sent", n->naks_sent); fprintf(f, ", ");
	HOST_U64(f, "cnps_sent", n->cnps_sent); fprintf(f, ", ");
	HOST_U64(f, "ce_received", n->ce_received); fprintf(f, ",\n     ");
	fprintf(f, "\"first_s\": %.6f, \"last_s\": %.6f}",
		(double)(p->r.first_ns - t0) / 1e9, (double)(p->r.last_ns - t0) / 1e9);
}

FILE *host_json_open(const char *out, char **tmp)
{
	size_t n = strlen(out) + 8;
	*tmp = malloc(n);
	if (!*tmp)
		host_die("malloc");
	snprintf(*tmp, n, "%s.tmp", out);
	FILE *f = fopen(*tmp, "w");
	if (!f)
		host_die(*tmp);
	return f;
}

void host_json_close(FILE *f, char *tmp, const char *out)
{
	if (fflush(f) || ferror(f) || fclose(f))
		host_die(tmp);
	if (rename(tmp, out))
		host_die(out);
	free(tmp);
}
