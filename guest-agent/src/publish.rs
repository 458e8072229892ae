//! Writing a sample into the guest section with the sequence protocol of
//! `ppa_guest_abi::ppa_page` (the guest section: layout 1.5).
//!
//! The agent's layout of the guest section (offsets from its start):
//!
//! ```text
//! 0      GuestHeader (64)
//! 64     GuestAgent (192): cost, interval, the aggregate of unpublished threads, transient
//!        tasks, where the alarm ring is, the reset it honoured
//! 256    with a threshold set: GuestAlarms (128) + slots × GuestAlarm (64) (`ring`)
//! A      nr_cpus × GuestCpu (192)
//! A + 192·nr_cpus   capacity × GuestThreadFull (256: the record and its 1.5 tail)
//! ```
//!
//! Data flow: [`Publisher::new`] takes the page's one writer ([`GuestWriter`]) and computes
//! the layout and the thread capacity (what fits, capped by `max_threads` and by the 1024
//! records a reader takes). Each [`Publisher::publish`] first checks that the region header
//! is still the one the agent checked and that nobody else wrote the guest header since its
//! last write (it stops rather than interleave with another writer), takes the threads the
//! collector chose ([`crate::collect::rank::select`]: most on-CPU time in the last interval
//! first, up to the capacity; then the exited threads still lingering, state `X`, in the room
//! left), keeps each in the slot it had ([`assign`]), sums the live threads left out into the
//! aggregate, takes the transient figures less the exited threads it lists ([`transient`]),
//! and writes the CPU records, the thread records, the sample's alarms ([`ring`]), its own
//! record and the header, each under the protocol. Every figure is written less its
//! baseline of the last reset ([`crate::collect::reset`]). When the header's thread count
//! shrinks it is written first, so a reader never counts a slot that is being rewritten for
//! another thread.

use std::collections::{HashMap, HashSet};

use ppa_guest_abi::ppa_page::{
    self as abi, GuestAgent, GuestHeader, GuestThread, GuestThreadFull, GuestThreadTail,
    GUEST_MAGIC, MAJOR, MINOR, THREAD_RECORD_SIZE_1_5,
};
use thiserror::Error;

use crate::collect::alarms::Thresholds;
use crate::collect::linger::transient;
use crate::collect::reset::{cpu_since, since};
use crate::collect::{Collector, ThreadInfo};
use crate::page::{GuestWriter, Page, WriterError};

mod ring;

const HEADER: u32 = 64;
const AGENT: u32 = 192;
/// A CPU record.
const RECORD: u32 = 192;
/// A thread record with its 1.5 tail.
const THREAD: u32 = THREAD_RECORD_SIZE_1_5;

/// Why the agent cannot (or no longer may) publish.
#[derive(Debug, Error)]
pub enum PublishError {
    /// The guest section cannot hold the layout with one thread record.
    #[error("the guest section has {size} bytes; the agent needs {need} for its header, its record, {cpus} CPU records and one thread record")]
    TooSmall {
        /// Guest section size.
        size: usize,
        /// Bytes needed.
        need: u64,
        /// CPU records.
        cpus: u32,
    },
    /// The VMM rewrote the region header under the agent.
    #[error("the region header changed under the agent (magic {magic:#010x}, layout {major}.{minor}, {total} bytes): stopping without writing")]
    RegionChanged {
        /// Magic now.
        magic: u32,
        /// Major now.
        major: u16,
        /// Minor now.
        minor: u16,
        /// Size now.
        total: u32,
    },
    /// The page has no writer to give (mapped to look, or another publisher has it).
    #[error("the agent cannot write the guest section")]
    Writer(#[from] WriterError),
    /// Someone else wrote the guest header.
    #[error("another writer changed the guest header (sequence {found}, the agent last wrote {wrote}): stopping so as not to interleave with it")]
    Foreign {
        /// Sequence counter found.
        found: u32,
        /// The one the agent left.
        wrote: u32,
    },
}

/// Where the tables go, and how many thread records fit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// The alarm ring's offset and slots (None: no ring).
    pub alarms: Option<(u32, u32)>,
    /// Offset of the CPU table.
    pub cpus_offset: u32,
    /// Offset of the thread table.
    pub threads_offset: u32,
    /// Thread records.
    pub capacity: u32,
}

/// Slots of the alarm ring when a threshold is set (and the section has room; else 16, else
/// none): 64 alarms is two samples' worth at the most one sample writes.
pub const ALARM_SLOTS: u32 = 64;

/// The layout for a guest section of `size` bytes and `nr_cpus` CPUs, with an alarm ring
/// when `alarms` (a threshold is set) and the section holds one beside one thread record.
pub fn layout(
    size: usize,
    nr_cpus: u32,
    max_threads: u32,
    alarms: bool,
) -> Result<Layout, PublishError> {
    let fits = |slots: u32| {
        let ring = if slots == 0 {
            0
        } else {
            abi::alarms::GuestAlarms::bytes(slots)
        };
        let cpus_offset = HEADER + AGENT + ring;
        let threads_offset = u64::from(cpus_offset) + u64::from(nr_cpus) * u64::from(RECORD);
        let need = threads_offset + u64::from(THREAD);
        ((size as u64) >= need).then_some((slots, cpus_offset, threads_offset, need))
    };
    let tries: &[u32] = if alarms { &[ALARM_SLOTS, 16, 0] } else { &[0] };
    let Some((slots, cpus_offset, threads_offset, _)) = tries.iter().find_map(|&n| fits(n)) else {
        let need =
            u64::from(HEADER + AGENT) + u64::from(nr_cpus) * u64::from(RECORD) + u64::from(THREAD);
        return Err(PublishError::TooSmall {
            size,
            need,
            cpus: nr_cpus,
        });
    };
    let fit = (size as u64 - threads_offset) / u64::from(THREAD);
    Ok(Layout {
        alarms: (slots > 0).then_some((HEADER + AGENT, slots)),
        cpus_offset,
        threads_offset: threads_offset as u32,
        capacity: fit.min(u64::from(max_threads.min(abi::READER_MAX_RECORDS))) as u32,
    })
}

/// Puts the `chosen` tids in `slots` (slot i holds `slots[i]`): a tid keeps the slot it had,
/// a new one takes the lowest free slot, and the last slots move into the holes left, so the
/// used slots are `0..chosen.len()`. Tids are never 0 (the idle task has no /proc entry).
pub fn assign(slots: &mut Vec<u32>, chosen: &[u32]) {
    const HOLE: u32 = 0;
    let keep: HashSet<u32> = chosen.iter().copied().collect();
    let mut present = HashSet::new();
    for t in slots.iter_mut() {
        if keep.contains(t) {
            present.insert(*t);
        } else {
            *t = HOLE;
        }
    }
    let mut free = 0;
    for &t in chosen.iter().filter(|t| !present.contains(t)) {
        while free < slots.len() && slots[free] != HOLE {
            free += 1;
        }
        if free < slots.len() {
            slots[free] = t;
        } else {
            slots.push(t);
        }
    }
    let mut i = 0;
    while i < slots.len() {
        if slots[i] == HOLE {
            while slots.last() == Some(&HOLE) {
                slots.pop();
            }
            if i < slots.len() {
                slots[i] = slots.pop().unwrap_or(HOLE);
            }
        }
        i += 1;
    }
}

/// The agent's own figures for its record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AgentFigures {
    /// Sample interval, ns.
    pub interval_ns: u64,
    /// Samples taken.
    pub samples: u64,
    /// CPU of the last sample, ns.
    pub sample_cpu_ns: u64,
    /// The most CPU one sample took, ns.
    pub sample_max_cpu_ns: u64,
    /// All its CPU, ns.
    pub agent_cpu_ns: u64,
    /// It is stopping.
    pub stopped: bool,
    /// The reset it honoured last (the host's generation) and when, on the header's clock.
    pub reset: (u64, u64),
}

/// The agent's writer into the guest section. It borrows the page's one
/// [`GuestWriter`], so the page cannot be dropped (and unmapped) while a publisher lives:
///
/// ```compile_fail,E0505
/// use ppa_agent::discover::Place;
/// use ppa_agent::page::{Access, Page};
/// use ppa_agent::collect::alarms::Thresholds;
/// use ppa_agent::publish::Publisher;
///
/// fn publish_after_unmap(place: &Place) {
///     let page = Page::open(place, Access::Publish).unwrap();
///     let p = Publisher::new(&page, 1, 8, Thresholds::default()).unwrap();
///     drop(page); // error[E0505]: cannot move out of `page` because it is borrowed
///     let _ = p.layout();
/// }
/// ```
///
/// while the same code with the publisher dropped first compiles:
///
/// ```no_run
/// use ppa_agent::discover::Place;
/// use ppa_agent::page::{Access, Page};
/// use ppa_agent::collect::alarms::Thresholds;
/// use ppa_agent::publish::Publisher;
///
/// fn publish_then_unmap(place: &Place) {
///     let page = Page::open(place, Access::Publish).unwrap();
///     let p = Publisher::new(&page, 1, 8, Thresholds::default()).unwrap();
///     let _ = p.layout();
///     drop(p);
///     drop(page);
/// }
/// ```
#[derive(Debug)]
pub struct Publisher<'p> {
    section: GuestWriter<'p>,
    layout: Layout,
    nr_cpus: u32,
    slots: Vec<u32>,
    published: u32,
    header: GuestHeader,
    wrote: Option<u32>,
    ring: ring::Ring,
}

/// The record of `t` (its figures less `base`, its baseline of the last reset) at `now_ns`.
/// An exited thread's record keeps the time of its exit as its update time (its figures are
/// final); a live thread is never published with the exited state: the rare `X` a /proc read
/// catches for a thread being reaped is shown as `Z`.
fn thread_record(t: &ThreadInfo, base: Option<&ThreadInfo>, now_ns: u64) -> GuestThreadFull {
    let t = &since(t, base);
    let mut r = GuestThread {
        seq: 0,
        tid: t.tid,
        tgid: t.tgid,
        last_cpu: t.last_cpu,
        comm: t.comm,
        on_cpu_ns: t.sched.on_cpu_ns,
        utime_ns: t.utime_ns,
        stime_ns: t.stime_ns,
        run_delay_ns: t.sched.run_delay_ns,
        timeslices: t.sched.timeslices,
        nvcsw: t.nvcsw,
        nivcsw: t.nivcsw,
        blkio_delay_ns: t.delays[0],
        swapin_delay_ns: t.delays[1],
        freepages_delay_ns: t.delays[2],
        irq_delay_ns: t.delays[3],
        updated_ns: if t.exited_ns != 0 {
            t.exited_ns
        } else {
            now_ns
        },
        work: 0,
        reserved: [0; 7],
    };
    let flags = if t.kernel { abi::THREAD_KERNEL } else { 0 };
    let state = match t.state {
        abi::THREAD_STATE_EXITED if t.exited_ns == 0 => b'Z',
        s => s,
    };
    r.set_ext(flags, state, t.interval_on_cpu_ns);
    r.set_v15(t.over, [t.delays[4], t.delays[5]]);
    GuestThreadFull {
        thread: r,
        tail: GuestThreadTail {
            wpcopy_delay_ns: t.delays[6],
            delay_counts: t.delay_counts,
        },
    }
}

impl<'p> Publisher<'p> {
    /// Lays out the guest section of `page` for `nr_cpus` CPUs, with an alarm ring when a
    /// threshold is set, taking the page's one writer. Nothing is written yet.
    pub fn new(
        page: &'p Page,
        nr_cpus: u32,
        max_threads: u32,
        thresholds: Thresholds,
    ) -> Result<Publisher<'p>, PublishError> {
        let section = page.guest_writer()?;
        let layout = layout(section.len(), nr_cpus, max_threads, thresholds.any())?;
        Ok(Publisher {
            section,
            layout,
            nr_cpus,
            slots: Vec::new(),
            published: 0,
            header: GuestHeader {
                seq: 0,
                magic: GUEST_MAGIC,
                major: MAJOR,
                minor: MINOR,
                nr_cpus,
                updated_ns: 0,
                threads_offset: layout.threads_offset,
                threads_count: 0,
                thread_record_size: THREAD,
                cpus_offset: layout.cpus_offset,
                cpus_count: nr_cpus,
                cpu_record_size: RECORD,
                transient_count: 0,
                transient_cpu_ns: 0,
            },
            wrote: None,
            ring: ring::Ring::new(layout.alarms, thresholds),
        })
    }

    /// The layout in use.
    pub fn layout(&self) -> Layout {
        self.layout
    }

    fn write_header(&mut self) {
        self.section.write(0, &self.header);
        self.wrote = self.section.header_seq();
    }

    /// Whether the region header is still the one checked and the guest header still the
    /// one the agent last wrote.
    fn still_ours(&self) -> Result<(), PublishError> {
        if let Err(h) = self.section.page().unchanged() {
            return Err(PublishError::RegionChanged {
                magic: h.magic,
                major: h.major,
                minor: h.minor,
                total: h.total_size,
            });
        }
        if let Some(wrote) = self.wrote {
            let found = self.section.header_seq().unwrap_or(0);
            if found != wrote {
                return Err(PublishError::Foreign { found, wrote });
            }
        }
        Ok(())
    }

    /// Publishes what `c` sampled, and `me`.
    pub fn publish(&mut self, c: &Collector, me: &AgentFigures) -> Result<(), PublishError> {
        self.still_ours()?;
        let now = c.now_ns();
        // The collector chose (and refreshed) the threads to publish, live ones first, then
        // exited ones; at most capacity.
        let picked: Vec<&ThreadInfo> = c.selected().take(self.layout.capacity as usize).collect();
        let by_tid: HashMap<u32, &ThreadInfo> = picked.iter().map(|t| (t.tid, *t)).collect();
        let chosen: Vec<u32> = picked.iter().map(|t| t.tid).collect();
        assign(&mut self.slots, &chosen);
        let totals = c.totals();
        self.header.updated_ns = now;
        self.header.threads_count = self.slots.len() as u32;
        // Exited threads published now are left out of the transient figures.
        let exited: Vec<ThreadInfo> = picked
            .iter()
            .filter(|t| t.exited_ns != 0)
            .map(|t| since(t, c.base(t.tid)))
            .collect();
        (self.header.transient_count, self.header.transient_cpu_ns) =
            transient((totals.exited_count, totals.exited_cpu_ns), exited.iter());
        if self.header.threads_count < self.published {
            self.write_header();
        }
        for r in c.cpus() {
            if r.cpu < self.nr_cpus {
                let i = r.cpu as usize;
                let off = u64::from(self.layout.cpus_offset) + u64::from(r.cpu) * 192;
                let mut rec = cpu_since(r, c.cpu_base(i));
                rec.set_over(c.cpu_over(i));
                self.section.write(off, &rec);
            }
        }
        for (i, tid) in self.slots.iter().enumerate() {
            if let Some(t) = by_tid.get(tid) {
                let off = u64::from(self.layout.threads_offset) + i as u64 * u64::from(THREAD);
                self.section
                    .write(off, &thread_record(t, c.base(*tid), now));
            }
        }
        self.ring.publish(&mut self.section, c.occurrences(), now);
        let mut a = agent_record(c, me, |tid| by_tid.contains_key(&tid), self.slots.len());
        let alarms = self
            .layout
            .alarms
            .map(|(off, slots)| (off, abi::alarms::GuestAlarms::bytes(slots)));
        a.set_v15(alarms, me.reset.0, me.reset.1);
        self.section.write(u64::from(HEADER), &a);
        self.write_header();
        self.published = self.header.threads_count;
        Ok(())
    }
}

/// The agent's record: `me`, and of what `c` sampled the live threads not published (the
/// aggregate: those for which `published` is false; an exited thread is published or in the
/// transient figures, never here), `listed` records published, and the collector's totals.
fn agent_record(
    c: &Collector,
    me: &AgentFigures,
    published: impl Fn(u32) -> bool,
    listed: usize,
) -> GuestAgent {
    let totals = c.totals();
    let (mut seen, mut rest) = (0u32, (0u64, 0u64, 0u64));
    for t in c.threads() {
        seen += 1;
        if !published(t.tid) {
            rest.0 += 1;
            rest.1 += since(t, c.base(t.tid)).sched.on_cpu_ns;
            rest.2 += t.interval_on_cpu_ns;
        }
    }
    let mut flags = 0;
    for (on, bit) in [
        (c.taskstats(), abi::AGENT_TASKSTATS),
        (c.delayacct(), abi::AGENT_DELAYACCT),
        (totals.exits_lost, abi::AGENT_EXITS_LOST),
        (c.cpu_switches(), abi::AGENT_CPU_SWITCHES),
        (me.stopped, abi::AGENT_STOPPED),
    ] {
        if on {
            flags |= bit;
        }
    }
    GuestAgent {
        seq: 0,
        magic: abi::AGENT_MAGIC,
        size: AGENT,
        flags,
        pid: std::process::id(),
        threads_seen: seen,
        threads_published: listed as u32,
        reserved0: 0,
        interval_ns: me.interval_ns,
        samples: me.samples,
        sample_cpu_ns: me.sample_cpu_ns,
        sample_max_cpu_ns: me.sample_max_cpu_ns,
        agent_cpu_ns: me.agent_cpu_ns,
        rest_count: rest.0,
        rest_on_cpu_ns: rest.1,
        rest_interval_on_cpu_ns: rest.2,
        unseen_count: totals.unseen_count,
        unseen_cpu_ns: totals.unseen_cpu_ns,
        exited_processes: totals.exited_processes,
        exits_missed: totals.exits_missed,
        updated_ns: c.now_ns(),
        reserved: [0; 7],
    }
}

#[cfg(test)]
mod tests;
