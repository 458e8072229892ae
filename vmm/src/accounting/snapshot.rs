//! Reading a vCPU's accounting: raw samples, reset baselines, and the fields of spec section 4.
//!
//! Data flow: [`VcpuAccounting::sample`] takes one [`RawSample`] — the meter's counter group,
//! the thread CPU clock (used), schedstat run_delay (steal), the KVM statistics and the
//! histograms — either live (reading the thread's clocks) or, after the thread ended, from the
//! [`FinalReadings`] it published on its way out. [`VcpuAccounting::reset`] stores a sample as
//! the baseline; [`VcpuAccounting::times`] subtracts it and derives [`VcpuTimes`]. The baseline
//! sits behind a mutex that only readers take: the vCPU thread never waits on it. The
//! derivation itself (a pure function of a sample and its baseline) is in `derivation`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use super::host::{SchedStatFile, ThreadClock, ThreadStateFile, TickTimes};
use super::meter::{MeterReading, MicroState, TraceState, VcpuMeter};
use super::switches::{Pairing, Tally};
use crate::hypervisor::stats::{KnownStat, StatKind, VcpuStats};
use crate::hypervisor::ExitCost;
use crate::sync::now_ns;
use ppa_vmm_api::TimeSplit;
pub use ppa_vmm_api::{HostCpu, VcpuTimes};

/// Live sources of a running vCPU thread, opened by the thread itself when it starts.
#[derive(Debug)]
pub struct LiveSources {
    /// Its CPU-time clock.
    pub clock: ThreadClock,
    /// Its schedstat file.
    pub sched: SchedStatFile,
    /// Its stat file, for whether it is runnable now (None if it could not be opened).
    pub state: Option<ThreadStateFile>,
}

/// What the vCPU thread read of itself as its loop ended (its /proc entries vanish with it).
#[derive(Debug, Clone, Default)]
pub struct FinalReadings {
    /// CLOCK_MONOTONIC when read.
    pub at_ns: u64,
    /// Thread CPU time.
    pub cpu_ns: u64,
    /// schedstat run_delay.
    pub run_delay_ns: u64,
    /// Tick-based times from /proc.
    pub ticks: Option<TickTimes>,
    /// KVM statistics (scalars).
    pub kvm: Vec<u64>,
}

/// One raw reading of every source of a vCPU, counted from the thread's start.
#[derive(Debug, Clone)]
pub struct RawSample {
    /// CLOCK_MONOTONIC of the sample (or of the thread's end).
    pub at_ns: u64,
    /// Wall time since the thread started.
    pub wall_ns: u64,
    /// The meter's counters, with the state in progress added.
    pub meter: MeterReading,
    /// Thread CPU time.
    pub used_ns: u64,
    /// schedstat run_delay.
    pub steal_ns: u64,
    /// KVM statistics.
    pub kvm: Vec<u64>,
    /// Histograms.
    pub hist: HistSnapshots,
    /// Tick-based /proc times (final samples only).
    pub ticks: Option<TickTimes>,
    /// Whether the meter's on-CPU figures of level full reach `at_ns` (false: a live sample
    /// in the middle of an interval whose records could not be looked at).
    pub on_cpu_complete: bool,
    /// Of the KVM_RUN in progress, the time the thread has been blocked so far (records only).
    pub blocking_ns: u64,
    /// Read from the running thread (false: its final readings, or before it started).
    pub live: bool,
    /// Start of the micro-state in progress as the sample began (live samples; the meter
    /// reading's may be later: the thread can move on while the clocks are read).
    pub began_in_ns: u64,
}

/// How many times a reader samples before it reads under the baseline lock (each retry
/// follows a reset that came in during its sample).
const READ_TRIES: usize = 3;

/// Accounting state of one vCPU beyond the meter: sources, final readings, baseline.
#[derive(Debug)]
pub struct VcpuAccounting {
    /// The meter the vCPU thread writes.
    pub meter: Arc<VcpuMeter>,
    /// Opened by the thread at start.
    pub live: OnceLock<LiveSources>,
    /// Published by the thread at its end.
    pub finals: OnceLock<FinalReadings>,
    /// The hypervisor's statistics of the vCPU (KVM's binary statistics), when the host has
    /// them.
    pub kvm: Option<VcpuStats>,
    /// The VM's measured in-kernel exit cost, for the kvm_ns estimate.
    pub exit_cost: Option<ExitCost>,
    /// Thread start, CLOCK_MONOTONIC (0 before).
    pub started_ns: AtomicU64,
    /// The end of its run loop, CLOCK_MONOTONIC (0 before), where its wall time ends: the
    /// thread's teardown after it (its records closed, its final readings; ~0.5 s at level
    /// full on the development host) is no limit's period.
    pub ended_ns: AtomicU64,
    /// CPU time and run_delay of the thread at `started_ns`: what it used and waited before its
    /// wall clock started (spawning, and the first run-queue wait) is not part of its figures.
    origin: OnceLock<(u64, u64)>,
    /// KVM statistics at `started_ns` (KVM counts from vCPU creation, which includes the
    /// VM's exit-cost calibration on vCPU 0).
    origin_kvm: OnceLock<Vec<u64>>,
    /// Which scalar KVM statistics are cumulative (only those are turned into deltas).
    kvm_cumulative: Vec<bool>,
    /// The sample a reset took (shared, so a reader clones a pointer under the lock, not the
    /// sample).
    baseline: Mutex<Option<Arc<RawSample>>>,
    /// The last split a reader returned ([`floor`]): readers only, held for a few additions.
    floor: Mutex<Option<Floor>>,
    /// Where the last reader's look at the records not yet drained stopped, so the next one
    /// walks only what was written since (a busy vCPU that stays in KVM_RUN for seconds
    /// leaves thousands of records, and the pressure sampler looks every few ms): readers
    /// only, held for a copy.
    peek_cache: Mutex<Option<PeekCache>>,
}

/// A reader's look at the records not yet drained, to go on from ([`RingView::peek_on`]).
#[derive(Debug, Clone, Copy)]
struct PeekCache {
    /// The consumer's tail and pairing state the look began from.
    tail: u64,
    start: Pairing,
    /// Where it stopped, and what it had found there.
    pos: u64,
    pairing: Pairing,
    tally: Tally,
}

fn sub_arr<const N: usize>(a: [u64; N], b: [u64; N]) -> [u64; N] {
    std::array::from_fn(|i| a[i].saturating_sub(b[i]))
}

fn sub_vec(a: &[u64], b: &[u64]) -> Vec<u64> {
    a.iter()
        .enumerate()
        .map(|(i, v)| v.saturating_sub(b.get(i).copied().unwrap_or(0)))
        .collect()
}

impl VcpuAccounting {
    /// Accounting for a vCPU that has not started.
    pub fn new(meter: Arc<VcpuMeter>, kvm: Option<VcpuStats>, exit_cost: Option<ExitCost>) -> Self {
        let kvm_cumulative = kvm.as_ref().map_or_else(Vec::new, |k| {
            (0..k.scalar_count())
                .map(|i| k.scalar_kind(i) == Some(StatKind::Cumulative))
                .collect()
        });
        VcpuAccounting {
            meter,
            live: OnceLock::new(),
            finals: OnceLock::new(),
            kvm,
            exit_cost,
            started_ns: AtomicU64::new(0),
            ended_ns: AtomicU64::new(0),
            origin: OnceLock::new(),
            origin_kvm: OnceLock::new(),
            kvm_cumulative,
            baseline: Mutex::new(None),
            floor: Mutex::new(None),
            peek_cache: Mutex::new(None),
        }
    }

    /// Called by the vCPU thread as its wall clock starts, with its CPU time and run_delay then.
    pub fn set_origin(&self, cpu_ns: u64, run_delay_ns: u64) {
        let _ = self.origin.set((cpu_ns, run_delay_ns));
        let _ = self.origin_kvm.set(self.read_kvm_raw());
    }

    /// Cumulative statistics since `started_ns`; instant and peak ones as they are.
    fn kvm_since_origin(&self, mut raw: Vec<u64>) -> Vec<u64> {
        let Some(origin) = self.origin_kvm.get() else {
            return raw;
        };
        for (i, v) in raw.iter_mut().enumerate() {
            if let (Some(true), Some(o)) = (self.kvm_cumulative.get(i), origin.get(i)) {
                *v = v.saturating_sub(*o);
            }
        }
        raw
    }

    fn origin(&self) -> (u64, u64) {
        self.origin.get().copied().unwrap_or((0, 0))
    }

    /// The current KVM statistics since the thread started, or empty.
    pub fn read_kvm(&self) -> Vec<u64> {
        self.kvm_since_origin(self.read_kvm_raw())
    }

    fn read_kvm_raw(&self) -> Vec<u64> {
        let Some(k) = &self.kvm else {
            return Vec::new();
        };
        thread_local! {
            // The data block a reader thread reads into, kept between reads (a `stats`
            // snapshot reads every vCPU's).
            static SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
        }
        let mut out = vec![0; k.scalar_count()];
        let read = SCRATCH.with(|s| match s.try_borrow_mut() {
            Ok(mut scratch) => k.read_scalars(&mut scratch, &mut out),
            Err(_) => k.read_scalars(&mut Vec::new(), &mut out),
        });
        match read {
            Ok(()) => out,
            Err(_) => Vec::new(),
        }
    }

    /// A raw sample now (live) or at the thread's end.
    pub fn sample(&self) -> RawSample {
        self.sample_with(true)
    }

    fn sample_with(&self, with_hist: bool) -> RawSample {
        let start = self.started_ns.load(Ordering::Acquire);
        let hist = if with_hist {
            HistSnapshots::of(&self.meter)
        } else {
            HistSnapshots::none()
        };
        if let Some(f) = self.finals.get() {
            return self.final_sample(f, start, hist);
        }
        let began_in_ns = self.meter.since_ns();
        let at = now_ns();
        let (cpu0, delay0) = self.origin();
        let live = self.live.get().and_then(|l| {
            let used = l.clock.read_ns().ok()?;
            let s = l.sched.read().ok()?;
            Some((
                used.saturating_sub(cpu0),
                s.run_delay_ns.saturating_sub(delay0),
            ))
        });
        let kvm = self.read_kvm();
        let mut meter = self.meter.read();
        let Some((used_ns, steal_ns)) = live else {
            // The thread ended between our checks, or never started.
            if let Some(f) = self.finals.get() {
                return self.final_sample(f, start, hist);
            }
            return RawSample {
                at_ns: at,
                meter,
                kvm,
                ..RawSample::zero(hist)
            };
        };
        // Add the micro-state in progress, so live figures do not lag by one interval.
        let now = self.add_in_progress(&mut meter, at);
        RawSample {
            at_ns: at,
            wall_ns: if start == 0 {
                0
            } else {
                at.saturating_sub(start)
            },
            meter,
            used_ns,
            steal_ns: steal_ns + now.steal_ns,
            kvm,
            hist,
            ticks: None,
            on_cpu_complete: now.on_cpu_complete,
            blocking_ns: now.blocking_ns,
            live: true,
            began_in_ns,
        }
    }

    /// Adds the micro-state in progress at `at` to `meter` (its wall time, and at level full
    /// its on-CPU part from the records not yet drained); returns what it adds beside the
    /// meter.
    fn add_in_progress(&self, meter: &mut MeterReading, at: u64) -> InProgressAdded {
        let mut added = InProgressAdded {
            steal_ns: 0,
            on_cpu_complete: true,
            blocking_ns: 0,
        };
        if meter.since == 0 {
            return added;
        }
        let state = meter.micro_state();
        if state.park_kind().is_none() && !meter.records_on {
            // The meter's on-CPU figures of level full stop at the interval's start, and
            // nothing here can see its on-CPU part so far (level basic, or full reading
            // the thread CPU clock): the split takes on-CPU time from the clock. Without
            // this, a busy vCPU that had not yet left its first KVM_RUN at level basic
            // (no exit counted at any level) showed its whole on-CPU time as blocked too.
            added.on_cpu_complete = false;
        }
        if state.park_kind().is_none() && meter.records_on {
            self.add_recorded_part(meter, at, &mut added);
        }
        let dt = at.saturating_sub(meter.since);
        let state = meter.micro_state();
        meter.wall[state] += dt;
        if let Some(k) = state.park_kind() {
            meter.blocked[k] += dt;
        }
        added
    }

    /// At level full, the on-CPU part of the interval in progress, from the records not yet
    /// drained (retried if the vCPU thread drains them meanwhile: the meter moved on too).
    fn add_recorded_part(&self, meter: &mut MeterReading, at: u64, added: &mut InProgressAdded) {
        let state = meter.micro_state();
        // As before the split: the interval's length from the first reading, even when a
        // retry below reads the meter again.
        let dt = at.saturating_sub(meter.since);
        let mut look = self.look_in_progress(meter, at);
        for _ in 0..3 {
            if look.is_some() {
                break;
            }
            *meter = self.meter.read();
            look = self.look_in_progress(meter, at);
        }
        match look {
            Some(l) if meter.micro_state() == state => {
                let on = dt.saturating_sub(l.off);
                let irq = l.irq.min(on);
                match state {
                    MicroState::Guest => {
                        meter.cpu_guest_full += on;
                        meter.irq_run += irq;
                        if meter.kvm_trace == TraceState::Firing {
                            meter.kvm_full += on.saturating_sub(l.guest + irq);
                        }
                    }
                    _ => {
                        meter.cpu_vmm_full += on;
                        meter.irq_vmm += irq;
                    }
                }
                // run_delay counts a wait only when it ends.
                added.steal_ns += l.preempting;
                if state == MicroState::Guest {
                    added.blocking_ns = l.blocking;
                }
            }
            _ => added.on_cpu_complete = false,
        }
    }

    /// The records of the interval in progress not yet drained, if the meter reading is
    /// still the one they follow.
    fn look_in_progress(&self, meter: &MeterReading, at: u64) -> Option<InProgress> {
        let ring = self.meter.ring.get()?;
        let lock = || self.peek_cache.lock().unwrap_or_else(|e| e.into_inner());
        let cached = *lock();
        let (from, p0, t0) = cached
            .filter(|c| c.tail == meter.ring_tail && c.start == meter.ring_pairing)
            .map_or(
                (meter.ring_tail, meter.ring_pairing, Tally::default()),
                |c| (c.pos, c.pairing, c.tally),
            );
        let (pos, t, pairing) = ring.peek_on(meter.ring_tail, from, p0, t0)?;
        if !t.lost {
            *lock() = Some(PeekCache {
                tail: meter.ring_tail,
                start: meter.ring_pairing,
                pos,
                pairing,
                tally: t,
            });
        }
        let open = |since: Option<u64>| since.map_or(0, |s| at.saturating_sub(s.max(meter.since)));
        let mut l = InProgress {
            off: t.off_total(),
            preempting: 0,
            blocking: 0,
            guest: t.guest.iter().sum::<u64>() + open(pairing.guest_since()),
            irq: t.irq.iter().sum::<u64>() + open(pairing.irq_since()),
        };
        if meter.micro_state() == MicroState::Vmm {
            // Episodes of this interval the exit's drain already took from the ring.
            l.off += meter.vmm_off_drained;
        }
        if let Some((out, preempted)) = pairing.pending() {
            let d = at.saturating_sub(out.max(meter.since));
            l.off += d;
            if preempted {
                l.preempting = d;
            } else {
                l.blocking = d;
            }
        }
        Some(l)
    }

    fn final_sample(&self, f: &FinalReadings, start: u64, hist: HistSnapshots) -> RawSample {
        let (cpu0, delay0) = self.origin();
        RawSample {
            at_ns: f.at_ns,
            wall_ns: f.at_ns.saturating_sub(start),
            meter: self.meter.read(),
            used_ns: f.cpu_ns.saturating_sub(cpu0),
            steal_ns: f.run_delay_ns.saturating_sub(delay0),
            kvm: f.kvm.clone(),
            hist,
            ticks: f.ticks,
            on_cpu_complete: true,
            blocking_ns: 0,
            live: false,
            began_in_ns: 0,
        }
    }

    /// CPU time of the vCPU thread when its wall clock started (None before).
    pub fn origin_cpu_ns(&self) -> Option<u64> {
        self.origin.get().map(|o| o.0)
    }

    /// Total CPU time of the vCPU thread (live, or at its end); None before it started.
    pub fn thread_cpu_ns(&self) -> Option<u64> {
        if let Some(f) = self.finals.get() {
            return Some(f.cpu_ns);
        }
        self.live.get().and_then(|l| l.clock.read_ns().ok())
    }

    /// Restarts every figure from zero: the current sample becomes the baseline, and the
    /// meter's reset epoch moves on. The vCPU thread never takes the baseline lock.
    pub fn reset(&self) {
        let mut base = self.baseline.lock().unwrap_or_else(|e| e.into_inner());
        *base = Some(Arc::new(self.sample()));
        self.meter.reset_epoch.fetch_add(1, Ordering::Release);
    }

    /// The fields of spec section 4 since the start or the last reset.
    pub fn times(&self) -> (VcpuTimes, HistSnapshots) {
        self.times_with(true)
    }

    /// The fields of spec section 4, with the histograms and the detail maps (KVM statistics
    /// by name, host CPUs, thresholds, exit handling times) only when `with_hist` (empty
    /// otherwise: `stats` on the control socket reads every vCPU often and needs neither).
    ///
    /// Held at or above what the previous reader was given ([`floor`]), so that no figure goes
    /// down between resets.
    pub fn times_with(&self, with_hist: bool) -> (VcpuTimes, HistSnapshots) {
        let (epoch, cur, (mut times, hist)) = self.read(with_hist);
        // Where the time in progress is going matters only if blocked grew since the last
        // read (the thread's state is then read: one more system call).
        let last = *self.floor.lock().unwrap_or_else(|e| e.into_inner());
        let grew = last.is_none_or(|p| p.epoch != epoch || times.blocked_ns > p.time.blocked_ns);
        let hint = grew
            .then(|| {
                let runnable = || self.live.get()?.state.as_ref()?.runnable().ok();
                let blocking = cur_kvm_stat(self.kvm.as_ref(), &cur.kvm, KnownStat::Blocking);
                floor::hint(&cur, blocking, runnable)
            })
            .flatten();
        let mut f = self.floor.lock().unwrap_or_else(|e| e.into_inner());
        let prev = match *f {
            // A sample from before a reset that came in meanwhile: as it is.
            Some(p) if p.epoch > epoch => return (times, hist),
            Some(p) if p.epoch == epoch => p,
            // The first read since the start or a reset holds at zero (its hint still routes
            // the time in progress).
            _ => Floor {
                epoch,
                time: TimeSplit::default(),
            },
        };
        let held = floor::hold(&prev, times.split(), cur.at_ns, hint);
        *f = Some(Floor { epoch, time: held });
        drop(f);
        set_split(&mut times, held);
        (times, hist)
    }

    /// The fields of spec section 4 as sampled, not held at what earlier readers were given:
    /// the final report's exact figures once the thread has ended.
    pub fn times_exact(&self) -> (VcpuTimes, HistSnapshots) {
        self.read(true).2
    }

    /// A sample and what it derives to, with the reset epoch it belongs to.
    fn read(&self, with_hist: bool) -> (u64, RawSample, (VcpuTimes, HistSnapshots)) {
        // Each reader sees the state wholly before or wholly after a reset, without holding
        // the lock across its sample (system calls: a reader preempted there, such as the
        // sampler at nice 0 waiting 100 ms for a CPU behind 32 vCPU threads, held every other
        // reader of this vCPU behind it, the `api` thread included). The baseline is taken
        // under the lock and the sample retried if a reset came in between (seqlock style).
        for _ in 0..READ_TRIES {
            let epoch = self.meter.reset_epoch.load(Ordering::Acquire);
            let base = self.baseline().clone();
            let cur = self.sample_with(with_hist);
            std::sync::atomic::fence(Ordering::Acquire);
            if self.meter.reset_epoch.load(Ordering::Relaxed) == epoch {
                let d = self.derive(&cur, base.as_deref(), with_hist);
                return (epoch, cur, d);
            }
        }
        // Resets kept coming (a client sending nothing else): read under the lock.
        let base = self.baseline();
        let epoch = self.meter.reset_epoch.load(Ordering::Acquire);
        let cur = self.sample_with(with_hist);
        let d = self.derive(&cur, base.as_deref(), with_hist);
        (epoch, cur, d)
    }

    fn baseline(&self) -> std::sync::MutexGuard<'_, Option<Arc<RawSample>>> {
        self.baseline.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn derive(
        &self,
        cur: &RawSample,
        base: Option<&RawSample>,
        with_hist: bool,
    ) -> (VcpuTimes, HistSnapshots) {
        let kernel = Kernel {
            why: (
                self.meter.kvm_trace_why.get().map(String::as_str),
                self.meter.irq_trace_why.get().map(String::as_str),
            ),
            irq_time_accounted: super::switches::events::irq_time_accounted(),
        };
        let (mut times, hist) = derive(
            cur,
            base,
            self.kvm.as_ref(),
            self.exit_cost,
            with_hist,
            kernel,
        );
        times.steal_before_start_ns = self.origin().1;
        (times, hist)
    }
}

impl RawSample {
    /// A sample of nothing (a thread that never started), with histograms `hist`: the
    /// baseline when there is none.
    fn zero(hist: HistSnapshots) -> RawSample {
        RawSample {
            at_ns: 0,
            wall_ns: 0,
            meter: MeterReading::default(),
            used_ns: 0,
            steal_ns: 0,
            kvm: Vec::new(),
            hist,
            ticks: None,
            on_cpu_complete: true,
            blocking_ns: 0,
            live: false,
            began_in_ns: 0,
        }
    }
}

/// What the interval in progress adds to a live sample beside the meter reading.
struct InProgressAdded {
    /// A preemption still going on (run_delay counts a wait only when it ends).
    steal_ns: u64,
    /// Whether the meter's on-CPU split covers the interval so far.
    on_cpu_complete: bool,
    /// A block still going on, in guest mode.
    blocking_ns: u64,
}

/// What a reader sees of the interval in progress in the records not yet drained.
#[derive(Debug, Clone, Copy)]
struct InProgress {
    /// Off-CPU time so far.
    off: u64,
    /// Of it, a preemption still going on (not yet in run_delay).
    preempting: u64,
    /// Of it, a block still going on.
    blocking: u64,
    /// Guest-mode time so far (KVM's tracepoints).
    guest: u64,
    /// Interrupt time so far (the interrupt tracepoints).
    irq: u64,
}

/// What [`derive`] needs to know of the kernel tracepoints' figures.
#[derive(Debug, Clone, Copy, Default)]
pub struct Kernel<'a> {
    /// Why KVM's and the interrupt tracepoints measure nothing, where the vCPU thread said so.
    pub why: (Option<&'a str>, Option<&'a str>),
    /// Whether the host kernel charges interrupt time to its CPU instead of the running thread
    /// (CONFIG_IRQ_TIME_ACCOUNTING): the thread CPU clock then leaves interrupted_ns out, and
    /// used_ns adds it back.
    pub irq_time_accounted: bool,
}

/// Puts a held split into `t`, with the figures derived from it.
fn set_split(t: &mut VcpuTimes, s: TimeSplit) {
    t.wall_ns = s.wall_ns;
    t.used_ns = s.used_ns;
    t.guest_ns = s.guest_ns;
    t.kvm_ns = t.kvm_ns.map(|_| s.kvm_ns);
    t.interrupted_ns = t.interrupted_ns.map(|_| s.interrupted_ns);
    t.vmm_ns = s.vmm_ns;
    t.steal_ns = s.steal_ns;
    t.halted_ns = s.halted_ns;
    t.idle_ns = s.idle_ns;
    t.limited_ns = s.limited_ns;
    t.paused_ns = s.paused_ns;
    t.blocked_ns = s.blocked_ns;
    t.identity_error_ns = s.identity_error_ns();
    t.guest_code_ns_estimate = t.kvm_ns_estimate.map(|k| s.guest_ns.saturating_sub(k));
}

mod derivation;
pub use derivation::derive;
mod floor;
use floor::Floor;
mod hists;
pub use hists::HistSnapshots;
mod kernel;
mod off_cpu;
use off_cpu::cur_kvm_stat;

#[cfg(test)]
mod tests;
