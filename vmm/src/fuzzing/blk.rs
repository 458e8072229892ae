//! The blk fuzz check: a disk's request queue over guest memory that is all fuzzer bytes
//! (descriptor table, rings, headers, buffers), as a hostile driver would leave it, then the
//! same bytes as a driver model's actions ([`super::blkmodel::run`]).
//!
//! Data flow: the first two bytes choose the queue size, EVENT_IDX, the disk's size and what
//! it offers (read-only, DISCARD, WRITE_ZEROES, FLUSH negotiated); the rest is guest memory
//! from address 0, with the descriptor table at 0, the available ring at 0x1000 and the used
//! ring at 0x2000. One request pass ([`req_pass`]) runs over it against an in-memory disk
//! that checks every call it gets. Properties: nothing panics or loops (the pass is bounded
//! by the queue size), no more requests are taken than the queue holds nor (without a
//! fault) than the driver made available, the used index moves by exactly the requests
//! answered, every request is counted once, the disk is never asked for a byte past its end,
//! and a read-only disk is never written, punched or zeroed.

use std::cell::Cell;
use std::io;
use std::num::Wrapping;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use crate::devices::blk::file::{Disk, SECTOR};
use crate::devices::blk::memdisk::MemDisk;
use crate::devices::blk::queue::{req_pass, BlkCounters, ReqQueue};
use crate::devices::blk::request::{Limits, ID_BYTES};
use crate::devices::virtio::counters::QueueCounters;
use crate::devices::virtio::queue::DeviceQueue;

/// Guest memory of the check.
const MEM: usize = 0x1_0000;

/// An in-memory disk that asserts what a correct device may ask of it.
pub struct Checked {
    /// The disk.
    pub inner: MemDisk,
    bytes: u64,
    readonly: bool,
    /// Calls made.
    pub calls: Cell<u64>,
}

impl Checked {
    /// A disk of `sectors`, read-only or not.
    pub fn new(sectors: u64, readonly: bool) -> Self {
        Checked {
            inner: MemDisk::new(sectors),
            bytes: sectors * SECTOR,
            readonly,
            calls: Cell::new(0),
        }
    }

    fn within(&self, offset: u64, len: u64, what: &str) {
        self.calls.set(self.calls.get() + 1);
        assert!(
            offset.checked_add(len).is_some_and(|e| e <= self.bytes),
            "{what} of {len} bytes at {offset} on a disk of {} bytes",
            self.bytes
        );
    }

    fn writes(&self, what: &str) {
        assert!(!self.readonly, "a read-only disk got a {what}");
    }
}

fn total(iov: &[libc::iovec]) -> u64 {
    iov.iter().map(|v| v.iov_len as u64).sum()
}

impl Disk for Checked {
    unsafe fn read_at(&self, iov: &[libc::iovec], offset: u64) -> io::Result<usize> {
        self.within(offset, total(iov), "a read");
        // SAFETY: forwarded from this function's contract.
        unsafe { self.inner.read_at(iov, offset) }
    }

    unsafe fn write_at(&self, iov: &[libc::iovec], offset: u64) -> io::Result<usize> {
        self.writes("write");
        self.within(offset, total(iov), "a write");
        // SAFETY: forwarded from this function's contract.
        unsafe { self.inner.write_at(iov, offset) }
    }

    fn sync(&self) -> io::Result<()> {
        self.inner.sync()
    }

    fn punch(&self, offset: u64, len: u64) -> io::Result<()> {
        self.writes("punch");
        self.within(offset, len, "a punch");
        self.inner.punch(offset, len)
    }

    fn zero(&self, offset: u64, len: u64) -> io::Result<()> {
        self.writes("zeroing");
        self.within(offset, len, "a zeroing");
        self.inner.zero(offset, len)
    }
}

/// The disk's limits from one setup byte and its size in sectors.
pub fn limits_of(flags: u8, sectors: u64) -> Limits {
    let mut id = [0u8; ID_BYTES];
    id[..4].copy_from_slice(b"blk0");
    let readonly = flags & 0x20 != 0;
    Limits {
        sectors,
        readonly,
        discard: !readonly && flags & 0x40 != 0,
        write_zeroes: !readonly && flags & 0x80 != 0,
        writeback: flags & 0x08 == 0,
        id,
    }
}

/// `data` as guest memory under a disk's request queue, then the same bytes as a driver
/// model's actions.
pub fn blk(data: &[u8]) {
    hostile(data);
    super::blkmodel::run(data);
}

/// `data` as guest memory under a disk's request queue.
fn hostile(data: &[u8]) {
    let Some((&[head, disk], rest)) = data.split_first_chunk::<2>() else {
        return;
    };
    let size = 1u16 << (head & 7).min(8);
    let Ok(mem) = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), MEM)]) else {
        return;
    };
    let n = rest.len().min(MEM);
    if mem.write_slice(&rest[..n], GuestAddress(0)).is_err() {
        return;
    }
    let mut q = match Queue::new(256) {
        Ok(q) => q,
        Err(_) => return,
    };
    let set = q.try_set_size(size).is_ok()
        && q.try_set_desc_table_address(GuestAddress(0)).is_ok()
        && q.try_set_avail_ring_address(GuestAddress(0x1000)).is_ok()
        && q.try_set_used_ring_address(GuestAddress(0x2000)).is_ok();
    q.set_event_idx(head & 0x10 != 0);
    q.set_ready(true);
    if !set || !q.is_valid(&mem) {
        return;
    }
    let offered = q
        .avail_idx(&mem, Ordering::Acquire)
        .map_or(0, |i| (i - Wrapping(q.next_avail())).0);
    let before = q.next_used();
    let sectors = u64::from(disk) + 1;
    let limits = limits_of(head, sectors);
    let d = Checked::new(sectors, limits.readonly);
    let mem = Arc::new(mem);
    let Ok(dq) = DeviceQueue::new(q, &mem) else {
        return;
    };
    let mut rq = ReqQueue::new(dq, limits);
    let (qc, bc) = (QueueCounters::default(), BlkCounters::default());
    let o = req_pass(&mut rq, &mem, &d, &qc, &bc, || true);
    assert!(
        o.handled <= u64::from(size),
        "{} requests from a queue of {size}",
        o.handled
    );
    if o.fault.is_none() {
        assert!(
            o.handled <= u64::from(offered),
            "more requests than made available"
        );
    }
    assert_eq!(
        rq.dq.queue().next_used().wrapping_sub(before),
        o.handled as u16,
        "the used index moves by the requests answered"
    );
    let counts = bc.counts();
    assert_eq!(
        counts.requests.iter().sum::<u64>(),
        o.handled,
        "each counted once"
    );
    assert_eq!(qc.packets.get(), o.handled);
    assert!(counts.errors.iter().sum::<u64>() <= o.handled);
    assert_eq!(qc.bytes.get(), counts.read + counts.written);
}
