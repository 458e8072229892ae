//! The PPA page, VMM side (spec section 8, docs/abi.md): the shared region's memory, its
//! header, and the host section the sampler refreshes.
//!
//! Data flow: `Vm::try_from` creates the region ([`PpaPage::create`]): a memfd, or the file
//! given with `--ppa-page-file` so that host tools can map it, mapped shared and registered as
//! its own KVM memory slot at [`crate::arch::x86_64::layout::PPA_PAGE_GPA`], outside RAM; it
//! writes the region header and tells each vCPU the address in its boot-info record. Every
//! 8 ms the sampler writes each started vCPU's section 4 figures into its host record with
//! the sequence protocol of `ppa_guest_abi::ppa_page`. The guest section is the guest's:
//! [`decode`] checks it on demand (`guest`, the final report) and
//! `ppa_vmm_client::guest_view` prints it.

use std::fs::OpenOptions;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use ppa_guest_abi::ppa_page::{
    read_record, write_record, HostVcpu, ReadError, RegionHeader, MAJOR, MINOR, REGION_MAGIC,
};
use thiserror::Error;

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
    /// The backing file or memfd could not be made.
    #[error("cannot create the PPA page's backing {what}")]
    Backing {
        /// `memfd` or the path.
        what: String,
        /// Cause.
        #[source]
        source: io::Error,
    },
}

/// The shared region.
#[derive(Debug)]
pub struct PpaPage {
    ptr: *mut u8,
    size: usize,
    vcpus: usize,
    header: RegionHeader,
    file: Option<PathBuf>,
    _fd: OwnedFd,
}

// SAFETY: the mapping is shared memory owned by this struct for its whole life; every access
// goes through the sequence protocol (host records: one writer, the sampler) or is a read.
unsafe impl Send for PpaPage {}
// SAFETY: as above.
unsafe impl Sync for PpaPage {}

/// The layout of a region of `size` bytes for `vcpus` vCPUs: host records after the header,
/// the guest section after them (8-byte aligned), the rest of the region.
pub fn layout(size: u64, vcpus: usize) -> Result<RegionHeader, PpaPageError> {
    if !(MIN_SIZE..=MAX_SIZE).contains(&size) || size % 4096 != 0 {
        return Err(PpaPageError::Size(size));
    }
    let header = std::mem::size_of::<RegionHeader>() as u64;
    let record = std::mem::size_of::<HostVcpu>() as u64;
    let host_end = header + record * vcpus as u64;
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
        reserved: [0; 3],
    })
}

impl PpaPage {
    /// Makes a zeroed region of `size` bytes for `vcpus` vCPUs, backed by `file` (created,
    /// mode 0600, removed when the region is dropped) or by a memfd, and writes its header.
    pub fn create(size: u64, vcpus: usize, file: Option<&Path>) -> Result<PpaPage, PpaPageError> {
        let header = layout(size, vcpus)?;
        let backing = |what: String| move |source| PpaPageError::Backing { what, source };
        let fd: OwnedFd = match file {
            Some(path) => {
                use std::os::unix::fs::OpenOptionsExt;
                OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create(true)
                    .truncate(true)
                    .mode(0o600)
                    .open(path)
                    .map_err(backing(path.display().to_string()))?
                    .into()
            }
            None => {
                // SAFETY: memfd_create reads the NUL-terminated name; the result is checked.
                let fd = unsafe { libc::memfd_create(c"ppa-page".as_ptr(), libc::MFD_CLOEXEC) };
                if fd < 0 {
                    return Err(backing("memfd".into())(io::Error::last_os_error()));
                }
                // SAFETY: `fd` is a new descriptor this function owns.
                unsafe { OwnedFd::from_raw_fd(fd) }
            }
        };
        let what = file.map_or("memfd".to_string(), |p| p.display().to_string());
        // SAFETY: ftruncate on a descriptor we own.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), size as libc::off_t) } != 0 {
            return Err(backing(what)(io::Error::last_os_error()));
        }
        // SAFETY: a new shared mapping of `size` bytes of a file we own and sized above.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                size as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(backing(what)(io::Error::last_os_error()));
        }
        let page = PpaPage {
            ptr: ptr.cast(),
            size: size as usize,
            vcpus,
            header,
            file: file.map(Path::to_path_buf),
            _fd: fd,
        };
        // SAFETY: the mapping is at least 64 bytes, page-aligned, and nobody else writes it
        // before the VM starts.
        unsafe { std::ptr::write_volatile(page.ptr.cast::<RegionHeader>(), header) };
        Ok(page)
    }

    /// Host address of the region.
    pub fn host_addr(&self) -> u64 {
        self.ptr as u64
    }

    /// Size of the region.
    pub fn size(&self) -> u64 {
        self.size as u64
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
            unsafe { self.ptr.add(off).cast::<HostVcpu>() }
        })
    }

    /// Publishes vCPU `vcpu`'s host record. Only the sampler calls this (one writer).
    pub fn publish(&self, vcpu: usize, rec: &HostVcpu) {
        if let Some(p) = self.host_ptr(vcpu) {
            // SAFETY: `p` is an aligned record inside the mapping; the sampler is its only
            // writer; the guest and host tools only read it.
            unsafe { write_record(p, rec) };
        }
    }

    /// The guest section, live.
    pub fn guest_section(&self) -> decode::Section {
        // SAFETY: `layout` placed the guest section inside the mapping, 8-byte aligned, and
        // the mapping lives as long as `self`.
        unsafe {
            decode::Section::new(
                self.ptr.add(self.header.guest_offset as usize),
                self.header.guest_size as usize,
            )
        }
    }

    /// What the guest published, decoded, with the host section as the guest sees it.
    pub fn guest_view(&self) -> ppa_vmm_api::GuestView {
        let mut v = decode::decode(self.guest_section());
        v.host = (0..self.vcpus)
            .filter_map(|i| self.read_host(i, 8)?.ok())
            .map(|r| [r.steal_ns, r.limited_ns, r.used_ns, r.updated_ns])
            .collect();
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
        // SAFETY: the mapping was made in `create` with this size and is not used after this.
        unsafe { libc::munmap(self.ptr.cast(), self.size) };
        if let Some(p) = &self.file {
            let _ = std::fs::remove_file(p);
        }
    }
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
        assert_eq!(h.guest_offset, 64 + 4 * 128);
        assert_eq!(h.guest_size, 64 * 1024 - (64 + 4 * 128));
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
        let path = std::env::temp_dir().join(format!("ppa-page-{}", std::process::id()));
        let page = PpaPage::create(8192, 2, Some(&path)).unwrap();
        let rec = HostVcpu {
            vcpu: 1,
            steal_ns: 77,
            ..Default::default()
        };
        page.publish(1, &rec);
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
        assert!(page.read_host(2, 4).is_none());
        drop(page);
        assert!(!path.exists(), "the file goes with the VM");
    }
}
