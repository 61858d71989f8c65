/* Starts a launcher command (skiff run ..., runc run ...) whose program prints its
 * CLOCK_MONOTONIC stamp on stdout, and times it.
 *   driver seq N -- CMD...   N starts one after another: per start, ms to the
 *                            program's main and to the launcher's exit
 *   driver conc N -- CMD...  N starts released at once: ms until all are running,
 *                            the slowest start, CPU-seconds the machine spent
 * "{}" in CMD becomes the start's index (unique container names).
 * Launchers are forked before the clock starts and released through a pipe, so the
 * harness's own forking does not serialise the concurrent case. Output: one JSON line. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static long long now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1000000000LL + t.tv_nsec;
}

/* Busy jiffies (all CPUs) from /proc/stat. */
static long long busy_jiffies(void) {
  FILE *f = fopen("/proc/stat", "r");
  long long v[10] = {0};
  if (fscanf(f, "cpu %lld %lld %lld %lld %lld %lld %lld %lld", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5], &v[6], &v[7]) != 8) exit(3);
  fclose(f);
  return v[0] + v[1] + v[2] + v[5] + v[6] + v[7]; /* user nice system irq softirq steal */
}

static char **argv_for(char **cmd, int index) {
  int n = 0;
  while (cmd[n]) n++;
  char **out = calloc(n + 1, sizeof *out);
  for (int i = 0; i < n; i++) {
    char *hole = strstr(cmd[i], "{}");
    if (!hole) { out[i] = cmd[i]; continue; }
    if (asprintf(&out[i], "%.*s%d%s", (int)(hole - cmd[i]), cmd[i], index, hole + 2) < 0) exit(3);
  }
  return out;
}

/* Forks a launcher that waits on `gate` before exec; its stdout is returned via *out. */
static pid_t prepare(char **cmd, int index, int gate, int gate_w, int *out) {
  int p[2];
  if (pipe(p)) exit(3);
  pid_t pid = fork();
  if (pid == 0) {
    dup2(p[1], 1);
    close(p[0]);
    close(p[1]);
    if (gate_w >= 0) close(gate_w);
    char c;
    if (gate >= 0 && read(gate, &c, 1) < 0) _exit(126);
    char **a = argv_for(cmd, index);
    execv(a[0], a);
    _exit(127);
  }
  close(p[1]);
  *out = p[0];
  return pid;
}

static long long read_stamp(int fd) {
  char buf[64] = {0};
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  return n > 0 ? atoll(buf) : 0;
}

int main(int argc, char **argv) {
  if (argc < 5 || strcmp(argv[3], "--")) {
    fprintf(stderr, "usage: driver seq|conc N -- CMD...\n");
    return 2;
  }
  int n = atoi(argv[2]);
  char **cmd = argv + 4;
  int failures = 0;
  if (!strcmp(argv[1], "seq")) {
    printf("{\"mode\":\"seq\",\"n\":%d,\"to_main_ms\":[", n);
    long long *exit_ns = calloc(n, sizeof *exit_ns);
    for (int i = 0; i < n; i++) {
      int fd, status;
      long long t0 = now();
      pid_t pid = prepare(cmd, i, -1, -1, &fd);
      long long stamp = read_stamp(fd);
      waitpid(pid, &status, 0);
      exit_ns[i] = now() - t0;
      if (!stamp || !WIFEXITED(status) || WEXITSTATUS(status)) failures++;
      printf("%s%.4f", i ? "," : "", stamp ? (stamp - t0) / 1e6 : -1.0);
    }
    printf("],\"to_exit_ms\":[");
    for (int i = 0; i < n; i++) printf("%s%.4f", i ? "," : "", exit_ns[i] / 1e6);
    printf("],\"failures\":%d}\n", failures);
    return 0;
  }
  int gate[2];
  if (pipe(gate)) return 3;
  int *fds = calloc(n, sizeof *fds);
  pid_t *pids = calloc(n, sizeof *pids);
  for (int i = 0; i < n; i++) pids[i] = prepare(cmd, i, gate[0], gate[1], &fds[i]);
  close(gate[0]);
  usleep(200000); /* let every launcher reach the gate */
  long long cpu0 = busy_jiffies();
  long long t0 = now();
  close(gate[1]);
  long long last = 0;
  for (int i = 0; i < n; i++) {
    long long stamp = read_stamp(fds[i]);
    if (!stamp) failures++;
    if (stamp > last) last = stamp;
  }
  for (int i = 0; i < n; i++) {
    int status;
    waitpid(pids[i], &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status)) failures++;
  }
  long long done = now();
  double cpu = (busy_jiffies() - cpu0) / (double)sysconf(_SC_CLK_TCK);
  printf("{\"mode\":\"conc\",\"n\":%d,\"all_running_ms\":%.3f,\"all_exited_ms\":%.3f,\"cpu_s\":%.3f,\"failures\":%d}\n",
         n, (last - t0) / 1e6, (done - t0) / 1e6, cpu, failures);
  return 0;
}
