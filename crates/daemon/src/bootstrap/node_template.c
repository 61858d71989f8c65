/* The native half of skiff's node template (zygote): what JavaScript cannot do by
 * itself. Loaded into the template with process.dlopen; the sandbox steps themselves
 * are in node.js, driven by the plan the sandbox crate makes.
 *   sys(nr, ...args)        a raw system call; numbers, BigInts, strings (as C strings),
 *                           Buffers (as pointers) and null; returns the result or -errno
 *   address(buffer)         a Buffer's address, as a BigInt (for structs that point)
 *   recvFds(fd)             [Buffer, fds] from a SEQPACKET socket ([null, []] at its end)
 *   sendFds(fd, buf, fds)   one message with descriptors
 *   spare(flags)            clone3 with these flags plus CLONE_PIDFD: [pid, pidfd] in the
 *                           template, [0, -1] in the child
 *   loopFork()              renews the event loop's kernel state in a forked child (once
 *                           the child has closed the template's descriptors)
 *   exit(code)              _exit: a forked child has none of node's helper threads to
 *                           join, so process.exit would wait forever */
#define _GNU_SOURCE
#include <errno.h>
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

static napi_value address(napi_env env, napi_callback_info info) {
  size_t argc = 1;
  napi_value argv[1], r;
  void *data;
  size_t len;
  napi_get_cb_info(env, info, &argc, argv, NULL, NULL);
  napi_get_buffer_info(env, argv[0], &data, &len);
  napi_create_bigint_int64(env, (int64_t)(intptr_t)data, &r);
  return r;
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

/* V8 marks its heap MADV_DONTFORK: a forked child would find no heap. */
static void allow_fork_of_everything(void) {
  FILE *f = fopen("/proc/self/smaps", "r");
  if (!f) return;
  char line[512];
  unsigned long lo = 0, hi = 0;
  while (fgets(line, sizeof line, f)) {
    unsigned long a, b;
    if (line[0] != 'V' && sscanf(line, "%lx-%lx ", &a, &b) == 2) {
      lo = a;
      hi = b;
    } else if (strncmp(line, "VmFlags:", 8) == 0 && strstr(line, " dc")) {
      madvise((void *)lo, hi - lo, MADV_DOFORK);
    }
  }
  fclose(f);
}

static napi_value spare(napi_env env, napi_callback_info info) {
  size_t argc = 1;
  napi_value argv[1], out;
  int64_t flags;
  napi_get_cb_info(env, info, &argc, argv, NULL, NULL);
  napi_get_value_int64(env, argv[0], &flags);
  allow_fork_of_everything();
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

static napi_value loop_fork(napi_env env, napi_callback_info info) {
  uv_loop_t *loop;
  napi_get_uv_event_loop(env, &loop);
  return number(env, uv_loop_fork(loop));
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
  } all[] = {{"sys", sys},         {"address", address}, {"recvFds", recv_fds},
             {"sendFds", send_fds}, {"spare", spare},     {"exit", quit},
             {"loopFork", loop_fork}};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
    napi_value f;
    napi_create_function(env, all[i].name, NAPI_AUTO_LENGTH, all[i].fn, NULL, &f);
    napi_set_named_property(env, exports, all[i].name, f);
  }
  return exports;
}
