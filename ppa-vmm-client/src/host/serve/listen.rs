//! `host serve`'s connections, held as the VMM's own metrics listener holds them
//! (vmm/src/api/serve/accept.rs): a fixed number of connection slots, each connection's
//! request head due within [`HEAD_DEADLINE`] of its accept (a deadline, not a read timeout
//! that a byte a second restarts), and, when every slot is taken, a new connection evicts the
//! oldest one still sending its head. So no local user can keep the owner's scrapes out by
//! holding connections open: silent ones and slow ones both lose their slot, to the deadline
//! or to the next connection.
//!
//! Data flow: one thread ([`Listen::run`]) polls the listener and every connection whose head
//! is not whole yet (non-blocking sockets, one `poll` over them), reads what arrived, answers
//! 408 to a head past its deadline, and hands a whole `GET /metrics` (or `HEAD`) to a
//! `host-scrape` thread of its own (at most [`MAX_SCRAPES`] at once, a 503 past them), which
//! scrapes every VM and writes the answer; any other request is answered at once
//! (`ppa_vmm_api::http::metrics_request`). A connection being scraped keeps its slot until its
//! answer is written, and is never evicted.

use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ppa_vmm_api::http::{
    head_end, head_only, http_response, metrics_request, request_line, MetricsRequest,
    MAX_HTTP_HEAD,
};

/// Connection slots: heads being read and scrapes being served together (the VMM's metrics
/// listener has as many, `HTTP_MAX_CLIENTS`).
pub const MAX_CONNS: usize = 64;
/// Scrapes served at once (each asks every VM); a whole head past them gets 503.
pub const MAX_SCRAPES: usize = 8;
/// How long a connection has from its accept to send its whole request head.
pub const HEAD_DEADLINE: Duration = Duration::from_secs(2);
/// How long a scrape's answer may take to be written.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// Content type of the exposition.
const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// What a scrape gives: the exposition, or why there is none (a 500).
pub type ScrapeFn = dyn Fn() -> Result<String, String> + Send + Sync;

/// A connection whose request head is not whole yet.
struct Pending {
    stream: TcpStream,
    head: Vec<u8>,
    /// When it was accepted: its head is due [`HEAD_DEADLINE`] after.
    since: Instant,
}

/// What happened to connections, for the log and the tests.
#[derive(Debug, Default)]
pub struct Counts {
    /// Closed with 408: the head was not whole by its deadline.
    pub timed_out: AtomicUsize,
    /// Closed to make room for a new connection.
    pub evicted: AtomicUsize,
    /// Answered 503: every slot was a scrape, or [`MAX_SCRAPES`] ran.
    pub refused: AtomicUsize,
    /// Scrapes answered.
    pub scraped: AtomicUsize,
}

/// The listener and the connections it holds.
pub struct Listen {
    listener: TcpListener,
    pending: Vec<Pending>,
    /// Scrapes running now (each holds a slot).
    scraping: Arc<AtomicUsize>,
    scrape: Arc<ScrapeFn>,
    /// What happened, readable while it runs.
    pub counts: Arc<Counts>,
}

/// The connection to evict when every slot is taken: the oldest whose head is not whole
/// (every pending one; a scrape is never evicted). `None`: none is pending.
fn eviction_victim(accepted_at: &[Instant]) -> Option<usize> {
    (0..accepted_at.len()).min_by_key(|&i| accepted_at[i])
}

/// Writes a short answer on a non-blocking socket (it fits in the socket's buffer) and
/// drops the connection. What the client sent and was not read is read first (some of it):
/// a socket closed with unread input resets the connection, and the client could lose the
/// answer.
fn answer_and_close(mut s: TcpStream, response: &str) {
    let mut sink = [0u8; 4096];
    for _ in 0..16 {
        if !matches!(s.read(&mut sink), Ok(n) if n > 0) {
            break;
        }
    }
    let _ = s.write(response.as_bytes());
}

impl Listen {
    /// Serves `listener` with `scrape` (non-blocking from now on).
    pub fn new(listener: TcpListener, scrape: Arc<ScrapeFn>) -> io::Result<Listen> {
        listener.set_nonblocking(true)?;
        Ok(Listen {
            listener,
            pending: Vec::new(),
            scraping: Arc::new(AtomicUsize::new(0)),
            scrape,
            counts: Arc::new(Counts::default()),
        })
    }

    /// Serves until the process ends.
    pub fn run(mut self) -> ! {
        loop {
            self.round();
        }
    }

    /// One round: wait for the listener, a connection or the next deadline; then expire,
    /// accept and read.
    fn round(&mut self) {
        let now = Instant::now();
        let wait = self
            .pending
            .iter()
            .map(|p| (p.since + HEAD_DEADLINE).saturating_duration_since(now))
            .min()
            // Scrapes that end free slots without a wake-up here; a second is soon enough
            // to notice (a new connection wakes the poll anyway).
            .unwrap_or(Duration::from_secs(1));
        let mut fds: Vec<libc::pollfd> = std::iter::once(self.listener.as_raw_fd())
            .chain(self.pending.iter().map(|p| p.stream.as_raw_fd()))
            .map(|fd| libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        let ms = wait.as_micros().div_ceil(1000).min(i32::MAX as u128) as libc::c_int;
        // SAFETY: `fds` is a live array of fds.len() pollfd entries naming descriptors that
        // `self` owns for the whole call; poll writes only their revents.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
        let readable: Vec<bool> = fds.iter().map(|f| n > 0 && f.revents != 0).collect();
        // From the end, so that removing one leaves the indices before it valid.
        for i in (0..self.pending.len()).rev() {
            if readable[i + 1] {
                self.read_head(i);
            }
        }
        self.expire(Instant::now());
        if readable[0] {
            self.accept_all();
        }
    }

    /// Answers 408 to every connection whose head is past its deadline, and closes it.
    fn expire(&mut self, now: Instant) {
        let mut i = 0;
        while i < self.pending.len() {
            if now >= self.pending[i].since + HEAD_DEADLINE {
                let p = self.pending.swap_remove(i);
                self.counts.timed_out.fetch_add(1, Ordering::Relaxed);
                answer_and_close(
                    p.stream,
                    &http_response("408 Request Timeout", "text/plain", "request timeout\n"),
                );
            } else {
                i += 1;
            }
        }
    }

    /// Accepts what is pending; a connection past the slots evicts the oldest head.
    fn accept_all(&mut self) {
        loop {
            let stream = match self.listener.accept() {
                Ok((s, _)) => s,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    // Out of descriptors, or the peer left: try again at the next round.
                    eprintln!("ppa-vmm: warn: host serve: accept failed: {e}");
                    return;
                }
            };
            if stream.set_nonblocking(true).is_err() {
                continue;
            }
            let held = self.pending.len() + self.scraping.load(Ordering::Acquire);
            if held >= MAX_CONNS {
                let since: Vec<Instant> = self.pending.iter().map(|p| p.since).collect();
                match eviction_victim(&since) {
                    Some(i) => {
                        drop(self.pending.swap_remove(i));
                        self.counts.evicted.fetch_add(1, Ordering::Relaxed);
                    }
                    None => {
                        self.counts.refused.fetch_add(1, Ordering::Relaxed);
                        answer_and_close(
                            stream,
                            &http_response(
                                "503 Service Unavailable",
                                "text/plain",
                                "too many clients\n",
                            ),
                        );
                        continue;
                    }
                }
            }
            self.pending.push(Pending {
                stream,
                head: Vec::new(),
                since: Instant::now(),
            });
            // A client usually sends its head right after connecting: read it now.
            let last = self.pending.len() - 1;
            self.read_head(last);
        }
    }

    /// Reads what connection `i` sent; a whole head is answered (or handed to a scrape), a
    /// closed or failed connection or one whose head is too large is dropped.
    fn read_head(&mut self, i: usize) {
        let mut buf = [0u8; 2048];
        let p = &mut self.pending[i];
        let room = (MAX_HTTP_HEAD + 1 - p.head.len()).min(buf.len());
        let end = match p.stream.read(&mut buf[..room]) {
            Ok(0) => None,
            Ok(n) => {
                p.head.extend_from_slice(&buf[..n]);
                match head_end(&p.head) {
                    Some(end) if end <= MAX_HTTP_HEAD => Some(Ok(())),
                    _ if p.head.len() > MAX_HTTP_HEAD => {
                        Some(Err("431 Request Header Fields Too Large"))
                    }
                    _ => return,
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => return,
            Err(_) => None,
        };
        let p = self.pending.swap_remove(i);
        match end {
            None => {}
            Some(Err(status)) => answer_and_close(
                p.stream,
                &http_response(status, "text/plain", "request head too large\n"),
            ),
            Some(Ok(())) => self.answer(p),
        }
    }

    /// Answers a whole head: an error at once, the metrics on a thread of their own.
    fn answer(&mut self, p: Pending) {
        let head_only_wanted = match metrics_request(&request_line(&p.head)) {
            MetricsRequest::Refuse(response) => return answer_and_close(p.stream, &response),
            MetricsRequest::Serve { head_only } => head_only,
        };
        if self.scraping.fetch_add(1, Ordering::AcqRel) >= MAX_SCRAPES {
            self.scraping.fetch_sub(1, Ordering::AcqRel);
            self.counts.refused.fetch_add(1, Ordering::Relaxed);
            return answer_and_close(
                p.stream,
                &http_response(
                    "503 Service Unavailable",
                    "text/plain",
                    "too many scrapes at once\n",
                ),
            );
        }
        let (scrape, scraping, counts) = (
            Arc::clone(&self.scrape),
            Arc::clone(&self.scraping),
            Arc::clone(&self.counts),
        );
        let mut stream = p.stream;
        let spawned = std::thread::Builder::new()
            .name("host-scrape".into())
            .spawn(move || {
                let response = match scrape() {
                    Ok(text) => http_response("200 OK", CONTENT_TYPE, &text),
                    Err(e) => http_response("500 Internal Server Error", "text/plain", &(e + "\n")),
                };
                let out = if head_only_wanted {
                    head_only(&response)
                } else {
                    &response
                };
                if stream.set_nonblocking(false).is_ok()
                    && stream.set_write_timeout(Some(WRITE_TIMEOUT)).is_ok()
                {
                    let _ = stream.write_all(out.as_bytes());
                }
                counts.scraped.fetch_add(1, Ordering::Relaxed);
                drop(stream);
                scraping.fetch_sub(1, Ordering::AcqRel);
            });
        if spawned.is_err() {
            self.scraping.fetch_sub(1, Ordering::AcqRel);
            self.counts.refused.fetch_add(1, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests;
