//! One vCPU: the state other threads see ([`VcpuShared`]), its thread, and how it ends.
//!
//! Data flow: the VM builder creates the hypervisor's vCPU and a [`VcpuShared`], then
//! [`spawn`]s a thread named `vcpu<N>` that owns the vCPU ([`VcpuThread`], generic over
//! `hypervisor::Vcpu`: static dispatch, no lock around the vCPU). The thread binds the vCPU
//! (so a kick can stop it) and loops ([`run`]): check its [`Requests`] → run the guest → hand
//! the `ExitEvent` to `exit::handle_exit` (the buses and devices) → carry out the outcome:
//! resume, park ([`park`], as a `ParkKind`) for a device's `Park` request, a limit or a pause,
//! or end. States (the protocol's [`ThreadState`]): `Running` (in or around the guest),
//! `Parked`, `Finished`. Everything other threads read lives in [`VcpuShared`] as atomics
//! written by this thread alone (single writer, relaxed increments, no lock, no allocation on
//! the exit path). When the loop ends the thread stores a [`VcpuEnd`] and tells the VM through
//! a channel.

use std::sync::atomic::{AtomicI32, AtomicU32, AtomicU8, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;

use serde::Serialize;
use thiserror::Error;

use crate::accounting::meter::MicroState;
use crate::accounting::snapshot::{HistSnapshots, VcpuAccounting, VcpuTimes};
use crate::accounting::AccountingControl;
use crate::devices::Buses;
use crate::exit::Failure;
use crate::hypervisor::{self as hv, Kicker, RegsDump, RunError, WarmUpStub};
use crate::stamp_clock::StampStatus;
use crate::sync::Counter;
use crate::sync::{futex_wake, now_ns};
use ppa_vmm_api::VcpuSummary;

mod kick_lead;
mod kick_timer;
mod park;
mod plain;
mod requests;
mod run;
pub mod stops;
#[cfg(test)]
mod tests;

pub use kick_timer::{signal_path, Deadline, KickDeadlines, StopStages, TimerMode};
pub use ppa_vmm_api::ThreadState;
use requests::RequestWord;
pub use requests::{LimitKind, Requests};

/// Errors of a vCPU thread's life outside the guest's control.
#[derive(Debug, Error)]
pub enum VcpuError {
    /// The thread could not be created.
    #[error("cannot start the thread of vCPU {0}")]
    Spawn(usize, #[source] std::io::Error),
}

/// How a vCPU's loop ended.
#[derive(Debug)]
pub enum VcpuEnd {
    /// The guest ended the vCPU with an exit code (tiny guest: the exit doorbell).
    Exited(u64),
    /// The guest did something fatal.
    Failed {
        /// What.
        failure: Failure,
        /// Registers at that moment, when the hypervisor could give them.
        regs: Option<Box<RegsDump>>,
        /// The exit before the fatal one, as the VMM saw it: where the guest last was for sure
        /// when the registers do not say (`RegsDump::reset`).
        last_exit: Option<LastExit>,
    },
    /// The hypervisor failed (not the guest's doing).
    Error(RunError),
    /// The VMM stopped it (another vCPU failed, the run timed out, an operator).
    Stopped,
    /// The guest asked for the whole VM to stop (a reset or power-off request).
    GuestStop,
}

/// An exit the vCPU loop remembers: its reason and address (what it keeps costs two stores
/// per exit, no clock or system call).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, schemars::JsonSchema)]
pub struct LastExit {
    /// Reason.
    pub reason: crate::exit::ExitReason,
    /// Guest address or port of an I/O exit.
    pub addr: Option<u64>,
}

impl VcpuEnd {
    /// Whether the end is a failure that should stop the other vCPUs.
    pub fn is_failure(&self) -> bool {
        matches!(self, VcpuEnd::Failed { .. } | VcpuEnd::Error(_))
    }

    /// The end as the protocol names it, and the guest's exit code when it chose its end (the
    /// vCPU that asked the VM to stop ended the run as the guest wanted: code 0).
    pub fn kind_and_code(&self) -> (ppa_vmm_api::VcpuEndKind, Option<u64>) {
        use ppa_vmm_api::VcpuEndKind as K;
        match self {
            VcpuEnd::Exited(code) => (K::Exited, Some(*code)),
            VcpuEnd::GuestStop => (K::Exited, Some(0)),
            VcpuEnd::Failed { .. } => (K::Failed, None),
            VcpuEnd::Error(_) => (K::Error, None),
            VcpuEnd::Stopped => (K::Stopped, None),
        }
    }

    /// One sentence for an operator, with the hypervisor's error where there is one.
    pub fn reason(&self) -> Option<String> {
        match self {
            VcpuEnd::Failed {
                failure,
                regs,
                last_exit,
            } => {
                let mut s = failure.to_string();
                if regs.as_ref().is_some_and(|r| r.reset) {
                    s.push_str(
                        "; the hypervisor handed back the registers in their reset state (CS \
                         0xf000, RIP 0xfff0), as KVM on AMD SVM does after a triple fault, so \
                         they do not show where the guest failed",
                    );
                    match last_exit {
                        Some(LastExit {
                            reason,
                            addr: Some(a),
                        }) => s.push_str(&format!(
                            "; its last exit before the fault was {} at {a:#x}",
                            reason.name()
                        )),
                        Some(LastExit { reason, addr: None }) => s.push_str(&format!(
                            "; its last exit before the fault was {}",
                            reason.name()
                        )),
                        None => s.push_str("; it made no exit before the fault"),
                    }
                }
                Some(s)
            }
            VcpuEnd::Error(e) => Some(match std::error::Error::source(e) {
                Some(s) => format!("{e}: {s}"),
                None => e.to_string(),
            }),
            _ => None,
        }
    }
}

/// The part of a vCPU other threads see.
pub struct VcpuShared {
    /// vCPU index.
    pub id: usize,
    tid: AtomicI32,
    state: AtomicU8,
    requests: RequestWord,
    wake: AtomicU32,
    kicker: OnceLock<Box<dyn Kicker>>,
    /// Accounting: the meter the thread writes, its sources, the reset baseline.
    pub acct: VcpuAccounting,
    /// Runaway and overload detections (written by the sampler).
    pub overloads: Counter,
    /// The deadlines of its limits' kick timer (written by the limiter) and its figures.
    pub kick_timer: KickDeadlines,
    /// What stopping it for its limits cost (written by its thread): the CPU its limits do
    /// not charge it.
    pub stops: stops::StopAccount,
    /// The host CPU of its last entry into the guest (`u32::MAX`: none yet): written by its
    /// thread when it changes.
    last_cpu: AtomicU32,
    /// How its thread takes its stamps (written by its stamp clock when that changes).
    pub stamp_status: Arc<StampStatus>,
    /// The CPUs it was placed on, list form (readers and the placer only).
    cpus: std::sync::Mutex<Option<String>>,
    end: OnceLock<VcpuEnd>,
}

impl std::fmt::Debug for VcpuShared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VcpuShared")
            .field("id", &self.id)
            .field("tid", &self.host_tid())
            .field("state", &self.state())
            .field("end", &self.end())
            .finish_non_exhaustive()
    }
}

impl VcpuShared {
    /// A vCPU that has not started.
    pub fn new(id: usize, acct: VcpuAccounting) -> Self {
        VcpuShared {
            id,
            tid: AtomicI32::new(0),
            state: AtomicU8::new(ThreadState::Created.index() as u8),
            requests: RequestWord::default(),
            wake: AtomicU32::new(0),
            kicker: OnceLock::new(),
            acct,
            overloads: Counter::default(),
            kick_timer: KickDeadlines::default(),
            stops: stops::StopAccount::default(),
            last_cpu: AtomicU32::new(u32::MAX),
            stamp_status: Arc::default(),
            cpus: std::sync::Mutex::new(None),
            end: OnceLock::new(),
        }
    }

    /// The CPU clock its limits charge it by (its thread's CPU clock less its stops, frozen
    /// while a stop is in progress) and its stops' totals; None before its thread started.
    pub fn charged_cpu_ns(&self) -> Option<(u64, stops::StopTotals)> {
        let started = std::cell::Cell::new(true);
        let r = self.stops.charged(|| {
            let c = self.acct.thread_cpu_ns();
            started.set(c.is_some());
            c.unwrap_or(0)
        });
        started.get().then_some(r)
    }

    /// Records the CPUs it was placed on.
    pub fn set_cpus(&self, cpus: String) {
        *self.cpus.lock().unwrap_or_else(|e| e.into_inner()) = Some(cpus);
    }

    /// Notes the host CPU of an entry into the guest (vCPU thread; a store only when it
    /// changed).
    #[inline]
    pub(crate) fn entered_on(&self, cpu: u32) {
        if self.last_cpu.load(Ordering::Relaxed) != cpu {
            self.last_cpu.store(cpu, Ordering::Relaxed);
        }
    }

    /// Host thread id of the vCPU thread (0 before it started).
    pub fn host_tid(&self) -> i32 {
        self.tid.load(Ordering::Acquire)
    }

    /// Current state.
    pub fn state(&self) -> ThreadState {
        let i = usize::from(self.state.load(Ordering::Acquire));
        ThreadState::ALL
            .get(i)
            .copied()
            .unwrap_or(ThreadState::Created)
    }

    /// How the loop ended, once it has.
    pub fn end(&self) -> Option<&VcpuEnd> {
        self.end.get()
    }

    /// Asks the vCPU to act on `requests` at its next exit and forces that exit now: wakes it
    /// if parked, kicks it out of the guest if running.
    pub fn kick(&self, requests: Requests) {
        self.acct
            .meter
            .released_at
            .store(now_ns(), Ordering::Release);
        self.requests.set(requests);
        futex_wake(&self.wake);
        // A thread not yet in its loop reads its requests at the loop's first turn; a signal
        // now would cut its warm-up run short ("warm-up run failed" under tight limits, whose
        // limiter stops a member that has not started where it sleeps: issue 39). The fence
        // pairs with the thread's after it says `Running`: one of the two sees the other.
        std::sync::atomic::fence(Ordering::SeqCst);
        if matches!(self.state(), ThreadState::Finished | ThreadState::Created) {
            return;
        }
        if let Some(k) = self.kicker.get() {
            k.kick();
        }
    }

    /// Releases a paused vCPU: clears the pause request and wakes it. The release time is what
    /// its wake-up latency is measured from.
    pub fn resume(&self) {
        self.release(Requests::PAUSE);
    }

    /// The section 4 fields now (or at the thread's end), with the histograms.
    pub fn times(&self) -> (VcpuTimes, HistSnapshots) {
        self.times_with(true)
    }

    /// The section 4 fields now, with the histograms and detail maps only when `with_hist`.
    pub fn times_with(&self, with_hist: bool) -> (VcpuTimes, HistSnapshots) {
        let (t, h) = self.acct.times_with(with_hist);
        (self.label(t), h)
    }

    /// `t` with this vCPU's id, thread, overloads and end.
    fn label(&self, mut t: VcpuTimes) -> VcpuTimes {
        t.id = self.id;
        t.host_tid = self.host_tid();
        t.overloads = self.overloads.get();
        t.cpus = self.cpus.lock().unwrap_or_else(|e| e.into_inner()).clone();
        t.last_cpu = Some(self.last_cpu.load(Ordering::Relaxed)).filter(|&c| c != u32::MAX);
        let (mode, drifts) = self.stamp_status.read();
        (t.stamp_clock, t.stamp_clock_drifts) = (mode, u64::from(drifts));
        if self.state() == ThreadState::Finished {
            t.state = ppa_vmm_api::VcpuMicroState::Finished;
        }
        t
    }

    /// The section 4 fields as sampled, not held at what earlier readers were given (the
    /// final report's exact figures; docs/accounting.md).
    pub fn times_exact(&self) -> (VcpuTimes, HistSnapshots) {
        let (t, h) = self.acct.times_exact();
        (self.label(t), h)
    }

    /// The overview of `stats`: the section 4 times and exit counts, without the histograms
    /// and detail maps (a few system calls and no map of KVM statistics).
    pub fn summary(&self) -> VcpuSummary {
        self.times_with(false).0.into()
    }

    /// Clears `requests` (a limit's stop) and wakes the vCPU if it is parked on them. The
    /// release time is what its wake-up latency is measured from.
    pub fn release(&self, requests: Requests) {
        self.acct
            .meter
            .released_at
            .store(now_ns(), Ordering::Release);
        self.requests.clear(requests);
        futex_wake(&self.wake);
    }

    /// Publishes the kick-timer deadline of limit `kind` (None: none). A vCPU its timer holds
    /// for that limit is released by the change, and woken.
    pub fn set_kick_deadline(&self, kind: LimitKind, deadline: Option<Deadline>) {
        if !self.kick_timer.publish(kind, deadline) {
            return;
        }
        self.wake_holder();
        // In the guest, it sees the change only at its next exit: if its timer would fire
        // too late, make it leave now to re-arm (a kick with no request).
        if let Some(d) = deadline {
            if self.kick_timer.armed_too_late(d.fire_at)
                && self.acct.meter.read().micro_state() == MicroState::Guest
            {
                if let Some(k) = self.kicker.get() {
                    k.kick();
                    self.kick_timer.nudged();
                }
            }
        }
    }

    /// Ends a hold of the kick timer for limit `kind` (a new period); true if the vCPU was
    /// held.
    pub fn release_kick_hold(&self, kind: LimitKind) -> bool {
        let held = self.kick_timer.release_hold(kind);
        if held {
            self.wake_holder();
        }
        held
    }

    /// Whether its kick timer stopped it for limit `kind` (current deadline).
    pub fn kick_held(&self, kind: LimitKind) -> bool {
        self.kick_timer.held(kind)
    }

    /// Turns a kick timer's hold for limit `kind` into that limit's stop: sets its request
    /// (the vCPU is parked, or about to park: no signal), then clears the deadline, which
    /// ends the hold while the request keeps the vCPU parked. No wake: a parked vCPU would
    /// only find the request and park again, and that round trip is CPU charged to the
    /// period it stopped in (issue 29: 10-30 µs here, varying, the largest part of a stop's
    /// error once the stop itself lands on its target).
    pub fn adopt_kick_hold(&self, kind: LimitKind) {
        self.requests.set(kind.into());
        self.kick_timer.publish(kind, None);
    }

    fn wake_holder(&self) {
        if self.kick_timer.hold_set() {
            self.acct
                .meter
                .released_at
                .store(now_ns(), Ordering::Release);
            futex_wake(&self.wake);
        }
    }

    /// Whether any of `requests` is set.
    pub fn requested(&self, requests: Requests) -> bool {
        self.requests.load().intersects(requests)
    }

    /// Whether a pause is requested.
    pub fn pause_requested(&self) -> bool {
        self.requested(Requests::PAUSE)
    }

    fn set_state(&self, s: ThreadState) {
        self.state.store(s.index() as u8, Ordering::Release);
    }

    /// Plays the thread's start (its wall clock from `started_ns`, CPU time 0) and, with
    /// `ended_ns`, its end, for tests of what readers do with them.
    #[cfg(test)]
    pub(crate) fn pretend_ran(&self, started_ns: u64, ended_ns: Option<u64>) {
        self.acct.set_origin(0, 0);
        self.acct.started_ns.store(started_ns, Ordering::Release);
        self.set_state(ThreadState::Running);
        if let Some(at_ns) = ended_ns {
            let _ = self
                .acct
                .finals
                .set(crate::accounting::snapshot::FinalReadings {
                    at_ns,
                    cpu_ns: 0,
                    run_delay_ns: 0,
                    ticks: None,
                    kvm: Vec::new(),
                });
            self.set_state(ThreadState::Finished);
        }
    }
}

/// How the vCPU threads are named: ours (`vcpu0`, `vcpu1`, …) or Firecracker's (`fc_vcpu 0`,
/// …), which Kata Containers looks for to find a Firecracker VM's vCPU threads
/// (docs/firecracker.md). The name is what `ps -L`, `top -H` and `ctl threads` show; the
/// accounting keys vCPUs by index either way.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum VcpuNames {
    /// `vcpuN`.
    #[default]
    Ppa,
    /// `fc_vcpu N`, as Firecracker names them.
    Firecracker,
}

impl VcpuNames {
    /// The name of vCPU `id`'s thread (at most 15 bytes for any id up to [`crate::config::MAX_VCPUS`]).
    pub fn name(self, id: usize) -> String {
        match self {
            VcpuNames::Ppa => format!("vcpu{id}"),
            VcpuNames::Firecracker => format!("fc_vcpu {id}"),
        }
    }
}

/// What a vCPU thread owns.
pub struct VcpuThread<V: hv::Vcpu> {
    /// The hypervisor's vCPU.
    pub vcpu: V,
    /// Shared state.
    pub shared: Arc<VcpuShared>,
    /// The VM's devices.
    pub buses: Arc<Buses>,
    /// Where to say "vCPU N finished".
    pub done: Sender<usize>,
    /// Opened once every vCPU thread exists, so that all start together and none runs while
    /// the others' stacks are being mapped.
    pub start_gate: Arc<AtomicU32>,
    /// The VM's accounting settings.
    pub control: Arc<AccountingControl>,
    /// The payload's warm-up stub, run once before the clocks start.
    pub warm_up: Option<WarmUpStub>,
}

/// Starts the thread of a vCPU, named `vcpuN` (the tests' shorthand for [`spawn_named`]); the
/// handle must be joined before the VM is dropped.
#[cfg(test)]
pub fn spawn<V: hv::Vcpu + 'static>(v: VcpuThread<V>) -> Result<JoinHandle<()>, VcpuError> {
    let name = VcpuNames::Ppa.name(v.shared.id);
    spawn_named(v, name)
}

/// Starts the thread of a vCPU named `name` (the VM's [`VcpuNames`]); the handle
/// must be joined before the VM is dropped.
pub fn spawn_named<V: hv::Vcpu + 'static>(
    v: VcpuThread<V>,
    name: String,
) -> Result<JoinHandle<()>, VcpuError> {
    let id = v.shared.id;
    std::thread::Builder::new()
        .name(name)
        .spawn(move || run::thread_main(v))
        .map_err(|e| VcpuError::Spawn(id, e))
}
