/* SPDX-License-Identifier: GPL-2.0 */
/*
 * A host on the transport: what every program around the queue pairs does the same way, so
 * roce_bw (perftest's ib_write_bw) and roce_ring (one collective rank) share it: options
 * parsed into numbers, signals, the sockets (a raw one to send, UDP 4791 to receive with the
 * ECN bits), the port's pacer and its round-robin over the requesters, the responders a
 * host answers for, the one-thread event loop's wait, and the JSON pieces.
 *
 * Why a raw socket to send: the ICRC covers the IPv4 header (its ID too), so the program
 * must write every field itself; the kernel fills in none that we set (a non-zero ID is
 * kept, the checksum is rewritten to the same value). Receiving goes through a plain UDP
 * socket on 4791, with IP_RECVTOS for the ECN bits.
 *
 * Why one thread and an event loop: the lab's hosts share 2 cores; a thread per QP would
 * cost a context switch per packet. ppoll sleeps until the next packet may go or the next
 * timer is due, with the timer slack at 1 ns so the wake is where the pacer asked.
 */
#ifndef FABRICLAB_ROCE_HOST_H
#define FABRICLAB_ROCE_HOST_H

#include <netinet/in.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/socket.h>

#include "qp.h"
#include "wire.h"

#define HOST_BATCH 64
#define HOST_BUF_LEN (ROCE_MAX_PKT + 64)
/* What the raw socket may have queued below it, in the host's NIC queue (SO_SNDBUF; the
 * kernel doubles it and charges each packet's buffer, ~2.3 kB for a 1 kB RoCE MTU): about
 * seven packets. A NIC's transmit stops when its port is paused, and a QP's timers run
 * from the packets it put on the wire; a host qdisc that held a megabyte of paused packets
 * would start them seconds early (spurious timeouts, go-back-N into a full queue, drops a
 * NIC never makes). With the socket's buffer full, sending stops until it drains. */
#define HOST_NIC_QUEUE_BYTES 8192
/* A port's queue that refused a packet has room again once one packet has left it: a
 * 1 kB packet leaves a 50 Mbit/s port in 170 us. */
#define HOST_REFUSED_RETRY_NS 200000ull

/* The program's name, for its one-line messages ("roce_bw: --size: ..."). */
extern const char *host_prog;
/* SIGINT or SIGTERM arrived (they are delivered only inside host_wait). */
extern volatile sig_atomic_t host_stop_signal;

uint64_t host_now_ns(void);
/* A bad option: one line naming it, exit 2 (as argparse does). */
void host_bad_opt(const char *name, const char *why) __attribute__((noreturn));
/* A number in lo..hi, or host_bad_opt. */
double host_num_opt(const char *name, const char *s, double lo, double hi);
/* A whole number in lo..hi (lo >= 0), or host_bad_opt. */
uint64_t host_int_opt(const char *name, const char *s, double lo, double hi);
/* The sprayer's and its receivers' options, shared by the programs with QPs: --spray N
 * ('Y'), --placement gbn|ooo ('O'), --reorder-pkts N ('K'). Sets the one option c names,
 * returns 1; 0 when c is none of them. */
int host_multipath_opt(int c, const char *arg, uint32_t *spray, int *placement_ooo,
		       uint32_t *reorder_pkts);
/* --reorder-pkts' default, every program's */
#define HOST_REORDER_PKTS 64
/* A system call failed: one line (what, and errno's text), exit 1. */
void host_die(const char *what) __attribute__((noreturn));
/* Timer slack 1 ns, SIGINT/SIGTERM caught and blocked outside host_wait. */
void host_process_init(void);

/* A requester's QP as this host answers for it: found by (remote address, QPN). */
struct host_peer {
	uint32_t addr;          /* the requester's host, host order */
	uint32_t local;         /* our address it wrote to: the source of our answers */
	uint8_t dscp;           /* the data's DSCP, which our ACKs travel with */
	/* the UDP source port of its latest packet, our answers' source port: an answer takes
	 * the reverse of the path its data's 5-tuple hashed to, and is counted with it */
	uint16_t reply_port;
	struct qp_responder r;
	int touched;
};

struct host {
	/* The program sets these. Requester i has QPN qpn_base + 2i and writes to remote_addr
	 * from local_addr, UDP source port src_port + i (0: from the QPN), DSCP dscp. */
	struct qp_requester *req;
	int nreq;
	uint32_t qpn_base;
	uint32_t local_addr, remote_addr;
	uint16_t src_port;
	uint8_t dscp;
	/* the responders' placement (qp_resp_set_placement) */
	int placement_ooo;
	uint32_t reorder_pkts;
	/* A responder is made for a new (address, QPN) whose first packet is a WRITE First or
	 * Only at ROCE_VA_BASE, up to max_peers, from peer_only (0: from any address). */
	uint32_t peer_only;
	int max_peers;
	struct host_peer *peers;
	int npeers;
	uint64_t cnp_interval_ns;
	/* counters */
	uint64_t unknown_qp_packets, malformed_packets, send_errors;
	/* times the NIC queue was full and sending stopped until it drained (PFC pausing the
	 * host's port, or a slower port than the pacer's rate) */
	uint64_t tx_blocked;
	/* of those, times the port's queue refused a packet (its qdisc dropped it on entry):
	 * the packet waits and goes again, as a NIC loses nothing it could not queue */
	uint64_t tx_refused;
	/* the event loop's own */
	int rx, tx;
	int rr;                 /* the requester that goes first next round */
	int blocked;            /* the NIC queue is full: packets wait in txm, none are made */
	uint64_t retry_ns;      /* blocked by a refusal: try again then (POLLOUT cannot say) */
	int readable;           /* the last wait said the socket has packets */
	int touched[HOST_BATCH];
	int ntouched;
	struct pacer port;
	uint16_t ip_id;
	uint64_t wake_ns, last_send_ns;  /* the pacer's shortest sleep, and its last send */
	/* packets queued for one sendmmsg */
	struct mmsghdr txm[HOST_BATCH];
	struct iovec txv[HOST_BATCH];
	struct sockaddr_in txa[HOST_BATCH];
	uint8_t (*txbuf)[HOST_BUF_LEN];
	int ntx;
	/* one recvmmsg's buffers */
	struct mmsghdr rxm[HOST_BATCH];
	struct iovec rxv[HOST_BATCH];
	struct sockaddr_in rxa[HOST_BATCH];
	uint8_t (*rxbuf)[HOST_BUF_LEN];
	uint8_t rxctl[HOST_BATCH][128];
};

/* Buffers, the port's pacer (rate_mbps of wire bits, a bucket of burst_pkts full packets
 * of mtu), the shortest sleep after a send (wake_us, at most what the bucket holds beyond
 * one packet), the CNP interval for rate_mbps, room for max_peers responders. */
void host_init(struct host *h, double rate_mbps, uint32_t burst_pkts, uint32_t mtu,
	       double wake_us, int max_peers);
/* UDP 4791 bound (one endpoint per namespace) and the raw socket. */
void host_open_sockets(struct host *h);
/* This host's address towards dst (the ICRC covers it, so it must be known before the
 * first packet); host_die(why) without a route. */
uint32_t host_route_source(uint32_t dst, const char *why);
/* Queue one packet (sent at the next host_flush, or when the batch is full). */
void host_queue(struct host *h, uint32_t saddr, uint32_t daddr, uint16_t sport, uint8_t tos,
		const struct roce_hdr *hdr, size_t payload);
void host_flush(struct host *h);
/* Drain the receive socket (a bounded number of batches, so sending is not starved): data
 * to the responders, ACKs/NAKs/CNPs to the requesters, then the ACKs, NAKs and CNPs owed. */
void host_receive(struct host *h);
/* Send what the pacers allow: one packet per requester per round (round-robin, as a NIC's
 * scheduler shares the port), each within its own rate, all within the port's. */
void host_send_ready(struct host *h, uint64_t now);
/* When the loop must wake next for the requesters: the first packet a pacer lets go (not
 * sooner than wake_ns after the last send) and every QP's next timer. UINT64_MAX: never. */
uint64_t host_next_wake(struct host *h, uint64_t now);
/* Sleep until wake (at most 100 ms), a packet, or SIGINT/SIGTERM (host_stop_signal). */
void host_wait(struct host *h, uint64_t wake);

/* JSON pieces. */
#define HOST_U64(f, name, v) fprintf(f, "\"%s\": %llu", name, (unsigned long long)(v))
void host_ip_str(uint32_t addr, char *buf);   /* buf: INET_ADDRSTRLEN */
void host_json_str(FILE *f, const char *s);
/* "cpu": {"user_s", "sys_s"} from getrusage. */
void host_json_cpu(FILE *f);
/* One requester's counters, one responder's (first_s/last_s from t0), as roce_bw reports
 * them (README.md), indented for a list. */
void host_json_requester(FILE *f, struct qp_requester *q);
void host_json_responder(FILE *f, const struct host_peer *p, uint64_t t0);
/* FILE.tmp opened (*tmp: its name, to pass to host_json_close, which renames it to out, so
 * a reader never sees half a file); host_die on failure. */
FILE *host_json_open(const char *out, char **tmp);
void host_json_close(FILE *f, char *tmp, const char *out);

#endif
