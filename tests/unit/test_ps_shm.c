/* test_ps_shm: a shard's shared memory against the processes around it —
 * a process of this user (root, here) that opens the parameter segment by
 * the name the WELCOME gives and writes NaN changes nothing the shard
 * serves or checkpoints; a peer that is not on this host is not offered
 * shared memory; a shard killed with kill -9 leaves no segment behind.
 * Servers run in a thread of this program (tests/ps_harness.h), except
 * the one killed, which is a child process. */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <math.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/util.h"
#include "proto/wire.h"
#include "server/core/shard_checkpoint.h"
#include "tests/ps_harness.h"
#include "tests/test.h"
#include "worker/client/ps_client.h"

#define TMO 5.0 /* client timeout in these tests */

static dp_model_t s_small;

/* HELLO as worker wid asking for shared memory; the reply's type, and the
 * parameter segment's name the WELCOME gives ("" for none) in name. */
static int s_hello_shm(void *sock, int wid, char *name, size_t name_n)
{
    Downpour__Envelope env, *rep;
    Downpour__Hello h;
    raw_hello_init(&env, &h, &s_small, wid, 1);
    h.shm = 1;
    int type = raw_request(sock, &env, &rep);
    snprintf(name, name_n, "%s", rep && rep->welcome && rep->welcome->shm_name ? rep->welcome->shm_name : "");
    dp_wire_destroy(&rep);
    return type;
}

/* HELLO as worker wid without shared memory; the reply's type. */
static int s_hello_plain(void *sock, int wid)
{
    Downpour__Envelope env;
    Downpour__Hello h;
    raw_hello_init(&env, &h, &s_small, wid, 2);
    return raw_request(sock, &env, NULL);
}

/* A PUSH of the whole range as worker wid saying the gradient is in its
 * segment (whatever that holds); the reply's type, its error text in why. */
static int s_push_shm(void *sock, int wid, char *why, size_t why_n)
{
    Downpour__Envelope env, *rep;
    dp_wire_env_init(&env, DOWNPOUR__MSG_TYPE__PUSH, 3, wid, s_small.fingerprint);
    Downpour__Push pu = DOWNPOUR__PUSH__INIT;
    env.push = &pu;
    env.shm = 1;
    Downpour__TensorDesc d;
    Downpour__TensorDesc *dv[1] = {&d};
    int64_t shape[1];
    dp_wire_desc_fill(&d, shape, "params", NULL, s_small.n_floats, 0, 1, 0);
    dp_wire_desc_no_checksum(&d);
    env.n_tensors = 1;
    env.tensors = dv;
    int type = raw_request(sock, &env, &rep);
    snprintf(why, why_n, "%s", rep && rep->error && rep->error->message ? rep->error->message : "");
    dp_wire_destroy(&rep);
    return type;
}

/* ---- a hostile process of the same user -------------------------------- */

/* Everything a process of this user can try with a segment's name to
 * overwrite every float after the header: open it (as a path, or as a
 * POSIX shm name), punch a hole (zeros), write() NaN, a writable shared
 * mapping, a read-only one made writable. The exit status has a bit per
 * way that went through (0: none did); 0x80: the name did not open. Runs
 * in a child: only system calls. */
static int s_scribble(const char *name)
{
    int fd = open(name, O_RDWR);
    if (fd < 0) fd = shm_open(name, O_RDWR, 0);
    if (fd < 0) fd = open(name, O_RDONLY);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0 || st.st_size <= 4096) return 0x80;
    size_t bytes = (size_t)st.st_size, n = (bytes - 4096) / 4;
    int bits = 0;
    if (fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 4096, (off_t)(bytes - 4096)) == 0)
        bits |= 8; /* zeros: first, so that the NaN below land on top */
    static float nan_page[1024];
    for (int i = 0; i < 1024; i++) nan_page[i] = NAN;
    if (pwrite(fd, nan_page, 4 * (n < 1024 ? n : 1024), 4096) > 0) bits |= 1;
    float *w = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (w != MAP_FAILED) {
        bits |= 2;
        for (size_t i = 0; i < n; i++) w[1024 + i] = NAN;
    }
    float *r = mmap(NULL, bytes, PROT_READ, MAP_SHARED, fd, 0);
    if (r != MAP_FAILED && mprotect(r, bytes, PROT_READ | PROT_WRITE) == 0) {
        bits |= 4;
        for (size_t i = 0; i < n; i++) r[1024 + i] = NAN;
    }
    return bits;
}

/* A worker that writes NaN into the parameter segment (whatever way it
 * can) changes nothing: the next PARAMS, frames or shared memory, are the
 * weights the pushes made, and so is the checkpoint a restart restores. */
static void test_hostile_writer(void)
{
    srv_small_model(&s_small);
    char dir[128], err[DP_ERR_LEN] = "";
    snprintf(dir, sizeof dir, "/tmp/dp-test-ps-shm-%d", (int)getpid());
    srv_t s;
    srv_init(&s, DP_MODE_ASYNC, 3);
    snprintf(s.cfg.checkpoint_dir, sizeof s.cfg.checkpoint_dir, "%s", dir);
    CHECK_EQ(srv_start(&s), 0);
    size_t n = s_small.n_floats;
    float *p0 = dp_malloc(n * 4), *p = dp_malloc(n * 4), *g = dp_malloc(n * 4), *want = dp_malloc(n * 4);
    dp_ps_client_t *c0 = NULL, *c2 = NULL;
    dp_ps_client_opts_t shm = {.timeout_s = TMO, .transport = DP_PS_TRANSPORT_SHM};
    dp_ps_client_opts_t frames = {.timeout_s = TMO, .transport = DP_PS_TRANSPORT_ZMQ};
    CHECK_EQ(dp_ps_client_new(&c0, s.endpoint, &s_small, 0, &shm, NULL, err), 0);
    CHECK_EQ(dp_ps_client_new(&c2, s.endpoint, &s_small, 2, &frames, NULL, err), 0);
    void *ctx = zmq_ctx_new(), *raw = raw_dealer(ctx, s.endpoint, 5000);
    char name[256];
    CHECK_EQ(s_hello_shm(raw, 1, name, sizeof name), DOWNPOUR__MSG_TYPE__WELCOME);
    CHECK(name[0] != 0);
    if (c0 && c2 && name[0]) {
        CHECK_EQ(dp_ps_client_shm_shards(c0), 1);
        CHECK_EQ(dp_ps_client_pull(c0, p0, err), 0);
        fflush(NULL);
        pid_t kid = fork();
        if (kid == 0) _exit(s_scribble(name));
        int st = 0;
        CHECK_EQ(waitpid(kid, &st, 0), kid);
        CHECK(WIFEXITED(st));
        CHECK_EQ(WEXITSTATUS(st), 0); /* bits: 1 write, 2 mmap, 4 mprotect, 8 hole went through */
        CHECK_EQ(dp_ps_client_pull(c2, p, err), 0);
        CHECK_CLOSE("frames after the scribble: the weights as they were", p, p0, n, 0, 0);
        CHECK_EQ(dp_ps_client_pull(c0, p, err), 0);
        CHECK_CLOSE("shared memory after the scribble", p, p0, n, 0, 0);
        srv_fill(g, n, 31);
        dp_push_result_t r;
        CHECK_EQ(dp_ps_client_push(c0, PS_PUSH(g, 1, 8), &r, err), 0);
        CHECK_EQ(r.applied, 1);
        for (size_t i = 0; i < n; i++) want[i] = p0[i] - 0.1f * g[i];
        CHECK_EQ(dp_ps_client_pull(c2, p, err), 0);
        CHECK_CLOSE("one step on the true weights", p, want, n, 0, 0);
        CHECK_EQ(dp_ps_client_shutdown_servers(c0, err), 0); /* the checkpoint */
    }
    zmq_close(raw);
    zmq_ctx_term(ctx);
    dp_ps_client_destroy(&c0);
    dp_ps_client_destroy(&c2);
    CHECK_EQ(srv_stop_after(&s, 5), 0);
    /* the checkpoint restores (a NaN in it would be refused) to those weights */
    srv_t s2;
    srv_init(&s2, DP_MODE_ASYNC, 3);
    s2.cfg.resume = 1; /* SHUTDOWN finished the run */
    snprintf(s2.cfg.checkpoint_dir, sizeof s2.cfg.checkpoint_dir, "%s", dir);
    int up = srv_start(&s2) == 0;
    CHECK(up);
    if (!up) fprintf(stderr, "  %s\n", s2.err);
    if (up) CHECK_EQ(dp_ps_client_new(&c2, s2.endpoint, &s_small, 2, PS_OPTS(TMO), NULL, err), 0);
    if (c2) {
        CHECK_EQ(dp_ps_client_pull(c2, p, err), 0);
        CHECK_EQ(dp_ps_client_version(c2), 1);
        CHECK_CLOSE("restored from the checkpoint", p, want, n, 0, 0);
    }
    dp_ps_client_destroy(&c2);
    CHECK_EQ(srv_stop(&s2), up ? 0 : -1);
    free(p0), free(p), free(g), free(want);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK_EQ(system(cmd), 0);
}

/* ---- a peer that is not on this host ---------------------------------- */

/* The first address of this host that is up and not loopback, or 0. */
static int s_routable_address(char *out, size_t n)
{
    struct ifaddrs *all = NULL, *a;
    if (getifaddrs(&all) != 0) return 0;
    int found = 0;
    for (a = all; a && !found; a = a->ifa_next) {
        if (!a->ifa_addr || a->ifa_addr->sa_family != AF_INET || !(a->ifa_flags & IFF_UP) ||
            (a->ifa_flags & IFF_LOOPBACK))
            continue;
        found = inet_ntop(AF_INET, &((struct sockaddr_in *)a->ifa_addr)->sin_addr, out, (socklen_t)n) != NULL;
    }
    freeifaddrs(all);
    return found;
}

/* A server listening on every address: the peer that comes through a
 * routable one (as a peer on another host would; it is this host's own
 * address here, so the test needs no second host) gets a WELCOME without
 * segments, and --transport shm fails there; through loopback the same
 * server grants it. */
static void test_not_local_refused(void)
{
    srv_small_model(&s_small);
    char addr[64];
    if (!s_routable_address(addr, sizeof addr)) SKIP("this host has no address but loopback (getifaddrs)");
    srv_t s;
    srv_init(&s, DP_MODE_ASYNC, 3);
    snprintf(s.cfg.bind, sizeof s.cfg.bind, "tcp://0.0.0.0:*");
    CHECK_EQ(srv_start(&s), 0);
    const char *port = strrchr(s.endpoint, ':');
    char remote[128], local[128], name[256], err[DP_ERR_LEN] = "";
    snprintf(remote, sizeof remote, "tcp://%s%s", addr, port ? port : ":0");
    snprintf(local, sizeof local, "tcp://127.0.0.1%s", port ? port : ":0");
    void *ctx = zmq_ctx_new(), *raw = raw_dealer(ctx, remote, 5000);
    CHECK_EQ(s_hello_shm(raw, 1, name, sizeof name), DOWNPOUR__MSG_TYPE__WELCOME);
    CHECK_STR(name, "");
    char why[DP_ERR_LEN];
    CHECK_EQ(s_push_shm(raw, 1, why, sizeof why), DOWNPOUR__MSG_TYPE__ERROR);
    CHECK(strstr(why, "malformed: PUSH through shared memory") != NULL);
    zmq_close(raw);
    zmq_ctx_term(ctx);
    dp_ps_client_t *c = NULL;
    dp_ps_client_opts_t shm = {.timeout_s = TMO, .transport = DP_PS_TRANSPORT_SHM};
    CHECK_EQ(dp_ps_client_new(&c, remote, &s_small, 2, &shm, NULL, err), -1);
    CHECK(strstr(err, "did not grant shared memory") != NULL);
    dp_ps_client_destroy(&c);
    CHECK_EQ(dp_ps_client_new(&c, local, &s_small, 0, &shm, NULL, err), 0);
    if (c) CHECK_EQ(dp_ps_client_shm_shards(c), 1);
    dp_ps_client_destroy(&c);
    CHECK_EQ(srv_stop(&s), 0);
}

/* A grant holds for the HELLO that got it: the same connection saying
 * HELLO again without asking (as a peer that took over the id would) may
 * no longer push "from" the segment, which still holds what was written
 * there before. */
static void test_grant_per_hello(void)
{
    srv_small_model(&s_small);
    srv_t s;
    srv_init(&s, DP_MODE_ASYNC, 2);
    CHECK_EQ(srv_start(&s), 0);
    char name[256], why[DP_ERR_LEN], err[DP_ERR_LEN] = "";
    void *ctx = zmq_ctx_new(), *raw = raw_dealer(ctx, s.endpoint, 5000);
    CHECK_EQ(s_hello_shm(raw, 1, name, sizeof name), DOWNPOUR__MSG_TYPE__WELCOME);
    CHECK(name[0] != 0);
    CHECK_EQ(s_push_shm(raw, 1, why, sizeof why), DOWNPOUR__MSG_TYPE__ACK); /* granted: applied */
    CHECK_EQ(s_hello_plain(raw, 1), DOWNPOUR__MSG_TYPE__WELCOME);
    CHECK_EQ(s_push_shm(raw, 1, why, sizeof why), DOWNPOUR__MSG_TYPE__ERROR);
    CHECK(strstr(why, "has no segment") != NULL);
    zmq_close(raw);
    zmq_ctx_term(ctx);
    dp_ps_client_t *c = NULL;
    CHECK_EQ(dp_ps_client_new(&c, s.endpoint, &s_small, 0, PS_OPTS(TMO), NULL, err), 0);
    dp_ps_stats_t st;
    if (c) {
        CHECK_EQ(dp_ps_client_stats(c, &st, err), 0);
        CHECK_EQ(st.version, 1); /* the first push only */
        CHECK_EQ(st.applied, 1);
    }
    dp_ps_client_destroy(&c);
    CHECK_EQ(srv_stop(&s), 0);
}

/* ---- kill -9 ------------------------------------------------------------ */

/* /dev/shm entries named for pid ("downpour-PID-..."), removed when
 * remove is set (what an older server left). */
static int s_segments_of(int pid, int remove)
{
    char prefix[64];
    snprintf(prefix, sizeof prefix, "downpour-%d-", pid);
    DIR *d = opendir("/dev/shm");
    if (!d) return 0;
    int k = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (strncmp(e->d_name, prefix, strlen(prefix)) != 0) continue;
        k++;
        char path[300];
        snprintf(path, sizeof path, "/dev/shm/%s", e->d_name);
        if (remove) unlink(path);
    }
    closedir(d);
    return k;
}

/* Our mappings of some shard's segments (memfds named downpour-*, or
 * /dev/shm files). */
static int s_mapped_segments(void)
{
    FILE *f = fopen("/proc/self/maps", "r");
    if (!f) return -1;
    char line[512];
    int k = 0;
    while (fgets(line, sizeof line, f))
        k += strstr(line, "/memfd:downpour-") != NULL || strstr(line, "/dev/shm/downpour-") != NULL;
    fclose(f);
    return k;
}

static void s_ready_to_pipe(const char *ep, void *arg)
{
    int fd = *(int *)arg;
    if (write(fd, ep, strlen(ep) + 1) < 0) _exit(3);
}

/* A shard process (a child) that granted shared memory, killed with
 * SIGKILL: nothing of it in /dev/shm, while it ran or after; the worker
 * still reads its mapping, and its memory goes with the worker's. */
static void test_kill9_leaves_nothing(void)
{
    srv_small_model(&s_small);
    int pfd[2];
    CHECK_EQ(pipe(pfd), 0);
    fflush(NULL);
    pid_t kid = fork();
    if (kid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlives the test */
        close(pfd[0]);
        srv_t s;
        srv_init(&s, DP_MODE_ASYNC, 1);
        s.cfg.on_ready = s_ready_to_pipe;
        s.cfg.on_ready_arg = &pfd[1];
        char err[DP_ERR_LEN];
        _exit(dp_ps_run(&s.cfg, &s.stop, err) == 0 ? 0 : 1);
    }
    close(pfd[1]);
    char ep[256] = "";
    struct pollfd pw = {pfd[0], POLLIN, 0};
    int ready = poll(&pw, 1, 10000) == 1 && read(pfd[0], ep, sizeof ep - 1) > 0;
    close(pfd[0]);
    CHECK(ready);
    char err[DP_ERR_LEN] = "";
    dp_ps_client_t *c = NULL;
    size_t n = s_small.n_floats;
    float *p = dp_malloc(n * 4), *g = dp_malloc(n * 4);
    if (ready) {
        dp_ps_client_opts_t shm = {.timeout_s = TMO, .transport = DP_PS_TRANSPORT_SHM};
        CHECK_EQ(dp_ps_client_new(&c, ep, &s_small, 0, &shm, NULL, err), 0);
    }
    if (c) {
        CHECK_EQ(dp_ps_client_shm_shards(c), 1);
        srv_fill(g, n, 5);
        dp_push_result_t r;
        CHECK_EQ(dp_ps_client_pull(c, p, err), 0);
        CHECK_EQ(dp_ps_client_push(c, PS_PUSH(g, 1, 8), &r, err), 0);
        CHECK_EQ(r.applied, 1);
        CHECK_EQ(dp_ps_client_pull(c, p, err), 0);
        CHECK_EQ(s_segments_of(kid, 0), 0); /* running: none has a name */
        CHECK_EQ(s_mapped_segments(), 2);   /* the parameters and our gradient */
    }
    CHECK_EQ(kill(kid, SIGKILL), 0);
    int st = 0;
    CHECK_EQ(waitpid(kid, &st, 0), kid);
    CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
    int left = s_segments_of(kid, 1); /* removed here even when found: no test leaves one */
    CHECK_EQ(left, 0);
    dp_ps_client_destroy(&c);
    CHECK_EQ(s_mapped_segments(), 0); /* the last mapping: the memory is gone */
    free(p), free(g);
}

/* ---- the push made where it is sent from ------------------------------- */

/* dp_ps_client_push_buffer: with the one shard on this host, the worker's
 * gradient slot itself, and a push made there steps the weights as one
 * from the worker's own memory; none over frames or for less than the
 * model. The buffer outlives the shard: lent, then the shard restarts (a
 * new incarnation, new segments), the push made in it still goes, copied
 * into the new segment, and steps the new shard's weights; the old
 * mapping goes at the next call, not before. */
/* A gradient filled (seed) in g, c's push buffer, pushed by c; the
 * weights then pulled by reader: p0 less one SGD step (lr 0.1) by g, bit
 * for bit. */
static void s_push_made_in(dp_ps_client_t *c, dp_ps_client_t *reader, float *g, uint64_t seed,
                           const float *p0, const char *what)
{
    size_t n = s_small.n_floats;
    float *want = dp_malloc(n * 4), *p = dp_malloc(n * 4);
    char err[DP_ERR_LEN] = "";
    srv_fill(g, n, seed);
    for (size_t i = 0; i < n; i++) want[i] = p0[i] - 0.1f * g[i];
    dp_push_result_t r;
    CHECK_EQ(dp_ps_client_push(c, PS_PUSH(g, 1, 8), &r, err), 0);
    CHECK_EQ(r.applied, 1);
    CHECK_EQ(dp_ps_client_pull(reader, p, err), 0);
    CHECK_CLOSE(what, p, want, n, 0, 0);
    free(want), free(p);
}

static void test_push_in_place(void)
{
    srv_small_model(&s_small);
    srv_t s;
    srv_init(&s, DP_MODE_ASYNC, 2);
    CHECK_EQ(srv_start(&s), 0);
    size_t n = s_small.n_floats;
    float *p0 = dp_malloc(n * 4);
    char err[DP_ERR_LEN] = "";
    dp_ps_client_opts_t shm = {.timeout_s = TMO, .transport = DP_PS_TRANSPORT_SHM};
    dp_ps_client_opts_t frames = {.timeout_s = TMO, .transport = DP_PS_TRANSPORT_ZMQ};
    dp_ps_client_t *c = NULL, *cf = NULL;
    CHECK_EQ(dp_ps_client_new(&c, s.endpoint, &s_small, 0, &shm, NULL, err), 0);
    CHECK_EQ(dp_ps_client_new(&cf, s.endpoint, &s_small, 1, &frames, NULL, err), 0);
    srv_t s2;
    int up = 0;
    if (c && cf) {
        CHECK(dp_ps_client_push_buffer(cf, n) == NULL);
        CHECK(dp_ps_client_push_buffer(c, n - 1) == NULL);
        float *g = dp_ps_client_push_buffer(c, n);
        CHECK(g != NULL);
        CHECK_EQ(dp_ps_client_pull(c, p0, err), 0);
        if (g) s_push_made_in(c, cf, g, 41, p0, "a push made in the slot");
        /* lent again, then the shard restarts under it */
        float *g2 = dp_ps_client_push_buffer(c, n);
        CHECK(g2 == g); /* the same shard: the same slot */
        int mapped = s_mapped_segments();
        CHECK_EQ(srv_stop(&s), 0);
        srv_init(&s2, DP_MODE_ASYNC, 2); /* seed 7 again: p0 again, version 0 */
        snprintf(s2.cfg.bind, sizeof s2.cfg.bind, "%s", s.endpoint);
        up = srv_start(&s2) == 0;
        CHECK(up);
        if (g2 && up) {
            s_push_made_in(c, c, g2, 42, p0, "the restarted shard stepped by the lent buffer");
            /* ours: the old gradient kept and the new segments; the server's
             * new ones instead of its old */
            CHECK_EQ(s_mapped_segments(), mapped + 1);
            float *g3 = dp_ps_client_push_buffer(c, n);
            CHECK(g3 != NULL && g3 != g2);
            CHECK_EQ(s_mapped_segments(), mapped);
        }
    }
    dp_ps_client_destroy(&c);
    dp_ps_client_destroy(&cf);
    if (up) CHECK_EQ(srv_stop(&s2), 0);
    else srv_stop(&s);
    free(p0);
}

DP_TESTS(T(test_hostile_writer), T(test_not_local_refused), T(test_grant_per_hello),
         T(test_kill9_leaves_nothing), T(test_push_in_place))
