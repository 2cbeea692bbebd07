/* bench/noise.c: intake noise from one thread of one process (bench.intake --generator c).
 *
 * The Python generator spends a thread per client and about 1.2 cores of 2 on 100 OCI
 * clients: on this machine class that alone raises a neighbour's p99 ~19x, so it could not
 * show whether fhmon keeps its 3x bound. This one makes the same bytes from one epoll loop.
 *
 *   noise dribble SOCKET CLIENTS INTERVAL_US PREFIX_HEX BODY_HEX ENDLESS
 *       each client sends PREFIX at once, then BODY one byte every INTERVAL_US; at the end
 *       of BODY it repeats BODY's last byte forever (ENDLESS=1) or reconnects (0).
 *       A client whose connection fails or is closed reconnects.
 *   noise pingpong SOCKET CLIENTS BURST_HEX ANSWER_BYTES
 *       each client writes BURST, reads until ANSWER_BYTES came back, and again.
 *   noise sink SOCKET UID
 *       a socket (owned by UID) that reads and discards everything: the noise floor.
 *
 * It runs until SIGTERM; SIGPIPE is ignored. Benchmark code, not part of fhmon.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

struct client {
    int fd;
    size_t sent;      /* bytes of prefix, then of body, sent */
    size_t got;       /* pingpong: answer bytes read this round */
    uint64_t next_ns; /* dribble: when the next byte is due; retry time when fd < 0 */
};

static volatile sig_atomic_t stopping;
static struct sockaddr_un address;
static int epfd;
static unsigned char *prefix, *body, *burst;
static size_t prefix_len, body_len, burst_len, answer_bytes;
static uint64_t interval_ns;
static int endless;

static void on_term(int sig) { (void)sig; stopping = 1; }

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static unsigned char *from_hex(const char *hex, size_t *len) {
    size_t n = strlen(hex) / 2;
    unsigned char *out = malloc(n ? n : 1);
    for (size_t i = 0; i < n; i++) {
        unsigned int byte;
        if (sscanf(hex + 2 * i, "%2x", &byte) != 1) {
            fprintf(stderr, "noise: bad hex\n");
            exit(2);
        }
        out[i] = (unsigned char)byte;
    }
    *len = n;
    return out;
}

/* a closed connection is made again at once, a refused one after 10 ms (as the Python
 * generator does) */
static void drop(struct client *c, uint64_t now, uint64_t delay_ns) {
    if (c->fd >= 0)
        close(c->fd);
    c->fd = -1;
    c->next_ns = now + delay_ns;
}

static void start(struct client *c, uint64_t now) {
    c->sent = c->got = 0;
    c->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (c->fd < 0 || connect(c->fd, (struct sockaddr *)&address, sizeof address) < 0) {
        drop(c, now, 10000000u);
        return;
    }
    struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP, .data.ptr = c};
    epoll_ctl(epfd, EPOLL_CTL_ADD, c->fd, &ev);
    c->next_ns = now;
}

/* dribble: send what is due; returns -1 when the connection is done with */
static int dribble_step(struct client *c, uint64_t now) {
    while (c->sent < prefix_len) {
        ssize_t n = send(c->fd, prefix + c->sent, prefix_len - c->sent, MSG_NOSIGNAL);
        if (n < 0)
            return errno == EAGAIN ? 0 : -1;
        c->sent += (size_t)n;
    }
    if (now < c->next_ns)
        return 0;
    size_t at = c->sent - prefix_len;
    if (at >= body_len && !endless)
        return -1;
    unsigned char byte = body[at < body_len ? at : body_len - 1];
    ssize_t n = send(c->fd, &byte, 1, MSG_NOSIGNAL);
    if (n < 0)
        return errno == EAGAIN ? 0 : -1;
    c->sent += 1;
    c->next_ns = now + interval_ns;
    return 0;
}

/* dribble: whatever fhmon answers is read and dropped; -1 once it has closed */
static int discard(struct client *c, uint32_t events) {
    static unsigned char scratch[1 << 12];
    if (events & (EPOLLHUP | EPOLLERR | EPOLLRDHUP))
        return -1;
    for (;;) {
        ssize_t n = recv(c->fd, scratch, sizeof scratch, 0);
        if (n == 0)
            return -1;
        if (n < 0)
            return errno == EAGAIN ? 0 : -1;
    }
}

/* pingpong: write the burst, then read the answers */
static int pingpong_step(struct client *c, int readable) {
    static unsigned char scratch[1 << 16];
    if (readable) {
        for (;;) {
            ssize_t n = recv(c->fd, scratch, sizeof scratch, 0);
            if (n == 0)
                return -1;
            if (n < 0)
                break;
            c->got += (size_t)n;
        }
        if (errno != EAGAIN)
            return -1;
    }
    if (c->sent == burst_len && c->got >= answer_bytes)
        c->sent = c->got = 0;
    while (c->sent < burst_len) {
        ssize_t n = send(c->fd, burst + c->sent, burst_len - c->sent, MSG_NOSIGNAL);
        if (n < 0)
            return errno == EAGAIN ? 0 : -1;
        c->sent += (size_t)n;
    }
    return 0;
}

static int sink(const char *path, unsigned int uid) {
    int server = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    unlink(path);
    if (server < 0 || bind(server, (struct sockaddr *)&address, sizeof address) < 0 ||
        (uid && chown(path, uid, uid) < 0) || listen(server, 4096) < 0) {
        perror("noise sink");
        return 1;
    }
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = server};
    epoll_ctl(epfd, EPOLL_CTL_ADD, server, &ev);
    static unsigned char scratch[1 << 16];
    struct epoll_event events[256];
    while (!stopping) {
        int n = epoll_wait(epfd, events, 256, 100);
        for (int i = 0; i < n; i++) {
            int fd = events[i].data.fd;
            if (fd == server) {
                int conn;
                while ((conn = accept4(server, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC)) >= 0) {
                    struct epoll_event cev = {.events = EPOLLIN, .data.fd = conn};
                    epoll_ctl(epfd, EPOLL_CTL_ADD, conn, &cev);
                }
                continue;
            }
            ssize_t got;
            while ((got = recv(fd, scratch, sizeof scratch, 0)) > 0) {
            }
            if (got == 0 || errno != EAGAIN)
                close(fd);
        }
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: noise dribble|pingpong|sink SOCKET ...\n");
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    struct sigaction term = {.sa_handler = on_term};
    sigaction(SIGTERM, &term, NULL);
    address.sun_family = AF_UNIX;
    if (strlen(argv[2]) >= sizeof address.sun_path) {
        fprintf(stderr, "noise: socket path too long\n");
        return 2;
    }
    strcpy(address.sun_path, argv[2]);
    epfd = epoll_create1(EPOLL_CLOEXEC);
    if (strcmp(argv[1], "sink") == 0)
        return sink(argv[2], (unsigned int)strtoul(argv[3], NULL, 10));
    int dribbling = strcmp(argv[1], "dribble") == 0;
    if (dribbling ? argc != 8 : (strcmp(argv[1], "pingpong") != 0 || argc != 6)) {
        fprintf(stderr, "noise: bad arguments\n");
        return 2;
    }
    int clients = atoi(argv[3]);
    if (dribbling) {
        interval_ns = strtoull(argv[4], NULL, 10) * 1000u;
        prefix = from_hex(argv[5], &prefix_len);
        body = from_hex(argv[6], &body_len);
        endless = atoi(argv[7]);
        if (body_len == 0) {
            fprintf(stderr, "noise: empty body\n");
            return 2;
        }
    } else {
        burst = from_hex(argv[4], &burst_len);
        answer_bytes = strtoull(argv[5], NULL, 10);
    }
    struct client *all = calloc((size_t)clients, sizeof *all);
    uint64_t now = now_ns();
    for (int i = 0; i < clients; i++)
        start(&all[i], now);
    struct epoll_event events[256];
    while (!stopping) {
        /* dribble: wake when the next byte is due; pingpong: on answers (or a retry) */
        int n = epoll_wait(epfd, events, 256, dribbling ? (int)(interval_ns / 1000000u) : 10);
        now = now_ns();
        for (int i = 0; i < n; i++) {
            struct client *c = events[i].data.ptr;
            if (c->fd < 0)
                continue;
            if (dribbling ? discard(c, events[i].events) < 0 : pingpong_step(c, 1) < 0)
                drop(c, now, 0);
        }
        for (int i = 0; i < clients; i++) {
            struct client *c = &all[i];
            if (c->fd < 0) {
                if (now >= c->next_ns)
                    start(c, now);
                if (c->fd < 0)
                    continue;
            }
            int step = dribbling ? dribble_step(c, now) : pingpong_step(c, 0);
            if (step < 0)
                drop(c, now, 0);
        }
    }
    return 0;
}
