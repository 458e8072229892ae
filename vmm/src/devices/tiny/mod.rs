//! The tiny guest's devices: the doorbell page (MMIO: console, exit, halt, workload and report
//! registers) and the workload port (PIO), with the per-vCPU state they keep.
//!
//! Data flow: the tiny payload makes one [`TinyBoard`] (per-vCPU console line buffers, access
//! counts by [`Doorbell`] kind, the values the guest reported) and puts a [`Doorbells`] and a
//! [`WorkloadPort`] sharing it on the buses. A vCPU's access decodes to a register; the device
//! updates that vCPU's state (atomics written only by that vCPU's thread, no lock, no
//! allocation) and answers with a `VcpuRequest` where the vCPU must act: `Exit(code)` for the
//! exit doorbell, `Park` until the deadline for the halt doorbell. At the end the payload's
//! report reads the board. Register offsets come from `ppa_guest_abi`, the contract with the
//! guest.

use std::io::Write as _;
use std::sync::atomic::{AtomicU32, AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;

use ppa_guest_abi::doorbell::{self, REPORT_KEYS};

use super::{le_value, BusAccess, BusDevice, VcpuRequest};
use crate::sync::now_ns;
use crate::sync::Counter;

indexed_enum! {
    /// Doorbell accesses by kind, so that workload exits are told apart from the protocol's
    /// own.
    pub enum Doorbell {
        /// Console byte.
        Console = "console",
        /// Exit doorbell.
        Exit = "exit",
        /// Halt doorbell.
        Halt = "halt",
        /// Report doorbell.
        Report = "report",
        /// MMIO workload doorbell.
        WorkloadMmio = "workload_mmio",
        /// PIO workload port.
        WorkloadPio = "workload_pio",
        /// An access to a register the page does not have, or to no device at all.
        Unhandled = "unhandled",
    }
}

/// Bytes of a console line; a longer line is cut into lines of this size.
const LINE: usize = 200;

/// One vCPU's console line buffer: written only by that vCPU's thread (atomics only so that
/// the shared board is `Sync` without a lock).
#[derive(Debug)]
struct Console {
    buf: [AtomicU8; LINE],
    len: AtomicUsize,
}

impl Default for Console {
    fn default() -> Self {
        Console {
            buf: std::array::from_fn(|_| AtomicU8::new(0)),
            len: AtomicUsize::new(0),
        }
    }
}

impl Console {
    fn push(&self, vcpu: usize, b: u8) {
        let mut len = self.len.load(Ordering::Relaxed);
        if b != b'\n' {
            self.buf[len].store(b, Ordering::Relaxed);
            len += 1;
            self.len.store(len, Ordering::Relaxed);
        }
        if b == b'\n' || len == LINE {
            self.flush(vcpu);
        }
    }

    /// Writes the line to stderr as `[vcpuN] bytes` when the log level is `info` or finer
    /// (`PPA_VMM_LOG=info`; the tiny guest's only line is its greeting, which a run must not
    /// print by default, issue 28); the guest's bytes go out as they are (no allocation), and
    /// a closed stderr is ignored rather than stopping the vCPU.
    fn flush(&self, vcpu: usize) {
        let len = self.len.swap(0, Ordering::Relaxed);
        if len == 0 || !log::log_enabled!(log::Level::Info) {
            return;
        }
        let mut line = [0u8; LINE];
        for (d, s) in line.iter_mut().zip(&self.buf[..len]) {
            *d = s.load(Ordering::Relaxed);
        }
        let mut err = std::io::stderr().lock();
        let _ = write!(err, "[vcpu{vcpu}] ");
        let _ = err.write_all(&line[..len]);
        let _ = err.write_all(b"\n");
    }
}

/// What the tiny devices keep about one vCPU.
#[derive(Debug, Default)]
pub struct TinyVcpu {
    console: Console,
    /// Accesses by [`Doorbell`] index.
    doorbells: [Counter; Doorbell::COUNT],
    /// Values the guest reported, by report key.
    reported: [Counter; REPORT_KEYS as usize],
    /// Bit K set when key K was reported.
    reported_mask: AtomicU32,
}

impl TinyVcpu {
    fn count(&self, d: Doorbell) {
        self.doorbells[d as usize].add(1);
    }

    /// Accesses of kind `d`.
    pub fn doorbell(&self, d: Doorbell) -> u64 {
        self.doorbells[d as usize].get()
    }

    /// The value the guest reported for `key`, if it did.
    pub fn reported(&self, key: usize) -> Option<u64> {
        let mask = self.reported_mask.load(Ordering::Acquire);
        (key < REPORT_KEYS as usize && mask & (1 << key) != 0).then(|| self.reported[key].get())
    }
}

/// The per-vCPU state of the tiny devices, shared by them and read by the payload's report.
#[derive(Debug)]
pub struct TinyBoard {
    vcpus: Box<[TinyVcpu]>,
}

impl TinyBoard {
    /// State for `vcpus` vCPUs.
    pub fn new(vcpus: usize) -> Arc<Self> {
        Arc::new(TinyBoard {
            vcpus: (0..vcpus).map(|_| TinyVcpu::default()).collect(),
        })
    }

    /// vCPU `i`'s state (None past the last vCPU).
    pub fn vcpu(&self, i: usize) -> Option<&TinyVcpu> {
        self.vcpus.get(i)
    }
}

/// Puts the doorbell page and the workload port, sharing `board`, on `buses`.
pub fn install(board: &Arc<TinyBoard>, buses: &mut super::Buses) -> Result<(), super::BusError> {
    use ppa_guest_abi::{DOORBELL_GPA, DOORBELL_SIZE, WORKLOAD_PIO_PORT};
    buses.mmio.insert(
        DOORBELL_GPA,
        DOORBELL_SIZE,
        Arc::new(Doorbells(Arc::clone(board))),
    )?;
    buses.pio.insert(
        u64::from(WORKLOAD_PIO_PORT),
        4,
        Arc::new(WorkloadPort(Arc::clone(board))),
    )
}

/// The doorbell page of spec section 3.
pub struct Doorbells(pub Arc<TinyBoard>);

impl TinyBoard {
    /// A read of a tiny device: zeros, counted as `d` for the vCPU that made it.
    fn read_zeros(&self, a: BusAccess, data: &mut [u8], d: Doorbell) -> Option<VcpuRequest> {
        data.fill(0);
        if let Some(v) = self.vcpu(a.vcpu) {
            v.count(d);
        }
        None
    }
}

impl BusDevice for Doorbells {
    fn read(&self, a: BusAccess, data: &mut [u8]) -> Option<VcpuRequest> {
        self.0.read_zeros(a, data, Doorbell::Unhandled)
    }

    #[link_section = "ppa_hot"]
    fn write(&self, a: BusAccess, data: &[u8]) -> Option<VcpuRequest> {
        let v = self.0.vcpu(a.vcpu)?;
        let value = le_value(data);
        match a.offset {
            doorbell::CONSOLE => {
                v.count(Doorbell::Console);
                v.console.push(a.vcpu, value as u8);
                None
            }
            doorbell::EXIT => {
                v.count(Doorbell::Exit);
                Some(VcpuRequest::Exit(value))
            }
            doorbell::HALT => {
                v.count(Doorbell::Halt);
                Some(VcpuRequest::Park {
                    deadline_ns: Some(now_ns().saturating_add(value)),
                })
            }
            doorbell::WORKLOAD => {
                v.count(Doorbell::WorkloadMmio);
                None
            }
            o if (doorbell::REPORT_BASE..doorbell::REPORT_BASE + 8 * REPORT_KEYS).contains(&o)
                && o % 8 == 0 =>
            {
                let key = ((o - doorbell::REPORT_BASE) / 8) as usize;
                v.count(Doorbell::Report);
                v.reported[key].set(value);
                v.reported_mask.fetch_or(1 << key, Ordering::Release);
                None
            }
            _ => {
                v.count(Doorbell::Unhandled);
                None
            }
        }
    }

    fn vcpu_ended(&self, vcpu: usize) {
        if let Some(v) = self.0.vcpu(vcpu) {
            v.console.flush(vcpu);
        }
    }
}

/// The port the `exits:kind=pio` workload writes to; reads return zeros.
pub struct WorkloadPort(pub Arc<TinyBoard>);

impl BusDevice for WorkloadPort {
    fn read(&self, a: BusAccess, data: &mut [u8]) -> Option<VcpuRequest> {
        self.0.read_zeros(a, data, Doorbell::WorkloadPio)
    }

    fn write(&self, a: BusAccess, _data: &[u8]) -> Option<VcpuRequest> {
        if let Some(v) = self.0.vcpu(a.vcpu) {
            v.count(Doorbell::WorkloadPio);
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(vcpu: usize, offset: u64) -> BusAccess {
        BusAccess {
            vcpu,
            addr: ppa_guest_abi::DOORBELL_GPA + offset,
            offset,
        }
    }

    #[test]
    fn doorbell_registers_decode_into_requests_and_state() {
        let board = TinyBoard::new(2);
        let d = Doorbells(Arc::clone(&board));
        assert_eq!(d.write(at(1, doorbell::CONSOLE), b"A"), None);
        assert_eq!(
            d.write(at(1, doorbell::EXIT), &7u64.to_le_bytes()),
            Some(VcpuRequest::Exit(7))
        );
        let before = now_ns();
        let Some(VcpuRequest::Park {
            deadline_ns: Some(deadline),
        }) = d.write(at(0, doorbell::HALT), &1_000_000u32.to_le_bytes())
        else {
            panic!("the halt doorbell parks with a deadline");
        };
        assert!(deadline >= before + 1_000_000 && deadline <= now_ns() + 1_000_000);
        assert_eq!(d.write(at(0, doorbell::WORKLOAD), &[0]), None);
        assert_eq!(
            d.write(at(1, doorbell::REPORT_BASE + 8 * 3), &42u64.to_le_bytes()),
            None
        );
        assert_eq!(d.write(at(1, doorbell::REPORT_BASE + 4), &[1]), None);
        assert_eq!(
            d.write(at(1, doorbell::REPORT_BASE + 8 * REPORT_KEYS), &[1]),
            None
        );
        let mut b = [9u8; 4];
        assert_eq!(d.read(at(0, 0), &mut b), None);
        assert_eq!(b, [0; 4]);

        let (v0, v1) = (board.vcpu(0).unwrap(), board.vcpu(1).unwrap());
        assert_eq!(v1.reported(3), Some(42));
        assert_eq!(v1.reported(2), None, "never reported");
        assert_eq!(v0.reported(3), None, "per vCPU");
        assert_eq!(v1.doorbell(Doorbell::Console), 1);
        assert_eq!(v1.doorbell(Doorbell::Exit), 1);
        assert_eq!(v1.doorbell(Doorbell::Report), 1);
        assert_eq!(
            v1.doorbell(Doorbell::Unhandled),
            2,
            "unaligned, out of range"
        );
        assert_eq!(v0.doorbell(Doorbell::Halt), 1);
        assert_eq!(v0.doorbell(Doorbell::WorkloadMmio), 1);
        assert_eq!(v0.doorbell(Doorbell::Unhandled), 1, "a read");
        assert!(board.vcpu(2).is_none());
        assert_eq!(d.write(at(5, doorbell::EXIT), &[1]), None, "no such vCPU");
    }

    #[test]
    fn console_lines_are_buffered_per_vcpu_and_cut_when_full() {
        let board = TinyBoard::new(1);
        let d = Doorbells(Arc::clone(&board));
        for b in b"hi" {
            d.write(at(0, doorbell::CONSOLE), &[*b]);
        }
        let c = &board.vcpu(0).unwrap().console;
        assert_eq!(c.len.load(Ordering::Relaxed), 2);
        d.vcpu_ended(0);
        assert_eq!(c.len.load(Ordering::Relaxed), 0, "flushed at the end");
        for _ in 0..LINE + 3 {
            d.write(at(0, doorbell::CONSOLE), b"x");
        }
        assert_eq!(c.len.load(Ordering::Relaxed), 3, "a full line went out");
        d.write(at(0, doorbell::CONSOLE), b"\n");
        assert_eq!(c.len.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn workload_port_counts_both_directions() {
        let board = TinyBoard::new(1);
        let p = WorkloadPort(Arc::clone(&board));
        let a = BusAccess {
            vcpu: 0,
            addr: 0x600,
            offset: 0,
        };
        assert_eq!(p.write(a, &[1, 2, 3, 4]), None);
        let mut b = [7u8; 4];
        assert_eq!(p.read(a, &mut b), None);
        assert_eq!(b, [0; 4]);
        assert_eq!(board.vcpu(0).unwrap().doorbell(Doorbell::WorkloadPio), 2);
    }
}
