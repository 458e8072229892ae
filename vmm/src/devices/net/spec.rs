//! `--net` values: `tap=NAME[,mac=MAC][,queues=N][,mtu=M][,id=ID][,rate=BUCKETS]`, parsed and checked before
//! anything is built (a bad value is exit code 2 with a sentence, before any vCPU runs).
//!
//! Data flow: the config layer hands each `--net` string (or config-file entry) to
//! [`NetSpec::parse`]; the VM builder gives each spec its id (`net0`, `net1`, … in order,
//! unless `id=` names it) and checks the queue count against the vCPUs.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use thiserror::Error;

use super::tap::MAX_NAME;
use crate::devices::cut;
use crate::devices::rate::{self, RateSpec, RateSpecError};

/// What `rate=` limits on a network device, in the order [`NetSpec`] keeps them.
pub const RATE_KINDS: &[&str] = &["rx-bytes", "rx-packets", "tx-bytes", "tx-packets"];
/// A `rate=` value shown in its errors.
pub const RATE_EXAMPLE: &str = "tx-bytes:125M/1s+rx-packets:100k/1s";

/// The most queue pairs a device may have.
pub const MAX_QUEUE_PAIRS: u16 = 16;
/// Default MTU offered to the guest.
pub const DEFAULT_MTU: u16 = 1500;

/// Why a `--net` value was refused.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum NetSpecError {
    /// `tap=` is missing.
    #[error("a network device needs tap=NAME (e.g. --net tap=tap0)")]
    NoTap,
    /// A key the option does not take.
    #[error("--net has no key `{0}` (it takes tap, mac, queues, mtu, id and rate)")]
    UnknownKey(String),
    /// A key given twice.
    #[error("--net key `{0}` is given twice")]
    Duplicate(String),
    /// `key=value` expected.
    #[error("`{0}` is not of the form key=value")]
    NotKeyValue(String),
    /// A bad interface name.
    #[error("`{0}` is not a usable interface name (1 to 15 bytes, no `/`, no spaces)")]
    BadName(String),
    /// A bad MAC address.
    #[error("`{0}` is not a unicast MAC address (six hex bytes like 02:00:00:00:00:01)")]
    BadMac(String),
    /// A bad queue count.
    #[error("queues={0} is out of range: 1 to {MAX_QUEUE_PAIRS} queue pairs")]
    BadQueues(String),
    /// A bad MTU.
    #[error("mtu={0} is out of range: 68 to 65535")]
    BadMtu(String),
    /// A bad id.
    #[error("id={0} is not a usable device id (1 to 32 letters, digits, `-` or `_`)")]
    BadId(String),
    /// A bad `rate=` value.
    #[error(transparent)]
    Rate(#[from] RateSpecError),
}

/// A MAC address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mac(pub [u8; 6]);

impl fmt::Display for Mac {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            b[0], b[1], b[2], b[3], b[4], b[5]
        )
    }
}

impl FromStr for Mac {
    type Err = NetSpecError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || NetSpecError::BadMac(s.chars().take(64).collect());
        let mut out = [0u8; 6];
        let mut parts = s.split([':', '-']);
        for b in &mut out {
            let p = parts.next().ok_or_else(bad)?;
            if p.len() != 2 {
                return Err(bad());
            }
            *b = u8::from_str_radix(p, 16).map_err(|_| bad())?;
        }
        // Multicast addresses and all zeros are not a device's own address.
        if parts.next().is_some() || out[0] & 1 == 1 || out == [0; 6] {
            return Err(bad());
        }
        Ok(Mac(out))
    }
}

impl Serialize for Mac {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Mac {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// One network device as configured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetSpec {
    /// The tap interface's name.
    pub tap: String,
    /// The guest's MAC address (None: one is made from the VMM's pid and the device index).
    pub mac: Option<Mac>,
    /// Queue pairs (each with its own thread and tap queue).
    pub queues: u16,
    /// MTU offered to the guest.
    pub mtu: u16,
    /// The device id (None: `net` and its index).
    pub id: Option<String>,
    /// What the guest may receive (frames delivered to it).
    pub rx_rate: RateSpec,
    /// What the guest may send (frames written to the tap).
    pub tx_rate: RateSpec,
}

fn valid_name(s: &str) -> bool {
    (1..=MAX_NAME).contains(&s.len())
        && s != "."
        && s != ".."
        && !s
            .bytes()
            .any(|b| b == b'/' || b == b':' || b.is_ascii_whitespace() || b < 0x20)
}

fn valid_id(s: &str) -> bool {
    (1..=32).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

impl NetSpec {
    /// Parses `tap=NAME[,mac=MAC][,queues=N][,mtu=M][,id=ID][,rate=BUCKETS]`, where BUCKETS
    /// are `KIND:SIZE/TIME[:burst=N]` joined by `+` and KIND is one of [`RATE_KINDS`].
    pub fn parse(s: &str) -> Result<NetSpec, NetSpecError> {
        let mut spec = NetSpec {
            tap: String::new(),
            mac: None,
            queues: 1,
            mtu: DEFAULT_MTU,
            id: None,
            rx_rate: RateSpec::default(),
            tx_rate: RateSpec::default(),
        };
        let mut seen: Vec<&str> = Vec::new();
        for kv in s.split(',').filter(|p| !p.is_empty()) {
            let (k, v) = kv
                .split_once('=')
                .ok_or_else(|| NetSpecError::NotKeyValue(cut(kv)))?;
            if seen.contains(&k) {
                return Err(NetSpecError::Duplicate(cut(k)));
            }
            match k {
                "tap" => {
                    if !valid_name(v) {
                        return Err(NetSpecError::BadName(cut(v)));
                    }
                    spec.tap = v.to_string();
                }
                "mac" => spec.mac = Some(v.parse()?),
                "queues" => {
                    spec.queues = v
                        .parse()
                        .ok()
                        .filter(|q| (1..=MAX_QUEUE_PAIRS).contains(q))
                        .ok_or_else(|| NetSpecError::BadQueues(cut(v)))?;
                }
                "mtu" => {
                    spec.mtu = v
                        .parse()
                        .ok()
                        .filter(|m| *m >= 68)
                        .ok_or_else(|| NetSpecError::BadMtu(cut(v)))?;
                }
                "id" => {
                    if !valid_id(v) {
                        return Err(NetSpecError::BadId(cut(v)));
                    }
                    spec.id = Some(v.to_string());
                }
                "rate" => (spec.rx_rate, spec.tx_rate) = parse_rate(v)?,
                _ => return Err(NetSpecError::UnknownKey(cut(k))),
            }
            seen.push(k);
        }
        if spec.tap.is_empty() {
            return Err(NetSpecError::NoTap);
        }
        Ok(spec)
    }

    /// The MAC address the guest gets: the configured one, or a locally administered one made
    /// from `pid` and the device `index` (02:50:PID:INDEX).
    pub fn mac_or_default(&self, pid: u32, index: usize) -> Mac {
        self.mac.unwrap_or_else(|| {
            let p = pid.to_be_bytes();
            Mac([0x02, 0x50, p[1], p[2], p[3], index as u8])
        })
    }

    /// The `rate=` value that gives this device's limits (None: it has none).
    pub fn rate_value(&self) -> Option<String> {
        rate_value(&self.rx_rate, &self.tx_rate)
    }
}

/// A network device's `rate=` value as (receive, transmit) buckets; `none` (what `set-rate`
/// takes to remove them; `--net` takes it too) gives none.
pub fn parse_rate(v: &str) -> Result<(RateSpec, RateSpec), RateSpecError> {
    let (mut rx, mut tx) = (RateSpec::default(), RateSpec::default());
    if v == rate::NONE {
        return Ok((rx, tx));
    }
    for (kind, b) in rate::parse(v, RATE_KINDS, RATE_EXAMPLE)? {
        let (way, bytes) = match kind {
            0 => (&mut rx, true),
            1 => (&mut rx, false),
            2 => (&mut tx, true),
            _ => (&mut tx, false),
        };
        *(if bytes { &mut way.bytes } else { &mut way.ops }) = Some(b);
    }
    Ok((rx, tx))
}

/// The `rate=` value of receive buckets `rx` and transmit buckets `tx` (None: neither limits).
pub fn rate_value(rx: &RateSpec, tx: &RateSpec) -> Option<String> {
    let mut v = rx.describe("rx-", "packets");
    v.extend(tx.describe("tx-", "packets"));
    (!v.is_empty()).then(|| v.join("+"))
}

impl FromStr for NetSpec {
    type Err = NetSpecError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        NetSpec::parse(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_spec_parses_and_defaults_fill_the_rest() {
        let s =
            NetSpec::parse("tap=tap0,mac=02:00:00:aa:bb:cc,queues=2,mtu=9000,id=uplink").unwrap();
        assert_eq!(s.tap, "tap0");
        assert_eq!(s.mac, Some(Mac([2, 0, 0, 0xaa, 0xbb, 0xcc])));
        assert_eq!((s.queues, s.mtu), (2, 9000));
        assert_eq!(s.id.as_deref(), Some("uplink"));
        let d = NetSpec::parse("tap=t").unwrap();
        assert_eq!(
            (d.queues, d.mtu, d.mac, d.id.clone()),
            (1, 1500, None, None)
        );
        let m = d.mac_or_default(0x123456, 3);
        assert_eq!(m, Mac([2, 0x50, 0x12, 0x34, 0x56, 3]));
        assert_eq!(m.to_string(), "02:50:12:34:56:03");
        assert_eq!(m.to_string().parse::<Mac>().unwrap(), m);
        assert!(!d.rx_rate.limits() && !d.tx_rate.limits() && d.rate_value().is_none());
        let n = NetSpec::parse("tap=t,rate=none").unwrap();
        assert!(!n.rx_rate.limits() && !n.tx_rate.limits() && n.rate_value().is_none());
        let (rx, tx) = parse_rate("tx-packets:10/1s").unwrap();
        assert!(!rx.limits() && tx.ops.is_some());
        assert_eq!(rate_value(&rx, &tx).as_deref(), Some("tx-packets:10/1s"));
        assert!(parse_rate("nothing").is_err() && parse_rate("").is_err());
    }

    #[test]
    fn rate_fills_each_ways_buckets_and_prints_back() {
        let s =
            NetSpec::parse("tap=t,rate=tx-packets:10k/1s+rx-bytes:1M/100ms:burst=64Ki").unwrap();
        assert_eq!(s.rx_rate.bytes.unwrap().size, 1_000_000);
        assert_eq!(s.rx_rate.bytes.unwrap().burst, 65_536);
        assert!(s.rx_rate.ops.is_none() && s.tx_rate.bytes.is_none());
        assert_eq!(s.tx_rate.ops.unwrap().per_second(), 10_000);
        let v = s.rate_value().unwrap();
        assert_eq!(v, "rx-bytes:1000000/100ms:burst=65536+tx-packets:10000/1s");
        let again = NetSpec::parse(&format!("tap=t,rate={v}")).unwrap();
        assert_eq!((again.rx_rate, again.tx_rate), (s.rx_rate, s.tx_rate));
        let e = NetSpec::parse("tap=t,rate=ops:1/1s")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("it takes rx-bytes, rx-packets, tx-bytes, tx-packets"),
            "{e}"
        );
    }

    #[test]
    fn each_bad_value_gets_its_own_sentence() {
        let e = |s: &str| NetSpec::parse(s).unwrap_err();
        assert_eq!(e("mac=02:00:00:00:00:01"), NetSpecError::NoTap);
        assert_eq!(e(""), NetSpecError::NoTap);
        assert_eq!(
            e("tap=t,speed=10"),
            NetSpecError::UnknownKey("speed".into())
        );
        assert_eq!(e("tap=t,tap=u"), NetSpecError::Duplicate("tap".into()));
        assert_eq!(e("tap"), NetSpecError::NotKeyValue("tap".into()));
        for name in ["", "a/b", "sixteen-chars-xx", "a b", ".."] {
            assert!(
                matches!(e(&format!("tap={name}")), NetSpecError::BadName(_)),
                "{name}"
            );
        }
        for mac in [
            "01:00:00:00:00:01",
            "00:00:00:00:00:00",
            "02:00:00:00:00",
            "zz:00:00:00:00:01",
            "02:00:00:00:00:01:02",
            "2:0:0:0:0:1",
        ] {
            assert!(
                matches!(e(&format!("tap=t,mac={mac}")), NetSpecError::BadMac(_)),
                "{mac}"
            );
        }
        for q in ["0", "17", "-1", "x"] {
            assert!(matches!(
                e(&format!("tap=t,queues={q}")),
                NetSpecError::BadQueues(_)
            ));
        }
        for m in ["67", "65536", "x"] {
            assert!(matches!(
                e(&format!("tap=t,mtu={m}")),
                NetSpecError::BadMtu(_)
            ));
        }
        assert!(matches!(e("tap=t,id=a.b"), NetSpecError::BadId(_)));
        assert!(matches!(
            e("tap=t,rate=rx-bytes:0/1s"),
            NetSpecError::Rate(RateSpecError::Size(_))
        ));
        // Quoted input is cut.
        let long = "x".repeat(10_000);
        let msg = e(&format!("tap=t,mac={long}")).to_string();
        assert!(msg.len() < 200, "{msg}");
    }
}
