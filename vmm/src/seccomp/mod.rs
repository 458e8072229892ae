//! Least privilege after set-up: each thread of the VMM, once its own set-up is done, drops the
//! capabilities it no longer needs, sets `PR_SET_NO_NEW_PRIVS` and installs the seccomp filter
//! of its kind ([`Kind`]: main, vCPU, api, api-stats, sampler, limiter, signals, device).
//!
//! Data flow: [`crate::vm::Vm::run`] arms the process's [`Mode`] (from `VmConfig::seccomp`)
//! before it starts any thread; each thread calls [`enter`] with its kind at the point where its
//! set-up ends (the vCPU thread after its warm-up and the start gate, the api thread before its
//! event loop, the main thread once every thread is started and placed; the binary's `signals`
//! thread, started before `Vm::run`, as it starts, the binary having armed the mode first).
//! [`enter`] builds the
//! kind's filter from [`allow`]'s list, drops capabilities ([`caps`]) and applies the filter
//! to the calling thread only (seccompiler's `apply_filter`, no TSYNC: every kind has its own
//! filter). Threads started later inherit their creator's filter, which is why the main thread
//! enters last, after it has started every other thread.
//!
//! Modes ([`Mode`]): `none` does nothing (the library's default: a filter cannot be removed,
//! so a process that builds VMs in a loop — tests, `bench` — must not arm it); `log` lets a
//! forbidden call through and the kernel logs it (`audit: type=1326 ... comm="vcpu3" ...
//! syscall=41`, in `dmesg` or the audit log); `kill` traps it: the thread gets SIGSYS, whose
//! handler ([`on_sigsys`]) writes which thread kind made which call on stderr and ends the
//! process with [`EXIT_SECCOMP`]. `ppa-vmm run` defaults to `kill` (as Firecracker does): an
//! allow-list that is too short is found by the first run that needs the call, loudly, rather
//! than by an attacker. docs/security.md has the threat model and every list with its reasons.

use std::cell::Cell;
use std::sync::{Mutex, Once};

use serde::Deserialize;
use thiserror::Error;

pub mod allow;
pub mod caps;
#[cfg(test)]
mod tests;

/// Exit status of a process whose thread made a forbidden system call in `kill` mode: the
/// status a shell shows for a process killed by SIGSYS (128 + 31).
pub const EXIT_SECCOMP: i32 = 159;

/// What a seccomp filter does with a system call outside its thread kind's allow-list.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, clap::ValueEnum, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// No filter, no capability drop (the library's default).
    #[default]
    None,
    /// Allow it and have the kernel log it (audit type 1326).
    Log,
    /// Stop the VMM: a message on stderr naming the thread and the call, exit status 159.
    Kill,
}

impl Mode {
    /// The name used on the command line and in logs.
    pub fn name(self) -> &'static str {
        match self {
            Mode::None => "none",
            Mode::Log => "log",
            Mode::Kill => "kill",
        }
    }
}

/// The kinds of thread the VMM runs; each has its own allow-list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// The thread that called `Vm::run`: supervises, builds the report, tears down.
    Main,
    /// A `vcpu<N>` thread: KVM_RUN and the exit path.
    Vcpu,
    /// The `api` thread: the control socket and /metrics.
    Api,
    /// The `api-stats` thread: refreshes the snapshot `stats` answers from.
    ApiStats,
    /// The `sampler` thread: schedstat windows, runaway detection, the PPA page.
    Sampler,
    /// The `limiter` thread: CPU limits.
    Limiter,
    /// The `signals` thread: waits for SIGTERM, SIGINT and SIGHUP (`crate::signals`).
    Signals,
    /// A device thread (`net0-qp0`): a virtio queue pair's event loop against its tap.
    Device,
    /// A disk's thread (`blk0-q0`): a virtio-blk request queue's event loop against its file.
    Disk,
}

impl Kind {
    /// Every kind.
    pub const ALL: [Kind; 9] = [
        Kind::Main,
        Kind::Vcpu,
        Kind::Api,
        Kind::ApiStats,
        Kind::Sampler,
        Kind::Limiter,
        Kind::Signals,
        Kind::Device,
        Kind::Disk,
    ];

    /// The name used in logs, messages and docs/security.md.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Main => "main",
            Kind::Vcpu => "vcpu",
            Kind::Api => "api",
            Kind::ApiStats => "api-stats",
            Kind::Sampler => "sampler",
            Kind::Limiter => "limiter",
            Kind::Signals => "signals",
            Kind::Device => "device",
            Kind::Disk => "disk",
        }
    }
}

/// Why a thread could not enter its kind.
#[derive(Debug, Error)]
pub enum SeccompError {
    /// The filter could not be compiled.
    #[error("cannot compile the seccomp filter of the {kind} thread")]
    Compile {
        /// Thread kind.
        kind: &'static str,
        /// Cause.
        #[source]
        source: seccompiler::BackendError,
    },
    /// The kernel refused the filter.
    #[error("cannot install the seccomp filter of the {kind} thread")]
    Install {
        /// Thread kind.
        kind: &'static str,
        /// Cause.
        #[source]
        source: seccompiler::Error,
    },
    /// The capabilities could not be dropped.
    #[error("cannot drop the capabilities of the {kind} thread")]
    Caps {
        /// Thread kind.
        kind: &'static str,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
}

/// The mode of the VM that runs in this process (see the module's comment: a process
/// property, because filters and dropped capabilities are for good).
static POLICY: Mutex<Mode> = Mutex::new(Mode::None);

thread_local! {
    /// The kind this thread entered (for the SIGSYS handler's message); const-initialised, so
    /// reading it in a signal handler allocates nothing.
    static ENTERED: Cell<Option<Kind>> = const { Cell::new(None) };
}

/// Sets the mode the threads that enter their kind from now on apply. `Vm::run` calls it
/// first.
pub fn arm(mode: Mode) {
    *POLICY.lock().unwrap_or_else(|p| p.into_inner()) = mode;
    if mode == Mode::Kill {
        install_sigsys_handler();
    }
}

/// The mode in force.
pub fn armed() -> Mode {
    *POLICY.lock().unwrap_or_else(|p| p.into_inner())
}

/// The calling thread's set-up is done: drops its capabilities, sets no-new-privs and installs
/// its kind's filter, as the armed mode says (nothing in mode `none`). A failure is logged,
/// not fatal in `log` mode; in `kill` mode it ends the process, since running without the
/// promised confinement would be worse than not running.
pub fn enter(kind: Kind) {
    let mode = armed();
    if mode == Mode::None {
        return;
    }
    match enter_with(kind, mode) {
        Ok(kept) => log::debug!(
            "{}: seccomp filter installed ({}); capabilities kept: {}",
            kind.name(),
            mode.name(),
            caps::names(kept)
        ),
        Err(e) if mode == Mode::Log => log::warn!("{}", ppa_vmm_api::describe(&e)),
        Err(e) => {
            log::error!("{}", ppa_vmm_api::describe(&e));
            std::process::exit(EXIT_SECCOMP);
        }
    }
}

/// [`enter`] with an explicit mode (not `none`); returns the capabilities kept.
pub fn enter_with(kind: Kind, mode: Mode) -> Result<u64, SeccompError> {
    let name = kind.name();
    let program = allow::program(kind, &allow::Context::current(mode))?;
    let kept = caps::drop_all_but(allow::kept_caps(kind))
        .map_err(|source| SeccompError::Caps { kind: name, source })?;
    ENTERED.with(|k| k.set(Some(kind)));
    // seccompiler sets PR_SET_NO_NEW_PRIVS on this thread before it installs the filter.
    seccompiler::apply_filter(&program)
        .map_err(|source| SeccompError::Install { kind: name, source })?;
    Ok(kept)
}

/// Installs the SIGSYS handler of `kill` mode (once per process).
fn install_sigsys_handler() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: a zeroed sigaction is a valid value to fill in (empty mask, no flags).
        let mut sa: libc::sigaction = unsafe { std::mem::zeroed() };
        sa.sa_sigaction = on_sigsys as *const () as usize;
        sa.sa_flags = libc::SA_SIGINFO;
        // SAFETY: `sa` is a fully initialised sigaction whose handler has the SA_SIGINFO
        // signature; the old action is not asked for (null).
        if unsafe { libc::sigaction(libc::SIGSYS, &sa, std::ptr::null_mut()) } != 0 {
            log::warn!(
                "cannot install the SIGSYS handler: a forbidden system call will kill the VMM \
                 without saying which: {}",
                std::io::Error::last_os_error()
            );
        }
    });
}

/// Appends `bytes` to `buf` at `*len` (truncating at the end of `buf`).
fn put(buf: &mut [u8], len: &mut usize, bytes: &[u8]) {
    let n = bytes.len().min(buf.len() - *len);
    buf[*len..*len + n].copy_from_slice(&bytes[..n]);
    *len += n;
}

/// The message of [`on_sigsys`], built without allocating.
fn sigsys_message(buf: &mut [u8; 256], kind: &str, nr: i32) -> usize {
    let mut len = 0;
    put(buf, &mut len, b"ppa-vmm: error: the ");
    put(buf, &mut len, kind.as_bytes());
    put(buf, &mut len, b" thread made system call ");
    let mut digits = [0u8; 12];
    let mut i = digits.len();
    let mut v = i64::from(nr).unsigned_abs();
    loop {
        i -= 1;
        digits[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    if nr < 0 {
        put(buf, &mut len, b"-");
    }
    put(buf, &mut len, &digits[i..]);
    put(
        buf,
        &mut len,
        b", which its seccomp filter forbids: stopping the VMM (docs/security.md)\n",
    );
    len
}

/// SIGSYS in `kill` mode: says which thread kind made which call (`ausyscall NR` names it)
/// and ends the process with [`EXIT_SECCOMP`]. Async-signal-safe: a stack buffer, `write`
/// and `_exit`, both in every kind's allow-list.
extern "C" fn on_sigsys(_: libc::c_int, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo for an SA_SIGINFO handler; for a seccomp
    // SIGSYS its union holds `_sigsys { void *_call_addr; int _syscall; unsigned _arch; }`,
    // so the call number is the int at byte 24 (after the three ints, padding and the
    // pointer), as Firecracker reads it.
    let nr = unsafe { *info.cast::<u8>().add(24).cast::<libc::c_int>() };
    let kind = ENTERED.with(Cell::get).map_or("unknown", Kind::name);
    let mut buf = [0u8; 256];
    let len = sigsys_message(&mut buf, kind, nr);
    // SAFETY: write and _exit are async-signal-safe; `buf[..len]` is initialised.
    unsafe {
        libc::write(2, buf.as_ptr().cast(), len);
        libc::_exit(EXIT_SECCOMP);
    }
}
