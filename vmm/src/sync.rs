//! Parking, clocks and counters shared by every thread of the VMM: the vDSO monotonic clock,
//! futex waits with absolute deadlines, and the single-writer [`Counter`].
//!
//! A parked vCPU, the limiter and the sampler wait on a futex word with an absolute
//! CLOCK_MONOTONIC deadline; whoever wants them to act bumps the word ([`futex_wake`]). No lock
//! is involved, so nothing a reader holds can delay a vCPU.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// Monotonic time in ns (vDSO, no syscall).
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Waits on `word` while it equals `seen`, until `deadline_ns` (CLOCK_MONOTONIC) if given. Returns
/// when woken, interrupted, timed out or when the word already changed: callers re-check their
/// condition.
pub fn futex_wait(word: &AtomicU32, seen: u32, deadline_ns: Option<u64>) {
    let ts = deadline_ns.map(|d| libc::timespec {
        tv_sec: (d / 1_000_000_000) as libc::time_t,
        tv_nsec: (d % 1_000_000_000) as libc::c_long,
    });
    let ts_ptr = ts
        .as_ref()
        .map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: `word` is a valid aligned u32 for the duration of the call; `ts_ptr` is null or
    // points at a live timespec; FUTEX_WAIT_BITSET takes an absolute CLOCK_MONOTONIC timeout.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT_BITSET | libc::FUTEX_PRIVATE_FLAG,
            seen,
            ts_ptr,
            std::ptr::null::<u32>(),
            libc::FUTEX_BITSET_MATCH_ANY,
        );
    }
}

/// Bumps `word` and wakes every waiter on it.
pub fn futex_wake(word: &AtomicU32) {
    word.fetch_add(1, Ordering::Release);
    // SAFETY: `word` is a valid aligned u32; FUTEX_WAKE only reads its address.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
            i32::MAX,
        );
    }
}

/// A single-writer counter: one thread adds, anyone reads.
#[derive(Debug, Default)]
pub struct Counter(AtomicU64);

impl Counter {
    /// Adds `n` (writer only: a plain load and store, no locked instruction).
    #[inline]
    pub fn add(&self, n: u64) {
        self.0.store(
            self.0.load(Ordering::Relaxed).wrapping_add(n),
            Ordering::Relaxed,
        );
    }
    /// Sets the value (writer only).
    #[inline]
    pub fn set(&self, v: u64) {
        self.0.store(v, Ordering::Relaxed);
    }
    /// Reads the value.
    #[inline]
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[test]
    fn futex_wait_returns_on_deadline_and_on_wake() {
        let w = AtomicU32::new(0);
        let before = now_ns();
        futex_wait(&w, 0, Some(before + 2_000_000));
        assert!(now_ns() >= before + 2_000_000, "woke before the deadline");
        // A changed word returns at once even with no deadline.
        futex_wait(&w, 1, None);

        let w = Arc::new(AtomicU32::new(0));
        let w2 = Arc::clone(&w);
        let t = std::thread::spawn(move || {
            while w2.load(Ordering::Acquire) == 0 {
                futex_wait(&w2, 0, None);
            }
        });
        futex_wake(&w);
        t.join().unwrap();
        assert_eq!(w.load(Ordering::Acquire), 1);
    }
}
