//! CPU limits (spec section 5, docs/limits.md): the syntax of limits and vCPU groups, their
//! checks, and the enforcement that the `limiter` thread runs.
//!
//! Data flow: the command line, the config file and the socket's `set-limit` give strings
//! (`150%`, `15ms/10ms`, `dataplane:0-1:50%`); [`Limit::parse`] and [`GroupSpec::parse`]
//! turn them into quota/period pairs and member lists, and [`check_groups`] refuses groups
//! that overlap, repeat a name, name a missing vCPU or ask for more than their members can
//! use. [`engine`] decides, from the members' CPU times, which members must stop and when to
//! look again; [`limiter`] is the thread that reads the clocks, kicks and releases vCPUs and
//! publishes each group's figures.

use std::collections::{BTreeMap, BTreeSet};

use thiserror::Error;

pub mod cgroup;
pub mod engine;
pub mod limiter;
pub mod margin;
pub mod member_kicks;
pub mod overload;
pub mod turns;

/// Shortest period accepted.
pub const MIN_PERIOD_NS: u64 = 1_000_000;
/// Smallest quota accepted. Each period a busy member is stopped and restarted, which costs
/// the VMM ~100-200 µs of CPU here (outside the quota: docs/limits.md, "What a stop costs, and
/// who pays it") and the guest what the stop's spin and the re-entry take, and a share of a
/// few tens of µs would mostly go to the stop's inexactness (measured in docs/limits.md).
/// Members that share a quota too small to give each 1 ms take turns ([`turns`]), so a
/// member that runs gets at least this much.
pub const MIN_QUOTA_NS: u64 = 250_000;
/// Largest duration (quota or period) a limit may spell, ns: beyond it the value is refused as
/// too large rather than rounded or wrapped.
pub const MAX_DURATION_NS: u64 = 1_000_000_000_000_000;
/// Longest period accepted.
pub const MAX_PERIOD_NS: u64 = 1_000_000_000;
/// Period of a limit given as a percentage.
pub const DEFAULT_PERIOD_NS: u64 = 100_000_000;
/// Name of the VM-wide limit where groups are named (`set-limit group=vm`).
pub const VM_GROUP: &str = "vm";

/// Why a limit or a group was refused.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum LimitError {
    /// Not `N%` nor `QUOTA/PERIOD`.
    #[error("`{q}` is not a CPU limit (use N% of one CPU, e.g. 50%, or QUOTA/PERIOD with units ns, us, ms or s, e.g. 15ms/10ms)", q = ppa_vmm_api::clip(.0))]
    Syntax(String),
    /// A quota of zero.
    #[error("the CPU limit `{q}` gives no CPU time at all; a limit must be above zero", q = ppa_vmm_api::clip(.0))]
    Zero(String),
    /// A period out of range.
    #[error("the period of `{q}` must be between 1 ms and 1 s", q = ppa_vmm_api::clip(.0))]
    Period(String),
    /// A quota above zero but below what the limiter can enforce for one member.
    #[error("the quota of `{q}` is below the smallest the VMM holds, {min} us per period (below it, stopping a vCPU each period takes about half of what the quota gives the guest; vCPUs that share a quota take turns)", q = ppa_vmm_api::clip(.0), min = MIN_QUOTA_NS / 1_000)]
    QuotaTooSmall(String),
    /// A number too large to be a duration or a percentage.
    #[error("the CPU limit `{q}` is too large: its numbers overflow (a quota or period is at most 1000000 s, a percentage at most 1000000000%)", q = ppa_vmm_api::clip(.0))]
    Overflow(String),
    /// More than the members can use.
    #[error("the CPU limit `{qlimit}` is more than {members} vCPU(s) can use ({max}%)", qlimit = ppa_vmm_api::clip(.limit))]
    OverMembers {
        /// The limit as given.
        limit: String,
        /// Members.
        members: usize,
        /// The most they can use, percent of one CPU.
        max: usize,
    },
    /// A group spec that is not NAME:VCPUS:LIMIT.
    #[error("`{q}` is not a vCPU group (use NAME:VCPUS:LIMIT, e.g. dataplane:0-1:50%)", q = ppa_vmm_api::clip(.0))]
    GroupSyntax(String),
    /// A bad group name.
    #[error("`{q}` cannot name a group (1 to 32 letters, digits, `-` or `_`; `vm` is the VM's own limit)", q = ppa_vmm_api::clip(.0))]
    GroupName(String),
    /// A bad vCPU list.
    #[error("`{q}` is not a list of vCPUs (use e.g. 0-3 or 0,2,5)", q = ppa_vmm_api::clip(.0))]
    Vcpus(String),
    /// A vCPU that does not exist.
    #[error("group `{qgroup}` names vCPU {vcpu}, but the VM has {count} vCPU(s)", qgroup = ppa_vmm_api::clip(.group))]
    NoSuchVcpu {
        /// The group.
        group: String,
        /// The vCPU.
        vcpu: usize,
        /// vCPUs of the VM.
        count: usize,
    },
    /// A vCPU in two groups.
    #[error("vCPU {vcpu} is in both group `{qfirst}` and group `{qsecond}`; a vCPU is in at most one group", qfirst = ppa_vmm_api::clip(.first), qsecond = ppa_vmm_api::clip(.second))]
    TwoGroups {
        /// The vCPU.
        vcpu: usize,
        /// One group.
        first: String,
        /// The other.
        second: String,
    },
    /// Two groups of one name.
    #[error("there are two groups named `{q}`", q = ppa_vmm_api::clip(.0))]
    Duplicate(String),
    /// No such group (socket).
    #[error("there is no group `{q}`", q = ppa_vmm_api::clip(.0))]
    NoSuchGroup(String),
    /// Run-time changes under the cgroup backend.
    #[error("limits cannot be changed at run time with the cgroup backend")]
    Backend,
    /// A scope that is not `vcpus` or `vm`, or one given to a vCPU group.
    #[error("`{q}` is not a scope of the VM's limit (scope=vcpus, the default, or scope=vm: the device threads too; a vCPU group's limit covers its vCPUs only)", q = ppa_vmm_api::clip(.0))]
    Scope(String),
    /// A bad runaway threshold.
    #[error("`{q}` is not a runaway threshold (milliseconds, 1 to 3600000)", q = ppa_vmm_api::clip(.0))]
    Runaway(String),
    /// A bad overload spec.
    #[error("`{q}` is not an overload rule (PCT:WINDOWS, e.g. 90:5: above 90 % of the time for 5 windows of 100 ms)", q = ppa_vmm_api::clip(.0))]
    Overload(String),
    /// A bad action.
    #[error("`{q}` is not an overload action (notify, pause or throttle:LIMIT)", q = ppa_vmm_api::clip(.0))]
    Action(String),
}

/// Who enforces the limits: the VMM itself ([`limiter`]), or the kernel's CFS bandwidth
/// control through cgroups ([`cgroup`]).
pub use ppa_vmm_api::LimitBackend as Backend;
/// What the VM's limit covers.
pub use ppa_vmm_api::LimitScope as Scope;

/// Parses the VM's limit: `LIMIT` or `LIMIT,scope=vcpus|vm` (`--cpu-limit`, `set-limit
/// group=vm`).
pub fn parse_vm_limit(s: &str) -> Result<(Limit, Scope), LimitError> {
    let (limit, scope) = match s.split_once(',') {
        None => (s, Scope::Vcpus),
        Some((l, rest)) => {
            let scope = match rest.trim() {
                "scope=vcpus" => Scope::Vcpus,
                "scope=vm" => Scope::Vm,
                _ => return Err(LimitError::Scope(rest.to_string())),
            };
            (l, scope)
        }
    };
    Ok((Limit::parse(limit)?, scope))
}

/// How the VMM backend stops a member that must stop (`--limit-kick`).
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    serde::Deserialize,
    clap::ValueEnum,
    schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum KickMode {
    /// Each vCPU's kick timer, armed by the vCPU thread for the CPU its runway allows and
    /// fired by the kernel; the limiter thread keeps the books and kicks when a timer is late.
    #[default]
    Timer,
    /// The limiter thread's kicks alone, at its looks.
    Limiter,
}

/// The limits of a VM at start.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LimitConfig {
    /// The VM-wide limit and its text.
    pub vm: Option<(Limit, String)>,
    /// What the VM-wide limit covers.
    pub vm_scope: Scope,
    /// The vCPU groups.
    pub groups: Vec<GroupSpec>,
    /// Who enforces them.
    pub backend: Backend,
    /// How the VMM backend stops members.
    pub kick: KickMode,
}

/// A CPU budget: `quota_ns` of CPU time per `period_ns` of wall time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Limit {
    /// CPU time per period.
    pub quota_ns: u64,
    /// Period length.
    pub period_ns: u64,
}

/// A duration with a unit (`15ms`, `2.5us`), in ns; `Err(true)` when it is well formed but
/// larger than [`MAX_DURATION_NS`], `Err(false)` when it is not a duration.
fn duration_ns(s: &str) -> Result<u64, bool> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .ok_or(false)?;
    let (num, unit) = s.split_at(split);
    let scale = match unit {
        "ns" => 1.0,
        "us" | "µs" => 1e3,
        "ms" => 1e6,
        "s" => 1e9,
        _ => return Err(false),
    };
    let v: f64 = num.parse().map_err(|_| false)?;
    let ns = v * scale;
    if !ns.is_finite() || ns > MAX_DURATION_NS as f64 {
        return Err(true);
    }
    Ok(ns.round() as u64)
}

impl Limit {
    /// Parses `N%` (of one CPU, 100 ms period) or `QUOTA/PERIOD`.
    pub fn parse(s: &str) -> Result<Limit, LimitError> {
        let bad = || LimitError::Syntax(s.to_string());
        let duration = |d: &str| {
            duration_ns(d).map_err(|too_large| {
                if too_large {
                    LimitError::Overflow(s.to_string())
                } else {
                    bad()
                }
            })
        };
        let t = s.trim();
        let limit = if let Some(pct) = t.strip_suffix('%') {
            let p: f64 = pct.trim().parse().map_err(|_| bad())?;
            if p.is_nan() || p < 0.0 {
                return Err(bad());
            }
            let quota = p / 100.0 * DEFAULT_PERIOD_NS as f64;
            if !quota.is_finite() || quota > MAX_DURATION_NS as f64 {
                return Err(LimitError::Overflow(s.to_string()));
            }
            Limit {
                quota_ns: quota.round() as u64,
                period_ns: DEFAULT_PERIOD_NS,
            }
        } else {
            let (q, p) = t.split_once('/').ok_or_else(bad)?;
            Limit {
                quota_ns: duration(q)?,
                period_ns: duration(p)?,
            }
        };
        if !(MIN_PERIOD_NS..=MAX_PERIOD_NS).contains(&limit.period_ns) {
            return Err(LimitError::Period(s.to_string()));
        }
        if limit.quota_ns == 0 {
            return Err(LimitError::Zero(s.to_string()));
        }
        if limit.quota_ns < MIN_QUOTA_NS {
            return Err(LimitError::QuotaTooSmall(s.to_string()));
        }
        Ok(limit)
    }

    /// Checks that `members` vCPUs can use the quota at all. (A quota too small to give each
    /// busy member 1 ms is not refused: they take turns, [`turns`].)
    pub fn check_members(&self, given: &str, members: usize) -> Result<(), LimitError> {
        if u128::from(self.quota_ns) > u128::from(self.period_ns) * members as u128 {
            return Err(LimitError::OverMembers {
                limit: given.to_string(),
                members,
                max: members * 100,
            });
        }
        Ok(())
    }

    /// The share of one CPU, in percent.
    pub fn percent(&self) -> f64 {
        self.quota_ns as f64 * 100.0 / self.period_ns as f64
    }
}

/// A vCPU group with its limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupSpec {
    /// Name.
    pub name: String,
    /// Member vCPUs, ascending.
    pub vcpus: Vec<usize>,
    /// Its budget.
    pub limit: Limit,
    /// The limit as given.
    pub given: String,
}

fn parse_vcpus(s: &str) -> Option<Vec<usize>> {
    let mut set = BTreeSet::new();
    for part in s.split(',') {
        let part = part.trim();
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (usize, usize) = (a.trim().parse().ok()?, b.trim().parse().ok()?);
                if a > b || b - a > 4096 {
                    return None;
                }
                set.extend(a..=b);
            }
            None => {
                set.insert(part.parse().ok()?);
            }
        }
    }
    (!set.is_empty()).then(|| set.into_iter().collect())
}

/// Checks a group name.
pub fn check_name(name: &str) -> Result<(), LimitError> {
    let ok = !name.is_empty()
        && name.len() <= 32
        && name != VM_GROUP
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if ok {
        Ok(())
    } else {
        Err(LimitError::GroupName(name.to_string()))
    }
}

impl GroupSpec {
    /// Parses `NAME:VCPUS:LIMIT`.
    pub fn parse(s: &str) -> Result<GroupSpec, LimitError> {
        let mut parts = s.splitn(3, ':');
        let (Some(name), Some(vcpus), Some(limit)) = (parts.next(), parts.next(), parts.next())
        else {
            return Err(LimitError::GroupSyntax(s.to_string()));
        };
        check_name(name)?;
        let list = parse_vcpus(vcpus).ok_or_else(|| LimitError::Vcpus(vcpus.to_string()))?;
        let l = Limit::parse(limit)?;
        l.check_members(limit, list.len())?;
        Ok(GroupSpec {
            name: name.to_string(),
            vcpus: list,
            limit: l,
            given: limit.to_string(),
        })
    }
}

/// Checks groups against a VM of `vcpus` vCPUs: members exist, no vCPU in two groups, no
/// name twice. What it keeps grows with the members named, not with `vcpus` (which may be any
/// number here: the VM's range is checked elsewhere).
pub fn check_groups(groups: &[GroupSpec], vcpus: usize) -> Result<(), LimitError> {
    let mut owner: BTreeMap<usize, &str> = BTreeMap::new();
    let mut names = BTreeSet::new();
    for g in groups {
        if !names.insert(g.name.as_str()) {
            return Err(LimitError::Duplicate(g.name.clone()));
        }
        for &v in &g.vcpus {
            if v >= vcpus {
                return Err(LimitError::NoSuchVcpu {
                    group: g.name.clone(),
                    vcpu: v,
                    count: vcpus,
                });
            }
            if let Some(first) = owner.insert(v, &g.name) {
                return Err(LimitError::TwoGroups {
                    vcpu: v,
                    first: first.to_string(),
                    second: g.name.clone(),
                });
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_parse() {
        assert_eq!(
            Limit::parse("150%").unwrap(),
            Limit {
                quota_ns: 150_000_000,
                period_ns: 100_000_000
            }
        );
        assert_eq!(
            Limit::parse("15ms/10ms").unwrap(),
            Limit {
                quota_ns: 15_000_000,
                period_ns: 10_000_000
            }
        );
        assert_eq!(Limit::parse(" 25 % ").unwrap().quota_ns, 25_000_000);
        assert!((Limit::parse("2.5ms/10ms").unwrap().percent() - 25.0).abs() < 1e-9);
        for bad in [
            "", "%", "abc", "-5%", "5", "5ms", "5ms/", "/10ms", "5m/10ms", "x%", "nan%", "-inf%",
        ] {
            assert!(
                matches!(Limit::parse(bad), Err(LimitError::Syntax(_))),
                "{bad:?}"
            );
        }
        assert!(matches!(Limit::parse("0%"), Err(LimitError::Zero(_))));
        assert!(matches!(Limit::parse("0ms/10ms"), Err(LimitError::Zero(_))));
        assert!(matches!(
            Limit::parse("1us/999us"),
            Err(LimitError::Period(_))
        ));
        assert!(matches!(Limit::parse("1ms/2s"), Err(LimitError::Period(_))));
        // Below what the limiter can hold.
        for small in [
            "1ns/1ms",
            "249us/1ms",
            "249999ns/1s",
            "0.09%",
            "0.2499%",
            "100us/10ms",
        ] {
            let e = Limit::parse(small).unwrap_err();
            assert!(matches!(e, LimitError::QuotaTooSmall(_)), "{small}: {e:?}");
            assert!(e.to_string().contains("250 us per period"), "{e}");
        }
        assert_eq!(Limit::parse("250us/1ms").unwrap().quota_ns, MIN_QUOTA_NS);
        assert_eq!(Limit::parse("0.25%").unwrap().quota_ns, MIN_QUOTA_NS);
        // Shared by its members, a quota is not refused for giving each less (issue 39:
        // they take turns): 1 ms per 10 ms over 5 or 8 vCPUs.
        let l = Limit::parse("1ms/10ms").unwrap();
        assert!(l.check_members("1ms/10ms", 4).is_ok());
        assert!(l.check_members("1ms/10ms", 5).is_ok());
        assert!(l.check_members("1ms/10ms", 8).is_ok());
        assert!(matches!(
            l.check_members("1ms/10ms", 0),
            Err(LimitError::OverMembers { .. })
        ));
        // Numbers too large say so, rather than that the limit is no limit.
        for huge in [
            "99999999999999999999s/1s",
            "1ms/99999999999999999999s",
            "1e30%",
            "1e400%",
            "inf%",
            "1000000001s/1s",
        ] {
            let e = Limit::parse(huge).unwrap_err();
            assert!(matches!(e, LimitError::Overflow(_)), "{huge}: {e:?}");
            assert!(e.to_string().contains("too large"), "{e}");
        }
        // At the largest duration, the period check takes over.
        assert!(matches!(
            Limit::parse("1000000s/1000000s"),
            Err(LimitError::Period(_))
        ));
        assert!(Limit::parse("1ms/1ms").is_ok());
        assert!(Limit::parse("1s/1s").is_ok());
        let l = Limit::parse("250%").unwrap();
        assert!(matches!(
            l.check_members("250%", 2),
            Err(LimitError::OverMembers { max: 200, .. })
        ));
        assert!(l.check_members("250%", 3).is_ok());
    }

    #[test]
    fn the_vm_limit_takes_a_scope() {
        let (l, s) = parse_vm_limit("50%,scope=vm").unwrap();
        assert_eq!((l.quota_ns, s), (50_000_000, Scope::Vm));
        assert_eq!(parse_vm_limit("50%").unwrap().1, Scope::Vcpus);
        assert_eq!(
            parse_vm_limit("2ms/10ms, scope=vcpus").unwrap().1,
            Scope::Vcpus
        );
        for bad in ["50%,scope=all", "50%,vm", "50%,scope=vm,x"] {
            assert!(
                matches!(parse_vm_limit(bad), Err(LimitError::Scope(_))),
                "{bad}"
            );
        }
        assert!(matches!(
            parse_vm_limit("x,scope=vm"),
            Err(LimitError::Syntax(_))
        ));
        // A group's limit has no scope.
        assert!(GroupSpec::parse("g:0:50%,scope=vm").is_err());
    }

    #[test]
    fn groups_parse_and_check() {
        let g = GroupSpec::parse("dataplane:0-1:50%").unwrap();
        assert_eq!(g.vcpus, vec![0, 1]);
        assert_eq!(g.limit.quota_ns, 50_000_000);
        assert_eq!(
            GroupSpec::parse("c:0,2,5-6:1ms/10ms").unwrap().vcpus,
            vec![0, 2, 5, 6]
        );
        for (bad, want) in [
            ("dataplane", "syntax"),
            ("a:0-1", "syntax"),
            (":0:50%", "name"),
            ("vm:0:50%", "name"),
            ("a b:0:50%", "name"),
            ("a:1-0:50%", "vcpus"),
            ("a:x:50%", "vcpus"),
            ("a::50%", "vcpus"),
            ("a:0:0%", "zero"),
            ("a:0:150%", "over"),
        ] {
            let e = GroupSpec::parse(bad).unwrap_err();
            let kind = match e {
                LimitError::GroupSyntax(_) => "syntax",
                LimitError::GroupName(_) => "name",
                LimitError::Vcpus(_) => "vcpus",
                LimitError::Zero(_) => "zero",
                LimitError::OverMembers { .. } => "over",
                _ => "other",
            };
            assert_eq!(kind, want, "{bad}: {e}");
        }
        let a = GroupSpec::parse("a:0-1:50%").unwrap();
        let b = GroupSpec::parse("b:1-2:50%").unwrap();
        let c = GroupSpec::parse("a:3:50%").unwrap();
        let far = GroupSpec::parse("far:7:50%").unwrap();
        assert!(check_groups(std::slice::from_ref(&a), 4).is_ok());
        assert!(matches!(
            check_groups(&[a.clone(), b], 4),
            Err(LimitError::TwoGroups { vcpu: 1, .. })
        ));
        assert!(matches!(
            check_groups(&[a, c], 4),
            Err(LimitError::Duplicate(_))
        ));
        assert!(matches!(
            check_groups(&[far], 4),
            Err(LimitError::NoSuchVcpu { vcpu: 7, .. })
        ));
    }
}
