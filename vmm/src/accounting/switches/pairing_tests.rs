//! The pairing of KVM's and the interrupt tracepoints' records, on synthetic streams.

use super::*;

const NPF: ExitCode = ExitCode {
    isa: 2,
    code: 0x400,
};
const IO: ExitCode = ExitCode { isa: 2, code: 0x7b };
const LOCAL_TIMER: u8 = 1;
const SOFTIRQ_TIMER: u8 = FIRST_SOFTIRQ + 1;

fn entry(time: u64) -> Record {
    Record::KvmEntry { time }
}

fn exit(time: u64, code: ExitCode) -> Record {
    Record::KvmExit { time, code }
}

fn irq(time: u64, kind: u8) -> Record {
    Record::IrqEnter { time, kind }
}

fn irq_end(time: u64) -> Record {
    Record::IrqExit { time }
}

/// What a sink was given.
#[derive(Debug, Default)]
struct Seen {
    exits: Vec<(ExitCode, u64)>,
    irqs: Vec<u8>,
}

impl TraceSink for Seen {
    fn kvm_exit(&mut self, code: ExitCode, ns: u64) {
        self.exits.push((code, ns));
    }
    fn interrupt(&mut self, kind: u8) {
        self.irqs.push(kind);
    }
}

/// Feeds `records` as one KVM_RUN entered at `bounds[0]` and left at `bounds[1]` (for a
/// signal: `intr`), drained once after it.
fn run_to(p: &mut Pairing, bounds: Bounds, intr: bool, records: &[Record]) -> (Tally, Seen) {
    let mut t = Tally::default();
    let mut seen = Seen::default();
    for r in records {
        p.feed_to(*r, bounds, &mut t, &mut seen);
    }
    p.end_run(&mut t, bounds[1], intr, &mut seen);
    (t, seen)
}

/// [`run_to`] of a run that returned for its last exit (MMIO, port I/O, ...).
fn run(p: &mut Pairing, bounds: Bounds, records: &[Record]) -> (Tally, Seen) {
    run_to(p, bounds, false, records)
}

#[test]
fn a_run_splits_into_guest_mode_in_kernel_exits_and_the_exit_to_userspace() {
    // KVM_RUN from 50 to 400: entry at 100, an NPF handled in the kernel (200..250), then an
    // I/O exit at 300 that returned to userspace.
    let mut p = Pairing::default();
    let (t, seen) = run(
        &mut p,
        [50, 400],
        &[entry(100), exit(200, NPF), entry(250), exit(300, IO)],
    );
    assert_eq!(t.guest, [0, 150, 0]);
    assert_eq!((t.kvm_entries, t.kvm_exits, t.kvm_exit_ns), (2, 1, 50));
    assert_eq!(t.kvm_to_user, 1, "the I/O exit reached userspace");
    assert_eq!(seen.exits, vec![(NPF, 50)]);
    assert!(!t.lost, "{t:?}");
    assert_eq!(p, Pairing::default(), "nothing stays open after the run");
}

#[test]
fn an_off_cpu_episode_between_exit_and_entry_is_not_handling_time() {
    let mut p = Pairing::default();
    let (t, seen) = run(
        &mut p,
        [0, 1000],
        &[
            entry(100),
            exit(200, NPF),
            Record::Out {
                time: 220,
                preempted: true,
            },
            Record::In { time: 270 },
            entry(300),
            exit(400, IO),
        ],
    );
    assert_eq!(
        seen.exits,
        vec![(NPF, 50)],
        "100 ns less the 50 off the CPU"
    );
    assert_eq!((t.off[1], t.preempted[1], t.episodes), (50, 50, 1));
    assert_eq!(t.guest[1], 200);
    assert!(!t.lost);
}

#[test]
fn an_interrupt_inside_exit_handling_is_interrupted_time_not_kvm_time() {
    let mut p = Pairing::default();
    let (t, seen) = run(
        &mut p,
        [0, 1000],
        &[
            entry(100),
            exit(200, NPF),
            irq(210, LOCAL_TIMER),
            irq_end(230),
            // The softirqs run as the hard interrupt returns; a hard one nests inside.
            irq(231, SOFTIRQ_TIMER),
            irq(240, LOCAL_TIMER),
            irq_end(245),
            irq_end(251),
            entry(300),
            exit(350, IO),
        ],
    );
    assert_eq!(t.irq, [0, 20 + 20, 0], "the outermost interrupts' spans");
    assert_eq!(t.interrupts, 3);
    assert_eq!(seen.irqs, vec![LOCAL_TIMER, SOFTIRQ_TIMER, LOCAL_TIMER]);
    assert_eq!(seen.exits, vec![(NPF, 100 - 40)]);
    assert_eq!(t.guest[1], 100 + 50);
    assert!(!t.lost);
}

#[test]
fn interrupts_are_counted_on_the_side_they_began_on() {
    // A run from 100 to 200; an interrupt before it (the VMM's handling before the entry
    // stamp) and one after the exit stamp (the handling that follows).
    let mut p = Pairing::default();
    let mut t = Tally::default();
    for r in [
        irq(50, LOCAL_TIMER),
        irq_end(60),
        entry(120),
        exit(150, IO),
        irq(250, LOCAL_TIMER),
        irq_end(253),
    ] {
        p.feed_to(r, [100, 200], &mut t, &mut ());
    }
    p.end_run(&mut t, 200, false, &mut ());
    assert_eq!(t.irq, [10, 0, 3]);
    assert_eq!(t.guest, [0, 30, 0]);
}

#[test]
fn an_interrupt_in_guest_mode_is_not_guest_time() {
    // Where an interrupt is recorded between an entry and its exit (not on VMX/SVM, where it
    // exits the guest first), guest mode does not hold it.
    let mut p = Pairing::default();
    let (t, _) = run(
        &mut p,
        [0, 1000],
        &[
            entry(100),
            irq(150, LOCAL_TIMER),
            irq_end(170),
            exit(300, IO),
        ],
    );
    assert_eq!(t.guest[1], 180);
    assert_eq!(t.irq[1], 20);
}

#[test]
fn an_exit_without_its_entry_after_a_ring_overflow_is_lost_but_still_paired_onwards() {
    let mut p = Pairing::default();
    let (t, seen) = run(
        &mut p,
        [0, 1000],
        &[
            entry(100),
            Record::Lost,
            exit(500, NPF),
            exit(520, NPF),
            entry(600),
            exit(700, IO),
        ],
    );
    assert!(t.lost, "a loss marker and an exit without entry: {t:?}");
    // The exit at 520 has no entry before it (one was lost after 500); it completes at the
    // entry at 600.
    assert_eq!(seen.exits, vec![(NPF, 80)]);
    assert_eq!(t.kvm_to_user, 1);
}

#[test]
fn a_run_that_returned_for_a_signal_ends_with_an_exit_kvm_handled_itself() {
    // CPUID exits at 200 and 300; KVM emulated the second, found a kick pending and returned
    // at 340 instead of entering again: both were in-kernel exits, none reached userspace.
    let cpuid = ExitCode { isa: 2, code: 0x72 };
    let mut p = Pairing::default();
    let (t, seen) = run_to(
        &mut p,
        [50, 340],
        true,
        &[entry(100), exit(200, cpuid), entry(230), exit(300, cpuid)],
    );
    assert_eq!(seen.exits, vec![(cpuid, 30), (cpuid, 40)]);
    assert_eq!((t.kvm_exits, t.kvm_to_user), (2, 0));
    // The same run ended by an MMIO exit forwards its last exit.
    let (t, _) = run_to(
        &mut p,
        [50, 340],
        false,
        &[entry(100), exit(200, cpuid), entry(230), exit(300, IO)],
    );
    assert_eq!((t.kvm_exits, t.kvm_to_user), (1, 1));
}

#[test]
fn a_lost_records_marker_flags_the_tally() {
    let mut p = Pairing::default();
    let (t, _) = run(&mut p, ALL_ON_SIDE_1, &[Record::Lost]);
    assert!(t.lost);
}

#[test]
fn what_cannot_be_open_in_userspace_flags_the_run_and_is_cleared() {
    for open in [
        vec![entry(10)],
        vec![irq(10, LOCAL_TIMER)],
        vec![irq_end(10)],
        vec![entry(10), entry(20)],
    ] {
        let mut p = Pairing::default();
        let (t, _) = run(&mut p, ALL_ON_SIDE_1, &open);
        assert!(t.lost, "{open:?}");
        assert_eq!(p.guest_since(), None);
        assert_eq!(p.irq_since(), None);
    }
}

#[test]
fn a_run_that_never_entered_the_guest_has_no_exit_to_userspace() {
    // A kick before entry: KVM_RUN returns at once, no VM exit.
    let mut p = Pairing::default();
    let (t, _) = run(&mut p, [0, 10], &[]);
    assert_eq!((t.kvm_entries, t.kvm_to_user), (0, 0));
    assert!(!t.lost);
}

#[test]
fn exits_open_at_a_drain_complete_at_the_next() {
    // A reader's look in the middle of a run: guest mode and an interrupt still open.
    let mut p = Pairing::default();
    let mut t = Tally::default();
    for r in [entry(100), exit(200, NPF), irq(210, LOCAL_TIMER)] {
        p.feed(r, ALL_ON_SIDE_1, &mut t);
    }
    assert_eq!(p.irq_since(), Some(210));
    assert_eq!(p.guest_since(), None);
    let mut rest = Tally::default();
    let mut seen = Seen::default();
    for r in [irq_end(215), entry(260)] {
        p.feed_to(r, ALL_ON_SIDE_1, &mut rest, &mut seen);
    }
    assert_eq!(p.guest_since(), Some(260));
    assert_eq!(seen.exits, vec![(NPF, 55)]);
    let peek = Pairing::with_open(None, 260, 0);
    assert_eq!(peek.guest_since(), Some(260));
}

/// A sample record's words: header, time, then the raw data (its u32 size first).
fn sample(time: u64, raw: &[u8]) -> Vec<u64> {
    let mut bytes = Vec::new();
    bytes.extend_from_slice(&time.to_le_bytes());
    bytes.extend_from_slice(&(raw.len() as u32).to_le_bytes());
    bytes.extend_from_slice(raw);
    while (bytes.len() + 8) % 8 != 0 {
        bytes.push(0);
    }
    let size = (bytes.len() + 8) as u64;
    let mut words = vec![9 | size << 48];
    words.extend(
        bytes
            .chunks(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap())),
    );
    words
}

fn layout() -> Layout {
    let mut l = Layout {
        exit_reason: 8,
        isa: 24,
        vec: 8,
        ..Layout::default()
    };
    l.push(103, EventKind::KvmExit);
    l.push(115, EventKind::KvmEntry);
    l.push(223, EventKind::SoftirqEnter);
    l.push(222, EventKind::IrqExit);
    l.push(77, EventKind::IrqEnter(LOCAL_TIMER));
    l
}

fn raw(id: u16, fields: &[(usize, u32)], len: usize) -> Vec<u8> {
    let mut r = vec![0u8; len];
    r[..2].copy_from_slice(&id.to_le_bytes());
    for &(off, v) in fields {
        r[off..off + 4].copy_from_slice(&v.to_le_bytes());
    }
    r
}

#[test]
fn tracepoint_samples_decode_by_their_id_and_fields() {
    let l = layout();
    let dec = |w: Vec<u64>| decode(&l, move |i| w[i as usize]);
    // kvm_exit as SVM prints it: exit_reason at 8, isa at 24, raw data of 72 bytes.
    let (r, size) = dec(sample(5, &raw(103, &[(8, 0x400), (24, 2)], 72)));
    assert_eq!(r, exit(5, NPF));
    assert_eq!(size, 8 + 8 + 4 + 72 + 4);
    // VMX: the flags above the basic reason are dropped.
    let (r, _) = dec(sample(6, &raw(103, &[(8, 0x8000_0030), (24, 1)], 72)));
    assert_eq!(r, exit(6, ExitCode { isa: 1, code: 0x30 }));
    let (r, _) = dec(sample(7, &raw(115, &[], 40)));
    assert_eq!(r, entry(7));
    let (r, _) = dec(sample(8, &raw(223, &[(8, 1)], 12)));
    assert_eq!(r, irq(8, SOFTIRQ_TIMER));
    let (r, _) = dec(sample(9, &raw(223, &[(8, 77)], 12)));
    assert_eq!(
        r,
        irq(9, FIRST_SOFTIRQ + 10),
        "an unknown vector is softirq_other"
    );
    let (r, _) = dec(sample(10, &raw(222, &[(8, 1)], 12)));
    assert_eq!(r, irq_end(10));
    let (r, _) = dec(sample(11, &raw(77, &[], 12)));
    assert_eq!(r, irq(11, LOCAL_TIMER));
    // An id the layout does not know, and raw data too short for its fields.
    let (r, _) = dec(sample(12, &raw(999, &[], 12)));
    assert_eq!(r, Record::Other);
    let (r, _) = dec(sample(13, &raw(103, &[(8, 0x400)], 20)));
    assert_eq!(r, Record::Other);
}

#[test]
fn a_sample_whose_raw_size_overruns_its_record_is_not_read() {
    let l = layout();
    let mut w = sample(5, &raw(103, &[(8, 0x400), (24, 2)], 72));
    // Claim 200 bytes of raw data in a record of 96.
    w[2] = (w[2] & !0xffff_ffff) | 200;
    let (r, _) = decode(&l, move |i| w.get(i as usize).copied().unwrap_or(0));
    assert_eq!(r, Record::Other);
}

#[test]
fn irq_kind_names_cover_every_softirq_vector() {
    assert_eq!(IRQ_KIND_NAMES.len(), IRQ_KINDS);
    assert_eq!(IRQ_KIND_NAMES[usize::from(FIRST_SOFTIRQ)], "softirq_hi");
    assert_eq!(IRQ_KIND_NAMES[usize::from(SOFTIRQ_TIMER)], "softirq_timer");
    assert_eq!(IRQ_KIND_NAMES[IRQ_KINDS - 1], "softirq_other");
}

/// Handoffs seen by a sink.
#[derive(Debug, Default)]
struct Handoffs(Vec<(u64, u32)>);

impl TraceSink for Handoffs {
    fn kvm_exit(&mut self, _: ExitCode, _: u64) {}
    fn interrupt(&mut self, _: u8) {}
    fn handoff(&mut self, time: u64, next: u32) {
        self.0.push((time, next));
    }
}

#[test]
fn sched_switch_samples_are_handoffs_to_the_next_thread_and_go_to_the_sink() {
    // sched_switch as this kernel prints it: next_pid at 56 of 64 bytes of raw data.
    let mut l = layout();
    l.next_pid = 56;
    l.push(372, EventKind::Switch);
    let dec = |w: Vec<u64>| decode(&l, move |i| w[i as usize]).0;
    let r = dec(sample(40, &raw(372, &[(56, 4321)], 64)));
    assert_eq!(
        r,
        Record::Handoff {
            time: 40,
            next: 4321
        }
    );
    // Raw data that stops before next_pid is not read.
    assert_eq!(dec(sample(41, &raw(372, &[], 58))), Record::Other);
    // Fed: a handoff to a thread reaches the sink and changes no figure; one to the idle
    // task (0) does not reach it; the switch-out after it pairs as before.
    let mut p = Pairing::default();
    let mut t = Tally::default();
    let mut sink = Handoffs::default();
    for r in [
        Record::Handoff { time: 100, next: 7 },
        Record::Out {
            time: 101,
            preempted: true,
        },
        Record::Handoff { time: 150, next: 0 },
        Record::In { time: 200 },
    ] {
        p.feed_to(r, ALL_ON_SIDE_1, &mut t, &mut sink);
    }
    assert_eq!(sink.0, vec![(100, 7)]);
    assert_eq!((t.off[1], t.preempted[1], t.episodes), (99, 99, 1));
    assert!(!t.lost, "{t:?}");
}
