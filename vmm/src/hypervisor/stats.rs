//! A vCPU's statistics as the hypervisor keeps them, in hypervisor-neutral terms.
//!
//! Data flow: a backend opens its per-vCPU counters when the vCPU is created (KVM: its binary
//! statistics, `kvm::stats`) and returns them from `Vcpu::stats` as a [`VcpuStats`]: named
//! scalar counters, each [`StatKind::Cumulative`] or [`StatKind::Current`], read as one block
//! by [`VcpuStats::read_scalars`], with the index of each [`KnownStat`] the accounting reads
//! at every sample found once. The accounting (`accounting::snapshot`) holds a `VcpuStats`
//! and nothing of the backend; the backend's reader sits behind the [`StatsSource`] trait.
//! Reads take `&self` (no seek state), so a `VcpuStats` is shared between readers.

use std::fmt;

use thiserror::Error;

/// Why the hypervisor's statistics of a vCPU could not be read.
#[derive(Debug, Error)]
#[error("the hypervisor's statistics of the vCPU could not be read")]
pub struct StatsError(#[source] pub Box<dyn std::error::Error + Send + Sync>);

/// How a statistic accumulates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatKind {
    /// A counter that only grows: the accounting turns it into a delta since a baseline.
    Cumulative,
    /// A current value or a peak: taken as it is.
    Current,
}

/// The statistics the accounting reads at every sample (`stats`, the PPA page): found once,
/// when the statistics are opened, rather than by comparing names at every read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KnownStat {
    /// Every exit the hypervisor saw, those it handled itself included.
    Exits,
    /// HLT exits.
    HaltExits,
    /// Time blocked in a halt, ns.
    HaltWaitNs,
    /// Whether the vCPU is blocked in the hypervisor now, in a halt or waiting for its
    /// start-up IPI (a boolean).
    Blocking,
}

impl KnownStat {
    /// Every known statistic, in index order.
    pub const ALL: [KnownStat; 4] = [
        KnownStat::Exits,
        KnownStat::HaltExits,
        KnownStat::HaltWaitNs,
        KnownStat::Blocking,
    ];
}

/// A backend's reader of one vCPU's statistics.
pub trait StatsSource: Send + Sync + fmt::Debug {
    /// Name and kind of every scalar statistic, in the order [`StatsSource::read`] fills.
    fn scalars(&self) -> Vec<(String, StatKind)>;
    /// Index (in that order) of a known statistic, None if this host has no such statistic.
    fn known_index(&self, k: KnownStat) -> Option<usize>;
    /// Reads every scalar into `out[..n]` (`out` holds at least `n` values, n = the length of
    /// [`StatsSource::scalars`]), with `scratch` as a reusable buffer.
    fn read(&self, scratch: &mut Vec<u8>, out: &mut [u64]) -> Result<(), StatsError>;
}

/// One vCPU's statistics: names, kinds and known indices found once, values read on demand.
#[derive(Debug)]
pub struct VcpuStats {
    source: Box<dyn StatsSource>,
    names: Vec<String>,
    kinds: Vec<StatKind>,
    known: [Option<usize>; KnownStat::ALL.len()],
}

impl VcpuStats {
    /// The statistics `source` reads.
    pub fn new(source: Box<dyn StatsSource>) -> Self {
        let (names, kinds) = source.scalars().into_iter().unzip();
        let known = KnownStat::ALL.map(|k| source.known_index(k));
        VcpuStats {
            source,
            names,
            kinds,
            known,
        }
    }

    /// Scalar index of a known statistic (None if this host has no such statistic).
    pub fn known_index(&self, k: KnownStat) -> Option<usize> {
        self.known[k as usize]
    }

    /// How scalar `i` accumulates (None past the last scalar).
    pub fn scalar_kind(&self, i: usize) -> Option<StatKind> {
        self.kinds.get(i).copied()
    }

    /// Names of the scalar statistics, in the order `read_scalars` fills.
    pub fn scalar_names(&self) -> impl Iterator<Item = &str> {
        self.names.iter().map(String::as_str)
    }

    /// The number of scalar statistics: the length `read_scalars` needs.
    pub fn scalar_count(&self) -> usize {
        self.names.len()
    }

    /// Reads every scalar's current value into `out[..scalar_count()]` (the rest of a longer
    /// `out` is left alone); a reused `scratch` keeps the read from allocating.
    pub fn read_scalars(&self, scratch: &mut Vec<u8>, out: &mut [u64]) -> Result<(), StatsError> {
        if out.len() < self.names.len() {
            return Err(StatsError(
                format!(
                    "the output holds {} values but there are {} statistics",
                    out.len(),
                    self.names.len()
                )
                .into(),
            ));
        }
        self.source.read(scratch, out)
    }
}
