//! The control socket and the HTTP /metrics endpoint, served by one thread (`api`) on an
//! event-manager loop with non-blocking I/O.
//!
//! Data flow: [`ApiServer::start`] binds the Unix socket (mode 0600) and the TCP listener
//! before any vCPU starts, so a bad path or a busy port is an error at start. The `api`
//! thread then waits in epoll on: the listeners (accept, check the peer's uid with
//! SO_PEERCRED, register the connection), each connection (read → [`LineBuffer`] → complete
//! lines → [`Handler`] → [`OutQueue`] → write as the socket allows), the [`EventHub`]'s
//! eventfd (events the run loop pushed: vcpu-exit, vm-exit), a 10 ms timer that turns growth
//! of the threshold counters into threshold events while someone subscribes to them, and a
//! stop eventfd. A client that does not read stops being read from once its queue holds
//! [`OUT_HIGH_WATER`] bytes, and loses events beyond [`EVENT_QUEUE_BYTES`]; nothing it does
//! blocks the thread, and the vCPU threads never wait on this thread at all.

use std::collections::{HashMap, VecDeque};
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use event_manager::{EventManager, EventOps, EventSet, Events, MutEventSubscriber, SubscriberOps};
use ppa_vmm_api::{ErrorBody, ErrorKind, Event, EventKind, Response, MAX_REQUEST_BYTES};
use thiserror::Error;
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};
use vmm_sys_util::timerfd::TimerFd;

use super::board::{run_refresher, Board};
use super::conn::{LineBuffer, Next, OutQueue};
use super::handler::{kind_bit, Handler, Outcome};
use super::http::{http_head_complete, http_reply, http_response, MAX_HTTP_HEAD};
use super::unix::{bind_unix, peer_uid};
use crate::accounting::meter::Counter;
use crate::accounting::{PerThreshold, Threshold};
use crate::handle::VmHandle;

/// Bytes queued for one client past which the server stops reading its requests.
pub const OUT_HIGH_WATER: usize = 4 << 20;
/// Bytes queued for one client past which its events are dropped.
pub const EVENT_QUEUE_BYTES: usize = 256 << 10;
/// Connections served at once (API and HTTP together); more are told so and closed.
pub const MAX_CLIENTS: usize = 1024;

/// Why the server could not start.
#[derive(Debug, Error)]
pub enum SocketError {
    /// The path exists and is not a socket.
    #[error("{0} exists and is not a socket; remove it or choose another path")]
    NotASocket(PathBuf),
    /// Another process serves the path.
    #[error("another process already serves {0}")]
    InUse(PathBuf),
    /// The path is too long for a Unix socket address.
    #[error("the socket path {0} is longer than a Unix socket address allows (107 bytes)")]
    PathTooLong(PathBuf),
    /// Binding the Unix socket failed.
    #[error("cannot serve the control socket at {path}")]
    Bind {
        /// The path.
        path: PathBuf,
        /// Cause.
        #[source]
        source: io::Error,
    },
    /// Binding the metrics address failed.
    #[error("cannot serve metrics on {addr}")]
    Metrics {
        /// The address.
        addr: SocketAddr,
        /// Cause.
        #[source]
        source: io::Error,
    },
    /// The event loop could not be set up.
    #[error("cannot set up the control socket's event loop: {0}")]
    EventLoop(String),
    /// The thread could not be started.
    #[error("cannot start the control socket thread")]
    Spawn(#[source] io::Error),
}

/// What to serve.
#[derive(Debug, Clone, Default)]
pub struct ServerOptions {
    /// Control socket path.
    pub api_sock: Option<PathBuf>,
    /// HTTP /metrics address.
    pub metrics_addr: Option<SocketAddr>,
    /// Longest reuse of a `stats` snapshot, ns.
    pub stats_max_age_ns: u64,
}

/// Events pushed by other threads (the run loop) for the server to stream.
#[derive(Debug)]
pub struct EventHub {
    queue: Mutex<VecDeque<Event>>,
    efd: EventFd,
}

impl EventHub {
    /// An empty hub.
    pub fn new() -> io::Result<Self> {
        Ok(EventHub {
            queue: Mutex::new(VecDeque::new()),
            efd: EventFd::new(EFD_NONBLOCK)?,
        })
    }

    /// Queues an event for every subscriber (never blocks on a client).
    pub fn push(&self, e: Event) {
        let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        if q.len() < 65_536 {
            q.push_back(e);
        }
        drop(q);
        let _ = self.efd.write(1);
    }

    fn drain(&self) -> Vec<Event> {
        let _ = self.efd.read();
        let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        q.drain(..).collect()
    }
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
}

const TOKEN_API: u32 = 0;
const TOKEN_HTTP: u32 = 1;
const TOKEN_HUB: u32 = 2;
const TOKEN_TIMER: u32 = 3;
const TOKEN_STOP: u32 = 4;
const FIRST_CONN: u32 = 16;

enum Stream {
    Api(UnixStream),
    Http(TcpStream),
}

impl Stream {
    fn fd(&self) -> RawFd {
        match self {
            Stream::Api(s) => s.as_raw_fd(),
            Stream::Http(s) => s.as_raw_fd(),
        }
    }

    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Api(s) => s.read(buf),
            Stream::Http(s) => s.read(buf),
        }
    }

    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Api(s) => s.write(buf),
            Stream::Http(s) => s.write(buf),
        }
    }
}

struct Conn {
    stream: Stream,
    input: LineBuffer,
    out: OutQueue,
    /// Subscribed event kinds (bit per kind).
    mask: u8,
    /// Close once `out` is written.
    closing: bool,
    /// The interest currently registered.
    interest: EventSet,
}

/// The subscriber the event loop drives.
struct Serve {
    handler: Handler,
    api: Option<UnixListener>,
    http: Option<TcpListener>,
    hub: Arc<EventHub>,
    stop: Arc<EventFd>,
    timer: TimerFd,
    timer_armed: bool,
    conns: HashMap<u32, Conn>,
    next_token: u32,
    uid: u32,
    /// Threshold counters at the last check, per vCPU.
    seen: Vec<PerThreshold<u64>>,
    stopping: bool,
}

fn read_chunk(stream: &mut Stream, scratch: &mut [u8]) -> io::Result<usize> {
    loop {
        match stream.read(scratch) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            r => return r,
        }
    }
}

impl Serve {
    fn token(&mut self) -> u32 {
        loop {
            let t = self.next_token;
            self.next_token = self.next_token.checked_add(1).unwrap_or(FIRST_CONN);
            if t >= FIRST_CONN && !self.conns.contains_key(&t) {
                return t;
            }
        }
    }

    fn accept_api(&mut self, ops: &mut EventOps) {
        let Some(listener) = &self.api else { return };
        // Accept what is pending now; epoll reports the rest.
        let mut accepted = Vec::new();
        for _ in 0..64 {
            match listener.accept() {
                Ok((s, _)) => accepted.push(s),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => {
                    log::warn!("control socket: accept failed: {e}");
                    break;
                }
            }
        }
        for stream in accepted {
            if stream.set_nonblocking(true).is_err() {
                continue;
            }
            let refuse = match peer_uid(&stream) {
                Ok(uid) if uid == self.uid || uid == 0 => None,
                Ok(uid) => Some(ErrorBody::new(
                    ErrorKind::PermissionDenied,
                    match self.uid {
                        0 => format!("uid {uid} may not use this socket (only root may)"),
                        own => format!(
                            "uid {uid} may not use this socket (only uid {own} and root may)"
                        ),
                    },
                )),
                Err(e) => Some(ErrorBody::new(
                    ErrorKind::PermissionDenied,
                    format!("the peer's credentials cannot be read: {e}"),
                )),
            };
            let refuse = refuse.or_else(|| {
                (self.conns.len() >= MAX_CLIENTS).then(|| {
                    ErrorBody::new(
                        ErrorKind::TooManyClients,
                        format!("the server already has {MAX_CLIENTS} clients"),
                    )
                })
            });
            if let Some(e) = refuse {
                let mut s = stream;
                let _ = s.write(
                    Response::err(serde_json::Value::Null, e)
                        .to_line()
                        .as_bytes(),
                );
                continue;
            }
            self.register(Stream::Api(stream), ops);
        }
    }

    fn accept_http(&mut self, ops: &mut EventOps) {
        let Some(listener) = &self.http else { return };
        let mut accepted = Vec::new();
        for _ in 0..64 {
            match listener.accept() {
                Ok((s, _)) => accepted.push(s),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => {
                    log::warn!("metrics endpoint: accept failed: {e}");
                    break;
                }
            }
        }
        for stream in accepted {
            if stream.set_nonblocking(true).is_err() || self.conns.len() >= MAX_CLIENTS {
                continue;
            }
            self.register(Stream::Http(stream), ops);
        }
    }

    fn register(&mut self, stream: Stream, ops: &mut EventOps) {
        let token = self.token();
        let interest = EventSet::IN | EventSet::READ_HANG_UP;
        if let Err(e) = ops.add(Events::with_data_raw(stream.fd(), token, interest)) {
            log::warn!("control socket: cannot watch a connection: {e}");
            return;
        }
        self.conns.insert(
            token,
            Conn {
                stream,
                input: LineBuffer::default(),
                out: OutQueue::default(),
                mask: 0,
                closing: false,
                interest,
            },
        );
    }

    fn close(&mut self, token: u32, ops: &mut EventOps) {
        if let Some(c) = self.conns.remove(&token) {
            let _ = ops.remove(Events::empty_raw(c.stream.fd()));
        }
    }

    /// Reads what the client sent and answers every complete request.
    fn on_readable(&mut self, token: u32, ops: &mut EventOps) {
        let mut scratch = [0u8; 16 * 1024];
        let Some(conn) = self.conns.get_mut(&token) else {
            return;
        };
        let mut eof = false;
        // Bounded work per wake-up: epoll reports the rest again.
        for _ in 0..8 {
            if conn.out.len() > OUT_HIGH_WATER {
                break;
            }
            match read_chunk(&mut conn.stream, &mut scratch) {
                Ok(0) => {
                    eof = true;
                    break;
                }
                Ok(n) => conn.input.push(&scratch[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(_) => {
                    eof = true;
                    break;
                }
            }
            if matches!(conn.stream, Stream::Http(_)) {
                break;
            }
        }
        self.process_input(token);
        if eof {
            if let Some(c) = self.conns.get_mut(&token) {
                c.closing = true;
            }
        }
        self.flush(token, ops);
    }

    /// Answers the complete lines a connection holds, while its output queue has room.
    fn process_input(&mut self, token: u32) {
        let Some(conn) = self.conns.get_mut(&token) else {
            return;
        };
        if let Stream::Http(_) = conn.stream {
            let head = conn.input.len();
            let complete = http_head_complete(&mut conn.input);
            match complete {
                Some(target) => {
                    let reply = http_reply(&target, &mut self.handler);
                    conn.out.push_response(&reply);
                    conn.closing = true;
                }
                None if head > MAX_HTTP_HEAD => {
                    conn.out.push_response(&http_response(
                        "431 Request Header Fields Too Large",
                        "text/plain",
                        "request too large\n",
                    ));
                    conn.closing = true;
                }
                None => {}
            }
            return;
        }
        while conn.out.len() <= OUT_HIGH_WATER {
            let line = match conn.input.next_line(MAX_REQUEST_BYTES) {
                Next::Pending => break,
                Next::TooLong(n) => {
                    let e = ErrorBody::new(
                        ErrorKind::TooLong,
                        format!(
                            "the request is over {MAX_REQUEST_BYTES} bytes ({n} so far without a newline); it is skipped up to its newline"
                        ),
                    );
                    conn.out
                        .push_response(&Response::err(serde_json::Value::Null, e).to_line());
                    continue;
                }
                Next::Line(l) => l,
            };
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            match self.handler.handle_line(&line) {
                Outcome::Reply(r) => conn.out.push_response(&r),
                Outcome::Subscribe(r, mask) => {
                    conn.out.push_response(&r);
                    conn.mask |= mask;
                    if mask & kind_bit(EventKind::Threshold) != 0 && !self.timer_armed {
                        let every = Duration::from_millis(10);
                        self.timer_armed = self.timer.reset(every, Some(every)).is_ok();
                    }
                }
            }
        }
    }

    /// Writes what the socket accepts; watches for writability while bytes remain.
    fn flush(&mut self, token: u32, ops: &mut EventOps) {
        let Some(conn) = self.conns.get_mut(&token) else {
            return;
        };
        let mut broken = false;
        while !conn.out.is_empty() {
            match conn.stream.write(conn.out.pending()) {
                Ok(0) => {
                    broken = true;
                    break;
                }
                Ok(n) => conn.out.consume(n),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(_) => {
                    broken = true;
                    break;
                }
            }
        }
        if broken || (conn.closing && conn.out.is_empty()) {
            self.close(token, ops);
            return;
        }
        let mut want = EventSet::READ_HANG_UP;
        if !conn.closing && conn.out.len() <= OUT_HIGH_WATER {
            want |= EventSet::IN;
        }
        if !conn.out.is_empty() {
            want |= EventSet::OUT;
        }
        if want != conn.interest {
            conn.interest = want;
            let fd = conn.stream.fd();
            let _ = ops.modify(Events::with_data_raw(fd, token, want));
        }
    }

    fn on_writable(&mut self, token: u32, ops: &mut EventOps) {
        self.flush(token, ops);
        // Room again: answer requests that waited in the input buffer.
        if self.conns.get(&token).is_some_and(|c| !c.input.is_empty()) {
            self.process_input(token);
            self.flush(token, ops);
        }
    }

    fn broadcast(&mut self, events: &[Event], ops: &mut EventOps) {
        if events.is_empty() {
            return;
        }
        let tokens: Vec<u32> = self
            .conns
            .iter()
            .filter(|(_, c)| c.mask != 0)
            .map(|(t, _)| *t)
            .collect();
        let lines: Vec<(u8, String)> = events
            .iter()
            .map(|e| (e.kind().map_or(0xff, kind_bit), e.to_line()))
            .collect();
        for t in tokens {
            if let Some(c) = self.conns.get_mut(&t) {
                for (bit, line) in &lines {
                    if c.mask & bit != 0 {
                        c.out.push_event(line, EVENT_QUEUE_BYTES);
                    }
                }
            }
            self.flush(t, ops);
        }
    }

    /// Turns growth of the threshold counters into events.
    fn check_thresholds(&mut self, ops: &mut EventOps) {
        let _ = self.timer.wait();
        let vm = self.handler.vm().clone();
        let limits = vm.thresholds();
        let uptime_ns = vm.uptime_ns();
        self.seen.resize(vm.vcpu_count(), PerThreshold::default());
        let mut events = Vec::new();
        for (v, seen) in vm.vcpus().iter().zip(self.seen.iter_mut()) {
            let now = v.acct.meter.exceeded.map(Counter::get);
            for t in Threshold::ALL {
                if now[t] > seen[t] {
                    events.push(Event::Threshold {
                        uptime_ns,
                        vcpu: v.id,
                        name: t,
                        threshold_ns: t.of(&limits),
                        count: now[t] - seen[t],
                        total: now[t],
                    });
                }
            }
            *seen = now;
        }
        self.broadcast(&events, ops);
    }

    fn on_stop(&mut self, ops: &mut EventOps) {
        let _ = self.stop.read();
        let events = self.hub.drain();
        self.broadcast(&events, ops);
        self.stopping = true;
        for t in self.conns.keys().copied().collect::<Vec<_>>() {
            if let Some(c) = self.conns.get_mut(&t) {
                c.closing = true;
            }
            self.flush(t, ops);
        }
    }

    /// Whether the thread may exit: stopping, and nothing left to write.
    fn done(&self) -> bool {
        self.stopping && self.conns.is_empty()
    }
}

impl MutEventSubscriber for Serve {
    fn process(&mut self, events: Events, ops: &mut EventOps) {
        let set = events.event_set();
        match events.data() {
            TOKEN_API => self.accept_api(ops),
            TOKEN_HTTP => self.accept_http(ops),
            TOKEN_HUB => {
                let evs = self.hub.drain();
                self.broadcast(&evs, ops);
            }
            TOKEN_TIMER => self.check_thresholds(ops),
            TOKEN_STOP => self.on_stop(ops),
            token => {
                if set.contains(EventSet::ERROR) || set.contains(EventSet::HANG_UP) {
                    self.close(token, ops);
                    return;
                }
                if set.contains(EventSet::OUT) {
                    self.on_writable(token, ops);
                }
                if set.intersects(EventSet::IN | EventSet::READ_HANG_UP) {
                    self.on_readable(token, ops);
                }
            }
        }
    }

    fn init(&mut self, ops: &mut EventOps) {
        let mut add = |fd: RawFd, token: u32| {
            if let Err(e) = ops.add(Events::with_data_raw(fd, token, EventSet::IN)) {
                log::warn!("control socket: cannot watch fd {fd}: {e}");
            }
        };
        if let Some(l) = &self.api {
            add(l.as_raw_fd(), TOKEN_API);
        }
        if let Some(l) = &self.http {
            add(l.as_raw_fd(), TOKEN_HTTP);
        }
        add(self.hub.efd.as_raw_fd(), TOKEN_HUB);
        add(self.timer.as_raw_fd(), TOKEN_TIMER);
        add(self.stop.as_raw_fd(), TOKEN_STOP);
    }
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
        let loop_err = |e: io::Error| SocketError::EventLoop(e.to_string());
        let stop = Arc::new(EventFd::new(EFD_NONBLOCK).map_err(loop_err)?);
        let timer = TimerFd::new().map_err(|e| SocketError::EventLoop(e.to_string()))?;
        // SAFETY: getuid has no preconditions.
        let uid = unsafe { libc::getuid() };
        let board = Arc::new(Board::default());
        let refresher = {
            let (board, vm) = (Arc::clone(&board), vm.clone());
            std::thread::Builder::new()
                .name("api-stats".into())
                .spawn(move || {
                    // As prompt as the api thread, which waits for its posts.
                    crate::sched::raise_priority(crate::sched::API_NICE, "stats refresher");
                    run_refresher(&board, super::handler::STATS_REFRESH_NS, || {
                        super::handler::snapshot(&vm)
                    })
                })
                .map_err(SocketError::Spawn)?
        };
        let serve = Arc::new(Mutex::new(Serve {
            handler: Handler::with_board(vm, opts.stats_max_age_ns, Arc::clone(&board)),
            api,
            http,
            hub: Arc::clone(&hub),
            stop: Arc::clone(&stop),
            timer,
            timer_armed: false,
            conns: HashMap::new(),
            next_token: FIRST_CONN,
            uid,
            seen: Vec::new(),
            stopping: false,
        }));
        let mut em: EventManager<Arc<Mutex<Serve>>> =
            EventManager::new().map_err(|e| SocketError::EventLoop(e.to_string()))?;
        em.add_subscriber(Arc::clone(&serve));
        let thread = std::thread::Builder::new()
            .name("api".into())
            .spawn(move || serve_loop(em, &serve))
            .map_err(SocketError::Spawn)?;
        Ok(Some(ApiServer {
            board,
            refresher: Some(refresher),
            hub,
            stop,
            thread: Some(thread),
            path: opts.api_sock,
            metrics_addr,
        }))
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
    crate::sched::raise_priority(crate::sched::API_NICE, "control socket");
    let mut deadline = None;
    loop {
        let timeout = if deadline.is_some() { 10 } else { -1 };
        if let Err(e) = em.run_with_timeout(timeout) {
            log::warn!("control socket: event loop failed: {e}");
            std::thread::sleep(Duration::from_millis(10));
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
