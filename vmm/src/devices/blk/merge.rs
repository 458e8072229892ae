//! Merging: reads (or writes) a pass takes one after another, each starting where the one
//! before ends in the file, go to the file as one `preadv` (or `pwritev`) over all their
//! buffers, as QEMU's virtio-blk merges them. Under load a queue holds many requests and a
//! sequential reader's or writer's follow each other; one call for several saves each
//! request's system call (~0.2 µs here), the file's checks and page-cache lookup. A pass never
//! waits for a request to merge: it merges only what the guest has already made available,
//! so a queue with one request in flight answers it as before.
//!
//! Data flow: [`super::queue::req_pass`] checks each request
//! ([`super::request::data_of`]); a read or write that continues the [`Batch`] joins it
//! ([`Batch::push`]: its buffers' iovecs appended, its head, status byte and start time
//! kept); anything else first runs the batch ([`Batch::run`]), as does the pass's end. A run
//! moves the data with one call per batch; each request is then answered in the order taken
//! (its status byte, its used entry, its counts). When the merged call fails, each request's
//! data is moved again on its own, so one bad request does not fail its neighbours and each
//! status is its own. Nothing here allocates: the batch's room is made once per queue.

use std::io;
use std::ops::Range;

use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use super::file::Disk;
use super::request::{finish, move_data, Data, Done, HEADER};
use crate::devices::virtio::chain::Segments;

/// Requests merged into one call at most (the most a pass waits to answer the first of them).
pub const MERGE_MAX: usize = 32;
/// The kernel's limit on one call's iovecs (`IOV_MAX`).
pub const IOV_MAX: usize = 1024;

/// One request of a batch, waiting for its data to move.
#[derive(Debug, Clone)]
pub struct Pending {
    /// The chain's head (for the used ring).
    pub head: u16,
    /// Its status byte.
    pub status: GuestAddress,
    /// Its file range.
    pub data: Data,
    /// When its chain was taken (its service time's start), ns.
    pub t0: u64,
    /// Its entries in the batch's iovecs.
    iov: Range<usize>,
}

/// Reads or writes that follow each other in the file, taken but not yet answered.
#[derive(Debug)]
pub struct Batch {
    reqs: Vec<Pending>,
    iov: Vec<libc::iovec>,
    /// The iovecs a call advances (a copy, so that each request's own stay whole for a retry).
    work: Vec<libc::iovec>,
    /// Where the next request must start to join.
    end: u64,
}

impl Default for Batch {
    fn default() -> Self {
        Batch {
            reqs: Vec::with_capacity(MERGE_MAX),
            iov: Vec::with_capacity(IOV_MAX),
            work: Vec::with_capacity(IOV_MAX),
            end: 0,
        }
    }
}

impl Batch {
    /// Requests waiting.
    pub fn len(&self) -> usize {
        self.reqs.len()
    }

    /// No request waits.
    pub fn is_empty(&self) -> bool {
        self.reqs.is_empty()
    }

    /// Whether a request with `d`'s range and `buffers` buffers may join: same direction,
    /// starting where the batch ends, and room left.
    pub fn takes(&self, d: &Data, buffers: usize) -> bool {
        self.reqs.first().is_some_and(|p| {
            p.data.write == d.write
                && d.offset == self.end
                && self.reqs.len() < MERGE_MAX
                && self.iov.len() + buffers <= IOV_MAX
        })
    }

    /// Whether a request of `buffers` buffers can be in a batch at all (else it is served
    /// alone).
    pub fn fits(buffers: usize) -> bool {
        buffers <= IOV_MAX
    }

    /// Adds the request loaded in `segs` with range `d`, taken at `t0`. The caller has
    /// checked [`Batch::takes`] (or that the batch is empty) and [`Batch::fits`]. False
    /// (nothing added) for a chain without a byte for its status.
    pub fn push(&mut self, segs: &Segments, d: Data, t0: u64) -> bool {
        let Some(status) = segs.last_byte() else {
            return false;
        };
        let start = self.iov.len();
        segs.append_iovecs(HEADER, d.len, &mut self.iov);
        if self.reqs.is_empty() {
            self.end = d.offset;
        }
        self.end += d.len;
        self.reqs.push(Pending {
            head: segs.head(),
            status,
            data: d,
            t0,
            iov: start..self.iov.len(),
        });
        true
    }

    /// Drops what waits, unanswered (the pass was abandoned: a reset takes the queue back).
    pub fn clear(&mut self) {
        self.reqs.clear();
        self.iov.clear();
    }

    /// Moves the batch's data on `disk` (one call, or one per request when it fails), then
    /// hands each request and what it did, in order, to `answer`; stops at the first error
    /// `answer` returns. Writes the status bytes into `mem` before each hand-over. Empty
    /// afterwards. Returns how many requests went in the call of the one before them (0 when
    /// the merged call failed and each went alone).
    ///
    /// # Safety
    ///
    /// The iovecs pushed point into `mem`'s mappings, which live for the call: every
    /// request was pushed from a chain loaded against `mem` in this pass.
    pub unsafe fn run<D: Disk, E>(
        &mut self,
        disk: &D,
        mem: &GuestMemoryMmap,
        writeback: bool,
        mut answer: impl FnMut(&Pending, &Done) -> Result<(), E>,
    ) -> Result<u64, E> {
        let Some(first) = self.reqs.first() else {
            return Ok(0);
        };
        let (write, offset) = (first.data.write, first.data.offset);
        // SAFETY: the caller's contract: the iovecs are the requests' buffers in `mem`.
        let all = unsafe { self.moved(disk, 0..self.iov.len(), write, offset, writeback) }.is_ok();
        let alone = !all && self.reqs.len() > 1;
        let mut r = Ok(if all { self.reqs.len() as u64 - 1 } else { 0 });
        for i in 0..self.reqs.len() {
            let p = &self.reqs[i];
            let moved = if alone {
                let (range, at) = (p.iov.clone(), p.data.offset);
                // SAFETY: as above.
                unsafe { self.moved(disk, range, write, at, writeback) }.is_ok()
            } else {
                all
            };
            let p = &self.reqs[i];
            let (status, done) = finish(p.data.kind(), p.data.answer(moved));
            let _ = mem.write_obj(status, p.status);
            if let Err(e) = answer(p, &done) {
                r = Err(e);
                break;
            }
        }
        self.clear();
        r
    }

    /// Moves the data of the iovecs `range` at `offset`.
    ///
    /// # Safety
    ///
    /// As [`Batch::run`].
    unsafe fn moved<D: Disk>(
        &mut self,
        disk: &D,
        range: Range<usize>,
        write: bool,
        offset: u64,
        writeback: bool,
    ) -> io::Result<()> {
        self.work.clear();
        self.work.extend_from_slice(&self.iov[range]);
        // SAFETY: the caller's contract: the iovecs are chain buffers in live guest memory,
        // writable for a read and readable for a write (the request's checks said so).
        unsafe { move_data(disk, write, &mut self.work, offset, writeback) }
    }
}

#[cfg(test)]
mod tests;
