//! Mapping the PPA page and checking it is one the agent understands.
//!
//! Data flow: [`Page::open`] maps the place discovery chose, read-write and shared: a
//! guest-physical range through /dev/mem, or a file. It reads the region header the VMM
//! wrote and refuses, before writing a byte, anything [`check_header`] does not accept (wrong
//! magic, another major version, sizes and offsets that do not fit). The publisher then
//! writes only inside [`Page::guest`], and calls [`Page::unchanged`] before each sample so
//! that a VMM that rewrites the region under the agent stops it instead of being written
//! over.
//!
//! /dev/mem: a kernel built with `CONFIG_STRICT_DEVMEM` (Debian's are) lets root map only
//! physical ranges that are not RAM and not claimed busy by a driver; `IO_STRICT_DEVMEM`
//! refuses busy I/O ranges too. The VMM puts the page in a range its e820 map marks reserved,
//! above 1 MiB, which Linux registers but never marks busy, so the mapping is allowed under
//! both. A kernel in lockdown mode (Secure Boot) refuses /dev/mem altogether.

use std::cell::Cell;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use ppa_guest_abi::ppa_page::{
    read_record, write_record, GuestHeader, HostVcpu, HostVm, ReadError, Record, RegionHeader,
    MAJOR, REGION_MAGIC,
};
use thiserror::Error;

use crate::discover::Place;

/// Largest region the agent maps.
pub const MAX_SIZE: u64 = 16 << 20;

/// What is wrong with a region header.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum HeaderError {
    /// Not the PPA page's magic.
    #[error(
        "the region's magic is {found:#010x}, not \"PPAP\" (0x50415050): this is not a PPA page"
    )]
    Magic {
        /// Magic found.
        found: u32,
    },
    /// A major version this agent does not write.
    #[error("the region has layout {major}.{minor}; this agent writes layout {MAJOR}.x only and leaves any other alone")]
    Major {
        /// Major found.
        major: u16,
        /// Minor found.
        minor: u16,
    },
    /// The header claims more bytes than are mapped.
    #[error("the region header says the region is {total} bytes, but {mapped} bytes are there")]
    Size {
        /// `total_size`.
        total: u32,
        /// Bytes mapped.
        mapped: u64,
    },
    /// A part of the region outside it or misaligned.
    #[error("the {what} ({size} bytes at offset {offset}) is not 8-byte aligned inside the region's {total} bytes")]
    Part {
        /// Which part.
        what: &'static str,
        /// Its offset.
        offset: u64,
        /// Its size.
        size: u64,
        /// The region's size.
        total: u32,
    },
}

/// Checks a region header against the `mapped` bytes behind it.
pub fn check_header(h: &RegionHeader, mapped: u64) -> Result<(), HeaderError> {
    if h.magic != REGION_MAGIC {
        return Err(HeaderError::Magic { found: h.magic });
    }
    if h.major != MAJOR {
        return Err(HeaderError::Major {
            major: h.major,
            minor: h.minor,
        });
    }
    if u64::from(h.total_size) > mapped {
        return Err(HeaderError::Size {
            total: h.total_size,
            mapped,
        });
    }
    let parts = [
        ("region header", 0, u64::from(h.header_size)),
        (
            "host section",
            u64::from(h.host_offset),
            u64::from(h.host_count) * u64::from(h.host_record_size),
        ),
        (
            "guest section",
            u64::from(h.guest_offset),
            u64::from(h.guest_size),
        ),
    ];
    for (what, offset, size) in parts {
        let min = if what == "region header" { 64 } else { 0 };
        if offset % 8 != 0 || size < min || offset + size > u64::from(h.total_size) {
            return Err(HeaderError::Part {
                what,
                offset,
                size,
                total: h.total_size,
            });
        }
    }
    if h.host_count > 0 && (h.host_record_size as usize) < std::mem::size_of::<HostVcpu>()
        || h.host_record_size % 8 != 0
    {
        return Err(HeaderError::Part {
            what: "host record size",
            offset: u64::from(h.host_offset),
            size: u64::from(h.host_record_size),
            total: h.total_size,
        });
    }
    Ok(())
}

/// Why the page could not be mapped or used.
#[derive(Debug, Error)]
pub enum PageError {
    /// The page file could not be opened.
    #[error("cannot open the page file {path}")]
    OpenFile {
        /// The file.
        path: PathBuf,
        /// Cause.
        #[source]
        source: io::Error,
    },
    /// The page file is not a regular file (a device, a FIFO, a directory).
    #[error("the page file {0} is not a regular file")]
    NotRegular(PathBuf),
    /// The page file cannot hold even a region header.
    #[error("the page file {path} has {size} bytes, too few for a region header (64)")]
    FileTooSmall {
        /// The file.
        path: PathBuf,
        /// Its size.
        size: u64,
    },
    /// Another agent holds the page.
    #[error("another ppa-agent is publishing into this page (it holds the lock on {0})")]
    Busy(PathBuf),
    /// No /dev/mem.
    #[error("there is no /dev/mem: mount devtmpfs on /dev or create it with `mknod /dev/mem c 1 1` (a kernel built without CONFIG_DEVMEM has none; use --page-file where a file is shared instead)")]
    NoDevMem,
    /// /dev/mem refused.
    #[error("opening /dev/mem was refused{why}")]
    DevMemDenied {
        /// What the agent knows about why.
        why: String,
        /// Cause.
        #[source]
        source: io::Error,
    },
    /// The mapping was refused.
    #[error("the kernel refused to map {what} at offset {offset:#x}, {size} bytes{why}")]
    Map {
        /// `/dev/mem` or the file.
        what: String,
        /// Offset (the GPA for /dev/mem).
        offset: u64,
        /// Size.
        size: u64,
        /// What the agent knows about why.
        why: &'static str,
        /// Cause.
        #[source]
        source: io::Error,
    },
    /// A size no page has.
    #[error("a PPA page of {0} bytes is outside the 4 KiB to 16 MiB the ABI allows")]
    Size(u64),
    /// The header is not one the agent understands.
    #[error("the PPA page at {at} is not one this agent understands")]
    Header {
        /// Where the page is.
        at: String,
        /// What is wrong.
        #[source]
        source: HeaderError,
    },
}

/// What the agent will do with the page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Publish: map read-write and take the one-agent lock.
    Publish,
    /// Look (`--probe`, `show`): map read-only, no lock, so it works beside a running agent.
    Look,
}

/// A mapped region whose header checked out.
#[derive(Debug)]
pub struct Page {
    ptr: *mut u8,
    len: usize,
    header: RegionHeader,
    at: String,
    /// Mapped read-write ([`Access::Publish`]).
    writable: bool,
    /// A [`GuestWriter`] of this page is alive.
    writing: Cell<bool>,
    _file: File,
    _lock: Option<File>,
}

/// Why the page has no writer to give.
#[derive(Debug, Error, Clone, Copy, PartialEq, Eq)]
pub enum WriterError {
    /// Mapped to look, not to publish.
    #[error("the page is mapped read-only (opened to look, not to publish)")]
    ReadOnly,
    /// Another writer of this page is alive in this process.
    #[error("another publisher in this process is already writing the page's guest section")]
    Taken,
}

/// The guest section of a [`Page`], for its one writer: it borrows the page, so the page
/// (whose drop unmaps the memory) outlives it, and while it lives [`Page::guest_writer`]
/// gives no other. Every write is checked against the section and made under the sequence
/// protocol of `ppa_guest_abi::ppa_page`.
#[derive(Debug)]
pub struct GuestWriter<'p> {
    page: &'p Page,
    base: *mut u8,
    len: usize,
}

impl GuestWriter<'_> {
    /// Bytes in the section.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the section is empty (never: `check_header` accepts no such region for
    /// publishing, since the layout needs room).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The record at byte offset `off` when it lies inside the section, 8-byte aligned.
    fn at<T: Record>(&self, off: u64) -> Option<*mut T> {
        let end = off.checked_add(std::mem::size_of::<T>() as u64)?;
        if off % 8 != 0 || end > self.len as u64 {
            return None;
        }
        // SAFETY: `off + size_of::<T>() <= len`, so the pointer stays inside the section,
        // which `check_header` placed inside the mapping.
        Some(unsafe { self.base.add(off as usize) }.cast::<T>())
    }

    /// Writes `rec` at byte offset `off` under the sequence protocol; false (nothing
    /// written) when the record would not lie inside the section, 8-byte aligned.
    pub fn write<T: Record>(&mut self, off: u64, rec: &T) -> bool {
        let Some(p) = self.at::<T>(off) else {
            return false;
        };
        // SAFETY: `at` checked the record lies inside the section, 8-byte aligned (the
        // section's offset is a multiple of 8 and the mapping page-aligned); the mapping is
        // read-write (`guest_writer` gives none otherwise) and lives as long as the page this
        // writer borrows; this writer is the process's only one (`Page::writing`) and the
        // advisory lock keeps other agents out.
        unsafe { write_record(p, rec) };
        true
    }

    /// The guest header's sequence counter (the section's first `u32`) as it is now; `None`
    /// when the section cannot hold a header.
    pub fn header_seq(&self) -> Option<u32> {
        let p = self.at::<GuestHeader>(0)?;
        // SAFETY: an aligned `u32` inside the live mapping (`at`); an `AtomicU32` has the
        // layout of a `u32`, and others write the word only atomically or not at all.
        Some(unsafe { &*p.cast::<AtomicU32>() }.load(Ordering::Acquire))
    }

    /// The page this writer writes.
    pub fn page(&self) -> &Page {
        self.page
    }
}

impl Drop for GuestWriter<'_> {
    fn drop(&mut self) {
        self.page.writing.set(false);
    }
}

/// Takes an exclusive advisory lock on `f`, or says another agent holds it.
fn lock(f: &File, path: &Path) -> Result<(), PageError> {
    // SAFETY: flock on a descriptor this function borrows; the result is checked.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        return Err(PageError::Busy(path.to_path_buf()));
    }
    Ok(())
}

/// The lockdown mode the kernel is in, if any (`integrity`, `confidentiality`).
fn lockdown() -> Option<String> {
    let s = std::fs::read_to_string("/sys/kernel/security/lockdown").ok()?;
    let mode = s.split('[').nth(1)?.split(']').next()?.to_string();
    (mode != "none").then_some(mode)
}

/// A page file or /dev/mem, opened and locked, not yet mapped.
struct Opened {
    file: File,
    /// Bytes to map.
    size: u64,
    /// Offset in `file` (the GPA for /dev/mem).
    offset: u64,
    /// Where the page is, in words.
    what: String,
    /// The one-agent lock, when it is a file of its own.
    lock: Option<File>,
}

/// Opens the page file at `path` (never through a symbolic link) and, to publish, locks it.
fn open_file(path: &Path, write: bool) -> Result<Opened, PageError> {
    use std::os::unix::fs::OpenOptionsExt;
    let open_err = |source| PageError::OpenFile {
        path: path.to_path_buf(),
        source,
    };
    // A symbolic link is never followed (ELOOP): a link planted at the path must not make a
    // root agent write into the file it points to.
    let f = OpenOptions::new()
        .read(true)
        .write(write)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .map_err(open_err)?;
    let meta = f.metadata().map_err(open_err)?;
    if !meta.is_file() {
        return Err(PageError::NotRegular(path.to_path_buf()));
    }
    let size = meta.len();
    if size < 64 {
        return Err(PageError::FileTooSmall {
            path: path.to_path_buf(),
            size,
        });
    }
    if write {
        lock(&f, path)?;
    }
    Ok(Opened {
        file: f,
        size: size.min(MAX_SIZE),
        offset: 0,
        what: path.display().to_string(),
        lock: None,
    })
}

/// Opens /dev/mem for the `size` bytes at `gpa` and, to publish, takes the one-agent lock.
fn open_devmem(gpa: u64, size: u64, write: bool) -> Result<Opened, PageError> {
    if !(4096..=MAX_SIZE).contains(&size) {
        return Err(PageError::Size(size));
    }
    let f = OpenOptions::new()
        .read(true)
        .write(write)
        .open("/dev/mem")
        .map_err(|source| match source.kind() {
            io::ErrorKind::NotFound => PageError::NoDevMem,
            _ => PageError::DevMemDenied {
                why: match lockdown() {
                    Some(m) => format!(
                        " (the kernel is in lockdown mode \"{m}\", which forbids /dev/mem; boot without lockdown, e.g. without Secure Boot)"
                    ),
                    // SAFETY: geteuid has no preconditions.
                    None if unsafe { libc::geteuid() } != 0 => {
                        " (the agent must run as root, with CAP_SYS_RAWIO)".into()
                    }
                    None => String::new(),
                },
                source,
            },
        })?;
    // One agent per guest: the lock is a file of its own, where /run exists.
    let lock_path = Path::new("/run/ppa-agent.lock");
    let lock_file = if write {
        use std::os::unix::fs::OpenOptionsExt;
        // Never through a symbolic link, never readable by others.
        OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(lock_path)
            .ok()
    } else {
        None
    };
    if let Some(l) = &lock_file {
        lock(l, lock_path)?;
    }
    Ok(Opened {
        file: f,
        size,
        offset: gpa,
        what: format!("/dev/mem at GPA {gpa:#x}"),
        lock: lock_file,
    })
}

/// Maps what `o` opened, shared, read-write to publish; the mapping is the caller's to
/// unmap.
fn map(o: &Opened, place: &Place, write: bool) -> Result<*mut u8, PageError> {
    // SAFETY: a new shared mapping of `size` bytes of a descriptor we hold; the result is
    // checked. The mapping is the caller's until it unmaps it (`Page`'s `Drop`).
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            o.size as usize,
            if write {
                libc::PROT_READ | libc::PROT_WRITE
            } else {
                libc::PROT_READ
            },
            libc::MAP_SHARED,
            o.file.as_raw_fd(),
            o.offset as libc::off_t,
        )
    };
    if ptr != libc::MAP_FAILED {
        return Ok(ptr.cast());
    }
    let (what, why) = match place {
        Place::Phys { .. } => ("/dev/mem".to_string(), " (with CONFIG_STRICT_DEVMEM the kernel maps only ranges that are neither RAM nor claimed busy by a driver; the VMM's page is an e820 reserved range, which qualifies, so check the address the VMM gave)"),
        Place::File(p) => (p.display().to_string(), ""),
    };
    Err(PageError::Map {
        what,
        offset: o.offset,
        size: o.size,
        why,
        source: io::Error::last_os_error(),
    })
}

impl Page {
    /// Maps `place` (read-write to publish) and checks its header. Nothing is written.
    pub fn open(place: &Place, access: Access) -> Result<Page, PageError> {
        let write = access == Access::Publish;
        let o = match place {
            Place::File(path) => open_file(path, write)?,
            Place::Phys { gpa, size } => open_devmem(*gpa, *size, write)?,
        };
        let ptr = map(&o, place, write)?;
        let mut page = Page {
            ptr,
            len: o.size as usize,
            header: RegionHeader {
                magic: 0,
                major: 0,
                minor: 0,
                total_size: 0,
                header_size: 0,
                host_offset: 0,
                host_count: 0,
                host_record_size: 0,
                guest_offset: 0,
                guest_size: 0,
                host_refresh_ns: 0,
                vm_offset: 0,
                vm_size: 0,
                reserved: [0; 2],
            },
            at: o.what,
            writable: write,
            writing: Cell::new(false),
            _file: o.file,
            _lock: o.lock,
        };
        page.header = page.read_header();
        check_header(&page.header, o.size).map_err(|source| PageError::Header {
            at: page.at.clone(),
            source,
        })?;
        Ok(page)
    }

    /// The region header as it is now.
    pub fn read_header(&self) -> RegionHeader {
        // SAFETY: the mapping is at least 64 bytes (checked in `open`) and page-aligned; the
        // header is plain integers; volatile, as the VMM could write it.
        unsafe { std::ptr::read_volatile(self.ptr.cast::<RegionHeader>()) }
    }

    /// The header checked at `open`.
    pub fn header(&self) -> &RegionHeader {
        &self.header
    }

    /// Where the page is, in words.
    pub fn at(&self) -> &str {
        &self.at
    }

    /// Whether the region header is still the one checked at `open`; if not, what it is now.
    pub fn unchanged(&self) -> Result<(), RegionHeader> {
        let now = self.read_header();
        if now == self.header {
            Ok(())
        } else {
            Err(now)
        }
    }

    /// The guest section's one writer, while nobody else in this process has it: the
    /// page must be mapped to publish.
    pub fn guest_writer(&self) -> Result<GuestWriter<'_>, WriterError> {
        if !self.writable {
            return Err(WriterError::ReadOnly);
        }
        if self.writing.replace(true) {
            return Err(WriterError::Taken);
        }
        let (base, len) = self.guest();
        Ok(GuestWriter {
            page: self,
            base,
            len,
        })
    }

    /// The guest section: its start and length (to read it; [`Page::guest_writer`] writes).
    pub fn guest(&self) -> (*mut u8, usize) {
        // SAFETY: `check_header` placed the guest section inside the mapping.
        let p = unsafe { self.ptr.add(self.header.guest_offset as usize) };
        (p, self.header.guest_size as usize)
    }

    /// vCPU `i`'s host record, read with the sequence protocol (`None` past the last vCPU).
    pub fn host(&self, i: u32, tries: u32) -> Option<Result<HostVcpu, ReadError>> {
        let h = &self.header;
        (i < h.host_count).then(|| {
            let off = h.host_offset as usize + i as usize * h.host_record_size as usize;
            // SAFETY: `check_header` put every host record inside the mapping, 8-byte aligned
            // (offset and record size are multiples of 8); the VMM writes it under the
            // sequence protocol and any bits are a valid `HostVcpu`.
            unsafe { read_record(self.ptr.add(off).cast::<HostVcpu>(), tries) }
        })
    }

    /// The VM-wide host record (layout 1.3), read with the sequence protocol (`None` when the
    /// region has none: a 1.2 VMM, or a header whose record does not fit before the guest
    /// section).
    pub fn host_vm(&self, tries: u32) -> Option<Result<HostVm, ReadError>> {
        let (off, _) = self.header.vm_record()?;
        // SAFETY: `vm_record` put the record inside the region (before the guest section,
        // within `total_size`, which `check_header` held to the mapping) and 8-byte aligned;
        // the VMM writes it under the sequence protocol and any bits are a valid `HostVm`.
        Some(unsafe { read_record(self.ptr.add(off as usize).cast::<HostVm>(), tries) })
    }

    /// Bytes mapped.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing is mapped (never, for an open page).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// The region header a VMM writes for a region of `size` bytes and `vcpus` vCPUs (the host
/// records after the header, the VM-wide host record after them, the guest section last):
/// for the benchmark and tests, which publish into a file of their own.
pub fn vmm_header(size: u32, vcpus: u32) -> RegionHeader {
    let vm_offset = 64 + 128 * vcpus;
    let host_end = vm_offset + 128;
    RegionHeader {
        magic: REGION_MAGIC,
        major: MAJOR,
        minor: ppa_guest_abi::ppa_page::MINOR,
        total_size: size,
        header_size: 64,
        host_offset: 64,
        host_count: vcpus,
        host_record_size: 128,
        guest_offset: host_end,
        guest_size: size.saturating_sub(host_end),
        host_refresh_ns: 10_000_000,
        vm_offset,
        vm_size: 128,
        reserved: [0; 2],
    }
}

/// Writes a zeroed region of `size` bytes with [`vmm_header`] to a new file at `path` (mode
/// 0600; a path where anything already is, a symbolic link included, is refused).
pub fn write_region_file(path: &Path, size: u32, vcpus: u32) -> io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let h = vmm_header(size, vcpus);
    let mut bytes = vec![0u8; size as usize];
    // SAFETY: RegionHeader is 64 bytes of repr(C) integers (asserted in the ABI crate), so
    // viewing it as bytes is sound for as long as `h` lives.
    let raw = unsafe { std::slice::from_raw_parts((&h as *const RegionHeader).cast::<u8>(), 64) };
    bytes[..64].copy_from_slice(raw);
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?
        .write_all(&bytes)
}

impl Drop for Page {
    fn drop(&mut self) {
        // SAFETY: the mapping was made in `open` with this length and nothing uses it after.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ppa_guest_abi::ppa_page::MINOR;

    fn good() -> RegionHeader {
        RegionHeader {
            magic: REGION_MAGIC,
            major: MAJOR,
            minor: MINOR,
            total_size: 65536,
            header_size: 64,
            host_offset: 64,
            host_count: 2,
            host_record_size: 128,
            guest_offset: 448,
            guest_size: 65536 - 448,
            host_refresh_ns: 10_000_000,
            vm_offset: 320,
            vm_size: 128,
            reserved: [0; 2],
        }
    }

    #[test]
    fn a_page_file_is_never_opened_through_a_link_nor_when_it_is_not_a_regular_file() {
        let tmp = std::env::temp_dir().join(format!("ppa-agent-page-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        std::fs::create_dir(&tmp).unwrap();
        let real = tmp.join("real.ppa");
        write_region_file(&real, 65536, 2).unwrap();
        assert!(
            write_region_file(&real, 65536, 2).is_err(),
            "an existing file is not overwritten"
        );
        let link = tmp.join("link.ppa");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        for access in [Access::Publish, Access::Look] {
            let e = Page::open(&Place::File(link.clone()), access).unwrap_err();
            match e {
                PageError::OpenFile { source, .. } => {
                    assert_eq!(source.raw_os_error(), Some(libc::ELOOP))
                }
                other => panic!("{other}"),
            }
            let e = Page::open(&Place::File(tmp.clone()), access).unwrap_err();
            assert!(
                matches!(e, PageError::NotRegular(_) | PageError::OpenFile { .. }),
                "{e}"
            );
        }
        assert!(Page::open(&Place::File(real.clone()), Access::Look).is_ok());
        std::fs::remove_dir_all(&tmp).unwrap();
    }

    #[test]
    fn a_vmm_header_passes_and_each_fault_is_named() {
        assert_eq!(check_header(&good(), 65536), Ok(()));
        // Another minor version of the same major is fine.
        assert_eq!(
            check_header(&RegionHeader { minor: 9, ..good() }, 65536),
            Ok(())
        );
        assert_eq!(
            check_header(
                &RegionHeader {
                    magic: 0xDEAD_BEEF,
                    ..good()
                },
                65536
            ),
            Err(HeaderError::Magic { found: 0xDEAD_BEEF })
        );
        let e = check_header(&RegionHeader { major: 2, ..good() }, 65536).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!("the region has layout 2.{MINOR}; this agent writes layout 1.x only and leaves any other alone")
        );
        assert_eq!(
            check_header(&good(), 4096),
            Err(HeaderError::Size {
                total: 65536,
                mapped: 4096
            })
        );
        let e = check_header(
            &RegionHeader {
                guest_size: 65536,
                ..good()
            },
            65536,
        )
        .unwrap_err();
        assert!(
            matches!(
                e,
                HeaderError::Part {
                    what: "guest section",
                    ..
                }
            ),
            "{e}"
        );
        let e = check_header(
            &RegionHeader {
                host_offset: 68,
                ..good()
            },
            65536,
        )
        .unwrap_err();
        assert!(
            matches!(
                e,
                HeaderError::Part {
                    what: "host section",
                    ..
                }
            ),
            "{e}"
        );
        let e = check_header(
            &RegionHeader {
                host_record_size: 64,
                ..good()
            },
            65536,
        );
        assert!(matches!(
            e,
            Err(HeaderError::Part {
                what: "host record size",
                ..
            })
        ));
        let e = check_header(
            &RegionHeader {
                header_size: 0,
                ..good()
            },
            65536,
        );
        assert!(matches!(
            e,
            Err(HeaderError::Part {
                what: "region header",
                ..
            })
        ));
    }
}
