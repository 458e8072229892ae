//! Accepting clients: the peer check on the control socket, each listener's cap, eviction
//! (HTTP: the oldest connection still sending its head; control socket: the new peer's own
//! longest-idle connection), and registration with the event loop.

use std::io::{self, Write};

use event_manager::{EventOps, EventSet, Events};
use ppa_vmm_api::{ErrorBody, ErrorKind, Response};

use super::{Conn, Serve, Stream, ACCEPTS_PER_WAKE};
use crate::api::http::http_response;
use crate::api::listen::{DropReason, FdReserve, Listener};
use crate::api::unix::peer_uid;
use crate::sync::now_ns;

impl Serve {
    /// Accepts what is pending on a listener now: the accepted streams.
    fn accept_all<S>(&mut self, which: Listener, accept: impl Fn() -> io::Result<S>) -> Vec<S> {
        let mut accepted = Vec::new();
        for _ in 0..ACCEPTS_PER_WAKE {
            match accept() {
                Ok(s) => accepted.push(s),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if FdReserve::is_exhaustion(&e) => {
                    // Take the connection with the spare descriptor and close it at once.
                    if self.reserve.released(|| accept().is_ok()) {
                        self.stats.on_drop(which, DropReason::NoFds);
                    }
                    log::warn!("{}: no descriptor left to accept a client", which.name());
                    break;
                }
                Err(e) => {
                    log::warn!("{}: accept failed: {e}", which.name());
                    break;
                }
            }
        }
        accepted
    }

    pub(super) fn accept_api(&mut self, ops: &mut EventOps) {
        let Some(listener) = self.api.take() else {
            return;
        };
        let accepted = self.accept_all(Listener::Api, || listener.accept().map(|(s, _)| s));
        self.api = Some(listener);
        for stream in accepted {
            if stream.set_nonblocking(true).is_err() {
                continue;
            }
            let (uid, refuse) = match peer_uid(&stream) {
                Ok(uid) if uid == self.uid || uid == 0 => (uid, None),
                Ok(uid) => (
                    uid,
                    Some(ErrorBody::new(
                        ErrorKind::PermissionDenied,
                        match self.uid {
                            0 => format!("uid {uid} may not use this socket (only root may)"),
                            own => format!(
                                "uid {uid} may not use this socket (only uid {own} and root may)"
                            ),
                        },
                    )),
                ),
                Err(e) => (
                    u32::MAX,
                    Some(ErrorBody::new(
                        ErrorKind::PermissionDenied,
                        format!("the peer's credentials cannot be read: {e}"),
                    )),
                ),
            };
            let max = self.limits.api_max_clients;
            let (refuse, reason) = match refuse {
                Some(e) => (Some(e), DropReason::Permission),
                None if self.count[Listener::Api.index()] < max => (None, DropReason::Full),
                // Full: the peer's own longest-idle connection makes room, so that a leak of
                // its own connections cannot lock the owner out.
                None => match self.api_victim(uid) {
                    Some(t) => {
                        self.evict_api(t, max, ops);
                        (None, DropReason::Full)
                    }
                    None => (
                        Some(ErrorBody::new(
                            ErrorKind::TooManyClients,
                            format!(
                                "the control socket already has {max} clients, none of them this uid's"
                            ),
                        )),
                        DropReason::Full,
                    ),
                },
            };
            if let Some(e) = refuse {
                self.stats.on_drop(Listener::Api, reason);
                let mut s = stream;
                let line = Response::err(serde_json::Value::Null, e).to_line();
                let _ = s.write(line.as_bytes());
                continue;
            }
            self.register(Stream::Api(stream), uid, ops);
        }
    }

    pub(super) fn accept_http(&mut self, ops: &mut EventOps) {
        let Some(listener) = self.http.take() else {
            return;
        };
        let accepted = self.accept_all(Listener::Http, || listener.accept().map(|(s, _)| s));
        self.http = Some(listener);
        for stream in accepted {
            if stream.set_nonblocking(true).is_err() {
                continue;
            }
            if self.count[Listener::Http.index()] >= self.limits.http_max_clients {
                // Make room by closing the oldest connection still sending its head.
                let victim = self
                    .conns
                    .iter()
                    .filter(|(_, c)| c.is_http() && !c.closing)
                    .min_by_key(|(_, c)| c.since)
                    .map(|(t, _)| *t);
                match victim {
                    Some(t) => self.drop_conn(t, DropReason::Evicted, ops),
                    None => {
                        self.stats.on_drop(Listener::Http, DropReason::Full);
                        let mut s = stream;
                        let _ = s.write(
                            http_response(
                                "503 Service Unavailable",
                                "text/plain",
                                "too many clients\n",
                            )
                            .as_bytes(),
                        );
                        continue;
                    }
                }
            }
            self.register(Stream::Http(stream), u32::MAX, ops);
        }
    }

    /// The control connection a new one from `uid` may replace when the socket is full: one
    /// of the same uid (root: any), quiet ones (nothing in flight, no subscription) first,
    /// then the one whose last request is oldest.
    fn api_victim(&self, uid: u32) -> Option<u32> {
        self.conns
            .iter()
            .filter(|(_, c)| !c.is_http() && !c.closing && (c.uid == uid || uid == 0))
            .min_by_key(|(_, c)| (!c.is_quiet(), c.request_at))
            .map(|(t, _)| *t)
    }

    /// Closes control connection `token` to make room, telling its client why.
    fn evict_api(&mut self, token: u32, max: usize, ops: &mut EventOps) {
        if let Some(c) = self.conns.get_mut(&token) {
            if c.out.is_empty() {
                let idle_s = now_ns().saturating_sub(c.request_at) as f64 / 1e9;
                let e = ErrorBody::new(
                    ErrorKind::TooManyClients,
                    format!(
                        "closed to make room for a new client: the control socket has {max} \
                         clients and this one had sent no request for {idle_s:.1} s"
                    ),
                );
                let line = Response::err(serde_json::Value::Null, e).to_line();
                let _ = c.stream.write(line.as_bytes());
            }
        }
        self.drop_conn(token, DropReason::Evicted, ops);
    }

    fn register(&mut self, stream: Stream, uid: u32, ops: &mut EventOps) {
        let token = self.token();
        let interest = EventSet::IN | EventSet::READ_HANG_UP;
        if let Err(e) = ops.add(Events::with_data_raw(stream.fd(), token, interest)) {
            log::warn!("control socket: cannot watch a connection: {e}");
            return;
        }
        let which = stream.listener();
        self.count[which.index()] += 1;
        self.stats.on_accept(which);
        self.conns
            .insert(token, Conn::new(stream, uid, interest, now_ns()));
        if !self.sweep_armed {
            let every = self.limits.sweep_every();
            self.sweep_armed = self.sweep.reset(every, Some(every)).is_ok();
        }
        // A client usually sends its request right after connecting: answer it in this round.
        self.on_readable(token, ops);
    }
}
