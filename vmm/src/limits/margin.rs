//! The stop margin of a limit, learnt from the errors of the periods that ended in stops.
//! Pure: the limiter thread feeds it each period's error; tests feed it numbers.
//!
//! Data flow. The margin is how much CPU a member is expected to use between the instant its
//! stop is due and its park (the kick path: timer expiry, signal, leaving KVM_RUN, park;
//! docs/limits.md). After a period in which `stops` members were stopped, the limiter reports
//! `used − quota`; the margin that would have made that period exact is the margin then plus
//! the error per stop: one *sample* of the stop latency. The margin is the median of the last
//! [`WINDOW`] samples (the p50 kick latency, as issue 29 asks): one late stop (a host burst of
//! a millisecond) is a sample among 15 and moves the margin by nothing, where the previous rule
//! (move by half of each error) moved it by half the burst and made the next periods undershoot
//! by as much, halving back over several periods. Until the window has samples the margin is
//! the limiter's estimate (two exit round trips plus 30 µs), and until it is full that estimate
//! counts as one more sample: a burst in the first periods (a limit's first period, which its
//! members begin before the limiter's first look; a host that delays the limiter's timer by
//! 4 ms) is then one sample of two, above the lower median, where alone it was the median. A
//! first period 7 ms over a 1 ms quota made the margin 2 ms, more than any member's share, and
//! the next three periods gave the guest 0, 400 and 400 µs (issue 39: "small quotas that starve
//! the guest").

/// Samples the median is taken over: odd, so the median is one of them.
pub const WINDOW: usize = 15;

/// Bounds of the margin.
pub const MIN_MARGIN_NS: u64 = 5_000;
/// See [`MIN_MARGIN_NS`].
pub const MAX_MARGIN_NS: u64 = 2_000_000;

/// A limit's learnt stop margin: a ring of the last [`WINDOW`] stop latencies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StopMargin {
    samples: [u64; WINDOW],
    /// Samples held (at most [`WINDOW`]).
    len: usize,
    /// Where the next sample goes.
    next: usize,
    /// The margin now.
    margin_ns: u64,
    /// The estimate it started at: one more sample until the window is full.
    initial_ns: u64,
}

impl StopMargin {
    /// A margin that starts at `initial_ns` (clamped to the bounds).
    pub fn new(initial_ns: u64) -> Self {
        let initial_ns = initial_ns.clamp(MIN_MARGIN_NS, MAX_MARGIN_NS);
        StopMargin {
            samples: [0; WINDOW],
            len: 0,
            next: 0,
            margin_ns: initial_ns,
            initial_ns,
        }
    }

    /// The margin now, ns.
    pub fn get(&self) -> u64 {
        self.margin_ns
    }

    /// After a period that ended with `stops` stops (at least one) and an error of `err_ns`
    /// (used − quota): one sample, the margin that would have made it exact, and the margin
    /// becomes the median of the window (with the initial estimate while it fills).
    pub fn learn(&mut self, err_ns: i64, stops: u64) {
        let per_stop = err_ns / stops.max(1) as i64;
        let sample = (self.margin_ns as i64)
            .saturating_add(per_stop)
            .clamp(MIN_MARGIN_NS as i64, MAX_MARGIN_NS as i64) as u64;
        self.samples[self.next] = sample;
        self.next = (self.next + 1) % WINDOW;
        self.len = (self.len + 1).min(WINDOW);
        let mut sorted = [0u64; WINDOW + 1];
        sorted[..self.len].copy_from_slice(&self.samples[..self.len]);
        let mut n = self.len;
        if n < WINDOW {
            sorted[n] = self.initial_ns;
            n += 1;
        }
        let held = &mut sorted[..n];
        held.sort_unstable();
        // The lower median of an even count.
        self.margin_ns = held[(n - 1) / 2];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn starts_at_the_estimate_within_bounds() {
        assert_eq!(StopMargin::new(66_000).get(), 66_000);
        assert_eq!(StopMargin::new(0).get(), MIN_MARGIN_NS);
        assert_eq!(StopMargin::new(u64::MAX).get(), MAX_MARGIN_NS);
    }

    #[test]
    fn a_steady_latency_is_learnt_and_the_error_goes_to_zero() {
        // The real latency is 40 µs; the estimate 66 µs undershoots by 26 µs per period.
        let mut m = StopMargin::new(66_000);
        let latency = 40_000i64;
        m.learn(latency - m.get() as i64, 1);
        assert_eq!(m.get(), 40_000, "one sample: the margin that was exact");
        for _ in 0..20 {
            m.learn(latency - m.get() as i64, 1);
        }
        assert_eq!(m.get(), 40_000);
    }

    #[test]
    fn a_burst_does_not_move_the_margin() {
        let mut m = StopMargin::new(30_000);
        for _ in 0..WINDOW {
            m.learn(0, 1);
        }
        assert_eq!(m.get(), 30_000);
        // One stop a millisecond late (a host burst): the median does not move, so the next
        // periods do not undershoot to pay for it. Half-the-error would have added 500 µs.
        m.learn(1_000_000, 1);
        assert_eq!(m.get(), 30_000);
        // Two or three more bursts among 15 still do not.
        m.learn(2_000_000, 1);
        m.learn(900_000, 1);
        assert_eq!(m.get(), 30_000);
    }

    #[test]
    fn the_error_is_shared_among_the_stops() {
        let mut m = StopMargin::new(30_000);
        // Two members stopped, 20 µs over in all: 10 µs each, a sample of 40 µs; the estimate
        // holds (the lower median of it and one sample) until a second sample agrees.
        m.learn(20_000, 2);
        assert_eq!(m.get(), 30_000);
        m.learn(20_000, 2);
        assert_eq!(m.get(), 40_000);
        // Zero stops counts as one: a sample of 40 + 10.
        m.learn(10_000, 0);
        assert_eq!(m.get(), 40_000, "the median of 30, 40, 40, 50");
    }

    #[test]
    fn a_burst_in_the_first_periods_does_not_move_the_margin() {
        let mut m = StopMargin::new(30_000);
        // A first period 7 ms over with 4 stops (the limiter's timer delayed 4 ms): a sample of
        // 1.78 ms, and alone with the estimate it is not the median.
        m.learn(7_000_000, 4);
        assert_eq!(m.get(), 30_000);
        m.learn(0, 1);
        assert_eq!(m.get(), 30_000);
        // A second burst among three samples and the estimate still is not.
        m.learn(5_000_000, 1);
        assert_eq!(m.get(), 30_000);
    }

    #[test]
    fn the_median_follows_a_shift_within_half_a_window() {
        let mut m = StopMargin::new(30_000);
        for _ in 0..WINDOW {
            m.learn(0, 1);
        }
        // The latency moves to 50 µs for good: after 8 of 15 samples the median is there.
        for k in 0..WINDOW {
            let before = m.get();
            m.learn(50_000 - m.get() as i64, 1);
            if k < WINDOW / 2 {
                assert_eq!(m.get(), 30_000, "sample {k}");
            } else {
                assert_eq!(m.get(), 50_000, "sample {k} (before {before})");
            }
        }
        // And bounded at both ends.
        m.learn(i64::MAX, 1);
        m.learn(i64::MIN, 1);
        assert!((MIN_MARGIN_NS..=MAX_MARGIN_NS).contains(&m.get()));
    }
}
