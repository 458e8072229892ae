//! Capabilities of the calling thread: read them, and drop all but a few.
//!
//! Linux keeps capability sets per thread, so each thread kind drops what it does not need
//! when its set-up ends ([`drop_all_but`]): the bounding set (while CAP_SETPCAP still allows
//! it), the ambient set, then the effective, permitted and inheritable sets through `capset`.
//! A process without privilege has nothing to drop, and nothing fails.

use std::io;

/// CAP_DAC_OVERRIDE: bypass file read, write and search permission checks.
pub const CAP_DAC_OVERRIDE: u32 = 1;
/// CAP_SETPCAP: needed to drop from the bounding set.
const CAP_SETPCAP: u32 = 8;
/// CAP_PERFMON: perf events where `perf_event_paranoid` forbids them to the unprivileged
/// (Debian and Ubuntu kernels default to 3, which forbids even a thread's own events).
pub const CAP_PERFMON: u32 = 38;
/// CAP_SYS_NICE: a real-time class (the `api` thread returning to SCHED_FIFO).
pub const CAP_SYS_NICE: u32 = 23;
/// The highest capability number this code knows of (CAP_CHECKPOINT_RESTORE, Linux 5.9);
/// later ones are dropped from the bounding set by trying up to 63.
const CAP_LAST_KNOWN: u32 = 40;

/// Names of the capabilities this module refers to, for logs.
const NAMES: [(u32, &str); 3] = [
    (CAP_DAC_OVERRIDE, "CAP_DAC_OVERRIDE"),
    (CAP_SETPCAP, "CAP_SETPCAP"),
    (CAP_PERFMON, "CAP_PERFMON"),
];

const VERSION_3: u32 = 0x2008_0522;

#[repr(C)]
struct Header {
    version: u32,
    pid: libc::c_int,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct Data {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// The calling thread's (effective, permitted) sets as bit masks.
pub fn current() -> io::Result<(u64, u64)> {
    let mut h = Header {
        version: VERSION_3,
        pid: 0,
    };
    let mut d = [Data::default(); 2];
    // SAFETY: capget with a version-3 header and room for its two data structs writes only
    // into `h` and `d`; pid 0 is the calling thread.
    let rc = unsafe { libc::syscall(libc::SYS_capget, &mut h, d.as_mut_ptr()) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    let join = |lo: u32, hi: u32| u64::from(lo) | (u64::from(hi) << 32);
    Ok((
        join(d[0].effective, d[1].effective),
        join(d[0].permitted, d[1].permitted),
    ))
}

/// Drops every capability of the calling thread except those of `keep` (a bit mask) that it
/// has; returns what it kept. Also clears the ambient set and, if the thread may, the
/// bounding set except `keep`.
pub fn drop_all_but(keep: u64) -> io::Result<u64> {
    let (effective, permitted) = current()?;
    // SAFETY: prctl with PR_CAP_AMBIENT_CLEAR_ALL takes integer arguments only; it fails
    // (EINVAL) on kernels without ambient capabilities, which leaves nothing to clear.
    unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL,
            0,
            0,
            0,
        )
    };
    if effective & (1 << CAP_SETPCAP) != 0 {
        for cap in 0..64u32 {
            if keep & (1 << cap) != 0 {
                continue;
            }
            // SAFETY: PR_CAPBSET_DROP takes one capability number; numbers the kernel does
            // not know give EINVAL, which ends the loop.
            let rc = unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) };
            if rc != 0 && cap > CAP_LAST_KNOWN {
                break;
            }
        }
    }
    let kept = keep & permitted;
    let lo = |m: u64| m as u32;
    let hi = |m: u64| (m >> 32) as u32;
    let d = [
        Data {
            effective: lo(kept),
            permitted: lo(kept),
            inheritable: 0,
        },
        Data {
            effective: hi(kept),
            permitted: hi(kept),
            inheritable: 0,
        },
    ];
    let h = Header {
        version: VERSION_3,
        pid: 0,
    };
    // SAFETY: capset reads a version-3 header and two data structs, all live for the call;
    // pid 0 is the calling thread, and the sets asked for are a subset of its permitted set.
    let rc = unsafe { libc::syscall(libc::SYS_capset, &h, d.as_ptr()) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(kept)
}

/// The capability bit of `cap`.
pub const fn bit(cap: u32) -> u64 {
    1 << cap
}

/// `mask` as names, for logs (`none` when empty).
pub fn names(mask: u64) -> String {
    if mask == 0 {
        return "none".into();
    }
    (0..64)
        .filter(|c| mask & (1 << c) != 0)
        .map(|c| {
            NAMES
                .iter()
                .find(|(n, _)| *n == c)
                .map_or_else(|| format!("cap {c}"), |(_, s)| (*s).to_string())
        })
        .collect::<Vec<_>>()
        .join(", ")
}
