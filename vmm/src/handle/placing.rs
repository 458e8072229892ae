//! Placing a running VM's threads on their CPUs (`--pin`, `set-pin`; `placement`), and the
//! `threads` answer with each thread's CPU set and last CPU.
//!
//! Data flow: `Vm::run`, once every thread exists and before the start gate opens, calls
//! [`VmHandle::place_threads`]: each vCPU thread and each device thread gets the set its role
//! resolves to (`PlacementBoard::cpus_for`), and every other thread of the process (main,
//! signals, api, api-stats, sampler, limiter) the service set; the service threads found are
//! remembered, and devices are told ([`crate::devices::Device::wake_threads`]) so that a thread
//! asleep since moves at once. `set-pin` ([`VmHandle::set_pin`]) checks and sets one rule and
//! places again. [`VmHandle::threads`] asks the kernel for each thread's set and last CPU.

use thiserror::Error;

use super::VmHandle;
use crate::placement::{self, PinError, PinRule, ThreadRole};

/// Why threads could not be placed.
#[derive(Debug, Error)]
pub enum PlaceError {
    /// A bad rule (`set-pin`).
    #[error(transparent)]
    Rule(#[from] PinError),
    /// The kernel refused a thread's set.
    #[error("cannot move thread {name} ({tid}) to CPUs {cpus}")]
    Affinity {
        /// Its name.
        name: String,
        /// Its tid.
        tid: i32,
        /// The set.
        cpus: String,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// The VM has no placement (a handle over synthetic vCPUs).
    #[error("this VM cannot place its threads")]
    NoPlacement,
}

/// The role of device thread `name` (`DEV-qpN`) of device `device`.
fn device_role(device: &str, name: &str) -> ThreadRole {
    let pair = name
        .rsplit_once("-qp")
        .and_then(|(_, p)| p.parse().ok())
        .unwrap_or(0);
    ThreadRole::QueuePair {
        device: device.to_string(),
        pair,
    }
}

impl VmHandle {
    /// Places every thread as the placement says (see the module's comment). `find_service`:
    /// look for the service threads in `/proc/self/task` (at the start) rather than take those
    /// found then (`set-pin`, from a confined thread).
    pub fn place_threads(&self, find_service: bool) -> Result<(), PlaceError> {
        let board = self.placement().ok_or(PlaceError::NoPlacement)?;
        let set = |name: &str, tid: i32, role: &ThreadRole| {
            let cpus = board.cpus_for(role);
            placement::set_affinity(tid, &cpus).map_err(|source| PlaceError::Affinity {
                name: name.to_string(),
                tid,
                cpus: cpus.to_string(),
                source,
            })
        };
        let mut own: Vec<i32> = Vec::new();
        for v in self.vcpus() {
            let tid = v.host_tid();
            if tid != 0 {
                let role = ThreadRole::Vcpu(v.id);
                set(&format!("vcpu{}", v.id), tid, &role)?;
                v.set_cpus(board.cpus_for(&role).to_string());
                own.push(tid);
            }
        }
        for d in self.devices() {
            for t in d.threads().iter().filter(|t| t.host_tid != 0) {
                set(&t.name, t.host_tid, &device_role(&t.device, &t.name))?;
                own.push(t.host_tid);
            }
            d.wake_threads();
        }
        if find_service {
            // The calling (main) thread, and the process's `signals` thread if it has one (the
            // binary's: one VM a process); the VM's other service threads registered
            // themselves as they started (`PlacementBoard::register_current`).
            // SAFETY: gettid has no preconditions.
            board.register(unsafe { libc::gettid() }, "main");
            for (tid, name) in placement::process_threads() {
                if name == "signals" && !own.contains(&tid) {
                    board.register(tid, &name);
                }
            }
        }
        for (tid, name) in board.service() {
            // A service thread that ended meanwhile (a helper) is no error.
            match set(&name, tid, &ThreadRole::Service) {
                Err(PlaceError::Affinity { source, .. })
                    if source.raw_os_error() == Some(libc::ESRCH) => {}
                r => r?,
            }
        }
        Ok(())
    }

    /// `set-pin`: checks `KEY=CPUS` against the VM, sets it (replacing that key's rule) and
    /// places the threads again.
    pub fn set_pin(&self, rule: &str) -> Result<(), PlaceError> {
        let board = self.placement().ok_or(PlaceError::NoPlacement)?;
        board.set(PinRule::parse(rule)?)?;
        self.place_threads(false)
    }

    /// What `threads` answers: every thread with its CPU set and last CPU.
    pub fn threads(&self) -> ppa_vmm_api::Threads {
        let cpus = |tid: i32| {
            (tid != 0)
                .then(|| placement::affinity_of(tid).ok())
                .flatten()
                .map(|s| s.to_string())
        };
        let last = |tid: i32| (tid != 0).then(|| placement::last_cpu(tid)).flatten();
        let board = self.placement();
        ppa_vmm_api::Threads {
            pid: std::process::id(),
            vcpus: self
                .vcpus()
                .iter()
                .map(|v| {
                    let tid = v.host_tid();
                    ppa_vmm_api::ThreadInfo {
                        vcpu: v.id,
                        host_tid: tid,
                        name: self.vcpu_thread_name(v.id),
                        state: v.state(),
                        cpus: cpus(tid),
                        last_cpu: last(tid),
                    }
                })
                .collect(),
            devices: self
                .devices()
                .iter()
                .flat_map(|d| d.threads())
                .map(|mut t| {
                    t.cpus = cpus(t.host_tid);
                    t.last_cpu = last(t.host_tid);
                    t
                })
                .collect(),
            service: board.map_or_else(Vec::new, |b| {
                // By name: the threads register as they start, in an order that varies from
                // run to run; a reader (and a diff of two answers) wants it stable.
                let mut service = b.service();
                service.sort_by(|x, y| x.1.cmp(&y.1));
                service
                    .into_iter()
                    .map(|(tid, name)| ppa_vmm_api::ServiceThreadInfo {
                        name,
                        host_tid: tid,
                        cpus: cpus(tid),
                        last_cpu: last(tid),
                    })
                    .collect()
            }),
            pins: board.map_or_else(Vec::new, |b| b.placement().texts()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_device_threads_name_gives_its_pair() {
        assert_eq!(
            device_role("net0", "net0-qp3"),
            ThreadRole::QueuePair {
                device: "net0".into(),
                pair: 3
            }
        );
    }
}
