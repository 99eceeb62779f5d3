/* test_node_sdk.c: runs tests/node/sdk.test.mjs (the official OpenAI Node SDK, npm `openai`,
 * under node's test runner) against a `lumen serve` of the tiny model started here.
 * LM_LABEL: server
 *
 * Skips (exit 77, ctest's SKIP_RETURN_CODE) when node is not installed or the SDK is not
 * (scripts/test.sh runs `npm ci --prefix tests/node` when node and npm exist). Otherwise the
 * result is node's: every test in sdk.test.mjs must pass. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"

#define SKIP 77

static pid_t g_server = -1;

static void stop_server(void) {
    if (g_server > 0) {
        kill(g_server, SIGKILL);
        waitpid(g_server, NULL, 0);
        g_server = -1;
    }
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t l = sizeof a;
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) ||
        getsockname(fd, (struct sockaddr *)&a, &l)) {
        if (fd >= 0) close(fd);
        return -1;
    }
    close(fd);
    return ntohs(a.sin_port);
}

/* GET /health over a plain socket: true on "HTTP/1.x 200". */
static bool healthy(int port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    bool ok = false;
    if (fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a) == 0) {
        const char req[] = "GET /health HTTP/1.0\r\n\r\n";
        char buf[64] = "";
        if (write(fd, req, sizeof req - 1) == (ssize_t)(sizeof req - 1)) {
            ssize_t n = read(fd, buf, sizeof buf - 1);
            ok = n > 12 && !strncmp(buf, "HTTP/1.", 7) && !strncmp(buf + 9, "200", 3);
        }
    }
    if (fd >= 0) close(fd);
    return ok;
}

static bool start_server(int *port_out) {
    for (int attempt = 0; attempt < 5; attempt++) {
        int port = free_port();
        if (port <= 0) continue;
        char ps[16];
        snprintf(ps, sizeof ps, "%d", port);
        pid_t pid = fork();
        if (pid == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            execl(LM_LUMEN_BIN, LM_LUMEN_BIN, "serve", "--model", TINY_MODEL, "--port", ps,
                  "--quiet", (char *)NULL);
            _exit(127);
        }
        g_server = pid;
        double t0 = now_s();
        while (now_s() - t0 < 60) {
            int status;
            if (waitpid(pid, &status, WNOHANG) ==
                pid) { /* exited: most likely the port was taken */
                g_server = -1;
                break;
            }
            if (healthy(port)) {
                *port_out = port;
                return true;
            }
            usleep(50 * 1000);
        }
        stop_server();
    }
    return false;
}

int main(void) {
    if (system("command -v node >/dev/null 2>&1") != 0) {
        fprintf(stderr, "test_node_sdk: node is not installed; skipped\n");
        return SKIP;
    }
    struct stat sb;
    if (stat(LM_SOURCE_DIR "/tests/node/node_modules/openai/package.json", &sb) != 0) {
        fprintf(stderr, "test_node_sdk: the OpenAI SDK is not installed (npm ci --prefix "
                        "tests/node); skipped\n");
        return SKIP;
    }
    atexit(stop_server);
    int port = 0;
    bool up = start_server(&port);
    CHECK(up, "lumen serve did not come up (%s)", LM_LUMEN_BIN);
    if (!up) return check_exit("test_node_sdk");

    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/v1", port);
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        setenv("LUMEN_BASE_URL", url, 1);
        setenv("LUMEN_MODEL", "tiny-qwen3", 1);
        execlp("node", "node", "--test", "--test-reporter=spec",
               LM_SOURCE_DIR "/tests/node/sdk.test.mjs", (char *)NULL);
        _exit(127);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "node --test exited with %d",
          WIFEXITED(status) ? WEXITSTATUS(status) : -1);

    kill(g_server, SIGTERM); /* a clean exit after the SDK's requests */
    int sst = 0;
    double t0 = now_s();
    while (now_s() - t0 < 20 && waitpid(g_server, &sst, WNOHANG) != g_server)
        usleep(20 * 1000);
    CHECK(WIFEXITED(sst) && WEXITSTATUS(sst) == 0, "lumen serve exits cleanly after SIGTERM");
    g_server = -1;
    return check_exit("test_node_sdk");
}
