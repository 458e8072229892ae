//! A disk in memory behind the [`Disk`] trait, for the unit tests and the fuzzer's model: the
//! same requests as on a file, with every operation counted and failures on demand.
//!
//! Data flow: a test or the fuzzer makes a [`MemDisk`] of some sectors, hands it to
//! `serve` or `req_pass` in place of a `DiskFile`, and then compares its bytes with what the
//! guest's requests should have left.

use std::cell::{Cell, RefCell};
use std::io;

use super::file::Disk;

/// A disk of bytes in memory, for one thread (the tests and the fuzzer are single-threaded).
#[derive(Debug, Default)]
pub struct MemDisk {
    /// The disk's bytes.
    pub bytes: RefCell<Vec<u8>>,
    /// Syncs asked.
    pub syncs: Cell<u64>,
    /// Bytes written since the last sync (what a crash would lose).
    pub unsynced: Cell<u64>,
    /// When set, every operation fails with EIO.
    pub fail: Cell<bool>,
    /// When set, each read or write moves at most this many bytes (short transfers).
    pub chunk: Cell<Option<usize>>,
    /// Reads and writes asked (calls, not bytes: merged requests make one).
    pub calls: Cell<u64>,
    /// When set, a read or write that reaches into these bytes `[start, end)` fails with EIO
    /// (a bad spot on the disk).
    pub bad: Cell<Option<(u64, u64)>>,
}

impl MemDisk {
    /// `sectors` zeroed sectors.
    pub fn new(sectors: u64) -> Self {
        MemDisk {
            bytes: RefCell::new(vec![0; (sectors * super::file::SECTOR) as usize]),
            ..MemDisk::default()
        }
    }

    fn check(&self) -> io::Result<()> {
        if self.fail.get() {
            Err(io::Error::from_raw_os_error(libc::EIO))
        } else {
            Ok(())
        }
    }

    /// A read or write of `iov` at `offset`: counted, and refused where it reaches a bad spot.
    fn transfer(&self, iov: &[libc::iovec], offset: u64) -> io::Result<()> {
        self.calls.set(self.calls.get() + 1);
        self.check()?;
        let len: u64 = iov.iter().map(|v| v.iov_len as u64).sum();
        match self.bad.get() {
            Some((s, e)) if offset < e && s < offset + len => {
                Err(io::Error::from_raw_os_error(libc::EIO))
            }
            _ => Ok(()),
        }
    }

    fn fill(&self, offset: u64, len: u64) -> io::Result<()> {
        self.check()?;
        let mut b = self.bytes.borrow_mut();
        let (start, end) = (offset as usize, (offset + len) as usize);
        if end > b.len() {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        b[start..end].fill(0);
        self.unsynced.set(self.unsynced.get() + len);
        Ok(())
    }
}

impl Disk for MemDisk {
    unsafe fn read_at(&self, iov: &[libc::iovec], offset: u64) -> io::Result<usize> {
        self.transfer(iov, offset)?;
        let b = self.bytes.borrow();
        let mut at = offset as usize;
        let limit = self.chunk.get().unwrap_or(usize::MAX);
        let mut done = 0;
        for v in iov {
            let n = v.iov_len.min(b.len().saturating_sub(at)).min(limit - done);
            // SAFETY: the caller's contract: the iovec is writable memory of its length; the
            // source is inside the disk's bytes (n is clamped to them).
            unsafe { std::ptr::copy_nonoverlapping(b.as_ptr().add(at), v.iov_base.cast(), n) };
            at += n;
            done += n;
            if n < v.iov_len {
                break;
            }
        }
        Ok(done)
    }

    unsafe fn write_at(&self, iov: &[libc::iovec], offset: u64) -> io::Result<usize> {
        self.transfer(iov, offset)?;
        let mut b = self.bytes.borrow_mut();
        let mut at = offset as usize;
        let limit = self.chunk.get().unwrap_or(usize::MAX);
        let mut done = 0;
        for v in iov {
            let n = v.iov_len.min(b.len().saturating_sub(at)).min(limit - done);
            // SAFETY: the caller's contract: the iovec is readable memory of its length; the
            // destination is inside the disk's bytes.
            unsafe { std::ptr::copy_nonoverlapping(v.iov_base.cast(), b.as_mut_ptr().add(at), n) };
            at += n;
            done += n;
            if n < v.iov_len {
                break;
            }
        }
        self.unsynced.set(self.unsynced.get() + done as u64);
        Ok(done)
    }

    fn sync(&self) -> io::Result<()> {
        self.check()?;
        self.syncs.set(self.syncs.get() + 1);
        self.unsynced.set(0);
        Ok(())
    }

    fn punch(&self, offset: u64, len: u64) -> io::Result<()> {
        self.fill(offset, len)
    }

    fn zero(&self, offset: u64, len: u64) -> io::Result<()> {
        self.fill(offset, len)
    }
}
