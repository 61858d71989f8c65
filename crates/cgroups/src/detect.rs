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
        let own = own_cgroups()?;
        Hierarchy::detect_with(&own)
    }

    fn detect_with(own: &str) -> Result<Hierarchy> {
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")
            .context("cannot read /proc/self/mountinfo")?;
        Hierarchy::parse(&mountinfo, own)
    }

    /// As [`Hierarchy::detect`], remembering the answer in the file `cache` for
    /// processes in the same cgroups: /proc/self/mountinfo costs ~40 µs to read here,
    /// on every `skiff run`.
    pub fn detect_cached(cache: &Path) -> Result<Hierarchy> {
        let own = own_cgroups()?;
        if let Some(cached) = crate::read_small(cache)
            .ok()
            .and_then(|text| Hierarchy::decode(&text, &own))
        {
            return Ok(cached);
        }
        let detected = Hierarchy::detect_with(&own)?;
        if let Some(text) = detected.encode(&own) {
            let tmp = cache.with_extension(format!("tmp{}", std::process::id()));
            if std::fs::write(&tmp, text).is_ok() {
                let _ = std::fs::rename(&tmp, cache);
            }
        }
        Ok(detected)
    }

    /// Lines: the key (own cgroups, each line prefixed `own\t`), the layout, then
    /// `v1\tCONTROLLER\tDIR` and `v2\tDIR\tCONTROLLERS`. None when a path holds a tab
    /// or newline.
    fn encode(&self, own: &str) -> Option<String> {
        let mut out = String::new();
        for line in own.lines() {
            out.push_str(&format!("own\t{line}\n"));
        }
        out.push_str(&format!("layout\t{}\n", self.layout));
        for (c, dir) in &self.v1 {
            out.push_str(&format!("v1\t{c}\t{}\n", dir.to_str()?));
        }
        if let Some((dir, controllers)) = &self.v2 {
            out.push_str(&format!(
                "v2\t{}\t{}\n",
                dir.to_str()?,
                controllers.join(",")
            ));
        }
        let clean = self
            .v1
            .iter()
            .map(|(_, d)| d)
            .chain(self.v2.iter().map(|(d, _)| d));
        clean
            .map(|d| d.to_string_lossy())
            .all(|d| !d.contains(['\t', '\n']))
            .then_some(out)
    }

    fn decode(text: &str, own: &str) -> Option<Hierarchy> {
        let key: String = text
            .lines()
            .filter_map(|l| l.strip_prefix("own\t"))
            .map(|l| format!("{l}\n"))
            .collect();
        if key.trim_end() != own.trim_end() {
            return None;
        }
        let mut layout = None;
        let mut v1 = Vec::new();
        let mut v2 = None;
        for line in text.lines() {
            let fields: Vec<&str> = line.split('\t').collect();
            match fields.as_slice() {
                ["layout", "v1"] => layout = Some(Layout::V1),
                ["layout", "v2"] => layout = Some(Layout::V2),
                ["layout", "hybrid"] => layout = Some(Layout::Hybrid),
                ["v1", c, dir] => v1.push((c.to_string(), PathBuf::from(dir))),
                ["v2", dir, cs] => {
                    let cs = cs.split(',').filter(|c| !c.is_empty()).map(str::to_owned);
                    v2 = Some((PathBuf::from(dir), cs.collect()));
                }
                _ => {}
            }
        }
        Some(Hierarchy {
            layout: layout?,
            v1,
            v2,
        })
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

fn own_cgroups() -> Result<String> {
    crate::read_small(Path::new("/proc/self/cgroup")).context("cannot read /proc/self/cgroup")
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
    fn cache_round_trips_and_is_keyed_by_own_cgroups() {
        let h = Hierarchy::parse(HYBRID_MOUNTS, HYBRID_OWN).unwrap();
        let text = h.encode(HYBRID_OWN).unwrap();
        let back = Hierarchy::decode(&text, HYBRID_OWN).unwrap();
        assert_eq!(back.layout, h.layout);
        assert_eq!(back.v1, h.v1);
        assert_eq!(back.v2, h.v2);
        assert!(Hierarchy::decode(&text, "0::/elsewhere\n").is_none());
    }

    #[test]
    fn missing_controller_is_an_error() {
        let v1 = "32 30 0:28 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n";
        let err = Hierarchy::parse(v1, "2:memory:/\n").unwrap_err();
        assert!(err.to_string().contains("\"cpu\""), "{err}");
    }
}
