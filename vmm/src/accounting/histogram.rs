//! Log-linear latency histograms, as in kstats (seed 003; spec section 4, "Histograms").
//!
//! This module owns the histogram data structure of the accounting layer: the slot scheme
//! ([`slot_of`], [`slot_bounds`], [`slot_count`]), the single-writer recorder
//! ([`Histogram`]), the plain-data readings ([`HistogramSnapshot`]) with their arithmetic
//! (baselines, merging, quantiles) and the two export forms: JSON ([`HistogramJson`]) and the
//! kstats text form ([`kstats_text`]).
//!
//! # Slot scheme
//!
//! A value `v` (u64 nanoseconds) keeps `1 + f` significant bits, where `f` is the number of
//! fractional bits (`0..=`[`MAX_FRAC_BITS`], default [`DEFAULT_FRAC_BITS`]). Exactly as in
//! `kstats_record()`:
//!
//! ```text
//! b    = fls64(v >> f)                  // 0 when v < 2^f; fls64(x) = 64 - leading_zeros(x)
//! slot = b == 0 ? v : (b << f) | ((v >> (b - 1)) & (2^f - 1))
//! ```
//!
//! Both branches are one expression, `(b << f) | ((v >> max(b, 1) - 1) & (2^f - 1))`, because
//! `v & (2^f - 1) == v` when `b == 0`; [`slot_of`] computes it without branches or loops.
//!
//! Bounds of slot `s` (both inclusive), with `b = s >> f` and `m = s & (2^f - 1)`:
//!
//! - `b == 0` (`s < 2^f`): `lo = hi = s` — each value below `2^f` has its own slot;
//! - `b >= 1`: `lo = (2^f + m) << (b - 1)`, `hi = lo + 2^(b - 1) - 1`.
//!
//! For `b == 1` this again gives `lo = hi = s`, so values below `2^(f + 1)` are exact. Each
//! power-of-two range `[2^e, 2^(e+1) - 1]` with `e >= f` is bucket `b = e - f + 1`, split into
//! `2^f` equal sub-ranges of width `2^(b-1)`. Because `lo >= 2^f * 2^(b-1)`, a slot's width
//! relative to any value in it is at most `2^-f` (12.5 % at the default `f = 3`). The highest
//! bucket is `b = 64 - f` and its last slot ends at `u64::MAX`, so there are
//! [`slot_count`]`(f) = (65 - f) << f` slots (65 for `f = 0`, 496 for `f = 3`, 1920 for
//! `f = 5`), partitioning all of u64 without gaps.
//!
//! # Data flow
//!
//! - The vCPU thread is the only writer of its histograms: [`Histogram::record`] is a relaxed
//!   load and store of a slot's count and sum and of the max (no locked instruction, no
//!   allocation, no syscall; the storage is allocated once in [`Histogram::new`]).
//! - Any thread reads with [`Histogram::snapshot`], which copies the slots into a
//!   [`HistogramSnapshot`] (plain data). A snapshot is not atomic across slots: a sample being
//!   recorded concurrently may be missing or only partly visible (its count without its sum),
//!   never more than the samples in flight (one, with one writer).
//! - Reading never resets. A reset is a baseline snapshot that readers keep and subtract
//!   ([`HistogramSnapshot::since`]); the vCPU thread never sees it. Per-vCPU snapshots are
//!   combined with [`HistogramSnapshot::merge`], and exported with
//!   [`HistogramSnapshot::to_json`] or [`kstats_text`].

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

/// Fractional bits used when the configuration does not say otherwise.
pub const DEFAULT_FRAC_BITS: u8 = 3;

/// Largest number of fractional bits accepted (as in kstats).
pub const MAX_FRAC_BITS: u8 = 5;

/// Errors of histogram construction.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum HistogramError {
    /// The number of fractional bits is above [`MAX_FRAC_BITS`].
    #[error("histogram fractional bits {0} out of range 0..={MAX_FRAC_BITS}")]
    FracBits(u8),
}

/// Number of slots of a histogram with `frac_bits` fractional bits: `(65 - f) << f`.
///
/// `frac_bits` must be at most [`MAX_FRAC_BITS`] (values up to 63 still give the slot count
/// of the scheme, but such histograms are not supported).
pub const fn slot_count(frac_bits: u8) -> usize {
    (65 - frac_bits as usize) << frac_bits
}

/// The slot of value `v` with `frac_bits` fractional bits (see the module doc for the
/// formula). Pure, branch-free and loop-free; always below [`slot_count`]`(frac_bits)`.
///
/// `frac_bits` must be at most [`MAX_FRAC_BITS`].
#[inline(always)]
pub fn slot_of(v: u64, frac_bits: u8) -> usize {
    let f = u32::from(frac_bits);
    debug_assert!(frac_bits <= MAX_FRAC_BITS);
    let mask = (1u64 << f) - 1;
    // fls64(v >> f): 0 when v < 2^f, else the 1-based position of the leading one.
    let b = u64::from(64 - (v >> f).leading_zeros());
    // For b == 0 the shift is 0 and `v & mask == v`: the exact slots need no branch.
    let shift = b.saturating_sub(1);
    ((b << f) | ((v >> shift) & mask)) as usize
}

/// Inclusive bounds `(lo, hi)` of `slot` with `frac_bits` fractional bits (see the module doc).
///
/// `slot` must be below [`slot_count`]`(frac_bits)`; larger slots are clamped to the last one
/// (which ends at `u64::MAX`).
pub fn slot_bounds(slot: usize, frac_bits: u8) -> (u64, u64) {
    let slot = slot.min(slot_count(frac_bits) - 1) as u64;
    let f = u32::from(frac_bits);
    let b = slot >> f;
    if b == 0 {
        return (slot, slot);
    }
    let m = slot & ((1u64 << f) - 1);
    // (2^f + m) < 2^(f+1) and b - 1 <= 63 - f: no overflow.
    let lo = ((1u64 << f) + m) << (b - 1);
    let hi = lo + ((1u64 << (b - 1)) - 1);
    (lo, hi)
}

/// One slot of a [`Histogram`]: its count and sum side by side (one cache line access).
#[derive(Default)]
struct Slot {
    count: AtomicU64,
    sum: AtomicU64,
}

/// Single-writer histogram: one thread records, any thread snapshots. Storage is allocated
/// once in [`Histogram::new`].
pub struct Histogram {
    slots: Box<[Slot]>,
    max: AtomicU64,
    frac_bits: u8,
}

impl fmt::Debug for Histogram {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let count: u64 = self
            .slots
            .iter()
            .map(|s| s.count.load(Ordering::Relaxed))
            .fold(0, u64::wrapping_add);
        f.debug_struct("Histogram")
            .field("frac_bits", &self.frac_bits)
            .field("slots", &self.slots.len())
            .field("count", &count)
            .field("max", &self.max.load(Ordering::Relaxed))
            .finish()
    }
}

impl Histogram {
    /// An empty histogram with `frac_bits` fractional bits (at most [`MAX_FRAC_BITS`]).
    pub fn new(frac_bits: u8) -> Result<Self, HistogramError> {
        if frac_bits > MAX_FRAC_BITS {
            return Err(HistogramError::FracBits(frac_bits));
        }
        let slots = (0..slot_count(frac_bits))
            .map(|_| Slot::default())
            .collect::<Vec<_>>()
            .into_boxed_slice();
        Ok(Histogram {
            slots,
            max: AtomicU64::new(0),
            frac_bits,
        })
    }

    /// Its number of fractional bits.
    pub fn frac_bits(&self) -> u8 {
        self.frac_bits
    }

    /// Records one value. Only the single writer (the owning vCPU thread) may call this: it is
    /// a relaxed load and store of the slot's count, its sum (wrapping) and the max — no
    /// read-modify-write instruction, no allocation, no syscall — so concurrent writers would
    /// lose updates.
    #[inline]
    pub fn record(&self, v: u64) {
        // slot_of() < slot_count(frac_bits) == slots.len() (frac_bits checked in new()), so
        // the bounds check never fails and is predicted.
        let s = &self.slots[slot_of(v, self.frac_bits)];
        s.count.store(
            s.count.load(Ordering::Relaxed).wrapping_add(1),
            Ordering::Relaxed,
        );
        s.sum.store(
            s.sum.load(Ordering::Relaxed).wrapping_add(v),
            Ordering::Relaxed,
        );
        if v > self.max.load(Ordering::Relaxed) {
            self.max.store(v, Ordering::Relaxed);
        }
    }

    /// Copies the histogram (any thread). The slots are read before the max (the writer
    /// stores them in the opposite order), and the max is then clamped into the bounds of the
    /// highest non-empty slot, so the snapshot is self-consistent even when it races with
    /// [`Histogram::record`].
    pub fn snapshot(&self) -> HistogramSnapshot {
        let mut counts = Vec::with_capacity(self.slots.len());
        let mut sums = Vec::with_capacity(self.slots.len());
        for s in self.slots.iter() {
            counts.push(s.count.load(Ordering::Relaxed));
            sums.push(s.sum.load(Ordering::Relaxed));
        }
        let raw_max = self.max.load(Ordering::Relaxed);
        let max = consistent_max(&counts, self.frac_bits, raw_max);
        HistogramSnapshot {
            frac_bits: self.frac_bits,
            counts,
            sums,
            max,
        }
    }
}

/// `raw_max` clamped into `[lo, hi]` of the highest non-empty slot of `counts`; 0 if all are
/// empty.
fn consistent_max(counts: &[u64], frac_bits: u8, raw_max: u64) -> u64 {
    match counts.iter().rposition(|&c| c != 0) {
        Some(top) => {
            let (lo, hi) = slot_bounds(top, frac_bits);
            raw_max.clamp(lo, hi)
        }
        None => 0,
    }
}

/// A reading of a [`Histogram`] (plain data): per-slot counts and sums, indexed by slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HistogramSnapshot {
    /// Fractional bits of the slot scheme.
    pub frac_bits: u8,
    /// Samples per slot ([`slot_count`]`(frac_bits)` entries).
    pub counts: Vec<u64>,
    /// Sum of the samples per slot, nanoseconds (wrapping).
    pub sums: Vec<u64>,
    /// Largest sample, nanoseconds (0 when empty). Always within the bounds of the highest
    /// non-empty slot.
    pub max: u64,
}

impl HistogramSnapshot {
    /// A snapshot with no samples (`frac_bits` is clamped to [`MAX_FRAC_BITS`]).
    pub fn empty(frac_bits: u8) -> Self {
        let frac_bits = frac_bits.min(MAX_FRAC_BITS);
        let n = slot_count(frac_bits);
        HistogramSnapshot {
            frac_bits,
            counts: vec![0; n],
            sums: vec![0; n],
            max: 0,
        }
    }

    /// Number of samples.
    pub fn count(&self) -> u64 {
        self.counts.iter().fold(0, |a, &c| a.saturating_add(c))
    }

    /// Sum of the samples, nanoseconds (wrapping, like the recorder).
    pub fn sum(&self) -> u64 {
        self.sums.iter().fold(0, |a, &s| a.wrapping_add(s))
    }

    /// What was recorded since `baseline` (a snapshot of the same histogram taken earlier,
    /// e.g. at a reset): per-slot saturating subtraction of counts and sums (a slot whose
    /// count difference is 0 gets sum 0).
    ///
    /// The max cannot be subtracted. The result's max is `min(raw max, hi)`, where `hi` is the
    /// upper bound of the highest non-empty slot of the difference (0 if the difference is
    /// empty). It is exact when the overall max was recorded after the baseline (it then lies
    /// in that slot); otherwise it is an upper bound of the true max since the baseline, at most
    /// one slot width (relative error `2^-f`) above it, since both lie in that slot.
    ///
    /// A baseline with other fractional bits or slot count is not of this histogram; it is
    /// treated as empty (the result is a copy of `self`).
    pub fn since(&self, baseline: &HistogramSnapshot) -> HistogramSnapshot {
        if baseline.frac_bits != self.frac_bits
            || baseline.counts.len() != self.counts.len()
            || baseline.sums.len() != self.sums.len()
        {
            return self.clone();
        }
        let counts: Vec<u64> = self
            .counts
            .iter()
            .zip(&baseline.counts)
            .map(|(c, b)| c.saturating_sub(*b))
            .collect();
        let sums = self
            .sums
            .iter()
            .zip(&baseline.sums)
            .zip(&counts)
            .map(|((s, b), &c)| if c == 0 { 0 } else { s.saturating_sub(*b) })
            .collect();
        let max = match counts.iter().rposition(|&c| c != 0) {
            Some(top) => self.max.min(slot_bounds(top, self.frac_bits).1),
            None => 0,
        };
        HistogramSnapshot {
            frac_bits: self.frac_bits,
            counts,
            sums,
            max,
        }
    }

    /// Adds another snapshot with the same frac_bits (merging vCPUs): counts (saturating),
    /// sums (wrapping) and the max.
    ///
    /// A snapshot with other fractional bits is re-binned: each of its non-empty slots goes
    /// whole into the slot of `self` that holds its average (a slot's resolution is kept when
    /// going to more bits and reduced to `self`'s when going to fewer).
    pub fn merge(&mut self, other: &HistogramSnapshot) {
        let n = slot_count(self.frac_bits);
        self.counts.resize(n, 0);
        self.sums.resize(n, 0);
        if other.frac_bits == self.frac_bits {
            for (c, o) in self.counts.iter_mut().zip(&other.counts) {
                *c = c.saturating_add(*o);
            }
            for (s, o) in self.sums.iter_mut().zip(&other.sums) {
                *s = s.wrapping_add(*o);
            }
        } else {
            for (i, (&c, &s)) in other.counts.iter().zip(&other.sums).enumerate() {
                if c == 0 {
                    continue;
                }
                let (lo, hi) = slot_bounds(i, other.frac_bits);
                let avg = (s / c).clamp(lo, hi);
                let j = slot_of(avg, self.frac_bits);
                self.counts[j] = self.counts[j].saturating_add(c);
                self.sums[j] = self.sums[j].wrapping_add(s);
            }
        }
        self.max = self.max.max(other.max);
    }

    /// Value at quantile `q` in `[0, 1]` (clamped; NaN counts as 0); 0 when empty.
    ///
    /// The slot is the first one where the cumulative count reaches `k = max(1, ceil(q *
    /// count))`, i.e. the slot that holds the k-th smallest sample; the result interpolates
    /// linearly inside `[lo, hi]` of that slot by the position of `q * count` among its samples,
    /// and is clamped to the max. Error bound: the result and the true k-th sample lie in the
    /// same slot, so they differ by less than one slot width (`hi - lo + 1`), i.e. by at most
    /// `2^-f` of the value (0 for values below `2^(f+1)`, whose slots are exact).
    pub fn quantile(&self, q: f64) -> u64 {
        let total = self.count();
        if total == 0 {
            return 0;
        }
        let q = if q.is_nan() { 0.0 } else { q.clamp(0.0, 1.0) };
        let pos = q * total as f64;
        // Integer rank of the sample sought, 1-based.
        let k = (pos.ceil() as u64).clamp(1, total);
        let mut before = 0u64;
        for (i, &c) in self.counts.iter().enumerate() {
            if c == 0 {
                continue;
            }
            let after = before.saturating_add(c);
            if after >= k {
                let (lo, hi) = slot_bounds(i, self.frac_bits);
                let frac = ((pos - before as f64) / c as f64).clamp(0.0, 1.0);
                let off = ((hi - lo) as f64 * frac) as u64;
                let v = lo.saturating_add(off).min(hi);
                return v.min(self.max);
            }
            before = after;
        }
        self.max
    }

    /// The JSON export: totals, quantiles and the non-empty slots.
    pub fn to_json(&self) -> HistogramJson {
        let count = self.count();
        let sum = self.sum();
        let slots = self
            .counts
            .iter()
            .zip(&self.sums)
            .enumerate()
            .filter(|(_, (&c, _))| c != 0)
            .map(|(slot, (&count, &sum))| {
                let (lo, hi) = slot_bounds(slot, self.frac_bits);
                SlotJson {
                    slot,
                    lo,
                    hi,
                    count,
                    sum,
                }
            })
            .collect();
        HistogramJson {
            frac_bits: self.frac_bits,
            count,
            sum,
            avg: sum.checked_div(count).unwrap_or(0),
            max: self.max,
            p50: self.quantile(0.5),
            p90: self.quantile(0.9),
            p99: self.quantile(0.99),
            p999: self.quantile(0.999),
            slots,
        }
    }
}

pub use ppa_vmm_api::{HistogramJson, SlotJson};

/// kstats text form: for each non-empty slot S in ascending order, one line per vCPU V with a
/// non-zero count in S:
/// `slot S vcpu V count C avg A p P` then one merged line `slot S vcpus N count C avg A p P`
/// where N = number of vCPUs given, avg = sum/count of that slot (integer ns), and p = the
/// cumulative fraction (0..1, 6 decimals) of that vCPU's (or the merged) samples at or below
/// this slot. Each line self-contained (grep/awk/gnuplot friendly). `name` is printed as a first
/// header line `# histogram NAME frac_bits F`.
///
/// F is the fractional bits of the first snapshot ([`DEFAULT_FRAC_BITS`] if none); snapshots
/// with other bits are re-binned to F as by [`HistogramSnapshot::merge`]. Whitespace and
/// control characters in `name` are printed as `_` so the header stays one line of fields.
pub fn kstats_text(name: &str, per_vcpu: &[(usize, HistogramSnapshot)]) -> String {
    use std::fmt::Write as _;

    let bits = per_vcpu
        .first()
        .map_or(DEFAULT_FRAC_BITS, |(_, h)| h.frac_bits.min(MAX_FRAC_BITS));
    let name: String = name
        .chars()
        .map(|c| {
            if c.is_whitespace() || c.is_control() {
                '_'
            } else {
                c
            }
        })
        .collect();
    // Every vCPU in the same scheme, so slot numbers agree across lines.
    let vcpus: Vec<(usize, HistogramSnapshot)> = per_vcpu
        .iter()
        .map(|(v, h)| {
            let mut r = HistogramSnapshot::empty(bits);
            r.merge(h);
            (*v, r)
        })
        .collect();
    let mut merged = HistogramSnapshot::empty(bits);
    for (_, h) in &vcpus {
        merged.merge(h);
    }
    let totals: Vec<u64> = vcpus.iter().map(|(_, h)| h.count()).collect();
    let merged_total = merged.count();
    let mut cum = vec![0u64; vcpus.len()];
    let mut merged_cum = 0u64;

    let mut out = String::new();
    let _ = writeln!(out, "# histogram {name} frac_bits {bits}");
    let frac = |part: u64, total: u64| {
        if total == 0 {
            0.0
        } else {
            part as f64 / total as f64
        }
    };
    for (slot, &mc) in merged.counts.iter().enumerate() {
        if mc == 0 {
            continue;
        }
        for (i, (v, h)) in vcpus.iter().enumerate() {
            let c = h.counts[slot];
            if c == 0 {
                continue;
            }
            cum[i] = cum[i].saturating_add(c);
            let _ = writeln!(
                out,
                "slot {slot} vcpu {v} count {c} avg {} p {:.6}",
                h.sums[slot] / c,
                frac(cum[i], totals[i]),
            );
        }
        merged_cum = merged_cum.saturating_add(mc);
        let _ = writeln!(
            out,
            "slot {slot} vcpus {} count {mc} avg {} p {:.6}",
            vcpus.len(),
            merged.sums[slot] / mc,
            frac(merged_cum, merged_total),
        );
    }
    out
}

#[cfg(test)]
#[path = "histogram_tests.rs"]
mod tests;
