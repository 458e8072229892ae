//! The 16550 UART at 0x3f8 (COM1) with its interrupt, for a Linux guest's console.
//!
//! Data flow: the guest's `in`/`out` to ports 0x3f8–0x3ff reach [`Serial`] through the port
//! bus; the register logic is vm-superio's `Serial`, behind a mutex that only vCPU threads
//! writing the console take (never a reader of the VMM's figures). Transmitted bytes go to a
//! [`ConsoleOut`], which writes whole lines to stderr as `[ttyS0] text` (a line at a time, as
//! the tiny guest's console does) and counts them. The UART's interrupt (IRQ 4) is an
//! `IrqLine`: an eventfd the hypervisor injects from.

use std::io::{self, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use vm_superio::serial::NoEvents;
use vm_superio::Trigger;

use super::{BusAccess, BusDevice, VcpuRequest};
use crate::hypervisor::IrqLine;

/// COM1's first port.
pub const COM1_PORT: u16 = 0x3f8;
/// COM1's ports.
pub const COM1_LEN: u64 = 8;
/// COM1's ISA interrupt.
pub const COM1_IRQ: u32 = 4;
/// Bytes of a console line; a longer line is cut.
const LINE: usize = 256;

/// Raises the UART's interrupt line.
struct IrqTrigger(Arc<IrqLine>);

impl Trigger for IrqTrigger {
    type E = io::Error;

    fn trigger(&self) -> io::Result<()> {
        self.0.trigger()
    }
}

/// What the console printed, for the report.
#[derive(Debug, Default)]
pub struct ConsoleStats {
    /// Bytes the guest transmitted.
    pub bytes: AtomicU64,
    /// Lines written to stderr.
    pub lines: AtomicU64,
}

/// Whole lines of the guest's console to stderr, prefixed.
pub struct ConsoleOut {
    prefix: &'static str,
    line: Vec<u8>,
    stats: Arc<ConsoleStats>,
}

impl ConsoleOut {
    /// A console whose lines start with `[prefix] `.
    pub fn new(prefix: &'static str, stats: Arc<ConsoleStats>) -> Self {
        ConsoleOut {
            prefix,
            line: Vec::with_capacity(LINE),
            stats,
        }
    }

    fn emit(&mut self) {
        let mut err = io::stderr().lock();
        let _ = write!(err, "[{}] ", self.prefix);
        let _ = err.write_all(&self.line);
        let _ = err.write_all(b"\n");
        self.line.clear();
        self.stats.lines.fetch_add(1, Ordering::Relaxed);
    }
}

impl Write for ConsoleOut {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        for &b in buf {
            self.stats.bytes.fetch_add(1, Ordering::Relaxed);
            match b {
                b'\n' => self.emit(),
                b'\r' => {}
                _ => {
                    self.line.push(b);
                    if self.line.len() == LINE {
                        self.emit();
                    }
                }
            }
        }
        Ok(buf.len())
    }

    /// A no-op: the UART flushes after every byte, and lines go out whole (at a newline, when
    /// full, or at the end through [`ConsoleOut::finish`]).
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl ConsoleOut {
    /// Writes out a partial last line.
    pub fn finish(&mut self) {
        if !self.line.is_empty() {
            self.emit();
        }
    }
}

type Uart = vm_superio::Serial<IrqTrigger, NoEvents, ConsoleOut>;

/// A 16550 UART on the port bus.
pub struct Serial {
    uart: Mutex<Uart>,
}

impl Serial {
    /// A UART raising `irq` and printing to `out`.
    pub fn new(irq: Arc<IrqLine>, out: ConsoleOut) -> Self {
        Serial {
            uart: Mutex::new(vm_superio::Serial::new(IrqTrigger(irq), out)),
        }
    }

    fn uart(&self) -> std::sync::MutexGuard<'_, Uart> {
        // A vCPU that panicked while holding the lock leaves a usable UART: its registers are
        // plain bytes.
        self.uart.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl BusDevice for Serial {
    fn read(&self, a: BusAccess, data: &mut [u8]) -> Option<VcpuRequest> {
        data.fill(0);
        if let Some(b) = data.first_mut() {
            *b = self.uart().read(a.offset as u8);
        }
        None
    }

    fn write(&self, a: BusAccess, data: &[u8]) -> Option<VcpuRequest> {
        if let Some(&b) = data.first() {
            // A full output or a failed interrupt injection loses a byte, not the vCPU.
            let _ = self.uart().write(a.offset as u8, b);
        }
        None
    }

    fn vcpu_ended(&self, _vcpu: usize) {
        self.uart().writer_mut().finish();
    }
}

#[cfg(test)]
mod tests {
    use vmm_sys_util::eventfd::EventFd;

    use super::*;

    fn at(offset: u64) -> BusAccess {
        BusAccess {
            vcpu: 0,
            addr: u64::from(COM1_PORT) + offset,
            offset,
        }
    }

    #[test]
    fn transmitted_bytes_become_console_lines_and_interrupts() {
        let irq = Arc::new(IrqLine::new(COM1_IRQ, EventFd::new(0).unwrap()));
        let stats = Arc::new(ConsoleStats::default());
        let s = Serial::new(
            Arc::clone(&irq),
            ConsoleOut::new("ttyS0", Arc::clone(&stats)),
        );
        // Enable the transmitter-empty interrupt (IER bit 1), as the 8250 driver does.
        s.write(at(1), &[0x02]);
        for b in b"hello\r\nworld" {
            assert_eq!(s.write(at(0), &[*b]), None);
        }
        assert_eq!(stats.lines.load(Ordering::Relaxed), 1, "one whole line");
        assert_eq!(stats.bytes.load(Ordering::Relaxed), 12);
        s.vcpu_ended(0);
        assert_eq!(
            stats.lines.load(Ordering::Relaxed),
            2,
            "the tail flushed at the end"
        );
        assert!(
            irq.eventfd().read().unwrap() > 0,
            "the interrupt line was raised"
        );
        // The line status register says the transmitter is empty.
        let mut lsr = [0u8; 1];
        s.read(at(5), &mut lsr);
        assert_ne!(lsr[0] & 0x20, 0);
    }
}
