//! Stop signals: SIGTERM, SIGINT and SIGHUP end a run the way the `shutdown` command does
//! (every vCPU stopped, the final report written, the control socket removed); a second one
//! forces the process out at once. One that arrives while the VM is still being set up ends
//! the process at once ([`abandon_start`]): whatever set-up is doing (waiting in `open`,
//! faulting in memory, measuring KVM), it stops within the moment, not when set-up is done.
//!
//! Data flow: the binary calls [`StopSignals::block`] first thing, while it is still
//! single-threaded, so every thread started later (vCPUs, the control socket, the sampler, the
//! limiter) inherits a mask that blocks the three signals: none of them is ever interrupted by
//! one, and the vCPU kick signal (SIGRTMIN, `hypervisor/kvm/kick.rs`) is neither blocked nor
//! touched. It then starts the `signals` thread at once with [`StopSignals::watch`], before it
//! reads its config or the run directory, which takes them with `sigwaitinfo`: the first
//! calls the action it was given (the binary's: [`abandon_start`] while the VM is being set
//! up, then `VmHandle::shutdown`, the same call as the `shutdown` command), a second one
//! removes the files this process made if they are still its own and exits with
//! [`forced_exit_code`] (128 + the signal's number, as a shell reports a death by that
//! signal), without a report.
//!
//! The thread starts before the seccomp mode is known (it comes from the config), so it
//! enters its filter when the binary, having armed the mode, calls [`Watcher::confine`]: a
//! real-time signal ([`confine_signal`]) blocked and waited for with the stop signals, which
//! nothing else sends.
//!
//! Why `sigwaitinfo` and not a signalfd: the kernel wakes every reader of a signalfd at every
//! signal delivered to any thread of the process, and the reader finds nothing and sleeps
//! again. With kick timers every limit stop is a SIGRTMIN to a vCPU thread, so a signalfd
//! reader woke 350 times a second under one VM limit (5 ms of CPU a second, and a preempted
//! vCPU each time) and used 1.3 % of a CPU in the 10-minute soak. `sigwaitinfo` wakes only
//! for the signals it waits for.

use std::io;

use thiserror::Error;

/// The signals that stop a run.
pub const STOP_SIGNALS: [libc::c_int; 3] = [libc::SIGTERM, libc::SIGINT, libc::SIGHUP];

/// Why the stop signals could not be set up or read.
#[derive(Debug, Error)]
pub enum SignalError {
    /// pthread_sigmask refused.
    #[error("cannot block SIGTERM, SIGINT and SIGHUP")]
    Mask(#[source] io::Error),
    /// Waiting for a stop signal failed.
    #[error("cannot wait for the stop signals")]
    Wait(#[source] io::Error),
    /// The `signals` thread could not start.
    #[error("cannot start the thread that waits for stop signals")]
    Spawn(#[source] io::Error),
    /// The `signals` thread could not be told to enter its seccomp filter.
    #[error("cannot tell the signals thread to enter its seccomp filter")]
    Confine(#[source] io::Error),
}

/// One stop signal received.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caught {
    /// Its number.
    pub signo: libc::c_int,
    /// The process that sent it (0 when the kernel did, e.g. a terminal's Ctrl-C).
    pub pid: u32,
}

impl Caught {
    /// `SIGTERM`, `SIGINT` or `SIGHUP`.
    pub fn name(&self) -> &'static str {
        signal_name(self.signo)
    }
}

/// The name of a stop signal (`SIG?` for another number).
pub fn signal_name(signo: libc::c_int) -> &'static str {
    match signo {
        libc::SIGTERM => "SIGTERM",
        libc::SIGINT => "SIGINT",
        libc::SIGHUP => "SIGHUP",
        _ => "SIG?",
    }
}

/// The exit code after a second stop signal: 128 + its number (143 for SIGTERM, 130 for
/// SIGINT, 129 for SIGHUP).
pub fn forced_exit_code(signo: libc::c_int) -> i32 {
    128 + signo
}

/// The stop signals, blocked in this thread and every thread it starts afterwards, pending
/// until the `signals` thread takes them.
#[derive(Debug)]
pub struct StopSignals {
    set: libc::sigset_t,
}

/// The real-time signal by which the binary tells the `signals` thread to enter its seccomp
/// filter ([`Watcher::confine`]). SIGRTMIN is the vCPU kick and SIGRTMIN + 1 the fake
/// hypervisor's; this one is blocked in every thread with the stop signals and sent by
/// nothing else.
pub fn confine_signal() -> libc::c_int {
    libc::SIGRTMIN() + 2
}

/// The stop signals and [`confine_signal`] as a signal set.
fn stop_set() -> libc::sigset_t {
    // SAFETY: sigset_t is plain old data; sigemptyset initialises it before any use.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid sigset_t owned by this frame; both calls only write into it.
    unsafe {
        libc::sigemptyset(&mut set);
        for s in STOP_SIGNALS {
            libc::sigaddset(&mut set, s);
        }
        libc::sigaddset(&mut set, confine_signal());
    }
    set
}

/// The running `signals` thread.
#[derive(Debug)]
pub struct Watcher {
    tid: libc::pid_t,
}

impl Watcher {
    /// Tells the `signals` thread to enter its seccomp kind, in the mode armed now
    /// (`seccomp::arm`): call it once the mode is armed. The thread enters it before it acts
    /// on any stop signal that arrives after this call.
    pub fn confine(&self) -> Result<(), SignalError> {
        // SAFETY: tgkill takes plain integers; `tid` is the `signals` thread of this process,
        // which blocks the signal and waits for it, and never ends before the process does.
        let rc =
            unsafe { libc::syscall(libc::SYS_tgkill, libc::getpid(), self.tid, confine_signal()) };
        if rc != 0 {
            return Err(SignalError::Confine(io::Error::last_os_error()));
        }
        Ok(())
    }
}

impl StopSignals {
    /// Blocks the stop signals (and [`confine_signal`]) in the calling thread (threads it
    /// starts later inherit the mask: call it before any other thread exists). Signals that
    /// arrive before [`StopSignals::watch`] takes them wait, pending.
    pub fn block() -> Result<StopSignals, SignalError> {
        let set = stop_set();
        // SAFETY: `set` is an initialised sigset_t; a null old-set pointer is allowed. The
        // call changes only this thread's mask, and only for the signals of `set`.
        let rc = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
        if rc != 0 {
            return Err(SignalError::Mask(io::Error::from_raw_os_error(rc)));
        }
        Ok(StopSignals { set })
    }

    /// Waits for the next signal of the set (blocked in the calling thread, as in every
    /// thread started after [`StopSignals::block`]): a stop signal or [`confine_signal`].
    pub fn next(&self) -> Result<Caught, SignalError> {
        loop {
            // SAFETY: siginfo_t is plain old data; all zeroes is a valid value.
            let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
            // SAFETY: `self.set` is an initialised sigset_t and `info` a valid siginfo_t for
            // the kernel to fill; the call only waits and writes `info`.
            let signo = unsafe { libc::sigwaitinfo(&self.set, &mut info) };
            if signo < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(SignalError::Wait(e));
            }
            // SAFETY: for a signal sent by kill, tgkill or the terminal, the kernel filled the
            // sender fields that si_pid reads (0 when the kernel itself sent it).
            let pid = unsafe { info.si_pid() };
            return Ok(Caught {
                signo,
                pid: u32::try_from(pid).unwrap_or(0),
            });
        }
    }

    /// The next stop signal; [`confine_signal`] on the way enters the `signals` kind (once).
    fn next_stop(&self, confined: &mut bool) -> Result<Caught, SignalError> {
        loop {
            let c = self.next()?;
            if c.signo != confine_signal() {
                return Ok(c);
            }
            if !*confined {
                crate::seccomp::enter(crate::seccomp::Kind::Signals);
                *confined = true;
            }
        }
    }

    /// Starts the `signals` thread: the first stop signal runs `first`; a second one removes
    /// the files this process still owns and exits at once with [`forced_exit_code`]. The
    /// thread runs unconfined until [`Watcher::confine`].
    pub fn watch(
        self,
        first: impl FnOnce(Caught) + Send + 'static,
    ) -> Result<Watcher, SignalError> {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name("signals".into())
            .spawn(move || {
                // SAFETY: gettid has no preconditions.
                let _ = tx.send(unsafe { libc::gettid() });
                let mut confined = false;
                let caught = match self.next_stop(&mut confined) {
                    Ok(c) => c,
                    Err(e) => {
                        log::error!("{e}: stop signals are ignored from now on");
                        return;
                    }
                };
                first(caught);
                match self.next_stop(&mut confined) {
                    Ok(c) => force_exit(c),
                    Err(e) => log::error!("{e}: a second stop signal cannot force the exit"),
                }
            })
            .map_err(SignalError::Spawn)?;
        let tid = rx
            .recv()
            .map_err(|_| SignalError::Spawn(io::Error::other("the thread ended at once")))?;
        Ok(Watcher { tid })
    }
}

/// Records the file now at `path`, which this process just made (the binary's run-directory
/// descriptor), to be removed by a forced exit or a stop signal during set-up, as the socket
/// and page files are, while it is still that file (`owned_files`). False when nothing is
/// there.
pub fn remove_at_forced_exit(path: &std::path::Path) -> bool {
    crate::owned_files::record(path)
}

/// The first stop signal of a run whose VM runs: says so on stderr (the action, the VM
/// handle's shutdown, follows).
pub fn announce_shutdown(c: Caught) {
    log::warn!(
        "{} from pid {}: stopping every vCPU, as `shutdown` does; the final report follows (a \
         second signal exits at once, without it)",
        c.name(),
        c.pid
    );
}

/// The first stop signal while the VM is still being set up: nothing has run and there is
/// nothing to report, so the process ends at once, whatever set-up is waiting for, with
/// [`forced_exit_code`], once the files it made that are still its own are removed.
pub fn abandon_start(c: Caught) -> ! {
    let code = forced_exit_code(c.signo);
    crate::owned_files::remove_all();
    eprintln!(
        "ppa-vmm: error: {} from pid {} while the VM was being set up: exiting at once with \
         code {code}, before any vCPU ran and without a report",
        c.name(),
        c.pid
    );
    // SAFETY: _exit ends the process without running destructors or atexit handlers, which
    // set-up still running on other threads needs (it may hold any lock); no preconditions.
    unsafe { libc::_exit(code) }
}

/// The second stop signal: removes the files this process made (its socket files, a PPA page
/// file) and exits without unwinding anything.
fn force_exit(c: Caught) -> ! {
    let code = forced_exit_code(c.signo);
    crate::owned_files::remove_all();
    eprintln!(
        "ppa-vmm: error: a second stop signal ({} from pid {}): exiting at once with code {code}, \
         without the final report",
        c.name(),
        c.pid
    );
    // SAFETY: _exit ends the process without running destructors or atexit handlers, which
    // is what a forced exit wants while other threads still run; it has no preconditions.
    unsafe { libc::_exit(code) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_blocked_stop_signal_is_taken_by_next() {
        // On a thread of its own: the mask changes only that thread, and the signals are sent
        // to that thread alone (a process-wide SIGHUP would kill the test harness).
        std::thread::spawn(|| {
            let s = StopSignals::block().unwrap();
            for signo in STOP_SIGNALS {
                // SAFETY: tgkill takes plain integers; the signal is blocked in this thread, so
                // it stays pending instead of running its default action.
                let rc = unsafe {
                    libc::syscall(libc::SYS_tgkill, libc::getpid(), libc::gettid(), signo)
                };
                assert_eq!(rc, 0);
                let c = s.next().unwrap();
                assert_eq!(c.signo, signo);
                assert_eq!(c.pid, std::process::id());
            }
        })
        .join()
        .unwrap();
    }

    /// Voluntary context switches of thread `tid` of this process.
    fn voluntary_switches(tid: i32) -> u64 {
        let s = std::fs::read_to_string(format!("/proc/self/task/{tid}/status")).unwrap();
        s.lines()
            .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    }

    #[test]
    fn signals_to_other_threads_do_not_wake_the_waiter() {
        // A signalfd reader was woken by every signal to any thread of the process (the kick
        // signals of the vCPUs). The waiter blocks on its own thread; 200 kick signals (which
        // have a handler: an ignored signal is dropped before anyone is woken) go to another
        // thread, spaced so that each would be a wake-up of its own; the waiter must not have
        // woken for them (a signalfd reader woke 200 times in the same test).
        crate::hypervisor::kvm::kick::install_handler().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let waiter = std::thread::spawn(move || {
            let s = StopSignals::block().unwrap();
            // SAFETY: gettid has no preconditions.
            tx.send(unsafe { libc::gettid() }).unwrap();
            s.next().unwrap()
        });
        let tid = rx.recv().unwrap();
        // Until it sleeps in the wait (its state S), nothing counts.
        let sleeping = || {
            std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).is_ok_and(|s| {
                s.rsplit(')')
                    .next()
                    .is_some_and(|r| r.trim_start().starts_with('S'))
            })
        };
        while !sleeping() {
            std::thread::yield_now();
        }
        let before = voluntary_switches(tid);
        // SAFETY: gettid has no preconditions.
        let me = unsafe { libc::gettid() };
        for _ in 0..200 {
            crate::hypervisor::kvm::kick::signal_thread(me);
            std::thread::sleep(std::time::Duration::from_micros(200));
        }
        let after = voluntary_switches(tid);
        assert!(
            after - before < 20,
            "the waiter woke {} times for 200 signals to another thread",
            after - before
        );
        // SAFETY: tgkill takes plain integers; SIGHUP is blocked in the waiter, which takes it.
        let rc = unsafe { libc::syscall(libc::SYS_tgkill, libc::getpid(), tid, libc::SIGHUP) };
        assert_eq!(rc, 0);
        assert_eq!(waiter.join().unwrap().signo, libc::SIGHUP);
    }

    #[test]
    fn names_and_forced_codes() {
        assert_eq!(signal_name(libc::SIGTERM), "SIGTERM");
        assert_eq!(signal_name(libc::SIGINT), "SIGINT");
        assert_eq!(signal_name(libc::SIGHUP), "SIGHUP");
        assert_eq!(forced_exit_code(libc::SIGTERM), 143);
        assert_eq!(forced_exit_code(libc::SIGINT), 130);
        assert_eq!(forced_exit_code(libc::SIGHUP), 129);
    }
}
