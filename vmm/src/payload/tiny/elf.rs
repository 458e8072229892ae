//! Tiny-guest image loading: a strict ELF64 parser (linux-loader's ELF header types and
//! constants) that checks every PT_LOAD against the part of guest memory the tiny layout
//! leaves for the image.
//!
//! Data flow: the image bytes (embedded tiny guest or a `--tiny-image` file) go to
//! [`parse_elf`] with the window of guest memory the image may occupy; it returns the entry
//! point and the segments (file bytes to copy, memory size to zero-fill), or a
//! [`LoaderError`] that names the problem. The tiny payload then copies the segments into guest
//! memory. Nothing here touches the hypervisor or memory, so every bad image is unit-tested.

use std::ops::Range;

use linux_loader::elf::{
    Elf64_Ehdr, Elf64_Phdr, EI_CLASS, EI_DATA, ELFCLASS64, ELFDATA2LSB, ELFMAG, EM_X86_64, ET_EXEC,
    PT_LOAD,
};
use thiserror::Error;
use vm_memory::ByteValued;

/// Why an image cannot be loaded.
#[derive(Debug, Clone, Error, PartialEq, Eq)]
pub enum LoaderError {
    /// Too short or without the ELF magic.
    #[error("the image is not an ELF file (no ELF magic in its first bytes)")]
    NotElf,
    /// A Linux kernel image given as a tiny-guest image.
    #[error("the image is a Linux kernel (bzImage), not a tiny-guest ELF image: a Linux kernel takes --kernel")]
    LinuxKernel,
    /// Wrong class, byte order, machine or type.
    #[error("the ELF image is not a 64-bit little-endian x86_64 executable: {0}")]
    WrongKind(&'static str),
    /// The program header table does not fit in the file.
    #[error("the ELF program header table lies outside the file")]
    BadProgramHeaders,
    /// A segment's file bytes lie outside the file or exceed its memory size.
    #[error("ELF segment {index} has file bytes outside the file or larger than its memory size")]
    BadSegment {
        /// Index in the program header table.
        index: usize,
    },
    /// A segment reaches below the image window (the page tables and boot area).
    #[error(
        "ELF segment {index} at {start:#x}..{end:#x} overlaps the page tables and boot area \
         below {min:#x}"
    )]
    OverlapsBootArea {
        /// Index in the program header table.
        index: usize,
        /// Segment start.
        start: u64,
        /// Segment end.
        end: u64,
        /// First address an image may use.
        min: u64,
    },
    /// A segment reaches past the end of usable guest memory.
    #[error(
        "ELF segment {index} at {start:#x}..{end:#x} lies outside guest memory available for \
         the image (which ends at {limit:#x}, below the vCPU stacks): give the VM more memory"
    )]
    OutsideMemory {
        /// Index in the program header table.
        index: usize,
        /// Segment start.
        start: u64,
        /// Segment end.
        end: u64,
        /// End of the window.
        limit: u64,
    },
    /// Two segments overlap.
    #[error("ELF segments {0} and {1} overlap")]
    SegmentsOverlap(usize, usize),
    /// No loadable segment.
    #[error("the ELF image has no loadable segment")]
    NoSegments,
    /// The entry point is not inside a loaded segment.
    #[error("the ELF entry point {0:#x} is not inside a loaded segment")]
    BadEntry(u64),
}

/// One loadable segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Segment {
    /// Guest-physical load address.
    pub gpa: u64,
    /// Bytes of the file to copy there.
    pub file: Range<usize>,
    /// Memory size; bytes past the file part are zero.
    pub mem_size: u64,
}

/// A parsed, checked image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Image {
    /// Entry point (guest-physical = guest-virtual, identity map).
    pub entry: u64,
    /// Loadable segments, sorted by address.
    pub segments: Vec<Segment>,
}

/// A `T` read from `bytes` at `off`, as the file stores it (little-endian, the host's order on
/// x86_64; no alignment needed), or None where it does not fit.
fn read_at<T: ByteValued + Default>(bytes: &[u8], off: usize) -> Option<T> {
    let src = bytes.get(off..off.checked_add(std::mem::size_of::<T>())?)?;
    let mut v = T::default();
    v.as_mut_slice().copy_from_slice(src);
    Some(v)
}

/// Program header `index` (`ph`) as a segment to load, None when it is not a PT_LOAD with
/// memory; checked against the file (`bytes`) and the guest window.
fn load_segment(
    bytes: &[u8],
    ph: &[u8],
    index: usize,
    window: &Range<u64>,
) -> Result<Option<Segment>, LoaderError> {
    let bad = LoaderError::BadSegment { index };
    let h: Elf64_Phdr = read_at(ph, 0).ok_or(LoaderError::BadProgramHeaders)?;
    if h.p_type != PT_LOAD {
        return Ok(None);
    }
    let (offset, paddr, filesz, memsz) = (h.p_offset, h.p_paddr, h.p_filesz, h.p_memsz);
    if memsz == 0 {
        return Ok(None);
    }
    let file_end = offset.checked_add(filesz).ok_or(bad.clone())?;
    if filesz > memsz || file_end > bytes.len() as u64 {
        return Err(bad);
    }
    let end = paddr.checked_add(memsz).ok_or(LoaderError::OutsideMemory {
        index,
        start: paddr,
        end: u64::MAX,
        limit: window.end,
    })?;
    if paddr < window.start {
        return Err(LoaderError::OverlapsBootArea {
            index,
            start: paddr,
            end,
            min: window.start,
        });
    }
    if end > window.end {
        return Err(LoaderError::OutsideMemory {
            index,
            start: paddr,
            end,
            limit: window.end,
        });
    }
    Ok(Some(Segment {
        gpa: paddr,
        file: offset as usize..file_end as usize,
        mem_size: memsz,
    }))
}

/// Parses `bytes` as a tiny-guest ELF image whose segments must lie inside `window`.
pub fn parse_elf(bytes: &[u8], window: Range<u64>) -> Result<Image, LoaderError> {
    if crate::payload::linux::looks_like_bzimage(bytes) {
        return Err(LoaderError::LinuxKernel);
    }
    let h: Elf64_Ehdr = match read_at(bytes, 0) {
        Some(h) if bytes.starts_with(ELFMAG) => h,
        _ => return Err(LoaderError::NotElf),
    };
    if h.e_ident[EI_CLASS] != ELFCLASS64 {
        return Err(LoaderError::WrongKind("not 64-bit"));
    }
    if h.e_ident[EI_DATA] != ELFDATA2LSB {
        return Err(LoaderError::WrongKind("not little-endian"));
    }
    if h.e_machine != EM_X86_64 {
        return Err(LoaderError::WrongKind("not x86_64"));
    }
    if h.e_type != ET_EXEC {
        return Err(LoaderError::WrongKind("not a static executable (ET_EXEC)"));
    }
    let (entry, phoff) = (h.e_entry, h.e_phoff);
    let phentsize = usize::from(h.e_phentsize);
    let phnum = usize::from(h.e_phnum);
    if phentsize < std::mem::size_of::<Elf64_Phdr>() {
        return Err(LoaderError::BadProgramHeaders);
    }
    let table_end = usize::try_from(phoff)
        .ok()
        .and_then(|o| o.checked_add(phentsize.checked_mul(phnum)?));
    if table_end.is_none_or(|end| end > bytes.len()) {
        return Err(LoaderError::BadProgramHeaders);
    }
    let phoff = phoff as usize;

    let mut segments: Vec<(usize, Segment)> = Vec::new();
    for index in 0..phnum {
        let ph = &bytes[phoff + index * phentsize..phoff + (index + 1) * phentsize];
        if let Some(segment) = load_segment(bytes, ph, index, &window)? {
            segments.push((index, segment));
        }
    }
    if segments.is_empty() {
        return Err(LoaderError::NoSegments);
    }
    segments.sort_by_key(|(_, s)| s.gpa);
    for pair in segments.windows(2) {
        let (ia, a) = &pair[0];
        let (ib, b) = &pair[1];
        if a.gpa + a.mem_size > b.gpa {
            return Err(LoaderError::SegmentsOverlap(*ia, *ib));
        }
    }
    if !segments
        .iter()
        .any(|(_, s)| (s.gpa..s.gpa + s.mem_size).contains(&entry))
    {
        return Err(LoaderError::BadEntry(entry));
    }
    Ok(Image {
        entry,
        segments: segments.into_iter().map(|(_, s)| s).collect(),
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A minimal ELF64 executable with the given (paddr, filesz, memsz) PT_LOADs and entry.
    pub(crate) fn elf(segments: &[(u64, u64, u64)], entry: u64) -> Vec<u8> {
        let phoff = 64u64;
        let data_off = phoff + 56 * segments.len() as u64;
        let mut b = vec![0u8; 64];
        b[0..4].copy_from_slice(b"\x7fELF");
        b[4] = 2;
        b[5] = 1;
        b[6] = 1;
        b[0x10..0x12].copy_from_slice(&ET_EXEC.to_le_bytes());
        b[0x12..0x14].copy_from_slice(&EM_X86_64.to_le_bytes());
        b[0x18..0x20].copy_from_slice(&entry.to_le_bytes());
        b[0x20..0x28].copy_from_slice(&phoff.to_le_bytes());
        b[0x36..0x38].copy_from_slice(&56u16.to_le_bytes());
        b[0x38..0x3a].copy_from_slice(&(segments.len() as u16).to_le_bytes());
        let mut off = data_off;
        for &(paddr, filesz, memsz) in segments {
            let mut ph = [0u8; 56];
            ph[0..4].copy_from_slice(&PT_LOAD.to_le_bytes());
            ph[8..16].copy_from_slice(&off.to_le_bytes());
            ph[16..24].copy_from_slice(&paddr.to_le_bytes());
            ph[24..32].copy_from_slice(&paddr.to_le_bytes());
            ph[32..40].copy_from_slice(&filesz.to_le_bytes());
            ph[40..48].copy_from_slice(&memsz.to_le_bytes());
            b.extend_from_slice(&ph);
            off += filesz;
        }
        for &(_, filesz, _) in segments {
            b.extend(std::iter::repeat_n(0xccu8, filesz as usize));
        }
        b
    }

    const WINDOW: Range<u64> = 0x10_0000..0x200_0000;

    #[test]
    fn accepts_a_good_image() {
        let img = parse_elf(
            &elf(
                &[(0x10_0000, 0x100, 0x200), (0x10_1000, 0x10, 0x10)],
                0x10_0010,
            ),
            WINDOW,
        )
        .unwrap();
        assert_eq!(img.entry, 0x10_0010);
        assert_eq!(img.segments.len(), 2);
        assert_eq!(img.segments[0].mem_size, 0x200);
        assert_eq!(img.segments[0].file.len(), 0x100);
    }

    #[test]
    fn rejects_bad_images() {
        assert_eq!(parse_elf(b"hello", WINDOW), Err(LoaderError::NotElf));
        assert_eq!(parse_elf(&[0u8; 10], WINDOW), Err(LoaderError::NotElf));
        let mut bz = vec![0u8; 0x300];
        bz[0x202..0x206].copy_from_slice(b"HdrS");
        assert_eq!(parse_elf(&bz, WINDOW), Err(LoaderError::LinuxKernel));
        let mut e32 = elf(&[(0x10_0000, 1, 1)], 0x10_0000);
        e32[4] = 1;
        assert!(matches!(
            parse_elf(&e32, WINDOW),
            Err(LoaderError::WrongKind(_))
        ));
        assert!(matches!(
            parse_elf(&elf(&[(0x1000, 0x10, 0x10)], 0x1000), WINDOW),
            Err(LoaderError::OverlapsBootArea { .. })
        ));
        assert!(matches!(
            parse_elf(&elf(&[(0x1ff_f000, 0x10, 0x2000)], 0x1ff_f000), WINDOW),
            Err(LoaderError::OutsideMemory { .. })
        ));
        assert!(matches!(
            parse_elf(&elf(&[(u64::MAX - 4, 1, 16)], 0x10_0000), WINDOW),
            Err(LoaderError::OutsideMemory { .. })
        ));
        assert_eq!(
            parse_elf(
                &elf(
                    &[(0x10_0000, 0x10, 0x2000), (0x10_1000, 0x10, 0x10)],
                    0x10_0000
                ),
                WINDOW
            ),
            Err(LoaderError::SegmentsOverlap(0, 1))
        );
        assert_eq!(
            parse_elf(&elf(&[(0x10_0000, 0x10, 0x10)], 0x50_0000), WINDOW),
            Err(LoaderError::BadEntry(0x50_0000))
        );
        assert_eq!(
            parse_elf(&elf(&[], 0x10_0000), WINDOW),
            Err(LoaderError::NoSegments)
        );
        // filesz > memsz, and file bytes past the end of the file.
        assert_eq!(
            parse_elf(&elf(&[(0x10_0000, 0x20, 0x10)], 0x10_0000), WINDOW),
            Err(LoaderError::BadSegment { index: 0 })
        );
        let mut truncated = elf(&[(0x10_0000, 0x100, 0x100)], 0x10_0000);
        truncated.truncate(200);
        assert_eq!(
            parse_elf(&truncated, WINDOW),
            Err(LoaderError::BadSegment { index: 0 })
        );
        // Program header table past the end of the file.
        let mut ph = elf(&[(0x10_0000, 1, 1)], 0x10_0000);
        ph[0x38..0x3a].copy_from_slice(&1000u16.to_le_bytes());
        assert_eq!(parse_elf(&ph, WINDOW), Err(LoaderError::BadProgramHeaders));
    }
}
