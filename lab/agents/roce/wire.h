/* SPDX-License-Identifier: GPL-2.0 */
/*
 * RoCEv2 packets as they go on the wire: IPv4 / UDP 4791 / BTH / RETH or AETH / payload /
 * ICRC (InfiniBand Architecture Specification, Annex A17), built and parsed here and
 * nowhere else, so the transport (qp.c), the program (roce_bw.c) and the unit test agree
 * on every byte.
 *
 * PSNs are 24-bit and wrap: compare them only with roce_psn_diff.
 */
#ifndef FABRICLAB_ROCE_WIRE_H
#define FABRICLAB_ROCE_WIRE_H

#include <stddef.h>
#include <stdint.h>

#define ROCE_UDP_PORT 4791
#define ROCE_IPV4_LEN 20
#define ROCE_UDP_LEN 8
#define ROCE_BTH_LEN 12
#define ROCE_RETH_LEN 16
#define ROCE_AETH_LEN 4
#define ROCE_CNP_PAD_LEN 16
#define ROCE_ICRC_LEN 4
/* What a packet of IP length n costs on the Ethernet wire: the 14-byte Ethernet header, the
 * FCS (4), preamble (8) and inter-frame gap (12), as the lab's port size table counts. */
#define ROCE_ETH_OVERHEAD 38
#define ROCE_PSN_MASK 0xffffffu
#define ROCE_QPN_MASK 0xffffffu
#define ROCE_PKEY_DEFAULT 0xffff
/* The largest IP packet this code builds: a 4096-byte payload with RETH. */
#define ROCE_MAX_PKT (ROCE_IPV4_LEN + ROCE_UDP_LEN + ROCE_BTH_LEN + ROCE_RETH_LEN + 4096 + \
		      ROCE_ICRC_LEN)

enum roce_opcode {
	ROCE_OP_WRITE_FIRST = 0x06,
	ROCE_OP_WRITE_MIDDLE = 0x07,
	ROCE_OP_WRITE_LAST = 0x08,
	ROCE_OP_WRITE_ONLY = 0x0a,
	ROCE_OP_ACK = 0x11,
	ROCE_OP_CNP = 0x81,
};

/* AETH syndromes: bits 7..5 say ACK (000) or NAK (011); an ACK's low 5 bits are credits
 * (31: "invalid", i.e. no end-to-end flow control, which is what this responder offers),
 * a NAK's are its code (0: PSN sequence error). */
#define ROCE_AETH_ACK_NO_CREDITS 0x1f
#define ROCE_AETH_NAK_PSN_SEQ 0x60
#define ROCE_AETH_IS_NAK(s) (((s) & 0xe0) == 0x60)

/* DSCPs and ECN codepoints: data is ECN-capable so a switch can mark it; CNPs are not, and
 * travel in their own class (DSCP 48, mlx5's cnp_dscp default). */
#define ROCE_DSCP_DATA_DEFAULT 26
#define ROCE_DSCP_CNP 48
#define ROCE_ECN_NOT_ECT 0
#define ROCE_ECN_ECT0 2
#define ROCE_ECN_CE 3

/* The IP and UDP fields of one packet (addresses and ports in host byte order). */
struct roce_ip {
	uint32_t saddr, daddr;
	uint16_t sport;        /* per-QP entropy for ECMP; dport is always 4791 */
	uint16_t ip_id;        /* non-zero: the kernel would fill a zero one after the ICRC */
	uint8_t tos;           /* DSCP << 2 | ECN */
	uint8_t ttl;
};

/* The transport headers of one packet. */
struct roce_hdr {
	uint8_t opcode;
	uint8_t se, mig, pad; /* solicited event, migration state, pad count (0..3) */
	uint16_t pkey;
	uint32_t dqpn;
	uint8_t ackreq;
	uint8_t resv8a;        /* BTH byte 4: FECN/BECN in IB, reserved in RoCEv2 */
	uint32_t psn;
	/* RETH (WRITE First and Only) */
	uint64_t va;
	uint32_t rkey;
	uint32_t dma_len;
	/* AETH (Acknowledge) */
	uint8_t syndrome;
	uint32_t msn;
};

/* Bytes of extension headers an opcode carries after the BTH (RETH, AETH, the CNP's 16
 * reserved bytes); -1 for an opcode this transport does not speak. */
int roce_ext_len(uint8_t opcode);
/* True for the opcodes that carry payload. */
int roce_has_payload(uint8_t opcode);

/* Build a whole IPv4 packet into buf: IPv4 (DF, TTL, TOS, ID, checksum), UDP (checksum 0,
 * as RoCEv2 over IPv4 allows), BTH, extension header, payload_len zero bytes plus the pad
 * count h->pad of zeros, ICRC. Returns the IP packet's length, or 0 when it does not fit
 * in cap or the opcode is unknown. The payload is zeros: there is no registered memory. */
size_t roce_build(uint8_t *buf, size_t cap, const struct roce_ip *ip,
		  const struct roce_hdr *h, size_t payload_len);

/* Parse a UDP payload (BTH onwards, as a UDP socket delivers it). Fills h and, when not
 * NULL, *payload_len (pad excluded). Returns 0, or -1 for a packet too short, of an
 * unknown opcode, or whose pad count exceeds its payload. The ICRC is not checked: it
 * covers IP header fields (the ID) a UDP socket does not deliver. */
int roce_parse(const uint8_t *udp_payload, size_t len, struct roce_hdr *h,
	       size_t *payload_len);

/* The ICRC of a whole IPv4 RoCEv2 packet of ip_len bytes whose last 4 bytes are the ICRC
 * field: the value as stored on the wire (little-endian, the complement of the CRC). */
uint32_t roce_icrc(const uint8_t *ip_pkt, size_t ip_len);

/* CRC-32 (the zlib/Ethernet polynomial, reflected) continued from crc, without the
 * pre/post inversion: the building block, exported so the unit test can check it. */
uint32_t roce_crc32_raw(uint32_t crc, const uint8_t *p, size_t n);

/* PSN arithmetic modulo 2^24. */
uint32_t roce_psn_add(uint32_t psn, uint32_t n);
/* a - b as a signed distance: positive when a is ahead of b, within half the PSN space. */
int32_t roce_psn_diff(uint32_t a, uint32_t b);

#endif
