/* The native half of skiff's node template (zygote): what JavaScript cannot do by
 * itself. Loaded into the template with process.dlopen; the sandbox steps themselves
 * are driven by the plan the sandbox crate makes (crates/sandbox/src/template.rs).
 *   sys(nr, ...args)        a raw system call; numbers, BigInts, strings (as C strings),
 *                           Buffers (as pointers) and null; returns the result or -errno
 *   enter(plan, fds)        in a spare child: the sandbox the plan describes, replaying
 *                           crates/sandbox/src/child.rs; returns the channel's descriptor
 *                           or throws "step: reason". In C: taken from JavaScript,
 *                           the same steps cost the child 1.9-2.8 ms, in C 1.3-1.6
 *   recvFds(fd)             [Buffer, fds] from a SEQPACKET socket ([null, []] at its end)
 *   sendFds(fd, buf, fds)   one message with descriptors
 *   spare(flags)            clone3 with these flags plus CLONE_PIDFD: [pid, pidfd] in the
 *                           template, [0, -1] in the child
 *   exit(code)              _exit: a forked child has none of node's helper threads to
 *                           join, so process.exit would wait forever
 * It is also preloaded into the template, for its madvise (below). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <linux/filter.h>
#include <linux/sched.h>
#include <linux/seccomp.h>
#include <node_api.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <uv.h>

#define MAX_FDS 16

static napi_value number(napi_env env, int64_t v) {
  napi_value r;
  napi_create_int64(env, v, &r);
  return r;
}

static napi_value sys(napi_env env, napi_callback_info info) {
  size_t argc = 7;
  napi_value argv[7];
  napi_get_cb_info(env, info, &argc, argv, NULL, NULL);
  long args[6] = {0};
  char *strings[6] = {0};
  int64_t nr = 0;
  napi_get_value_int64(env, argv[0], &nr);
  for (size_t i = 1; i < argc && i <= 6; i++) {
    napi_valuetype type;
    bool is_buffer = false;
    napi_typeof(env, argv[i], &type);
    napi_is_buffer(env, argv[i], &is_buffer);
    if (is_buffer) {
      void *data;
      size_t len;
      napi_get_buffer_info(env, argv[i], &data, &len);
      args[i - 1] = (long)data;
    } else if (type == napi_string) {
      size_t len;
      napi_get_value_string_utf8(env, argv[i], NULL, 0, &len);
      strings[i - 1] = malloc(len + 1);
      napi_get_value_string_utf8(env, argv[i], strings[i - 1], len + 1, &len);
      args[i - 1] = (long)strings[i - 1];
    } else if (type == napi_bigint) {
      bool lossless;
      int64_t v;
      napi_get_value_bigint_int64(env, argv[i], &v, &lossless);
      args[i - 1] = (long)v;
    } else if (type == napi_number) {
      int64_t v;
      napi_get_value_int64(env, argv[i], &v);
      args[i - 1] = (long)v;
    }
  }
  long r = syscall(nr, args[0], args[1], args[2], args[3], args[4], args[5]);
  int saved = errno;
  for (int i = 0; i < 6; i++) free(strings[i]);
  return number(env, r < 0 ? -saved : r);
}

static napi_value recv_fds(napi_env env, napi_callback_info info) {
  size_t argc = 1;
  napi_value argv[1], out, fds, buf;
  int64_t fd;
  napi_get_cb_info(env, info, &argc, argv, NULL, NULL);
  napi_get_value_int64(env, argv[0], &fd);
  static char data[1 << 20];
  char control[CMSG_SPACE(MAX_FDS * sizeof(int))];
  struct iovec iov = {data, sizeof data};
  struct msghdr msg = {0};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  ssize_t n;
  do n = recvmsg((int)fd, &msg, MSG_CMSG_CLOEXEC); while (n < 0 && errno == EINTR);
  napi_create_array(env, &out);
  napi_create_array(env, &fds);
  uint32_t count = 0;
  for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < k; i++) {
      int got;
      memcpy(&got, CMSG_DATA(c) + i * sizeof(int), sizeof got);
      napi_set_element(env, fds, count++, number(env, got));
    }
  }
  if (n <= 0) napi_get_null(env, &buf);
  else napi_create_buffer_copy(env, (size_t)n, data, NULL, &buf);
  napi_set_element(env, out, 0, buf);
  napi_set_element(env, out, 1, fds);
  return out;
}

static napi_value send_fds(napi_env env, napi_callback_info info) {
  size_t argc = 3;
  napi_value argv[3];
  int64_t fd;
  void *data;
  size_t len;
  uint32_t count = 0;
  napi_get_cb_info(env, info, &argc, argv, NULL, NULL);
  napi_get_value_int64(env, argv[0], &fd);
  napi_get_buffer_info(env, argv[1], &data, &len);
  napi_get_array_length(env, argv[2], &count);
  if (count > MAX_FDS) count = MAX_FDS;
  char control[CMSG_SPACE(MAX_FDS * sizeof(int))];
  memset(control, 0, sizeof control);
  struct iovec iov = {data, len};
  struct msghdr msg = {0};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  if (count > 0) {
    msg.msg_control = control;
    msg.msg_controllen = CMSG_SPACE(count * sizeof(int));
    struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(count * sizeof(int));
    for (uint32_t i = 0; i < count; i++) {
      napi_value v;
      int64_t one;
      napi_get_element(env, argv[2], i, &v);
      napi_get_value_int64(env, v, &one);
      int as_int = (int)one;
      memcpy(CMSG_DATA(c) + i * sizeof(int), &as_int, sizeof as_int);
    }
  }
  ssize_t n = sendmsg((int)fd, &msg, MSG_NOSIGNAL);
  return number(env, n < 0 ? -errno : n);
}

/* The template runs with this file preloaded (LD_PRELOAD): V8 marks every heap page it
 * maps MADV_DONTFORK, which would leave a forked child without a heap. */
int madvise(void *addr, size_t len, int advice) {
  if (advice == MADV_DONTFORK) return 0;
  return (int)syscall(SYS_madvise, addr, len, advice);
}

/* Plan fields (a parsed JSON object). Strings longer than their buffer fail the step. */
static bool plan_string(napi_env env, napi_value obj, const char *key, char *buf, size_t cap) {
  napi_value v;
  size_t len;
  return napi_get_named_property(env, obj, key, &v) == napi_ok &&
         napi_get_value_string_utf8(env, v, buf, cap, &len) == napi_ok && len + 1 < cap;
}

static int64_t plan_int(napi_env env, napi_value obj, const char *key) {
  napi_value v;
  int64_t n = 0;
  if (napi_get_named_property(env, obj, key, &v) == napi_ok) napi_get_value_int64(env, v, &n);
  return n;
}

static bool plan_bool(napi_env env, napi_value obj, const char *key) {
  napi_value v;
  bool b = false;
  if (napi_get_named_property(env, obj, key, &v) == napi_ok) napi_get_value_bool(env, v, &b);
  return b;
}

/* The `index`th string of the array field `key`; false past its end. */
static bool plan_item(napi_env env, napi_value obj, const char *key, uint32_t index, char *buf,
                      size_t cap) {
  napi_value list, v;
  uint32_t len = 0;
  size_t n;
  if (napi_get_named_property(env, obj, key, &list) != napi_ok ||
      napi_get_array_length(env, list, &len) != napi_ok || index >= len)
    return false;
  return napi_get_element(env, list, index, &v) == napi_ok &&
         napi_get_value_string_utf8(env, v, buf, cap, &n) == napi_ok && n + 1 < cap;
}

static int nibble(char c) {
  return c <= '9' ? c - '0' : c - 'a' + 10;
}

/* Out of the template's chroot, to the mount tree's root, where the plan's host paths
 * are (see View in crates/sandbox/src/template.rs): a chroot into /tmp leaves the working
 * directory outside the root, and from there .. climbs to the real one. */
static int leave_view(void) {
  struct stat here, up;
  if (chroot("/tmp") < 0) return -1;
  for (;;) {
    if (stat(".", &here) < 0 || stat("..", &up) < 0) return -1;
    if (here.st_dev == up.st_dev && here.st_ino == up.st_ino) break;
    if (chdir("..") < 0) return -1;
  }
  return chroot(".");
}

/* In a spare, before its plan: out of the template's view, then the steps every start
 * shares (see Preparation in crates/sandbox/src/template.rs). Returns null, or what
 * failed (the start that gets this spare reports it). */
static napi_value prepare(napi_env env, napi_callback_info info) {
  size_t argc = 1;
  napi_value argv[1], out;
  napi_get_cb_info(env, info, &argc, argv, NULL, NULL);
  napi_value prep = argv[0];
  static char item[256], path[sizeof item + 16], text[4096];
  const char *step = "leave the template's root";
  const unsigned long nsdx = MS_NOSUID | MS_NODEV | MS_NOEXEC;
  if (leave_view() < 0) goto failed;
  step = "make / private";
  if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0) goto failed;
  step = "mount /proc";
  if (mount("proc", "/proc", "proc", nsdx, NULL) < 0) goto failed;
  step = "mask /proc";
  for (uint32_t i = 0; plan_item(env, prep, "masked_files", i, item, sizeof item); i++) {
    snprintf(path, sizeof path, "/proc/%s", item);
    if (mount("/dev/null", path, NULL, MS_BIND, NULL) < 0 && errno != ENOENT) goto failed;
  }
  errno = 0;
  if (!plan_string(env, prep, "mask_options", text, sizeof text)) goto failed;
  for (uint32_t i = 0; plan_item(env, prep, "masked_dirs", i, item, sizeof item); i++) {
    snprintf(path, sizeof path, "/proc/%s", item);
    if (mount("tmpfs", path, "tmpfs", MS_RDONLY | nsdx, text) < 0 && errno != ENOENT)
      goto failed;
  }
  step = "bind /proc read-only";
  for (uint32_t i = 0; plan_item(env, prep, "readonly", i, item, sizeof item); i++) {
    snprintf(path, sizeof path, "/proc/%s", item);
    if (mount(path, path, NULL, MS_BIND, NULL) < 0) {
      if (errno == ENOENT) continue;
      goto failed;
    }
    if (mount(path, path, NULL, MS_BIND | MS_REMOUNT | MS_RDONLY | nsdx, NULL) < 0) goto failed;
  }
  step = "drop bounding capabilities";
  for (int64_t cap = 0, last = plan_int(env, prep, "last_cap"); cap <= last; cap++)
    if (prctl(PR_CAPBSET_DROP, (unsigned long)cap) < 0) goto failed;
  napi_get_null(env, &out);
  return out;
failed:
  snprintf(text, sizeof text, "%s: %s", step, errno ? strerror(errno) : "bad preparation");
  napi_create_string_utf8(env, text, NAPI_AUTO_LENGTH, &out);
  return out;
}

static napi_value enter(napi_env env, napi_callback_info info) {
  size_t argc = 2;
  napi_value argv[2];
  napi_get_cb_info(env, info, &argc, argv, NULL, NULL);
  napi_value plan = argv[0];
  int fds[3 + 2 + MAX_FDS];
  uint32_t nfds = 0;
  napi_get_array_length(env, argv[1], &nfds);
  if (nfds > sizeof fds / sizeof fds[0]) nfds = sizeof fds / sizeof fds[0];
  for (uint32_t i = 0; i < nfds; i++) {
    napi_value v;
    int64_t fd = -1;
    napi_get_element(env, argv[1], i, &v);
    napi_get_value_int64(env, v, &fd);
    fds[i] = (int)fd;
  }
  static char root[4096], path[sizeof root + 16], text[4096];
  static char seccomp_hex[1 << 16];
  const char *step = "";
  const unsigned long nsd = MS_NOSUID | MS_NODEV, nsdx = nsd | MS_NOEXEC;
  uint32_t next = 3;
  int clone_into = plan_bool(env, plan, "clone_into") ? fds[next++] : -1;
  uint32_t joins = (uint32_t)plan_int(env, plan, "joins");
  uint32_t first_join = next;
  next += joins;
  int netns = plan_bool(env, plan, "netns") ? fds[next++] : -1;
/* A step's system call failed (errno says why), or the plan lacks what it needs. */
#define STEP(what, call)         \
  do {                           \
    step = what;                 \
    if ((call) < 0) goto failed; \
  } while (0)
#define PLAN(what, ok) \
  do {                 \
    step = what;       \
    if (!(ok)) {       \
      errno = 0;       \
      goto failed;     \
    }                  \
  } while (0)
  PLAN("read the plan", next <= nfds && plan_string(env, plan, "rootfs", root, sizeof root));
  /* Forked ahead, before its cgroup was known: the child moves itself. */
  if (clone_into >= 0) {
    int procs;
    STEP("open cgroup.procs", procs = openat(clone_into, "cgroup.procs", O_WRONLY | O_CLOEXEC));
    STEP("join the cgroup", write(procs, "0", 1));
    close(procs);
  }
  for (uint32_t i = 0; i < joins; i++)
    STEP("join the cgroup", write(fds[first_join + i], "0", 1));
  STEP("unshare the cgroup namespace", unshare(CLONE_NEWCGROUP));
  if (netns >= 0) STEP("join the network namespace", setns(netns, CLONE_NEWNET));
  STEP("bind the root", mount(root, root, NULL, MS_BIND, NULL));
  STEP("remount the root read-only",
       mount(root, root, NULL, MS_BIND | MS_REMOUNT | MS_RDONLY | nsd, NULL));
  snprintf(path, sizeof path, "%s/proc", root);
  STEP("move /proc under the root", mount("/proc", path, NULL, MS_MOVE, NULL));
  PLAN("bind /dev", plan_string(env, plan, "dev_template", text, sizeof text));
  snprintf(path, sizeof path, "%s/dev", root);
  STEP("bind /dev", mount(text, path, NULL, MS_BIND | MS_REC, NULL));
  PLAN("mount /dev/shm", plan_string(env, plan, "shm_options", text, sizeof text));
  snprintf(path, sizeof path, "%s/dev/shm", root);
  STEP("mount /dev/shm", mount("tmpfs", path, "tmpfs", nsdx, text));
  PLAN("mount /tmp", plan_string(env, plan, "tmp_options", text, sizeof text));
  snprintf(path, sizeof path, "%s/tmp", root);
  STEP("mount /tmp", mount("tmpfs", path, "tmpfs", nsd, text));
  STEP("chdir to the root", chdir(root));
  STEP("pivot_root", syscall(SYS_pivot_root, ".", "."));
  STEP("detach the old root", umount2(".", MNT_DETACH));
  STEP("chdir /", chdir("/"));
  PLAN("sethostname", plan_string(env, plan, "hostname", text, sizeof text));
  STEP("sethostname", sethostname(text, strlen(text)));
  struct rlimit files = {(rlim_t)plan_int(env, plan, "max_open_files"), 0}, core = {0, 0};
  files.rlim_max = files.rlim_cur;
  STEP("setrlimit", setrlimit(RLIMIT_NOFILE, &files));
  STEP("setrlimit", setrlimit(RLIMIT_CORE, &core));
  /* Raw calls: each changes only this thread, which is all the child has; libc's
   * wrappers would signal threads it still believes the template has. */
  STEP("setgroups", syscall(SYS_setgroups, 0, NULL));
  STEP("securebits", prctl(PR_SET_SECUREBITS, (unsigned long)plan_int(env, plan, "secure_bits")));
  STEP("clear ambient capabilities", prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0));
  long gid = (long)plan_int(env, plan, "gid"), uid = (long)plan_int(env, plan, "uid");
  STEP("setresgid", syscall(SYS_setresgid, gid, gid, gid));
  STEP("setresuid", syscall(SYS_setresuid, uid, uid, uid));
  struct __user_cap_header_struct header = {_LINUX_CAPABILITY_VERSION_3, 0};
  struct __user_cap_data_struct none[2];
  memset(none, 0, sizeof none);
  STEP("capset", syscall(SYS_capset, &header, none));
  PLAN("chdir", plan_string(env, plan, "cwd", text, sizeof text));
  STEP("chdir", chdir(text));
  STEP("parent-death signal", prctl(PR_SET_PDEATHSIG, SIGKILL));
  /* The channel, stdout and stderr may have arrived as any numbers, 0 to 2 included:
   * lift them out of the way, put them in place, close everything else of the
   * template's (the event loop's descriptors too: it is renewed right after). */
  int keep, out, err, devnull;
  STEP("dup", keep = fcntl(fds[0], F_DUPFD_CLOEXEC, 100));
  STEP("dup", out = fcntl(fds[1], F_DUPFD_CLOEXEC, 100));
  STEP("dup", err = fcntl(fds[2], F_DUPFD_CLOEXEC, 100));
  STEP("stdout", dup3(out, 1, 0));
  STEP("stderr", dup3(err, 2, 0));
  syscall(SYS_close_range, 3, keep - 1, 0);
  syscall(SYS_close_range, keep + 1, ~0U, 0);
  uv_loop_t *loop;
  napi_get_uv_event_loop(env, &loop);
  step = "renew the event loop";
  if ((errno = -uv_loop_fork(loop)) != 0) goto failed;
  STEP("open /dev/null", devnull = open("/dev/null", O_RDONLY | O_CLOEXEC));
  STEP("stdin", dup3(devnull, 0, 0));
  close(devnull);
  STEP("no_new_privs", prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0));
  PLAN("seccomp", plan_string(env, plan, "seccomp", seccomp_hex, sizeof seccomp_hex));
  size_t bytes = strlen(seccomp_hex) / 2;
  static struct sock_filter program[(sizeof seccomp_hex / 2) / sizeof(struct sock_filter)];
  for (size_t i = 0; i < bytes; i++) /* lower-case hex, from the sandbox crate */
    ((unsigned char *)program)[i] = (unsigned char)(nibble(seccomp_hex[2 * i]) << 4 |
                                                    nibble(seccomp_hex[2 * i + 1]));
  struct sock_fprog prog = {(unsigned short)(bytes / sizeof(struct sock_filter)), program};
  STEP("seccomp", syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &prog));
#undef STEP
#undef PLAN
  return number(env, keep);
failed:
  snprintf(text, sizeof text, "%s: %s", step, errno ? strerror(errno) : "bad plan");
  napi_throw_error(env, NULL, text);
  return NULL;
}

static napi_value spare(napi_env env, napi_callback_info info) {
  size_t argc = 1;
  napi_value argv[1], out;
  int64_t flags;
  napi_get_cb_info(env, info, &argc, argv, NULL, NULL);
  napi_get_value_int64(env, argv[0], &flags);
  int pidfd = -1;
  struct clone_args args;
  memset(&args, 0, sizeof args);
  args.flags = (uint64_t)flags | CLONE_PIDFD;
  args.pidfd = (uint64_t)(uintptr_t)&pidfd;
  long pid = syscall(SYS_clone3, &args, sizeof args);
  napi_create_array(env, &out);
  napi_set_element(env, out, 0, number(env, pid < 0 ? -errno : pid));
  napi_set_element(env, out, 1, number(env, pidfd));
  return out;
}

/* A spare's lesson from the daemon (crates/sandbox/src/lesson.rs): (start, length,
 * advice) triples of little-endian u64s, each range populated as advised while the spare
 * waits. Only the two populate advices are taken; a range this process lacks fails
 * harmlessly (ENOMEM) and is skipped. */
static napi_value populate(napi_env env, napi_callback_info info) {
  size_t argc = 1, len = 0;
  napi_value argv[1];
  void *data = NULL;
  napi_get_cb_info(env, info, &argc, argv, NULL, NULL);
  napi_get_buffer_info(env, argv[0], &data, &len);
  for (size_t at = 0; at + 3 * sizeof(uint64_t) <= len; at += 3 * sizeof(uint64_t)) {
    uint64_t range[3];
    memcpy(range, (char *)data + at, sizeof range);
    if (range[2] == 22 || range[2] == 23) /* MADV_POPULATE_READ, MADV_POPULATE_WRITE */
      madvise((void *)(uintptr_t)range[0], (size_t)range[1], (int)range[2]);
  }
  return NULL;
}

static napi_value quit(napi_env env, napi_callback_info info) {
  size_t argc = 1;
  napi_value argv[1];
  int64_t code = 0;
  napi_get_cb_info(env, info, &argc, argv, NULL, NULL);
  if (argc > 0) napi_get_value_int64(env, argv[0], &code);
  _exit((int)code);
}

NAPI_MODULE_INIT() {
  struct {
    const char *name;
    napi_callback fn;
  } all[] = {{"sys", sys},         {"enter", enter}, {"recvFds", recv_fds},
             {"sendFds", send_fds}, {"spare", spare},     {"exit", quit},
             {"populate", populate}, {"prepare", prepare}};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
    napi_value f;
    napi_create_function(env, all[i].name, NAPI_AUTO_LENGTH, all[i].fn, NULL, &f);
    napi_set_named_property(env, exports, all[i].name, f);
  }
  return exports;
}
