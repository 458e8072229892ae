//! The guest side's metric families (docs/control.md, "Metric families"): what the guest
//! published in the PPA page, decoded and checked, and the alarms and resets the VMM handled.
//! Cardinality is bounded by the VM, not by the guest: CPUs up to the VM's vCPU count, threads
//! to the `--guest-metrics-threads` busiest (at most [`MAX_THREADS`]) and one `rest` series for
//! the others, each thread's delays by the seven kinds the page carries.
//!
//! Data flow: the exporter decodes the page at each render ([`Guest`] in `Detailed`), and
//! [`add_guest`] turns it into samples; everything else is the text encoder's.

use ppa_vmm_api::{GuestThreadView, GuestView, ALARM_WHAT};

use super::text::{Families, Seconds};

pub use crate::ppa_page::board::MAX_METRICS_THREADS as MAX_THREADS;

/// What the guest families are rendered from.
#[derive(Debug, Clone)]
pub struct Guest {
    /// The decoded page.
    pub view: GuestView,
    /// Threads to name (the rest summed under `tid="rest"`).
    pub threads: usize,
    /// The VM's vCPUs (guest CPU records beyond them are not exported).
    pub vcpus: usize,
}

/// `/proc/stat`'s modes in the CPU records' `times_ns` order.
const MODES: [&str; 7] = [
    "user", "system", "idle", "iowait", "irq", "softirq", "steal",
];
/// Delay kinds: run-queue wait, then the page's seven in their order.
const DELAYS: [&str; 8] = [
    "run",
    "blkio",
    "swapin",
    "freepages",
    "irq",
    "thrashing",
    "compact",
    "wpcopy",
];

/// One thread's (or the rest's) figures for the families.
#[derive(Debug, Clone, Copy, Default)]
struct Figures {
    cpu_ns: u64,
    delays_ns: [u64; 8],
    counts: [u64; 8],
}

impl Figures {
    fn of(t: &GuestThreadView) -> Figures {
        let mut f = Figures {
            cpu_ns: t.on_cpu_ns,
            ..Default::default()
        };
        f.delays_ns[0] = t.run_delay_ns;
        f.delays_ns[1..5].copy_from_slice(&t.delays_ns);
        f.delays_ns[5..8].copy_from_slice(&t.delays_more_ns);
        f.counts[0] = t.timeslices;
        f.counts[1..8].copy_from_slice(&t.delay_counts);
        f
    }

    fn add(&mut self, o: &Figures) {
        self.cpu_ns = self.cpu_ns.saturating_add(o.cpu_ns);
        for k in 0..8 {
            self.delays_ns[k] = self.delays_ns[k].saturating_add(o.delays_ns[k]);
            self.counts[k] = self.counts[k].saturating_add(o.counts[k]);
        }
    }
}

/// Adds the guest side's samples of VM `vm`.
pub fn add_guest(f: &mut Families, vm: &str, g: &Guest) {
    let v = &g.view;
    for c in v.cpus.iter().filter(|c| (c.cpu as usize) < g.vcpus) {
        let cpu = c.cpu.to_string();
        for (mode, ns) in MODES.iter().zip(c.times_ns) {
            let labels = [("vm", vm), ("cpu", cpu.as_str()), ("mode", *mode)];
            f.add("ppa_guest_cpu_seconds_total", &labels, Seconds(ns));
        }
    }
    threads(f, vm, g);
    if v.published {
        f.add(
            "ppa_guest_transient_tasks_total",
            &[("vm", vm)],
            v.transient_count,
        );
        f.add(
            "ppa_guest_transient_cpu_seconds_total",
            &[("vm", vm)],
            Seconds(v.transient_cpu_ns),
        );
        let exited = v.threads.iter().filter(|t| t.state == "X").count() as u64;
        f.add(
            "ppa_guest_threads",
            &[("vm", vm), ("state", "exited")],
            exited,
        );
    }
    if let Some(a) = &v.agent {
        f.add(
            "ppa_guest_threads",
            &[("vm", vm), ("state", "live")],
            u64::from(a.threads_seen),
        );
        f.add(
            "ppa_guest_agent_cpu_seconds_total",
            &[("vm", vm)],
            Seconds(a.agent_cpu_ns),
        );
    }
    // What the VMM counts of alarms and resets is there for every VM with a page, zeros
    // included, so that a board's panel has data before the first alarm.
    let a = v.alarms.clone().unwrap_or_default();
    for (what, n) in ALARM_WHAT.iter().zip(a.forwarded) {
        f.add("ppa_guest_alarms_total", &[("vm", vm), ("what", *what)], n);
    }
    f.add("ppa_guest_alarms_lost_total", &[("vm", vm)], a.lost);
    f.add("ppa_guest_alarms_refused_total", &[("vm", vm)], a.invalid);
    if v.alarms.is_some() {
        f.add(
            "ppa_guest_alarms_suppressed_total",
            &[("vm", vm)],
            a.suppressed,
        );
    }
    let r = v.reset.unwrap_or_default();
    for (side, n) in [("requested", r.requested), ("honoured", r.honoured)] {
        f.add(
            "ppa_guest_reset_generation",
            &[("vm", vm), ("side", side)],
            n,
        );
    }
}

/// The busiest `g.threads` threads by name, each once (a tid the guest lists twice goes to
/// the rest), and the rest: the other published threads and the agent's aggregate.
fn threads(f: &mut Families, vm: &str, g: &Guest) {
    let v = &g.view;
    if !v.published {
        return;
    }
    let n = g.threads.min(MAX_THREADS);
    let mut named: Vec<(String, String, Figures)> = Vec::with_capacity(n);
    let mut rest = Figures::default();
    // The view lists threads by on-CPU time, highest first.
    for t in &v.threads {
        let tid = t.tid.to_string();
        if named.len() < n && !named.iter().any(|(x, _, _)| *x == tid) {
            named.push((tid, t.comm.clone(), Figures::of(t)));
        } else {
            rest.add(&Figures::of(t));
        }
    }
    if let Some(a) = &v.agent {
        rest.cpu_ns = rest.cpu_ns.saturating_add(a.rest_on_cpu_ns);
    }
    let all = named
        .iter()
        .map(|(t, c, f)| (t.as_str(), c.as_str(), f))
        .chain(std::iter::once(("rest", "rest", &rest)));
    for (tid, comm, fig) in all {
        let base = [("vm", vm), ("tid", tid), ("comm", comm)];
        f.add(
            "ppa_guest_thread_cpu_seconds_total",
            &base,
            Seconds(fig.cpu_ns),
        );
        for (k, kind) in DELAYS.iter().enumerate() {
            let labels = [base[0], base[1], base[2], ("kind", *kind)];
            f.add(
                "ppa_guest_thread_delay_seconds_total",
                &labels,
                Seconds(fig.delays_ns[k]),
            );
            f.add("ppa_guest_thread_delays_total", &labels, fig.counts[k]);
        }
    }
}
