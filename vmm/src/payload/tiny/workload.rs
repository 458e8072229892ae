//! Tiny-guest workloads: parsing `NAME:key=value,...` specs and assigning them to vCPUs.
//!
//! Data flow: the CLI or config file gives strings such as `busy:ms=300` or `2=exits:n=10`;
//! [`Assignment::parse`] turns each into a target (one vCPU or all), a [`Spec`] and whether the
//! guest publishes to the PPA page (`publish=on|off`, any workload); [`resolve`] applies them
//! in order to the VM's vCPUs (later ones win) and expands the `mixed` preset;
//! [`VcpuWorkload::to_desc`] encodes one vCPU's workload for its boot-info record.

use std::fmt;
use std::str::FromStr;

use ppa_guest_abi::{workload as abi, WorkloadDesc};
use thiserror::Error;

/// Why a workload spec was refused.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum WorkloadError {
    /// The name before the colon is not a workload.
    #[error("unknown workload `{q}` (expected idle, busy, periodic, exits, mixed, fault, hostile, memtouch, net-tx, net-rx, net-echo, blk-write or blk-verify)", q = ppa_vmm_api::clip(.0))]
    UnknownWorkload(String),
    /// A key the workload does not take.
    #[error("workload `{workload}` has no parameter `{qkey}` (it takes: {allowed})", qkey = ppa_vmm_api::clip(.key))]
    UnknownKey {
        /// Workload name.
        workload: &'static str,
        /// The key given.
        key: String,
        /// The keys it takes.
        allowed: &'static str,
    },
    /// A parameter given twice.
    #[error("parameter `{q}` is given twice", q = ppa_vmm_api::clip(.0))]
    DuplicateKey(String),
    /// `key=value` without `=`.
    #[error("`{q}` is not of the form key=value", q = ppa_vmm_api::clip(.0))]
    NotKeyValue(String),
    /// A value that is not a number in range.
    #[error("`{qkey}={qvalue}` is not valid: {why}", qkey = ppa_vmm_api::clip(.key), qvalue = ppa_vmm_api::clip(.value))]
    BadValue {
        /// The key.
        key: String,
        /// The value given.
        value: String,
        /// What it must be.
        why: &'static str,
    },
    /// `I=SPEC` with an I that is not a number.
    #[error("`{q}` is not a vCPU index", q = ppa_vmm_api::clip(.0))]
    BadTarget(String),
    /// `I=SPEC` for a vCPU the VM does not have.
    #[error("a workload targets vCPU {index} but the VM has {vcpus} vCPUs (0..={last})", last = vcpus - 1)]
    NoSuchVcpu {
        /// Index given.
        index: usize,
        /// vCPUs of the VM.
        vcpus: usize,
    },
}

/// How the `exits` workload leaves the guest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitKind {
    /// A write to the MMIO workload doorbell.
    Mmio,
    /// An `out` to the workload port.
    Pio,
    /// A CPUID: an exit KVM handles in the kernel on VMX and SVM (never seen by the VMM).
    Cpuid,
}

/// How the `fault` workload kills its vCPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultKind {
    /// HLT at CPL 3.
    Hlt,
    /// UD2.
    Ud,
}

/// How much of each block `blk-verify` compares with its pattern.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlkCheck {
    /// Every 8-byte word (the default).
    All,
    /// The first word of each 512-byte sector: a sector read from the wrong place is seen,
    /// a change inside one is not. The guest's side of a read then costs little, so that
    /// `bench disk` times the device rather than the guest's comparing.
    Sectors,
}

impl BlkCheck {
    /// The words between two compared (the workload's third parameter).
    fn stride(self) -> u64 {
        match self {
            BlkCheck::All => 1,
            BlkCheck::Sectors => 64,
        }
    }
}

/// What the `hostile` workload writes into the PPA page's guest section (see
/// `ppa_guest_abi::workload::HOSTILE_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostileMode(pub u64);

impl HostileMode {
    /// The mode's name.
    pub fn name(self) -> &'static str {
        abi::HOSTILE_MODES
            .get(self.0 as usize)
            .copied()
            .unwrap_or("?")
    }
}

/// One vCPU's workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Workload {
    /// Halt in 10 ms steps for `ms`.
    Idle {
        /// Duration in ms.
        ms: u64,
    },
    /// Spin on the TSC for `ms`.
    Busy {
        /// Duration in ms.
        ms: u64,
    },
    /// Spin `run_us`, halt to the end of each `period_us`, `count` times.
    Periodic {
        /// Spin time per period, µs.
        run_us: u64,
        /// Period, µs.
        period_us: u64,
        /// Number of periods.
        count: u64,
    },
    /// `n` doorbell exits back to back.
    Exits {
        /// Number of exits.
        n: u64,
        /// MMIO or port I/O.
        kind: ExitKind,
    },
    /// Shut the vCPU down on purpose.
    Fault {
        /// Which instruction.
        kind: FaultKind,
    },
    /// Write bad data into the PPA page's guest section for `ms`.
    Hostile {
        /// Duration in ms.
        ms: u64,
        /// What to write.
        mode: HostileMode,
    },
    /// Write a pattern over `mib` MiB of RAM (above 4 GiB when the VM has RAM there), read
    /// it back and report what it found.
    Memtouch {
        /// MiB to touch.
        mib: u64,
    },
    /// Send `packets` frames of `size` bytes through the first network device.
    NetTx {
        /// Frames.
        packets: u64,
        /// Bytes per frame, Ethernet header included (60 to 2036).
        size: u64,
    },
    /// Receive until `packets` frames came or `ms` passed, after `wait_ms` with the device
    /// started and no buffer posted (frames wait at the tap: `bench net` fills it so).
    NetRx {
        /// Frames.
        packets: u64,
        /// Time limit, ms (from the end of the wait).
        ms: u64,
        /// Wait before the receive buffers are posted, ms.
        wait_ms: u64,
    },
    /// Send every frame received back to its sender, for `ms`.
    NetEcho {
        /// Duration, ms.
        ms: u64,
    },
    /// Write 4 KiB blocks `0..blocks` of the first disk with their patterns, then FLUSH, then
    /// spin `hold_ms` before reporting (a test kills the VMM meanwhile).
    BlkWrite {
        /// Blocks.
        blocks: u64,
        /// Requests in flight (1 to 64).
        depth: u64,
        /// Spin after the FLUSH, ms.
        hold_ms: u64,
    },
    /// Read blocks `0..blocks` of the first disk back and compare them with their patterns.
    BlkVerify {
        /// Blocks.
        blocks: u64,
        /// Requests in flight (1 to 64).
        depth: u64,
        /// How much of each block is compared.
        check: BlkCheck,
    },
}

impl Workload {
    /// Whether it drives the network device.
    pub fn uses_net(&self) -> bool {
        matches!(
            self,
            Workload::NetTx { .. } | Workload::NetRx { .. } | Workload::NetEcho { .. }
        )
    }

    /// Whether it drives the disk.
    pub fn uses_blk(&self) -> bool {
        matches!(self, Workload::BlkWrite { .. } | Workload::BlkVerify { .. })
    }
}

/// One vCPU's workload and whether its guest publishes to the PPA page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VcpuWorkload {
    /// What it runs.
    pub workload: Workload,
    /// Whether it publishes its thread and CPU records (default on).
    pub publish: bool,
}

/// A parsed spec: one workload, or the `mixed` preset that depends on the vCPU index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Spec {
    /// The same workload.
    One(Workload),
    /// busy, periodic, exits, idle by vCPU index modulo 4, each lasting about `ms`.
    Mixed {
        /// Duration of each part in ms.
        ms: u64,
    },
}

/// A spec and the vCPU it targets (`None`: all of them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Assignment {
    /// vCPU index, or all.
    pub target: Option<usize>,
    /// What to run.
    pub spec: Spec,
    /// `publish=on|off` (default on).
    pub publish: bool,
}

const MAX_MS: u64 = 86_400_000;
const MAX_COUNT: u64 = 10_000_000_000;
/// The most blocks a disk workload names (4 KiB each: 1 TiB).
const MAX_BLOCKS: u64 = 1 << 28;

/// The parameters of one spec, checked against the keys its workload takes.
struct Params<'a> {
    workload: &'static str,
    allowed: &'static str,
    pairs: Vec<(&'a str, &'a str)>,
}

impl<'a> Params<'a> {
    fn parse(
        workload: &'static str,
        allowed: &'static str,
        text: &'a str,
    ) -> Result<Self, WorkloadError> {
        let mut pairs: Vec<(&str, &str)> = Vec::new();
        for item in text.split(',').filter(|s| !s.is_empty()) {
            let (k, v) = item
                .split_once('=')
                .ok_or_else(|| WorkloadError::NotKeyValue(item.to_string()))?;
            let k = k.trim();
            if !allowed.split(", ").any(|a| a == k) {
                return Err(WorkloadError::UnknownKey {
                    workload,
                    key: k.to_string(),
                    allowed,
                });
            }
            if pairs.iter().any(|(pk, _)| *pk == k) {
                return Err(WorkloadError::DuplicateKey(k.to_string()));
            }
            pairs.push((k, v.trim()));
        }
        Ok(Params {
            workload,
            allowed,
            pairs,
        })
    }

    fn get(&self, key: &str) -> Option<&'a str> {
        debug_assert!(self.allowed.contains(key), "{} takes {key}", self.workload);
        self.pairs.iter().find(|(k, _)| *k == key).map(|(_, v)| *v)
    }

    fn num(&self, key: &str, default: u64, range: (u64, u64)) -> Result<u64, WorkloadError> {
        let Some(v) = self.get(key) else {
            return Ok(default);
        };
        let bad = |why| WorkloadError::BadValue {
            key: key.to_string(),
            value: v.to_string(),
            why,
        };
        let n: u64 = v.parse().map_err(|_| bad("not a whole number"))?;
        if n < range.0 || n > range.1 {
            return Err(bad("out of range"));
        }
        Ok(n)
    }

    fn choice<T: Copy>(&self, key: &str, options: &[(&str, T)]) -> Result<T, WorkloadError> {
        let Some(v) = self.get(key) else {
            return Ok(options[0].1);
        };
        options
            .iter()
            .find(|(name, _)| *name == v)
            .map(|(_, t)| *t)
            .ok_or_else(|| WorkloadError::BadValue {
                key: key.to_string(),
                value: v.to_string(),
                why: "not one of the allowed names",
            })
    }
}

/// `periodic:run_us=…,period_us=…,count=…`.
fn periodic(rest: &str) -> Result<Workload, WorkloadError> {
    let p = Params::parse("periodic", "run_us, period_us, count", rest)?;
    let period_us = p.num("period_us", 3000, (1, 10_000_000))?;
    let run_us = p.num("run_us", 300, (0, period_us))?;
    if run_us > period_us {
        // Only the default can be: a given run_us is checked against the period.
        return Err(WorkloadError::BadValue {
            key: "run_us".into(),
            value: format!("{run_us} (the default)"),
            why: "longer than period_us; give a run_us up to the period",
        });
    }
    let count = p.num("count", 300, (1, MAX_COUNT))?;
    Ok(Workload::Periodic {
        run_us,
        period_us,
        count,
    })
}

/// `exits:n=…,kind=mmio|pio|cpuid`.
fn exits(rest: &str) -> Result<Workload, WorkloadError> {
    let p = Params::parse("exits", "n, kind", rest)?;
    Ok(Workload::Exits {
        n: p.num("n", 10_000, (0, MAX_COUNT))?,
        kind: p.choice(
            "kind",
            &[
                ("mmio", ExitKind::Mmio),
                ("pio", ExitKind::Pio),
                ("cpuid", ExitKind::Cpuid),
            ],
        )?,
    })
}

/// `hostile:ms=…,mode=…` (the modes of the ABI's `HOSTILE_MODES`).
fn hostile(rest: &str) -> Result<Workload, WorkloadError> {
    let p = Params::parse("hostile", "ms, mode", rest)?;
    let modes: Vec<(&str, HostileMode)> = abi::HOSTILE_MODES
        .iter()
        .enumerate()
        .map(|(i, n)| (*n, HostileMode(i as u64)))
        .collect();
    Ok(Workload::Hostile {
        ms: p.num("ms", 1000, (0, MAX_MS))?,
        mode: p.choice("mode", &modes)?,
    })
}

impl FromStr for Spec {
    type Err = WorkloadError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (name, rest) = s.trim().split_once(':').unwrap_or((s.trim(), ""));
        let spec = match name {
            "idle" => {
                let p = Params::parse("idle", "ms", rest)?;
                Spec::One(Workload::Idle {
                    ms: p.num("ms", 1000, (0, MAX_MS))?,
                })
            }
            "busy" => {
                let p = Params::parse("busy", "ms", rest)?;
                Spec::One(Workload::Busy {
                    ms: p.num("ms", 1000, (0, MAX_MS))?,
                })
            }
            "periodic" => Spec::One(periodic(rest)?),
            "exits" => Spec::One(exits(rest)?),
            "fault" => {
                let p = Params::parse("fault", "kind", rest)?;
                Spec::One(Workload::Fault {
                    kind: p.choice("kind", &[("hlt", FaultKind::Hlt), ("ud", FaultKind::Ud)])?,
                })
            }
            "hostile" => Spec::One(hostile(rest)?),
            "memtouch" => {
                let p = Params::parse("memtouch", "mib", rest)?;
                Spec::One(Workload::Memtouch {
                    mib: p.num("mib", 64, (1, 1 << 20))?,
                })
            }
            "net-tx" => {
                let p = Params::parse("net-tx", "packets, size", rest)?;
                Spec::One(Workload::NetTx {
                    packets: p.num("packets", 100_000, (0, MAX_COUNT))?,
                    size: p.num("size", 64, (60, 2036))?,
                })
            }
            "net-rx" => {
                let p = Params::parse("net-rx", "packets, ms, wait_ms", rest)?;
                Spec::One(Workload::NetRx {
                    packets: p.num("packets", 10_000, (0, MAX_COUNT))?,
                    ms: p.num("ms", 10_000, (0, MAX_MS))?,
                    wait_ms: p.num("wait_ms", 0, (0, MAX_MS))?,
                })
            }
            "net-echo" => {
                let p = Params::parse("net-echo", "ms", rest)?;
                Spec::One(Workload::NetEcho {
                    ms: p.num("ms", 10_000, (0, MAX_MS))?,
                })
            }
            "blk-write" => {
                let p = Params::parse("blk-write", "blocks, depth, hold_ms", rest)?;
                Spec::One(Workload::BlkWrite {
                    blocks: p.num("blocks", 1024, (0, MAX_BLOCKS))?,
                    depth: p.num("depth", 32, (1, 64))?,
                    hold_ms: p.num("hold_ms", 0, (0, MAX_MS))?,
                })
            }
            "blk-verify" => {
                let p = Params::parse("blk-verify", "blocks, depth, check", rest)?;
                Spec::One(Workload::BlkVerify {
                    blocks: p.num("blocks", 1024, (0, MAX_BLOCKS))?,
                    depth: p.num("depth", 32, (1, 64))?,
                    check: p.choice(
                        "check",
                        &[("all", BlkCheck::All), ("sectors", BlkCheck::Sectors)],
                    )?,
                })
            }
            "mixed" => {
                let p = Params::parse("mixed", "ms", rest)?;
                Spec::Mixed {
                    ms: p.num("ms", 1000, (1, MAX_MS))?,
                }
            }
            other => return Err(WorkloadError::UnknownWorkload(other.to_string())),
        };
        Ok(spec)
    }
}

impl Spec {
    /// The workload this spec gives vCPU `index`.
    pub fn for_vcpu(&self, index: usize) -> Workload {
        match *self {
            Spec::One(w) => w,
            Spec::Mixed { ms } => match index % 4 {
                0 => Workload::Busy { ms },
                1 => Workload::Periodic {
                    run_us: 300,
                    period_us: 3000,
                    count: (ms / 3).max(1),
                },
                2 => Workload::Exits {
                    n: ms * 20,
                    kind: ExitKind::Mmio,
                },
                _ => Workload::Idle { ms },
            },
        }
    }
}

impl Assignment {
    /// Parses `SPEC` (all vCPUs) or `I=SPEC` (vCPU I).
    pub fn parse(s: &str) -> Result<Self, WorkloadError> {
        let s = s.trim();
        // A target is digits before the first '=' that come before any ':'.
        if let Some((head, tail)) = s.split_once('=') {
            if !head.contains(':') && !head.contains(',') {
                if head.chars().all(|c| c.is_ascii_digit()) && !head.is_empty() {
                    let index = head
                        .parse()
                        .map_err(|_| WorkloadError::BadTarget(head.to_string()))?;
                    let (spec, publish) = spec_and_publish(tail)?;
                    return Ok(Assignment {
                        target: Some(index),
                        spec,
                        publish,
                    });
                }
                return Err(WorkloadError::BadTarget(head.to_string()));
            }
        }
        let (spec, publish) = spec_and_publish(s)?;
        Ok(Assignment {
            target: None,
            spec,
            publish,
        })
    }
}

/// Splits the `publish=on|off` parameter, which every workload takes, from the spec's own.
fn spec_and_publish(s: &str) -> Result<(Spec, bool), WorkloadError> {
    let (name, rest) = s.trim().split_once(':').unwrap_or((s.trim(), ""));
    let mut publish = None;
    let mut others = Vec::new();
    for item in rest.split(',') {
        match item.split_once('=') {
            Some((k, v)) if k.trim() == "publish" => {
                if publish.is_some() {
                    return Err(WorkloadError::DuplicateKey("publish".into()));
                }
                publish = Some(match v.trim() {
                    "on" => true,
                    "off" => false,
                    other => {
                        return Err(WorkloadError::BadValue {
                            key: "publish".into(),
                            value: other.into(),
                            why: "not on or off",
                        })
                    }
                });
            }
            _ => others.push(item),
        }
    }
    let spec = format!("{name}:{}", others.join(",")).parse()?;
    Ok((spec, publish.unwrap_or(true)))
}

/// The workload of each of `vcpus` vCPUs: `mixed` unless an assignment says otherwise; later
/// assignments override earlier ones.
pub fn resolve(
    assignments: &[Assignment],
    vcpus: usize,
) -> Result<Vec<VcpuWorkload>, WorkloadError> {
    let default = (Spec::Mixed { ms: 1000 }, true);
    let mut specs = vec![default; vcpus];
    for a in assignments {
        match a.target {
            None => specs.iter_mut().for_each(|s| *s = (a.spec, a.publish)),
            Some(index) if index < vcpus => specs[index] = (a.spec, a.publish),
            Some(index) => return Err(WorkloadError::NoSuchVcpu { index, vcpus }),
        }
    }
    Ok(specs
        .iter()
        .enumerate()
        .map(|(i, (s, publish))| VcpuWorkload {
            workload: s.for_vcpu(i),
            publish: *publish,
        })
        .collect())
}

impl VcpuWorkload {
    /// The encoding the guest reads from its boot-info record.
    pub fn to_desc(&self) -> WorkloadDesc {
        let mut d = self.workload.to_desc();
        if !self.publish {
            d.flags |= abi::FLAG_NO_PUBLISH;
        }
        d
    }
}

impl fmt::Display for VcpuWorkload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.workload)?;
        if !self.publish {
            write!(f, ",publish=off")?;
        }
        Ok(())
    }
}

impl Workload {
    /// The encoding the guest reads from its boot-info record (publishing on).
    pub fn to_desc(&self) -> WorkloadDesc {
        let (kind, params) = match *self {
            Workload::Idle { ms } => (abi::IDLE, [ms, 0, 0, 0]),
            Workload::Busy { ms } => (abi::BUSY, [ms, 0, 0, 0]),
            Workload::Periodic {
                run_us,
                period_us,
                count,
            } => (abi::PERIODIC, [run_us, period_us, count, 0]),
            Workload::Exits { n, kind } => {
                let k = match kind {
                    ExitKind::Mmio => abi::EXITS_MMIO,
                    ExitKind::Pio => abi::EXITS_PIO,
                    ExitKind::Cpuid => abi::EXITS_CPUID,
                };
                (abi::EXITS, [n, k, 0, 0])
            }
            Workload::Fault { kind } => {
                let k = match kind {
                    FaultKind::Hlt => abi::FAULT_HLT,
                    FaultKind::Ud => abi::FAULT_UD,
                };
                (abi::FAULT, [k, 0, 0, 0])
            }
            Workload::Hostile { ms, mode } => (abi::HOSTILE, [ms, mode.0, 0, 0]),
            // The base (params[1]) depends on the VM's memory map: the payload fills it in.
            Workload::Memtouch { mib } => (abi::MEMTOUCH, [mib << 20, 0, 0, 0]),
            Workload::NetTx { packets, size } => (abi::NET_TX, [packets, size, 0, 0]),
            Workload::NetRx {
                packets,
                ms,
                wait_ms,
            } => (abi::NET_RX, [packets, ms, wait_ms, 0]),
            Workload::NetEcho { ms } => (abi::NET_ECHO, [ms, 0, 0, 0]),
            Workload::BlkWrite {
                blocks,
                depth,
                hold_ms,
            } => (abi::BLK_WRITE, [blocks, depth, hold_ms, 0]),
            Workload::BlkVerify {
                blocks,
                depth,
                check,
            } => (abi::BLK_VERIFY, [blocks, depth, check.stride(), 0]),
        };
        WorkloadDesc {
            kind,
            flags: 0,
            params,
        }
    }
}

impl fmt::Display for Workload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Workload::Idle { ms } => write!(f, "idle:ms={ms}"),
            Workload::Busy { ms } => write!(f, "busy:ms={ms}"),
            Workload::Periodic {
                run_us,
                period_us,
                count,
            } => write!(
                f,
                "periodic:run_us={run_us},period_us={period_us},count={count}"
            ),
            Workload::Exits { n, kind } => {
                let k = match kind {
                    ExitKind::Mmio => "mmio",
                    ExitKind::Pio => "pio",
                    ExitKind::Cpuid => "cpuid",
                };
                write!(f, "exits:n={n},kind={k}")
            }
            Workload::Fault { kind } => {
                let k = if kind == FaultKind::Hlt { "hlt" } else { "ud" };
                write!(f, "fault:kind={k}")
            }
            Workload::Hostile { ms, mode } => write!(f, "hostile:ms={ms},mode={}", mode.name()),
            Workload::Memtouch { mib } => write!(f, "memtouch:mib={mib}"),
            Workload::NetTx { packets, size } => write!(f, "net-tx:packets={packets},size={size}"),
            Workload::NetRx {
                packets,
                ms,
                wait_ms: 0,
            } => write!(f, "net-rx:packets={packets},ms={ms}"),
            Workload::NetRx {
                packets,
                ms,
                wait_ms,
            } => write!(f, "net-rx:packets={packets},ms={ms},wait_ms={wait_ms}"),
            Workload::NetEcho { ms } => write!(f, "net-echo:ms={ms}"),
            Workload::BlkWrite {
                blocks,
                depth,
                hold_ms: 0,
            } => write!(f, "blk-write:blocks={blocks},depth={depth}"),
            Workload::BlkWrite {
                blocks,
                depth,
                hold_ms,
            } => write!(
                f,
                "blk-write:blocks={blocks},depth={depth},hold_ms={hold_ms}"
            ),
            Workload::BlkVerify {
                blocks,
                depth,
                check: BlkCheck::All,
            } => write!(f, "blk-verify:blocks={blocks},depth={depth}"),
            Workload::BlkVerify {
                blocks,
                depth,
                check: BlkCheck::Sectors,
            } => write!(f, "blk-verify:blocks={blocks},depth={depth},check=sectors"),
        }
    }
}

#[cfg(test)]
mod tests;
