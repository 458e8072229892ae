//! Cost of recording into a log-linear histogram (the per-exit hot path) and of the slot
//! computation alone.

use std::hint::black_box;

use criterion::{criterion_main, Criterion};
use ppa_vmm::accounting::histogram::{slot_of, Histogram, DEFAULT_FRAC_BITS};

/// Precomputed values spread over 1 ns..~1 s (log-uniform-ish), like exit and run durations.
fn values() -> Vec<u64> {
    let mut x = 0x2545_f491_4f6c_dd1du64;
    (0..4096)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            // Top bits: a mantissa; next bits: a shift of 0..=29.
            (x >> 44) >> ((x >> 20) % 30)
        })
        .collect()
}

fn bench_record(c: &mut Criterion) {
    let h = Histogram::new(DEFAULT_FRAC_BITS).expect("valid frac_bits");
    let vals = values();
    let mut i = 0usize;
    c.bench_function("histogram_record", |b| {
        b.iter(|| {
            let v = black_box(vals[i & (vals.len() - 1)]);
            i = i.wrapping_add(1);
            h.record(v);
        })
    });
    black_box(h.snapshot().count());
}

fn bench_slot_of(c: &mut Criterion) {
    let vals = values();
    let mut i = 0usize;
    c.bench_function("slot_of", |b| {
        b.iter(|| {
            let v = black_box(vals[i & (vals.len() - 1)]);
            i = i.wrapping_add(1);
            slot_of(v, black_box(DEFAULT_FRAC_BITS))
        })
    });
}

/// The benchmark group (criterion's macro makes an undocumented `pub fn`).
mod group {
    #![allow(missing_docs)]
    use super::{bench_record, bench_slot_of};
    use criterion::criterion_group;

    criterion_group!(benches, bench_record, bench_slot_of);
}

criterion_main!(group::benches);
