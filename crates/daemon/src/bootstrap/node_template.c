/* The native half of skiff's node template (zygote): what JavaScript cannot do by
 * itself. Loaded into the template with process.dlopen; the sandbox steps themselves
 * are the sandbox entry's (crates/sandbox/src/entry.c, compiled in), driven by the plan
 * the sandbox crate makes (crates/sandbox/src/template.rs).
 *   sys(nr, ...args)        a raw system call; numbers, BigInts, strings (as C strings),
 *                           Buffers (as pointers) and null; returns the result or -errno
 *   prepare(preparation)    in a spare: out of the template's view, then the entry's
 *                           skiff_prepare; returns null or what failed
 *   enter(plan, fds)        in a spare child: the entry's skiff_enter with the plan;
 *                           returns the channel's descriptor or throws "step: reason"
 *   recvFds(fd)             [Buffer, fds] from a SEQPACKET socket ([null, []] at its end)
 *   sendFds(fd, buf, fds)   one message with descriptors
 *   spare(flags)            clone3 with these flags plus CLONE_PIDFD: [pid, pidfd] in the
 *                           template, [0, -1] in the child
 *   exit(code)              _exit: a forked child has none of node's helper threads to
 *                           join, so process.exit would wait forever
 * It is also preloaded into the template, for its madvise (below). */
#define _GNU_SOURCE
#include <errno.h>
#include <linux/filter.h>
#include <linux/sched.h>
#include <node_api.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <uv.h>

#include "entry.h"

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

/* Plan fields (a parsed JSON object), copied into `buf`; false if absent or too long. */
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

/* The array of strings `key` as a NULL-ended list in `list` (up to `max` names), their
 * text in `text`; false if absent or too long. */
static bool plan_list(napi_env env, napi_value obj, const char *key, const char **list,
                      size_t max, char *text, size_t cap) {
  napi_value array, v;
  uint32_t len = 0;
  size_t used = 0, n;
  if (napi_get_named_property(env, obj, key, &array) != napi_ok ||
      napi_get_array_length(env, array, &len) != napi_ok || len > max)
    return false;
  for (uint32_t i = 0; i < len; i++) {
    if (napi_get_element(env, array, i, &v) != napi_ok ||
        napi_get_value_string_utf8(env, v, text + used, cap - used, &n) != napi_ok ||
        used + n + 1 >= cap)
      return false;
    list[i] = text + used;
    used += n + 1;
  }
  list[len] = NULL;
  return true;
}

static int nibble(char c) {
  return c <= '9' ? c - '0' : c - 'a' + 10;
}

/* "what: reason" for a failed step of the entry. */
static void failed_step(const struct skiff_prep *prep, const struct skiff_plan *plan,
                        const struct skiff_failure *failed, char *text, size_t cap) {
  skiff_describe(prep, plan, failed, text, cap);
  size_t n = strlen(text);
  snprintf(text + n, cap - n, ": %s", failed->error ? strerror(failed->error) : "bad plan");
}

/* In a spare, before its plan: out of the template's view, then the steps every start
 * shares (the daemon's Preparation, through the sandbox entry). Returns null, or what
 * failed (the start that gets this spare reports it). */
static napi_value prepare(napi_env env, napi_callback_info info) {
  size_t argc = 1;
  napi_value argv[1], out;
  napi_get_cb_info(env, info, &argc, argv, NULL, NULL);
  static const char *lists[3][64];
  static char names[3][4096], options[256], text[4096];
  struct skiff_prep prep = {lists[0], lists[1], lists[2], options,
                            (uint32_t)plan_int(env, argv[0], "last_cap"), 1};
  struct skiff_failure failed = {0, 0, 0};
  if (!plan_list(env, argv[0], "masked_files", lists[0], 63, names[0], sizeof names[0]) ||
      !plan_list(env, argv[0], "masked_dirs", lists[1], 63, names[1], sizeof names[1]) ||
      !plan_list(env, argv[0], "readonly", lists[2], 63, names[2], sizeof names[2]) ||
      !plan_string(env, argv[0], "mask_options", options, sizeof options)) {
    napi_create_string_utf8(env, "a bad preparation", NAPI_AUTO_LENGTH, &out);
    return out;
  }
  if (skiff_prepare(&prep, &failed) < 0) {
    failed_step(&prep, NULL, &failed, text, sizeof text);
    napi_create_string_utf8(env, text, NAPI_AUTO_LENGTH, &out);
    return out;
  }
  napi_get_null(env, &out);
  return out;
}

/* The entry's last step before it locks: libuv's loop made anew in the child. */
static int renew_loop(void *loop) {
  int r = uv_loop_fork(loop);
  if (r < 0) errno = -r;
  return r;
}

/* In a spare child: the sandbox the plan describes, through the sandbox entry; returns
 * the channel's descriptor or throws "step: reason". */
static napi_value enter(napi_env env, napi_callback_info info) {
  size_t argc = 2;
  napi_value argv[2];
  napi_get_cb_info(env, info, &argc, argv, NULL, NULL);
  napi_value p = argv[0];
  int32_t fds[3 + 2 + MAX_FDS];
  uint32_t nfds = 0;
  napi_get_array_length(env, argv[1], &nfds);
  if (nfds > sizeof fds / sizeof fds[0]) nfds = sizeof fds / sizeof fds[0];
  for (uint32_t i = 0; i < nfds; i++) {
    napi_value v;
    int64_t fd = -1;
    napi_get_element(env, argv[1], i, &v);
    napi_get_value_int64(env, v, &fd);
    fds[i] = (int32_t)fd;
  }
  static char root[4096], dev[4096], shm[256], tmp[256], host[256], cwd[4096], text[4096];
  static char seccomp_hex[1 << 16];
  static struct sock_filter program[(sizeof seccomp_hex / 2) / sizeof(struct sock_filter)];
  uv_loop_t *loop;
  napi_get_uv_event_loop(env, &loop);
  /* The descriptors: channel, stdout, stderr, then the cgroup to move into if
   * clone_into, `joins` v1 tasks files, a network namespace if netns. */
  uint32_t next = 3;
  struct skiff_plan plan = {0};
  plan.cgroup = plan_bool(env, p, "clone_into") ? fds[next++] : -1;
  plan.joins = fds + next;
  plan.n_joins = (uint32_t)plan_int(env, p, "joins");
  next += plan.n_joins;
  plan.netns = plan_bool(env, p, "netns") ? fds[next++] : -1;
  bool read = next <= nfds && plan_string(env, p, "rootfs", root, sizeof root) &&
              plan_string(env, p, "dev_template", dev, sizeof dev) &&
              plan_string(env, p, "shm_options", shm, sizeof shm) &&
              plan_string(env, p, "tmp_options", tmp, sizeof tmp) &&
              plan_string(env, p, "hostname", host, sizeof host) &&
              plan_string(env, p, "cwd", cwd, sizeof cwd) &&
              plan_string(env, p, "seccomp", seccomp_hex, sizeof seccomp_hex);
  if (!read) {
    napi_throw_error(env, NULL, "read the plan: bad plan");
    return NULL;
  }
  size_t bytes = strlen(seccomp_hex) / 2;
  for (size_t i = 0; i < bytes; i++) /* lower-case hex, from the sandbox crate */
    ((unsigned char *)program)[i] = (unsigned char)(nibble(seccomp_hex[2 * i]) << 4 |
                                                    nibble(seccomp_hex[2 * i + 1]));
  plan.root = root;
  plan.dev_template = dev;
  plan.shm_options = shm;
  plan.tmp_options = tmp;
  plan.hostname = host;
  plan.cwd = cwd;
  plan.user_ns_sock = -1;
  plan.uid = (uint32_t)plan_int(env, p, "uid");
  plan.gid = (uint32_t)plan_int(env, p, "gid");
  plan.max_open_files = (uint64_t)plan_int(env, p, "max_open_files");
  plan.securebits = (uint64_t)plan_int(env, p, "secure_bits");
  plan.die_with_parent = 1;
  plan.parent_sock = -1;
  plan.stdio[0] = -1;
  plan.stdio[1] = fds[1];
  plan.stdio[2] = fds[2];
  plan.channel = fds[0];
  /* The event loop's descriptors too: renew_loop makes new ones. */
  plan.close_rest = 1;
  plan.before_lock = renew_loop;
  plan.before_lock_arg = loop;
  plan.seccomp = program;
  plan.seccomp_len = (uint32_t)(bytes / sizeof(struct sock_filter));
  struct skiff_failure failed = {0, 0, 0};
  int keep = skiff_enter(&plan, &failed);
  if (keep < 0) {
    failed_step(NULL, &plan, &failed, text, sizeof text);
    napi_throw_error(env, NULL, text);
    return NULL;
  }
  return number(env, keep);
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
