// SPDX-License-Identifier: GPL-2.0
/*
 * RoCEv2 packet formats and the ICRC, written from the InfiniBand Architecture
 * Specification (Annex A17, RoCEv2): see wire.h for what each function promises.
 */
#include "wire.h"

#include <string.h>

/* Slicing-by-8 tables for the reflected CRC-32 polynomial 0xEDB88320: the ICRC covers every
 * payload byte, and a byte-at-a-time loop would cost as much CPU as the pacing itself. */
static uint32_t crc_tab[8][256];
static int crc_ready;

static void crc_init(void)
{
	for (uint32_t i = 0; i < 256; i++) {
		uint32_t c = i;
		for (int k = 0; k < 8; k++)
			c = (c & 1) ? (c >> 1) ^ 0xedb88320u : c >> 1;
		crc_tab[0][i] = c;
	}
	for (uint32_t i = 0; i < 256; i++)
		for (int t = 1; t < 8; t++)
			crc_tab[t][i] = (crc_tab[t - 1][i] >> 8) ^ crc_tab[0][crc_tab[t - 1][i] & 0xff];
	crc_ready = 1;
}

uint32_t roce_crc32_raw(uint32_t crc, const uint8_t *p, size_t n)
{
	if (!crc_ready)
		crc_init();
	while (n >= 8) {
		uint32_t lo = crc ^ ((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
				     (uint32_t)p[3] << 24);
		crc = crc_tab[7][lo & 0xff] ^ crc_tab[6][(lo >> 8) & 0xff] ^
		      crc_tab[5][(lo >> 16) & 0xff] ^ crc_tab[4][lo >> 24] ^
		      crc_tab[3][p[4]] ^ crc_tab[2][p[5]] ^ crc_tab[1][p[6]] ^ crc_tab[0][p[7]];
		p += 8;
		n -= 8;
	}
	while (n--)
		crc = (crc >> 8) ^ crc_tab[0][(crc ^ *p++) & 0xff];
	return crc;
}

uint32_t roce_psn_add(uint32_t psn, uint32_t n)
{
	return (psn + n) & ROCE_PSN_MASK;
}

int32_t roce_psn_diff(uint32_t a, uint32_t b)
{
	/* Shift the 24-bit difference into the top of 32 bits and back: sign extension. */
	return (int32_t)(((a - b) & ROCE_PSN_MASK) << 8) >> 8;
}

int roce_ext_len(uint8_t opcode)
{
	switch (opcode) {
	case ROCE_OP_WRITE_FIRST:
	case ROCE_OP_WRITE_ONLY:
		return ROCE_RETH_LEN;
	case ROCE_OP_WRITE_MIDDLE:
	case ROCE_OP_WRITE_LAST:
		return 0;
	case ROCE_OP_ACK:
		return ROCE_AETH_LEN;
	case ROCE_OP_CNP:
		return ROCE_CNP_PAD_LEN;
	default:
		return -1;
	}
}

int roce_has_payload(uint8_t opcode)
{
	return opcode == ROCE_OP_WRITE_FIRST || opcode == ROCE_OP_WRITE_MIDDLE ||
	       opcode == ROCE_OP_WRITE_LAST || opcode == ROCE_OP_WRITE_ONLY;
}

static void put16(uint8_t *p, uint32_t v)
{
	p[0] = v >> 8;
	p[1] = v;
}

static void put24(uint8_t *p, uint32_t v)
{
	p[0] = v >> 16;
	p[1] = v >> 8;
	p[2] = v;
}

static void put32(uint8_t *p, uint32_t v)
{
	p[0] = v >> 24;
	p[1] = v >> 16;
	p[2] = v >> 8;
	p[3] = v;
}

static uint32_t get16(const uint8_t *p)
{
	return (uint32_t)p[0] << 8 | p[1];
}

static uint32_t get24(const uint8_t *p)
{
	return (uint32_t)p[0] << 16 | (uint32_t)p[1] << 8 | p[2];
}

static uint32_t get32(const uint8_t *p)
{
	return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static uint16_t ip_checksum(const uint8_t *p, size_t n)
{
	uint32_t sum = 0;
	for (size_t i = 0; i + 1 < n; i += 2)
		sum += get16(p + i);
	while (sum >> 16)
		sum = (sum & 0xffff) + (sum >> 16);
	return (uint16_t)~sum;
}

uint32_t roce_icrc(const uint8_t *pkt, size_t ip_len)
{
	/* The invariant CRC covers what no router may change. Fields a hop rewrites are
	 * replaced by ones: the 8-byte LRH of an IB packet (RoCEv2 has none: all ones), and
	 * in IPv4 the TOS (ECN marking, DSCP rewriting), TTL and header checksum, the UDP
	 * checksum, and BTH byte 4 (the reserved byte after the P_Key). */
	uint8_t masked[8 + ROCE_IPV4_LEN + ROCE_UDP_LEN + ROCE_BTH_LEN];
	const size_t hdrs = sizeof(masked) - 8;

	if (ip_len < hdrs + ROCE_ICRC_LEN)
		return 0;
	memset(masked, 0xff, 8);
	memcpy(masked + 8, pkt, hdrs);
	uint8_t *ip = masked + 8;
	ip[1] = 0xff;                    /* TOS */
	ip[8] = 0xff;                    /* TTL */
	ip[10] = ip[11] = 0xff;          /* header checksum */
	uint8_t *udp = ip + ROCE_IPV4_LEN;
	udp[6] = udp[7] = 0xff;          /* UDP checksum */
	udp[ROCE_UDP_LEN + 4] = 0xff;    /* BTH resv8a */

	uint32_t crc = roce_crc32_raw(0xffffffffu, masked, sizeof(masked));
	crc = roce_crc32_raw(crc, pkt + hdrs, ip_len - hdrs - ROCE_ICRC_LEN);
	/* The CRC's complement, stored least significant byte first (as rxe stores it). */
	return ~crc;
}

size_t roce_build(uint8_t *buf, size_t cap, const struct roce_ip *ip,
		  const struct roce_hdr *h, size_t payload_len)
{
	int ext = roce_ext_len(h->opcode);
	if (ext < 0)
		return 0;
	size_t body = roce_has_payload(h->opcode) ? payload_len + (h->pad & 3) : 0;
	size_t len = ROCE_IPV4_LEN + ROCE_UDP_LEN + ROCE_BTH_LEN + (size_t)ext + body +
		     ROCE_ICRC_LEN;
	if (len > cap || len > 0xffff)
		return 0;

	uint8_t *p = buf;
	p[0] = 0x45;                     /* IPv4, 20-byte header */
	p[1] = ip->tos;
	put16(p + 2, (uint32_t)len);
	put16(p + 4, ip->ip_id);
	put16(p + 6, 0x4000);            /* DF: RoCE is never fragmented */
	p[8] = ip->ttl;
	p[9] = 17;                       /* UDP */
	put16(p + 10, 0);
	put32(p + 12, ip->saddr);
	put32(p + 16, ip->daddr);
	put16(p + 10, ip_checksum(p, ROCE_IPV4_LEN));

	p += ROCE_IPV4_LEN;
	put16(p, ip->sport);
	put16(p + 2, ROCE_UDP_PORT);
	put16(p + 4, (uint32_t)(len - ROCE_IPV4_LEN));
	put16(p + 6, 0);                 /* no UDP checksum: the ICRC protects the packet */

	p += ROCE_UDP_LEN;
	p[0] = h->opcode;
	p[1] = (uint8_t)((h->se & 1) << 7 | (h->mig & 1) << 6 | (h->pad & 3) << 4);  /* TVer 0 */
	put16(p + 2, h->pkey);
	p[4] = h->resv8a;
	put24(p + 5, h->dqpn & ROCE_QPN_MASK);
	p[8] = (uint8_t)((h->ackreq & 1) << 7);
	put24(p + 9, h->psn & ROCE_PSN_MASK);

	p += ROCE_BTH_LEN;
	if (h->opcode == ROCE_OP_WRITE_FIRST || h->opcode == ROCE_OP_WRITE_ONLY) {
		put32(p, (uint32_t)(h->va >> 32));
		put32(p + 4, (uint32_t)h->va);
		put32(p + 8, h->rkey);
		put32(p + 12, h->dma_len);
	} else if (h->opcode == ROCE_OP_ACK) {
		p[0] = h->syndrome;
		put24(p + 1, h->msn);
	} else if (h->opcode == ROCE_OP_CNP) {
		memset(p, 0, ROCE_CNP_PAD_LEN);
	}
	p += ext;
	memset(p, 0, body);
	p += body;

	uint32_t icrc = roce_icrc(buf, len);
	p[0] = icrc;
	p[1] = icrc >> 8;
	p[2] = icrc >> 16;
	p[3] = icrc >> 24;
	return len;
}

int roce_parse(const uint8_t *b, size_t len, struct roce_hdr *h, size_t *payload_len)
{
	if (len < ROCE_BTH_LEN + ROCE_ICRC_LEN)
		return -1;
	memset(h, 0, sizeof(*h));
	h->opcode = b[0];
	h->se = b[1] >> 7;
	h->mig = (b[1] >> 6) & 1;
	h->pad = (b[1] >> 4) & 3;
	h->pkey = (uint16_t)get16(b + 2);
	h->resv8a = b[4];
	h->dqpn = get24(b + 5);
	h->ackreq = b[8] >> 7;
	h->psn = get24(b + 9);
	int ext = roce_ext_len(h->opcode);
	if (ext < 0 || len < (size_t)(ROCE_BTH_LEN + ext + ROCE_ICRC_LEN))
		return -1;
	const uint8_t *e = b + ROCE_BTH_LEN;
	if (h->opcode == ROCE_OP_WRITE_FIRST || h->opcode == ROCE_OP_WRITE_ONLY) {
		h->va = (uint64_t)get32(e) << 32 | get32(e + 4);
		h->rkey = get32(e + 8);
		h->dma_len = get32(e + 12);
	} else if (h->opcode == ROCE_OP_ACK) {
		h->syndrome = e[0];
		h->msn = get24(e + 1);
	}
	size_t body = len - ROCE_BTH_LEN - (size_t)ext - ROCE_ICRC_LEN;
	if (!roce_has_payload(h->opcode))
		body = 0;
	if (body < h->pad)
		return -1;
	if (payload_len)
		*payload_len = body - h->pad;
	return 0;
}
