//! The `stats` snapshot board: where the latest snapshot of every vCPU waits for requests.
//!
//! Data flow: a snapshot of 64 vCPUs costs about half a millisecond of CPU (two system calls
//! and a KVM statistics read per vCPU), too long to take on the request path when every host
//! CPU runs vCPU threads. While clients ask for `stats` (demand lasts one second after each
//! request), the `api-stats` thread ([`run_refresher`]) takes a snapshot every refresh
//! interval and posts it here with its JSON text; the `api` thread serves the posted one when
//! it is younger than the maximum age, and takes one itself otherwise (the first request
//! after a quiet spell, or a command that changed what `stats` shows). Demand starts only
//! when a request follows the previous one within [`POLL_NS`]: a snapshot every refresh
//! interval is cheaper than one per request only for a client that asks more often than that,
//! and one that asks once (`ctl stats`, each VM of a `host list`) is answered by a snapshot of
//! its own instead of keeping the refresher awake for a second (200 idle VMMs each refreshing
//! for a second after one `host list` kept the development host's two CPUs busy for seconds).
//! vCPU threads never touch the board.
//!
//! The refresher keeps to a CPU budget ([`REFRESH_BUDGET_PER_MILLE`] of one CPU): it measures
//! the CPU time of each cycle on its own thread clock (the snapshot, and the wake-up, the
//! post and the wait around it) and stretches the interval when cycles cost more than the
//! budget allows at the configured one (a VM with many vCPUs on a host whose system calls
//! are slow). The maximum age the `api` thread accepts stretches with
//! it ([`Board::max_age_ns`]), so the api thread does not start taking snapshots itself.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::sync::{futex_wait, futex_wake, now_ns};

/// How long a `stats` request keeps the refresher running.
pub const DEMAND_NS: u64 = 1_000_000_000;

/// A `stats` request that follows the previous one within this starts or extends demand:
/// the longest refresh interval, beyond which a snapshot per request costs less than the
/// refresher's.
pub const POLL_NS: u64 = MAX_REFRESH_NS;

/// The refresher's CPU budget while clients ask for `stats`, per mille of one CPU. Every
/// microsecond of it is taken from the guests when all host CPUs run vCPU threads (in
/// `bench socket` the guests lost throughput in step with the serving threads' CPU), and it
/// is spent for as long as anyone polls, even once a second; half a percent keeps a 64-vCPU
/// VM's snapshots ~100 ms apart on the development host and a few-vCPU VM's 10-15 ms.
pub const REFRESH_BUDGET_PER_MILLE: u64 = 5;

/// Longest interval the budget may stretch the refresh to.
pub const MAX_REFRESH_NS: u64 = 100_000_000;

/// The refresh interval that keeps snapshots costing `cost_ns` of CPU each within the budget,
/// never below `configured_ns` nor above [`MAX_REFRESH_NS`].
pub fn budgeted_interval(configured_ns: u64, cost_ns: u64) -> u64 {
    (cost_ns.saturating_mul(1000) / REFRESH_BUDGET_PER_MILLE)
        .clamp(configured_ns, MAX_REFRESH_NS.max(configured_ns))
}

/// One posted snapshot.
#[derive(Debug, PartialEq)]
pub struct Snapshot {
    /// CLOCK_MONOTONIC when it was taken.
    pub at_ns: u64,
    /// Its JSON text.
    pub text: String,
}

/// The board shared by the `api` and `api-stats` threads.
#[derive(Debug, Default)]
pub struct Board {
    posted: Mutex<Option<Arc<Snapshot>>>,
    demand_until: AtomicU64,
    /// CLOCK_MONOTONIC of the latest request (0: none yet).
    last_request: AtomicU64,
    /// Futex word: bumped by `futex_wake` to wake the refresher.
    wake: AtomicU32,
    stop: AtomicBool,
    /// The refresher's current interval over the configured one, per mille (0: not stretched).
    stretch_per_mille: AtomicU64,
    /// The refresher is taking a snapshot now.
    taking: AtomicBool,
}

impl Board {
    /// Posts a snapshot (replacing an older one).
    pub fn post(&self, s: Arc<Snapshot>) {
        let mut p = self.posted.lock().unwrap_or_else(|e| e.into_inner());
        if p.as_ref().is_none_or(|old| old.at_ns <= s.at_ns) {
            *p = Some(s);
        }
    }

    /// The posted snapshot if it is younger than `max_age_ns`, or, while the refresher is in
    /// the middle of taking the next one, younger than [`DEMAND_NS`]; records demand when the
    /// previous request came less than [`POLL_NS`] before this one.
    ///
    /// Why the second case: a refresher that is late is held up inside its snapshot, by a
    /// vCPU thread preempted in a meter write section (readers wait for it; at 32 vCPU threads
    /// a CPU that wait reaches ~130 ms). A snapshot taken by the caller would wait for the same
    /// vCPU, so the posted one is served instead; its `uptime_ns` says when it was taken.
    pub fn take(&self, max_age_ns: u64) -> Option<Arc<Snapshot>> {
        let now = now_ns();
        let previous = self.last_request.swap(now, Ordering::AcqRel);
        if previous != 0 && now.saturating_sub(previous) < POLL_NS {
            let was = self.demand_until.swap(now + DEMAND_NS, Ordering::AcqRel);
            if was < now {
                futex_wake(&self.wake); // bumps the word too
            }
        }
        let max_age = if self.taking.load(Ordering::Acquire) {
            max_age_ns.max(DEMAND_NS)
        } else {
            max_age_ns
        };
        let p = self.posted.lock().unwrap_or_else(|e| e.into_inner());
        p.as_ref()
            .filter(|s| now.saturating_sub(s.at_ns) < max_age)
            .cloned()
    }

    /// The maximum age to serve a posted snapshot at: `configured_ns`, stretched in the
    /// proportion the refresher's budget stretched its interval (the slack for the
    /// refresher's own lateness grows with it).
    pub fn max_age_ns(&self, configured_ns: u64) -> u64 {
        let s = self.stretch_per_mille.load(Ordering::Relaxed).max(1000);
        (u128::from(configured_ns) * u128::from(s) / 1000).min(u128::from(u64::MAX)) as u64
    }

    /// Drops the posted snapshot (its figures are out of date).
    pub fn clear(&self) {
        *self.posted.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }

    /// Ends the refresher.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        futex_wake(&self.wake); // bumps the word too
    }
}

/// The `api-stats` thread: while there is demand, posts a snapshot every `interval_ns`, or
/// less often if that would cost more than the budget (each snapshot taken by `take`; the
/// cost of a cycle, from the end of the previous one, read from the thread's CPU clock by
/// `cpu_ns`); sleeps otherwise. Returns when the board is stopped.
pub fn run_refresher(
    board: &Board,
    interval_ns: u64,
    cpu_ns: impl Fn() -> u64,
    take: impl Fn() -> Snapshot,
) {
    // The cost of a snapshot, smoothed over about eight (a single one that was preempted or
    // ran on a cold cache should not stretch the interval by itself).
    let mut cost_ns = 0u64;
    // The thread's CPU clock at the end of the previous cycle, while demand lasts: a cycle
    // also pays for its wake-up (on a host whose CPUs all run vCPU threads, a context switch
    // away from one), the post and the wait, which a measure around the snapshot alone missed
    // (the thread used 1.1-1.8 % of a CPU against a 1 % budget).
    let mut last_cpu: Option<u64> = None;
    while !board.stop.load(Ordering::Acquire) {
        let seen = board.wake.load(Ordering::Acquire);
        let now = now_ns();
        if board.demand_until.load(Ordering::Acquire) <= now {
            last_cpu = None;
            futex_wait(&board.wake, seen, None);
            continue;
        }
        let c0 = cpu_ns();
        board.taking.store(true, Ordering::Release);
        let s = take();
        board.taking.store(false, Ordering::Release);
        board.post(Arc::new(s));
        let c1 = cpu_ns();
        let cost = c1.saturating_sub(last_cpu.unwrap_or(c0));
        last_cpu = Some(c1);
        cost_ns = if cost_ns == 0 {
            cost
        } else {
            cost_ns - cost_ns / 8 + cost / 8
        };
        let interval = budgeted_interval(interval_ns, cost_ns);
        board.stretch_per_mille.store(
            interval.saturating_mul(1000) / interval_ns.max(1),
            Ordering::Relaxed,
        );
        futex_wait(&board.wake, seen, Some(now + interval));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two requests in a row: a client that polls.
    fn demand(b: &Board) {
        let _ = b.take(0);
        let _ = b.take(0);
    }

    fn snap(at_ns: u64) -> Arc<Snapshot> {
        Arc::new(Snapshot {
            at_ns,
            text: String::new(),
        })
    }

    #[test]
    fn serves_only_young_snapshots_and_keeps_the_newest() {
        let b = Board::default();
        assert!(b.take(u64::MAX).is_none());
        let now = now_ns();
        b.post(snap(now));
        b.post(snap(now - 5));
        assert_eq!(
            b.take(u64::MAX).unwrap().at_ns,
            now,
            "an older post does not win"
        );
        assert!(
            b.take(1).is_none() || now_ns() == now,
            "too old for a 1 ns maximum age"
        );
        b.clear();
        assert!(b.take(u64::MAX).is_none());
    }

    #[test]
    fn a_refresher_held_up_in_its_snapshot_lets_the_posted_one_be_served() {
        let b = Arc::new(Board::default());
        let (b2, gate) = (Arc::clone(&b), Arc::new(AtomicU32::new(0)));
        let g2 = Arc::clone(&gate);
        let taken = Arc::new(AtomicU32::new(0));
        let t2 = Arc::clone(&taken);
        let t = std::thread::spawn(move || {
            run_refresher(
                &b2,
                1_000_000,
                || 0,
                || {
                    // The second snapshot is held up (a vCPU writer preempted) until released.
                    if t2.fetch_add(1, Ordering::AcqRel) == 1 {
                        while g2.load(Ordering::Acquire) == 0 {
                            futex_wait(&g2, 0, None);
                        }
                    }
                    Snapshot {
                        at_ns: now_ns(),
                        text: "x".into(),
                    }
                },
            )
        });
        demand(&b);
        let t0 = now_ns();
        while taken.load(Ordering::Acquire) < 2 || !b.taking.load(Ordering::Acquire) {
            assert!(now_ns() - t0 < 10_000_000_000, "the refresher starts again");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
        // Older than 1 ms, but the refresher is inside its next snapshot: served.
        let s = b.take(1_000_000).expect("the posted snapshot is served");
        assert!(now_ns() - s.at_ns >= 1_000_000);
        gate.store(1, Ordering::Release);
        futex_wake(&gate);
        while b.taking.load(Ordering::Acquire) {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        b.stop();
        t.join().unwrap();
        // The refresher is not taking one: the age limit applies again.
        std::thread::sleep(std::time::Duration::from_millis(2));
        assert!(b.take(1_000_000).is_none());
    }

    #[test]
    fn a_lone_request_does_not_wake_the_refresher_and_a_second_soon_after_does() {
        let b = Board::default();
        let _ = b.take(0);
        assert_eq!(
            b.wake.load(Ordering::Acquire),
            0,
            "one request is not a poll"
        );
        assert_eq!(b.demand_until.load(Ordering::Acquire), 0);
        let _ = b.take(0);
        assert_eq!(
            b.wake.load(Ordering::Acquire),
            1,
            "the second one starts demand"
        );
        let _ = b.take(0);
        assert_eq!(
            b.wake.load(Ordering::Acquire),
            1,
            "demand lasting: no second wake-up"
        );
        // A request long after the previous one (as a `host list` every few seconds) does not
        // extend demand.
        b.last_request
            .store(now_ns() - 2 * POLL_NS, Ordering::Release);
        b.demand_until.store(0, Ordering::Release);
        let _ = b.take(0);
        assert_eq!(b.demand_until.load(Ordering::Acquire), 0);
        assert_eq!(b.wake.load(Ordering::Acquire), 1);
    }

    #[test]
    fn refresher_posts_while_there_is_demand_and_stops() {
        let b = Arc::new(Board::default());
        let b2 = Arc::clone(&b);
        let t = std::thread::spawn(move || {
            run_refresher(
                &b2,
                1_000_000,
                || 0,
                || Snapshot {
                    at_ns: now_ns(),
                    text: "x".into(),
                },
            )
        });
        demand(&b);
        let t0 = now_ns();
        while b.take(u64::MAX).is_none() {
            assert!(now_ns() - t0 < 10_000_000_000, "the refresher posts");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        b.stop();
        t.join().unwrap();
        assert_eq!(
            b.max_age_ns(5),
            5,
            "free snapshots do not stretch the interval"
        );
    }

    #[test]
    fn costly_snapshots_stretch_the_interval_and_the_age_served() {
        // 10 ms configured: up to 50 µs a cycle fits 0.5 % of a CPU.
        assert_eq!(budgeted_interval(10_000_000, 0), 10_000_000);
        assert_eq!(budgeted_interval(10_000_000, 50_000), 10_000_000);
        assert_eq!(budgeted_interval(10_000_000, 125_000), 25_000_000);
        assert_eq!(budgeted_interval(10_000_000, 50_000_000), MAX_REFRESH_NS);
        assert_eq!(budgeted_interval(200_000_000, 50_000_000), 200_000_000);

        let b = Arc::new(Board::default());
        let b2 = Arc::clone(&b);
        // Each snapshot "costs" 150 µs of CPU: 30 ms between them.
        let clock = Arc::new(AtomicU64::new(0));
        let c2 = Arc::clone(&clock);
        let t = std::thread::spawn(move || {
            run_refresher(
                &b2,
                10_000_000,
                || c2.load(Ordering::Relaxed),
                || {
                    c2.fetch_add(150_000, Ordering::Relaxed);
                    Snapshot {
                        at_ns: now_ns(),
                        text: "x".into(),
                    }
                },
            )
        });
        demand(&b);
        let t0 = now_ns();
        while b.max_age_ns(15_000_000) != 45_000_000 {
            assert!(now_ns() - t0 < 10_000_000_000, "the refresher stretches");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        b.stop();
        t.join().unwrap();
    }

    #[test]
    fn the_budget_counts_what_a_cycle_costs_outside_its_snapshot() {
        // Free snapshots, but each reading of the clock finds 100 µs more used (the wake-up,
        // the post, the wait): from the second cycle on, 200 µs a cycle, so 40 ms apart.
        let b = Arc::new(Board::default());
        let b2 = Arc::clone(&b);
        let clock = AtomicU64::new(0);
        let t = std::thread::spawn(move || {
            run_refresher(
                &b2,
                10_000_000,
                || clock.fetch_add(100_000, Ordering::Relaxed),
                || Snapshot {
                    at_ns: now_ns(),
                    text: "x".into(),
                },
            )
        });
        demand(&b);
        let t0 = now_ns();
        while b.max_age_ns(10_000_000) < 30_000_000 {
            assert!(
                now_ns() - t0 < 10_000_000_000,
                "the cost outside the snapshot stretches the interval"
            );
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        b.stop();
        t.join().unwrap();
    }
}
