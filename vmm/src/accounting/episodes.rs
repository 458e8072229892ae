//! A vCPU's log of its own state intervals: each off-CPU episode its context-switch records
//! showed (preempted, or asleep inside or outside KVM_RUN) and each park (idle, limited,
//! paused, with the run-queue wait at its end), so that a reader can place every vCPU's stall
//! in time, not only sum it: what level full's exact VM pressure is made of (`pressure.rs`,
//! docs/accounting.md "Pressure").
//!
//! Data flow: the vCPU thread is the one writer. Its drains of the perf ring push each
//! completed episode ([`EpisodeLog::push`], through the recorder's trace sink), and its
//! `park_end` pushes the park; a push is five stores into a fixed ring of
//! [`EPISODE_SLOTS`] entries (a sixth, of the overwritten entry's end, once the ring has
//! wrapped), no lock, no allocation, no system call. The sampler reads new
//! entries from its own cursor ([`EpisodeLog::read_from`]); an entry the writer overwrote
//! before the reader took it is reported lost, never returned torn (a claim counter, stored
//! before the entry's words, says which slots a push has begun to reuse), with a time by which
//! every lost entry had ended ([`LogRead::lost_until`]).

use std::sync::atomic::{fence, AtomicU64, Ordering};

/// Entries the ring holds: 256 entries between two sampler ticks (8 ms, a quiet VM's up to
/// 128 ms) is ~32,000 context switches or parks a second of one vCPU thread, ~16,000 where
/// each switch-out also logs its handoff ([`EpisodeKind::Handoff`]).
pub const EPISODE_SLOTS: usize = 256;

/// What a vCPU was doing during an [`Episode`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EpisodeKind {
    /// Off its CPU, runnable (the context-switch records' preemption): stalled.
    Preempted = 1,
    /// Off its CPU, asleep, inside KVM_RUN (an in-kernel HLT, or a sleep on a kernel lock).
    SleptInRun = 2,
    /// Off its CPU, asleep, outside KVM_RUN and outside parks (blocked in exit handling).
    Slept = 3,
    /// Parked because the guest asked to idle.
    Idle = 4,
    /// Parked by a CPU limit.
    Limited = 5,
    /// Parked by an operator's pause.
    Paused = 6,
    /// Not an interval: at `start` (= `end`) the kernel picked the thread whose id is `wait`
    /// to run in this vCPU's place on its CPU (`sched:sched_switch`); if that thread is another
    /// vCPU of the VM, its wait for a CPU ended then.
    Handoff = 7,
}

impl EpisodeKind {
    fn from_u8(v: u8) -> Option<EpisodeKind> {
        Some(match v {
            1 => EpisodeKind::Preempted,
            2 => EpisodeKind::SleptInRun,
            3 => EpisodeKind::Slept,
            4 => EpisodeKind::Idle,
            5 => EpisodeKind::Limited,
            6 => EpisodeKind::Paused,
            7 => EpisodeKind::Handoff,
            _ => return None,
        })
    }
}

/// One interval of a vCPU's time, CLOCK_MONOTONIC ns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Episode {
    /// When it began.
    pub start: u64,
    /// When it ended (≥ `start`).
    pub end: u64,
    /// What it was.
    pub kind: EpisodeKind,
    /// For a park: the run-queue wait inside it (its wake-up's wait for a CPU, at its end), ns;
    /// 0 otherwise.
    pub wait: u64,
}

impl Episode {
    /// A [`EpisodeKind::Handoff`]: at `time` the kernel picked thread `next` in the vCPU's
    /// place.
    pub fn handoff(time: u64, next: u32) -> Episode {
        Episode {
            start: time,
            end: time,
            kind: EpisodeKind::Handoff,
            wait: u64::from(next),
        }
    }
}

/// The ring of a vCPU's episodes (one writer, one reader).
#[derive(Debug)]
pub struct EpisodeLog {
    /// Entries pushed so far.
    head: AtomicU64,
    /// The push in progress or last begun, plus one: slots of entries below `claim −`
    /// [`EPISODE_SLOTS`] may be reused.
    claim: AtomicU64,
    /// The latest end of any entry a push overwrote (stored before the claim that reuses its
    /// slot): every entry a reader finds lost ended by then.
    dropped_end: AtomicU64,
    /// Three words per slot: start, end, kind | wait << 8.
    words: Box<[AtomicU64]>,
}

impl Default for EpisodeLog {
    fn default() -> Self {
        EpisodeLog {
            head: AtomicU64::new(0),
            claim: AtomicU64::new(0),
            dropped_end: AtomicU64::new(0),
            words: (0..3 * EPISODE_SLOTS).map(|_| AtomicU64::new(0)).collect(),
        }
    }
}

/// What a read found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogRead {
    /// The cursor to read from next time.
    pub next: u64,
    /// Entries after the cursor were overwritten before they were read.
    pub lost: bool,
    /// When `lost`: a time by which every lost entry had ended (the latest end of any entry
    /// the writer overwrote); 0 otherwise. A reader whose window begins at or after it lost
    /// nothing of that window.
    pub lost_until: u64,
}

impl EpisodeLog {
    /// Appends `e` (the vCPU thread only).
    #[inline]
    pub fn push(&self, e: Episode) {
        let i = self.head.load(Ordering::Relaxed);
        let b = (i as usize % EPISODE_SLOTS) * 3;
        if i >= EPISODE_SLOTS as u64 {
            // The entry this push overwrites: its end bounds what a reader can lose. One
            // writer: a plain load and store.
            let old = self.words[b + 1].load(Ordering::Relaxed);
            if old > self.dropped_end.load(Ordering::Relaxed) {
                self.dropped_end.store(old, Ordering::Relaxed);
            }
        }
        // Release: a reader that sees this claim (or a later head) sees `dropped_end` above.
        self.claim.store(i + 1, Ordering::Release);
        // The claim is seen by any reader that sees one of the stores below.
        fence(Ordering::Release);
        self.words[b].store(e.start, Ordering::Relaxed);
        self.words[b + 1].store(e.end.max(e.start), Ordering::Relaxed);
        self.words[b + 2].store(
            e.kind as u64 | (e.wait.min(u64::MAX >> 8) << 8),
            Ordering::Relaxed,
        );
        self.head.store(i + 1, Ordering::Release);
    }

    /// Entries pushed so far (where a reader that wants only new entries starts).
    pub fn head(&self) -> u64 {
        self.head.load(Ordering::Acquire)
    }

    /// Calls `f` with each entry pushed since `cursor`, oldest first, and says where to read
    /// next and whether entries were lost (overwritten before this read: at most
    /// [`EPISODE_SLOTS`] entries are kept). Never waits for the writer.
    pub fn read_from(&self, cursor: u64, mut f: impl FnMut(Episode)) -> LogRead {
        let head = self.head.load(Ordering::Acquire);
        let cap = EPISODE_SLOTS as u64;
        let first = cursor.max(head.saturating_sub(cap));
        let mut lost = cursor < first || cursor > head;
        let first = if cursor > head { head } else { first };
        let mut buf = [(0u64, 0u64, 0u64); 32];
        let mut at = first;
        while at < head {
            let n = ((head - at) as usize).min(buf.len());
            for (k, slot) in buf[..n].iter_mut().enumerate() {
                let b = ((at + k as u64) as usize % EPISODE_SLOTS) * 3;
                *slot = (
                    self.words[b].load(Ordering::Relaxed),
                    self.words[b + 1].load(Ordering::Relaxed),
                    self.words[b + 2].load(Ordering::Relaxed),
                );
            }
            fence(Ordering::Acquire);
            let claim = self.claim.load(Ordering::Acquire);
            for (k, &(start, end, w)) in buf[..n].iter().enumerate() {
                // A push at index ≥ this entry's + the capacity may have rewritten its slot.
                if claim > at + k as u64 + cap {
                    lost = true;
                    continue;
                }
                if let Some(kind) = EpisodeKind::from_u8(w as u8) {
                    f(Episode {
                        start,
                        end,
                        kind,
                        wait: w >> 8,
                    });
                }
            }
            at += n as u64;
        }
        // After the head's and the claims' acquire loads: covers every overwrite they showed.
        let lost_until = if cursor > head {
            // Not a cursor of this log: anything may be lost.
            u64::MAX
        } else if lost {
            self.dropped_end.load(Ordering::Relaxed)
        } else {
            0
        };
        LogRead {
            next: head,
            lost,
            lost_until,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ep(i: u64) -> Episode {
        Episode {
            start: 10 * i,
            end: 10 * i + 5,
            kind: if i % 2 == 0 {
                EpisodeKind::Preempted
            } else {
                EpisodeKind::Idle
            },
            wait: i,
        }
    }

    fn read(log: &EpisodeLog, cursor: u64) -> (Vec<Episode>, LogRead) {
        let mut v = Vec::new();
        let r = log.read_from(cursor, |e| v.push(e));
        (v, r)
    }

    #[test]
    fn a_reader_gets_each_entry_once_in_order() {
        let log = EpisodeLog::default();
        let (v, r) = read(&log, 0);
        assert!(v.is_empty());
        assert_eq!(
            r,
            LogRead {
                next: 0,
                lost: false,
                lost_until: 0
            }
        );
        for i in 0..10 {
            log.push(ep(i));
        }
        let (v, r) = read(&log, 0);
        assert_eq!(v, (0..10).map(ep).collect::<Vec<_>>());
        assert_eq!(
            r,
            LogRead {
                next: 10,
                lost: false,
                lost_until: 0
            }
        );
        log.push(ep(10));
        let (v, r) = read(&log, r.next);
        assert_eq!(v, vec![ep(10)]);
        assert!(!r.lost);
        // A handoff keeps the next thread's id (a pid up to 2^22, any u32 here) whole.
        let handoff = Episode {
            start: 700,
            end: 700,
            kind: EpisodeKind::Handoff,
            wait: u64::from(u32::MAX),
        };
        log.push(handoff);
        let (v, _) = read(&log, r.next);
        assert_eq!(v, vec![handoff]);
    }

    #[test]
    fn entries_overwritten_before_the_read_are_reported_lost_never_returned() {
        let log = EpisodeLog::default();
        let n = EPISODE_SLOTS as u64 + 40;
        for i in 0..n {
            log.push(ep(i));
        }
        let (v, r) = read(&log, 0);
        assert!(r.lost);
        assert_eq!(r.next, n);
        // Only the last EPISODE_SLOTS entries are there, in order.
        assert_eq!(v, (40..n).map(ep).collect::<Vec<_>>());
        // Entries 0-39 are lost: the last of them ended at 395, and the bound says so.
        assert_eq!(r.lost_until, ep(39).end);
        // A cursor from the future (a reader of another log) reads nothing and says so.
        let (v, r) = read(&log, n + 5);
        assert!(v.is_empty() && r.lost);
        assert_eq!(r.lost_until, u64::MAX);
    }

    #[test]
    fn a_push_that_began_on_a_slot_makes_its_old_entry_lost() {
        let log = EpisodeLog::default();
        for i in 0..EPISODE_SLOTS as u64 {
            log.push(ep(i));
        }
        // A writer that claimed the slot of entry 0 and was preempted before its head store
        // (having noted the end of the entry it overwrites).
        log.dropped_end.store(ep(0).end, Ordering::Relaxed);
        log.claim.store(EPISODE_SLOTS as u64 + 1, Ordering::Relaxed);
        let (v, r) = read(&log, 0);
        assert!(r.lost);
        assert_eq!(v.first(), Some(&ep(1)));
        assert_eq!(v.len(), EPISODE_SLOTS - 1);
        assert_eq!(r.lost_until, ep(0).end);
    }

    #[test]
    fn a_reader_beside_the_writer_never_sees_a_torn_entry() {
        use std::sync::Arc;
        let log = Arc::new(EpisodeLog::default());
        let w = Arc::clone(&log);
        let writer = std::thread::spawn(move || {
            for i in 0..200_000u64 {
                // Every word of an entry derives from its index.
                w.push(Episode {
                    start: i * 3,
                    end: i * 3 + 1,
                    kind: EpisodeKind::Limited,
                    wait: i,
                });
            }
        });
        let mut cursor = 0;
        let mut seen = 0u64;
        while seen < 200_000 && !writer.is_finished() || cursor < log.head() {
            let r = log.read_from(cursor, |e| {
                assert_eq!(e.start, e.wait * 3, "torn: {e:?}");
                assert_eq!(e.end, e.start + 1, "torn: {e:?}");
                assert_eq!(e.kind, EpisodeKind::Limited);
                seen += 1;
            });
            cursor = r.next;
        }
        writer.join().unwrap();
        assert!(seen > 0);
    }
}
