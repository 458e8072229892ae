//! What the control socket and the HTTP endpoint let clients hold: connection caps per
//! listener, time limits, the output budget, and the counters of what happened to clients.
//!
//! Data flow: [`ClientLimits`] comes from the command line (`--client-timeout`,
//! `--idle-timeout`) through `ServerOptions` to the `api` thread, which applies it at accept
//! time, on every read and write, and in a sweep every [`ClientLimits::sweep_every`]. The
//! thread counts what it does in a [`ListenerStats`] (atomics) that any thread may read:
//! clients connected and accepted per [`Listener`], and clients dropped per [`DropReason`].
//! [`FdReserve`] keeps one descriptor in hand so that a full descriptor table cannot make the
//! accept loop spin, and [`raise_fd_limit`] makes room for both caps at start.

use std::fs::File;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::metrics::{self, ServerCounters};

/// Connections the control socket serves at once (from its owner or root; other uids are
/// refused before they count). When it is full, a new connection closes the longest-idle
/// one of its own uid, so that the owner always gets in.
pub const API_MAX_CLIENTS: usize = 256;
/// Connections the HTTP /metrics endpoint serves at once. When it is full, a new connection
/// evicts the oldest one that has not sent its whole request head yet.
pub const HTTP_MAX_CLIENTS: usize = 64;
/// A client's queued output past which the server answers no more of its requests until the
/// client has read some.
pub const CLIENT_OUT_PAUSE: usize = 64 << 10;
/// Bytes queued for one client past which its events are dropped.
pub const EVENT_QUEUE_BYTES: usize = 256 << 10;
/// Output queued for all clients together past which the clients holding the most are
/// dropped, largest first.
pub const OUT_BUDGET: usize = 32 << 20;
/// Requests answered for one client in one turn, at most.
pub const REQUESTS_PER_TURN: usize = 16;
/// Time one client's turn may take: no new request is begun past it (one is always).
pub const TURN_NS: u64 = 200_000;
/// Time the turns of waiting clients may take before the event loop looks at its other
/// descriptors (new clients, new requests) again.
pub const ROUND_NS: u64 = 2_000_000;
/// State-changing requests (`reset`, `set-level`, `set-thresholds`, `set-limit`, `pause`,
/// `resume`, `shutdown`) one client may make per second, sustained: a storm of them took the
/// guests' CPU (issue 28: 1.27 M pause/resume in seconds halved the VM's throughput).
pub const CHANGES_PER_SEC: u64 = 20;
/// How many of them one client may make at once before [`CHANGES_PER_SEC`] applies.
pub const CHANGE_BURST: u64 = 20;
/// Share of one CPU the `api` thread may spend on one client's requests, sustained, in per
/// mille: past it (and its burst) the client's socket is neither read nor answered until its
/// share is back, so that one client's storm of requests, whatever they are, takes at most
/// this much CPU from the guests (issue 28).
pub const CLIENT_WORK_PER_MILLE: u64 = 50;
/// Work one client may have done at once before [`CLIENT_WORK_PER_MILLE`] applies, ns.
pub const CLIENT_WORK_BURST_NS: u64 = 50_000_000;
/// Default of `--client-timeout`.
pub const DEFAULT_CLIENT_TIMEOUT: Duration = Duration::from_secs(10);
/// Default of `--idle-timeout`.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(300);

/// The caps and time limits the server applies to its clients.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientLimits {
    /// Control connections at once.
    pub api_max_clients: usize,
    /// HTTP connections at once.
    pub http_max_clients: usize,
    /// How long a request may take to arrive once begun (an HTTP connection: its whole head
    /// from connect), and how long a client with answers waiting may go without taking any.
    pub client_timeout: Duration,
    /// How long a control connection with nothing in flight and no subscription may stay
    /// silent; `None`: forever.
    pub idle_timeout: Option<Duration>,
    /// Output queued for all clients together past which the clients holding the most are
    /// dropped ([`OUT_BUDGET`]).
    pub out_budget: usize,
}

impl Default for ClientLimits {
    fn default() -> Self {
        ClientLimits {
            api_max_clients: API_MAX_CLIENTS,
            http_max_clients: HTTP_MAX_CLIENTS,
            client_timeout: DEFAULT_CLIENT_TIMEOUT,
            idle_timeout: Some(DEFAULT_IDLE_TIMEOUT),
            out_budget: OUT_BUDGET,
        }
    }
}

impl ClientLimits {
    /// How often the server looks for clients past a time limit: a quarter of the shortest
    /// limit, between 50 ms and 1 s.
    pub fn sweep_every(&self) -> Duration {
        let shortest = self
            .idle_timeout
            .map_or(self.client_timeout, |i| i.min(self.client_timeout));
        (shortest / 4).clamp(Duration::from_millis(50), Duration::from_secs(1))
    }
}

/// One client's budget of state-changing requests: [`CHANGES_PER_SEC`] a second with bursts
/// of [`CHANGE_BURST`] (a generic cell rate algorithm: `tat` is when the budget is whole
/// again).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ChangeBudget {
    tat: u64,
}

impl ChangeBudget {
    /// Time between two requests at the sustained rate.
    const INTERVAL_NS: u64 = 1_000_000_000 / CHANGES_PER_SEC;

    /// Takes one request's share at `now` (ns): `Ok` when it fits, else how long until one
    /// would.
    pub fn take(&mut self, now: u64) -> Result<(), Duration> {
        let tat = self.tat.max(now);
        let tolerance = (CHANGE_BURST - 1) * Self::INTERVAL_NS;
        if tat - now > tolerance {
            return Err(Duration::from_nanos(tat - now - tolerance));
        }
        self.tat = tat + Self::INTERVAL_NS;
        Ok(())
    }
}

/// One client's share of the `api` thread's time ([`CLIENT_WORK_PER_MILLE`], bursts of
/// [`CLIENT_WORK_BURST_NS`]): each answer's time is charged, and a client past its share
/// rests until [`WorkBudget::rest_until`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WorkBudget {
    tat: u64,
}

impl WorkBudget {
    /// How far ahead of now the budget may run before the client rests.
    const TOLERANCE_NS: u64 = CLIENT_WORK_BURST_NS * 1000 / CLIENT_WORK_PER_MILLE;

    /// Charges `work_ns` of the thread's time done at `now`.
    pub fn charge(&mut self, now: u64, work_ns: u64) {
        self.tat = self.tat.max(now) + work_ns.saturating_mul(1000 / CLIENT_WORK_PER_MILLE);
    }

    /// Until when the client rests (`None`: it may be answered at `now`).
    pub fn rest_until(&self, now: u64) -> Option<u64> {
        let until = self.tat.saturating_sub(Self::TOLERANCE_NS);
        (until > now).then_some(until)
    }
}

indexed_enum! {
    /// The two listeners; `name()` is the label value.
    pub enum Listener {
        /// The control socket.
        Api = "api",
        /// The HTTP /metrics endpoint.
        Http = "http",
    }
}

indexed_enum! {
    /// Why the server closed a client's connection (or refused it) on its own; `name()` is
    /// the label value.
    pub enum DropReason {
        /// The listener was at its cap: a control client got `too-many-clients`, an HTTP
        /// client `503` (only when no connection could be evicted).
        Full = "full",
        /// The peer's uid may not use the control socket.
        Permission = "permission",
        /// Closed to make room for a new connection: on the HTTP side one that had not sent
        /// its whole request head; on the control socket the new peer's own connection (same
        /// uid; root: any) that was quiet longest, else the one whose last request is oldest.
        Evicted = "evicted",
        /// A request begun and not finished within the client timeout (slowloris).
        HeaderTimeout = "header_timeout",
        /// A control connection silent for the idle timeout.
        Idle = "idle",
        /// Answers waited for the client timeout without the client taking any.
        Stalled = "stalled",
        /// All clients' queued output passed [`OUT_BUDGET`], and this client held the most.
        OutputBudget = "output_budget",
        /// The process had no descriptor left to accept the connection with.
        NoFds = "no_fds",
    }
}

/// Counters of the listeners, written by the `api` thread and readable from any thread. What
/// they count is passed on to the [`ServerCounters`] the metrics exporter shows (`ppa_api_*`):
/// clients connected and accepted, clients refused (cap, uid, no descriptor) and events
/// dropped.
#[derive(Debug, Default)]
pub struct ListenerStats {
    connected: [AtomicU64; Listener::COUNT],
    accepted: [AtomicU64; Listener::COUNT],
    dropped: [[AtomicU64; DropReason::COUNT]; Listener::COUNT],
    queued_bytes: AtomicU64,
    /// Times a client was past its share of the thread and rested.
    rests: AtomicU64,
    exported: Arc<ServerCounters>,
}

impl ListenerStats {
    /// Clients connected now.
    pub fn connected(&self, l: Listener) -> u64 {
        self.connected[l.index()].load(Ordering::Relaxed)
    }

    /// Clients accepted and served since start (refused ones are not counted).
    pub fn accepted(&self, l: Listener) -> u64 {
        self.accepted[l.index()].load(Ordering::Relaxed)
    }

    /// Clients the server refused or closed for `reason` since start.
    pub fn dropped(&self, l: Listener, reason: DropReason) -> u64 {
        self.dropped[l.index()][reason.index()].load(Ordering::Relaxed)
    }

    /// Times a control client went past its share of the `api` thread ([`WorkBudget`]) and
    /// rested, since start.
    pub fn rests(&self) -> u64 {
        self.rests.load(Ordering::Relaxed)
    }

    pub(super) fn on_rest(&self) {
        self.rests.fetch_add(1, Ordering::Relaxed);
    }

    /// Output bytes queued for all clients now (not yet taken by their sockets).
    pub fn queued_bytes(&self) -> u64 {
        self.queued_bytes.load(Ordering::Relaxed)
    }

    /// One line for the log: per listener, clients connected, accepted and dropped by
    /// reason, and the output queued.
    pub fn summary(&self) -> String {
        let mut parts = Vec::new();
        for l in Listener::ALL {
            let drops: Vec<String> = DropReason::ALL
                .iter()
                .filter(|&&r| self.dropped(l, r) > 0)
                .map(|&r| format!("{} {}", r.name(), self.dropped(l, r)))
                .collect();
            parts.push(format!(
                "{}: {} connected, {} accepted, dropped: {}",
                l.name(),
                self.connected(l),
                self.accepted(l),
                if drops.is_empty() {
                    "none".to_string()
                } else {
                    drops.join(", ")
                }
            ));
        }
        format!(
            "{}; {} bytes queued; {} rests",
            parts.join("; "),
            self.queued_bytes(),
            self.rests()
        )
    }

    /// The exporter's view of these counters, to hand to `Exporter::attach_server`.
    pub fn exported(&self) -> Arc<ServerCounters> {
        Arc::clone(&self.exported)
    }

    pub(super) fn on_accept(&self, l: Listener) {
        self.accepted[l.index()].fetch_add(1, Ordering::Relaxed);
        self.connected[l.index()].fetch_add(1, Ordering::Relaxed);
        self.exported.connected(l.exported());
    }

    pub(super) fn on_close(&self, l: Listener) {
        self.connected[l.index()].fetch_sub(1, Ordering::Relaxed);
        self.exported.closed(l.exported());
    }

    pub(super) fn on_drop(&self, l: Listener, reason: DropReason) {
        self.dropped[l.index()][reason.index()].fetch_add(1, Ordering::Relaxed);
        // Turned away before being served; the others were connected and are closed.
        if matches!(
            reason,
            DropReason::Full | DropReason::Permission | DropReason::NoFds
        ) {
            self.exported.refused(l.exported());
        }
    }

    pub(super) fn on_events_dropped(&self, n: u64) {
        self.exported.events_dropped(n);
    }

    pub(super) fn set_queued(&self, bytes: usize) {
        self.queued_bytes.store(bytes as u64, Ordering::Relaxed);
    }
}

impl Listener {
    /// The exporter's name for this listener (its `listener` label).
    fn exported(self) -> metrics::Listener {
        match self {
            Listener::Api => metrics::Listener::Socket,
            Listener::Http => metrics::Listener::Http,
        }
    }
}

/// One spare descriptor: given back when accept fails for want of descriptors, so the pending
/// connection can be accepted and closed instead of staying in the backlog, where epoll
/// would report it again at once, forever.
#[derive(Debug)]
pub struct FdReserve(Option<File>);

impl FdReserve {
    /// Opens the spare descriptor (/dev/null).
    pub fn new() -> io::Result<Self> {
        Ok(FdReserve(Some(File::open("/dev/null")?)))
    }

    /// Runs `f` with the spare descriptor closed, then takes it back.
    pub fn released<R>(&mut self, f: impl FnOnce() -> R) -> R {
        self.0 = None;
        let r = f();
        self.0 = File::open("/dev/null").ok();
        r
    }

    /// Whether `e` says the process or the system is out of descriptors.
    pub fn is_exhaustion(e: &io::Error) -> bool {
        matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE))
    }
}

/// Raises the soft limit on open descriptors to at least `want` (up to the hard limit), so
/// that both listeners' caps fit beside the VM's own descriptors; returns the soft limit now
/// in force.
pub fn raise_fd_limit(want: u64) -> io::Result<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid, writable rlimit.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Err(io::Error::last_os_error());
    }
    if lim.rlim_cur >= want || lim.rlim_cur >= lim.rlim_max {
        return Ok(lim.rlim_cur);
    }
    lim.rlim_cur = want.min(lim.rlim_max);
    // SAFETY: `lim` is a valid rlimit whose soft value does not exceed its hard value.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(lim.rlim_cur)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sweep_is_a_quarter_of_the_shortest_limit_within_bounds() {
        let mut l = ClientLimits::default();
        assert_eq!(l.sweep_every(), Duration::from_secs(1));
        l.client_timeout = Duration::from_secs(2);
        assert_eq!(l.sweep_every(), Duration::from_millis(500));
        l.idle_timeout = Some(Duration::from_millis(400));
        assert_eq!(l.sweep_every(), Duration::from_millis(100));
        l.idle_timeout = Some(Duration::from_millis(10));
        assert_eq!(l.sweep_every(), Duration::from_millis(50));
        l.idle_timeout = None;
        assert_eq!(l.sweep_every(), Duration::from_millis(500));
    }

    #[test]
    fn counters_are_kept_per_listener_and_reason() {
        let s = ListenerStats::default();
        s.on_accept(Listener::Http);
        s.on_accept(Listener::Http);
        s.on_close(Listener::Http);
        s.on_drop(Listener::Http, DropReason::Evicted);
        s.on_drop(Listener::Api, DropReason::Stalled);
        assert_eq!(s.connected(Listener::Http), 1);
        assert_eq!(s.accepted(Listener::Http), 2);
        assert_eq!(s.connected(Listener::Api), 0);
        assert_eq!(s.dropped(Listener::Http, DropReason::Evicted), 1);
        assert_eq!(s.dropped(Listener::Api, DropReason::Evicted), 0);
        assert_eq!(s.dropped(Listener::Api, DropReason::Stalled), 1);
        assert_eq!(
            s.summary(),
            "api: 0 connected, 0 accepted, dropped: stalled 1; \
             http: 1 connected, 2 accepted, dropped: evicted 1; 0 bytes queued; 0 rests"
        );
        assert!(DropReason::ALL
            .iter()
            .all(|r| r.name().chars().all(|c| c.is_ascii_lowercase() || c == '_')));
    }

    #[test]
    fn the_change_budget_takes_a_burst_then_the_rate() {
        let mut b = ChangeBudget::default();
        let t0 = 1_000_000_000_000;
        for i in 0..CHANGE_BURST {
            assert_eq!(b.take(t0), Ok(()), "request {i} of the burst");
        }
        let wait = b.take(t0).unwrap_err();
        assert_eq!(wait, Duration::from_nanos(ChangeBudget::INTERVAL_NS));
        assert!(b.take(t0 + ChangeBudget::INTERVAL_NS - 1).is_err());
        assert_eq!(b.take(t0 + ChangeBudget::INTERVAL_NS), Ok(()));
        // A second later, a second's worth more.
        let t1 = t0 + 2_000_000_000;
        let taken = (0..100).filter(|_| b.take(t1).is_ok()).count() as u64;
        assert_eq!(taken, CHANGE_BURST);
    }

    #[test]
    fn the_work_budget_is_a_share_of_a_cpu_with_a_burst() {
        let mut b = WorkBudget::default();
        let t0 = 1_000_000_000_000;
        // The burst: 50 ms of work at once.
        b.charge(t0, CLIENT_WORK_BURST_NS);
        assert_eq!(b.rest_until(t0), None);
        b.charge(t0, 1_000_000);
        // 1 ms more is 20 ms of rest at a 5 % share.
        assert_eq!(b.rest_until(t0), Some(t0 + 20_000_000));
        assert_eq!(b.rest_until(t0 + 20_000_000), None);
        // A client within its share never rests: 1 ms of work every 20 ms.
        let mut b = WorkBudget::default();
        for i in 0..1000 {
            let now = t0 + i * 20_000_000;
            assert_eq!(b.rest_until(now), None, "step {i}");
            b.charge(now, 1_000_000);
        }
    }

    #[test]
    fn the_fd_limit_only_goes_up() {
        let before = raise_fd_limit(0).unwrap();
        assert_eq!(
            raise_fd_limit(16).unwrap(),
            before,
            "a lower wish changes nothing"
        );
        let after = raise_fd_limit(before + 1).unwrap();
        assert!(after >= before);
    }

    #[test]
    fn the_reserve_is_taken_back() {
        let mut r = FdReserve::new().unwrap();
        let fd =
            r.released(|| File::open("/dev/null").map(|f| std::os::fd::AsRawFd::as_raw_fd(&f)));
        assert!(fd.is_ok());
        assert!(r.0.is_some());
        assert!(FdReserve::is_exhaustion(&io::Error::from_raw_os_error(
            libc::EMFILE
        )));
        assert!(!FdReserve::is_exhaustion(&io::Error::from_raw_os_error(
            libc::EAGAIN
        )));
    }
}
