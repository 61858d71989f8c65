use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

/// Which cgroup layout the host runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// Only v1 hierarchies.
    V1,
    /// Only the unified v2 hierarchy.
    V2,
    /// v1 controllers plus a v2 mount (systemd's hybrid mode): limits come from v1, the
    /// v2 side gives `cgroup.kill` and `clone3(CLONE_INTO_CGROUP)`.
    Hybrid,
}

impl std::fmt::Display for Layout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Layout::V1 => "v1",
            Layout::V2 => "v2",
            Layout::Hybrid => "hybrid",
        })
    }
}

/// The mounted hierarchies and this process's own directory in each.
#[derive(Debug, Clone)]
pub struct Hierarchy {
    pub layout: Layout,
    /// v1 controller name → this process's cgroup directory in it.
    pub v1: Vec<(String, PathBuf)>,
    /// This process's cgroup directory in the v2 hierarchy, with the controllers it offers.
    pub v2: Option<(PathBuf, Vec<String>)>,
}

/// v1 controllers skiff uses.
pub(crate) const V1_CONTROLLERS: [&str; 3] = ["memory", "cpu", "pids"];

impl Hierarchy {
    pub fn detect() -> Result<Hierarchy> {
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")
            .context("cannot read /proc/self/mountinfo")?;
        let own = crate::read_small(Path::new("/proc/self/cgroup"))
            .context("cannot read /proc/self/cgroup")?;
        Hierarchy::parse(&mountinfo, &own)
    }

    fn parse(mountinfo: &str, own: &str) -> Result<Hierarchy> {
        let mut v1 = Vec::new();
        let mut v2 = None;
        for line in mountinfo.lines() {
            let Some((left, right)) = line.split_once(" - ") else {
                continue;
            };
            let fields: Vec<&str> = left.split(' ').collect();
            let rfields: Vec<&str> = right.split(' ').collect();
            if fields.len() < 5 || rfields.len() < 3 {
                continue;
            }
            // Only a hierarchy's root mount lets us reach our own path below it.
            let (root, mount_point) = (fields[3], unescape(fields[4]));
            match rfields[0] {
                "cgroup2" if root == "/" && v2.is_none() => {
                    let path = own_path(own, |c| c.is_empty())
                        .map(|p| mount_point.join(p.trim_start_matches('/')));
                    if let Some(dir) = path {
                        let controllers = crate::read_small(&dir.join("cgroup.controllers"))
                            .unwrap_or_default()
                            .split_whitespace()
                            .map(str::to_owned)
                            .collect();
                        v2 = Some((dir, controllers));
                    }
                }
                "cgroup" if root == "/" => {
                    for option in rfields[2].split(',') {
                        if !V1_CONTROLLERS.contains(&option) || v1.iter().any(|(c, _)| c == option)
                        {
                            continue;
                        }
                        let path = own_path(own, |cs| cs.split(',').any(|c| c == option));
                        if let Some(p) = path {
                            v1.push((
                                option.to_owned(),
                                mount_point.join(p.trim_start_matches('/')),
                            ));
                        }
                    }
                }
                _ => {}
            }
        }
        let layout = match (v1.is_empty(), &v2) {
            (true, None) => bail!("no cgroup hierarchy is mounted"),
            (true, Some(_)) => Layout::V2,
            (false, None) => Layout::V1,
            (false, Some(_)) => Layout::Hybrid,
        };
        if layout != Layout::V2 {
            for c in V1_CONTROLLERS {
                if !v1.iter().any(|(name, _)| name == c) {
                    bail!("the cgroup v1 controller {c:?} is not mounted");
                }
            }
        }
        // A v2 mount with controllers while v1 has them too means those controllers are
        // split; skiff keeps limits on v1 in that case.
        Ok(Hierarchy { layout, v1, v2 })
    }

    pub fn v1_dir(&self, controller: &str) -> Option<&Path> {
        self.v1
            .iter()
            .find(|(c, _)| c == controller)
            .map(|(_, p)| p.as_path())
    }
}

/// This process's path in the hierarchy whose controller list satisfies `matches`.
fn own_path(own: &str, matches: impl Fn(&str) -> bool) -> Option<String> {
    own.lines().find_map(|line| {
        let mut parts = line.splitn(3, ':');
        let (_id, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        matches(controllers).then(|| path.to_owned())
    })
}

/// mountinfo escapes spaces and a few other bytes as octal.
fn unescape(field: &str) -> PathBuf {
    let mut out = String::with_capacity(field.len());
    let mut chars = field.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            let code: String = chars.by_ref().take(3).collect();
            if let Ok(b) = u8::from_str_radix(&code, 8) {
                out.push(b as char);
                continue;
            }
            out.push('\\');
            out.push_str(&code);
        } else {
            out.push(c);
        }
    }
    PathBuf::from(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const HYBRID_MOUNTS: &str = "\
30 25 0:26 / /sys/fs/cgroup rw - tmpfs tmpfs rw,mode=755
31 30 0:27 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu
32 30 0:28 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory
33 30 0:29 / /sys/fs/cgroup/pids rw - cgroup cgroup rw,pids
34 30 0:30 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw
";
    const HYBRID_OWN: &str = "8:pids:/\n4:memory:/process_api/abc\n1:cpu:/\n0::/\n";

    #[test]
    fn detects_hybrid_and_own_paths() {
        let h = Hierarchy::parse(HYBRID_MOUNTS, HYBRID_OWN).unwrap();
        assert_eq!(h.layout, Layout::Hybrid);
        assert_eq!(
            h.v1_dir("memory").unwrap(),
            Path::new("/sys/fs/cgroup/memory/process_api/abc")
        );
        assert_eq!(h.v1_dir("cpu").unwrap(), Path::new("/sys/fs/cgroup/cpu"));
        assert_eq!(h.v2.unwrap().0, PathBuf::from("/sys/fs/cgroup/unified"));
    }

    #[test]
    fn detects_pure_v2_and_co_mounted_v1() {
        let v2 = "30 25 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
        let h = Hierarchy::parse(v2, "0::/user.slice/skiff\n").unwrap();
        assert_eq!(h.layout, Layout::V2);
        assert_eq!(
            h.v2.unwrap().0,
            PathBuf::from("/sys/fs/cgroup/user.slice/skiff")
        );

        let v1 = "\
31 30 0:27 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct
32 30 0:28 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory
33 30 0:29 / /sys/fs/cgroup/pids rw - cgroup cgroup rw,pids
";
        let own = "3:cpu,cpuacct:/a\n2:memory:/a\n1:pids:/a\n";
        let h = Hierarchy::parse(v1, own).unwrap();
        assert_eq!(h.layout, Layout::V1);
        assert_eq!(
            h.v1_dir("cpu").unwrap(),
            Path::new("/sys/fs/cgroup/cpu,cpuacct/a")
        );
    }

    #[test]
    fn missing_controller_is_an_error() {
        let v1 = "32 30 0:28 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n";
        let err = Hierarchy::parse(v1, "2:memory:/\n").unwrap_err();
        assert!(err.to_string().contains("\"cpu\""), "{err}");
    }
}
