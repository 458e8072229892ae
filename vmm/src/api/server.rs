//! The control socket and the HTTP /metrics endpoint, served by one thread (`api`) on an
//! event-manager loop with non-blocking I/O.
//!
//! Data flow: [`ApiServer::start`] binds the Unix socket (mode 0600) and the TCP listener
//! before any vCPU starts, so a bad path or a busy port is an error at start, raises the
//! descriptor limit to fit both listeners' caps, and starts the `api` thread, whose event
//! loop drives the subscriber in [`super::serve`]: accept, read, answer, write, time limits.
//! The run loop pushes events (vcpu-exit, vm-exit, ...) into the `EventHub` (`crate::event_hub`), which wakes
//! the thread through an eventfd. What a client may hold is set by [`ClientLimits`]
//! (`super::listen`): a cap per listener, a client timeout and an idle timeout, a queue per
//! client past which it gets no more answers, and a budget for all queues together; a
//! client that does not read is dropped, never waited for, and the vCPU threads never wait
//! on this thread at all. [`ListenerStats`] counts clients connected and dropped.

use std::io;
use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use event_manager::{EventManager, SubscriberOps};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::board::{run_refresher, Board};
use super::handler::Handler;
use super::listen::{raise_fd_limit, ClientLimits, ListenerStats};
use super::serve::{Serve, ServeParts};
use super::unix::bind_unix;
use super::SocketError;
use crate::event_hub::EventHub;
use crate::handle::VmHandle;

/// Descriptors the VMM wants besides its clients' (vCPUs, KVM, files, threads).
const OWN_FDS: u64 = 2048;

/// What to serve.
#[derive(Debug, Clone, Default)]
pub struct ServerOptions {
    /// Control socket path.
    pub api_sock: Option<PathBuf>,
    /// HTTP /metrics address.
    pub metrics_addr: Option<SocketAddr>,
    /// Longest reuse of a `stats` snapshot, ns.
    pub stats_max_age_ns: u64,
    /// Caps and time limits for clients.
    pub limits: ClientLimits,
}

/// A running server.
pub struct ApiServer {
    board: Arc<Board>,
    refresher: Option<JoinHandle<()>>,
    hub: Arc<EventHub>,
    stop: Arc<EventFd>,
    thread: Option<JoinHandle<()>>,
    path: Option<PathBuf>,
    metrics_addr: Option<SocketAddr>,
    stats: Arc<ListenerStats>,
}

impl ApiServer {
    /// Binds what `opts` asks for and starts the `api` thread; `None` when there is nothing
    /// to serve.
    pub fn start(
        opts: ServerOptions,
        vm: VmHandle,
        hub: Arc<EventHub>,
    ) -> Result<Option<ApiServer>, SocketError> {
        if opts.api_sock.is_none() && opts.metrics_addr.is_none() {
            return Ok(None);
        }
        let api = opts.api_sock.as_deref().map(bind_unix).transpose()?;
        let http = match opts.metrics_addr {
            None => None,
            Some(addr) => {
                let l = TcpListener::bind(addr)
                    .and_then(|l| l.set_nonblocking(true).map(|()| l))
                    .map_err(|source| SocketError::Metrics { addr, source })?;
                Some(l)
            }
        };
        let metrics_addr = http.as_ref().and_then(|l| l.local_addr().ok());
        let vm_placement = vm.placement().cloned();
        let loop_err = |e: io::Error| SocketError::EventLoop(e.to_string());
        let limits = opts.limits;
        let want = OWN_FDS + (limits.api_max_clients + limits.http_max_clients) as u64;
        match raise_fd_limit(want) {
            Ok(n) if n < want => log::warn!(
                "the descriptor limit is {n}, under the {want} that both listeners' caps and the VM may need; clients past it are refused"
            ),
            Ok(_) => {}
            Err(e) => log::warn!("cannot read or raise the descriptor limit: {e}"),
        }
        let stop = Arc::new(EventFd::new(EFD_NONBLOCK).map_err(loop_err)?);
        let board = Arc::new(Board::default());
        let stats = Arc::new(ListenerStats::default());
        let handler = Handler::with_board(vm.clone(), opts.stats_max_age_ns, Arc::clone(&board));
        // The exporter shows the listeners' counters (ppa_api_*).
        handler.metrics().attach_server(stats.exported());
        let serve = Serve::new(ServeParts {
            handler,
            api,
            http,
            hub: Arc::clone(&hub),
            stop: Arc::clone(&stop),
            limits,
            stats: Arc::clone(&stats),
        })
        .map_err(loop_err)?;
        let serve = Arc::new(Mutex::new(serve));
        let mut em: EventManager<Arc<Mutex<Serve>>> =
            EventManager::new().map_err(|e| SocketError::EventLoop(e.to_string()))?;
        em.add_subscriber(Arc::clone(&serve));
        let refresher = {
            let board = Arc::clone(&board);
            std::thread::Builder::new()
                .name("api-stats".into())
                .spawn(move || {
                    if let Some(b) = vm.placement() {
                        b.register_current("api-stats");
                    }
                    // As prompt as the api thread, which waits for its posts; its CPU is
                    // bounded by the board's budget (0.5 % of a CPU), so SCHED_FIFO is safe.
                    crate::sched::raise_realtime(
                        "stats refresher",
                        crate::sched::SERVICE_RT_PRIORITY,
                    );
                    crate::seccomp::enter(crate::seccomp::Kind::ApiStats);
                    run_refresher(
                        &board,
                        super::handler::STATS_REFRESH_NS,
                        crate::accounting::host::thread_cpu_ns,
                        || super::handler::snapshot(&vm),
                    )
                })
                .map_err(SocketError::Spawn)?
        };
        let placement = vm_placement;
        let thread = std::thread::Builder::new()
            .name("api".into())
            .spawn(move || {
                if let Some(b) = placement {
                    b.register_current("api");
                }
                serve_loop(em, &serve)
            })
            .map_err(SocketError::Spawn)?;
        Ok(Some(ApiServer {
            board,
            refresher: Some(refresher),
            hub,
            stop,
            thread: Some(thread),
            path: opts.api_sock,
            metrics_addr,
            stats,
        }))
    }

    /// The listeners' counters.
    #[cfg(test)]
    pub(crate) fn listener_stats(&self) -> &ListenerStats {
        &self.stats
    }

    /// Where events for subscribers go.
    pub fn hub(&self) -> &EventHub {
        &self.hub
    }

    /// The bound metrics address (with the real port when port 0 was asked for).
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_addr
    }

    /// Delivers queued events, closes every connection (waiting at most about 200 ms for
    /// slow readers), removes the socket file and joins the thread.
    pub fn stop(mut self) {
        let _ = self.stop.write(1);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        log::debug!("clients: {}", self.stats.summary());
        self.board.stop();
        if let Some(t) = self.refresher.take() {
            let _ = t.join();
        }
        if let Some(p) = &self.path {
            super::unix::remove_socket_file(p);
        }
    }
}

fn serve_loop(mut em: EventManager<Arc<Mutex<Serve>>>, serve: &Mutex<Serve>) {
    use crate::accounting::host::thread_cpu_ns;
    use crate::sched::{Class, RtGuard};
    // SCHED_FIFO while the thread keeps to its CPU budget (a flood of requests drops it to the
    // fair class: docs/security.md).
    let mut guard = crate::sched::raise_guarded("control socket")
        .then(|| RtGuard::new(crate::sync::now_ns(), thread_cpu_ns()));
    crate::seccomp::enter(crate::seccomp::Kind::Api);
    let mut deadline = None;
    loop {
        // While out of SCHED_FIFO, look again every window even without requests.
        let demoted = guard.is_some_and(|g| g.class() == Class::Fair);
        let timeout = if deadline.is_some() {
            10
        } else if demoted {
            (crate::sched::RT_WINDOW_NS / 1_000_000) as i32
        } else {
            -1
        };
        if let Err(e) = em.run_with_timeout(timeout) {
            log::warn!("control socket: event loop failed: {e}");
            std::thread::sleep(Duration::from_millis(10));
        }
        if let Some(g) = guard.as_mut() {
            if let Some(class) = g.check(crate::sync::now_ns(), thread_cpu_ns()) {
                match (crate::sched::set_class(class), class) {
                    (Err(e), _) => log::warn!("control socket: cannot change class: {e}"),
                    (Ok(()), Class::Fair) => log::warn!(
                        "control socket: over its CPU budget at SCHED_FIFO; nice {} until it keeps to it",
                        crate::sched::API_NICE
                    ),
                    (Ok(()), Class::Realtime) => {
                        log::info!("control socket: back to SCHED_FIFO")
                    }
                }
            }
        }
        let s = serve.lock().unwrap_or_else(|p| p.into_inner());
        if s.done() {
            return;
        }
        if s.stopping {
            let d = *deadline.get_or_insert_with(|| crate::sync::now_ns() + 200_000_000);
            if crate::sync::now_ns() >= d {
                return;
            }
        }
    }
}
