/*
 * tcp_floor.c -- a bare-socket TCP ping-pong on this machine: two processes, one loopback TCP connection
 * (TCP_NODELAY), each side busy-polls recv(MSG_DONTWAIT) and answers with one send. No message layer at
 * all: a reference for what the kernel path costs (not a strict floor: busy recv contends for the socket
 * lock with loopback delivery, and in some runs an epoll-driven reader does better). bench/run.sh prints
 * it next to the TCP tables.
 *
 *   tcp_floor [--sizes 8,1024] [--iters N] [--json FILE]
 *
 * JSON: {"benchmark": "tcplat", "transport": "kernel-floor", "results": [{"size": 8, "latency_us": ...}]}
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
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

int main(int argc, char **argv)
{
    long sizes[16] = {8, 1024}, iters = 100000;
    int ns = 2;
    const char *json = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--iters") && i + 1 < argc) iters = atol(argv[++i]);
        else if (!strcmp(argv[i], "--json") && i + 1 < argc) json = argv[++i];
        else if (!strcmp(argv[i], "--sizes") && i + 1 < argc) {
            ns = 0;
            for (char *t = strtok(argv[++i], ","); t && ns < 16; t = strtok(NULL, ",")) sizes[ns++] = atol(t);
        } else {
            fprintf(stderr, "usage: tcp_floor [--sizes 8,1024] [--iters N] [--json FILE]\n");
            return 2;
        }
    }
    int one = 1, ls = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {0};
    socklen_t al = sizeof a;
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (ls < 0 || bind(ls, (void *)&a, sizeof a) || listen(ls, 1) || getsockname(ls, (void *)&a, &al)) die("listen");
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
