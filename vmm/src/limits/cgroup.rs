//! The `cgroup` limit backend (`--limit-backend cgroup`), for comparison with the VMM's own
//! enforcement: the kernel's CFS bandwidth control, as Firecracker's jailer and libvirt use.
//!
//! Data flow: [`CgroupLimits::create`] makes one cgroup per limit under the cpu controller
//! (v2 `cpu.max` where the cpu controller is enabled in the unified hierarchy, else v1
//! `cpu.cfs_quota_us`/`cpu.cfs_period_us`): the VM's limit is the parent, each vCPU group a
//! child, so both hold. `Vm::run` calls [`CgroupLimits::place`] with the vCPU threads' ids
//! after they exist and before the start gate opens, so no guest code runs outside them.
//! Figures come from the cgroups' own `cpu.stat` (periods, throttled periods, throttled
//! time) and the members' thread CPU clocks. The directories are removed on drop. What fails
//! is a [`CgroupError`].

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use ppa_vmm_api::{GroupStats, LimitBackend, LimitKick, LimitKicks};
use thiserror::Error;

use super::{Limit, LimitConfig, VM_GROUP};
use crate::accounting::histogram::HistogramSnapshot;

/// Why the cgroups could not be set up or the vCPU threads placed in them.
#[derive(Debug, Error)]
pub enum CgroupError {
    /// Neither a v2 hierarchy with the cpu controller nor a v1 cpu hierarchy.
    #[error(
        "there is no cgroup cpu controller: neither cgroup v2 with `cpu` in {} nor v1 at {}",
        .controllers.display(),
        .v1.display()
    )]
    NoController {
        /// The v2 list of controllers looked at.
        controllers: PathBuf,
        /// The v1 hierarchy looked for.
        v1: PathBuf,
    },
    /// A cgroup directory could not be made.
    #[error("cannot create the cgroup {}", .path.display())]
    Create {
        /// The directory.
        path: PathBuf,
        /// Cause.
        #[source]
        source: io::Error,
    },
    /// A cgroup file could not be written.
    #[error("cannot write `{text}` to {}", .path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// What was to be written.
        text: String,
        /// Cause.
        #[source]
        source: io::Error,
    },
    /// The vCPU threads did not all get their thread ids in time to be placed.
    #[error(
        "the vCPU threads did not start within {secs} s, so they cannot be placed in their cgroups"
    )]
    ThreadsLate {
        /// How long was waited.
        secs: u64,
    },
}

/// The cgroups of one VM.
#[derive(Debug)]
pub struct CgroupLimits {
    /// (name, directory, members, limit text, limit), the VM's first.
    groups: Vec<(String, PathBuf, Vec<usize>, String, Limit)>,
    v2: bool,
    root: PathBuf,
}

/// Figures of a cgroup's `cpu.stat`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CpuStat {
    /// Periods with activity.
    pub nr_periods: u64,
    /// Periods in which the cgroup was throttled.
    pub nr_throttled: u64,
    /// Total time throttled, ns.
    pub throttled_ns: u64,
}

/// Parses `cpu.stat` (v1: `throttled_time` in ns; v2: `throttled_usec`).
pub fn parse_cpu_stat(text: &str) -> CpuStat {
    let mut s = CpuStat::default();
    for line in text.lines() {
        let mut it = line.split_whitespace();
        let (Some(k), Some(v)) = (it.next(), it.next()) else {
            continue;
        };
        let Ok(v) = v.parse::<u64>() else { continue };
        match k {
            "nr_periods" => s.nr_periods = v,
            "nr_throttled" => s.nr_throttled = v,
            "throttled_time" => s.throttled_ns = v,
            "throttled_usec" => s.throttled_ns = v.saturating_mul(1000),
            _ => {}
        }
    }
    s
}

fn write(path: &Path, text: &str) -> Result<(), CgroupError> {
    fs::write(path, text).map_err(|source| CgroupError::Write {
        path: path.to_path_buf(),
        text: text.to_string(),
        source,
    })
}

fn create_dir(path: &Path) -> Result<(), CgroupError> {
    fs::create_dir_all(path).map_err(|source| CgroupError::Create {
        path: path.to_path_buf(),
        source,
    })
}

impl CgroupLimits {
    /// Creates the cgroups for `config` under a directory named after the VM.
    pub fn create(config: &LimitConfig, vcpus: usize, tag: &str) -> Result<Self, CgroupError> {
        let unified = Path::new("/sys/fs/cgroup");
        let v2 = fs::read_to_string(unified.join("cgroup.controllers"))
            .map(|c| c.split_whitespace().any(|x| x == "cpu"))
            .unwrap_or(false);
        let base = if v2 {
            unified.to_path_buf()
        } else {
            unified.join("cpu")
        };
        if !base
            .join(if v2 {
                "cgroup.subtree_control"
            } else {
                "cpu.cfs_quota_us"
            })
            .exists()
        {
            return Err(CgroupError::NoController {
                controllers: unified.join("cgroup.controllers"),
                v1: unified.join("cpu"),
            });
        }
        let root = base.join(format!("ppa-vmm-{tag}"));
        create_dir(&root)?;
        let mut me = CgroupLimits {
            groups: Vec::new(),
            v2,
            root: root.clone(),
        };
        if v2 {
            // Threads of one process in different cgroups need a threaded subtree.
            let _ = write(&root.join("cgroup.type"), "threaded");
            write(&root.join("cgroup.subtree_control"), "+cpu")?;
        }
        let vm_limit = config.vm.clone().unwrap_or((
            Limit {
                quota_ns: u64::MAX,
                period_ns: super::DEFAULT_PERIOD_NS,
            },
            "none".into(),
        ));
        me.set(&root, &vm_limit.0)?;
        if config.vm.is_some() {
            me.groups.push((
                VM_GROUP.into(),
                root.clone(),
                (0..vcpus).collect(),
                vm_limit.1.clone(),
                vm_limit.0,
            ));
        }
        for g in &config.groups {
            let dir = root.join(&g.name);
            create_dir(&dir)?;
            if v2 {
                let _ = write(&dir.join("cgroup.type"), "threaded");
            }
            me.set(&dir, &g.limit)?;
            me.groups.push((
                g.name.clone(),
                dir,
                g.vcpus.clone(),
                g.given.clone(),
                g.limit,
            ));
        }
        Ok(me)
    }

    fn set(&self, dir: &Path, l: &Limit) -> Result<(), CgroupError> {
        let period_us = l.period_ns / 1000;
        if self.v2 {
            let quota = if l.quota_ns == u64::MAX {
                "max".to_string()
            } else {
                (l.quota_ns / 1000).to_string()
            };
            write(&dir.join("cpu.max"), &format!("{quota} {period_us}"))
        } else {
            write(&dir.join("cpu.cfs_period_us"), &period_us.to_string())?;
            let quota = if l.quota_ns == u64::MAX {
                "-1".to_string()
            } else {
                (l.quota_ns / 1000).to_string()
            };
            write(&dir.join("cpu.cfs_quota_us"), &quota)
        }
    }

    /// Places vCPU `i`'s thread (`tids[i]`) in its group's cgroup, or the VM's.
    pub fn place(&self, tids: &[i32]) -> Result<(), CgroupError> {
        let file = if self.v2 { "cgroup.threads" } else { "tasks" };
        for (i, tid) in tids.iter().enumerate() {
            let dir = self
                .groups
                .iter()
                .find(|g| g.0 != VM_GROUP && g.2.contains(&i))
                .map_or(&self.root, |g| &g.1);
            write(&dir.join(file), &tid.to_string())?;
        }
        Ok(())
    }

    /// The `cpu.stat` of a limit's cgroup.
    pub fn cpu_stat(&self, name: &str) -> Option<CpuStat> {
        let g = self.groups.iter().find(|g| g.0 == name)?;
        fs::read_to_string(g.1.join("cpu.stat"))
            .ok()
            .map(|t| parse_cpu_stat(&t))
    }

    /// Each limit's figures; `used_ns` is the members' CPU time from `cpu_of`.
    pub fn groups(&self, cpu_of: impl Fn(usize) -> u64) -> Vec<GroupStats> {
        self.groups
            .iter()
            .map(|(name, _, members, given, l)| {
                let s = self.cpu_stat(name).unwrap_or_default();
                GroupStats {
                    name: name.clone(),
                    vcpus: members.clone(),
                    backend: LimitBackend::Cgroup,
                    limit: given.clone(),
                    quota_ns: l.quota_ns,
                    period_ns: l.period_ns,
                    periods: s.nr_periods,
                    periods_ns: s.nr_periods.saturating_mul(l.period_ns),
                    throttled_periods: s.nr_throttled,
                    used_ns: members.iter().map(|&i| cpu_of(i)).sum(),
                    limited_ns: s.throttled_ns,
                    overshoot_max_ns: 0,
                    overshoot: HistogramSnapshot::empty(3).to_json(),
                    kicks: LimitKicks {
                        path: LimitKick::Kernel,
                        timer: 0,
                        rearms: 0,
                        limiter: 0,
                        stages: None,
                    },
                }
            })
            .collect()
    }
}

impl Drop for CgroupLimits {
    fn drop(&mut self) {
        // Children first; a cgroup with threads left in it cannot be removed (they are gone
        // once the vCPU threads have exited).
        for (name, dir, ..) in self.groups.iter().rev() {
            if name != VM_GROUP {
                let _ = fs::remove_dir(dir);
            }
        }
        let _ = fs::remove_dir(&self.root);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_stat_of_both_versions() {
        let v1 = "nr_periods 20\nnr_throttled 19\nthrottled_time 1500000000\nnr_bursts 0\n";
        assert_eq!(
            parse_cpu_stat(v1),
            CpuStat {
                nr_periods: 20,
                nr_throttled: 19,
                throttled_ns: 1_500_000_000
            }
        );
        let v2 = "usage_usec 5\nnr_periods 3\nnr_throttled 1\nthrottled_usec 70\n";
        assert_eq!(parse_cpu_stat(v2).throttled_ns, 70_000);
        assert_eq!(
            parse_cpu_stat("garbage\nnr_periods x\n"),
            CpuStat::default()
        );
    }

    #[test]
    fn errors_name_the_file_and_keep_their_cause() {
        let dir = std::env::temp_dir().join(format!("ppa-cgroup-test-{}", std::process::id()));
        let e = write(&dir.join("missing").join("cpu.max"), "max 100000").unwrap_err();
        assert!(matches!(&e, CgroupError::Write { text, .. } if text == "max 100000"));
        assert!(
            e.to_string().starts_with("cannot write `max 100000` to "),
            "{e}"
        );
        assert!(e.to_string().ends_with("missing/cpu.max"), "{e}");
        let cause = std::error::Error::source(&e).expect("the I/O error is the source");
        assert_eq!(
            cause.downcast_ref::<io::Error>().map(io::Error::kind),
            Some(io::ErrorKind::NotFound)
        );
        std::fs::write(&dir, "a file, not a directory").unwrap();
        let e = create_dir(&dir.join("child")).unwrap_err();
        std::fs::remove_file(&dir).unwrap();
        assert!(matches!(e, CgroupError::Create { .. }), "{e}");
        assert!(std::error::Error::source(&e).is_some());
    }
}
