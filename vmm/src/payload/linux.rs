//! The Linux payload: a kernel (bzImage or ELF vmlinux), an optional initrd and a command line,
//! booted through the 64-bit boot protocol on a PC platform (in-kernel interrupt controllers
//! and PIT, an MP table, a 16550 console, the i8042 reset).
//!
//! Data flow: [`LinuxBoot::prepare`] checks the files and the command line against the VM (no
//! memory or hypervisor yet); the VM builder creates the platform in the hypervisor (before the
//! vCPUs: `Vm::create_platform`) and reads the CPUID it supports; [`LinuxBoot::load`] loads the
//! kernel at 1 MiB (linux-loader), the initrd at the top of the RAM below 2 GiB, the command line
//! (with `ppa.page=GPA,SIZE` when the VM has a PPA page), the zero page with the e820 map, the
//! boot GDT and page tables, the MP table and the ACPI tables (`arch::x86_64::{linux, mptable,
//! acpi}`: Debian's cloud kernel has no MP parser, so ACPI's MADT lists its vCPUs); gives every vCPU
//! its CPUID (topology, KVM's leaves, the PPA leaf) and boot MSRs, wires its LAPIC, sets the
//! boot vCPU's registers (the others wait for the kernel's start-up IPI); and puts the serial
//! port (IRQ 4) and the i8042 on the port bus. The guest's HLTs stay in the hypervisor, so its
//! idle time is `halted_ns` (KVM's halt statistics). A reset through the i8042 ends the run
//! cleanly.

use std::fs::File;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use linux_loader::cmdline::Cmdline;
use linux_loader::loader::bootparam::{setup_header, XLF_KERNEL_64};
use linux_loader::loader::bzimage::BzImage;
use linux_loader::loader::elf::Elf;
use linux_loader::loader::{load_cmdline, KernelLoader};
use serde::Serialize;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use super::{write, Load, PayloadError, VirtioSlot};
use crate::arch::x86_64::acpi;
use crate::arch::x86_64::cpuid::{boot_msrs, guest_cpuid};
use crate::arch::x86_64::layout::Region;
use crate::arch::x86_64::linux as boot;
use crate::arch::x86_64::mptable::{mptable, MAX_CPUS};
use crate::arch::x86_64::regs::{CpuidEntry, Fpu};
use crate::devices::i8042::{COMMAND_PORT, DATA_PORT, I8042};
use crate::devices::serial::{ConsoleOut, ConsoleStats, Serial, COM1_IRQ, COM1_LEN, COM1_PORT};
use crate::hypervisor::{self as hv, Vcpu as _};

/// What every Linux guest's command line starts with: the console on the serial port, a
/// keyboard-controller reset for `reboot` (which ends the VM), no PCI probing (there is none).
pub const BASE_CMDLINE: &str = "console=ttyS0 reboot=k panic=1 pci=off";
/// The least RAM a Linux guest gets.
pub const MIN_RAM_MIB: u64 = 64;
/// The initrd ends below this (64-bit kernels' `initrd_addr_max`).
const INITRD_CEILING: u64 = 0x8000_0000;

/// Where a bzImage's setup header starts in the file (the boot protocol's 0x1f1).
pub(crate) const SETUP_HEADER_OFFSET: u64 = 0x1f1;

/// The setup header's `header` field in a bzImage: "HdrS", little-endian.
pub(crate) const SETUP_HEADER_MAGIC: u32 = u32::from_le_bytes(*b"HdrS");

/// Whether `bytes` (a file's start) carry a bzImage's setup header magic.
pub(crate) fn looks_like_bzimage(bytes: &[u8]) -> bool {
    let at = SETUP_HEADER_OFFSET as usize + std::mem::offset_of!(setup_header, header);
    bytes
        .get(at..at + 4)
        .is_some_and(|m| m == SETUP_HEADER_MAGIC.to_le_bytes())
}

/// Room below the initrd for the kernel's own early allocations after decompression.
const KERNEL_SLACK: u64 = 16 << 20;

/// What the Linux payload reports about one vCPU (nothing yet beyond section 4).
#[derive(Debug, Clone, Default, Serialize, schemars::JsonSchema)]
pub struct LinuxVcpuReport {}

/// What the Linux payload reports about the VM.
#[derive(Debug, Clone, Default, Serialize, schemars::JsonSchema)]
pub struct LinuxVmReport {
    /// The whole command line the kernel got.
    pub cmdline: String,
    /// Lines the guest printed on its serial console.
    pub console_lines: u64,
    /// Bytes it transmitted.
    pub console_bytes: u64,
    /// Resets it asked for through the i8042 (a `reboot`).
    pub resets: u64,
}

impl LinuxVmReport {
    /// One line for the text report.
    pub fn text(&self) -> String {
        format!(
            "LINUX command line \"{}\"; console {} lines ({} bytes); {} reset request(s)\n",
            self.cmdline, self.console_lines, self.console_bytes, self.resets,
        )
    }
}

/// A Linux guest ready to load.
#[derive(Debug)]
pub struct LinuxBoot {
    kernel: PathBuf,
    initrd: Option<PathBuf>,
    cmdline: String,
    vcpus: usize,
    ram: Vec<Region>,
    /// Bytes the kernel needs from its load address (from a bzImage's header; the file size
    /// for an ELF).
    kernel_span: u64,
    initrd_len: u64,
    console: Arc<ConsoleStats>,
    i8042: Arc<I8042>,
    /// The virtio-mmio windows, for the DSDT.
    virtio: Vec<VirtioSlot>,
}

/// The memory a bzImage's kernel needs from its load address while it decompresses and
/// starts (`init_size` of its setup header), or None when the file is not a bzImage.
fn bzimage_init_size(file: &mut File) -> Option<u64> {
    use std::io::{Read, Seek, SeekFrom};
    use vm_memory::ByteValued;
    let mut hdr = setup_header::default();
    file.seek(SeekFrom::Start(SETUP_HEADER_OFFSET)).ok()?;
    file.read_exact(hdr.as_mut_slice()).ok()?;
    let _ = file.seek(SeekFrom::Start(0));
    // Copied out of the packed header before use.
    let (magic, init_size) = (hdr.header, hdr.init_size);
    (magic == SETUP_HEADER_MAGIC).then_some(u64::from(init_size))
}

impl LinuxBoot {
    /// Checks `kernel`, `initrd` and `cmdline` for a VM of `vcpus` vCPUs with RAM `ram` and,
    /// when there is one, a PPA page at `ppa_page`.
    pub fn prepare(
        kernel: &std::path::Path,
        initrd: Option<&std::path::Path>,
        cmdline: &str,
        vcpus: usize,
        ram: &[Region],
        ppa_page: Option<Region>,
        virtio: &[VirtioSlot],
    ) -> Result<LinuxBoot, PayloadError> {
        let open = |p: &std::path::Path| {
            File::open(p).map_err(|source| PayloadError::ReadImage {
                path: p.to_path_buf(),
                source,
            })
        };
        let mut k = open(kernel)?;
        let len = |f: &File, p: &std::path::Path| {
            f.metadata()
                .map(|m| m.len())
                .map_err(|source| PayloadError::ReadImage {
                    path: p.to_path_buf(),
                    source,
                })
        };
        let kernel_len = len(&k, kernel)?;
        let kernel_span = bzimage_init_size(&mut k)
            .unwrap_or(kernel_len)
            .max(kernel_len);
        let initrd_len = match initrd {
            Some(p) => len(&open(p)?, p)?,
            None => 0,
        };
        if vcpus > MAX_CPUS {
            return Err(PayloadError::TooManyVcpus { max: MAX_CPUS });
        }
        let ram_mib = ram.iter().map(|r| r.size).sum::<u64>() >> 20;
        let low_end = ram.first().map_or(0, Region::end).min(INITRD_CEILING);
        let needed =
            boot::KERNEL_GPA + kernel_span + KERNEL_SLACK + initrd_len.next_multiple_of(4096);
        if ram_mib < MIN_RAM_MIB || needed > low_end {
            return Err(PayloadError::LinuxTooSmall {
                memory_mib: ram_mib,
                needed_mib: (needed >> 20).max(MIN_RAM_MIB),
            });
        }
        let mut full = BASE_CMDLINE.to_string();
        if let Some(p) = ppa_page {
            full.push_str(&format!(" ppa.page={:#x},{}", p.gpa, p.size));
        }
        // For kernels built with CONFIG_VIRTIO_MMIO_CMDLINE_DEVICES; the others (Debian's)
        // find the same windows in the DSDT.
        for v in virtio {
            full.push_str(&format!(
                " virtio_mmio.device={}K@{:#x}:{}",
                v.window.size >> 10,
                v.window.gpa,
                v.gsi
            ));
        }
        if !cmdline.trim().is_empty() {
            full.push(' ');
            full.push_str(cmdline.trim());
        }
        if full.len() >= boot::CMDLINE_MAX {
            return Err(PayloadError::CmdlineTooLong {
                len: full.len(),
                max: boot::CMDLINE_MAX - 1,
            });
        }
        Cmdline::try_from(&full, boot::CMDLINE_MAX)
            .map_err(|e| PayloadError::Cmdline(e.to_string()))?;
        Ok(LinuxBoot {
            kernel: kernel.to_path_buf(),
            initrd: initrd.map(std::path::Path::to_path_buf),
            cmdline: full,
            vcpus,
            ram: ram.to_vec(),
            kernel_span,
            initrd_len,
            console: Arc::new(ConsoleStats::default()),
            i8042: Arc::new(I8042::default()),
            virtio: virtio.to_vec(),
        })
    }

    /// The kernel's path.
    pub fn label(&self) -> String {
        self.kernel.display().to_string()
    }

    /// The whole command line the kernel gets.
    pub fn cmdline(&self) -> &str {
        &self.cmdline
    }

    /// Loads the kernel; returns its 64-bit entry and its setup header (a bzImage's).
    fn load_kernel(
        &self,
        mem: &GuestMemoryMmap,
    ) -> Result<(u64, Option<setup_header>), PayloadError> {
        let mut f = File::open(&self.kernel).map_err(|source| PayloadError::ReadImage {
            path: self.kernel.clone(),
            source,
        })?;
        let start = Some(GuestAddress(boot::KERNEL_GPA));
        match Elf::load(mem, None, &mut f, start) {
            Ok(r) => Ok((r.kernel_load.0, None)),
            Err(linux_loader::loader::Error::Elf(
                linux_loader::loader::elf::Error::InvalidElfMagicNumber,
            )) => {
                let r = BzImage::load(mem, None, &mut f, start)
                    .map_err(|e| PayloadError::Kernel(e.to_string()))?;
                let hdr = r
                    .setup_header
                    .ok_or_else(|| PayloadError::Kernel("no setup header".into()))?;
                let (version, flags) = (hdr.version, hdr.xloadflags);
                if version < 0x020c || flags & XLF_KERNEL_64 == 0 {
                    return Err(PayloadError::Kernel(
                        "the bzImage has no 64-bit entry point (boot protocol 2.12 or later)"
                            .into(),
                    ));
                }
                Ok((r.kernel_load.0 + boot::BZIMAGE_64BIT_ENTRY, Some(hdr)))
            }
            Err(e) => Err(PayloadError::Kernel(e.to_string())),
        }
    }

    /// Writes the initrd at the top of the RAM below 2 GiB.
    fn load_initrd(&self, mem: &GuestMemoryMmap) -> Result<Option<Region>, PayloadError> {
        let Some(path) = &self.initrd else {
            return Ok(None);
        };
        let bytes = std::fs::read(path).map_err(|source| PayloadError::ReadImage {
            path: path.clone(),
            source,
        })?;
        let top = self.ram[0].end().min(INITRD_CEILING);
        let gpa = (top - bytes.len() as u64) & !0xfff;
        write(mem, gpa, &bytes)?;
        Ok(Some(Region {
            gpa,
            size: bytes.len() as u64,
        }))
    }

    /// Loads the guest, configures every vCPU and adds the serial port and the i8042.
    pub fn load<V: hv::Vm>(&self, ctx: &mut Load<'_, V>) -> Result<(), PayloadError> {
        let (mem, vcpus) = (ctx.memory, ctx.vcpus);
        let (entry, header) = self.load_kernel(mem)?;
        if let Some(h) = header {
            let max = h.cmdline_size as usize;
            if max > 0 && self.cmdline.len() > max {
                return Err(PayloadError::CmdlineTooLong {
                    len: self.cmdline.len(),
                    max,
                });
            }
        }
        let initrd = self.load_initrd(mem)?;
        let cmdline = Cmdline::try_from(&self.cmdline, boot::CMDLINE_MAX)
            .map_err(|e| PayloadError::Cmdline(e.to_string()))?;
        load_cmdline(mem, GuestAddress(boot::CMDLINE_GPA), &cmdline)
            .map_err(|e| PayloadError::Cmdline(e.to_string()))?;
        let loaded = boot::Loaded {
            initrd,
            cmdline_len: self.cmdline.len(),
        };
        let mut params = boot::zero_page(header, &loaded, &boot::e820(&self.ram, ctx.ppa_page))?;
        params.acpi_rsdp_addr = acpi::RSDP_GPA;
        mem.write_obj(params, GuestAddress(boot::ZERO_PAGE_GPA))
            .map_err(|source| PayloadError::Write {
                gpa: boot::ZERO_PAGE_GPA,
                len: std::mem::size_of_val(&params),
                source,
            })?;
        let gdt: Vec<u8> = boot::gdt().iter().flat_map(|e| e.to_le_bytes()).collect();
        write(mem, boot::GDT_GPA, &gdt)?;
        write(mem, boot::IDT_GPA, &[0; 8])?;
        for (gpa, table) in boot::boot_tables() {
            let bytes: Vec<u8> = table.iter().flat_map(|e| e.to_le_bytes()).collect();
            write(mem, gpa, &bytes)?;
        }
        write(
            mem,
            boot::MPTABLE_GPA,
            &mptable(boot::MPTABLE_GPA, self.vcpus),
        )?;
        let windows: Vec<(u64, u64, u32)> = self
            .virtio
            .iter()
            .map(|v| (v.window.gpa, v.window.size, v.gsi))
            .collect();
        for (gpa, table) in acpi::tables(self.vcpus, &windows) {
            write(mem, gpa, &table)?;
        }

        let extra = ppa_cpuid(ctx.ppa_page);
        for (i, v) in vcpus.iter().enumerate() {
            v.set_cpuid(&guest_cpuid(&ctx.cpuid, i, vcpus.len(), &extra))?;
            v.set_msrs(&boot_msrs())?;
            v.setup_lapic_lints()?;
            v.set_fpu(&Fpu::default())?;
        }
        if let Some(bsp) = vcpus.first() {
            bsp.set_sregs(&boot::boot_sregs())?;
            bsp.set_regs(&boot::boot_regs(entry))?;
        }

        let serial = Serial::new(
            ctx.vm.irq_line(COM1_IRQ)?,
            ConsoleOut::new("ttyS0", Arc::clone(&self.console)),
        );
        ctx.buses
            .pio
            .insert(u64::from(COM1_PORT), COM1_LEN, Arc::new(serial))?;
        let i8042: Arc<I8042> = Arc::clone(&self.i8042);
        ctx.buses
            .pio
            .insert(u64::from(DATA_PORT), 1, i8042.clone())?;
        ctx.buses.pio.insert(u64::from(COMMAND_PORT), 1, i8042)?;
        Ok(())
    }

    /// What the report says about the guest.
    pub fn vm_report(&self) -> LinuxVmReport {
        LinuxVmReport {
            cmdline: self.cmdline.clone(),
            console_lines: self.console.lines.load(Ordering::Relaxed),
            console_bytes: self.console.bytes.load(Ordering::Relaxed),
            resets: self.i8042.resets(),
        }
    }

    /// Bytes the kernel needs from its load address, and the initrd's size (for checks).
    pub fn sizes(&self) -> (u64, u64) {
        (self.kernel_span, self.initrd_len)
    }
}

// The CPUID page leaf carries the page's size in 32 bits; the layout caps the page below that.
const _: () = assert!(crate::arch::x86_64::layout::PPA_PAGE_MAX <= u32::MAX as u64);

/// The VMM's own CPUID leaves (`ppa_guest_abi::cpuid`, beside KVM's range): the signature and
/// where the PPA page is, its size and layout version, so a guest's agent finds the page
/// without the command line. None without a page.
fn ppa_cpuid(page: Option<Region>) -> Vec<CpuidEntry> {
    let Some(p) = page else {
        return Vec::new();
    };
    // Cannot fail: `layout::ppa_page_region` keeps the page within PPA_PAGE_MAX (above).
    let Ok(size) = u32::try_from(p.size) else {
        return Vec::new();
    };
    ppa_guest_abi::cpuid::encode(p.gpa, size, ppa_guest_abi::ppa_page::VERSION)
        .iter()
        .map(|l| CpuidEntry {
            function: l.function,
            index: 0,
            flags: 0,
            eax: l.eax,
            ebx: l.ebx,
            ecx: l.ecx,
            edx: l.edx,
        })
        .collect()
}
