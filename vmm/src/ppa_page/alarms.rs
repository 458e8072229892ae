//! The guest agent's alarm ring (layout 1.5, `ppa_guest_abi::ppa_page::alarms`), read as
//! untrusted input: where it is ([`locate`]: the guest header and the agent record say, every
//! figure checked against the section), its header ([`ring_header`]), and the alarms after a
//! reader's place ([`AlarmReader::poll`]), at most a given number per poll, each read under
//! the sequence protocol with bounded tries and taken only when its slot carries the number
//! expected. What a hostile guest writes costs a poll at most that number of record reads.
//!
//! Data flow: the decoder shows the ring's header in the `guest` view; the sampler holds an
//! [`AlarmReader`] and polls it at each page refresh (8 ms), forwarding what it returns as
//! `guest-alarm` events, counts and the last alarms (`handle::GuestAlarmBoard`).

use ppa_guest_abi::ppa_page::alarms::{
    AlarmKind, GuestAlarm, GuestAlarms, ALARMS_MAGIC, MAX_SLOTS,
};
use ppa_guest_abi::ppa_page::{self as abi, GuestAgent, GuestHeader, COMM_LEN, GUEST_MAGIC, MAJOR};
use ppa_vmm_api::GuestAlarmView;

use super::decode::Section;

/// Where a ring is: its offset in the section, its slots and their size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingAt {
    /// Offset of its header in the guest section.
    pub offset: u64,
    /// Slots.
    pub slots: u32,
    /// Bytes per slot.
    pub record_size: u32,
}

/// The guest header and agent record of a 1.5 writer, if both are there and readable.
fn agent(section: &Section<'_>) -> Option<(GuestHeader, GuestAgent)> {
    let h: GuestHeader = section.read(0).ok()?.ok()?;
    if h.magic != GUEST_MAGIC || h.major != MAJOR || h.minor < 5 || !abi::agent_record_fits(&h) {
        return None;
    }
    let a: GuestAgent = section.read(u64::from(abi::AGENT_OFFSET)).ok()?.ok()?;
    (a.magic == abi::AGENT_MAGIC).then_some((h, a))
}

/// The ring the agent record names, checked: `Ok(None)` when there is none, `Err` with a
/// sentence when the agent names one this VMM cannot take.
pub fn locate(section: &Section<'_>) -> Result<Option<(RingAt, GuestAlarms)>, String> {
    let Some((_, a)) = agent(section) else {
        return Ok(None);
    };
    let Some((off, size)) = a.alarms() else {
        return Ok(None);
    };
    ring_header(section, off, size).map(Some)
}

/// The ring header at `off`, of `size` bytes in all, checked against the section.
pub fn ring_header(
    section: &Section<'_>,
    off: u32,
    size: u32,
) -> Result<(RingAt, GuestAlarms), String> {
    let head = std::mem::size_of::<GuestAlarms>() as u64;
    let (off64, size64) = (u64::from(off), u64::from(size));
    let end = off64 + size64;
    if off % 8 != 0 || size64 < head || end > section.len() as u64 {
        return Err(format!(
            "the guest agent's alarm ring ({size} bytes at offset {off}) is not 8-byte aligned, \
             too small for its header, or past the section's {} bytes",
            section.len()
        ));
    }
    let r: GuestAlarms = match section.read(off64) {
        Err(e) => return Err(e),
        Ok(Err(())) => return Err("the guest agent's alarm ring header stayed mid-update".into()),
        Ok(Ok(r)) => r,
    };
    if r.magic != ALARMS_MAGIC {
        return Err(format!(
            "the guest agent's alarm ring has magic {:#010x}, not \"PPAL\"",
            r.magic
        ));
    }
    let min = std::mem::size_of::<GuestAlarm>() as u32;
    if r.slots == 0
        || r.slots > MAX_SLOTS
        || r.record_size < min
        || r.record_size % 8 != 0
        || head + u64::from(r.slots) * u64::from(r.record_size) > size64
    {
        return Err(format!(
            "the guest agent's alarm ring declares {} slots of {} bytes, which its {size} bytes \
             do not hold (at most {MAX_SLOTS} slots of at least {min} bytes, a multiple of 8)",
            r.slots, r.record_size
        ));
    }
    Ok((
        RingAt {
            offset: off64,
            slots: r.slots,
            record_size: r.record_size,
        },
        r,
    ))
}

/// What one poll found.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Poll {
    /// New alarms, oldest first.
    pub alarms: Vec<GuestAlarmView>,
    /// Alarms overwritten before this reader took them.
    pub lost: u64,
    /// Alarm records refused (unknown kind) or read torn.
    pub invalid: u64,
    /// The ring's problem, when it cannot be read (said once per different problem).
    pub problem: Option<String>,
}

/// A reader's place in the ring: the number of the last alarm it took, and the writer it
/// took it from (a new agent numbers from 1 again).
#[derive(Debug, Default)]
pub struct AlarmReader {
    taken: u64,
    writer: Option<u32>,
    last_problem: Option<String>,
}

/// The name of a thread as the decoder shows names: up to its NUL, control characters and
/// invalid UTF-8 replaced.
fn name(raw: &[u8; COMM_LEN]) -> String {
    let len = raw.iter().position(|&b| b == 0).unwrap_or(COMM_LEN);
    String::from_utf8_lossy(&raw[..len])
        .chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect()
}

impl AlarmReader {
    /// The alarms written since the last poll, at most `max` (the oldest first; those left
    /// are taken by the next polls, unless the writer overwrites them first).
    pub fn poll(&mut self, section: &Section<'_>, max: usize) -> Poll {
        let mut p = Poll::default();
        let Some((_, a)) = agent(section) else {
            return p;
        };
        let (at, ring) = match a.alarms().map(|(o, s)| ring_header(section, o, s)) {
            None => return p,
            Some(Err(e)) => {
                if self.last_problem.as_ref() != Some(&e) {
                    self.last_problem = Some(e.clone());
                    p.problem = Some(e);
                }
                return p;
            }
            Some(Ok(r)) => r,
        };
        self.last_problem = None;
        if self.writer != Some(a.pid) || ring.written < self.taken {
            // Another agent (or the same one started again): its numbers start at 1.
            self.writer = Some(a.pid);
            self.taken = 0;
        }
        let slots = u64::from(at.slots);
        let behind = ring.written - self.taken;
        if behind > slots {
            p.lost = behind - slots;
            self.taken = ring.written - slots;
        }
        let first = self.taken + 1;
        let last = ring.written.min(self.taken.saturating_add(max as u64));
        let base = at.offset + std::mem::size_of::<GuestAlarms>() as u64;
        for number in first..=last {
            let off = base + (number - 1) % slots * u64::from(at.record_size);
            match section.read::<GuestAlarm>(off) {
                Ok(Ok(r)) if r.number == number => match AlarmKind::from_u32(r.kind) {
                    Some(k) => p.alarms.push(GuestAlarmView {
                        number,
                        what: k.name().to_string(),
                        tid: if k.of_thread() { r.tid } else { 0 },
                        comm: if k.of_thread() {
                            name(&r.comm)
                        } else {
                            String::new()
                        },
                        cpu: r.cpu,
                        value: r.value,
                        threshold: r.threshold,
                        guest_ns: r.guest_ns,
                    }),
                    None => p.invalid += 1,
                },
                // Overwritten by a later alarm since the header was read: lost to us.
                Ok(Ok(_)) => p.lost += 1,
                _ => p.invalid += 1,
            }
        }
        self.taken = last;
        p
    }
}

#[cfg(test)]
#[path = "alarms_tests.rs"]
mod tests;
