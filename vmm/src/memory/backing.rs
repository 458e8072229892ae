//! What backs guest RAM (issue 36): anonymous 4 KiB pages (the default), or huge pages of
//! 2 MiB or 1 GiB from the kernel's pool (`--memory-backing hugepages[=2M|1G]`), and the NUMA
//! node it is bound to (`--numa-node N`).
//!
//! Data flow: [`MemoryBacking::parse`] reads the option; before anything is mapped,
//! [`MemoryBacking::check`] refuses RAM that is not in whole huge pages and a pool with too few
//! free pages, with the numbers (`/sys/kernel/mm/hugepages/hugepages-SIZEkB/`: free less
//! reserved); [`map_region`] maps each RAM region private and anonymous, with `MAP_HUGETLB` and
//! the page size's flag for huge pages (the mapping reserves its pages from the pool at once,
//! so a shortfall is an error here rather than a SIGBUS at the guest's first touch), and binds
//! it to the node (`mbind`, `MPOL_BIND`) before a page is faulted in. Why private anonymous
//! memory and not a hugetlbfs file or a shared memfd: nothing else maps guest RAM today; a
//! vhost-user backend would need a shared file descriptor (`memfd_create` with `MFD_HUGETLB`),
//! the one change to [`map_region`] it would take.

use std::fmt;
use std::io;

use thiserror::Error;
use vm_memory::mmap::{MmapRegion, MmapRegionBuilder};

/// Why a backing was refused.
#[derive(Debug, Error)]
pub enum BackingError {
    /// Not `anonymous`, `hugepages`, `hugepages=2M` or `hugepages=1G`.
    #[error("`{q}` is not a memory backing (use hugepages, hugepages=2M or hugepages=1G; anonymous is the default)", q = ppa_vmm_api::clip(.0))]
    Syntax(String),
    /// RAM not in whole huge pages.
    #[error("guest memory of {mib} MiB is not a whole number of {page} pages (its regions, below and above the 32-bit gap, must each be): give a multiple of {page}")]
    Unaligned {
        /// The RAM asked.
        mib: u64,
        /// The page size.
        page: PageSize,
    },
    /// The pool has too few free pages.
    #[error("the {page} huge page pool has {free} free page(s) ({total} in all, {reserved} reserved), and the VM's {mib} MiB need {need}: add pages (echo N > {dir}/nr_hugepages as root) or give the VM less memory")]
    Pool {
        /// The page size.
        page: PageSize,
        /// Free pages not reserved by other mappings.
        free: u64,
        /// Pages in the pool.
        total: u64,
        /// Reserved pages.
        reserved: u64,
        /// Pages the VM needs.
        need: u64,
        /// The RAM asked.
        mib: u64,
        /// The pool's directory.
        dir: String,
    },
    /// The kernel has no pool of that size.
    #[error("this kernel has no {page} huge page pool ({dir} is missing)")]
    NoPool {
        /// The page size.
        page: PageSize,
        /// The directory looked for.
        dir: String,
    },
    /// mmap or mbind failed.
    #[error("cannot {what} {bytes} bytes of guest memory ({page} pages)")]
    Map {
        /// mmap or bind.
        what: &'static str,
        /// The region's size.
        bytes: u64,
        /// The page size.
        page: PageSize,
        /// Cause.
        #[source]
        source: io::Error,
    },
}

/// The size of the pages backing guest RAM.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, schemars::JsonSchema)]
pub enum PageSize {
    /// Anonymous memory of the base page size (4 KiB).
    #[default]
    #[serde(rename = "4K")]
    Base,
    /// 2 MiB huge pages.
    #[serde(rename = "2M")]
    Huge2M,
    /// 1 GiB huge pages.
    #[serde(rename = "1G")]
    Huge1G,
}

impl PageSize {
    /// Bytes of a page.
    pub fn bytes(self) -> u64 {
        match self {
            PageSize::Base => 4096,
            PageSize::Huge2M => 2 << 20,
            PageSize::Huge1G => 1 << 30,
        }
    }

    /// The pool's directory in sysfs (huge pages only).
    pub fn pool_dir(self) -> String {
        format!(
            "/sys/kernel/mm/hugepages/hugepages-{}kB",
            self.bytes() / 1024
        )
    }

    /// mmap flags beyond private and anonymous: `MAP_HUGETLB` with the size's log2.
    fn mmap_flags(self) -> i32 {
        match self {
            PageSize::Base => libc::MAP_NORESERVE,
            PageSize::Huge2M => libc::MAP_HUGETLB | (21 << libc::MAP_HUGE_SHIFT),
            PageSize::Huge1G => libc::MAP_HUGETLB | (30 << libc::MAP_HUGE_SHIFT),
        }
    }
}

impl fmt::Display for PageSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PageSize::Base => "4 KiB",
            PageSize::Huge2M => "2 MiB",
            PageSize::Huge1G => "1 GiB",
        })
    }
}

/// What backs guest RAM, and where.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemoryBacking {
    /// Page size.
    pub page: PageSize,
    /// The NUMA node the RAM is bound to.
    pub numa_node: Option<u32>,
}

/// A huge page pool as sysfs shows it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pool {
    /// `nr_hugepages`.
    pub total: u64,
    /// `free_hugepages`.
    pub free: u64,
    /// `resv_hugepages`: free pages promised to mappings that have not faulted them in.
    pub reserved: u64,
}

impl Pool {
    /// Reads the pool of `page` (None when the kernel has none).
    pub fn read(page: PageSize) -> Option<Pool> {
        let dir = page.pool_dir();
        let n = |f: &str| -> Option<u64> {
            std::fs::read_to_string(format!("{dir}/{f}"))
                .ok()?
                .trim()
                .parse()
                .ok()
        };
        Some(Pool {
            total: n("nr_hugepages")?,
            free: n("free_hugepages")?,
            reserved: n("resv_hugepages").unwrap_or(0),
        })
    }

    /// Pages a new mapping can take.
    pub fn available(&self) -> u64 {
        self.free.saturating_sub(self.reserved)
    }
}

impl MemoryBacking {
    /// Parses `--memory-backing` (`anonymous`, `hugepages`, `hugepages=2M`, `hugepages=1G`).
    pub fn parse(s: &str) -> Result<PageSize, BackingError> {
        match s.trim() {
            "anonymous" | "4K" | "4k" => Ok(PageSize::Base),
            "hugepages" | "hugepages=2M" | "hugepages=2m" => Ok(PageSize::Huge2M),
            "hugepages=1G" | "hugepages=1g" => Ok(PageSize::Huge1G),
            _ => Err(BackingError::Syntax(s.to_string())),
        }
    }

    /// Refuses regions of `sizes` bytes (the RAM regions, `mib` MiB in all) that are not whole
    /// pages, or a pool (`pool`, as read now) with too few pages for them.
    pub fn check(&self, sizes: &[u64], mib: u64, pool: Option<Pool>) -> Result<(), BackingError> {
        let page = self.page;
        if page == PageSize::Base {
            return Ok(());
        }
        if sizes.iter().any(|s| s % page.bytes() != 0) {
            return Err(BackingError::Unaligned { mib, page });
        }
        let Some(pool) = pool else {
            return Err(BackingError::NoPool {
                page,
                dir: page.pool_dir(),
            });
        };
        let need: u64 = sizes.iter().map(|s| s / page.bytes()).sum();
        if pool.available() < need {
            return Err(BackingError::Pool {
                page,
                free: pool.available(),
                total: pool.total,
                reserved: pool.reserved,
                need,
                mib,
                dir: page.pool_dir(),
            });
        }
        Ok(())
    }
}

/// Maps one RAM region of `size` bytes as `backing` says (private, anonymous; huge pages and
/// the node's binding when asked).
pub fn map_region(size: u64, backing: &MemoryBacking) -> Result<MmapRegion<()>, BackingError> {
    let err = |what, source| BackingError::Map {
        what,
        bytes: size,
        page: backing.page,
        source,
    };
    let region = MmapRegionBuilder::<()>::new(size as usize)
        .with_mmap_prot(libc::PROT_READ | libc::PROT_WRITE)
        .with_mmap_flags(libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | backing.page.mmap_flags())
        .with_hugetlbfs(backing.page != PageSize::Base)
        .build()
        .map_err(|e| err("map", io::Error::other(e.to_string())))?;
    if let Some(node) = backing.numa_node {
        bind(region.as_ptr(), size, node).map_err(|e| err("bind to its NUMA node", e))?;
    }
    Ok(region)
}

/// `mbind(addr, len, MPOL_BIND, {node}, ...)`: the pages of the range come from `node` only,
/// those already there moved (none are: it is called before the first touch).
fn bind(addr: *mut u8, len: u64, node: u32) -> io::Result<()> {
    const MPOL_BIND: libc::c_ulong = 2;
    const MPOL_MF_STRICT: libc::c_ulong = 1;
    const MPOL_MF_MOVE: libc::c_ulong = 2;
    let bits = libc::c_ulong::BITS;
    let mut mask = vec![0 as libc::c_ulong; node as usize / bits as usize + 1];
    mask[node as usize / bits as usize] |= 1 << (node % bits);
    // SAFETY: `addr`/`len` describe a mapping this process owns (just made); `mask` holds
    // `mask.len() * bits` bits, the maxnode passed, and the kernel only reads it.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_mbind,
            addr,
            len as libc::c_ulong,
            MPOL_BIND,
            mask.as_ptr(),
            (mask.len() as libc::c_ulong) * libc::c_ulong::from(bits),
            MPOL_MF_STRICT | MPOL_MF_MOVE,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backings_parse() {
        assert_eq!(MemoryBacking::parse("hugepages").unwrap(), PageSize::Huge2M);
        assert_eq!(
            MemoryBacking::parse("hugepages=2M").unwrap(),
            PageSize::Huge2M
        );
        assert_eq!(
            MemoryBacking::parse("hugepages=1G").unwrap(),
            PageSize::Huge1G
        );
        assert_eq!(MemoryBacking::parse("anonymous").unwrap(), PageSize::Base);
        assert!(matches!(
            MemoryBacking::parse("huge"),
            Err(BackingError::Syntax(_))
        ));
        assert_eq!(
            PageSize::Huge1G.pool_dir(),
            "/sys/kernel/mm/hugepages/hugepages-1048576kB"
        );
    }

    #[test]
    fn a_short_pool_is_refused_with_the_numbers() {
        let b = MemoryBacking {
            page: PageSize::Huge2M,
            numa_node: None,
        };
        let pool = Pool {
            total: 20,
            free: 12,
            reserved: 2,
        };
        assert!(
            b.check(&[20 << 20], 20, Some(pool)).is_ok(),
            "10 pages of 10"
        );
        let e = b.check(&[32 << 20], 32, Some(pool)).unwrap_err();
        assert_eq!(
            e.to_string(),
            "the 2 MiB huge page pool has 10 free page(s) (20 in all, 2 reserved), and the VM's 32 MiB need 16: add pages (echo N > /sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages as root) or give the VM less memory"
        );
        let e = b.check(&[3 << 20], 3, Some(pool)).unwrap_err();
        assert!(matches!(e, BackingError::Unaligned { mib: 3, .. }), "{e}");
        assert!(matches!(
            b.check(&[2 << 20], 2, None),
            Err(BackingError::NoPool { .. })
        ));
        // Base pages need no pool.
        assert!(MemoryBacking::default().check(&[3 << 20], 3, None).is_ok());
    }

    #[test]
    fn anonymous_memory_binds_to_node_0() {
        let b = MemoryBacking {
            page: PageSize::Base,
            numa_node: Some(0),
        };
        let r = map_region(1 << 20, &b).unwrap();
        assert_eq!(r.size(), 1 << 20);
    }
}
