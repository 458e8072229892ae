//! The `api` thread's event-loop subscriber: every client connection, from accept to close.
//!
//! Data flow: epoll reports a listener (accept: check the peer's uid with SO_PEERCRED on the
//! control socket, apply the listener's cap, register), a connection ([`Conn`], in
//! `client.rs`: read → `LineBuffer` → complete lines → [`Handler`] → `OutQueue` → write as
//! the socket allows), the [`EventHub`]'s eventfd (events from the run loop, queued for
//! subscribers), the threshold timer (growth of the threshold counters, as events), the sweep
//! timer (time limits), the kick eventfd (connections with requests left over from their
//! turn) and the stop eventfd.
//!
//! Fairness: a connection's turn is at most [`REQUESTS_PER_TURN`] answers and [`TURN_NS`]
//! of work; what is left waits in the ready list for its next turn, after every other ready
//! connection, and the turns of the ready list take at most [`ROUND_NS`] before epoll is
//! asked again, so a new client or request waits about a round at most. A client
//! whose queue holds more than [`CLIENT_OUT_PAUSE`] gets no more answers, and its socket is
//! not read, until it reads; the kernel's socket buffer holds what it sends meanwhile. Each
//! answer's time is charged to its client's [`WorkBudget`]: a client past its share of the
//! thread rests (not read, not answered) until the rest timer wakes it, and its
//! state-changing requests draw on its [`ChangeBudget`] (both in [`super::listen`]), so that
//! one client's storm is bounded whatever it asks. Every [`DropReason`] is applied here, and
//! counted in [`ListenerStats`].

use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::TcpListener;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixListener;
use std::sync::Arc;
use std::time::Duration;

use event_manager::{EventOps, EventSet, Events, MutEventSubscriber};
use ppa_vmm_api::{ErrorBody, ErrorKind, Event, EventKind, Response, MAX_REQUEST_BYTES};
use vmm_sys_util::eventfd::EventFd;
use vmm_sys_util::timerfd::TimerFd;

use super::conn::Next;
use super::handler::{kind_bit, Handler, Outcome, STATS_TAIL};
use super::http::{http_head, http_reply, http_response, Head};
use super::listen::{
    ClientLimits, DropReason, FdReserve, Listener, ListenerStats, EVENT_QUEUE_BYTES,
    REQUESTS_PER_TURN, ROUND_NS, TURN_NS,
};
use crate::accounting::{PerThreshold, Threshold};
use crate::event_hub::EventHub;
use crate::pressure::trigger::Trigger;
use crate::sync::now_ns;
use crate::sync::Counter;
use client::{Conn, Stream};

pub(super) const TOKEN_API: u32 = 0;
pub(super) const TOKEN_HTTP: u32 = 1;
pub(super) const TOKEN_HUB: u32 = 2;
pub(super) const TOKEN_TIMER: u32 = 3;
pub(super) const TOKEN_STOP: u32 = 4;
pub(super) const TOKEN_SWEEP: u32 = 5;
pub(super) const TOKEN_KICK: u32 = 6;
pub(super) const TOKEN_REST: u32 = 7;
const FIRST_CONN: u32 = 16;
/// Connections accepted per listener wake-up; epoll reports the rest.
const ACCEPTS_PER_WAKE: usize = 64;

/// The answer to a line that passed the limit without a newline after `n` bytes.
fn too_long(n: usize) -> String {
    let e = ErrorBody::new(
        ErrorKind::TooLong,
        format!(
            "the request is over {MAX_REQUEST_BYTES} bytes ({n} so far without a newline); it is skipped up to its newline"
        ),
    );
    Response::err(serde_json::Value::Null, e).to_line()
}

/// Answers an HTTP connection's request once its head is whole (its one answer, after which
/// the connection closes).
fn answer_http(conn: &mut Conn, handler: &mut Handler) {
    if !conn.closing {
        let reply = match http_head(&mut conn.input) {
            Head::Pending => None,
            Head::TooLarge => {
                // What the client sent beyond is thrown away, so that closing does
                // not reset the connection before it reads the answer.
                let mut sink = [0u8; 4096];
                for _ in 0..16 {
                    if !matches!(conn.stream.read(&mut sink), Ok(n) if n > 0) {
                        break;
                    }
                }
                Some(http_response(
                    "431 Request Header Fields Too Large",
                    "text/plain",
                    "request too large\n",
                ))
            }
            Head::Complete(target) => Some(http_reply(&target, handler)),
        };
        if let Some(r) = reply {
            conn.out.push_response(&r);
            conn.closing = true;
        }
    }
}

/// Arms the rest timer for `until` unless it fires before.
fn arm_rest(timer: &mut TimerFd, at: &mut Option<u64>, until: u64) {
    if at.is_none_or(|t| until < t) {
        let wait = Duration::from_nanos(until.saturating_sub(now_ns()).max(1));
        *at = timer.reset(wait, None).is_ok().then_some(until);
    }
}

/// What the loop needs besides the connections.
pub(super) struct ServeParts {
    pub handler: Handler,
    pub api: Option<UnixListener>,
    pub http: Option<TcpListener>,
    pub hub: Arc<EventHub>,
    pub stop: Arc<EventFd>,
    pub limits: ClientLimits,
    pub stats: Arc<ListenerStats>,
}

/// The subscriber the event loop drives.
pub(super) struct Serve {
    handler: Handler,
    api: Option<UnixListener>,
    http: Option<TcpListener>,
    hub: Arc<EventHub>,
    stop: Arc<EventFd>,
    /// Threshold checks while someone subscribes to threshold events.
    timer: TimerFd,
    timer_armed: bool,
    /// Time-limit checks while there are connections.
    sweep: TimerFd,
    sweep_armed: bool,
    /// Written when the ready list gains a connection.
    kick: EventFd,
    /// Fires when the earliest resting connection may be answered again.
    rest: TimerFd,
    /// When `rest` fires (`None`: disarmed).
    rest_at: Option<u64>,
    ready: VecDeque<u32>,
    reserve: FdReserve,
    limits: ClientLimits,
    stats: Arc<ListenerStats>,
    conns: HashMap<u32, Conn>,
    /// Connections per listener.
    count: [usize; Listener::COUNT],
    /// Output bytes queued over all connections.
    queued: usize,
    next_token: u32,
    uid: u32,
    /// Threshold counters at the last check, per vCPU.
    seen: Vec<PerThreshold<u64>>,
    /// Where a connection's bytes are read into (kept: one per server, not per read).
    scratch: Box<[u8]>,
    pub(super) stopping: bool,
}

impl Serve {
    pub(super) fn new(p: ServeParts) -> io::Result<Self> {
        Ok(Serve {
            handler: p.handler,
            api: p.api,
            http: p.http,
            hub: p.hub,
            stop: p.stop,
            timer: TimerFd::new()?,
            timer_armed: false,
            sweep: TimerFd::new()?,
            sweep_armed: false,
            kick: EventFd::new(vmm_sys_util::eventfd::EFD_NONBLOCK)?,
            rest: TimerFd::new()?,
            rest_at: None,
            ready: VecDeque::new(),
            reserve: FdReserve::new()?,
            limits: p.limits,
            stats: p.stats,
            conns: HashMap::new(),
            count: [0; Listener::COUNT],
            queued: 0,
            next_token: FIRST_CONN,
            // SAFETY: getuid has no preconditions.
            uid: unsafe { libc::getuid() },
            seen: Vec::new(),
            scratch: vec![0; 16 * 1024].into_boxed_slice(),
            stopping: false,
        })
    }

    fn token(&mut self) -> u32 {
        loop {
            let t = self.next_token;
            self.next_token = self.next_token.checked_add(1).unwrap_or(FIRST_CONN);
            if t >= FIRST_CONN && !self.conns.contains_key(&t) {
                return t;
            }
        }
    }

    fn close(&mut self, token: u32, ops: &mut EventOps) {
        if let Some(c) = self.conns.remove(&token) {
            let _ = ops.remove(Events::empty_raw(c.stream.fd()));
            let which = c.stream.listener();
            self.count[which.index()] -= 1;
            self.stats.on_close(which);
            self.queued -= c.out.len();
        }
    }

    /// Closes a connection on the server's own decision, counting why.
    fn drop_conn(&mut self, token: u32, reason: DropReason, ops: &mut EventOps) {
        let Some(c) = self.conns.get_mut(&token) else {
            return;
        };
        let which = c.stream.listener();
        if which == Listener::Http && reason == DropReason::HeaderTimeout && c.out.is_empty() {
            let _ = c.stream.write(
                http_response("408 Request Timeout", "text/plain", "request timeout\n").as_bytes(),
            );
        }
        log::debug!("{}: dropping a client ({})", which.name(), reason.name());
        self.stats.on_drop(which, reason);
        self.close(token, ops);
    }

    /// Reads what the client sent and answers its complete requests, within its turn.
    fn on_readable(&mut self, token: u32, ops: &mut EventOps) {
        let scratch = &mut self.scratch[..];
        let Some(conn) = self.conns.get_mut(&token) else {
            return;
        };
        // Bounded work per wake-up: epoll (level-triggered) reports the rest again.
        for _ in 0..4 {
            if !conn.wants_input() {
                break;
            }
            let room = conn.read_room().min(scratch.len());
            match conn.stream.read(&mut scratch[..room]) {
                Ok(0) => conn.eof = true,
                Ok(n) => {
                    conn.input.push(&scratch[..n]);
                    conn.active_at = now_ns();
                    if n < room {
                        // Drained for now: a second read would only say EAGAIN.
                        break;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(_) => conn.eof = true,
            }
        }
        self.answer(token, ops);
        self.flush(token, ops);
    }

    /// Answers the connection's complete requests, up to its turn's share; queues the
    /// connection for another turn if some are left.
    fn answer(&mut self, token: u32, ops: &mut EventOps) {
        let Some(conn) = self.conns.get_mut(&token) else {
            return;
        };
        let before = conn.out.len();
        if conn.is_http() {
            answer_http(conn, &mut self.handler);
        } else {
            let turn_end = now_ns() + TURN_NS;
            let mut answered = 0;
            while conn.can_answer()
                && (answered == 0 || (answered < REQUESTS_PER_TURN && now_ns() < turn_end))
            {
                answered += 1;
                let line = match conn.held.take() {
                    Some(l) => l,
                    None => match conn.input.next_line(MAX_REQUEST_BYTES) {
                        Next::Pending => break,
                        Next::TooLong(n) => {
                            conn.out.push_response(&too_long(n));
                            continue;
                        }
                        Next::Line(l) => l,
                    },
                };
                if line.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                conn.request_at = now_ns();
                let began = now_ns();
                let outcome = self.handler.handle_line_from(&line, &mut conn.changes);
                let done = now_ns();
                conn.work.charge(done, done - began);
                match outcome {
                    Outcome::Wait(wait) => {
                        // Past its budget of state changes: the request waits, in order.
                        conn.held = Some(line);
                        let until = done + wait.as_nanos() as u64;
                        conn.resting_until = Some(until);
                        self.stats.on_rest();
                        arm_rest(&mut self.rest, &mut self.rest_at, until);
                        break;
                    }
                    Outcome::Reply(r) => conn.send(&r),
                    Outcome::Stats(head, snap) => conn.send_parts([
                        head.as_bytes(),
                        snap.text.as_bytes(),
                        STATS_TAIL.as_bytes(),
                    ]),
                    Outcome::Subscribe(r, mask, trigger) => {
                        conn.send(&r);
                        conn.mask |= mask;
                        if let Some(t) = trigger {
                            conn.trigger = Some(Trigger::new(t, now_ns()));
                        }
                        let timed = kind_bit(EventKind::Threshold) | kind_bit(EventKind::Pressure);
                        if mask & timed != 0 && !self.timer_armed {
                            let every = Duration::from_millis(10);
                            self.timer_armed = self.timer.reset(every, Some(every)).is_ok();
                        }
                    }
                }
            }
            if let Some(until) = conn.work.rest_until(now_ns()) {
                // Past its share of the thread: it rests (its socket unread, its requests
                // unanswered) until the share is back.
                let until = until.max(conn.resting_until.unwrap_or(0));
                conn.resting_until = Some(until);
                self.stats.on_rest();
                arm_rest(&mut self.rest, &mut self.rest_at, until);
            }
            // A line over the limit without its newline is found only by looking.
            if !conn.input.has_line() && conn.input.len() > MAX_REQUEST_BYTES {
                if let Next::TooLong(n) = conn.input.next_line(MAX_REQUEST_BYTES) {
                    conn.out.push_response(&too_long(n));
                }
            }
            if conn.input.partial() {
                conn.partial_since.get_or_insert_with(now_ns);
            } else {
                conn.partial_since = None;
            }
            if conn.can_answer() && !conn.ready {
                conn.ready = true;
                self.ready.push_back(token);
                let _ = self.kick.write(1);
            }
        }
        let after = conn.out.len();
        self.queued = self.queued + after - before;
        if after > before && self.queued > self.limits.out_budget {
            self.enforce_budget(ops);
        }
    }

    /// Drops the connections holding the most output until all of it fits the budget
    /// ([`super::listen::OUT_BUDGET`] unless set otherwise).
    fn enforce_budget(&mut self, ops: &mut EventOps) {
        while self.queued > self.limits.out_budget {
            let Some(t) = self
                .conns
                .iter()
                .max_by_key(|(_, c)| c.out.len())
                .map(|(t, _)| *t)
            else {
                return;
            };
            self.drop_conn(t, DropReason::OutputBudget, ops);
        }
    }

    /// Writes what the socket accepts; closes the connection when it is done; registers the
    /// interest its state calls for.
    fn flush(&mut self, token: u32, ops: &mut EventOps) {
        let Some(conn) = self.conns.get_mut(&token) else {
            return;
        };
        let before = conn.out.len();
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
        let after = conn.out.len();
        self.queued -= before - after;
        if after < before {
            let now = now_ns();
            conn.active_at = now;
            conn.stalled_since = (after > 0).then_some(now);
        } else if after > 0 {
            conn.stalled_since.get_or_insert_with(now_ns);
        }
        // An HTTP request is answered as soon as its head is whole: at EOF nothing is left.
        let finished = conn.closing || (conn.eof && (conn.is_http() || !conn.input.has_line()));
        if broken || (finished && conn.out.is_empty()) {
            self.close(token, ops);
            return;
        }
        // Output taken below the pause at once (no EPOLLOUT will come): requests that waited
        // for room get a turn.
        if conn.can_answer() && !conn.ready {
            conn.ready = true;
            self.ready.push_back(token);
            let _ = self.kick.write(1);
        }
        let mut want = EventSet::empty();
        if conn.wants_input() {
            want |= EventSet::IN | EventSet::READ_HANG_UP;
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
        if self.conns.get(&token).is_some_and(Conn::can_answer) {
            self.answer(token, ops);
            self.flush(token, ops);
        }
    }

    /// Gives the connections in the ready list their turns, in order, for one round.
    fn on_kick(&mut self, ops: &mut EventOps) {
        let _ = self.kick.read();
        let round_end = now_ns() + ROUND_NS;
        while let Some(t) = self.ready.pop_front() {
            if let Some(c) = self.conns.get_mut(&t) {
                c.ready = false;
                self.answer(t, ops);
                self.flush(t, ops);
            }
            if now_ns() >= round_end {
                break;
            }
        }
        if !self.ready.is_empty() {
            let _ = self.kick.write(1);
        }
    }

    /// Wakes the connections whose rest is over: they are read and answered again.
    fn on_rest(&mut self, ops: &mut EventOps) {
        let _ = self.rest.wait();
        let now = now_ns();
        self.rest_at = None;
        let mut next: Option<u64> = None;
        let mut woken = Vec::new();
        for (t, c) in self.conns.iter_mut() {
            match c.resting_until {
                Some(u) if u <= now => {
                    c.resting_until = None;
                    woken.push(*t);
                }
                Some(u) => next = Some(next.map_or(u, |n| n.min(u))),
                None => {}
            }
        }
        if let Some(until) = next {
            arm_rest(&mut self.rest, &mut self.rest_at, until);
        }
        for t in woken {
            self.answer(t, ops);
            self.flush(t, ops);
        }
    }

    /// Closes the connections past a time limit.
    fn on_sweep(&mut self, ops: &mut EventOps) {
        let _ = self.sweep.wait();
        if self.conns.is_empty() {
            self.sweep_armed = self.sweep.reset(Duration::ZERO, None).is_err();
            return;
        }
        let now = now_ns();
        let past =
            |since: u64, limit: Duration| now.saturating_sub(since) > limit.as_nanos() as u64;
        let timeout = self.limits.client_timeout;
        let idle = self.limits.idle_timeout;
        let doomed: Vec<(u32, DropReason)> = self
            .conns
            .iter()
            .filter_map(|(t, c)| {
                let reason = if c.stalled_since.is_some_and(|s| past(s, timeout)) {
                    DropReason::Stalled
                } else if c.is_http() {
                    (!c.closing && past(c.since, timeout)).then_some(DropReason::HeaderTimeout)?
                } else if c.partial_since.is_some_and(|s| past(s, timeout)) {
                    DropReason::HeaderTimeout
                } else {
                    let limit = idle.filter(|_| c.is_quiet() && !c.closing)?;
                    past(c.active_at, limit).then_some(DropReason::Idle)?
                };
                Some((*t, reason))
            })
            .collect();
        for (t, reason) in doomed {
            self.drop_conn(t, reason, ops);
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
                let before = c.out.len();
                let mut lost = 0;
                for (bit, line) in &lines {
                    if c.mask & bit != 0 && !c.out.push_event(line, EVENT_QUEUE_BYTES) {
                        lost += 1;
                    }
                }
                self.queued += c.out.len() - before;
                if lost > 0 {
                    self.stats.on_events_dropped(lost);
                }
            }
            self.flush(t, ops);
        }
        if self.queued > self.limits.out_budget {
            self.enforce_budget(ops);
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
        self.check_triggers(ops);
    }

    /// Checks each connection's pressure trigger against the board's history; a firing is an
    /// event for that connection alone.
    fn check_triggers(&mut self, ops: &mut EventOps) {
        if !self.conns.values().any(|c| c.trigger.is_some()) {
            return;
        }
        let vm = self.handler.vm().clone();
        let uptime_ns = vm.uptime_ns();
        let history = vm.pressure().lock().history.clone();
        let fired: Vec<(u32, String)> = self
            .conns
            .iter_mut()
            .filter_map(|(token, c)| {
                let t = c.trigger.as_mut()?;
                let f = t.check(&history)?;
                let e = Event::Pressure {
                    uptime_ns,
                    kind: t.spec.kind,
                    threshold_us: t.spec.threshold_us,
                    window_us: t.spec.window_us,
                    stall_us: f.stall_us,
                };
                Some((*token, e.to_line()))
            })
            .collect();
        for (token, line) in fired {
            if let Some(c) = self.conns.get_mut(&token) {
                let before = c.out.len();
                if !c.out.push_event(&line, EVENT_QUEUE_BYTES) {
                    self.stats.on_events_dropped(1);
                }
                self.queued += c.out.len() - before;
            }
            self.flush(token, ops);
        }
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
    pub(super) fn done(&self) -> bool {
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
            TOKEN_SWEEP => self.on_sweep(ops),
            TOKEN_KICK => self.on_kick(ops),
            TOKEN_REST => self.on_rest(ops),
            token => {
                if set.contains(EventSet::ERROR) || set.contains(EventSet::HANG_UP) {
                    self.close(token, ops);
                } else {
                    if set.contains(EventSet::OUT) {
                        self.on_writable(token, ops);
                    }
                    if set.intersects(EventSet::IN | EventSet::READ_HANG_UP) {
                        self.on_readable(token, ops);
                    }
                }
            }
        }
        self.stats.set_queued(self.queued);
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
        add(self.hub.efd().as_raw_fd(), TOKEN_HUB);
        add(self.timer.as_raw_fd(), TOKEN_TIMER);
        add(self.stop.as_raw_fd(), TOKEN_STOP);
        add(self.sweep.as_raw_fd(), TOKEN_SWEEP);
        add(self.kick.as_raw_fd(), TOKEN_KICK);
        add(self.rest.as_raw_fd(), TOKEN_REST);
    }
}

mod accept;
mod client;
#[cfg(test)]
mod tests;
