// SPDX-License-Identifier: GPL-2.0
/*
 * ECN marker for one switch port: a tc clsact egress program (direct action).
 *
 * Why a virtual queue: this kernel has no RED, and a tc program runs *before* the port's
 * htb/bfifo qdisc, so it cannot see that queue. Instead it keeps a model of it, fed with
 * every packet the port sends:
 *
 *   work   a fluid queue served at exactly the htb rate R: on each packet it first drains
 *          by elapsed_ns * R / 8e9 bytes (never below 0), then takes the packet;
 *   queue  = max(0, work - B), B the htb burst. htb is a token bucket: while work < B it
 *          still has tokens and sends at once, so the bfifo behind it holds only what
 *          exceeds the bucket. (Without this, after htb had spent its burst the model sat
 *          that far above a nearly empty real queue and marked too early.)
 *
 * The decision uses the queue a packet finds on arrival, *before* it is added, as RED and
 * DCTCP switches do. Then the packet is added unless the bfifo would drop it
 * (queue + len > limit). Bytes are wire bytes, as the qdisc counts them (see `len` below).
 *
 * Marking is RED/DCQCN-shaped: p = 0 up to Kmin, rising linearly to Pmax at Kmax, 1 above
 * Kmax. A DCTCP step at K is Kmin = Kmax = K, Pmax = 1. Only IPv4 ECT(0)/ECT(1) packets
 * are marked (ECN bits set to CE, header checksum fixed). The program never drops: the
 * bfifo behind it does the tail-drop.
 *
 * Maps (one instance of each per loaded program, i.e. per port; key is always 0):
 *   ecn_config  the port's shaping and marking, written by the controller at run time. A
 *               hash map without preallocation: an update swaps in a whole new element
 *               (RCU), so the program never sees half of an old and half of a new config.
 *   ecn_state   the model and the counters, updated under a spin lock so that CPUs sending
 *               on the same port at once see one queue. Separate from the config so that
 *               changing K keeps the queue and the counters.
 */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

/* The model is kept in units of 1/8e9 byte: draining at R bit/s for t ns then removes
 * exactly t * R units, with no rounding to carry between packets. The controller keeps
 * burst + limit below 2^31 bytes, so work never overflows 64 bits. */
#define UNITS_PER_BYTE 8000000000ULL
#ifndef WIRE_OVERHEAD_BYTES
#error "build with -DWIRE_OVERHEAD_BYTES (controllers/ecn.py compile_flags)"
#endif

#define ECN_MASK 0x3
#define ECN_NOT_ECT 0x0
#define ECN_CE 0x3

struct ecn_config {
	__u64 rate_bps;     /* the port's htb rate */
	__u64 burst_bytes;  /* the htb class's burst (its token bucket) */
	__u64 limit_bytes;  /* the bfifo limit: a packet that does not fit is not queued */
	__u64 kmin_bytes;
	__u64 kmax_bytes;   /* == kmin_bytes for a step */
	__u64 pmax_x32;     /* Pmax * 2^32, in 1..2^32 */
	__u64 enabled;      /* 0: only model and count (marking off) */
};

struct ecn_state {
	struct bpf_spin_lock lock;
	__u32 pad;
	__u64 last_ns;         /* when work was last drained */
	__u64 work_units;      /* the fluid queue at rate R, in 1/8e9 byte */
	__u64 packets;         /* every packet seen (GSO super-packets count once) */
	__u64 ect;             /* IPv4 packets with ECT(0), ECT(1) or CE */
	__u64 ce_marked;       /* packets this program set to CE */
	__u64 ce_bytes;
	__u64 not_ect_over_k;  /* not ECN-capable, sent while the queue was above Kmin */
	__u64 max_vq_bytes;    /* largest modelled queue, after enqueue */
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, __u32);
	__type(value, struct ecn_config);
} ecn_config SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct ecn_state);
} ecn_state SEC(".maps");

/* Whether to mark at virtual backlog vq (bytes); rnd is uniform in [0, 2^32). */
static __always_inline int should_mark(const struct ecn_config *c, __u64 vq, __u32 rnd)
{
	if (vq > c->kmax_bytes)
		return 1;
	if (vq <= c->kmin_bytes)
		return 0;
	/* Kmin < vq <= Kmax, so Kmax > Kmin. Both are below 2^30 (the controller checks),
	 * so the product stays below 2^62. */
	return (__u64)rnd < c->pmax_x32 * (vq - c->kmin_bytes) / (c->kmax_bytes - c->kmin_bytes);
}

SEC("tc")
int ecn_mark(struct __sk_buff *skb)
{
	__u32 key = 0;
	struct ecn_config *cfgp = bpf_map_lookup_elem(&ecn_config, &key);
	struct ecn_state *st = bpf_map_lookup_elem(&ecn_state, &key);

	if (!cfgp || !st || cfgp->rate_bps == 0)
		return TC_ACT_OK;     /* not configured yet */
	struct ecn_config cfg = *cfgp;

	/* Read what we need before taking the lock: helpers cannot be called under it. */
	__be16 proto = 0;
	__u8 ip[2] = {0, 0};  /* version/IHL, TOS */
	int ipv4 = bpf_skb_load_bytes(skb, offsetof(struct ethhdr, h_proto), &proto,
				      sizeof(proto)) == 0 &&
		   proto == bpf_htons(ETH_P_IP) &&
		   bpf_skb_load_bytes(skb, ETH_HLEN, ip, sizeof(ip)) == 0 &&
		   (ip[0] >> 4) == 4;
	__u8 ecn = ipv4 ? (ip[1] & ECN_MASK) : ECN_NOT_ECT;
	__u64 now = bpf_ktime_get_ns();
	__u32 rnd = bpf_get_prandom_u32();
	/* Count bytes as the qdisc does: wire bytes. wire_len is qdisc_pkt_len() before the
	 * port's size table: each frame's bytes, a GSO super-packet's segments with their
	 * headers. The table (controllers/marking.py, wire_size_table) adds every frame's
	 * preamble, gap and FCS, and htb charges that against the rate and the bfifo against
	 * its limit; skb->len alone would make the virtual queue drain ~6% faster than the
	 * real one under TSO, and then sit empty below a full real queue. */
	__u64 frames = skb->gso_segs ? skb->gso_segs : 1;
	__u64 len = (skb->wire_len ? skb->wire_len : skb->len) + frames * WIRE_OVERHEAD_BYTES;
	__u64 len_units = len * UNITS_PER_BYTE;
	__u64 burst_units = cfg.burst_bytes * UNITS_PER_BYTE;
	int mark = 0;

	bpf_spin_lock(&st->lock);
	/* Drain. Another CPU may have taken a later timestamp first: then nothing elapsed. */
	if ((__s64)(now - st->last_ns) > 0) {
		__u64 elapsed = now - st->last_ns;

		st->last_ns = now;
		/* Divide before multiplying so a long idle time cannot overflow. */
		if (elapsed >= st->work_units / cfg.rate_bps + 1)
			st->work_units = 0;
		else
			st->work_units -= elapsed * cfg.rate_bps;
	}
	__u64 work = st->work_units;
	__u64 vq = work > burst_units ? (work - burst_units) / UNITS_PER_BYTE : 0;

	st->packets++;
	if (ecn != ECN_NOT_ECT)
		st->ect++;
	if (cfg.enabled) {
		if (ecn == ECN_NOT_ECT) {
			if (vq > cfg.kmin_bytes)
				st->not_ect_over_k++;
		} else if (ecn != ECN_CE && should_mark(&cfg, vq, rnd)) {
			mark = 1;
			st->ce_marked++;
			st->ce_bytes += len;
		}
	}
	/* Enqueue like the bfifo: a packet that does not fit is dropped there, so not added. */
	if (vq + len <= cfg.limit_bytes) {
		work += len_units;
		st->work_units = work;
		vq = work > burst_units ? (work - burst_units) / UNITS_PER_BYTE : 0;
		if (vq > st->max_vq_bytes)
			st->max_vq_bytes = vq;
	}
	bpf_spin_unlock(&st->lock);

	if (mark) {
		/* TOS is the low byte of the header's first 16-bit word: replace that word in
		 * the checksum, then store the new TOS (both helpers unshare a cloned header). */
		__u8 tos = ip[1] | ECN_CE;
		__u16 old_word, new_word;
		__u8 new_ip[2] = {ip[0], tos};

		__builtin_memcpy(&old_word, ip, sizeof(old_word));
		__builtin_memcpy(&new_word, new_ip, sizeof(new_word));
		bpf_l3_csum_replace(skb, ETH_HLEN + offsetof(struct iphdr, check), old_word,
				    new_word, sizeof(new_word));
		bpf_skb_store_bytes(skb, ETH_HLEN + offsetof(struct iphdr, tos), &tos,
				    sizeof(tos), 0);
	}
	return TC_ACT_OK;
}

char LICENSE[] SEC("license") = "GPL";
