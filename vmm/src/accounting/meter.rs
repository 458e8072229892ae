//! The per-vCPU meter: what the vCPU thread measures at its KVM_RUN boundaries and parks.
//!
//! [`VcpuMeter`] is shared; its counters have exactly one writer, the vCPU thread's
//! [`Recorder`]. The writer updates a group of counters between two increments of a sequence
//! counter (odd while writing); [`VcpuMeter::read`] retries until it sees the same even value
//! before and after, so a reader gets a consistent group and never blocks the writer (no lock,
//! no locked instruction, no allocation, no syscall on the exit path at level basic).
//!
//! The vCPU thread is always in one micro-state: `guest` (inside KVM_RUN), `vmm` (handling an
//! exit), or parked (`idle`, `limited`, `paused`). Each transition adds the wall time since the
//! previous one to that state's total. Parks also read the thread CPU clock and schedstat at
//! both ends (a park is a syscall anyway), so the time the thread was really blocked is
//! `wall − on-CPU − run-queue wait`: what the identity of spec section 4 needs.
//!
//! This file holds the shared counters and their readers; the writer is `meter/recorder.rs`
//! (its context-switch records `meter/records.rs`), readers' back-off `meter/backoff.rs`.

use std::sync::atomic::{fence, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, OnceLock};

use ppa_vmm_api::VcpuMicroState;

use super::episodes::EpisodeLog;
use super::histogram::Histogram;
use super::switches::pairing::IRQ_KINDS;
use super::switches::{Pairing, RingView};
use super::{ByKey, Key, Level, PerThreshold, Threshold};
use crate::accounting::ExitReason;
use crate::sync::Counter;

/// Micro-states of a vCPU thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MicroState {
    /// Inside KVM_RUN.
    Guest = 0,
    /// Outside KVM_RUN, handling an exit or doing bookkeeping.
    Vmm = 1,
    /// Parked because the guest asked to idle.
    Idle = 2,
    /// Parked because a CPU limit was exhausted.
    Limited = 3,
    /// Parked because an operator paused the VM.
    Paused = 4,
}

impl MicroState {
    /// Number of states.
    pub const COUNT: usize = 5;

    fn from_u8(v: u8) -> MicroState {
        match v {
            0 => MicroState::Guest,
            2 => MicroState::Idle,
            3 => MicroState::Limited,
            4 => MicroState::Paused,
            _ => MicroState::Vmm,
        }
    }

    /// The kind of park this state is (`None`: not parked).
    pub fn park_kind(self) -> Option<ParkKind> {
        match self {
            MicroState::Guest | MicroState::Vmm => None,
            MicroState::Idle => Some(ParkKind::Idle),
            MicroState::Limited => Some(ParkKind::Limited),
            MicroState::Paused => Some(ParkKind::Paused),
        }
    }
}

impl Key for MicroState {
    fn index(self) -> usize {
        self as usize
    }
}

/// Why a vCPU thread is parked: what a park is given, and the key of per-park-kind counters.
/// Each is one of the parked micro-states ([`MicroState::from`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParkKind {
    /// The guest asked to idle.
    Idle = 0,
    /// A CPU limit was exhausted.
    Limited = 1,
    /// An operator paused the VM.
    Paused = 2,
}

impl ParkKind {
    /// Number of kinds.
    pub const COUNT: usize = 3;
}

impl From<ParkKind> for MicroState {
    fn from(k: ParkKind) -> MicroState {
        match k {
            ParkKind::Idle => MicroState::Idle,
            ParkKind::Limited => MicroState::Limited,
            ParkKind::Paused => MicroState::Paused,
        }
    }
}

impl Key for ParkKind {
    fn index(self) -> usize {
        self as usize
    }
}

/// One value per micro-state.
pub type PerState<T> = ByKey<MicroState, T, { MicroState::COUNT }>;
/// One value per park kind.
pub type PerPark<T> = ByKey<ParkKind, T, { ParkKind::COUNT }>;
/// One value per accounting level.
pub type PerLevel<T> = ByKey<Level, T, 3>;

impl From<MicroState> for VcpuMicroState {
    fn from(s: MicroState) -> VcpuMicroState {
        match s {
            MicroState::Guest => VcpuMicroState::Guest,
            MicroState::Vmm => VcpuMicroState::Vmm,
            MicroState::Idle => VcpuMicroState::Idle,
            MicroState::Limited => VcpuMicroState::Limited,
            MicroState::Paused => VcpuMicroState::Paused,
        }
    }
}

/// The histograms of one vCPU.
#[derive(Debug)]
pub struct Histograms {
    /// Userspace handling time of each exit, by reason.
    pub exit_handling: [Histogram; ExitReason::COUNT],
    /// Userspace handling time of every exit.
    pub exit_handling_all: Histogram,
    /// Duration of each KVM_RUN.
    pub guest_run: Histogram,
    /// From the release of a park to the next KVM_RUN.
    pub wakeup_latency: Histogram,
}

impl Histograms {
    fn new(frac_bits: u8) -> Histograms {
        let h = || Histogram::new(frac_bits).expect("frac_bits checked by the config");
        Histograms {
            exit_handling: std::array::from_fn(|_| h()),
            exit_handling_all: h(),
            guest_run: h(),
            wakeup_latency: h(),
        }
    }
}

/// Where a vCPU thread's tracepoints stand (kept in a [`Counter`] as its number).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TraceState {
    /// Not opened: the thread has not run at level full.
    #[default]
    NotOpened = 0,
    /// They cannot be had here (the reason is in the meter's `*_trace_why`).
    Unavailable = 1,
    /// Opened, not yet seen to fire (KVM's: no KVM_RUN that ran the guest yet).
    Unknown = 2,
    /// Opened and firing.
    Firing = 3,
    /// Opened, but this host's KVM does not fire them (a KVM_RUN ran guest code without a
    /// `kvm_entry` record); closed since.
    Silent = 4,
}

impl TraceState {
    /// The state of number `v`.
    pub fn from_u64(v: u64) -> TraceState {
        match v {
            1 => TraceState::Unavailable,
            2 => TraceState::Unknown,
            3 => TraceState::Firing,
            4 => TraceState::Silent,
            _ => TraceState::NotOpened,
        }
    }
}

/// Reasons kept apart in [`KvmExits`]: the first `KVM_SLOTS - 1` reasons a vCPU's guest
/// causes get a slot each, later ones share the last.
pub const KVM_SLOTS: usize = 24;

/// The code of [`KvmExits`]' last slot, which holds the reasons that found no slot of their own.
pub const KVM_OTHER: u64 = u64::MAX;

/// A vCPU's in-kernel exits by hardware reason, slot by slot; the vCPU thread is the one
/// writer (counts inside the meter's write sections, histograms as the others).
#[derive(Debug)]
pub struct KvmExits {
    /// Each slot's reason: `1 << 40 | isa << 32 | code`, [`KVM_OTHER`], or 0 while unused.
    pub code: [Counter; KVM_SLOTS],
    /// In-kernel exits.
    pub count: [Counter; KVM_SLOTS],
    /// Their handling time on a CPU, interrupts excluded.
    pub ns: [Counter; KVM_SLOTS],
    /// One histogram of that handling time per slot.
    pub hist: Box<[Histogram]>,
}

impl KvmExits {
    /// Empty slots, histograms of `frac_bits`.
    pub fn new(frac_bits: u8) -> KvmExits {
        KvmExits {
            code: Default::default(),
            count: Default::default(),
            ns: Default::default(),
            hist: (0..KVM_SLOTS)
                .map(|_| Histogram::new(frac_bits).expect("frac_bits checked by the config"))
                .collect(),
        }
    }
}

/// The counters of one vCPU, written by its thread only.
#[derive(Debug)]
pub struct VcpuMeter {
    seq: AtomicU64,
    state: AtomicU8,
    since: AtomicU64,
    /// Wall time in each micro-state (while timed: level basic or full).
    pub wall: PerState<Counter>,
    /// On-CPU time inside KVM_RUN, measured at level full.
    pub cpu_guest_full: Counter,
    /// On-CPU time handling exits, measured at level full.
    pub cpu_vmm_full: Counter,
    /// Wall time handling exits at level basic (the estimate of VMM CPU time there).
    pub vmm_wall_basic: Counter,
    /// On-CPU time during parks (entering and leaving the wait).
    pub park_cpu: Counter,
    /// Run-queue wait during parks (the wake-up part; also in steal).
    pub park_delay: Counter,
    /// Time blocked inside KVM_RUN before the guest started this vCPU (an application
    /// processor waiting for its INIT and start-up IPI), which the hypervisor's halt
    /// statistics do not count.
    pub start_wait: Counter,
    /// Time really blocked in parks, by kind (idle, limited, paused).
    pub blocked: PerPark<Counter>,
    /// Number of parks.
    pub parks: Counter,
    /// KVM_RUN intervals at level full split with context-switch records (the rest of the
    /// full ones read the thread CPU clock).
    pub records_runs: Counter,
    /// Boundaries at which the records may have been incomplete (see `switches`).
    pub records_lost: Counter,
    /// Preempted (runnable) off-CPU time the records showed outside parks, ns.
    pub records_preempted: Counter,
    /// Off-CPU episodes the records showed outside parks.
    pub records_episodes: Counter,
    /// The records' consumer position, its open switch-out (time, 0: none) and whether that
    /// was a preemption, as of the last drain: what readers peek from.
    pub ring_tail: Counter,
    /// See [`VcpuMeter::ring_tail`].
    pub ring_out: Counter,
    /// See [`VcpuMeter::ring_tail`].
    pub ring_out_preempted: Counter,
    /// Off-CPU time of the `vmm` interval in progress that the exit's drain already took from
    /// the records (episodes that began after the exit stamp), for readers' looks.
    pub vmm_off_drained: Counter,
    /// 1 while the records are on (level full with a ring), else 0.
    pub records_on: Counter,
    /// Times the records were turned on (what the ring held before each is dropped): a
    /// reader that finds it changed knows its episodes have a gap.
    pub records_switches: Counter,
    /// When the records were last turned on (CLOCK_MONOTONIC): the episodes are complete
    /// from then.
    pub records_on_since: Counter,
    /// The vCPU's episodes and parks, placed in time (the reader is the pressure tracker).
    pub episodes: EpisodeLog,
    /// The thread's context-switch ring, once level full first opened it (for readers' looks
    /// at the interval in progress).
    pub ring: OnceLock<Arc<RingView>>,
    /// On-CPU time inside KVM_RUN neither in guest mode nor in an interrupt, of the runs split
    /// with KVM's tracepoints (see `kvm_runs`): KVM's own time.
    pub kvm_full: Counter,
    /// KVM_RUN intervals split with KVM's tracepoints.
    pub kvm_runs: Counter,
    /// VM exits that ended their KVM_RUN (reached userspace), as KVM's tracepoints saw them.
    pub kvm_to_user: Counter,
    /// Host interrupt time inside KVM_RUN, from the interrupt tracepoints (level full).
    pub irq_run: Counter,
    /// Host interrupt time in `vmm` intervals (level full).
    pub irq_vmm: Counter,
    /// Interrupts by kind (`IRQ_KIND_NAMES`), at level full outside parks.
    pub interrupts: [Counter; IRQ_KINDS],
    /// The state of KVM's tracepoints on this thread ([`TraceState`]).
    pub kvm_trace: Counter,
    /// The state of the interrupt tracepoints on this thread ([`TraceState`]).
    pub irq_trace: Counter,
    /// Why KVM's tracepoints split nothing, once that is known for good (one sentence).
    pub kvm_trace_why: OnceLock<String>,
    /// Why the interrupt tracepoints measure nothing, once known for good.
    pub irq_trace_why: OnceLock<String>,
    /// In-kernel exits by reason, allocated when KVM's tracepoints are opened.
    pub kvm_exits: OnceLock<Box<KvmExits>>,
    /// Userspace exits by reason, exact at every level.
    pub exits: [Counter; ExitReason::COUNT],
    /// Userspace handling wall time by reason.
    pub exit_ns: [Counter; ExitReason::COUNT],
    /// Exits recorded at each level (off, basic, full).
    pub exits_at_level: PerLevel<Counter>,
    /// Occurrences above each threshold. The vCPU thread counts exit_handling, guest_run and
    /// wakeup_latency; the sampler thread is the one writer of steal_window (a count of
    /// sampler windows), outside the sequence counter's groups.
    pub exceeded: PerThreshold<Counter>,
    /// KVM_RUN wall time by host CPU (the CPU at entry).
    pub guest_wall_by_cpu: Box<[Counter]>,
    /// KVM_RUN entries by host CPU.
    pub entries_by_cpu: Box<[Counter]>,
    /// Host CPU changes seen between two KVM_RUN entries.
    pub migrations: Counter,
    /// Histograms.
    pub hist: Histograms,
    /// When the last kick released this vCPU (written by kickers, not by the vCPU thread).
    pub released_at: AtomicU64,
    /// Bumped by every reset (by readers): the recorder drops histogram records it still holds
    /// from before the reset.
    pub reset_epoch: AtomicU64,
}

/// A consistent copy of a [`VcpuMeter`]'s counter group.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MeterReading {
    /// Micro-state at the time of the read.
    pub state: u8,
    /// When that state began (0: not timed).
    pub since: u64,
    /// See [`VcpuMeter::wall`].
    pub wall: PerState<u64>,
    /// See [`VcpuMeter::cpu_guest_full`].
    pub cpu_guest_full: u64,
    /// See [`VcpuMeter::cpu_vmm_full`].
    pub cpu_vmm_full: u64,
    /// See [`VcpuMeter::vmm_wall_basic`].
    pub vmm_wall_basic: u64,
    /// See [`VcpuMeter::park_cpu`].
    pub park_cpu: u64,
    /// See [`VcpuMeter::park_delay`].
    pub park_delay: u64,
    /// See [`VcpuMeter::start_wait`].
    pub start_wait: u64,
    /// See [`VcpuMeter::blocked`].
    pub blocked: PerPark<u64>,
    /// See [`VcpuMeter::parks`].
    pub parks: u64,
    /// See [`VcpuMeter::records_runs`].
    pub records_runs: u64,
    /// See [`VcpuMeter::records_lost`].
    pub records_lost: u64,
    /// See [`VcpuMeter::records_preempted`].
    pub records_preempted: u64,
    /// See [`VcpuMeter::records_episodes`].
    pub records_episodes: u64,
    /// See [`VcpuMeter::ring_tail`].
    pub ring_tail: u64,
    /// The consumer's pairing state as of `ring_tail`.
    pub ring_pairing: Pairing,
    /// See [`VcpuMeter::vmm_off_drained`].
    pub vmm_off_drained: u64,
    /// See [`VcpuMeter::records_on`].
    pub records_on: bool,
    /// See [`VcpuMeter::kvm_full`].
    pub kvm_full: u64,
    /// See [`VcpuMeter::kvm_runs`].
    pub kvm_runs: u64,
    /// See [`VcpuMeter::kvm_to_user`].
    pub kvm_to_user: u64,
    /// See [`VcpuMeter::irq_run`].
    pub irq_run: u64,
    /// See [`VcpuMeter::irq_vmm`].
    pub irq_vmm: u64,
    /// See [`VcpuMeter::interrupts`].
    pub interrupts: [u64; IRQ_KINDS],
    /// See [`VcpuMeter::kvm_trace`].
    pub kvm_trace: TraceState,
    /// See [`VcpuMeter::irq_trace`].
    pub irq_trace: TraceState,
    /// The used slots of [`VcpuMeter::kvm_exits`]: (code, count, ns).
    pub kvm_exits: Vec<(u64, u64, u64)>,
    /// See [`VcpuMeter::exits`].
    pub exits: [u64; ExitReason::COUNT],
    /// See [`VcpuMeter::exit_ns`].
    pub exit_ns: [u64; ExitReason::COUNT],
    /// See [`VcpuMeter::exits_at_level`].
    pub exits_at_level: PerLevel<u64>,
    /// See [`VcpuMeter::exceeded`].
    pub exceeded: PerThreshold<u64>,
    /// See [`VcpuMeter::guest_wall_by_cpu`].
    pub guest_wall_by_cpu: Vec<u64>,
    /// See [`VcpuMeter::entries_by_cpu`].
    pub entries_by_cpu: Vec<u64>,
    /// See [`VcpuMeter::migrations`].
    pub migrations: u64,
    /// False if the writer kept the group busy through every retry (the copy may be torn).
    pub consistent: bool,
}

/// What [`VcpuMeter::position`] gives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MeterPosition {
    /// Micro-state at the read.
    pub state: MicroState,
    /// When it began (0: not timed).
    pub since: u64,
    /// See [`VcpuMeter::ring_tail`].
    pub ring_tail: u64,
    /// The consumer's pairing state as of `ring_tail`.
    pub ring_pairing: Pairing,
    /// See [`VcpuMeter::records_on`].
    pub records_on: bool,
    /// See [`VcpuMeter::records_lost`].
    pub records_lost: u64,
    /// See [`VcpuMeter::records_switches`].
    pub records_switches: u64,
    /// See [`VcpuMeter::records_on_since`].
    pub records_on_since: u64,
}

impl MeterReading {
    /// The micro-state at the time of the read.
    pub fn micro_state(&self) -> MicroState {
        MicroState::from_u8(self.state)
    }
}

fn counters<const N: usize>(c: &[Counter; N]) -> [u64; N] {
    std::array::from_fn(|i| c[i].get())
}

/// Host CPUs the per-CPU arrays cover.
pub fn host_cpu_slots() -> usize {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_CONF) };
    usize::try_from(n).unwrap_or(1).clamp(1, 4096)
}

impl VcpuMeter {
    /// A meter with histograms of `frac_bits` and per-CPU arrays for `host_cpus` CPUs.
    pub fn new(frac_bits: u8, host_cpus: usize) -> VcpuMeter {
        let per_cpu = || (0..host_cpus.max(1)).map(|_| Counter::default()).collect();
        VcpuMeter {
            seq: AtomicU64::new(0),
            state: AtomicU8::new(MicroState::Vmm as u8),
            since: AtomicU64::new(0),
            wall: Default::default(),
            cpu_guest_full: Counter::default(),
            cpu_vmm_full: Counter::default(),
            vmm_wall_basic: Counter::default(),
            park_cpu: Counter::default(),
            park_delay: Counter::default(),
            start_wait: Counter::default(),
            blocked: Default::default(),
            parks: Counter::default(),
            records_runs: Counter::default(),
            records_lost: Counter::default(),
            records_preempted: Counter::default(),
            records_episodes: Counter::default(),
            ring_tail: Counter::default(),
            ring_out: Counter::default(),
            ring_out_preempted: Counter::default(),
            vmm_off_drained: Counter::default(),
            records_on: Counter::default(),
            records_switches: Counter::default(),
            records_on_since: Counter::default(),
            episodes: EpisodeLog::default(),
            ring: OnceLock::new(),
            kvm_full: Counter::default(),
            kvm_runs: Counter::default(),
            kvm_to_user: Counter::default(),
            irq_run: Counter::default(),
            irq_vmm: Counter::default(),
            interrupts: Default::default(),
            kvm_trace: Counter::default(),
            irq_trace: Counter::default(),
            kvm_trace_why: OnceLock::new(),
            irq_trace_why: OnceLock::new(),
            kvm_exits: OnceLock::new(),
            exits: Default::default(),
            exit_ns: Default::default(),
            exits_at_level: Default::default(),
            exceeded: Default::default(),
            guest_wall_by_cpu: per_cpu(),
            entries_by_cpu: per_cpu(),
            migrations: Counter::default(),
            hist: Histograms::new(frac_bits),
            released_at: AtomicU64::new(0),
            reset_epoch: AtomicU64::new(0),
        }
    }

    #[inline]
    fn begin(&self) {
        let s = self.seq.load(Ordering::Relaxed);
        self.seq.store(s.wrapping_add(1), Ordering::Relaxed);
        fence(Ordering::Release);
    }

    #[inline]
    fn end(&self) {
        let s = self.seq.load(Ordering::Relaxed);
        self.seq.store(s.wrapping_add(1), Ordering::Release);
    }

    #[inline]
    fn set_state(&self, state: MicroState, since: u64) {
        self.state.store(state as u8, Ordering::Relaxed);
        self.since.store(since, Ordering::Relaxed);
    }

    /// A consistent copy of the counter group (bounded retries; see
    /// [`MeterReading::consistent`]).
    pub fn read(&self) -> MeterReading {
        // A write section is a few stores, but its writer can be preempted inside one, and
        // then it is back only when the scheduler picks it (at 32 vCPU threads a CPU, up to
        // ~130 ms here). Spin briefly, yield a few times, then sleep with a doubling back-off
        // (see `backoff_us`), for about 2 s in all before giving up.
        let mut r = MeterReading::default();
        let mut slept_us = 0u64;
        for attempt in 0u32.. {
            let s1 = self.seq.load(Ordering::Acquire);
            if s1 % 2 == 0 {
                r = self.read_unchecked();
                fence(Ordering::Acquire);
                if self.seq.load(Ordering::Relaxed) == s1 {
                    r.consistent = true;
                    return r;
                }
            }
            match backoff_us(attempt) {
                None => std::hint::spin_loop(),
                Some(0) => std::thread::yield_now(),
                Some(_) if slept_us >= READ_GIVE_UP_US => break,
                Some(us) => {
                    std::thread::sleep(std::time::Duration::from_micros(us));
                    slept_us += us;
                }
            }
        }
        r
    }

    /// Where the thread is, for a reader placing its episodes in time: its micro-state and
    /// since when, the records' consumer position and open switch-out, and whether the
    /// records are on. A few tries without sleeping (a writer preempted inside its write
    /// section makes it `None`: the caller treats the vCPU as not known this time).
    pub fn position(&self) -> Option<MeterPosition> {
        for attempt in 0..64u32 {
            let s1 = self.seq.load(Ordering::Acquire);
            if s1 % 2 == 0 {
                let p = MeterPosition {
                    state: MicroState::from_u8(self.state.load(Ordering::Relaxed)),
                    since: self.since.load(Ordering::Relaxed),
                    ring_tail: self.ring_tail.get(),
                    ring_pairing: Pairing::with_pending(match self.ring_out.get() {
                        0 => None,
                        t => Some((t, self.ring_out_preempted.get() != 0)),
                    }),
                    records_on: self.records_on.get() != 0,
                    records_lost: self.records_lost.get(),
                    records_switches: self.records_switches.get(),
                    records_on_since: self.records_on_since.get(),
                };
                fence(Ordering::Acquire);
                if self.seq.load(Ordering::Relaxed) == s1 {
                    return Some(p);
                }
            }
            if attempt < 48 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        None
    }

    /// Start of the micro-state in progress (CLOCK_MONOTONIC; 0 before the first): one load,
    /// no consistent reading.
    pub fn since_ns(&self) -> u64 {
        self.since.load(Ordering::Acquire)
    }

    fn read_unchecked(&self) -> MeterReading {
        MeterReading {
            state: self.state.load(Ordering::Relaxed),
            since: self.since.load(Ordering::Relaxed),
            wall: self.wall.map(Counter::get),
            cpu_guest_full: self.cpu_guest_full.get(),
            cpu_vmm_full: self.cpu_vmm_full.get(),
            vmm_wall_basic: self.vmm_wall_basic.get(),
            park_cpu: self.park_cpu.get(),
            park_delay: self.park_delay.get(),
            start_wait: self.start_wait.get(),
            blocked: self.blocked.map(Counter::get),
            parks: self.parks.get(),
            records_runs: self.records_runs.get(),
            records_lost: self.records_lost.get(),
            records_preempted: self.records_preempted.get(),
            records_episodes: self.records_episodes.get(),
            ring_tail: self.ring_tail.get(),
            ring_pairing: Pairing::with_pending(match self.ring_out.get() {
                0 => None,
                t => Some((t, self.ring_out_preempted.get() != 0)),
            }),
            vmm_off_drained: self.vmm_off_drained.get(),
            records_on: self.records_on.get() != 0,
            kvm_full: self.kvm_full.get(),
            kvm_runs: self.kvm_runs.get(),
            kvm_to_user: self.kvm_to_user.get(),
            irq_run: self.irq_run.get(),
            irq_vmm: self.irq_vmm.get(),
            interrupts: counters(&self.interrupts),
            kvm_trace: TraceState::from_u64(self.kvm_trace.get()),
            irq_trace: TraceState::from_u64(self.irq_trace.get()),
            kvm_exits: self.kvm_exits.get().map_or_else(Vec::new, |k| {
                (0..KVM_SLOTS)
                    .filter(|&i| k.code[i].get() != 0)
                    .map(|i| (k.code[i].get(), k.count[i].get(), k.ns[i].get()))
                    .collect()
            }),
            exits: counters(&self.exits),
            exit_ns: counters(&self.exit_ns),
            exits_at_level: self.exits_at_level.map(Counter::get),
            exceeded: self.exceeded.map(Counter::get),
            guest_wall_by_cpu: self.guest_wall_by_cpu.iter().map(Counter::get).collect(),
            entries_by_cpu: self.entries_by_cpu.iter().map(Counter::get).collect(),
            migrations: self.migrations.get(),
            consistent: false,
        }
    }
}

mod kvm;
mod recorder;
pub use kvm::{decode as decode_kvm_slot, encode as encode_kvm_slot};
pub use recorder::{ParkStamp, Recorder, Stamp};
mod backoff;
mod records;
use backoff::{backoff_us, READ_GIVE_UP_US};

#[cfg(test)]
#[path = "meter_tests.rs"]
mod tests;
