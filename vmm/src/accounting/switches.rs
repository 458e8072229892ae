//! A vCPU thread's perf ring, read without system calls: its context-switch records (where
//! each KVM_RUN interval's off-CPU time went: preempted or blocked) and, where the kernel has
//! them, KVM's and the host's interrupt tracepoints (guest mode, in-kernel exits, interrupts),
//! for the exact split of level `full`.
//!
//! Data flow: the vCPU thread opens a perf software event on itself ([`SwitchRing::open`]:
//! `PERF_COUNT_SW_DUMMY` with `context_switch`, `sample_id_all`, `PERF_SAMPLE_TIME` and
//! `use_clockid = CLOCK_MONOTONIC`, so record times are on the vDSO clock the recorder
//! stamps with) and maps its ring; the tracepoints of [`events`] send their records into the
//! same ring, so all of them are in one time order. The kernel appends a record at every switch
//! of the thread (a switch-out, flagged when the thread was preempted, and a switch-in), at
//! every guest entry and exit, and at each interrupt's entry and exit. At each KVM_RUN boundary
//! the recorder calls [`SwitchRing::drain_to`]: one load of the ring's head; when it moved, the
//! records since the last drain are paired ([`pairing`]) into off-CPU episodes, guest-mode
//! segments, in-kernel exits and interrupts, summed ([`Tally`]) on the sides of two boundary
//! times (a KVM_RUN's entry and exit stamps), then the tail is given back. Readers (the
//! sampler, `stats`) may look at the records not yet drained ([`RingView::peek`]) to see an
//! episode still in progress, and check that the vCPU thread did not drain them meanwhile.
//!
//! The kernel writes a record only when it fits; a lost one is reported late
//! (`PERF_RECORD_LOST` once space frees), so a drain that finds the ring nearly full, a
//! `PERF_RECORD_LOST`, or records that do not pair flags its tally `lost`, and the accounting
//! falls back to what the thread CPU clock says for that window (docs/accounting.md). Each
//! time half the ring has been written, perf sends the vCPU thread the kick signal
//! ([`events::signal_on_wakeup`]), so a thread that stays inside KVM_RUN (a guest whose exits
//! KVM handles itself) comes out to drain it before it overflows.
//!
//! Measured on the development host (platform.md): ~2.5 ns per record to drain, ~2 µs of
//! kernel time per off-CPU episode of the traced thread, 30-130 ns on every other context
//! switch of the host while such an event exists.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

pub mod events;
pub mod pairing;

use events::{TraceCatalog, TraceError, TraceFds};
use pairing::{decode, Layout};
pub use pairing::{Bounds, Pairing, Record, Tally, TraceSink, ALL_ON_SIDE_1};

/// `perf_event_attr` as of `PERF_ATTR_SIZE_VER8` (include/uapi/linux/perf_event.h). Only
/// the fields this module sets are named; the bit fields are one `u64`.
#[repr(C)]
#[derive(Default)]
pub(crate) struct PerfEventAttr {
    pub(crate) type_: u32,
    pub(crate) size: u32,
    pub(crate) config: u64,
    pub(crate) sample_period: u64,
    pub(crate) sample_type: u64,
    pub(crate) read_format: u64,
    pub(crate) flags: u64,
    pub(crate) wakeup_events: u32,
    pub(crate) bp_type: u32,
    pub(crate) config1: u64,
    pub(crate) config2: u64,
    pub(crate) branch_sample_type: u64,
    pub(crate) sample_regs_user: u64,
    pub(crate) sample_stack_user: u32,
    pub(crate) clockid: i32,
    pub(crate) sample_regs_intr: u64,
    pub(crate) aux_watermark: u32,
    pub(crate) sample_max_stack: u16,
    pub(crate) reserved_2: u16,
    pub(crate) aux_sample_size: u32,
    pub(crate) reserved_3: u32,
    pub(crate) sig_data: u64,
    pub(crate) config3: u64,
}

const PERF_TYPE_SOFTWARE: u32 = 1;
const PERF_COUNT_SW_DUMMY: u64 = 9;
const PERF_SAMPLE_TIME: u64 = 1 << 2;
const FLAG_DISABLED: u64 = 1 << 0;
const FLAG_EXCLUDE_KERNEL: u64 = 1 << 5;
const FLAG_EXCLUDE_HV: u64 = 1 << 6;
const FLAG_SAMPLE_ID_ALL: u64 = 1 << 18;
const FLAG_USE_CLOCKID: u64 = 1 << 25;
const FLAG_CONTEXT_SWITCH: u64 = 1 << 26;
/// perf_event_open's flag for a close-on-exec descriptor (the vCPU filter checks for it).
pub const PERF_FLAG_FD_CLOEXEC: libc::c_ulong = 1 << 3;
/// The ioctl that starts the event (the vCPU filter allows it).
pub const PERF_EVENT_IOC_ENABLE: libc::c_ulong = 0x2400;
/// The ioctl that stops the event (the vCPU filter allows it).
pub const PERF_EVENT_IOC_DISABLE: libc::c_ulong = 0x2401;

/// Offsets in the first (control) page of the mapping: `data_head`, `data_tail`,
/// `data_offset`, `data_size` of `struct perf_event_mmap_page`.
const DATA_HEAD: usize = 1024;
const DATA_TAIL: usize = 1032;
const DATA_OFFSET: usize = 1040;
const DATA_SIZE: usize = 1048;

/// Free bytes below which a drain assumes the kernel may have dropped a record (a switch
/// record is 16 bytes, a lost record 32, a tracepoint sample at most ~128).
const FULL_SLACK: u64 = 256;

/// Data pages tried, largest first (a power of two each): 16 pages hold ~2,000 off-CPU
/// episodes of one KVM_RUN; an unprivileged user's perf mlock budget (516 KiB by default)
/// may allow only smaller rings for many vCPUs.
const DATA_PAGES: [usize; 3] = [16, 4, 1];

/// Data pages tried with tracepoints: 64 pages (256 KiB) hold ~1,600 in-kernel exits (two
/// records of 64 and 96 bytes each) between two wakeups of the thread.
const TRACE_DATA_PAGES: [usize; 4] = [64, 16, 4, 1];

/// The mapped ring, shared by its consumer (the vCPU thread) and readers that peek.
#[derive(Debug)]
pub struct RingView {
    base: NonNull<u8>,
    len: usize,
    data_offset: usize,
    data_size: u64,
    layout: Layout,
}

// SAFETY: the mapping is process memory valid until drop; every access goes through atomic
// loads and stores (the control words) or volatile reads of 8-byte words (the records), so
// sharing the pointer between threads is sound.
unsafe impl Send for RingView {}
// SAFETY: as above: no access through `&RingView` writes except the atomic tail store, whose
// single writer is the consumer by contract (`SwitchRing` owns the only `&mut` path to it).
unsafe impl Sync for RingView {}

impl RingView {
    fn control(&self, off: usize) -> &AtomicU64 {
        // SAFETY: `off` is one of the 8-byte aligned control-word offsets inside the first
        // page of the live mapping (len > 4096), which the kernel and this process access
        // atomically; AtomicU64 has the layout of u64.
        unsafe { &*(self.base.as_ptr().add(off) as *const AtomicU64) }
    }

    /// The kernel's write position (acquire: records before it are complete).
    fn head(&self) -> u64 {
        self.control(DATA_HEAD).load(Ordering::Acquire)
    }

    /// The consumer's read position.
    fn tail(&self) -> u64 {
        self.control(DATA_TAIL).load(Ordering::Acquire)
    }

    /// The u64 at ring position `pos` (8-byte aligned; positions wrap at the data size).
    fn word(&self, pos: u64) -> u64 {
        let off = self.data_offset + (pos % self.data_size) as usize;
        debug_assert!(off + 8 <= self.len && off % 8 == 0);
        // SAFETY: `off` is inside the data area of the live mapping (data_offset + data_size
        // <= len, checked at open) and 8-byte aligned (records are multiples of 8 bytes and
        // the data area is page aligned); a volatile read of memory the kernel may write
        // concurrently (only in the free area; see `peek`) cannot be torn within a word.
        unsafe { std::ptr::read_volatile(self.base.as_ptr().add(off) as *const u64) }
    }

    /// Walks the records in `[from, to)`, calling `f` with each.
    fn walk(&self, from: u64, to: u64, mut f: impl FnMut(Record)) {
        let mut pos = from;
        while pos < to {
            let (r, size) = decode(&self.layout, |i| self.word(pos + 8 * i));
            if size < 8 || size % 8 != 0 || pos + size > to {
                f(Record::Lost);
                return;
            }
            f(r);
            pos += size;
        }
    }

    /// What the records not yet drained say, for a reader, if the consumer's tail is still
    /// `tail` before and after the look (otherwise the consumer drained them meanwhile:
    /// `None`). `pairing` is the consumer's pairing state as of that tail.
    pub fn peek(&self, tail: u64, pairing: Pairing) -> Option<(Tally, Pairing)> {
        self.peek_on(tail, tail, pairing, Tally::default())
            .map(|(_, t, p)| (t, p))
    }

    /// [`RingView::peek`] going on from an earlier look at the same `tail`: `from` is where
    /// that look stopped (a position at or past `tail`), `pairing` and `tally` what it had
    /// found there. Walks only the records written since, and returns where it stopped with
    /// the tally and pairing state of everything from `tail`: what a whole walk would give.
    /// `None` as for `peek`, or when `from` is not a position between `tail` and the head.
    pub fn peek_on(
        &self,
        tail: u64,
        from: u64,
        pairing: Pairing,
        tally: Tally,
    ) -> Option<(u64, Tally, Pairing)> {
        if self.tail() != tail {
            return None;
        }
        let head = self.head();
        if head.wrapping_sub(tail) > self.data_size || from < tail || from > head {
            return None;
        }
        let mut p = pairing;
        let mut t = tally;
        self.walk(from, head, |r| p.feed(r, ALL_ON_SIDE_1, &mut t));
        (self.tail() == tail).then_some((head, t, p))
    }

    /// A reader's look that goes on from an earlier one: while the consumer's tail is still
    /// `tail` (before and after), walks the records from `from` (a position an earlier look
    /// reached, at or past `tail`, whose pairing state was `pairing`) to the head, giving each
    /// completed episode to `sink`. Returns where it stopped and the pairing state there, or
    /// `None` when the consumer drained meanwhile, `from` is not a position of this ring, or
    /// the switch records do not pair. Interrupt records are skipped: the look is after
    /// episodes, and an interrupt whose entry the kernel did not record (seen on the
    /// development host: a run of `call_function_single` exits right after a switch-in) says
    /// nothing about them.
    pub fn peek_from(
        &self,
        tail: u64,
        from: u64,
        pairing: Pairing,
        sink: &mut impl TraceSink,
    ) -> Option<(u64, Pairing)> {
        if self.tail() != tail {
            return None;
        }
        let head = self.head();
        if head.wrapping_sub(tail) > self.data_size || from < tail || from > head {
            return None;
        }
        let mut p = pairing;
        let mut t = Tally::default();
        self.walk(from, head, |r| {
            if !matches!(r, Record::IrqEnter { .. } | Record::IrqExit { .. }) {
                p.feed_to(r, ALL_ON_SIDE_1, &mut t, sink);
            }
        });
        (self.tail() == tail && !t.lost).then_some((head, p))
    }
}

impl Drop for RingView {
    fn drop(&mut self) {
        // SAFETY: `base`/`len` are the mapping made in `SwitchRing::open`, unmapped once here.
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.len) };
    }
}

/// The calling thread's ring: the consumer side.
#[derive(Debug)]
pub struct SwitchRing {
    view: Arc<RingView>,
    fd: OwnedFd,
    trace: TraceFds,
    tail: u64,
    pairing: Pairing,
    enabled: bool,
}

/// What [`SwitchRing::open`] gave: the ring, and why each group of tracepoints is not in it.
#[derive(Debug)]
pub struct OpenedRing {
    /// The ring (context-switch records, and the tracepoints that could be opened).
    pub ring: SwitchRing,
    /// Why KVM's tracepoints are not in it (None: they are).
    pub kvm: Option<TraceError>,
    /// Why the interrupt tracepoints are not in it (None: they are).
    pub irq: Option<TraceError>,
}

impl SwitchRing {
    /// Opens the context-switch event for the calling thread, disabled, with the largest ring
    /// the perf memory budget allows, and the tracepoints of `trace` into the same ring.
    /// `signal` (a signal and this thread's id): perf sends it when the ring needs a drain.
    /// Fails where perf events are unavailable or forbidden (`perf_event_paranoid` above 2,
    /// seccomp, no CONFIG_PERF_EVENTS); tracepoints that cannot be had leave their reason in
    /// the result.
    pub fn open(
        trace: Option<&TraceCatalog>,
        signal: Option<(libc::c_int, libc::pid_t)>,
    ) -> io::Result<OpenedRing> {
        let attr = PerfEventAttr {
            type_: PERF_TYPE_SOFTWARE,
            size: std::mem::size_of::<PerfEventAttr>() as u32,
            config: PERF_COUNT_SW_DUMMY,
            sample_type: PERF_SAMPLE_TIME,
            flags: FLAG_DISABLED
                | FLAG_EXCLUDE_KERNEL
                | FLAG_EXCLUDE_HV
                | FLAG_SAMPLE_ID_ALL
                | FLAG_USE_CLOCKID
                | FLAG_CONTEXT_SWITCH,
            clockid: libc::CLOCK_MONOTONIC,
            ..Default::default()
        };
        let fd = open_on_self(&attr)?;
        let pages: &[usize] = match trace {
            Some(t) if t.any() => &TRACE_DATA_PAGES,
            _ => &DATA_PAGES,
        };
        let layout = trace.map(TraceCatalog::layout).unwrap_or_default();
        let mut last = io::Error::from(io::ErrorKind::OutOfMemory);
        let view = pages.iter().find_map(|&n| match map(&fd, n, layout) {
            Ok(v) => Some(v),
            Err(e) => {
                last = e;
                None
            }
        });
        let Some(view) = view else {
            return Err(last);
        };
        if let Some((sig, tid)) = signal {
            events::signal_on_wakeup(&fd, sig, tid);
        }
        // The ring must exist before other events can send their records into it.
        let opened = match trace {
            Some(t) => TraceFds::open(t, &fd, signal),
            None => events::Opened {
                fds: TraceFds::default(),
                kvm: Some(TraceError::Disabled),
                irq: Some(TraceError::Disabled),
                sched: Some(TraceError::Disabled),
            },
        };
        // Without it level full still measures; only pressure's handoffs are missing
        // (docs/accounting.md, "Pressure").
        if let (Some(e), Some(_)) = (&opened.sched, trace) {
            log::debug!("no handoffs for pressure: {}", e.sentence());
        }
        Ok(OpenedRing {
            ring: SwitchRing {
                view: Arc::new(view),
                fd,
                trace: opened.fds,
                tail: 0,
                pairing: Pairing::default(),
                enabled: false,
            },
            kvm: opened.kvm,
            irq: opened.irq,
        })
    }

    /// The ring for readers.
    pub fn view(&self) -> Arc<RingView> {
        Arc::clone(&self.view)
    }

    /// Bytes of record space.
    pub fn capacity(&self) -> u64 {
        self.view.data_size
    }

    /// Whether the events are counting.
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// Whether KVM's tracepoints send records here.
    pub fn has_kvm(&self) -> bool {
        self.trace.has_kvm()
    }

    /// Whether the interrupt tracepoints send records here.
    pub fn has_irq(&self) -> bool {
        self.trace.has_irq()
    }

    /// Stops using KVM's tracepoints (a host whose KVM does not fire them: nothing to wait
    /// for); they are turned off, and closed when the records are dropped.
    pub fn drop_kvm(&mut self) {
        self.trace.drop_kvm();
    }

    /// Starts or stops the records (a system call per event, made only when the level
    /// changes). When started again, what the ring holds from before is dropped.
    pub fn set_enabled(&mut self, on: bool) -> io::Result<()> {
        if on == self.enabled {
            return Ok(());
        }
        let result = if on {
            events::ioctl_enable(&self.fd, true).and_then(|()| self.trace.set_enabled(true))
        } else {
            // The tracepoints first and the context-switch event last: a preemption inside
            // their system calls is still recorded, and the next entry's drain (at the old
            // level: the switch takes effect after it) takes it from the interval before.
            let trace = self.trace.set_enabled(false);
            events::ioctl_enable(&self.fd, false).and(trace)
        };
        if let Err(e) = result {
            let _ = self.trace.set_enabled(false);
            let _ = events::ioctl_enable(&self.fd, false);
            self.enabled = false;
            return Err(e);
        }
        self.enabled = on;
        if on {
            self.skip();
        }
        Ok(())
    }

    /// Drops what the ring holds.
    fn skip(&mut self) {
        self.tail = self.view.head();
        self.view
            .control(DATA_TAIL)
            .store(self.tail, Ordering::Release);
        self.pairing.clear();
    }

    /// The consumer position and pairing state as of the last drain, for readers' peeks.
    pub fn position(&self) -> (u64, Pairing) {
        (self.tail, self.pairing)
    }

    /// Reads the records the kernel added since the last drain into a tally, split at
    /// `bounds`, and frees their space. Without new records it costs one load.
    #[inline]
    pub fn drain(&mut self, bounds: Bounds) -> Tally {
        self.drain_to(bounds, &mut (), None)
    }

    /// [`SwitchRing::drain`], giving completed in-kernel exits and interrupts to `sink`;
    /// `end_run`: the drain follows a KVM_RUN's return, for a signal or not (see
    /// [`Pairing::end_run`]; the run ended at `bounds[1]`).
    #[inline]
    pub fn drain_to(
        &mut self,
        bounds: Bounds,
        sink: &mut impl TraceSink,
        end_run: Option<bool>,
    ) -> Tally {
        let head = self.view.head();
        let mut t = Tally::default();
        if head != self.tail {
            self.drain_slow(head, bounds, &mut t, sink);
        }
        if let Some(intr) = end_run {
            self.pairing.end_run(&mut t, bounds[1], intr, sink);
        }
        t
    }

    #[cold]
    fn drain_slow(&mut self, head: u64, bounds: Bounds, t: &mut Tally, sink: &mut impl TraceSink) {
        let used = head.wrapping_sub(self.tail);
        if used > self.view.data_size {
            // Not a position this consumer can have left: start again from the head.
            t.lost = true;
            self.skip();
            return;
        }
        if self.view.data_size - used < FULL_SLACK {
            t.lost = true;
        }
        let mut p = self.pairing;
        self.view
            .walk(self.tail, head, |r| p.feed_to(r, bounds, t, sink));
        self.pairing = p;
        self.tail = head;
        // Release: our reads of the records happen before the kernel may reuse their space.
        self.view.control(DATA_TAIL).store(head, Ordering::Release);
    }
}

/// Maps the event's control page and `pages` data pages.
fn map(fd: &OwnedFd, pages: usize, layout: Layout) -> io::Result<RingView> {
    let page = 4096usize;
    let len = page * (1 + pages);
    // SAFETY: a fresh shared mapping of the perf fd (the kernel chooses the address); the
    // result is checked before use.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd.as_raw_fd(),
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    let base = NonNull::new(p.cast::<u8>()).ok_or_else(|| io::Error::from(io::ErrorKind::Other))?;
    let mut view = RingView {
        base,
        len,
        data_offset: page,
        data_size: (page * pages) as u64,
        layout,
    };
    // Kernels since 4.1 say where the data area is; older ones leave zeros (one page in).
    let (off, size) = (
        view.control(DATA_OFFSET).load(Ordering::Relaxed),
        view.control(DATA_SIZE).load(Ordering::Relaxed),
    );
    if off != 0 && size != 0 {
        if off as usize % page != 0 || off as usize + size as usize > len || size % 8 != 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "the perf ring's data area is not inside its mapping",
            ));
        }
        view.data_offset = off as usize;
        view.data_size = size;
    }
    Ok(view)
}

/// Opens the perf event `attr` on the calling thread (any CPU, no group), close-on-exec.
pub(super) fn open_on_self(attr: &PerfEventAttr) -> io::Result<OwnedFd> {
    // SAFETY: `attr` is a valid perf_event_attr whose `size` field says how much the kernel
    // may read; pid 0 / cpu -1 is the calling thread on any CPU; no group fd.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_perf_event_open,
            attr as *const PerfEventAttr,
            0,
            -1,
            -1,
            PERF_FLAG_FD_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the syscall returned a new file descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

#[cfg(test)]
#[path = "switches_tests.rs"]
mod tests;
