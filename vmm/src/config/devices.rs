//! The devices of a configuration: each `--net` and `--disk` value parsed, and the set checked
//! against the VM (queues within its vCPUs, room in the memory map, no two devices with one
//! id).
//!
//! Data flow: [`super::RunOptions::into_config`] calls [`parse_nets`] and [`parse_disks`] on
//! the strings the command line and the config file gave; [`super::VmConfig::validate`] calls
//! [`check`] on the parsed specs (also for a `VmConfig` built in code).

use std::collections::BTreeSet;

use super::ConfigError;
use crate::arch::x86_64::layout::MAX_VIRTIO_DEVICES;
use crate::devices::blk::spec::DiskSpec;
use crate::devices::net::spec::NetSpec;

/// At most 200 characters of a value for an error message.
fn cut(spec: &str) -> String {
    spec.chars().take(200).collect()
}

/// Each `--net` device.
pub fn parse_nets(specs: &[String]) -> Result<Vec<NetSpec>, ConfigError> {
    specs
        .iter()
        .map(|spec| {
            NetSpec::parse(spec).map_err(|source| ConfigError::Net {
                spec: cut(spec),
                source,
            })
        })
        .collect()
}

/// Each `--disk` device.
pub fn parse_disks(specs: &[String]) -> Result<Vec<DiskSpec>, ConfigError> {
    specs
        .iter()
        .map(|spec| {
            DiskSpec::parse(spec).map_err(|source| ConfigError::Disk {
                spec: cut(spec),
                source,
            })
        })
        .collect()
}

/// The ids the devices get: `net0`, `net1`, … and `blk0`, `blk1`, … in order, unless named.
pub fn ids(net: &[NetSpec], disks: &[DiskSpec]) -> (Vec<String>, Vec<String>) {
    (
        net.iter()
            .enumerate()
            .map(|(i, n)| n.id.clone().unwrap_or_else(|| format!("net{i}")))
            .collect(),
        disks
            .iter()
            .enumerate()
            .map(|(i, d)| d.id.clone().unwrap_or_else(|| format!("blk{i}")))
            .collect(),
    )
}

/// Checks the devices against a VM of `vcpus` vCPUs.
pub fn check(vcpus: usize, net: &[NetSpec], disks: &[DiskSpec]) -> Result<(), ConfigError> {
    let count = net.len() + disks.len();
    if count > MAX_VIRTIO_DEVICES {
        return Err(ConfigError::TooManyDevices(count));
    }
    for n in net {
        if usize::from(n.queues) > vcpus {
            return Err(ConfigError::NetQueues {
                tap: n.tap.clone(),
                queues: n.queues,
                vcpus,
            });
        }
    }
    for d in disks {
        if usize::from(d.queues) > vcpus {
            return Err(ConfigError::DiskQueues {
                path: d.path.display().to_string(),
                queues: d.queues,
                vcpus,
            });
        }
    }
    let (net_ids, disk_ids) = ids(net, disks);
    let mut seen = BTreeSet::new();
    for id in net_ids.into_iter().chain(disk_ids) {
        if !seen.insert(id.clone()) {
            return Err(ConfigError::DeviceId(id));
        }
    }
    Ok(())
}
