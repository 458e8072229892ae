//! The `fc_api` thread: Firecracker's API socket served by one epoll loop, and the periodic
//! metrics line.
//!
//! Data flow: epoll wakes the thread for the listener (new connections, at most
//! [`MAX_CONNS`]: the oldest is closed for a new one) and for each connection's bytes, which
//! collect in its buffer until [`http::parse`] finds a whole request; [`Api::handle`] answers
//! it, the answer is written and the connection closed. A connection that has not sent a
//! whole request within [`REQUEST_TIMEOUT`] is closed. Between wake-ups (at most
//! [`TICK`] apart) the thread writes the metrics line when it is due. Once the VM runs, the
//! thread confines itself to the `api` kind's system calls (it made every file and socket it
//! needs before), as our control socket's thread does.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::api::{Api, Starter};
use super::http::{self, Parsed, Response};
use super::metrics::MetricsState;

/// Most connections open at once.
pub const MAX_CONNS: usize = 64;
/// Longest time a connection may take to send its request.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest sleep of the loop.
const TICK: Duration = Duration::from_millis(500);

struct Conn {
    stream: UnixStream,
    buf: Vec<u8>,
    since: Instant,
}

/// The API thread's state.
pub struct Server<S: Starter> {
    /// The API.
    pub api: Api<S>,
    listener: Option<UnixListener>,
    /// The largest request body.
    pub max_payload: usize,
    metrics: Arc<Mutex<MetricsState>>,
    conns: HashMap<RawFd, Conn>,
    confined: bool,
}

/// A new epoll instance.
fn epoll() -> std::io::Result<OwnedFd> {
    // SAFETY: epoll_create1 takes a flag and returns a new descriptor or -1.
    let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` is a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Watches `fd` for input (level-triggered), with `fd` as its token.
fn watch(ep: &OwnedFd, fd: RawFd) -> std::io::Result<()> {
    let mut ev = libc::epoll_event {
        events: libc::EPOLLIN as u32,
        u64: fd as u64,
    };
    // SAFETY: `ev` is a valid epoll_event; both descriptors are open.
    let rc = unsafe { libc::epoll_ctl(ep.as_raw_fd(), libc::EPOLL_CTL_ADD, fd, &mut ev) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

impl<S: Starter> Server<S> {
    /// A server of `api` on `listener` (none with `--no-api`: the metrics alone).
    pub fn new(
        api: Api<S>,
        listener: Option<UnixListener>,
        metrics: Arc<Mutex<MetricsState>>,
    ) -> Self {
        Server {
            api,
            listener,
            max_payload: http::DEFAULT_MAX_PAYLOAD,
            metrics,
            conns: HashMap::new(),
            confined: false,
        }
    }

    /// Serves until the process ends.
    pub fn run(mut self) {
        let ep = match epoll() {
            Ok(ep) => ep,
            Err(e) => {
                log::error!("the Firecracker API cannot make its epoll instance: {e}");
                return;
            }
        };
        let listen_fd = self.listener.as_ref().map(AsRawFd::as_raw_fd);
        if let Some(fd) = listen_fd {
            if let Err(e) = watch(&ep, fd) {
                log::error!("the Firecracker API cannot watch its socket: {e}");
                return;
            }
        }
        let mut events = [libc::epoll_event { events: 0, u64: 0 }; 32];
        loop {
            // SAFETY: `events` has room for 32 entries; the epoll descriptor is open.
            let n = unsafe {
                libc::epoll_wait(
                    ep.as_raw_fd(),
                    events.as_mut_ptr(),
                    events.len() as i32,
                    TICK.as_millis() as i32,
                )
            };
            for ev in events.iter().take(n.max(0) as usize) {
                let fd = ev.u64 as RawFd;
                if Some(fd) == listen_fd {
                    self.accept(&ep);
                } else {
                    self.readable(fd);
                }
            }
            self.expire();
            self.tick();
        }
    }

    /// Takes every waiting connection.
    fn accept(&mut self, ep: &OwnedFd) {
        let Some(listener) = &self.listener else {
            return;
        };
        while let Ok((stream, _)) = listener.accept() {
            if stream.set_nonblocking(true).is_err() {
                continue;
            }
            if self.conns.len() >= MAX_CONNS {
                let oldest = self
                    .conns
                    .iter()
                    .min_by_key(|(_, c)| c.since)
                    .map(|(k, _)| *k);
                if let Some(k) = oldest {
                    self.conns.remove(&k);
                }
            }
            let fd = stream.as_raw_fd();
            if watch(ep, fd).is_ok() {
                self.conns.insert(
                    fd,
                    Conn {
                        stream,
                        buf: Vec::new(),
                        since: Instant::now(),
                    },
                );
            }
        }
    }

    /// Reads what connection `fd` sent; answers it once its request is whole.
    fn readable(&mut self, fd: RawFd) {
        let Some(conn) = self.conns.get_mut(&fd) else {
            return;
        };
        let limit = http::MAX_HEAD + self.max_payload + 1;
        let mut chunk = [0u8; 16 << 10];
        let closed = loop {
            match conn.stream.read(&mut chunk) {
                Ok(0) => break true,
                Ok(n) => {
                    conn.buf.extend_from_slice(&chunk[..n]);
                    if conn.buf.len() > limit || n < chunk.len() {
                        break false;
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break false,
                Err(_) => break true,
            }
        };
        let answer = match http::parse(&conn.buf, self.max_payload) {
            Ok(Parsed::Incomplete) if !closed => return,
            Ok(Parsed::Incomplete) => None,
            Ok(Parsed::Done(req)) => Some(self.api.handle(&req)),
            Err(e) => Some(Response::fault(e.to_string())),
        };
        if let Some(mut conn) = self.conns.remove(&fd) {
            if let Some(r) = answer {
                // The socket buffer takes a whole answer (a few KiB) at once.
                let _ = conn.stream.write_all(&r.to_bytes());
            }
        }
        self.confine_once_started();
    }

    /// Closes connections that took too long to send their request.
    fn expire(&mut self) {
        let now = Instant::now();
        self.conns
            .retain(|_, c| now.duration_since(c.since) < REQUEST_TIMEOUT);
    }

    /// The periodic metrics line; the confinement of a VM started elsewhere.
    fn tick(&mut self) {
        let vm = self.api.vm().cloned();
        let mut m = self.metrics.lock().unwrap_or_else(|e| e.into_inner());
        if m.due(Instant::now()) {
            if let Err(e) = m.flush(vm.as_ref()) {
                log::warn!("{e}");
            }
        }
        drop(m);
        self.confine_once_started();
    }

    /// Once the VM runs, the thread has made all it needs: it enters the `api` kind.
    fn confine_once_started(&mut self) {
        if !self.confined && self.api.vm().is_some() {
            self.confined = true;
            ppa_vmm::seccomp::enter(ppa_vmm::seccomp::Kind::Api);
        }
    }
}
