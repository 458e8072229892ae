//! The PPA page decoder's fuzz check: the guest section is the guest's, so every byte of it is
//! hostile input. The decoder's own unit tests (`ppa_page::decode::tests`) run their random
//! and mutated sections through [`ppa_page_words`] too.
//!
//! Data flow: bytes → little-endian words (the section, 8-byte aligned) → `decode` → the view
//! is checked against the words, read here independently of the decoder with plain integer
//! loads at the records' field offsets (no sequence protocol: nothing writes the words).

use std::mem::{offset_of, size_of};

use ppa_guest_abi::ppa_page::{GuestCpu, GuestHeader, GuestThread, COMM_LEN, GUEST_MAGIC, MAJOR};
use ppa_vmm_api::GuestView;

use crate::ppa_page::decode::{decode, Section, MAX_RECORDS, STALE_NS};

/// Most problems listed, and the line that counts the rest.
const MAX_ERRORS: usize = 65;

/// A section of `data` (padded with zeros to whole words) through the decoder.
pub fn ppa_page(data: &[u8]) {
    let words: Vec<u64> = data
        .chunks(8)
        .map(|c| {
            let mut b = [0u8; 8];
            b[..c.len()].copy_from_slice(c);
            u64::from_le_bytes(b)
        })
        .collect();
    ppa_page_words(&words);
}

/// The section's bytes, little-endian, as the guest wrote them.
struct Bytes(Vec<u8>);

impl Bytes {
    fn u32(&self, at: usize) -> Option<u32> {
        let b = self.0.get(at..at + 4)?;
        Some(u32::from_le_bytes(b.try_into().ok()?))
    }

    fn u16(&self, at: usize) -> Option<u16> {
        let b = self.0.get(at..at + 2)?;
        Some(u16::from_le_bytes(b.try_into().ok()?))
    }

    fn u64(&self, at: usize) -> Option<u64> {
        let b = self.0.get(at..at + 8)?;
        Some(u64::from_le_bytes(b.try_into().ok()?))
    }
}

/// Where a table's records lie: `(offset, record size, count)` from the header.
struct Table {
    off: u64,
    size: u64,
    count: u64,
}

impl Table {
    /// Byte range of record `slot`, when it lies inside `len` bytes.
    fn record(&self, slot: usize, len: usize, record: usize) -> Option<usize> {
        let start = self.off.checked_add(self.size.checked_mul(slot as u64)?)?;
        let end = start.checked_add(record as u64)?;
        (end <= len as u64).then_some(start as usize)
    }

    /// Whether the table is as a correct guest writes it: aligned records of at least
    /// `record` bytes, at most [`MAX_RECORDS`], all inside `len` bytes.
    fn well_formed(&self, len: usize, record: usize) -> bool {
        self.size >= record as u64
            && self.size % 8 == 0
            && self.off % 8 == 0
            && self.count <= u64::from(MAX_RECORDS)
            && self.off + self.count * self.size <= len as u64
    }

    /// Slots a static section publishes: written (counter even and not zero).
    fn published(&self, bytes: &Bytes, record: usize) -> Vec<usize> {
        (0..self.count as usize)
            .filter(|&slot| {
                self.record(slot, bytes.0.len(), record)
                    .and_then(|at| bytes.u32(at))
                    .is_some_and(|seq| seq != 0 && seq % 2 == 0)
            })
            .collect()
    }
}

/// Decodes `words` as a guest section and checks the view against them.
///
/// Properties: it returns (bounded work) with at most 64 problems and a count of the rest;
/// nothing is shown unless the header's magic and major version are right; the header's
/// figures are copied; no more records are shown than the header declares, than
/// [`MAX_RECORDS`], or than fit in the section; every record shown lies inside the section,
/// was written (its counter even, not zero), once, and holds what the bytes at its place hold;
/// names are free of control characters; lag and staleness agree with the times; threads
/// are sorted by on-CPU time. When the tables are well formed, every written record is shown.
pub fn ppa_page_words(words: &[u64]) {
    let view = decode(Section::of_words(words));
    let bytes = Bytes(words.iter().flat_map(|w| w.to_le_bytes()).collect());
    check_view(&view, &bytes);
    check_alarms(words);
}

/// Alarms one poll may take in this check (the sampler's cap is larger; any cap holds).
const ALARM_CAP: usize = 8;

/// The alarm ring of the same section, as the sampler reads it: each poll returns at most its
/// cap, numbered upwards, with names the decoder's rules allow and a known kind; a problem is
/// said once, not at every poll.
fn check_alarms(words: &[u64]) {
    use ppa_vmm_api::ALARM_WHAT;
    let mut reader = crate::ppa_page::alarms::AlarmReader::default();
    let mut last = 0u64;
    let mut problems = 0;
    for _ in 0..3 {
        let p = reader.poll(&Section::of_words(words), ALARM_CAP);
        assert!(
            p.alarms.len() <= ALARM_CAP,
            "{} alarms in one poll",
            p.alarms.len()
        );
        problems += usize::from(p.problem.is_some());
        for a in &p.alarms {
            assert!(a.number > last, "alarm {} after {last}", a.number);
            last = a.number;
            assert!(ALARM_WHAT.contains(&a.what.as_str()), "{a:?}");
            assert!(a.comm.chars().count() <= COMM_LEN, "{a:?}");
            assert!(!a.comm.chars().any(char::is_control), "{a:?}");
        }
    }
    assert!(problems <= 1, "the same problem said {problems} times");
}

fn check_view(v: &GuestView, b: &Bytes) {
    let len = b.0.len();
    assert!(v.page, "a decoded section is a page");
    assert!(v.errors.len() <= MAX_ERRORS, "{} problems", v.errors.len());
    assert!(v.errors.iter().all(|e| !e.is_empty() && e.len() <= 512));
    if !v.published {
        assert!(
            v.threads.is_empty() && v.cpus.is_empty(),
            "unpublished records shown"
        );
        return;
    }
    let h = |field: usize| {
        b.u32(field)
            .expect("a published header is inside the section")
    };
    let h64 = |field: usize| {
        b.u64(field)
            .expect("a published header is inside the section")
    };
    assert!(len >= size_of::<GuestHeader>());
    assert_eq!(h(offset_of!(GuestHeader, magic)), GUEST_MAGIC);
    let major = b.u16(offset_of!(GuestHeader, major)).unwrap_or_default();
    let minor = b.u16(offset_of!(GuestHeader, minor)).unwrap_or_default();
    assert_eq!(major, MAJOR);
    assert_eq!(v.version, format!("{major}.{minor}"));
    assert_eq!(
        h(offset_of!(GuestHeader, seq)) % 2,
        0,
        "a torn header shown"
    );
    assert_eq!(v.nr_cpus, h(offset_of!(GuestHeader, nr_cpus)));
    let updated = h64(offset_of!(GuestHeader, updated_ns));
    assert_eq!(v.updated_ns, updated);
    assert_eq!(
        (v.transient_count, v.transient_cpu_ns),
        (
            h64(offset_of!(GuestHeader, transient_count)),
            h64(offset_of!(GuestHeader, transient_cpu_ns))
        )
    );

    check_threads(v, b, updated);
    check_cpus(v, b);
}

/// The thread records shown against the bytes of the table the header declares.
fn check_threads(v: &GuestView, b: &Bytes, updated: u64) {
    let len = b.0.len();
    let h = |field: usize| {
        b.u32(field)
            .expect("a published header is inside the section")
    };
    let threads = Table {
        off: h(offset_of!(GuestHeader, threads_offset)).into(),
        size: h(offset_of!(GuestHeader, thread_record_size)).into(),
        count: h(offset_of!(GuestHeader, threads_count)).into(),
    };
    let record = size_of::<GuestThread>();
    assert!(v.threads.len() as u64 <= threads.count.min(MAX_RECORDS.into()));
    let mut slots = Vec::new();
    for t in &v.threads {
        let at = threads
            .record(t.slot, len, record)
            .unwrap_or_else(|| panic!("thread record {} lies outside the section", t.slot));
        assert!(
            (t.slot as u64) < threads.count,
            "slot {} past the count",
            t.slot
        );
        let seq = b.u32(at).unwrap_or_default();
        assert!(
            seq != 0 && seq % 2 == 0,
            "slot {}: counter {seq} shown",
            t.slot
        );
        let field = |f: usize| b.u64(at + f).unwrap_or_default();
        assert_eq!(
            t.tid,
            b.u32(at + offset_of!(GuestThread, tid)).unwrap_or_default()
        );
        assert_eq!(t.on_cpu_ns, field(offset_of!(GuestThread, on_cpu_ns)));
        assert_eq!(t.work, field(offset_of!(GuestThread, work)));
        assert_eq!(t.updated_ns, field(offset_of!(GuestThread, updated_ns)));
        assert_eq!(t.lag_ns, updated.saturating_sub(t.updated_ns));
        // An exited thread (state `X`) keeps its final figures and is never stale.
        assert_eq!(t.stale, t.lag_ns > STALE_NS && t.state != "X", "{t:?}");
        assert!(!t.comm.chars().any(char::is_control), "{:?}", t.comm);
        assert!(t.comm.len() <= 3 * COMM_LEN, "{:?}", t.comm);
        slots.push(t.slot);
    }
    assert!(
        v.threads
            .windows(2)
            .all(|w| (w[1].on_cpu_ns, w[0].slot) <= (w[0].on_cpu_ns, w[1].slot)),
        "threads not sorted by on-CPU time"
    );
    slots.sort_unstable();
    assert!(slots.windows(2).all(|w| w[0] < w[1]), "a slot shown twice");
    if threads.well_formed(len, record) {
        assert_eq!(
            slots,
            threads.published(b, record),
            "written thread records missing"
        );
    }
}

/// The CPU records shown against the bytes of the table the header declares.
fn check_cpus(v: &GuestView, b: &Bytes) {
    let len = b.0.len();
    let h = |field: usize| {
        b.u32(field)
            .expect("a published header is inside the section")
    };
    let cpus = Table {
        off: h(offset_of!(GuestHeader, cpus_offset)).into(),
        size: h(offset_of!(GuestHeader, cpu_record_size)).into(),
        count: h(offset_of!(GuestHeader, cpus_count)).into(),
    };
    let record = size_of::<GuestCpu>();
    assert!(v.cpus.len() as u64 <= cpus.count.min(MAX_RECORDS.into()));
    if cpus.well_formed(len, record) {
        // Records are shown in slot order: the written ones, field for field.
        let written = cpus.published(b, record);
        assert_eq!(v.cpus.len(), written.len(), "written CPU records missing");
        for (c, slot) in v.cpus.iter().zip(written) {
            let at = cpus.record(slot, len, record).expect("a well-formed table");
            assert_eq!(
                c.cpu,
                b.u32(at + offset_of!(GuestCpu, cpu)).unwrap_or_default()
            );
            let field = |f: usize| b.u64(at + f).unwrap_or_default();
            assert_eq!(c.updated_ns, field(offset_of!(GuestCpu, updated_ns)));
            assert_eq!(c.times_ns[6], field(offset_of!(GuestCpu, steal_ns)));
        }
    } else {
        assert!(
            v.cpus.len() as u64 <= (len as u64).saturating_sub(cpus.off) / cpus.size.max(1),
            "more CPU records than fit"
        );
    }
}
