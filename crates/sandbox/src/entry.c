/* skiff's sandbox entry (see entry.h): the one implementation of the steps. */
#define _GNU_SOURCE
#include "entry.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

/* The kernel's own definitions: musl ships no linux/ headers. */
#define CLOSE_RANGE_CLOEXEC (1U << 2)
#define SECCOMP_SET_MODE_FILTER 1
#define CAPABILITY_VERSION_3 0x20080522
struct cap_header {
  uint32_t version;
  int pid;
};
struct cap_data {
  uint32_t effective, permitted, inheritable;
};
struct filter_program {
  unsigned short len;
  const void *filter;
};

enum stage {
  LEAVE_CHROOT = 1,
  PRIVATE,
  MOUNT_PROC,
  MASK_PROC,
  READONLY_PROC,
  BOUNDING,
  JOIN_CGROUP,
  CGROUP_NS,
  NETNS,
  BIND_ROOT,
  REMOUNT_ROOT,
  MOVE_PROC,
  MOUNT_DEV,
  DEV_SHM,
  MOUNT_TMP,
  MOUNT_TMPFS,
  BIND_WORK,
  PIVOT_ROOT,
  HOSTNAME,
  RLIMIT,
  USER_NS,
  CAPS,
  SET_IDS,
  CHDIR,
  PARENT,
  DESCRIPTORS,
  BEFORE_LOCK,
  NO_NEW_PRIVS,
  SECCOMP,
};

static const unsigned long NSD = MS_NOSUID | MS_NODEV, NSDX = MS_NOSUID | MS_NODEV | MS_NOEXEC;

static int failure(struct skiff_failure *failed, int stage, int index, int error) {
  failed->stage = stage;
  failed->index = index;
  failed->error = error;
  return -1;
}

/* Fails the step when `call` is negative, with errno. */
#define STEP(stage, index, call)                                       \
  do {                                                                 \
    if ((long)(call) < 0) return failure(failed, stage, index, errno); \
  } while (0)

/* `a` then `b` into buf (PATH_MAX bytes), or -1 (ENAMETOOLONG). */
static int join(char *buf, const char *a, const char *b) {
  size_t la = strlen(a), lb = strlen(b);
  if (la + lb + 1 > 4096) {
    errno = ENAMETOOLONG;
    return -1;
  }
  memcpy(buf, a, la);
  memcpy(buf + la, b, lb + 1);
  return 0;
}

/* Out of a template's chroot, to the mount tree's root: a chroot into /tmp leaves the
 * working directory outside the root, and from there .. climbs to the real one. */
static int leave_chroot(void) {
  struct stat here, up;
  if (chroot("/tmp") < 0) return -1;
  for (;;) {
    if (stat(".", &here) < 0 || stat("..", &up) < 0) return -1;
    if (here.st_dev == up.st_dev && here.st_ino == up.st_ino) break;
    if (chdir("..") < 0) return -1;
  }
  return chroot(".");
}

int skiff_prepare(const struct skiff_prep *p, struct skiff_failure *failed) {
  char path[4096];
  if (p->leave_chroot) STEP(LEAVE_CHROOT, 0, leave_chroot());
  STEP(PRIVATE, 0, mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL));
  STEP(MOUNT_PROC, 0, mount("proc", "/proc", "proc", NSDX, NULL));
  int i = 0;
  for (const char *const *f = p->masked_files; *f; f++, i++) {
    STEP(MASK_PROC, i, join(path, "/proc/", *f));
    if (mount("/dev/null", path, NULL, MS_BIND, NULL) < 0 && errno != ENOENT)
      return failure(failed, MASK_PROC, i, errno);
  }
  for (const char *const *d = p->masked_dirs; *d; d++, i++) {
    STEP(MASK_PROC, i, join(path, "/proc/", *d));
    if (mount("tmpfs", path, "tmpfs", MS_RDONLY | NSDX, p->mask_options) < 0 && errno != ENOENT)
      return failure(failed, MASK_PROC, i, errno);
  }
  i = 0;
  for (const char *const *r = p->readonly; *r; r++, i++) {
    STEP(READONLY_PROC, i, join(path, "/proc/", *r));
    if (mount(path, path, NULL, MS_BIND, NULL) < 0) {
      if (errno == ENOENT) continue;
      return failure(failed, READONLY_PROC, i, errno);
    }
    STEP(READONLY_PROC, i, mount(path, path, NULL, MS_BIND | MS_REMOUNT | MS_RDONLY | NSDX, NULL));
  }
  /* Only the bounding set: the effective capabilities the plan's steps need stay. */
  for (uint32_t cap = 0; cap <= p->last_cap; cap++)
    STEP(BOUNDING, 0, prctl(PR_CAPBSET_DROP, (unsigned long)cap));
  return 0;
}

/* The plan's descriptors at 0, 1, 2 and the channel above them, nothing else of ours. */
static int place_descriptors(const struct skiff_plan *p, struct skiff_failure *failed) {
  /* Lifted above 2 first: any of them may arrive as 0, 1 or 2. */
  int lifted[3], keep = 0;
  if (p->channel >= 0) STEP(DESCRIPTORS, 0, keep = fcntl(p->channel, F_DUPFD_CLOEXEC, 3));
  for (int i = 0; i < 3; i++) {
    int fd = p->stdio[i];
    if (fd < 0) STEP(DESCRIPTORS, 1, fd = open("/dev/null", O_RDWR | O_CLOEXEC));
    STEP(DESCRIPTORS, 1, lifted[i] = fcntl(fd, F_DUPFD_CLOEXEC, 3));
    if (p->stdio[i] < 0) close(fd);
  }
  for (int i = 0; i < 3; i++) STEP(DESCRIPTORS, 2, dup3(lifted[i], i, 0));
  if (!p->close_rest) {
    /* The caller execs: its own descriptors (the setup socket) last until then. */
    STEP(DESCRIPTORS, 3, syscall(SYS_close_range, 3U, ~0U, CLOSE_RANGE_CLOEXEC));
  } else if (keep > 0) {
    STEP(DESCRIPTORS, 3, syscall(SYS_close_range, 3U, (unsigned)keep - 1, 0U));
    STEP(DESCRIPTORS, 3, syscall(SYS_close_range, (unsigned)keep + 1, ~0U, 0U));
  } else {
    STEP(DESCRIPTORS, 3, syscall(SYS_close_range, 3U, ~0U, 0U));
  }
  return keep;
}

int skiff_enter(const struct skiff_plan *p, struct skiff_failure *failed) {
  char path[4096];
  const char *root = p->root;
  /* A child forked ahead, before its cgroup was known, moves itself. */
  if (p->cgroup >= 0) {
    int procs;
    STEP(JOIN_CGROUP, 0, procs = openat(p->cgroup, "cgroup.procs", O_WRONLY | O_CLOEXEC));
    STEP(JOIN_CGROUP, 0, write(procs, "0", 1));
    close(procs);
  }
  for (uint32_t i = 0; i < p->n_joins; i++) STEP(JOIN_CGROUP, 1, write(p->joins[i], "0", 1));
  /* After joining, so the namespace's root is the sandbox's own cgroup. */
  STEP(CGROUP_NS, 0, unshare(CLONE_NEWCGROUP));
  if (p->netns >= 0) STEP(NETNS, 0, setns(p->netns, CLONE_NEWNET));

  STEP(BIND_ROOT, 0, mount(root, root, NULL, MS_BIND, NULL));
  STEP(REMOUNT_ROOT, 0, mount(root, root, NULL, MS_BIND | MS_REMOUNT | MS_RDONLY | NSD, NULL));
  STEP(MOVE_PROC, 0, join(path, root, "/proc"));
  STEP(MOVE_PROC, 0, mount("/proc", path, NULL, MS_MOVE, NULL));
  STEP(MOUNT_DEV, 0, join(path, root, "/dev"));
  STEP(MOUNT_DEV, 0, mount(p->dev_template, path, NULL, MS_BIND | MS_REC, NULL));
  STEP(DEV_SHM, 0, join(path, root, "/dev/shm"));
  STEP(DEV_SHM, 0, mount("tmpfs", path, "tmpfs", NSDX, p->shm_options));
  STEP(MOUNT_TMP, 0, join(path, root, "/tmp"));
  STEP(MOUNT_TMP, 0, mount("tmpfs", path, "tmpfs", NSD, p->tmp_options));
  int i = 0;
  for (const char *const *t = p->tmpfs; t && *t; t++, i++)
    STEP(MOUNT_TMPFS, i, mount("tmpfs", *t, "tmpfs", NSD, p->tmp_options));
  if (p->work) {
    STEP(BIND_WORK, 0, join(path, root, "/work"));
    STEP(BIND_WORK, 0, mount(p->work, path, NULL, MS_BIND, NULL));
    STEP(BIND_WORK, 1, mount(path, path, NULL, MS_BIND | MS_REMOUNT | NSD, NULL));
  }
  /* runc's trick: pivot onto the new root with the old one stacked beneath, then detach
   * the old one; no put_old directory is needed in a read-only root. */
  STEP(PIVOT_ROOT, 0, chdir(root));
  STEP(PIVOT_ROOT, 1, syscall(SYS_pivot_root, ".", "."));
  STEP(PIVOT_ROOT, 2, umount2(".", MNT_DETACH));
  STEP(PIVOT_ROOT, 3, chdir("/"));

  STEP(HOSTNAME, 0, sethostname(p->hostname, strlen(p->hostname)));
  struct rlimit files = {p->max_open_files, p->max_open_files}, core = {0, 0};
  STEP(RLIMIT, 0, syscall(SYS_prlimit64, 0, RLIMIT_NOFILE, &files, NULL));
  STEP(RLIMIT, 1, syscall(SYS_prlimit64, 0, RLIMIT_CORE, &core, NULL));
  /* Raw calls for the ids: each changes this thread only, all a child has; libc's
   * wrappers would signal threads it believes the process still has. */
  STEP(SET_IDS, 0, syscall(SYS_setgroups, 0, NULL));
  if (p->user_ns_sock >= 0) {
    /* Last, after every mount: the other namespaces stay owned by the host's user
     * namespace, so root inside holds no power over them. */
    char reply;
    STEP(USER_NS, 0, unshare(CLONE_NEWUSER));
    STEP(USER_NS, 1, write(p->user_ns_sock, "U", 1));
    if (read(p->user_ns_sock, &reply, 1) != 1) return failure(failed, USER_NS, 2, EPIPE);
  }
  /* Root's special powers locked off first: an exec as uid 0 grants nothing. */
  STEP(CAPS, 0, prctl(PR_SET_SECUREBITS, (unsigned long)p->securebits));
  STEP(CAPS, 1, prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0));
  STEP(SET_IDS, 0, syscall(SYS_setresgid, p->gid, p->gid, p->gid));
  STEP(SET_IDS, 0, syscall(SYS_setresuid, p->uid, p->uid, p->uid));
  /* uid 0 keeps its capability sets across setresuid: clear them explicitly. */
  struct cap_header header = {CAPABILITY_VERSION_3, 0};
  struct cap_data none[2];
  memset(none, 0, sizeof none);
  STEP(CAPS, 2, syscall(SYS_capset, &header, none));
  STEP(CHDIR, 0, chdir(p->cwd));
  if (p->die_with_parent) {
    /* After the uid change, which would clear it. A parent that died before this has
     * closed its end of the socket: give up rather than run unsupervised. */
    STEP(PARENT, 0, prctl(PR_SET_PDEATHSIG, SIGKILL));
    struct pollfd gone = {p->parent_sock, 0, 0};
    if (p->parent_sock >= 0 && poll(&gone, 1, 0) > 0 && gone.revents & POLLHUP)
      return failure(failed, PARENT, 1, ESRCH);
  }
  int keep = place_descriptors(p, failed);
  if (keep < 0) return -1;
  if (p->before_lock) STEP(BEFORE_LOCK, 0, p->before_lock(p->before_lock_arg));
  STEP(NO_NEW_PRIVS, 0, prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0));
  struct filter_program prog = {(unsigned short)p->seccomp_len, p->seccomp};
  STEP(SECCOMP, 0, syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &prog));
  return keep;
}

/* The `index`th name of a NULL-ended list, or "". */
static const char *nth(const char *const *list, int index) {
  for (int i = 0; list && list[i]; i++)
    if (i == index) return list[i];
  return "";
}

void skiff_describe(const struct skiff_prep *prep, const struct skiff_plan *plan,
                    const struct skiff_failure *f, char *buf, size_t cap) {
  const char *root = plan ? plan->root : "";
  const char *name = "";
  if (prep && f->stage == MASK_PROC) {
    int files = 0;
    while (prep->masked_files[files]) files++;
    name = f->index < files ? nth(prep->masked_files, f->index)
                            : nth(prep->masked_dirs, f->index - files);
  } else if (prep && f->stage == READONLY_PROC) {
    name = nth(prep->readonly, f->index);
  }
  switch (f->stage) {
  case LEAVE_CHROOT: snprintf(buf, cap, "leave the template's root"); break;
  case PRIVATE: snprintf(buf, cap, "make mounts private"); break;
  case MOUNT_PROC: snprintf(buf, cap, "mount /proc"); break;
  case MASK_PROC: snprintf(buf, cap, "mask /proc/%s", name); break;
  case READONLY_PROC: snprintf(buf, cap, "make /proc/%s read-only", name); break;
  case BOUNDING: snprintf(buf, cap, "drop bounding capabilities"); break;
  case JOIN_CGROUP: snprintf(buf, cap, "join the sandbox's cgroup"); break;
  case CGROUP_NS: snprintf(buf, cap, "create a cgroup namespace"); break;
  case NETNS: snprintf(buf, cap, "join the network namespace"); break;
  case BIND_ROOT: snprintf(buf, cap, "bind-mount the rootfs %s", root); break;
  case REMOUNT_ROOT: snprintf(buf, cap, "make the rootfs %s read-only", root); break;
  case MOVE_PROC: snprintf(buf, cap, "move /proc under the rootfs %s", root); break;
  case MOUNT_DEV: snprintf(buf, cap, "mount /dev"); break;
  case DEV_SHM: snprintf(buf, cap, "mount /dev/shm"); break;
  case MOUNT_TMP: snprintf(buf, cap, "mount /tmp"); break;
  case MOUNT_TMPFS:
    snprintf(buf, cap, "mount a tmpfs on %s", plan ? nth(plan->tmpfs, f->index) : "");
    break;
  case BIND_WORK: snprintf(buf, cap, "bind-mount the work directory at /work"); break;
  case PIVOT_ROOT: snprintf(buf, cap, "pivot_root into the rootfs"); break;
  case HOSTNAME: snprintf(buf, cap, "set the hostname"); break;
  case RLIMIT: snprintf(buf, cap, "set resource limits"); break;
  case USER_NS: snprintf(buf, cap, "create a user namespace"); break;
  case CAPS: snprintf(buf, cap, "drop capabilities"); break;
  case SET_IDS:
    snprintf(buf, cap, "switch to uid %u gid %u", plan ? plan->uid : 0, plan ? plan->gid : 0);
    break;
  case CHDIR: snprintf(buf, cap, "change to the directory %s", plan ? plan->cwd : ""); break;
  case PARENT: snprintf(buf, cap, "stay tied to the parent"); break;
  case DESCRIPTORS: snprintf(buf, cap, "set up the descriptors"); break;
  case BEFORE_LOCK: snprintf(buf, cap, "finish the runtime's own set-up"); break;
  case NO_NEW_PRIVS: snprintf(buf, cap, "set no_new_privs"); break;
  case SECCOMP: snprintf(buf, cap, "install the seccomp filter"); break;
  default: snprintf(buf, cap, "set up the sandbox (step %d)", f->stage); break;
  }
}

size_t skiff_plan_size(void) {
  return sizeof(struct skiff_plan);
}
