//! Payloads: what boots in a VM. Each payload owns its boot layout (where its tables, records
//! and image go inside RAM), its vCPUs' boot state, its devices, and its part of the report.
//!
//! Data flow: the config names a [`Payload`]; the VM builder calls [`Boot::prepare`] with the
//! VM's RAM regions (the image is read and checked, workloads resolved; nothing touches the
//! hypervisor or memory yet), then, once RAM is mapped and the vCPUs exist, [`Boot::load`]
//! writes the payload into guest memory, sets every vCPU's registers and puts the payload's
//! devices on the buses. After the run, [`Boot::vcpu_report`] gives the payload's fields of each
//! vCPU's report and [`Boot::text`] its table. The VM knows nothing of any payload's protocol.
//!
//! Payloads: [`tiny`] (the tiny test guest) and [`linux`] (a Linux kernel, initrd and command
//! line on a PC platform).

use std::path::PathBuf;

use serde::Serialize;
use thiserror::Error;
use vm_memory::GuestMemoryMmap;

use crate::arch::x86_64::layout::Region;
use crate::arch::x86_64::regs::CpuidEntry;
use crate::devices::{BusError, Buses};
use crate::hypervisor::{self as hv, HvError, WarmUpStub};

pub mod linux;
pub mod tiny;

use linux::LinuxBoot;

use tiny::workload::{Assignment, WorkloadError};
use tiny::{TinyBoot, TinyImage};

/// A virtio device's place: its MMIO window and interrupt (`arch::x86_64::layout::virtio_slot`),
/// what the payload tells its guest (Linux: the DSDT and the command line; the tiny guest: its
/// boot-info record).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VirtioSlot {
    /// The MMIO window.
    pub window: Region,
    /// The interrupt (GSI).
    pub gsi: u32,
    /// What the device is.
    pub kind: ppa_vmm_api::DeviceKind,
}

/// What the VM boots, as configured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Payload {
    /// The tiny test guest.
    Tiny {
        /// Its image.
        image: TinyImage,
        /// Workload assignments, applied in order (later ones win).
        workloads: Vec<Assignment>,
        /// A gap between two rdtsc reads longer than this (ns) counts as lost time.
        gap_threshold_ns: u64,
    },
    /// A Linux kernel.
    Linux {
        /// bzImage or ELF vmlinux.
        kernel: PathBuf,
        /// Initial RAM disk.
        initrd: Option<PathBuf>,
        /// Command line, after the VMM's own part (`linux::BASE_CMDLINE`, `ppa.page=`).
        cmdline: String,
    },
}

impl Payload {
    /// Whether this payload is a guest kernel, which needs a hypervisor that runs privileged
    /// code and the PC platform.
    pub fn is_kernel(&self) -> bool {
        matches!(self, Payload::Linux { .. })
    }
}

impl Default for Payload {
    fn default() -> Self {
        Payload::Tiny {
            image: TinyImage::Embedded,
            workloads: Vec::new(),
            gap_threshold_ns: 2_000,
        }
    }
}

/// Why a payload cannot boot.
#[derive(Debug, Error)]
pub enum PayloadError {
    /// The image file cannot be read.
    #[error("cannot read the guest image {path}")]
    ReadImage {
        /// Path.
        path: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// The image is not loadable.
    #[error("the guest image cannot be loaded")]
    Elf(#[from] tiny::elf::LoaderError),
    /// A workload targets a vCPU that does not exist, or similar.
    #[error("the workloads do not fit this VM")]
    Workload(#[from] WorkloadError),
    /// Memory too small for the vCPU stacks and the image.
    #[error("{memory_mib} MiB of guest memory is too small for {vcpus} vCPU stacks and the image")]
    MemoryTooSmall {
        /// Memory given.
        memory_mib: u64,
        /// vCPUs.
        vcpus: usize,
    },
    /// More RAM than the tiny guest's page tables map.
    #[error("the tiny guest maps at most {max_gib} GiB of guest-physical space; this VM's RAM reaches {gib} GiB")]
    TooMuchRam {
        /// GiB the RAM reaches.
        gib: u64,
        /// Most GiB mapped.
        max_gib: u64,
    },
    /// The memtouch window does not fit the RAM.
    #[error("memtouch wants {mib} MiB but the RAM at {at:#x} has room for {room_mib} MiB: give the VM more memory")]
    TouchTooLarge {
        /// MiB asked for.
        mib: u64,
        /// MiB there.
        room_mib: u64,
        /// Where.
        at: u64,
    },
    /// Guest memory could not be written.
    #[error("cannot write {len} bytes of boot state at {gpa:#x} in guest memory")]
    Write {
        /// Where.
        gpa: u64,
        /// How much.
        len: usize,
        /// Cause.
        #[source]
        source: vm_memory::GuestMemoryError,
    },
    /// A vCPU's registers could not be set.
    #[error(transparent)]
    Hypervisor(#[from] HvError),
    /// A device could not be placed.
    #[error("cannot place a device of the payload")]
    Bus(#[from] BusError),
    /// This host's hypervisor cannot run a guest kernel.
    #[error("{0}")]
    HostCannotBoot(String),
    /// The kernel could not be loaded.
    #[error("the kernel cannot be loaded: {0}")]
    Kernel(String),
    /// The command line is not valid.
    #[error("the kernel command line is not valid: {0}")]
    Cmdline(String),
    /// The command line is longer than the kernel takes.
    #[error("the kernel command line is {len} bytes; the kernel takes at most {max}")]
    CmdlineTooLong {
        /// Bytes.
        len: usize,
        /// Most bytes.
        max: usize,
    },
    /// Too little RAM for the kernel and initrd.
    #[error("{memory_mib} MiB of guest memory is too small for this kernel and initrd: give it at least {needed_mib} MiB")]
    LinuxTooSmall {
        /// RAM given.
        memory_mib: u64,
        /// RAM needed.
        needed_mib: u64,
    },
    /// More vCPUs than the MP table can describe.
    #[error("a Linux guest here can have at most {max} vCPUs")]
    TooManyVcpus {
        /// Most vCPUs.
        max: usize,
    },
    /// The zero page could not be made.
    #[error(transparent)]
    Boot(#[from] crate::arch::x86_64::linux::BootError),
    /// A device workload without its device.
    #[error("{} need a device to drive: add {}", .0.workloads(), .0.option())]
    NoDevice(tiny::DriverKind),
    /// More than one vCPU runs a workload of one device.
    #[error("{what} run on one vCPU of the tiny guest (it drives the first device's first queue); vCPUs {vcpus:?} have one", what = .0.workloads(), vcpus = .1)]
    DriverVcpus(tiny::DriverKind, Vec<usize>),
    /// No room in low RAM for a device workload's rings and buffers.
    #[error("{memory_mib} MiB of guest memory leaves no room for the rings and buffers of {} (2 MiB): give the VM more memory", .kind.workloads())]
    DriverNoRoom {
        /// Whose.
        kind: tiny::DriverKind,
        /// RAM given.
        memory_mib: u64,
    },
}

/// Writes `bytes` at `gpa` in guest memory, or says where it could not.
fn write(mem: &GuestMemoryMmap, gpa: u64, bytes: &[u8]) -> Result<(), PayloadError> {
    use vm_memory::{Bytes, GuestAddress};
    mem.write_slice(bytes, GuestAddress(gpa))
        .map_err(|source| PayloadError::Write {
            gpa,
            len: bytes.len(),
            source,
        })
}

/// What a payload loads itself into, and what it needs to know to do so.
pub struct Load<'a, V: hv::Vm> {
    /// Guest RAM.
    pub memory: &'a GuestMemoryMmap,
    /// The guest's TSC frequency.
    pub tsc_khz: u64,
    /// Where the PPA page is, when the VM has one.
    pub ppa_page: Option<Region>,
    /// The CPUID the hypervisor supports (read only for payloads that set CPUID).
    pub cpuid: Vec<CpuidEntry>,
    /// The hypervisor's VM (for interrupt lines).
    pub vm: &'a V,
    /// Its vCPUs, to set their registers.
    pub vcpus: &'a [V::Vcpu],
    /// Where the payload's devices go.
    pub buses: &'a mut Buses,
}

/// A payload's fields in one vCPU's report (flattened into the vCPU's JSON object).
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
#[serde(untagged)]
pub enum PayloadVcpuReport {
    /// The tiny guest's workload, doorbells and own measurements.
    Tiny(tiny::report::TinyVcpuReport),
    /// A Linux guest's vCPU.
    Linux(linux::LinuxVcpuReport),
}

/// A payload's fields in the VM's report (flattened into the `vm` object).
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
#[serde(untagged)]
pub enum PayloadVmReport {
    /// The tiny guest: nothing beyond `image`.
    Tiny {},
    /// A Linux guest: its command line and console.
    Linux(linux::LinuxVmReport),
}

/// A payload, prepared for a VM.
#[derive(Debug)]
pub enum Boot {
    /// The tiny guest.
    Tiny(TinyBoot),
    /// A Linux guest.
    Linux(LinuxBoot),
}

impl Boot {
    /// Reads and checks `payload` for a VM of `vcpus` vCPUs with RAM `ram`, when it has
    /// one a PPA page at `ppa_page`, and the virtio devices at `virtio`.
    pub fn prepare(
        payload: &Payload,
        vcpus: usize,
        ram: &[Region],
        ppa_page: Option<Region>,
        virtio: &[VirtioSlot],
    ) -> Result<Boot, PayloadError> {
        match payload {
            Payload::Linux {
                kernel,
                initrd,
                cmdline,
            } => Ok(Boot::Linux(LinuxBoot::prepare(
                kernel,
                initrd.as_deref(),
                cmdline,
                vcpus,
                ram,
                ppa_page,
                virtio,
            )?)),
            Payload::Tiny {
                image,
                workloads,
                gap_threshold_ns,
            } => Ok(Boot::Tiny(TinyBoot::prepare(
                image,
                workloads,
                *gap_threshold_ns,
                vcpus,
                ram,
                virtio,
            )?)),
        }
    }

    /// What the report calls the image: `tiny` or the image's path.
    pub fn label(&self) -> String {
        match self {
            Boot::Tiny(t) => t.label().to_string(),
            Boot::Linux(l) => l.label(),
        }
    }

    /// Whether the payload runs a guest kernel (privileged code), which needs the PC platform
    /// in the hypervisor (`Vm::create_platform`) and a hypervisor that can run it.
    pub fn needs_platform(&self) -> bool {
        matches!(self, Boot::Linux(_))
    }

    /// Writes the payload into guest memory, sets the vCPUs' registers, adds its devices.
    pub fn load<V: hv::Vm>(&self, to: &mut Load<'_, V>) -> Result<(), PayloadError> {
        match self {
            Boot::Tiny(t) => t.load(to),
            Boot::Linux(l) => l.load(to),
        }
    }

    /// The stub each vCPU thread runs once before its clocks start, if the payload has one.
    pub fn warm_up(&self) -> Option<WarmUpStub> {
        match self {
            Boot::Tiny(t) => Some(t.warm_up()),
            Boot::Linux(_) => None,
        }
    }

    /// The payload's fields of vCPU `index`'s report.
    pub fn vcpu_report(&self, index: usize, buses: &Buses) -> PayloadVcpuReport {
        match self {
            Boot::Tiny(t) => PayloadVcpuReport::Tiny(t.vcpu_report(index, buses)),
            Boot::Linux(_) => PayloadVcpuReport::Linux(linux::LinuxVcpuReport {}),
        }
    }

    /// The payload's fields of the VM's report.
    pub fn vm_report(&self) -> PayloadVmReport {
        match self {
            Boot::Tiny(_) => PayloadVmReport::Tiny {},
            Boot::Linux(l) => PayloadVmReport::Linux(l.vm_report()),
        }
    }
}

/// The payload's part of the text report, from the VM's payload fields and each vCPU's id,
/// payload fields and exit-handling p99.
pub fn text(vm: &PayloadVmReport, rows: &[(usize, &PayloadVcpuReport, Option<u64>)]) -> String {
    if let PayloadVmReport::Linux(l) = vm {
        return l.text();
    }
    let tiny: Vec<tiny::report::Row<'_>> = rows
        .iter()
        .filter_map(|(id, p, p99)| match p {
            PayloadVcpuReport::Tiny(t) => Some(tiny::report::Row {
                id: *id,
                tiny: t,
                exit_p99_ns: *p99,
            }),
            PayloadVcpuReport::Linux(_) => None,
        })
        .collect();
    if tiny.is_empty() {
        String::new()
    } else {
        tiny::report::text(&tiny)
    }
}
