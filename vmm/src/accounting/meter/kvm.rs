//! The recorder's sink for what the tracepoints in its ring complete ([`TraceAcc`]): each
//! in-kernel exit to its reason's slot (count, handling time, histogram) and each interrupt
//! to its kind's count, held on the vCPU thread until the next write section publishes them
//! (`Recorder::on_exit` and the other boundaries). Slots are given to reasons in the order the
//! guest first causes them; the last slot takes every reason that came after the others were
//! taken. Each completed off-CPU episode goes straight to the meter's episode log. No
//! allocation, lock or system call: the arrays are fixed, the histograms allocated when the
//! tracepoints were opened.

use std::sync::Arc;

use super::super::episodes::{Episode, EpisodeKind};
use super::super::switches::pairing::{ExitCode, TraceSink, IRQ_KINDS};
use super::{VcpuMeter, KVM_OTHER, KVM_SLOTS};

/// Histogram records held before they are applied (one page touch per batch).
const PENDING: usize = 64;

/// What drains completed since the last publication.
#[derive(Debug)]
pub struct TraceAcc {
    meter: Arc<VcpuMeter>,
    /// The reason of each slot (0: unused), as the shared `KvmExits::code` will say.
    codes: [u64; KVM_SLOTS],
    used: usize,
    count: [u64; KVM_SLOTS],
    ns: [u64; KVM_SLOTS],
    irqs: [u64; IRQ_KINDS],
    dirty: bool,
    hist: [(u8, u64); PENDING],
    hist_len: usize,
}

/// A reason's slot code.
pub fn encode(c: ExitCode) -> u64 {
    1 << 40 | u64::from(c.isa) << 32 | u64::from(c.code)
}

/// The reason of a slot code (None: the shared last slot).
pub fn decode(v: u64) -> Option<ExitCode> {
    (v != KVM_OTHER).then_some(ExitCode {
        isa: (v >> 32) as u8,
        code: v as u32,
    })
}

impl TraceAcc {
    /// An empty accumulator for `meter`.
    pub fn new(meter: Arc<VcpuMeter>) -> TraceAcc {
        TraceAcc {
            meter,
            codes: [0; KVM_SLOTS],
            used: 0,
            count: [0; KVM_SLOTS],
            ns: [0; KVM_SLOTS],
            irqs: [0; IRQ_KINDS],
            dirty: false,
            hist: [(0, 0); PENDING],
            hist_len: 0,
        }
    }

    fn slot(&mut self, c: ExitCode) -> usize {
        let code = encode(c);
        if let Some(i) = self.codes[..self.used].iter().position(|&k| k == code) {
            return i;
        }
        if self.used < KVM_SLOTS - 1 {
            self.codes[self.used] = code;
            self.used += 1;
            return self.used - 1;
        }
        self.codes[KVM_SLOTS - 1] = KVM_OTHER;
        KVM_SLOTS - 1
    }

    /// Adds what was held to the shared counters (inside a write section of the meter). Only
    /// the test of the flag is inlined: the exits that held nothing (every exit at level off
    /// and basic) then touch no code page of their own for it.
    #[inline]
    pub fn publish(&mut self) {
        if self.dirty {
            self.publish_held();
        }
    }

    /// [`Self::publish`] of what is held.
    #[inline(never)]
    fn publish_held(&mut self) {
        self.dirty = false;
        let m = &*self.meter;
        for (k, n) in self.irqs.iter_mut().enumerate() {
            if *n != 0 {
                m.interrupts[k].add(std::mem::take(n));
            }
        }
        let Some(k) = m.kvm_exits.get() else {
            self.count = [0; KVM_SLOTS];
            self.ns = [0; KVM_SLOTS];
            return;
        };
        for i in 0..KVM_SLOTS {
            if self.count[i] != 0 {
                k.code[i].set(self.codes[i]);
                k.count[i].add(std::mem::take(&mut self.count[i]));
                k.ns[i].add(std::mem::take(&mut self.ns[i]));
            }
        }
    }

    /// Applies the histogram records held.
    pub fn flush(&mut self) {
        if let Some(k) = self.meter.kvm_exits.get() {
            for &(slot, v) in &self.hist[..self.hist_len] {
                k.hist[usize::from(slot)].record(v);
            }
        }
        self.hist_len = 0;
    }

    /// Drops the histogram records held (a reset came in: they belong before it).
    pub fn drop_pending(&mut self) {
        self.hist_len = 0;
    }
}

impl TraceSink for TraceAcc {
    #[inline]
    fn kvm_exit(&mut self, code: ExitCode, ns: u64) {
        let s = self.slot(code);
        self.count[s] += 1;
        self.ns[s] += ns;
        self.dirty = true;
        self.hist[self.hist_len] = (s as u8, ns);
        self.hist_len += 1;
        if self.hist_len == PENDING {
            self.flush();
        }
    }

    #[inline]
    fn interrupt(&mut self, kind: u8) {
        if let Some(n) = self.irqs.get_mut(usize::from(kind)) {
            *n += 1;
            self.dirty = true;
        }
    }

    /// Each completed off-CPU episode goes to the meter's episode log at once (a few stores),
    /// for the pressure tracker to place in time.
    #[inline]
    fn episode(&mut self, out: u64, back: u64, preempted: bool, side: usize) {
        let kind = match (preempted, side) {
            (true, _) => EpisodeKind::Preempted,
            (false, 1) => EpisodeKind::SleptInRun,
            (false, _) => EpisodeKind::Slept,
        };
        self.meter.episodes.push(Episode {
            start: out,
            end: back,
            kind,
            wait: 0,
        });
    }

    /// Each handoff too (`wait` holds the next thread's id).
    #[inline]
    fn handoff(&mut self, time: u64, next: u32) {
        self.meter.episodes.push(Episode::handoff(time, next));
    }
}
