// SPDX-License-Identifier: GPL-2.0
/*
 * roce_bw: RDMA WRITE bandwidth over a software RoCEv2 transport, like perftest's
 * ib_write_bw. The server answers any client's QPs; the client runs N RC QPs of fixed-size
 * messages, paced per QP (DCQCN or the line rate) and per port (the line rate), and both
 * write their counters as JSON. README.md beside this file says what is real.
 *
 * The sockets, the port's pacer, the event loop's wait and the JSON pieces are host.c's,
 * which says why one thread, a raw socket to send and UDP 4791 to receive.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "host.h"
#include "qp.h"
#include "wire.h"

#define MAX_QPS 128
#define MAX_RESPONDERS 4096

struct opts {
	int server;
	const char *server_ip;
	const char *out;
	int qps;
	uint64_t size, iters;
	double duration_s;
	uint32_t tx_depth, mtu, dscp, ack_every, retry_cnt, burst_pkts, start_psn;
	double rate_mbps, rto_ms, drain_s, wake_us;
	int cc_dcqcn, like_rxe, placement_ooo;
	uint32_t spray, reorder_pkts;
	uint16_t src_port;
};

struct app {
	struct opts o;
	struct host h;
	struct qp_requester req[MAX_QPS];
	uint64_t t0, t_last_completion;
};

static void usage(FILE *f)
{
	fprintf(f,
		"usage: roce_bw --server --out FILE.json [--duration S] [--rate-mbps R]\n"
		"       roce_bw --client SERVER_IP --out FILE.json [--qps N] [--size BYTES]\n"
		"               (--iters N | --duration S) [--tx-depth D] [--mtu M]\n"
		"               [--rate-mbps R] [--cc dcqcn|none] [--dscp D] [--src-port P]\n"
		"               [--ack-every N] [--rto-ms MS] [--retry-cnt N] [--burst PKTS]\n"
		"               [--psn START] [--drain-s S] [--wake-us US] [--like rxe]\n"
		"               [--spray N]   (server: [--placement gbn|ooo] [--reorder-pkts N])\n");
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
		{"like", required_argument, 0, 'L'}, {"spray", required_argument, 0, 'Y'},
		{"placement", required_argument, 0, 'O'},
		{"reorder-pkts", required_argument, 0, 'K'}, {"help", no_argument, 0, 'h'},
		{0, 0, 0, 0}};
	*o = (struct opts){.qps = 1, .size = 65536, .tx_depth = 16, .mtu = 1024, .dscp = 26,
			   .ack_every = 64, .retry_cnt = 7, .burst_pkts = 4, .rate_mbps = 100,
			   .rto_ms = 4, .drain_s = -1, .wake_us = 100, .cc_dcqcn = 1,
			   .reorder_pkts = HOST_REORDER_PKTS};
	opterr = 0;
	int c, idx;
	while ((c = getopt_long(argc, argv, "", longs, &idx)) != -1) {
		switch (c) {
		case 'S': o->server = 1; break;
		case 'c': o->server_ip = optarg; break;
		case 'o': o->out = optarg; break;
		case 'q': o->qps = (int)host_int_opt("qps", optarg, 1, MAX_QPS); break;
		case 's': o->size = host_int_opt("size", optarg, 1, 1u << 30); break;
		case 'n': o->iters = host_int_opt("iters", optarg, 1, 1e12); break;
		case 'D': o->duration_s = host_num_opt("duration", optarg, 0.001, 1e6); break;
		case 't': o->tx_depth = (uint32_t)host_int_opt("tx-depth", optarg, 1, 65536); break;
		case 'm': {
			o->mtu = (uint32_t)host_int_opt("mtu", optarg, 256, 4096);
			if (o->mtu & (o->mtu - 1))
				host_bad_opt("mtu", "must be one of 256, 512, 1024, 2048, 4096");
			break;
		}
		case 'r': o->rate_mbps = host_num_opt("rate-mbps", optarg, 0.01, 100000); break;
		case 'C':
			if (strcmp(optarg, "dcqcn") && strcmp(optarg, "none"))
				host_bad_opt("cc", "must be dcqcn or none");
			o->cc_dcqcn = !strcmp(optarg, "dcqcn");
			break;
		case 'd': o->dscp = (uint32_t)host_int_opt("dscp", optarg, 0, 63); break;
		case 'p': o->src_port = (uint16_t)host_int_opt("src-port", optarg, 1, 65535); break;
		case 'a': o->ack_every = (uint32_t)host_int_opt("ack-every", optarg, 1, 1 << 20); break;
		case 'R': o->rto_ms = host_num_opt("rto-ms", optarg, 0.01, 60000); break;
		case 'y': o->retry_cnt = (uint32_t)host_int_opt("retry-cnt", optarg, 0, 1000); break;
		case 'b': o->burst_pkts = (uint32_t)host_int_opt("burst", optarg, 1, HOST_BATCH); break;
		case 'P': o->start_psn = (uint32_t)host_int_opt("psn", optarg, 0, ROCE_PSN_MASK); break;
		case 'x': o->drain_s = host_num_opt("drain-s", optarg, 0, 3600); break;
		case 'w': o->wake_us = host_num_opt("wake-us", optarg, 0, 100000); break;
		case 'L':
			/* rxe's rules (qp.h), for bench/rxe_check.py to hold the lab to rxe */
			if (strcmp(optarg, "rxe"))
				host_bad_opt("like", "must be rxe");
			o->like_rxe = 1;
			break;
		case 'Y':
		case 'O':
		case 'K':
			host_multipath_opt(c, optarg, &o->spray, &o->placement_ooo,
					   &o->reorder_pkts);
			break;
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
		host_bad_opt("client", "unexpected argument (options only)");
	if (o->server == !!o->server_ip)
		host_bad_opt("server", "give exactly one of --server and --client SERVER_IP");
	if (!o->out)
		host_bad_opt("out", "is required");
	if (!o->server && !o->iters == !(o->duration_s > 0))
		host_bad_opt("iters", "a client needs exactly one of --iters and --duration");
	if (o->src_port && o->src_port + o->qps - 1 > 65535)
		host_bad_opt("src-port", "P + qps - 1 must stay a port number");
	if (o->src_port && o->spray > 1 && o->src_port + o->qps - 1 + o->spray - 1 > 65535)
		host_bad_opt("spray", "P + qps - 1 + N - 1 must stay a port number");
	if (o->drain_s < 0)  /* long enough for every retry of the last messages */
		o->drain_s = 1.0 + o->rto_ms * (o->retry_cnt + 1) / 1000.0;
}

static void start_client(struct app *a, uint64_t now)
{
	struct in_addr in;
	if (inet_pton(AF_INET, a->o.server_ip, &in) != 1)
		host_bad_opt("client", "not an IPv4 address");
	a->h.remote_addr = ntohl(in.s_addr);
	a->h.local_addr = host_route_source(a->h.remote_addr, "no route to the server");
	/* QPNs from the PID: a restarted client is a new connection to a running server. */
	a->h.qpn_base = 0x100 + (uint32_t)(getpid() % 32768) * 256;
	struct qp_config c = {
		.mtu = a->o.mtu, .msg_size = a->o.size, .tx_depth = a->o.tx_depth,
		.iters = a->o.iters, .ackreq_every = a->o.ack_every,
		.rto_ns = (uint64_t)(a->o.rto_ms * 1e6), .retry_cnt = a->o.retry_cnt,
		.start_psn = a->o.start_psn, .cc_dcqcn = a->o.cc_dcqcn,
		.line_rate_bps = a->o.rate_mbps * 1e6, .burst_pkts = a->o.burst_pkts,
		.max_unacked = a->o.like_rxe ? RXE_MAX_UNACKED_PSNS : 0,
		.nak_once_per_retry = a->o.like_rxe, .spray = a->o.spray};
	for (int i = 0; i < a->o.qps; i++) {
		uint32_t qpn = a->h.qpn_base + 2 * (uint32_t)i;
		c.sport = roce_udp_sport(qpn, a->o.src_port ? (uint16_t)(a->o.src_port + i) : 0, 0, 0);
		if (qp_req_init(&a->req[i], &c, qpn, qpn + 1, now)) {
			fprintf(stderr, "roce_bw: out of memory\n");
			exit(1);
		}
		a->h.nreq++;
	}
}

static int clients_done(struct app *a)
{
	for (int i = 0; i < a->h.nreq; i++)
		if (!qp_req_done(&a->req[i]))
			return 0;
	return 1;
}

static void write_json(struct app *a, uint64_t end, const char *error);

static int run(struct app *a)
{
	uint64_t now = host_now_ns();
	a->t0 = now;
	uint64_t t_end = a->o.duration_s > 0 ? now + (uint64_t)(a->o.duration_s * 1e9) :
					       UINT64_MAX;
	uint64_t t_drain = UINT64_MAX;
	if (!a->o.server)
		start_client(a, now);
	const char *error = NULL;
	char why[256];
	for (;;) {
		if (a->h.readable)
			host_receive(&a->h);
		now = host_now_ns();
		for (int i = 0; i < a->h.nreq; i++) {
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
		if (error || host_stop_signal)
			break;
		if (now >= t_end && t_drain == UINT64_MAX) {
			if (a->o.server)
				break;
			for (int i = 0; i < a->h.nreq; i++)
				qp_req_stop_posting(&a->req[i]);
			t_drain = now + (uint64_t)(a->o.drain_s * 1e9);
		}
		if (!a->o.server && clients_done(a))
			break;
		if (now >= t_drain) {
			uint64_t left = 0;
			for (int i = 0; i < a->h.nreq; i++)
				left += a->req[i].n.messages_posted - a->req[i].n.messages_completed;
			snprintf(why, sizeof(why), "%llu messages not completed %.1f s after the end",
				 (unsigned long long)left, a->o.drain_s);
			error = why;
			break;
		}
		host_send_ready(&a->h, now);
		host_flush(&a->h);
		uint64_t wake = host_next_wake(&a->h, now);
		if (t_end < wake && t_drain == UINT64_MAX)
			wake = t_end;
		if (t_drain < wake)
			wake = t_drain;
		host_wait(&a->h, wake);
	}
	host_flush(&a->h);
	uint64_t end = host_now_ns();
	if (!a->o.server && !host_stop_signal && !error)
		end = a->t_last_completion ? a->t_last_completion : end;
	write_json(a, end, error);
	if (error) {
		fprintf(stderr, "roce_bw: %s\n", error);
		return 1;
	}
	return 0;
}

static void json_client(FILE *f, struct app *a, double elapsed)
{
	const struct opts *o = &a->o;
	char local[INET_ADDRSTRLEN];
	host_ip_str(a->h.local_addr, local);
	fprintf(f, "  \"server\": \"%s\", \"local\": \"%s\",\n", o->server_ip, local);
	fprintf(f, "  \"config\": {\"qps\": %d, \"size\": %llu, \"iters\": %llu, "
		"\"duration_s\": %g, \"tx_depth\": %u, \"mtu\": %u, \"rate_mbps\": %g, "
		"\"cc\": \"%s\", \"dscp\": %u, \"ack_every\": %u, \"rto_ms\": %g, "
		"\"retry_cnt\": %u, \"burst_pkts\": %u, \"start_psn\": %u, \"wake_us\": %.3f, "
		"\"like\": %s, \"spray\": %u},\n",
		o->qps, (unsigned long long)o->size, (unsigned long long)o->iters, o->duration_s,
		o->tx_depth, o->mtu, o->rate_mbps, o->cc_dcqcn ? "dcqcn" : "none", o->dscp,
		o->ack_every, o->rto_ms, o->retry_cnt, o->burst_pkts, o->start_psn,
		(double)a->h.wake_ns / 1e3, o->like_rxe ? "\"rxe\"" : "null", o->spray);
	struct qp_req_counters t = {0};
	for (int i = 0; i < a->h.nreq; i++) {
		const struct qp_req_counters *n = &a->req[i].n;
		t.packets_sent += n->packets_sent;
		t.payload_bytes_sent += n->payload_bytes_sent;
		t.wire_bytes_sent += n->wire_bytes_sent;
		t.retransmitted_packets += n->retransmitted_packets;
		t.naks_received += n->naks_received;
		t.cnps_received += n->cnps_received;
		t.rto_events += n->rto_events;
		t.naks_ignored += n->naks_ignored;
		t.messages_completed += n->messages_completed;
	}
	double good = elapsed > 0 ? (double)t.messages_completed * (double)o->size * 8 /
					    elapsed / 1e6 : 0;
	fprintf(f, "  \"goodput_mbps\": %.3f,\n  \"totals\": {", good);
	HOST_U64(f, "packets_sent", t.packets_sent); fprintf(f, ", ");
	HOST_U64(f, "payload_bytes_sent", t.payload_bytes_sent); fprintf(f, ", ");
	HOST_U64(f, "wire_bytes_sent", t.wire_bytes_sent); fprintf(f, ", ");
	HOST_U64(f, "retransmitted_packets", t.retransmitted_packets); fprintf(f, ", ");
	HOST_U64(f, "naks_received", t.naks_received); fprintf(f, ", ");
	HOST_U64(f, "cnps_received", t.cnps_received); fprintf(f, ", ");
	HOST_U64(f, "rto_events", t.rto_events); fprintf(f, ", ");
	HOST_U64(f, "naks_ignored", t.naks_ignored); fprintf(f, ", ");
	HOST_U64(f, "messages_completed", t.messages_completed);
	fprintf(f, "},\n  \"qps\": [\n");
	for (int i = 0; i < a->h.nreq; i++) {
		host_json_requester(f, &a->req[i]);
		fprintf(f, "%s\n", i + 1 < a->h.nreq ? "," : "");
	}
	fprintf(f, "  ]");
}

static void json_server(FILE *f, struct app *a)
{
	fprintf(f, "  \"config\": {\"rate_mbps\": %g, \"cnp_interval_us\": %.3f, "
		"\"placement\": \"%s\", \"reorder_pkts\": %u},\n",
		a->o.rate_mbps, (double)a->h.cnp_interval_ns / 1e3,
		a->o.placement_ooo ? "ooo" : "gbn", a->o.reorder_pkts);
	struct qp_resp_counters t = {0};
	for (int i = 0; i < a->h.npeers; i++) {
		const struct qp_resp_counters *n = &a->h.peers[i].r.n;
		t.packets_received += n->packets_received;
		t.payload_bytes_received += n->payload_bytes_received;
		t.wire_bytes_received += n->wire_bytes_received;
		t.naks_sent += n->naks_sent;
		t.cnps_sent += n->cnps_sent;
		t.ce_received += n->ce_received;
		t.messages_received += n->messages_received;
		t.placed_out_of_order += n->placed_out_of_order;
		t.out_of_sequence += n->out_of_sequence;
		t.duplicates += n->duplicates;
	}
	fprintf(f, "  \"totals\": {");
	HOST_U64(f, "packets_received", t.packets_received); fprintf(f, ", ");
	HOST_U64(f, "payload_bytes_received", t.payload_bytes_received); fprintf(f, ", ");
	HOST_U64(f, "wire_bytes_received", t.wire_bytes_received); fprintf(f, ", ");
	HOST_U64(f, "messages_received", t.messages_received); fprintf(f, ", ");
	HOST_U64(f, "placed_out_of_order", t.placed_out_of_order); fprintf(f, ", ");
	HOST_U64(f, "out_of_sequence", t.out_of_sequence); fprintf(f, ", ");
	HOST_U64(f, "duplicates", t.duplicates); fprintf(f, ", ");
	HOST_U64(f, "naks_sent", t.naks_sent); fprintf(f, ", ");
	HOST_U64(f, "cnps_sent", t.cnps_sent); fprintf(f, ", ");
	HOST_U64(f, "ce_received", t.ce_received);
	fprintf(f, "},\n  \"qps\": [\n");
	for (int i = 0; i < a->h.npeers; i++) {
		host_json_responder(f, &a->h.peers[i], a->t0);
		fprintf(f, "%s\n", i + 1 < a->h.npeers ? "," : "");
	}
	fprintf(f, "  ]");
}

/* The JSON goes to FILE.tmp, then is renamed: a reader never sees half of it. */
static void write_json(struct app *a, uint64_t end, const char *error)
{
	char *tmp;
	FILE *f = host_json_open(a->o.out, &tmp);
	double elapsed = (double)(end - a->t0) / 1e9;
	fprintf(f, "{\n  \"role\": \"%s\", \"elapsed_s\": %.6f, \"error\": ",
		a->o.server ? "server" : "client", elapsed);
	if (error)
		host_json_str(f, error);
	else
		fprintf(f, "null");
	fprintf(f, ", \"stopped_by_signal\": %s,\n  ", host_stop_signal ? "true" : "false");
	host_json_cpu(f);
	fprintf(f, ",\n  ");
	HOST_U64(f, "unknown_qp_packets", a->h.unknown_qp_packets); fprintf(f, ", ");
	HOST_U64(f, "malformed_packets", a->h.malformed_packets); fprintf(f, ", ");
	HOST_U64(f, "send_errors", a->h.send_errors); fprintf(f, ", ");
	HOST_U64(f, "tx_blocked", a->h.tx_blocked); fprintf(f, ",\n");
	HOST_U64(f, "tx_refused", a->h.tx_refused); fprintf(f, ",\n");
	if (a->o.server)
		json_server(f, a);
	else
		json_client(f, a, elapsed);
	fprintf(f, "\n}\n");
	host_json_close(f, tmp, a->o.out);
}

int main(int argc, char **argv)
{
	static struct app app;
	struct app *a = &app;
	host_prog = "roce_bw";
	parse_opts(argc, argv, &a->o);
	host_process_init();
	a->h.req = a->req;
	a->h.dscp = (uint8_t)a->o.dscp;
	a->h.src_port = a->o.src_port;
	a->h.placement_ooo = a->o.placement_ooo;
	a->h.reorder_pkts = a->o.reorder_pkts;
	host_init(&a->h, a->o.rate_mbps, a->o.burst_pkts, a->o.mtu, a->o.wake_us,
		  MAX_RESPONDERS);
	host_open_sockets(&a->h);
	return run(a);
}
