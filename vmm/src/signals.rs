//! Stop signals: SIGTERM, SIGINT and SIGHUP end a run the way the `shutdown` command does
//! (every vCPU stopped, the final report written, the control socket removed); a second one
//! forces the process out at once.
//!
//! Data flow: the binary calls [`StopSignals::block`] while it is still single-threaded,
//! before it builds the VM, so every thread started later (vCPUs, the control socket, the
//! sampler, the limiter) inherits a mask that blocks the three signals: none of them is ever
//! interrupted by one, and the vCPU kick signal (SIGRTMIN, `hypervisor/kvm/kick.rs`) is neither
//! blocked nor touched. The signals queue on a signalfd instead, which [`StopSignals::watch`]
//! reads on a thread of its own (`signals`): the first calls the action it was given (the
//! binary's: `VmHandle::shutdown`, the same call as the `shutdown` command), a second one
//! removes the control-socket file if it is still this process's and exits with
//! [`forced_exit_code`] (128 + the signal's number, as a shell reports a death by that signal),
//! without a report.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::thread::JoinHandle;

use thiserror::Error;

/// The signals that stop a run.
pub const STOP_SIGNALS: [libc::c_int; 3] = [libc::SIGTERM, libc::SIGINT, libc::SIGHUP];

/// Why the stop signals could not be set up or read.
#[derive(Debug, Error)]
pub enum SignalError {
    /// pthread_sigmask refused.
    #[error("cannot block SIGTERM, SIGINT and SIGHUP")]
    Mask(#[source] io::Error),
    /// signalfd refused.
    #[error("cannot open a signalfd for SIGTERM, SIGINT and SIGHUP")]
    Fd(#[source] io::Error),
    /// Reading the signalfd failed.
    #[error("cannot read the stop signals")]
    Read(#[source] io::Error),
    /// The `signals` thread could not start.
    #[error("cannot start the thread that waits for stop signals")]
    Spawn(#[source] io::Error),
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

/// The stop signals, blocked in this thread and every thread it starts afterwards, queued on
/// a signalfd.
#[derive(Debug)]
pub struct StopSignals {
    fd: OwnedFd,
}

/// The stop signals as a signal set.
fn stop_set() -> libc::sigset_t {
    // SAFETY: sigset_t is plain old data; sigemptyset initialises it before any use.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid sigset_t owned by this frame; both calls only write into it.
    unsafe {
        libc::sigemptyset(&mut set);
        for s in STOP_SIGNALS {
            libc::sigaddset(&mut set, s);
        }
    }
    set
}

impl StopSignals {
    /// Blocks the stop signals in the calling thread (threads it starts later inherit the
    /// mask: call it before any other thread exists) and opens a signalfd for them. Signals
    /// that arrive before [`StopSignals::watch`] reads them wait, pending.
    pub fn block() -> Result<StopSignals, SignalError> {
        let set = stop_set();
        // SAFETY: `set` is an initialised sigset_t; a null old-set pointer is allowed. The
        // call changes only this thread's mask, and only for the three stop signals.
        let rc = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
        if rc != 0 {
            return Err(SignalError::Mask(io::Error::from_raw_os_error(rc)));
        }
        // SAFETY: `set` is an initialised sigset_t of the right size; -1 asks for a new fd.
        let fd = unsafe { libc::signalfd(-1, &set, libc::SFD_CLOEXEC) };
        if fd < 0 {
            return Err(SignalError::Fd(io::Error::last_os_error()));
        }
        // SAFETY: `fd` is a new descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(StopSignals { fd })
    }

    /// Waits for the next stop signal.
    pub fn next(&self) -> Result<Caught, SignalError> {
        loop {
            // SAFETY: signalfd_siginfo is plain old data; all zeroes is a valid value.
            let mut info: libc::signalfd_siginfo = unsafe { std::mem::zeroed() };
            let size = std::mem::size_of::<libc::signalfd_siginfo>();
            // SAFETY: `info` is valid for writes of `size` bytes, the size a signalfd read
            // fills for one signal.
            let n = unsafe {
                libc::read(
                    self.fd.as_raw_fd(),
                    (&mut info as *mut libc::signalfd_siginfo).cast(),
                    size,
                )
            };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(SignalError::Read(e));
            }
            if n as usize == size {
                return Ok(Caught {
                    signo: info.ssi_signo as libc::c_int,
                    pid: info.ssi_pid,
                });
            }
        }
    }

    /// Starts the `signals` thread: the first stop signal runs `first`; a second one removes
    /// the control-socket files this process still owns and exits at once with
    /// [`forced_exit_code`].
    pub fn watch(
        self,
        first: impl FnOnce(Caught) + Send + 'static,
    ) -> Result<JoinHandle<()>, SignalError> {
        std::thread::Builder::new()
            .name("signals".into())
            .spawn(move || {
                // Confined before the first signal (the mode the binary armed; none in tests).
                crate::seccomp::enter(crate::seccomp::Kind::Signals);
                let caught = match self.next() {
                    Ok(c) => c,
                    Err(e) => {
                        log::error!("{e}: stop signals are ignored from now on");
                        return;
                    }
                };
                log::warn!(
                    "{} from pid {}: stopping every vCPU, as `shutdown` does; the final report \
                     follows (a second signal exits at once, without it)",
                    caught.name(),
                    caught.pid
                );
                first(caught);
                match self.next() {
                    Ok(c) => force_exit(c),
                    Err(e) => log::error!("{e}: a second stop signal cannot force the exit"),
                }
            })
            .map_err(SignalError::Spawn)
    }
}

/// The second stop signal: removes our socket files and exits without unwinding anything.
fn force_exit(c: Caught) -> ! {
    let code = forced_exit_code(c.signo);
    crate::api::unix::remove_own_socket_files();
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
    fn a_blocked_stop_signal_is_read_from_the_signalfd() {
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
