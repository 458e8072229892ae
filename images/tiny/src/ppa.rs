//! Publishing to the PPA page from inside the guest (docs/abi.md, "The PPA page").
//!
//! Data flow: at start each vCPU finds the region through its boot-info record, checks the
//! region header the VMM wrote, and claims its own slots in the guest section: thread record
//! `i` and CPU record `i` for vCPU `i` (one writer per record). vCPU 0 also owns the guest
//! header. Every [`INTERVAL_NS`] of TSC time the workload loop calls [`Publisher::publish`]
//! with its running measurements: the vCPU's worker thread record (on-CPU time = ran plus the
//! time of the `exits` doorbell loop, run delay = lost, work = iterations), a read of its
//! host record (the steal the VMM saw), and its CPU record (user = on-CPU time, idle = time
//! halted, steal = the host's figure). All writes follow the sequence protocol of `ppa_guest_abi::ppa_page`; nothing
//! here makes an exit.
//!
//! Guest-section layout the tiny guest uses (offsets from the section's start, `n` vCPUs):
//! the header at 0, `n` thread records at 64, `n` CPU records at `64 + 192 n`. A region too
//! small for that is not published to.

use ppa_guest_abi::ppa_page::{
    read_record, write_record, GuestCpu, GuestHeader, GuestThread, HostVcpu, Record, RegionHeader,
    COMM_LEN, GUEST_MAGIC, MAJOR, MINOR, REGION_MAGIC,
};

use crate::boot::Boot;
use crate::{Clock, Stats};

/// How often a vCPU republishes its records, guest TSC time.
pub const INTERVAL_NS: u64 = 2_000_000;
/// Offset of the thread records in the guest section.
const THREADS_OFFSET: u64 = 64;
/// Tries per read of the host record.
const HOST_TRIES: u32 = 8;

/// Where the guest section is, once the region header checked out. Only [`find`] makes one,
/// from the VMM's checked boot record, so its memory is the VMM's mapping for the whole run
/// and its writes are safe; the VMM reads it concurrently, never through Rust references.
#[derive(Clone, Copy)]
pub struct Section {
    /// Guest address of the section (identity mapped), 8-byte aligned.
    base: u64,
    /// Its size in bytes.
    len: u64,
}

impl Section {
    /// Its size in bytes.
    pub fn size(self) -> u64 {
        self.len
    }

    /// The record of type `T` at byte offset `off`, when it lies inside the section, 8-byte
    /// aligned.
    fn at<T>(self, off: u64) -> Option<*mut T> {
        let end = off.checked_add(core::mem::size_of::<T>() as u64)?;
        (off.is_multiple_of(8) && end <= self.len).then_some((self.base + off) as *mut T)
    }

    /// Stores the word `v` at byte offset `off` (volatile, plainly: no protocol) when it lies
    /// inside the section, 8-byte aligned.
    pub fn word(self, off: u64, v: u64) {
        if let Some(p) = self.at::<u64>(off) {
            // SAFETY: the word is inside the guest section (checked), which the VMM maps into
            // the identity map for the whole run (a `Section` only comes from `find`); it is
            // aligned; volatile, as the VMM reads concurrently.
            unsafe { core::ptr::write_volatile(p, v) };
        }
    }

    /// Writes `r` at byte offset `off` under the sequence protocol, when it lies inside the
    /// section, 8-byte aligned. The caller is the record's one writer that follows the
    /// protocol (others may write it plainly: the VMM's reader copes with anything).
    pub fn write<T: Record>(self, off: u64, r: &T) {
        if let Some(p) = self.at::<T>(off) {
            // SAFETY: the record is inside the section (checked), which the VMM maps for the
            // whole run, 8-byte aligned; no Rust reference points into the section, and the
            // VMM only reads it.
            unsafe { write_record(p, r) };
        }
    }
}

/// The region's guest section and this vCPU's host record, if the VMM gave a region that
/// makes sense: right magic and major version, header and tables inside the size it gave.
pub fn find(b: Boot) -> Option<(Section, *const HostVcpu)> {
    let (gpa, size) = (b.ppa_page_gpa, b.ppa_page_size);
    if gpa == 0 || gpa % 4096 != 0 || size < 64 {
        return None;
    }
    // SAFETY: `b` is the VMM's checked record (`Boot`), so the VMM maps `size` (>= 64) bytes
    // at the page-aligned `gpa` into the identity map before the vCPU starts; the header is
    // plain integers and written once before that.
    let h: RegionHeader = unsafe { core::ptr::read_volatile(gpa as *const RegionHeader) };
    let host_end =
        u64::from(h.host_offset) + u64::from(h.host_count) * u64::from(h.host_record_size);
    let guest_end = u64::from(h.guest_offset) + u64::from(h.guest_size);
    let ok = h.magic == REGION_MAGIC
        && h.major == MAJOR
        && u64::from(h.total_size) <= size
        && host_end <= u64::from(h.total_size)
        && guest_end <= u64::from(h.total_size)
        && h.host_record_size as usize >= core::mem::size_of::<HostVcpu>()
        && h.host_offset.is_multiple_of(8)
        && h.host_record_size.is_multiple_of(8)
        && h.guest_offset.is_multiple_of(8)
        && b.vcpu_index < h.host_count;
    if !ok {
        return None;
    }
    let host =
        gpa + u64::from(h.host_offset) + u64::from(b.vcpu_index) * u64::from(h.host_record_size);
    let section = Section {
        base: gpa + u64::from(h.guest_offset),
        len: u64::from(h.guest_size),
    };
    Some((section, host as *const HostVcpu))
}

/// One vCPU's publishing state: pointers to its records and local copies of them.
pub struct Publisher {
    thread: *mut GuestThread,
    cpu: *mut GuestCpu,
    /// The guest header, for vCPU 0 only.
    header: Option<*mut GuestHeader>,
    host: *const HostVcpu,
    hdr: GuestHeader,
    t: GuestThread,
    c: GuestCpu,
    clk: Clock,
    interval: u64,
    /// TSC value at which the next publication is due.
    pub next: u64,
    /// Publications made.
    pub publishes: u64,
    /// The host record as last read consistently, and the TSC of that read.
    pub host_seen: Option<(HostVcpu, u64)>,
}

impl Publisher {
    /// Claims this vCPU's records and publishes them once, named `name`; `None` when there is
    /// no usable region or the guest section cannot hold the tables.
    pub fn new(b: Boot, clk: Clock, name: &[u8; COMM_LEN]) -> Option<Publisher> {
        let (sec, host) = find(b)?;
        let n = u64::from(b.vcpu_count);
        let rec = core::mem::size_of::<GuestThread>() as u64;
        let cpus_offset = THREADS_OFFSET + n * rec;
        if b.vcpu_index >= b.vcpu_count || cpus_offset + n * rec > sec.len {
            return None;
        }
        let i = u64::from(b.vcpu_index);
        let hdr = GuestHeader {
            seq: 0,
            magic: GUEST_MAGIC,
            major: MAJOR,
            minor: MINOR,
            nr_cpus: b.vcpu_count,
            updated_ns: 0,
            threads_offset: THREADS_OFFSET as u32,
            threads_count: b.vcpu_count,
            thread_record_size: rec as u32,
            cpus_offset: cpus_offset as u32,
            cpus_count: b.vcpu_count,
            cpu_record_size: core::mem::size_of::<GuestCpu>() as u32,
            transient_count: 0,
            transient_cpu_ns: 0,
        };
        let t = GuestThread {
            tid: b.vcpu_index + 1,
            tgid: 1,
            last_cpu: b.vcpu_index,
            comm: *name,
            ..Default::default()
        };
        let c = GuestCpu {
            cpu: b.vcpu_index,
            ..Default::default()
        };
        let mut p = Publisher {
            thread: (sec.base + THREADS_OFFSET + i * rec) as *mut GuestThread,
            cpu: (sec.base + cpus_offset + i * rec) as *mut GuestCpu,
            header: (i == 0).then_some(sec.base as *mut GuestHeader),
            host,
            hdr,
            t,
            c,
            clk,
            interval: clk.cycles(INTERVAL_NS, 1),
            next: 0,
            publishes: 0,
            host_seen: None,
        };
        p.publish(crate::rdtsc(), &Stats::default(), 0);
        Some(p)
    }

    /// Reads this vCPU's host record; keeps it when the copy is consistent.
    pub fn read_host(&mut self) -> Option<HostVcpu> {
        // SAFETY: `find` checked the record lies inside the region the VMM mapped, 8-byte
        // aligned; the VMM writes it under the sequence protocol; any bits are a valid value.
        if let Ok(h) = unsafe { read_record(self.host, HOST_TRIES) } {
            self.host_seen = Some((h, crate::rdtsc()));
        }
        self.host_seen.map(|(h, _)| h)
    }

    /// Publishes the measurements so far; `now` is the current TSC, `work` the work count.
    pub fn publish(&mut self, now: u64, st: &Stats, work: u64) {
        let clk = self.clk;
        let now_ns = clk.ns(now);
        let lost = clk.ns(st.lost);
        let ran = clk.ns(st.spin).saturating_sub(lost);
        let on_cpu = ran.saturating_add(clk.ns(st.looped));
        let t = &mut self.t;
        t.on_cpu_ns = on_cpu;
        t.utime_ns = on_cpu;
        t.run_delay_ns = lost;
        t.nivcsw = st.gaps;
        t.nvcsw = st.halts;
        t.timeslices = st.gaps + st.halts + 1;
        t.work = work;
        t.updated_ns = now_ns;
        // SAFETY: `new` placed the record inside the guest section, 8-byte aligned (the
        // section's offset and the table offsets are multiples of 8); this vCPU is its only
        // writer.
        unsafe { write_record(self.thread, t) };

        let steal = self.read_host().map_or(0, |h| h.steal_ns);
        let c = &mut self.c;
        c.user_ns = on_cpu;
        c.idle_ns = clk.ns(st.halted);
        c.steal_ns = steal;
        c.context_switches = st.gaps + st.halts;
        c.updated_ns = now_ns;
        // SAFETY: as for the thread record.
        unsafe { write_record(self.cpu, c) };

        if let Some(h) = self.header {
            self.hdr.updated_ns = now_ns;
            // SAFETY: the header is at the section's start (checked inside the region); only
            // vCPU 0 writes it.
            unsafe { write_record(h, &self.hdr) };
        }
        self.publishes += 1;
        self.next = now.saturating_add(self.interval);
    }
}

/// `"<kind>-<index>"`, NUL-padded, cut at [`COMM_LEN`] bytes.
pub fn name(kind: &[u8], index: u32) -> [u8; COMM_LEN] {
    let mut out = [0u8; COMM_LEN];
    let mut len = 0;
    let mut push = |b: u8| {
        if len < COMM_LEN {
            out[len] = b;
            len += 1;
        }
    };
    kind.iter().for_each(|&b| push(b));
    push(b'-');
    crate::digits(index, push);
    out
}
