//! The recorder's use of the thread's perf ring (level full): opening it (context-switch
//! records, and the tracepoints the VM's catalog found) before the clocks start, switching it
//! with the level before an entry stamp, draining it at KVM_RUN boundaries, learning whether
//! KVM's tracepoints fire on this host, and publishing the ring position readers peek from.
//! The records themselves (the ring, pairing, tallies, tracepoints) are
//! `accounting::switches`.

use super::super::switches::events::TraceError;
use super::super::switches::{Bounds, OpenedRing, SwitchRing, Tally};
use super::super::Level;
use super::{KvmExits, MicroState, Recorder, Stamp, TraceState};
use crate::accounting::ExitReason;

impl Recorder {
    /// Starts the clocks at `start` (after `use_records`, whose cost is then nobody's time):
    /// the recorder is in state `vmm` from there, and records from before are dropped. An
    /// off-CPU episode that began after `start` (a preemption between the start stamp and this
    /// drain, as the wake-up of a thread waiting for this one's start can cause) is the first
    /// `vmm` interval's: dropped with the rest, that interval counted it as on-CPU time
    /// (36 ms of a 50 ms vCPU in the nested SVM host).
    pub fn begin(&mut self, start: Stamp) {
        let records = self.drain_quiet([start.now, u64::MAX]);
        self.since = start.now;
        self.cpu_since = start.cpu;
        self.meter.begin();
        if let Some(t) = &records {
            self.carry_quiet(t);
        }
        self.publish_ring();
        self.meter.set_state(MicroState::Vmm, start.now);
        self.meter.end();
    }

    /// Applies the level of the next KVM_RUN to the records before its entry stamp is taken:
    /// opening or switching them can sleep, which must fall in the interval measured at the
    /// old level, not inside the run. The test of whether there is anything to do is inlined:
    /// an entry that neither opens nor switches the records (every entry but a level switch's)
    /// touches no code of `apply_records`, whose page costs a walk at each exit on this host
    /// (docs/design.md, "Where the gap is").
    #[inline]
    pub fn prepare(&mut self, next: Level) {
        let full = next == Level::Full;
        let opens = full && self.records_wanted && !self.records_tried;
        let switches = self.ring.as_ref().is_some_and(|r| r.enabled() != full);
        if opens || switches {
            self.apply_records(next);
        }
    }

    /// Splits level `full` with context-switch records instead of thread-CPU-clock reads,
    /// where perf gives them. The recorder opens them on its thread (the vCPU thread) the
    /// first time level full is in force: an open event costs every context switch on the
    /// host a little, so a VM that never uses level full does not open one.
    pub fn use_records(&mut self) {
        self.records_wanted = true;
        self.apply_records(self.level);
    }

    /// Whether records split level full (else the thread CPU clock does).
    pub fn has_records(&self) -> bool {
        self.ring.is_some()
    }

    /// Opens the records (once), and turns them on for level full and off otherwise (a
    /// system call, only when that changes); a ring that cannot be switched is given up for
    /// the CPU clock.
    #[link_section = "ppa_hot"]
    pub(super) fn apply_records(&mut self, level: Level) {
        if level == Level::Full && self.records_wanted && !self.records_tried {
            self.records_tried = true;
            // SAFETY: gettid has no preconditions.
            let tid = unsafe { libc::gettid() };
            let kick = crate::hypervisor::kvm::kick::install_handler()
                .ok()
                .map(|()| (crate::hypervisor::kvm::kick::kick_signal(), tid));
            match SwitchRing::open(self.control.trace(), kick) {
                Ok(opened) => self.adopt(opened),
                Err(e) => {
                    log::warn!(
                        "no context-switch records for this vCPU thread ({e}); level full reads the thread CPU clock at every KVM_RUN boundary"
                    );
                    let why = format!("level full has no perf ring on this vCPU thread: {e}");
                    self.set_trace_states(Some(why.clone()), Some(why));
                }
            }
        }
        let Some(ring) = &mut self.ring else {
            return;
        };
        let want = level == Level::Full;
        if ring.enabled() == want {
            return;
        }
        let ok = ring.set_enabled(want).is_ok();
        if !ok {
            log::warn!("context-switch records could not be switched; level full reads the thread CPU clock");
            self.ring = None;
            let why = "the perf ring of this vCPU thread could not be switched on".to_string();
            self.set_trace_states(Some(why.clone()), Some(why));
        }
        self.meter.begin();
        self.meter.records_on.set(u64::from(want && ok));
        if want && ok {
            self.meter.records_switches.add(1);
            self.meter.records_on_since.set(crate::sync::now_ns());
        }
        self.publish_ring();
        self.meter.end();
    }

    /// Takes an opened ring: its view for readers, and where each group of tracepoints stands.
    fn adopt(&mut self, opened: OpenedRing) {
        let _ = self.meter.ring.set(opened.ring.view());
        if opened.ring.has_kvm() {
            let _ = self
                .meter
                .kvm_exits
                .set(Box::new(KvmExits::new(self.control.frac_bits())));
        }
        let why = |e: Option<TraceError>| e.map(|e| e.sentence());
        self.set_trace_states(why(opened.kvm), why(opened.irq));
        self.ring = Some(opened.ring);
    }

    /// Publishes where KVM's and the interrupt tracepoints stand: each unavailable with its
    /// reason, or opened (KVM's: firing on a VMX or SVM host, whose KVM traces every entry and
    /// exit, else not yet seen to fire; the interrupts': on).
    fn set_trace_states(&mut self, kvm: Option<String>, irq: Option<String>) {
        let m = &*self.meter;
        self.kvm_state = match kvm {
            Some(why) => {
                let _ = m.kvm_trace_why.set(why);
                TraceState::Unavailable
            }
            None if matches!(self.control.trace_backend(), Some("kvm_intel" | "kvm_amd")) => {
                TraceState::Firing
            }
            None => TraceState::Unknown,
        };
        self.irq_on = irq.is_none();
        if let Some(why) = irq {
            let _ = m.irq_trace_why.set(why);
        }
        m.begin();
        m.kvm_trace.set(self.kvm_state as u64);
        m.irq_trace.set(if self.irq_on {
            TraceState::Firing
        } else {
            TraceState::Unavailable
        } as u64);
        m.end();
    }

    /// What a KVM_RUN's records say about KVM's tracepoints: a `kvm_entry` record means they
    /// fire; a run that reached the guest (an MMIO, port or HLT exit) with none, and no record
    /// lost, means this host's KVM does not fire them (found at the first such run; on a VMX
    /// or SVM host, which is taken to fire them from the start, never). Returns whether they
    /// were just found silent (the caller closes them after its write section).
    #[inline]
    pub(super) fn learn_kvm(&mut self, t: &Tally, reason: ExitReason) -> bool {
        if !matches!(self.kvm_state, TraceState::Unknown | TraceState::Firing) {
            return false;
        }
        if t.kvm_entries > 0 {
            if self.kvm_state == TraceState::Unknown {
                self.kvm_state = TraceState::Firing;
                self.meter.kvm_trace.set(TraceState::Firing as u64);
            }
            return false;
        }
        let ran_guest = matches!(
            reason,
            ExitReason::MmioRead
                | ExitReason::MmioWrite
                | ExitReason::IoIn
                | ExitReason::IoOut
                | ExitReason::Hlt
        );
        if !ran_guest || t.lost {
            return false;
        }
        self.kvm_state = TraceState::Silent;
        let backend = self
            .control
            .trace_backend()
            .map_or(String::new(), |b| format!(" (module {b})"));
        let _ = self.meter.kvm_trace_why.set(format!(
            "this host's KVM{backend} did not fire kvm:kvm_entry during a KVM_RUN that ran guest \
             code, so its backend does not trace guest entries and exits and in-kernel exit \
             handling stays inside guest_ns"
        ));
        self.meter.kvm_trace.set(TraceState::Silent as u64);
        true
    }

    /// Turns KVM's tracepoints, found silent, off (a few system calls, once; closed with the
    /// ring at the thread's end: closing now would block for RCU grace periods).
    #[cold]
    pub(super) fn silence_kvm(&mut self) {
        if let Some(ring) = &mut self.ring {
            ring.drop_kvm();
        }
    }

    /// Whether a boundary between intervals at `prev` and `next` reads the thread CPU clock:
    /// level full without records.
    #[inline]
    pub fn needs_cpu_clock(&self, prev: Level, next: Level) -> bool {
        (prev == Level::Full || next == Level::Full) && self.ring.is_none()
    }

    /// The records since the last drain, split at `bounds` (None: no records in use), their
    /// in-kernel exits and interrupts held for publication; `end_run`: the drain follows a
    /// KVM_RUN's return, for a signal (`Some(true)`) or not.
    #[inline]
    pub(super) fn drain(&mut self, bounds: Bounds, end_run: Option<bool>) -> Option<Tally> {
        // A disabled ring still holds what it recorded before it was disabled.
        Some(self.ring.as_mut()?.drain_to(bounds, &mut self.acc, end_run))
    }

    /// [`Recorder::drain`] of records whose exits and interrupts are not counted (a park,
    /// which measures itself, or what came before the clocks started).
    #[inline]
    pub(super) fn drain_quiet(&mut self, bounds: Bounds) -> Option<Tally> {
        Some(self.ring.as_mut()?.drain(bounds))
    }

    /// Keeps what side `side` of a drain found after the stamp that began the `vmm` interval
    /// in progress (a preemption, an interrupt between that stamp and the drain) for the close
    /// of that interval, and shows its off-CPU part to readers. Inside a write section.
    #[inline(always)]
    pub(super) fn carry_to_vmm(&mut self, t: &Tally, side: usize) {
        self.vmm_off = t.off[side];
        self.vmm_irq = t.irq[side];
        if t.off[side] != 0 {
            self.meter.vmm_off_drained.set(t.off[side]);
        }
    }

    /// [`Recorder::carry_to_vmm`] of side 1 of a quiet drain (at the start, at a park's end),
    /// whose run-queue wait is counted in `records_preempted` as a loud drain's is, and whose
    /// lost records in `records_lost` (what it carries may then be short).
    pub(super) fn carry_quiet(&mut self, t: &Tally) {
        self.carry_to_vmm(t, 1);
        if t.preempted[1] != 0 {
            self.meter.records_preempted.add(t.preempted[1]);
        }
        if t.lost {
            self.meter.records_lost.add(1);
        }
    }

    /// Counts what a drain found and publishes the ring position for readers' peeks (only
    /// when it moved). Called inside a write section.
    #[inline]
    pub(super) fn note_records(&mut self, t: &Tally, sides: std::ops::Range<usize>) {
        let m = &*self.meter;
        if t.episodes != 0 {
            m.records_episodes.add(t.episodes);
            let preempted: u64 = t.preempted[sides].iter().sum();
            if preempted != 0 {
                m.records_preempted.add(preempted);
            }
        }
        if t.lost {
            m.records_lost.add(1);
        }
        self.publish_ring();
    }

    #[inline]
    pub(super) fn publish_ring(&mut self) {
        let Some(ring) = &self.ring else {
            return;
        };
        let (tail, pairing) = ring.position();
        if tail == self.published_tail {
            return;
        }
        self.published_tail = tail;
        let m = &*self.meter;
        m.ring_tail.set(tail);
        let (out, preempted) = pairing.pending().unwrap_or((0, false));
        m.ring_out.set(out);
        m.ring_out_preempted.set(u64::from(preempted));
    }
}
