//! One block request, from a checked descriptor chain to its status byte: the header read and
//! checked, the data found in the chain, the file read or written straight from and into
//! guest memory, the answer written. Pure of threads and queues, so the unit tests and the
//! fuzzer run exactly this on any chain.
//!
//! Data flow: the request pass hands [`serve`] a chain already loaded by
//! [`Segments::load`] (every buffer inside guest RAM, device-readable ones first), the
//! disk's [`Limits`] and a [`Disk`]. The layout (virtio 1.2, 5.2.6): a 16-byte header
//! (`type`, `reserved`, `sector`) in the readable part, then data (readable for a write,
//! writable for a read), and a status byte, the chain's last writable byte. A request that
//! breaks the layout, is not a whole number of sectors, reaches past the disk's end, writes
//! a read-only disk or names a type the device does not offer is answered with IOERR or
//! UNSUPP, as the spec says, and the device goes on; only a chain with no writable byte (no
//! place for a status) is refused ([`Refused`]), which the pass turns into NEEDS_RESET.
//! Every loop is bounded by the chain's buffers or a fixed count; nothing allocates.

use std::io;

use ppa_vmm_api::{BlkRequestKind, BlkStatus};
use virtio_bindings::bindings::virtio_blk::*;
use vm_memory::GuestMemoryMmap;

use super::file::{Disk, SECTOR};
use crate::devices::virtio::chain::Segments;

/// Bytes of a request's header.
pub const HEADER: u64 = 16;
/// Bytes of GET_ID's answer.
pub const ID_BYTES: usize = VIRTIO_BLK_ID_BYTES as usize;
/// Bytes of one DISCARD or WRITE_ZEROES range.
const RANGE: u64 = 16;
/// Ranges one DISCARD or WRITE_ZEROES request may carry (`max_discard_seg`,
/// `max_write_zeroes_seg`).
pub const MAX_RANGES: u32 = 16;
/// Sectors one range may cover (`max_discard_sectors`, `max_write_zeroes_sectors`): 1 GiB.
pub const MAX_RANGE_SECTORS: u32 = 1 << 21;
/// Tries of one positioned read or write before a request is failed: each returns at least
/// one byte or is an interruption, and a chain has at most a queue's size of buffers.
const IO_TRIES: usize = 1024;

/// What the disk offers and holds, for checking requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Whole sectors.
    pub sectors: u64,
    /// No write reaches the file (`VIRTIO_BLK_F_RO`).
    pub readonly: bool,
    /// DISCARD offered.
    pub discard: bool,
    /// WRITE_ZEROES offered.
    pub write_zeroes: bool,
    /// The driver negotiated FLUSH: writes may stay in the host's cache until a flush.
    /// Without it, each write is made durable before it completes.
    pub writeback: bool,
    /// GET_ID's answer, NUL-padded.
    pub id: [u8; ID_BYTES],
}

/// Why a request got an error status (logged once per reason by the device).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Why {
    /// The readable part is shorter than the header.
    Header,
    /// Data where the type takes none, or of the wrong direction, or missing.
    Layout,
    /// Data that is not a whole number of sectors.
    Unaligned,
    /// Sectors past the disk's end.
    PastEnd,
    /// A write, DISCARD or WRITE_ZEROES to a read-only disk.
    ReadOnly,
    /// A type the device does not know or does not offer (UNSUPP).
    Unsupported,
    /// DISCARD or WRITE_ZEROES ranges that are malformed, too many or too long, or flags the
    /// type does not take.
    Ranges,
    /// The file's own error (or a read that found the file shorter than it was).
    Io,
}

impl Why {
    /// Every reason, in [`Why::index`] order.
    pub const ALL: [Why; 8] = [
        Why::Header,
        Why::Layout,
        Why::Unaligned,
        Why::PastEnd,
        Why::ReadOnly,
        Why::Unsupported,
        Why::Ranges,
        Why::Io,
    ];

    /// Its place in [`Why::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }

    /// A sentence for the log.
    pub fn describe(self) -> &'static str {
        match self {
            Why::Header => "a request is shorter than its 16-byte header",
            Why::Layout => {
                "a request's data is missing, points the wrong way, or comes with a type that takes none"
            }
            Why::Unaligned => "a request's data is not a whole number of 512-byte sectors",
            Why::PastEnd => "a request reaches past the disk's last sector",
            Why::ReadOnly => "the guest wrote to a read-only disk (answered IOERR)",
            Why::Unsupported => "a request of a type the device does not offer (answered UNSUPP)",
            Why::Ranges => "a DISCARD or WRITE_ZEROES request's ranges are malformed, too many or too long",
            Why::Io => "the disk file failed a read, write or flush",
        }
    }
}

/// A request's outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Done {
    /// Its type (`Unknown` when the header could not be read).
    pub kind: BlkRequestKind,
    /// None: OK; else the error status it got.
    pub error: Option<(BlkStatus, Why)>,
    /// Bytes the device wrote into the chain's writable buffers (the used entry's length).
    pub used: u32,
    /// Bytes read from the disk into the guest.
    pub read: u64,
    /// Bytes written from the guest to the disk.
    pub written: u64,
}

/// A chain with no writable byte: no place for a status, so no answer is possible.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refused;

/// The type a request's header names.
pub fn kind_of(ty: u32) -> BlkRequestKind {
    match ty {
        VIRTIO_BLK_T_IN => BlkRequestKind::Read,
        VIRTIO_BLK_T_OUT => BlkRequestKind::Write,
        VIRTIO_BLK_T_FLUSH => BlkRequestKind::Flush,
        VIRTIO_BLK_T_GET_ID => BlkRequestKind::GetId,
        VIRTIO_BLK_T_DISCARD => BlkRequestKind::Discard,
        VIRTIO_BLK_T_WRITE_ZEROES => BlkRequestKind::WriteZeroes,
        _ => BlkRequestKind::Unknown,
    }
}

/// The chain's shape: readable bytes, writable bytes.
fn shape(segs: &Segments) -> (u64, u64) {
    let (r, w) = segs.split();
    let sum = |s: &[crate::devices::virtio::chain::Segment]| -> u64 {
        s.iter().map(|x| u64::from(x.len)).sum()
    };
    (sum(r), sum(w))
}

/// A request's header and layout, read from its loaded chain.
#[derive(Debug, Clone, Copy)]
struct Head {
    /// The header's type (`Unknown` when the header could not be read).
    kind: BlkRequestKind,
    /// The header is all there (16 readable bytes, read).
    whole: bool,
    readable: u64,
    writable: u64,
    sector: u64,
}

impl Head {
    /// Reads the header of the chain in `segs`; `Refused` when it has no writable byte.
    fn read(segs: &Segments, mem: &GuestMemoryMmap) -> Result<Head, Refused> {
        let (readable, writable) = shape(segs);
        if writable == 0 {
            return Err(Refused);
        }
        let mut header = [0u8; HEADER as usize];
        let whole = readable >= HEADER && segs.read_into(mem, &mut header) == header.len();
        let ty = u32::from_le_bytes([header[0], header[1], header[2], header[3]]);
        let mut sector = [0u8; 8];
        sector.copy_from_slice(&header[8..16]);
        Ok(Head {
            kind: if whole {
                kind_of(ty)
            } else {
                BlkRequestKind::Unknown
            },
            whole,
            readable,
            writable,
            sector: u64::from_le_bytes(sector),
        })
    }

    /// The data of a read or write of `len` bytes at the header's sector: a whole number of
    /// sectors inside the disk. Returns the byte offset.
    fn span(&self, len: u64, limits: &Limits) -> Result<u64, (BlkStatus, Why)> {
        if len % SECTOR != 0 {
            return Err((IOERR, Why::Unaligned));
        }
        match self.sector.checked_add(len / SECTOR) {
            Some(end) if end <= limits.sectors => Ok(self.sector * SECTOR),
            _ => Err((IOERR, Why::PastEnd)),
        }
    }

    /// The file range of a read or write that passes every check, or the error it is
    /// answered with. Only for those two types.
    fn data(&self, limits: &Limits) -> Result<Data, (BlkStatus, Why)> {
        let len = if self.kind == BlkRequestKind::Write {
            if limits.readonly {
                return Err((IOERR, Why::ReadOnly));
            }
            // The readable part is the header then data; the writable part only the status.
            if self.writable != 1 {
                return Err((IOERR, Why::Layout));
            }
            self.readable - HEADER
        } else {
            // Nothing readable after the header; the writable part is data, then the status.
            if self.readable != HEADER {
                return Err((IOERR, Why::Layout));
            }
            self.writable - 1
        };
        Ok(Data {
            write: self.kind == BlkRequestKind::Write,
            offset: self.span(len, limits)?,
            len,
        })
    }
}

/// A read or write that passed every check: the file range it moves. Its data is the
/// chain's bytes from [`HEADER`] on, `len` of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Data {
    /// A write (else a read).
    pub write: bool,
    /// The file offset.
    pub offset: u64,
    /// Bytes.
    pub len: u64,
}

impl Data {
    /// The request's type.
    pub fn kind(&self) -> BlkRequestKind {
        if self.write {
            BlkRequestKind::Write
        } else {
            BlkRequestKind::Read
        }
    }

    /// What the request did once its data moved: the used length (a read's data and its
    /// status byte, a write's status byte), bytes read, bytes written.
    fn moved(&self) -> (u32, u64, u64) {
        if self.write {
            (1, 0, self.len)
        } else {
            (u32::try_from(self.len + 1).unwrap_or(u32::MAX), self.len, 0)
        }
    }

    /// The request's answer, given how its data went to or from the file (and, for a write
    /// to a disk without FLUSH, to the disk).
    pub fn answer(&self, moved: bool) -> Answer {
        if moved {
            Ok(self.moved())
        } else {
            Err((IOERR, Why::Io))
        }
    }
}

/// The read or write in `segs` (a chain loaded device-readable first) when it passes every
/// check and so only its data is left to move; None for any other request, which
/// [`serve`] answers whole.
pub fn data_of(segs: &Segments, mem: &GuestMemoryMmap, limits: &Limits) -> Option<Data> {
    let h = Head::read(segs, mem).ok()?;
    matches!(h.kind, BlkRequestKind::Read | BlkRequestKind::Write)
        .then(|| h.data(limits).ok())
        .flatten()
}

/// Moves the data of the request whose buffers are `iov` (advanced as the data moves) at
/// `offset`: a read from the file, or a write to it, made durable when the disk is
/// write-through (`writeback` false).
///
/// # Safety
///
/// Each iovec is guest memory, mapped for the whole call, that the request's chain hands
/// the device: writable for a read, readable for a write.
pub unsafe fn move_data<D: Disk>(
    disk: &D,
    write: bool,
    iov: &mut [libc::iovec],
    offset: u64,
    writeback: bool,
) -> io::Result<()> {
    transfer(iov, offset, |iov, at| {
        // SAFETY: the caller's contract: the iovecs are the chain's buffers, mapped and
        // pointing the right way for the call.
        unsafe {
            if write {
                disk.write_at(iov, at)
            } else {
                disk.read_at(iov, at)
            }
        }
    })?;
    if write && !writeback {
        disk.sync()?;
    }
    Ok(())
}

/// One checked request in progress.
struct Req<'a, D: Disk> {
    segs: &'a Segments,
    mem: &'a GuestMemoryMmap,
    disk: &'a D,
    limits: &'a Limits,
    iov: &'a mut Vec<libc::iovec>,
    head: Head,
}

/// What a request did: (used length, bytes read, bytes written), or its error status.
pub type Answer = Result<(u32, u64, u64), (BlkStatus, Why)>;

const IOERR: BlkStatus = BlkStatus::Ioerr;

/// Answers the request in `segs` (a chain loaded device-readable first): does its I/O on
/// `disk` through `iov` (scratch of the queue's size) and writes its status byte.
pub fn serve<D: Disk>(
    segs: &Segments,
    mem: &GuestMemoryMmap,
    disk: &D,
    limits: &Limits,
    iov: &mut Vec<libc::iovec>,
) -> Result<Done, Refused> {
    let head = Head::read(segs, mem)?;
    let kind = head.kind;
    let answer = if head.whole {
        let mut r = Req {
            segs,
            mem,
            disk,
            limits,
            iov,
            head,
        };
        match kind {
            BlkRequestKind::Read | BlkRequestKind::Write => r.data(),
            BlkRequestKind::Flush => r.flush(),
            BlkRequestKind::GetId => r.get_id(),
            BlkRequestKind::Discard | BlkRequestKind::WriteZeroes => r.ranges(kind),
            BlkRequestKind::Unknown => Err((BlkStatus::Unsupp, Why::Unsupported)),
        }
    } else {
        Err((IOERR, Why::Header))
    };
    let (status, done) = finish(kind, answer);
    segs.write_at(mem, head.readable + head.writable - 1, &[status]);
    Ok(done)
}

/// The status byte a request of `kind` answered `answer` gets, and its [`Done`].
pub fn finish(kind: BlkRequestKind, answer: Answer) -> (u8, Done) {
    match answer {
        Ok((used, read, written)) => (
            VIRTIO_BLK_S_OK as u8,
            Done {
                kind,
                error: None,
                used,
                read,
                written,
            },
        ),
        Err((s, why)) => (
            match s {
                BlkStatus::Ioerr => VIRTIO_BLK_S_IOERR as u8,
                BlkStatus::Unsupp => VIRTIO_BLK_S_UNSUPP as u8,
            },
            Done {
                kind,
                error: Some((s, why)),
                used: 1,
                read: 0,
                written: 0,
            },
        ),
    }
}

impl<D: Disk> Req<'_, D> {
    /// A read or a write: its checks, then its data moved.
    fn data(&mut self) -> Answer {
        let d = self.head.data(self.limits)?;
        self.segs.iovecs(HEADER, d.len, self.iov);
        // SAFETY: the iovecs point into guest RAM that `mem` keeps mapped for the whole
        // call: the chain's writable buffers for a read, its readable ones for a write.
        let moved = unsafe {
            move_data(
                self.disk,
                d.write,
                self.iov,
                d.offset,
                self.limits.writeback,
            )
        };
        d.answer(moved.is_ok())
    }

    fn durable(&self) -> Result<(), (BlkStatus, Why)> {
        if self.limits.writeback {
            return Ok(());
        }
        self.disk.sync().map_err(|_| (IOERR, Why::Io))
    }

    fn flush(&mut self) -> Answer {
        self.disk.sync().map_err(|_| (IOERR, Why::Io))?;
        Ok((1, 0, 0))
    }

    fn get_id(&mut self) -> Answer {
        if self.head.readable != HEADER {
            return Err((IOERR, Why::Layout));
        }
        let n = (self.head.writable - 1).min(ID_BYTES as u64) as usize;
        self.segs.write_at(self.mem, HEADER, &self.limits.id[..n]);
        Ok((n as u32 + 1, 0, 0))
    }

    /// DISCARD and WRITE_ZEROES: every range is checked before any is carried out.
    fn ranges(&mut self, kind: BlkRequestKind) -> Answer {
        let discard = kind == BlkRequestKind::Discard;
        let offered = if discard {
            self.limits.discard
        } else {
            self.limits.write_zeroes
        };
        if self.limits.readonly {
            return Err((BlkStatus::Unsupp, Why::ReadOnly));
        }
        if !offered {
            return Err((BlkStatus::Unsupp, Why::Unsupported));
        }
        let data = self.head.readable - HEADER;
        if self.head.writable != 1 || data == 0 || data % RANGE != 0 {
            return Err((IOERR, Why::Layout));
        }
        let n = data / RANGE;
        if n > u64::from(MAX_RANGES) {
            return Err((IOERR, Why::Ranges));
        }
        for pass in 0..2 {
            for i in 0..n {
                let (sector, count, flags) = self.range(i)?;
                let unmap = flags & VIRTIO_BLK_WRITE_ZEROES_FLAG_UNMAP != 0;
                if flags & !VIRTIO_BLK_WRITE_ZEROES_FLAG_UNMAP != 0 || (discard && unmap) {
                    return Err((BlkStatus::Unsupp, Why::Ranges));
                }
                if count > MAX_RANGE_SECTORS {
                    return Err((IOERR, Why::Ranges));
                }
                let end = sector.checked_add(u64::from(count));
                if end.is_none_or(|e| e > self.limits.sectors) {
                    return Err((IOERR, Why::PastEnd));
                }
                if pass == 1 && count > 0 {
                    let (off, len) = (sector * SECTOR, u64::from(count) * SECTOR);
                    let r = if discard || unmap {
                        self.disk.punch(off, len)
                    } else {
                        self.disk.zero(off, len)
                    };
                    r.map_err(|_| (IOERR, Why::Io))?;
                }
            }
        }
        if !discard {
            self.durable()?;
        }
        Ok((1, 0, 0))
    }

    /// Range `i`: sector, sectors, flags.
    fn range(&self, i: u64) -> Result<(u64, u32, u32), (BlkStatus, Why)> {
        let mut b = [0u8; RANGE as usize];
        if self.segs.read_at(self.mem, HEADER + i * RANGE, &mut b) < b.len() {
            return Err((IOERR, Why::Ranges));
        }
        let mut s = [0u8; 8];
        s.copy_from_slice(&b[..8]);
        Ok((
            u64::from_le_bytes(s),
            u32::from_le_bytes([b[8], b[9], b[10], b[11]]),
            u32::from_le_bytes([b[12], b[13], b[14], b[15]]),
        ))
    }
}

/// Moves all of `iov` at byte `offset` with `op` (a positioned vector read or write), going on
/// after a short transfer from where it stopped (the entries are advanced in place). Fails
/// when `op` fails, moves nothing (the file ended), or takes more than [`IO_TRIES`] calls.
pub fn transfer(
    iov: &mut [libc::iovec],
    offset: u64,
    mut op: impl FnMut(&[libc::iovec], u64) -> io::Result<usize>,
) -> io::Result<()> {
    let mut at = offset;
    let mut first = 0;
    for _ in 0..IO_TRIES {
        while first < iov.len() && iov[first].iov_len == 0 {
            first += 1;
        }
        if first == iov.len() {
            return Ok(());
        }
        let n = match op(&iov[first..], at) {
            Ok(0) => return Err(io::Error::from(io::ErrorKind::UnexpectedEof)),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        at += n as u64;
        let mut left = n;
        for v in iov[first..].iter_mut() {
            if left == 0 {
                break;
            }
            let take = left.min(v.iov_len);
            // SAFETY: advancing inside the buffer the entry describes (take <= its length).
            v.iov_base = unsafe { v.iov_base.cast::<u8>().add(take) }.cast();
            v.iov_len -= take;
            left -= take;
        }
    }
    Err(io::Error::from(io::ErrorKind::TimedOut))
}

#[cfg(test)]
mod tests;
