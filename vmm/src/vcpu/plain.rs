//! The steady exit path, the plain loop: what the run loop ([`super::run`]) does for each exit
//! while the level stays what it is, the vCPU has started, no stop is open, nothing is
//! requested and the kick timer says "enter".
//!
//! It makes the same calls per exit as the run loop does in that state, in the same order: the
//! host CPU (`rdpid` where the host allows it) and the records' `prepare` before an entry, the
//! stamps (the wall clock from the thread's stamp clock, the thread CPU clock where the
//! recorder asks for it), the recorder's `on_entry` and `on_exit` (given the level as a
//! constant: `entry_from`, `exit_at`; at level off `on_entry_off` and `on_exit_off`, which the
//! general ones are at level off, with stamps that hold no clock reading),
//! `exit::handle_exit`, and before the next entry
//! the kick, the request bits, the kick timer's `prepare`, the stop and the level. It leaves
//! out what that state makes idle: the stop's bookkeeping, a level switch, the start wait, the
//! parks. What it saves is code and data the exit path touches, not instructions: this PVM
//! host flushes the TLB at every exit, and each page the path then touches costs a page walk
//! through the nested host's paging, ~150-400 cycles when the next load waits on it
//! (docs/design.md, "The exit path in fewer pages"). The run loop was 7.8 KiB; the level-off
//! instance of this one is 918 bytes. There is one instance per level, each given its level as
//! a constant, which it passes on to the recorder (`Recorder::entry_from`, `exit_at`): with
//! one instance for both timed levels, level basic ran through 5,089 bytes that held level
//! full's branches too; its own instance is 2,436 (level full's 4,683), and on this PVM host
//! the lines of code an exit runs cost as much as the lines of data (docs/design.md, "One
//! plain loop per level").
//!
//! It hands back to the run loop, before entering the guest again, as soon as any of its
//! conditions stops holding. It also hands back an exit whose outcome is not to resume at once
//! (a park, the guest's exit, a failure), which the run loop carries out as it does its own.

use super::kick_timer::{KickTimer, Prepared};
use super::run::{entry_cpu, exit_stamp, stamp};
use super::{LastExit, VcpuShared};
use crate::accounting::host::CpuReader;
use crate::accounting::meter::{Recorder, Stamp};
use crate::accounting::Level;
use crate::devices::Buses;
use crate::exit::{handle_exit, Outcome};
use crate::hypervisor::{RunError, Vcpu};
use crate::stamp_clock::StampClock;

/// Why the plain loop handed back to the run loop.
#[derive(Debug)]
pub(super) enum Plain {
    /// Something needs the whole loop before the next entry: a request, a level switch, a
    /// stop, the kick timer. The run loop starts its iteration again.
    Leave,
    /// An exit whose outcome is not to resume at once, and the exit before it.
    Exit {
        /// What the exit asks for.
        outcome: Outcome,
        /// The exit before it (what a failure reports).
        previous: Option<LastExit>,
    },
    /// KVM_RUN failed.
    Error(RunError),
}

/// What the plain loop runs with: the run loop's own.
pub(super) struct Steady<'a, V> {
    /// The hypervisor's vCPU.
    pub vcpu: &'a mut V,
    /// The VM's devices.
    pub buses: &'a Buses,
    /// The vCPU's shared state (its requests, stops and kick timer's slots).
    pub shared: &'a VcpuShared,
    /// The vCPU's accounting.
    pub rec: &'a mut Recorder,
    /// The vCPU's kick timer.
    pub timer: &'a mut KickTimer,
    /// The last exit, which the plain loop keeps as the run loop does.
    pub last_exit: &'a mut Option<LastExit>,
    /// The wall clock.
    pub clock: &'a mut StampClock,
    /// How the host CPU is read.
    pub cpu: CpuReader,
}

/// A stamp with no clock reading: level off reads none.
const NO_CLOCK: Stamp = Stamp { now: 0, cpu: None };

/// Whether the plain loop may take over from the run loop for an entry at level `next`, after
/// the run loop has cleared the kick, found no request and been told "enter" by the kick
/// timer: the level stays what it is, the vCPU has started (`unstarted` false) and no stop is
/// open.
#[inline]
pub(super) fn applies(rec: &Recorder, next: Level, shared: &VcpuShared, unstarted: bool) -> bool {
    next == rec.level() && !unstarted && !shared.stops.is_open()
}

/// [`run`] at `level`: its instance for that level.
#[inline]
pub(super) fn run_at<V: Vcpu>(s: Steady<'_, V>, level: Level) -> Plain {
    match level {
        Level::Off => run::<V, { Level::Off as u8 }>(s),
        Level::Basic => run::<V, { Level::Basic as u8 }>(s),
        Level::Full => run::<V, { Level::Full as u8 }>(s),
    }
}

/// Runs the vCPU at level `LEVEL` (a [`Level`] as its number: one instance per level, each
/// with only that level's code, the recorder's calls given the level as a constant) until
/// [`applies`] stops holding or an exit needs the run loop; `last_exit` follows every exit, as
/// the run loop's does. Enters the guest at once: its caller checked what the loop checks
/// before each entry. At level off nothing is timed and the recorder's level-off calls are
/// made; otherwise each boundary reads the wall clock, and the CPU clock where the recorder
/// asks for it, as the run loop's stamps do, and the host CPU is noted at each entry.
#[inline(never)]
#[link_section = "ppa_hot"]
pub(super) fn run<V: Vcpu, const LEVEL: u8>(s: Steady<'_, V>) -> Plain {
    let level = const { Level::from_u8(LEVEL) };
    let timed = level != Level::Off;
    let Steady {
        vcpu,
        buses,
        shared,
        rec,
        timer,
        last_exit,
        clock: mono,
        cpu: cpu_reader,
    } = s;
    loop {
        if timed {
            let cpu = entry_cpu(shared, cpu_reader, level);
            rec.prepare(level);
            let clock = rec.needs_cpu_clock(level, level) || rec.cpu_at_entry();
            rec.entry_from(level, stamp(mono, level, clock), cpu, level);
        } else {
            rec.on_entry_off(NO_CLOCK);
        }
        let result = vcpu.run();
        let s = if timed {
            exit_stamp(mono, rec, level, &result)
        } else {
            NO_CLOCK
        };
        let event = match result {
            Ok(event) => event,
            Err(e) => return Plain::Error(e),
        };
        let addr = event.address();
        let (reason, outcome) = handle_exit(event, buses, shared.id);
        if timed {
            rec.exit_at(level, s, reason);
        } else {
            rec.on_exit_off(s, reason);
        }
        let previous = last_exit.replace(LastExit { reason, addr });
        if !matches!(outcome, Outcome::Resume) {
            return Plain::Exit { outcome, previous };
        }
        // What the run loop checks before an entry, in its order.
        vcpu.clear_kick();
        if !shared.requests.load().is_empty() {
            return Plain::Leave;
        }
        if timer.prepare(shared) != Prepared::Enter
            || shared.stops.is_open()
            || rec.next_level() != level
        {
            return Plain::Leave;
        }
    }
}
