//! The records of a vCPU thread's perf ring, decoded, and paired into what level full splits a
//! KVM_RUN with: off-CPU episodes (context-switch records), guest-mode segments and in-kernel
//! exits (KVM's `kvm_entry`/`kvm_exit` tracepoints) and host interrupts (the irq tracepoints).
//! Pure functions of the record stream, so the pairing is unit-tested on synthetic streams.
//!
//! Data flow: the ring's walk decodes each record ([`decode`], with the tracepoints' ids and
//! field offsets in a [`Layout`]) and feeds it to a [`Pairing`], whose state survives across
//! drains (an episode or an exit handling open at a drain completes at the next). What
//! completes is summed into a [`Tally`] on the side of the drain's bounds it began on; each
//! completed in-kernel exit and each interrupt also goes to a [`TraceSink`] (per reason,
//! per kind, histograms), which the vCPU thread's recorder implements. The run that a drain
//! at a KVM_RUN exit closes ends with [`Pairing::end_run`]: an exit still open then is the
//! one KVM forwarded to userspace (MMIO, port I/O, ...), not an in-kernel one, unless the run
//! ended for a signal (`intr`): then KVM handled that exit itself and found the signal after.
//!
//! Time on a CPU inside a KVM_RUN is then guest mode (entry to exit), interrupts (outermost
//! entry to exit), and the rest, which is KVM's (the ioctl's way in, each exit's handling, the
//! way out). All records carry the same clock (`use_clockid` = CLOCK_MONOTONIC) and come from
//! one thread, so they are in time order.

/// A VM exit's hardware reason as `kvm_exit` gives it: the ISA (1 VMX, 2 SVM) and the code
/// (VMX: the basic exit reason, low 16 bits; SVM: the exit code).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ExitCode {
    /// `KVM_ISA_VMX` (1) or `KVM_ISA_SVM` (2); anything else is kept as given.
    pub isa: u8,
    /// The exit code.
    pub code: u32,
}

/// Number of interrupt kinds counted: [`IRQ_KIND_NAMES`].
pub const IRQ_KINDS: usize = 16;

/// Interrupt kinds by index: hard interrupts (a device's handler through
/// `irq:irq_handler_entry`, and x86's system vectors through `irq_vectors:*_entry`; not
/// `irq_work`, whose exit perf refuses to sample: perf's own wakeups are irq work), then
/// softirqs by vector in Linux's order (`irq:softirq_entry`), then a softirq vector beyond
/// those.
pub const IRQ_KIND_NAMES: [&str; IRQ_KINDS] = [
    "device",
    "local_timer",
    "reschedule",
    "call_function",
    "call_function_single",
    "softirq_hi",
    "softirq_timer",
    "softirq_net_tx",
    "softirq_net_rx",
    "softirq_block",
    "softirq_irq_poll",
    "softirq_tasklet",
    "softirq_sched",
    "softirq_hrtimer",
    "softirq_rcu",
    "softirq_other",
];

/// Index in [`IRQ_KIND_NAMES`] of the first softirq.
pub const FIRST_SOFTIRQ: u8 = 5;

/// One decoded record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Record {
    /// The thread left its CPU at `time`; `preempted`: it was still runnable.
    Out {
        /// CLOCK_MONOTONIC ns.
        time: u64,
        /// Preempted (runnable) rather than blocked.
        preempted: bool,
    },
    /// The thread got a CPU back at `time`.
    In {
        /// CLOCK_MONOTONIC ns.
        time: u64,
    },
    /// KVM entered the guest (`kvm:kvm_entry`).
    KvmEntry {
        /// CLOCK_MONOTONIC ns.
        time: u64,
    },
    /// The guest exited to KVM (`kvm:kvm_exit`).
    KvmExit {
        /// CLOCK_MONOTONIC ns.
        time: u64,
        /// Its hardware reason.
        code: ExitCode,
    },
    /// A host interrupt began on the thread's CPU while it was current.
    IrqEnter {
        /// CLOCK_MONOTONIC ns.
        time: u64,
        /// Index in [`IRQ_KIND_NAMES`].
        kind: u8,
    },
    /// A host interrupt ended.
    IrqExit {
        /// CLOCK_MONOTONIC ns.
        time: u64,
    },
    /// The kernel picked thread `next` to run on the thread's CPU in its place
    /// (`sched:sched_switch`, just before the switch-out record): the instant `next`'s wait
    /// for that CPU ended.
    Handoff {
        /// CLOCK_MONOTONIC ns.
        time: u64,
        /// The next thread's id (0: the CPU goes idle).
        next: u32,
    },
    /// The kernel dropped records.
    Lost,
    /// Anything else (skipped).
    Other,
}

/// What a decoded tracepoint sample is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    /// `kvm:kvm_entry`.
    KvmEntry,
    /// `kvm:kvm_exit`.
    KvmExit,
    /// An interrupt's entry, of this kind (index in [`IRQ_KIND_NAMES`]; softirqs are decoded
    /// from their vector).
    IrqEnter(u8),
    /// `irq:softirq_entry` (its kind comes from the vector field).
    SoftirqEnter,
    /// An interrupt's exit (hard or soft).
    IrqExit,
    /// `sched:sched_switch`: the thread leaves its CPU and the kernel picked the next one.
    Switch,
}

/// Most tracepoints a ring carries.
pub const MAX_EVENTS: usize = 16;

/// How tracepoint samples in a ring are told apart and read: each event's id (the first field
/// of every raw record, `common_type`) and the offsets of the fields read, from tracefs'
/// `format` files. Samples are `PERF_SAMPLE_TIME | PERF_SAMPLE_RAW`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Layout {
    /// (id, kind) of each event, `len` of them.
    pub events: [(u16, Option<EventKind>); MAX_EVENTS],
    /// Events in use.
    pub len: usize,
    /// Byte offsets in `kvm_exit`'s raw data of `exit_reason` and `isa` (u32 each).
    pub exit_reason: u16,
    /// See [`Layout::exit_reason`].
    pub isa: u16,
    /// Byte offset in `softirq_entry`'s raw data of `vec` (u32).
    pub vec: u16,
    /// Byte offset in `sched_switch`'s raw data of `next_pid` (u32).
    pub next_pid: u16,
}

impl Layout {
    /// Adds an event (ignored beyond [`MAX_EVENTS`]).
    pub fn push(&mut self, id: u16, kind: EventKind) {
        if self.len < MAX_EVENTS {
            self.events[self.len] = (id, Some(kind));
            self.len += 1;
        }
    }

    fn kind_of(&self, id: u16) -> Option<EventKind> {
        self.events[..self.len]
            .iter()
            .find(|(i, _)| *i == id)
            .and_then(|(_, k)| *k)
    }
}

const PERF_RECORD_LOST: u32 = 2;
const PERF_RECORD_SAMPLE: u32 = 9;
const PERF_RECORD_SWITCH: u32 = 14;
/// `PERF_RECORD_MISC_SWITCH_OUT`.
pub const MISC_SWITCH_OUT: u16 = 1 << 13;
/// `PERF_RECORD_MISC_SWITCH_OUT_PREEMPT`.
pub const MISC_SWITCH_OUT_PREEMPT: u16 = 1 << 14;
/// A sample's raw data starts at this byte of the record: header, time, then its u32 size.
const RAW_AT: u64 = 20;

/// The `n`-byte little-endian value at byte `at` of a record whose i-th u64 is `word(i)`.
fn bytes_at(word: &impl Fn(u64) -> u64, at: u64, n: u64) -> u64 {
    let (w, shift) = (at / 8, (at % 8) * 8);
    let lo = word(w) >> shift;
    let v = if shift + n * 8 > 64 {
        lo | (word(w + 1) << (64 - shift))
    } else {
        lo
    };
    if n >= 8 {
        v
    } else {
        v & ((1u64 << (n * 8)) - 1)
    }
}

/// Decodes a record from its first words (`word(i)` is the record's i-th u64; it is read only
/// inside the record's size). Returns the record and its size in bytes.
pub fn decode(layout: &Layout, word: impl Fn(u64) -> u64) -> (Record, u64) {
    let header = word(0);
    let kind = header as u32;
    let misc = (header >> 32) as u16;
    let size = header >> 48;
    let r = match kind {
        PERF_RECORD_SWITCH if size >= 16 => {
            let time = word(1);
            if misc & MISC_SWITCH_OUT != 0 {
                Record::Out {
                    time,
                    preempted: misc & MISC_SWITCH_OUT_PREEMPT != 0,
                }
            } else {
                Record::In { time }
            }
        }
        PERF_RECORD_LOST => Record::Lost,
        PERF_RECORD_SAMPLE if size >= RAW_AT + 4 => decode_sample(layout, &word, size),
        _ => Record::Other,
    };
    (r, size)
}

/// A tracepoint sample: time at byte 8, the raw data's size at 16, the raw data at 20.
fn decode_sample(layout: &Layout, word: &impl Fn(u64) -> u64, size: u64) -> Record {
    let time = word(1);
    let raw_size = bytes_at(word, 16, 4);
    let raw_end = RAW_AT + raw_size;
    if raw_size < 2 || raw_end > size {
        return Record::Other;
    }
    // Reads `n` bytes at `off` in the raw data, if they are inside it.
    let field = |off: u16, n: u64| {
        let at = RAW_AT + u64::from(off);
        (at + n <= raw_end).then(|| bytes_at(word, at, n))
    };
    let Some(kind) = layout.kind_of(bytes_at(word, RAW_AT, 2) as u16) else {
        return Record::Other;
    };
    match kind {
        EventKind::KvmEntry => Record::KvmEntry { time },
        EventKind::KvmExit => match (field(layout.exit_reason, 4), field(layout.isa, 4)) {
            (Some(reason), Some(isa)) => {
                let isa = isa.min(255) as u8;
                // VMX: the basic exit reason is the low 16 bits (the rest are flags).
                let code = if isa == 1 { reason & 0xffff } else { reason } as u32;
                Record::KvmExit {
                    time,
                    code: ExitCode { isa, code },
                }
            }
            _ => Record::Other,
        },
        EventKind::IrqEnter(k) => Record::IrqEnter { time, kind: k },
        EventKind::SoftirqEnter => match field(layout.vec, 4) {
            Some(v) => Record::IrqEnter {
                time,
                kind: FIRST_SOFTIRQ + v.min(10) as u8,
            },
            None => Record::Other,
        },
        EventKind::IrqExit => Record::IrqExit { time },
        EventKind::Switch => match field(layout.next_pid, 4) {
            Some(next) => Record::Handoff {
                time,
                next: next as u32,
            },
            None => Record::Other,
        },
    }
}

/// Where a drain splits what it completes: before `bounds[0]` (side 0), from there to before
/// `bounds[1]` (side 1), from `bounds[1]` on (side 2). At a KVM_RUN exit the bounds are the
/// run's entry and exit stamps: side 0 is an interval measured otherwise, side 1 the run, side
/// 2 the VMM's handling that follows the exit stamp. An off-CPU episode is cut at the bounds
/// and each part goes to its side ([`split`]); guest-mode time and interrupts go whole to the
/// side they began on. `bounds[0] <= bounds[1]`.
pub type Bounds = [u64; 2];

/// Bounds that put everything on side 1 (a reader's look, the tests).
pub const ALL_ON_SIDE_1: Bounds = [0, u64::MAX];

fn side(t: u64, bounds: Bounds) -> usize {
    usize::from(t >= bounds[0]) + usize::from(t >= bounds[1])
}

/// The parts of the off-CPU episode from `out` to `back` on each side of `bounds`. Where the
/// bounds are clock readings taken on the thread itself in the kernel's clock, no episode
/// straddles one (the thread is on a CPU when it reads the clock), so this is the whole
/// episode on the side it began on. The vCPU thread's stamps are its stamp clock's
/// (`crate::stamp_clock`), a few tens of ns off the kernel's clock, more while a change of
/// the clock's rate is not yet caught: cut at the bounds, an episode that the error makes
/// straddle a stamp moves by that error, not whole to the wrong side (a preemption just after
/// an exit stamp, taken whole from a microsecond run, would be a whole run-queue wait counted
/// as on-CPU time in the handling).
pub fn split(out: u64, back: u64, bounds: Bounds) -> [u64; 3] {
    let part = |from: u64, to: u64| back.min(to).saturating_sub(out.max(from));
    [
        part(0, bounds[0]),
        part(bounds[0], bounds[1]),
        part(bounds[1], u64::MAX),
    ]
}

/// What a drain found, on each side of its [`Bounds`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tally {
    /// Off-CPU ns of episodes that began on each side.
    pub off: [u64; 3],
    /// The part of `off` in which the thread was preempted (runnable).
    pub preempted: [u64; 3],
    /// Completed off-CPU episodes.
    pub episodes: u64,
    /// Guest-mode ns (kvm_entry to kvm_exit, less interrupts inside) by the side its entry
    /// fell on.
    pub guest: [u64; 3],
    /// Interrupt ns (outermost entry to exit) by the side it began on.
    pub irq: [u64; 3],
    /// `kvm_entry` records seen.
    pub kvm_entries: u64,
    /// In-kernel exits completed (a `kvm_exit` followed by a `kvm_entry`).
    pub kvm_exits: u64,
    /// Their handling time: on a CPU, less interrupts.
    pub kvm_exit_ns: u64,
    /// Exits that ended their KVM_RUN ([`Pairing::end_run`]) and that KVM forwarded to
    /// userspace.
    pub kvm_to_user: u64,
    /// Interrupts that began.
    pub interrupts: u64,
    /// Records may be missing: the ring was nearly full, the kernel reported a loss, or the
    /// records did not pair.
    pub lost: bool,
}

impl Tally {
    /// Adds `other` to this tally.
    pub fn add(&mut self, other: &Tally) {
        for side in 0..3 {
            self.off[side] += other.off[side];
            self.preempted[side] += other.preempted[side];
            self.guest[side] += other.guest[side];
            self.irq[side] += other.irq[side];
        }
        self.episodes += other.episodes;
        self.kvm_entries += other.kvm_entries;
        self.kvm_exits += other.kvm_exits;
        self.kvm_exit_ns += other.kvm_exit_ns;
        self.kvm_to_user += other.kvm_to_user;
        self.interrupts += other.interrupts;
        self.lost |= other.lost;
    }

    /// Off-CPU ns on every side.
    pub fn off_total(&self) -> u64 {
        self.off.iter().sum()
    }
}

/// Where completed in-kernel exits and interrupts go one by one (per reason, per kind,
/// histograms). `()` drops them (a reader's look).
pub trait TraceSink {
    /// An in-kernel exit of `code` took `ns` on a CPU (interrupts excluded).
    fn kvm_exit(&mut self, code: ExitCode, ns: u64);
    /// An interrupt of `kind` (index in [`IRQ_KIND_NAMES`]) began.
    fn interrupt(&mut self, kind: u8);
    /// An off-CPU episode from `out` to `back` completed; `preempted`: the thread was
    /// runnable; `side`: the side of the drain's bounds `out` fell on (1: inside the KVM_RUN
    /// the bounds frame). The default drops it.
    fn episode(&mut self, out: u64, back: u64, preempted: bool, side: usize) {
        let _ = (out, back, preempted, side);
    }
    /// At `time` the kernel picked thread `next` (not 0) to run on this thread's CPU in its
    /// place. The default drops it.
    fn handoff(&mut self, time: u64, next: u32) {
        let _ = (time, next);
    }
}

impl TraceSink for () {
    fn kvm_exit(&mut self, _: ExitCode, _: u64) {}
    fn interrupt(&mut self, _: u8) {}
}

/// An in-kernel exit whose handling is under way.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OpenExit {
    /// When the guest exited.
    pub time: u64,
    /// Why.
    pub code: ExitCode,
    /// Off-CPU ns inside it so far.
    pub off: u64,
    /// Interrupt ns inside it so far.
    pub irq: u64,
}

/// Interrupt nesting deeper than this is taken for lost exit records.
const MAX_IRQ_DEPTH: u8 = 8;

/// Pairs the records (the state survives across drains).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pairing {
    out: Option<(u64, bool)>,
    /// In guest mode since (a `kvm_entry` without its exit yet).
    guest_since: Option<u64>,
    /// Interrupt ns inside the guest-mode segment in progress.
    guest_irq: u64,
    exit: Option<OpenExit>,
    irq_depth: u8,
    irq_since: u64,
}

impl Pairing {
    /// Feeds one record; completed episodes go to `tally` on the side of `bounds` their
    /// switch-out fell on (in-kernel exits and interrupts are dropped from the sink).
    pub fn feed(&mut self, r: Record, bounds: Bounds, tally: &mut Tally) {
        self.feed_to(r, bounds, tally, &mut ());
    }

    /// [`Pairing::feed`], with completed in-kernel exits and interrupts also given to `sink`.
    pub fn feed_to(&mut self, r: Record, bounds: Bounds, t: &mut Tally, sink: &mut impl TraceSink) {
        match r {
            Record::Out { time, preempted } => {
                if self.out.is_some() || self.guest_since.is_some() || self.irq_depth != 0 {
                    // Two switch-outs, or one in guest mode or in an interrupt: records
                    // between them are missing.
                    t.lost = true;
                }
                self.out = Some((time, preempted));
            }
            Record::In { time } => match self.out.take() {
                Some((out, preempted)) => {
                    let d = time.saturating_sub(out);
                    sink.episode(out, time, preempted, side(out, bounds));
                    for (s, part) in split(out, time, bounds).into_iter().enumerate() {
                        t.off[s] += part;
                        if preempted {
                            t.preempted[s] += part;
                        }
                    }
                    t.episodes += 1;
                    if let Some(e) = &mut self.exit {
                        e.off += d;
                    }
                }
                None => t.lost = true,
            },
            Record::KvmEntry { time } => self.entry(time, t, sink),
            Record::KvmExit { time, code } => {
                match self.guest_since.take() {
                    Some(g) => {
                        let d = time.saturating_sub(g).saturating_sub(self.guest_irq);
                        t.guest[side(g, bounds)] += d;
                    }
                    // An exit without its entry: the entry was lost (or the records were
                    // turned on in guest mode, which a thread turning on its own cannot be).
                    None => t.lost = true,
                }
                if self.exit.is_some() {
                    t.lost = true;
                }
                self.guest_irq = 0;
                self.exit = Some(OpenExit {
                    time,
                    code,
                    off: 0,
                    irq: 0,
                });
            }
            Record::IrqEnter { time, kind } => {
                if self.irq_depth == 0 {
                    self.irq_since = time;
                }
                if self.irq_depth >= MAX_IRQ_DEPTH {
                    t.lost = true;
                } else {
                    self.irq_depth += 1;
                }
                t.interrupts += 1;
                sink.interrupt(kind);
            }
            Record::IrqExit { time } => self.irq_exit(time, bounds, t),
            Record::Handoff { time, next } if next != 0 => sink.handoff(time, next),
            Record::Handoff { .. } => {}
            Record::Lost => t.lost = true,
            Record::Other => {}
        }
    }

    fn entry(&mut self, time: u64, t: &mut Tally, sink: &mut impl TraceSink) {
        t.kvm_entries += 1;
        if self.guest_since.is_some() {
            t.lost = true;
        }
        if let Some(e) = self.exit.take() {
            let ns = time
                .saturating_sub(e.time)
                .saturating_sub(e.off)
                .saturating_sub(e.irq);
            t.kvm_exits += 1;
            t.kvm_exit_ns += ns;
            sink.kvm_exit(e.code, ns);
        }
        self.guest_since = Some(time);
        self.guest_irq = 0;
    }

    fn irq_exit(&mut self, time: u64, bounds: Bounds, t: &mut Tally) {
        if self.irq_depth == 0 {
            t.lost = true;
            return;
        }
        self.irq_depth -= 1;
        if self.irq_depth != 0 {
            return;
        }
        let d = time.saturating_sub(self.irq_since);
        t.irq[side(self.irq_since, bounds)] += d;
        if let Some(e) = &mut self.exit {
            e.irq += d;
        }
        if self.guest_since.is_some() {
            self.guest_irq += d;
        }
    }

    /// The KVM_RUN whose records were just fed returned to userspace at `end` (its exit
    /// stamp). An exit still open is the last VM exit of the run: KVM forwarded it to userspace
    /// (counted in `kvm_to_user`, not as an in-kernel exit), unless the run returned for a
    /// signal (`intr`: a kick, the ring's own wakeup), in which case KVM handled that exit in
    /// the kernel and then found the signal, and its handling ends at `end`. The thread is in
    /// userspace and on its CPU, so nothing else can be open: a guest-mode segment or an
    /// interrupt still open means records were lost.
    pub fn end_run(&mut self, t: &mut Tally, end: u64, intr: bool, sink: &mut impl TraceSink) {
        if let Some(e) = self.exit.take() {
            if intr {
                let ns = end
                    .saturating_sub(e.time)
                    .saturating_sub(e.off)
                    .saturating_sub(e.irq);
                t.kvm_exits += 1;
                t.kvm_exit_ns += ns;
                sink.kvm_exit(e.code, ns);
            } else {
                t.kvm_to_user += 1;
            }
        }
        if self.guest_since.take().is_some() || self.irq_depth != 0 {
            t.lost = true;
        }
        self.guest_irq = 0;
        self.irq_depth = 0;
    }

    /// A pairing state with `out` as its open switch-out.
    pub fn with_pending(out: Option<(u64, bool)>) -> Pairing {
        Pairing {
            out,
            ..Pairing::default()
        }
    }

    /// [`Pairing::with_pending`], also in guest mode since `guest_since`, and in an interrupt
    /// since `irq_since` (0: none of either).
    pub fn with_open(out: Option<(u64, bool)>, guest_since: u64, irq_since: u64) -> Pairing {
        Pairing {
            out,
            guest_since: (guest_since != 0).then_some(guest_since),
            irq_depth: u8::from(irq_since != 0),
            irq_since,
            ..Pairing::default()
        }
    }

    /// The switch-out not yet matched: (time, preempted).
    pub fn pending(&self) -> Option<(u64, bool)> {
        self.out
    }

    /// Since when the thread has been in guest mode, if it is (as far as the records go).
    pub fn guest_since(&self) -> Option<u64> {
        self.guest_since
    }

    /// Since when the thread has been in an interrupt, if it is.
    pub fn irq_since(&self) -> Option<u64> {
        (self.irq_depth != 0).then_some(self.irq_since)
    }

    /// Forgets everything open (after the records were disabled and enabled again).
    pub fn clear(&mut self) {
        *self = Pairing::default();
    }
}

#[cfg(test)]
#[path = "pairing_tests.rs"]
mod tests;
