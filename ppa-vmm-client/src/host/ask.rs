//! Asking every VM of a scan at once, from a few threads, with one deadline ([`gather`]).
//!
//! Data flow: the VMs are dealt to up to [`MAX_THREADS`] threads (one per [`PER_THREAD`]
//! VMs); each connects to its VMs' control sockets without blocking (at most [`MAX_OPEN`]
//! connections open over all threads; the others wait for a free slot) and sends the first
//! request at once: `stats`, then `metrics` when asked, then after the interval a second
//! `stats` (sent up to a quarter of the interval early, so that one wake-up sends it to every
//! VM whose interval ends about then). One `poll(2)` per thread over its open connections
//! waits for whatever arrives next; each answer line is matched to its request by id (event
//! lines and stale answers are skipped) and moves its VM to the next step. At the deadline
//! one last round reads what has arrived without waiting; every VM still waiting is then
//! `not answering` (one that gave its first `stats` but not the second gives that one), and
//! its connection is dropped: a VMM that accepts and never answers, or whose queue is full,
//! costs one descriptor until then and never holds up the others.
//!
//! A few threads rather than one per VM: with 200 VMMs on the 2-core development host
//! (docs/operations.md, "200 VMs on one host") the thread per VM spent 1.5-2.5 s starting
//! 200 threads, twice the CPU, and missed the deadline for 5-24 % of the VMs.

use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ppa_vmm_api::{Command, Request, RequestId, Stats};
use serde_json::Value;
use thiserror::Error;

use crate::rundir::{Descriptor, Scan};

/// Most connections open at once (over all threads).
pub const MAX_OPEN: usize = 256;
/// Most threads that ask, each for its share of the VMs.
pub const MAX_THREADS: usize = 4;
/// VMs per thread before another is started.
pub const PER_THREAD: usize = 32;
/// Longest line read from a VMM while a `stats` answer is awaited (event lines and stale
/// answers on the way count too). A `stats` answer of a 256-vCPU VM is about 83 KB (an idle
/// tiny guest, measured 2026-11-28); a longer line is that VM's error
/// ([`AskError::TooLong`]), read no further, and never holds more than this in memory.
pub const MAX_STATS_LINE: usize = 4 << 20;
/// Longest line read while a `metrics` answer is awaited (the exposition as one JSON string:
/// a 256-vCPU VM's is about 2.0 MB, measured as above).
pub const MAX_METRICS_LINE: usize = 32 << 20;
/// How often a connection the VMM's queue refused (`EAGAIN`) is tried again.
const RETRY: Duration = Duration::from_millis(5);

/// Why a VM's answer is missing.
#[derive(Debug, Clone, Error)]
pub enum AskError {
    /// Its descriptor names no socket.
    #[error("the VM has no control socket")]
    NoSocket,
    /// The socket could not be connected to.
    #[error("cannot connect to {path}")]
    Connect {
        /// The socket.
        path: PathBuf,
        /// Cause.
        #[source]
        source: Arc<io::Error>,
    },
    /// Reading or writing the connection failed.
    #[error("the connection to the VMM failed")]
    Io(#[source] Arc<io::Error>),
    /// The VMM closed the connection before it answered.
    #[error("the VMM closed the connection before it answered")]
    Closed,
    /// Nothing, or not everything, by the deadline.
    #[error("no answer within {waited_ms} ms")]
    NoAnswer {
        /// How long it had, ms.
        waited_ms: u64,
    },
    /// The VMM refused a command.
    #[error("the VMM refused `{cmd}`: {message}")]
    Refused {
        /// The command.
        cmd: &'static str,
        /// What it said.
        message: String,
    },
    /// A line that is not the expected answer.
    #[error("an answer that is not `{cmd}`")]
    BadAnswer {
        /// The command.
        cmd: &'static str,
        /// Cause.
        #[source]
        source: Arc<serde_json::Error>,
    },
    /// A line longer than the most read of one ([`MAX_STATS_LINE`], [`MAX_METRICS_LINE`]).
    #[error(
        "the VMM sent a line longer than {bound} bytes while `{cmd}` was awaited, the most \
         read of one: the rest was not read"
    )]
    TooLong {
        /// The command awaited.
        cmd: &'static str,
        /// The most read of one line, bytes.
        bound: usize,
    },
}

impl AskError {
    /// Whether the VM was reached but did not answer in time (else it could not be reached,
    /// or answered wrongly).
    pub fn is_late(&self) -> bool {
        matches!(self, AskError::NoAnswer { .. })
    }
}

/// What one VM answered.
#[derive(Debug, Clone)]
pub struct Answer {
    /// `stats` at the start and, when asked for, after the interval.
    pub stats: Vec<Stats>,
    /// Seconds between the two `stats`, measured.
    pub interval_s: f64,
    /// The `metrics` text, when asked for.
    pub metrics: Option<String>,
}

/// One VM as the host view sees it.
#[derive(Debug, Clone)]
pub struct VmView {
    /// Its descriptor.
    pub descriptor: Descriptor,
    /// What it answered, or why not.
    pub answer: Result<Answer, AskError>,
}

/// What [`gather`] asks each VM.
#[derive(Debug, Clone, Copy)]
pub struct Ask {
    /// A second `stats` after this long (rates), or just one.
    pub interval: Option<Duration>,
    /// The `metrics` text too.
    pub metrics: bool,
    /// Deadline for every VM's answer, from the start (the interval comes on top).
    pub timeout: Duration,
}

/// What a connection waits for.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Step {
    /// The first `stats`.
    Stats,
    /// The `metrics` text.
    Metrics,
    /// The end of the interval, to send the second `stats`.
    Pause(Instant),
    /// The second `stats`.
    Again,
}

impl Step {
    fn cmd(self) -> &'static str {
        match self {
            Step::Metrics => "metrics",
            _ => "stats",
        }
    }

    /// The longest line read while this step waits.
    fn max_line(self) -> usize {
        match self {
            Step::Metrics => MAX_METRICS_LINE,
            _ => MAX_STATS_LINE,
        }
    }
}

/// Appends `bytes` to `input`, growing its allocation by doubling but never past `cap` bytes
/// (a plain `extend` could double a buffer of `cap` bytes to twice that).
fn push_bounded(input: &mut Vec<u8>, bytes: &[u8], cap: usize) {
    let need = input.len() + bytes.len();
    if need > input.capacity() {
        let want = (input.capacity() * 2).clamp(need, cap.max(need));
        input.reserve_exact(want - input.len());
    }
    input.extend_from_slice(bytes);
}

/// One VM's connection and what it has answered so far.
struct Conn {
    vm: usize,
    stream: UnixStream,
    out: Vec<u8>,
    input: Vec<u8>,
    /// How much of `input` holds no newline.
    scanned: usize,
    next_id: u64,
    step: Step,
    t0: Instant,
    t1: Instant,
    stats: Vec<Stats>,
    metrics: Option<String>,
}

impl Conn {
    fn new(vm: usize, stream: UnixStream) -> Conn {
        let now = Instant::now();
        let mut c = Conn {
            vm,
            stream,
            out: Vec::new(),
            input: Vec::new(),
            scanned: 0,
            next_id: 1,
            step: Step::Stats,
            t0: now,
            t1: now,
            stats: Vec::new(),
            metrics: None,
        };
        c.send(Command::Stats {});
        c
    }

    /// Queues `command` (sent by [`Conn::flush`]).
    fn send(&mut self, command: Command) {
        let line = Request {
            id: RequestId::from(self.next_id),
            command,
        }
        .to_line();
        self.out.extend_from_slice(line.as_bytes());
        self.out.push(b'\n');
    }

    /// Writes what is queued, as far as the socket takes it.
    fn flush(&mut self) -> Result<(), AskError> {
        while !self.out.is_empty() {
            match (&self.stream).write(&self.out) {
                Ok(0) => return Err(AskError::Closed),
                Ok(n) => drop(self.out.drain(..n)),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(AskError::Io(Arc::new(e))),
            }
        }
        Ok(())
    }

    /// Reads what arrived and handles each whole line: `Ok(true)` once the VM has answered
    /// everything.
    /// A line longer than its step's bound is an error once the bound is passed: at most
    /// the bound and one byte are ever held.
    fn receive(&mut self, ask: Ask) -> Result<bool, AskError> {
        let mut buf = [0u8; 65536];
        loop {
            let bound = self.step.max_line();
            // At least one byte: the input is within the bound here.
            let room = (bound + 1)
                .saturating_sub(self.input.len())
                .clamp(1, buf.len());
            match (&self.stream).read(&mut buf[..room]) {
                Ok(0) => return Err(AskError::Closed),
                Ok(n) => push_bounded(&mut self.input, &buf[..n], bound + 1),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(AskError::Io(Arc::new(e))),
            }
            while let Some(at) = self.input[self.scanned..].iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.input.drain(..=self.scanned + at).collect();
                self.scanned = 0;
                if self.handle(&line, ask)? {
                    return Ok(true);
                }
            }
            self.scanned = self.input.len();
            let bound = self.step.max_line();
            if self.input.len() > bound {
                return Err(AskError::TooLong {
                    cmd: self.step.cmd(),
                    bound,
                });
            }
        }
        Ok(false)
    }

    /// One answer line: `Ok(true)` once the VM has answered everything.
    fn handle(&mut self, line: &[u8], ask: Ask) -> Result<bool, AskError> {
        if line.iter().all(u8::is_ascii_whitespace) {
            return Ok(false);
        }
        let cmd = self.step.cmd();
        let bad = |source| AskError::BadAnswer {
            cmd,
            source: Arc::new(source),
        };
        let id = RequestId::from(self.next_id);
        let Some(result) = crate::matching_response(line, &id).map_err(bad)? else {
            return Ok(false);
        };
        let result = result
            .result
            .filter(|_| result.ok)
            .ok_or_else(|| AskError::Refused {
                cmd,
                message: result.error.map_or("no reason given".into(), |e| e.message),
            })?;
        self.next_id += 1;
        match self.step {
            Step::Stats | Step::Again => self
                .stats
                .push(serde_json::from_value(result).map_err(bad)?),
            Step::Metrics => match result {
                Value::String(s) => self.metrics = Some(s),
                _ => {
                    return Err(AskError::Refused {
                        cmd,
                        message: "the metrics are not a text".into(),
                    })
                }
            },
            Step::Pause(_) => return Ok(false),
        }
        self.step = match (self.step, ask.interval) {
            (Step::Stats, _) if ask.metrics => {
                self.send(Command::Metrics {});
                Step::Metrics
            }
            (Step::Stats | Step::Metrics, Some(i)) => Step::Pause(self.t0 + i),
            _ => return Ok(true),
        };
        Ok(false)
    }

    /// Sends the second `stats` once the interval is over, or within `slack` of its end (so
    /// that one wake-up sends it to every VM whose interval ends about then).
    fn tick(&mut self, now: Instant, slack: Duration) {
        if let Step::Pause(until) = self.step {
            if now + slack >= until {
                self.t1 = now;
                self.send(Command::Stats {});
                self.step = Step::Again;
            }
        }
    }

    fn answer(self) -> Answer {
        Answer {
            interval_s: if self.stats.len() > 1 {
                (self.t1 - self.t0).as_secs_f64()
            } else {
                0.0
            },
            stats: self.stats,
            metrics: self.metrics,
        }
    }
}

/// Connects to the Unix socket `path` without blocking; `WouldBlock` when its queue is full.
fn connect(path: &Path) -> io::Result<UnixStream> {
    let bytes = path.as_os_str().as_bytes();
    // SAFETY: sockaddr_un is plain data; all zeroes is a valid (empty) value of it.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    if bytes.is_empty() || bytes.len() >= addr.sun_path.len() || bytes.contains(&0) {
        return Err(io::Error::from(io::ErrorKind::InvalidInput));
    }
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (d, s) in addr.sun_path.iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    // SAFETY: socket takes no pointers; a negative result is an error, checked below.
    let fd = unsafe {
        libc::socket(
            libc::AF_UNIX,
            libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is a descriptor socket just returned, owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let len = std::mem::size_of::<libc::sa_family_t>() + bytes.len() + 1;
    // SAFETY: addr is a live sockaddr_un whose first len bytes (family, path, its NUL: the
    // path is shorter than sun_path, checked above) are initialised; connect only reads them.
    let r = unsafe {
        libc::connect(
            fd.as_raw_fd(),
            std::ptr::addr_of!(addr).cast::<libc::sockaddr>(),
            len as libc::socklen_t,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(UnixStream::from(fd))
}

/// Every VM's state while [`gather`] runs.
struct Gathering<'s> {
    scan: &'s Scan,
    ask: Ask,
    deadline: Instant,
    /// VMs not yet connected, in order (those whose queue was full come back).
    waiting: std::collections::VecDeque<usize>,
    /// Most connections open at once.
    max_open: usize,
    open: Vec<Conn>,
    answers: Vec<Option<Result<Answer, AskError>>>,
}

impl Gathering<'_> {
    /// Connects while slots are free; a full queue is tried again later.
    fn open_more(&mut self) {
        let mut retry = Vec::new();
        while self.open.len() < self.max_open {
            let Some(vm) = self.waiting.pop_front() else {
                break;
            };
            let Some(path) = self.scan.vms[vm].descriptor.socket.as_deref() else {
                self.answers[vm] = Some(Err(AskError::NoSocket));
                continue;
            };
            match connect(path) {
                Ok(s) => self.open.push(Conn::new(vm, s)),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => retry.push(vm),
                Err(e) => {
                    self.answers[vm] = Some(Err(AskError::Connect {
                        path: path.to_path_buf(),
                        source: Arc::new(e),
                    }))
                }
            }
        }
        self.waiting.extend(retry);
    }

    /// Ends connection `i` with `r`.
    fn finish(&mut self, i: usize, r: Result<(), AskError>) {
        let c = self.open.swap_remove(i);
        let vm = c.vm;
        self.answers[vm] = Some(r.map(|()| c.answer()));
    }

    /// How early an interval may end: a quarter of it.
    fn slack(&self) -> Duration {
        self.ask.interval.unwrap_or_default() / 4
    }

    /// How long `poll` may wait: until the deadline, the next interval's end, or the next
    /// connection retry.
    fn wait_ms(&self, now: Instant) -> libc::c_int {
        let mut until = self.deadline;
        for c in &self.open {
            if let Step::Pause(t) = c.step {
                until = until.min(t.checked_sub(self.slack()).unwrap_or(t));
            }
        }
        if !self.waiting.is_empty() {
            until = until.min(now + RETRY);
        }
        let d = until.saturating_duration_since(now);
        // Rounded up: waking before the time would only poll again.
        d.as_micros().div_ceil(1000).min(i32::MAX as u128) as libc::c_int
    }

    /// One round: send what is due, wait, read what arrived.
    fn round(&mut self) {
        let now = Instant::now();
        let slack = self.slack();
        for c in &mut self.open {
            c.tick(now, slack);
        }
        let mut i = 0;
        while i < self.open.len() {
            match self.open[i].flush() {
                Ok(()) => i += 1,
                Err(e) => self.finish(i, Err(e)),
            }
        }
        let mut fds: Vec<libc::pollfd> = self
            .open
            .iter()
            .map(|c| libc::pollfd {
                fd: c.stream.as_raw_fd(),
                events: libc::POLLIN | if c.out.is_empty() { 0 } else { libc::POLLOUT },
                revents: 0,
            })
            .collect();
        let wait = self.wait_ms(now);
        // SAFETY: fds is a live array of fds.len() pollfd entries, each naming a descriptor
        // that self.open owns for the whole call; poll writes only their revents.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, wait) };
        if n <= 0 {
            return;
        }
        // From the end: finish swaps the last connection into the place it removes.
        for i in (0..fds.len()).rev() {
            if fds[i].revents == 0 {
                continue;
            }
            match self.open[i].receive(self.ask) {
                Ok(false) => {}
                Ok(true) => self.finish(i, Ok(())),
                Err(e) => self.finish(i, Err(e)),
            }
        }
    }
}

/// Asks every VM of `scan` at once; what has not arrived by the deadline (the timeout, and
/// the interval on top) is [`AskError::NoAnswer`], except that a VM whose second `stats`
/// alone is missing gives its first (its state, no rates). Up to [`MAX_THREADS`] threads
/// ask, each for every n-th VM; one that cannot be started leaves its share to this one.
pub fn gather(scan: &Scan, ask: Ask) -> Vec<VmView> {
    let deadline = Instant::now() + ask.timeout + ask.interval.unwrap_or_default();
    let shares = scan.vms.len().div_ceil(PER_THREAD).clamp(1, MAX_THREADS);
    let mut answers: Vec<Option<Result<Answer, AskError>>> = vec![None; scan.vms.len()];
    std::thread::scope(|s| {
        let mut mine = vec![0];
        let mut threads = Vec::new();
        for k in 1..shares {
            let spawned = std::thread::Builder::new()
                .name("host-ask".into())
                .spawn_scoped(s, move || ask_share(scan, ask, deadline, (k, shares)));
            match spawned {
                Ok(t) => threads.push(t),
                Err(_) => mine.push(k),
            }
        }
        let mut got: Vec<_> = mine
            .into_iter()
            .flat_map(|k| ask_share(scan, ask, deadline, (k, shares)))
            .collect();
        for t in threads {
            got.extend(t.join().unwrap_or_default());
        }
        for (vm, a) in got {
            answers[vm] = Some(a);
        }
    });
    let waited_ms = ask.timeout.as_millis() as u64;
    scan.vms
        .iter()
        .zip(answers)
        .map(|(e, a)| VmView {
            descriptor: e.descriptor.clone(),
            answer: a.unwrap_or(Err(AskError::NoAnswer { waited_ms })),
        })
        .collect()
}

/// Asks the VMs `k`, `k + n`, `k + 2n`, ... of `scan` (`(k, n)` = `share`); their answers,
/// by index (a VM missing from them did not answer by the deadline).
fn ask_share(
    scan: &Scan,
    ask: Ask,
    deadline: Instant,
    share: (usize, usize),
) -> Vec<(usize, Result<Answer, AskError>)> {
    let (k, n) = share;
    let mut g = Gathering {
        scan,
        ask,
        deadline,
        waiting: (k..scan.vms.len()).step_by(n).collect(),
        max_open: (MAX_OPEN / n).max(1),
        open: Vec::new(),
        answers: vec![None; scan.vms.len()],
    };
    loop {
        g.open_more();
        if g.open.is_empty() && g.waiting.is_empty() {
            break;
        }
        // Past the deadline, one last round that does not wait: what has arrived counts (a
        // starved host may have been slow to read it).
        let last = Instant::now() >= deadline;
        g.round();
        if last {
            break;
        }
    }
    // A VM that gave its first answers but not the second `stats` in time: what it gave.
    for c in std::mem::take(&mut g.open) {
        if matches!(c.step, Step::Pause(_) | Step::Again) {
            let vm = c.vm;
            g.answers[vm] = Some(Ok(c.answer()));
        }
    }
    g.answers
        .into_iter()
        .enumerate()
        .filter_map(|(vm, a)| Some((vm, a?)))
        .collect()
}

#[cfg(test)]
mod tests;
