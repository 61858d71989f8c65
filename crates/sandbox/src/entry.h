/* skiff's sandbox entry: the steps that turn a process into a sandbox, written once.
 * The native spawner (child.rs, between clone3 and execve, linked into skiff), the
 * python template (a shared object, through ctypes) and node's template addon (compiled
 * in) all call these with the values of the plan the sandbox crate makes (template.rs:
 * `Preparation` and `Plan`). System calls only: nothing here allocates or locks, so it
 * may run in a vfork'd child. Struct layouts are mirrored in child.rs and python.py. */
#ifndef SKIFF_ENTRY_H
#define SKIFF_ENTRY_H

#include <stddef.h>
#include <stdint.h>

/* The steps every start shares, which a template's spare takes while it waits: a
 * private mount tree, a fresh /proc at /proc with runc's masks (skiff_enter moves it
 * under the root), an empty bounding set. Name lists end with NULL. */
struct skiff_prep {
  const char *const *masked_files; /* in /proc, covered by /dev/null */
  const char *const *masked_dirs;  /* in /proc, covered by an empty read-only tmpfs */
  const char *const *readonly;     /* in /proc, made read-only */
  const char *mask_options;        /* the masking tmpfs's options */
  uint32_t last_cap;               /* the highest capability the kernel knows */
  int32_t leave_chroot;            /* first climb out of a template's chroot (see View) */
};

/* One sandbox, entered on top of skiff_prepare. Descriptors are -1 when absent. */
struct skiff_plan {
  const char *root;         /* the root filesystem's host path, bound read-only */
  const char *dev_template; /* bound at /dev */
  const char *shm_options;  /* /dev/shm's tmpfs */
  const char *tmp_options;  /* /tmp's tmpfs, and those of `tmpfs` */
  const char *const *tmpfs; /* more tmpfs mount points, host paths under root; NULL-ended */
  const char *work;         /* a host directory bound read-write at root/work, or NULL */
  const char *hostname;
  const char *cwd;
  const int32_t *joins; /* cgroup v1 `tasks` files to join */
  uint32_t n_joins;
  int32_t cgroup; /* a cgroup v2 directory to move into (a child forked ahead) */
  int32_t netns;  /* a network namespace to join */
  /* Unshare a user namespace after the mounts, send "U" here and wait for one byte: the
   * parent writes the id maps meanwhile. */
  int32_t user_ns_sock;
  uint32_t uid, gid;
  uint64_t max_open_files;
  uint64_t securebits;
  int32_t die_with_parent; /* SIGKILL when the parent dies... */
  int32_t parent_sock;     /* ...and fail now if this socket's other end is gone */
  int32_t stdio[3];        /* put at 0, 1, 2; -1: /dev/null */
  int32_t channel;         /* kept open, at the descriptor skiff_enter returns */
  int32_t close_rest;      /* close every other descriptor; 0: mark them close-on-exec */
  /* Called after the descriptors are in place, before no_new_privs and seccomp (node
   * renews its event loop there); a negative result fails the entry. */
  int (*before_lock)(void *);
  void *before_lock_arg;
  const void *seccomp; /* the filter's struct sock_filter instructions */
  uint32_t seccomp_len;
};

/* Which step failed, its index in a list, and errno (0: the plan lacks something). */
struct skiff_failure {
  int32_t stage;
  int32_t index;
  int32_t error;
};

/* Each returns -1 and fills `failed` when a step fails. skiff_enter returns the
 * channel's descriptor (0 without one). */
int skiff_prepare(const struct skiff_prep *prep, struct skiff_failure *failed);
int skiff_enter(const struct skiff_plan *plan, struct skiff_failure *failed);

/* What a failed step was doing, in words, NUL-terminated in buf. */
void skiff_describe(const struct skiff_prep *prep, const struct skiff_plan *plan,
                    const struct skiff_failure *failed, char *buf, size_t cap);

/* sizeof(struct skiff_plan): a caller that mirrors the struct checks its copy. */
size_t skiff_plan_size(void);

#endif
