//! The kernel-armed kick of CPU limits: a POSIX timer per vCPU that the kernel fires when the
//! vCPU may have used its budget, so that a stop does not wait for the limiter thread to wake.
//!
//! Data flow. The limiter (`limits::limiter`) stays the bookkeeper: at each look it works out
//! how much CPU each member may still use (its runway, `limits::engine`) and publishes, in the
//! vCPU's [`KickDeadlines`], one [`Deadline`] per limit the vCPU is a member of (a slot per
//! [`LimitKind`]: group, VM, runaway throttle): the thread CPU clock value at which the
//! vCPU must stop, and the earliest wall time it can get there (now + runway: a vCPU runs on
//! one CPU at most). Before each entry the vCPU thread ([`KickTimer::prepare`]) sees a change
//! with one load, re-reads the slots and arms its timer at the earliest `fire_at`: one
//! `timer_settime` per change, no system call otherwise. The timer is CLOCK_MONOTONIC with
//! SIGEV_THREAD_ID aimed at the vCPU thread and armed from it (so the hrtimer sits on the CPU
//! the vCPU runs on), and delivers the hypervisor's kick signal, whose handler sets
//! `immediate_exit` and the timer's `fired` flag. When it fires, the vCPU leaves the guest and
//! reads its CPU clock ([`on_fire`]): at its target it stops for that slot (a *hold*: it parks
//! as limited until the limiter moves on); short of it (it was preempted or idle, so it used
//! less CPU than the wall time that passed) it re-arms for the rest. It also re-arms when it
//! finds itself on another CPU than the one holding its timer. A firing noticed while parked
//! costs no KVM_RUN: the loop clears the pending kick before it looks at its requests, and
//! handles the firing before it enters the guest. The limiter adopts a hold at its next look
//! (the limit's request, as if it had kicked), releases it by publishing anew, and still
//! kicks by itself when a timer is late or could not be created (the fallback).
//!
//! The protocol, lock-free: each slot is a seqlock that only the limiter thread writes (`seq`
//! odd while it writes). A hold names the slot and the `seq` it was taken against and is
//! valid only while that slot's `seq` is unchanged, so any publish by the limiter (a new
//! deadline, none, a new period) releases it without a write by the vCPU: no update can be
//! lost between the vCPU clearing a deadline (taking a hold) and the limiter setting one. The
//! vCPU stores its hold before it re-reads `seq`; the limiter bumps `seq` before it looks for
//! a hold to wake; all four are sequentially consistent, so one of them sees the other (the
//! tests below run every interleaving).

use std::sync::atomic::{fence, AtomicU64, AtomicU8, Ordering};

use super::kick_lead::{Lead, MAX_LEAD_NS};
use super::{LimitKind, VcpuShared};
use crate::accounting::histogram::{Histogram, HistogramSnapshot};
use crate::accounting::host::CpuReader;
use crate::hypervisor::timer_signal::TimerFired;
use crate::sync::now_ns;

/// Deadline slots per vCPU: one per [`LimitKind`] (group, VM, runaway throttle), indexed by
/// [`LimitKind::slot`].
pub const SLOTS: usize = LimitKind::ALL.len();

/// With less CPU than this left when the timer fires, the vCPU stops rather than re-arms for
/// a moment shorter than an exit (the least lead [`on_fire`] is given); and a re-arm never
/// fires sooner than this after its firing.
pub const REARM_MIN_NS: u64 = 10_000;

/// The longest wall time a vCPU spins to its CPU target. A spin needs at most [`MAX_LEAD_NS`]
/// of CPU, and a thread preempted meanwhile uses none, so it may take longer in wall time and
/// still stop exactly (a host with a hog on every CPU preempted spins for 4-5 ms); the bound is
/// only for a CPU clock that stopped advancing (it reads 0 should the kernel refuse it).
pub const SPIN_WALL_MAX_NS: u64 = 400 * MAX_LEAD_NS;

/// When a vCPU must stop for one limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deadline {
    /// CLOCK_MONOTONIC ns: the earliest time the vCPU can reach `cpu_target`.
    pub fire_at: u64,
    /// The vCPU thread's CPU clock (ns) at which it must stop.
    pub cpu_target: u64,
}

impl Deadline {
    /// The deadline of a member that may use `runway_ns` more CPU, as read at `now` (any time
    /// before its CPU clock was read) with its CPU clock at `cpu_ns`: its clock cannot advance
    /// faster than the wall clock, so it reaches the target no earlier than `now + runway_ns`.
    pub fn after(now: u64, cpu_ns: u64, runway_ns: u64) -> Deadline {
        Deadline {
            fire_at: now.saturating_add(runway_ns).max(1),
            cpu_target: cpu_ns.saturating_add(runway_ns),
        }
    }
}

/// What a firing decides, from the CPU clock now ([`on_fire`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnFire {
    /// A target is reached or within the lead: spin to it and stop, held by this limit's slot.
    Stop(LimitKind),
    /// More than the lead of CPU left to every target: the vCPU used less CPU than wall time
    /// passed. Fire again after this long, the least CPU left to any target (the earliest any
    /// can be reached) less the lead; `limit` is the limit whose target that is.
    Rearm {
        /// Wall time from now.
        after_ns: u64,
        /// The limit with the least CPU left.
        limit: LimitKind,
    },
    /// No deadline left.
    Idle,
}

/// The decision at a firing with the charged CPU clock at `cpu_ns` and a timer lead of
/// `lead_ns` (at least [`REARM_MIN_NS`] is taken): the slot with the least CPU left decides
/// (the earliest deadline wins); it stops when that is within the lead, or when a re-arm would
/// come less than [`REARM_MIN_NS`] later. A re-arm waits `firing_ns` longer than the CPU left less the
/// lead: the firing's own exit and entry (a KVM round trip) are a stop's cost, not charged, so
/// the guest gets that much less than the wall time that passes (without it, a vCPU a few µs
/// short of its target re-armed again and again, each firing costing more than the guest got
/// between two: 75,000 firings in 3 s for 4 vCPUs at 1 ms per 10 ms).
pub fn on_fire(
    cpu_ns: u64,
    deadlines: &[Option<Deadline>; SLOTS],
    lead_ns: u64,
    firing_ns: u64,
) -> OnFire {
    let lead_ns = lead_ns.max(REARM_MIN_NS);
    let least = LimitKind::ALL
        .into_iter()
        .zip(deadlines)
        .filter_map(|(k, d)| d.map(|d| (d.cpu_target.saturating_sub(cpu_ns), k)))
        .min_by_key(|&(left, k)| (left, k.slot()));
    match least {
        None => OnFire::Idle,
        // Within the lead, or so near it that the re-arm would fire less than REARM_MIN_NS
        // after it is set: stop. A re-arm that short fired before the loop could enter the
        // guest (the timer set for a time already past), its stop still open froze the
        // charged clock, and the same decision came again: a vCPU stuck re-arming in the VMM,
        // 250,000 times in 3 s, until the limiter's next period (a test of the fake
        // hypervisor caught it on a loaded host).
        Some((left, kind)) if left <= lead_ns || left - lead_ns + firing_ns < REARM_MIN_NS => {
            OnFire::Stop(kind)
        }
        Some((left, limit)) => OnFire::Rearm {
            after_ns: left - lead_ns + firing_ns,
            limit,
        },
    }
}

/// The earliest `fire_at` of `deadlines`.
pub fn earliest(deadlines: &[Option<Deadline>; SLOTS]) -> Option<u64> {
    deadlines.iter().flatten().map(|d| d.fire_at).min()
}

/// Whether the timer is to be re-armed before an entry: its wanted expiry (`want`, 0: none)
/// differs from what it is armed for, or it is armed on another CPU than the vCPU's now
/// (migrated: the hrtimer stays where it was armed).
pub fn needs_arming(want: u64, armed_at: u64, armed_cpu: u32, cpu: impl FnOnce() -> u32) -> bool {
    want != armed_at || (want != 0 && cpu() != armed_cpu)
}

/// Whether kick timers are used by a vCPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum TimerMode {
    /// Not used (`--limit-kick limiter`, or the cgroup backend).
    Off = 0,
    /// Wanted: the vCPU thread creates its timer when it starts.
    Wanted = 1,
    /// The timer exists and kicks.
    Active = 2,
    /// Wanted, but the timer could not be created or armed: the limiter kicks.
    Failed = 3,
}

impl TimerMode {
    fn from_u8(v: u8) -> Self {
        match v {
            0 => TimerMode::Off,
            2 => TimerMode::Active,
            3 => TimerMode::Failed,
            _ => TimerMode::Wanted,
        }
    }
}

/// One limit's deadline for a vCPU: a seqlock the limiter writes, and the vCPU's counters.
#[derive(Default)]
struct Slot {
    seq: AtomicU64,
    /// 0: no deadline.
    fire_at: AtomicU64,
    cpu_target: AtomicU64,
    stops: AtomicU64,
    rearms: AtomicU64,
}

const HOLD_SHIFT: u32 = 62;
const SEQ_MASK: u64 = (1 << HOLD_SHIFT) - 1;

fn hold_word(kind: LimitKind, seq: u64) -> u64 {
    ((kind.slot() as u64 + 1) << HOLD_SHIFT) | (seq & SEQ_MASK)
}

/// The deadlines of one vCPU's limits, what the two threads share (in [`VcpuShared`]).
pub struct KickDeadlines {
    slots: [Slot; SLOTS],
    /// Bumped after every publish: the vCPU's one load to see a change.
    epoch: AtomicU64,
    /// 0, or the slot and `seq` the vCPU stopped for ([`hold_word`]).
    hold: AtomicU64,
    /// Set by the kick signal's handler when the timer fired, with the time the handler ran
    /// (the timer's value points here).
    fired: TimerFired,
    /// When the vCPU decided to stop for a firing (0: no stop waiting for its park); written
    /// and read by the vCPU thread only.
    stop_at: AtomicU64,
    mode: AtomicU8,
    /// What the vCPU's timer is armed for (0: not armed), and the epoch that arming reflects
    /// (written by the vCPU after each arming).
    armed_at: AtomicU64,
    armed_epoch: AtomicU64,
    migrations: AtomicU64,
    nudges: AtomicU64,
    lateness: Histogram,
    overrun: Histogram,
    stages: StageHistograms,
}

/// The stages of a timer stop, wall time each ([`KickDeadlines::stages`]).
struct StageHistograms {
    to_handler: Histogram,
    to_decision: Histogram,
    spin: Histogram,
    to_park: Histogram,
}

/// Snapshots of the stages of the timer stops, wall time each but `spin` (docs/limits.md):
/// `to_handler` from the time the timer was armed for to its signal handler (the hrtimer's
/// expiry, the signal, the vCPU's way out of the guest and out of KVM_RUN: the handler runs
/// as the ioctl returns to user mode), `to_decision` from the handler to the run loop's stop
/// decision (sigreturn, the exit's bookkeeping, the clock read), `spin` the CPU spent spinning
/// to the target, `to_park` from the spin's end to the park (the park's clock readings).
#[derive(Debug, Clone)]
pub struct StopStages {
    /// Armed-for time to the signal handler.
    pub to_handler: HistogramSnapshot,
    /// Handler to the stop decision.
    pub to_decision: HistogramSnapshot,
    /// The CPU spent spinning from the decision to the CPU target (0 when the target was
    /// reached already); unlike the other stages CPU time, not wall: the exact stop's cost,
    /// whether or not the thread was preempted meanwhile.
    pub spin: HistogramSnapshot,
    /// Spin's end to the park.
    pub to_park: HistogramSnapshot,
}

impl std::fmt::Debug for KickDeadlines {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KickDeadlines")
            .field("mode", &self.mode())
            .field("hold", &self.hold.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl Default for KickDeadlines {
    fn default() -> Self {
        KickDeadlines {
            slots: Default::default(),
            epoch: AtomicU64::new(0),
            hold: AtomicU64::new(0),
            fired: TimerFired::default(),
            stop_at: AtomicU64::new(0),
            mode: AtomicU8::new(TimerMode::Wanted as u8),
            armed_at: AtomicU64::new(0),
            armed_epoch: AtomicU64::new(0),
            migrations: AtomicU64::new(0),
            nudges: AtomicU64::new(0),
            lateness: Histogram::new(3).expect("3 fractional bits are valid"),
            overrun: Histogram::new(3).expect("3 fractional bits are valid"),
            stages: StageHistograms {
                to_handler: Histogram::new(3).expect("3 fractional bits are valid"),
                to_decision: Histogram::new(3).expect("3 fractional bits are valid"),
                spin: Histogram::new(3).expect("3 fractional bits are valid"),
                to_park: Histogram::new(3).expect("3 fractional bits are valid"),
            },
        }
    }
}

impl KickDeadlines {
    /// Whether the vCPU is to use a kick timer; set before its thread starts.
    pub fn set_wanted(&self, on: bool) {
        let m = if on {
            TimerMode::Wanted
        } else {
            TimerMode::Off
        };
        self.mode.store(m as u8, Ordering::Release);
    }

    /// The timer's mode now.
    pub fn mode(&self) -> TimerMode {
        TimerMode::from_u8(self.mode.load(Ordering::Acquire))
    }

    /// Whether the timer exists and kicks (the limiter then relies on it).
    pub fn active(&self) -> bool {
        self.mode() == TimerMode::Active
    }

    /// Publishes limit `kind`'s deadline (None: no deadline); true when it changed. A deadline with
    /// the same CPU target as the one in place is not a change (its `fire_at` can only have
    /// moved later, and the vCPU re-arms by itself when it fires early). Only the limiter
    /// thread may call it (single writer).
    pub fn publish(&self, kind: LimitKind, d: Option<Deadline>) -> bool {
        let s = &self.slots[kind.slot()];
        let present = s.fire_at.load(Ordering::Relaxed) != 0;
        let same = match d {
            None => !present,
            Some(d) => present && s.cpu_target.load(Ordering::Relaxed) == d.cpu_target,
        };
        if !same {
            self.write(kind, d);
        }
        !same
    }

    /// Ends a hold for limit `kind` though its deadline stays (a new period); true if there was
    /// one. Limiter thread only.
    pub fn release_hold(&self, kind: LimitKind) -> bool {
        if !self.held(kind) {
            return false;
        }
        let s = &self.slots[kind.slot()];
        let d = match s.fire_at.load(Ordering::Relaxed) {
            0 => None,
            fire_at => Some(Deadline {
                fire_at,
                cpu_target: s.cpu_target.load(Ordering::Relaxed),
            }),
        };
        self.write(kind, d);
        true
    }

    fn write(&self, kind: LimitKind, d: Option<Deadline>) {
        let s = &self.slots[kind.slot()];
        let seq = s.seq.load(Ordering::Relaxed);
        s.seq.store(seq.wrapping_add(1), Ordering::Relaxed);
        fence(Ordering::Release);
        s.fire_at
            .store(d.map_or(0, |d| d.fire_at.max(1)), Ordering::Relaxed);
        s.cpu_target
            .store(d.map_or(0, |d| d.cpu_target), Ordering::Relaxed);
        s.seq.store(seq.wrapping_add(2), Ordering::SeqCst);
        self.epoch.fetch_add(1, Ordering::SeqCst);
    }

    /// Whether the vCPU stopped itself for limit `kind`'s current deadline (and is, or is
    /// about to be, parked as limited).
    pub fn held(&self, kind: LimitKind) -> bool {
        self.hold.load(Ordering::SeqCst)
            == hold_word(kind, self.slots[kind.slot()].seq.load(Ordering::SeqCst))
    }

    /// Whether the vCPU holds for any slot's current deadline.
    pub fn holds(&self) -> bool {
        let h = self.hold.load(Ordering::SeqCst);
        if h == 0 {
            return false;
        }
        let slot = (h >> HOLD_SHIFT) as usize - 1;
        self.slots[slot].seq.load(Ordering::SeqCst) & SEQ_MASK == h & SEQ_MASK
    }

    /// After a publish of a deadline firing at `fire_at`: whether the vCPU's timer, armed for
    /// an older epoch, fires later than that or not at all. A vCPU in the guest sees the change
    /// only at its next exit, so the limiter then makes it leave to re-arm ([`Self::nudged`]).
    pub fn armed_too_late(&self, fire_at: u64) -> bool {
        if !self.active()
            || self.armed_epoch.load(Ordering::SeqCst) >= self.epoch.load(Ordering::SeqCst)
        {
            return false;
        }
        let armed = self.armed_at.load(Ordering::SeqCst);
        armed == 0 || armed > fire_at
    }

    /// Counts a kick that made the vCPU leave the guest to re-arm (limiter side).
    pub fn nudged(&self) {
        self.nudges.fetch_add(1, Ordering::Relaxed);
    }

    /// Kicks that made the vCPU leave the guest to re-arm for an earlier deadline.
    pub fn nudges(&self) -> u64 {
        self.nudges.load(Ordering::Relaxed)
    }

    /// Whether a hold word is set, valid or not (the limiter then wakes the vCPU after a
    /// publish, so that a parked vCPU sees its hold ended).
    pub fn hold_set(&self) -> bool {
        self.hold.load(Ordering::SeqCst) != 0
    }

    /// Reads limit `kind`'s slot (vCPU side): its `seq` and deadline, or None if the limiter
    /// kept writing.
    fn read(&self, kind: LimitKind) -> Option<(u64, Option<Deadline>)> {
        let s = &self.slots[kind.slot()];
        for _ in 0..16 {
            let seq = s.seq.load(Ordering::Acquire);
            if seq & 1 == 0 {
                let fire_at = s.fire_at.load(Ordering::Relaxed);
                let cpu_target = s.cpu_target.load(Ordering::Relaxed);
                fence(Ordering::Acquire);
                if s.seq.load(Ordering::Relaxed) == seq {
                    let d = (fire_at != 0).then_some(Deadline {
                        fire_at,
                        cpu_target,
                    });
                    return Some((seq, d));
                }
            }
            std::hint::spin_loop();
        }
        None
    }

    /// Takes a hold for limit `kind` as of `seq` (vCPU side); false (and no hold) if the
    /// limiter published since.
    fn take_hold(&self, kind: LimitKind, seq: u64) -> bool {
        self.hold.store(hold_word(kind, seq), Ordering::SeqCst);
        if self.slots[kind.slot()].seq.load(Ordering::SeqCst) == seq {
            return true;
        }
        self.hold.store(0, Ordering::SeqCst);
        false
    }

    /// Stops the vCPU's timer made for limit `kind`.
    pub fn stops(&self, kind: LimitKind) -> u64 {
        self.slots[kind.slot()].stops.load(Ordering::Relaxed)
    }

    /// Firings after which the vCPU had CPU left for limit `kind` and re-armed.
    pub fn rearms(&self, kind: LimitKind) -> u64 {
        self.slots[kind.slot()].rearms.load(Ordering::Relaxed)
    }

    /// Re-arms because the vCPU was on another CPU than the one holding its timer.
    pub fn migrations(&self) -> u64 {
        self.migrations.load(Ordering::Relaxed)
    }

    /// How late each firing was noticed by the vCPU thread: from the time the timer was armed
    /// for until the thread, out of the guest, read the clock.
    pub fn lateness(&self) -> HistogramSnapshot {
        self.lateness.snapshot()
    }

    /// At each stop, the CPU the vCPU had used past its target (0 when it stopped short of it,
    /// within [`REARM_MIN_NS`]): what the timer's lateness cost while the vCPU ran. Unlike
    /// [`Self::lateness`] it leaves out the time the thread was preempted.
    pub fn overrun(&self) -> HistogramSnapshot {
        self.overrun.snapshot()
    }

    /// The stages of this vCPU's timer stops.
    pub fn stages(&self) -> StopStages {
        StopStages {
            to_handler: self.stages.to_handler.snapshot(),
            to_decision: self.stages.to_decision.snapshot(),
            spin: self.stages.spin.snapshot(),
            to_park: self.stages.to_park.snapshot(),
        }
    }

    /// The vCPU parks as limited at `now` (vCPU thread): ends the stage of a timer stop's
    /// park. One relaxed load when the park is not a timer stop's.
    pub(super) fn parked(&self, now: u64) {
        let at = self.stop_at.load(Ordering::Relaxed);
        if at != 0 {
            self.stop_at.store(0, Ordering::Relaxed);
            self.stages.to_park.record(now.saturating_sub(at));
        }
    }
}

/// What the loop does after [`KickTimer::prepare`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Prepared {
    /// Enter the guest.
    Enter,
    /// Park as limited: the vCPU holds for a limit's deadline.
    Hold,
    /// Start the iteration again (a firing arrived meanwhile, or the limiter moved on).
    Again,
}

/// A POSIX timer aimed at the calling thread.
struct OsTimer(libc::timer_t);

impl OsTimer {
    /// A CLOCK_MONOTONIC timer that sends `signal` to this thread with `fired` as its value.
    fn create(signal: libc::c_int, fired: &TimerFired) -> std::io::Result<Self> {
        // SAFETY: sigevent is plain data (integers, a pointer, padding): all zeroes is valid.
        let mut ev: libc::sigevent = unsafe { std::mem::zeroed() };
        ev.sigev_notify = libc::SIGEV_THREAD_ID;
        ev.sigev_signo = signal;
        // SAFETY: gettid has no preconditions.
        ev.sigev_notify_thread_id = unsafe { libc::gettid() };
        ev.sigev_value = libc::sigval {
            sival_ptr: fired as *const TimerFired as *mut libc::c_void,
        };
        let mut id: libc::timer_t = std::ptr::null_mut();
        // SAFETY: `ev` and `id` are valid for the call; the kernel copies `ev`. The value it
        // carries points at `fired`, which the caller keeps alive as long as the timer
        // (`KickTimer`'s contract), as the signal handler's `mark_timer_fired` requires.
        if unsafe { libc::timer_create(libc::CLOCK_MONOTONIC, &mut ev, &mut id) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(OsTimer(id))
    }

    /// Arms the timer for CLOCK_MONOTONIC time `at_ns`, or disarms it (0).
    fn set(&self, at_ns: u64) -> std::io::Result<()> {
        let spec = libc::itimerspec {
            it_interval: libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            it_value: libc::timespec {
                tv_sec: (at_ns / 1_000_000_000) as libc::time_t,
                tv_nsec: (at_ns % 1_000_000_000) as libc::c_long,
            },
        };
        // SAFETY: `self.0` is a live timer of this process; `spec` is valid for the call.
        let r = unsafe {
            libc::timer_settime(self.0, libc::TIMER_ABSTIME, &spec, std::ptr::null_mut())
        };
        if r != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }
}

impl Drop for OsTimer {
    fn drop(&mut self) {
        // SAFETY: `self.0` is a live timer created by `create` and deleted only here.
        unsafe { libc::timer_delete(self.0) };
    }
}

/// The vCPU thread's side: its timer and what it last read of its deadlines. Lives on the
/// vCPU thread, inside the run loop (the timer is deleted when the loop ends, while the
/// thread still holds the [`VcpuShared`] whose `fired` flag the timer points at).
pub(super) struct KickTimer {
    os: Option<OsTimer>,
    seen_epoch: u64,
    seen: [(u64, Option<Deadline>); SLOTS],
    /// What the timer is armed for (0: not armed).
    armed_at: u64,
    armed_cpu: u32,
    /// How early the timer fires before a target can be reached, learnt from its firings.
    lead: Lead,
    /// The most the vCPU may spin for the deadlines it read last: half the CPU it had left
    /// to the nearest target when it read them ([`spin_cap`]).
    spin_cap: u64,
    /// The lead the timer is armed with (what a firing's sample is measured against).
    armed_lead: u64,
    /// How the thread reads its CPU (the run loop's own reader).
    cpu: CpuReader,
}

impl KickTimer {
    /// Creates the calling vCPU thread's timer when the VM wants kick timers and the
    /// hypervisor's kicks are signals; without one the limiter kicks by itself. `cpu` is the
    /// run loop's CPU reader.
    pub(super) fn start(shared: &VcpuShared, cpu: CpuReader) -> Self {
        let t = &shared.kick_timer;
        let mut os = None;
        if t.mode() == TimerMode::Wanted {
            let signal = shared.kicker.get().and_then(|k| k.timer_signal());
            os = match signal.map(|s| OsTimer::create(s, &t.fired)) {
                Some(Ok(os)) => Some(os),
                Some(Err(e)) => {
                    log::warn!(
                        "vCPU {}: no kick timer ({e}); the limiter thread kicks it",
                        shared.id
                    );
                    None
                }
                None => None,
            };
            let mode = if os.is_some() {
                TimerMode::Active
            } else {
                TimerMode::Failed
            };
            t.mode.store(mode as u8, Ordering::Release);
        }
        KickTimer {
            os,
            seen_epoch: 0,
            seen: [(0, None); SLOTS],
            armed_at: 0,
            armed_cpu: 0,
            lead: Lead::default(),
            spin_cap: u64::MAX,
            armed_lead: 0,
            cpu,
        }
    }

    /// Before an entry: whether the vCPU holds for a limit, and the timer armed for the
    /// earliest deadline. The common case is three loads (and `rdpid` while armed, or
    /// `sched_getcpu` where the host does not allow it): no lock, no allocation, no system
    /// call.
    #[inline]
    pub(super) fn prepare(&mut self, shared: &VcpuShared) -> Prepared {
        let t = &shared.kick_timer;
        if t.hold.load(Ordering::Relaxed) != 0 {
            if t.holds() {
                return Prepared::Hold;
            }
            // The limiter moved on: the hold is over.
            t.hold.store(0, Ordering::SeqCst);
        }
        if self.os.is_none() {
            return Prepared::Enter;
        }
        let fired = t.fired.fired.load(Ordering::Relaxed);
        let epoch = t.epoch.load(Ordering::Acquire);
        if !fired
            && epoch == self.seen_epoch
            && !needs_arming(self.armed_at, self.armed_at, self.armed_cpu, || {
                self.cpu.read()
            })
        {
            return Prepared::Enter;
        }
        self.slow(shared, fired, epoch)
    }

    fn deadlines(&self) -> [Option<Deadline>; SLOTS] {
        [self.seen[0].1, self.seen[1].1, self.seen[2].1]
    }

    /// The lead the timer fires with: the learnt one, within the spin cap.
    fn lead(&self) -> u64 {
        self.lead.get().min(self.spin_cap)
    }

    /// The least CPU target of `deadlines`.
    fn least_target(deadlines: &[Option<Deadline>; SLOTS]) -> Option<u64> {
        deadlines.iter().flatten().map(|d| d.cpu_target).min()
    }

    /// Reads every slot again (the limiter published since `epoch`), and the spin's cap.
    fn reread(&mut self, shared: &VcpuShared, epoch: u64) {
        let mut read = [(0, None); SLOTS];
        for (k, r) in LimitKind::ALL.into_iter().zip(read.iter_mut()) {
            match shared.kick_timer.read(k) {
                Some(v) => *r = v,
                // The limiter is writing this slot: take it all again at the next entry.
                None => return,
            }
        }
        self.seen = read;
        self.seen_epoch = epoch;
        self.spin_cap = spin_cap(Self::least_target(&self.deadlines()), || {
            charged_now(shared).0
        });
    }

    #[cold]
    fn slow(&mut self, shared: &VcpuShared, fired: bool, epoch: u64) -> Prepared {
        let t = &shared.kick_timer;
        if epoch != self.seen_epoch {
            self.reread(shared, epoch);
        }
        let now = now_ns();
        let mut due = false;
        // The firing's armed-for time and handler time, for the stages of a stop.
        let mut firing = None;
        if fired {
            t.fired.fired.store(false, Ordering::Relaxed);
            // A signal before the time armed for is a stale one, of an earlier arming.
            if self.armed_at != 0 && now >= self.armed_at {
                t.lateness.record(now - self.armed_at);
                firing = Some((self.armed_at, t.fired.at_ns.load(Ordering::Acquire)));
                self.armed_at = 0;
                due = true;
            }
        }
        let deadlines = self.deadlines();
        // The timer fires the lead before the earliest time a target can be reached.
        let want = earliest(&deadlines).map(|at| at.saturating_sub(self.lead()).max(1));
        due |= want.is_some_and(|at| at <= now);
        if due {
            // Targets are on the charged clock (the thread's CPU clock less its stops); the
            // spin reads the thread's own clock, `offset` ahead of it.
            let (cpu, raw) = charged_now(shared);
            let offset = raw - cpu;
            if let (Some(_), Some(target)) = (firing, Self::least_target(&deadlines)) {
                self.lead.learn(self.armed_lead, target, cpu);
            }
            let firing_ns = shared.acct.exit_cost.map_or(0, |c| c.hot_ns);
            match on_fire(cpu, &deadlines, self.lead(), firing_ns) {
                OnFire::Stop(kind) => {
                    // A re-arm's stop still open (the guest has not run since): it ends here,
                    // so that the spin is charged as a stop's spin is.
                    shared.stops.end(raw, 0);
                    self.arm(t, 0);
                    let target = deadlines[kind.slot()].map_or(cpu, |d| d.cpu_target) + offset;
                    let spun_from = raw;
                    let Some(cpu) = spin_to(shared, target, raw, epoch) else {
                        return Prepared::Again;
                    };
                    let (stop, spun) = (now_ns(), cpu.saturating_sub(spun_from));
                    t.overrun.record(cpu.saturating_sub(target));
                    // The spin is charged (it lands the stop on its target); what follows is
                    // the stop's own cost, the VMM's.
                    shared.stops.begin(cpu);
                    if t.take_hold(kind, self.seen[kind.slot()].0) {
                        t.slots[kind.slot()].stops.fetch_add(1, Ordering::Relaxed);
                        if let Some((armed, handler)) = firing.filter(|f| f.1 >= f.0) {
                            t.stages.to_handler.record(handler - armed);
                            t.stages.to_decision.record(now.saturating_sub(handler));
                            t.stages.spin.record(spun);
                            t.stop_at.store(stop, Ordering::Relaxed);
                        }
                        return Prepared::Hold;
                    }
                    return Prepared::Again;
                }
                OnFire::Rearm { after_ns, limit } => {
                    // A firing short of the target: the exit it forced and the re-arming are
                    // a stop's cost too, not the guest's.
                    shared.stops.begin(raw);
                    t.slots[limit.slot()].rearms.fetch_add(1, Ordering::Relaxed);
                    self.arm(t, now + after_ns);
                }
                OnFire::Idle => self.arm(t, 0),
            }
        } else {
            let want = want.unwrap_or(0);
            if needs_arming(want, self.armed_at, self.armed_cpu, || self.cpu.read()) {
                if want == self.armed_at {
                    t.migrations.fetch_add(1, Ordering::Relaxed);
                }
                self.arm(t, want);
            }
        }
        // Say what the timer is armed for, then look again: a deadline the limiter published
        // meanwhile is taken now, or the limiter sees this arming is stale and kicks.
        t.armed_at.store(self.armed_at, Ordering::SeqCst);
        t.armed_epoch.store(self.seen_epoch, Ordering::SeqCst);
        if t.fired.fired.load(Ordering::Relaxed) || t.epoch.load(Ordering::SeqCst) != epoch {
            Prepared::Again
        } else {
            Prepared::Enter
        }
    }

    /// Arms the timer for `at` (0: disarms it) on this CPU. A timer that cannot be armed is
    /// given up: the limiter then kicks by itself.
    fn arm(&mut self, t: &KickDeadlines, at: u64) {
        if at == 0 && self.armed_at == 0 {
            return;
        }
        let Some(os) = &self.os else {
            return;
        };
        match os.set(at) {
            Ok(()) => {
                self.armed_at = at;
                self.armed_lead = self.lead();
                self.armed_cpu = if at == 0 { 0 } else { self.cpu.read() };
            }
            Err(e) => {
                log::warn!("a kick timer cannot be armed ({e}); the limiter thread kicks");
                self.os = None;
                self.armed_at = 0;
                t.mode.store(TimerMode::Failed as u8, Ordering::Release);
            }
        }
    }
}

mod probe;
mod spin;
pub use probe::signal_path;
pub use spin::spin_cap;
use spin::{charged_now, spin_to};
#[cfg(test)]
mod tests;
