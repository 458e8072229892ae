//! Tiny-guest image loading: a strict ELF64 parser that checks every PT_LOAD against the part
//! of guest memory the tiny layout leaves for the image.
//!
//! Data flow: the image bytes (embedded tiny guest or a `--tiny-image` file) go to
//! [`parse_elf`] with the window of guest memory the image may occupy; it returns the entry
//! point and the segments (file bytes to copy, memory size to zero-fill), or a
//! [`LoaderError`] that names the problem. The tiny payload then copies the segments into guest
//! memory. Nothing here touches the hypervisor or memory, so every bad image is unit-tested.

use std::ops::Range;

use thiserror::Error;

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

const PT_LOAD: u32 = 1;
const EM_X86_64: u16 = 62;
const ET_EXEC: u16 = 2;

fn u16_at(b: &[u8], off: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(off..off + 2)?.try_into().ok()?))
}
fn u32_at(b: &[u8], off: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(off..off + 4)?.try_into().ok()?))
}
fn u64_at(b: &[u8], off: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(off..off + 8)?.try_into().ok()?))
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
    if u32_at(ph, 0).ok_or(LoaderError::BadProgramHeaders)? != PT_LOAD {
        return Ok(None);
    }
    let offset = u64_at(ph, 8).ok_or(LoaderError::BadProgramHeaders)?;
    let paddr = u64_at(ph, 24).ok_or(LoaderError::BadProgramHeaders)?;
    let filesz = u64_at(ph, 32).ok_or(LoaderError::BadProgramHeaders)?;
    let memsz = u64_at(ph, 40).ok_or(LoaderError::BadProgramHeaders)?;
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
    if bytes.len() < 64 || &bytes[0..4] != b"\x7fELF" {
        return Err(LoaderError::NotElf);
    }
    if bytes[4] != 2 {
        return Err(LoaderError::WrongKind("not 64-bit"));
    }
    if bytes[5] != 1 {
        return Err(LoaderError::WrongKind("not little-endian"));
    }
    let field16 = |off| u16_at(bytes, off).ok_or(LoaderError::NotElf);
    if field16(0x12)? != EM_X86_64 {
        return Err(LoaderError::WrongKind("not x86_64"));
    }
    if field16(0x10)? != ET_EXEC {
        return Err(LoaderError::WrongKind("not a static executable (ET_EXEC)"));
    }
    let entry = u64_at(bytes, 0x18).ok_or(LoaderError::NotElf)?;
    let phoff = u64_at(bytes, 0x20).ok_or(LoaderError::NotElf)?;
    let phentsize = usize::from(field16(0x36)?);
    let phnum = usize::from(field16(0x38)?);
    if phentsize < 56 {
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
