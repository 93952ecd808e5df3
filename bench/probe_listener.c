/* probe_listener.c - the 10,000 backends of bench/probe-cost.sh in one small process.
 *
 * Binds one listening socket per address 127.0.A.B:PORT for the first N addresses of
 * 127.0.1.1 .. 127.0.1.250, 127.0.2.1 .. (250 per /24, so 10,000 addresses end at 127.0.40.250),
 * each explicitly (never 0.0.0.0: nothing here is reachable from outside the host), and answers
 * every connection with `HTTP/1.1 200 OK` (Content-Length 3, "ok\n", Connection: close) as soon
 * as its request arrives, then closes it.
 *
 * It counts every accepted connection (= one probe) in 10 ms buckets of CLOCK_REALTIME and per
 * address. SIGUSR1 writes what was counted since the previous SIGUSR1 to OUT.<n> (n = 0, 1, ...)
 * and starts counting afresh: a header line "start_ns end_ns bucket_ns probes addresses_seen",
 * one line of bucket counts, one line of per-address counts. SIGTERM/SIGINT exit.
 *
 * With a 4th argument `spin`, it polls without ever sleeping (epoll_wait with timeout 0). On
 * loopback, the kernel work of waking a sleeping listener (an inter-processor wake-up from
 * inside connect() and send()) is charged to the prober's CPU time; a spinning listener never
 * sleeps, so the prober pays only for its own work. It costs one full core while it runs.
 *
 * Build: gcc -O2 -o probe_listener probe_listener.c
 * Usage: probe_listener N PORT OUT [spin]
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define BUCKET_NS 10000000LL /* 10 ms */
#define MAX_BUCKETS 100000   /* 1,000 s per dump period */
#define TAG_LISTEN (1ULL << 32)

static volatile sig_atomic_t want_dump = 0, want_exit = 0;
static void on_usr1(int s) { (void)s; want_dump = 1; }
static void on_term(int s) { (void)s; want_exit = 1; }

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static const char RESPONSE[] =
    "HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\nok\n";

int main(int argc, char **argv) {
    if (argc != 4 && !(argc == 5 && strcmp(argv[4], "spin") == 0)) {
        fprintf(stderr, "usage: %s N PORT OUT [spin]\n", argv[0]);
        return 2;
    }
    int wait_ms = argc == 5 ? 0 : 100;
    int n = atoi(argv[1]), port = atoi(argv[2]);
    const char *out = argv[3];
    if (n < 1 || n > 250 * 254) {
        fprintf(stderr, "N must be 1..%d\n", 250 * 254);
        return 2;
    }
    struct rlimit rl;
    getrlimit(RLIMIT_NOFILE, &rl);
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);

    int ep = epoll_create1(EPOLL_CLOEXEC);
    int *lfd = calloc(n, sizeof(int));
    uint32_t *per_addr = calloc(n, sizeof(uint32_t));
    uint32_t *buckets = calloc(MAX_BUCKETS, sizeof(uint32_t));
    for (int i = 0; i < n; i++) {
        struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
        sa.sin_addr.s_addr = htonl((127u << 24) | ((uint32_t)(1 + i / 250) << 8) | (uint32_t)(1 + i % 250));
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof sa) < 0 || listen(fd, 128) < 0) {
            fprintf(stderr, "listen %s:%d: %s\n", inet_ntoa(sa.sin_addr), port, strerror(errno));
            return 1;
        }
        lfd[i] = fd;
        struct epoll_event ev = {.events = EPOLLIN, .data.u64 = TAG_LISTEN | (uint64_t)i};
        epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);
    }
    signal(SIGUSR1, on_usr1);
    signal(SIGTERM, on_term);
    signal(SIGINT, on_term);
    signal(SIGPIPE, SIG_IGN);
    fprintf(stderr, "probe_listener: %d addresses 127.0.1.1..127.0.%d.%d port %d%s ready\n", n,
            1 + (n - 1) / 250, 1 + (n - 1) % 250, port, wait_ms ? "" : " (spinning)");

    int64_t start = now_ns();
    uint64_t probes = 0;
    int dumps = 0;
    struct epoll_event evs[512];
    char buf[4096];
    while (!want_exit) {
        if (want_dump) {
            want_dump = 0;
            int64_t end = now_ns();
            char path[4096];
            snprintf(path, sizeof path, "%s.%d", out, dumps++);
            FILE *f = fopen(path, "w");
            if (f) {
                int seen = 0;
                for (int i = 0; i < n; i++) seen += per_addr[i] > 0;
                fprintf(f, "%lld %lld %lld %llu %d\n", (long long)start, (long long)end, BUCKET_NS,
                        (unsigned long long)probes, seen);
                int64_t nb = (end - start) / BUCKET_NS + 1;
                if (nb > MAX_BUCKETS) nb = MAX_BUCKETS;
                for (int64_t b = 0; b < nb; b++) fprintf(f, b ? " %u" : "%u", buckets[b]);
                fputc('\n', f);
                for (int i = 0; i < n; i++) fprintf(f, i ? " %u" : "%u", per_addr[i]);
                fputc('\n', f);
                fclose(f);
            }
            memset(buckets, 0, MAX_BUCKETS * sizeof(uint32_t));
            memset(per_addr, 0, n * sizeof(uint32_t));
            probes = 0;
            start = end;
        }
        int k = epoll_wait(ep, evs, 512, wait_ms);
        for (int e = 0; e < k; e++) {
            uint64_t tag = evs[e].data.u64;
            if (tag & TAG_LISTEN) {
                int i = (int)(tag & 0xffffffffu);
                for (;;) {
                    int c = accept4(lfd[i], NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
                    if (c < 0) break;
                    int64_t t = now_ns();
                    int64_t b = (t - start) / BUCKET_NS;
                    if (b >= 0 && b < MAX_BUCKETS) buckets[b]++;
                    per_addr[i]++;
                    probes++;
                    /* The request is usually there already; if not, wait for it. */
                    ssize_t r = read(c, buf, sizeof buf);
                    if (r > 0) {
                        ssize_t w = write(c, RESPONSE, sizeof RESPONSE - 1);
                        (void)w;
                        close(c);
                    } else if (r < 0 && errno == EAGAIN) {
                        struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP, .data.u64 = (uint64_t)c};
                        epoll_ctl(ep, EPOLL_CTL_ADD, c, &ev);
                    } else {
                        close(c);
                    }
                }
            } else {
                int c = (int)tag;
                ssize_t r = read(c, buf, sizeof buf);
                if (r > 0) {
                    ssize_t w = write(c, RESPONSE, sizeof RESPONSE - 1);
                    (void)w;
                }
                if (r >= 0 || errno != EAGAIN) close(c);
            }
        }
    }
    return 0;
}
