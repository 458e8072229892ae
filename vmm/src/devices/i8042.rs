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

/// Status register bits of an idle controller: system flag (self-test passed), keyboard not
/// locked. Bit 0 (0x01) says a byte waits in the output buffer.
const STATUS_IDLE: u8 = 0x14;
/// The reset command (pulse the CPU's reset line).
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
            x if x == u64::from(COMMAND_PORT) => STATUS_IDLE | u8::from(s.output.is_some()),
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
                0x20 => s.output = Some(s.config), // read the configuration byte
                0x60 => s.writing_config = true,   // write it (next byte on the data port)
                0xaa => s.output = Some(0x55),     // controller self-test: passed
                0xab => s.output = Some(0x00),     // keyboard interface test: no error
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
        let full = |d: &I8042| read(d, COMMAND_PORT) & 0x01 != 0;
        assert!(!full(&d));
        d.write(port(COMMAND_PORT), &[0xaa]);
        assert!(full(&d));
        assert_eq!(read(&d, DATA_PORT), 0x55);
        assert!(!full(&d), "taken");
        // The configuration byte round-trips.
        d.write(port(COMMAND_PORT), &[0x60]);
        d.write(port(DATA_PORT), &[0x47]);
        d.write(port(COMMAND_PORT), &[0x20]);
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
