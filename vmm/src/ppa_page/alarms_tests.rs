//! The alarm ring read as untrusted input: a well-formed ring read from its place, a writer
//! that laps the reader, a new agent, and every malformation of the header, each costing a
//! poll at most its cap.

use super::*;
use ppa_guest_abi::ppa_page::write_record;

const WORDS: usize = 16384 / 8;
const RING: u32 = 256;
const SLOTS: u32 = 8;

/// A 1.5 agent's section: header, agent record naming a ring of [`SLOTS`] at [`RING`].
fn section(pid: u32) -> Vec<u64> {
    let mut w = vec![0u64; WORDS];
    let h = GuestHeader {
        magic: GUEST_MAGIC,
        major: MAJOR,
        minor: 5,
        threads_offset: 4096,
        cpus_offset: 4096,
        ..Default::default()
    };
    let mut a = GuestAgent {
        magic: abi::AGENT_MAGIC,
        size: 192,
        pid,
        ..Default::default()
    };
    a.set_v15(Some((RING, GuestAlarms::bytes(SLOTS))), 0, 0);
    let r = GuestAlarms {
        magic: ALARMS_MAGIC,
        slots: SLOTS,
        record_size: 64,
        ..Default::default()
    };
    let base = w.as_mut_ptr().cast::<u8>();
    // SAFETY: the records lie inside `w`, owned and 8-aligned.
    unsafe {
        write_record(base.cast::<GuestHeader>(), &h);
        write_record(base.add(64).cast::<GuestAgent>(), &a);
        write_record(base.add(RING as usize).cast::<GuestAlarms>(), &r);
    }
    w
}

/// Writes alarms `from..=to` as the agent does: each slot, then the header's count.
fn raise(w: &mut [u64], from: u64, to: u64) {
    let base = w.as_mut_ptr().cast::<u8>();
    for n in from..=to {
        let mut comm = [0u8; COMM_LEN];
        comm[..4].copy_from_slice(b"spin");
        let a = GuestAlarm {
            kind: if n % 2 == 0 { 2 } else { 4 },
            number: n,
            tid: 40 + n as u32,
            cpu: 1,
            comm,
            value: 1000 * n,
            threshold: 500,
            guest_ns: n,
            ..Default::default()
        };
        let off = RING as usize + 128 + ((n - 1) % u64::from(SLOTS)) as usize * 64;
        // SAFETY: inside `w`, aligned.
        unsafe { write_record(base.add(off).cast::<GuestAlarm>(), &a) };
    }
    set_ring(w, |r| r.written = to);
}

fn set_ring(w: &mut [u64], f: impl FnOnce(&mut GuestAlarms)) {
    let base = w.as_mut_ptr().cast::<u8>();
    // SAFETY: the ring header is inside `w`, aligned; nothing else reads it meanwhile.
    unsafe {
        let p = base.add(RING as usize).cast::<GuestAlarms>();
        let mut r = *p;
        f(&mut r);
        write_record(p, &r);
    }
}

#[test]
fn alarms_are_read_in_order_once_each() {
    let mut w = section(7);
    let mut r = AlarmReader::default();
    let p = r.poll(&Section::of_words(&w), 32);
    assert_eq!(p, Poll::default(), "nothing written yet");
    raise(&mut w, 1, 3);
    let p = r.poll(&Section::of_words(&w), 32);
    let numbers: Vec<u64> = p.alarms.iter().map(|a| a.number).collect();
    assert_eq!(numbers, [1, 2, 3]);
    let a = &p.alarms[1];
    assert_eq!(
        (
            a.what.as_str(),
            a.tid,
            a.comm.as_str(),
            a.value,
            a.threshold
        ),
        ("slice", 42, "spin", 2000, 500)
    );
    // A CPU's alarm has no thread.
    assert_eq!(
        (
            p.alarms[0].what.as_str(),
            p.alarms[0].tid,
            p.alarms[0].comm.as_str()
        ),
        ("irq", 0, "")
    );
    assert!(
        r.poll(&Section::of_words(&w), 32).alarms.is_empty(),
        "taken once"
    );
    // The ring says where it is in the decoded view too.
    let (at, h) = locate(&Section::of_words(&w)).unwrap().unwrap();
    assert_eq!((at.offset, at.slots, h.written), (256, SLOTS, 3));
}

#[test]
fn a_writer_that_laps_the_reader_loses_the_oldest_and_a_cap_leaves_the_rest_for_later() {
    let mut w = section(7);
    let mut r = AlarmReader::default();
    raise(&mut w, 1, 20);
    // 20 written in a ring of 8: 12 lost, 13 to 20 left, 5 taken now (the cap), 3 after.
    let p = r.poll(&Section::of_words(&w), 5);
    assert_eq!(p.lost, 12);
    assert_eq!(
        p.alarms.iter().map(|a| a.number).collect::<Vec<_>>(),
        [13, 14, 15, 16, 17]
    );
    let p = r.poll(&Section::of_words(&w), 5);
    assert_eq!(
        p.alarms.iter().map(|a| a.number).collect::<Vec<_>>(),
        [18, 19, 20]
    );
    assert_eq!(p.lost, 0);
    // A slot rewritten by a later alarm than the one expected there: lost, not shown twice.
    raise(&mut w, 21, 29);
    set_ring(&mut w, |h| h.written = 21);
    let p = r.poll(&Section::of_words(&w), 5);
    assert!(p.alarms.is_empty() && p.lost == 1, "{p:?}");
}

#[test]
fn a_new_agent_numbers_from_one_again() {
    let mut w = section(7);
    let mut r = AlarmReader::default();
    raise(&mut w, 1, 6);
    assert_eq!(r.poll(&Section::of_words(&w), 32).alarms.len(), 6);
    let mut w = section(8);
    raise(&mut w, 1, 2);
    let p = r.poll(&Section::of_words(&w), 32);
    assert_eq!(
        p.alarms.iter().map(|a| a.number).collect::<Vec<_>>(),
        [1, 2]
    );
}

#[test]
fn a_hostile_ring_costs_a_poll_its_cap_and_is_said_once() {
    // A count far past the ring: everything before the last slots is lost, at most the cap
    // read, and a number from the future is no alarm.
    let mut w = section(7);
    raise(&mut w, 1, 8);
    set_ring(&mut w, |h| h.written = u64::MAX);
    let mut r = AlarmReader::default();
    let p = r.poll(&Section::of_words(&w), 4);
    assert!(p.alarms.is_empty());
    assert_eq!(p.lost + p.invalid, u64::MAX - 8 + 4);
    // An unknown kind: refused.
    let mut w = section(7);
    raise(&mut w, 1, 1);
    let base = w.as_mut_ptr().cast::<u8>();
    // SAFETY: slot 0 is inside `w`.
    unsafe {
        let p = base.add(RING as usize + 128).cast::<GuestAlarm>();
        let mut a = *p;
        a.kind = 77;
        write_record(p, &a);
    }
    let p = AlarmReader::default().poll(&Section::of_words(&w), 4);
    assert_eq!((p.alarms.len(), p.invalid), (0, 1));
    // Malformed headers: a sentence each, said once, and nothing read.
    for (tag, f) in [
        (
            "magic",
            Box::new(|h: &mut GuestAlarms| h.magic = 1) as Box<dyn Fn(&mut GuestAlarms)>,
        ),
        (
            "slots",
            Box::new(|h: &mut GuestAlarms| h.slots = MAX_SLOTS + 1),
        ),
        ("zero", Box::new(|h: &mut GuestAlarms| h.slots = 0)),
        ("size", Box::new(|h: &mut GuestAlarms| h.record_size = 60)),
        ("fit", Box::new(|h: &mut GuestAlarms| h.slots = 9)),
    ] {
        let mut w = section(7);
        set_ring(&mut w, f);
        let mut r = AlarmReader::default();
        let p = r.poll(&Section::of_words(&w), 4);
        assert!(p.alarms.is_empty(), "{tag}");
        assert!(p.problem.is_some(), "{tag}");
        assert!(
            r.poll(&Section::of_words(&w), 4).problem.is_none(),
            "{tag}: said once"
        );
        assert!(locate(&Section::of_words(&w)).is_err(), "{tag}");
    }
    // The agent record placing the ring outside the section, or unaligned.
    for (off, size) in [(16380, 4224), (260, 4224), (256, 64)] {
        let mut w = section(7);
        let base = w.as_mut_ptr().cast::<u8>();
        // SAFETY: the agent record is inside `w`.
        unsafe {
            let p = base.add(64).cast::<GuestAgent>();
            let mut a = *p;
            a.set_v15(Some((off, size)), 0, 0);
            write_record(p, &a);
        }
        assert!(locate(&Section::of_words(&w)).is_err(), "{off} {size}");
        let p = AlarmReader::default().poll(&Section::of_words(&w), 4);
        assert!(p.alarms.is_empty() && p.problem.is_some());
    }
    // A 1.4 header: no ring looked for.
    let mut w = section(7);
    raise(&mut w, 1, 2);
    let base = w.as_mut_ptr().cast::<u8>();
    // SAFETY: the header is at the start of `w`.
    unsafe {
        let p = base.cast::<GuestHeader>();
        let mut h = *p;
        h.minor = 4;
        write_record(p, &h);
    }
    assert!(AlarmReader::default()
        .poll(&Section::of_words(&w), 4)
        .alarms
        .is_empty());
}

#[test]
fn mutated_rings_pass_the_fuzz_check() {
    // A well-formed ring with alarms in every slot, then bytes of the header, the agent
    // record and the ring changed at random: the fuzz target's properties hold for each
    // (the decoder's and the alarm reader's: no panic, at most the cap, said once).
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let span = RING as usize + 128 + SLOTS as usize * 64;
    for round in 0..400 {
        let mut w = section(7);
        raise(&mut w, 1, 6 + round % 5);
        let mut bytes: Vec<u8> = w.iter().flat_map(|x| x.to_le_bytes()).collect();
        for _ in 0..1 + next() % 8 {
            let at = (next() % span as u64) as usize;
            bytes[at] = next() as u8;
        }
        let words: Vec<u64> = bytes
            .chunks(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
            .collect();
        crate::fuzzing::ppa_page_words(&words);
    }
}
