/* Times launchers (skiff run ..., runc run ...) whose program, bench/startup/stamp.c,
 * prints its CLOCK_MONOTONIC stamp (ns) on stdout as the first thing its main does.
 *
 *   driver seq N -- CMD...    N starts one after another. Per start: ms from just before
 *                             the spawn to the program's stamp ("to main") and to the
 *                             launcher's exit ("to exit").
 *   driver conc N -- CMD...   N starts spawned back to back. ms from the first spawn until
 *                             every program has printed its stamp ("all running"), the
 *                             slowest single start (its stamp minus its own spawn time),
 *                             until every launcher exited, the busy CPU-seconds of the
 *                             whole machine over the batch (/proc/stat: includes kernel
 *                             work in kworkers) and of the driver's reaped descendants.
 *   driver idle N -- CMD...   N long-lived processes (bare `stamp sleep`): returns once
 *                             every one has printed its stamp, printing their pids.
 *
 * "{}" in CMD becomes the start's index (unique container names). Children are started
 * with posix_spawn (glibc: clone(CLONE_VM|CLONE_VFORK), no copy of the driver's page
 * tables), each with its own O_CLOEXEC pipe dup'ed onto its stdout, so a launcher sees no
 * other launcher's pipe. Output of seq and conc: one JSON object on stdout. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

static long long now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1000000000LL + t.tv_nsec;
}

static void die(const char *what) {
  perror(what);
  exit(3);
}

/* Busy jiffies of all CPUs: user nice system irq softirq steal. */
static long long busy_jiffies(void) {
  FILE *f = fopen("/proc/stat", "r");
  long long v[8] = {0};
  if (!f || fscanf(f, "cpu %lld %lld %lld %lld %lld %lld %lld %lld", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5],
                   &v[6], &v[7]) != 8)
    die("/proc/stat");
  fclose(f);
  return v[0] + v[1] + v[2] + v[5] + v[6] + v[7];
}

/* argv for start `index`: "{}" replaced by the index. Built before any clock starts. */
static char **argv_for(char **cmd, int index) {
  int n = 0;
  while (cmd[n]) n++;
  char **out = calloc(n + 1, sizeof *out);
  if (!out) die("calloc");
  for (int i = 0; i < n; i++) {
    char *hole = strstr(cmd[i], "{}");
    if (!hole) {
      out[i] = cmd[i];
      continue;
    }
    if (asprintf(&out[i], "%.*s%d%s", (int)(hole - cmd[i]), cmd[i], index, hole + 2) < 0) die("asprintf");
  }
  return out;
}

/* Spawns argv with stdout on a fresh pipe; returns the pid, the read end in *out. */
static pid_t spawn(char **argv, int *out) {
  int p[2];
  if (pipe2(p, O_CLOEXEC)) die("pipe2");
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, p[1], 1); /* dup2 clears O_CLOEXEC on fd 1 */
  pid_t pid;
  int err = posix_spawn(&pid, argv[0], &fa, NULL, argv, environ);
  posix_spawn_file_actions_destroy(&fa);
  close(p[1]);
  if (err) {
    fprintf(stderr, "driver: spawn %s: %s\n", argv[0], strerror(err));
    exit(3);
  }
  *out = p[0];
  return pid;
}

/* The first line the program wrote (its stamp), or 0 if it wrote nothing. */
static long long read_stamp(int fd) {
  char buf[64] = {0};
  size_t got = 0;
  while (got < sizeof buf - 1 && !memchr(buf, '\n', got)) {
    ssize_t n = read(fd, buf + got, sizeof buf - 1 - got);
    if (n <= 0) break;
    got += n;
  }
  close(fd);
  return got ? atoll(buf) : 0;
}

/* CPU-seconds (user + system) of the driver's reaped descendants so far. */
static double children_cpu(void) {
  struct rusage r;
  getrusage(RUSAGE_CHILDREN, &r);
  return r.ru_utime.tv_sec + r.ru_stime.tv_sec + (r.ru_utime.tv_usec + r.ru_stime.tv_usec) / 1e6;
}

static int failed(int status) { return !WIFEXITED(status) || WEXITSTATUS(status) != 0; }

int main(int argc, char **argv) {
  if (argc < 5 || strcmp(argv[3], "--")) {
    fprintf(stderr, "usage: driver seq|conc|idle N -- CMD...\n");
    return 2;
  }
  const char *mode = argv[1];
  int n = atoi(argv[2]);
  if (n < 1) return 2;
  char ***argvs = calloc(n, sizeof *argvs);
  int *fds = calloc(n, sizeof *fds);
  pid_t *pids = calloc(n, sizeof *pids);
  long long *spawned = calloc(n, sizeof *spawned), *stamps = calloc(n, sizeof *stamps);
  if (!argvs || !fds || !pids || !spawned || !stamps) die("calloc");
  for (int i = 0; i < n; i++) argvs[i] = argv_for(argv + 4, i);
  int failures = 0;

  /* CPU the rest of the machine used meanwhile: busy time of all CPUs less that of the
   * launchers and their programs, per second of wall time (kernel threads' work for the
   * starts, e.g. cgroup teardown, counts as "other" too; it is small next to a busy
   * neighbour). Over 0.3 CPUs in a batch of 0.2 s or more (shorter ones are below the
   * jiffy resolution) the batch is marked "disturbed", and run.sh measures it again. */
  double own0 = children_cpu();
  long long cpu0 = busy_jiffies();
  long long t0 = now();
#define CPU_FIELDS(end)                                                                                 \
  double cpu = (busy_jiffies() - cpu0) / (double)sysconf(_SC_CLK_TCK), own = children_cpu() - own0; \
  double wall = (end - t0) / 1e9, other = (cpu - own) / wall;                                        \
  printf("\"cpu_s\":%.3f,\"children_cpu_s\":%.3f,\"other_cpus\":%.3f,\"disturbed\":%d,", cpu, own, other, \
         wall >= 0.2 && other > 0.3)

  if (!strcmp(mode, "seq")) {
    long long *exited = calloc(n, sizeof *exited);
    for (int i = 0; i < n; i++) {
      int status;
      spawned[i] = now();
      pids[i] = spawn(argvs[i], &fds[i]);
      stamps[i] = read_stamp(fds[i]);
      if (waitpid(pids[i], &status, 0) < 0) die("waitpid");
      exited[i] = now();
      if (!stamps[i] || failed(status)) failures++;
    }
    long long done = now();
    printf("{\"mode\":\"seq\",\"n\":%d,\"wall_ms\":%.1f,", n, (done - t0) / 1e6);
    CPU_FIELDS(done);
    printf("\"to_main_ms\":[");
    for (int i = 0; i < n; i++) printf("%s%.4f", i ? "," : "", stamps[i] ? (stamps[i] - spawned[i]) / 1e6 : -1.0);
    printf("],\"to_exit_ms\":[");
    for (int i = 0; i < n; i++) printf("%s%.4f", i ? "," : "", (exited[i] - spawned[i]) / 1e6);
    printf("],\"failures\":%d}\n", failures);
    return 0;
  }

  if (!strcmp(mode, "conc")) {
    for (int i = 0; i < n; i++) {
      spawned[i] = now();
      pids[i] = spawn(argvs[i], &fds[i]);
    }
    long long last = 0, slowest = 0;
    for (int i = 0; i < n; i++) {
      stamps[i] = read_stamp(fds[i]);
      if (!stamps[i]) {
        failures++;
        continue;
      }
      if (stamps[i] > last) last = stamps[i];
      if (stamps[i] - spawned[i] > slowest) slowest = stamps[i] - spawned[i];
    }
    for (int i = 0; i < n; i++) {
      int status;
      if (waitpid(pids[i], &status, 0) < 0) die("waitpid");
      if (failed(status)) failures++;
    }
    long long done = now();
    printf("{\"mode\":\"conc\",\"n\":%d,", n);
    CPU_FIELDS(done);
    printf("\"all_running_ms\":%.3f,\"slowest_start_ms\":%.3f,\"spawn_loop_ms\":%.3f,\"all_exited_ms\":%.3f,"
           "\"failures\":%d}\n",
           (last - t0) / 1e6, slowest / 1e6, (spawned[n - 1] - t0) / 1e6, (done - t0) / 1e6, failures);
    return 0;
  }

  if (!strcmp(mode, "idle")) {
    for (int i = 0; i < n; i++) pids[i] = spawn(argvs[i], &fds[i]);
    for (int i = 0; i < n; i++)
      if (!read_stamp(fds[i])) failures++;
    for (int i = 0; i < n; i++) printf("%d\n", pids[i]);
    if (failures) fprintf(stderr, "driver: %d of %d did not start\n", failures, n);
    return failures ? 1 : 0;
  }
  fprintf(stderr, "driver: unknown mode %s\n", mode);
  return 2;
}
