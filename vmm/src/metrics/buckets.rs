//! Prometheus histogram buckets from the accounting's log-linear histograms.
//!
//! The accounting keeps kstats-style histograms ([`HistogramSnapshot`]: a count and a sum per
//! slot, 496 slots at the default 3 fractional bits). A Prometheus histogram has a fixed set
//! of upper bounds (`le`) shared by every series of a family. This module maps slots onto
//! [`LE_NS`]: powers of two in nanoseconds, 256 ns to 2^30 ns (about 1.07 s), a factor of 4
//! apart, and `+Inf`.
//!
//! Every power of two is the lower bound of a slot whatever the fractional bits (0 to 5), so
//! each bucket holds whole slots and its cumulative count is exact: `_bucket{le="X"}` counts
//! the samples below X nanoseconds (a sample of exactly X ns, a one-nanosecond edge, counts in
//! the next bucket). No interpolation happens here; `_sum` and `_count` are the histogram's
//! own sum and count.
//!
//! Why 12 coarse bounds and not the 496 slots: the per-vCPU families cost `(12 + 3)` series
//! per histogram and vCPU, 2,880 series for three histograms on 64 vCPUs; quantiles from them
//! (`histogram_quantile`) are within a factor of 4, and the exact percentiles stay available
//! from the socket (`histogram` command, within one slot width).

use ppa_vmm_api::HistogramJson;

use crate::accounting::histogram::{slot_of, HistogramSnapshot};

/// The finite upper bounds of every histogram family, nanoseconds: `2^8, 2^10, ..., 2^30`.
pub const LE_NS: [u64; 12] = {
    let mut le = [0u64; 12];
    let mut i = 0;
    while i < le.len() {
        le[i] = 1 << (8 + 2 * i);
        i += 1;
    }
    le
};

/// One histogram in Prometheus form: samples per bucket (not cumulative; the last entry is
/// the `+Inf` bucket: samples of `2^30` ns and more), their count and their sum.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Buckets {
    /// Samples per bucket: `[i]` for `i < LE_NS.len()` counts samples in
    /// `[LE_NS[i-1], LE_NS[i])`, the last one samples of `LE_NS[11]` ns or more.
    pub per_bucket: [u64; LE_NS.len() + 1],
    /// Number of samples: the sum of `per_bucket`.
    pub count: u64,
    /// Sum of the samples, nanoseconds (wrapping, like the recorder).
    pub sum_ns: u64,
}

impl Buckets {
    /// The buckets of a snapshot (any fractional bits).
    pub fn of_snapshot(h: &HistogramSnapshot) -> Buckets {
        let mut b = Buckets::default();
        // Bucket i holds slots [start, slot_of(LE_NS[i])): slot_of(LE) is the first slot of
        // values >= LE. Sums of slices (no branch per slot).
        let sum = |slots: &[u64]| slots.iter().fold(0u64, |a, &c| a.wrapping_add(c));
        let mut start = 0;
        for (i, le) in LE_NS.iter().enumerate() {
            let end = slot_of(*le, h.frac_bits).clamp(start, h.counts.len());
            b.per_bucket[i] = sum(&h.counts[start..end]);
            start = end;
        }
        b.per_bucket[LE_NS.len()] = sum(&h.counts[start..]);
        b.count = b.per_bucket.iter().fold(0, |a, &c| a.saturating_add(c));
        b.sum_ns = h.sum();
        b
    }

    /// The buckets of a JSON export (a limit's overshoot histogram): a slot goes into the
    /// first bucket whose bound is above its highest value.
    pub fn of_json(h: &HistogramJson) -> Buckets {
        let mut b = Buckets::default();
        for s in &h.slots {
            let i = LE_NS
                .iter()
                .position(|&le| s.hi < le)
                .unwrap_or(LE_NS.len());
            b.per_bucket[i] = b.per_bucket[i].saturating_add(s.count);
        }
        b.count = b.per_bucket.iter().fold(0, |a, &c| a.saturating_add(c));
        b.sum_ns = h.sum;
        b
    }

    /// Adds another histogram's buckets (merging vCPUs).
    pub fn merge(&mut self, o: &Buckets) {
        for (a, b) in self.per_bucket.iter_mut().zip(&o.per_bucket) {
            *a = a.saturating_add(*b);
        }
        self.count = self.count.saturating_add(o.count);
        self.sum_ns = self.sum_ns.wrapping_add(o.sum_ns);
    }

    /// `(le in ns, cumulative count)` for every bucket, `+Inf` (`None`) last, whose count is
    /// `count`: `_bucket{le="+Inf"}` always equals `_count`.
    pub fn cumulative(&self) -> impl Iterator<Item = (Option<u64>, u64)> + '_ {
        let mut total = 0u64;
        LE_NS
            .iter()
            .zip(&self.per_bucket)
            .map(move |(&le, &c)| {
                total = total.saturating_add(c);
                (Some(le), total)
            })
            .chain(std::iter::once((None, self.count)))
    }
}
