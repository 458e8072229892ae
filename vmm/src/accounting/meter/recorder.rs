//! The vCPU thread's side of the meter ([`Recorder`]): its local state between boundaries,
//! the clock readings it takes ([`Stamp`], [`ParkStamp`]), and the write sections that move
//! the shared [`VcpuMeter`] counters at each KVM_RUN entry and exit and at each park. Readers
//! never see this state; they read the counters (`meter.rs`). Context-switch records are
//! `records.rs`.

use std::sync::Arc;

use super::super::episodes::{Episode, EpisodeKind};
use super::super::switches::{SwitchRing, Tally};
use super::super::{AccountingControl, Level};
use super::kvm::TraceAcc;
use super::*;

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
    pub(super) meter: Arc<VcpuMeter>,
    pub(super) control: Arc<AccountingControl>,
    /// Level in force for the current interval.
    pub(super) level: Level,
    pub(super) since: u64,
    pub(super) cpu_since: Option<u64>,
    /// Host CPU of the last timed entry.
    pub(super) host_cpu: Option<usize>,
    /// KVM_RUN entries and wall time on `host_cpu` not yet added to the per-CPU arrays (applied
    /// when the CPU changes and with the histogram batches: two fewer pages per exit).
    pub(super) cpu_entries: u64,
    pub(super) cpu_wall: u64,
    /// The reset epoch the pending histogram records belong to.
    pub(super) epoch: u64,
    /// The exit being handled (None before the first exit).
    pub(super) exit_reason: Option<usize>,
    pub(super) exit_vmm_ns: u64,
    pub(super) park: Option<(ParkKind, ParkStamp)>,
    pub(super) wakeup_from: Option<u64>,
    /// The thread's context-switch records, when perf gives them (level full uses them
    /// instead of the thread CPU clock).
    pub(super) ring: Option<SwitchRing>,
    /// Whether to try records at all, and whether opening them was tried.
    pub(super) records_wanted: bool,
    pub(super) records_tried: bool,
    /// Off-CPU time inside the KVM_RUN in progress found by the drain at its entry.
    pub(super) run_off: u64,
    /// Off-CPU time of the `vmm` interval in progress found by the drain at the exit that began
    /// it (a preemption between the exit stamp and that drain).
    pub(super) vmm_off: u64,
    /// The ring position last published to the meter.
    pub(super) published_tail: u64,
    /// In-kernel exits and interrupts the drains completed, until published.
    pub(super) acc: TraceAcc,
    /// KVM's tracepoints on this thread.
    pub(super) kvm_state: TraceState,
    /// Whether the interrupt tracepoints are in the ring.
    pub(super) irq_on: bool,
    /// Guest-mode and interrupt time inside the KVM_RUN in progress found by the drain at its
    /// entry (as `run_off`).
    pub(super) run_guest: u64,
    /// See [`Recorder::run_guest`].
    pub(super) run_irq: u64,
    /// Interrupt time of the `vmm` interval in progress found by the drain at the exit that
    /// began it (as `vmm_off`).
    pub(super) vmm_irq: u64,
}

impl Recorder {
    /// A recorder for `meter`, starting in state `vmm` at `start`.
    pub fn new(meter: Arc<VcpuMeter>, control: Arc<AccountingControl>, start: Stamp) -> Self {
        let level = control.level();
        meter.set_state(MicroState::Vmm, start.now);
        let acc_meter = Arc::clone(&meter);
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
            acc: TraceAcc::new(acc_meter),
            kvm_state: TraceState::NotOpened,
            irq_on: false,
            run_guest: 0,
            run_irq: 0,
            vmm_irq: 0,
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
    #[link_section = "ppa_hot"]
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
    /// In the exit path's `ppa_hot` section (`vcpu::run::run_loop`).
    #[link_section = "ppa_hot"]
    pub fn flush(&mut self) {
        self.flush_cpu();
        self.acc.flush();
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

    /// Whether the entry that ends the `vmm` interval in progress reads the thread CPU clock
    /// at level basic: the interval began with a reading (a kicked exit, [`Self::cpu_at_exit`],
    /// or a park's end), so that its handling is measured by the clock rather than by wall
    /// time (issue 39: a limit's stop, preempted in its spin or park path, made level basic
    /// put a third of a limited VM's CPU in `vmm_ns`).
    #[inline]
    pub fn cpu_at_entry(&self) -> bool {
        self.level == Level::Basic && self.cpu_since.is_some()
    }

    /// Whether the exit stamp of a KVM_RUN that returned `kicked` (an `intr` exit: a kick, a
    /// kick timer) reads the thread CPU clock at level basic (see [`Self::cpu_at_entry`]).
    #[inline]
    pub fn cpu_at_exit(&self, kicked: bool) -> bool {
        kicked && self.level == Level::Basic
    }

    /// Closes a `vmm` interval ending at `s`: its wall and CPU go to the VMM totals and to the
    /// current exit. Called inside a write section. At level full its on-CPU part is the wall
    /// time less the off-CPU episodes the records show (those the exit's drain found after
    /// its stamp, and those that began before `s`), or the thread CPU clock's delta; the
    /// interrupts the records show in it are counted apart (`irq_vmm`).
    ///
    /// `level` is the recorder's own, passed in (see [`Self::entry_from`]); `run_follows`: a
    /// KVM_RUN begins at `s` (an entry), not a park or the end, whose run-queue wait after `s`
    /// is not counted in `records_preempted` (a park's is its own, in `park_delay`).
    #[inline(always)]
    fn close_vmm(&mut self, level: Level, s: Stamp, run_follows: bool) {
        debug_assert_eq!(level, self.level);
        let h = s.now.saturating_sub(self.since);
        self.exit_vmm_ns += h;
        let records = if level == Level::Full {
            self.drain([s.now, u64::MAX], None)
        } else {
            None
        };
        if let Some(t) = &records {
            self.note_records(t, 0..1 + usize::from(run_follows));
            self.run_off += t.off[1];
            self.run_guest += t.guest[1];
            self.run_irq += t.irq[1];
        }
        let carried = std::mem::take(&mut self.vmm_off);
        let carried_irq = std::mem::take(&mut self.vmm_irq);
        let m = &*self.meter;
        if carried != 0 {
            m.vmm_off_drained.set(0);
        }
        m.wall[MicroState::Vmm].add(h);
        match (level, records, s.cpu, self.cpu_since) {
            (Level::Full, Some(t), _, _) => {
                let on = h.saturating_sub(t.off[0] + carried);
                m.cpu_vmm_full.add(on);
                if self.irq_on {
                    m.irq_vmm.add((t.irq[0] + carried_irq).min(on));
                }
            }
            // Level full without records, and at level basic the handling that followed a
            // kicked exit or a park (read by the thread CPU clock at both ends: a limit's stop,
            // whose spin and park path a preemption can stretch to milliseconds of wall time).
            (Level::Full | Level::Basic, None, Some(c), Some(c0)) => {
                m.cpu_vmm_full.add(c.saturating_sub(c0))
            }
            _ => m.vmm_wall_basic.add(h),
        }
        self.acc.publish();
    }

    /// Just before KVM_RUN: closes the handling of the previous exit, applies a level switch,
    /// and starts a `guest` interval on `host_cpu`. `s` holds what `level_for_entry` needs.
    #[inline]
    pub fn on_entry(&mut self, s: Stamp, host_cpu: usize, next: Level) {
        self.entry_from(self.level, s, host_cpu, next)
    }

    /// [`Self::on_entry`] given the level of the interval it closes, which must be the
    /// recorder's own: the plain loop (`vcpu::plain`) passes it as a constant, so that each of
    /// its instances keeps only its level's code. At level basic that is a few hundred bytes
    /// instead of the 5 KiB that held level full's branches too, and on this PVM host each
    /// line of code an exit runs is fetched again after the exit (docs/design.md, "One
    /// plain loop per level").
    #[inline(always)]
    pub fn entry_from(&mut self, prev: Level, s: Stamp, host_cpu: usize, next: Level) {
        debug_assert_eq!(prev, self.level);
        if prev == Level::Off && next == Level::Off {
            return self.on_entry_off(s);
        }
        let host_cpu = host_cpu.min(self.meter.entries_by_cpu.len() - 1);
        let timed = prev != Level::Off;
        self.follow_reset();
        let mut wakeup = None;
        self.meter.begin();
        if timed {
            self.close_vmm(prev, s, true);
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

    /// [`Self::on_entry`] at level off with the next run at level off too: what the general
    /// case does then, with none of its branches (the plain loop's entry, `vcpu::plain`, is
    /// this and [`Self::on_exit_off`], a few dozen instructions).
    #[inline]
    pub fn on_entry_off(&mut self, s: Stamp) {
        self.follow_reset();
        let m = &*self.meter;
        m.begin();
        m.set_state(MicroState::Guest, 0);
        m.end();
        self.wakeup_from = None;
        self.since = s.now;
        self.cpu_since = s.cpu;
    }

    /// Follows a reset of the figures: records taken before it must not count after it.
    #[inline]
    fn follow_reset(&mut self) {
        let epoch = self.meter.reset_epoch.load(Ordering::Relaxed);
        if epoch != self.epoch {
            self.pending_len = 0;
            self.acc.drop_pending();
            self.epoch = epoch;
        }
    }

    /// [`Self::on_exit`] of a run at level off: counts the exit; nothing is timed.
    #[inline]
    pub fn on_exit_off(&mut self, s: Stamp, reason: ExitReason) {
        let r = reason.index();
        let m = &*self.meter;
        m.begin();
        m.exits[r].add(1);
        m.exits_at_level[Level::Off].add(1);
        self.acc.publish();
        let m = &*self.meter;
        m.set_state(MicroState::Vmm, 0);
        m.end();
        self.after_exit(s, r);
    }

    /// What every exit leaves behind: the exit being handled, and no run's parts held.
    #[inline]
    fn after_exit(&mut self, s: Stamp, r: usize) {
        self.exit_reason = Some(r);
        self.exit_vmm_ns = 0;
        self.run_off = 0;
        self.run_guest = 0;
        self.run_irq = 0;
        self.since = s.now;
        self.cpu_since = s.cpu;
    }

    /// Just after KVM_RUN returned with `reason`: counts the exit and closes the `guest`
    /// interval.
    #[inline]
    pub fn on_exit(&mut self, s: Stamp, reason: ExitReason) {
        self.exit_at(self.level, s, reason)
    }

    /// [`Self::on_exit`] given the level of the run it closes, which must be the recorder's
    /// own (as [`Self::entry_from`]).
    #[inline(always)]
    pub fn exit_at(&mut self, level: Level, s: Stamp, reason: ExitReason) {
        debug_assert_eq!(level, self.level);
        if level == Level::Off {
            return self.on_exit_off(s, reason);
        }
        let r = reason.index();
        let run = s.now.saturating_sub(self.since);
        // Episodes that began after the exit stamp `s` (a preemption before this drain) are the
        // next `vmm` interval's, not this run's: taken from the run, a run shorter than such an
        // episode would lose the difference and count it as on-CPU time.
        let records = if level == Level::Full {
            self.drain(
                [self.since, s.now.max(self.since)],
                Some(reason == ExitReason::Intr),
            )
        } else {
            None
        };
        let silenced = records.as_ref().is_some_and(|t| self.learn_kvm(t, reason));
        self.meter.begin();
        if let Some(t) = &records {
            self.note_records(t, 1..3);
            self.carry_to_vmm(t, 2);
        }
        let m = &*self.meter;
        m.exits[r].add(1);
        m.exits_at_level[level].add(1);
        m.wall[MicroState::Guest].add(run);
        match (level, records, s.cpu, self.cpu_since) {
            (Level::Full, Some(t), _, _) => self.split_run(run, &t),
            (Level::Full, None, Some(c), Some(c0)) => {
                m.cpu_guest_full.add(c.saturating_sub(c0));
            }
            _ => {}
        }
        let t = self.control.threshold(Threshold::GuestRun);
        if t != 0 && run > t {
            m.exceeded[Threshold::GuestRun].add(1);
        }
        self.acc.publish();
        let m = &*self.meter;
        m.set_state(MicroState::Vmm, s.now);
        m.end();
        if silenced {
            self.silence_kvm();
        }
        self.cpu_wall += run;
        self.hist(HistId::GuestRun, run);
        self.after_exit(s, r);
    }

    /// A KVM_RUN of `run` ns at level full, its records in `t`: its on-CPU time (wall less the
    /// off-CPU episodes), and of it the interrupts and, where KVM's tracepoints fire and no
    /// record was lost, KVM's own time (on-CPU less guest mode less interrupts). Inside a
    /// write section.
    #[inline]
    fn split_run(&self, run: u64, t: &Tally) {
        let m = &*self.meter;
        // Side 0 began before this entry, in an interval measured otherwise (a park, or VMM
        // time at another level): not this run's.
        let on = run.saturating_sub(self.run_off + t.off[1]);
        m.cpu_guest_full.add(on);
        m.records_runs.add(1);
        let irq = if self.irq_on {
            (self.run_irq + t.irq[1]).min(on)
        } else {
            0
        };
        m.irq_run.add(irq);
        if self.kvm_state == TraceState::Firing {
            m.kvm_to_user.add(t.kvm_to_user);
            if !t.lost {
                let guest = self.run_guest + t.guest[1];
                m.kvm_full.add(on.saturating_sub(guest + irq));
                m.kvm_runs.add(1);
            }
        }
    }

    /// The loop ended at `s`: closes the handling of the last exit and applies pending records.
    pub fn finish(&mut self, s: Stamp) {
        if self.level != Level::Off {
            self.meter.begin();
            self.close_vmm(self.level, s, false);
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
    pub fn park_begin(&mut self, kind: ParkKind, p: ParkStamp) {
        self.flush();
        self.meter.begin();
        if self.level != Level::Off {
            self.close_vmm(
                self.level,
                Stamp {
                    now: p.now,
                    cpu: p.cpu,
                },
                false,
            );
        }
        self.meter.set_state(kind.into(), p.now);
        self.meter.end();
        self.run_off = 0;
        self.run_guest = 0;
        self.run_irq = 0;
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
        // The park measures itself (its stamps); its records are dropped, but for an episode
        // that began after its end stamp `p` (a preemption before this drain), which is the
        // next `vmm` interval's (as at `begin`).
        let records = self.drain_quiet([p.now, u64::MAX]);
        let wall = p.now.saturating_sub(start.now);
        self.meter.begin();
        if let Some(t) = &records {
            self.carry_quiet(t);
            self.publish_ring();
        }
        let m = &*self.meter;
        m.parks.add(1);
        m.wall[MicroState::from(kind)].add(wall);
        let mut wait = 0;
        if let (Some(c0), Some(c1), Some(d0), Some(d1)) =
            (start.cpu, p.cpu, start.run_delay, p.run_delay)
        {
            let dcpu = c1.saturating_sub(c0);
            let ddelay = d1.saturating_sub(d0);
            m.park_cpu.add(dcpu);
            m.park_delay.add(ddelay);
            m.blocked[kind].add(wall.saturating_sub(dcpu + ddelay));
            wait = ddelay;
        } else {
            // Level off: only the wall time is known.
            m.blocked[kind].add(wall);
        }
        m.set_state(MicroState::Vmm, p.now);
        m.end();
        m.episodes.push(Episode {
            start: start.now,
            end: p.now,
            kind: match kind {
                ParkKind::Idle => EpisodeKind::Idle,
                ParkKind::Limited => EpisodeKind::Limited,
                ParkKind::Paused => EpisodeKind::Paused,
            },
            wait: wait.min(wall),
        });
        self.wakeup_from = Some(release.min(p.now));
        self.since = p.now;
        if p.cpu.is_some() {
            self.cpu_since = p.cpu;
        }
    }
}
