//! Hostile guest sections: every malformation the issue lists, random bytes, and a writer
//! rewriting the section while it is decoded.

use super::*;
use ppa_guest_abi::ppa_page::{write_record, MINOR};

const WORDS: usize = 4096 / 8;

/// A valid section: header, 3 threads at 64, 2 CPUs after them.
fn valid() -> Vec<u64> {
    let mut w = vec![0u64; WORDS];
    let base = w.as_mut_ptr().cast::<u8>();
    let h = GuestHeader {
        magic: GUEST_MAGIC,
        major: MAJOR,
        minor: MINOR,
        nr_cpus: 2,
        updated_ns: 5_000_000_000,
        threads_offset: 64,
        threads_count: 3,
        thread_record_size: 192,
        cpus_offset: 64 + 3 * 192,
        cpus_count: 2,
        cpu_record_size: 192,
        transient_count: 4,
        transient_cpu_ns: 9,
        ..Default::default()
    };
    // SAFETY: the records lie inside `w`, which is 8-aligned and owned here.
    unsafe {
        write_record(base.cast::<GuestHeader>(), &h);
        for i in 0..3u64 {
            let mut comm = [0u8; COMM_LEN];
            comm[..7].copy_from_slice(b"worker0");
            comm[6] = b'0' + i as u8;
            let t = GuestThread {
                tid: 100 + i as u32,
                comm,
                on_cpu_ns: (i + 1) * 1000,
                updated_ns: 5_000_000_000 - i,
                ..Default::default()
            };
            write_record(base.add(64 + 192 * i as usize).cast::<GuestThread>(), &t);
        }
        for c in 0..2u32 {
            let r = GuestCpu {
                cpu: c,
                steal_ns: 7,
                ..Default::default()
            };
            write_record(
                base.add(64 + 3 * 192 + 192 * c as usize).cast::<GuestCpu>(),
                &r,
            );
        }
    }
    w
}

fn header(w: &mut [u64]) -> &mut GuestHeader {
    // SAFETY: the header is at the start of the owned, aligned buffer.
    unsafe { &mut *w.as_mut_ptr().cast::<GuestHeader>() }
}

fn errors_of(w: &[u64]) -> (GuestView, String) {
    let v = decode(Section::of_words(w));
    let e = v.errors.join(" | ");
    (v, e)
}

#[test]
fn a_valid_section_decodes_sorted() {
    let (v, e) = errors_of(&valid());
    assert!(v.published && e.is_empty(), "{e}");
    assert_eq!(v.version, format!("{MAJOR}.{MINOR}"));
    assert_eq!(v.threads.len(), 3);
    assert_eq!(
        v.threads.iter().map(|t| t.on_cpu_ns).collect::<Vec<_>>(),
        vec![3000, 2000, 1000],
        "by on-CPU time"
    );
    assert_eq!(v.threads[2].comm, "worker0");
    assert_eq!(v.cpus.len(), 2);
    assert_eq!(v.cpus[1].times_ns[6], 7);
    assert_eq!((v.transient_count, v.transient_cpu_ns), (4, 9));
}

#[test]
fn nothing_published_is_not_an_error() {
    let (v, e) = errors_of(&vec![0u64; WORDS]);
    assert!(!v.published && e.is_empty());
}

#[test]
fn slots_never_written_are_empty_not_errors() {
    // The header counts 4 threads and 3 CPUs, but the last slots were never written (their
    // counter is 0): a writer that has not started yet, or a vCPU that does not publish.
    let mut w = valid();
    let h = header(&mut w);
    h.threads_count = 4;
    h.cpus_offset = 64 + 4 * 192;
    h.cpus_count = 3;
    let old_cpus = (64 + 3 * 192) / 8;
    let new_cpus = (64 + 4 * 192) / 8;
    for i in (0..2 * 192 / 8).rev() {
        w[new_cpus + i] = w[old_cpus + i];
    }
    w[old_cpus..new_cpus].fill(0);
    let (v, e) = errors_of(&w);
    assert!(v.published && e.is_empty(), "{e}");
    assert_eq!((v.threads.len(), v.cpus.len()), (3, 2));
    // A written record with a zero counter is impossible; one left odd is torn, not empty.
    w[old_cpus] = 1;
    let (v, e) = errors_of(&w);
    assert_eq!(v.threads.len(), 3);
    assert!(e.contains("thread record 3 stayed mid-update"), "{e}");
}

#[test]
fn each_malformation_is_reported_and_the_rest_shown() {
    let mut w = valid();
    header(&mut w).magic = 0x1234_5678;
    assert!(errors_of(&w).1.contains("magic"));

    let mut w = valid();
    header(&mut w).major = 2;
    assert!(errors_of(&w).1.contains("major version"));

    let mut w = valid();
    header(&mut w).threads_count = 1_000_000;
    let (v, e) = errors_of(&w);
    assert!(e.contains("more than"), "{e}");
    assert_eq!(v.cpus.len(), 2, "the CPU table is still shown");

    let mut w = valid();
    header(&mut w).threads_count = 30;
    assert!(errors_of(&w).1.contains("past the section"));

    let mut w = valid();
    header(&mut w).cpus_offset = u32::MAX;
    let (v, e) = errors_of(&w);
    assert!(e.contains("past the section"), "{e}");
    assert_eq!(v.threads.len(), 3, "the threads are still shown");

    let mut w = valid();
    header(&mut w).threads_offset = 68;
    assert!(errors_of(&w).1.contains("aligned"));

    let mut w = valid();
    header(&mut w).thread_record_size = 100;
    assert!(errors_of(&w).1.contains("record size"));

    // A record whose counter is stuck odd: reported, the others shown.
    let mut w = valid();
    w[(64 + 192) / 8] |= 1;
    let (v, e) = errors_of(&w);
    assert!(e.contains("thread record 1 stayed mid-update"), "{e}");
    assert_eq!(v.threads.len(), 2);

    // The header's own counter stuck odd.
    let mut w = valid();
    header(&mut w).seq = 3;
    assert!(errors_of(&w).1.contains("guest header stayed mid-update"));

    // Names: no NUL (16 bytes), invalid UTF-8, control characters.
    let mut w = valid();
    let name = (64 + 16) / 8;
    w[name] = u64::from_le_bytes(*b"abcdefgh");
    w[name + 1] = u64::from_le_bytes(*b"ijklmnop");
    let (v, e) = errors_of(&w);
    assert!(e.is_empty(), "{e}");
    assert!(v.threads.iter().any(|t| t.comm == "abcdefghijklmnop"));
    w[name] = u64::from_le_bytes([0xff, 0xfe, b'x', 0, 0, 0, 0, 0]);
    assert!(errors_of(&w).1.contains("not valid UTF-8"));
    w[name] = u64::from_le_bytes([b'a', 0x07, 0, 0, 0, 0, 0, 0]);
    assert!(errors_of(&w).1.contains("control characters"));
    // Invalid UTF-8 does not smuggle a terminal escape through (found by the fuzzer).
    w[name] = u64::from_le_bytes([0xff, 0x1b, b'[', b'2', b'J', 0, 0, 0]);
    let (v, e) = errors_of(&w);
    assert!(
        e.contains("not valid UTF-8") && e.contains("control characters"),
        "{e}"
    );
    assert!(
        v.threads.iter().all(|t| !t.comm.contains('\x1b')),
        "{:?}",
        v.threads
    );

    // A stale record.
    let mut w = valid();
    w[(64 + 120) / 8] = 1;
    let (v, _) = errors_of(&w);
    assert!(v.threads.iter().any(|t| t.stale && t.lag_ns > STALE_NS));
}

/// A section as the guest agent lays it out (1.1): its record at 64, then 2 CPUs at 256, then
/// 3 threads, one a kernel thread in state `S`.
fn agent_layout(minor: u16) -> Vec<u64> {
    let mut w = vec![0u64; WORDS];
    let base = w.as_mut_ptr().cast::<u8>();
    let (cpus, threads) = (256u32, 256 + 2 * 192);
    let h = GuestHeader {
        magic: GUEST_MAGIC,
        major: MAJOR,
        minor,
        nr_cpus: 2,
        updated_ns: 7_000,
        threads_offset: threads,
        threads_count: 3,
        thread_record_size: 192,
        cpus_offset: cpus,
        cpus_count: 2,
        cpu_record_size: 192,
        transient_count: 51,
        transient_cpu_ns: 900,
        ..Default::default()
    };
    let a = GuestAgent {
        magic: abi::AGENT_MAGIC,
        size: 192,
        flags: abi::AGENT_TASKSTATS | abi::AGENT_STOPPED,
        pid: 4242,
        threads_seen: 10,
        threads_published: 3,
        interval_ns: 100_000_000,
        samples: 12,
        sample_cpu_ns: 50_000,
        rest_count: 7,
        rest_on_cpu_ns: 123,
        unseen_count: 50,
        unseen_cpu_ns: 800,
        exited_processes: 50,
        updated_ns: 7_000,
        ..Default::default()
    };
    // SAFETY: every record lies inside `w`, which is 8-aligned and owned here.
    unsafe {
        write_record(base.cast::<GuestHeader>(), &h);
        write_record(base.add(64).cast::<GuestAgent>(), &a);
        for i in 0..3u32 {
            let mut t = GuestThread {
                tid: 10 + i,
                comm: *b"kworker/0:1\0\0\0\0\0",
                on_cpu_ns: u64::from(i) * 10,
                updated_ns: 7_000,
                ..Default::default()
            };
            t.set_ext(
                if i == 0 { abi::THREAD_KERNEL } else { 0 },
                [b'S', b'R', b'X'][i as usize],
                u64::from(i),
            );
            write_record(
                base.add((threads + 192 * i) as usize).cast::<GuestThread>(),
                &t,
            );
        }
        for c in 0..2u32 {
            let r = GuestCpu {
                cpu: c,
                ..Default::default()
            };
            write_record(base.add((cpus + 192 * c) as usize).cast::<GuestCpu>(), &r);
        }
    }
    w
}

#[test]
fn a_guest_agents_record_and_thread_words_are_shown_from_a_1_1_header() {
    let (v, e) = errors_of(&agent_layout(1));
    assert!(v.published && e.is_empty(), "{e}");
    let a = v.agent.expect("the agent's record");
    assert_eq!(
        (a.pid, a.samples, a.rest_count, a.unseen_count),
        (4242, 12, 7, 50)
    );
    assert!(a.taskstats && a.stopped && !a.delayacct && !a.exits_lost);
    assert_eq!(v.threads.len(), 3);
    let k = v.threads.iter().find(|t| t.tid == 10).unwrap();
    assert!(k.kernel && k.state == "S", "{k:?}");
    let r = v.threads.iter().find(|t| t.tid == 11).unwrap();
    assert!(
        !r.kernel && r.state == "R" && r.interval_on_cpu_ns == 1,
        "{r:?}"
    );
    // 'X' (an exited thread) is a letter; anything else would be shown as '?'.
    assert_eq!(v.threads.iter().find(|t| t.tid == 12).unwrap().state, "X");

    // An exited thread's record keeps the time of its exit: it lags, but is final, not stale;
    // a live one that lags as much is stale.
    let mut w = agent_layout(1);
    header(&mut w).updated_ns = 7_000 + 5 * STALE_NS;
    let (v, _) = errors_of(&w);
    for t in &v.threads {
        assert!(t.lag_ns > STALE_NS, "{t:?}");
        assert_eq!(t.stale, t.state != "X", "{t:?}");
    }
    // Any other byte is an unknown state, shown as '?', never a panic.
    let state_word = |slot: usize| (256 + 2 * 192 + 192 * slot + 136) / 8;
    for b in [1u8, b'0', b' ', 0x7f, 0x80, 0xff] {
        let mut w = agent_layout(1);
        let i = state_word(2);
        w[i] = (w[i] & !(0xff << 32)) | u64::from(b) << 32;
        let (v, _) = errors_of(&w);
        let t = v.threads.iter().find(|t| t.tid == 12).unwrap();
        assert_eq!(t.state, "?", "state byte {b:#x}");
    }

    // The same bytes under a 1.0 header: no agent record, reserved words ignored.
    let (v, e) = errors_of(&agent_layout(0));
    assert!(e.is_empty() && v.agent.is_none(), "{e}");
    assert!(v.threads.iter().all(|t| t.state.is_empty() && !t.kernel));

    // Tables that start right after the header (the tiny guest's layout) leave no room, so
    // bytes there that look like an agent record are the tables' and are not read as one.
    let mut w = agent_layout(1);
    header(&mut w).cpus_offset = 64;
    let (v, _) = errors_of(&w);
    assert!(v.agent.is_none());

    // Room left but unused (no magic): nothing, and no error.
    let mut w = agent_layout(1);
    w[(64 + 4) / 8] = 0;
    let (v, e) = errors_of(&w);
    assert!(v.agent.is_none() && e.is_empty(), "{e}");

    // The magic with a size smaller than 1.1's: a problem, the rest still shown.
    let mut w = agent_layout(1);
    w[(64 + 8) / 8] = u64::from(abi::AGENT_TASKSTATS) << 32 | 64;
    let (v, e) = errors_of(&w);
    assert!(
        e.contains("the guest agent's record says it is 64 bytes"),
        "{e}"
    );
    assert!(v.agent.is_none() && v.threads.len() == 3);

    // A counter stuck odd.
    let mut w = agent_layout(1);
    w[64 / 8] |= 1;
    assert!(errors_of(&w).1.contains("agent's record stayed mid-update"));
}

/// xorshift64*: deterministic random bytes without a dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

/// Random sections, and valid ones with random words overwritten: the decoder returns, and
/// what it shows passes the fuzz target's checks (`crate::fuzzing::ppa_page_words`: bounded
/// output, no more records than fit, each record the bytes at its place). `PPA_FUZZ_SECS`
/// runs it for that long instead of 20 000 cases; `scripts/fuzz.sh ppa_page` fuzzes the same
/// checks with coverage guidance.
#[test]
fn random_and_mutated_sections_never_panic() {
    let secs: u64 = std::env::var("PPA_FUZZ_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let until = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut cases = 0u64;
    while cases < 20_000 || std::time::Instant::now() < until {
        let mut w = if rng.next() % 2 == 0 {
            (0..WORDS).map(|_| rng.next()).collect::<Vec<u64>>()
        } else {
            let mut w = valid();
            for _ in 0..(rng.next() % 8 + 1) {
                let i = (rng.next() % WORDS as u64) as usize;
                // Small values too, so counts and offsets land near the limits.
                w[i] = if rng.next() % 2 == 0 {
                    rng.next()
                } else {
                    rng.next() % 4096
                };
            }
            w
        };
        if rng.next() % 4 == 0 {
            // Valid magic and version over random tables.
            let h = header(&mut w);
            h.seq &= !1;
            h.magic = GUEST_MAGIC;
            h.major = MAJOR;
        }
        crate::fuzzing::ppa_page_words(&w);
        cases += 1;
    }
    eprintln!("decoded {cases} random sections without a panic");
}

/// A guest that rewrites its section as fast as it can while the VMM decodes it.
#[test]
fn a_section_rewritten_concurrently_is_decoded_in_bounded_time() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    struct Shared(*mut u64);
    // SAFETY: the words are only touched with volatile accesses and the sequence protocol.
    unsafe impl Send for Shared {}
    // SAFETY: as above.
    unsafe impl Sync for Shared {}
    let words = Box::leak(valid().into_boxed_slice());
    let shared = Arc::new(Shared(words.as_mut_ptr()));
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (shared, stop) = (Arc::clone(&shared), Arc::clone(&stop));
        std::thread::spawn(move || {
            let mut rng = Rng(42);
            while !stop.load(Ordering::Relaxed) {
                let i = (rng.next() % WORDS as u64) as usize;
                // SAFETY: `i` is inside the leaked buffer.
                unsafe { std::ptr::write_volatile(shared.0.add(i), rng.next()) };
            }
        })
    };
    for _ in 0..2000 {
        // SAFETY: the buffer is 8-aligned, WORDS words long, and never freed.
        let s = unsafe { Section::new(shared.0.cast(), WORDS * 8) };
        let v = decode(s);
        assert!(v.threads.len() <= MAX_RECORDS as usize);
    }
    stop.store(true, Ordering::Relaxed);
    writer.join().unwrap();
}

/// Writes the ppa_page fuzz target's seeds (fuzz/seeds/ppa_page/): the valid section, one with
/// slots never written and a torn record, and one whose tables lie at the section's end.
/// Run by hand: `cargo test -p ppa-vmm --lib write_fuzz_seeds -- --ignored`.
#[test]
#[ignore = "writes the fuzz seeds into the source tree"]
fn write_fuzz_seeds() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/seeds/ppa_page");
    std::fs::create_dir_all(&dir).unwrap();
    let bytes = |w: &[u64]| w.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    std::fs::write(dir.join("valid"), bytes(&valid())).unwrap();
    let mut w = valid();
    header(&mut w).threads_count = 4;
    w[(64 + 192) / 8] |= 1;
    std::fs::write(dir.join("torn-and-empty"), bytes(&w)).unwrap();
    let mut w = valid();
    let h = header(&mut w);
    h.cpus_offset = (WORDS * 8 - 2 * 192) as u32;
    std::fs::write(dir.join("at-the-end"), bytes(&w)).unwrap();
}
