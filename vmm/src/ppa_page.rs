//! The PPA page, VMM side (spec section 8, docs/abi.md): the shared region's memory, its
//! header, and the host section the sampler refreshes.
//!
//! Data flow: `Vm::try_from` creates the region ([`PpaPage::create`]): a memfd, or the file
//! given with `--ppa-page-file` so that host tools can map it, mapped shared (a vm-memory
//! `MmapRegion` of the file from offset 0) and registered as its own KVM memory slot at
//! [`crate::arch::x86_64::layout::PPA_PAGE_GPA`], outside RAM; it writes the region header
//! and tells each vCPU the address in its boot-info record. Every 8 ms the sampler writes
//! each started vCPU's section 4 figures into its host record with the sequence protocol of
//! `ppa_guest_abi::ppa_page`, through the page's one [`HostWriter`], which it takes at start
//! and keeps for its whole run, with the reset generation the [`board`] holds; it also polls
//! the guest agent's alarm ring ([`alarms`]) into the board. The guest section is the
//! guest's: [`decode`] checks it on demand (`guest`, the final report) and
//! `ppa_vmm_api::guest_view` prints it.

use std::fs::File;
use std::io;
use std::os::fd::{FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use ppa_guest_abi::ppa_page::{
    read_record, write_record, HostVcpu, HostVm, ReadError, RegionHeader, MAJOR, MINOR,
    REGION_MAGIC,
};
use thiserror::Error;
use vm_memory::mmap::MmapRegionError;
use vm_memory::{FileOffset, MmapRegion};

pub mod alarms;
pub mod board;
pub mod decode;

/// Smallest region: a page.
pub const MIN_SIZE: u64 = 4096;
/// Largest region.
pub const MAX_SIZE: u64 = 16 << 20;

/// Why the region could not be made.
#[derive(Debug, Error)]
pub enum PpaPageError {
    /// A size out of range or not a multiple of 4 KiB.
    #[error("the PPA page must be 4 KiB to 16 MiB in whole 4 KiB pages, not {0} bytes")]
    Size(u64),
    /// Too small for the header and one host record per vCPU.
    #[error("a PPA page of {size} bytes cannot hold the host records of {vcpus} vCPUs and a guest section")]
    TooSmall {
        /// Size given.
        size: u64,
        /// vCPUs.
        vcpus: usize,
    },
    /// Something is already at the page file's path: the VMM makes its page file itself and
    /// never opens, follows or overwrites what it finds there.
    #[error(
        "--ppa-page-file {path}: {what} is already there; the VMM creates the page file itself \
         (mode 0600) and never reuses, follows or overwrites a path: choose a new path, or \
         remove the file if a VMM that was killed left it behind"
    )]
    Exists {
        /// The path given.
        path: PathBuf,
        /// What is there ("a file", "a symbolic link", "a directory").
        what: &'static str,
    },
    /// The backing file or memfd could not be made.
    #[error("cannot create the PPA page's backing {what}")]
    Backing {
        /// `memfd` or the path.
        what: String,
        /// Cause.
        #[source]
        source: io::Error,
    },
    /// The backing file or memfd could not be mapped.
    #[error("cannot map the PPA page's backing {what}")]
    Map {
        /// `memfd` or the path.
        what: String,
        /// Cause.
        #[source]
        source: MmapRegionError,
    },
}

/// The shared region: a shared mapping of its memfd or file, through vm-memory.
#[derive(Debug)]
pub struct PpaPage {
    mapping: Arc<MmapRegion>,
    vcpus: usize,
    header: RegionHeader,
    file: Option<PathBuf>,
    /// A [`HostWriter`] of this page is alive.
    writing: AtomicBool,
    /// Resets asked of the guest agent, and the alarms forwarded from it.
    board: board::GuestBoard,
}

/// The host section's one writer (the sampler's): the sequence protocol allows one writer
/// per record, so the records are written only through this handle, which is not `Clone`
/// and of which [`PpaPage::host_writer`] gives at most one at a time. It borrows the page,
/// so the mapping outlives it.
#[derive(Debug)]
pub struct HostWriter<'p> {
    page: &'p PpaPage,
}

impl HostWriter<'_> {
    /// Publishes vCPU `vcpu`'s host record (nothing past the last vCPU).
    pub fn publish(&mut self, vcpu: usize, rec: &HostVcpu) {
        if let Some(p) = self.page.host_ptr(vcpu) {
            // SAFETY: `p` is an aligned record inside the mapping (`host_ptr`), which lives as
            // long as the page this writer borrows; this writer is the page's only one
            // (`PpaPage::writing`); the guest and host tools only read it.
            unsafe { write_record(p, rec) };
        }
    }

    /// Publishes the VM-wide host record.
    pub fn publish_vm(&mut self, rec: &HostVm) {
        // SAFETY: an aligned record inside the mapping (`vm_ptr`), which lives as long as the
        // page this writer borrows; this writer is the page's only one; the guest and host
        // tools only read it.
        unsafe { write_record(self.page.vm_ptr(), rec) };
    }
}

impl Drop for HostWriter<'_> {
    fn drop(&mut self) {
        self.page.writing.store(false, Ordering::Release);
    }
}

/// The layout of a region of `size` bytes for `vcpus` vCPUs: host records after the header,
/// the VM-wide host record after them, the guest section after it (8-byte aligned), the rest
/// of the region.
pub fn layout(size: u64, vcpus: usize) -> Result<RegionHeader, PpaPageError> {
    if !(MIN_SIZE..=MAX_SIZE).contains(&size) || size % 4096 != 0 {
        return Err(PpaPageError::Size(size));
    }
    let header = std::mem::size_of::<RegionHeader>() as u64;
    let record = std::mem::size_of::<HostVcpu>() as u64;
    let vm_offset = header + record * vcpus as u64;
    let vm_size = std::mem::size_of::<HostVm>() as u64;
    let host_end = vm_offset + vm_size;
    let guest_min = std::mem::size_of::<ppa_guest_abi::ppa_page::GuestHeader>() as u64;
    if host_end + guest_min > size {
        return Err(PpaPageError::TooSmall { size, vcpus });
    }
    Ok(RegionHeader {
        magic: REGION_MAGIC,
        major: MAJOR,
        minor: MINOR,
        total_size: size as u32,
        header_size: header as u32,
        host_offset: header as u32,
        host_count: vcpus as u32,
        host_record_size: record as u32,
        guest_offset: host_end as u32,
        guest_size: (size - host_end) as u32,
        host_refresh_ns: 10_000_000,
        vm_offset: vm_offset as u32,
        vm_size: vm_size as u32,
        reserved: [0; 2],
    })
}

impl PpaPage {
    /// Makes a zeroed region of `size` bytes for `vcpus` vCPUs, backed by `file` or by a
    /// memfd, and writes its header. The file is new (`owned_files::create_exclusive`: a
    /// path where anything is already, a symbolic link included, is refused), mode 0600
    /// whatever the umask, and removed when the region is dropped while the path still names
    /// it.
    pub fn create(size: u64, vcpus: usize, file: Option<&Path>) -> Result<PpaPage, PpaPageError> {
        let header = layout(size, vcpus)?;
        let what = file.map_or("memfd".to_string(), |p| p.display().to_string());
        let backing = |source| PpaPageError::Backing {
            what: what.clone(),
            source,
        };
        let backing_file = match file {
            Some(path) => match crate::owned_files::create_exclusive(path, 0o600) {
                Ok(f) => f,
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                    return Err(PpaPageError::Exists {
                        path: path.to_path_buf(),
                        what: crate::owned_files::what_is_at(path).unwrap_or("a file"),
                    })
                }
                Err(e) => return Err(backing(e)),
            },
            None => memfd().map_err(backing)?,
        };
        // A file of `size` zero bytes: the mapping below never reaches past its end.
        backing_file.set_len(size).map_err(backing)?;
        let mapping = MmapRegion::from_file(FileOffset::new(backing_file, 0), size as usize)
            .map_err(|source| PpaPageError::Map { what, source })?;
        // SAFETY: the mapping is `size` >= 4096 bytes, page-aligned (so the header's 8-byte
        // alignment holds), and nobody else writes it before the VM starts.
        unsafe { std::ptr::write_volatile(mapping.as_ptr().cast::<RegionHeader>(), header) };
        Ok(PpaPage {
            mapping: Arc::new(mapping),
            vcpus,
            header,
            file: file.map(Path::to_path_buf),
            writing: AtomicBool::new(false),
            board: board::GuestBoard::default(),
        })
    }

    /// Resets asked of the guest agent and the alarms forwarded from it.
    pub fn board(&self) -> &board::GuestBoard {
        &self.board
    }

    /// Host address of the region.
    pub fn host_addr(&self) -> u64 {
        self.mapping.as_ptr() as u64
    }

    /// Size of the region.
    pub fn size(&self) -> u64 {
        self.mapping.size() as u64
    }

    /// The region's mapping (its memfd or file at offset 0), to place it in a guest memory map.
    pub fn mapping(&self) -> Arc<MmapRegion> {
        Arc::clone(&self.mapping)
    }

    /// The header written at the start.
    pub fn header(&self) -> &RegionHeader {
        &self.header
    }

    fn host_ptr(&self, vcpu: usize) -> Option<*mut HostVcpu> {
        (vcpu < self.vcpus).then(|| {
            let off =
                self.header.host_offset as usize + vcpu * self.header.host_record_size as usize;
            // SAFETY: `layout` checked that every host record lies inside the mapping.
            unsafe { self.mapping.as_ptr().add(off).cast::<HostVcpu>() }
        })
    }

    /// The host section's one writer, or `None` while another lives (the sampler holds it
    /// for its whole run).
    pub fn host_writer(&self) -> Option<HostWriter<'_>> {
        (!self.writing.swap(true, Ordering::Acquire)).then_some(HostWriter { page: self })
    }

    fn vm_ptr(&self) -> *mut HostVm {
        // SAFETY: `layout` placed the VM record inside the mapping, after the host records
        // (8-byte aligned: the header and the records are multiples of 8 bytes).
        unsafe {
            self.mapping
                .as_ptr()
                .add(self.header.vm_offset as usize)
                .cast::<HostVm>()
        }
    }

    /// Reads the VM-wide host record (at most `tries` attempts).
    pub fn read_vm(&self, tries: u32) -> Result<HostVm, ReadError> {
        // SAFETY: an aligned record inside the mapping (`vm_ptr`).
        unsafe { read_record(self.vm_ptr(), tries) }
    }

    /// The guest section, live: it borrows the page, so it cannot outlive the mapping.
    pub fn guest_section(&self) -> decode::Section<'_> {
        // SAFETY: `layout` placed the guest section inside the mapping, 8-byte aligned; the
        // mapping lives as long as `self`, which the returned section borrows; the guest writes
        // it concurrently, which `Section` allows (it reads only with volatile reads).
        unsafe {
            decode::Section::new(
                self.mapping.as_ptr().add(self.header.guest_offset as usize),
                self.header.guest_size as usize,
            )
        }
    }

    /// What the guest published, decoded, with the host section as the guest sees it, the
    /// resets asked and the alarms forwarded.
    pub fn guest_view(&self) -> ppa_vmm_api::GuestView {
        let mut v = decode::decode(self.guest_section());
        v.host = (0..self.vcpus)
            .filter_map(|i| self.read_host(i, 8)?.ok())
            .map(|r| [r.steal_ns, r.limited_ns, r.used_ns, r.updated_ns])
            .collect();
        v.alarms = self.board.alarms_view(v.alarms.take());
        let asked = self.board.reset_asked();
        if asked != 0 || v.reset.is_some() {
            let mut r = v.reset.unwrap_or_default();
            r.requested = asked;
            v.reset = Some(r);
        }
        v
    }

    /// Reads vCPU `vcpu`'s host record (at most `tries` attempts).
    pub fn read_host(&self, vcpu: usize, tries: u32) -> Option<Result<HostVcpu, ReadError>> {
        let p = self.host_ptr(vcpu)?;
        // SAFETY: `p` is an aligned record inside the mapping.
        Some(unsafe { read_record(p, tries) })
    }
}

impl Drop for PpaPage {
    fn drop(&mut self) {
        // The mapping goes with the last holder of `mapping`; the name goes now, if it is
        // still the file this page made.
        if let Some(p) = &self.file {
            crate::owned_files::remove(p);
        }
    }
}

/// A new memfd, closed on exec.
fn memfd() -> io::Result<File> {
    // SAFETY: memfd_create reads the NUL-terminated name; the result is checked.
    let fd = unsafe { libc::memfd_create(c"ppa-page".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a new descriptor nothing else owns.
    Ok(File::from(unsafe { OwnedFd::from_raw_fd(fd) }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_checks_sizes() {
        let h = layout(64 * 1024, 4).unwrap();
        assert_eq!(
            (h.host_offset, h.host_count, h.host_record_size),
            (64, 4, 128)
        );
        assert_eq!((h.vm_offset, h.vm_size), (64 + 4 * 128, 128));
        assert_eq!(h.vm_record(), Some((64 + 4 * 128, 128)));
        assert_eq!(h.guest_offset, 64 + 5 * 128);
        assert_eq!(h.guest_size, 64 * 1024 - (64 + 5 * 128));
        assert!(matches!(layout(1000, 1), Err(PpaPageError::Size(1000))));
        assert!(matches!(layout(5000, 1), Err(PpaPageError::Size(_))));
        assert!(matches!(layout(32 << 20, 1), Err(PpaPageError::Size(_))));
        assert!(matches!(
            layout(4096, 64),
            Err(PpaPageError::TooSmall { vcpus: 64, .. })
        ));
    }

    #[test]
    fn a_file_backed_region_is_shared_with_its_file() {
        let dir = vmm_sys_util::tempdir::TempDir::new().unwrap();
        let path = dir.as_path().join("page");
        let page = PpaPage::create(8192, 2, Some(&path)).unwrap();
        let mut w = page.host_writer().unwrap();
        let rec = HostVcpu {
            vcpu: 1,
            steal_ns: 77,
            ..Default::default()
        };
        w.publish(1, &rec);
        let got = page.read_host(1, 4).unwrap().unwrap();
        assert_eq!(got.steal_ns, 77);
        // Another mapping of the file (as a host tool has) sees the header and the record.
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(&bytes[0..4], b"PPAP");
        let off = 64 + 128 + 48;
        assert_eq!(
            u64::from_le_bytes(bytes[off..off + 8].try_into().unwrap()),
            77
        );
        // The VM record sits after the two vCPU records; a host tool finds it there.
        w.publish_vm(&HostVm {
            flags: ppa_guest_abi::ppa_page::VM_PRESSURE,
            pressure_some_total_us: 4242,
            ..Default::default()
        });
        assert_eq!(page.read_vm(4).unwrap().pressure_some_total_us, 4242);
        let bytes = std::fs::read(&path).unwrap();
        let vm = 64 + 2 * 128;
        assert_eq!(
            &bytes[40..48],
            &[vm as u8, (vm >> 8) as u8, 0, 0, 128, 0, 0, 0]
        );
        assert_eq!(
            u64::from_le_bytes(bytes[vm + 80..vm + 88].try_into().unwrap()),
            4242
        );
        assert!(page.read_host(2, 4).is_none());
        drop(w);
        drop(page);
        assert!(!path.exists(), "the file goes with the VM");
    }

    #[test]
    fn a_page_file_path_that_exists_or_is_a_link_is_refused_and_nothing_is_written() {
        // The trial's finding: `page.ppa -> victim.txt` truncated and filled the victim.
        let dir = vmm_sys_util::tempdir::TempDir::new().unwrap();
        let victim = dir.as_path().join("victim.txt");
        std::fs::write(&victim, b"do not touch").unwrap();
        let link = dir.as_path().join("page.ppa");
        std::os::unix::fs::symlink(&victim, &link).unwrap();
        let e = PpaPage::create(65536, 1, Some(&link)).unwrap_err();
        assert!(
            matches!(
                e,
                PpaPageError::Exists {
                    what: "a symbolic link",
                    ..
                }
            ),
            "{e}"
        );
        assert!(e
            .to_string()
            .contains("never reuses, follows or overwrites"));
        assert_eq!(std::fs::read(&victim).unwrap(), b"do not touch");
        assert!(
            std::fs::symlink_metadata(&link).unwrap().is_symlink(),
            "the link stays"
        );
        // A regular file at the path: refused, left whole.
        let e = PpaPage::create(65536, 1, Some(&victim)).unwrap_err();
        assert!(
            matches!(e, PpaPageError::Exists { what: "a file", .. }),
            "{e}"
        );
        assert_eq!(std::fs::read(&victim).unwrap(), b"do not touch");
        // A new path: made 0600 and removed at the end.
        let path = dir.as_path().join("new.ppa");
        let page = PpaPage::create(8192, 1, Some(&path)).unwrap();
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode, 0o600);
        // Replaced under the running VM by someone else's file: that file stays at the end.
        std::fs::remove_file(&path).unwrap();
        std::fs::write(&path, b"theirs").unwrap();
        drop(page);
        assert_eq!(std::fs::read(&path).unwrap(), b"theirs");
    }

    #[test]
    fn a_memfd_backed_region_has_its_header_records_and_an_empty_guest_section() {
        let page = PpaPage::create(16384, 3, None).unwrap();
        assert_eq!(page.size(), 16384);
        assert_eq!(page.mapping().size(), 16384);
        assert_eq!(
            page.host_addr() % 4096,
            0,
            "page-aligned for a KVM memory slot"
        );
        // SAFETY: the header is at the start of the live mapping, written by `create`.
        let h: RegionHeader = unsafe { std::ptr::read_volatile(page.host_addr() as *const _) };
        assert_eq!(h, *page.header());
        assert_eq!(
            (h.magic, h.host_count, h.total_size),
            (REGION_MAGIC, 3, 16384)
        );
        let mut w = page.host_writer().unwrap();
        assert!(
            page.host_writer().is_none(),
            "one writer at a time: a second is refused while the first lives"
        );
        for vcpu in 0..3 {
            let rec = HostVcpu {
                vcpu: vcpu as u32,
                used_ns: 1000 + vcpu as u64,
                ..Default::default()
            };
            w.publish(vcpu, &rec);
        }
        drop(w);
        assert!(
            page.host_writer().is_some(),
            "the writer comes back when the first is dropped"
        );
        for vcpu in 0..3 {
            let got = page.read_host(vcpu, 4).unwrap().unwrap();
            assert_eq!((got.vcpu, got.used_ns), (vcpu as u32, 1000 + vcpu as u64));
            assert_eq!(got.seq, 2, "written once");
        }
        let v = page.guest_view();
        assert!(v.page && !v.published && v.errors.is_empty(), "{v:?}");
        assert_eq!(v.host.len(), 3);
    }
}
