//! The bodies of Firecracker's API, in Firecracker's JSON layout (its swagger file, 1.x): what
//! its clients send and what they read back. Plain serde structs, no KVM type; every body a
//! client sends refuses unknown fields, as Firecracker's do.
//!
//! Data flow: the API thread ([`super::api`]) and the config-file reader
//! ([`super::resources::Resources::from_config_file`]) deserialize these; the pre-boot state
//! ([`super::resources`]) keeps them as given and serializes them back for `GET
//! /machine-config` and `GET /vm/config`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Firecracker's default memory size, MiB.
pub const DEFAULT_MEM_SIZE_MIB: u64 = 128;

/// `PUT /machine-config` (and the config file's `machine-config`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MachineConfig {
    /// vCPUs.
    pub vcpu_count: u16,
    /// Guest memory, MiB.
    pub mem_size_mib: u64,
    /// Simultaneous multithreading (refused when true).
    #[serde(default)]
    pub smt: bool,
    /// A static CPU template (refused unless `None`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_template: Option<String>,
    /// Dirty page tracking for diff snapshots (refused when true).
    #[serde(default)]
    pub track_dirty_pages: bool,
    /// Page size backing guest memory (refused unless `None`).
    #[serde(default)]
    pub huge_pages: HugePages,
}

impl Default for MachineConfig {
    fn default() -> Self {
        MachineConfig {
            vcpu_count: 1,
            mem_size_mib: DEFAULT_MEM_SIZE_MIB,
            smt: false,
            cpu_template: None,
            track_dirty_pages: false,
            huge_pages: HugePages::None,
        }
    }
}

/// `PATCH /machine-config`: any subset of [`MachineConfig`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MachineConfigUpdate {
    /// vCPUs.
    pub vcpu_count: Option<u16>,
    /// Guest memory, MiB.
    pub mem_size_mib: Option<u64>,
    /// Simultaneous multithreading.
    pub smt: Option<bool>,
    /// A static CPU template.
    pub cpu_template: Option<String>,
    /// Dirty page tracking.
    pub track_dirty_pages: Option<bool>,
    /// Page size backing guest memory.
    pub huge_pages: Option<HugePages>,
}

/// Firecracker's `huge_pages` values.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum HugePages {
    /// 4 KiB pages.
    #[default]
    None,
    /// Transparent huge pages (madvise).
    Transparent,
    /// 2 MiB hugetlbfs pages.
    #[serde(rename = "2M")]
    Hugetlbfs2M,
}

impl HugePages {
    /// The value as a client writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            HugePages::None => "None",
            HugePages::Transparent => "Transparent",
            HugePages::Hugetlbfs2M => "2M",
        }
    }
}

/// `PUT /boot-source`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BootSource {
    /// A Linux kernel (bzImage or ELF vmlinux), or a tiny-guest ELF image.
    pub kernel_image_path: String,
    /// The Linux guest's initial RAM disk.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initrd_path: Option<String>,
    /// The kernel command line (a tiny guest reads its `ppa.workload=` words).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_args: Option<String>,
}

/// A token bucket of a rate limiter.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenBucket {
    /// Tokens the bucket holds (0: no limit).
    pub size: u64,
    /// An initial burst.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub one_time_burst: Option<u64>,
    /// Milliseconds to refill (0: no limit).
    pub refill_time: u64,
}

impl TokenBucket {
    /// Whether the bucket limits anything (Firecracker disables a bucket of size or refill
    /// time 0).
    pub fn limits(&self) -> bool {
        self.size > 0 && self.refill_time > 0
    }
}

/// A rate limiter: bytes and operations.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateLimiter {
    /// Bytes per refill time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bandwidth: Option<TokenBucket>,
    /// Operations per refill time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ops: Option<TokenBucket>,
}

impl RateLimiter {
    /// Whether any bucket limits anything.
    pub fn limits(&self) -> bool {
        self.bandwidth
            .iter()
            .chain(&self.ops)
            .any(TokenBucket::limits)
    }
}

/// `PUT /drives/{id}` (and the config file's `drives`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Drive {
    /// The drive's id.
    pub drive_id: String,
    /// The root partition's UUID.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partuuid: Option<String>,
    /// Whether the guest mounts it as its root.
    pub is_root_device: bool,
    /// `Unsafe` or `Writeback`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_type: Option<String>,
    /// Read-only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub is_read_only: Option<bool>,
    /// The host file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path_on_host: Option<String>,
    /// Its rate limiter.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limiter: Option<RateLimiter>,
    /// `Sync` or `Async`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub io_engine: Option<String>,
    /// A vhost-user-block socket.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub socket: Option<String>,
}

/// `PATCH /drives/{id}`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PartialDrive {
    /// The drive's id.
    pub drive_id: String,
    /// A new host file.
    pub path_on_host: Option<String>,
    /// A new rate limiter.
    pub rate_limiter: Option<RateLimiter>,
}

/// `PUT /network-interfaces/{id}` (and the config file's `network-interfaces`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetworkInterface {
    /// The interface's id (our device id).
    pub iface_id: String,
    /// The host's tap.
    pub host_dev_name: String,
    /// The guest's MAC address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guest_mac: Option<String>,
    /// The MTU offered to the guest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u16>,
    /// Receive rate limiter.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rx_rate_limiter: Option<RateLimiter>,
    /// Transmit rate limiter.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tx_rate_limiter: Option<RateLimiter>,
}

/// `PATCH /network-interfaces/{id}`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PartialNetworkInterface {
    /// The interface's id.
    pub iface_id: String,
    /// Receive rate limiter.
    pub rx_rate_limiter: Option<RateLimiter>,
    /// Transmit rate limiter.
    pub tx_rate_limiter: Option<RateLimiter>,
}

/// The actions of `PUT /actions`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum ActionType {
    /// Write a metrics line now.
    FlushMetrics,
    /// Build and start the VM.
    InstanceStart,
    /// Ask the guest to shut down.
    SendCtrlAltDel,
}

/// `PUT /actions`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InstanceActionInfo {
    /// Which action.
    pub action_type: ActionType,
}

/// The states `PATCH /vm` sets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum VmStateChange {
    /// Park every vCPU.
    Paused,
    /// Release them.
    Resumed,
}

/// `PATCH /vm`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VmPatch {
    /// The state to go to.
    pub state: VmStateChange,
}

/// `PUT /logger` (and the config file's `logger`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Logger {
    /// A file or named pipe for the log lines (default: stderr).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log_path: Option<String>,
    /// Error, Warning, Info, Debug, Trace or Off (any case).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub level: Option<String>,
    /// Put the level in each line.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub show_level: Option<bool>,
    /// Put the source file and line in each line.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub show_log_origin: Option<bool>,
    /// Only lines of modules under this path.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub module: Option<String>,
}

/// `PUT /metrics` (and the config file's `metrics`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Metrics {
    /// A file or named pipe for the metrics lines.
    pub metrics_path: String,
    /// Put the instance id in each line (`"id"`).
    #[serde(default)]
    pub emit_id: bool,
    /// Key-value pairs put in each line (`"properties"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub properties: Option<BTreeMap<String, String>>,
}

/// `GET /`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct InstanceInfo {
    /// `Firecracker`, which clients check; `vmm_version` says what it really is.
    pub app_name: String,
    /// The instance id (`--id`).
    pub id: String,
    /// `Not started`, `Running` or `Paused`.
    pub state: String,
    /// Our version, marked as PPA-VMM's.
    pub vmm_version: String,
}

/// A failed request's body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Fault {
    /// What went wrong, as a sentence.
    pub fault_message: String,
}

/// The config file of `--config-file`, and what `GET /vm/config` answers: Firecracker's
/// `FullVmConfiguration`. The sections PPA-VMM does not have are read as any JSON value, so
/// that a file that uses one is refused with a sentence naming it rather than a parse error.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct FullVmConfig {
    /// Not there (refused when given).
    #[serde(default)]
    pub balloon: Option<serde_json::Value>,
    /// The drives.
    #[serde(default)]
    pub drives: Vec<Drive>,
    /// What boots.
    #[serde(default)]
    pub boot_source: Option<BootSource>,
    /// Not there (refused when given).
    #[serde(default)]
    pub cpu_config: Option<serde_json::Value>,
    /// The logger.
    #[serde(default)]
    pub logger: Option<Logger>,
    /// vCPUs and memory.
    #[serde(default)]
    pub machine_config: Option<MachineConfig>,
    /// The metrics file.
    #[serde(default)]
    pub metrics: Option<Metrics>,
    /// Not there (refused when given).
    #[serde(default)]
    pub mmds_config: Option<serde_json::Value>,
    /// The network interfaces.
    #[serde(default)]
    pub network_interfaces: Vec<NetworkInterface>,
    /// Not there until vsock exists (refused when given).
    #[serde(default)]
    pub vsock: Option<serde_json::Value>,
    /// Not there (refused when given).
    #[serde(default)]
    pub entropy: Option<serde_json::Value>,
    /// Not there (refused when given; absent from what `GET /vm/config` answers).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pmem: Vec<serde_json::Value>,
    /// Not there (refused when given; absent from what `GET /vm/config` answers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_hotplug: Option<serde_json::Value>,
}
