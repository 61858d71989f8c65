/* probe: tries one thing a sandboxed function must not be able to do, or measures one
 * thing. Exit 0 means the attempt was refused as expected (or the measurement ran),
 * 1 means it succeeded (an escape), 2 means bad usage. It prints what happened. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/ptrace.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <time.h>
#include <unistd.h>

static int refused(const char *what, long r) {
  if (r < 0) {
    printf("%s: refused (%s)\n", what, strerror(errno));
    return 0;
  }
  printf("%s: ALLOWED\n", what);
  return 1;
}

static double now(clockid_t c) {
  struct timespec t;
  clock_gettime(c, &t);
  return t.tv_sec + t.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
  if (argc < 2) return 2;
  const char *cmd = argv[1];
  long arg = argc > 2 ? atol(argv[2]) : 0;
  if (!strcmp(cmd, "mount")) return refused("mount", mount("none", "/tmp", "tmpfs", 0, NULL));
  if (!strcmp(cmd, "unshare-mnt")) return refused("unshare(CLONE_NEWNS)", unshare(CLONE_NEWNS));
  if (!strcmp(cmd, "unshare-user")) return refused("unshare(CLONE_NEWUSER)", unshare(CLONE_NEWUSER));
  if (!strcmp(cmd, "setns")) {
    int fd = open("/proc/1/ns/mnt", O_RDONLY);
    if (fd < 0) return refused("open /proc/1/ns/mnt", fd);
    return refused("setns", setns(fd, 0));
  }
  if (!strcmp(cmd, "ptrace")) return refused("ptrace attach", ptrace(PTRACE_ATTACH, (pid_t)arg, 0, 0));
  if (!strcmp(cmd, "kill")) return refused("kill", kill((pid_t)arg, SIGKILL));
  if (!strcmp(cmd, "mknod")) return refused("mknod", mknod("/tmp/mem", S_IFCHR | 0600, makedev(1, 1)));
  if (!strcmp(cmd, "module")) {
    int a = refused("init_module", syscall(SYS_init_module, "", 0, ""));
    int b = refused("finit_module", syscall(SYS_finit_module, 0, "", 0));
    return a | b;
  }
  if (!strcmp(cmd, "kcore")) {
    int fd = open("/proc/kcore", O_RDONLY);
    if (fd < 0) return refused("open /proc/kcore", fd);
    char buf[64];
    ssize_t n = read(fd, buf, sizeof buf);
    printf("read /proc/kcore: %zd bytes\n", n);
    return n > 0;
  }
  if (!strcmp(cmd, "proc-sys")) return refused("open /proc/sys/kernel/hostname for writing", open("/proc/sys/kernel/hostname", O_WRONLY));
  if (!strcmp(cmd, "write-root")) return refused("create /escape", open("/escape", O_CREAT | O_WRONLY, 0644));
  if (!strcmp(cmd, "capset")) {
    struct __user_cap_header_struct h = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct d[2] = {{0}};
    d[0].effective = d[0].permitted = 1u << CAP_SYS_ADMIN;
    return refused("capset CAP_SYS_ADMIN", syscall(SYS_capset, &h, d));
  }
  if (!strcmp(cmd, "chroot")) return refused("chroot", chroot("/tmp"));
  if (!strcmp(cmd, "spin")) {
    double end = now(CLOCK_MONOTONIC) + arg / 1000.0;
    volatile unsigned long x = 0;
    while (now(CLOCK_MONOTONIC) < end) x++;
    printf("cpu %.3f\n", now(CLOCK_PROCESS_CPUTIME_ID));
    return 0;
  }
  if (!strcmp(cmd, "alloc")) {
    size_t size = (size_t)arg << 20;
    char *p = malloc(size);
    if (!p) return refused("malloc", -1);
    for (size_t i = 0; i < size; i += 4096) p[i] = 1;
    printf("allocated %ld MB\n", arg);
    return 1;
  }
  return 2;
}
