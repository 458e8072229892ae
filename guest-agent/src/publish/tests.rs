//! Layout, ranking and slot assignment, and a publication of this machine's threads into a
//! page file read back with the sequence protocol.

use super::*;
use crate::collect::alarms::Occurrence;
use crate::collect::Options;
use crate::discover::Place;
use crate::page::{write_region_file, Access};
use ppa_guest_abi::ppa_page::alarms::AlarmKind;
use ppa_guest_abi::ppa_page::read_record;
use ppa_guest_abi::ppa_page::GuestCpu;

#[test]
fn the_layout_and_its_capacity() {
    // A 64 KiB page of a 3-vCPU VM: 64 + 3·128 bytes of host side, the rest the guest's.
    let l = layout(65536 - 448, 2, 1024, false).unwrap();
    assert_eq!(l.alarms, None);
    assert_eq!((l.cpus_offset, l.threads_offset), (256, 256 + 2 * 192));
    assert_eq!(l.capacity, (65536 - 448 - 640) / 256);
    assert_eq!(layout(65536 - 448, 2, 8, false).unwrap().capacity, 8);
    // With thresholds, the alarm ring of 64 slots comes first.
    let l = layout(65536 - 448, 2, 1024, true).unwrap();
    assert_eq!(l.alarms, Some((256, 64)));
    assert_eq!(l.cpus_offset, 256 + 128 + 64 * 64);
    assert_eq!(l.capacity, (65536 - 448 - l.threads_offset) / 256);
    // A small page: a ring of 16, then none, rather than no thread record.
    assert_eq!(layout(4096, 2, 1024, true).unwrap().alarms, Some((256, 16)));
    assert_eq!(layout(1200, 2, 1024, true).unwrap().alarms, None);
    // 16 MiB fits more than a reader takes.
    assert_eq!(layout(16 << 20, 2, 5000, true).unwrap().capacity, 1024);
    let e = layout(800, 4, 1024, false).unwrap_err();
    assert_eq!(
        e.to_string(),
        "the guest section has 800 bytes; the agent needs 1280 for its header, its record, \
         4 CPU records and one thread record"
    );
}

#[test]
fn slots_stay_put_new_threads_fill_holes_and_the_tail_closes_them() {
    let mut s = vec![];
    assign(&mut s, &[5, 6, 7]);
    assert_eq!(s, [5, 6, 7]);
    // 6 leaves, 9 arrives: 9 takes 6's slot.
    assign(&mut s, &[7, 5, 9]);
    assert_eq!(s, [5, 9, 7]);
    // Two leave, none arrive: the tail moves into the hole.
    assign(&mut s, &[7]);
    assert_eq!(s, [7]);
    assign(&mut s, &[1, 2, 3, 7]);
    assert_eq!(s, [7, 1, 2, 3]);
    assign(&mut s, &[3, 2]);
    assert_eq!(s, [3, 2]);
    assign(&mut s, &[]);
    assert!(s.is_empty());
}

#[test]
fn slot_assignment_keeps_every_chosen_thread_exactly_once() {
    // Random rounds: the slots are the chosen set, and a thread that stays chosen keeps its
    // slot unless its slot is past the new end (then it moved into a hole).
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut slots: Vec<u32> = Vec::new();
    for _ in 0..2000 {
        let n = (next() % 12) as usize;
        let mut chosen: Vec<u32> = Vec::new();
        while chosen.len() < n {
            let t = (next() % 20 + 1) as u32;
            if !chosen.contains(&t) {
                chosen.push(t);
            }
        }
        let before = slots.clone();
        assign(&mut slots, &chosen);
        let mut a = slots.clone();
        a.sort_unstable();
        let mut b = chosen.clone();
        b.sort_unstable();
        assert_eq!(a, b, "{before:?} + {chosen:?} -> {slots:?}");
        for (i, t) in before.iter().enumerate() {
            if chosen.contains(t) && i < chosen.len() {
                assert_eq!(slots[i], *t, "{before:?} + {chosen:?} -> {slots:?}");
            }
        }
    }
}

fn temp(tag: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("ppa-agent-{tag}-{}", std::process::id()))
}

#[test]
fn a_page_has_one_publisher_at_a_time_and_none_when_mapped_to_look() {
    let path = temp("one-writer");
    write_region_file(&path, 16384, 1).unwrap();
    let page = crate::page::Page::open(&Place::File(path.clone()), Access::Publish).unwrap();
    let p = Publisher::new(&page, 1, 8, Thresholds::default()).unwrap();
    let e = Publisher::new(&page, 1, 8, Thresholds::default()).unwrap_err();
    assert!(matches!(e, PublishError::Writer(WriterError::Taken)), "{e}");
    drop(p);
    assert!(
        Publisher::new(&page, 1, 8, Thresholds::default()).is_ok(),
        "the writer comes back when the publisher goes"
    );
    let look = crate::page::Page::open(&Place::File(path.clone()), Access::Look).unwrap();
    let e = Publisher::new(&look, 1, 8, Thresholds::default()).unwrap_err();
    assert!(
        matches!(e, PublishError::Writer(WriterError::ReadOnly)),
        "{e}"
    );
    drop(page);
    drop(look);
    std::fs::remove_file(&path).unwrap();
}

fn read_header(base: *const u8) -> GuestHeader {
    // SAFETY: the caller passes the guest section's start inside a live mapping.
    unsafe { read_record(base.cast::<GuestHeader>(), 8) }.unwrap()
}

#[test]
fn this_machines_threads_published_and_read_back() {
    let _g = crate::threads_serial();
    let path = temp("publish");
    write_region_file(&path, 16384, 2).unwrap();
    let page = crate::page::Page::open(&Place::File(path.clone()), Access::Publish).unwrap();
    let mut c = Collector::new(None, Options::default()).unwrap();
    c.sample().unwrap();
    let mut p = Publisher::new(&page, c.nr_cpus(), 8, Thresholds::default()).unwrap();
    let me = AgentFigures {
        interval_ns: 1_000_000_000,
        samples: 1,
        ..Default::default()
    };
    p.publish(&c, &me).unwrap();
    let (base, _) = page.guest();
    let h = read_header(base);
    assert_eq!((h.magic, h.major, h.minor), (GUEST_MAGIC, MAJOR, MINOR));
    let seen = c.thread_count();
    assert!(seen > 8, "this machine has more threads than 8: {seen}");
    assert_eq!(h.threads_count, 8, "capped at max_threads");
    assert_eq!(h.cpus_count, c.nr_cpus());
    // SAFETY: the agent record is at 64 inside the mapping.
    let a: GuestAgent = unsafe { read_record(base.add(64).cast::<GuestAgent>(), 8) }.unwrap();
    assert_eq!(a.magic, abi::AGENT_MAGIC);
    assert_eq!((a.threads_seen as usize, a.threads_published), (seen, 8));
    assert_eq!(
        a.rest_count as usize,
        seen - 8,
        "the aggregate counts the rest"
    );
    let published: u64 = (0..8)
        .map(|i| {
            let off = h.threads_offset as usize + h.thread_record_size as usize * i;
            // SAFETY: slot i is inside the thread table in the mapping.
            unsafe { read_record(base.add(off).cast::<GuestThread>(), 8) }
                .unwrap()
                .on_cpu_ns
        })
        .sum();
    let all: u64 = c.threads().map(|t| t.sched.on_cpu_ns).sum();
    assert_eq!(
        published + a.rest_on_cpu_ns,
        all,
        "nothing dropped silently"
    );
    assert!(abi::agent_record_fits(&h));

    // Someone else writes the guest header: the agent stops, and writes nothing more.
    // SAFETY: the header's counter, in the mapping; a plain store as another writer would.
    unsafe { base.cast::<u32>().write_volatile(h.seq + 2) };
    let before = std::fs::read(&path).unwrap();
    let e = p.publish(&c, &me).unwrap_err();
    assert!(matches!(e, PublishError::Foreign { .. }), "{e}");
    assert_eq!(std::fs::read(&path).unwrap(), before, "nothing written");
    drop(p);
    drop(page);
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn a_region_header_rewritten_under_the_agent_stops_it() {
    let _g = crate::threads_serial();
    let path = temp("rewritten");
    write_region_file(&path, 8192, 1).unwrap();
    let page = crate::page::Page::open(&Place::File(path.clone()), Access::Publish).unwrap();
    let mut c = Collector::new(None, Options::default()).unwrap();
    c.sample().unwrap();
    let mut p = Publisher::new(&page, c.nr_cpus(), 4, Thresholds::default()).unwrap();
    p.publish(&c, &AgentFigures::default()).unwrap();
    // The VMM (or anyone) writes another magic over the region header.
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    f.write_all_at(b"XXXX", 0).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    let e = p.publish(&c, &AgentFigures::default()).unwrap_err();
    assert!(
        e.to_string()
            .starts_with("the region header changed under the agent (magic 0x58585858"),
        "{e}"
    );
    assert_eq!(
        std::fs::read(&path).unwrap(),
        bytes,
        "nothing written after"
    );
    drop(p);
    drop(page);
    std::fs::remove_file(&path).unwrap();
}

/// The thread records of the table `h` describes, read back.
fn read_threads(base: *const u8, h: &GuestHeader) -> Vec<GuestThread> {
    (0..h.threads_count as usize)
        .map(|i| {
            let off = h.threads_offset as usize + h.thread_record_size as usize * i;
            // SAFETY: slot i is inside the thread table in the mapping.
            unsafe { read_record(base.add(off).cast::<GuestThread>(), 8) }.unwrap()
        })
        .collect()
}

/// A thread that spins `ms` of its own CPU time and ends; its tid and CPU at its last read.
fn short_thread(ms: u64) -> (u32, u64) {
    std::thread::spawn(move || {
        let t0 = crate::thread_cpu_ns();
        while crate::thread_cpu_ns() - t0 < ms * 1_000_000 {}
        // SAFETY: gettid has no preconditions.
        (unsafe { libc::gettid() } as u32, crate::thread_cpu_ns())
    })
    .join()
    .unwrap()
}

/// One publication of `c`, read back: every CPU figure the collector holds (live threads and
/// all exits) is in exactly one of the thread records, the aggregate and the transient
/// figures, and so is every thread. Returns the header and the records.
fn publish_and_add_up(
    p: &mut Publisher<'_>,
    page: &crate::page::Page,
    c: &Collector,
) -> (GuestHeader, Vec<GuestThread>) {
    p.publish(c, &AgentFigures::default()).unwrap();
    let (base, _) = page.guest();
    let h = read_header(base);
    // SAFETY: the agent record is at 64 inside the mapping.
    let a: GuestAgent = unsafe { read_record(base.add(64).cast::<GuestAgent>(), 8) }.unwrap();
    let records = read_threads(base, &h);
    let totals = c.totals();
    let published: u64 = records.iter().map(|t| t.on_cpu_ns).sum();
    let live: u64 = c
        .threads()
        .map(|t| since(t, c.base(t.tid)).sched.on_cpu_ns)
        .sum();
    assert_eq!(
        published + a.rest_on_cpu_ns + h.transient_cpu_ns,
        live + totals.exited_cpu_ns,
        "published + aggregate + transient = all the CPU the agent saw"
    );
    let exited_listed = records
        .iter()
        .filter(|t| t.state() == abi::THREAD_STATE_EXITED)
        .count() as u64;
    assert_eq!(
        a.rest_count,
        u64::from(a.threads_seen) - (u64::from(a.threads_published) - exited_listed),
        "the aggregate is the live threads not published"
    );
    assert_eq!(
        h.transient_count + exited_listed,
        totals.exited_count,
        "every exit listed or in the transient count"
    );
    (h, records)
}

#[test]
fn an_exited_thread_stays_published_as_x_for_linger_samples_and_is_counted_once() {
    let _g = crate::threads_serial();
    for linger in [2, 0] {
        let path = temp(&format!("linger{linger}"));
        write_region_file(&path, 262144, 1).unwrap();
        let page = crate::page::Page::open(&Place::File(path.clone()), Access::Publish).unwrap();
        let opts = Options {
            linger,
            ..Options::default()
        };
        let mut c = Collector::new(None, opts).unwrap();
        let mut p = Publisher::new(&page, c.nr_cpus(), 1024, Thresholds::default()).unwrap();
        c.set_capacity(p.layout().capacity as usize);
        c.sample().unwrap();
        publish_and_add_up(&mut p, &page, &c);
        // Seen by a sample while it runs, then ended before the next.
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let (tid_tx, tid_rx) = std::sync::mpsc::channel();
        let h = std::thread::spawn(move || {
            let t0 = crate::thread_cpu_ns();
            while crate::thread_cpu_ns() - t0 < 20_000_000 {}
            // SAFETY: gettid has no preconditions.
            tid_tx.send(unsafe { libc::gettid() } as u32).unwrap();
            let _ = rx.recv();
            crate::thread_cpu_ns()
        });
        let tid = tid_rx.recv().unwrap();
        c.sample().unwrap();
        publish_and_add_up(&mut p, &page, &c);
        drop(tx);
        let spun = h.join().unwrap();
        // And one that starts and ends between two samples (no sample sees it; without
        // taskstats it has no record of its own, only its share of the transient figures).
        let (blip, _) = short_thread(2);
        let mut shown = 0;
        for sample in 0..4 {
            c.sample().unwrap();
            let (hd, records) = publish_and_add_up(&mut p, &page, &c);
            assert!(records.iter().all(|t| t.tid != blip || t.state() == b'X'));
            match records.iter().find(|t| t.tid == tid) {
                Some(t) => {
                    shown += 1;
                    assert_eq!(t.state(), abi::THREAD_STATE_EXITED, "{t:?}");
                    // The last sample's figure: at least what it spun when that sample
                    // saw it, at most its CPU when it ended.
                    assert!(
                        t.on_cpu_ns >= 20_000_000 && t.on_cpu_ns <= spun,
                        "{t:?} vs {spun}"
                    );
                    assert!(t.updated_ns <= hd.updated_ns);
                    // Its interval time: what it ran since the sample before, then 0.
                    if sample > 0 {
                        assert_eq!(t.interval_on_cpu_ns(), 0, "{t:?}");
                    }
                }
                None => assert!(
                    linger == 0 || sample >= linger,
                    "sample {sample} after the exit lost it (linger {linger})"
                ),
            }
        }
        assert_eq!(shown, linger, "published in exactly `linger` samples");
        drop(p);
        drop(page);
        std::fs::remove_file(&path).unwrap();
    }
}

fn occurrence(i: u32) -> Occurrence {
    Occurrence {
        kind: if i % 2 == 0 {
            AlarmKind::Slice
        } else {
            AlarmKind::Irq
        },
        tid: i,
        cpu: i % 3,
        comm: *b"worker\0\0\0\0\0\0\0\0\0\0",
        value: 1000 + u64::from(i),
        threshold: 1000,
    }
}

#[test]
fn alarms_are_numbered_into_the_ring_and_a_storm_is_capped_per_sample() {
    use ppa_guest_abi::ppa_page::alarms::{GuestAlarm, GuestAlarms, ALARMS_MAGIC};
    let path = temp("ring");
    write_region_file(&path, 16384, 1).unwrap();
    let page = crate::page::Page::open(&Place::File(path.clone()), Access::Publish).unwrap();
    let mut w = page.guest_writer().unwrap();
    let th = Thresholds([0, 1000, 0, 1000, 0]);
    let mut r = ring::Ring::new(Some((256, 8)), th);
    let (base, _) = page.guest();
    // SAFETY: the ring header and its 8 slots lie inside the guest section of the mapping.
    let header = || unsafe { read_record(base.add(256).cast::<GuestAlarms>(), 8) }.unwrap();
    // SAFETY: as above.
    let slot =
        |i: usize| unsafe { read_record(base.add(384 + 64 * i).cast::<GuestAlarm>(), 8) }.unwrap();
    // A first sample without occurrences makes the ring known.
    r.publish(&mut w, &[], 5);
    let h = header();
    assert_eq!(
        (h.magic, h.slots, h.record_size, h.written),
        (ALARMS_MAGIC, 8, 64, 0)
    );
    assert_eq!(h.thresholds, th.0);
    // Three alarms: numbers 1 to 3 in slots 0 to 2.
    let found: Vec<Occurrence> = (1..=3).map(occurrence).collect();
    r.publish(&mut w, &found, 7);
    assert_eq!(header().written, 3);
    let a = slot(2);
    assert_eq!(
        (a.number, a.kind, a.tid, a.value, a.guest_ns),
        (3, AlarmKind::Irq as u32, 3, 1003, 7)
    );
    // A storm of 100: the sample writes 32 (numbers 4 to 35, the ring keeping the last 8)
    // and counts the other 68 as suppressed.
    let storm: Vec<Occurrence> = (0..100).map(occurrence).collect();
    r.publish(&mut w, &storm, 9);
    let h = header();
    assert_eq!((h.written, h.suppressed), (35, 68));
    assert_eq!(slot((35 - 1) % 8).number, 35);
    assert_eq!(slot((28 - 1) % 8).number, 28);
    drop(w);
    drop(page);
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn after_a_reset_every_figure_counts_from_zero_and_still_adds_up() {
    let _g = crate::threads_serial();
    let path = temp("reset");
    write_region_file(&path, 262144, 1).unwrap();
    let page = crate::page::Page::open(&Place::File(path.clone()), Access::Publish).unwrap();
    let mut c = Collector::new(None, Options::default()).unwrap();
    let mut p = Publisher::new(&page, c.nr_cpus(), 1024, Thresholds::default()).unwrap();
    c.set_capacity(p.layout().capacity as usize);
    c.sample().unwrap();
    let (_, before) = publish_and_add_up(&mut p, &page, &c);
    let mine = crate::thread_cpu_ns();
    assert!(before.iter().map(|t| t.on_cpu_ns).sum::<u64>() > 0);
    c.reset();
    let (h, after) = publish_and_add_up(&mut p, &page, &c);
    // Right after the reset: nothing ran since, every figure is 0 (the sample is the base).
    assert!(
        after.iter().all(|t| t.on_cpu_ns == 0 && t.timeslices == 0),
        "{after:?}"
    );
    assert_eq!((h.transient_count, h.transient_cpu_ns), (0, 0));
    let (base, _) = page.guest();
    let cpus: Vec<GuestCpu> = (0..h.cpus_count as usize)
        .map(|i| {
            // SAFETY: CPU record i is inside the CPU table in the mapping.
            unsafe {
                read_record(
                    base.add(h.cpus_offset as usize + 192 * i)
                        .cast::<GuestCpu>(),
                    8,
                )
            }
            .unwrap()
        })
        .collect();
    assert!(
        cpus.iter()
            .all(|r| r.user_ns + r.system_ns + r.idle_ns == 0),
        "{cpus:?}"
    );
    // This thread spins 30 ms: its figure since the reset is that, not its whole life.
    while crate::thread_cpu_ns() - mine < 30_000_000 {}
    c.sample().unwrap();
    let (_, later) = publish_and_add_up(&mut p, &page, &c);
    // SAFETY: gettid has no preconditions.
    let me = unsafe { libc::gettid() } as u32;
    let t = later
        .iter()
        .find(|t| t.tid == me)
        .expect("this thread is published");
    let now = crate::thread_cpu_ns();
    assert!(
        t.on_cpu_ns >= 25_000_000 && t.on_cpu_ns <= now - mine + 5_000_000,
        "{t:?}"
    );
    drop(p);
    drop(page);
    std::fs::remove_file(&path).unwrap();
}
