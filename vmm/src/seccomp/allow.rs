//! The allow-list of each thread kind, with the reason for every entry, and its BPF program.
//!
//! A list is groups of [`Allow`] entries: what every thread needs to live, kick a vCPU and end
//! ([`THREAD`]), to allocate ([`MEMORY`]), to read clocks and wait ([`TIME`]), to log and
//! signal an eventfd ([`WRITE`]), to read files ([`READ_FILES`]), plus the kind's own.
//! Arguments are checked where a call has a dangerous use: `mmap`/`mprotect` never with
//! PROT_EXEC, `ioctl` only with the requests listed, `tgkill` only this process's threads and
//! only the kick signal or SIGABRT (a panic's abort), `openat` only read-only outside the main
//! thread, `perf_event_open` (vCPU threads) only for the calling thread. The program is built when a thread enters its kind ([`program`]).
//! docs/security.md is these tables in prose; a test checks that it names every entry.

use std::collections::BTreeMap;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen as Len, SeccompCmpOp as Op, SeccompCondition,
    SeccompFilter, SeccompRule, TargetArch,
};

use super::{caps, Kind, Mode, SeccompError};

/// Which calls of a system call an entry allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Args {
    /// Any arguments.
    Any,
    /// The protection argument (at this index) without PROT_EXEC: no new executable memory.
    NoExec(u8),
    /// `ioctl` with one of these requests (name, number).
    Ioctl(&'static [(&'static str, u64)]),
    /// `tgkill` of a thread of this process with the vCPU kick signal or SIGABRT.
    Kick,
    /// `openat` without write access, creation, truncation or appending.
    ReadOnly,
    /// `perf_event_open` of an event on the calling thread only (pid 0), on any CPU (-1), in
    /// no group (-1), with a close-on-exec descriptor: no other thread or process observed.
    PerfSelf,
    /// `prlimit64` that reads this process's limit and sets none (pid 0, no new limit): what
    /// `getrlimit` makes.
    GetLimit,
    /// `sched_setattr` of the calling thread (pid 0, flags 0): its own scheduling class only.
    SelfOnly,
    /// `timer_create` on CLOCK_MONOTONIC (the kick timer; its sigevent, behind a pointer,
    /// cannot be checked).
    Monotonic,
    /// `fcntl` with one of these commands (name, number).
    Fcntl(&'static [(&'static str, u64)]),
}

/// One allowed system call.
#[derive(Debug, Clone, Copy)]
pub struct Allow {
    /// Its name (x86_64).
    pub name: &'static str,
    /// Its number.
    pub nr: i64,
    /// Which arguments.
    pub args: Args,
    /// Why the thread makes it.
    pub why: &'static str,
}

macro_rules! allow {
    ($name:ident, $args:expr, $why:literal) => {
        Allow {
            name: stringify!($name),
            nr: sys::$name,
            args: $args,
            why: $why,
        }
    };
}

/// System call numbers by name (x86_64), so that entries read as the call's name.
#[allow(non_upper_case_globals)]
mod sys {
    pub const futex: i64 = libc::SYS_futex;
    pub const exit: i64 = libc::SYS_exit;
    pub const exit_group: i64 = libc::SYS_exit_group;
    pub const munmap: i64 = libc::SYS_munmap;
    pub const madvise: i64 = libc::SYS_madvise;
    pub const sigaltstack: i64 = libc::SYS_sigaltstack;
    pub const rt_sigprocmask: i64 = libc::SYS_rt_sigprocmask;
    pub const rt_sigtimedwait: i64 = libc::SYS_rt_sigtimedwait;
    pub const rt_sigreturn: i64 = libc::SYS_rt_sigreturn;
    pub const sched_yield: i64 = libc::SYS_sched_yield;
    pub const sched_setattr: i64 = libc::SYS_sched_setattr;
    pub const sched_setaffinity: i64 = libc::SYS_sched_setaffinity;
    pub const sched_getaffinity: i64 = libc::SYS_sched_getaffinity;
    pub const mmap: i64 = libc::SYS_mmap;
    pub const mprotect: i64 = libc::SYS_mprotect;
    pub const mremap: i64 = libc::SYS_mremap;
    pub const brk: i64 = libc::SYS_brk;
    pub const clock_gettime: i64 = libc::SYS_clock_gettime;
    pub const clock_nanosleep: i64 = libc::SYS_clock_nanosleep;
    pub const nanosleep: i64 = libc::SYS_nanosleep;
    pub const gettid: i64 = libc::SYS_gettid;
    pub const getpid: i64 = libc::SYS_getpid;
    pub const write: i64 = libc::SYS_write;
    pub const writev: i64 = libc::SYS_writev;
    pub const tgkill: i64 = libc::SYS_tgkill;
    pub const ioctl: i64 = libc::SYS_ioctl;
    pub const pread64: i64 = libc::SYS_pread64;
    pub const pwrite64: i64 = libc::SYS_pwrite64;
    pub const read: i64 = libc::SYS_read;
    pub const readv: i64 = libc::SYS_readv;
    pub const io_uring_enter: i64 = libc::SYS_io_uring_enter;
    pub const io_uring_register: i64 = libc::SYS_io_uring_register;
    pub const preadv: i64 = libc::SYS_preadv;
    pub const pwritev: i64 = libc::SYS_pwritev;
    pub const fallocate: i64 = libc::SYS_fallocate;
    pub const openat: i64 = libc::SYS_openat;
    pub const close: i64 = libc::SYS_close;
    pub const statx: i64 = libc::SYS_statx;
    pub const fstat: i64 = libc::SYS_fstat;
    pub const newfstatat: i64 = libc::SYS_newfstatat;
    pub const lseek: i64 = libc::SYS_lseek;
    pub const getcpu: i64 = libc::SYS_getcpu;
    pub const epoll_wait: i64 = libc::SYS_epoll_wait;
    pub const epoll_pwait: i64 = libc::SYS_epoll_pwait;
    pub const epoll_ctl: i64 = libc::SYS_epoll_ctl;
    pub const accept4: i64 = libc::SYS_accept4;
    pub const recvfrom: i64 = libc::SYS_recvfrom;
    pub const sendto: i64 = libc::SYS_sendto;
    pub const getsockopt: i64 = libc::SYS_getsockopt;
    pub const shutdown: i64 = libc::SYS_shutdown;
    pub const timerfd_settime: i64 = libc::SYS_timerfd_settime;
    pub const getdents64: i64 = libc::SYS_getdents64;
    pub const fcntl: i64 = libc::SYS_fcntl;
    pub const getrandom: i64 = libc::SYS_getrandom;
    pub const unlink: i64 = libc::SYS_unlink;
    pub const unlinkat: i64 = libc::SYS_unlinkat;
    pub const rmdir: i64 = libc::SYS_rmdir;
    pub const rename: i64 = libc::SYS_rename;
    pub const renameat: i64 = libc::SYS_renameat;
    pub const renameat2: i64 = libc::SYS_renameat2;
    pub const fsync: i64 = libc::SYS_fsync;
    pub const fdatasync: i64 = libc::SYS_fdatasync;
    pub const perf_event_open: i64 = libc::SYS_perf_event_open;
    pub const prlimit64: i64 = libc::SYS_prlimit64;
    pub const timer_create: i64 = libc::SYS_timer_create;
    pub const timer_settime: i64 = libc::SYS_timer_settime;
    pub const timer_delete: i64 = libc::SYS_timer_delete;
}

use crate::accounting::switches::events::PERF_EVENT_IOC_SET_OUTPUT;
use crate::accounting::switches::{
    PERF_EVENT_IOC_DISABLE, PERF_EVENT_IOC_ENABLE, PERF_FLAG_FD_CLOEXEC,
};
use crate::hypervisor::kvm::ioctls::VCPU_THREAD_IOCTLS;

/// The ioctls of a vCPU thread's loop: the hypervisor backend's, then level full's perf ones.
const VCPU_IOCTLS: &[(&str, u64)] =
    &concat::<{ VCPU_THREAD_IOCTLS.len() + PERF_IOCTLS.len() }>(VCPU_THREAD_IOCTLS, PERF_IOCTLS);

/// The perf ioctls of a vCPU thread.
const PERF_IOCTLS: &[(&str, u64)] = &[
    // Level full's context-switch records (accounting::switches) on and off as the level
    // changes; the ring itself is read from memory, with no call.
    ("PERF_EVENT_IOC_ENABLE", PERF_EVENT_IOC_ENABLE),
    ("PERF_EVENT_IOC_DISABLE", PERF_EVENT_IOC_DISABLE),
    // Level full's tracepoints (KVM's exits, host interrupts) send their records into the
    // thread's own ring.
    ("PERF_EVENT_IOC_SET_OUTPUT", PERF_EVENT_IOC_SET_OUTPUT),
];

/// `a` then `b`, at compile time (`N` must be their total length: a wrong one fails the build).
const fn concat<const N: usize>(
    a: &[(&'static str, u64)],
    b: &[(&'static str, u64)],
) -> [(&'static str, u64); N] {
    assert!(a.len() + b.len() == N);
    let mut out = [("", 0); N];
    let mut i = 0;
    while i < a.len() {
        out[i] = a[i];
        i += 1;
    }
    while i < N {
        out[i] = b[i - a.len()];
        i += 1;
    }
    out
}

/// The fcntl commands of a vCPU thread: its perf ring's wakeup signal aimed at itself, and
/// F_GETFD, which the standard library's descriptor drop calls in a debug build (it checks the
/// descriptor is open before closing it: the thread's own vCPU descriptor at its end).
const PERF_FCNTLS: &[(&str, u64)] = &[
    ("F_GETFD", libc::F_GETFD as u64),
    ("F_SETOWN_EX", 15),
    ("F_SETSIG", 10),
    ("F_GETFL", libc::F_GETFL as u64),
    ("F_SETFL", libc::F_SETFL as u64),
];

/// The ioctls of a device thread: a multi-queue tap's queues attached and detached as the
/// guest changes the queue pairs it uses, and the offloads the guest accepts.
const DEVICE_IOCTLS: &[(&str, u64)] = &[
    ("TUNSETQUEUE", libc::TUNSETQUEUE),
    ("TUNSETOFFLOAD", libc::TUNSETOFFLOAD),
];

/// The ioctls of the api thread.
const API_IOCTLS: &[(&str, u64)] = &[("FIONBIO", libc::FIONBIO)];

/// What every thread needs to run and to end.
pub const THREAD: &[Allow] = &[
    allow!(
        futex,
        Args::Any,
        "parks and wake-ups (futex words), locks, channels, joins"
    ),
    allow!(sched_yield, Args::Any, "the standard channels' back-off"),
    allow!(
        rt_sigreturn,
        Args::Any,
        "return from a signal handler (the vCPU kick)"
    ),
    allow!(
        rt_sigprocmask,
        Args::Any,
        "the C library masks signals while a thread ends"
    ),
    allow!(
        sigaltstack,
        Args::Any,
        "a thread's signal stack is removed as it ends"
    ),
    allow!(exit, Args::Any, "a thread ends"),
    allow!(
        exit_group,
        Args::Any,
        "the process ends (and the SIGSYS handler of kill mode)"
    ),
    allow!(gettid, Args::Any, "the thread's id"),
    allow!(
        getpid,
        Args::Any,
        "the process id (tgkill's first argument)"
    ),
    allow!(
        tgkill,
        Args::Kick,
        "a vCPU kicked out of KVM_RUN; a panic's abort (only those two signals, only this process)"
    ),
];

/// What the allocator needs.
pub const MEMORY: &[Allow] = &[
    allow!(
        mmap,
        Args::NoExec(2),
        "allocation: a thread's malloc arena, large blocks (never executable)"
    ),
    allow!(
        mprotect,
        Args::NoExec(2),
        "allocation: an arena grows (never executable)"
    ),
    allow!(
        munmap,
        Args::Any,
        "allocation: large blocks freed; a thread's signal stack freed as it ends"
    ),
    allow!(mremap, Args::Any, "allocation: a large block grows"),
    allow!(brk, Args::Any, "allocation: the main arena"),
    allow!(
        madvise,
        Args::Any,
        "allocation: freed memory returned; a thread's stack as it ends"
    ),
];

/// Clocks and sleeps.
pub const TIME: &[Allow] = &[
    allow!(
        clock_gettime,
        Args::Any,
        "thread CPU clocks (a system call; the monotonic clock is vDSO)"
    ),
    allow!(
        clock_nanosleep,
        Args::Any,
        "short sleeps (a retry after an error)"
    ),
    allow!(
        nanosleep,
        Args::Any,
        "short sleeps (a retry after an error)"
    ),
];

/// Writing to an open descriptor.
pub const WRITE: &[Allow] = &[
    allow!(
        write,
        Args::Any,
        "log lines on stderr; an eventfd signalled (events, interrupts)"
    ),
    allow!(
        writev,
        Args::Any,
        "log lines on stderr; a guest frame to its tap (device threads)"
    ),
];

/// Reading a file opened read-only.
pub const READ_FILES: &[Allow] = &[
    allow!(
        openat,
        Args::ReadOnly,
        "/proc files of this process (schedstat, stat, status), read-only"
    ),
    allow!(read, Args::Any, "a file's or socket's content"),
    allow!(
        pread64,
        Args::Any,
        "schedstat and KVM statistics at an offset, on descriptors opened at set-up"
    ),
    allow!(lseek, Args::Any, "file reads"),
    allow!(
        sched_getaffinity,
        Args::Any,
        "a thread's CPU set, shown beside the CPU it last ran on (threads, stats, the report)"
    ),
    allow!(statx, Args::Any, "a file's size before it is read whole"),
    allow!(fstat, Args::Any, "a file's size before it is read whole"),
    allow!(
        newfstatat,
        Args::Any,
        "a file's size before it is read whole"
    ),
    allow!(
        close,
        Args::Any,
        "a file read whole is closed; descriptors dropped as a thread ends"
    ),
    allow!(
        fcntl,
        Args::Fcntl(GETFD),
        "a debug build's standard library checks that a descriptor is open before it closes it (read-only)"
    ),
];

/// F_GETFD alone: what a debug build's descriptor drop calls before `close`.
const GETFD: &[(&str, u64)] = &[("F_GETFD", libc::F_GETFD as u64)];

/// The vCPU thread's own.
pub const VCPU: &[Allow] = &[
    allow!(ioctl, Args::Ioctl(VCPU_IOCTLS), "KVM_RUN; the guest's clock told of a pause or limit park; an unstarted AP's state; registers for a failure's report"),
    allow!(getcpu, Args::Any, "the host CPU of an exit (when the C library cannot read it from rseq)"),
    allow!(timer_create, Args::Monotonic, "the kick timer of CPU limits, created as the loop starts (docs/limits.md)"),
    allow!(timer_settime, Args::Any, "the kick timer armed for the next limit deadline, or disarmed"),
    allow!(timer_delete, Args::Any, "the kick timer deleted as the loop ends"),
    allow!(perf_event_open, Args::PerfSelf, "level full's context-switch records and kernel tracepoints of this thread, opened the first time level full is in force (possibly after a set-level at run time)"),
    allow!(fcntl, Args::Fcntl(PERF_FCNTLS), "level full's perf ring wakes this thread with the kick signal when half written (F_SETOWN_EX, F_SETSIG, O_ASYNC), so a long KVM_RUN comes out to drain it; F_GETFD: a debug build's descriptor drop checks the descriptor first"),
];

/// The api thread's own.
pub const API: &[Allow] = &[
    allow!(
        sched_setaffinity,
        Args::Any,
        "set-pin: the threads a placement rule names moved to its CPUs"
    ),
    allow!(epoll_wait, Args::Any, "the event loop"),
    allow!(epoll_pwait, Args::Any, "the event loop"),
    allow!(epoll_ctl, Args::Any, "connections watched and unwatched"),
    allow!(accept4, Args::Any, "a new connection"),
    allow!(getsockopt, Args::Any, "the peer's uid (SO_PEERCRED)"),
    allow!(
        ioctl,
        Args::Ioctl(API_IOCTLS),
        "a connection made non-blocking"
    ),
    allow!(fcntl, Args::Any, "descriptor flags"),
    allow!(recvfrom, Args::Any, "a request's bytes"),
    allow!(sendto, Args::Any, "a response's bytes"),
    allow!(shutdown, Args::Any, "a connection closed"),
    allow!(
        timerfd_settime,
        Args::Any,
        "the threshold-event and client time-limit timers armed and disarmed"
    ),
    allow!(
        getdents64,
        Args::Any,
        "/proc/self/fd counted for the metrics"
    ),
    allow!(getrandom, Args::Any, "hash-map keys"),
    allow!(
        prlimit64,
        Args::GetLimit,
        "the open-file limit read for the metrics (process_max_fds)"
    ),
    allow!(
        sched_setattr,
        Args::SelfOnly,
        "the thread's own class: out of SCHED_FIFO over its CPU budget, back after (sched::RtGuard)"
    ),
];

/// A device thread's own (`devices::net::worker`): its event loop, and writing frames.
pub const DEVICE: &[Allow] = &[
    allow!(epoll_wait, Args::Any, "the event loop"),
    allow!(epoll_pwait, Args::Any, "the event loop"),
    allow!(
        epoll_ctl,
        Args::Any,
        "the tap watched while the guest has room for frames"
    ),
    allow!(
        ioctl,
        Args::Ioctl(DEVICE_IOCTLS),
        "tap queues attached and detached (the guest's queue pairs); the guest's offloads"
    ),
    allow!(
        readv,
        Args::Any,
        "a frame from the tap straight into the guest's receive buffers"
    ),
    allow!(
        io_uring_enter,
        Args::Any,
        "a batch of frames to the tap with one call (the ring, made before the filter, may only write its tap, never blocking)"
    ),
    allow!(
        io_uring_register,
        Args::Any,
        "the ring lets go of its tap as the thread ends (the ring refuses every other registration)"
    ),
    allow!(
        timerfd_settime,
        Args::Any,
        "a rate limiter's timer armed for when a throttled queue's tokens are there, or disarmed at a reset"
    ),
];

/// A disk's thread (`devices::blk::worker`): its event loop, and the file's positioned reads,
/// writes, flushes and holes.
pub const DISK: &[Allow] = &[
    allow!(epoll_wait, Args::Any, "the event loop"),
    allow!(epoll_pwait, Args::Any, "the event loop"),
    allow!(
        epoll_ctl,
        Args::Any,
        "the queue's kicks watched in an active epoch, unwatched after a reset"
    ),
    allow!(
        preadv,
        Args::Any,
        "a read request: the disk file straight into the guest's buffers"
    ),
    allow!(
        pread64,
        Args::Any,
        "a read request whose data is one buffer, as `preadv` does for several"
    ),
    allow!(
        pwritev,
        Args::Any,
        "a write request: the guest's buffers straight into the disk file"
    ),
    allow!(
        pwrite64,
        Args::Any,
        "a write request whose data is one buffer, as `pwritev` does for several"
    ),
    allow!(
        fdatasync,
        Args::Any,
        "a FLUSH request (and every write when the driver did not negotiate FLUSH)"
    ),
    allow!(
        fallocate,
        Args::Any,
        "DISCARD and WRITE_ZEROES: holes punched, ranges zeroed"
    ),
    allow!(
        timerfd_settime,
        Args::Any,
        "a rate limiter's timer armed for when the throttled queue's tokens are there, or disarmed at a reset"
    ),
];

/// The `signals` thread's own: a second stop signal removes the files (socket files, a PPA page
/// file) that are still this process's before it exits (`owned_files::remove_all`).
pub const SIGNALS: &[Allow] = &[
    allow!(
        rt_sigtimedwait,
        Args::Any,
        "the wait for a stop signal (sigwaitinfo)"
    ),
    allow!(
        unlink,
        Args::Any,
        "the socket and page files removed on a forced exit (a second stop signal)"
    ),
    allow!(
        unlinkat,
        Args::Any,
        "the socket and page files removed on a forced exit (a second stop signal)"
    ),
];

/// The main thread's own, beyond reading files: the run's end.
pub const MAIN: &[Allow] = &[
    allow!(openat, Args::Any, "the report and histogram files written"),
    allow!(
        unlink,
        Args::Any,
        "the socket file and the PPA page file removed"
    ),
    allow!(
        unlinkat,
        Args::Any,
        "the socket file and the PPA page file removed"
    ),
    allow!(
        rmdir,
        Args::Any,
        "the VM's cgroups removed (cgroup backend)"
    ),
    allow!(rename, Args::Any, "the report file put in place whole"),
    allow!(renameat, Args::Any, "the report file put in place whole"),
    allow!(renameat2, Args::Any, "the report file put in place whole"),
    allow!(
        fsync,
        Args::Any,
        "the report file made durable before it is put in place"
    ),
    allow!(
        fdatasync,
        Args::Any,
        "the report file made durable before it is put in place"
    ),
    allow!(
        getdents64,
        Args::Any,
        "directories read at the end (cgroups)"
    ),
];

/// The groups of `kind`'s list, in order (the first entry for a call wins).
pub fn groups(kind: Kind) -> Vec<&'static [Allow]> {
    let common: [&'static [Allow]; 5] = [THREAD, MEMORY, TIME, WRITE, READ_FILES];
    let own: Vec<&'static [Allow]> = match kind {
        Kind::Main => vec![MAIN],
        Kind::Vcpu => vec![VCPU],
        Kind::Api => vec![API],
        Kind::Signals => vec![SIGNALS],
        Kind::Device => vec![DEVICE],
        Kind::Disk => vec![DISK],
        Kind::ApiStats | Kind::Sampler | Kind::Limiter => vec![],
    };
    own.into_iter().chain(common).collect()
}

/// `kind`'s list: one entry per call, the first of [`groups`] that names it.
pub fn list(kind: Kind) -> Vec<Allow> {
    let mut seen = std::collections::BTreeSet::new();
    groups(kind)
        .into_iter()
        .flatten()
        .filter(|a| seen.insert(a.nr))
        .copied()
        .collect()
}

/// The capabilities `kind` keeps after its set-up: none, except the main thread's
/// CAP_DAC_OVERRIDE, with which a VMM run as root writes its report, removes its socket and
/// its PPA page file wherever the operator put them, as it could at start, and a vCPU
/// thread's CAP_PERFMON, with which it opens its own context-switch records (level full) on
/// hosts whose `perf_event_paranoid` is 3 (Debian's default), now or when the level is
/// switched later; its filter lets perf_event_open name only the thread itself.
pub fn kept_caps(kind: Kind) -> u64 {
    match kind {
        Kind::Main | Kind::Signals => caps::bit(caps::CAP_DAC_OVERRIDE),
        Kind::Vcpu => caps::bit(caps::CAP_PERFMON),
        // Its class back to SCHED_FIFO after its RtGuard dropped it; the filter lets it change
        // only its own class (sched_setattr with pid 0), and allows no other call the
        // capability widens.
        Kind::Api => caps::bit(caps::CAP_SYS_NICE),
        _ => 0,
    }
}

/// What a filter is built against.
#[derive(Debug, Clone, Copy)]
pub struct Context {
    /// The mode.
    pub mode: Mode,
    /// This process's id (`tgkill`'s first argument).
    pub pid: i32,
    /// The kick signal.
    pub kick_signal: i32,
}

impl Context {
    /// The context of this process under `mode`.
    pub fn current(mode: Mode) -> Context {
        Context {
            mode,
            // SAFETY: getpid has no preconditions.
            pid: unsafe { libc::getpid() },
            kick_signal: crate::hypervisor::kvm::kick::kick_signal(),
        }
    }
}

fn cond(arg: u8, op: Op, value: u64) -> Result<SeccompCondition, seccompiler::BackendError> {
    SeccompCondition::new(arg, Len::Dword, op, value)
}

/// The rules of one entry (empty: any arguments).
fn rules(a: &Allow, ctx: &Context) -> Result<Vec<SeccompRule>, seccompiler::BackendError> {
    const WRITE_FLAGS: u64 =
        (libc::O_ACCMODE | libc::O_CREAT | libc::O_TRUNC | libc::O_APPEND) as u64;
    let one = |c: Vec<SeccompCondition>| SeccompRule::new(c).map(|r| vec![r]);
    match a.args {
        Args::Any => Ok(Vec::new()),
        Args::NoExec(i) => one(vec![cond(i, Op::MaskedEq(libc::PROT_EXEC as u64), 0)?]),
        Args::Ioctl(reqs) | Args::Fcntl(reqs) => reqs
            .iter()
            .map(|&(_, r)| SeccompRule::new(vec![cond(1, Op::Eq, r)?]))
            .collect(),
        Args::Kick => [ctx.kick_signal, libc::SIGABRT]
            .iter()
            .map(|&sig| {
                SeccompRule::new(vec![
                    cond(0, Op::Eq, ctx.pid as u64)?,
                    cond(2, Op::Eq, sig as u64)?,
                ])
            })
            .collect(),
        Args::ReadOnly => one(vec![cond(2, Op::MaskedEq(WRITE_FLAGS), 0)?]),
        // Compared as 32-bit words: the kernel reads pid, cpu and group_fd as ints.
        Args::Monotonic => one(vec![cond(0, Op::Eq, libc::CLOCK_MONOTONIC as u64)?]),
        Args::GetLimit => one(vec![
            cond(0, Op::Eq, 0)?,
            SeccompCondition::new(2, Len::Qword, Op::Eq, 0)?,
        ]),
        Args::SelfOnly => one(vec![cond(0, Op::Eq, 0)?, cond(2, Op::Eq, 0)?]),
        Args::PerfSelf => one(vec![
            cond(1, Op::Eq, 0)?,
            cond(2, Op::Eq, u64::from(u32::MAX))?,
            cond(3, Op::Eq, u64::from(u32::MAX))?,
            cond(4, Op::Eq, PERF_FLAG_FD_CLOEXEC)?,
        ]),
    }
}

/// The filter of `kind`, with `mismatch` for calls outside its list.
pub fn filter(
    kind: Kind,
    ctx: &Context,
    mismatch: SeccompAction,
) -> Result<BpfProgram, SeccompError> {
    let compile = |source| SeccompError::Compile {
        kind: kind.name(),
        source,
    };
    let mut map: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    for a in list(kind) {
        map.insert(a.nr, rules(&a, ctx).map_err(compile)?);
    }
    let f = SeccompFilter::new(map, mismatch, SeccompAction::Allow, TargetArch::x86_64)
        .map_err(compile)?;
    f.try_into().map_err(compile)
}

/// The filter of `kind` under `ctx`'s mode (`log`: logged; `kill`: SIGSYS).
pub fn program(kind: Kind, ctx: &Context) -> Result<BpfProgram, SeccompError> {
    let mismatch = match ctx.mode {
        Mode::Kill => SeccompAction::Trap,
        Mode::Log | Mode::None => SeccompAction::Log,
    };
    filter(kind, ctx, mismatch)
}
