//! The virtio-mmio transport (virtio 1.2, 4.2; version 2 of the register layout only): one
//! 4 KiB window per device on the MMIO bus, its registers kept in atomics shared with the
//! device's threads ([`super::VirtioShared`]).
//!
//! Data flow: a vCPU's MMIO exit in the window reaches [`MmioTransport`]'s `read` or `write`
//! (`BusDevice`): identification and feature registers are answered from the device, queue
//! registers go into the shared [`super::QueueRegs`], a status write goes through the pure
//! state machine ([`super::status::on_write`]) and is carried out here (reset, refused
//! features, activation, NEEDS_RESET). `QueueNotify` is normally caught by an ioeventfd and
//! never exits; a write that does reach us signals the same eventfd (the fallback where the
//! hypervisor does not honour MMIO ioeventfds) and is counted. Configuration-space reads at
//! 0x100 go to the device.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use virtio_bindings::bindings::virtio_mmio::*;
use virtio_bindings::bindings::virtio_ring::VIRTIO_RING_F_EVENT_IDX;
use vm_memory::GuestMemoryMmap;

use super::status::{self, on_write, Transition, Violation};
use super::{Half, Ring, VirtioDevice, VirtioShared};
use crate::devices::{le_value, BusAccess, BusDevice, IoEvent, VcpuRequest};
use crate::hypervisor::IoAddr;

/// Size of one device's window.
pub const WINDOW: u64 = 0x1000;
/// "virt", the magic value.
const MAGIC: u32 = u32::from_le_bytes(*b"virt");
/// The register layout's version: 2 (virtio 1.x). Version 1 is the legacy layout.
const VERSION: u32 = 2;
/// Our vendor id: "PPAV".
pub const VENDOR_ID: u32 = u32::from_le_bytes(*b"PPAV");
/// How long a reset waits for the device's threads to let go of their queues before it
/// returns to the guest (the driver may reuse the rings' memory right after its write; the
/// status reads 0 and the re-probe's writes are taken whether they have or not).
const RESET_WAIT_NS: u64 = 20_000_000;

/// A virtio device's MMIO window.
pub struct MmioTransport {
    base: u64,
    device: Arc<dyn VirtioDevice>,
    shared: Arc<VirtioShared>,
    memory: Arc<GuestMemoryMmap>,
    device_features_sel: AtomicU32,
    driver_features_sel: AtomicU32,
    queue_sel: AtomicU32,
    reset_wait_ns: u64,
}

impl MmioTransport {
    /// The window at `base` for `device`, sharing `shared` with it; queue rings are checked
    /// against `memory` at activation.
    pub fn new(
        base: u64,
        device: Arc<dyn VirtioDevice>,
        shared: Arc<VirtioShared>,
        memory: Arc<GuestMemoryMmap>,
    ) -> Self {
        MmioTransport {
            base,
            device,
            shared,
            memory,
            device_features_sel: AtomicU32::new(0),
            driver_features_sel: AtomicU32::new(0),
            queue_sel: AtomicU32::new(0),
            reset_wait_ns: RESET_WAIT_NS,
        }
    }

    /// The same transport with a reset that waits `ns` at most for the device's threads (the
    /// fuzzer's model plays the threads itself and cannot run while a write waits).
    pub fn with_reset_wait(mut self, ns: u64) -> Self {
        self.reset_wait_ns = ns;
        self
    }

    /// The window's guest-physical base.
    pub fn base(&self) -> u64 {
        self.base
    }

    fn selected_queue(&self) -> Option<&super::QueueRegs> {
        self.shared
            .queue(self.queue_sel.load(Ordering::Relaxed) as usize)
    }

    /// Completes an activation that waited for the device's threads, if they have caught up
    /// (every register access looks; the last thread to let go does too).
    fn settle(&self) {
        if self.shared.word().pending() {
            self.shared.complete_activation();
        }
    }

    /// A driver's reset: the status reads 0 from now on and a new inactive epoch begins, so
    /// the re-probe's register writes are taken at once; the device's threads drop their
    /// queues (a batch in progress ends at its next chain). The write waits a bounded time
    /// for them, since a driver may reuse the rings' memory right after it; a thread slower
    /// than that is counted, and an activation meanwhile waits for it.
    fn reset(&self) {
        let c = &self.shared.counters;
        c.resets.fetch_add(1, Ordering::Relaxed);
        self.device.on_reset();
        let Some((_, new)) = self.shared.update(|w| Some(w.reset())) else {
            return;
        };
        self.shared.reset_registers();
        self.shared.wake_all();
        let epoch = new.epoch();
        let deadline = crate::sync::now_ns() + self.reset_wait_ns;
        while !self.shared.caught_up(epoch) {
            if crate::sync::now_ns() >= deadline {
                c.resets_unsettled.fetch_add(1, Ordering::Relaxed);
                break;
            }
            std::thread::sleep(std::time::Duration::from_micros(20));
        }
    }

    /// Checks every enabled queue's registers against guest memory (sizes, alignment, rings
    /// inside RAM), as DRIVER_OK asks.
    fn check_queues(&self) -> Result<(), Violation> {
        let event_idx = self.shared.has_feature(VIRTIO_RING_F_EVENT_IDX);
        for i in 0..self.shared.queue_count() {
            let (Some(regs), Some(max)) = (self.shared.queue(i), self.shared.max_size(i)) else {
                continue;
            };
            regs.to_queue(max, event_idx, &self.memory)?;
        }
        Ok(())
    }

    /// A status write other than 0, through the pure state machine, applied to the state word
    /// with a compare-and-swap: a NEEDS_RESET a device thread sets meanwhile is never erased
    /// (the write is worked out again from the status that holds it).
    fn write_status(&self, value: u32) {
        if value == 0 {
            return self.reset();
        }
        let (offered, acked) = (self.device.features(), self.shared.driver_features());
        let mut checked: Option<Result<(), Violation>> = None;
        let mut applied = None;
        let done = self.shared.update(|w| {
            let t = on_write(w.status(), value, offered, acked);
            applied = Some(t);
            match t {
                Transition::Set(v) => Some(w.with_status(v)),
                // A write of 0 was handled above.
                Transition::Reset => None,
                Transition::RefuseFeatures(_) => Some(w.with_status(value & !status::FEATURES_OK)),
                Transition::Activate(v) => {
                    match *checked.get_or_insert_with(|| self.check_queues()) {
                        Ok(()) => Some(w.activate(v, self.shared.caught_up(w.epoch()))),
                        Err(_) => Some(w.with_status(v & !status::DRIVER_OK)),
                    }
                }
                Transition::NeedsReset(_) => None,
            }
        });
        match applied {
            Some(Transition::RefuseFeatures(v)) => self.shared.record_violation(v),
            Some(Transition::NeedsReset(v)) => self.shared.needs_reset(v),
            Some(Transition::Activate(_)) => match checked {
                Some(Err(v)) => self.shared.needs_reset(v),
                _ => {
                    if done.is_some_and(|(_, new)| new.active()) {
                        self.shared
                            .counters
                            .activations
                            .fetch_add(1, Ordering::Relaxed);
                        self.shared.wake_all();
                    }
                }
            },
            _ => {}
        }
    }

    fn read_register(&self, offset: u32) -> u32 {
        let s = &self.shared;
        match offset {
            VIRTIO_MMIO_MAGIC_VALUE => MAGIC,
            VIRTIO_MMIO_VERSION => VERSION,
            VIRTIO_MMIO_DEVICE_ID => self.device.device_type(),
            VIRTIO_MMIO_VENDOR_ID => VENDOR_ID,
            VIRTIO_MMIO_DEVICE_FEATURES => match self.device_features_sel.load(Ordering::Relaxed) {
                0 => self.device.features() as u32,
                1 => (self.device.features() >> 32) as u32,
                _ => 0,
            },
            VIRTIO_MMIO_QUEUE_NUM_MAX => s
                .max_size(self.queue_sel.load(Ordering::Relaxed) as usize)
                .map_or(0, u32::from),
            VIRTIO_MMIO_QUEUE_READY => self.selected_queue().map_or(0, |q| u32::from(q.ready())),
            VIRTIO_MMIO_QUEUE_NUM => self.selected_queue().map_or(0, |q| q.size()),
            VIRTIO_MMIO_INTERRUPT_STATUS => s.interrupt_status(),
            VIRTIO_MMIO_STATUS => s.status(),
            VIRTIO_MMIO_CONFIG_GENERATION => 0,
            VIRTIO_MMIO_QUEUE_DESC_LOW..=VIRTIO_MMIO_QUEUE_USED_HIGH => {
                match (ring_of(offset), self.selected_queue()) {
                    (Some((ring, half)), Some(q)) => q.get_addr(ring, half),
                    _ => 0,
                }
            }
            // No shared memory regions: a length of all ones says so.
            VIRTIO_MMIO_SHM_LEN_LOW | VIRTIO_MMIO_SHM_LEN_HIGH => u32::MAX,
            _ => 0,
        }
    }

    fn write_register(&self, offset: u32, value: u32) {
        let s = &self.shared;
        let st = s.status();
        match offset {
            VIRTIO_MMIO_DEVICE_FEATURES_SEL => {
                self.device_features_sel.store(value, Ordering::Relaxed)
            }
            VIRTIO_MMIO_DRIVER_FEATURES_SEL => {
                self.driver_features_sel.store(value, Ordering::Relaxed)
            }
            VIRTIO_MMIO_DRIVER_FEATURES => {
                if st & status::FEATURES_OK != 0 {
                    s.record_violation(Violation::LateWrite);
                    return;
                }
                let f = s.driver_features_atomic();
                let old = f.load(Ordering::Relaxed);
                let new = match self.driver_features_sel.load(Ordering::Relaxed) {
                    0 => (old & !0xffff_ffff) | u64::from(value),
                    1 => (old & 0xffff_ffff) | (u64::from(value) << 32),
                    _ => return,
                };
                f.store(new, Ordering::Release);
            }
            VIRTIO_MMIO_QUEUE_SEL => self.queue_sel.store(value, Ordering::Relaxed),
            VIRTIO_MMIO_QUEUE_NUM
            | VIRTIO_MMIO_QUEUE_READY
            | VIRTIO_MMIO_QUEUE_DESC_LOW..=VIRTIO_MMIO_QUEUE_USED_HIGH => {
                if st & status::DRIVER_OK != 0 {
                    s.record_violation(Violation::LateWrite);
                    return;
                }
                let Some(q) = self.selected_queue() else {
                    return;
                };
                match offset {
                    VIRTIO_MMIO_QUEUE_NUM => q.set_size(value),
                    VIRTIO_MMIO_QUEUE_READY => q.set_ready(value & 1 == 1),
                    _ => {
                        if let Some((ring, half)) = ring_of(offset) {
                            q.set_addr(ring, half, value);
                        }
                    }
                }
            }
            VIRTIO_MMIO_QUEUE_NOTIFY => {
                s.counters.notify_exits.fetch_add(1, Ordering::Relaxed);
                if let Some(fd) = self.device.kick_fd(value as usize) {
                    let _ = fd.write(1);
                }
            }
            VIRTIO_MMIO_INTERRUPT_ACK => s.ack_interrupt(value),
            VIRTIO_MMIO_STATUS => self.write_status(value),
            _ => {}
        }
    }
}

/// The ring and half a queue-address register sets.
fn ring_of(offset: u32) -> Option<(Ring, Half)> {
    Some(match offset {
        VIRTIO_MMIO_QUEUE_DESC_LOW => (Ring::Desc, Half::Low),
        VIRTIO_MMIO_QUEUE_DESC_HIGH => (Ring::Desc, Half::High),
        VIRTIO_MMIO_QUEUE_AVAIL_LOW => (Ring::Avail, Half::Low),
        VIRTIO_MMIO_QUEUE_AVAIL_HIGH => (Ring::Avail, Half::High),
        VIRTIO_MMIO_QUEUE_USED_LOW => (Ring::Used, Half::Low),
        VIRTIO_MMIO_QUEUE_USED_HIGH => (Ring::Used, Half::High),
        _ => return None,
    })
}

impl BusDevice for MmioTransport {
    fn read(&self, access: BusAccess, data: &mut [u8]) -> Option<VcpuRequest> {
        self.settle();
        let off = access.offset;
        if off >= u64::from(VIRTIO_MMIO_CONFIG) {
            self.device
                .read_config(off - u64::from(VIRTIO_MMIO_CONFIG), data);
        } else if data.len() == 4 && off % 4 == 0 {
            data.copy_from_slice(&self.read_register(off as u32).to_le_bytes());
        } else {
            // Registers are 32 bits wide and aligned; anything else reads as zeros.
            data.fill(0);
        }
        None
    }

    fn write(&self, access: BusAccess, data: &[u8]) -> Option<VcpuRequest> {
        self.settle();
        let off = access.offset;
        // The configuration space of our devices is read-only; registers are 32-bit.
        if off < u64::from(VIRTIO_MMIO_CONFIG) && data.len() == 4 && off % 4 == 0 {
            self.write_register(off as u32, le_value(data) as u32);
        }
        None
    }

    fn ioevents(&self) -> Vec<IoEvent<'_>> {
        (0..self.shared.queue_count())
            .filter_map(|i| {
                Some(IoEvent {
                    addr: IoAddr::Mmio(self.base + u64::from(VIRTIO_MMIO_QUEUE_NOTIFY)),
                    datamatch: Some(i as u32),
                    fd: self.device.kick_fd(i)?,
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests;
