//! The i8042 keyboard controller, as far as a Linux guest needs it: its probe succeeds, and
//! the reset command (0xFE to port 0x64, what `reboot=k` and `reboot -f` use) stops the VM.
//!
//! Data flow: ports 0x60 (data) and 0x64 (status/command) on the port bus reach [`I8042`]. A
//! command that answers (read the configuration byte, self-test, interface test) leaves a byte
//! in the output buffer and sets the status register's "output full" bit; a read of 0x60 takes
//! it. The reset command answers with `VcpuRequest::Stop`: the vCPU ends and the VM stops the
//! others, a clean end for a guest that rebooted. There is no keyboard behind it.

use std::sync::Mutex;

use super::{BusAccess, BusDevice, VcpuRequest};

/// The data port.
pub const DATA_PORT: u16 = 0x60;
/// The status (read) and command (write) port.
pub const COMMAND_PORT: u16 = 0x64;

const STATUS_OUTPUT_FULL: u8 = 0x01;
const STATUS_SYSTEM_FLAG: u8 = 0x04;
const CMD_READ_CONFIG: u8 = 0x20;
const CMD_WRITE_CONFIG: u8 = 0x60;
const CMD_SELF_TEST: u8 = 0xaa;
const CMD_PORT_TEST: u8 = 0xab;
const CMD_RESET: u8 = 0xfe;

#[derive(Debug, Default)]
struct State {
    config: u8,
    output: Option<u8>,
    writing_config: bool,
    resets: u64,
}

/// The controller.
#[derive(Debug, Default)]
pub struct I8042 {
    state: Mutex<State>,
}

impl I8042 {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Reset commands the guest gave.
    pub fn resets(&self) -> u64 {
        self.state().resets
    }
}

impl BusDevice for I8042 {
    fn read(&self, a: BusAccess, data: &mut [u8]) -> Option<VcpuRequest> {
        data.fill(0);
        let mut s = self.state();
        let v = match a.addr {
            x if x == u64::from(COMMAND_PORT) => {
                STATUS_SYSTEM_FLAG
                    | if s.output.is_some() {
                        STATUS_OUTPUT_FULL
                    } else {
                        0
                    }
            }
            _ => s.output.take().unwrap_or(0),
        };
        if let Some(b) = data.first_mut() {
            *b = v;
        }
        None
    }

    fn write(&self, a: BusAccess, data: &[u8]) -> Option<VcpuRequest> {
        let &v = data.first()?;
        let mut s = self.state();
        if a.addr == u64::from(COMMAND_PORT) {
            s.writing_config = false;
            match v {
                CMD_READ_CONFIG => s.output = Some(s.config),
                CMD_WRITE_CONFIG => s.writing_config = true,
                CMD_SELF_TEST => s.output = Some(0x55),
                CMD_PORT_TEST => s.output = Some(0x00),
                CMD_RESET => {
                    s.resets += 1;
                    return Some(VcpuRequest::Stop);
                }
                _ => {}
            }
        } else if std::mem::take(&mut s.writing_config) {
            s.config = v;
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn port(p: u16) -> BusAccess {
        BusAccess {
            vcpu: 0,
            addr: u64::from(p),
            offset: 0,
        }
    }

    fn read(d: &I8042, p: u16) -> u8 {
        let mut b = [0u8; 1];
        d.read(port(p), &mut b);
        b[0]
    }

    #[test]
    fn the_probe_sees_a_controller_and_reset_stops_the_vm() {
        let d = I8042::default();
        assert_eq!(read(&d, COMMAND_PORT) & STATUS_OUTPUT_FULL, 0);
        d.write(port(COMMAND_PORT), &[CMD_SELF_TEST]);
        assert_ne!(read(&d, COMMAND_PORT) & STATUS_OUTPUT_FULL, 0);
        assert_eq!(read(&d, DATA_PORT), 0x55);
        assert_eq!(read(&d, COMMAND_PORT) & STATUS_OUTPUT_FULL, 0, "taken");
        // The configuration byte round-trips.
        d.write(port(COMMAND_PORT), &[CMD_WRITE_CONFIG]);
        d.write(port(DATA_PORT), &[0x47]);
        d.write(port(COMMAND_PORT), &[CMD_READ_CONFIG]);
        assert_eq!(read(&d, DATA_PORT), 0x47);
        assert_eq!(d.resets(), 0);
        assert_eq!(
            d.write(port(COMMAND_PORT), &[CMD_RESET]),
            Some(VcpuRequest::Stop)
        );
        assert_eq!(d.resets(), 1);
        assert_eq!(
            d.write(port(DATA_PORT), &[CMD_RESET]),
            None,
            "data, not a command"
        );
    }
}
