//! Parking a vCPU thread (idle, limited or paused) and the clock readings around a park.
//!
//! At the end of a pause or a limit park the guest's paravirtual clock is told (`Vcpu::pause_notify`: KVM's
//! KVMCLOCK_CTRL) so that a Linux guest does not call the time it was held a soft lockup.
//! A park is a futex wait on the vCPU's wake word with an optional absolute deadline; whoever
//! releases it (a kick, a limit's release, a resume) bumps the word. The readings at both ends
//! ([`consistent_stamp`]: wall, thread CPU time, run_delay as of one instant) let the recorder
//! split the parked wall time into its own CPU, run-queue wait and blocked time.

use std::sync::atomic::Ordering;

use super::{Requests, ThreadState, VcpuShared};
use crate::accounting::host::thread_cpu_ns;
use crate::accounting::meter::{ParkKind, ParkStamp, Recorder};
use crate::hypervisor::Vcpu;
use crate::sync::{futex_wait, now_ns};

/// Wall clock, thread CPU time and run_delay read as of one instant: run_delay is read before
/// and after the clocks, and the reads are retried if a run-queue wait completed in between
/// (it would otherwise fall inside the wall interval but outside the run_delay delta, or the
/// other way round). Bounded: after 4 tries the last reading stands.
pub(super) fn consistent_stamp(shared: &VcpuShared) -> ParkStamp {
    let sched = shared.acct.live.get().map(|l| &l.sched);
    let read = || sched.and_then(|s| s.read().ok()).map(|s| s.run_delay_ns);
    let mut stamp = ParkStamp::default();
    for _ in 0..4 {
        let before = read();
        stamp = ParkStamp {
            cpu: Some(thread_cpu_ns()),
            now: now_ns(),
            run_delay: before,
        };
        if read() == before {
            break;
        }
    }
    stamp
}

/// Parks as `kind` until `deadline_ns` (or forever with `None`) or until released: a
/// pause park ends when the pause request is cleared or a stop arrives; a limited park when
/// every limit bit is cleared and the kick timer holds no more, or a stop or pause arrives; an idle park at a stop or pause
/// (a limit that stops an idle vCPU takes effect when the idle park ends). Returns the park's
/// wall time, ns.
pub(super) fn park<V: Vcpu>(
    vcpu: &V,
    shared: &VcpuShared,
    rec: &mut Recorder,
    kind: ParkKind,
    deadline_ns: Option<u64>,
) -> u64 {
    shared.set_state(ThreadState::Parked);
    let begin = consistent_stamp(shared);
    if kind == ParkKind::Limited {
        shared.kick_timer.parked(begin.now);
    }
    rec.park_begin(kind, begin);
    let release = loop {
        let seen = shared.wake.load(Ordering::Acquire);
        let requests = shared.requests.load();
        let released = match kind {
            ParkKind::Paused => {
                !requests.contains(Requests::PAUSE) || requests.contains(Requests::STOP)
            }
            ParkKind::Limited => {
                (!requests.intersects(Requests::LIMIT) && !shared.kick_timer.holds())
                    || requests.intersects(Requests::STOP | Requests::PAUSE)
            }
            ParkKind::Idle => requests.intersects(Requests::STOP | Requests::PAUSE),
        };
        if released {
            break shared.acct.meter.released_at.load(Ordering::Acquire);
        }
        if let Some(d) = deadline_ns {
            if now_ns() >= d {
                break d;
            }
        }
        futex_wait(&shared.wake, seen, deadline_ns);
    };
    let end = consistent_stamp(shared);
    rec.park_end(end, release);
    if matches!(kind, ParkKind::Paused | ParkKind::Limited) {
        // The guest did not ask for this stop: tell its paravirtual clock before it runs
        // again, so its watchdogs do not report the parked time as a soft lockup. At the end,
        // not the start: the ioctl's CPU (~10 µs here, varying) then falls before the next
        // stop's target instead of after this one's, where it was a limit's error (issue 29).
        vcpu.pause_notify();
    }
    shared.set_state(ThreadState::Running);
    end.now.saturating_sub(begin.now)
}
