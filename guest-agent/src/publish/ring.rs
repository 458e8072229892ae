//! The agent's alarm ring (layout 1.5, `ppa_page::alarms`): each sample's threshold
//! occurrences become numbered alarms in the ring's slots, at most [`PER_SAMPLE`] a sample
//! (the rest counted as suppressed), then the ring's header says how many were written.
//!
//! Data flow: [`super::Publisher::publish`] hands [`Ring::publish`] the collector's
//! occurrences of the sample; the ring writes each alarm's slot under the sequence protocol,
//! then its header, so that a reader that sees the header's count finds each alarm it counts
//! in its slot (or a later one, which it tells by the number).

use ppa_guest_abi::ppa_page::alarms::{GuestAlarm, GuestAlarms, ALARMS_MAGIC};

use crate::collect::alarms::{Occurrence, Thresholds};
use crate::page::GuestWriter;

/// Most alarms one sample writes: a sample in which every thread of a busy guest crossed a
/// threshold (a storm) costs the ring, and the host reading it, a bounded amount.
pub const PER_SAMPLE: usize = 32;

/// The ring's state: where it is, the numbers written so far.
#[derive(Debug, Clone)]
pub struct Ring {
    at: Option<(u32, u32)>,
    header: GuestAlarms,
}

impl Ring {
    /// A ring at `at` (offset, slots; None: the layout has no ring) for `thresholds`.
    pub fn new(at: Option<(u32, u32)>, thresholds: Thresholds) -> Ring {
        Ring {
            at,
            header: GuestAlarms {
                seq: 0,
                magic: ALARMS_MAGIC,
                slots: at.map_or(0, |(_, n)| n),
                record_size: std::mem::size_of::<GuestAlarm>() as u32,
                written: 0,
                suppressed: 0,
                thresholds: thresholds.0,
                reserved: [0; 7],
            },
        }
    }

    /// Writes this sample's `found` (at most [`PER_SAMPLE`]) stamped `now_ns`, then the
    /// header (also when nothing was found: the first sample makes the ring known).
    pub fn publish(&mut self, section: &mut GuestWriter<'_>, found: &[Occurrence], now_ns: u64) {
        let Some((off, slots)) = self.at else {
            return;
        };
        let base = u64::from(off) + std::mem::size_of::<GuestAlarms>() as u64;
        for o in found.iter().take(PER_SAMPLE) {
            let number = self.header.written + 1;
            let slot = (number - 1) % u64::from(slots);
            let a = GuestAlarm {
                seq: 0,
                kind: o.kind as u32,
                number,
                tid: o.tid,
                cpu: o.cpu,
                comm: o.comm,
                value: o.value,
                threshold: o.threshold,
                guest_ns: now_ns,
            };
            section.write(base + slot * std::mem::size_of::<GuestAlarm>() as u64, &a);
            self.header.written = number;
        }
        self.header.suppressed += found.len().saturating_sub(PER_SAMPLE) as u64;
        section.write(u64::from(off), &self.header);
    }
}
