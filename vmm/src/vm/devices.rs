//! The VM's virtio devices: where each goes (before the payload is prepared, which tells its
//! guest), building them on the MMIO bus once RAM and the vCPUs exist, and the exit-free
//! notifications every device on a bus asked for.
//!
//! Data flow: [`virtio_slots`] gives each configured device its window and GSI
//! (`arch::x86_64::layout::virtio_slot`) for `Boot::prepare`; [`build`] opens each device
//! (its tap), gives it an interrupt line when the guest has an interrupt controller, puts an
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
use crate::devices::net::{NetDevice, NetParams};
use crate::devices::virtio::mmio::MmioTransport;
use crate::devices::{Buses, Device};
use crate::hypervisor::{self as hv, IoAddr};
use crate::payload::VirtioSlot;

/// The windows and interrupts of the configured devices, in order (`net0`, `net1`, …).
pub fn virtio_slots(config: &VmConfig) -> Result<Vec<VirtioSlot>, VmError> {
    if config.net.len() > MAX_VIRTIO_DEVICES {
        return Err(ConfigError::TooManyDevices(config.net.len()).into());
    }
    Ok((0..config.net.len())
        .filter_map(virtio_slot)
        .map(|(window, gsi)| VirtioSlot {
            window,
            gsi,
            kind: DeviceKind::Net,
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
    for (i, (spec, slot)) in b.config.net.iter().zip(b.slots).enumerate() {
        let irq = if b.interrupts {
            Some(b.vm.irq_line(slot.gsi)?)
        } else {
            None
        };
        let (dev, shared) = NetDevice::new(NetParams {
            spec,
            id: spec.id.clone().unwrap_or_else(|| format!("net{i}")),
            index: i,
            vcpus: b.config.vcpus,
            irq,
            memory: Arc::clone(b.memory),
            mmio_base: slot.window.gpa,
        })?;
        let transport = MmioTransport::new(
            slot.window.gpa,
            Arc::clone(&dev) as Arc<dyn crate::devices::virtio::VirtioDevice>,
            shared,
            Arc::clone(b.memory),
        );
        buses
            .mmio
            .insert(slot.window.gpa, slot.window.size, Arc::new(transport))
            .map_err(crate::payload::PayloadError::from)?;
        out.push(dev);
    }
    Ok(out)
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
