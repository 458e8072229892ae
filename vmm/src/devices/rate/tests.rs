use super::*;

const NET: &[&str] = &["rx-bytes", "rx-packets", "tx-bytes", "tx-packets"];
const EX: &str = "tx-bytes:125M/1s";

fn spec(size: u64, refill_ns: u64, burst: u64) -> BucketSpec {
    BucketSpec {
        size,
        refill_ns,
        burst,
    }
}

#[test]
fn buckets_parse_with_units_and_print_back_as_they_parse() {
    let v = parse(
        "tx-bytes:125M/1s+rx-packets:10k/100ms:burst=4Ki+rx-bytes:1Gi/s",
        NET,
        EX,
    )
    .unwrap();
    assert_eq!(
        v,
        vec![
            (2, spec(125_000_000, 1_000_000_000, 0)),
            (1, spec(10_000, 100_000_000, 4096)),
            (0, spec(1 << 30, 1_000_000_000, 0)),
        ]
    );
    assert_eq!(v[1].1.to_string(), "10000/100ms:burst=4096");
    assert_eq!(v[0].1.to_string(), "125000000/1s");
    for (_, b) in &v {
        let again = parse(&format!("tx-bytes:{b}"), NET, EX).unwrap();
        assert_eq!(again[0].1, *b);
    }
    assert_eq!(v[0].1.per_second(), 125_000_000);
    assert_eq!(v[1].1.per_second(), 100_000);
    assert_eq!(spec(3, 1_500_000, 0).to_string(), "3/1500us");
}

#[test]
fn each_bad_bucket_gets_its_own_sentence() {
    let e = |s: &str| parse(s, NET, EX).unwrap_err();
    assert_eq!(e(""), RateSpecError::Empty(EX));
    assert!(matches!(e("tx-bytes"), RateSpecError::Form(..)));
    assert!(matches!(e("tx-bytes:100"), RateSpecError::Form(..)));
    assert!(matches!(e("tx-bytes:1/1s:2"), RateSpecError::Form(..)));
    assert!(matches!(
        e("tx-bytes:1/1s:burst=1:x"),
        RateSpecError::Form(..)
    ));
    assert!(matches!(e("tx-bytes:1/1s+"), RateSpecError::Form(..)));
    let k = e("bytes:1/1s");
    assert_eq!(
        k.to_string(),
        "`bytes` is not something this device limits (it takes rx-bytes, rx-packets, tx-bytes, tx-packets)"
    );
    assert_eq!(
        e("tx-bytes:1/1s+tx-bytes:2/1s"),
        RateSpecError::Duplicate("tx-bytes".into())
    );
    for size in [
        "0",
        "-1",
        "x",
        "1T",
        "281474976710657",
        "1.5M",
        "",
        "99999999999999999999",
    ] {
        assert!(
            matches!(e(&format!("tx-bytes:{size}/1s")), RateSpecError::Size(_)),
            "{size}"
        );
    }
    assert!(matches!(e("tx-bytes:1/1s:burst=0"), RateSpecError::Size(_)));
    for t in ["999us", "0ms", "2h", "1", "ms1", "1.5s", "3601s", "-1s"] {
        assert!(
            matches!(e(&format!("tx-bytes:1/{t}")), RateSpecError::Time(_)),
            "{t}"
        );
    }
    // Quoted input is cut.
    let long = "x".repeat(10_000);
    assert!(e(&format!("tx-bytes:{long}/1s")).to_string().len() < 300);
}

#[test]
fn a_bucket_starts_full_refills_continuously_and_never_past_its_size() {
    // 1,000 bytes per 1 ms: one byte per µs.
    let mut l = Limiter::new(
        &RateSpec {
            bytes: Some(spec(1_000, 1_000_000, 0)),
            ops: None,
        },
        0,
    );
    assert_eq!(l.try_take(0, 600), Ok(()));
    assert_eq!(l.try_take(0, 400), Ok(()));
    assert_eq!(l.bytes().unwrap().tokens(), 0);
    // 500 bytes need 500 µs; the wait is exact (above the floor).
    assert_eq!(l.try_take(0, 500), Err(500_000));
    assert_eq!(l.try_take(499_999, 500), Err(MIN_WAIT_NS));
    assert_eq!(l.try_take(500_000, 500), Ok(()));
    // A long idle refills to the size, no more.
    assert_eq!(l.try_take(10_000_000_000, 1_000), Ok(()));
    assert!(l.try_take(10_000_000_000, 1).is_err());
    // A frame larger than the bucket waits for a full bucket, then owes the rest.
    assert_eq!(l.try_take(10_001_000_000, 3_000), Ok(()));
    assert_eq!(l.try_take(10_001_000_000, 1), Err(2_001_000));
}

#[test]
fn the_one_time_burst_goes_first_and_is_not_refilled() {
    let mut l = Limiter::new(
        &RateSpec {
            bytes: None,
            ops: Some(spec(2, 1_000_000_000, 3)),
        },
        0,
    );
    for _ in 0..5 {
        assert_eq!(l.try_take(0, 0), Ok(()));
    }
    assert_eq!(l.try_take(0, 0), Err(500_000_000));
    // After a full refill only the size is there again.
    for _ in 0..2 {
        assert_eq!(l.try_take(5_000_000_000, 0), Ok(()));
    }
    assert!(l.try_take(5_000_000_000, 0).is_err());
}

#[test]
fn both_buckets_must_hold_the_cost_and_a_refusal_takes_nothing() {
    let mut l = Limiter::new(
        &RateSpec {
            bytes: Some(spec(100, 1_000_000, 0)),
            ops: Some(spec(1, 1_000_000, 0)),
        },
        0,
    );
    assert_eq!(l.try_take(0, 10), Ok(()));
    // The ops bucket is empty: nothing is taken from the bytes bucket either.
    assert_eq!(l.try_take(0, 10), Err(1_000_000));
    assert_eq!(l.bytes().unwrap().tokens(), 90);
}

#[test]
fn receive_goes_on_one_token_and_its_debt_is_waited_for() {
    let mut l = Limiter::new(
        &RateSpec {
            bytes: Some(spec(1_000, 1_000_000, 0)),
            ops: None,
        },
        0,
    );
    assert_eq!(l.admit(0), Ok(()));
    l.charge(0, 1_500);
    // 500 owed and 1 needed: 501 µs.
    assert_eq!(l.admit(0), Err(501_000));
    assert_eq!(l.admit(501_000), Ok(()));
    // Over a long run the rate is exact: 1,000 bytes a ms in 64 KiB frames.
    let mut now = 1_000_000;
    let mut sent = 0u64;
    while now < 1_000_000_000 {
        match l.admit(now) {
            Ok(()) => {
                l.charge(now, 65_536);
                sent += 65_536;
            }
            Err(w) => now += w,
        }
    }
    let expect = 1_000_000u64;
    assert!(sent.abs_diff(expect) <= 65_536 + 1_000, "{sent}");
}

#[test]
fn the_throttle_clock_counts_waits_and_reads_a_wait_in_progress() {
    let c = ThrottleClock::default();
    assert_eq!(c.total_ns(5), 0);
    c.begin(1_000);
    c.begin(1_500);
    assert!(c.waiting());
    assert_eq!(c.total_ns(1_200), 200);
    c.end(1_700);
    c.end(1_900);
    assert!(!c.waiting());
    assert_eq!(c.total_ns(9_999), 700);
    c.begin(10_000);
    assert_eq!(c.total_ns(10_050), 750);
    c.end(10_100);
    assert_eq!(c.total_ns(20_000), 800);
}

#[test]
fn a_spec_says_what_it_limits() {
    let r = RateSpec {
        bytes: Some(spec(10, 1_000_000_000, 0)),
        ops: Some(spec(5, 1_000_000, 0)),
    };
    assert!(r.limits() && !RateSpec::default().limits());
    assert_eq!(
        r.describe("tx-", "packets"),
        vec!["tx-bytes:10/1s", "tx-packets:5/1ms"]
    );
    assert!(SharedLimiter::new(&RateSpec::default()).is_none());
    let s = SharedLimiter::new(&r).unwrap();
    assert_eq!(s.try_take(10), Ok(()));
    assert!(s.try_take(1).is_err());
    assert_eq!(s.spec(), r);
}

/// `set-rate`: new buckets replace the old ones full; no buckets limit nothing; a limiter made
/// without buckets is limited by a later `set`.
#[test]
fn set_replaces_the_buckets_full_and_none_limits_nothing() {
    let one = RateSpec {
        bytes: None,
        ops: Some(spec(2, 1_000_000_000, 0)),
    };
    let s = SharedLimiter::always(&RateSpec::default());
    assert!(!s.limits());
    assert_eq!(s.try_take(1 << 40), Ok(()), "no bucket: nothing waits");
    s.set(&one);
    assert!(s.limits());
    assert_eq!(s.spec(), one);
    assert_eq!(s.try_take(1), Ok(()));
    assert_eq!(s.try_take(1), Ok(()));
    assert!(s.try_take(1).is_err(), "the bucket of 2 is spent");
    // The same buckets again: full again, as Firecracker's update makes them.
    s.set(&one);
    assert_eq!(s.try_take(1), Ok(()));
    s.set(&RateSpec::default());
    assert!(!s.limits());
    assert_eq!(s.spec(), RateSpec::default());
    for _ in 0..10 {
        assert_eq!(s.try_take(1), Ok(()));
    }
}
