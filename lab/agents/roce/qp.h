/* SPDX-License-Identifier: GPL-2.0 */
/*
 * One reliable-connection (RC) queue pair: the requester (RDMA WRITE messages split into
 * MTU packets, a send queue of tx_depth messages, ACK/NAK handling with go-back-N, a
 * retransmission timer and retry limit, DCQCN's reaction point and a token-bucket pacer)
 * and the responder (expected PSN, one NAK per gap, coalesced ACKs, the CNP notification
 * point), with the counters a NIC reports.
 *
 * No I/O and no clock: the caller passes the time (ns, any monotonic clock) and the parsed
 * headers, and asks for the headers of the next packet to send. The perftest-like program
 * (roce_bw.c) and collective ranks share it.
 */
#ifndef FABRICLAB_ROCE_QP_H
#define FABRICLAB_ROCE_QP_H

#include <stddef.h>
#include <stdint.h>

#include "dcqcn.h"
#include "wire.h"

/* The remote buffer every WRITE targets (there is no memory registration: the responder
 * discards payload). Message m writes at ROCE_VA_BASE + m * size; the responder takes a
 * First/Only packet at ROCE_VA_BASE as a new connection's first message. */
#define ROCE_VA_BASE 0x10000000ull
#define ROCE_RKEY 0x1234
/* Rate samples (every QP_SAMPLE_NS) kept per QP: 60 s worth, then sampling stops. */
#define QP_SAMPLE_NS 10000000ull
#define QP_MAX_SAMPLES 6000
/* How far ahead of the expected PSN a responder placing out of order keeps packets. */
#define QP_OOO_WINDOW 4096
/* Completion latencies kept per QP for the percentiles; later ones are not recorded. */
#define QP_MAX_LATENCIES (1u << 20)

/* A token bucket in wire bytes. */
struct pacer {
	double rate_bps;
	double tokens;         /* bytes */
	double burst;          /* bytes the bucket holds at most */
	uint64_t last_ns;
};

void pacer_init(struct pacer *p, double rate_bps, double burst_bytes, uint64_t now_ns);
void pacer_refill(struct pacer *p, uint64_t now_ns);
/* When `bytes` may go (now_ns or later), after a refill at now_ns. */
uint64_t pacer_ready_at(const struct pacer *p, double bytes, uint64_t now_ns);
void pacer_take(struct pacer *p, double bytes);

struct qp_config {
	uint32_t mtu;              /* payload bytes per packet */
	uint64_t msg_size;         /* bytes per RDMA WRITE message */
	uint32_t tx_depth;         /* messages posted and not completed, at most */
	uint64_t iters;            /* messages to post in all; 0: until qp_req_stop_posting */
	uint32_t ackreq_every;     /* AckReq on every Nth packet besides each message's last */
	uint64_t rto_ns;           /* no ACK progress this long after an AckReq: go back */
	uint32_t retry_cnt;        /* consecutive timeouts/NAKs without progress tolerated */
	uint32_t start_psn;
	int cc_dcqcn;              /* 1: pace at DCQCN's rc_bps; 0: at the line rate */
	double line_rate_bps;
	uint32_t burst_pkts;       /* the pacer's bucket: this many full packets */
	uint16_t sport;            /* UDP source port (entropy for ECMP) */
	/* Soft-RoCE's (rxe's) two rules, for checking the lab against it (``--like rxe``):
	 * at most this many packets unacknowledged (rxe_param.h RXE_MAX_UNACKED_PSNS; 0: the
	 * send queue's depth is the only bound), and a NAK that arrives while a retry is under
	 * way is ignored until a message completes (rxe_comp.c's started_retry), so a second
	 * loss in the message being resent waits for the timer. */
	uint32_t max_unacked;
	int nak_once_per_retry;
	/* Packet spraying: 0 or 1, one UDP source port per QP (the switches' hash keeps the QP
	 * on one path); N > 1, each packet takes one of N entropy values in turn, as Ultra
	 * Ethernet's senders do, and the hash spreads the QP's packets over the paths. */
	uint32_t spray;
};
#define RXE_MAX_UNACKED_PSNS 128

struct qp_rate_sample {
	double t_s, rc_bps, rt_bps, alpha;
};

struct qp_req_counters {
	uint64_t packets_sent, payload_bytes_sent, wire_bytes_sent;
	uint64_t retransmitted_packets;
	uint64_t acks_received, naks_received, cnps_received;
	uint64_t rto_events;
	uint64_t naks_ignored;     /* by nak_once_per_retry */
	uint64_t messages_posted, messages_completed;
};

enum qp_state { QP_RTS, QP_ERROR };

struct qp_requester {
	struct qp_config c;
	uint32_t qpn, dqpn;
	enum qp_state state;
	const char *error;         /* why the QP went to QP_ERROR */
	uint32_t pkts_per_msg;
	/* Packet sequence numbers unwrapped to 64 bits (packet 0 is start_psn on the wire):
	 * message m is packets [m * pkts_per_msg, (m + 1) * pkts_per_msg). */
	uint64_t una;              /* oldest packet not acknowledged */
	uint64_t send_seq;         /* next packet to (re)send */
	uint64_t max_sent;         /* one past the highest packet ever sent */
	uint64_t last_ackreq;      /* highest packet sent with AckReq, +1 (0: none) */
	int posting;               /* 0 once qp_req_stop_posting was called */
	uint64_t *post_ns;         /* post time of message m at [m % tx_depth] */
	uint64_t rto_deadline;     /* 0: timer not armed */
	uint32_t retries;
	int retry_started;         /* went back since a message last completed */
	uint64_t start_ns;
	struct pacer pace;
	struct dcqcn_state cc;
	struct qp_req_counters n;
	uint64_t *lat_ns;
	size_t lat_len, lat_cap;
	struct qp_rate_sample *samples;
	size_t n_samples;
	uint64_t next_sample_ns;
};

/* Returns 0, or -1 when memory is short. Posts the first tx_depth messages at now_ns. */
int qp_req_init(struct qp_requester *q, const struct qp_config *c, uint32_t qpn,
		uint32_t dqpn, uint64_t now_ns);
void qp_req_free(struct qp_requester *q);
/* Post no more messages (a --duration run's end); the outstanding ones still complete. */
void qp_req_stop_posting(struct qp_requester *q);
/* Raise the messages to post in all (a QP made with iters > 0) to iters, and post what
 * the send queue has room for: a collective posts each chunk when its data is ready. */
void qp_req_post_upto(struct qp_requester *q, uint64_t iters, uint64_t now_ns);
/* Every posted message completed (or the QP failed): the QP has nothing left to do. */
int qp_req_done(const struct qp_requester *q);
/* The IP length of the next packet the QP would send; 0 when it has none to send now. */
size_t qp_req_next_len(const struct qp_requester *q);
/* When the pacer lets the next packet go (UINT64_MAX: no packet to send). */
uint64_t qp_req_ready_at(struct qp_requester *q, uint64_t now_ns);
/* Take the next packet: fills h and *payload_len, advances the send state, the pacer and
 * the counters (DCQCN is told the wire bytes). Returns its IP length, 0 if none. */
size_t qp_req_take(struct qp_requester *q, struct roce_hdr *h, size_t *payload_len,
		   uint64_t now_ns);
/* An ACK, NAK or CNP for this QP arrived. */
void qp_req_on_packet(struct qp_requester *q, const struct roce_hdr *h, uint64_t now_ns);
/* Fire what is due: the retransmission timer, DCQCN's timers, the rate sample. */
void qp_req_advance(struct qp_requester *q, uint64_t now_ns);
/* When qp_req_advance next has work (UINT64_MAX: none). */
uint64_t qp_req_next_timer(const struct qp_requester *q);
/* The rate the QP paces at now. */
double qp_req_rate_bps(const struct qp_requester *q);
/* Completion latency percentiles over the recorded messages (q in 0..100); sorts them. */
double qp_req_latency_pct(struct qp_requester *q, double pct);

/* The UDP source port of a QP's packet seq: the one place that chooses it. base 0
 * derives it from the QPN (49152..65535); spray > 1 varies it per packet over spray
 * values (base + 0..spray-1, or spray values hashed with the QPN). */
uint16_t roce_udp_sport(uint32_t qpn, uint16_t base, uint64_t seq, uint32_t spray);

struct qp_resp_counters {
	uint64_t packets_received, payload_bytes_received, wire_bytes_received;
	uint64_t messages_received;
	uint64_t duplicates, out_of_sequence;
	uint64_t placed_out_of_order;  /* ahead of the expected PSN, kept (placement ooo) */
	uint64_t acks_sent, naks_sent, cnps_sent;
	uint64_t ce_received;
};

struct qp_responder {
	uint32_t qpn, peer_qpn;
	uint32_t epsn;             /* expected PSN */
	uint32_t msn;              /* messages completed, as the AETH carries */
	int nak_outstanding;       /* a NAK for epsn went out: none again until epsn arrives */
	int ack_pending, nak_pending, cnp_pending;
	uint64_t cnp_interval_ns;
	uint64_t last_cnp_ns;
	int cnp_ever;
	uint64_t first_ns, last_ns;
	/* Out-of-order placement (MRC's, Ultra Ethernet's; 0: RC's go-back-N receiver, which
	 * drops every packet after a gap): a packet up to QP_OOO_WINDOW ahead of epsn is placed
	 * and remembered; epsn then moves over what was placed. A NAK goes out only once
	 * reorder_pkts later packets have arrived past the gap: reordering is not loss. */
	int ooo;
	uint32_t reorder_pkts, past_gap;
	uint64_t placed[QP_OOO_WINDOW / 64], last[QP_OOO_WINDOW / 64];
	struct qp_resp_counters n;
};

void qp_resp_init(struct qp_responder *r, uint32_t qpn, uint32_t peer_qpn, uint32_t epsn,
		  uint64_t cnp_interval_ns);
/* Place out of order (ooo 1) with a NAK after reorder_pkts packets past a gap, or not. */
void qp_resp_set_placement(struct qp_responder *r, int ooo, uint32_t reorder_pkts);
/* A data packet for this QP; ce: its IP ECN field was CE. wire_len: its bytes as the NIC
 * counts them. */
void qp_resp_on_data(struct qp_responder *r, const struct roce_hdr *h, size_t payload_len,
		     size_t wire_len, int ce, uint64_t now_ns);
/* The ACK or NAK owed (one, coalescing what the last packets asked for): fills h and
 * returns 1, or returns 0. */
int qp_resp_response(struct qp_responder *r, struct roce_hdr *h);
/* The CNP owed: fills h and returns 1, or returns 0. */
int qp_resp_cnp(struct qp_responder *r, struct roce_hdr *h);

#endif
