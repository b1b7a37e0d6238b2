/* A verbs client compiled against the system's <infiniband/verbs.h> and linked with -libverbs, as
 * llama.cpp is: the header's inline functions (ibv_post_send, ibv_poll_cq, ...) jump through the
 * context's ops table and ibv_query_port / ibv_query_gid_ex go through their macros. Run with
 * LD_LIBRARY_PATH at the fabric. Each scenario forks: parent = side A, child = side B; the two
 * swap (qpn, gid) and sync bytes over pipes. Exit status 0 = the scenario's checks held.
 * usage: client exchange|small|norecv|kill|peer_error|chanpoll|rtr_timeout|modify|cleanup */
#include <infiniband/verbs.h>
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define CHECK(c, ...) do { if (!(c)) { fprintf(stderr, "[%d] FAIL %s:%d: ", (int)getpid(), __FILE__, __LINE__); \
    fprintf(stderr, __VA_ARGS__); fprintf(stderr, "\n"); exit(1); } } while (0)
#define BUF (1024 * 1024)

struct side {
    struct ibv_context *ctx; struct ibv_pd *pd; struct ibv_comp_channel *ch;
    struct ibv_cq *scq, *rcq; struct ibv_qp *qp; struct ibv_mr *mr; char *buf; int gid_idx;
    union ibv_gid gid;
};
struct addr { uint32_t qpn; union ibv_gid gid; };
static int to_peer, from_peer; /* pipes */
static int rcq_tag;

static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec / 1e9; }
static void put(const void *p, size_t n) { CHECK(write(to_peer, p, n) == (ssize_t)n, "pipe write"); }
static void get(void *p, size_t n) { CHECK(read(from_peer, p, n) == (ssize_t)n, "pipe read (peer died?)"); }
static void sync_send(char c) { put(&c, 1); }
static char sync_wait(void) { char c; get(&c, 1); return c; }

static void open_side(struct side *s) {
    int n = 0;
    struct ibv_device **devs = ibv_get_device_list(&n);
    CHECK(devs && n == 1 && devs[1] == NULL, "device list n=%d", n);
    CHECK(strcmp(ibv_get_device_name(devs[0]), "fabric0") == 0, "device name");
    s->ctx = ibv_open_device(devs[0]);
    CHECK(s->ctx, "open");
    ibv_free_device_list(devs);
    struct ibv_port_attr pa;
    CHECK(ibv_query_port(s->ctx, 1, &pa) == 0, "query_port");
    CHECK(pa.state == IBV_PORT_ACTIVE && pa.active_mtu >= IBV_MTU_256 && pa.active_mtu <= IBV_MTU_4096, "port attrs");
    CHECK(pa.link_layer == IBV_LINK_LAYER_ETHERNET && pa.gid_tbl_len >= 1, "link layer / gid table");
    struct ibv_port_attr pa2;
    CHECK(ibv_query_port(s->ctx, 2, &pa2) != 0, "port 2 must not exist");
    union ibv_gid want = {0};
    want.raw[10] = want.raw[11] = 0xff; want.raw[12] = 127; want.raw[15] = 1;
    s->gid_idx = -1;
    for (int i = 0; i < pa.gid_tbl_len; i++) {
        struct ibv_gid_entry e = {0};
        CHECK(ibv_query_gid_ex(s->ctx, 1, i, &e, 0) == 0, "query_gid_ex %d", i);
        CHECK(e.gid_type == IBV_GID_TYPE_ROCE_V2 && e.gid_index == (uint32_t)i && e.port_num == 1, "gid entry");
        if (memcmp(e.gid.raw, want.raw, 16) == 0) s->gid_idx = i;
    }
    CHECK(s->gid_idx >= 0, "no GID ::ffff:127.0.0.1");
    struct ibv_gid_entry e;
    CHECK(ibv_query_gid_ex(s->ctx, 1, pa.gid_tbl_len, &e, 0) != 0, "gid index past the table");
    CHECK(ibv_query_gid(s->ctx, 1, s->gid_idx, &s->gid) == 0 && memcmp(&s->gid, &want, 16) == 0, "query_gid");
    s->pd = ibv_alloc_pd(s->ctx);
    s->ch = ibv_create_comp_channel(s->ctx);
    CHECK(s->pd && s->ch && s->ch->fd >= 0, "pd/channel");
    s->scq = ibv_create_cq(s->ctx, 16, NULL, s->ch, 0);
    s->rcq = ibv_create_cq(s->ctx, 64, &rcq_tag, s->ch, 0);
    CHECK(s->scq && s->rcq, "cq");
    struct ibv_qp_init_attr qia = {0};
    qia.send_cq = s->scq; qia.recv_cq = s->rcq; qia.qp_type = IBV_QPT_RC;
    qia.cap.max_send_wr = 8; qia.cap.max_recv_wr = 32; qia.cap.max_send_sge = 1; qia.cap.max_recv_sge = 1;
    qia.cap.max_inline_data = 256;
    s->qp = ibv_create_qp(s->pd, &qia);
    CHECK(s->qp && qia.cap.max_inline_data >= 256, "create_qp");
    CHECK(s->qp->qp_num < (1u << 24) && s->qp->state == IBV_QPS_RESET, "qpn/state");
    s->buf = aligned_alloc(4096, BUF);
    s->mr = ibv_reg_mr(s->pd, s->buf, BUF, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    CHECK(s->mr && s->mr->lkey != 0, "reg_mr");
}

static struct addr swap_addr(struct side *s) {
    struct addr mine = { s->qp->qp_num, s->gid }, peer;
    put(&mine, sizeof mine); get(&peer, sizeof peer);
    return peer;
}

static int to_init(struct side *s) {
    struct ibv_qp_attr a = {0};
    a.qp_state = IBV_QPS_INIT; a.port_num = 1; a.pkey_index = 0;
    a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_LOCAL_WRITE;
    return ibv_modify_qp(s->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
}
static int to_rtr(struct side *s, struct addr p, int extra_mask) {
    struct ibv_qp_attr a = {0};
    a.qp_state = IBV_QPS_RTR; a.path_mtu = IBV_MTU_1024; a.dest_qp_num = p.qpn; a.rq_psn = p.qpn & 0xffffff;
    a.max_dest_rd_atomic = 1; a.min_rnr_timer = 1; a.ah_attr.is_global = 1; a.ah_attr.grh.dgid = p.gid;
    a.ah_attr.grh.hop_limit = 1; a.ah_attr.grh.sgid_index = s->gid_idx; a.ah_attr.port_num = 1;
    return ibv_modify_qp(s->qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                         IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER | extra_mask);
}
static int to_rts(struct side *s) {
    struct ibv_qp_attr a = {0};
    a.qp_state = IBV_QPS_RTS; a.timeout = 14; a.retry_cnt = 7; a.rnr_retry = 7;
    a.sq_psn = s->qp->qp_num & 0xffffff; a.max_rd_atomic = 1;
    return ibv_modify_qp(s->qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                         IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
}
static void connect_side(struct side *s, struct addr p) {
    if (s->qp->state == IBV_QPS_RESET) CHECK(to_init(s) == 0, "INIT");
    CHECK(to_rtr(s, p, 0) == 0, "RTR");
    CHECK(to_rts(s) == 0, "RTS");
    CHECK(s->qp->state == IBV_QPS_RTS, "state RTS");
}

static void post_recv(struct side *s, uint64_t id, size_t off, uint32_t len) {
    struct ibv_sge sge = { (uintptr_t)(s->buf + off), len, s->mr->lkey };
    struct ibv_recv_wr wr = {0}, *bad = NULL;
    wr.wr_id = id; wr.sg_list = &sge; wr.num_sge = 1;
    CHECK(ibv_post_recv(s->qp, &wr, &bad) == 0, "post_recv");
}
static int post_send(struct side *s, uint64_t id, size_t off, uint32_t len, int inl) {
    struct ibv_sge sge = { (uintptr_t)(s->buf + off), len, inl ? 0 : s->mr->lkey };
    struct ibv_send_wr wr = {0}, *bad = NULL;
    wr.wr_id = id; wr.opcode = IBV_WR_SEND; wr.sg_list = &sge; wr.num_sge = 1;
    wr.send_flags = IBV_SEND_SIGNALED | (inl ? IBV_SEND_INLINE : 0);
    return ibv_post_send(s->qp, &wr, &bad);
}
/* Polls until a completion or the deadline; returns 1 with *wc filled, 0 on timeout. */
static int wait_wc(struct ibv_cq *cq, struct ibv_wc *wc, double secs) {
    double end = now() + secs;
    do {
        int n = ibv_poll_cq(cq, 1, wc);
        CHECK(n >= 0, "poll_cq");
        if (n == 1) return 1;
        usleep(1000);
    } while (now() < end);
    return 0;
}
static void expect_wc(struct ibv_cq *cq, uint64_t id, int status, int opcode, int len, const char *what) {
    struct ibv_wc wc;
    CHECK(wait_wc(cq, &wc, 10), "%s: no completion", what);
    CHECK(wc.wr_id == id && (int)wc.status == status, "%s: wr_id=%llu status=%d (%s), want %llu/%d",
          what, (unsigned long long)wc.wr_id, wc.status, ibv_wc_status_str(wc.status), (unsigned long long)id, status);
    if (status == IBV_WC_SUCCESS) {
        CHECK((int)wc.opcode == opcode, "%s: opcode %d", what, wc.opcode);
        if (len >= 0) CHECK((int)wc.byte_len == len, "%s: byte_len %u want %d", what, wc.byte_len, len);
    }
}
static void fill(char *p, size_t n, int seed) { for (size_t i = 0; i < n; i++) p[i] = (char)(i * 31 + seed); }
static int same(const char *p, size_t n, int seed) { for (size_t i = 0; i < n; i++) if (p[i] != (char)(i * 31 + seed)) return 0; return 1; }

static void close_side(struct side *s) {
    CHECK(ibv_dereg_mr(s->mr) == 0 && ibv_destroy_qp(s->qp) == 0, "dereg/destroy qp");
    CHECK(ibv_destroy_cq(s->scq) == 0 && ibv_destroy_cq(s->rcq) == 0, "destroy cq");
    CHECK(ibv_destroy_comp_channel(s->ch) == 0 && ibv_dealloc_pd(s->pd) == 0, "channel/pd");
    CHECK(ibv_close_device(s->ctx) == 0, "close");
    free(s->buf);
}

/* --- scenarios: a(...) runs in the parent, b(...) in the child --- */
static void exchange_a(struct side *s, struct addr p) {
    CHECK(to_init(s) == 0, "INIT");
    post_recv(s, 900, 0, 4096);
    connect_side(s, p);
    sync_wait(); /* B has posted its receives and is in RTS */
    fill(s->buf + 1000, 100, 1); fill(s->buf + 8192, 4096, 2); fill(s->buf + 65536, 262144, 3);
    CHECK(post_send(s, 1, 1000, 100, 1) == 0, "send 1");
    memset(s->buf + 1000, 0, 100); /* inline: copied at post time */
    CHECK(post_send(s, 2, 8192, 4096, 0) == 0 && post_send(s, 3, 65536, 262144, 0) == 0, "send 2/3");
    expect_wc(s->scq, 1, IBV_WC_SUCCESS, IBV_WC_SEND, -1, "send 1");
    expect_wc(s->scq, 2, IBV_WC_SUCCESS, IBV_WC_SEND, -1, "send 2");
    expect_wc(s->scq, 3, IBV_WC_SUCCESS, IBV_WC_SEND, -1, "send 3");
    expect_wc(s->rcq, 900, IBV_WC_SUCCESS, IBV_WC_RECV, 7, "reply");
    CHECK(memcmp(s->buf, "thanks!", 7) == 0, "reply bytes");
}
static void exchange_b(struct side *s, struct addr p) {
    CHECK(to_init(s) == 0, "INIT");
    post_recv(s, 10, 0, 262144); post_recv(s, 11, 262144, 4096); post_recv(s, 12, 266240, 262144);
    connect_side(s, p);
    sync_send('r');
    expect_wc(s->rcq, 10, IBV_WC_SUCCESS, IBV_WC_RECV, 100, "recv 1");
    expect_wc(s->rcq, 11, IBV_WC_SUCCESS, IBV_WC_RECV, 4096, "recv 2");
    expect_wc(s->rcq, 12, IBV_WC_SUCCESS, IBV_WC_RECV, 262144, "recv 3");
    CHECK(same(s->buf, 100, 1) && same(s->buf + 262144, 4096, 2) && same(s->buf + 266240, 262144, 3), "payloads");
    memcpy(s->buf + 4096, "thanks!", 7);
    CHECK(post_send(s, 20, 4096, 7, 0) == 0, "reply");
    expect_wc(s->scq, 20, IBV_WC_SUCCESS, IBV_WC_SEND, -1, "reply sent");
}

static void small_a(struct side *s, struct addr p) {
    connect_side(s, p);
    sync_wait();
    CHECK(post_send(s, 1, 0, 64, 0) == 0, "send");
    expect_wc(s->scq, 1, IBV_WC_REM_INV_REQ_ERR, 0, 0, "sender sees the receiver's length error");
}
static void small_b(struct side *s, struct addr p) {
    CHECK(to_init(s) == 0, "INIT");
    post_recv(s, 10, 0, 16); post_recv(s, 11, 4096, 4096);
    connect_side(s, p);
    sync_send('r');
    expect_wc(s->rcq, 10, IBV_WC_LOC_LEN_ERR, 0, 0, "small receive");
    expect_wc(s->rcq, 11, IBV_WC_WR_FLUSH_ERR, 0, 0, "rest flushed");
}

static void norecv_a(struct side *s, struct addr p) {
    connect_side(s, p);
    sync_wait();
    fill(s->buf, 5000, 9);
    CHECK(post_send(s, 1, 0, 5000, 0) == 0, "send");
    struct ibv_wc wc;
    CHECK(!wait_wc(s->scq, &wc, 0.5), "send completed with no receive posted (status %d)", wc.status);
    sync_send('p'); /* B may post now */
    expect_wc(s->scq, 1, IBV_WC_SUCCESS, IBV_WC_SEND, -1, "send after the receive was posted");
}
static void norecv_b(struct side *s, struct addr p) {
    connect_side(s, p);
    sync_send('r');
    sync_wait();
    post_recv(s, 10, 0, 8192);
    expect_wc(s->rcq, 10, IBV_WC_SUCCESS, IBV_WC_RECV, 5000, "late receive");
    CHECK(same(s->buf, 5000, 9), "payload");
}

static pid_t child;
static void kill_a(struct side *s, struct addr p) {
    CHECK(to_init(s) == 0, "INIT");
    post_recv(s, 900, 0, 4096); post_recv(s, 901, 4096, 4096);
    connect_side(s, p);
    sync_wait();
    CHECK(post_send(s, 1, 8192, 100, 0) == 0, "send (B posts no receive)");
    usleep(200000);
    CHECK(kill(child, SIGKILL) == 0, "kill");
    waitpid(child, NULL, 0);
    child = 0;
    expect_wc(s->scq, 1, IBV_WC_RETRY_EXC_ERR, 0, 0, "in-flight send after the peer died");
    expect_wc(s->rcq, 900, IBV_WC_WR_FLUSH_ERR, 0, 0, "receive 900 flushed");
    expect_wc(s->rcq, 901, IBV_WC_WR_FLUSH_ERR, 0, 0, "receive 901 flushed");
    CHECK(post_send(s, 2, 8192, 100, 0) == 0, "send on an errored QP is accepted");
    expect_wc(s->scq, 2, IBV_WC_WR_FLUSH_ERR, 0, 0, "and flushed");
}
static void kill_b(struct side *s, struct addr p) {
    connect_side(s, p);
    sync_send('r');
    pause(); /* killed by A */
}

/* The receiver's QP is put in ERR (process alive) while a SEND waits for a receive: the sender
 * must not hang but fail as a real requester does once its retries run out. */
static void peer_error_a(struct side *s, struct addr p) {
    connect_side(s, p);
    sync_wait();
    CHECK(post_send(s, 1, 0, 100, 0) == 0, "send (B posts no receive)");
    usleep(200000);
    sync_send('e');
    expect_wc(s->scq, 1, IBV_WC_RETRY_EXC_ERR, 0, 0, "send to a QP that went to ERR");
    sync_send('d');
}
static void peer_error_b(struct side *s, struct addr p) {
    connect_side(s, p);
    sync_send('r');
    sync_wait();
    struct ibv_qp_attr a = {0};
    a.qp_state = IBV_QPS_ERR;
    CHECK(ibv_modify_qp(s->qp, &a, IBV_QP_STATE) == 0 && s->qp->state == IBV_QPS_ERR, "to ERR");
    sync_wait();
}

static void chanpoll_a(struct side *s, struct addr p) {
    CHECK(to_init(s) == 0, "INIT");
    post_recv(s, 900, 0, 4096);
    connect_side(s, p);
    CHECK(ibv_req_notify_cq(s->rcq, 0) == 0, "arm");
    struct pollfd pf = { s->ch->fd, POLLIN, 0 };
    CHECK(poll(&pf, 1, 300) == 0, "channel readable before any completion");
    sync_send('s'); /* B sends now */
    CHECK(poll(&pf, 1, 10000) == 1 && (pf.revents & POLLIN), "channel fd not readable after a completion");
    struct ibv_cq *cq = NULL; void *cctx = NULL;
    CHECK(ibv_get_cq_event(s->ch, &cq, &cctx) == 0 && cq == s->rcq && cctx == &rcq_tag, "get_cq_event");
    ibv_ack_cq_events(cq, 1);
    expect_wc(s->rcq, 900, IBV_WC_SUCCESS, IBV_WC_RECV, 33, "recv");
    CHECK(poll(&pf, 1, 0) == 0, "event consumed");
    /* An unarmed CQ raises no event. */
    post_recv(s, 901, 0, 4096);
    sync_send('s');
    expect_wc(s->rcq, 901, IBV_WC_SUCCESS, IBV_WC_RECV, 33, "recv 2");
    CHECK(poll(&pf, 1, 200) == 0, "unarmed CQ fired an event");
    sync_wait();
}
static void chanpoll_b(struct side *s, struct addr p) {
    connect_side(s, p);
    for (int i = 0; i < 2; i++) {
        sync_wait();
        CHECK(post_send(s, 1, 0, 33, 1) == 0, "send");
        expect_wc(s->scq, 1, IBV_WC_SUCCESS, IBV_WC_SEND, -1, "sent");
    }
    sync_send('d');
}

static void rtr_timeout_a(struct side *s, struct addr p) {
    connect_side(s, p);
    double t0 = now();
    CHECK(post_send(s, 1, 0, 10, 0) == 0, "send");
    expect_wc(s->scq, 1, IBV_WC_RETRY_EXC_ERR, 0, 0, "send to a peer that never reaches RTR");
    CHECK(now() - t0 >= 0.3, "timed out too early (%.3fs)", now() - t0);
    sync_send('d');
}
static void rtr_timeout_b(struct side *s, struct addr p) {
    (void)p;
    CHECK(to_init(s) == 0, "INIT only");
    sync_wait();
}

/* Single process: state-machine and protection checks, and cleanup. */
static int count_dir(const char *path) {
    DIR *d = opendir(path); int n = 0; struct dirent *e;
    if (!d) return -1;
    while ((e = readdir(d))) if (e->d_name[0] != '.') n++;
    closedir(d); return n;
}
static void modify_checks(void) {
    struct side s; open_side(&s);
    struct addr self = { s.qp->qp_num, s.gid };
    CHECK(to_rtr(&s, self, 0) == EINVAL, "RESET->RTR must be EINVAL");
    struct ibv_qp_attr a = {0};
    a.qp_state = IBV_QPS_INIT; a.port_num = 1;
    CHECK(ibv_modify_qp(s.qp, &a, IBV_QP_STATE | IBV_QP_PORT) == EINVAL, "INIT without pkey/access");
    CHECK(post_send(&s, 1, 0, 8, 0) != 0, "post_send in RESET");
    CHECK(to_init(&s) == 0, "INIT");
    CHECK(post_send(&s, 1, 0, 8, 0) != 0, "post_send in INIT");
    CHECK(to_rts(&s) == EINVAL, "INIT->RTS must be EINVAL");
    CHECK(to_rtr(&s, self, IBV_QP_SQ_PSN) == EINVAL, "RTR with an RTS-only attribute");
    CHECK(to_rtr(&s, self, 0) == 0, "RTR (loopback to itself)");
    CHECK(to_rts(&s) == 0, "RTS");
    /* An SGE outside the registered region: local protection error. */
    struct ibv_sge sge = { (uintptr_t)(s.buf + BUF - 8), 64, s.mr->lkey };
    struct ibv_send_wr wr = {0}, *bad = NULL;
    wr.wr_id = 7; wr.opcode = IBV_WR_SEND; wr.sg_list = &sge; wr.num_sge = 1; wr.send_flags = IBV_SEND_SIGNALED;
    CHECK(ibv_post_send(s.qp, &wr, &bad) == 0, "post");
    expect_wc(s.scq, 7, IBV_WC_LOC_PROT_ERR, 0, 0, "SGE outside the MR");
    /* Inline beyond the granted limit is refused at post time. */
    CHECK(post_send(&s, 8, 0, 100000, 1) != 0, "oversized inline");
    close_side(&s);
}

int main(int argc, char **argv) {
    setvbuf(stderr, NULL, _IONBF, 0);
    CHECK(argc == 2, "usage: client SCENARIO");
    const char *sc = argv[1];
    if (!strcmp(sc, "modify")) { modify_checks(); return 0; }
    if (!strcmp(sc, "cleanup")) {
        const char *dir = getenv("GGML_VERBS_FABRIC_DIR");
        CHECK(dir, "GGML_VERBS_FABRIC_DIR unset");
        int fds0 = count_dir("/proc/self/fd"), th0 = count_dir("/proc/self/task");
        for (int i = 0; i < 3; i++) {
            struct side s; open_side(&s);
            struct addr self = { s.qp->qp_num, s.gid };
            CHECK(to_init(&s) == 0, "INIT");
            post_recv(&s, 1, 0, 64);
            connect_side(&s, self); /* RTR starts the sender thread, which connects to itself */
            CHECK(post_send(&s, 2, 4096, 64, 0) == 0, "loopback send");
            expect_wc(s.scq, 2, IBV_WC_SUCCESS, IBV_WC_SEND, -1, "loopback send");
            expect_wc(s.rcq, 1, IBV_WC_SUCCESS, IBV_WC_RECV, 64, "loopback recv");
            CHECK(count_dir(dir) == 1, "one socket per QP");
            close_side(&s);
        }
        CHECK(count_dir(dir) == 0, "socket files left behind: %d", count_dir(dir));
        CHECK(count_dir("/proc/self/fd") == fds0, "fds left behind: %d -> %d", fds0, count_dir("/proc/self/fd"));
        CHECK(count_dir("/proc/self/task") == th0, "threads left behind: %d -> %d", th0, count_dir("/proc/self/task"));
        return 0;
    }
    void (*fa)(struct side *, struct addr) = NULL, (*fb)(struct side *, struct addr) = NULL;
#define SC(name) if (!strcmp(sc, #name)) { fa = name##_a; fb = name##_b; }
    SC(exchange) SC(small) SC(norecv) SC(kill) SC(peer_error) SC(chanpoll) SC(rtr_timeout)
    CHECK(fa, "unknown scenario %s", sc);
    int ab[2], ba[2];
    CHECK(pipe(ab) == 0 && pipe(ba) == 0, "pipe");
    child = fork();
    CHECK(child >= 0, "fork");
    struct side s;
    if (child == 0) {
        to_peer = ba[1]; from_peer = ab[0]; close(ab[1]); close(ba[0]);
        open_side(&s);
        fb(&s, swap_addr(&s));
        close_side(&s);
        _exit(0);
    }
    to_peer = ab[1]; from_peer = ba[0]; close(ab[0]); close(ba[1]);
    open_side(&s);
    fa(&s, swap_addr(&s));
    close_side(&s);
    if (child > 0) {
        int st = 0;
        CHECK(waitpid(child, &st, 0) == child, "waitpid");
        CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "side B failed (status %d)", st);
    }
    printf("ok %s\n", sc);
    return 0;
}
