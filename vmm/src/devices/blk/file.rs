//! The file behind a disk: opened once (read-write, or read-only for `readonly=on`), locked
//! so that no other process opens the same writable disk, measured (its size in sectors) and
//! probed for what it can do (punch holes: DISCARD and WRITE_ZEROES), then read and written
//! by the request threads with positioned vector I/O straight from and into guest memory.
//!
//! Data flow: `BlkDevice::new` calls [`DiskFile::open`] on the VM builder's thread (before
//! any seccomp filter); the request threads then call the [`Disk`] methods, concurrently
//! (positioned I/O shares no file offset). The fuzzer and the unit tests put an in-memory
//! disk behind the same trait.
//!
//! The lock is an open file description lock (`F_OFD_SETLK`) over the whole file: a write
//! lock for a writable disk, a read lock for a read-only one, so two VMMs (or one VMM twice)
//! can share a read-only disk but never a disk one of them may write. It is released when the
//! file is closed (the device dropped, or the process gone, even by SIGKILL).

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use thiserror::Error;

/// Bytes of a sector (the unit of `sector` in a request and of the capacity).
pub const SECTOR: u64 = 512;

/// Why a disk's file could not be used.
#[derive(Debug, Error)]
pub enum DiskError {
    /// The file cannot be opened.
    #[error("cannot open the disk file {path}")]
    Open {
        /// The path.
        path: PathBuf,
        /// Cause.
        #[source]
        source: io::Error,
    },
    /// Neither a regular file nor a block device.
    #[error("the disk file {path} is neither a regular file nor a block device")]
    NotAFile {
        /// The path.
        path: PathBuf,
    },
    /// Another process (or this one) holds a conflicting lock.
    #[error(
        "the disk file {path} is in use: another VMM (or another process) has it open {held}, and a disk one of them may write is never shared"
    )]
    Locked {
        /// The path.
        path: PathBuf,
        /// How the holder has it ("for writing" or "for reading").
        held: &'static str,
    },
    /// The lock could not be taken for another reason.
    #[error("cannot lock the disk file {path}")]
    Lock {
        /// The path.
        path: PathBuf,
        /// Cause.
        #[source]
        source: io::Error,
    },
    /// Its size cannot be read, or it holds no whole sector.
    #[error("the disk file {path} has {bytes} bytes: a disk needs at least one 512-byte sector")]
    TooSmall {
        /// The path.
        path: PathBuf,
        /// Its size.
        bytes: u64,
    },
}

/// What a disk does, positioned. The file's is called by the request threads concurrently
/// (positioned I/O shares no offset).
pub trait Disk {
    /// Reads into `iov` from byte `offset`; returns the bytes read (fewer at the file's end).
    ///
    /// # Safety
    /// Every `iovec` must describe memory valid for writes of its length during the call.
    unsafe fn read_at(&self, iov: &[libc::iovec], offset: u64) -> io::Result<usize>;
    /// Writes `iov` at byte `offset`; returns the bytes written.
    ///
    /// # Safety
    /// Every `iovec` must describe memory valid for reads of its length during the call.
    unsafe fn write_at(&self, iov: &[libc::iovec], offset: u64) -> io::Result<usize>;
    /// Makes what was written durable (`fdatasync`).
    fn sync(&self) -> io::Result<()>;
    /// Deallocates `[offset, offset + len)`, which then reads as zeros (a punched hole).
    fn punch(&self, offset: u64, len: u64) -> io::Result<()>;
    /// Makes `[offset, offset + len)` read as zeros, keeping it allocated where the file can.
    fn zero(&self, offset: u64, len: u64) -> io::Result<()>;
}

/// An open, locked disk file.
#[derive(Debug)]
pub struct DiskFile {
    file: File,
    path: PathBuf,
    bytes: u64,
    readonly: bool,
    can_punch: bool,
}

/// Takes the whole-file OFD lock on `file`: a read lock when `readonly`, a write lock else.
fn lock(file: &File, path: &Path, readonly: bool) -> Result<(), DiskError> {
    let ty = if readonly {
        libc::F_RDLCK
    } else {
        libc::F_WRLCK
    };
    // SAFETY: an all-zero flock is a valid value (plain integers).
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = ty as libc::c_short;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    // SAFETY: F_OFD_SETLK reads the flock we own, on our open descriptor.
    let r = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_OFD_SETLK, &fl) };
    if r == 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EAGAIN) | Some(libc::EACCES) => {
            // Who holds it: asked with the lock we wanted (F_OFD_GETLK fills in the holder's).
            let mut q = fl;
            // SAFETY: as above, F_OFD_GETLK writes into the flock we own.
            let held = if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_OFD_GETLK, &mut q) } == 0
                && q.l_type == libc::F_RDLCK as libc::c_short
            {
                "for reading"
            } else {
                "for writing"
            };
            Err(DiskError::Locked {
                path: path.to_path_buf(),
                held,
            })
        }
        _ => Err(DiskError::Lock {
            path: path.to_path_buf(),
            source: e,
        }),
    }
}

/// `fallocate(mode | KEEP_SIZE)` over `[offset, offset + len)`.
fn fallocate(file: &File, mode: libc::c_int, offset: u64, len: u64) -> io::Result<()> {
    let (Ok(off), Ok(len)) = (i64::try_from(offset), i64::try_from(len)) else {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    };
    // SAFETY: fallocate on our open descriptor; no memory is passed.
    let r =
        unsafe { libc::fallocate(file.as_raw_fd(), mode | libc::FALLOC_FL_KEEP_SIZE, off, len) };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

impl DiskFile {
    /// Opens and locks `path` (read-only when `readonly`), reads its size and probes whether
    /// it can punch holes.
    pub fn open(path: &Path, readonly: bool) -> Result<DiskFile, DiskError> {
        let open_err = |source| DiskError::Open {
            path: path.to_path_buf(),
            source,
        };
        let file = OpenOptions::new()
            .read(true)
            .write(!readonly)
            .custom_flags(libc::O_CLOEXEC)
            .open(path)
            .map_err(open_err)?;
        let meta = file.metadata().map_err(open_err)?;
        let block = meta.file_type().is_block_device();
        if !meta.is_file() && !block {
            return Err(DiskError::NotAFile {
                path: path.to_path_buf(),
            });
        }
        lock(&file, path, readonly)?;
        // A block device's size is where its end seeks to.
        let bytes = if block {
            // SAFETY: lseek on our open descriptor.
            let end = unsafe { libc::lseek(file.as_raw_fd(), 0, libc::SEEK_END) };
            u64::try_from(end).unwrap_or(0)
        } else {
            meta.len()
        };
        if bytes < SECTOR {
            return Err(DiskError::TooSmall {
                path: path.to_path_buf(),
                bytes,
            });
        }
        // Punching a hole at the file's end changes nothing (no byte lies there); a file
        // system that cannot punch says so (EOPNOTSUPP). A block device is not probed: past
        // its end is an error, and its discard is the device's business.
        let can_punch = !readonly
            && !block
            && fallocate(&file, libc::FALLOC_FL_PUNCH_HOLE, bytes, SECTOR).is_ok();
        if bytes % SECTOR != 0 {
            log::warn!(
                "the disk file {} has {bytes} bytes, not a whole number of 512-byte sectors: the last {} bytes are out of the guest's reach",
                path.display(),
                bytes % SECTOR
            );
        }
        Ok(DiskFile {
            file,
            path: path.to_path_buf(),
            bytes,
            readonly,
            can_punch,
        })
    }

    /// Its path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whole sectors the guest sees.
    pub fn sectors(&self) -> u64 {
        self.bytes / SECTOR
    }

    /// Whether it was opened read-only.
    pub fn readonly(&self) -> bool {
        self.readonly
    }

    /// Whether it can punch holes (DISCARD and WRITE_ZEROES are offered then).
    pub fn can_punch(&self) -> bool {
        self.can_punch
    }
}

impl Disk for DiskFile {
    unsafe fn read_at(&self, iov: &[libc::iovec], offset: u64) -> io::Result<usize> {
        let off = i64::try_from(offset).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        let fd = self.file.as_raw_fd();
        // SAFETY: the caller's contract: each iovec is writable memory of its length; at most
        // IOV_MAX of them. One buffer goes as `pread` (the kernel then copies no iovec array).
        let r = unsafe {
            match iov {
                [one] => libc::pread(fd, one.iov_base, one.iov_len, off),
                _ => libc::preadv(fd, iov.as_ptr(), iov.len() as libc::c_int, off),
            }
        };
        usize::try_from(r).map_err(|_| io::Error::last_os_error())
    }

    unsafe fn write_at(&self, iov: &[libc::iovec], offset: u64) -> io::Result<usize> {
        let off = i64::try_from(offset).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        let fd = self.file.as_raw_fd();
        // SAFETY: the caller's contract: each iovec is readable memory of its length; at most
        // IOV_MAX of them. One buffer goes as `pwrite`.
        let r = unsafe {
            match iov {
                [one] => libc::pwrite(fd, one.iov_base, one.iov_len, off),
                _ => libc::pwritev(fd, iov.as_ptr(), iov.len() as libc::c_int, off),
            }
        };
        usize::try_from(r).map_err(|_| io::Error::last_os_error())
    }

    fn sync(&self) -> io::Result<()> {
        self.file.sync_data()
    }

    fn punch(&self, offset: u64, len: u64) -> io::Result<()> {
        fallocate(&self.file, libc::FALLOC_FL_PUNCH_HOLE, offset, len)
    }

    fn zero(&self, offset: u64, len: u64) -> io::Result<()> {
        match fallocate(&self.file, libc::FALLOC_FL_ZERO_RANGE, offset, len) {
            // tmpfs, among others, punches but does not zero ranges.
            Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => self.punch(offset, len),
            r => r,
        }
    }
}
