//! The tiny-guest devices: the doorbell page (MMIO) and the workload port (PIO).
//!
//! Both are stateless decoders from an access to a [`DeviceAction`]; what the action does to the
//! vCPU (print, park, stop, record) is the vCPU loop's business. Their addresses and register
//! offsets come from `ppa_guest_abi`, the contract with the guest.

use ppa_guest_abi::doorbell;

use crate::bus::{BusDevice, DeviceAction};

/// Little-endian value of a guest write of 1 to 8 bytes.
fn le_value(data: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    let n = data.len().min(8);
    b[..n].copy_from_slice(&data[..n]);
    u64::from_le_bytes(b)
}

/// The doorbell page of spec section 3: console, exit, halt, workload and report registers.
pub struct Doorbells;

impl BusDevice for Doorbells {
    fn read(&self, _vcpu: usize, _offset: u64, data: &mut [u8]) -> DeviceAction {
        data.fill(0);
        DeviceAction::Unhandled
    }

    fn write(&self, _vcpu: usize, offset: u64, data: &[u8]) -> DeviceAction {
        let value = le_value(data);
        match offset {
            doorbell::CONSOLE => DeviceAction::Console(value as u8),
            doorbell::EXIT => DeviceAction::Exit(value),
            doorbell::HALT => DeviceAction::Halt(value),
            doorbell::WORKLOAD => DeviceAction::Workload,
            o if (doorbell::REPORT_BASE..doorbell::REPORT_BASE + 8 * doorbell::REPORT_KEYS)
                .contains(&o)
                && o % 8 == 0 =>
            {
                DeviceAction::Report {
                    key: (o - doorbell::REPORT_BASE) / 8,
                    value,
                }
            }
            _ => DeviceAction::Unhandled,
        }
    }
}

/// The port the `exits:kind=pio` workload writes to; reads return zeros.
pub struct WorkloadPort;

impl BusDevice for WorkloadPort {
    fn read(&self, _vcpu: usize, _offset: u64, data: &mut [u8]) -> DeviceAction {
        data.fill(0);
        DeviceAction::Workload
    }

    fn write(&self, _vcpu: usize, _offset: u64, _data: &[u8]) -> DeviceAction {
        DeviceAction::Workload
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doorbell_registers_decode() {
        let d = Doorbells;
        assert_eq!(
            d.write(0, doorbell::CONSOLE, b"A"),
            DeviceAction::Console(b'A')
        );
        assert_eq!(
            d.write(0, doorbell::EXIT, &7u64.to_le_bytes()),
            DeviceAction::Exit(7)
        );
        assert_eq!(
            d.write(0, doorbell::HALT, &1_000_000u32.to_le_bytes()),
            DeviceAction::Halt(1_000_000)
        );
        assert_eq!(d.write(0, doorbell::WORKLOAD, &[0]), DeviceAction::Workload);
        assert_eq!(
            d.write(0, doorbell::REPORT_BASE + 8 * 3, &42u64.to_le_bytes()),
            DeviceAction::Report { key: 3, value: 42 }
        );
        assert_eq!(
            d.write(0, doorbell::REPORT_BASE + 4, &[1]),
            DeviceAction::Unhandled,
            "unaligned report register"
        );
        assert_eq!(
            d.write(0, doorbell::REPORT_BASE + 8 * doorbell::REPORT_KEYS, &[1]),
            DeviceAction::Unhandled
        );
        let mut b = [9u8; 4];
        assert_eq!(d.read(0, 0, &mut b), DeviceAction::Unhandled);
        assert_eq!(b, [0; 4]);
    }
}
