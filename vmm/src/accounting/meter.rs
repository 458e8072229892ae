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

use std::sync::atomic::{fence, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, OnceLock};

use ppa_vmm_api::VcpuMicroState;

use super::histogram::Histogram;
use super::switches::{Pairing, RingView, SwitchRing};
use super::{AccountingControl, ByKey, Key, Level, PerThreshold, Threshold};
use crate::exit::ExitReason;

/// A single-writer counter: one thread adds, anyone reads.
#[derive(Debug, Default)]
pub struct Counter(AtomicU64);

impl Counter {
    /// Adds `n` (writer only: a plain load and store, no locked instruction).
    #[inline]
    pub fn add(&self, n: u64) {
        self.0.store(
            self.0.load(Ordering::Relaxed).wrapping_add(n),
            Ordering::Relaxed,
        );
    }
    /// Sets the value (writer only).
    #[inline]
    pub fn set(&self, v: u64) {
        self.0.store(v, Ordering::Relaxed);
    }
    /// Reads the value.
    #[inline]
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

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

/// Why a vCPU thread is parked: the parked micro-states, as the key of per-park-kind counters.
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
    /// The thread's context-switch ring, once level full first opened it (for readers' looks
    /// at the interval in progress).
    pub ring: OnceLock<Arc<RingView>>,
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
            ring: OnceLock::new(),
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

/// Clock readings taken at one boundary, as the level requires.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stamp {
    /// CLOCK_MONOTONIC ns (0 when not read).
    pub now: u64,
    /// Thread CPU ns, when read.
    pub cpu: Option<u64>,
}

/// Readings at a park boundary: wall, thread CPU time and schedstat run_delay.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ParkStamp {
    /// CLOCK_MONOTONIC ns.
    pub now: u64,
    /// Thread CPU ns, when read.
    pub cpu: Option<u64>,
    /// schedstat run_delay ns, when read.
    pub run_delay: Option<u64>,
}

/// Histogram records waiting in the recorder: kept on the vCPU thread's own stack and applied
/// in batches, so an exit touches the histograms' pages once per batch instead of three times
/// per exit (each KVM_RUN round trip costs TLB entries on PVM hosts).
const PENDING: usize = 64;

/// Which histogram a pending record goes to.
#[derive(Debug, Clone, Copy)]
enum HistId {
    GuestRun,
    Exit(u8),
    Wakeup,
}

/// The vCPU thread's side of the meter: local state plus the shared counters.
#[derive(Debug)]
pub struct Recorder {
    pending: [(HistId, u64); PENDING],
    pending_len: usize,
    meter: Arc<VcpuMeter>,
    control: Arc<AccountingControl>,
    /// Level in force for the current interval.
    level: Level,
    since: u64,
    cpu_since: Option<u64>,
    /// Host CPU of the last timed entry.
    host_cpu: Option<usize>,
    /// KVM_RUN entries and wall time on `host_cpu` not yet added to the per-CPU arrays (applied
    /// when the CPU changes and with the histogram batches: two fewer pages per exit).
    cpu_entries: u64,
    cpu_wall: u64,
    /// The reset epoch the pending histogram records belong to.
    epoch: u64,
    /// The exit being handled (None before the first exit).
    exit_reason: Option<usize>,
    exit_vmm_ns: u64,
    park: Option<(MicroState, ParkStamp)>,
    wakeup_from: Option<u64>,
    /// The thread's context-switch records, when perf gives them (level full uses them
    /// instead of the thread CPU clock).
    ring: Option<SwitchRing>,
    /// Whether to try records at all, and whether opening them was tried.
    records_wanted: bool,
    records_tried: bool,
    /// Off-CPU time inside the KVM_RUN in progress found by the drain at its entry.
    run_off: u64,
    /// Off-CPU time of the `vmm` interval in progress found by the drain at the exit that began
    /// it (a preemption between the exit stamp and that drain).
    vmm_off: u64,
    /// The ring position last published to the meter.
    published_tail: u64,
}

impl Recorder {
    /// A recorder for `meter`, starting in state `vmm` at `start`.
    pub fn new(meter: Arc<VcpuMeter>, control: Arc<AccountingControl>, start: Stamp) -> Self {
        let level = control.level();
        meter.set_state(MicroState::Vmm, start.now);
        Recorder {
            pending: [(HistId::GuestRun, 0); PENDING],
            pending_len: 0,
            meter,
            control,
            level,
            since: start.now,
            cpu_since: start.cpu,
            host_cpu: None,
            cpu_entries: 0,
            cpu_wall: 0,
            epoch: 0,
            exit_reason: None,
            exit_vmm_ns: 0,
            park: None,
            wakeup_from: None,
            ring: None,
            records_wanted: false,
            records_tried: false,
            run_off: 0,
            vmm_off: 0,
            published_tail: 0,
        }
    }

    /// The shared meter.
    pub fn meter(&self) -> &VcpuMeter {
        &self.meter
    }

    #[inline]
    fn hist(&mut self, id: HistId, v: u64) {
        self.pending[self.pending_len] = (id, v);
        self.pending_len += 1;
        if self.pending_len == PENDING {
            self.flush();
        }
    }

    /// Adds the pending per-CPU entries and wall time to the shared arrays.
    fn flush_cpu(&mut self) {
        if let Some(c) = self.host_cpu {
            let m = &*self.meter;
            m.entries_by_cpu[c].add(self.cpu_entries);
            m.guest_wall_by_cpu[c].add(self.cpu_wall);
        }
        self.cpu_entries = 0;
        self.cpu_wall = 0;
    }

    /// Applies the pending histogram records and per-CPU figures (at most [`PENDING`] − 1
    /// records wait between flushes; the vCPU loop flushes before every park and at its end).
    pub fn flush(&mut self) {
        self.flush_cpu();
        let h = &self.meter.hist;
        for &(id, v) in &self.pending[..self.pending_len] {
            match id {
                HistId::GuestRun => h.guest_run.record(v),
                HistId::Wakeup => h.wakeup_latency.record(v),
                HistId::Exit(r) => {
                    h.exit_handling[usize::from(r)].record(v);
                    h.exit_handling_all.record(v);
                }
            }
        }
        self.pending_len = 0;
    }

    /// The level the next KVM_RUN entry will use (read from the VM's control).
    #[inline]
    pub fn next_level(&self) -> Level {
        self.control.level()
    }

    /// Level of the interval in progress.
    #[inline]
    pub fn level(&self) -> Level {
        self.level
    }

    /// Closes a `vmm` interval ending at `s`: its wall and CPU go to the VMM totals and to the
    /// current exit. Called inside a write section. At level full its on-CPU part is the wall
    /// time less the off-CPU episodes the records show (those the exit's drain found after
    /// its stamp, and those that began before `s`), or the thread CPU clock's delta.
    #[inline]
    fn close_vmm(&mut self, s: Stamp) {
        let h = s.now.saturating_sub(self.since);
        self.exit_vmm_ns += h;
        let records = if self.level == Level::Full {
            self.drain([s.now, u64::MAX])
        } else {
            None
        };
        if let Some(t) = &records {
            self.note_records(t, 0..2);
            self.run_off += t.off[1];
        }
        let carried = std::mem::take(&mut self.vmm_off);
        let m = &*self.meter;
        if carried != 0 {
            m.vmm_off_drained.set(0);
        }
        m.wall[MicroState::Vmm].add(h);
        match (self.level, records, s.cpu, self.cpu_since) {
            (Level::Full, Some(t), _, _) => {
                m.cpu_vmm_full.add(h.saturating_sub(t.off[0] + carried));
            }
            (Level::Full, None, Some(c), Some(c0)) => m.cpu_vmm_full.add(c.saturating_sub(c0)),
            _ => m.vmm_wall_basic.add(h),
        }
    }

    /// Just before KVM_RUN: closes the handling of the previous exit, applies a level switch,
    /// and starts a `guest` interval on `host_cpu`. `s` holds what `level_for_entry` needs.
    #[inline]
    pub fn on_entry(&mut self, s: Stamp, host_cpu: usize, next: Level) {
        let host_cpu = host_cpu.min(self.meter.entries_by_cpu.len() - 1);
        let timed = self.level != Level::Off;
        let epoch = self.meter.reset_epoch.load(Ordering::Relaxed);
        if epoch != self.epoch {
            // Records taken before a reset must not count after it.
            self.pending_len = 0;
            self.epoch = epoch;
        }
        let mut wakeup = None;
        self.meter.begin();
        if timed {
            self.close_vmm(s);
        }
        let m = &*self.meter;
        let handled = self.exit_reason.filter(|_| timed);
        if let Some(r) = handled {
            m.exit_ns[r].add(self.exit_vmm_ns);
            let t = self.control.threshold(Threshold::ExitHandling);
            if t != 0 && self.exit_vmm_ns > t {
                m.exceeded[Threshold::ExitHandling].add(1);
            }
        }
        if timed {
            if let Some(rel) = self.wakeup_from {
                let lat = s.now.saturating_sub(rel);
                let t = self.control.threshold(Threshold::WakeupLatency);
                if t != 0 && lat > t {
                    m.exceeded[Threshold::WakeupLatency].add(1);
                }
                wakeup = Some(lat);
            }
        }
        if next != Level::Off && self.host_cpu.is_some_and(|c| c != host_cpu) {
            m.migrations.add(1);
        }
        m.set_state(
            MicroState::Guest,
            if next == Level::Off { 0 } else { s.now },
        );
        m.end();
        if let Some(r) = handled {
            self.hist(HistId::Exit(r as u8), self.exit_vmm_ns);
        }
        if let Some(lat) = wakeup {
            self.hist(HistId::Wakeup, lat);
        }
        self.wakeup_from = None;
        if next != Level::Off {
            if self.host_cpu != Some(host_cpu) {
                self.flush_cpu();
                self.host_cpu = Some(host_cpu);
            }
            self.cpu_entries += 1;
        }
        self.level = next;
        self.since = s.now;
        self.cpu_since = s.cpu;
    }

    /// Just after KVM_RUN returned with `reason`: counts the exit and closes the `guest`
    /// interval.
    #[inline]
    pub fn on_exit(&mut self, s: Stamp, reason: ExitReason) {
        let r = reason.index();
        let timed = self.level != Level::Off;
        let run = s.now.saturating_sub(self.since);
        // Episodes that began after the exit stamp `s` (a preemption before this drain) are the
        // next `vmm` interval's, not this run's: taken from the run, a run shorter than such an
        // episode would lose the difference and count it as on-CPU time.
        let records = if self.level == Level::Full {
            self.drain([self.since, s.now.max(self.since)])
        } else {
            None
        };
        self.meter.begin();
        if let Some(t) = &records {
            self.note_records(t, 1..3);
            self.vmm_off = t.off[2];
            if t.off[2] != 0 {
                self.meter.vmm_off_drained.set(t.off[2]);
            }
        }
        let m = &*self.meter;
        m.exits[r].add(1);
        m.exits_at_level[self.level].add(1);
        if timed {
            m.wall[MicroState::Guest].add(run);
            match (self.level, records, s.cpu, self.cpu_since) {
                (Level::Full, Some(t), _, _) => {
                    // Side 0 began before this entry, in an interval measured otherwise (a
                    // park, or VMM time at another level): not this run's.
                    let off = self.run_off + t.off[1];
                    m.cpu_guest_full.add(run.saturating_sub(off));
                    m.records_runs.add(1);
                }
                (Level::Full, None, Some(c), Some(c0)) => {
                    m.cpu_guest_full.add(c.saturating_sub(c0));
                }
                _ => {}
            }
            let t = self.control.threshold(Threshold::GuestRun);
            if t != 0 && run > t {
                m.exceeded[Threshold::GuestRun].add(1);
            }
        }
        m.set_state(MicroState::Vmm, if timed { s.now } else { 0 });
        m.end();
        if timed {
            self.cpu_wall += run;
            self.hist(HistId::GuestRun, run);
        }
        self.exit_reason = Some(r);
        self.exit_vmm_ns = 0;
        self.run_off = 0;
        self.since = s.now;
        self.cpu_since = s.cpu;
    }

    /// The loop ended at `s`: closes the handling of the last exit and applies pending records.
    pub fn finish(&mut self, s: Stamp) {
        if self.level != Level::Off {
            self.meter.begin();
            self.close_vmm(s);
            if let Some(r) = self.exit_reason {
                self.meter.exit_ns[r].add(self.exit_vmm_ns);
            }
            self.meter.set_state(MicroState::Vmm, 0);
            self.meter.end();
            if let Some(r) = self.exit_reason {
                self.hist(HistId::Exit(r as u8), self.exit_vmm_ns);
            }
        }
        self.exit_reason = None;
        self.flush();
    }

    /// The thread is about to park as `kind` (idle, limited or paused).
    pub fn park_begin(&mut self, kind: MicroState, p: ParkStamp) {
        self.flush();
        self.meter.begin();
        if self.level != Level::Off {
            self.close_vmm(Stamp {
                now: p.now,
                cpu: p.cpu,
            });
        }
        self.meter.set_state(kind, p.now);
        self.meter.end();
        self.run_off = 0;
        self.park = Some((kind, p));
    }

    /// A run of a vCPU the guest had not started yet ended: `before` and `after` were taken
    /// around it (wall, thread CPU, run_delay); the time the thread slept in it, neither on a
    /// CPU nor runnable, was the wait for the start-up IPI.
    pub fn start_wait(&mut self, before: ParkStamp, after: ParkStamp) {
        if let (Some(c0), Some(c1), Some(d0), Some(d1)) =
            (before.cpu, after.cpu, before.run_delay, after.run_delay)
        {
            let wall = after.now.saturating_sub(before.now);
            let slept = wall.saturating_sub(c1.saturating_sub(c0) + d1.saturating_sub(d0));
            self.meter.begin();
            self.meter.start_wait.add(slept);
            self.meter.end();
        }
    }

    /// The park ended; `release` is when it was released (its deadline, or the kick).
    pub fn park_end(&mut self, p: ParkStamp, release: u64) {
        let Some((kind, start)) = self.park.take() else {
            return;
        };
        // The park measures itself (its stamps); its records are dropped.
        let records = self.drain([u64::MAX, u64::MAX]);
        let wall = p.now.saturating_sub(start.now);
        self.meter.begin();
        if records.is_some() {
            self.publish_ring();
        }
        let m = &*self.meter;
        m.parks.add(1);
        m.wall[kind].add(wall);
        if let (Some(c0), Some(c1), Some(d0), Some(d1)) =
            (start.cpu, p.cpu, start.run_delay, p.run_delay)
        {
            let dcpu = c1.saturating_sub(c0);
            let ddelay = d1.saturating_sub(d0);
            m.park_cpu.add(dcpu);
            m.park_delay.add(ddelay);
            if let Some(k) = kind.park_kind() {
                m.blocked[k].add(wall.saturating_sub(dcpu + ddelay));
            }
        } else if let Some(k) = kind.park_kind() {
            // Level off: only the wall time is known.
            m.blocked[k].add(wall);
        }
        m.set_state(MicroState::Vmm, p.now);
        m.end();
        self.wakeup_from = Some(release.min(p.now));
        self.since = p.now;
        if p.cpu.is_some() {
            self.cpu_since = p.cpu;
        }
    }
}

mod backoff;
mod records;
use backoff::{backoff_us, READ_GIVE_UP_US};

#[cfg(test)]
#[path = "meter_tests.rs"]
mod tests;
