//! KVM's exit cost, kept per host in the run directory (`calibration.json`), so that a VM
//! does not measure it on a scratch VM at every start (spec section 11, "Ready fast": the
//! measurement was ~10 of the 27 ms from exec to an answering socket on the development
//! host).
//!
//! Data flow: `Vm::build` calls [`exit_cost`] with the cache file and the measurement. The
//! file holds the figures with the key they were measured under: the kernel (release and
//! version), the CPU model and the KVM backend (which of kvm_intel, kvm_amd, kvm_pvm is
//! loaded). A file that is missing, unreadable, not ours, or whose key differs from this
//! host's now is measured again and replaced (atomically, mode 0600); a failure to write it
//! only costs the next VM the measurement.

use std::fs;
use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::hypervisor::ExitCost;

/// What the figures depend on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostKey {
    /// `uname -r` and `uname -v`.
    pub kernel: String,
    /// The first `model name` of /proc/cpuinfo.
    pub cpu_model: String,
    /// The KVM modules loaded (`kvm_intel`, `kvm_amd`, `kvm_pvm`).
    pub backend: String,
}

/// The file's contents.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Cached {
    /// Under what it was measured.
    pub key: HostKey,
    /// [`ExitCost::hot_ns`].
    pub hot_ns: u64,
    /// [`ExitCost::after_park_ns`].
    pub after_park_ns: u64,
    /// [`ExitCost::after_long_park_ns`] (a file without it, from before it was measured, is
    /// not read: measured again and replaced).
    pub after_long_park_ns: u64,
}

fn uname() -> String {
    // SAFETY: utsname is plain data; uname fills it and returns 0 on success.
    let mut u: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: `u` is a valid, writable utsname.
    if unsafe { libc::uname(&mut u) } != 0 {
        return String::new();
    }
    let field = |f: &[libc::c_char]| {
        let bytes: Vec<u8> = f
            .iter()
            .take_while(|c| **c != 0)
            .map(|c| *c as u8)
            .collect();
        String::from_utf8_lossy(&bytes).into_owned()
    };
    format!("{} {}", field(&u.release), field(&u.version))
}

/// This host's key now.
pub fn host_key() -> HostKey {
    let cpu_model = fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines().find_map(|l| {
                l.strip_prefix("model name")
                    .map(|r| r.trim_start_matches([' ', '\t', ':']).to_string())
            })
        })
        .unwrap_or_default();
    let backend = ["kvm_intel", "kvm_amd", "kvm_pvm"]
        .into_iter()
        .filter(|m| Path::new("/sys/module").join(m).exists())
        .collect::<Vec<_>>()
        .join(",");
    HostKey {
        kernel: uname(),
        cpu_model,
        backend,
    }
}

/// The cached figures in `file` when they were measured under `key` and the file is ours.
/// Opened `O_NONBLOCK | O_NOFOLLOW` and read only when it is a regular file: a FIFO or a link
/// planted at the path is a miss (measured again and replaced), never a VMM blocked at start.
pub fn read(file: &Path, key: &HostKey) -> Option<ExitCost> {
    let f = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW)
        .open(file)
        .ok()?;
    let meta = f.metadata().ok()?;
    // SAFETY: geteuid has no preconditions.
    if !meta.is_file() || meta.uid() != unsafe { libc::geteuid() } {
        return None;
    }
    let mut text = String::new();
    f.take(4096).read_to_string(&mut text).ok()?;
    let c: Cached = serde_json::from_str(&text).ok()?;
    (c.key == *key && c.hot_ns > 0).then_some(ExitCost {
        hot_ns: c.hot_ns,
        after_park_ns: c.after_park_ns,
        after_long_park_ns: c.after_long_park_ns,
    })
}

/// Writes `cost` under `key` to `file`, atomically.
pub fn write(file: &Path, key: &HostKey, cost: ExitCost) -> std::io::Result<()> {
    let c = Cached {
        key: key.clone(),
        hot_ns: cost.hot_ns,
        after_park_ns: cost.after_park_ns,
        after_long_park_ns: cost.after_long_park_ns,
    };
    let tmp = file.with_extension(format!("tmp.{}", std::process::id()));
    let _ = fs::remove_file(&tmp);
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)?;
    f.write_all(
        serde_json::to_string(&c)
            .map_err(std::io::Error::other)?
            .as_bytes(),
    )?;
    drop(f);
    fs::rename(&tmp, file).inspect_err(|_| {
        let _ = fs::remove_file(&tmp);
    })
}

/// The exit cost from `file` when it holds this host's, else `measure()`'s, kept in `file`.
pub fn exit_cost(file: &Path, measure: impl FnOnce() -> Option<ExitCost>) -> Option<ExitCost> {
    let key = host_key();
    if let Some(c) = read(file, &key) {
        log::debug!("KVM exit cost from {}", file.display());
        return Some(c);
    }
    let c = measure()?;
    if let Err(e) = write(file, &key, c) {
        log::info!("cannot keep the exit cost in {}: {e}", file.display());
    }
    Some(c)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    #[test]
    fn measured_once_per_host_key_and_measured_again_when_it_changes() {
        let dir = vmm_sys_util::tempdir::TempDir::new().unwrap();
        let file = dir.as_path().join("calibration.json");
        let measured = Cell::new(0);
        let measure = || {
            measured.set(measured.get() + 1);
            Some(ExitCost {
                hot_ns: 18_000,
                after_park_ns: 26_000,
                after_long_park_ns: 75_000,
            })
        };
        let a = exit_cost(&file, measure).unwrap();
        let b = exit_cost(&file, measure).unwrap();
        assert_eq!((a, measured.get()), (b, 1), "the second VM reads the file");
        assert_eq!((b.after_park_ns, b.after_long_park_ns), (26_000, 75_000));
        // A file of before the long park was measured: not read, measured again.
        let old = format!(
            "{{\"key\":{},\"hot_ns\":18000,\"after_park_ns\":26000}}",
            serde_json::to_string(&host_key()).unwrap()
        );
        fs::write(&file, old).unwrap();
        assert_eq!(read(&file, &host_key()), None);
        exit_cost(&file, measure).unwrap();
        assert_eq!(measured.get(), 2, "measured again");
        assert!(read(&file, &host_key()).is_some(), "and replaced");
        measured.set(1);
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            fs::metadata(&file).unwrap().permissions().mode() & 0o777,
            0o600
        );
        // Another kernel (or CPU, or backend): the file is not this host's.
        let mut other = host_key();
        other.kernel.push_str(" (another)");
        assert_eq!(read(&file, &other), None);
        write(&file, &other, a).unwrap();
        exit_cost(&file, measure).unwrap();
        assert_eq!(measured.get(), 2, "measured again, and kept");
        assert!(read(&file, &host_key()).is_some());
        // Garbage, or a measurement that failed: measured, nothing cached.
        fs::write(&file, b"{garbage").unwrap();
        assert!(exit_cost(&file, || None).is_none());
        assert_eq!(read(&file, &host_key()), None);
        // Where nothing can be written, the measurement still serves.
        let nowhere = dir.as_path().join("missing/calibration.json");
        assert!(exit_cost(&nowhere, measure).is_some());
    }

    /// Issue 39, item 5: a FIFO planted as the run directory's `calibration.json` would block
    /// a VMM's start in `open` (as one planted as a descriptor did). A FIFO or a link is a
    /// miss, measured again and replaced; the link's target is not followed or written.
    #[test]
    fn a_fifo_or_a_link_at_the_cache_is_a_miss_and_never_blocks() {
        let dir = vmm_sys_util::tempdir::TempDir::new().unwrap();
        let file = dir.as_path().join("calibration.json");
        let c = std::ffi::CString::new(file.to_str().unwrap()).unwrap();
        // SAFETY: `c` is a NUL-terminated path that outlives the call.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let (tx, rx) = std::sync::mpsc::channel();
        let f = file.clone();
        std::thread::spawn(move || {
            let _ = tx.send(read(&f, &host_key()));
        });
        let got = rx
            .recv_timeout(std::time::Duration::from_secs(5))
            .expect("reading a FIFO as the cache blocked for 5 s");
        assert_eq!(got, None);
        // A link to a good cache of this host: not followed.
        let target = dir.as_path().join("real.json");
        let cost = ExitCost {
            hot_ns: 18_000,
            after_park_ns: 26_000,
            after_long_park_ns: 75_000,
        };
        write(&target, &host_key(), cost).unwrap();
        assert_eq!(read(&target, &host_key()), Some(cost));
        fs::remove_file(&file).unwrap();
        std::os::unix::fs::symlink(&target, &file).unwrap();
        assert_eq!(read(&file, &host_key()), None);
    }

    #[test]
    fn the_key_names_the_kernel_and_cpu() {
        let k = host_key();
        assert!(!k.kernel.is_empty());
        assert!(k.kernel.contains(' '), "release and version: {k:?}");
    }
}
