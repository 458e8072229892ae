//! The stamp clock against a scripted TSC and clock (its state machine, exactly), and against
//! this host's own (where the TSC is its clocksource).

use super::*;

/// The clock's mode, checked against what its status word says.
fn mode<C: Clocks>(c: &StampClock<C>) -> StampClockMode {
    let (published, drifts) = c.status.read();
    assert_eq!(published, Some(c.mode()), "published mode");
    assert_eq!(drifts, c.drifts, "published drifts");
    c.mode()
}

/// A scripted host: the TSC advances `cost` cycles at each read (of either clock; an anchor's
/// stamp is the clock's read, `cost` after the TSC read the truth is taken at), and CLOCK_MONOTONIC is
/// `origin + cycles × rate` with the rate in ns per cycle, changed at will.
#[derive(Debug)]
struct Script {
    t: u64,
    cost: u64,
    /// The clock's value at TSC `from`, and its rate from there.
    from: u64,
    from_ns: f64,
    rate: f64,
}

impl Script {
    fn new(rate: f64) -> Script {
        Script {
            t: 1_000_000,
            cost: 2,
            from: 0,
            from_ns: 5e9,
            rate,
        }
    }

    /// The clock's value at TSC `t`.
    fn mono_at(&self, t: u64) -> f64 {
        self.from_ns + (t as f64 - self.from as f64) * self.rate
    }

    /// Changes the clock's rate from now on (a slew), keeping it continuous.
    fn set_rate(&mut self, rate: f64) {
        self.from_ns = self.mono_at(self.t);
        self.from = self.t;
        self.rate = rate;
    }
}

impl Clocks for Script {
    fn tsc(&mut self) -> u64 {
        let t = self.t;
        self.t += self.cost;
        t
    }

    fn mono(&mut self) -> u64 {
        let ns = self.mono_at(self.t) as u64;
        self.t += self.cost;
        ns
    }
}

/// Runs `n` stamps `step` cycles apart; returns the largest difference between a stamp and the
/// clock's true value at its TSC read, ns, after `settle` stamps, and checks that no stamp went
/// back.
fn run(c: &mut StampClock<Script>, n: usize, step: u64, settle: usize) -> f64 {
    let mut worst = 0f64;
    let mut last = 0;
    for i in 0..n {
        c.clocks.t += step;
        let truth = c.clocks.mono_at(c.clocks.t);
        let s = c.now_ns();
        assert!(s >= last, "stamp {i} went back: {last} then {s}");
        last = s;
        if i >= settle {
            worst = worst.max((s as f64 - truth).abs());
        }
    }
    worst
}

#[test]
fn stamps_follow_the_clock_once_the_rate_is_known() {
    let mut c = StampClock::with(Script::new(0.408), true);
    // 50,000 cycles between stamps (an exit every ~20 µs): the rate after 2^25 cycles.
    run(&mut c, 1_000, 50_000, 0);
    assert_eq!(
        mode(&c),
        StampClockMode::Tsc,
        "no rate after 5e7 cycles: {c:?}"
    );
    let worst = run(&mut c, 200_000, 50_000, 0);
    // The bracket's middle is the clock's read exactly here: what is left is rounding.
    assert!(worst <= 2.0, "a stamp was {worst} ns off: {c:?}");
    assert_eq!(c.drifts, 0);
}

#[test]
fn the_baseline_moves_on_and_the_rate_always_spans_half_a_window() {
    let mut c = StampClock::with(Script::new(0.4), true);
    let first = {
        run(&mut c, 100, 1_000_000, 0);
        c.base_tsc
    };
    for _ in 0..40 {
        run(&mut c, 1_000, 1_000_000, 0);
        if c.mid_ns != 0 && c.base_tsc != first {
            let span = c.at_tsc - c.base_tsc;
            assert!(
                span >= RATE_WINDOW_CYCLES / 2,
                "the rate spans {span} cycles: {c:?}"
            );
        }
    }
    assert!(c.base_tsc > first, "the baseline never moved: {c:?}");
    assert_eq!(mode(&c), StampClockMode::Tsc);
}

#[test]
fn a_step_in_the_clocks_rate_drops_the_rate_and_it_is_learned_again() {
    let mut c = StampClock::with(Script::new(0.4), true);
    run(&mut c, 5_000, 50_000, 0);
    assert_eq!(mode(&c), StampClockMode::Tsc);
    // chrony's fastest slew: the clock runs 8.3 % fast.
    c.clocks.set_rate(0.4 * 1.083);
    run(&mut c, 100, 50_000, 0);
    assert_eq!(c.drifts, 1, "{c:?}");
    assert_eq!(mode(&c), StampClockMode::Learning, "{c:?}");
    let worst = run(&mut c, 5_000, 50_000, 4_000);
    assert_eq!(
        mode(&c),
        StampClockMode::Tsc,
        "the new rate was not learned: {c:?}"
    );
    assert!(
        worst <= 2.0,
        "a stamp was {worst} ns off the new rate: {c:?}"
    );
}

#[test]
fn a_clock_that_keeps_drifting_is_given_up_and_stamps_are_the_clocks() {
    let mut c = StampClock::with(Script::new(0.4), true);
    let mut rate = 0.4;
    for _ in 0..DRIFTS_MAX {
        run(&mut c, 2_000, 50_000, 0);
        rate *= 1.05;
        c.clocks.set_rate(rate);
    }
    run(&mut c, 100, 50_000, 0);
    assert_eq!(mode(&c), StampClockMode::GivenUp, "{c:?}");
    let worst = run(&mut c, 1_000, 50_000, 0);
    assert!(
        worst <= 1.0,
        "given up, a stamp is the clock's read: {worst} ns off"
    );
}

#[test]
fn brackets_that_are_never_narrow_give_extrapolation_up() {
    let mut script = Script::new(0.4);
    script.cost = PAIR_MAX_CYCLES;
    let mut c = StampClock::with(script, true);
    run(&mut c, FAILED_ANCHORS_MAX as usize + 10, 50_000, 0);
    assert_eq!(mode(&c), StampClockMode::GivenUp, "{c:?}");
}

#[test]
fn a_tsc_that_goes_back_takes_a_new_anchor_and_stamps_do_not_go_back() {
    let mut c = StampClock::with(Script::new(0.4), true);
    run(&mut c, 2_000, 50_000, 0);
    assert_eq!(mode(&c), StampClockMode::Tsc);
    let before = c.now_ns();
    // Another CPU's TSC, 3,000,000 cycles (more than an anchor period) behind this one's; the
    // clock goes on as it did (re-based at this TSC first, so that its origin can move back).
    c.clocks.set_rate(0.4);
    c.clocks.t -= 3_000_000;
    c.clocks.from -= 3_000_000;
    let after = c.now_ns();
    assert!(after >= before);
    assert!(c.at_tsc < c.clocks.t, "no new anchor: {c:?}");
    run(&mut c, 1_000, 50_000, 0);
}

#[test]
fn without_extrapolation_every_stamp_is_the_clock() {
    let mut c = StampClock::with(HostClocks(MonoClock::get()), false);
    for _ in 0..1000 {
        let a = crate::sync::now_ns();
        let s = c.now_ns();
        let b = crate::sync::now_ns();
        assert!(a <= s && s <= b, "{a} <= {s} <= {b}");
    }
    assert_eq!(mode(&c), StampClockMode::Vdso);
}

#[test]
fn on_this_host_extrapolated_stamps_lie_between_the_clock_reads_around_them() {
    if !tsc_usable() {
        eprintln!("the TSC is not this host's clocksource: nothing to extrapolate");
        return;
    }
    let status = Arc::new(StampStatus::default());
    assert_eq!(status.read(), (None, 0), "a status no clock has written");
    let mut c = StampClock::new(MonoClock::get(), Arc::clone(&status));
    let mut last = 0;
    let mut worst = 0i64;
    for i in 0..40_000 {
        let a = crate::sync::now_ns();
        let s = c.now_ns();
        let b = crate::sync::now_ns();
        assert!(s >= last, "stamp {i} went back: {last} then {s}");
        last = s;
        if mode(&c) == StampClockMode::Tsc {
            let off = if s < a {
                a as i64 - s as i64
            } else {
                s.saturating_sub(b) as i64
            };
            worst = worst.max(off);
        }
        if i % 1000 == 0 {
            std::thread::sleep(std::time::Duration::from_micros(500));
        }
    }
    // Each stamp lies between the two reads around it, give or take the extrapolation's error
    // (the pairing's, ~210 ns at most, twice across an anchor; 2 µs leaves room).
    assert!(
        worst <= 2_000,
        "a stamp was {worst} ns outside its bracket: {c:?}"
    );
    if mode(&c) == StampClockMode::GivenUp {
        eprintln!("this host's brackets were never narrow: no stamp was extrapolated");
    }
    assert_eq!(
        status.read().0,
        Some(c.mode()),
        "the status the readers see"
    );
}

#[test]
fn scale_is_fixed_point() {
    assert_eq!(scale(1_000, 1 << 32), 1_000);
    assert_eq!(scale(1_000, 1 << 31), 500);
    assert_eq!(scale(u64::MAX >> 4, 2 << 32), (u64::MAX >> 4) * 2);
}
