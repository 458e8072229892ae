//! Unit tests of the mapping from log-linear slots to Prometheus buckets.

use super::buckets::{Buckets, LE_NS};
use crate::accounting::histogram::{
    slot_bounds, slot_of, Histogram, HistogramSnapshot, MAX_FRAC_BITS,
};

/// A small deterministic generator (xorshift64*), so failures reproduce.
fn values(n: usize, seed: u64) -> Vec<u64> {
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            let r = x.wrapping_mul(0x2545_f491_4f6c_dd1d);
            // Log-uniform over 1 ns .. 2^34 ns, plus the bounds themselves and their neighbours.
            match r % 8 {
                0 => LE_NS[(r >> 8) as usize % LE_NS.len()],
                1 => LE_NS[(r >> 8) as usize % LE_NS.len()] - 1,
                _ => (r >> 30) >> ((r >> 3) % 30),
            }
        })
        .collect()
}

fn recorded(frac_bits: u8, vals: &[u64]) -> HistogramSnapshot {
    let h = Histogram::new(frac_bits).unwrap();
    vals.iter().for_each(|&v| h.record(v));
    h.snapshot()
}

#[test]
fn bounds_are_powers_of_two_from_256_ns_to_about_a_second() {
    assert_eq!(LE_NS[0], 256);
    assert_eq!(LE_NS[LE_NS.len() - 1], 1 << 30);
    for w in LE_NS.windows(2) {
        assert_eq!(w[1], w[0] * 4);
    }
}

/// Every bound starts a slot at every supported resolution, so buckets hold whole slots.
#[test]
fn every_bound_starts_a_slot() {
    for f in 0..=MAX_FRAC_BITS {
        for le in LE_NS {
            let (lo, _) = slot_bounds(slot_of(le, f), f);
            assert_eq!(lo, le, "frac_bits {f}");
            let (_, hi) = slot_bounds(slot_of(le - 1, f), f);
            assert_eq!(hi, le - 1, "frac_bits {f}");
        }
    }
}

/// The cumulative counts are exactly the number of samples below each bound.
#[test]
fn cumulative_counts_are_exact() {
    for f in 0..=MAX_FRAC_BITS {
        let vals = values(5_000, 0x9e37_79b9 + u64::from(f));
        let b = Buckets::of_snapshot(&recorded(f, &vals));
        let cum: Vec<(Option<u64>, u64)> = b.cumulative().collect();
        assert_eq!(cum.len(), LE_NS.len() + 1);
        for (i, le) in LE_NS.iter().enumerate() {
            let below = vals.iter().filter(|&&v| v < *le).count() as u64;
            assert_eq!(cum[i], (Some(*le), below), "frac_bits {f}, le {le}");
        }
        assert_eq!(cum[LE_NS.len()], (None, vals.len() as u64));
        assert_eq!(b.count, vals.len() as u64);
        assert_eq!(b.sum_ns, vals.iter().fold(0u64, |a, v| a.wrapping_add(*v)));
    }
}

/// A limit's overshoot arrives as JSON (non-empty slots only); it maps the same way.
#[test]
fn json_export_maps_like_the_snapshot() {
    for f in [0, 3, 5] {
        let snap = recorded(f, &values(2_000, 7 + u64::from(f)));
        assert_eq!(
            Buckets::of_json(&snap.to_json()),
            Buckets::of_snapshot(&snap)
        );
    }
    assert_eq!(
        Buckets::of_json(&HistogramSnapshot::empty(3).to_json()),
        Buckets::default()
    );
}

#[test]
fn merging_adds_buckets_counts_and_sums() {
    let (a, b) = (values(500, 1), values(700, 2));
    let mut m = Buckets::of_snapshot(&recorded(3, &a));
    m.merge(&Buckets::of_snapshot(&recorded(3, &b)));
    let all: Vec<u64> = a.iter().chain(&b).copied().collect();
    assert_eq!(m, Buckets::of_snapshot(&recorded(3, &all)));
}
