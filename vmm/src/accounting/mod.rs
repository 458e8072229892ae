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
//! Definitions of every field are in docs/accounting.md.

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};

pub mod histogram;
pub mod host;
pub mod meter;
pub mod snapshot;

pub use ppa_vmm_api::{Level, Thresholds, THRESHOLD_NAMES};

/// VM-wide accounting settings, shared by every vCPU thread, the sampler and readers.
#[derive(Debug)]
pub struct AccountingControl {
    level: AtomicU8,
    thresholds: [AtomicU64; 4],
    frac_bits: u8,
    sample_interval_ns: u64,
}

impl AccountingControl {
    /// Settings at start.
    pub fn new(
        level: Level,
        thresholds: Thresholds,
        frac_bits: u8,
        sample_interval_ns: u64,
    ) -> Self {
        let t = thresholds;
        AccountingControl {
            level: AtomicU8::new(level as u8),
            thresholds: [
                AtomicU64::new(t.exit_handling_ns),
                AtomicU64::new(t.guest_run_ns),
                AtomicU64::new(t.wakeup_latency_ns),
                AtomicU64::new(t.steal_window_ns),
            ],
            frac_bits,
            sample_interval_ns,
        }
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

    /// Threshold `i` (index into [`THRESHOLD_NAMES`]).
    #[inline]
    pub fn threshold(&self, i: usize) -> u64 {
        self.thresholds[i].load(Ordering::Relaxed)
    }

    /// The current thresholds.
    pub fn thresholds(&self) -> Thresholds {
        Thresholds {
            exit_handling_ns: self.threshold(0),
            guest_run_ns: self.threshold(1),
            wakeup_latency_ns: self.threshold(2),
            steal_window_ns: self.threshold(3),
        }
    }

    /// Replaces the thresholds.
    pub fn set_thresholds(&self, t: Thresholds) {
        let v = [
            t.exit_handling_ns,
            t.guest_run_ns,
            t.wakeup_latency_ns,
            t.steal_window_ns,
        ];
        for (a, v) in self.thresholds.iter().zip(v) {
            a.store(v, Ordering::Relaxed);
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
