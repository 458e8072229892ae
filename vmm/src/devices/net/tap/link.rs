//! What the kernel says of a tap through rtnetlink (`RTM_GETLINK`, the tun driver's
//! `IFLA_LINKINFO`): how many queues are attached to it and how many detached, in the
//! network namespace of the calling thread (the tap's own, unlike `/sys/class/net`, which shows
//! the namespace `/sys` was mounted in).
//!
//! Data flow: [`queues`] sends one request for the interface by name on a fresh
//! `NETLINK_ROUTE` socket, reads the answer into a bounded buffer and walks its attributes
//! with every length checked: `IFLA_LINKINFO` → `IFLA_INFO_DATA` → `IFLA_TUN_NUM_QUEUES` and
//! `IFLA_TUN_NUM_DISABLED_QUEUES` (Linux 4.19 and later; older kernels answer without them,
//! and the caller then cannot tell).

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd};

use super::MAX_NAME;

const NLMSG_HDRLEN: usize = 16;
const IFINFO_LEN: usize = 16;
const RTA_HDRLEN: usize = 4;
const IFLA_IFNAME: u16 = 3;
const IFLA_LINKINFO: u16 = 18;
const IFLA_INFO_DATA: u16 = 2;
const IFLA_TUN_NUM_QUEUES: u16 = 8;
const IFLA_TUN_NUM_DISABLED_QUEUES: u16 = 9;
/// Nested attributes carry this flag in their type.
const NLA_TYPE_MASK: u16 = 0x3fff;

/// The queues of a tap: (attached, detached), or None when the kernel does not say.
pub fn queues(name: &str) -> io::Result<Option<(u32, u32)>> {
    // SAFETY: socket() takes integers; the result is checked.
    let fd = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            libc::NETLINK_ROUTE,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is new and ours; File closes it.
    let sock = unsafe { File::from_raw_fd(fd) };
    let req = request(name);
    // SAFETY: `req` is a buffer of its length, valid for the call; the kernel is the peer
    // (a zeroed sockaddr_nl is address 0, the kernel).
    let sent = unsafe {
        let mut to: libc::sockaddr_nl = std::mem::zeroed();
        to.nl_family = libc::AF_NETLINK as libc::sa_family_t;
        libc::sendto(
            sock.as_raw_fd(),
            req.as_ptr().cast(),
            req.len(),
            0,
            (&raw const to).cast(),
            std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t,
        )
    };
    if sent < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut buf = vec![0u8; 32 * 1024];
    // SAFETY: `buf` is valid for writes of its length for the call.
    let n = unsafe { libc::recv(sock.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(parse(&buf[..n as usize]))
}

/// An `RTM_GETLINK` request for `name`.
fn request(name: &str) -> Vec<u8> {
    let name: Vec<u8> = name
        .bytes()
        .take(MAX_NAME)
        .chain(std::iter::once(0))
        .collect();
    let attr_len = RTA_HDRLEN + name.len();
    let len = NLMSG_HDRLEN + IFINFO_LEN + attr_len.next_multiple_of(4);
    let mut m = Vec::with_capacity(len);
    m.extend_from_slice(&(len as u32).to_ne_bytes());
    m.extend_from_slice(&libc::RTM_GETLINK.to_ne_bytes());
    m.extend_from_slice(&(libc::NLM_F_REQUEST as u16).to_ne_bytes());
    m.extend_from_slice(&1u32.to_ne_bytes()); // sequence
    m.extend_from_slice(&0u32.to_ne_bytes()); // port: the kernel
    m.extend_from_slice(&[0u8; IFINFO_LEN]); // any family, index 0: by name
    m.extend_from_slice(&(attr_len as u16).to_ne_bytes());
    m.extend_from_slice(&IFLA_IFNAME.to_ne_bytes());
    m.extend_from_slice(&name);
    m.resize(len, 0);
    m
}

/// The attributes in `b`: (type without flags, payload), each length checked.
fn attrs(mut b: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    std::iter::from_fn(move || {
        if b.len() < RTA_HDRLEN {
            return None;
        }
        let len = usize::from(u16::from_ne_bytes([b[0], b[1]]));
        let kind = u16::from_ne_bytes([b[2], b[3]]) & NLA_TYPE_MASK;
        if len < RTA_HDRLEN || len > b.len() {
            return None;
        }
        let payload = &b[RTA_HDRLEN..len];
        b = &b[len.next_multiple_of(4).min(b.len())..];
        Some((kind, payload))
    })
}

fn u32_of(p: &[u8]) -> Option<u32> {
    Some(u32::from_ne_bytes(p.get(..4)?.try_into().ok()?))
}

/// The queue counts in an answer to [`request`].
fn parse(msg: &[u8]) -> Option<(u32, u32)> {
    let len = (u32_of(msg)? as usize).min(msg.len());
    let kind = u16::from_ne_bytes([*msg.get(4)?, *msg.get(5)?]);
    if kind != libc::RTM_NEWLINK || len < NLMSG_HDRLEN + IFINFO_LEN {
        return None;
    }
    let info = attrs(&msg[NLMSG_HDRLEN + IFINFO_LEN..len])
        .find(|(k, _)| *k == IFLA_LINKINFO)?
        .1;
    let data = attrs(info).find(|(k, _)| *k == IFLA_INFO_DATA)?.1;
    let (mut on, mut off) = (None, None);
    for (k, p) in attrs(data) {
        match k {
            IFLA_TUN_NUM_QUEUES => on = u32_of(p),
            IFLA_TUN_NUM_DISABLED_QUEUES => off = u32_of(p),
            _ => {}
        }
    }
    Some((on?, off.unwrap_or(0)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attr(kind: u16, payload: &[u8]) -> Vec<u8> {
        let mut a = Vec::new();
        a.extend_from_slice(&((RTA_HDRLEN + payload.len()) as u16).to_ne_bytes());
        a.extend_from_slice(&kind.to_ne_bytes());
        a.extend_from_slice(payload);
        a.resize(a.len().next_multiple_of(4), 0);
        a
    }

    fn answer(info_data: &[u8]) -> Vec<u8> {
        let mut linkinfo = attr(1, b"tun\0");
        linkinfo.extend(attr(IFLA_INFO_DATA | 0x8000, info_data));
        let mut body = vec![0u8; IFINFO_LEN];
        body.extend(attr(IFLA_IFNAME, b"tap0\0"));
        body.extend(attr(IFLA_LINKINFO | 0x8000, &linkinfo));
        let mut m = Vec::new();
        m.extend_from_slice(&((NLMSG_HDRLEN + body.len()) as u32).to_ne_bytes());
        m.extend_from_slice(&libc::RTM_NEWLINK.to_ne_bytes());
        m.extend_from_slice(&[0u8; 10]);
        m.extend(body);
        m
    }

    #[test]
    fn the_queue_counts_come_out_of_a_nested_answer() {
        let mut d = attr(IFLA_TUN_NUM_QUEUES, &3u32.to_ne_bytes());
        d.extend(attr(IFLA_TUN_NUM_DISABLED_QUEUES, &2u32.to_ne_bytes()));
        assert_eq!(parse(&answer(&d)), Some((3, 2)));
        // An older kernel: no counts.
        assert_eq!(parse(&answer(&attr(6, &[1]))), None);
    }

    #[test]
    fn a_truncated_or_lying_answer_gives_nothing() {
        let mut d = attr(IFLA_TUN_NUM_QUEUES, &3u32.to_ne_bytes());
        d.extend(attr(IFLA_TUN_NUM_DISABLED_QUEUES, &2u32.to_ne_bytes()));
        let a = answer(&d);
        for cut in 0..a.len() {
            let _ = parse(&a[..cut]);
        }
        let mut lying = a.clone();
        // An attribute length past the message.
        let at = NLMSG_HDRLEN + IFINFO_LEN;
        lying[at..at + 2].copy_from_slice(&4000u16.to_ne_bytes());
        assert_eq!(parse(&lying), None);
        assert_eq!(parse(&[]), None);
    }

    #[test]
    fn the_request_names_the_interface() {
        let r = request("tap0");
        assert_eq!(r.len() % 4, 0);
        assert_eq!(u32_of(&r), Some(r.len() as u32));
        assert_eq!(&r[NLMSG_HDRLEN + IFINFO_LEN + RTA_HDRLEN..][..5], b"tap0\0");
    }
}
