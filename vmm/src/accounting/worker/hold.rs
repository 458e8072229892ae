//! Holding a device thread for a CPU limit of scope `vm` (issue 36): the limiter holds it once
//! the VM's budget is spent (its vCPUs already stopped), the thread stops reading its queues
//! until the period ends, and the time it was held is its `limited_ns`.
//!
//! Data flow: the limiter ([`ThreadHold::hold`], [`ThreadHold::release`]) writes the hold flag
//! and wakes the thread (a futex wake, and the device wakes its event loop); the device thread
//! looks at the flag before each wait of its loop ([`ThreadHold::is_held`], one load) and, when
//! held, sleeps on it ([`ThreadHold::wait`]) instead of serving its queues, so the guest's
//! frames wait in its rings and the tap; it stamps the hold's wall time (its `limited_ns`) and,
//! after it, counts the frames the first pass of each kind carried ([`ThreadHold::after_pass`]):
//! those that waited for the hold to end. The thread is the one writer of the figures.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

use crate::sync::{futex_wait, futex_wake, now_ns, Counter};

/// How long a held thread sleeps before it looks at its device's stop flag again.
const STOP_POLL_NS: u64 = 10_000_000;

/// A device thread's hold, and what holds cost it.
#[derive(Debug, Default)]
pub struct ThreadHold {
    /// Whether the limiter holds the thread.
    held: AtomicBool,
    /// The futex word a held thread sleeps on; the limiter bumps it as it releases
    /// ([`futex_wake`] bumps the word it wakes, so it cannot be the hold flag itself).
    word: AtomicU32,
    /// When the hold in progress began (wall; 0: not held now).
    since: AtomicU64,
    held_ns: Counter,
    holds: Counter,
    /// Kinds of work (bits) whose first pass after a hold has not run yet.
    resumed: AtomicU32,
    frames: Counter,
}

impl ThreadHold {
    /// Holds the thread (limiter); true when it was not held.
    pub fn hold(&self) -> bool {
        !self.held.swap(true, Ordering::AcqRel)
    }

    /// Releases it (limiter); true when it was held.
    pub fn release(&self) -> bool {
        let was = self.held.swap(false, Ordering::AcqRel);
        if was {
            futex_wake(&self.word);
        }
        was
    }

    /// Whether the limiter holds it now (device thread, one load).
    #[inline]
    pub fn is_held(&self) -> bool {
        self.held.load(Ordering::Acquire)
    }

    /// Sleeps while held (device thread), or until `stop`; the hold's wall time is its
    /// limited time. `kinds`: the bits of the passes whose first run after it counts frames.
    pub fn wait(&self, stop: &AtomicBool, kinds: u32) {
        let t0 = now_ns().max(1);
        self.since.store(t0, Ordering::Release);
        self.holds.add(1);
        loop {
            // The word is read before the flag: a release between the two changes the word,
            // and the wait returns at once.
            let seen = self.word.load(Ordering::Acquire);
            if !self.is_held() || stop.load(Ordering::Acquire) {
                break;
            }
            futex_wait(&self.word, seen, Some(now_ns() + STOP_POLL_NS));
        }
        self.held_ns.add(now_ns().saturating_sub(t0));
        self.since.store(0, Ordering::Release);
        self.resumed.store(kinds, Ordering::Relaxed);
    }

    /// After a pass of kind `kind` (a bit) that handled `frames` (device thread): the first
    /// after a hold counts them as frames that waited. One load otherwise.
    #[inline]
    pub fn after_pass(&self, kind: u32, frames: u64) {
        let r = self.resumed.load(Ordering::Relaxed);
        if r & kind != 0 {
            self.resumed.store(r & !kind, Ordering::Relaxed);
            self.frames.add(frames);
        }
    }

    /// Its held time so far, the hold in progress included (readers).
    pub fn held_ns(&self) -> u64 {
        let since = self.since.load(Ordering::Acquire);
        let open = if since != 0 {
            now_ns().saturating_sub(since)
        } else {
            0
        };
        self.held_ns.get() + open
    }

    /// Holds so far.
    pub fn holds(&self) -> u64 {
        self.holds.get()
    }

    /// Frames that waited for a hold to end (the first pass of each kind after it).
    pub fn frames(&self) -> u64 {
        self.frames.get()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[test]
    fn a_held_thread_sleeps_until_released_and_counts_what_waited() {
        let h = Arc::new(ThreadHold::default());
        let stop = Arc::new(AtomicBool::new(false));
        assert!(!h.is_held());
        assert!(h.hold());
        assert!(!h.hold(), "already held");
        let t = {
            let (h, stop) = (Arc::clone(&h), Arc::clone(&stop));
            std::thread::spawn(move || {
                h.wait(&stop, 0b11);
                h.after_pass(0b01, 7);
                h.after_pass(0b01, 5);
                h.after_pass(0b10, 3);
            })
        };
        // The hold in progress counts as soon as the thread sleeps on it.
        while h.held_ns() == 0 {
            std::thread::yield_now();
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert!(h.release());
        t.join().unwrap();
        assert_eq!(h.holds(), 1);
        assert_eq!(
            h.frames(),
            7 + 3,
            "the first pass of each kind after the hold"
        );
        assert!(h.held_ns() >= 20_000_000);
        // A held thread also ends when its device stops.
        assert!(h.hold());
        stop.store(true, Ordering::Release);
        h.wait(&stop, 0);
        assert_eq!(h.holds(), 2);
    }
}
