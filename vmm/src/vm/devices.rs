//! The VM's virtio devices: where each goes (before the payload is prepared, which tells its
//! guest), building them on the MMIO bus once RAM and the vCPUs exist, and the exit-free
//! notifications every device on a bus asked for.
//!
//! Data flow: [`virtio_slots`] gives each configured device its window and GSI
//! (`arch::x86_64::layout::virtio_slot`) for `Boot::prepare`; [`build`] opens each device
//! (its tap, its disk file), gives it an interrupt line when the guest has an interrupt controller, puts an
//! MMIO transport over it on the bus, and returns the devices for `Vm::run` to start and
//! readers to look at; [`register_ioevents`] then registers every bus device's ioevents with
//! the hypervisor, and says (once, in the log) when this host does not take MMIO ones, in
//! which case the transport's QueueNotify handler signals the same eventfd on the exit.

use std::sync::Arc;

use ppa_vmm_api::DeviceKind;
use vm_memory::GuestMemoryMmap;

use super::VmError;
use crate::arch::x86_64::layout::{virtio_slot, MAX_VIRTIO_DEVICES};
use crate::config::{ConfigError, VmConfig};
use crate::devices::blk::{BlkDevice, BlkParams};
use crate::devices::net::{NetDevice, NetParams};
use crate::devices::virtio::mmio::MmioTransport;
use crate::devices::virtio::{VirtioDevice, VirtioShared};
use crate::devices::{Buses, Device};
use crate::hypervisor::{self as hv, IoAddr, IrqLine};
use crate::payload::VirtioSlot;

/// The windows and interrupts of the configured devices, in order: the network devices
/// (`net0`, `net1`, …), then the disks (`blk0`, …).
pub fn virtio_slots(config: &VmConfig) -> Result<Vec<VirtioSlot>, VmError> {
    let count = config.net.len() + config.disks.len();
    if count > MAX_VIRTIO_DEVICES {
        return Err(ConfigError::TooManyDevices(count).into());
    }
    let kinds = std::iter::repeat_n(DeviceKind::Net, config.net.len())
        .chain(std::iter::repeat_n(DeviceKind::Blk, config.disks.len()));
    Ok(kinds
        .enumerate()
        .filter_map(|(i, kind)| {
            virtio_slot(i).map(|(window, gsi)| VirtioSlot { window, gsi, kind })
        })
        .collect())
}

/// What [`build`] works with.
pub struct Build<'a, V: hv::Vm> {
    /// The configuration.
    pub config: &'a VmConfig,
    /// The hypervisor's VM (interrupt lines).
    pub vm: &'a V,
    /// Guest RAM.
    pub memory: &'a Arc<GuestMemoryMmap>,
    /// The devices' places.
    pub slots: &'a [VirtioSlot],
    /// Whether the guest has an interrupt controller (a Linux guest): without one, devices
    /// get no interrupt line and the guest polls.
    pub interrupts: bool,
}

/// Builds every configured device and puts its transport on the MMIO bus.
pub fn build<V: hv::Vm>(
    b: Build<'_, V>,
    buses: &mut Buses,
) -> Result<Vec<Arc<dyn Device>>, VmError> {
    let mut out: Vec<Arc<dyn Device>> = Vec::new();
    let (net_ids, disk_ids) = crate::config::devices::ids(&b.config.net, &b.config.disks);
    let mut slots = b.slots.iter();
    for (i, (spec, id)) in b.config.net.iter().zip(net_ids).enumerate() {
        let Some(slot) = slots.next() else { break };
        let (dev, shared) = NetDevice::new(NetParams {
            spec,
            id,
            index: i,
            vcpus: b.config.vcpus,
            irq: irq_line(&b, slot)?,
            memory: Arc::clone(b.memory),
            mmio_base: slot.window.gpa,
        })?;
        attach(&b, buses, slot, Arc::clone(&dev) as _, shared)?;
        out.push(dev);
    }
    for (spec, id) in b.config.disks.iter().zip(disk_ids) {
        let Some(slot) = slots.next() else { break };
        let (dev, shared) = BlkDevice::new(BlkParams {
            spec,
            id,
            vcpus: b.config.vcpus,
            irq: irq_line(&b, slot)?,
            memory: Arc::clone(b.memory),
            mmio_base: slot.window.gpa,
        })?;
        attach(&b, buses, slot, Arc::clone(&dev) as _, shared)?;
        out.push(dev);
    }
    Ok(out)
}

/// The device's interrupt line, when the guest has an interrupt controller.
fn irq_line<V: hv::Vm>(
    b: &Build<'_, V>,
    slot: &VirtioSlot,
) -> Result<Option<Arc<IrqLine>>, VmError> {
    Ok(if b.interrupts {
        Some(b.vm.irq_line(slot.gsi)?)
    } else {
        None
    })
}

/// Puts an MMIO transport over `dev` in its window.
fn attach<V: hv::Vm>(
    b: &Build<'_, V>,
    buses: &mut Buses,
    slot: &VirtioSlot,
    dev: Arc<dyn VirtioDevice>,
    shared: Arc<VirtioShared>,
) -> Result<(), VmError> {
    let transport = MmioTransport::new(slot.window.gpa, dev, shared, Arc::clone(b.memory));
    buses
        .mmio
        .insert(slot.window.gpa, slot.window.size, Arc::new(transport))
        .map_err(crate::payload::PayloadError::from)?;
    Ok(())
}

/// Registers the ioevents of every device on the buses. Returns how many the hypervisor
/// refused (those notifications then reach the VMM as exits, which the device handles the
/// same way).
pub fn register_ioevents<V: hv::Vm>(vm: &V, buses: &Buses) -> usize {
    let mut refused = 0;
    for dev in buses.mmio.devices().into_iter().chain(buses.pio.devices()) {
        for ev in dev.ioevents() {
            if let Err(e) = vm.register_ioevent(ev.fd, ev.addr, ev.datamatch) {
                if refused == 0 {
                    let at = match ev.addr {
                        IoAddr::Mmio(a) => format!("MMIO {a:#x}"),
                        IoAddr::Pio(p) => format!("port {p:#x}"),
                    };
                    log::warn!(
                        "the hypervisor refused an ioeventfd at {at} ({e}): queue kicks reach the VMM as exits instead"
                    );
                }
                refused += 1;
            }
        }
    }
    refused
}
