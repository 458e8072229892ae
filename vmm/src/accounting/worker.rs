//! Accounting of a device thread (a virtio queue pair's event loop), as exact as a vCPU's:
//! `wall = used + steal + waiting + blocked` (spec section 10; docs/accounting.md, "Device
//! threads").
//!
//! Data flow: the thread owns its [`WorkerMeter`] as the single writer. As it starts it
//! records its tid, opens its own CPU clock and schedstat for readers, and notes the
//! run-queue wait it had before its clock started. Around each wait of its event loop it
//! reads the vDSO clock ([`WorkerMeter::wait_begin`], [`WorkerMeter::wait_end`]: two ~28 ns
//! reads a loop pass), and at each boundary between kinds of work (a receive batch, a
//! transmit batch) its CPU clock ([`WorkerMeter::cpu_mark`]: one ~0.6 µs read a batch, not a
//! packet), so the CPU of each kind is exact. As it ends it stores its final CPU time and
//! run-queue wait (its /proc entries go with it). Readers ([`WorkerMeter::times`]) combine
//! these with the kernel's exact counters: `used` is the thread's CPU clock, `steal` its
//! schedstat run_delay, and the time it was not runnable is split into `limited` (held by a
//! CPU limit of scope `vm`: [`hold`]), `waiting` (asleep in its loop's wait) and `blocked`
//! (asleep anywhere else).

use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::sync::OnceLock;

use super::host::{thread_cpu_ns, SchedStatFile, ThreadClock};

pub mod hold;
use crate::sync::now_ns;
use crate::sync::Counter;

/// Kinds of work a thread's CPU is split into (the device names them).
pub const PARTS: usize = 4;

/// A device thread's figures at one read, ns.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WorkerTimes {
    /// Monotonic time since the thread started (to its end once it ended).
    pub wall_ns: u64,
    /// Its CPU clock.
    pub used_ns: u64,
    /// Runnable but waiting for a CPU (schedstat run_delay since it started).
    pub steal_ns: u64,
    /// Not runnable, asleep in its event loop's wait.
    pub waiting_ns: u64,
    /// Not runnable anywhere else (a page fault waiting for I/O, a kernel lock).
    pub blocked_ns: u64,
    /// Held by a CPU limit of scope `vm` (asleep on the hold, not serving its queues).
    pub limited_ns: u64,
    /// CPU of each kind of work, by [`PARTS`] index.
    pub parts_ns: [u64; PARTS],
    /// Whether the thread has ended.
    pub ended: bool,
}

impl WorkerTimes {
    /// `wall − (used + steal + waiting + blocked + limited)`, signed.
    pub fn identity_error_ns(&self) -> i64 {
        self.wall_ns as i64
            - (self.used_ns + self.steal_ns + self.waiting_ns + self.blocked_ns + self.limited_ns)
                as i64
    }
}

/// What a reader opens once: the thread's clock and schedstat.
#[derive(Debug)]
struct Files {
    clock: ThreadClock,
    schedstat: SchedStatFile,
}

/// The single-writer accounting of one device thread.
#[derive(Debug, Default)]
pub struct WorkerMeter {
    tid: AtomicI32,
    start_ns: AtomicU64,
    end_ns: AtomicU64,
    run_delay_at_start: AtomicU64,
    wait_ns: Counter,
    /// CLOCK_MONOTONIC when the wait in progress began; 0 when not waiting.
    wait_since: AtomicU64,
    parts: [Counter; PARTS],
    /// The CPU clock at the last boundary.
    last_cpu: Counter,
    final_cpu_ns: Counter,
    final_run_delay_ns: Counter,
    ended: AtomicBool,
    files: OnceLock<Files>,
    /// Own schedstat, read by the thread itself at its end.
    own: OnceLock<SchedStatFile>,
    /// The hold of a CPU limit of scope `vm`.
    pub hold: hold::ThreadHold,
}

impl WorkerMeter {
    /// Called by the thread first thing: its tid, its clock and schedstat for readers, and the
    /// run-queue wait it had before its clock starts (not part of its figures).
    pub fn start(&self) {
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::gettid() };
        self.tid.store(tid, Ordering::Relaxed);
        if let (Ok(clock), Ok(schedstat)) = (ThreadClock::of_tid(tid), SchedStatFile::open(tid)) {
            let _ = self.files.set(Files { clock, schedstat });
        }
        if let Ok(own) = SchedStatFile::own() {
            if let Ok(s) = own.read() {
                self.run_delay_at_start
                    .store(s.run_delay_ns, Ordering::Relaxed);
            }
            let _ = self.own.set(own);
        }
        self.last_cpu.set(thread_cpu_ns());
        self.start_ns.store(now_ns(), Ordering::Release);
    }

    /// The thread's host tid (0 before it started).
    pub fn tid(&self) -> i32 {
        self.tid.load(Ordering::Relaxed)
    }

    /// The event loop is about to wait.
    #[inline]
    pub fn wait_begin(&self) {
        self.wait_since.store(now_ns().max(1), Ordering::Release);
    }

    /// The event loop's wait returned.
    #[inline]
    pub fn wait_end(&self) {
        let since = self.wait_since.swap(0, Ordering::AcqRel);
        if since != 0 {
            self.wait_ns.add(now_ns().saturating_sub(since));
        }
    }

    /// Ends a stretch of work of kind `part` (index below [`PARTS`]): the CPU since the last
    /// mark goes to it. Returns that CPU, ns.
    #[inline]
    pub fn cpu_mark(&self, part: usize) -> u64 {
        let now = thread_cpu_ns();
        let d = now.saturating_sub(self.last_cpu.get());
        self.last_cpu.set(now);
        if let Some(c) = self.parts.get(part) {
            c.add(d);
        }
        d
    }

    /// Moves the last mark to now without charging anyone (after a wait: the CPU it took is
    /// the loop's, left in `used` outside every part).
    #[inline]
    pub fn cpu_skip(&self) {
        self.last_cpu.set(thread_cpu_ns());
    }

    /// Called by the thread last: its final CPU time and run-queue wait.
    pub fn end(&self) {
        self.wait_end();
        self.final_cpu_ns.set(thread_cpu_ns());
        if let Some(s) = self.own.get().and_then(|f| f.read().ok()) {
            self.final_run_delay_ns.set(s.run_delay_ns);
        }
        self.end_ns.store(now_ns(), Ordering::Release);
        self.ended.store(true, Ordering::Release);
    }

    /// The thread's figures now (or at its end). Before it started: all zero.
    pub fn times(&self) -> WorkerTimes {
        let start = self.start_ns.load(Ordering::Acquire);
        if start == 0 {
            return WorkerTimes::default();
        }
        let ended = self.ended.load(Ordering::Acquire);
        let now = if ended {
            self.end_ns.load(Ordering::Acquire)
        } else {
            now_ns()
        };
        let (cpu, run_delay) = if ended {
            (self.final_cpu_ns.get(), self.final_run_delay_ns.get())
        } else {
            match self.files.get() {
                Some(f) => (
                    f.clock.read_ns().unwrap_or(self.final_cpu_ns.get()),
                    f.schedstat.read().map_or(0, |s| s.run_delay_ns),
                ),
                None => (0, 0),
            }
        };
        let wait_since = self.wait_since.load(Ordering::Acquire);
        let mut waited = self.wait_ns.get();
        if wait_since != 0 && !ended {
            waited += now.saturating_sub(wait_since);
        }
        split(SplitInput {
            wall_ns: now.saturating_sub(start),
            cpu_ns: cpu,
            run_delay_ns: run_delay.saturating_sub(self.run_delay_at_start.load(Ordering::Relaxed)),
            waited_ns: waited,
            held_ns: self.hold.held_ns(),
            parts_ns: std::array::from_fn(|i| self.parts[i].get()),
            ended,
        })
    }
}

/// What [`split`] combines.
#[derive(Debug, Clone, Copy, Default)]
pub struct SplitInput {
    /// Wall time since the thread started.
    pub wall_ns: u64,
    /// Its CPU clock.
    pub cpu_ns: u64,
    /// Its run-queue wait since it started.
    pub run_delay_ns: u64,
    /// Wall time inside its loop's waits.
    pub waited_ns: u64,
    /// Wall time held by a limit.
    pub held_ns: u64,
    /// CPU by kind of work.
    pub parts_ns: [u64; PARTS],
    /// Whether it ended.
    pub ended: bool,
}

/// The split of a thread's wall time (pure): the time it was not runnable is
/// `wall − used − steal`; of it, at most the wall time of its loop's waits is `waiting` and
/// the rest `blocked`. A thread that sleeps only in its loop's wait (the normal case) has
/// `blocked` 0 and `waiting` exact; a sleep elsewhere is `blocked` up to the wake-up waits
/// and syscall time inside the loop's waits, which `waiting` may absorb.
pub fn split(i: SplitInput) -> WorkerTimes {
    let steal = i.run_delay_ns.min(i.wall_ns);
    let used = i.cpu_ns.min(i.wall_ns - steal);
    let not_runnable = i.wall_ns - steal - used;
    let limited = i.held_ns.min(not_runnable);
    let waiting = i.waited_ns.min(not_runnable - limited);
    WorkerTimes {
        wall_ns: i.wall_ns,
        used_ns: used,
        steal_ns: steal,
        waiting_ns: waiting,
        blocked_ns: not_runnable - limited - waiting,
        limited_ns: limited,
        parts_ns: i.parts_ns,
        ended: i.ended,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_split_holds_the_identity_and_puts_sleep_in_the_loop_first() {
        let t = split(SplitInput {
            wall_ns: 1000,
            cpu_ns: 300,
            run_delay_ns: 100,
            waited_ns: 650,
            held_ns: 0,
            parts_ns: [100, 150, 0, 0],
            ended: false,
        });
        assert_eq!(
            (t.used_ns, t.steal_ns, t.waiting_ns, t.blocked_ns),
            (300, 100, 600, 0),
            "the waits' wall includes the wake-up wait, already in steal"
        );
        assert_eq!(t.identity_error_ns(), 0);
        // A sleep outside the loop's wait is blocked.
        let t = split(SplitInput {
            wall_ns: 1000,
            cpu_ns: 300,
            run_delay_ns: 100,
            waited_ns: 400,
            ..Default::default()
        });
        assert_eq!((t.waiting_ns, t.blocked_ns), (400, 200));
        // Clocks read a little apart never give a negative part.
        let t = split(SplitInput {
            wall_ns: 100,
            cpu_ns: 90,
            run_delay_ns: 30,
            waited_ns: 50,
            ..Default::default()
        });
        assert_eq!(
            (t.steal_ns, t.used_ns, t.waiting_ns, t.blocked_ns),
            (30, 70, 0, 0)
        );
        assert_eq!(t.identity_error_ns(), 0);
        // Held by a limit (issue 36): its own part, before the loop's waits.
        let t = split(SplitInput {
            wall_ns: 1000,
            cpu_ns: 300,
            run_delay_ns: 100,
            waited_ns: 400,
            held_ns: 500,
            ..Default::default()
        });
        assert_eq!((t.limited_ns, t.waiting_ns, t.blocked_ns), (500, 100, 0));
        assert_eq!(t.identity_error_ns(), 0);
    }

    #[test]
    fn a_thread_measures_its_own_waits_and_parts() {
        let m = std::sync::Arc::new(WorkerMeter::default());
        assert_eq!(m.times(), WorkerTimes::default(), "not started");
        let mm = std::sync::Arc::clone(&m);
        std::thread::spawn(move || {
            mm.start();
            // Work of part 1: spin ~2 ms of CPU.
            let t0 = thread_cpu_ns();
            while thread_cpu_ns() - t0 < 2_000_000 {}
            mm.cpu_mark(1);
            mm.wait_begin();
            std::thread::sleep(std::time::Duration::from_millis(20));
            mm.wait_end();
            mm.cpu_skip();
            mm.end();
        })
        .join()
        .unwrap();
        let t = m.times();
        assert!(t.ended);
        assert!(m.tid() > 0);
        assert!(t.parts_ns[1] >= 2_000_000, "{t:?}");
        assert!(t.used_ns >= t.parts_ns[1], "{t:?}");
        // The 20 ms sleep was in the loop's wait: off CPU, asleep there or waking up. (On a
        // host that is itself a VM, time its hypervisor takes from the running thread is in
        // neither clock and lands in `blocked`: it stays small beside the sleep. The thread's
        // CPU clock also counts the sleep's entry and exit, under host load up to a few
        // hundred µs of it: the bound leaves that room.)
        assert!(
            t.waiting_ns + t.steal_ns + t.blocked_ns >= 15_000_000,
            "{t:?}"
        );
        assert!(
            t.waiting_ns > t.blocked_ns,
            "the sleep is waiting, not blocked: {t:?}"
        );
        assert_eq!(t.identity_error_ns(), 0, "{t:?}");
    }
}
