//! Per-vCPU accounting: where every nanosecond of a vCPU thread went (spec section 4).
//!
//! Data flow:
//! - The vCPU thread owns a [`meter::Recorder`]. At every KVM_RUN boundary and park it reads
//!   the vDSO clock (level basic) and the thread CPU clock (level full, and around parks),
//!   and publishes micro-state totals, exit counts, exit handling times, histograms and
//!   threshold counts into its [`meter::VcpuMeter`]: atomics with one writer, grouped under a
//!   sequence counter so readers see a consistent group without a lock.
//! - The sampler thread (`sampler.rs`) reads each vCPU thread's schedstat every window for
//!   the steal-window threshold.
//! - Readers ([`snapshot`]) combine the meter with the sources the kernel keeps exactly: the
//!   thread CPU clock (used_ns), schedstat run_delay (steal_ns) and KVM's binary statistics
//!   (halted_ns, kvm_stats). Reset stores a baseline snapshot that readers subtract; the vCPU
//!   thread never sees a reset, so a reader sees either the state before or after it.
//!
//! Counters that come one per state, park kind, level or threshold sit in [`ByKey`] arrays
//! indexed by that enum, not by number.
//!
//! Definitions of every field are in docs/accounting.md.

use std::marker::PhantomData;
use std::ops::{Index, IndexMut};
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};

pub mod episodes;
mod exit_reason;
pub mod histogram;
pub mod host;
pub mod kvm_reasons;
pub mod meter;
pub mod snapshot;
pub mod switches;
pub mod worker;

pub use exit_reason::ExitReason;
pub use ppa_vmm_api::{Level, Threshold, Thresholds};

/// A fieldless enum whose `N` values number 0 to N − 1: the key of a [`ByKey`] array.
pub trait Key: Copy {
    /// The value's position.
    fn index(self) -> usize;
}

impl Key for Threshold {
    fn index(self) -> usize {
        Threshold::index(self)
    }
}

impl Key for Level {
    fn index(self) -> usize {
        self as usize
    }
}

/// One `T` for each of the `N` values of the enum `K`, indexed by `K`.
pub struct ByKey<K, T, const N: usize>([T; N], PhantomData<K>);

impl<K: Key, T, const N: usize> ByKey<K, T, N> {
    /// The array whose entry for each key is `f(index)`.
    pub fn from_fn(f: impl FnMut(usize) -> T) -> Self {
        ByKey(std::array::from_fn(f), PhantomData)
    }

    /// `f` of each entry, under the same keys.
    pub fn map<U>(&self, mut f: impl FnMut(&T) -> U) -> ByKey<K, U, N> {
        ByKey::from_fn(|i| f(&self.0[i]))
    }

    /// The entries in key order.
    pub fn values(&self) -> &[T; N] {
        &self.0
    }
}

impl<K: Key, const N: usize> ByKey<K, u64, N> {
    /// Each entry less the same entry of `base` (0 where it went down).
    pub fn since(&self, base: &Self) -> Self {
        ByKey::from_fn(|i| self.0[i].saturating_sub(base.0[i]))
    }
}

impl<K: Key, T, const N: usize> Index<K> for ByKey<K, T, N> {
    type Output = T;

    #[inline]
    fn index(&self, k: K) -> &T {
        &self.0[k.index()]
    }
}

impl<K: Key, T, const N: usize> IndexMut<K> for ByKey<K, T, N> {
    #[inline]
    fn index_mut(&mut self, k: K) -> &mut T {
        &mut self.0[k.index()]
    }
}

impl<K: Key, T: Default, const N: usize> Default for ByKey<K, T, N> {
    fn default() -> Self {
        ByKey::from_fn(|_| T::default())
    }
}

impl<K, T: Clone, const N: usize> Clone for ByKey<K, T, N> {
    fn clone(&self) -> Self {
        ByKey(self.0.clone(), PhantomData)
    }
}

impl<K, T: Copy, const N: usize> Copy for ByKey<K, T, N> {}

impl<K, T: PartialEq, const N: usize> PartialEq for ByKey<K, T, N> {
    fn eq(&self, other: &Self) -> bool {
        self.0 == other.0
    }
}

impl<K, T: Eq, const N: usize> Eq for ByKey<K, T, N> {}

impl<K, T: PartialEq, const N: usize> PartialEq<[T; N]> for ByKey<K, T, N> {
    fn eq(&self, other: &[T; N]) -> bool {
        self.0 == *other
    }
}

impl<K, T: std::fmt::Debug, const N: usize> std::fmt::Debug for ByKey<K, T, N> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// One value per threshold.
pub type PerThreshold<T> = ByKey<Threshold, T, { Threshold::COUNT }>;

/// VM-wide accounting settings, shared by every vCPU thread, the sampler and readers.
#[derive(Debug)]
pub struct AccountingControl {
    level: AtomicU8,
    thresholds: PerThreshold<AtomicU64>,
    frac_bits: u8,
    sample_interval_ns: u64,
    /// The kernel tracepoints level full opens on each vCPU thread (None: none).
    trace: Option<switches::events::TraceCatalog>,
}

impl AccountingControl {
    /// Settings at start.
    pub fn new(
        level: Level,
        thresholds: Thresholds,
        frac_bits: u8,
        sample_interval_ns: u64,
    ) -> Self {
        let control = AccountingControl {
            level: AtomicU8::new(level as u8),
            thresholds: PerThreshold::default(),
            frac_bits,
            sample_interval_ns,
            trace: None,
        };
        control.set_thresholds(thresholds);
        control
    }

    /// These settings, with the tracepoints `catalog` found for level full to open.
    pub fn with_trace(mut self, catalog: switches::events::TraceCatalog) -> Self {
        self.trace = Some(catalog);
        self
    }

    /// The tracepoints level full opens on each vCPU thread (None: none, as if turned off).
    pub fn trace(&self) -> Option<&switches::events::TraceCatalog> {
        self.trace.as_ref()
    }

    /// The KVM backend module of this host, if known (for reasons given in reports).
    pub fn trace_backend(&self) -> Option<&'static str> {
        self.trace.as_ref().and_then(|t| t.backend())
    }

    /// The current level.
    #[inline]
    pub fn level(&self) -> Level {
        Level::from_u8(self.level.load(Ordering::Relaxed))
    }

    /// Switches the level; each vCPU applies it at its next exit.
    pub fn set_level(&self, level: Level) {
        self.level.store(level as u8, Ordering::Relaxed);
    }

    /// The value of threshold `t` (0: off).
    #[inline]
    pub fn threshold(&self, t: Threshold) -> u64 {
        self.thresholds[t].load(Ordering::Relaxed)
    }

    /// The current thresholds.
    pub fn thresholds(&self) -> Thresholds {
        let mut out = Thresholds::default();
        for t in Threshold::ALL {
            t.set(&mut out, self.threshold(t));
        }
        out
    }

    /// Replaces the thresholds.
    pub fn set_thresholds(&self, t: Thresholds) {
        for k in Threshold::ALL {
            self.thresholds[k].store(k.of(&t), Ordering::Relaxed);
        }
    }

    /// Fractional bits of every histogram.
    pub fn frac_bits(&self) -> u8 {
        self.frac_bits
    }

    /// Sampler window.
    pub fn sample_interval_ns(&self) -> u64 {
        self.sample_interval_ns
    }
}

impl Default for AccountingControl {
    fn default() -> Self {
        AccountingControl::new(
            Level::Basic,
            Thresholds::default(),
            histogram::DEFAULT_FRAC_BITS,
            10_000_000,
        )
    }
}
