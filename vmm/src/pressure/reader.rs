//! The sampler's look at one vCPU's state intervals for a pressure tick (level full): the
//! episodes and parks its log gained since the last look, the records its perf ring holds
//! beyond the vCPU thread's last drain, and what it is doing now, turned into the tick's
//! phases ([`timeline::segments`]). A tick is known exactly only where the vCPU's records
//! were on through it and nothing was lost; otherwise the look says so and the tracker falls
//! back to the overlap rule for the sets the vCPU is in.
//!
//! Data flow: [`VcpuReader::look`] reads the meter's position (a consistent group: micro-state,
//! the ring's consumer position and open switch-out), the episode log from its own cursor, then
//! the ring from where its previous look stopped (or from the consumer's position, when the
//! vCPU thread drained since), and checks the consumer did not drain meanwhile (else it tries
//! again, a few times). It never waits for the vCPU thread and takes no lock it takes. A look
//! is gathered first ([`VcpuReader::gather`]) and placed in time after the tracker has every
//! vCPU's ([`Gathered::segments`]): the handoffs in one vCPU's records (`sched_switch`: whom
//! the kernel picked in its place) say when another vCPU's wait for a CPU ended.

use crate::accounting::episodes::{Episode, EpisodeKind};
use crate::accounting::meter::{MeterPosition, MicroState, VcpuMeter};
use crate::accounting::switches::pairing::ExitCode;
use crate::accounting::switches::{Pairing, TraceSink};

use super::timeline::{picked_at, segments, Now, Seg};

/// Tries of one look before it gives up for this tick (the vCPU thread drained the ring, or
/// was inside a write section, each time).
const TRIES: usize = 4;

/// Why a look is not exact (kept for the tracker's counts and the tests).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotKnown {
    /// The records are off (level below full, or no perf ring on this thread), were turned
    /// on after the window began, or were turned off and on since the last look.
    NoRecords,
    /// Records or log entries were lost in the window (or, at a first look, ever).
    Lost,
    /// The vCPU thread kept draining, or kept its meter busy, through every try.
    Busy,
}

/// One vCPU's reader state between ticks.
#[derive(Debug, Default)]
pub struct VcpuReader {
    /// Where the next log read starts (None before the first look).
    cursor: Option<u64>,
    /// Episodes already read that end after the last window.
    carry: Vec<Episode>,
    /// Where the last look at the ring stopped: (consumer tail it was based on, position,
    /// pairing state there).
    peeked: Option<(u64, u64, Pairing)>,
    /// (records_lost, records_switches) at the last look that found the records on.
    prev: Option<(u64, u64)>,
}

/// Collects a look's completed episodes, placing each inside or outside KVM_RUN by the
/// vCPU's interval in progress.
struct Collect {
    out: Vec<Episode>,
    state: MicroState,
    since: u64,
}

impl TraceSink for Collect {
    fn kvm_exit(&mut self, _: ExitCode, _: u64) {}
    fn interrupt(&mut self, _: u8) {}
    fn episode(&mut self, out: u64, back: u64, preempted: bool, _side: usize) {
        let kind = if preempted {
            EpisodeKind::Preempted
        } else if in_run(self.state, self.since, out) {
            EpisodeKind::SleptInRun
        } else {
            EpisodeKind::Slept
        };
        self.out.push(Episode {
            start: out,
            end: back,
            kind,
            wait: 0,
        });
    }
    fn handoff(&mut self, time: u64, next: u32) {
        self.out.push(Episode::handoff(time, next));
    }
}

/// One vCPU's look at a window, before its phases are placed: its episodes (with the
/// handoffs its records show) and what it is doing at the window's end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gathered {
    eps: Vec<Episode>,
    now: Option<Now>,
}

impl Gathered {
    /// The handoffs in this vCPU's records: (when, the thread the kernel picked in its place).
    pub fn handoffs(&self) -> impl Iterator<Item = (u64, u32)> + '_ {
        self.eps
            .iter()
            .filter(|e| e.kind == EpisodeKind::Handoff)
            .map(|e| (e.start, e.wait as u32))
    }

    /// The vCPU's phases in `[from, to)`; `picked`: the instants the kernel picked this vCPU's
    /// thread to run (other vCPUs' handoffs to it), each wait for a CPU ending at the
    /// latest of them inside it ([`picked_at`]); `halts` as in [`segments`].
    pub fn segments(&self, picked: &[u64], halts: bool, from: u64, to: u64) -> Vec<Seg> {
        let (eps, now) = picked_at(&self.eps, self.now, picked);
        segments(&eps, now, halts, from, to)
    }
}

/// Whether a switch-out at `out` was inside KVM_RUN, for a thread in `state` since `since`:
/// the records since the last drain belong to the interval in progress (its drain at the
/// boundary took the ones before), or, between a boundary's stamp and its drain, to the one
/// just closed.
fn in_run(state: MicroState, since: u64, out: u64) -> bool {
    match state {
        MicroState::Guest => out >= since,
        MicroState::Vmm => out < since,
        _ => false,
    }
}

impl VcpuReader {
    /// The vCPU's phases in `[from, to)`, or why they are not known exactly, with no other
    /// vCPU's handoffs ([`VcpuReader::gather`], then [`Gathered::segments`]).
    pub fn look(
        &mut self,
        meter: &VcpuMeter,
        started: u64,
        (from, to): (u64, u64),
        halts: bool,
    ) -> Result<Vec<Seg>, NotKnown> {
        self.gather(meter, started, (from, to))
            .map(|g| g.segments(&[], halts, from, to))
    }

    /// The vCPU's episodes and state for the window `[from, to)`, or why they are not known
    /// exactly. `started`: when its clocks started (before, it did not exist: idle).
    pub fn gather(
        &mut self,
        meter: &VcpuMeter,
        started: u64,
        (from, to): (u64, u64),
    ) -> Result<Gathered, NotKnown> {
        if started == 0 {
            // Its clocks have not started, and the caller read that after taking `to`: the
            // vCPU did not exist in the window (idle), whatever its records say. The log and
            // the ring are left for the first look after the start.
            let absent = Episode {
                start: from,
                end: to,
                kind: EpisodeKind::Paused,
                wait: 0,
            };
            return Ok(Gathered {
                eps: vec![absent],
                now: None,
            });
        }
        let mut eps = std::mem::take(&mut self.carry);
        let mut lost = false;
        // The log starts empty with the VM: a first look reads it from its start.
        let cursor = *self.cursor.get_or_insert(0);
        let r = meter.episodes.read_from(cursor, |e| eps.push(e));
        self.cursor = Some(r.next);
        // Entries the writer overwrote before this read matter only where one may reach into
        // the window (the log's bound on their ends).
        lost |= r.lost && r.lost_until > from;
        let mut found = None;
        for _ in 0..TRIES {
            let Some(pos) = meter.position() else {
                continue;
            };
            // Entries pushed since the read above (a drain between the two).
            let r = meter
                .episodes
                .read_from(self.cursor.unwrap_or(0), |e| eps.push(e));
            self.cursor = Some(r.next);
            lost |= r.lost && r.lost_until > from;
            if !pos.records_on {
                found = Some((pos, None));
                break;
            }
            if let Some(look) = self.peek(meter, &pos) {
                found = Some((pos, Some(look)));
                break;
            }
        }
        // Keep what reaches past this window for the next one (a park pushed after `to`, an
        // episode a look completed after it).
        self.carry = eps.iter().filter(|e| e.end > to).copied().collect();
        let Some((pos, look)) = found else {
            self.prev = None;
            return Err(NotKnown::Busy);
        };
        let marks = (pos.records_lost, pos.records_switches);
        let prev = std::mem::replace(&mut self.prev, pos.records_on.then_some(marks));
        let Some((peeked, pairing)) = look else {
            return Err(NotKnown::NoRecords);
        };
        eps.extend(peeked);
        // Before its clocks started the vCPU did not exist: idle for pressure.
        if started > from {
            eps.push(Episode {
                start: from,
                end: started,
                kind: EpisodeKind::Paused,
                wait: 0,
            });
        }
        let covered = pos.records_on_since <= from.max(started);
        match prev {
            _ if !covered => Err(NotKnown::NoRecords),
            Some((_, switches)) if switches != marks.1 => Err(NotKnown::NoRecords),
            Some((lost_before, _)) if lost_before != marks.0 || lost => Err(NotKnown::Lost),
            None if marks.0 != 0 || lost => Err(NotKnown::Lost),
            _ => Ok(Gathered {
                eps,
                now: Some(Now {
                    state: pos.state,
                    since: pos.since,
                    out: pairing.pending(),
                }),
            }),
        }
    }

    /// The records past the consumer's last drain, from where the previous look stopped when
    /// the consumer has not drained since: the completed episodes and the pairing state at
    /// the head. None when the consumer drained during the look.
    fn peek(&mut self, meter: &VcpuMeter, pos: &MeterPosition) -> Option<(Vec<Episode>, Pairing)> {
        let ring = meter.ring.get()?;
        let (from, pairing) = match self.peeked {
            Some((tail, at, p)) if tail == pos.ring_tail => (at, p),
            _ => (pos.ring_tail, pos.ring_pairing),
        };
        let mut c = Collect {
            out: Vec::new(),
            state: pos.state,
            since: pos.since,
        };
        match ring.peek_from(pos.ring_tail, from, pairing, &mut c) {
            Some((head, p)) => {
                self.peeked = Some((pos.ring_tail, head, p));
                Some((c.out, p))
            }
            None => {
                self.peeked = None;
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::accounting::meter::VcpuMeter;

    #[test]
    fn a_vcpu_without_records_is_not_known_and_its_log_is_still_consumed() {
        let m = VcpuMeter::new(3, 1);
        let mut r = VcpuReader::default();
        m.episodes.push(Episode {
            start: 0,
            end: 5,
            kind: EpisodeKind::Idle,
            wait: 0,
        });
        assert_eq!(r.look(&m, 1, (0, 10), true), Err(NotKnown::NoRecords));
        // A park that reaches past the window is carried to the next.
        m.episodes.push(Episode {
            start: 8,
            end: 30,
            kind: EpisodeKind::Limited,
            wait: 0,
        });
        assert_eq!(r.look(&m, 1, (10, 20), true), Err(NotKnown::NoRecords));
        assert_eq!(r.carry.len(), 1);
        assert_eq!(r.cursor, Some(2));
    }

    #[test]
    fn a_vcpu_whose_clocks_have_not_started_is_idle_and_known_even_without_records() {
        // The failure this replaces: a vCPU thread that existed but had not started its
        // clocks made the tick unknown, and with the other vCPUs waiting for CPUs the whole
        // VM's pressure read `estimated` from its first ticks on.
        let m = VcpuMeter::new(3, 1);
        let mut r = VcpuReader::default();
        m.episodes.push(Episode {
            start: 0,
            end: 5,
            kind: EpisodeKind::Preempted,
            wait: 0,
        });
        let idle = vec![Seg {
            start: 10,
            end: 20,
            phase: super::super::timeline::Phase::Idle,
        }];
        assert_eq!(r.look(&m, 0, (10, 20), true), Ok(idle));
        // Its log waits for the first look after the start.
        assert_eq!(r.cursor, None);
    }

    #[test]
    fn the_vcpu_thread_s_side_in_or_out_of_kvm_run() {
        assert!(in_run(MicroState::Guest, 10, 10));
        assert!(!in_run(MicroState::Guest, 10, 9));
        assert!(in_run(MicroState::Vmm, 10, 9));
        assert!(!in_run(MicroState::Vmm, 10, 11));
        assert!(!in_run(MicroState::Idle, 10, 11));
    }
}
