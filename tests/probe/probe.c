/* probe: a static helper the sandbox tests run inside a sandbox. Each subcommand either
 * tries one thing a sandboxed function must not be able to do, or measures one thing.
 *
 * Escape attempts print one line, `WHAT: denied ENAME` (the errno's name, so tests can
 * check that the attempt reached the permission check rather than failing on a bad
 * argument) or `WHAT: ALLOWED`, and exit 0 when denied, 1 when allowed.
 * Measurements print their result and exit 0. Bad usage exits 2.
 *
 *   mount                  mount a tmpfs on /tmp
 *   unshare-mnt            unshare(CLONE_NEWNS)
 *   unshare-user           unshare(CLONE_NEWUSER)
 *   setns                  setns() into /proc/1/ns/mnt
 *   ptrace PID             ptrace(PTRACE_ATTACH, PID)
 *   kill PID               kill(PID, 0): can PID even be signalled?
 *   mknod                  mknod /tmp/mem as /dev/mem (char 1:1)
 *   module                 init_module and finit_module (both must be denied)
 *   kcore                  open and read /proc/kcore (0 bytes read counts as denied)
 *   proc-sys               open /proc/sys/kernel/hostname for writing
 *   write-root             create /escape
 *   capset                 raise CAP_SYS_ADMIN in the effective and permitted sets
 *   chroot                 chroot("/tmp")
 *   status                 print the Cap*, NoNewPrivs and Seccomp lines of /proc/self/status
 *   spin MS                busy-loop MS ms of wall time, print `cpu SECONDS` (getrusage)
 *   alloc MB               allocate and touch MB MiB, print `allocated MB MB`, exit 1
 *   forkbomb MS            start a fork bomb (its processes keep trying when fork fails),
 *                          watch it for MS ms, print `max N` (the most processes seen in
 *                          /proc at once) and `fork: denied ENAME` or `fork: ALLOWED` (a
 *                          fork of its own once the bomb has had its time), exit 0 (which
 *                          ends the bomb with the PID namespace)
 *   zombies N              fork N children that exit unwaited and one orphan grandchild
 *                          that sleeps 60 s, print `zombies N`, exit 0 without waiting
 */
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
#include <sys/wait.h>
#include <dirent.h>
#include <ctype.h>
#include <time.h>
#include <unistd.h>

static const char *errno_name(int e) {
#define E(x) \
  case x:    \
    return #x;
  switch (e) {
    E(EPERM) E(ENOENT) E(ESRCH) E(EINTR) E(EIO) E(ENXIO) E(E2BIG) E(ENOEXEC) E(EBADF)
    E(ECHILD) E(EAGAIN) E(ENOMEM) E(EACCES) E(EFAULT) E(EBUSY) E(EEXIST) E(EXDEV)
    E(ENODEV) E(ENOTDIR) E(EISDIR) E(EINVAL) E(ENFILE) E(EMFILE) E(ENOSPC) E(ESPIPE)
    E(EROFS) E(EMLINK) E(ENOSYS) E(ENOTSUP) E(ENOKEY) E(EKEYREJECTED) E(ENOPKG)
  }
#undef E
  static char buf[32];
  snprintf(buf, sizeof buf, "errno%d", e);
  return buf;
}

/* r < 0: the attempt failed with errno. */
static int attempt(const char *what, long r) {
  if (r < 0) {
    printf("%s: denied %s\n", what, errno_name(errno));
    return 0;
  }
  printf("%s: ALLOWED\n", what);
  return 1;
}

static double cpu_seconds(void) {
  struct rusage u;
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_utime.tv_usec / 1e6 + u.ru_stime.tv_sec +
         u.ru_stime.tv_usec / 1e6;
}

static double wall_seconds(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec / 1e9;
}

static int number(int argc, char **argv, long *out) {
  if (argc < 3) return 0;
  char *end;
  *out = strtol(argv[2], &end, 10);
  return *argv[2] && !*end;
}

int main(int argc, char **argv) {
  if (argc < 2) return 2;
  setvbuf(stdout, NULL, _IOLBF, 0);
  const char *cmd = argv[1];
  long arg = 0;
  int has_arg = number(argc, argv, &arg);

  if (!strcmp(cmd, "mount")) return attempt("mount", mount("none", "/tmp", "tmpfs", 0, NULL));
  if (!strcmp(cmd, "unshare-mnt")) return attempt("unshare(CLONE_NEWNS)", unshare(CLONE_NEWNS));
  if (!strcmp(cmd, "unshare-user"))
    return attempt("unshare(CLONE_NEWUSER)", unshare(CLONE_NEWUSER));
  if (!strcmp(cmd, "setns")) {
    int fd = open("/proc/1/ns/mnt", O_RDONLY);
    if (fd < 0) return attempt("open /proc/1/ns/mnt", fd);
    return attempt("setns", setns(fd, 0));
  }
  if (!strcmp(cmd, "ptrace") && has_arg) {
    if (!attempt("ptrace(PTRACE_ATTACH)", ptrace(PTRACE_ATTACH, (pid_t)arg, 0, 0))) return 0;
    /* Do not leave the tracee stopped. */
    waitpid((pid_t)arg, NULL, __WALL);
    ptrace(PTRACE_DETACH, (pid_t)arg, 0, 0);
    return 1;
  }
  if (!strcmp(cmd, "kill") && has_arg) return attempt("kill(pid, 0)", kill((pid_t)arg, 0));
  if (!strcmp(cmd, "mknod"))
    return attempt("mknod", mknod("/tmp/mem", S_IFCHR | 0600, makedev(1, 1)));
  if (!strcmp(cmd, "module")) {
    /* Both check CAP_SYS_MODULE before looking at their arguments. */
    static char image[64];
    int a = attempt("init_module", syscall(SYS_init_module, image, sizeof image, ""));
    int fd = open("/proc/self/exe", O_RDONLY);
    int b = attempt("finit_module", syscall(SYS_finit_module, fd, "", 0));
    return a | b;
  }
  if (!strcmp(cmd, "kcore")) {
    int fd = open("/proc/kcore", O_RDONLY);
    if (fd < 0) return attempt("open /proc/kcore", fd);
    char buf[64];
    ssize_t n = read(fd, buf, sizeof buf);
    if (n < 0) return attempt("read /proc/kcore", n);
    if (n == 0) {
      printf("read /proc/kcore: denied empty\n");
      return 0;
    }
    printf("read /proc/kcore: ALLOWED (%zd bytes)\n", n);
    return 1;
  }
  if (!strcmp(cmd, "proc-sys"))
    return attempt("open /proc/sys/kernel/hostname for writing",
                   open("/proc/sys/kernel/hostname", O_WRONLY));
  if (!strcmp(cmd, "write-root"))
    return attempt("create /escape", open("/escape", O_CREAT | O_WRONLY, 0644));
  if (!strcmp(cmd, "capset")) {
    struct __user_cap_header_struct h = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct d[2];
    memset(d, 0, sizeof d);
    d[0].effective = d[0].permitted = 1u << CAP_SYS_ADMIN;
    return attempt("capset(CAP_SYS_ADMIN)", syscall(SYS_capset, &h, d));
  }
  if (!strcmp(cmd, "chroot")) return attempt("chroot", chroot("/tmp"));
  if (!strcmp(cmd, "status")) {
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return 2;
    char line[256];
    while (fgets(line, sizeof line, f))
      if (!strncmp(line, "Cap", 3) || !strncmp(line, "NoNewPrivs:", 11) ||
          !strncmp(line, "Seccomp:", 8))
        fputs(line, stdout);
    return 0;
  }
  if (!strcmp(cmd, "spin") && has_arg) {
    double end = wall_seconds() + arg / 1000.0;
    volatile unsigned long x = 0;
    while (wall_seconds() < end) x++;
    printf("cpu %.3f\n", cpu_seconds());
    return 0;
  }
  if (!strcmp(cmd, "alloc") && has_arg) {
    size_t size = (size_t)arg << 20;
    char *p = malloc(size);
    if (!p) return attempt("malloc", -1);
    for (size_t i = 0; i < size; i += 4096) p[i] = 1;
    printf("allocated %ld MB\n", arg);
    return 1;
  }
  if (!strcmp(cmd, "forkbomb") && has_arg) {
    if (fork() == 0)
      for (;;)
        if (fork() < 0) usleep(1000);
    double end = wall_seconds() + arg / 1000.0;
    int max = 0;
    while (wall_seconds() < end) {
      DIR *d = opendir("/proc");
      if (!d) return 2;
      int n = 0;
      struct dirent *e;
      while ((e = readdir(d)))
        if (isdigit((unsigned char)e->d_name[0])) n++;
      closedir(d);
      if (n > max) max = n;
      usleep(1000);
    }
    printf("max %d\n", max);
    pid_t child = fork();
    if (child == 0) _exit(0);
    if (child > 0) waitpid(child, NULL, 0);
    attempt("fork", child);
    return 0;
  }
  if (!strcmp(cmd, "zombies") && has_arg) {
    for (long i = 0; i < arg; i++)
      if (fork() == 0) _exit(0);
    if (fork() == 0) {
      if (fork() == 0) {
        sleep(60);
        _exit(0);
      }
      _exit(0);
    }
    /* Let every child exit (and become a zombie) before leaving them all behind. */
    struct timespec t = {0, 100 * 1000 * 1000};
    nanosleep(&t, NULL);
    printf("zombies %ld\n", arg);
    return 0;
  }
  return 2;
}
