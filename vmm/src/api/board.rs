//! The `stats` snapshot board: where the latest snapshot of every vCPU waits for requests.
//!
//! Data flow: a snapshot of 64 vCPUs costs about half a millisecond of CPU (two system calls
//! and a KVM statistics read per vCPU), too long to take on the request path when every host
//! CPU runs vCPU threads. While clients ask for `stats` (demand lasts one second after each
//! request), the `api-stats` thread ([`run_refresher`]) takes a snapshot every refresh
//! interval and posts it here with its JSON text; the `api` thread serves the posted one when
//! it is younger than the maximum age, and takes one itself otherwise (the first request
//! after a quiet spell, or a command that changed what `stats` shows). vCPU threads never
//! touch the board.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::sync::{futex_wait, futex_wake, now_ns};

/// How long a `stats` request keeps the refresher running.
pub const DEMAND_NS: u64 = 1_000_000_000;

/// One posted snapshot.
#[derive(Debug)]
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
    /// Futex word: bumped to wake the refresher.
    wake: AtomicU32,
    stop: AtomicBool,
}

impl Board {
    /// Posts a snapshot (replacing an older one).
    pub fn post(&self, s: Arc<Snapshot>) {
        let mut p = self.posted.lock().unwrap_or_else(|e| e.into_inner());
        if p.as_ref().is_none_or(|old| old.at_ns <= s.at_ns) {
            *p = Some(s);
        }
    }

    /// The posted snapshot if it is younger than `max_age_ns`; records demand.
    pub fn take(&self, max_age_ns: u64) -> Option<Arc<Snapshot>> {
        let now = now_ns();
        let was = self.demand_until.swap(now + DEMAND_NS, Ordering::AcqRel);
        if was < now {
            self.wake.fetch_add(1, Ordering::Release);
            futex_wake(&self.wake);
        }
        let p = self.posted.lock().unwrap_or_else(|e| e.into_inner());
        p.as_ref()
            .filter(|s| now.saturating_sub(s.at_ns) < max_age_ns)
            .cloned()
    }

    /// Drops the posted snapshot (its figures are out of date).
    pub fn clear(&self) {
        *self.posted.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }

    /// Ends the refresher.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        self.wake.fetch_add(1, Ordering::Release);
        futex_wake(&self.wake);
    }
}

/// The `api-stats` thread: while there is demand, posts a snapshot every `interval_ns`
/// (taken by `take`); sleeps otherwise. Returns when the board is stopped.
pub fn run_refresher(board: &Board, interval_ns: u64, take: impl Fn() -> Snapshot) {
    while !board.stop.load(Ordering::Acquire) {
        let seen = board.wake.load(Ordering::Acquire);
        let now = now_ns();
        if board.demand_until.load(Ordering::Acquire) <= now {
            futex_wait(&board.wake, seen, None);
            continue;
        }
        board.post(Arc::new(take()));
        futex_wait(&board.wake, seen, Some(now + interval_ns));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn refresher_posts_while_there_is_demand_and_stops() {
        let b = Arc::new(Board::default());
        let b2 = Arc::clone(&b);
        let t = std::thread::spawn(move || {
            run_refresher(&b2, 1_000_000, || Snapshot {
                at_ns: now_ns(),
                text: "x".into(),
            })
        });
        let _ = b.take(0); // demand
        let t0 = now_ns();
        while b.take(u64::MAX).is_none() {
            assert!(now_ns() - t0 < 10_000_000_000, "the refresher posts");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        b.stop();
        t.join().unwrap();
    }
}
