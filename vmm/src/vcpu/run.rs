//! The vCPU thread: its start, its run loop, and what it publishes when it ends.
//!
//! The loop is generic over `hypervisor::Vcpu` and is the whole exit path: clear a stale kick,
//! read the request bits, take a clock stamp, run the guest, take a stamp, classify and route
//! the exit (`exit::handle_exit`), record it, carry out the outcome. It holds no lock, makes no
//! allocation, and makes no system call beyond KVM_RUN and what the accounting level asks for
//! (none at `off` and `basic`: stamp-clock reads; at `full`, none either where the thread has
//! context-switch records, else two thread-CPU-clock reads), and, with CPU limits, what the
//! kick timer does when its deadlines change or it fires (`kick_timer`: a `timer_settime`, a
//! CPU clock read).
//!
//! While nothing but exits is in play (the level stays what it is, no stop is open, nothing is
//! requested, the kick timer says "enter", the vCPU has started) the loop hands the vCPU to the
//! plain loop ([`super::plain`]), which makes the same calls per exit in a few hundred bytes of
//! code and hands back before the next entry when any of that changes; an outcome other than
//! "resume" comes back to [`settle`], which both loops share. Both take their stamps from the
//! thread's [`StampClock`]: CLOCK_MONOTONIC through the vDSO's own entry point
//! ([`crate::vdso::MonoClock`]) about once a millisecond, the TSC in between.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::kick_timer::{KickTimer, Prepared};
use super::park::{consistent_stamp, park};
use super::plain::{self, Plain, Steady};
use super::{LastExit, Requests, ThreadState, VcpuEnd, VcpuShared, VcpuThread};
use crate::accounting::host::{
    thread_cpu_ns, thread_ticks, CpuReader, SchedStatFile, ThreadClock, ThreadStateFile,
};
use crate::accounting::meter::{ParkKind, ParkStamp, Recorder, Stamp};
use crate::accounting::snapshot::{FinalReadings, LiveSources};
use crate::accounting::Level;
use crate::devices::VcpuRequest;
use crate::exit::{handle_exit, Outcome};
use crate::hypervisor::Vcpu;
use crate::stamp_clock::StampClock;
use crate::sync::futex_wait;
use crate::vdso::MonoClock;

pub(super) fn thread_main<V: Vcpu>(mut v: VcpuThread<V>) {
    let shared = Arc::clone(&v.shared);
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::gettid() };
    shared.tid.store(tid, Ordering::Release);
    if let (Ok(clock), Ok(sched)) = (ThreadClock::current(), SchedStatFile::open(tid)) {
        let state = ThreadStateFile::open(tid).ok();
        let _ = shared.acct.live.set(LiveSources {
            clock,
            sched,
            state,
        });
    }
    // SAFETY: `unbind_thread` runs below on this thread, before `v` (and its vCPU) is dropped
    // at the end of this function; the vCPU never leaves this thread in between.
    let (end, last) = match unsafe { v.vcpu.bind_thread() } {
        Ok(kicker) => {
            let _ = shared.kicker.set(Box::new(kicker));
            let ended = start_and_run(&mut v, &shared);
            v.vcpu.unbind_thread();
            ended
        }
        Err(e) => {
            while v.start_gate.load(Ordering::Acquire) == 0 {
                futex_wait(&v.start_gate, 0, None);
            }
            v.buses.vcpu_ended(shared.id);
            (VcpuEnd::Error(e), consistent_stamp(&shared))
        }
    };
    publish_final(&shared, tid, last);
    let _ = shared.end.set(end);
    shared.set_state(ThreadState::Finished);
    let _ = v.done.send(shared.id);
}

/// Warms up, waits for the start gate, starts the clocks and runs the loop to its end: how it
/// ended, and the stamp that closed the last interval (the end of the vCPU's wall time, so
/// that nothing after it, such as the devices' end-of-vCPU work, is wall no interval holds).
fn start_and_run<V: Vcpu>(v: &mut VcpuThread<V>, shared: &VcpuShared) -> (VcpuEnd, ParkStamp) {
    if !v.vcpu.warm_up(v.warm_up) {
        log::warn!(
            "vCPU {}: warm-up run failed; its first run is measured",
            shared.id
        );
    }
    while v.start_gate.load(Ordering::Acquire) == 0 {
        futex_wait(&v.start_gate, 0, None);
    }
    // Precise halts: the default 50 µs timer slack would lengthen every park.
    // SAFETY: PR_SET_TIMERSLACK takes one integer argument and affects only this thread.
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong) };
    let mut rec = Recorder::new(
        Arc::clone(&shared.acct.meter),
        Arc::clone(&v.control),
        Stamp::default(),
    );
    // Opening the context-switch records can sleep (perf_event_open, mmap): before the
    // clocks start, so that no interval holds time no record explains. And before the thread
    // drops its privileges: a kernel with perf_event_paranoid 3 (Debian's default) refuses
    // the event to a thread without them.
    rec.use_records();
    crate::seccomp::enter(crate::seccomp::Kind::Vcpu);
    let origin = consistent_stamp(shared);
    let start = Stamp {
        now: origin.now,
        cpu: origin.cpu,
    };
    shared
        .acct
        .set_origin(origin.cpu.unwrap_or(0), origin.run_delay.unwrap_or(0));
    shared.acct.started_ns.store(start.now, Ordering::Release);
    shared.set_state(ThreadState::Running);
    // Pairs with `VcpuShared::kick`'s: a request made while this thread was `Created` (and so
    // not signalled) is seen by the loop's first turn.
    std::sync::atomic::fence(Ordering::SeqCst);
    rec.begin(start);
    let end = run_loop(v, &mut rec);
    // The devices' end-of-vCPU work (a console line flushed) is VMM time of this vCPU.
    v.buses.vcpu_ended(shared.id);
    let last = consistent_stamp(shared);
    shared
        .acct
        .ended_ns
        .store(last.now.max(1), Ordering::Release);
    rec.finish(Stamp {
        now: last.now,
        cpu: last.cpu,
    });
    (end, last)
}

/// Reads its own clocks, schedstat, /proc ticks and KVM statistics as the loop ends, for the
/// final report (its /proc entries vanish when the thread exits).
fn publish_final(shared: &VcpuShared, tid: i32, end: ParkStamp) {
    let finals = FinalReadings {
        at_ns: end.now,
        cpu_ns: end.cpu.unwrap_or(0),
        run_delay_ns: end.run_delay.unwrap_or(0),
        ticks: thread_ticks(tid).ok(),
        kvm: shared.acct.read_kvm(),
    };
    let _ = shared.acct.finals.set(finals);
}

/// Clock readings for a run boundary after an interval at `prev`: the wall clock unless level
/// off (the thread's stamp clock, at every level: level full's context-switch records, which
/// carry the kernel's own CLOCK_MONOTONIC times, are split at these stamps within the stamp
/// clock's error; docs/accounting.md, "The stamp clock"), the thread CPU clock when `cpu`
/// (`Recorder::needs_cpu_clock`).
#[inline]
pub(super) fn stamp(clock: &mut StampClock, prev: Level, cpu: bool) -> Stamp {
    Stamp {
        now: if prev == Level::Off && !cpu {
            0
        } else {
            clock.now_ns()
        },
        cpu: if cpu { Some(thread_cpu_ns()) } else { None },
    }
}

/// The host CPU an entry at level `next` runs on, read by `cpu` and noted in the shared state;
/// 0 at level off, which notes none.
#[inline]
pub(super) fn entry_cpu(shared: &VcpuShared, cpu: CpuReader, next: Level) -> usize {
    if next == Level::Off {
        return 0;
    }
    let c = cpu.read();
    shared.entered_on(c);
    c as usize
}

/// The stamp just after a KVM_RUN that returned `result`, for the interval at `level` (the
/// recorder's own, passed in as `Recorder::exit_at` takes it): the CPU clock too where that
/// level needs it or the run was kicked at level basic.
#[inline]
pub(super) fn exit_stamp<E>(
    clock: &mut StampClock,
    rec: &Recorder,
    level: Level,
    result: &Result<crate::hypervisor::ExitEvent<'_>, E>,
) -> Stamp {
    debug_assert_eq!(level, rec.level());
    let kicked = matches!(result, Ok(crate::hypervisor::ExitEvent::Intr));
    stamp(
        clock,
        level,
        rec.needs_cpu_clock(level, level) || rec.cpu_at_exit(kicked),
    )
}

/// The entry's stamp at level `next`; a stop still open ends at it (with the CPU clock it
/// then needs), so the guest's time from here on is charged again.
#[link_section = "ppa_hot"]
fn entry_stamp(
    clock: &mut StampClock,
    rec: &Recorder,
    next: Level,
    shared: &VcpuShared,
    stop: &mut StopTrack,
) -> Stamp {
    let stopped = shared.stops.is_open();
    let level = if next == Level::Off {
        rec.level()
    } else {
        next
    };
    let entry = stamp(
        clock,
        level,
        rec.needs_cpu_clock(rec.level(), next) || rec.cpu_at_entry() || stopped,
    );
    if stopped {
        stop.end(shared, entry.cpu.unwrap_or_else(thread_cpu_ns));
    }
    entry
}

/// The exit path. It and the functions every exit calls (`handle_exit`, the bus and the
/// doorbells' `write`, `KvmVcpu::run`, the recorder's) sit together in the `ppa_hot` section,
/// a few pages: this PVM host flushes the TLB at every exit, and each page of code an exit
/// touches then costs a page walk through the nested host's paging (~75 ns a page measured;
/// docs/design.md, "Where the gap is").
#[inline(never)]
#[link_section = "ppa_hot"]
pub(super) fn run_loop<V: Vcpu>(v: &mut VcpuThread<V>, rec: &mut Recorder) -> VcpuEnd {
    let shared = Arc::clone(&v.shared);
    let id = shared.id;
    let mut last_exit: Option<LastExit> = None;
    // An application processor the guest has not started blocks in its runs until it is: the
    // thread measures that wait (only then, at a few system calls per run).
    let mut unstarted = v.vcpu.waits_for_start();
    let cpu = CpuReader::new();
    let mut kick_timer = KickTimer::start(&shared, cpu);
    let mut stop = StopTrack::default();
    let mut clock = StampClock::new(MonoClock::get(), Arc::clone(&shared.stamp_status));
    let end = loop {
        // A kick that arrived while outside the guest (a park it already ended, a request
        // read below) must not also cost an `intr` exit on the next entry.
        v.vcpu.clear_kick();
        let requests = shared.requests.load();
        if requests.contains(Requests::STOP) {
            break VcpuEnd::Stopped;
        }
        if requests.contains(Requests::PAUSE) {
            park(&v.vcpu, &shared, rec, ParkKind::Paused, None);
            continue;
        }
        if requests.intersects(Requests::LIMIT) {
            if shared.stops.begin(thread_cpu_ns()) {
                stop.begun(&shared, last_exit);
            }
            stop.parked = Some(park(&v.vcpu, &shared, rec, ParkKind::Limited, None));
            continue;
        }
        let prepared = kick_timer.prepare(&shared);
        stop.observe(&shared, last_exit);
        match prepared {
            Prepared::Enter => {}
            Prepared::Hold => {
                stop.parked = Some(park(&v.vcpu, &shared, rec, ParkKind::Limited, None));
                continue;
            }
            Prepared::Again => continue,
        }
        let next = rec.next_level();
        if plain::applies(rec, next, &shared, unstarted) {
            let s = Steady {
                vcpu: &mut v.vcpu,
                buses: &v.buses,
                shared: &shared,
                rec,
                timer: &mut kick_timer,
                last_exit: &mut last_exit,
                clock: &mut clock,
                cpu,
            };
            let plain = plain::run_at(s, next);
            match after_plain(v, &shared, rec, plain) {
                Some(end) => break end,
                None => continue,
            }
        }
        let host_cpu = entry_cpu(&shared, cpu, next);
        rec.prepare(next);
        let before = unstarted.then(|| consistent_stamp(&shared));
        let entry = entry_stamp(&mut clock, rec, next, &shared, &mut stop);
        rec.on_entry(entry, host_cpu, next);
        let result = v.vcpu.run();
        let exit_stamp = exit_stamp(&mut clock, rec, rec.level(), &result);
        if let Some(before) = before {
            rec.start_wait(before, consistent_stamp(&shared));
        }
        let event = match result {
            Ok(event) => event,
            Err(e) => break VcpuEnd::Error(e),
        };
        let addr = event.address();
        let (reason, outcome) = handle_exit(event, &v.buses, id);
        rec.on_exit(exit_stamp, reason);
        if unstarted {
            unstarted = v.vcpu.waits_for_start();
        }
        let previous = last_exit.replace(LastExit { reason, addr });
        if let Some(end) = settle(v, &shared, rec, outcome, previous) {
            break end;
        }
    };
    // A stop the loop ended in (a stop request while parked) ends here, with no round trip.
    if shared.stops.is_open() {
        shared.stops.end(thread_cpu_ns(), 0);
    }
    end
}

/// What the run loop does with what the plain loop handed back: `None` to start its next
/// iteration, or how it ends.
fn after_plain<V: Vcpu>(
    v: &VcpuThread<V>,
    shared: &VcpuShared,
    rec: &mut Recorder,
    plain: Plain,
) -> Option<VcpuEnd> {
    match plain {
        Plain::Leave => None,
        Plain::Error(e) => Some(VcpuEnd::Error(e)),
        Plain::Exit { outcome, previous } => settle(v, shared, rec, outcome, previous),
    }
}

/// Carries out an exit's `outcome` (`previous`: the exit before it): `None` to go on, or how
/// the loop ends.
#[inline]
fn settle<V: Vcpu>(
    v: &VcpuThread<V>,
    shared: &VcpuShared,
    rec: &mut Recorder,
    outcome: Outcome,
    previous: Option<LastExit>,
) -> Option<VcpuEnd> {
    match outcome {
        Outcome::Resume => None,
        Outcome::Request(VcpuRequest::Park { deadline_ns }) => {
            park(&v.vcpu, shared, rec, ParkKind::Idle, deadline_ns);
            None
        }
        Outcome::Request(VcpuRequest::Exit(code)) => Some(VcpuEnd::Exited(code)),
        Outcome::Request(VcpuRequest::Stop) => Some(VcpuEnd::GuestStop),
        Outcome::Fail(failure) => Some(VcpuEnd::Failed {
            failure,
            regs: v.vcpu.dump_regs().map(Box::new),
            last_exit: previous,
        }),
    }
}

/// The run loop's side of a stop in progress ([`super::stops`]): whether the exit before it
/// was one the stop forced (a kick's `intr` exit) and whether it parked (for how long), which
/// decide the KVM round trip it is said to have cost.
#[derive(Debug, Default)]
struct StopTrack {
    /// The stop seen begin (its number: `StopTotals::stops` once it began).
    seen: u64,
    forced: bool,
    /// The wall time of its last park, ns, when it parked.
    parked: Option<u64>,
}

impl StopTrack {
    /// A stop began after `last_exit`.
    fn begun(&mut self, shared: &VcpuShared, last_exit: Option<LastExit>) {
        self.seen = shared.stops.count();
        self.forced = last_exit.is_some_and(|e| e.reason == crate::exit::ExitReason::Intr);
        self.parked = None;
    }

    /// After the kick timer's turn: a stop it began (a firing) is noted.
    #[inline]
    fn observe(&mut self, shared: &VcpuShared, last_exit: Option<LastExit>) {
        if shared.stops.is_open() && shared.stops.count() != self.seen {
            self.begun(shared, last_exit);
        }
    }

    /// The stop ends as the guest is entered again, with the CPU clock at `cpu`.
    fn end(&mut self, shared: &VcpuShared, cpu: u64) {
        let kvm = super::stops::kvm_round_trip(shared.acct.exit_cost, self.forced, self.parked);
        shared.stops.end(cpu, kvm);
        self.forced = false;
        self.parked = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    extern "C" {
        // The linker's bounds of the `ppa_hot` section (it names a section whose name is an
        // identifier so).
        static __start_ppa_hot: u8;
        static __stop_ppa_hot: u8;
    }

    #[test]
    fn the_exit_path_sits_in_its_own_few_pages() {
        let (start, stop) = (
            std::ptr::addr_of!(__start_ppa_hot) as *const () as usize,
            std::ptr::addr_of!(__stop_ppa_hot) as *const () as usize,
        );
        let hot: [(&str, usize); 9] = [
            (
                "run_loop",
                run_loop::<crate::hypervisor::kvm::KvmVcpu> as *const () as usize,
            ),
            (
                "plain::run (level off)",
                plain::run::<crate::hypervisor::kvm::KvmVcpu, { Level::Off as u8 }> as *const ()
                    as usize,
            ),
            (
                "plain::run (level basic)",
                plain::run::<crate::hypervisor::kvm::KvmVcpu, { Level::Basic as u8 }> as *const ()
                    as usize,
            ),
            (
                "plain::run (level full)",
                plain::run::<crate::hypervisor::kvm::KvmVcpu, { Level::Full as u8 }> as *const ()
                    as usize,
            ),
            ("entry_stamp", entry_stamp as *const () as usize),
            (
                "handle_exit",
                crate::exit::handle_exit as *const () as usize,
            ),
            (
                "Bus::write",
                crate::devices::bus::Bus::write as *const () as usize,
            ),
            (
                "KvmVcpu::run",
                <crate::hypervisor::kvm::KvmVcpu as Vcpu>::run as *const () as usize,
            ),
            (
                "Doorbells::write",
                <crate::devices::tiny::Doorbells as crate::devices::BusDevice>::write as *const ()
                    as usize,
            ),
        ];
        for (name, at) in hot {
            assert!(
                (start..stop).contains(&at),
                "{name} at {at:#x} is outside ppa_hot ({start:#x}..{stop:#x})"
            );
        }
        // Cold code stays out: the section is the exit path, not the vCPU thread.
        assert!(!(start..stop)
            .contains(&(thread_main::<crate::hypervisor::kvm::KvmVcpu> as *const () as usize)));
    }
}
