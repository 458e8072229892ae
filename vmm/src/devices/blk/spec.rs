//! `--disk` values: `path=FILE[,readonly=on][,id=NAME][,queues=N][,rate=BUCKETS][,poll_us=N]`, parsed and checked before
//! anything is built (a bad value is exit code 2 with a sentence, before any vCPU runs).
//!
//! Data flow: the config layer hands each `--disk` string (or config-file entry) to
//! [`DiskSpec::parse`]; the VM builder gives each spec its id (`blk0`, `blk1`, … in order,
//! unless `id=` names it), which is also the string GET_ID answers, and opens the file.

use std::path::PathBuf;

use thiserror::Error;

use crate::devices::cut;
use crate::devices::rate::{self, RateSpec, RateSpecError};

/// What `rate=` limits on a disk: the requests' data bytes and the requests.
pub const RATE_KINDS: &[&str] = &["bytes", "ops"];
/// A `rate=` value shown in its errors.
pub const RATE_EXAMPLE: &str = "bytes:100M/1s+ops:1000/1s";

/// The most request queues a disk may have (one thread each).
pub const MAX_QUEUES: u16 = 16;
/// The longest polling of an empty ring, µs.
pub const MAX_POLL_US: u32 = 1000;
/// The longest id: GET_ID answers 20 bytes (`VIRTIO_BLK_ID_BYTES`).
pub const MAX_ID: usize = 20;

/// Why a `--disk` value was refused.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum DiskSpecError {
    /// `path=` is missing.
    #[error("a disk needs path=FILE (e.g. --disk path=rootfs.ext4)")]
    NoPath,
    /// A key the option does not take.
    #[error("--disk has no key `{0}` (it takes path, readonly, id, queues, rate and poll_us)")]
    UnknownKey(String),
    /// A key given twice.
    #[error("--disk key `{0}` is given twice")]
    Duplicate(String),
    /// `key=value` expected.
    #[error("`{0}` is not of the form key=value")]
    NotKeyValue(String),
    /// An empty path.
    #[error("path= is empty; it names the disk's file")]
    EmptyPath,
    /// A bad `readonly=` value.
    #[error("readonly={0} is neither on nor off")]
    BadReadonly(String),
    /// A bad queue count.
    #[error("queues={0} is out of range: 1 to {MAX_QUEUES} request queues")]
    BadQueues(String),
    /// A bad `poll_us=` value.
    #[error("poll_us={0} is out of range: 0 (no polling) to {MAX_POLL_US} µs")]
    BadPoll(String),
    /// A bad id.
    #[error("id={0} is not a usable disk id (1 to {MAX_ID} letters, digits, `-` or `_`: GET_ID answers it in 20 bytes)")]
    BadId(String),
    /// A bad `rate=` value.
    #[error(transparent)]
    Rate(#[from] RateSpecError),
}

/// One disk as configured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskSpec {
    /// The file (a regular file or a block device) holding the disk's bytes.
    pub path: PathBuf,
    /// Whether the guest may only read it (`VIRTIO_BLK_F_RO`; the file is opened read-only).
    pub readonly: bool,
    /// The device id (None: `blk` and its index), which GET_ID answers.
    pub id: Option<String>,
    /// Request queues (each with its own thread).
    pub queues: u16,
    /// Its rate limiter's buckets (`rate=`).
    pub rate: RateSpec,
    /// How long a request thread keeps looking at its emptied ring for new requests before
    /// it turns the driver's notifications on and sleeps, µs (0: it does not).
    pub poll_us: u32,
}

fn valid_id(s: &str) -> bool {
    (1..=MAX_ID).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

impl DiskSpec {
    /// Parses `path=FILE[,readonly=on|off][,id=NAME][,queues=N][,rate=BUCKETS][,poll_us=N]`
    /// (a path cannot hold a comma).
    pub fn parse(s: &str) -> Result<DiskSpec, DiskSpecError> {
        let mut spec = DiskSpec {
            path: PathBuf::new(),
            readonly: false,
            id: None,
            queues: 1,
            rate: RateSpec::default(),
            poll_us: 0,
        };
        let mut seen: Vec<&str> = Vec::new();
        for kv in s.split(',').filter(|p| !p.is_empty()) {
            let (k, v) = kv
                .split_once('=')
                .ok_or_else(|| DiskSpecError::NotKeyValue(cut(kv)))?;
            if seen.contains(&k) {
                return Err(DiskSpecError::Duplicate(cut(k)));
            }
            match k {
                "path" if v.is_empty() => return Err(DiskSpecError::EmptyPath),
                "path" => spec.path = PathBuf::from(v),
                "readonly" => {
                    spec.readonly = match v {
                        "on" | "true" | "yes" | "1" => true,
                        "off" | "false" | "no" | "0" => false,
                        _ => return Err(DiskSpecError::BadReadonly(cut(v))),
                    }
                }
                "id" if valid_id(v) => spec.id = Some(v.to_string()),
                "id" => return Err(DiskSpecError::BadId(cut(v))),
                "queues" => {
                    spec.queues = v
                        .parse()
                        .ok()
                        .filter(|q| (1..=MAX_QUEUES).contains(q))
                        .ok_or_else(|| DiskSpecError::BadQueues(cut(v)))?;
                }
                "rate" => spec.rate = parse_rate(v)?,
                "poll_us" => {
                    spec.poll_us = v
                        .parse()
                        .ok()
                        .filter(|p| *p <= MAX_POLL_US)
                        .ok_or_else(|| DiskSpecError::BadPoll(cut(v)))?;
                }
                _ => return Err(DiskSpecError::UnknownKey(cut(k))),
            }
            seen.push(k);
        }
        if spec.path.as_os_str().is_empty() {
            return Err(DiskSpecError::NoPath);
        }
        Ok(spec)
    }

    /// The `rate=` value that gives this disk's limits (None: it has none).
    pub fn rate_value(&self) -> Option<String> {
        rate_value(&self.rate)
    }
}

/// A disk's `rate=` value as its buckets; `none` (what `set-rate` takes to remove them;
/// `--disk` takes it too) gives none.
pub fn parse_rate(v: &str) -> Result<RateSpec, RateSpecError> {
    let mut spec = RateSpec::default();
    if v == rate::NONE {
        return Ok(spec);
    }
    for (kind, b) in rate::parse(v, RATE_KINDS, RATE_EXAMPLE)? {
        *(if kind == 0 {
            &mut spec.bytes
        } else {
            &mut spec.ops
        }) = Some(b);
    }
    Ok(spec)
}

/// The `rate=` value of a disk's buckets `r` (None: it has none).
pub fn rate_value(r: &RateSpec) -> Option<String> {
    let v = r.describe("", "ops");
    (!v.is_empty()).then(|| v.join("+"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_disk_is_a_path_with_options() {
        let d = DiskSpec::parse("path=/var/lib/vm/root.ext4").unwrap();
        assert_eq!(d.path, PathBuf::from("/var/lib/vm/root.ext4"));
        assert_eq!((d.readonly, d.id.as_deref(), d.queues), (false, None, 1));
        let d = DiskSpec::parse("path=a.img,readonly=on,id=data_1,queues=2").unwrap();
        assert_eq!(
            (d.readonly, d.id.as_deref(), d.queues),
            (true, Some("data_1"), 2)
        );
        assert!(!DiskSpec::parse("readonly=off,path=x").unwrap().readonly);
        assert!(d.rate_value().is_none());
        let d = DiskSpec::parse("path=a,rate=ops:1k/1s+bytes:10Mi/100ms:burst=1Gi").unwrap();
        assert_eq!(d.rate.ops.unwrap().per_second(), 1_000);
        assert_eq!(d.rate.bytes.unwrap().per_second(), 104_857_600);
        assert_eq!(
            d.rate_value().unwrap(),
            "bytes:10485760/100ms:burst=1073741824+ops:1000/1s"
        );
        assert_eq!(DiskSpec::parse("path=a").unwrap().poll_us, 0);
        assert_eq!(DiskSpec::parse("path=a,poll_us=50").unwrap().poll_us, 50);
        let e = DiskSpec::parse("path=a,rate=tx-bytes:1/1s").unwrap_err();
        assert!(e.to_string().contains("it takes bytes, ops"), "{e}");
    }

    #[test]
    fn bad_values_are_refused_with_a_reason() {
        use DiskSpecError::*;
        for (s, e) in [
            ("", NoPath),
            ("readonly=on", NoPath),
            ("path=", EmptyPath),
            ("path=a,size=3", UnknownKey("size".into())),
            ("path=a,path=b", Duplicate("path".into())),
            ("path=a,ro", NotKeyValue("ro".into())),
            ("path=a,readonly=maybe", BadReadonly("maybe".into())),
            ("path=a,queues=0", BadQueues("0".into())),
            ("path=a,queues=17", BadQueues("17".into())),
            ("path=a,poll_us=1001", BadPoll("1001".into())),
            ("path=a,poll_us=-1", BadPoll("-1".into())),
            ("path=a,id=a b", BadId("a b".into())),
            (
                "path=a,id=abcdefghijklmnopqrstu",
                BadId("abcdefghijklmnopqrstu".into()),
            ),
        ] {
            assert_eq!(DiskSpec::parse(s), Err(e), "{s}");
        }
        // Twenty characters fit GET_ID's answer exactly.
        assert!(DiskSpec::parse("path=a,id=abcdefghijklmnopqrst").is_ok());
    }
}
