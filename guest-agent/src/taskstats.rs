//! Linux taskstats over generic netlink: an exit notification for every task that ends, and
//! per-thread queries for delay-accounting totals.
//!
//! Data flow: [`Taskstats::open`] resolves the `TASKSTATS` family, registers a socket for the
//! exits of every possible CPU (the kernel keeps one listener list per CPU and sends an exit
//! on the list of the CPU the task exits on, so all of them are registered), and opens a
//! second socket for queries. The agent polls [`Taskstats::exit_fd`] between samples and
//! calls [`Taskstats::drain`], which parses each datagram with [`parse`] into [`TaskExit`]s.
//! Registration needs `CAP_NET_ADMIN` in the initial user and PID namespaces; without it the
//! agent falls back to what /proc shows (see `collect`).
//!
//! The `struct taskstats` payload is read by byte offset ([`stats`]), checked against the
//! attribute's length, so kernels with an older or newer version of it (Debian 6.1 sends
//! version 13, 416 bytes; 6.18 sends 16) parse alike; fields a kernel does not send are 0.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use ppa_guest_abi::ppa_page::{COMM_LEN, DELAY_KINDS};
use thiserror::Error;

/// Generic netlink's controller family.
const GENL_ID_CTRL: u16 = 0x10;
const CTRL_CMD_GETFAMILY: u8 = 3;
const CTRL_ATTR_FAMILY_ID: u16 = 1;
const CTRL_ATTR_FAMILY_NAME: u16 = 2;
const TASKSTATS_CMD_GET: u8 = 1;
const TASKSTATS_CMD_NEW: u8 = 2;
const TASKSTATS_CMD_ATTR_PID: u16 = 1;
const TASKSTATS_CMD_ATTR_REGISTER_CPUMASK: u16 = 3;
const TASKSTATS_TYPE_PID: u16 = 1;
const TASKSTATS_TYPE_STATS: u16 = 3;
const TASKSTATS_TYPE_AGGR_PID: u16 = 4;
const NLMSG_ERROR: u16 = 2;
const NLM_F_REQUEST: u16 = 1;
const NLM_F_ACK: u16 = 4;
const NLA_TYPE_MASK: u16 = 0x3fff;
/// `ac_flag` bit: the last thread of its group (the process ended).
const AGROUP: u8 = 0x20;
/// Receive buffer asked of the kernel for exit notifications.
const RCVBUF: libc::c_int = 4 << 20;

/// Why taskstats cannot be used.
#[derive(Debug, Error)]
pub enum TaskstatsError {
    /// A netlink socket could not be made.
    #[error("cannot open a generic netlink socket")]
    Socket(#[source] io::Error),
    /// The kernel has no taskstats family (built without CONFIG_TASKSTATS).
    #[error("the kernel has no TASKSTATS netlink family (built without CONFIG_TASKSTATS)")]
    NoFamily,
    /// Registering for exit notifications was refused.
    #[error("registering for taskstats exit notifications was refused{why}")]
    Register {
        /// What the agent knows about why.
        why: &'static str,
        /// Cause.
        #[source]
        source: io::Error,
    },
    /// Talking to the kernel failed.
    #[error("a taskstats netlink exchange failed")]
    Io(#[source] io::Error),
}

/// The final figures of a task that exited, or a live thread's from a query.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TaskExit {
    /// Thread id.
    pub tid: u32,
    /// Thread group id.
    pub tgid: u32,
    /// Name, as `procfs::comm` makes it.
    pub comm: [u8; COMM_LEN],
    /// On-CPU time, ns: the scheduler's `sum_exec_runtime` (`cpu_run_virtual_total`) as of
    /// its last update before the exit path, which leaves out the slice the task was in
    /// when it began to exit (the scheduler updates it on ticks and switches). A task
    /// switched onto a CPU only once ran that one slice from its start to its exit: its
    /// time is its elapsed time less its run-queue wait, when that is more.
    pub cpu_ns: u64,
    /// The scheduler's figure alone, ns (`cpu_ns` before the one-slice correction).
    pub sched_cpu_ns: u64,
    /// Time from its start to its exit, ns (µs resolution).
    pub elapsed_ns: u64,
    /// Run-queue wait, ns.
    pub run_delay_ns: u64,
    /// Timeslices.
    pub timeslices: u64,
    /// User and system time, ns (µs resolution): the kernel's tick-sampled split
    /// (`ac_utime`, `ac_stime`), not scaled to `cpu_ns`.
    pub utime_ns: u64,
    /// See `utime_ns`.
    pub stime_ns: u64,
    /// Voluntary and involuntary switches.
    pub nvcsw: u64,
    /// See `nvcsw`.
    pub nivcsw: u64,
    /// Delay totals, ns, by kind: block I/O, swap-in, memory reclaim, IRQ, thrashing,
    /// compaction, write-protect copy (`ppa_page::DELAY_KINDS`; 0 where the kernel's
    /// version of the struct has no such field).
    pub delays: [u64; DELAY_KINDS],
    /// How many delays of each kind, same order.
    pub delay_counts: [u64; DELAY_KINDS],
    /// It was the last thread of its process.
    pub group_end: bool,
}

fn u64_at(b: &[u8], off: usize) -> u64 {
    b.get(off..off + 8)
        .map_or(0, |s| u64::from_le_bytes(s.try_into().unwrap_or([0; 8])))
}

fn u32_at(b: &[u8], off: usize) -> u32 {
    b.get(off..off + 4)
        .map_or(0, |s| u32::from_le_bytes(s.try_into().unwrap_or([0; 4])))
}

/// Each delay kind's (count, total) byte offsets in `struct taskstats`, and the struct version
/// that added them: block I/O and swap-in (1), memory reclaim (3), thrashing (9),
/// compaction (11), write-protect copy (13, Linux 6.0), IRQ (14, Linux 6.8). A field past
/// the payload the kernel sent reads 0.
const DELAY_FIELDS: [(usize, usize, u16); DELAY_KINDS] = [
    (32, 40, 1),
    (48, 56, 1),
    (312, 320, 3),
    (416, 424, 14),
    (328, 336, 9),
    (352, 360, 11),
    (400, 408, 13),
];

/// Decodes a `struct taskstats` payload by field offset (include/uapi/linux/taskstats.h).
/// `None` when it is shorter than version 1's 328 bytes.
pub fn stats(b: &[u8]) -> Option<TaskExit> {
    if b.len() < 328 {
        return None;
    }
    let comm_raw = &b[80..112];
    let n = comm_raw
        .iter()
        .position(|&c| c == 0)
        .unwrap_or(comm_raw.len());
    let sched_cpu_ns = u64_at(b, 72);
    let run_delay_ns = u64_at(b, 24);
    let timeslices = u64_at(b, 16);
    let elapsed_ns = u64_at(b, 144).saturating_mul(1000);
    let version = u16::from_le_bytes([b[0], b[1]]);
    let cpu_ns = if timeslices == 1 {
        sched_cpu_ns.max(elapsed_ns.saturating_sub(run_delay_ns))
    } else {
        sched_cpu_ns
    };
    Some(TaskExit {
        tid: u32_at(b, 128),
        tgid: u32_at(b, 368),
        comm: crate::procfs::comm(&comm_raw[..n]),
        cpu_ns,
        sched_cpu_ns,
        elapsed_ns,
        run_delay_ns,
        timeslices,
        utime_ns: u64_at(b, 152).saturating_mul(1000),
        stime_ns: u64_at(b, 160).saturating_mul(1000),
        nvcsw: u64_at(b, 272),
        nivcsw: u64_at(b, 280),
        delays: DELAY_FIELDS.map(|(_, total, since)| {
            if version >= since {
                u64_at(b, total)
            } else {
                0
            }
        }),
        delay_counts: DELAY_FIELDS.map(|(count, _, since)| {
            if version >= since {
                u64_at(b, count)
            } else {
                0
            }
        }),
        group_end: b[8] & AGROUP != 0,
    })
}

/// The attributes in `b`: (type, payload). A truncated attribute ends the list.
fn attrs(mut b: &[u8]) -> impl Iterator<Item = (u16, &[u8])> + '_ {
    std::iter::from_fn(move || {
        if b.len() < 4 {
            return None;
        }
        let len = u16::from_le_bytes([b[0], b[1]]) as usize;
        let ty = u16::from_le_bytes([b[2], b[3]]) & NLA_TYPE_MASK;
        if len < 4 || len > b.len() {
            return None;
        }
        let payload = &b[4..len];
        b = b.get((len + 3) & !3..).unwrap_or(&[]);
        Some((ty, payload))
    })
}

/// What one netlink datagram held.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Parsed {
    /// Per-task records (exits, or query replies).
    pub tasks: Vec<TaskExit>,
    /// Errors and acknowledgements: (sequence number, errno as the kernel gives it, ≤ 0).
    pub acks: Vec<(u32, i32)>,
    /// The family id, when the datagram answers a family lookup.
    pub family: Option<u16>,
}

/// Parses one datagram of netlink messages. Messages of other families and attributes the
/// agent does not know are skipped; a truncated message ends the parse.
pub fn parse(mut b: &[u8], family: u16) -> Parsed {
    let mut out = Parsed::default();
    while b.len() >= 16 {
        let len = u32_at(b, 0) as usize;
        let ty = u16::from_le_bytes([b[4], b[5]]);
        let seq = u32_at(b, 8);
        if len < 16 || len > b.len() {
            break;
        }
        let body = &b[16..len];
        if ty == NLMSG_ERROR && body.len() >= 4 {
            out.acks.push((
                seq,
                i32::from_le_bytes([body[0], body[1], body[2], body[3]]),
            ));
        } else if ty == GENL_ID_CTRL && body.len() >= 4 {
            for (t, p) in attrs(&body[4..]) {
                if t == CTRL_ATTR_FAMILY_ID && p.len() >= 2 {
                    out.family = Some(u16::from_le_bytes([p[0], p[1]]));
                }
            }
        } else if ty == family && family != 0 && body.len() >= 4 && body[0] == TASKSTATS_CMD_NEW {
            for (t, p) in attrs(&body[4..]) {
                // AGGR_TGID (a process's sum) is left out: each of its threads has its own.
                if t != TASKSTATS_TYPE_AGGR_PID {
                    continue;
                }
                let mut tid = 0;
                for (t, p) in attrs(p) {
                    match t {
                        TASKSTATS_TYPE_PID => tid = u32_at(p, 0),
                        TASKSTATS_TYPE_STATS => {
                            if let Some(mut s) = stats(p) {
                                if s.tid == 0 {
                                    s.tid = tid;
                                }
                                out.tasks.push(s);
                            }
                        }
                        _ => {}
                    }
                }
            }
        }
        b = b.get((len + 3) & !3..).unwrap_or(&[]);
    }
    out
}

/// Appends a netlink request: header, generic header, one attribute.
fn request(ty: u16, flags: u16, seq: u32, cmd: u8, attr: u16, payload: &[u8]) -> Vec<u8> {
    let attr_len = 4 + payload.len();
    let len = 16 + 4 + ((attr_len + 3) & !3);
    let mut m = Vec::with_capacity(len);
    m.extend_from_slice(&(len as u32).to_le_bytes());
    m.extend_from_slice(&ty.to_le_bytes());
    m.extend_from_slice(&(NLM_F_REQUEST | flags).to_le_bytes());
    m.extend_from_slice(&seq.to_le_bytes());
    m.extend_from_slice(&0u32.to_le_bytes());
    m.extend_from_slice(&[cmd, 1, 0, 0]);
    m.extend_from_slice(&(attr_len as u16).to_le_bytes());
    m.extend_from_slice(&attr.to_le_bytes());
    m.extend_from_slice(payload);
    m.resize(len, 0);
    m
}

fn socket() -> Result<OwnedFd, TaskstatsError> {
    // SAFETY: plain socket(2); the result is checked and owned below.
    let fd = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            libc::NETLINK_GENERIC,
        )
    };
    if fd < 0 {
        return Err(TaskstatsError::Socket(io::Error::last_os_error()));
    }
    // SAFETY: `fd` is a new descriptor nobody else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: a zeroed sockaddr_nl is valid (pid 0: the kernel assigns one).
    let mut sa: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
    sa.nl_family = libc::AF_NETLINK as libc::sa_family_t;
    // SAFETY: `sa` is a valid sockaddr_nl of the size given.
    let r = unsafe {
        libc::bind(
            fd.as_raw_fd(),
            (&sa as *const libc::sockaddr_nl).cast(),
            std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t,
        )
    };
    if r != 0 {
        return Err(TaskstatsError::Socket(io::Error::last_os_error()));
    }
    Ok(fd)
}

fn send(fd: &OwnedFd, msg: &[u8]) -> io::Result<()> {
    // SAFETY: a zeroed sockaddr_nl addresses the kernel (pid 0).
    let mut sa: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
    sa.nl_family = libc::AF_NETLINK as libc::sa_family_t;
    // SAFETY: `msg` is valid for its length; `sa` is a valid address of the size given.
    let r = unsafe {
        libc::sendto(
            fd.as_raw_fd(),
            msg.as_ptr().cast(),
            msg.len(),
            0,
            (&sa as *const libc::sockaddr_nl).cast(),
            std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// One datagram into `buf`; `Ok(None)` when nothing is waiting and `wait` is false.
fn recv(fd: &OwnedFd, buf: &mut [u8], wait: bool) -> io::Result<Option<usize>> {
    let flags = if wait { 0 } else { libc::MSG_DONTWAIT };
    // SAFETY: `buf` is valid for writes of its length.
    let n = unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), flags) };
    if n < 0 {
        let e = io::Error::last_os_error();
        if e.kind() == io::ErrorKind::WouldBlock {
            return Ok(None);
        }
        return Err(e);
    }
    Ok(Some(n as usize))
}

/// Sends a request that asks for an acknowledgement and waits for it, keeping what else
/// arrives meanwhile in `kept`.
fn call(
    fd: &OwnedFd,
    buf: &mut [u8],
    msg: &[u8],
    seq: u32,
    family: u16,
    kept: &mut Parsed,
) -> io::Result<()> {
    send(fd, msg)?;
    // A socket timeout keeps a kernel that never answers from hanging the agent.
    let tv = libc::timeval {
        tv_sec: 2,
        tv_usec: 0,
    };
    // SAFETY: `tv` is a valid timeval of the size given.
    unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&tv as *const libc::timeval).cast(),
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        )
    };
    loop {
        let n = recv(fd, buf, true)?.unwrap_or(0);
        let p = parse(&buf[..n], family);
        kept.tasks.extend(p.tasks);
        if p.family.is_some() {
            kept.family = p.family;
        }
        if let Some(&(_, err)) = p.acks.iter().find(|(s, _)| *s == seq) {
            return if err == 0 {
                Ok(())
            } else {
                Err(io::Error::from_raw_os_error(-err))
            };
        }
    }
}

/// Registered taskstats sockets.
#[derive(Debug)]
pub struct Taskstats {
    exits: OwnedFd,
    query: OwnedFd,
    family: u16,
    buf: Vec<u8>,
    seq: u32,
    lost: bool,
}

impl Taskstats {
    /// Finds the family and registers for the exits of the CPUs in `cpus` (a list such as
    /// `0-3`, from /sys/devices/system/cpu/possible).
    pub fn open(cpus: &str) -> Result<Taskstats, TaskstatsError> {
        let exits = socket()?;
        let query = socket()?;
        let mut buf = vec![0u8; 64 << 10];
        let mut kept = Parsed::default();
        let lookup = request(
            GENL_ID_CTRL,
            NLM_F_ACK,
            1,
            CTRL_CMD_GETFAMILY,
            CTRL_ATTR_FAMILY_NAME,
            b"TASKSTATS\0",
        );
        call(&query, &mut buf, &lookup, 1, 0, &mut kept).map_err(|e| {
            if e.raw_os_error() == Some(libc::ENOENT) {
                TaskstatsError::NoFamily
            } else {
                TaskstatsError::Io(e)
            }
        })?;
        let family = kept.family.ok_or(TaskstatsError::NoFamily)?;
        for opt in [libc::SO_RCVBUFFORCE, libc::SO_RCVBUF] {
            // SAFETY: an int option of the size given; failure only leaves the default.
            let r = unsafe {
                libc::setsockopt(
                    exits.as_raw_fd(),
                    libc::SOL_SOCKET,
                    opt,
                    (&RCVBUF as *const libc::c_int).cast(),
                    std::mem::size_of::<libc::c_int>() as libc::socklen_t,
                )
            };
            if r == 0 {
                break;
            }
        }
        let mut mask = cpus.trim().as_bytes().to_vec();
        mask.push(0);
        let reg = request(
            family,
            NLM_F_ACK,
            2,
            TASKSTATS_CMD_GET,
            TASKSTATS_CMD_ATTR_REGISTER_CPUMASK,
            &mask,
        );
        call(&exits, &mut buf, &reg, 2, family, &mut Parsed::default()).map_err(|source| {
            let why = match source.raw_os_error() {
                Some(libc::EPERM) | Some(libc::EACCES) => {
                    " (the agent needs CAP_NET_ADMIN)"
                }
                Some(libc::EINVAL) => {
                    " (the agent must run in the initial user and PID namespaces, and the CPU list must be possible CPUs)"
                }
                _ => "",
            };
            TaskstatsError::Register { why, source }
        })?;
        // The exit socket is read without blocking from now on.
        // SAFETY: `exits` is our descriptor; flags are read and written back with O_NONBLOCK.
        unsafe {
            let fl = libc::fcntl(exits.as_raw_fd(), libc::F_GETFL);
            libc::fcntl(exits.as_raw_fd(), libc::F_SETFL, fl | libc::O_NONBLOCK);
        }
        Ok(Taskstats {
            exits,
            query,
            family,
            buf,
            seq: 2,
            lost: false,
        })
    }

    /// The descriptor to poll for exit notifications.
    pub fn exit_fd(&self) -> RawFd {
        self.exits.as_raw_fd()
    }

    /// Whether the kernel dropped notifications since the last call (its socket buffer
    /// overflowed: `ENOBUFS`).
    pub fn take_lost(&mut self) -> bool {
        std::mem::take(&mut self.lost)
    }

    /// Hands every exit notification waiting to `f`, without blocking.
    pub fn drain(&mut self, mut f: impl FnMut(TaskExit)) -> Result<(), TaskstatsError> {
        loop {
            match recv(&self.exits, &mut self.buf, false) {
                Ok(None) => return Ok(()),
                Ok(Some(n)) => parse(&self.buf[..n], self.family)
                    .tasks
                    .into_iter()
                    .for_each(&mut f),
                Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => self.lost = true,
                Err(e) => return Err(TaskstatsError::Io(e)),
            }
        }
    }

    /// A live thread's figures (its delay totals), `None` when it is gone.
    pub fn query(&mut self, tid: u32) -> Result<Option<TaskExit>, TaskstatsError> {
        self.seq = self.seq.wrapping_add(1);
        let msg = request(
            self.family,
            0,
            self.seq,
            TASKSTATS_CMD_GET,
            TASKSTATS_CMD_ATTR_PID,
            &tid.to_le_bytes(),
        );
        send(&self.query, &msg).map_err(TaskstatsError::Io)?;
        loop {
            let n = recv(&self.query, &mut self.buf, true)
                .map_err(TaskstatsError::Io)?
                .unwrap_or(0);
            let p = parse(&self.buf[..n], self.family);
            if let Some(t) = p.tasks.into_iter().find(|t| t.tid == tid) {
                return Ok(Some(t));
            }
            if p.acks.iter().any(|&(s, _)| s == self.seq) {
                return Ok(None);
            }
            if n == 0 {
                return Ok(None);
            }
        }
    }
}

#[cfg(test)]
mod tests;
