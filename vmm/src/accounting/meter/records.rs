//! The recorder's use of the thread's context-switch records (level full): opening them
//! before the clocks start, switching them with the level before an entry stamp, draining them
//! at KVM_RUN boundaries and publishing the ring position readers peek from. The records
//! themselves (the ring, pairing, tallies) are `accounting::switches`.

use super::super::switches::{Bounds, SwitchRing, Tally};
use super::super::Level;
use super::{MicroState, Recorder, Stamp};

impl Recorder {
    /// Starts the clocks at `start` (after `use_records`, whose cost is then nobody's time):
    /// the recorder is in state `vmm` from there, and records from before are dropped.
    pub fn begin(&mut self, start: Stamp) {
        let _ = self.drain([u64::MAX, u64::MAX]);
        self.since = start.now;
        self.cpu_since = start.cpu;
        self.meter.begin();
        self.publish_ring();
        self.meter.set_state(MicroState::Vmm, start.now);
        self.meter.end();
    }

    /// Applies the level of the next KVM_RUN to the records before its entry stamp is taken:
    /// opening or switching them can sleep, which must fall in the interval measured at the
    /// old level, not inside the run.
    #[inline]
    pub fn prepare(&mut self, next: Level) {
        self.apply_records(next);
    }

    /// Splits level `full` with context-switch records instead of thread-CPU-clock reads,
    /// where perf gives them. The recorder opens them on its thread (the vCPU thread) the
    /// first time level full is in force: an open event costs every context switch on the
    /// host a little, so a VM that never uses level full does not open one.
    pub fn use_records(&mut self) {
        self.records_wanted = true;
        self.apply_records(self.level);
    }

    /// Whether records split level full (else the thread CPU clock does).
    pub fn has_records(&self) -> bool {
        self.ring.is_some()
    }

    /// Opens the records (once), and turns them on for level full and off otherwise (a
    /// system call, only when that changes); a ring that cannot be switched is given up for
    /// the CPU clock.
    pub(super) fn apply_records(&mut self, level: Level) {
        if level == Level::Full && self.records_wanted && !self.records_tried {
            self.records_tried = true;
            match SwitchRing::open() {
                Ok(ring) => {
                    let _ = self.meter.ring.set(ring.view());
                    self.ring = Some(ring);
                }
                Err(e) => log::warn!(
                    "no context-switch records for this vCPU thread ({e}); level full reads the thread CPU clock at every KVM_RUN boundary"
                ),
            }
        }
        let Some(ring) = &mut self.ring else {
            return;
        };
        let want = level == Level::Full;
        if ring.enabled() == want {
            return;
        }
        let ok = ring.set_enabled(want).is_ok();
        if !ok {
            log::warn!("context-switch records could not be switched; level full reads the thread CPU clock");
            self.ring = None;
        }
        self.meter.begin();
        self.meter.records_on.set(u64::from(want && ok));
        self.publish_ring();
        self.meter.end();
    }

    /// Whether a boundary between intervals at `prev` and `next` reads the thread CPU clock:
    /// level full without records.
    #[inline]
    pub fn needs_cpu_clock(&self, prev: Level, next: Level) -> bool {
        (prev == Level::Full || next == Level::Full) && self.ring.is_none()
    }

    /// The records since the last drain, split at `bounds` (None: no records in use).
    #[inline]
    pub(super) fn drain(&mut self, bounds: Bounds) -> Option<Tally> {
        // A disabled ring still holds what it recorded before it was disabled.
        Some(self.ring.as_mut()?.drain(bounds))
    }

    /// Counts what a drain found and publishes the ring position for readers' peeks (only
    /// when it moved). Called inside a write section.
    #[inline]
    pub(super) fn note_records(&mut self, t: &Tally, sides: std::ops::Range<usize>) {
        let m = &*self.meter;
        if t.episodes != 0 {
            m.records_episodes.add(t.episodes);
            let preempted: u64 = t.preempted[sides].iter().sum();
            if preempted != 0 {
                m.records_preempted.add(preempted);
            }
        }
        if t.lost {
            m.records_lost.add(1);
        }
        self.publish_ring();
    }

    #[inline]
    pub(super) fn publish_ring(&mut self) {
        let Some(ring) = &self.ring else {
            return;
        };
        let (tail, pairing) = ring.position();
        if tail == self.published_tail {
            return;
        }
        self.published_tail = tail;
        let m = &*self.meter;
        m.ring_tail.set(tail);
        let (out, preempted) = pairing.pending().unwrap_or((0, false));
        m.ring_out.set(out);
        m.ring_out_preempted.set(u64::from(preempted));
    }
}
