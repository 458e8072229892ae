//! The tiny payload: a `#![no_std]` ELF (embedded, or from `--tiny-image`) that starts every
//! vCPU at CPL 3 in long mode, runs one workload per vCPU and reports its own rdtsc
//! measurements through doorbells (spec section 3).
//!
//! Data flow: [`TinyBoot::prepare`] reads and checks the image against the tiny layout
//! ([`layout`], [`elf`]) and the VM's RAM, and resolves the workloads ([`workload`]), touching
//! neither the hypervisor nor guest memory; [`TinyBoot::load`] writes the page tables, GDT, TSS,
//! warm-up stub, image segments and one boot-info record per vCPU into guest RAM, sets each
//! vCPU's registers, and puts the tiny devices (`devices::tiny`, sharing one board) on the
//! buses. After the run, [`TinyBoot::vcpu_report`] reads what the devices kept (doorbell counts,
//! the guest's reported measurements: the ground truth the VMM's figures are checked against)
//! and [`report`] prints it.

use std::borrow::Cow;
use std::path::PathBuf;
use std::sync::Arc;

use ppa_guest_abi::{BootInfo, DOORBELL_GPA};

use super::{write, Load, PayloadError, VirtioSlot};
use crate::arch::x86_64::cpl3::{entry_regs, tss};
use crate::arch::x86_64::layout::{Region, MMIO_GAP_END};
use crate::arch::x86_64::regs::Fpu;
use crate::devices::tiny::TinyBoard;
use crate::devices::Buses;
use crate::hypervisor::{self as hv, Vcpu as _, WarmUpStub};

pub mod elf;
pub mod layout;
pub mod report;
pub mod workload;

use workload::{resolve, Assignment, VcpuWorkload, Workload};

/// The tiny guest embedded in the binary (built from images/tiny by build.rs).
pub static TINY_GUEST: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/tiny.elf"));

/// The warm-up stub: `mov [rax], ecx` then `jmp` back to it.
const STUB: [u8; 4] = [0x89, 0x08, 0xeb, 0xfc];
/// The unclaimed doorbell register the warm-up stub writes.
const STUB_TARGET: u64 = DOORBELL_GPA + 0x800;

/// Where the tiny guest's image comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TinyImage {
    /// The tiny guest embedded in the binary.
    Embedded,
    /// An ELF file that follows the tiny-guest protocol.
    File(PathBuf),
}

/// A tiny guest ready to load: its checked image, its workloads and its place in RAM.
#[derive(Debug)]
pub struct TinyBoot {
    label: String,
    bytes: Cow<'static, [u8]>,
    image: elf::Image,
    workloads: Vec<VcpuWorkload>,
    gap_threshold_ns: u64,
    low_end: u64,
    map_gib: u64,
    touch: Option<Region>,
    /// The first network device's window and the RAM its driver uses, when a vCPU runs a
    /// network workload.
    net: Option<(Region, Region)>,
    /// The first disk's window and the RAM its driver uses, when a vCPU runs a disk workload.
    blk: Option<(Region, Region)>,
    board: Arc<TinyBoard>,
}

/// Bytes of RAM a device workload's driver gets (the network driver's rings and 512 buffers
/// of 2 KiB; the disk driver's ring and 64 slots of 4 KiB).
const DRIVER_RAM: u64 = 2 << 20;

/// The kind of device a workload drives, for its place and its errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DriverKind {
    /// virtio-net: net-tx, net-rx, net-echo.
    Net,
    /// virtio-blk: blk-write, blk-verify.
    Blk,
}

impl DriverKind {
    /// The workloads, in words.
    pub fn workloads(self) -> &'static str {
        match self {
            DriverKind::Net => "the network workloads (net-tx, net-rx, net-echo)",
            DriverKind::Blk => "the disk workloads (blk-write, blk-verify)",
        }
    }

    /// The option that adds the device.
    pub fn option(self) -> &'static str {
        match self {
            DriverKind::Net => "--net tap=NAME",
            DriverKind::Blk => "--disk path=FILE",
        }
    }

    fn device(self) -> ppa_vmm_api::DeviceKind {
        match self {
            DriverKind::Net => ppa_vmm_api::DeviceKind::Net,
            DriverKind::Blk => ppa_vmm_api::DeviceKind::Blk,
        }
    }

    fn uses(self, w: &Workload) -> bool {
        match self {
            DriverKind::Net => w.uses_net(),
            DriverKind::Blk => w.uses_blk(),
        }
    }
}

/// A device workload's place: the first device of `kind`'s window and, for its driver, a
/// 2 MiB-aligned window of low RAM from `free_from` (above the image and any memtouch window),
/// below the stacks.
fn driver_window(
    kind: DriverKind,
    workloads: &[VcpuWorkload],
    virtio: &[VirtioSlot],
    free_from: u64,
    stacks: u64,
    ram: &[Region],
) -> Result<Option<(Region, Region)>, PayloadError> {
    let users: Vec<usize> = workloads
        .iter()
        .enumerate()
        .filter(|(_, w)| kind.uses(&w.workload))
        .map(|(i, _)| i)
        .collect();
    if users.is_empty() {
        return Ok(None);
    }
    if users.len() > 1 {
        return Err(PayloadError::DriverVcpus(kind, users));
    }
    let dev = virtio
        .iter()
        .find(|s| s.kind == kind.device())
        .ok_or(PayloadError::NoDevice(kind))?;
    let start = free_from.next_multiple_of(2 << 20);
    if start + DRIVER_RAM > stacks {
        return Err(PayloadError::DriverNoRoom {
            kind,
            memory_mib: ram.iter().map(|r| r.size).sum::<u64>() >> 20,
        });
    }
    Ok(Some((
        dev.window,
        Region {
            gpa: start,
            size: DRIVER_RAM,
        },
    )))
}

/// The RAM range `memtouch` writes: from 4 GiB when the VM has RAM there, else the free low
/// RAM between the image and the stacks (2 MiB aligned).
fn touch_window(
    ram: &[Region],
    image_end: u64,
    stacks: u64,
    bytes: u64,
) -> Result<Region, PayloadError> {
    let (gpa, room) = match ram.iter().find(|r| r.gpa >= MMIO_GAP_END) {
        Some(high) => (high.gpa, high.size),
        None => {
            let start = image_end.next_multiple_of(2 << 20);
            (start, stacks.saturating_sub(start))
        }
    };
    if bytes > room {
        return Err(PayloadError::TouchTooLarge {
            mib: bytes >> 20,
            room_mib: room >> 20,
            at: gpa,
        });
    }
    Ok(Region { gpa, size: bytes })
}

impl TinyBoot {
    /// Reads and checks `image` for a VM of `vcpus` vCPUs with RAM `ram` and the virtio
    /// devices `virtio`, and resolves the workloads.
    pub fn prepare(
        image: &TinyImage,
        workloads: &[Assignment],
        gap_threshold_ns: u64,
        vcpus: usize,
        ram: &[Region],
        virtio: &[VirtioSlot],
    ) -> Result<TinyBoot, PayloadError> {
        let workloads = resolve(workloads, vcpus)?;
        let (bytes, label): (Cow<'static, [u8]>, String) = match image {
            TinyImage::Embedded => (TINY_GUEST.into(), "tiny".to_string()),
            TinyImage::File(path) => (
                std::fs::read(path)
                    .map_err(|source| PayloadError::ReadImage {
                        path: path.clone(),
                        source,
                    })?
                    .into(),
                path.display().to_string(),
            ),
        };
        let low_end = ram.first().map_or(0, |r| r.end());
        let stacks = layout::stacks_bottom(vcpus, low_end);
        if vcpus > layout::MAX_VCPUS || stacks <= layout::IMAGE_MIN_GPA {
            return Err(PayloadError::MemoryTooSmall {
                memory_mib: ram.iter().map(|r| r.size).sum::<u64>() >> 20,
                vcpus,
            });
        }
        let map_gib = layout::map_gib(ram);
        if map_gib > layout::MAX_MAP_GIB {
            return Err(PayloadError::TooMuchRam {
                gib: map_gib,
                max_gib: layout::MAX_MAP_GIB,
            });
        }
        let image = elf::parse_elf(&bytes, layout::IMAGE_MIN_GPA..stacks)?;
        let image_end = image
            .segments
            .iter()
            .map(|s| s.gpa + s.mem_size)
            .max()
            .unwrap_or(layout::IMAGE_MIN_GPA);
        let touch = workloads
            .iter()
            .filter_map(|w| match w.workload {
                Workload::Memtouch { mib } => Some(mib << 20),
                _ => None,
            })
            .max()
            .map(|bytes| touch_window(ram, image_end, stacks, bytes))
            .transpose()?;
        let free_from = match touch {
            Some(t) if t.gpa < MMIO_GAP_END => t.end(),
            _ => image_end,
        };
        let net = driver_window(DriverKind::Net, &workloads, virtio, free_from, stacks, ram)?;
        let blk_from = net.map_or(free_from, |(_, r)| r.end());
        let blk = driver_window(DriverKind::Blk, &workloads, virtio, blk_from, stacks, ram)?;
        Ok(TinyBoot {
            label,
            bytes,
            image,
            workloads,
            gap_threshold_ns,
            low_end,
            map_gib,
            touch,
            net,
            blk,
            board: TinyBoard::new(vcpus),
        })
    }

    /// `tiny` or the image's path.
    pub fn label(&self) -> &str {
        &self.label
    }

    /// Each vCPU's workload.
    pub fn workloads(&self) -> &[VcpuWorkload] {
        &self.workloads
    }

    /// The warm-up stub [`TinyBoot::load`] writes.
    pub fn warm_up(&self) -> WarmUpStub {
        WarmUpStub {
            rip: layout::WARM_UP_STUB_GPA,
            target: STUB_TARGET,
        }
    }

    /// Writes the boot state into guest memory, sets every vCPU's registers and puts the
    /// tiny devices on the buses.
    pub fn load<V: hv::Vm>(&self, ctx: &mut Load<'_, V>) -> Result<(), PayloadError> {
        let mem = ctx.memory;
        let vcpus = ctx.vcpus;
        let tables = &layout::TABLES;
        for (gpa, table) in tables.page_tables(self.map_gib) {
            let bytes: Vec<u8> = table.iter().flat_map(|e| e.to_le_bytes()).collect();
            write(mem, gpa, &bytes)?;
        }
        write(mem, tables.gdt, &tables.gdt())?;
        write(mem, tables.tss, &tss())?;
        write(mem, layout::WARM_UP_STUB_GPA, &STUB)?;
        for seg in &self.image.segments {
            write(mem, seg.gpa, &self.bytes[seg.file.clone()])?;
        }
        for (index, (w, vcpu)) in self.workloads.iter().zip(vcpus).enumerate() {
            let mut info = BootInfo::new();
            info.vcpu_index = index as u32;
            info.vcpu_count = vcpus.len() as u32;
            info.tsc_khz = ctx.tsc_khz;
            info.gap_threshold_ns = self.gap_threshold_ns;
            info.workload = w.to_desc();
            if let (Workload::Memtouch { mib }, Some(t)) = (w.workload, self.touch) {
                info.workload.params = [mib << 20, t.gpa, 0, 0];
            }
            if let Some(p) = ctx.ppa_page {
                info.ppa_page_gpa = p.gpa;
                info.ppa_page_size = p.size;
            }
            if let (true, Some((window, ram))) = (w.workload.uses_net(), self.net) {
                info.net_mmio_gpa = window.gpa;
                info.net_ram_gpa = ram.gpa;
                info.net_ram_size = ram.size;
            }
            if let (true, Some((window, ram))) = (w.workload.uses_blk(), self.blk) {
                info.blk_mmio_gpa = window.gpa;
                info.blk_ram_gpa = ram.gpa;
                info.blk_ram_size = ram.size;
            }
            write(mem, layout::boot_info_gpa(index), &info.to_bytes())?;
            vcpu.set_sregs(&tables.special_regs())?;
            vcpu.set_regs(&entry_regs(
                self.image.entry,
                layout::stack_pointer(index, self.low_end),
                layout::boot_info_gpa(index),
            ))?;
            vcpu.set_fpu(&Fpu::default())?;
        }
        crate::devices::tiny::install(&self.board, ctx.buses)?;
        Ok(())
    }

    /// What the tiny devices kept about vCPU `index`, for the report.
    pub fn vcpu_report(&self, index: usize, buses: &Buses) -> report::TinyVcpuReport {
        report::TinyVcpuReport::new(
            &self.workloads[index],
            self.board.vcpu(index),
            buses.unclaimed(index),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch::x86_64::layout::ram_regions;

    #[test]
    fn memtouch_goes_above_4gib_when_there_is_ram_there() {
        let ram = ram_regions(5 << 30);
        let w = touch_window(&ram, 0x20_0000, 3 << 30, 1 << 30).unwrap();
        assert_eq!(
            w,
            Region {
                gpa: 4 << 30,
                size: 1 << 30
            }
        );
        assert!(matches!(
            touch_window(&ram, 0x20_0000, 3 << 30, 3 << 30),
            Err(PayloadError::TouchTooLarge { room_mib: 2048, .. })
        ));
        let small = ram_regions(64 << 20);
        let w = touch_window(&small, 0x12_3456, 60 << 20, 8 << 20).unwrap();
        assert_eq!(w.gpa, 2 << 20, "above the image, 2 MiB aligned");
    }

    #[test]
    fn a_device_workload_needs_a_device_one_vcpu_and_room() {
        let slot = VirtioSlot {
            window: Region {
                gpa: 0xC000_0000,
                size: 0x1000,
            },
            gsi: 5,
            kind: ppa_vmm_api::DeviceKind::Net,
        };
        let prep = |mib: u64, vcpus: usize, w: &[&str], virtio: &[VirtioSlot]| {
            let a: Vec<Assignment> = w.iter().map(|s| Assignment::parse(s).unwrap()).collect();
            TinyBoot::prepare(
                &TinyImage::Embedded,
                &a,
                2000,
                vcpus,
                &ram_regions(mib << 20),
                virtio,
            )
        };
        let t = prep(32, 2, &["busy:ms=1", "1=net-tx"], &[slot]).unwrap();
        let (window, ram) = t.net.unwrap();
        assert_eq!(window.gpa, 0xC000_0000);
        assert_eq!((ram.gpa % (2 << 20), ram.size), (0, DRIVER_RAM));
        assert!(ram.end() <= layout::stacks_bottom(2, 32 << 20));
        assert!(matches!(
            prep(32, 1, &["net-rx"], &[]),
            Err(PayloadError::NoDevice(DriverKind::Net))
        ));
        assert!(matches!(
            prep(32, 2, &["net-echo"], &[slot]),
            Err(PayloadError::DriverVcpus(DriverKind::Net, v)) if v == vec![0, 1]
        ));
        assert!(matches!(
            prep(3, 1, &["net-tx"], &[slot]),
            Err(PayloadError::DriverNoRoom { .. })
        ));
        assert!(prep(32, 1, &["busy"], &[]).unwrap().net.is_none());
        // A disk workload beside a network one: each driver its own area, the disk's window.
        let disk = VirtioSlot {
            window: Region {
                gpa: 0xC000_1000,
                size: 0x1000,
            },
            gsi: 6,
            kind: ppa_vmm_api::DeviceKind::Blk,
        };
        let t = prep(32, 2, &["net-tx", "1=blk-write"], &[slot, disk]).unwrap();
        let ((_, net_ram), (blk_window, blk_ram)) = (t.net.unwrap(), t.blk.unwrap());
        assert_eq!(blk_window.gpa, 0xC000_1000);
        assert!(blk_ram.gpa >= net_ram.end(), "apart");
        assert!(matches!(
            prep(32, 1, &["blk-verify"], &[slot]),
            Err(PayloadError::NoDevice(DriverKind::Blk))
        ));
    }

    #[test]
    fn prepare_checks_memory_and_workloads() {
        let prep = |ram_mib: u64, vcpus: usize, w: &[&str]| {
            let a: Vec<Assignment> = w.iter().map(|s| Assignment::parse(s).unwrap()).collect();
            TinyBoot::prepare(
                &TinyImage::Embedded,
                &a,
                2000,
                vcpus,
                &ram_regions(ram_mib << 20),
                &[],
            )
        };
        let t = prep(5 << 10, 2, &["memtouch:mib=1024"]).unwrap();
        assert_eq!(t.map_gib, 6);
        assert_eq!(
            t.touch,
            Some(Region {
                gpa: 4 << 30,
                size: 1 << 30
            })
        );
        assert_eq!(t.label(), "tiny");
        assert!(matches!(
            prep(2, 40, &[]),
            Err(PayloadError::MemoryTooSmall { vcpus: 40, .. })
        ));
        assert!(matches!(
            prep(300 << 10, 1, &[]),
            Err(PayloadError::TooMuchRam { .. })
        ));
        assert!(matches!(
            prep(32, 1, &["3=busy"]),
            Err(PayloadError::Workload(_))
        ));
        let missing = TinyBoot::prepare(
            &TinyImage::File("/nonexistent/tiny.elf".into()),
            &[],
            2000,
            1,
            &ram_regions(32 << 20),
            &[],
        );
        assert!(matches!(missing, Err(PayloadError::ReadImage { .. })));
    }
}
