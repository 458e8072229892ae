//! Descriptor chains as untrusted input: a chain the driver made available is walked with
//! `virtio_queue`'s iterator and turned into a bounded list of checked guest buffers, or
//! refused with the reason.
//!
//! Data flow: a device thread pops a chain from its queue and calls [`Segments::load`] with
//! the direction the device needs (readable for a transmit queue, writable for a receive
//! queue). Every descriptor is checked: the chain must end (a chain cut short by a loop, a
//! descriptor index past the table, an unreadable descriptor or more descriptors than the
//! queue holds is `Broken`), each buffer must lie wholly in guest memory (`OutsideMemory`:
//! this is also where a 4 GiB length lands), point the right way (`WrongDirection`), and the
//! chain must carry at least one byte (`Empty`). The device then reads or writes the
//! buffers through [`Segments::slices`]; nothing here allocates after the list is made (its
//! capacity is the largest queue size) and every loop is bounded by the queue size.

use std::ops::Deref;

use virtio_queue::DescriptorChain;
use vm_memory::{GuestAddress, GuestMemory, GuestMemoryBackend, GuestMemoryMmap, VolatileSlice};

/// Why a chain was refused (each sets NEEDS_RESET: the virtio spec's answer to a driver that
/// made a malformed chain).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ChainError {
    /// The chain does not end: a loop, an index past the descriptor table, a descriptor that
    /// cannot be read, or more descriptors than the queue has.
    Broken,
    /// A buffer is not wholly inside guest RAM (or its length wraps).
    OutsideMemory,
    /// A buffer points the wrong way: a device-readable buffer where the device must write,
    /// or a writable one where it must read.
    WrongDirection,
    /// The chain carries no bytes at all, or fewer than the device's header.
    Empty,
}

impl ChainError {
    /// A sentence for the log.
    pub fn describe(self) -> &'static str {
        match self {
            ChainError::Broken => {
                "a descriptor chain does not end (a loop, an index past the table, or longer than the queue)"
            }
            ChainError::OutsideMemory => "a descriptor's buffer lies outside guest memory",
            ChainError::WrongDirection => {
                "a descriptor's buffer points the wrong way (read-only where the device must write, or the reverse)"
            }
            ChainError::Empty => "a descriptor chain is too short to hold the device's header",
        }
    }
}

/// Which way the device moves data through a chain's buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// The device reads (a transmit request): every buffer must be device-readable.
    Read,
    /// The device writes (a receive buffer): every buffer must be device-writable.
    Write,
    /// A request and its answer (a control command): device-readable buffers first, then
    /// device-writable ones.
    ReadThenWrite,
}

/// One checked buffer of a chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    /// Guest-physical address.
    pub addr: u64,
    /// Bytes (never 0: zero-length descriptors are skipped).
    pub len: u32,
    /// Where the buffer is mapped in this process, found when the chain was checked: the
    /// buffer lies wholly in one guest memory region, mapped for the VM's life, so the I/O
    /// paths need not look it up again.
    pub host: usize,
}

impl Segment {
    /// The buffer as an `iovec` for the kernel to read or write.
    pub fn iovec(&self) -> libc::iovec {
        libc::iovec {
            iov_base: self.host as *mut libc::c_void,
            iov_len: self.len as usize,
        }
    }
}

/// The checked buffers of one chain. Made once per queue with room for the largest chain a
/// queue may hold, then reused: loading a chain never allocates.
#[derive(Debug)]
pub struct Segments {
    list: Vec<Segment>,
    total: u64,
    /// How many of the buffers, from the start, are device-readable.
    readable: usize,
    head: u16,
    max: usize,
}

impl Segments {
    /// Room for chains of up to `max_descriptors` descriptors (the queue's size).
    pub fn with_capacity(max_descriptors: usize) -> Self {
        Segments {
            list: Vec::with_capacity(max_descriptors),
            total: 0,
            readable: 0,
            head: 0,
            max: max_descriptors,
        }
    }

    /// Walks `chain`, checking each descriptor against `mem` and `dir`; at least `min_len`
    /// bytes must be there. On success the buffers are in [`Segments::list`].
    pub fn load<M>(
        &mut self,
        chain: DescriptorChain<M>,
        mem: &GuestMemoryMmap,
        dir: Direction,
        min_len: u64,
    ) -> Result<(), ChainError>
    where
        M: Deref,
        M::Target: GuestMemory,
    {
        self.list.clear();
        self.total = 0;
        self.readable = 0;
        self.head = chain.head_index();
        let mut ended = false;
        let mut writing = dir == Direction::Write;
        for (n, d) in chain.enumerate() {
            if n >= self.max {
                return Err(ChainError::Broken);
            }
            if dir == Direction::ReadThenWrite && d.is_write_only() {
                writing = true;
            }
            if d.is_write_only() != writing {
                return Err(ChainError::WrongDirection);
            }
            ended = !d.has_next();
            if d.len() == 0 {
                continue;
            }
            let addr = d.addr().0;
            if addr.checked_add(u64::from(d.len())).is_none() {
                return Err(ChainError::OutsideMemory);
            }
            let Ok(slice) = mem.get_slice(GuestAddress(addr), d.len() as usize) else {
                return Err(ChainError::OutsideMemory);
            };
            self.list.push(Segment {
                addr,
                len: d.len(),
                host: slice.ptr_guard().as_ptr() as usize,
            });
            self.total += u64::from(d.len());
            if !writing {
                self.readable += 1;
            }
        }
        if !ended {
            return Err(ChainError::Broken);
        }
        if self.total < min_len.max(1) {
            return Err(ChainError::Empty);
        }
        Ok(())
    }

    /// The buffers of the chain last loaded.
    pub fn list(&self) -> &[Segment] {
        &self.list
    }

    /// The device-readable buffers at the start of the chain, and the writable ones after.
    pub fn split(&self) -> (&[Segment], &[Segment]) {
        self.list.split_at(self.readable)
    }

    /// The chain's head index (for the used ring).
    pub fn head(&self) -> u16 {
        self.head
    }

    /// Bytes in all buffers.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// The buffers as volatile slices of `mem` (each was checked when loaded, so each is
    /// there; a buffer that vanished since yields nothing).
    pub fn slices<'m>(
        &'m self,
        mem: &'m GuestMemoryMmap,
    ) -> impl Iterator<Item = VolatileSlice<'m, ()>> + 'm {
        self.list
            .iter()
            .filter_map(|s| mem.get_slice(GuestAddress(s.addr), s.len as usize).ok())
    }

    /// Replaces `out` with `iovec`s over the chain's bytes `[skip, skip + len)` (as many as
    /// there are), in order; returns how many bytes they cover. At most one entry per buffer:
    /// `out`, made with the queue's size as capacity, never grows. The entries point into
    /// the guest memory's mappings the chain was loaded against, valid while that memory
    /// lives (the caller's I/O must end before it goes).
    pub fn iovecs(&self, skip: u64, len: u64, out: &mut Vec<libc::iovec>) -> u64 {
        out.clear();
        self.append_iovecs(skip, len, out)
    }

    /// As [`Segments::iovecs`], after what `out` already holds: at most one entry per buffer
    /// is added. The addresses are the ones found when the chain was loaded (no lookup).
    pub fn append_iovecs(&self, skip: u64, len: u64, out: &mut Vec<libc::iovec>) -> u64 {
        let (mut skip, mut left) = (skip, len);
        for s in &self.list {
            if left == 0 {
                break;
            }
            let n = u64::from(s.len);
            if skip >= n {
                skip -= n;
                continue;
            }
            let take = (n - skip).min(left);
            out.push(libc::iovec {
                // Inside the buffer: skip < n, and the buffer lies wholly in one mapping.
                iov_base: s.host.wrapping_add(skip as usize) as *mut libc::c_void,
                iov_len: take as usize,
            });
            left -= take;
            skip = 0;
        }
        len - left
    }

    /// The guest address of the chain's last byte (a block request's status byte).
    pub fn last_byte(&self) -> Option<GuestAddress> {
        self.list
            .last()
            .map(|s| GuestAddress(s.addr + u64::from(s.len) - 1))
    }

    /// Copies up to `bytes.len()` bytes into the buffers in order, skipping the first `skip`
    /// bytes of the chain; returns how many were copied.
    pub fn write_at(&self, mem: &GuestMemoryMmap, skip: u64, bytes: &[u8]) -> usize {
        let mut skip = skip;
        let mut done = 0;
        for s in self.slices(mem) {
            if done == bytes.len() {
                break;
            }
            let len = s.len() as u64;
            if skip >= len {
                skip -= len;
                continue;
            }
            let room = (len - skip) as usize;
            let n = room.min(bytes.len() - done);
            if let Ok(sub) = s.subslice(skip as usize, n) {
                sub.copy_from(&bytes[done..done + n]);
            }
            done += n;
            skip = 0;
        }
        done
    }

    /// Copies the chain's first `out.len()` bytes (or fewer) into `out`; returns how many.
    pub fn read_into(&self, mem: &GuestMemoryMmap, out: &mut [u8]) -> usize {
        self.read_at(mem, 0, out)
    }

    /// Copies the chain's bytes from `skip` on into `out` (as many as fit or are there);
    /// returns how many.
    pub fn read_at(&self, mem: &GuestMemoryMmap, skip: u64, out: &mut [u8]) -> usize {
        let mut skip = skip;
        let mut done = 0;
        for s in self.slices(mem) {
            if done == out.len() {
                break;
            }
            let len = s.len() as u64;
            if skip >= len {
                skip -= len;
                continue;
            }
            let n = ((len - skip) as usize).min(out.len() - done);
            if let Ok(sub) = s.subslice(skip as usize, n) {
                sub.copy_to(&mut out[done..done + n]);
            }
            done += n;
            skip = 0;
        }
        done
    }
}

#[cfg(test)]
mod tests;
