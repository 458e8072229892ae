//! Decoding the guest section of the PPA page: untrusted input.
//!
//! Data flow: the `guest` command (and tests, and the fuzz test) hand [`decode`] a
//! [`Section`]: the guest section's memory, live (the guest may rewrite it while we read) or a
//! copy. The decoder reads the header with the sequence protocol, checks every field it will
//! use (magic, major version, record sizes, offsets, counts, alignment, bounds, with checked
//! arithmetic), reads each record with a bounded number of tries, checks names (NUL, UTF-8),
//! flags stale records, reads a guest agent's record where a 1.1 header leaves room for one
//! (and from a 1.5 agent the reset it honoured and its alarm ring's header, `alarms`), takes a
//! 1.5 thread record's tail where the table's record size holds it, and returns what is valid
//! plus one sentence per problem. Its work is
//! bounded by [`MAX_RECORDS`] records of [`MAX_TRIES`] tries each, whatever the guest wrote:
//! it never panics, never loops past its bounds and never blocks.

use std::marker::PhantomData;

use ppa_guest_abi::ppa_page::{
    self as abi, read_record, GuestAgent, GuestCpu, GuestHeader, GuestThread, GuestThreadFull,
    Record, COMM_LEN, GUEST_MAGIC, MAJOR, THREAD_RECORD_SIZE_1_5,
};
use ppa_vmm_api::{
    GuestAgentView, GuestAlarmsView, GuestCpuView, GuestResetView, GuestThreadView, GuestView,
};

/// Most records of each kind decoded.
pub const MAX_RECORDS: u32 = abi::READER_MAX_RECORDS;
/// Tries per record before it is reported as torn.
pub const MAX_TRIES: u32 = 8;
/// A record whose update lags the header's by more than this is flagged stale (not one of
/// an exited thread, state `X`: its figures are final, its update time that of the exit).
pub const STALE_NS: u64 = 1_000_000_000;

/// The guest section's memory, borrowed for `'a`: a section cannot outlive the memory it
/// reads. It reads only with volatile copies under the sequence protocol, so another agent
/// (the guest) may write the memory while it is read.
#[derive(Debug, Clone, Copy)]
pub struct Section<'a> {
    base: *const u8,
    len: usize,
    _memory: PhantomData<&'a [u64]>,
}

impl<'a> Section<'a> {
    /// The section at `base`, `len` bytes, for `'a`.
    ///
    /// # Safety
    ///
    /// `base` must be 8-byte aligned and valid for reads of `len` bytes for all of `'a` (the
    /// memory is neither unmapped nor freed while the section, or a copy of it, lives). Other
    /// agents may write it concurrently, but not through Rust references.
    pub unsafe fn new(base: *const u8, len: usize) -> Section<'a> {
        Section {
            base,
            len,
            _memory: PhantomData,
        }
    }

    /// A section over words the caller owns (tests and fuzzing): borrowed, so the words
    /// outlive the section and nobody writes them while it lives.
    pub fn of_words(words: &'a [u64]) -> Section<'a> {
        Section {
            base: words.as_ptr().cast(),
            len: std::mem::size_of_val(words),
            _memory: PhantomData,
        }
    }

    /// Bytes in the section.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the section has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Reads the record of type `T` at byte offset `off`, checked against the section.
    pub(crate) fn read<T: Record>(&self, off: u64) -> Result<Result<T, ()>, String> {
        let size = std::mem::size_of::<T>() as u64;
        let end = off
            .checked_add(size)
            .ok_or_else(|| format!("offset {off} overflows"))?;
        if end > self.len as u64 {
            return Err(format!(
                "a record at offset {off} ends at {end}, past the section's {} bytes",
                self.len
            ));
        }
        if off % 8 != 0 {
            return Err(format!("a record at offset {off} is not 8-byte aligned"));
        }
        // SAFETY: `off + size <= len` and `off` is 8-aligned within an 8-aligned section, so
        // the record is valid for reads and aligned for as long as `self` lives (the
        // `Section` contract: the memory outlives `'a`).
        let p = unsafe { self.base.add(off as usize) }.cast::<T>();
        // SAFETY: as above; `T: Record` accepts any bit pattern.
        Ok(unsafe { read_record(p, MAX_TRIES) }.map_err(|_| ()))
    }
}

fn comm(raw: &[u8; COMM_LEN], errors: &mut Vec<String>, slot: usize) -> String {
    let len = raw.iter().position(|&b| b == 0).unwrap_or(COMM_LEN);
    let name = String::from_utf8_lossy(&raw[..len]);
    if std::str::from_utf8(&raw[..len]).is_err() {
        errors.push(format!("thread record {slot}: its name is not valid UTF-8"));
    }
    // Checked after the lossy conversion too: invalid bytes must not let a control character
    // (a terminal escape) through to `ctl --text guest` and the report.
    if name.chars().any(char::is_control) {
        errors.push(format!(
            "thread record {slot}: its name has control characters"
        ));
        return name
            .chars()
            .map(|c| if c.is_control() { '?' } else { c })
            .collect();
    }
    name.into_owned()
}

/// Where a table of `count` records of `size` bytes at `off` lies, checked.
fn table(
    what: &str,
    off: u32,
    count: u32,
    size: u32,
    min: usize,
    len: usize,
) -> Result<(u64, u64, u32), String> {
    if (size as usize) < min || size % 8 != 0 {
        return Err(format!(
            "the {what} record size {size} is smaller than {min} or not a multiple of 8"
        ));
    }
    let count = if count > MAX_RECORDS {
        return Err(format!(
            "the guest declares {count} {what} records, more than {MAX_RECORDS}"
        ));
    } else {
        count
    };
    let end = u64::from(off) + u64::from(count) * u64::from(size);
    if end > len as u64 {
        return Err(format!(
            "the {what} table ({count} × {size} bytes at offset {off}) ends at {end}, past the section's {len} bytes"
        ));
    }
    Ok((u64::from(off), u64::from(size), count))
}

/// A thread's state letter: an ASCII letter, else `?` (0: not given).
fn state(b: u8) -> String {
    match b {
        0 => String::new(),
        b if b.is_ascii_alphabetic() => (b as char).to_string(),
        _ => "?".to_string(),
    }
}

/// The guest agent's record at [`abi::AGENT_OFFSET`], if one is there: the magic decides
/// (the room may be unused); a record with the magic but a wrong size is a problem.
fn agent(section: &Section, errors: &mut Vec<String>) -> Option<(GuestAgentView, GuestAgent)> {
    let a: GuestAgent = match section.read::<GuestAgent>(u64::from(abi::AGENT_OFFSET)) {
        Err(e) => {
            errors.push(e);
            return None;
        }
        Ok(Err(())) => {
            errors.push(format!(
                "the guest agent's record stayed mid-update for {MAX_TRIES} tries"
            ));
            return None;
        }
        Ok(Ok(a)) => a,
    };
    if a.magic != abi::AGENT_MAGIC {
        return None;
    }
    if (a.size as usize) < std::mem::size_of::<GuestAgent>() {
        errors.push(format!(
            "the guest agent's record says it is {} bytes, less than the {} of layout 1.1",
            a.size,
            std::mem::size_of::<GuestAgent>()
        ));
        return None;
    }
    let flag = |bit: u32| a.flags & bit != 0;
    let view = GuestAgentView {
        pid: a.pid,
        interval_ns: a.interval_ns,
        samples: a.samples,
        sample_cpu_ns: a.sample_cpu_ns,
        sample_max_cpu_ns: a.sample_max_cpu_ns,
        agent_cpu_ns: a.agent_cpu_ns,
        threads_seen: a.threads_seen,
        threads_published: a.threads_published,
        rest_count: a.rest_count,
        rest_on_cpu_ns: a.rest_on_cpu_ns,
        rest_interval_on_cpu_ns: a.rest_interval_on_cpu_ns,
        unseen_count: a.unseen_count,
        unseen_cpu_ns: a.unseen_cpu_ns,
        exited_processes: a.exited_processes,
        exits_missed: a.exits_missed,
        taskstats: flag(abi::AGENT_TASKSTATS),
        delayacct: flag(abi::AGENT_DELAYACCT),
        exits_lost: flag(abi::AGENT_EXITS_LOST),
        cpu_switches: flag(abi::AGENT_CPU_SWITCHES),
        stopped: flag(abi::AGENT_STOPPED),
        updated_ns: a.updated_ns,
    };
    Some((view, a))
}

/// What a 1.5 agent record says of resets and its alarm ring, into `v`.
fn agent_v15(section: &Section, a: &GuestAgent, v: &mut GuestView) {
    if a.reset_generation() != 0 {
        v.reset = Some(GuestResetView {
            requested: 0,
            honoured: a.reset_generation(),
            honoured_ns: a.reset_ns(),
        });
    }
    match super::alarms::locate(section) {
        Ok(Some((at, h))) => {
            v.alarms = Some(GuestAlarmsView {
                slots: at.slots,
                written: h.written,
                suppressed: h.suppressed,
                thresholds: h.thresholds,
                ..Default::default()
            })
        }
        Ok(None) => {}
        Err(e) => v.errors.push(e),
    }
}

/// Decodes the guest section.
pub fn decode(section: Section<'_>) -> GuestView {
    let mut v = GuestView {
        page: true,
        published: false,
        version: String::new(),
        nr_cpus: 0,
        updated_ns: 0,
        threads: Vec::new(),
        cpus: Vec::new(),
        transient_count: 0,
        transient_cpu_ns: 0,
        errors: Vec::new(),
        host: Vec::new(),
        agent: None,
        host_reset: Vec::new(),
        alarms: None,
        reset: None,
    };
    let Some(h) = header(&section, &mut v) else {
        return v;
    };
    v.published = true;
    v.nr_cpus = h.nr_cpus;
    v.updated_ns = h.updated_ns;
    v.transient_count = h.transient_count;
    v.transient_cpu_ns = h.transient_cpu_ns;
    if abi::agent_record_fits(&h) {
        if let Some((view, raw)) = agent(&section, &mut v.errors) {
            v.agent = Some(view);
            if h.minor >= 5 {
                agent_v15(&section, &raw, &mut v);
            }
        }
    }
    threads(&section, &h, &mut v);
    v.threads
        .sort_by(|a, b| b.on_cpu_ns.cmp(&a.on_cpu_ns).then(a.slot.cmp(&b.slot)));
    cpus(&section, &h, &mut v);
    if v.errors.len() > 64 {
        let n = v.errors.len() - 64;
        v.errors.truncate(64);
        v.errors.push(format!("and {n} more problems"));
    }
    v
}

/// The guest header, when the guest published one this VMM reads (right magic, major
/// version); otherwise `None`, with the problem in `v.errors` (none when nothing was
/// published yet). Sets `v.version` once the magic is right.
fn header(section: &Section, v: &mut GuestView) -> Option<GuestHeader> {
    let h: GuestHeader = match section.read::<GuestHeader>(0) {
        Err(e) => {
            v.errors.push(e);
            return None;
        }
        Ok(Err(())) => {
            v.errors.push(format!(
                "the guest header stayed mid-update (odd or changing sequence counter) for {MAX_TRIES} tries"
            ));
            return None;
        }
        Ok(Ok(h)) => h,
    };
    if h.magic == 0 && h.seq == 0 {
        // Nothing published yet: not an error.
        return None;
    }
    if h.magic != GUEST_MAGIC {
        v.errors.push(format!(
            "the guest header's magic is {:#010x}, not \"PPAG\"",
            h.magic
        ));
        return None;
    }
    v.version = format!("{}.{}", h.major, h.minor);
    if h.major != MAJOR {
        v.errors.push(format!(
            "the guest writes layout {}.{}; this VMM reads major version {MAJOR}",
            h.major, h.minor
        ));
        return None;
    }
    Some(h)
}

/// The thread records `h` declares, into `v.threads` (problems into `v.errors`).
fn threads(section: &Section, h: &GuestHeader, v: &mut GuestView) {
    let (off, size, count) = match table(
        "thread",
        h.threads_offset,
        h.threads_count,
        h.thread_record_size,
        std::mem::size_of::<GuestThread>(),
        section.len,
    ) {
        Err(e) => return v.errors.push(e),
        Ok(t) => t,
    };
    // A 1.5 writer's records of 256 bytes or more carry the tail; read them whole (one
    // sequence counter).
    let full = h.minor >= 5 && size >= u64::from(THREAD_RECORD_SIZE_1_5);
    for slot in 0..count as usize {
        let at = off + slot as u64 * size;
        let read = if full {
            section.read::<GuestThreadFull>(at)
        } else {
            section.read::<GuestThread>(at).map(|r| {
                r.map(|thread| GuestThreadFull {
                    thread,
                    ..Default::default()
                })
            })
        };
        match read {
            Err(e) => v.errors.push(e),
            Ok(Err(())) => v.errors.push(format!(
                "thread record {slot} stayed mid-update for {MAX_TRIES} tries"
            )),
            // Never written (a writer leaves seq at 2 or more): an empty slot.
            Ok(Ok(t)) if t.thread.seq == 0 => {}
            Ok(Ok(t)) => {
                let view = thread_view(&t, full, h, slot, &mut v.errors);
                v.threads.push(view);
            }
        }
    }
}

/// Thread record `slot`, `r`, as the view shows it; the layout 1.1 fields only where `h`
/// is 1.1 or later, the 1.5 ones where it is 1.5 or later, the tail's where the record had
/// one (`tail`).
fn thread_view(
    r: &GuestThreadFull,
    tail: bool,
    h: &GuestHeader,
    slot: usize,
    errors: &mut Vec<String>,
) -> GuestThreadView {
    let t = &r.thread;
    let ext = h.minor >= 1;
    let v15 = h.minor >= 5;
    let more = if v15 { t.more_delays_ns() } else { [0; 2] };
    let lag_ns = h.updated_ns.saturating_sub(t.updated_ns);
    GuestThreadView {
        slot,
        tid: t.tid,
        tgid: t.tgid,
        comm: comm(&t.comm, errors, slot),
        last_cpu: t.last_cpu,
        on_cpu_ns: t.on_cpu_ns,
        utime_ns: t.utime_ns,
        stime_ns: t.stime_ns,
        run_delay_ns: t.run_delay_ns,
        timeslices: t.timeslices,
        nvcsw: t.nvcsw,
        nivcsw: t.nivcsw,
        delays_ns: [
            t.blkio_delay_ns,
            t.swapin_delay_ns,
            t.freepages_delay_ns,
            t.irq_delay_ns,
        ],
        delays_more_ns: [
            more[0],
            more[1],
            if tail { r.tail.wpcopy_delay_ns } else { 0 },
        ],
        delay_counts: if tail { r.tail.delay_counts } else { [0; 7] },
        over: if v15 { t.over() } else { [0; 3] },
        work: t.work,
        updated_ns: t.updated_ns,
        lag_ns,
        stale: lag_ns > STALE_NS && !(ext && t.state() == abi::THREAD_STATE_EXITED),
        state: if ext { state(t.state()) } else { String::new() },
        kernel: ext && t.flags() & abi::THREAD_KERNEL != 0,
        interval_on_cpu_ns: if ext { t.interval_on_cpu_ns() } else { 0 },
    }
}

/// The CPU records `h` declares, into `v.cpus` (problems into `v.errors`).
fn cpus(section: &Section, h: &GuestHeader, v: &mut GuestView) {
    let (off, size, count) = match table(
        "CPU",
        h.cpus_offset,
        h.cpus_count,
        h.cpu_record_size,
        std::mem::size_of::<GuestCpu>(),
        section.len,
    ) {
        Err(e) => return v.errors.push(e),
        Ok(t) => t,
    };
    for slot in 0..count as usize {
        match section.read::<GuestCpu>(off + slot as u64 * size) {
            Err(e) => v.errors.push(e),
            Ok(Err(())) => v.errors.push(format!(
                "CPU record {slot} stayed mid-update for {MAX_TRIES} tries"
            )),
            Ok(Ok(c)) if c.seq == 0 => {}
            Ok(Ok(c)) => v.cpus.push(GuestCpuView {
                cpu: c.cpu,
                times_ns: [
                    c.user_ns,
                    c.system_ns,
                    c.idle_ns,
                    c.iowait_ns,
                    c.irq_ns,
                    c.softirq_ns,
                    c.steal_ns,
                ],
                interrupts: c.interrupts,
                context_switches: c.context_switches,
                softirqs: c.softirqs,
                updated_ns: c.updated_ns,
                over: if h.minor >= 5 { c.over() } else { [0; 2] },
            }),
        }
    }
}

#[cfg(test)]
mod tests;
