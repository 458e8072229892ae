//! Host-side per-thread time sources: what the host kernel knows about a vCPU thread.
//!
//! This module owns every read of a host clock or `/proc` file about a thread's CPU use; the
//! rest of the accounting code works on the numbers it returns. Nothing here keeps state
//! besides an open clock id or file descriptor.
//!
//! | source | what it gives | cost measured here |
//! | --- | --- | --- |
//! | [`current_cpu`] (`sched_getcpu`: glibc's rseq area) | host CPU of the caller | ~3 ns warm; ~290 cycles just after a KVM_RUN on this PVM host |
//! | [`CpuReader::read`] (`rdpid`, else `sched_getcpu`) | host CPU of the caller | ~150 cycles just after a KVM_RUN |
//! | [`thread_cpu_ns`] (`CLOCK_THREAD_CPUTIME_ID`, a syscall) | exact CPU time of the caller | ~640-710 ns |
//! | [`process_cpu_ns`] (`CLOCK_PROCESS_CPUTIME_ID`, a syscall) | CPU time of the whole process | ~640 ns |
//! | [`ThreadClock::read_ns`] (`clock_gettime` on a thread's clock id) | exact CPU time of any thread of this process | ~640-700 ns (own or a running thread), ~360 ns (a sleeping one) |
//! | [`SchedStatFile::read`] (`pread` of `schedstat`) | on-CPU ns, run-queue wait ns, timeslices | ~1000 ns |
//! | [`thread_migrations`] (read of `/proc/.../sched`) | `se.nr_migrations` | ~17 µs |
//! | [`thread_ticks`] (reads of `/proc/.../stat` and `status`) | tick-sampled utime/stime, CPU, context switches | ~34 µs |
//!
//! platform.md gives vDSO `CLOCK_MONOTONIC` ~28 ns, the thread CPU clock ~615 ns, a schedstat
//! pread ~860 ns and one KVM exit ~18 µs on these nested 2-core PVM hosts (~1-2 µs on bare-metal
//! VMX). The right-hand column was measured with this module's functions in a release build
//! (best of 3 runs of 1 M reads for the cheap ones, 20 k for the `/proc` parsers) while other
//! builds shared the machine; the vDSO clock read 28 ns in the same run. So at level `full` the
//! two thread-CPU-clock reads per exit cost ~7% of an exit here and would be about as long as
//! a whole bare-metal exit.
//!
//! Who calls what:
//! - The vCPU thread, on its hot path: [`CpuReader::read`] at every timed entry, and [`thread_cpu_ns`] at
//!   every KVM_RUN boundary only at level `full` (and around parks), because it is a syscall.
//!   When it starts it opens [`ThreadClock::current`] and [`SchedStatFile::open`] for itself
//!   and hands them to the sampler and readers; as its loop ends it reads [`thread_ticks`] for
//!   the final report (its `/proc` entries vanish with it).
//! - The sampler thread and snapshot readers: [`ThreadClock::read_ns`] and
//!   [`SchedStatFile::read`] on another thread's sources (no allocation on either).
//! - The VM's final report: [`process_cpu_ns`] (to attribute CPU time of non-vCPU threads) and
//!   the tick-based [`thread_ticks`] baseline, plus [`thread_migrations`] when available.
//!
//! ## No syscall-free thread CPU clock on these hosts
//!
//! A perf `task-clock` event mmapped by the thread itself could give the thread's CPU time in
//! userspace (`time_running` + a TSC delta from `time_offset`/`time_mult`/`time_shift`), but
//! only when the page says `cap_user_time = 1`. A probe (a C program: `perf_event_open` of
//! `PERF_COUNT_SW_TASK_CLOCK` for the calling thread, `pid = 0`, `cpu = -1`, one mmapped page)
//! printed on this host: `cap_user_time=0 cap_user_time_zero=0 cap_user_time_short=0
//! cap_user_rdpmc=0 index=0 time_mult=0 time_shift=0 time_offset=0 time_zero=0`. The x86 kernel
//! only sets `cap_user_time` when `sched_clock` is the native TSC one; these guests use
//! kvm-clock's `sched_clock` (dmesg: "kvm-clock: using sched offset"), although the clocksource
//! is `tsc`. `time_running` alone is refreshed only when the event is scheduled in, so without
//! the TSC delta it lags by up to the current slice (deltas over the probe's spin + sleep loop
//! were 70-110 µs off `CLOCK_THREAD_CPUTIME_ID`). Hardware events do not exist here either (`cycles` gives
//! ENOENT: no PMU). The page itself reads in ~11 ns, so a `PerfThreadClock` would be worth
//! building on hosts where `cap_user_time = 1` (typically bare-metal x86 with a stable TSC); this module
//! therefore has none, and the VMM uses `clock_gettime` ([`thread_cpu_ns`]).

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

use crate::arch::x86_64::tsc;

/// Nanoseconds per second.
const NS_PER_SEC: u64 = 1_000_000_000;

/// Reads a clock, in ns.
fn clock_ns(clock: libc::clockid_t) -> io::Result<u64> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the duration of the call; clock_gettime
    // writes only into it and reports an invalid clock id as an error, not as UB.
    let r = unsafe { libc::clock_gettime(clock, &mut ts) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((ts.tv_sec as u64)
        .wrapping_mul(NS_PER_SEC)
        .wrapping_add(ts.tv_nsec as u64))
}

/// CPU-time clock of a thread of this process: a `clockid_t` from `pthread_getcpuclockid`,
/// read with `clock_gettime` (a syscall, ~360-700 ns here).
///
/// The clock id encodes the thread's kernel tid, so any thread of the process may read it
/// (this is how the sampler and readers read a vCPU thread's CPU time). Once the thread has
/// exited, [`ThreadClock::read_ns`] fails (`EINVAL`); if the tid were reused by a new thread
/// of this process the clock would read that thread, so drop a `ThreadClock` when its thread
/// ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ThreadClock {
    clock: libc::clockid_t,
}

impl ThreadClock {
    /// The clock of the calling thread, readable from any thread of the process (unlike
    /// `CLOCK_THREAD_CPUTIME_ID`, which always means the reader).
    pub fn current() -> io::Result<Self> {
        // SAFETY: pthread_self() is the calling thread, which is alive and not joined for the
        // whole call, so its pthread_t is valid as pthread_getcpuclockid requires.
        unsafe { Self::of_thread(libc::pthread_self()) }
    }

    /// The clock of the thread `thread` of this process.
    ///
    /// # Safety
    ///
    /// `thread` must be a pthread_t of a thread of this process that has not been joined
    /// (nor detached and exited) when this is called: glibc reads the thread's descriptor,
    /// which is freed or reused after that, so a stale handle is a use after free. The
    /// returned clock itself stays safe to read at any time (see [`ThreadClock`]). To avoid
    /// the requirement, use [`ThreadClock::of_tid`].
    pub unsafe fn of_thread(thread: libc::pthread_t) -> io::Result<Self> {
        let mut clock: libc::clockid_t = 0;
        // SAFETY: `clock` is a valid out pointer for the call; the caller guarantees that
        // `thread` names a live (not joined) thread of this process.
        let r = unsafe { libc::pthread_getcpuclockid(thread, &mut clock) };
        if r != 0 {
            return Err(io::Error::from_raw_os_error(r));
        }
        Ok(ThreadClock { clock })
    }

    /// The clock of the thread with kernel id `tid` (from `gettid`), built the way glibc's
    /// `pthread_getcpuclockid` builds it (the kernel ABI of per-thread CPU clocks:
    /// `(!tid << 3) | CPUCLOCK_PERTHREAD_MASK | CPUCLOCK_SCHED`). The kernel only resolves the
    /// tid among the threads of the reading process, so this needs no pthread handle and is
    /// safe; it fails with `EINVAL` if no such thread exists.
    pub fn of_tid(tid: i32) -> io::Result<Self> {
        if tid <= 0 {
            return Err(io::ErrorKind::InvalidInput.into());
        }
        let clock = ThreadClock {
            clock: ((!tid) << 3) | 4 | 2,
        };
        clock.read_ns()?;
        Ok(clock)
    }

    /// The thread's CPU time in ns (user + system, including guest time of a vCPU thread).
    /// Fails once the thread has exited.
    #[inline]
    pub fn read_ns(&self) -> io::Result<u64> {
        clock_ns(self.clock)
    }
}

/// CPU time of the calling thread in ns (`CLOCK_THREAD_CPUTIME_ID`; a syscall, ~650 ns here).
/// That clock always exists for the caller, so this cannot fail; should the kernel refuse it
/// anyway, the result is 0.
#[inline]
pub fn thread_cpu_ns() -> u64 {
    clock_ns(libc::CLOCK_THREAD_CPUTIME_ID).unwrap_or(0)
}

/// CPU time of the whole process in ns, including threads that have exited
/// (`CLOCK_PROCESS_CPUTIME_ID`; a syscall). Cannot fail; 0 should the kernel refuse it anyway.
pub fn process_cpu_ns() -> u64 {
    clock_ns(libc::CLOCK_PROCESS_CPUTIME_ID).unwrap_or(0)
}

/// The host CPU the calling thread runs on right now (`sched_getcpu`: glibc reads it from the
/// rseq area or the vDSO, no syscall; ~3 ns here). The answer may be stale as soon as it is
/// returned. 0 if the kernel cannot tell (it always can on Linux x86_64).
#[inline]
pub fn current_cpu() -> u32 {
    // SAFETY: sched_getcpu has no preconditions and touches no caller memory.
    let cpu = unsafe { libc::sched_getcpu() };
    u32::try_from(cpu).unwrap_or(0)
}

/// How a thread reads the host CPU it runs on at each KVM_RUN entry: with `rdpid` where the
/// CPU has it and Linux keeps the CPU's number in TSC_AUX (one instruction touching no
/// memory), else with [`current_cpu`]. `sched_getcpu` reaches glibc's code through the PLT
/// and reads the rseq area in the thread's TLS: three or four lines and pages that this PVM
/// host's exit leaves cold, ~290 cycles an entry against ~150 for `rdpid` (docs/design.md,
/// "The host CPU without glibc").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuReader {
    rdpid: bool,
}

impl CpuReader {
    /// The reader this host allows ([`rdpid_usable`]).
    pub fn new() -> Self {
        CpuReader {
            rdpid: rdpid_usable(),
        }
    }

    /// Whether it reads `rdpid` (else `sched_getcpu`).
    pub fn uses_rdpid(self) -> bool {
        self.rdpid
    }

    /// The host CPU the calling thread runs on right now (stale as soon as returned, as
    /// [`current_cpu`]'s answer).
    #[inline]
    pub fn read(self) -> u32 {
        if self.rdpid {
            // SAFETY: `rdpid` is true only from `rdpid_usable`, after `has_rdpid` found the
            // instruction.
            unsafe { read_rdpid() }
        } else {
            current_cpu()
        }
    }
}

impl Default for CpuReader {
    fn default() -> Self {
        Self::new()
    }
}

/// The CPU's number in TSC_AUX as Linux writes it (`(node << 12) | cpu`; its vDSO's
/// `getcpu` reads the same bits).
const TSC_AUX_CPU: u64 = 0xfff;

/// Whether `rdpid` tells this thread's CPU as the kernel does: the CPU has the instruction,
/// the kernel uses it (its `/proc/cpuinfo` flags say `rdpid`: a kernel that has it writes the
/// CPU's number into TSC_AUX on every CPU at boot, and one booted with `clearcpuid=rdpid`
/// drops the flag), and it agrees with `sched_getcpu` on either side of it, in the first
/// comparison not straddled by a migration (at most 64 tries, else no). Asked once; `Vm::run`
/// asks before its threads' system-call filters are armed (the file read needs `openat`).
pub fn rdpid_usable() -> bool {
    static USABLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *USABLE.get_or_init(|| {
        tsc::has_rdpid()
            && std::fs::read_to_string("/proc/cpuinfo").is_ok_and(|s| flags_have_rdpid(&s))
            // SAFETY: `read_rdpid` runs only once `has_rdpid` found the instruction (`&&`).
            && agrees(current_cpu, || unsafe { read_rdpid() })
    })
}

/// Whether the first `flags` line of a `/proc/cpuinfo` text names `rdpid`.
fn flags_have_rdpid(cpuinfo: &str) -> bool {
    cpuinfo
        .lines()
        .find(|l| l.starts_with("flags"))
        .and_then(|l| l.split_once(':'))
        .is_some_and(|(_, flags)| flags.split_whitespace().any(|f| f == "rdpid"))
}

/// The CPU number in TSC_AUX.
///
/// # Safety
///
/// The CPU must have `rdpid` ([`tsc::has_rdpid`]).
#[inline]
unsafe fn read_rdpid() -> u32 {
    // SAFETY: the caller guarantees the instruction exists.
    (unsafe { tsc::rdpid() } & TSC_AUX_CPU) as u32
}

/// Whether `candidate` reads what `kernel` reads, in the first of 64 tries that `kernel`
/// gives the same answer before and after.
fn agrees(mut kernel: impl FnMut() -> u32, mut candidate: impl FnMut() -> u32) -> bool {
    for _ in 0..64 {
        let before = kernel();
        let c = candidate();
        if kernel() == before {
            return c == before;
        }
    }
    false
}

/// One reading of `/proc/<pid>/task/<tid>/schedstat`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SchedStat {
    /// Time spent on a CPU (the scheduler's `sum_exec_runtime`, updated at ticks and switches),
    /// ns.
    pub exec_ns: u64,
    /// Time spent runnable but waiting on a run queue, ns.
    pub run_delay_ns: u64,
    /// Number of times the thread was scheduled in.
    pub timeslices: u64,
}

/// A thread's `/proc/self/task/<tid>/schedstat`, kept open; each read is one `pread` at
/// offset 0 into a stack buffer (no allocation; ~1 µs here). Any thread of the process may
/// read it. Reads fail once the thread has exited.
#[derive(Debug)]
pub struct SchedStatFile {
    file: File,
}

impl SchedStatFile {
    /// Opens the schedstat file of thread `tid` of this process.
    pub fn open(tid: i32) -> io::Result<Self> {
        let file = File::open(format!("/proc/self/task/{tid}/schedstat"))?;
        Ok(SchedStatFile { file })
    }

    /// Opens the calling thread's own schedstat file (`/proc/thread-self/schedstat`).
    pub fn own() -> io::Result<Self> {
        let file = File::open("/proc/thread-self/schedstat")?;
        Ok(SchedStatFile { file })
    }

    /// Reads the current values.
    pub fn read(&self) -> io::Result<SchedStat> {
        // Three u64 in decimal, two spaces and a newline are at most 63 bytes.
        let mut buf = [0u8; 128];
        let n = self.file.read_at(&mut buf, 0)?;
        parse_schedstat(&buf[..n]).ok_or_else(|| io::ErrorKind::InvalidData.into())
    }
}

/// A thread's `/proc/self/task/<tid>/stat`, kept open to tell whether the thread is runnable
/// now (state `R`: on a CPU or waiting for one) with one `pread` (~1 µs here) into a stack
/// buffer. Reads fail once the thread has exited.
#[derive(Debug)]
pub struct ThreadStateFile {
    file: File,
}

impl ThreadStateFile {
    /// Opens the stat file of thread `tid` of this process.
    pub fn open(tid: i32) -> io::Result<Self> {
        let file = File::open(format!("/proc/self/task/{tid}/stat"))?;
        Ok(ThreadStateFile { file })
    }

    /// Whether the thread is runnable now (running or waiting for a CPU).
    pub fn runnable(&self) -> io::Result<bool> {
        // The state follows the comm (at most 64 bytes with its parentheses) and the pid.
        let mut buf = [0u8; 160];
        let n = self.file.read_at(&mut buf, 0)?;
        parse_stat_state(&buf[..n])
            .map(|c| c == b'R')
            .ok_or_else(|| io::ErrorKind::InvalidData.into())
    }
}

/// The state letter of a `/proc/<pid>/stat` line (pure): the first character after the last
/// `) ` (the comm may itself hold parentheses and spaces).
pub fn parse_stat_state(text: &[u8]) -> Option<u8> {
    let close = text.iter().rposition(|&c| c == b')')?;
    match text.get(close + 1..close + 3)? {
        [b' ', c] if c.is_ascii_alphabetic() => Some(*c),
        _ => None,
    }
}

/// Parses an unsigned decimal number with no sign or other characters.
fn parse_u64_ascii(s: &[u8]) -> Option<u64> {
    if s.is_empty() {
        return None;
    }
    s.iter().try_fold(0u64, |acc, &c| {
        if c.is_ascii_digit() {
            acc.checked_mul(10)?.checked_add(u64::from(c - b'0'))
        } else {
            None
        }
    })
}

/// Parses schedstat text, `"<exec ns> <run_delay ns> <timeslices>\n"` (pure, no allocation).
/// Fields beyond the third are ignored; fewer than three, or a non-number, give `None`.
pub fn parse_schedstat(text: &[u8]) -> Option<SchedStat> {
    let mut fields = text
        .split(|c| c.is_ascii_whitespace())
        .filter(|f| !f.is_empty());
    let exec_ns = parse_u64_ascii(fields.next()?)?;
    let run_delay_ns = parse_u64_ascii(fields.next()?)?;
    let timeslices = parse_u64_ascii(fields.next()?)?;
    Some(SchedStat {
        exec_ns,
        run_delay_ns,
        timeslices,
    })
}

pub use ppa_vmm_api::TickTimes;

/// Clock ticks per second of `/proc` times (`sysconf(_SC_CLK_TCK)`, USER_HZ; 100 on Linux).
fn clk_tck() -> u64 {
    // SAFETY: sysconf has no preconditions and touches no caller memory.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    u64::try_from(t).ok().filter(|&t| t > 0).unwrap_or(100)
}

/// Reads the tick-based times of thread `tid` of this process from
/// `/proc/self/task/<tid>/stat` and `/proc/self/task/<tid>/status` (two file reads that
/// allocate, ~34 µs: for final reports, not hot paths). Fails once the thread has exited, or
/// with `InvalidData` if the files cannot be parsed.
pub fn thread_ticks(tid: i32) -> io::Result<TickTimes> {
    let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat"))?;
    let status = std::fs::read_to_string(format!("/proc/self/task/{tid}/status"))?;
    let (utime_ns, stime_ns, processor) =
        parse_stat_line(&stat, clk_tck()).ok_or(io::ErrorKind::InvalidData)?;
    let (nr_switches_voluntary, nr_switches_involuntary) =
        parse_status_switches(&status).ok_or(io::ErrorKind::InvalidData)?;
    Ok(TickTimes {
        utime_ns,
        stime_ns,
        processor,
        nr_switches_voluntary,
        nr_switches_involuntary,
    })
}

/// Converts clock ticks to ns.
fn ticks_to_ns(ticks: u64, clk_tck: u64) -> u64 {
    let ns = u128::from(ticks) * u128::from(NS_PER_SEC) / u128::from(clk_tck);
    u64::try_from(ns).unwrap_or(u64::MAX)
}

/// Parses a `/proc/<pid>/task/<tid>/stat` line into `(utime_ns, stime_ns, processor)`
/// (pure). `clk_tck` is the tick rate of the times (`sysconf(_SC_CLK_TCK)`). The comm field
/// (2) is in parentheses and may itself contain spaces and `)`, so fields are counted from
/// after the last `)`. `None` if the line is too short, a field is not a number, or
/// `clk_tck` is 0.
pub fn parse_stat_line(line: &str, clk_tck: u64) -> Option<(u64, u64, u32)> {
    if clk_tck == 0 {
        return None;
    }
    let rest = &line[line.rfind(')')? + 1..];
    // Field 3 (state) is the first after the comm: field n is at index n - 3.
    let mut fields = rest.split_ascii_whitespace();
    let utime: u64 = fields.nth(14 - 3)?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    let processor: u32 = fields.nth(39 - 16)?.parse().ok()?;
    Some((
        ticks_to_ns(utime, clk_tck),
        ticks_to_ns(stime, clk_tck),
        processor,
    ))
}

/// Parses `(voluntary, involuntary)` context switch counts from the text of a
/// `/proc/<pid>/task/<tid>/status` file (pure). `None` if either line is missing or bad.
pub fn parse_status_switches(status: &str) -> Option<(u64, u64)> {
    let mut voluntary = None;
    let mut involuntary = None;
    for line in status.lines() {
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        match key.trim() {
            "voluntary_ctxt_switches" => voluntary = Some(value.trim().parse().ok()?),
            "nonvoluntary_ctxt_switches" => involuntary = Some(value.trim().parse().ok()?),
            _ => {}
        }
    }
    Some((voluntary?, involuntary?))
}

/// The kernel's count of migrations of thread `tid` of this process between host CPUs
/// (`se.nr_migrations` in `/proc/self/task/<tid>/sched`). `None` when that file does not exist
/// (kernels without `CONFIG_SCHED_DEBUG`), the thread has exited, or the line is missing.
/// One file read that allocates (~17 µs): for reports, not hot paths.
pub fn thread_migrations(tid: i32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/self/task/{tid}/sched")).ok()?;
    parse_sched_migrations(&text)
}

/// Parses `se.nr_migrations` from the text of a `/proc/<pid>/task/<tid>/sched` file (pure).
pub fn parse_sched_migrations(text: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let (key, value) = line.split_once(':')?;
        if key.trim() == "se.nr_migrations" {
            value.trim().parse().ok()
        } else {
            None
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::thread::JoinHandleExt;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{mpsc, Arc};
    use std::time::{Duration, Instant};

    fn gettid() -> i32 {
        // SAFETY: gettid has no preconditions.
        unsafe { libc::gettid() }
    }

    /// Spins until the calling thread has used `ns` of CPU time.
    fn spin_cpu(ns: u64) {
        let start = thread_cpu_ns();
        while thread_cpu_ns() - start < ns {
            std::hint::spin_loop();
        }
    }

    #[test]
    fn parses_schedstat() {
        let s = parse_schedstat(b"1234567890 98765 42\n").unwrap();
        assert_eq!(
            s,
            SchedStat {
                exec_ns: 1_234_567_890,
                run_delay_ns: 98_765,
                timeslices: 42
            }
        );
        assert_eq!(parse_schedstat(b"1 2 3").unwrap().timeslices, 3);
        assert_eq!(parse_schedstat(b"1 2 3 4\n").unwrap().exec_ns, 1);
        assert_eq!(parse_schedstat(b"0 0 0\n"), Some(SchedStat::default()));
        assert_eq!(parse_schedstat(b""), None);
        assert_eq!(parse_schedstat(b"1 2\n"), None);
        assert_eq!(parse_schedstat(b"1 -2 3\n"), None);
        assert_eq!(parse_schedstat(b"1 x 3\n"), None);
        assert_eq!(parse_schedstat(b"99999999999999999999999 1 1\n"), None);
    }

    /// A stat line of a thread whose comm has spaces and parentheses.
    const STAT: &str = "16870 (a) b (c)) R 16864 16864 12356 0 -1 4194304 98 0 1 0 \
        250 37 0 0 20 0 1 0 238013 3133440 380 18446744073709551615 93880582156288 \
        93880582176169 140723223889504 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0 93880582192176 \
        93880582193792 93880848084992 140723223890652 140723223890672 140723223890672 \
        140723223891947 0\n";

    #[test]
    fn parses_stat_line_with_odd_comm() {
        assert_eq!(
            parse_stat_line(STAT, 100),
            Some((2_500_000_000, 370_000_000, 1))
        );
        assert_eq!(
            parse_stat_line(STAT, 250),
            Some((1_000_000_000, 148_000_000, 1))
        );
        assert_eq!(parse_stat_line(STAT, 0), None);
        // A plain comm.
        let plain = STAT.replace("(a) b (c))", "(cat)");
        assert_eq!(
            parse_stat_line(&plain, 100),
            Some((2_500_000_000, 370_000_000, 1))
        );
        // Truncated before the processor field, or no comm at all.
        assert_eq!(parse_stat_line(&STAT[..120], 100), None);
        assert_eq!(parse_stat_line("1 cat R 1 2 3", 100), None);
        assert_eq!(parse_stat_line("", 100), None);
    }

    #[test]
    fn parses_status_and_sched() {
        let status = "Name:\tvcpu 0\nState:\tR (running)\nTgid:\t5\n\
            voluntary_ctxt_switches:\t17\nnonvoluntary_ctxt_switches:\t3\n";
        assert_eq!(parse_status_switches(status), Some((17, 3)));
        assert_eq!(parse_status_switches("Name:\tx\n"), None);
        assert_eq!(
            parse_status_switches("voluntary_ctxt_switches:\tx\nnonvoluntary_ctxt_switches:\t3\n"),
            None
        );

        let sched = "cat (14998, #threads: 1)\n-----------\n\
            se.exec_start                                :       2276589.927638\n\
            se.sum_exec_runtime                          :             0.000000\n\
            se.nr_migrations                             :                    7\n\
            nr_switches                                  :                    0\n";
        assert_eq!(parse_sched_migrations(sched), Some(7));
        assert_eq!(parse_sched_migrations("nr_switches : 1\n"), None);
    }

    #[test]
    fn schedstat_of_this_thread() {
        let f = SchedStatFile::open(gettid()).unwrap();
        let w0 = Instant::now();
        let s0 = f.read().unwrap();
        spin_cpu(20_000_000);
        let s1 = f.read().unwrap();
        let wall = w0.elapsed().as_nanos() as u64;
        let exec = s1.exec_ns - s0.exec_ns;
        // exec_ns advances at ticks and switches (4 ms at HZ=250), the spin used 20 ms.
        assert!(exec >= 10_000_000, "exec grew by {exec} ns");
        // s0 may lag the real exec time by up to one tick, which adds to the delta.
        assert!(
            exec <= wall + 5_000_000,
            "exec {exec} > wall {wall} + a tick"
        );
        let delay = s1.run_delay_ns - s0.run_delay_ns;
        assert!(delay <= wall, "run_delay {delay} > wall {wall}");
        assert!(s1.timeslices >= s0.timeslices);
    }

    #[test]
    fn the_state_follows_the_last_parenthesis() {
        assert_eq!(parse_stat_state(b"12 (vcpu 0) R 1 12 12 0"), Some(b'R'));
        assert_eq!(parse_stat_state(b"12 (a) (b) ) S 1 12"), Some(b'S'));
        assert_eq!(parse_stat_state(b"12 (x)"), None);
        assert_eq!(parse_stat_state(b"12 (x) 7 1"), None);
        assert_eq!(parse_stat_state(b"no parenthesis R"), None);
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::gettid() };
        let f = ThreadStateFile::open(tid).unwrap();
        assert!(
            f.runnable().unwrap(),
            "a thread reading its own state is running"
        );
        let (tx, rx) = std::sync::mpsc::channel();
        let sleeper = std::thread::spawn(move || {
            // SAFETY: gettid has no preconditions.
            tx.send(unsafe { libc::gettid() }).unwrap();
            std::thread::park_timeout(std::time::Duration::from_secs(10));
        });
        let f = ThreadStateFile::open(rx.recv().unwrap()).unwrap();
        // Once it has parked, it is asleep: not runnable.
        let t0 = std::time::Instant::now();
        while f.runnable().unwrap() && t0.elapsed() < std::time::Duration::from_secs(5) {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let asleep = !f.runnable().unwrap();
        sleeper.thread().unpark();
        sleeper.join().unwrap();
        assert!(asleep, "a parked thread is not runnable");
        assert!(f.runnable().is_err(), "the thread has exited");
    }

    #[test]
    fn schedstat_of_missing_thread_fails() {
        assert!(SchedStatFile::open(i32::MAX).is_err());
    }

    #[test]
    fn thread_clock_matches_thread_cpu_ns() {
        let clock = ThreadClock::current().unwrap();
        spin_cpu(1_000_000);
        let a = clock.read_ns().unwrap();
        let b = thread_cpu_ns();
        let c = clock.read_ns().unwrap();
        assert!(a <= b && b <= c, "{a} {b} {c}");
        assert!(c - a < 1_000_000, "{a} {c}");
        // The tid-built clock is the same clock id glibc builds.
        assert_eq!(ThreadClock::of_tid(gettid()).unwrap(), clock);
    }

    #[test]
    fn thread_clock_of_another_thread() {
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, rx) = mpsc::channel();
        let stop2 = Arc::clone(&stop);
        let handle = std::thread::spawn(move || {
            tx.send(gettid()).unwrap();
            while !stop2.load(Ordering::Relaxed) {
                std::hint::spin_loop();
            }
        });
        let tid = rx.recv().unwrap();
        // SAFETY: `handle` is joined only below, after the last use of its pthread_t.
        let clock = unsafe { ThreadClock::of_thread(handle.as_pthread_t()) }.unwrap();
        let by_tid = ThreadClock::of_tid(tid).unwrap();
        assert_eq!(clock, by_tid);
        let t0 = clock.read_ns().unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut t1 = t0;
        while t1 < t0 + 5_000_000 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
            t1 = clock.read_ns().unwrap();
        }
        stop.store(true, Ordering::Relaxed);
        handle.join().unwrap();
        assert!(t1 >= t0 + 5_000_000, "spinning thread used {} ns", t1 - t0);
        // The thread is gone: its clock fails rather than reading 0. join() returns when the
        // kernel clears the thread id, a moment before the task is released: wait for that.
        let gone = (0..1000).any(|_| {
            std::thread::sleep(Duration::from_millis(1));
            clock.read_ns().is_err()
        });
        assert!(gone, "the clock of an exited thread still reads");
        assert!(ThreadClock::of_tid(tid).is_err());
    }

    #[test]
    fn ticks_of_this_thread() {
        let tid = gettid();
        spin_cpu(100_000_000);
        let t = thread_ticks(tid).unwrap();
        // 100 ms is ~10 USER_HZ ticks; tick sampling may miss some but not all.
        assert!(t.utime_ns + t.stime_ns > 0, "{t:?}");
        assert!(
            t.utime_ns + t.stime_ns <= process_cpu_ns() + 20_000_000,
            "{t:?}"
        );
        assert!(t.processor < 4096);
        assert!(thread_ticks(i32::MAX).is_err());
    }

    #[test]
    fn ticks_of_thread_with_odd_name() {
        let t = std::thread::Builder::new()
            .name("a) b (c".into())
            .spawn(|| {
                spin_cpu(20_000_000);
                let tid = gettid();
                let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).unwrap();
                assert!(stat.contains("(a) b (c)"), "{stat}");
                thread_ticks(tid).unwrap()
            })
            .unwrap()
            .join()
            .unwrap();
        assert!(t.processor < 4096);
    }

    #[test]
    fn migrations_when_available() {
        let tid = gettid();
        let m = thread_migrations(tid);
        if std::path::Path::new("/proc/self/sched").exists() {
            assert!(m.is_some());
        }
        assert_eq!(thread_migrations(i32::MAX), None);
    }

    #[test]
    fn process_and_cpu() {
        let t = thread_cpu_ns();
        let p = process_cpu_ns();
        assert!(p >= t, "process {p} < thread {t}");
        assert!(t > 0);
        assert!(current_cpu() < 4096);
    }

    #[test]
    fn a_candidate_agrees_only_where_the_kernel_holds_still() {
        assert!(agrees(|| 3, || 3));
        assert!(!agrees(|| 3, || 0), "a TSC_AUX left at 0 on CPU 3");
        // The kernel's answer moves between its two reads once (a migration), then holds:
        // the comparison made during the move is not the one that counts, whichever way it
        // went.
        for (first, second, verdict) in [(2, 2, true), (1, 2, true), (2, 5, false), (1, 5, false)] {
            let mut kernel = [1, 2, 2, 2].into_iter();
            let mut candidate = [first, second].into_iter();
            assert_eq!(
                agrees(|| kernel.next().unwrap(), || candidate.next().unwrap()),
                verdict,
                "candidate {first} during the move, {second} after"
            );
        }
        // A kernel that never holds still gives no verdict but "no".
        let mut n = 0;
        assert!(!agrees(
            || {
                n += 1;
                n
            },
            || 0
        ));
    }

    #[test]
    fn the_kernel_flags_are_read_as_words() {
        let info = "processor\t: 0\nflags\t\t: fpu rdtscp lm rdpid fsrm\nbugs\t\t: x\n";
        assert!(flags_have_rdpid(info));
        assert!(!flags_have_rdpid("flags\t\t: fpu rdtscp rdpidx lm\n"));
        assert!(!flags_have_rdpid("processor\t: 0\n"));
        assert!(
            !flags_have_rdpid("vmx flags\t: rdpid\n"),
            "not the flags line"
        );
    }

    #[test]
    fn the_reader_tells_each_cpu_as_the_kernel_does() {
        let reader = CpuReader::new();
        let kernel_uses_it =
            std::fs::read_to_string("/proc/cpuinfo").is_ok_and(|s| flags_have_rdpid(&s));
        if tsc::has_rdpid() && kernel_uses_it {
            assert!(
                reader.uses_rdpid(),
                "rdpid exists but disagrees with sched_getcpu"
            );
        }
        // Pinned to each allowed CPU in turn, the reader must name it.
        let cpus = crate::sched::allowed_cpus();
        std::thread::spawn(move || {
            for c in cpus {
                crate::placement::set_affinity(0, &crate::placement::CpuSet::of([c]))
                    .unwrap_or_else(|e| panic!("pin to CPU {c}: {e}"));
                assert_eq!(reader.read() as usize, c);
                assert_eq!(current_cpu() as usize, c);
            }
        })
        .join()
        .unwrap();
    }
}

/// Time this host itself lost to the hypervisor it runs on (paravirt steal), summed over all
/// CPUs, from the `steal` column of the `cpu` line of /proc/stat (in USER_HZ ticks: 10 ms
/// resolution). The kernel's task clocks exclude it, so a vCPU thread that was running when its
/// CPU was stolen loses that time from used_ns without gaining it in run_delay. None if
/// /proc/stat cannot be read.
pub fn host_steal_ns() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/stat").ok()?;
    parse_host_steal(&text, clk_tck())
}

/// Pure parser behind [`host_steal_ns`].
pub fn parse_host_steal(proc_stat: &str, clk_tck: u64) -> Option<u64> {
    let line = proc_stat.lines().find(|l| l.starts_with("cpu "))?;
    let steal: u64 = line.split_whitespace().nth(8)?.parse().ok()?;
    Some(steal.checked_mul(1_000_000_000)? / clk_tck.max(1))
}

#[cfg(test)]
mod steal_tests {
    use super::*;

    #[test]
    fn parses_the_steal_column() {
        let text = "cpu  99280 0 19801 496566 535 0 244 194 6781 0\ncpu0 1 2 3 4 5 6 7 8 9 0\n";
        assert_eq!(parse_host_steal(text, 100), Some(1_940_000_000));
        assert_eq!(parse_host_steal("cpu0 1 2\n", 100), None);
        assert_eq!(parse_host_steal("cpu  1 2 3\n", 100), None);
        assert!(host_steal_ns().is_some());
    }
}
