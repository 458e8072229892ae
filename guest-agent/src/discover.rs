//! Finding the PPA page: the VMM's CPUID leaves, the kernel command line `ppa.page=GPA,SIZE`,
//! or a file given with `--page-file` (docs/agent.md, "Discovery").
//!
//! Data flow: [`Discovery::run`] asks each source in turn and keeps what each said (found, or
//! why not), so `--probe` can report all three; [`Discovery::choice`] picks the page to map: a
//! `--page-file` when one is given (an operator's explicit choice), else the CPUID leaves,
//! else the command line. When CPUID and the command line both name a page and disagree,
//! CPUID wins and [`Discovery::report`] says so.

use std::path::{Path, PathBuf};

use ppa_guest_abi::cpuid::{self, CpuidError, CpuidLeaf, PageLocation};
use thiserror::Error;

/// Why the CPUID leaves name no page.
#[derive(Debug, Error, Clone, Copy, PartialEq, Eq)]
pub enum CpuidMiss {
    /// Not running under a hypervisor.
    #[error("the CPU reports no hypervisor (CPUID.1:ECX bit 31 is clear)")]
    NoHypervisor,
    /// A hypervisor, but not PPA-VMM's leaves, or bad ones.
    #[error("no usable PPA-VMM CPUID leaves")]
    Leaf(#[source] CpuidError),
}

/// Why `ppa.page=` could not be read.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum CmdlineError {
    /// Not `GPA,SIZE` with numbers the agent reads.
    #[error("`ppa.page={0}` is not GPA,SIZE (e.g. ppa.page=0xfd000000,64K)")]
    Form(String),
    /// Numbers no page can have.
    #[error("`ppa.page={0}` does not name a non-empty, 4 KiB-aligned range")]
    Range(String),
}

/// Reads the CPUID leaves of this CPU.
pub fn read_cpuid() -> Result<PageLocation, CpuidMiss> {
    let regs = |leaf: u32| {
        // SAFETY: `cpuid` exists on every x86-64 CPU and only reads registers; for a leaf
        // the CPU does not implement it returns other data, which `decode` refuses. (Unsafe
        // only on toolchains older than the one that made it safe.)
        #[allow(unused_unsafe)]
        let r = unsafe { core::arch::x86_64::__cpuid(leaf) };
        CpuidLeaf {
            function: leaf,
            eax: r.eax,
            ebx: r.ebx,
            ecx: r.ecx,
            edx: r.edx,
        }
    };
    if regs(1).ecx & (1 << 31) == 0 {
        return Err(CpuidMiss::NoHypervisor);
    }
    cpuid::decode(regs(cpuid::BASE), regs(cpuid::LEAF_PAGE)).map_err(CpuidMiss::Leaf)
}

fn number(s: &str) -> Option<u64> {
    match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => s.parse().ok(),
    }
}

/// The page named by `ppa.page=GPA,SIZE` in a kernel command line (the last one wins, as
/// for kernel parameters). Numbers are decimal or 0x-hex; SIZE may end in K or M (KiB, MiB).
pub fn cmdline_page(cmdline: &str) -> Result<Option<(u64, u64)>, CmdlineError> {
    let Some(v) = cmdline
        .split_ascii_whitespace()
        .filter_map(|w| w.strip_prefix("ppa.page="))
        .next_back()
    else {
        return Ok(None);
    };
    let form = || CmdlineError::Form(v.to_string());
    let (gpa, size) = v.split_once(',').ok_or_else(form)?;
    let gpa = number(gpa).ok_or_else(form)?;
    let (digits, scale) = match size.as_bytes().last() {
        Some(b'K' | b'k') => (&size[..size.len() - 1], 1024),
        Some(b'M' | b'm') => (&size[..size.len() - 1], 1024 * 1024),
        _ => (size, 1),
    };
    let size = number(digits)
        .and_then(|n| n.checked_mul(scale))
        .ok_or_else(form)?;
    if gpa == 0 || gpa % 4096 != 0 || size == 0 || size % 4096 != 0 {
        return Err(CmdlineError::Range(v.to_string()));
    }
    Ok(Some((gpa, size)))
}

/// Where the page is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Place {
    /// Guest-physical memory, mapped through /dev/mem.
    Phys {
        /// Address.
        gpa: u64,
        /// Size, bytes.
        size: u64,
    },
    /// A file.
    File(PathBuf),
}

/// What each source said.
#[derive(Debug)]
pub struct Discovery {
    /// The CPUID leaves.
    pub cpuid: Result<PageLocation, CpuidMiss>,
    /// The kernel command line (`None` when /proc/cmdline could not be read).
    pub cmdline: Option<Result<Option<(u64, u64)>, CmdlineError>>,
    /// `--page-file`.
    pub file: Option<PathBuf>,
}

impl Discovery {
    /// Asks every source.
    pub fn run(file: Option<&Path>) -> Discovery {
        let cmdline = std::fs::read_to_string("/proc/cmdline").ok();
        Discovery::with_cmdline(file, cmdline.as_deref())
    }

    /// Asks every source, with `cmdline` as the text of /proc/cmdline (`None`: unreadable).
    pub fn with_cmdline(file: Option<&Path>, cmdline: Option<&str>) -> Discovery {
        Discovery {
            cpuid: read_cpuid(),
            cmdline: cmdline.map(cmdline_page),
            file: file.map(Path::to_path_buf),
        }
    }

    /// The page to use, and which source named it.
    pub fn choice(&self) -> Option<(&'static str, Place)> {
        if let Some(f) = &self.file {
            return Some(("--page-file", Place::File(f.clone())));
        }
        if let Ok(p) = &self.cpuid {
            return Some((
                "CPUID",
                Place::Phys {
                    gpa: p.gpa,
                    size: u64::from(p.size),
                },
            ));
        }
        if let Some(Ok(Some((gpa, size)))) = &self.cmdline {
            return Some((
                "kernel command line",
                Place::Phys {
                    gpa: *gpa,
                    size: *size,
                },
            ));
        }
        None
    }

    /// One line per source, for `--probe` and the log.
    pub fn report(&self) -> Vec<String> {
        let mut out = Vec::new();
        out.push(match &self.cpuid {
            Ok(p) => format!(
                "CPUID leaf {:#x}: a page at {:#x}, {} bytes, layout {}.{}",
                cpuid::BASE,
                p.gpa,
                p.size,
                p.major,
                p.minor
            ),
            Err(e) => format!("CPUID: {}", crate::describe(e)),
        });
        out.push(match &self.cmdline {
            None => "kernel command line: /proc/cmdline cannot be read".to_string(),
            Some(Ok(None)) => "kernel command line: no ppa.page= parameter".to_string(),
            Some(Ok(Some((gpa, size)))) => {
                format!("kernel command line: ppa.page= names {gpa:#x}, {size} bytes")
            }
            Some(Err(e)) => format!("kernel command line: {e}"),
        });
        if let (Ok(p), Some(Ok(Some((gpa, size))))) = (&self.cpuid, &self.cmdline) {
            if (p.gpa, u64::from(p.size)) != (*gpa, *size) {
                out.push(format!(
                    "CPUID and ppa.page= disagree ({:#x}+{} vs {gpa:#x}+{size}): CPUID wins",
                    p.gpa, p.size
                ));
            }
        }
        out.push(match &self.file {
            Some(f) => format!("--page-file: {}", f.display()),
            None => "--page-file: not given".to_string(),
        });
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kernel_parameter_in_its_forms() {
        assert_eq!(cmdline_page("quiet console=ttyS0"), Ok(None));
        assert_eq!(
            cmdline_page("console=ttyS0 ppa.page=0xfd000000,65536 quiet\n"),
            Ok(Some((0xFD00_0000, 65536)))
        );
        assert_eq!(
            cmdline_page("ppa.page=4244635648,64K"),
            Ok(Some((0xFD00_0000, 65536)))
        );
        assert_eq!(
            cmdline_page("ppa.page=0x1000,1M ppa.page=0xFD000000,0x2000"),
            Ok(Some((0xFD00_0000, 0x2000))),
            "the last one wins"
        );
        assert_eq!(
            cmdline_page("ppa.page=0xfd000000"),
            Err(CmdlineError::Form("0xfd000000".into()))
        );
        assert_eq!(
            cmdline_page("ppa.page=0xfd000000,lots"),
            Err(CmdlineError::Form("0xfd000000,lots".into()))
        );
        assert_eq!(
            cmdline_page("ppa.page=0xfd000100,4096"),
            Err(CmdlineError::Range("0xfd000100,4096".into()))
        );
        assert_eq!(
            cmdline_page("ppa.page=0,4096").unwrap_err().to_string(),
            "`ppa.page=0,4096` does not name a non-empty, 4 KiB-aligned range"
        );
        // Another parameter that merely contains the text is not it.
        assert_eq!(cmdline_page("xppa.page=0x1000,4096"), Ok(None));
    }

    #[test]
    fn an_explicit_file_wins_then_cpuid_then_the_command_line() {
        let leaf = PageLocation {
            gpa: 0xFD00_0000,
            size: 65536,
            major: 1,
            minor: 1,
        };
        let mut d = Discovery {
            cpuid: Ok(leaf),
            cmdline: Some(Ok(Some((0xE000_0000, 4096)))),
            file: Some(PathBuf::from("/tmp/page")),
        };
        assert_eq!(d.choice().unwrap().0, "--page-file");
        d.file = None;
        assert_eq!(
            d.choice(),
            Some((
                "CPUID",
                Place::Phys {
                    gpa: 0xFD00_0000,
                    size: 65536
                }
            ))
        );
        assert!(
            d.report().iter().any(|l| l.contains("disagree")),
            "{:?}",
            d.report()
        );
        d.cpuid = Err(CpuidMiss::NoHypervisor);
        assert_eq!(d.choice().unwrap().0, "kernel command line");
        d.cmdline = Some(Ok(None));
        assert_eq!(d.choice(), None);
        let r = d.report();
        assert_eq!(
            r[0],
            "CPUID: the CPU reports no hypervisor (CPUID.1:ECX bit 31 is clear)"
        );
        assert_eq!(r[1], "kernel command line: no ppa.page= parameter");
    }

    #[test]
    fn a_proc_cmdline_with_the_vmms_parameter_names_the_page() {
        // What PPA-VMM writes (`ppa.page={gpa:#x},{size}`), as /proc/cmdline shows it (with
        // its newline), and the same page written all in hex or all in decimal.
        for text in [
            "console=ttyS0 reboot=k panic=1 pci=off ppa.page=0xfd000000,65536 quiet\n",
            "console=ttyS0 ppa.page=0xFD000000,0x10000\n",
            "ppa.page=4244635648,65536\n",
        ] {
            let mut d = Discovery::with_cmdline(None, Some(text));
            // Whatever this machine's CPUID says, the command line is what is tested here.
            d.cpuid = Err(CpuidMiss::NoHypervisor);
            assert_eq!(
                d.choice(),
                Some((
                    "kernel command line",
                    Place::Phys {
                        gpa: 0xFD00_0000,
                        size: 65536
                    }
                )),
                "{text:?}"
            );
            assert_eq!(
                d.report()[1],
                "kernel command line: ppa.page= names 0xfd000000, 65536 bytes"
            );
        }
        let d = Discovery::with_cmdline(None, None);
        assert_eq!(
            d.report()[1],
            "kernel command line: /proc/cmdline cannot be read"
        );
    }

    #[test]
    fn this_machine_has_no_ppa_vmm_leaves() {
        // The development hosts run under a hypervisor that is not PPA-VMM: the leaves are
        // read, and refused (the signature decides, whatever the registers hold).
        assert!(read_cpuid().is_err());
    }
}
