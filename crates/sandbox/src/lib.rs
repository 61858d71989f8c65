//! Function sandboxes.
//!
//! A [`Spawner`] starts a command in a new PID, mount, IPC, UTS and cgroup namespace
//! (user and network namespaces on request) with one `clone3` call, straight into a
//! pooled cgroup where the kernel allows it, and hands back a pidfd. The child then sets
//! itself up through the sandbox entry (`entry.c`, which the templates call too): a
//! read-only bind of the root, fresh /proc with runc's masks, a minimal /dev, tmpfs for
//! /tmp, `pivot_root`, no capabilities, `no_new_privs`, a seccomp allowlist; then
//! `execve`.

mod child;
pub mod devices;
mod lesson;
pub mod netns;
pub mod seccomp;
mod server;
mod spawn;
mod spec;
pub mod template;

pub use server::{recv_with_fds, send_with_fds, RemoteSpawner};
pub use spawn::{Child, ExitStatus, SpawnError, SpawnErrorKind, Spawner};
pub use spec::{IdMap, Spec};
