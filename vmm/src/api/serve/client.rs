//! One client connection of the `api` thread: its socket (control or HTTP) and what the loop
//! keeps for it (input, queued output, subscriptions, budgets); [`super::Serve`] owns them.
//!
//! Data flow: [`super::Serve`] reads into a connection's [`LineBuffer`], runs the complete
//! lines and sends each answer through [`Conn::send`], which writes at once as far as the
//! socket takes it and queues the rest in its [`OutQueue`].

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;

use event_manager::EventSet;
use ppa_vmm_api::MAX_REQUEST_BYTES;

use super::super::conn::{LineBuffer, OutQueue};
use super::super::http::MAX_HTTP_HEAD;
use super::super::listen::{ChangeBudget, Listener, WorkBudget, CLIENT_OUT_PAUSE};
use crate::pressure::trigger::Trigger;
use crate::sync::now_ns;

pub(super) enum Stream {
    Api(UnixStream),
    Http(TcpStream),
}

impl Stream {
    pub(super) fn fd(&self) -> RawFd {
        match self {
            Stream::Api(s) => s.as_raw_fd(),
            Stream::Http(s) => s.as_raw_fd(),
        }
    }

    pub(super) fn listener(&self) -> Listener {
        match self {
            Stream::Api(_) => Listener::Api,
            Stream::Http(_) => Listener::Http,
        }
    }

    pub(super) fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            let r = match self {
                Stream::Api(s) => s.read(buf),
                Stream::Http(s) => s.read(buf),
            };
            match r {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                r => return r,
            }
        }
    }

    pub(super) fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Api(s) => s.write(buf),
            Stream::Http(s) => s.write(buf),
        }
    }

    pub(super) fn write_parts(&mut self, parts: [&[u8]; 3]) -> io::Result<usize> {
        let io = parts.map(io::IoSlice::new);
        match self {
            Stream::Api(s) => s.write_vectored(&io),
            Stream::Http(s) => s.write_vectored(&io),
        }
    }
}

pub(super) struct Conn {
    pub(super) stream: Stream,
    /// The peer's uid (control socket; `u32::MAX` for HTTP).
    pub(super) uid: u32,
    pub(super) input: LineBuffer,
    pub(super) out: OutQueue,
    /// Subscribed event kinds (bit per kind).
    pub(super) mask: u8,
    /// The pressure trigger, checked with the threshold timer.
    pub(super) trigger: Option<Trigger>,
    /// Close once `out` is written (an HTTP answer, or the server stopping).
    pub(super) closing: bool,
    /// The peer sent all it will send; close once its requests are answered and written.
    pub(super) eof: bool,
    /// The interest currently registered.
    pub(super) interest: EventSet,
    /// When it was accepted.
    pub(super) since: u64,
    /// The last byte read or written.
    pub(super) active_at: u64,
    /// When its last request was answered (at accept: the accept).
    pub(super) request_at: u64,
    /// Since when a request has been begun and not finished.
    pub(super) partial_since: Option<u64>,
    /// Since when answers have waited without the client taking any.
    pub(super) stalled_since: Option<u64>,
    /// In the ready list.
    pub(super) ready: bool,
    /// What is left of its state-changing requests.
    pub(super) changes: ChangeBudget,
    /// Its share of the thread's time.
    pub(super) work: WorkBudget,
    /// Past its share: neither read nor answered until then.
    pub(super) resting_until: Option<u64>,
    /// A request taken from `input` and not run yet (its state change waits for the budget).
    pub(super) held: Option<Vec<u8>>,
}

impl Conn {
    /// Sends a response line: written to the socket at once as far as it takes it when
    /// nothing is queued before it, the rest queued. A 20 KB `stats` answer then goes from its
    /// string to the socket without a copy through the queue (and the queue's allocation of
    /// it, given back after each answer); an error is left for the next flush to find.
    pub(super) fn send(&mut self, line: &str) {
        self.send_parts([line.as_bytes(), &[], &[]]);
    }

    /// [`Conn::send`] of a line made of three parts, written with one `writev`.
    pub(super) fn send_parts(&mut self, parts: [&[u8]; 3]) {
        let mut written = if self.out.is_empty() && !self.closing {
            match self.stream.write_parts(parts) {
                Ok(n) => {
                    self.active_at = now_ns();
                    n
                }
                Err(_) => 0,
            }
        } else {
            0
        };
        for p in parts {
            let taken = written.min(p.len());
            self.out.push_bytes(&p[taken..]);
            written -= taken;
        }
    }

    pub(super) fn new(stream: Stream, uid: u32, interest: EventSet, now: u64) -> Self {
        Conn {
            stream,
            uid,
            input: LineBuffer::default(),
            out: OutQueue::default(),
            mask: 0,
            trigger: None,
            closing: false,
            eof: false,
            interest,
            since: now,
            active_at: now,
            request_at: now,
            partial_since: None,
            stalled_since: None,
            ready: false,
            changes: ChangeBudget::default(),
            work: WorkBudget::default(),
            resting_until: None,
            held: None,
        }
    }

    pub(super) fn is_http(&self) -> bool {
        matches!(self.stream, Stream::Http(_))
    }

    /// Nothing in flight (no input, no output queued) and no subscription.
    pub(super) fn is_quiet(&self) -> bool {
        self.mask == 0 && self.out.is_empty() && self.input.is_empty() && self.held.is_none()
    }

    /// Whether the server reads this connection's socket now: it is waiting for bytes to
    /// complete a request, and the client has read its answers.
    pub(super) fn wants_input(&self) -> bool {
        if self.closing || self.eof || self.resting_until.is_some() {
            return false;
        }
        if self.is_http() {
            return self.input.len() <= MAX_HTTP_HEAD;
        }
        self.out.len() <= CLIENT_OUT_PAUSE && !self.input.has_line() && self.held.is_none()
    }

    /// Whether complete requests wait and may be answered now.
    pub(super) fn can_answer(&self) -> bool {
        !self.closing
            && self.resting_until.is_none()
            && !self.is_http()
            && self.out.len() <= CLIENT_OUT_PAUSE
            && (self.input.has_line() || self.held.is_some())
    }

    /// The largest read that keeps the input within what the protocol needs to see.
    pub(super) fn read_room(&self) -> usize {
        let limit = if self.is_http() {
            MAX_HTTP_HEAD
        } else {
            MAX_REQUEST_BYTES
        };
        (limit + 1).saturating_sub(self.input.len()).max(1)
    }
}
