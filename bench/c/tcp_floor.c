/*
 * tcp_floor.c -- a bare-socket TCP ping-pong on this machine: two processes, one loopback TCP connection
 * (TCP_NODELAY), each side busy-polls recv(MSG_DONTWAIT) and answers with one send. No message layer at
 * all: a reference for what the kernel path costs (not a strict floor: busy recv contends for the socket
 * lock with loopback delivery, and in some runs an epoll-driven reader does better). bench/run.sh prints
 * it next to the TCP tables.
 *
 *   tcp_floor [--sizes 8,1024] [--iters N] [--json FILE]
 *   tcp_floor --bw plain|spin|zerocopy|splice [--sizes 1048576] [--iters N] [--json FILE]
 *
 * --bw streams N messages of each size one way (4 MiB socket buffers, as vmfabric's TCP transport) and
 * reports MB/s. `plain`: blocking send/recv. `spin`: nonblocking send and recv, each retried at once
 * (MSG_DONTWAIT), as vmfabric's transport polls: the kernel's bandwidth ceiling on this machine (a
 * reader that keeps the socket busy takes in the packets the sender's CPU would otherwise process; this
 * ran at 1.5x `plain` in the same rounds). `zerocopy` sends with
 * MSG_ZEROCOPY (completions reaped from the error queue), `splice` moves the user pages with
 * vmsplice+splice (no copy on the sender; unsafe for MPI unless the receiver acknowledges). Over loopback
 * both still end in a copy (zerocopy frags are copied on delivery; spliced pages are copied by the reader),
 * which is why vmfabric sends plainly; see docs/transports/tcp.md.
 *
 * JSON: {"benchmark": "tcplat", "transport": "kernel-floor", "results": [{"size": 8, "latency_us": ...}]}
 *       (--bw: "tcpbw", "kernel-floor-<mode>", "mb_per_s")
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/errqueue.h>
#include <sys/uio.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void die(const char *m)
{
    perror(m);
    exit(1);
}

static void xfer(int s, char *b, long n, int out)
{
    long d = 0;
    while (d < n) {
        long r = out ? send(s, b + d, n - d, 0) : recv(s, b + d, n - d, MSG_DONTWAIT);
        if (r > 0) d += r;
        else if (r == 0) die("peer closed");
    }
}

/* A listening socket on a kernel-chosen loopback port; its address in *a. */
static int loopback_listener(struct sockaddr_in *a)
{
    int ls = socket(AF_INET, SOCK_STREAM, 0);
    socklen_t al = sizeof *a;
    memset(a, 0, sizeof *a);
    a->sin_family = AF_INET;
    a->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (ls < 0 || bind(ls, (void *)a, sizeof *a) || listen(ls, 1) || getsockname(ls, (void *)a, &al)) die("listen");
    return ls;
}

#ifndef SO_ZEROCOPY
#define SO_ZEROCOPY 60
#endif
#ifndef MSG_ZEROCOPY
#define MSG_ZEROCOPY 0x4000000
#endif

/* Send n bytes with `mode` (0 plain, 1 MSG_ZEROCOPY, 2 vmsplice+splice through pipe p, 3 nonblocking). */
static void bw_send(int s, char *b, long n, int mode, int p[2])
{
    long d = 0;
    while (d < n) {
        long r;
        if (mode == 2) {
            struct iovec v = {b + d, n - d};
            r = vmsplice(p[1], &v, 1, 0);
            if (r <= 0) die("vmsplice");
            for (long q = r; q > 0;) {
                long w = splice(p[0], NULL, s, NULL, q, SPLICE_F_MORE);
                if (w <= 0) die("splice");
                q -= w;
            }
        } else if (mode == 3) {
            r = send(s, b + d, n - d, MSG_DONTWAIT);
            if (r < 0 && errno == EAGAIN) continue;
            if (r <= 0) die("send");
        } else {
            r = send(s, b + d, n - d, mode == 1 ? MSG_ZEROCOPY : 0);
            if (r <= 0) die("send");
        }
        d += r;
    }
    if (mode == 1) { /* reap completions so that the socket's option memory never runs out */
        char c[256];
        struct msghdr m = {0};
        m.msg_control = c;
        m.msg_controllen = sizeof c;
        while (recvmsg(s, &m, MSG_ERRQUEUE | MSG_DONTWAIT) > 0) m.msg_controllen = sizeof c;
    }
}

static int bandwidth(const char *mode_s, long *sizes, int ns, long iters, const char *json)
{
    int mode = !strcmp(mode_s, "plain") ? 0 : !strcmp(mode_s, "zerocopy") ? 1 : !strcmp(mode_s, "splice") ? 2
             : !strcmp(mode_s, "spin") ? 3 : -1;
    if (mode < 0) {
        fprintf(stderr, "tcp_floor: --bw takes plain, spin, zerocopy or splice\n");
        return 2;
    }
    int one = 1, buf = 4 << 20;
    struct sockaddr_in a;
    int ls = loopback_listener(&a);
    long maxs = 1;
    for (int k = 0; k < ns; k++) if (sizes[k] > maxs) maxs = sizes[k];
    char *b = aligned_alloc(4096, (maxs + 4095) / 4096 * 4096);
    memset(b, 1, maxs);
    pid_t child = fork();
    if (child == 0) {
        int s = socket(AF_INET, SOCK_STREAM, 0);
        setsockopt(s, SOL_SOCKET, SO_RCVBUF, &buf, sizeof buf);
        if (connect(s, (void *)&a, sizeof a)) die("connect");
        for (int k = 0; k < ns; k++) {
            for (long i = 0; i < iters; i++)
                for (long d = 0; d < sizes[k];) {
                    long r = recv(s, b + d, sizes[k] - d, mode == 3 ? MSG_DONTWAIT : 0);
                    if (r < 0 && mode == 3 && errno == EAGAIN) continue;
                    if (r <= 0) die("recv");
                    d += r;
                }
            if (send(s, b, 1, 0) != 1) die("ack");
        }
        exit(0);
    }
    int s = accept(ls, NULL, NULL), p[2] = {-1, -1};
    if (s < 0) die("accept");
    setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    setsockopt(s, SOL_SOCKET, SO_SNDBUF, &buf, sizeof buf);
    if (mode == 1 && setsockopt(s, SOL_SOCKET, SO_ZEROCOPY, &one, sizeof one)) die("SO_ZEROCOPY");
    if (mode == 2 && (pipe(p) || fcntl(p[1], F_SETPIPE_SZ, 1 << 20) < 0)) die("pipe");
    double mbs[16];
    for (int k = 0; k < ns; k++) {
        double t0 = now();
        for (long i = 0; i < iters; i++) bw_send(s, b, sizes[k], mode, p);
        char c;
        if (recv(s, &c, 1, MSG_WAITALL) != 1) die("ack");
        mbs[k] = (double)sizes[k] * iters / (now() - t0) / 1e6;
        printf("%10ld %14.1f MB/s (%s)\n", sizes[k], mbs[k], mode_s);
    }
    waitpid(child, NULL, 0);
    if (json) {
        FILE *f = fopen(json, "w");
        if (!f) die(json);
        fprintf(f, "{\"benchmark\": \"tcpbw\", \"transport\": \"kernel-floor-%s\", \"results\": [", mode_s);
        for (int k = 0; k < ns; k++) fprintf(f, "%s{\"size\": %ld, \"mb_per_s\": %.1f}", k ? ", " : "", sizes[k], mbs[k]);
        fprintf(f, "]}\n");
        fclose(f);
    }
    return 0;
}

int main(int argc, char **argv)
{
    long sizes[16] = {8, 1024}, iters = 100000;
    int ns = 2;
    const char *json = NULL, *bw = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--iters") && i + 1 < argc) iters = atol(argv[++i]);
        else if (!strcmp(argv[i], "--bw") && i + 1 < argc) bw = argv[++i];
        else if (!strcmp(argv[i], "--json") && i + 1 < argc) json = argv[++i];
        else if (!strcmp(argv[i], "--sizes") && i + 1 < argc) {
            ns = 0;
            for (char *t = strtok(argv[++i], ","); t && ns < 16; t = strtok(NULL, ",")) sizes[ns++] = atol(t);
        } else {
            fprintf(stderr, "usage: tcp_floor [--bw plain|spin|zerocopy|splice] [--sizes 8,1024] [--iters N] [--json FILE]\n");
            return 2;
        }
    }
    if (bw) return bandwidth(bw, sizes, ns, iters, json);
    int one = 1;
    struct sockaddr_in a;
    int ls = loopback_listener(&a);
    long maxs = 1;
    for (int k = 0; k < ns; k++) if (sizes[k] > maxs) maxs = sizes[k];
    char *b = calloc(1, maxs);
    pid_t child = fork();
    if (child == 0) {
        int s = socket(AF_INET, SOCK_STREAM, 0);
        if (connect(s, (void *)&a, sizeof a)) die("connect");
        setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        for (int k = 0; k < ns; k++)
            for (long i = 0; i < iters + iters / 10; i++) {
                xfer(s, b, sizes[k], 0);
                xfer(s, b, sizes[k], 1);
            }
        exit(0);
    }
    int s = accept(ls, NULL, NULL);
    if (s < 0) die("accept");
    setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    double lat[16];
    for (int k = 0; k < ns; k++) {
        double t0 = 0;
        for (long i = 0; i < iters + iters / 10; i++) {
            if (i == iters / 10) t0 = now();
            xfer(s, b, sizes[k], 1);
            xfer(s, b, sizes[k], 0);
        }
        lat[k] = (now() - t0) / iters / 2 * 1e6;
        printf("%10ld %14.3f\n", sizes[k], lat[k]);
    }
    waitpid(child, NULL, 0);
    if (json) {
        FILE *f = fopen(json, "w");
        if (!f) die(json);
        fprintf(f, "{\"benchmark\": \"tcplat\", \"transport\": \"kernel-floor\", \"results\": [");
        for (int k = 0; k < ns; k++) fprintf(f, "%s{\"size\": %ld, \"latency_us\": %.4f}", k ? ", " : "", sizes[k], lat[k]);
        fprintf(f, "]}\n");
        fclose(f);
    }
    return 0;
}
