/* pfcd: Priority Flow Control (IEEE 802.1Qbb) emulated on the lab's htb ports.
 *
 * Usage: pfcd CONFIG OUT.json
 *
 * Every poll interval it reads the backlog of each watched lossless queue (an htb class's
 * leaf qdisc) with one rtnetlink qdisc dump per network namespace. When a queue reaches
 * XOFF it "pauses" that priority on every port feeding the switch: each feeder's htb class
 * is changed (RTM_NEWTCLASS) to a pause rate; at XON the class gets its rate and ceil back.
 * On SIGTERM or SIGINT it resumes whatever is paused, writes its counters as JSON and exits
 * 0 (1 if a class could not be resumed). A bad config is one line on stderr, exit 2.
 *
 * Hand-written rtnetlink and libc only, so that it builds anywhere the lab builds C (clang
 * with the lab's flags), in one process: a Python loop at 1 kHz would cost a good part of
 * one of this machine's two cores. It starts nothing and listens on nothing.
 *
 * What a class change does to htb (net/sched/sch_htb.c, htb_change_class): it recomputes
 * rate, ceil, buffer, cbuffer, quantum and prio, and leaves the class's tokens, ctokens,
 * checkpoint time, mode and wait-queue event alone. So a class that may send when the
 * pause lands still sends one packet, and htb charges it at the pause rate: the class then
 * owes len/pause_rate of time (clamped at 60 s, htb's mbuffer), and keeps owing it after
 * the resume, because a change neither clears tokens nor reschedules the class's event.
 * The pause rate is therefore a trade (README): one frame leaks per len/pause_rate while
 * paused, and a resume can wait up to that long. pfcd reads the debt (htb's xstats tokens)
 * before each resume and reports the largest.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <linux/gen_stats.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>

#include "pfcd.h"

/* htb's time unit in tc_htb_opt.buffer and its xstats: 64 ns (PSCHED_SHIFT 6). */
#define PSCHED_TICK_NS 64
/* The rtnetlink receive buffer: a dump arrives as several messages per datagram. */
#define NL_BUF 65536

static volatile sig_atomic_t g_stop;
static struct config g_cfg;
static const char *g_cfg_path;
static char g_buf[NL_BUF] __attribute__((aligned(8)));
static uint64_t g_polls, g_late, g_poll_errors, g_missing;
static int64_t g_max_late_ns;
static struct samples g_poll_ns;

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void on_signal(int sig)
{
    (void)sig;
    g_stop = 1;
}

/* A bad config or setup is one line naming the field, exit 2: whoever drives pfcd (a
 * test, later controllers/pfc.py) shows that line to a person. */
__attribute__((format(printf, 3, 4), noreturn))
static void die_config(int line, const char *field, const char *fmt, ...)
{
    va_list ap;
    if (line > 0)
        fprintf(stderr, "pfcd: %s:%d: %s: ", g_cfg_path, line, field);
    else
        fprintf(stderr, "pfcd: %s: ", field);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    exit(2);
}

/* ---- samples ------------------------------------------------------------------------ */

static void sample_add(struct samples *s, int64_t v)
{
    s->count++;
    if (v > s->max)
        s->max = v;
    if (s->n == s->cap) {
        if (s->cap >= MAX_SAMPLES)
            return;
        uint32_t cap = s->cap ? s->cap * 2 : 256;
        int64_t *nv = realloc(s->v, (size_t)cap * sizeof(*nv));
        if (!nv)
            return;      /* out of memory: the maximum and count still hold */
        s->v = nv;
        s->cap = cap;
    }
    s->v[s->n++] = v;
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* Nearest-rank percentile: the smallest sample with at least p% of samples <= it. */
static int64_t percentile(const struct samples *s, double p)
{
    if (!s->n)
        return 0;
    size_t rank = (size_t)(p / 100.0 * s->n + 0.999999);
    if (rank < 1)
        rank = 1;
    if (rank > s->n)
        rank = s->n;
    return s->v[rank - 1];
}

/* ---- config ------------------------------------------------------------------------- */

static bool parse_u64(const char *s, uint64_t *out)
{
    char *end;
    if (!*s || *s == '-' || *s == '+')
        return false;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end)
        return false;
    *out = v;
    return true;
}

/* A tc handle as tc writes it: "1:10" is major 1, minor 0x10 (both hexadecimal), "10:" is
 * major 0x10 minor 0. */
static bool parse_handle(const char *s, uint32_t *out)
{
    char *end;
    errno = 0;
    unsigned long maj = strtoul(s, &end, 16);
    if (errno || end == s || *end != ':' || maj > 0xffff)
        return false;
    const char *m = end + 1;
    unsigned long min = 0;
    if (*m) {
        min = strtoul(m, &end, 16);
        if (errno || *end || min > 0xffff)
            return false;
    }
    *out = (uint32_t)(maj << 16 | min);
    return true;
}

/* Names go into the JSON report unescaped, so only plain characters are accepted. */
static bool plain_name(const char *s, size_t max)
{
    size_t n = strlen(s);
    if (!n || n >= max)
        return false;
    for (; *s; s++)
        if (*s <= ' ' || *s > '~' || *s == '"' || *s == '\\')
            return false;
    return true;
}

static int ns_index(int line, const char *name)
{
    struct config *c = &g_cfg;
    char path[NS_PATH_MAX];
    if (!plain_name(name, NS_PATH_MAX - 16))
        die_config(line, "ns", "not a namespace name or path: '%s'", name);
    if (!strcmp(name, "-"))
        path[0] = 0;
    else if (name[0] == '/')
        snprintf(path, sizeof path, "%s", name);
    else
        snprintf(path, sizeof path, "/run/netns/%s", name);
    for (int i = 0; i < c->nns; i++)
        if (!strcmp(c->ns[i].path, path))
            return i;
    if (c->nns == MAX_NS)
        die_config(line, "ns", "more than %d namespaces", MAX_NS);
    struct nsock *n = &c->ns[c->nns];
    snprintf(n->path, sizeof n->path, "%s", path);
    snprintf(n->name, sizeof n->name, "%s", name);
    n->fd = -1;
    return c->nns++;
}

static int port_index(int line, const char *ns, const char *dev)
{
    struct config *c = &g_cfg;
    int n = ns_index(line, ns);
    if (!plain_name(dev, IF_NAMESIZE))
        die_config(line, "dev", "not an interface name: '%s'", dev);
    for (int i = 0; i < c->nports; i++)
        if (c->ports[i].ns == n && !strcmp(c->ports[i].dev, dev))
            return i;
    if (c->nports == MAX_PORTS)
        die_config(line, "dev", "more than %d ports", MAX_PORTS);
    struct port *p = &c->ports[c->nports];
    p->ns = n;
    snprintf(p->dev, sizeof p->dev, "%s", dev);
    return c->nports++;
}

/* key=value words after "port NS DEV" / "feeder NS DEV". */
struct kv {
    const char *key, *val;
};

static int split_kv(int line, const char *what, char **words, int n, struct kv *out)
{
    for (int i = 0; i < n; i++) {
        char *eq = strchr(words[i], '=');
        if (!eq || eq == words[i])
            die_config(line, what, "expected key=value, got '%s'", words[i]);
        *eq = 0;
        out[i].key = words[i];
        out[i].val = eq + 1;
    }
    return n;
}

static const char *kv_get(struct kv *kv, int n, const char *key)
{
    for (int i = 0; i < n; i++)
        if (!strcmp(kv[i].key, key))
            return kv[i].val;
    return NULL;
}

static uint64_t kv_u64(int line, struct kv *kv, int n, const char *what, const char *key,
                       bool required, uint64_t dflt)
{
    char field[64];
    const char *v = kv_get(kv, n, key);
    uint64_t out;
    snprintf(field, sizeof field, "%s.%s", what, key);
    if (!v) {
        if (required)
            die_config(line, field, "missing");
        return dflt;
    }
    if (!parse_u64(v, &out))
        die_config(line, field, "not a non-negative integer: '%s'", v);
    return out;
}

static uint32_t kv_handle(int line, struct kv *kv, int n, const char *what, const char *key)
{
    char field[64];
    const char *v = kv_get(kv, n, key);
    uint32_t h;
    snprintf(field, sizeof field, "%s.%s", what, key);
    if (!v)
        die_config(line, field, "missing");
    if (!parse_handle(v, &h))
        die_config(line, field, "not a tc handle like 1:10 or 10: ('%s')", v);
    return h;
}

static void check_keys(int line, const char *what, struct kv *kv, int n,
                       const char *const *known)
{
    for (int i = 0; i < n; i++) {
        bool ok = false;
        for (const char *const *k = known; *k; k++)
            ok |= !strcmp(kv[i].key, *k);
        if (!ok) {
            char field[64];
            snprintf(field, sizeof field, "%s.%s", what, kv[i].key);
            die_config(line, field, "unknown field");
        }
        for (int j = 0; j < i; j++)
            if (!strcmp(kv[i].key, kv[j].key)) {
                char field[64];
                snprintf(field, sizeof field, "%s.%s", what, kv[i].key);
                die_config(line, field, "given twice");
            }
    }
}

static void parse_port(int line, char **w, int nw)
{
    static const char *const known[] = {"prio", "class", "leaf", "xoff", "xon", NULL};
    struct config *c = &g_cfg;
    struct kv kv[16];
    if (nw < 3 || nw - 3 > 16)
        die_config(line, "port", "expected: port NS DEV prio=P class=1:10 leaf=10: "
                   "xoff=BYTES xon=BYTES");
    if (c->nw == MAX_WATCHED)
        die_config(line, "port", "more than %d watched ports", MAX_WATCHED);
    struct watched *q = &c->w[c->nw];
    q->port = port_index(line, w[1], w[2]);
    int n = split_kv(line, "port", w + 3, nw - 3, kv);
    check_keys(line, "port", kv, n, known);
    uint64_t prio = kv_u64(line, kv, n, "port", "prio", true, 0);
    if (prio >= NPRIO)
        die_config(line, "port.prio", "must be 0..7, not %llu", (unsigned long long)prio);
    q->prio = (int)prio;
    q->classid = kv_handle(line, kv, n, "port", "class");
    q->leaf = kv_handle(line, kv, n, "port", "leaf");
    q->xoff = kv_u64(line, kv, n, "port", "xoff", true, 0);
    q->xon = kv_u64(line, kv, n, "port", "xon", true, 0);
    if (!q->xoff || q->xoff > UINT32_MAX)
        die_config(line, "port.xoff", "must be 1..%u bytes", UINT32_MAX);
    if (q->xon >= q->xoff)
        die_config(line, "port.xon", "must be below xoff (%llu), not %llu",
                   (unsigned long long)q->xoff, (unsigned long long)q->xon);
    for (int i = 0; i < c->nw; i++)
        if (c->w[i].port == q->port && c->w[i].classid == q->classid)
            die_config(line, "port.class", "this queue is already watched");
    struct pcounters *pc = &c->ports[q->port].pc[q->prio];
    if (pc->watched)
        die_config(line, "port.prio", "another queue of this port is watched at "
                   "priority %d", q->prio);
    pc->used = pc->watched = true;
    pc->xoff = q->xoff;
    pc->xon = q->xon;
    c->nw++;
}

static void parse_feeder(int line, char **w, int nw)
{
    static const char *const known[] = {"class", "rate", "ceil", "pause", NULL};
    struct config *c = &g_cfg;
    struct kv kv[16];
    if (!c->nw)
        die_config(line, "feeder", "a feeder line belongs to the port line above it");
    if (nw < 3 || nw - 3 > 16)
        die_config(line, "feeder", "expected: feeder NS DEV class=1:10 rate=BPS ceil=BPS "
                   "[pause=BPS]");
    struct watched *q = &c->w[c->nw - 1];
    struct feeder f = {.port = port_index(line, w[1], w[2]), .prio = q->prio};
    int n = split_kv(line, "feeder", w + 3, nw - 3, kv);
    check_keys(line, "feeder", kv, n, known);
    f.classid = kv_handle(line, kv, n, "feeder", "class");
    f.rate_bps = kv_u64(line, kv, n, "feeder", "rate", true, 0);
    f.ceil_bps = kv_u64(line, kv, n, "feeder", "ceil", true, 0);
    f.pause_bps = kv_u64(line, kv, n, "feeder", "pause", false, c->pause_bps);
    /* htb refuses a rate or ceil of 0 bytes/s, so 8 bit/s is the least it takes. */
    if (f.rate_bps < 8)
        die_config(line, "feeder.rate", "must be at least 8 bit/s");
    if (f.ceil_bps < f.rate_bps)
        die_config(line, "feeder.ceil", "must be at least rate (%llu)",
                   (unsigned long long)f.rate_bps);
    if (!f.pause_bps)
        die_config(line, "feeder.pause", "missing (give pause=BPS or a pause_bps line)");
    if (f.pause_bps < 8 || f.pause_bps >= f.rate_bps)
        die_config(line, "feeder.pause", "must be 8 bit/s or more and below rate (%llu)",
                   (unsigned long long)f.rate_bps);
    if (q->nfeeders == MAX_FEEDS_PER)
        die_config(line, "feeder", "more than %d feeders for one port", MAX_FEEDS_PER);
    int idx = -1;
    for (int i = 0; i < c->nf; i++)
        if (c->f[i].port == f.port && c->f[i].classid == f.classid)
            idx = i;
    if (idx >= 0) {
        struct feeder *g = &c->f[idx];
        /* One class is one priority's queue: pausing it for two priorities, or restoring
         * it to two different rates, would make one of them wrong. */
        if (g->prio != f.prio)
            die_config(line, "feeder.class", "already paused for priority %d", g->prio);
        if (g->rate_bps != f.rate_bps || g->ceil_bps != f.ceil_bps ||
            g->pause_bps != f.pause_bps)
            die_config(line, "feeder.rate", "differs from this feeder's earlier line");
        for (int i = 0; i < q->nfeeders; i++)
            if (q->feeders[i] == idx)
                die_config(line, "feeder", "listed twice for this port");
    } else {
        if (c->nf == MAX_FEEDERS)
            die_config(line, "feeder", "more than %d feeders", MAX_FEEDERS);
        idx = c->nf++;
        c->f[idx] = f;
    }
    q->feeders[q->nfeeders++] = idx;
    struct pcounters *pc = &c->ports[f.port].pc[f.prio];
    pc->used = pc->fed = true;
}

static void parse_global(int line, char **w, int nw)
{
    uint64_t v;
    if (nw != 2)
        die_config(line, w[0], "expected one value");
    if (!parse_u64(w[1], &v))
        die_config(line, w[0], "not a non-negative integer: '%s'", w[1]);
    if (!strcmp(w[0], "poll_us")) {
        if (v < 100 || v > 1000000)
            die_config(line, "poll_us", "must be 100..1000000");
        g_cfg.poll_us = (uint32_t)v;
    } else if (!strcmp(w[0], "refresh_us")) {
        if (v < 100 || v > 10000000)
            die_config(line, "refresh_us", "must be 100..10000000");
        g_cfg.refresh_us = (uint32_t)v;
    } else {
        if (v < 8)
            die_config(line, "pause_bps", "must be at least 8 bit/s");
        g_cfg.pause_bps = v;
    }
}

static void load_config(const char *path)
{
    FILE *fp = fopen(path, "r");
    char text[1024];
    int line = 0;
    g_cfg_path = path;
    g_cfg.poll_us = DEFAULT_POLL_US;
    g_cfg.refresh_us = DEFAULT_REFRESH_US;
    if (!fp)
        die_config(0, "config", "cannot read %s: %s", path, strerror(errno));
    while (fgets(text, sizeof text, fp)) {
        char *w[24], *save = NULL, *tok;
        int nw = 0;
        line++;
        if (!strchr(text, '\n') && !feof(fp))
            die_config(line, "line", "longer than %zu characters", sizeof text - 2);
        char *hash = strchr(text, '#');
        if (hash)
            *hash = 0;
        for (tok = strtok_r(text, " \t\r\n", &save); tok && nw < 24;
             tok = strtok_r(NULL, " \t\r\n", &save))
            w[nw++] = tok;
        if (!nw)
            continue;
        if (tok)
            die_config(line, w[0], "too many words");
        if (!strcmp(w[0], "poll_us") || !strcmp(w[0], "refresh_us") ||
            !strcmp(w[0], "pause_bps")) {
            /* Globals come first, so that every feeder below sees the same defaults. */
            if (g_cfg.nw)
                die_config(line, w[0], "global settings go before the first port line");
            parse_global(line, w, nw);
        } else if (!strcmp(w[0], "port"))
            parse_port(line, w, nw);
        else if (!strcmp(w[0], "feeder"))
            parse_feeder(line, w, nw);
        else
            die_config(line, w[0], "unknown directive (poll_us, refresh_us, pause_bps, "
                       "port, feeder)");
    }
    fclose(fp);
    if (!g_cfg.nw)
        die_config(0, "port", "the config watches no port");
    for (int i = 0; i < g_cfg.nw; i++)
        if (!g_cfg.w[i].nfeeders)
            die_config(0, "feeder", "port %s has no feeder",
                       g_cfg.ports[g_cfg.w[i].port].dev);
    for (int i = 0; i < g_cfg.nw; i++)
        g_cfg.ns[g_cfg.ports[g_cfg.w[i].port].ns].watched = true;
}

/* ---- rtnetlink ---------------------------------------------------------------------- */

static int nl_open(void)
{
    int fd = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_ROUTE);
    int one = 1, rcv = 1 << 20;
    struct timeval tv = {.tv_sec = 1};
    struct sockaddr_nl sa = {.nl_family = AF_NETLINK};
    if (fd < 0)
        return -1;
    /* CAP_ACK: an ACK carries only our header back, not the whole request. EXT_ACK: a
     * refusal comes with the kernel's reason, which goes to stderr as it is. */
    setsockopt(fd, SOL_NETLINK, NETLINK_CAP_ACK, &one, sizeof one);
    setsockopt(fd, SOL_NETLINK, NETLINK_EXT_ACK, &one, sizeof one);
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcv, sizeof rcv);
    /* A kernel that never answers must not hang the loop (and the resume on exit). */
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    if (bind(fd, (struct sockaddr *)&sa, sizeof sa) < 0) {
        close(fd);
        return -1;
    }
    return fd;
}

static int nl_send(struct nsock *ns, struct nlmsghdr *nh)
{
    struct sockaddr_nl sa = {.nl_family = AF_NETLINK};
    nh->nlmsg_seq = ++ns->seq;
    ssize_t r;
    do
        r = sendto(ns->fd, nh, nh->nlmsg_len, 0, (struct sockaddr *)&sa, sizeof sa);
    while (r < 0 && errno == EINTR);
    return r == (ssize_t)nh->nlmsg_len ? 0 : -1;
}

static ssize_t nl_recv(struct nsock *ns)
{
    ssize_t r;
    do
        r = recv(ns->fd, g_buf, sizeof g_buf, 0);
    while (r < 0 && errno == EINTR);
    return r;
}

/* The kernel's reason for a refusal (NETLINK_EXT_ACK), or "". */
static const char *extack_msg(struct nlmsghdr *nh)
{
    struct nlmsgerr *e = NLMSG_DATA(nh);
    if (!(nh->nlmsg_flags & NLM_F_ACK_TLVS))
        return "";
    size_t off = sizeof(*e);
    if (!(nh->nlmsg_flags & NLM_F_CAPPED))
        off += e->msg.nlmsg_len - sizeof(struct nlmsghdr);
    char *p = (char *)e + NLMSG_ALIGN(off), *end = (char *)nh + nh->nlmsg_len;
    while (p + sizeof(struct nlattr) <= end) {
        struct nlattr *a = (struct nlattr *)p;
        if (a->nla_len < sizeof *a || p + a->nla_len > end)
            break;
        if ((a->nla_type & NLA_TYPE_MASK) == NLMSGERR_ATTR_MSG)
            return (const char *)(a + 1);
        p += NLA_ALIGN(a->nla_len);
    }
    return "";
}

typedef void (*dump_cb)(struct nlmsghdr *nh, void *arg);

/* A dump (qdiscs or classes) of one namespace, or of one device's classes; each message
 * to cb. Returns 0, or a negative errno. */
static int nl_dump(struct nsock *ns, int type, int ifindex, dump_cb cb, void *arg)
{
    struct {
        struct nlmsghdr nh;
        struct tcmsg tc;
    } req = {
        .nh = {.nlmsg_len = sizeof req, .nlmsg_type = (uint16_t)type,
               .nlmsg_flags = NLM_F_REQUEST | NLM_F_DUMP},
        .tc = {.tcm_family = AF_UNSPEC, .tcm_ifindex = ifindex},
    };
    if (nl_send(ns, &req.nh) < 0)
        return -errno;
    for (;;) {
        ssize_t len = nl_recv(ns);
        if (len < 0)
            return -errno;
        for (struct nlmsghdr *nh = (struct nlmsghdr *)g_buf; NLMSG_OK(nh, (size_t)len);
             nh = NLMSG_NEXT(nh, len)) {
            if (nh->nlmsg_seq != ns->seq)
                continue;      /* a late answer to an earlier request */
            if (nh->nlmsg_type == NLMSG_DONE)
                return 0;
            if (nh->nlmsg_type == NLMSG_ERROR) {
                struct nlmsgerr *e = NLMSG_DATA(nh);
                return e->error ? e->error : -EPROTO;
            }
            cb(nh, arg);
        }
    }
}

static void put_attr(struct nlmsghdr *nh, int type, const void *data, size_t len)
{
    struct rtattr *rta = (struct rtattr *)((char *)nh + NLMSG_ALIGN(nh->nlmsg_len));
    rta->rta_type = (unsigned short)type;
    rta->rta_len = (unsigned short)RTA_LENGTH(len);
    if (len)
        memcpy(RTA_DATA(rta), data, len);
    nh->nlmsg_len = NLMSG_ALIGN(nh->nlmsg_len) + RTA_ALIGN(rta->rta_len);
}

/* ---- what the dumps say ------------------------------------------------------------- */

struct qdisc_poll {
    int ns;
};

/* A qdisc message: if it is a watched leaf, its backlog and drops (TCA_STATS2 ->
 * TCA_STATS_QUEUE, the counters `tc -s qdisc` shows). */
static void on_qdisc(struct nlmsghdr *nh, void *arg)
{
    struct qdisc_poll *qp = arg;
    struct tcmsg *tc = NLMSG_DATA(nh);
    struct watched *q = NULL;
    if (nh->nlmsg_type != RTM_NEWQDISC)
        return;
    for (int i = 0; i < g_cfg.nw; i++) {
        struct port *p = &g_cfg.ports[g_cfg.w[i].port];
        if (p->ns == qp->ns && p->ifindex == tc->tcm_ifindex &&
            g_cfg.w[i].leaf == tc->tcm_handle && g_cfg.w[i].classid == tc->tcm_parent)
            q = &g_cfg.w[i];
    }
    if (!q)
        return;
    int len = (int)(nh->nlmsg_len - NLMSG_LENGTH(sizeof *tc));
    for (struct rtattr *a = (struct rtattr *)((char *)tc + NLMSG_ALIGN(sizeof *tc));
         RTA_OK(a, len); a = RTA_NEXT(a, len)) {
        if ((a->rta_type & NLA_TYPE_MASK) != TCA_STATS2)
            continue;
        int sl = (int)RTA_PAYLOAD(a);
        for (struct rtattr *s = RTA_DATA(a); RTA_OK(s, sl); s = RTA_NEXT(s, sl))
            if (s->rta_type == TCA_STATS_QUEUE &&
                RTA_PAYLOAD(s) >= sizeof(struct gnet_stats_queue)) {
                struct gnet_stats_queue gq;
                memcpy(&gq, RTA_DATA(s), sizeof gq);
                q->backlog = gq.backlog;
                q->drops = gq.drops;
                q->seen = true;
            }
    }
}

/* One htb class as a dump gives it, and what the port's other leaf classes have sent
 * (the priorities a pause must not stop). */
struct class_info {
    int ifindex;
    uint32_t classid;
    bool found, have_opt;
    struct tc_htb_opt opt;
    uint64_t bytes, packets, other_bytes;
    int32_t tokens, ctokens;
    bool have_xstats;
};

static void parse_class(struct nlmsghdr *nh, struct class_info *ci)
{
    struct tcmsg *tc = NLMSG_DATA(nh);
    int len = (int)(nh->nlmsg_len - NLMSG_LENGTH(sizeof *tc));
    for (struct rtattr *a = (struct rtattr *)((char *)tc + NLMSG_ALIGN(sizeof *tc));
         RTA_OK(a, len); a = RTA_NEXT(a, len)) {
        int type = a->rta_type & NLA_TYPE_MASK, sl = (int)RTA_PAYLOAD(a);
        if (type == TCA_OPTIONS) {
            for (struct rtattr *s = RTA_DATA(a); RTA_OK(s, sl); s = RTA_NEXT(s, sl))
                if (s->rta_type == TCA_HTB_PARMS && RTA_PAYLOAD(s) >= sizeof ci->opt) {
                    memcpy(&ci->opt, RTA_DATA(s), sizeof ci->opt);
                    ci->have_opt = true;
                }
        } else if (type == TCA_STATS2) {
            for (struct rtattr *s = RTA_DATA(a); RTA_OK(s, sl); s = RTA_NEXT(s, sl)) {
                if (s->rta_type == TCA_STATS_BASIC && RTA_PAYLOAD(s) >= 12) {
                    uint64_t b;
                    uint32_t p;
                    memcpy(&b, RTA_DATA(s), 8);
                    memcpy(&p, (char *)RTA_DATA(s) + 8, 4);
                    ci->bytes = b;
                    ci->packets = p;
                } else if (s->rta_type == TCA_STATS_APP &&
                           RTA_PAYLOAD(s) >= sizeof(struct tc_htb_xstats)) {
                    struct tc_htb_xstats x;
                    memcpy(&x, RTA_DATA(s), sizeof x);
                    ci->tokens = x.tokens;
                    ci->ctokens = x.ctokens;
                    ci->have_xstats = true;
                }
            }
        }
    }
}

static void on_class(struct nlmsghdr *nh, void *arg)
{
    struct class_info *ci = arg, one;
    struct tcmsg *tc = NLMSG_DATA(nh);
    if (nh->nlmsg_type != RTM_NEWTCLASS || tc->tcm_ifindex != ci->ifindex)
        return;
    memset(&one, 0, sizeof one);
    parse_class(nh, &one);
    if (tc->tcm_handle != ci->classid) {
        /* Inner classes (1:1) count their children's bytes again: leaves only. */
        if (one.have_opt && one.opt.level == 0)
            ci->other_bytes += one.bytes;
        return;
    }
    one.other_bytes = ci->other_bytes;
    one.ifindex = ci->ifindex;
    one.classid = ci->classid;
    one.found = true;
    *ci = one;
}

static int read_class(struct feeder *f, struct class_info *ci)
{
    struct port *p = &g_cfg.ports[f->port];
    memset(ci, 0, sizeof *ci);
    ci->ifindex = p->ifindex;
    ci->classid = f->classid;
    int err = nl_dump(&g_cfg.ns[p->ns], RTM_GETTCLASS, p->ifindex, on_class, ci);
    if (!err && !ci->found)
        err = -ENOENT;
    return err;
}

/* ---- class changes ------------------------------------------------------------------ */

/* Change feeder f's htb class to rate/ceil (bit/s), keeping the burst, quantum and prio it
 * was made with. linklayer ethernet tells the kernel it needs no rate table (it reads one
 * only for TC_LINKLAYER_UNAWARE); the wire-size table on the port's root qdisc already
 * makes every length a wire length, so overhead and mpu stay as tc set them. */
static int change_class(struct feeder *f, uint64_t rate_bps, uint64_t ceil_bps,
                        char *why, size_t whylen)
{
    struct port *p = &g_cfg.ports[f->port];
    struct nsock *ns = &g_cfg.ns[p->ns];
    union {
        struct nlmsghdr nh;
        char buf[512];
    } req;
    memset(&req, 0, sizeof req);
    req.nh.nlmsg_len = NLMSG_LENGTH(sizeof(struct tcmsg));
    req.nh.nlmsg_type = RTM_NEWTCLASS;
    /* No NLM_F_CREATE: a class that vanished is an error, never a new class. */
    req.nh.nlmsg_flags = NLM_F_REQUEST | NLM_F_ACK;
    struct tcmsg *tc = NLMSG_DATA(&req.nh);
    tc->tcm_family = AF_UNSPEC;
    tc->tcm_ifindex = p->ifindex;
    tc->tcm_handle = f->classid;
    tc->tcm_parent = 0;          /* an existing class: the kernel finds its qdisc */
    put_attr(&req.nh, TCA_KIND, "htb", 4);
    struct rtattr *opts = (struct rtattr *)((char *)&req + NLMSG_ALIGN(req.nh.nlmsg_len));
    put_attr(&req.nh, TCA_OPTIONS, NULL, 0);
    struct tc_htb_opt o = f->tmpl;
    uint64_t rB = rate_bps / 8, cB = ceil_bps / 8;
    o.rate.rate = rB > UINT32_MAX ? UINT32_MAX : (uint32_t)rB;
    o.ceil.rate = cB > UINT32_MAX ? UINT32_MAX : (uint32_t)cB;
    o.rate.linklayer = o.ceil.linklayer = TC_LINKLAYER_ETHERNET;
    o.level = 0;
    put_attr(&req.nh, TCA_HTB_PARMS, &o, sizeof o);
    if (rB > UINT32_MAX)
        put_attr(&req.nh, TCA_HTB_RATE64, &rB, sizeof rB);
    if (cB > UINT32_MAX)
        put_attr(&req.nh, TCA_HTB_CEIL64, &cB, sizeof cB);
    opts->rta_type |= NLA_F_NESTED;
    opts->rta_len = (unsigned short)((char *)&req + req.nh.nlmsg_len - (char *)opts);
    if (nl_send(ns, &req.nh) < 0) {
        snprintf(why, whylen, "send: %s", strerror(errno));
        return -1;
    }
    for (;;) {
        ssize_t len = nl_recv(ns);
        if (len < 0) {
            snprintf(why, whylen, "no answer: %s", strerror(errno));
            return -1;
        }
        for (struct nlmsghdr *nh = (struct nlmsghdr *)g_buf; NLMSG_OK(nh, (size_t)len);
             nh = NLMSG_NEXT(nh, len)) {
            if (nh->nlmsg_seq != ns->seq || nh->nlmsg_type != NLMSG_ERROR)
                continue;
            struct nlmsgerr *e = NLMSG_DATA(nh);
            if (!e->error)
                return 0;
            snprintf(why, whylen, "%s %s", strerror(-e->error), extack_msg(nh));
            return -1;
        }
    }
}

static void change_failed(struct feeder *f, const char *what, const char *why)
{
    struct port *p = &g_cfg.ports[f->port];
    struct pcounters *pc = &p->pc[f->prio];
    /* Logged the first few times only: a port that went away must not flood stderr at
     * the poll rate; the count goes into the report. */
    if (pc->change_errors++ < 5)
        fprintf(stderr, "pfcd: %s %s class %x:%x: %s\n", what, p->dev, f->classid >> 16,
                f->classid & 0xffff, why);
}

/* ---- pause and resume --------------------------------------------------------------- */

static void pause_feeder(struct feeder *f, int64_t t_poll, struct samples *reaction)
{
    char why[256];
    if (change_class(f, f->pause_bps, f->pause_bps, why, sizeof why) < 0) {
        change_failed(f, "pause", why);
        return;
    }
    int64_t t = now_ns();
    sample_add(reaction, t - t_poll);
    f->paused = true;
    f->paused_at = t;
    f->have_snapshot = false;
    g_cfg.ports[f->port].pc[f->prio].pauses++;
}

/* The class's byte counter right after its pause: what it sends from here until the
 * resume is the leak. Read after every pause of an XOFF is acknowledged, so that reading
 * never delays a pause; a frame htb hands out between ACK and reading is not counted. */
static void snapshot_feeder(struct feeder *f)
{
    struct class_info ci;
    if (!f->paused || f->have_snapshot || read_class(f, &ci) < 0)
        return;
    f->bytes_at_pause = ci.bytes;
    f->packets_at_pause = ci.packets;
    f->other_at_pause = ci.other_bytes;
    f->have_snapshot = true;
}

static void resume_feeder(struct feeder *f, int64_t t_poll, struct samples *reaction)
{
    struct pcounters *pc = &g_cfg.ports[f->port].pc[f->prio];
    struct class_info ci;
    char why[256];
    /* Read before the resume (it costs the resume one class dump, the pause nothing):
     * the bytes sent while paused, and what htb says the class owes. */
    if (read_class(f, &ci) == 0) {
        if (f->have_snapshot && ci.bytes >= f->bytes_at_pause) {
            pc->leak_bytes += ci.bytes - f->bytes_at_pause;
            pc->leak_packets += ci.packets - f->packets_at_pause;
            if (ci.other_bytes >= f->other_at_pause)
                pc->other_bytes_paused += ci.other_bytes - f->other_at_pause;
        }
        if (ci.have_xstats) {
            int32_t t = ci.tokens < ci.ctokens ? ci.tokens : ci.ctokens;
            int64_t debt = t < 0 ? -(int64_t)t * PSCHED_TICK_NS : 0;
            if (debt > pc->max_debt_ns)
                pc->max_debt_ns = debt;
        }
    }
    if (change_class(f, f->rate_bps, f->ceil_bps, why, sizeof why) < 0) {
        change_failed(f, "resume", why);
        return;
    }
    int64_t t = now_ns();
    if (reaction)
        sample_add(reaction, t - t_poll);
    pc->paused_ns += (uint64_t)(t - f->paused_at);
    f->paused = false;
}

/* Frames on the wire: the switch sends one PAUSE on each feeding link, and each feeder
 * receives it. */
static void count_frames(struct watched *q)
{
    g_cfg.ports[q->port].pc[q->prio].pause_tx += (uint64_t)q->nfeeders;
    for (int i = 0; i < q->nfeeders; i++) {
        struct feeder *f = &g_cfg.f[q->feeders[i]];
        g_cfg.ports[f->port].pc[f->prio].pause_rx++;
    }
}

static void on_xoff(struct watched *q, int64_t t_poll)
{
    struct pcounters *pc = &g_cfg.ports[q->port].pc[q->prio];
    q->in_xoff = true;
    pc->xoff_events++;
    count_frames(q);
    q->next_refresh = t_poll + (int64_t)g_cfg.refresh_us * 1000;
    for (int i = 0; i < q->nfeeders; i++) {
        struct feeder *f = &g_cfg.f[q->feeders[i]];
        f->refs++;
        if (!f->paused)
            pause_feeder(f, t_poll, &pc->pause_reaction);
    }
    for (int i = 0; i < q->nfeeders; i++)
        snapshot_feeder(&g_cfg.f[q->feeders[i]]);
}

static void on_xon(struct watched *q, int64_t t_poll)
{
    struct pcounters *pc = &g_cfg.ports[q->port].pc[q->prio];
    q->in_xoff = false;
    for (int i = 0; i < q->nfeeders; i++) {
        struct feeder *f = &g_cfg.f[q->feeders[i]];
        if (f->refs > 0)
            f->refs--;
        /* Another watched queue in XOFF still holds this feeder: it stays paused, as
         * an upstream port stays paused while any PAUSE for the priority is in force. */
        if (!f->refs && f->paused)
            resume_feeder(f, t_poll, &pc->resume_reaction);
    }
}

static void evaluate(struct watched *q, int64_t t_poll)
{
    struct pcounters *pc = &g_cfg.ports[q->port].pc[q->prio];
    if (!q->seen) {
        g_missing++;
        return;
    }
    if (q->backlog > pc->max_backlog)
        pc->max_backlog = q->backlog;
    if (!pc->drops_seen) {
        pc->drops_first = pc->drops_last = q->drops;
        pc->drops_seen = true;
    }
    uint32_t dropped = q->drops - pc->drops_last;
    if (q->in_xoff)
        pc->drops_in_xoff += dropped;
    else
        pc->drops_out_of_xoff += dropped;
    pc->drops_last = q->drops;
    if (!q->in_xoff && q->backlog >= q->xoff)
        on_xoff(q, t_poll);
    else if (q->in_xoff && q->backlog <= q->xon)
        on_xon(q, t_poll);
    else if (q->in_xoff) {
        /* Every refresh interval still in XOFF is one more PAUSE on each link; a late
         * poll counts the refreshes it missed, as a switch would have sent them. */
        int64_t now = now_ns();
        while (now >= q->next_refresh) {
            count_frames(q);
            q->next_refresh += (int64_t)g_cfg.refresh_us * 1000;
        }
    }
}

/* ---- the loop ----------------------------------------------------------------------- */

static void poll_once(void)
{
    for (int n = 0; n < g_cfg.nns; n++) {
        struct nsock *ns = &g_cfg.ns[n];
        struct qdisc_poll qp = {.ns = n};
        if (!ns->watched)
            continue;
        for (int i = 0; i < g_cfg.nw; i++)
            g_cfg.w[i].seen = false;
        int64_t t_poll = now_ns();
        int err = nl_dump(ns, RTM_GETQDISC, 0, on_qdisc, &qp);
        sample_add(&g_poll_ns, now_ns() - t_poll);
        if (err) {
            if (g_poll_errors++ < 5)
                fprintf(stderr, "pfcd: qdisc dump in %s: %s\n", ns->name, strerror(-err));
            continue;
        }
        for (int i = 0; i < g_cfg.nw; i++)
            if (g_cfg.ports[g_cfg.w[i].port].ns == n)
                evaluate(&g_cfg.w[i], t_poll);
    }
    g_polls++;
}

static void run_loop(void)
{
    int64_t period = (int64_t)g_cfg.poll_us * 1000, next = now_ns();
    while (!g_stop) {
        /* How late this poll starts against its slot: the time a crossing of XOFF can go
         * unseen is the interval plus this. */
        int64_t late = now_ns() - next;
        if (late > g_max_late_ns)
            g_max_late_ns = late;
        poll_once();
        next += period;
        int64_t now = now_ns();
        if (now >= next) {
            /* Overran the interval: skip the missed slots rather than poll back to back,
             * and count them, so the report says how often 1 ms was not held. */
            g_late += (uint64_t)((now - next) / period + 1);
            next += ((now - next) / period + 1) * period;
        }
        struct timespec ts = {.tv_sec = next / 1000000000, .tv_nsec = next % 1000000000};
        /* A signal interrupts the sleep (no SA_RESTART), so SIGTERM acts at once. */
        clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL);
    }
}

/* ---- setup -------------------------------------------------------------------------- */

/* Open one socket inside each namespace and resolve the devices there: setns moves this
 * (single-threaded) process, and a socket keeps the namespace it was made in, so after
 * moving back every socket still talks to its own namespace's kernel tables. */
static void open_namespaces(void)
{
    int self = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
    if (self < 0)
        die_config(0, "ns", "cannot open /proc/self/ns/net: %s", strerror(errno));
    for (int n = 0; n < g_cfg.nns; n++) {
        struct nsock *ns = &g_cfg.ns[n];
        if (ns->path[0]) {
            int fd = open(ns->path, O_RDONLY | O_CLOEXEC);
            if (fd < 0)
                die_config(0, "ns", "cannot open %s: %s", ns->path, strerror(errno));
            if (setns(fd, CLONE_NEWNET) < 0)
                die_config(0, "ns", "cannot enter %s: %s", ns->path, strerror(errno));
            close(fd);
        }
        ns->fd = nl_open();
        if (ns->fd < 0)
            die_config(0, "ns", "no rtnetlink socket in %s: %s", ns->name, strerror(errno));
        for (int i = 0; i < g_cfg.nports; i++) {
            struct port *p = &g_cfg.ports[i];
            if (p->ns != n)
                continue;
            p->ifindex = (int)if_nametoindex(p->dev);
            if (!p->ifindex)
                die_config(0, "dev", "no device %s in namespace %s", p->dev, ns->name);
        }
        if (ns->path[0] && setns(self, CLONE_NEWNET) < 0)
            die_config(0, "ns", "cannot return to pfcd's namespace: %s", strerror(errno));
    }
    close(self);
}

/* Every feeder's class must exist and be htb; its burst, quantum and prio are kept for
 * every change, so that a pause and a resume alter nothing but rate and ceil. Every
 * watched leaf must exist under its class. */
static void check_kernel_objects(void)
{
    for (int i = 0; i < g_cfg.nf; i++) {
        struct feeder *f = &g_cfg.f[i];
        struct class_info ci;
        int err = read_class(f, &ci);
        if (err || !ci.have_opt)
            die_config(0, "feeder.class", "no htb class %x:%x on %s (%s)", f->classid >> 16,
                       f->classid & 0xffff, g_cfg.ports[f->port].dev,
                       err ? strerror(-err) : "not htb");
        f->tmpl = ci.opt;
    }
    for (int n = 0; n < g_cfg.nns; n++) {
        struct qdisc_poll qp = {.ns = n};
        if (!g_cfg.ns[n].watched)
            continue;
        int err = nl_dump(&g_cfg.ns[n], RTM_GETQDISC, 0, on_qdisc, &qp);
        if (err)
            die_config(0, "ns", "qdisc dump in %s: %s", g_cfg.ns[n].name, strerror(-err));
    }
    for (int i = 0; i < g_cfg.nw; i++) {
        struct watched *q = &g_cfg.w[i];
        if (!q->seen)
            die_config(0, "port.leaf", "no qdisc %x: under class %x:%x on %s",
                       q->leaf >> 16, q->classid >> 16, q->classid & 0xffff,
                       g_cfg.ports[q->port].dev);
        q->seen = false;
    }
}

/* ---- report ------------------------------------------------------------------------- */

static void write_samples(FILE *fp, const char *name, struct samples *s)
{
    if (s->n)
        qsort(s->v, s->n, sizeof *s->v, cmp_i64);
    fprintf(fp, "\"%s\": {\"n\": %llu, \"p50\": %lld, \"p99\": %lld, \"max\": %lld}", name,
            (unsigned long long)s->count, (long long)percentile(s, 50),
            (long long)percentile(s, 99), (long long)s->max);
}

static void write_prio(FILE *fp, struct pcounters *pc)
{
    uint64_t above = pc->max_backlog > pc->xoff ? pc->max_backlog - pc->xoff : 0;
    fprintf(fp, "{\"pause_frames_tx\": %llu, \"pause_frames_rx\": %llu, "
            "\"paused_ns\": %llu, \"xoff_events\": %llu, \"pauses\": %llu, "
            "\"max_backlog_bytes\": %llu, ",
            (unsigned long long)pc->pause_tx, (unsigned long long)pc->pause_rx,
            (unsigned long long)pc->paused_ns, (unsigned long long)pc->xoff_events,
            (unsigned long long)pc->pauses, (unsigned long long)pc->max_backlog);
    if (pc->watched)
        fprintf(fp, "\"xoff_bytes\": %llu, \"xon_bytes\": %llu, \"headroom_used_bytes\": %llu, "
                "\"drops\": %llu, \"drops_in_xoff\": %llu, \"drops_out_of_xoff\": %llu, ",
                (unsigned long long)pc->xoff, (unsigned long long)pc->xon,
                (unsigned long long)above,
                (unsigned long long)(uint32_t)(pc->drops_last - pc->drops_first),
                (unsigned long long)pc->drops_in_xoff,
                (unsigned long long)pc->drops_out_of_xoff);
    fprintf(fp, "\"leak_bytes\": %llu, \"leak_packets\": %llu, \"max_debt_ns\": %lld, "
            "\"other_bytes_while_paused\": %llu, \"change_errors\": %llu, ",
            (unsigned long long)pc->leak_bytes, (unsigned long long)pc->leak_packets,
            (long long)pc->max_debt_ns, (unsigned long long)pc->other_bytes_paused,
            (unsigned long long)pc->change_errors);
    write_samples(fp, "pause_reaction_ns", &pc->pause_reaction);
    fputs(", ", fp);
    write_samples(fp, "resume_reaction_ns", &pc->resume_reaction);
    fputc('}', fp);
}

static int write_report(const char *path, int64_t run_ns, struct rusage *r0, struct rusage *r1)
{
    char tmp[PATH_MAX];
    snprintf(tmp, sizeof tmp, "%s.%d.tmp", path, (int)getpid());
    FILE *fp = fopen(tmp, "w");
    if (!fp)
        return -1;
    double user = (double)(r1->ru_utime.tv_sec - r0->ru_utime.tv_sec) +
                  (double)(r1->ru_utime.tv_usec - r0->ru_utime.tv_usec) / 1e6;
    double sys = (double)(r1->ru_stime.tv_sec - r0->ru_stime.tv_sec) +
                 (double)(r1->ru_stime.tv_usec - r0->ru_stime.tv_usec) / 1e6;
    double secs = (double)run_ns / 1e9;
    fprintf(fp, "{\"poll_us\": %u, \"refresh_us\": %u, \"run_s\": %.3f, \"polls\": %llu, "
            "\"late_polls\": %llu, \"max_late_ns\": %lld, \"poll_errors\": %llu, "
            "\"missing_leaf\": %llu, "
            "\"cpu\": {\"user_s\": %.4f, \"sys_s\": %.4f, \"per_s\": %.5f}, ",
            g_cfg.poll_us, g_cfg.refresh_us, secs, (unsigned long long)g_polls,
            (unsigned long long)g_late, (long long)g_max_late_ns,
            (unsigned long long)g_poll_errors,
            (unsigned long long)g_missing, user, sys, secs > 0 ? (user + sys) / secs : 0.0);
    write_samples(fp, "poll_ns", &g_poll_ns);
    fputs(", \"ports\": [", fp);
    bool first = true;
    for (int i = 0; i < g_cfg.nports; i++) {
        struct port *p = &g_cfg.ports[i];
        fprintf(fp, "%s\n  {\"ns\": \"%s\", \"dev\": \"%s\", \"priorities\": {",
                first ? "" : ",", g_cfg.ns[p->ns].name, p->dev);
        first = false;
        bool pfirst = true;
        for (int pr = 0; pr < NPRIO; pr++) {
            if (!p->pc[pr].used)
                continue;
            fprintf(fp, "%s\"%d\": ", pfirst ? "" : ", ", pr);
            pfirst = false;
            write_prio(fp, &p->pc[pr]);
        }
        fputs("}}", fp);
    }
    fputs("\n]}\n", fp);
    if (fclose(fp) != 0)
        return -1;
    return rename(tmp, path);
}

int main(int argc, char **argv)
{
    struct sigaction sa = {.sa_handler = on_signal};
    struct rusage r0, r1;
    if (argc != 3) {
        fprintf(stderr, "usage: pfcd CONFIG OUT.json\n");
        return 2;
    }
    load_config(argv[1]);
    open_namespaces();
    check_kernel_objects();
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    /* Whoever started pfcd waits for this line before it puts load on the ports. */
    printf("pfcd: ready, %d watched, %d feeders, %d namespaces\n", g_cfg.nw, g_cfg.nf,
           g_cfg.nns);
    fflush(stdout);
    getrusage(RUSAGE_SELF, &r0);
    int64_t t0 = now_ns();
    run_loop();
    int64_t run_ns = now_ns() - t0;
    getrusage(RUSAGE_SELF, &r1);
    /* Never leave a port paused: every class still at its pause rate gets its own back. */
    int rc = 0;
    for (int i = 0; i < g_cfg.nf; i++) {
        struct feeder *f = &g_cfg.f[i];
        if (!f->paused)
            continue;
        resume_feeder(f, 0, NULL);
        if (f->paused) {
            fprintf(stderr, "pfcd: could not resume %s\n", g_cfg.ports[f->port].dev);
            rc = 1;
        }
    }
    if (write_report(argv[2], run_ns, &r0, &r1) < 0) {
        fprintf(stderr, "pfcd: cannot write %s: %s\n", argv[2], strerror(errno));
        rc = 1;
    }
    return rc;
}
