//! The `cgroup` limit backend (`--limit-backend cgroup`), for comparison with the VMM's own
//! enforcement: the kernel's CFS bandwidth control, as Firecracker's jailer and libvirt use.
//!
//! Data flow: [`CgroupLimits::create`] makes one cgroup per limit under the cpu controller
//! (v2 `cpu.max` where the cpu controller is enabled in the unified hierarchy, else v1
//! `cpu.cfs_quota_us`/`cpu.cfs_period_us`), in `ppa-vmm-PID-N` under the process's own
//! cgroup ([`cgroup_place`]: under a systemd unit with `Delegate=yes`, the unit's), with three
//! leaves (issue 36): `vcpus/` (each vCPU group a child of it), `devices/` and `service/`.
//! The VM's limit is the quota of `vcpus/` (scope `vcpus`) or of the VM's cgroup (scope `vm`),
//! each group's its own, so all hold and a quota on the vCPUs never holds a device thread.
//! `Vm::run` calls [`CgroupLimits::place`] with every thread's id after they exist and before
//! the start gate opens, so no guest code runs outside them.
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
    /// This process's cgroup does not offer the cpu controller to cgroups under it.
    #[error(
        "the cgroup backend makes its cgroups under this process's own cgroup, {}, which does \
         not offer the cpu controller: run the VMM in a cgroup delegated to it (systemd: \
         Delegate=yes, as dist/systemd/ppa-vmm@.service has it) or one with cpu enabled",
        .parent.display()
    )]
    NotDelegated {
        /// The process's cgroup.
        parent: PathBuf,
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
    /// The process's own cgroup (threads go back to it at the end).
    parent: PathBuf,
    /// What the VM's limit covers.
    scope: super::Scope,
}

/// The leaves of a VM's cgroup.
pub const LEAVES: [&str; 3] = ["vcpus", "devices", "service"];

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

/// Where a VM's cgroups go: `ppa-vmm-TAG` under this process's own cgroup in the cpu
/// hierarchy, as `/proc/self/cgroup` (`proc_self_cgroup`) names it: with cgroup v2 (`v2`) the
/// `0::PATH` line, under /sys/fs/cgroup; with v1 the line whose controllers include `cpu`,
/// under /sys/fs/cgroup/cpu. A unit with `Delegate=yes` (dist/systemd/ppa-vmm@.service) is
/// given its own cgroup to manage, and the VMM runs in it: its cgroups go under the unit's,
/// `/sys/fs/cgroup/system.slice/ppa-vmm@web.service/ppa-vmm-PID-0` (v2). Elsewhere that is the
/// cgroup the VMM was started in (a shell's session, `/` in a container). With v2 it could be
/// nowhere else: a process's threads may only move within its own threaded subtree. `None`:
/// no such line, or a path that would leave the hierarchy.
pub fn cgroup_place(proc_self_cgroup: &str, v2: bool, tag: &str) -> Option<PathBuf> {
    let own = proc_self_cgroup.lines().find_map(|l| {
        let mut f = l.splitn(3, ':');
        let (_id, controllers, path) = (f.next()?, f.next()?, f.next()?);
        let ours = if v2 {
            controllers.is_empty()
        } else {
            controllers.split(',').any(|c| c == "cpu")
        };
        ours.then_some(path)
    })?;
    let base = if v2 {
        PathBuf::from(CGROUP_ROOT)
    } else {
        Path::new(CGROUP_ROOT).join("cpu")
    };
    // The path is absolute within the hierarchy; `..` or `.` would leave it.
    let rel = Path::new(own.trim_start_matches('/'));
    if rel
        .components()
        .any(|c| !matches!(c, std::path::Component::Normal(_)))
    {
        return None;
    }
    Some(base.join(rel).join(format!("ppa-vmm-{tag}")))
}

/// Where the cgroup file systems are mounted.
const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// Adds `+cpu` to `dir`'s `cgroup.subtree_control` unless it is there (v2: what makes the
/// cpu controller's files appear in its children).
fn enable_cpu(dir: &Path) -> Result<(), CgroupError> {
    let file = dir.join("cgroup.subtree_control");
    let on = fs::read_to_string(&file)
        .map(|c| c.split_whitespace().any(|x| x == "cpu"))
        .unwrap_or(false);
    if on {
        return Ok(());
    }
    write(&file, "+cpu")
}

impl CgroupLimits {
    /// Creates the cgroups for `config` in `ppa-vmm-TAG` under this process's own cgroup of
    /// the cpu hierarchy ([`cgroup_place`]): the VM's cgroup with three leaves, `vcpus/` (the
    /// vCPU threads, each vCPU group a child of it), `devices/` (the device threads) and
    /// `service/` (every other thread), so that a quota on the vCPUs never holds a device or
    /// service thread. The VM's limit is the quota of `vcpus/` (scope `vcpus`) or of the VM's
    /// cgroup (scope `vm`: devices and service too).
    pub fn create(config: &LimitConfig, vcpus: usize, tag: &str) -> Result<Self, CgroupError> {
        let unified = Path::new(CGROUP_ROOT);
        let v2 = fs::read_to_string(unified.join("cgroup.controllers"))
            .map(|c| c.split_whitespace().any(|x| x == "cpu"))
            .unwrap_or(false);
        let no_controller = || CgroupError::NoController {
            controllers: unified.join("cgroup.controllers"),
            v1: unified.join("cpu"),
        };
        let own = fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
        let root = cgroup_place(&own, v2, tag).ok_or_else(no_controller)?;
        let parent = root.parent().ok_or_else(no_controller)?.to_path_buf();
        let available = if v2 {
            fs::read_to_string(parent.join("cgroup.controllers"))
                .is_ok_and(|c| c.split_whitespace().any(|x| x == "cpu"))
        } else {
            parent.join("cpu.cfs_quota_us").exists()
        };
        if !available {
            return Err(CgroupError::NotDelegated { parent });
        }
        create_dir(&root)?;
        let mut me = CgroupLimits {
            groups: Vec::new(),
            v2,
            root: root.clone(),
            parent: parent.clone(),
            scope: config.vm_scope,
        };
        if v2 {
            // Threads of one process in different cgroups need a threaded subtree: ours, under
            // the process's cgroup (which becomes its threaded domain), with the cpu
            // controller on for it and in it.
            write(&root.join("cgroup.type"), "threaded")?;
            enable_cpu(&parent)?;
            enable_cpu(&root)?;
        }
        for leaf in LEAVES {
            me.make(&root.join(leaf))?;
        }
        let vcpus_dir = root.join("vcpus");
        if v2 && !config.groups.is_empty() {
            enable_cpu(&vcpus_dir)?;
        }
        let unlimited = Limit {
            quota_ns: u64::MAX,
            period_ns: super::DEFAULT_PERIOD_NS,
        };
        let vm_dir = match config.vm_scope {
            super::Scope::Vm => &root,
            super::Scope::Vcpus => &vcpus_dir,
        };
        me.set(&root, &unlimited)?;
        me.set(&vcpus_dir, &unlimited)?;
        if let Some((l, given)) = &config.vm {
            me.set(vm_dir, l)?;
            me.groups.push((
                VM_GROUP.into(),
                vm_dir.clone(),
                (0..vcpus).collect(),
                given.clone(),
                *l,
            ));
        }
        for g in &config.groups {
            let dir = vcpus_dir.join(&g.name);
            me.make(&dir)?;
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

    /// Makes a cgroup under the VM's (threaded with v2).
    fn make(&self, dir: &Path) -> Result<(), CgroupError> {
        create_dir(dir)?;
        if self.v2 {
            write(&dir.join("cgroup.type"), "threaded")?;
        }
        Ok(())
    }

    /// The file a thread's id is written to, to move it into a cgroup.
    fn threads_file(&self) -> &'static str {
        if self.v2 {
            "cgroup.threads"
        } else {
            "tasks"
        }
    }

    /// Where the VM's cgroup is: its directory.
    pub fn root(&self) -> &Path {
        &self.root
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

    /// Places vCPU `i`'s thread (`vcpus[i]`) in its group's cgroup under `vcpus/`, or in
    /// `vcpus/`; the device threads in `devices/`, the others (`service`) in `service/`.
    pub fn place(
        &self,
        vcpus: &[i32],
        devices: &[i32],
        service: &[i32],
    ) -> Result<(), CgroupError> {
        let file = self.threads_file();
        let vcpus_dir = self.root.join("vcpus");
        for (i, tid) in vcpus.iter().enumerate() {
            let dir = self
                .groups
                .iter()
                .find(|g| g.0 != VM_GROUP && g.2.contains(&i))
                .map_or(&vcpus_dir, |g| &g.1);
            write(&dir.join(file), &tid.to_string())?;
        }
        for (leaf, tids) in [("devices", devices), ("service", service)] {
            for tid in tids {
                match write(&self.root.join(leaf).join(file), &tid.to_string()) {
                    // A service thread that ended meanwhile is no error.
                    Err(CgroupError::Write { source, .. })
                        if source.raw_os_error() == Some(libc::ESRCH) => {}
                    // A real-time service thread (`api-stats` runs SCHED_FIFO) is refused by a
                    // cgroup v1 cpu group without RT runtime (`cpu.rt_runtime_us` 0): it stays
                    // in the process's cgroup, outside the VM's quota (its CPU is bounded by
                    // its own budget, 0.5 % of a CPU).
                    Err(CgroupError::Write { source, .. })
                        if leaf == "service" && source.raw_os_error() == Some(libc::EINVAL) => {}
                    r => r?,
                }
            }
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
                    stops: Default::default(),
                    scope: if name == VM_GROUP {
                        self.scope
                    } else {
                        Default::default()
                    },
                    devices_ns: 0,
                    devices_limited_ns: 0,
                    device_holds: 0,
                    limited_ns: s.throttled_ns,
                    turn_periods: 0,
                    straddled_periods: 0,
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
        // The threads still in the VM's cgroups (the service threads, the main thread among
        // them) go back to the process's cgroup; then children first (a cgroup with threads
        // in it cannot be removed; the vCPU and device threads have exited).
        let file = self.threads_file();
        let mut dirs: Vec<PathBuf> = self
            .groups
            .iter()
            .filter(|g| g.0 != VM_GROUP)
            .map(|g| g.1.clone())
            .collect();
        dirs.extend(LEAVES.iter().map(|l| self.root.join(l)));
        dirs.push(self.root.clone());
        for dir in &dirs {
            let tids = fs::read_to_string(dir.join(file)).unwrap_or_default();
            for tid in tids.split_whitespace() {
                let _ = fs::write(self.parent.join(file), tid);
            }
            let _ = fs::remove_dir(dir);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 39, item 9: the unit says `Delegate=yes` gives the backend cgroups under the
    /// unit's own; a run put them at /sys/fs/cgroup/cpu/ppa-vmm-PID-0, the hierarchy's root.
    /// They go under the process's own cgroup, which is the unit's when systemd runs it.
    #[test]
    fn the_cgroups_go_under_the_processs_own_cgroup_the_units_under_systemd() {
        let unit_v2 = "0::/system.slice/ppa-vmm@web.service\n";
        assert_eq!(
            cgroup_place(unit_v2, true, "42-0"),
            Some(PathBuf::from(
                "/sys/fs/cgroup/system.slice/ppa-vmm@web.service/ppa-vmm-42-0"
            ))
        );
        // v1 (or hybrid): the cpu hierarchy's line, whichever controllers share it; not
        // cpuset's or cpuacct's alone.
        let unit_v1 = "12:cpuset:/\n4:cpuacct:/other\n3:cpu,cpuacct:/system.slice/ppa-vmm@web.service\n\
                       1:name=systemd:/system.slice/ppa-vmm@web.service\n0::/system.slice/ppa-vmm@web.service\n";
        assert_eq!(
            cgroup_place(unit_v1, false, "42-0"),
            Some(PathBuf::from(
                "/sys/fs/cgroup/cpu/system.slice/ppa-vmm@web.service/ppa-vmm-42-0"
            ))
        );
        // At the hierarchy's root (a container, this development host): directly under it.
        assert_eq!(
            cgroup_place("1:cpu:/\n0::/\n", false, "7-1"),
            Some(PathBuf::from("/sys/fs/cgroup/cpu/ppa-vmm-7-1"))
        );
        assert_eq!(
            cgroup_place("0::/\n", true, "7-1"),
            Some(PathBuf::from("/sys/fs/cgroup/ppa-vmm-7-1"))
        );
        // No cpu hierarchy, or a path that would leave it.
        assert_eq!(
            cgroup_place("4:cpuacct:/\n3:cpuset:/\n", false, "1-0"),
            None
        );
        assert_eq!(cgroup_place("1:cpu:/\n", true, "1-0"), None);
        assert_eq!(cgroup_place("0::/../etc\n", true, "1-0"), None);
    }

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
