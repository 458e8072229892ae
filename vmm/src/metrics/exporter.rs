//! The rendered-metrics cache and the exporter's own figures.
//!
//! A render reads every vCPU (two clocks, a KVM statistics read and ~100 KB of histogram
//! copies each) and `/proc/self`; a scrape flood must not turn that into a core's worth of
//! CPU at the API thread's raised priority. So the [`Exporter`] renders at most once per
//! render interval ([`RENDER_INTERVAL_NS`], 100 ms) and every request inside the interval,
//! from any scraper or the `metrics` command, gets the same text: what a scraper reads is
//! never older than the interval (measured from the start of the render), and a flood costs
//! a copy of the text per request, not a render.
//!
//! Data flow: the API handler owns one exporter and calls [`Exporter::text`] per request. The
//! first request after the interval renders under the exporter's lock (requests arriving
//! meanwhile wait for that render instead of starting their own), [`collect`]ing a
//! [`Detailed`] from the VM, [`render`]ing it and appending the exporter's own families. The
//! API server may hand the exporter a [`ServerCounters`] ([`Exporter::attach_server`]) that it
//! updates as clients come and go; its families appear from then on.
//!
//! The API server's counters: its `ListenerStats` (api/listen.rs) own a [`ServerCounters`],
//! attached when the server starts, and call [`ServerCounters::connected`] when a connection
//! is registered, [`ServerCounters::closed`] when it is removed, [`ServerCounters::refused`]
//! when one is turned away (cap, uid, no descriptor) and [`ServerCounters::events_dropped`]
//! with the number of events a slow client lost.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use super::process::{ProcessReading, ThreadCpu};
use super::text::{Decl, Families, Kind, Seconds};
use super::{render, Detailed, VcpuDetail};
use crate::handle::VmHandle;
use crate::sync::now_ns;

/// Longest reuse of a rendered text.
pub const RENDER_INTERVAL_NS: u64 = 100_000_000;

/// The exporter's own families, written after [`super::FAMILIES`].
const EXPORTER_FAMILIES: &[Decl] = &[
    Decl {
        name: "ppa_metrics_requests_total",
        kind: Kind::Counter,
        help: "Metrics texts served (GET /metrics and the metrics command), from the cache or rendered.",
    },
    Decl {
        name: "ppa_metrics_renders_total",
        kind: Kind::Counter,
        help: "Metrics texts rendered; at most one per render interval.",
    },
    Decl {
        name: "ppa_metrics_render_duration_seconds",
        kind: Kind::Gauge,
        help: "How long this text took to collect and render.",
    },
    Decl {
        name: "ppa_metrics_render_interval_seconds",
        kind: Kind::Gauge,
        help: "Longest reuse of a rendered text: no scrape reads figures older than this.",
    },
    Decl {
        name: "ppa_api_clients",
        kind: Kind::Gauge,
        help: "Connections open now, by listener (socket, http).",
    },
    Decl {
        name: "ppa_api_connections_total",
        kind: Kind::Counter,
        help: "Connections accepted and served, by listener.",
    },
    Decl {
        name: "ppa_api_connections_refused_total",
        kind: Kind::Counter,
        help: "Connections turned away (too many clients, a uid that may not connect), by listener.",
    },
    Decl {
        name: "ppa_api_events_dropped_total",
        kind: Kind::Counter,
        help: "Events not delivered to subscribers that did not read fast enough.",
    },
];

/// Every family the exporter itself may write (for the docs test).
#[cfg(test)]
pub fn exporter_families() -> &'static [Decl] {
    EXPORTER_FAMILIES
}

/// Which listener a connection came through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listener {
    /// The control socket (`--api-sock`).
    Socket,
    /// The HTTP metrics endpoint (`--metrics-addr`).
    Http,
}

impl Listener {
    const ALL: [Listener; 2] = [Listener::Socket, Listener::Http];

    fn as_str(self) -> &'static str {
        match self {
            Listener::Socket => "socket",
            Listener::Http => "http",
        }
    }
}

/// Counters the API server updates and the exporter shows (`ppa_api_*`). Every method is one
/// relaxed atomic operation.
#[derive(Debug, Default)]
pub struct ServerCounters {
    clients: [AtomicU64; 2],
    accepted: [AtomicU64; 2],
    refused: [AtomicU64; 2],
    events_dropped: AtomicU64,
}

impl ServerCounters {
    /// A connection through `l` was accepted and is now served.
    pub fn connected(&self, l: Listener) {
        self.accepted[l as usize].fetch_add(1, Ordering::Relaxed);
        self.clients[l as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// A connection through `l` that [`ServerCounters::connected`] counted was closed.
    pub fn closed(&self, l: Listener) {
        let _ = self.clients[l as usize].fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
            Some(n.saturating_sub(1))
        });
    }

    /// A connection through `l` was turned away.
    pub fn refused(&self, l: Listener) {
        self.refused[l as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// `n` events were not delivered to a subscriber.
    pub fn events_dropped(&self, n: u64) {
        self.events_dropped.fetch_add(n, Ordering::Relaxed);
    }
}

/// One rendered text.
#[derive(Debug)]
pub struct Rendered {
    /// CLOCK_MONOTONIC (the exporter's clock) when the render started: every figure in the
    /// text was read after it.
    pub at_ns: u64,
    /// The exposition text.
    pub text: String,
}

/// The metrics of one VM, rendered at most once per interval (see the module doc).
pub struct Exporter {
    interval_ns: u64,
    clock: Box<dyn Fn() -> u64 + Send + Sync>,
    state: Mutex<State>,
    requests: AtomicU64,
    renders: AtomicU64,
    server: OnceLock<Arc<ServerCounters>>,
}

impl std::fmt::Debug for Exporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Exporter")
            .field("interval_ns", &self.interval_ns)
            .field("requests", &self.requests.load(Ordering::Relaxed))
            .field("renders", &self.renders.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

/// What lives between renders.
#[derive(Default)]
struct State {
    last: Option<Arc<Rendered>>,
    threads: ThreadCpu,
}

impl Default for Exporter {
    fn default() -> Self {
        Exporter::with_interval(RENDER_INTERVAL_NS)
    }
}

impl Exporter {
    /// An exporter that reuses a text for at most `interval_ns` (0: renders every request).
    pub fn with_interval(interval_ns: u64) -> Exporter {
        Exporter::with_clock(interval_ns, now_ns)
    }

    /// The same, with `clock` as its time source (nanoseconds, never decreasing).
    pub fn with_clock(interval_ns: u64, clock: impl Fn() -> u64 + Send + Sync + 'static) -> Self {
        Exporter {
            interval_ns,
            clock: Box::new(clock),
            state: Mutex::new(State::default()),
            requests: AtomicU64::new(0),
            renders: AtomicU64::new(0),
            server: OnceLock::new(),
        }
    }

    /// Shows `counters` in every text rendered from now on. Only the first call takes effect
    /// (returns false otherwise).
    pub fn attach_server(&self, counters: Arc<ServerCounters>) -> bool {
        self.server.set(counters).is_ok()
    }

    /// Texts rendered so far.
    #[cfg(test)]
    pub fn renders(&self) -> u64 {
        self.renders.load(Ordering::Relaxed)
    }

    /// The metrics of `vm`: the cached text when younger than the interval, else a new one.
    pub fn text(&self, vm: &VmHandle) -> Arc<Rendered> {
        self.serve(|threads| collect(vm, threads))
    }

    /// [`Exporter::text`] with the figures from `collect` (called only when rendering).
    pub(super) fn serve(&self, collect: impl FnOnce(&mut ThreadCpu) -> Detailed) -> Arc<Rendered> {
        let requests = self.requests.fetch_add(1, Ordering::Relaxed) + 1;
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let now = (self.clock)();
        if let Some(r) = &st.last {
            if now.saturating_sub(r.at_ns) < self.interval_ns {
                return Arc::clone(r);
            }
        }
        let detailed = collect(&mut st.threads);
        let mut text = render(&detailed);
        let seq = self.renders.fetch_add(1, Ordering::Relaxed) + 1;
        let took = (self.clock)().saturating_sub(now);
        text.push_str(&self.own_families(&detailed.vm.name, requests, seq, took));
        let r = Arc::new(Rendered { at_ns: now, text });
        st.last = Some(Arc::clone(&r));
        r
    }

    /// The exporter's own families for a text rendered in `took_ns`.
    fn own_families(&self, vm: &str, requests: u64, renders: u64, took_ns: u64) -> String {
        let mut f = Families::new(EXPORTER_FAMILIES);
        let base: [(&str, &str); 1] = [("vm", vm)];
        f.add("ppa_metrics_requests_total", &base, requests);
        f.add("ppa_metrics_renders_total", &base, renders);
        f.add(
            "ppa_metrics_render_duration_seconds",
            &base,
            Seconds(took_ns),
        );
        f.add(
            "ppa_metrics_render_interval_seconds",
            &base,
            Seconds(self.interval_ns),
        );
        if let Some(s) = self.server.get() {
            for l in Listener::ALL {
                let labels = [("vm", vm), ("listener", l.as_str())];
                let i = l as usize;
                let get = |a: &[AtomicU64; 2]| a[i].load(Ordering::Relaxed);
                f.add("ppa_api_clients", &labels, get(&s.clients));
                f.add("ppa_api_connections_total", &labels, get(&s.accepted));
                f.add(
                    "ppa_api_connections_refused_total",
                    &labels,
                    get(&s.refused),
                );
            }
            f.add(
                "ppa_api_events_dropped_total",
                &base,
                s.events_dropped.load(Ordering::Relaxed),
            );
        }
        f.render()
    }
}

/// Reads everything a render needs from `vm` and the process, now.
pub fn collect(vm: &VmHandle, threads: &mut ThreadCpu) -> Detailed {
    let vcpus = vm
        .vcpus()
        .iter()
        .map(|v| {
            let (times, hist) = v.times();
            VcpuDetail { times, hist }
        })
        .collect();
    Detailed {
        vm: vm.vm_stats(),
        vcpus,
        groups: vm.limiter().groups(),
        devices: vm.device_stats(),
        process: Some(ProcessReading::read(threads)),
        pressure_groups: vm.pressure().report().groups,
        guest: vm.ppa_page().map(|p| super::guest::Guest {
            view: p.guest_view(),
            threads: p.board().metrics_threads(),
            vcpus: vm.vcpu_count(),
        }),
    }
}
