//! The result of `threads`: the VMM's threads (vCPUs, devices' queue pairs, the service
//! threads) with their host thread ids, the CPUs each may run on and the one it last ran on.

use serde::{Deserialize, Serialize};

use crate::ThreadState;

/// One vCPU thread in `threads`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ThreadInfo {
    /// vCPU index.
    pub vcpu: usize,
    /// Host thread id (0 before the thread started).
    pub host_tid: i32,
    /// Thread name.
    pub name: String,
    /// `created`, `running`, `parked` or `finished`.
    pub state: ThreadState,
    /// The CPUs it may run on, in the kernel's list form (`0-3,6`; its affinity as the
    /// kernel has it now); null before it started or after it ended.
    #[serde(default)]
    pub cpus: Option<String>,
    /// The CPU it last ran on (the kernel's `processor` of the thread); null when unknown.
    #[serde(default)]
    pub last_cpu: Option<u32>,
}

/// One service thread (main, signals, api, api-stats, sampler, limiter) in `threads`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ServiceThreadInfo {
    /// Thread name.
    pub name: String,
    /// Host thread id.
    pub host_tid: i32,
    /// The CPUs it may run on (list form); null when it cannot be read (it ended).
    pub cpus: Option<String>,
    /// The CPU it last ran on.
    pub last_cpu: Option<u32>,
}

/// Result of `threads`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Threads {
    /// The VMM's process id.
    pub pid: u32,
    /// Each vCPU thread.
    pub vcpus: Vec<ThreadInfo>,
    /// Each device thread.
    #[serde(default)]
    pub devices: Vec<crate::DeviceThreadInfo>,
    /// The service threads, as found when the threads were placed at the start.
    #[serde(default)]
    pub service: Vec<ServiceThreadInfo>,
    /// The placement rules in force (`--pin`, `set-pin`): `KEY=CPUS`.
    #[serde(default)]
    pub pins: Vec<String>,
}
