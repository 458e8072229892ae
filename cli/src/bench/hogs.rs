//! Host CPU hogs for `bench limit --hogs`: one child process per CPU this process may run on,
//! pinned there, spinning until it is dropped (or this process dies), so the limiter, the
//! vCPU and its kick timer compete with busy work on every core.
//!
//! The children are forked from this (multi-threaded) process and do nothing but system calls
//! that are async-signal-safe (pin themselves, ask to die with their parent) and a spin loop.

/// The hog processes; dropping this kills and reaps them.
#[derive(Debug)]
pub struct Hogs {
    pids: Vec<libc::pid_t>,
}

impl Hogs {
    /// Starts one spinning process per allowed CPU.
    pub fn start() -> std::io::Result<Hogs> {
        let mut hogs = Hogs { pids: Vec::new() };
        // SAFETY: getpid has no preconditions.
        let parent = unsafe { libc::getpid() };
        for cpu in ppa_vmm::probes::allowed_cpus() {
            // SAFETY: the child runs only async-signal-safe system calls (sched_setaffinity,
            // prctl) and a spin loop, and never returns into Rust code of the parent's state.
            match unsafe { libc::fork() } {
                -1 => return Err(std::io::Error::last_os_error()),
                0 => spin_on(cpu, parent),
                pid => hogs.pids.push(pid),
            }
        }
        Ok(hogs)
    }

    /// How many are spinning.
    pub fn count(&self) -> usize {
        self.pids.len()
    }
}

/// The child: pinned to `cpu`, killed with its parent, spinning forever.
fn spin_on(cpu: usize, parent: libc::pid_t) -> ! {
    // SAFETY: plain system calls on this process; `set` is a valid cpu_set_t.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong);
        // The parent died before the request took effect: nobody would kill this one.
        if libc::getppid() != parent {
            libc::_exit(0);
        }
    }
    loop {
        std::hint::spin_loop();
    }
}

impl Drop for Hogs {
    fn drop(&mut self) {
        for &pid in &self.pids {
            // SAFETY: `pid` is a child of this process that only this struct reaps, so it is
            // still ours (a zombie at worst) until the waitpid below.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, std::ptr::null_mut(), 0);
            }
        }
    }
}
