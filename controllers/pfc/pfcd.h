/* pfcd: Priority Flow Control (IEEE 802.1Qbb) emulated on the lab's htb ports.
 *
 * Types and limits shared by the engine's parts (config, netlink, loop, report). The
 * limits are fixed arrays on purpose: the engine allocates nothing in its 1 kHz loop
 * except reaction-time samples, and a lab rig has tens of ports, not thousands.
 */
#ifndef PFCD_H
#define PFCD_H

#include <stdbool.h>
#include <stdint.h>
#include <linux/pkt_sched.h>
#include <net/if.h>

#define MAX_NS 32          /* network namespaces (one netlink socket each) */
#define MAX_PORTS 128      /* (namespace, device) pairs named anywhere in the config */
#define MAX_WATCHED 64     /* lossless queues watched */
#define MAX_FEEDERS 64     /* upstream classes that can be paused */
#define MAX_FEEDS_PER 16   /* feeders of one watched queue */
#define NPRIO 8            /* 802.1Qbb priorities */
#define NS_PATH_MAX 256
/* Reaction samples kept per port and priority: 2^20 pauses is days of a busy port at
 * ~10 pauses/s; beyond it the maximum still counts but percentiles use the first 2^20. */
#define MAX_SAMPLES (1u << 20)

/* Defaults (README: "Config"). */
#define DEFAULT_POLL_US 1000
/* A real switch re-sends PAUSE before its quanta run out; 65535 quanta of 512 bit times
 * last 671 ms at 50 Mbit/s, so switches refresh at a fraction of that. The emulated pause
 * never expires (it is a rate, not a timer), so the refresh only counts frames. */
#define DEFAULT_REFRESH_US 3000

/* One sample set: every value for percentiles, and the maximum over all of them. */
struct samples {
    int64_t *v;
    uint32_t n, cap;
    uint64_t count;
    int64_t max;
};

/* What a switch's PFC counters hold for one port and one priority, plus what the
 * prototype measures about itself. */
struct pcounters {
    bool used, watched, fed;
    uint64_t pause_tx;       /* frames this port's queue caused (XOFF + refreshes) */
    uint64_t pause_rx;       /* frames this port, as a feeder, was sent */
    uint64_t paused_ns;      /* time this port's class was held at the pause rate */
    uint64_t xoff_events;
    uint64_t pauses;         /* 0 -> 1 transitions of this feeder (class changes) */
    uint64_t max_backlog;    /* largest backlog a poll saw, bytes */
    uint64_t xoff, xon;      /* thresholds, for the report */
    uint32_t drops_first, drops_last;
    /* drops seen at polls in XOFF and outside it: outside means the queue went from below
     * XOFF to full between two polls (a burst the poll interval cannot see) */
    uint64_t drops_in_xoff, drops_out_of_xoff;
    bool drops_seen;
    uint64_t leak_bytes;     /* sent by the class between pause ACK and resume */
    uint64_t leak_packets;
    /* what the port's other priorities sent while this one was paused: PFC stops one
     * priority, and this shows the others kept going */
    uint64_t other_bytes_paused;
    int64_t max_debt_ns;     /* htb tokens owed just before a resume */
    uint64_t change_errors;
    struct samples pause_reaction;   /* poll that saw XOFF -> ACK of the pause */
    struct samples resume_reaction;  /* poll that saw XON -> ACK of the resume */
};

struct nsock {
    char path[NS_PATH_MAX];  /* "" = pfcd's own namespace */
    char name[NS_PATH_MAX];  /* as the config wrote it, for the report */
    int fd;                  /* rtnetlink socket opened inside the namespace */
    uint32_t seq;
    bool watched;            /* polled every interval */
};

struct port {
    int ns;
    char dev[IF_NAMESIZE];
    int ifindex;
    struct pcounters pc[NPRIO];
};

struct feeder {
    int port;
    uint32_t classid;
    uint64_t rate_bps, ceil_bps, pause_bps;
    int prio;
    struct tc_htb_opt tmpl;  /* the class as dumped at start: burst, quantum, prio */
    int refs;                /* watched queues in XOFF that feed through this class */
    bool paused;
    int64_t paused_at;       /* ns, ACK of the pause */
    uint64_t bytes_at_pause, packets_at_pause, other_at_pause;
    bool have_snapshot;
};

struct watched {
    int port;
    int prio;
    uint32_t classid, leaf;
    uint64_t xoff, xon;
    int feeders[MAX_FEEDS_PER];
    int nfeeders;
    bool in_xoff;
    int64_t next_refresh;
    uint32_t backlog, drops;
    bool seen;               /* this poll's dump had the leaf */
};

struct config {
    uint32_t poll_us, refresh_us;
    uint64_t pause_bps;      /* default pause rate of a feeder, 0 = per-feeder only */
    struct nsock ns[MAX_NS];
    int nns;
    struct port ports[MAX_PORTS];
    int nports;
    struct watched w[MAX_WATCHED];
    int nw;
    struct feeder f[MAX_FEEDERS];
    int nf;
};

#endif
