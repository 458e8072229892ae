//! The hypervisor CPUID leaves through which PPA-VMM tells a Linux guest where its PPA page is
//! (spec section 8, docs/abi.md "Discovery").
//!
//! Data flow: the VMM calls [`encode`] with the page's guest-physical address, size and layout
//! version and installs the [`LEAVES`] entries in every vCPU's CPUID table; the guest agent
//! executes `cpuid` for [`BASE`] and [`LEAF_PAGE`] and hands the registers to [`decode`],
//! which trusts them only when the signature matches. Both sides use these two functions, so
//! they cannot disagree on the encoding.
//!
//! The range sits beside KVM's leaves (0x4000_0000..0x4000_00ff), at [`BASE`] =
//! 0x4000_0100, one of the 0x100-aligned slots Linux scans for hypervisor signatures. It
//! carries its own signature, so KVM's, Hyper-V's or Xen's detection code ignores it:
//!
//! | leaf | EAX | EBX | ECX | EDX |
//! | --- | --- | --- | --- | --- |
//! | 0x4000_0100 | max leaf (0x4000_0101) | `"PPA-"` | `"VMM-"` | `"PAGE"` |
//! | 0x4000_0101 | page GPA bits 0–31 | page GPA bits 32–63 | page size, bytes | layout version: major << 16 \| minor |

use core::fmt;

/// First leaf of the range: the max leaf and the signature.
pub const BASE: u32 = 0x4000_0100;
/// The leaf with the page's address, size and layout version.
pub const LEAF_PAGE: u32 = BASE + 1;
/// The highest leaf of the range (EAX of [`BASE`]).
pub const MAX_LEAF: u32 = LEAF_PAGE;
/// Number of leaves [`encode`] makes.
pub const LEAVES: usize = 2;
/// The signature in EBX, ECX, EDX of [`BASE`] (as `cpuid` returns it: 12 ASCII bytes).
pub const SIGNATURE: [u8; 12] = *b"PPA-VMM-PAGE";

/// One CPUID leaf's output registers (subleaf 0; these leaves have no subleaves).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CpuidLeaf {
    /// The leaf (EAX input).
    pub function: u32,
    /// EAX output.
    pub eax: u32,
    /// EBX output.
    pub ebx: u32,
    /// ECX output.
    pub ecx: u32,
    /// EDX output.
    pub edx: u32,
}

/// What the leaves say about the page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageLocation {
    /// Guest-physical address of the region.
    pub gpa: u64,
    /// Its size in bytes.
    pub size: u32,
    /// Layout major version.
    pub major: u16,
    /// Layout minor version.
    pub minor: u16,
}

/// Why the leaves do not describe a page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CpuidError {
    /// [`BASE`] does not carry [`SIGNATURE`]: not PPA-VMM, or a VMM without a PPA page.
    NoSignature {
        /// The 12 signature bytes found.
        found: [u8; 12],
    },
    /// The signature is there but the max leaf does not reach [`LEAF_PAGE`].
    NoPageLeaf {
        /// EAX of [`BASE`].
        max_leaf: u32,
    },
    /// The page leaf holds an address or size no page can have (zero, not 4 KiB aligned).
    BadPage {
        /// The address given.
        gpa: u64,
        /// The size given.
        size: u32,
    },
}

impl fmt::Display for CpuidError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CpuidError::NoSignature { found } => {
                write!(f, "CPUID leaf {BASE:#x} has no PPA-VMM signature (found \"")?;
                for &b in found {
                    if b.is_ascii_graphic() {
                        write!(f, "{}", b as char)?;
                    } else {
                        write!(f, "\\x{b:02x}")?;
                    }
                }
                write!(f, "\")")
            }
            CpuidError::NoPageLeaf { max_leaf } => write!(
                f,
                "CPUID leaf {BASE:#x} has the PPA-VMM signature but its max leaf {max_leaf:#x} \
                 does not reach the page leaf {LEAF_PAGE:#x}"
            ),
            CpuidError::BadPage { gpa, size } => write!(
                f,
                "CPUID leaf {LEAF_PAGE:#x} gives a page at {gpa:#x} of {size} bytes, which is not \
                 a non-empty, 4 KiB-aligned range"
            ),
        }
    }
}

impl core::error::Error for CpuidError {}

/// [`SIGNATURE`] as the three registers EBX, ECX, EDX.
const SIGNATURE_WORDS: [u32; 3] = {
    let s = SIGNATURE;
    [
        u32::from_le_bytes([s[0], s[1], s[2], s[3]]),
        u32::from_le_bytes([s[4], s[5], s[6], s[7]]),
        u32::from_le_bytes([s[8], s[9], s[10], s[11]]),
    ]
};

/// The leaves that advertise a page at `gpa` of `size` bytes with layout `version` (major <<
/// 16 | minor; [`crate::ppa_page::VERSION`] for this crate's layout), for the VMM to install
/// in each vCPU's CPUID table.
pub const fn encode(gpa: u64, size: u32, version: u32) -> [CpuidLeaf; LEAVES] {
    [
        CpuidLeaf {
            function: BASE,
            eax: MAX_LEAF,
            ebx: SIGNATURE_WORDS[0],
            ecx: SIGNATURE_WORDS[1],
            edx: SIGNATURE_WORDS[2],
        },
        CpuidLeaf {
            function: LEAF_PAGE,
            eax: gpa as u32,
            ebx: (gpa >> 32) as u32,
            ecx: size,
            edx: version,
        },
    ]
}

/// Decodes the registers of [`BASE`] and [`LEAF_PAGE`] as `cpuid` returned them. The page
/// leaf is looked at only when the base leaf carries the signature and reaches it.
pub fn decode(base: CpuidLeaf, page: CpuidLeaf) -> Result<PageLocation, CpuidError> {
    if [base.ebx, base.ecx, base.edx] != SIGNATURE_WORDS {
        let mut found = [0u8; 12];
        found[0..4].copy_from_slice(&base.ebx.to_le_bytes());
        found[4..8].copy_from_slice(&base.ecx.to_le_bytes());
        found[8..12].copy_from_slice(&base.edx.to_le_bytes());
        return Err(CpuidError::NoSignature { found });
    }
    if base.eax < LEAF_PAGE {
        return Err(CpuidError::NoPageLeaf { max_leaf: base.eax });
    }
    let gpa = u64::from(page.eax) | (u64::from(page.ebx) << 32);
    let size = page.ecx;
    if gpa == 0 || !gpa.is_multiple_of(4096) || size == 0 || !size.is_multiple_of(4096) {
        return Err(CpuidError::BadPage { gpa, size });
    }
    Ok(PageLocation {
        gpa,
        size,
        major: (page.edx >> 16) as u16,
        minor: page.edx as u16,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encode_then_decode_gives_the_page_back() {
        let [base, page] = encode(0x1_FD00_0000, 65536, (1 << 16) | 1);
        assert_eq!(base.function, 0x4000_0100);
        assert_eq!(page.function, 0x4000_0101);
        assert_eq!(base.eax, 0x4000_0101, "max leaf");
        // The signature reads as ASCII in EBX, ECX, EDX order, as KVM's "KVMKVMKVM" does.
        let mut sig = [0u8; 12];
        sig[0..4].copy_from_slice(&base.ebx.to_le_bytes());
        sig[4..8].copy_from_slice(&base.ecx.to_le_bytes());
        sig[8..12].copy_from_slice(&base.edx.to_le_bytes());
        assert_eq!(&sig, b"PPA-VMM-PAGE");
        assert_eq!(
            (page.eax, page.ebx, page.ecx, page.edx),
            (0xFD00_0000, 1, 65536, 0x1_0001)
        );
        assert_eq!(
            decode(base, page),
            Ok(PageLocation {
                gpa: 0x1_FD00_0000,
                size: 65536,
                major: 1,
                minor: 1
            })
        );
    }

    #[test]
    fn other_signatures_and_bad_pages_are_refused() {
        let [base, page] = encode(0xFD00_0000, 4096, 1 << 16);
        // KVM's own signature at this base (or what bare metal returns) is not ours.
        let kvm = CpuidLeaf {
            ebx: u32::from_le_bytes(*b"KVMK"),
            ecx: u32::from_le_bytes(*b"VMKV"),
            edx: u32::from_le_bytes(*b"M\0\0\0"),
            ..base
        };
        let e = decode(kvm, page).unwrap_err();
        assert!(matches!(e, CpuidError::NoSignature { found } if &found[..9] == b"KVMKVMKVM"));
        let mut text = [0u8; 128];
        let n = {
            use core::fmt::Write;
            let mut w = Buf(&mut text, 0);
            write!(w, "{e}").unwrap();
            w.1
        };
        assert_eq!(
            core::str::from_utf8(&text[..n]).unwrap(),
            "CPUID leaf 0x40000100 has no PPA-VMM signature (found \"KVMKVMKVM\\x00\\x00\\x00\")"
        );
        assert_eq!(
            decode(CpuidLeaf { eax: BASE, ..base }, page),
            Err(CpuidError::NoPageLeaf { max_leaf: BASE })
        );
        for (gpa, size) in [
            (0, 4096),
            (0xFD00_0800, 4096),
            (0xFD00_0000, 0),
            (0xFD00_0000, 100),
        ] {
            let [_, p] = encode(gpa, size, 1 << 16);
            assert_eq!(decode(base, p), Err(CpuidError::BadPage { gpa, size }));
        }
        // All zeroes (a CPU that knows no such leaf) is no signature.
        assert!(matches!(
            decode(CpuidLeaf::default(), CpuidLeaf::default()),
            Err(CpuidError::NoSignature { .. })
        ));
    }

    /// A fixed buffer for formatting without an allocator.
    struct Buf<'a>(&'a mut [u8], usize);
    impl core::fmt::Write for Buf<'_> {
        fn write_str(&mut self, s: &str) -> core::fmt::Result {
            let end = self.1 + s.len();
            self.0
                .get_mut(self.1..end)
                .ok_or(core::fmt::Error)?
                .copy_from_slice(s.as_bytes());
            self.1 = end;
            Ok(())
        }
    }
}
