//! Unit tests of the log-linear histograms (kept apart to keep histogram.rs short).
use super::*;

#[test]
fn slot_counts() {
    assert_eq!(slot_count(0), 65);
    assert_eq!(slot_count(3), 496);
    assert_eq!(slot_count(5), 1920);
    for f in 0..=MAX_FRAC_BITS {
        assert_eq!(slot_of(u64::MAX, f), slot_count(f) - 1);
        assert_eq!(slot_bounds(slot_count(f) - 1, f).1, u64::MAX);
        assert_eq!(slot_of(0, f), 0);
    }
}

#[test]
fn slots_partition_u64() {
    for f in 0..=MAX_FRAC_BITS {
        let n = slot_count(f);
        let mut next = 0u64;
        for s in 0..n {
            let (lo, hi) = slot_bounds(s, f);
            assert_eq!(lo, next, "gap before slot {s} f {f}");
            assert!(lo <= hi);
            assert_eq!(slot_of(lo, f), s, "lo of slot {s} f {f}");
            assert_eq!(slot_of(hi, f), s, "hi of slot {s} f {f}");
            let mid = lo + (hi - lo) / 2;
            assert_eq!(slot_of(mid, f), s);
            if s + 1 < n {
                assert_eq!(slot_of(hi + 1, f), s + 1, "hi+1 of slot {s} f {f}");
                next = hi + 1;
            } else {
                assert_eq!(hi, u64::MAX);
            }
        }
    }
}

#[test]
fn exact_slots_below_two_to_the_f_plus_one() {
    for f in 0..=MAX_FRAC_BITS {
        for v in 0..(1u64 << (f + 1)) {
            assert_eq!(slot_of(v, f), v as usize);
            assert_eq!(slot_bounds(v as usize, f), (v, v));
        }
    }
}

#[test]
fn relative_width_bounded() {
    for f in 0..=MAX_FRAC_BITS {
        for s in 0..slot_count(f) {
            let (lo, hi) = slot_bounds(s, f);
            let width = u128::from(hi - lo) + 1;
            // width / lo <= 2^-f  <=>  width << f <= lo (lo > 0 when width > 1).
            if width > 1 {
                assert!(width << f <= u128::from(lo), "slot {s} f {f}");
            }
        }
    }
}

#[test]
fn matches_kstats_reference() {
    // Straight transcription of kstats_record()'s slot computation.
    fn kstats(v: u64, f: u8) -> usize {
        let fls = |x: u64| 64 - x.leading_zeros() as u64;
        let bucket = fls(v >> f);
        let mask = (1u64 << f) - 1;
        (if bucket == 0 {
            v
        } else {
            (bucket << f) | ((v >> (bucket - 1)) & mask)
        }) as usize
    }
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for f in 0..=MAX_FRAC_BITS {
        for _ in 0..10_000 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let v = x >> (x % 64);
            assert_eq!(slot_of(v, f), kstats(v, f));
        }
    }
}

#[test]
fn new_rejects_too_many_bits() {
    assert_eq!(Histogram::new(6).unwrap_err(), HistogramError::FracBits(6));
    assert!(Histogram::new(5).is_ok());
    assert!(Histogram::new(0).is_ok());
    assert_eq!(Histogram::new(3).unwrap().frac_bits(), 3);
}

#[test]
fn record_and_snapshot() {
    let h = Histogram::new(3).unwrap();
    assert_eq!(h.snapshot(), HistogramSnapshot::empty(3));
    for v in [0, 1, 7, 100, 100, 1_000_000, u64::MAX] {
        h.record(v);
    }
    let s = h.snapshot();
    assert_eq!(s.count(), 7);
    assert_eq!(s.counts.len(), slot_count(3));
    assert_eq!(s.counts[slot_of(100, 3)], 2);
    assert_eq!(s.sums[slot_of(100, 3)], 200);
    assert_eq!(s.counts[slot_of(7, 3)], 1);
    assert_eq!(s.max, u64::MAX);
    let expect = 1u64 + 7 + 200 + 1_000_000;
    assert_eq!(s.sum(), expect.wrapping_add(u64::MAX));
    let j = s.to_json();
    assert_eq!(j.count, 7);
    assert_eq!(j.slots.len(), 6);
    assert!(j.slots.windows(2).all(|w| w[0].slot < w[1].slot));
    assert!(format!("{h:?}").contains("count: 7"));
}

#[test]
fn concurrent_snapshot_is_consistent() {
    let h = std::sync::Arc::new(Histogram::new(3).unwrap());
    let w = h.clone();
    let writer = std::thread::spawn(move || {
        for v in 0..200_000u64 {
            w.record(v);
        }
    });
    let mut last = 0;
    while !writer.is_finished() {
        let s = h.snapshot();
        assert!(s.count() >= last);
        last = s.count();
        if s.count() > 0 {
            let top = s.counts.iter().rposition(|&c| c != 0).unwrap();
            let (lo, hi) = slot_bounds(top, 3);
            assert!(s.max >= lo && s.max <= hi);
        }
    }
    writer.join().unwrap();
    assert_eq!(h.snapshot().count(), 200_000);
    assert_eq!(h.snapshot().max, 199_999);
}

#[test]
fn since_baseline() {
    let h = Histogram::new(3).unwrap();
    for v in [10, 20, 5000] {
        h.record(v);
    }
    let base = h.snapshot();
    assert_eq!(h.snapshot().since(&base), HistogramSnapshot::empty(3));
    for v in [10, 30, 40] {
        h.record(v);
    }
    let d = h.snapshot().since(&base);
    assert_eq!(d.count(), 3);
    assert_eq!(d.sum(), 80);
    assert_eq!(d.counts[slot_of(10, 3)], 1);
    assert_eq!(d.counts[slot_of(5000, 3)], 0);
    // The raw max (5000) predates the baseline: bounded by the top slot of the difference.
    let (lo, hi) = slot_bounds(slot_of(40, 3), 3);
    assert_eq!(hi, 43);
    assert!(d.max >= lo && d.max <= hi);
    assert_eq!(d.max, hi);
    // A new overall max after the baseline is exact.
    h.record(9999);
    let d = h.snapshot().since(&base);
    assert_eq!(d.max, 9999);
    assert_eq!(d.count(), 4);
    // Baseline of another scheme is ignored.
    let cur = h.snapshot();
    assert_eq!(cur.since(&HistogramSnapshot::empty(2)), cur);
}

#[test]
fn merge_snapshots() {
    let a = Histogram::new(3).unwrap();
    let b = Histogram::new(3).unwrap();
    for v in 1..=100 {
        a.record(v);
    }
    for v in 101..=300 {
        b.record(v);
    }
    let mut m = HistogramSnapshot::empty(3);
    m.merge(&a.snapshot());
    m.merge(&b.snapshot());
    assert_eq!(m.count(), 300);
    assert_eq!(m.sum(), 300 * 301 / 2);
    assert_eq!(m.max, 300);
    let both = Histogram::new(3).unwrap();
    for v in 1..=300 {
        both.record(v);
    }
    assert_eq!(m, both.snapshot());

    // Other bits: re-binned, totals kept.
    let c = Histogram::new(5).unwrap();
    for v in [3, 1000, 123_456] {
        c.record(v);
    }
    let mut m2 = HistogramSnapshot::empty(3);
    m2.merge(&c.snapshot());
    assert_eq!(m2.count(), 3);
    assert_eq!(m2.sum(), 3 + 1000 + 123_456);
    assert_eq!(m2.counts[slot_of(1000, 3)], 1);
    assert_eq!(m2.max, 123_456);
}

#[test]
fn quantiles_uniform() {
    for f in 0..=MAX_FRAC_BITS {
        let h = Histogram::new(f).unwrap();
        for v in 1..=1000 {
            h.record(v);
        }
        let s = h.snapshot();
        for (q, truth) in [(0.5, 500u64), (0.9, 900), (0.99, 990), (0.999, 999)] {
            let got = s.quantile(q);
            let (lo, hi) = slot_bounds(slot_of(truth, f), f);
            assert!(got >= lo && got <= hi, "f {f} q {q} got {got}");
            assert!(got.abs_diff(truth) <= hi - lo, "f {f} q {q} got {got}");
        }
        assert_eq!(s.quantile(1.0), 1000);
        assert_eq!(s.quantile(0.0), 1);
        assert_eq!(s.quantile(f64::NAN), 1);
        assert_eq!(s.quantile(7.0), 1000);
    }
    let h = Histogram::new(3).unwrap();
    for v in 1..=1000 {
        h.record(v);
    }
    let j = h.snapshot().to_json();
    assert!(j.p50.abs_diff(500) <= 32, "p50 {}", j.p50);
    assert_eq!(j.avg, 500);
    assert_eq!(j.max, 1000);
    assert!(j.p999 <= 1000);
}

#[test]
fn quantiles_edge_cases() {
    assert_eq!(HistogramSnapshot::empty(3).quantile(0.5), 0);
    let h = Histogram::new(3).unwrap();
    h.record(12345);
    let s = h.snapshot();
    for q in [0.0, 0.5, 0.99, 1.0] {
        let got = s.quantile(q);
        let (lo, _) = slot_bounds(slot_of(12345, 3), 3);
        assert!(got >= lo && got <= 12345, "q {q} got {got}");
    }
    assert_eq!(s.quantile(1.0), 12345);
    // Exact slots give exact quantiles.
    let h = Histogram::new(3).unwrap();
    for v in [1, 2, 3, 4] {
        h.record(v);
    }
    let s = h.snapshot();
    assert_eq!(s.quantile(0.25), 1);
    assert_eq!(s.quantile(0.5), 2);
    assert_eq!(s.quantile(0.75), 3);
    assert_eq!(s.quantile(1.0), 4);
}

#[test]
fn json_serializes() {
    let h = Histogram::new(3).unwrap();
    h.record(100);
    h.record(300);
    let v = serde_json::to_value(h.snapshot().to_json()).unwrap();
    assert_eq!(v["count"], 2);
    assert_eq!(v["sum"], 400);
    assert_eq!(v["avg"], 200);
    assert_eq!(v["max"], 300);
    assert_eq!(v["slots"].as_array().unwrap().len(), 2);
    assert_eq!(v["slots"][0]["lo"], 96);
    assert_eq!(v["slots"][0]["hi"], 103);
    for k in ["p50", "p90", "p99", "p999", "frac_bits"] {
        assert!(v.get(k).is_some(), "{k}");
    }
}

#[derive(Debug, PartialEq)]
struct Line {
    slot: usize,
    who: String,
    id: usize,
    count: u64,
    avg: u64,
    p: f64,
}

fn parse(line: &str) -> Line {
    let f: Vec<&str> = line.split(' ').collect();
    assert_eq!(f.len(), 10, "{line}");
    assert_eq!((f[0], f[4], f[6], f[8]), ("slot", "count", "avg", "p"));
    assert!(f[1..].iter().all(|x| !x.is_empty()));
    let p_str = f[9];
    assert_eq!(p_str.split('.').nth(1).unwrap().len(), 6, "{line}");
    Line {
        slot: f[1].parse().unwrap(),
        who: f[2].to_string(),
        id: f[3].parse().unwrap(),
        count: f[5].parse().unwrap(),
        avg: f[7].parse().unwrap(),
        p: p_str.parse().unwrap(),
    }
}

#[test]
fn kstats_text_format() {
    let a = Histogram::new(3).unwrap();
    let b = Histogram::new(3).unwrap();
    for v in [100, 100, 102, 5000] {
        a.record(v);
    }
    for v in [101, 7000, 7000, 7000] {
        b.record(v);
    }
    let text = kstats_text(
        "guest run",
        &[
            (0, a.snapshot()),
            (3, b.snapshot()),
            (5, HistogramSnapshot::empty(3)),
        ],
    );
    let mut lines = text.lines();
    assert_eq!(lines.next().unwrap(), "# histogram guest_run frac_bits 3");
    let parsed: Vec<Line> = lines.map(parse).collect();
    let s100 = slot_of(100, 3);
    let s5000 = slot_of(5000, 3);
    let s7000 = slot_of(7000, 3);
    let l = |slot, who: &str, id, count, avg, p| Line {
        slot,
        who: who.to_string(),
        id,
        count,
        avg,
        p,
    };
    let expect = vec![
        l(s100, "vcpu", 0, 3, 100, 0.75),
        l(s100, "vcpu", 3, 1, 101, 0.25),
        l(s100, "vcpus", 3, 4, 100, 0.5),
        l(s5000, "vcpu", 0, 1, 5000, 1.0),
        l(s5000, "vcpus", 3, 1, 5000, 0.625),
        l(s7000, "vcpu", 3, 3, 7000, 1.0),
        l(s7000, "vcpus", 3, 3, 7000, 1.0),
    ];
    assert_eq!(parsed, expect);
    assert!(text.ends_with('\n'));

    // No vCPUs: just the header.
    assert_eq!(kstats_text("x", &[]), "# histogram x frac_bits 3\n");
}
