//! Placement of the VMM's threads on host CPUs (issue 36): `--pin KEY=CPUS` rules, the NUMA
//! node's CPUs for threads no rule names, and what each thread's CPU set is now.
//!
//! Data flow: the config gives `KEY=CPUS` strings; [`PinRule::parse`] turns each into a key
//! ([`PinKey`]: `vcpus`, `vcpuN`, a device id, one queue pair `DEV-qpN`, `service`) and a
//! [`CpuSet`] (the kernel's cpulist form); [`Placement::check`] refuses, before any vCPU runs,
//! a rule that names a vCPU or device the VM does not have or a CPU outside the process's
//! allowed set. Once every thread exists and before the start gate opens, the VM places each
//! one ([`Placement::cpus_for`]: the most specific rule for its [`ThreadRole`], else the NUMA
//! node's CPUs, else nothing) with `sched_setaffinity` on its thread id ([`set_affinity`]).
//! `set-pin` on the socket replaces one key's rule and places the threads it reaches at once.
//! Readers ask the kernel what a thread's set is ([`affinity_of`]) and where it last ran
//! ([`last_cpu`]): what `threads`, `stats` and the report show.

use std::collections::BTreeSet;
use std::fmt;
use std::io;

use thiserror::Error;

/// The highest CPU number a set may name (the kernel's `cpu_set_t` holds 1024).
pub const MAX_CPU: usize = libc::CPU_SETSIZE as usize - 1;

/// Why a placement was refused.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum PinError {
    /// Not `KEY=CPUS`.
    #[error("`{q}` is not a placement (use KEY=CPUS: KEY vcpus, vcpuN, a device id such as net0, one queue pair such as net0-qp1, or service; CPUS as the kernel writes CPU lists, e.g. 4 or 0-3,6)", q = ppa_vmm_api::clip(.0))]
    Syntax(String),
    /// A bad CPU list.
    #[error("`{q}` is not a list of CPUs (use the kernel's form: 4, 0-3 or 0-3,6, numbers up to {MAX_CPU})", q = ppa_vmm_api::clip(.0))]
    CpuList(String),
    /// A vCPU the VM does not have.
    #[error("`{q}` names vCPU {vcpu}, but the VM has {count} vCPU(s)", q = ppa_vmm_api::clip(.key))]
    NoSuchVcpu {
        /// The key as given.
        key: String,
        /// The vCPU.
        vcpu: usize,
        /// vCPUs of the VM.
        count: usize,
    },
    /// A device (or a queue pair) the VM does not have.
    #[error("`{q}` names no device or queue pair of this VM (it has {have})", q = ppa_vmm_api::clip(.key))]
    NoSuchDevice {
        /// The key as given.
        key: String,
        /// What the VM has, in words.
        have: String,
    },
    /// CPUs outside the process's allowed set.
    #[error("`{q}` names CPU(s) {outside} outside the CPUs this VMM may run on ({allowed}): the kernel would refuse them", q = ppa_vmm_api::clip(.rule))]
    NotAllowed {
        /// The rule as given.
        rule: String,
        /// The CPUs outside, as a list.
        outside: String,
        /// The allowed set, as a list.
        allowed: String,
    },
    /// A NUMA node that does not exist.
    #[error("there is no NUMA node {node} on this host (it has {have})")]
    NoSuchNode {
        /// The node asked.
        node: u32,
        /// The nodes there are.
        have: String,
    },
    /// A NUMA node none of whose CPUs the process may run on.
    #[error(
        "NUMA node {node} has no CPU this VMM may run on (its CPUs {cpus}, allowed {allowed})"
    )]
    NodeNotAllowed {
        /// The node.
        node: u32,
        /// Its CPUs.
        cpus: String,
        /// The allowed set.
        allowed: String,
    },
}

/// A set of host CPUs, in the kernel's cpulist form when printed (`0-3,6`).
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CpuSet(BTreeSet<usize>);

impl CpuSet {
    /// Parses the kernel's cpulist form: comma-separated numbers and ranges `A-B`.
    pub fn parse(s: &str) -> Result<CpuSet, PinError> {
        let bad = || PinError::CpuList(s.to_string());
        let mut set = BTreeSet::new();
        for part in s.trim().split(',') {
            let part = part.trim();
            let (a, b) = match part.split_once('-') {
                Some((a, b)) => (a.trim(), b.trim()),
                None => (part, part),
            };
            let (a, b): (usize, usize) =
                (a.parse().map_err(|_| bad())?, b.parse().map_err(|_| bad())?);
            if a > b || b > MAX_CPU {
                return Err(bad());
            }
            set.extend(a..=b);
        }
        if set.is_empty() {
            return Err(bad());
        }
        Ok(CpuSet(set))
    }

    /// A set of the given CPUs.
    pub fn of(cpus: impl IntoIterator<Item = usize>) -> CpuSet {
        CpuSet(cpus.into_iter().collect())
    }

    /// Whether the set holds `cpu`.
    pub fn contains(&self, cpu: usize) -> bool {
        self.0.contains(&cpu)
    }

    /// The CPUs, ascending.
    pub fn cpus(&self) -> impl Iterator<Item = usize> + '_ {
        self.0.iter().copied()
    }

    /// How many CPUs.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The CPUs of `self` not in `other`.
    pub fn minus(&self, other: &CpuSet) -> CpuSet {
        CpuSet(self.0.difference(&other.0).copied().collect())
    }

    /// The CPUs in both.
    pub fn and(&self, other: &CpuSet) -> CpuSet {
        CpuSet(self.0.intersection(&other.0).copied().collect())
    }
}

impl fmt::Display for CpuSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        let mut it = self.0.iter().copied().peekable();
        while let Some(a) = it.next() {
            let mut b = a;
            while it.peek() == Some(&(b + 1)) {
                b = it.next().unwrap_or(b);
            }
            if !first {
                f.write_str(",")?;
            }
            first = false;
            if a == b {
                write!(f, "{a}")?;
            } else {
                write!(f, "{a}-{b}")?;
            }
        }
        Ok(())
    }
}

/// What a rule names.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum PinKey {
    /// Every vCPU thread.
    Vcpus,
    /// One vCPU's thread.
    Vcpu(usize),
    /// Every thread of a device (its id: `net0`).
    Device(String),
    /// One queue pair's thread of a device (`net0-qp1`).
    QueuePair(String, usize),
    /// The service threads (main, signals, api, api-stats, sampler, limiter).
    Service,
}

impl PinKey {
    /// Parses a key; a device key is any other word (checked against the VM's devices by
    /// [`Placement::check`]).
    pub fn parse(s: &str) -> Option<PinKey> {
        let s = s.trim();
        match s {
            "" => None,
            "vcpus" => Some(PinKey::Vcpus),
            "service" => Some(PinKey::Service),
            _ => {
                if let Some(n) = s.strip_prefix("vcpu").and_then(|n| n.parse().ok()) {
                    return Some(PinKey::Vcpu(n));
                }
                if let Some((dev, pair)) = s.rsplit_once("-qp") {
                    let pair = pair.parse().ok()?;
                    return (!dev.is_empty()).then(|| PinKey::QueuePair(dev.to_string(), pair));
                }
                s.chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
                    .then(|| PinKey::Device(s.to_string()))
            }
        }
    }
}

impl fmt::Display for PinKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PinKey::Vcpus => f.write_str("vcpus"),
            PinKey::Vcpu(i) => write!(f, "vcpu{i}"),
            PinKey::Device(d) => f.write_str(d),
            PinKey::QueuePair(d, p) => write!(f, "{d}-qp{p}"),
            PinKey::Service => f.write_str("service"),
        }
    }
}

/// One `KEY=CPUS` rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PinRule {
    /// What it names.
    pub key: PinKey,
    /// Where those threads may run.
    pub cpus: CpuSet,
}

impl PinRule {
    /// Parses `KEY=CPUS`.
    pub fn parse(s: &str) -> Result<PinRule, PinError> {
        let (k, c) = s
            .split_once('=')
            .ok_or_else(|| PinError::Syntax(s.into()))?;
        let key = PinKey::parse(k).ok_or_else(|| PinError::Syntax(s.into()))?;
        Ok(PinRule {
            key,
            cpus: CpuSet::parse(c)?,
        })
    }
}

impl fmt::Display for PinRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}={}", self.key, self.cpus)
    }
}

/// What a thread of the VMM is, for placement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ThreadRole {
    /// vCPU `n`'s thread.
    Vcpu(usize),
    /// Queue pair `pair`'s thread of device `device`.
    QueuePair {
        /// The device id.
        device: String,
        /// The pair.
        pair: usize,
    },
    /// A service thread.
    Service,
}

/// The devices a VM has, for checking rules: (id, queue pairs).
pub type DeviceList<'a> = &'a [(String, usize)];

/// Where a VM's threads go: its rules (later ones replace earlier ones of the same key) and
/// the NUMA node whose CPUs hold the threads no rule names.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Placement {
    /// The rules.
    pub rules: Vec<PinRule>,
    /// The node's CPUs, with `--numa-node` (already checked against the allowed set).
    pub node_cpus: Option<CpuSet>,
}

impl Placement {
    /// Parses `KEY=CPUS` rules.
    pub fn parse(rules: &[String]) -> Result<Placement, PinError> {
        let mut p = Placement::default();
        for r in rules {
            p.set(PinRule::parse(r)?);
        }
        Ok(p)
    }

    /// Sets a rule, replacing one of the same key.
    pub fn set(&mut self, rule: PinRule) {
        self.rules.retain(|r| r.key != rule.key);
        self.rules.push(rule);
    }

    /// Refuses a rule naming a vCPU or device the VM lacks, or a CPU outside `allowed`.
    pub fn check(
        &self,
        vcpus: usize,
        devices: DeviceList<'_>,
        allowed: &CpuSet,
    ) -> Result<(), PinError> {
        for r in &self.rules {
            check_rule(r, vcpus, devices, allowed)?;
        }
        Ok(())
    }

    /// The CPUs for a thread of role `role`: the most specific rule (a vCPU's own before
    /// `vcpus`, a queue pair's before its device's), else the node's CPUs, else None (the
    /// thread keeps what it inherited).
    pub fn cpus_for(&self, role: &ThreadRole) -> Option<CpuSet> {
        let find = |k: &PinKey| {
            self.rules
                .iter()
                .find(|r| &r.key == k)
                .map(|r| r.cpus.clone())
        };
        let ruled = match role {
            ThreadRole::Vcpu(i) => find(&PinKey::Vcpu(*i)).or_else(|| find(&PinKey::Vcpus)),
            ThreadRole::QueuePair { device, pair } => {
                find(&PinKey::QueuePair(device.clone(), *pair))
                    .or_else(|| find(&PinKey::Device(device.clone())))
            }
            ThreadRole::Service => find(&PinKey::Service),
        };
        ruled.or_else(|| self.node_cpus.clone())
    }

    /// The rules as given (`KEY=CPUS`), for the report.
    pub fn texts(&self) -> Vec<String> {
        self.rules.iter().map(ToString::to_string).collect()
    }
}

/// [`Placement::check`] of one rule.
pub fn check_rule(
    r: &PinRule,
    vcpus: usize,
    devices: DeviceList<'_>,
    allowed: &CpuSet,
) -> Result<(), PinError> {
    let text = r.to_string();
    match &r.key {
        PinKey::Vcpu(i) if *i >= vcpus => {
            return Err(PinError::NoSuchVcpu {
                key: r.key.to_string(),
                vcpu: *i,
                count: vcpus,
            })
        }
        PinKey::Device(d) if !devices.iter().any(|(id, _)| id == d) => {
            return Err(no_device(&r.key, devices))
        }
        PinKey::QueuePair(d, p) if !devices.iter().any(|(id, n)| id == d && p < n) => {
            return Err(no_device(&r.key, devices))
        }
        _ => {}
    }
    let outside = r.cpus.minus(allowed);
    if !outside.is_empty() {
        return Err(PinError::NotAllowed {
            rule: text,
            outside: outside.to_string(),
            allowed: allowed.to_string(),
        });
    }
    Ok(())
}

fn no_device(key: &PinKey, devices: DeviceList<'_>) -> PinError {
    let have = if devices.is_empty() {
        "no device".to_string()
    } else {
        devices
            .iter()
            .map(|(id, n)| {
                format!(
                    "{id} with queue pairs {id}-qp0 to {id}-qp{}",
                    n.saturating_sub(1)
                )
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    PinError::NoSuchDevice {
        key: key.to_string(),
        have,
    }
}

/// The CPUs of NUMA node `node` that `allowed` holds, read from
/// `/sys/devices/system/node/nodeN/cpulist`.
pub fn node_cpus(node: u32, allowed: &CpuSet) -> Result<CpuSet, PinError> {
    let text = std::fs::read_to_string(format!("/sys/devices/system/node/node{node}/cpulist"));
    let Ok(text) = text else {
        let have = std::fs::read_to_string("/sys/devices/system/node/online")
            .map(|s| format!("nodes {}", s.trim()))
            .unwrap_or_else(|_| "no NUMA information".into());
        return Err(PinError::NoSuchNode { node, have });
    };
    let cpus = if text.trim().is_empty() {
        CpuSet::default()
    } else {
        CpuSet::parse(&text).unwrap_or_default()
    };
    let usable = cpus.and(allowed);
    if usable.is_empty() {
        return Err(PinError::NodeNotAllowed {
            node,
            cpus: cpus.to_string(),
            allowed: allowed.to_string(),
        });
    }
    Ok(usable)
}

/// A VM's placement while it runs: its rules (which `set-pin` changes), what they are
/// checked against, and the service threads found when the threads were placed. Readers and
/// the `api` thread take its lock for a few operations; no vCPU or device thread does.
#[derive(Debug)]
pub struct PlacementBoard {
    placement: std::sync::Mutex<Placement>,
    /// The CPUs the process could run on when the VM was built: what a rule is checked
    /// against, and what a thread no rule names gets.
    pub original: CpuSet,
    vcpus: usize,
    devices: Vec<(String, usize)>,
    service: std::sync::Mutex<Vec<(i32, String)>>,
}

impl PlacementBoard {
    /// The board of a VM of `vcpus` vCPUs and `devices`, with `placement` already checked.
    pub fn new(
        placement: Placement,
        original: CpuSet,
        vcpus: usize,
        devices: Vec<(String, usize)>,
    ) -> Self {
        PlacementBoard {
            placement: std::sync::Mutex::new(placement),
            original,
            vcpus,
            devices,
            service: std::sync::Mutex::new(Vec::new()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Placement> {
        self.placement.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The rules now.
    pub fn placement(&self) -> Placement {
        self.lock().clone()
    }

    /// The set a thread of `role` gets: its rule's, else the node's, else the original.
    pub fn cpus_for(&self, role: &ThreadRole) -> CpuSet {
        self.lock()
            .cpus_for(role)
            .unwrap_or_else(|| self.original.clone())
    }

    /// Checks `rule` against the VM and sets it (`set-pin`).
    pub fn set(&self, rule: PinRule) -> Result<(), PinError> {
        check_rule(&rule, self.vcpus, &self.devices, &self.original)?;
        self.lock().set(rule);
        Ok(())
    }

    /// The calling thread is a service thread of this VM called `name`: it is remembered (for
    /// `threads` and `set-pin`) and moved to the service threads' CPUs at once, before it
    /// does its work. Best effort: a set the kernel refuses leaves it where it is.
    pub fn register_current(&self, name: &str) {
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::gettid() };
        self.register(tid, name);
        let _ = set_affinity(0, &self.cpus_for(&ThreadRole::Service));
    }

    /// Remembers thread `tid` as a service thread called `name` (once).
    pub fn register(&self, tid: i32, name: &str) {
        let mut s = self.service.lock().unwrap_or_else(|e| e.into_inner());
        if !s.iter().any(|(t, _)| *t == tid) {
            s.push((tid, name.to_string()));
        }
    }

    /// The service threads registered.
    pub fn service(&self) -> Vec<(i32, String)> {
        self.service
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

/// The CPUs the calling thread may run on.
pub fn allowed() -> CpuSet {
    CpuSet::of(crate::sched::allowed_cpus())
}

/// Sets thread `tid`'s CPU set (0: the calling thread).
pub fn set_affinity(tid: i32, cpus: &CpuSet) -> io::Result<()> {
    // SAFETY: cpu_set_t is plain data; all zeroes is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for c in cpus.cpus().filter(|&c| c <= MAX_CPU) {
        // SAFETY: `c` is below CPU_SETSIZE; CPU_SET writes the set.
        unsafe { libc::CPU_SET(c, &mut set) };
    }
    // SAFETY: `set` is valid for its size; the kernel reads it and checks `tid`.
    let rc = unsafe { libc::sched_setaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &set) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Thread `tid`'s CPU set now (0: the calling thread).
pub fn affinity_of(tid: i32) -> io::Result<CpuSet> {
    // SAFETY: cpu_set_t is plain data; all zeroes is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is valid for its size; the kernel writes at most that much.
    let rc =
        unsafe { libc::sched_getaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(CpuSet::of(
        // SAFETY: `i` is below CPU_SETSIZE; CPU_ISSET reads the set.
        (0..=MAX_CPU).filter(|&i| unsafe { libc::CPU_ISSET(i, &set) }),
    ))
}

/// The CPU thread `tid` of this process last ran on: field 39 (`processor`) of
/// `/proc/self/task/TID/stat`.
pub fn last_cpu(tid: i32) -> Option<u32> {
    let text = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).ok()?;
    processor_of_stat(&text)
}

/// Field 39 of a `stat` line: after the command in parentheses (which may hold spaces and
/// parentheses), the 37th field.
pub fn processor_of_stat(stat: &str) -> Option<u32> {
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(36)?.parse().ok()
}

/// Every thread of this process: (tid, name), from `/proc/self/task`.
pub fn process_threads() -> Vec<(i32, String)> {
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| {
            let tid: i32 = e.file_name().to_str()?.parse().ok()?;
            let name = std::fs::read_to_string(e.path().join("comm")).ok()?;
            Some((tid, name.trim_end().to_string()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_parse_and_print_as_the_kernel_writes_them() {
        assert_eq!(CpuSet::parse("4").unwrap(), CpuSet::of([4]));
        let s = CpuSet::parse("0-3,6").unwrap();
        assert_eq!(s, CpuSet::of([0, 1, 2, 3, 6]));
        assert_eq!(s.to_string(), "0-3,6");
        assert_eq!(CpuSet::parse(" 6, 0-1 ,2").unwrap().to_string(), "0-2,6");
        assert_eq!(CpuSet::of([1, 3, 5]).to_string(), "1,3,5");
        for bad in ["", "a", "3-1", "1-", ",", "2000", "0-1024", "-1"] {
            assert!(
                matches!(CpuSet::parse(bad), Err(PinError::CpuList(_))),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn keys_parse() {
        for (s, k) in [
            ("vcpus", PinKey::Vcpus),
            ("vcpu12", PinKey::Vcpu(12)),
            ("net0", PinKey::Device("net0".into())),
            ("net0-qp1", PinKey::QueuePair("net0".into(), 1)),
            ("service", PinKey::Service),
        ] {
            assert_eq!(PinKey::parse(s), Some(k.clone()), "{s}");
            assert_eq!(k.to_string(), s);
        }
        for bad in ["", "-qp1", "net0-qpx", "a b", "net0=1"] {
            assert_eq!(PinKey::parse(bad), None, "{bad:?}");
        }
        assert!(matches!(PinRule::parse("vcpus"), Err(PinError::Syntax(_))));
        assert!(matches!(
            PinRule::parse("vcpus=x"),
            Err(PinError::CpuList(_))
        ));
    }

    #[test]
    fn the_most_specific_rule_wins_and_the_node_takes_the_rest() {
        let mut p = Placement::parse(&[
            "vcpus=1".into(),
            "vcpu2=0".into(),
            "net0=0-1".into(),
            "net0-qp1=1".into(),
        ])
        .unwrap();
        assert_eq!(p.cpus_for(&ThreadRole::Vcpu(0)), Some(CpuSet::of([1])));
        assert_eq!(p.cpus_for(&ThreadRole::Vcpu(2)), Some(CpuSet::of([0])));
        let qp = |pair| ThreadRole::QueuePair {
            device: "net0".into(),
            pair,
        };
        assert_eq!(p.cpus_for(&qp(0)), Some(CpuSet::of([0, 1])));
        assert_eq!(p.cpus_for(&qp(1)), Some(CpuSet::of([1])));
        assert_eq!(p.cpus_for(&ThreadRole::Service), None, "no rule: inherited");
        p.node_cpus = Some(CpuSet::of([0, 1]));
        assert_eq!(p.cpus_for(&ThreadRole::Service), Some(CpuSet::of([0, 1])));
        // A later rule of the same key replaces the earlier.
        p.set(PinRule::parse("vcpus=0").unwrap());
        assert_eq!(p.cpus_for(&ThreadRole::Vcpu(0)), Some(CpuSet::of([0])));
        assert_eq!(p.rules.len(), 4);
    }

    #[test]
    fn rules_outside_the_vm_or_the_allowed_cpus_are_refused() {
        let allowed = CpuSet::of([0, 1]);
        let devices = [("net0".to_string(), 2)];
        let check = |r: &str| {
            Placement::parse(&[r.into()])
                .unwrap()
                .check(2, &devices, &allowed)
        };
        assert!(check("vcpus=0-1").is_ok());
        assert!(check("net0-qp1=0").is_ok());
        let e = check("vcpu2=0").unwrap_err();
        assert!(
            matches!(
                e,
                PinError::NoSuchVcpu {
                    vcpu: 2,
                    count: 2,
                    ..
                }
            ),
            "{e}"
        );
        let e = check("net1=0").unwrap_err();
        assert!(
            e.to_string()
                .contains("net0 with queue pairs net0-qp0 to net0-qp1"),
            "{e}"
        );
        assert!(matches!(
            check("net0-qp2=0"),
            Err(PinError::NoSuchDevice { .. })
        ));
        let e = check("vcpus=1-3").unwrap_err();
        assert_eq!(
            e.to_string(),
            "`vcpus=1-3` names CPU(s) 2-3 outside the CPUs this VMM may run on (0-1): the kernel would refuse them"
        );
    }

    #[test]
    fn the_processor_field_is_found_after_a_command_with_spaces() {
        let line = "42 (a (b) c) S 1 1 1 0 -1 4194560 10 0 0 0 1 2 0 0 20 0 1 0 100 1000 200 \
                    18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 3 0 0 0 0 0";
        assert_eq!(processor_of_stat(line), Some(3));
        assert_eq!(processor_of_stat("garbage"), None);
    }

    #[test]
    fn this_thread_can_read_and_set_its_own_set() {
        let now = affinity_of(0).unwrap();
        assert!(!now.is_empty());
        let one = CpuSet::of([now.cpus().next().unwrap()]);
        let t = std::thread::spawn(move || {
            set_affinity(0, &one).unwrap();
            let got = affinity_of(0).unwrap();
            (got, one)
        });
        let (got, one) = t.join().unwrap();
        assert_eq!(got, one);
        assert!(process_threads().iter().any(|(_, n)| !n.is_empty()));
    }
}
