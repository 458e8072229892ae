//! One vCPU: its host thread, its KVM_RUN loop as a small state machine, and the counters it
//! publishes.
//!
//! Data flow: `vm.rs` creates the vCPU fd and a [`VcpuShared`], then [`spawn`]s a thread named
//! `vcpu<N>` that owns the fd. The thread loops: check requests → KVM_RUN → turn the result
//! into an `exit::ExitEvent` → `exit::handle_exit` (the bus and devices) → carry out the
//! outcome (resume, park for a halt, record a report, stop). States: `Running` (in or around
//! KVM_RUN), `Parked` (halt doorbell or HLT), `Finished`. Everything other threads read lives in
//! [`VcpuShared`] as atomics written by this thread alone (single writer, relaxed increments,
//! no lock, no allocation on the exit path). When the loop ends the thread stores a
//! [`VcpuEnd`] and tells the VM through a channel.

use std::sync::atomic::{AtomicI32, AtomicU32, AtomicU8, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;

use kvm_ioctls::{VcpuExit, VcpuFd};
use ppa_guest_abi::doorbell::REPORT_KEYS;
use serde::Serialize;
use thiserror::Error;

use crate::accounting::host::{
    current_cpu, thread_cpu_ns, thread_ticks, SchedStatFile, ThreadClock,
};
use crate::accounting::meter::{Counter, MicroState, ParkStamp, Recorder, Stamp};
use crate::accounting::snapshot::{
    FinalReadings, HistSnapshots, LiveSources, VcpuAccounting, VcpuTimes,
};
use crate::accounting::{AccountingControl, Level};
use crate::bus::{Bus, DeviceAction};
use crate::exit::{handle_exit, ExitEvent, ExitReason, Failure, Outcome};
use crate::kick::{self, futex_wait, futex_wake, now_ns};
use ppa_vmm_api::VcpuSummary;

/// Errors of a vCPU thread's life outside the guest's control.
#[derive(Debug, Error)]
pub enum VcpuError {
    /// The thread could not be created.
    #[error("cannot start the thread of vCPU {0}")]
    Spawn(usize, #[source] std::io::Error),
    /// KVM_RUN failed with an error other than EINTR/EAGAIN.
    #[error("KVM_RUN failed")]
    Run(#[source] kvm_ioctls::Error),
}

/// Life-cycle state of a vCPU thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum VcpuState {
    /// Created, thread not yet in its loop.
    Created = 0,
    /// In or around KVM_RUN.
    Running = 1,
    /// Parked by the VMM (halt doorbell or HLT).
    Parked = 2,
    /// The loop has ended.
    Finished = 3,
}

impl VcpuState {
    fn from_u8(v: u8) -> Self {
        match v {
            1 => VcpuState::Running,
            2 => VcpuState::Parked,
            3 => VcpuState::Finished,
            _ => VcpuState::Created,
        }
    }
}

/// Request bit: leave the loop at the next exit.
pub const REQ_STOP: u32 = 1;
/// Request bit: park (paused) at the next exit until the bit is cleared.
pub const REQ_PAUSE: u32 = 2;
/// Request bit: park (limited) at the next exit until cleared: the vCPU's group is out of
/// budget.
pub const REQ_LIMIT_GROUP: u32 = 4;
/// Request bit: the same for the VM-wide limit.
pub const REQ_LIMIT_VM: u32 = 8;
/// Request bit: the same for a throttle that runaway detection applied to this vCPU.
pub const REQ_LIMIT_RUNAWAY: u32 = 16;
/// Any limit bit.
pub const REQ_LIMIT: u32 = REQ_LIMIT_GROUP | REQ_LIMIT_VM | REQ_LIMIT_RUNAWAY;

/// Doorbell accesses by kind, so that workload exits are told apart from the protocol's own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Doorbell {
    /// Console byte.
    Console,
    /// Exit doorbell.
    Exit,
    /// Halt doorbell.
    Halt,
    /// Report doorbell.
    Report,
    /// MMIO workload doorbell.
    WorkloadMmio,
    /// PIO workload port.
    WorkloadPio,
    /// An access no device claims.
    Unhandled,
}

impl Doorbell {
    /// Number of kinds.
    pub const COUNT: usize = 7;
    /// Every kind, in index order.
    pub const ALL: [Doorbell; Self::COUNT] = [
        Doorbell::Console,
        Doorbell::Exit,
        Doorbell::Halt,
        Doorbell::Report,
        Doorbell::WorkloadMmio,
        Doorbell::WorkloadPio,
        Doorbell::Unhandled,
    ];
    /// Name in reports.
    pub fn name(self) -> &'static str {
        [
            "console",
            "exit",
            "halt",
            "report",
            "workload_mmio",
            "workload_pio",
            "unhandled",
        ][self as usize]
    }
}

/// What the vCPU thread publishes about its devices while it runs (exits and times are in
/// its accounting meter).
#[derive(Debug, Default)]
pub struct VcpuCounters {
    /// Doorbell accesses by [`Doorbell`] index.
    pub doorbells: [Counter; Doorbell::COUNT],
    /// Values the guest reported, by report key.
    pub reported: [Counter; REPORT_KEYS as usize],
    /// Bit K set when key K was reported.
    pub reported_mask: AtomicU32,
}

/// Register state of a failed vCPU, for the operator.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct RegsDump {
    /// Instruction pointer.
    pub rip: String,
    /// Stack pointer.
    pub rsp: String,
    /// Flags.
    pub rflags: String,
    /// RAX.
    pub rax: String,
    /// RDI.
    pub rdi: String,
    /// CR0.
    pub cr0: String,
    /// CR3.
    pub cr3: String,
    /// CR4.
    pub cr4: String,
    /// EFER.
    pub efer: String,
    /// CS selector.
    pub cs: String,
    /// SS selector.
    pub ss: String,
}

/// How a vCPU's loop ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VcpuEnd {
    /// The guest wrote the exit doorbell.
    Exited(u64),
    /// The guest did something fatal.
    Failed {
        /// What.
        failure: Failure,
        /// Registers at that moment, when KVM could give them.
        regs: Option<Box<RegsDump>>,
    },
    /// KVM failed (not the guest's doing).
    Error(String),
    /// The VMM stopped it (another vCPU failed, the run timed out, an operator).
    Stopped,
}

/// The part of a vCPU other threads see.
#[derive(Debug)]
pub struct VcpuShared {
    /// vCPU index.
    pub id: usize,
    tid: AtomicI32,
    state: AtomicU8,
    requests: AtomicU32,
    wake: AtomicU32,
    /// Counters published by the vCPU thread.
    pub counters: VcpuCounters,
    /// Accounting: the meter the thread writes, its sources, the reset baseline.
    pub acct: VcpuAccounting,
    /// Runaway and overload detections (written by the sampler).
    pub overloads: Counter,
    end: OnceLock<VcpuEnd>,
}

impl VcpuShared {
    /// A vCPU that has not started.
    pub fn new(id: usize, acct: VcpuAccounting) -> Self {
        VcpuShared {
            id,
            tid: AtomicI32::new(0),
            state: AtomicU8::new(VcpuState::Created as u8),
            requests: AtomicU32::new(0),
            wake: AtomicU32::new(0),
            counters: VcpuCounters::default(),
            acct,
            overloads: Counter::default(),
            end: OnceLock::new(),
        }
    }

    /// Host thread id of the vCPU thread (0 before it started).
    pub fn host_tid(&self) -> i32 {
        self.tid.load(Ordering::Acquire)
    }

    /// Current state.
    pub fn state(&self) -> VcpuState {
        VcpuState::from_u8(self.state.load(Ordering::Acquire))
    }

    /// How the loop ended, once it has.
    pub fn end(&self) -> Option<&VcpuEnd> {
        self.end.get()
    }

    /// Asks the vCPU to act on `bits` at its next exit and forces that exit now: wakes it if
    /// parked, signals it if in KVM_RUN.
    pub fn kick(&self, bits: u32) {
        self.acct
            .meter
            .released_at
            .store(now_ns(), Ordering::Release);
        self.requests.fetch_or(bits, Ordering::AcqRel);
        futex_wake(&self.wake);
        if self.state() == VcpuState::Finished {
            return;
        }
        let tid = self.tid.load(Ordering::Acquire);
        if tid != 0 {
            kick::signal_thread(tid);
        }
    }

    /// Releases a paused vCPU: clears the pause request and wakes it. The release time is what
    /// its wake-up latency is measured from.
    pub fn resume(&self) {
        self.acct
            .meter
            .released_at
            .store(now_ns(), Ordering::Release);
        self.requests.fetch_and(!REQ_PAUSE, Ordering::AcqRel);
        futex_wake(&self.wake);
    }

    /// The section 4 fields now (or at the thread's end), with the histograms.
    pub fn times(&self) -> (VcpuTimes, HistSnapshots) {
        self.times_with(true)
    }

    /// The section 4 fields now, with the histograms and detail maps only when `with_hist`.
    pub fn times_with(&self, with_hist: bool) -> (VcpuTimes, HistSnapshots) {
        let (mut t, h) = self.acct.times_with(with_hist);
        t.id = self.id;
        t.host_tid = self.host_tid();
        t.overloads = self.overloads.get();
        if self.state() == VcpuState::Finished {
            t.state = ppa_vmm_api::VcpuMicroState::Finished;
        }
        (t, h)
    }

    /// The overview of `stats`: the section 4 times and exit counts, without the histograms
    /// and detail maps (a few system calls and no map of KVM statistics).
    pub fn summary(&self) -> VcpuSummary {
        self.times_with(false).0.into()
    }

    /// Clears request `bits` (a limit's stop) and wakes the vCPU if it is parked on them.
    /// The release time is what its wake-up latency is measured from.
    pub fn release(&self, bits: u32) {
        self.acct
            .meter
            .released_at
            .store(now_ns(), Ordering::Release);
        self.requests.fetch_and(!bits, Ordering::AcqRel);
        futex_wake(&self.wake);
    }

    /// Whether any of request `bits` is set.
    pub fn requested(&self, bits: u32) -> bool {
        self.requests.load(Ordering::Acquire) & bits != 0
    }

    /// Whether a pause is requested.
    pub fn pause_requested(&self) -> bool {
        self.requests.load(Ordering::Acquire) & REQ_PAUSE != 0
    }

    fn set_state(&self, s: VcpuState) {
        self.state.store(s as u8, Ordering::Release);
    }
}

/// What the vCPU thread owns.
pub struct VcpuThread {
    /// The KVM vCPU.
    pub fd: VcpuFd,
    /// Shared state.
    pub shared: Arc<VcpuShared>,
    /// MMIO bus.
    pub mmio: Arc<Bus>,
    /// Port bus.
    pub pio: Arc<Bus>,
    /// Where to say "vCPU N finished".
    pub done: Sender<usize>,
    /// Opened once every vCPU thread exists, so that all start together and none runs while
    /// the others' stacks are being mapped.
    pub start_gate: Arc<AtomicU32>,
    /// The VM's accounting settings.
    pub control: Arc<AccountingControl>,
}

/// Starts the thread of a vCPU; the handle must be joined before the VM is dropped.
pub fn spawn(v: VcpuThread) -> Result<JoinHandle<()>, VcpuError> {
    let id = v.shared.id;
    std::thread::Builder::new()
        .name(format!("vcpu{id}"))
        .spawn(move || thread_main(v))
        .map_err(|e| VcpuError::Spawn(id, e))
}

fn thread_main(mut v: VcpuThread) {
    let shared = Arc::clone(&v.shared);
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::gettid() };
    shared.tid.store(tid, Ordering::Release);
    if let (Ok(clock), Ok(sched)) = (ThreadClock::current(), SchedStatFile::open(tid)) {
        let _ = shared.acct.live.set(LiveSources { clock, sched });
    }
    if crate::arch::x86_64::calibrate::warm_up(&mut v.fd).is_none() {
        log::warn!(
            "vCPU {}: warm-up run failed; its first KVM_RUN is measured",
            shared.id
        );
    }
    while v.start_gate.load(Ordering::Acquire) == 0 {
        futex_wait(&v.start_gate, 0, None);
    }
    // Precise halts: the default 50 µs timer slack would lengthen every park.
    // SAFETY: PR_SET_TIMERSLACK takes one integer argument and affects only this thread.
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong) };
    kick::set_immediate_exit_ptr(&mut v.fd.get_kvm_run().immediate_exit);
    let origin = consistent_stamp(&shared);
    let start = Stamp {
        now: origin.now,
        cpu: origin.cpu,
    };
    shared
        .acct
        .set_origin(origin.cpu.unwrap_or(0), origin.run_delay.unwrap_or(0));
    shared.acct.started_ns.store(start.now, Ordering::Release);
    shared.set_state(VcpuState::Running);
    let mut rec = Recorder::new(
        Arc::clone(&shared.acct.meter),
        Arc::clone(&v.control),
        start,
    );

    let end = run_loop(&mut v, &mut rec);
    rec.finish(stamp(rec.level(), rec.level()));

    kick::set_immediate_exit_ptr(std::ptr::null_mut());
    publish_final(&shared, tid);
    let _ = shared.end.set(end);
    shared.set_state(VcpuState::Finished);
    let _ = v.done.send(shared.id);
}

/// Converts KVM's view of an exit into ours.
fn to_event(exit: VcpuExit<'_>) -> ExitEvent<'_> {
    match exit {
        VcpuExit::IoIn(port, data) => ExitEvent::IoIn { port, data },
        VcpuExit::IoOut(port, data) => ExitEvent::IoOut { port, data },
        VcpuExit::MmioRead(addr, data) => ExitEvent::MmioRead { addr, data },
        VcpuExit::MmioWrite(addr, data) => ExitEvent::MmioWrite { addr, data },
        VcpuExit::Hlt => ExitEvent::Hlt,
        VcpuExit::Shutdown => ExitEvent::Shutdown,
        VcpuExit::Intr => ExitEvent::Intr,
        VcpuExit::FailEntry(reason, cpu) => ExitEvent::FailEntry { reason, cpu },
        VcpuExit::InternalError => ExitEvent::InternalError { suberror: 0 },
        VcpuExit::SystemEvent(kind, _) => ExitEvent::SystemEvent { kind },
        VcpuExit::Exception => ExitEvent::Other("exception"),
        VcpuExit::Debug(_) => ExitEvent::Other("debug"),
        VcpuExit::Hypercall(_) => ExitEvent::Other("hypercall"),
        VcpuExit::IrqWindowOpen => ExitEvent::Other("irq window open"),
        VcpuExit::MemoryFault { .. } => ExitEvent::Other("memory fault"),
        _ => ExitEvent::Other("unknown exit reason"),
    }
}

/// A console line buffer, fixed size: the exit path does not allocate.
struct Console {
    buf: [u8; 200],
    len: usize,
}

impl Console {
    fn push(&mut self, id: usize, b: u8) {
        if b != b'\n' {
            self.buf[self.len] = b;
            self.len += 1;
        }
        if b == b'\n' || self.len == self.buf.len() {
            self.flush(id);
        }
    }
    /// Writes the line to stderr as `[vcpuN] bytes`; the guest's bytes go out as they are
    /// (no allocation), and a closed stderr is ignored rather than stopping the vCPU.
    fn flush(&mut self, id: usize) {
        if self.len > 0 {
            use std::io::Write;
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "[vcpu{id}] ");
            let _ = err.write_all(&self.buf[..self.len]);
            let _ = err.write_all(b"\n");
            self.len = 0;
        }
    }
}

fn dump_regs(fd: &VcpuFd) -> Option<Box<RegsDump>> {
    let r = fd.get_regs().ok()?;
    let s = fd.get_sregs().ok()?;
    let h = |v: u64| format!("{v:#x}");
    Some(Box::new(RegsDump {
        rip: h(r.rip),
        rsp: h(r.rsp),
        rflags: h(r.rflags),
        rax: h(r.rax),
        rdi: h(r.rdi),
        cr0: h(s.cr0),
        cr3: h(s.cr3),
        cr4: h(s.cr4),
        efer: h(s.efer),
        cs: h(u64::from(s.cs.selector)),
        ss: h(u64::from(s.ss.selector)),
    }))
}

/// Reads its own clocks, schedstat, /proc ticks and KVM statistics as the loop ends, for the
/// final report (its /proc entries vanish when the thread exits).
fn publish_final(shared: &VcpuShared, tid: i32) {
    let end = consistent_stamp(shared);
    let finals = FinalReadings {
        at_ns: end.now,
        cpu_ns: end.cpu.unwrap_or(0),
        run_delay_ns: end.run_delay.unwrap_or(0),
        ticks: thread_ticks(tid).ok(),
        kvm: shared.acct.read_kvm(),
    };
    let _ = shared.acct.finals.set(finals);
}

/// Wall clock, thread CPU time and run_delay read as of one instant: run_delay is read before
/// and after the clocks, and the reads are retried if a run-queue wait completed in between
/// (it would otherwise fall inside the wall interval but outside the run_delay delta, or the
/// other way round). Bounded: after 4 tries the last reading stands.
fn consistent_stamp(shared: &VcpuShared) -> ParkStamp {
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
/// both limit bits are cleared or a stop or pause arrives; an idle park at a stop or pause
/// (a limit that stops an idle vCPU takes effect when the idle park ends).
fn park(shared: &VcpuShared, rec: &mut Recorder, kind: MicroState, deadline_ns: Option<u64>) {
    shared.set_state(VcpuState::Parked);
    rec.park_begin(kind, consistent_stamp(shared));
    let release = loop {
        let seen = shared.wake.load(Ordering::Acquire);
        let requests = shared.requests.load(Ordering::Acquire);
        let released = match kind {
            MicroState::Paused => requests & REQ_PAUSE == 0 || requests & REQ_STOP != 0,
            MicroState::Limited => {
                requests & REQ_LIMIT == 0 || requests & (REQ_STOP | REQ_PAUSE) != 0
            }
            _ => requests & (REQ_STOP | REQ_PAUSE) != 0,
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
    rec.park_end(consistent_stamp(shared), release);
    shared.set_state(VcpuState::Running);
}

/// Clock readings for a KVM_RUN boundary between an interval at `prev` and one at `next`.
#[inline]
fn stamp(prev: Level, next: Level) -> Stamp {
    let timed = prev != Level::Off || next != Level::Off;
    let full = prev == Level::Full || next == Level::Full;
    Stamp {
        now: if timed { now_ns() } else { 0 },
        cpu: if full { Some(thread_cpu_ns()) } else { None },
    }
}

fn run_loop(v: &mut VcpuThread, rec: &mut Recorder) -> VcpuEnd {
    let shared = Arc::clone(&v.shared);
    let c = &shared.counters;
    let id = shared.id;
    let mut console = Console {
        buf: [0; 200],
        len: 0,
    };
    let end = loop {
        let requests = shared.requests.load(Ordering::Acquire);
        if requests & REQ_STOP != 0 {
            break VcpuEnd::Stopped;
        }
        if requests & REQ_PAUSE != 0 {
            park(&shared, rec, MicroState::Paused, None);
            continue;
        }
        if requests & REQ_LIMIT != 0 {
            park(&shared, rec, MicroState::Limited, None);
            continue;
        }
        let next = rec.next_level();
        let host_cpu = if next == Level::Off {
            0
        } else {
            current_cpu() as usize
        };
        rec.on_entry(stamp(rec.level(), next), host_cpu, next);
        let result = v.fd.run();
        let exit_stamp = stamp(rec.level(), rec.level());
        let event = match result {
            Ok(VcpuExit::InternalError) => {
                // SAFETY: KVM_EXIT_INTERNAL_ERROR means the kernel filled the `internal` member
                // of the kvm_run union; its u32 suberror is valid for any bit pattern.
                let suberror = unsafe { v.fd.get_kvm_run().__bindgen_anon_1.internal.suberror };
                ExitEvent::InternalError { suberror }
            }
            Ok(exit) => to_event(exit),
            Err(e) if e.errno() == libc::EINTR => ExitEvent::Intr,
            Err(e) if e.errno() == libc::EAGAIN => ExitEvent::Intr,
            Err(e) => break VcpuEnd::Error(VcpuError::Run(e).to_string() + &format!(": {e}")),
        };
        let (reason, outcome) = handle_exit(event, &v.mmio, &v.pio, id);
        rec.on_exit(exit_stamp, reason);
        match outcome {
            Outcome::Resume => {
                if reason == ExitReason::Intr {
                    v.fd.set_kvm_immediate_exit(0);
                }
            }
            Outcome::ParkUntilKicked => park(&shared, rec, MicroState::Idle, None),
            Outcome::Fail(failure) => {
                break VcpuEnd::Failed {
                    failure,
                    regs: dump_regs(&v.fd),
                }
            }
            Outcome::Device(action) => {
                let bell = match action {
                    DeviceAction::None => None,
                    DeviceAction::Console(b) => {
                        console.push(id, b);
                        Some(Doorbell::Console)
                    }
                    DeviceAction::Exit(code) => {
                        c.doorbells[Doorbell::Exit as usize].add(1);
                        break VcpuEnd::Exited(code);
                    }
                    DeviceAction::Halt(ns) => {
                        c.doorbells[Doorbell::Halt as usize].add(1);
                        let deadline = now_ns().saturating_add(ns);
                        park(&shared, rec, MicroState::Idle, Some(deadline));
                        None
                    }
                    DeviceAction::Report { key, value } => {
                        c.reported[key as usize].set(value);
                        c.reported_mask.fetch_or(1 << key, Ordering::Release);
                        Some(Doorbell::Report)
                    }
                    DeviceAction::Workload if reason == ExitReason::IoOut => {
                        Some(Doorbell::WorkloadPio)
                    }
                    DeviceAction::Workload if reason == ExitReason::IoIn => {
                        Some(Doorbell::WorkloadPio)
                    }
                    DeviceAction::Workload => Some(Doorbell::WorkloadMmio),
                    DeviceAction::Unhandled => Some(Doorbell::Unhandled),
                };
                if let Some(b) = bell {
                    c.doorbells[b as usize].add(1);
                }
            }
        }
    };
    console.flush(id);
    end
}
