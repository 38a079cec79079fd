//! Roaming, the agent's side: notices when the host's addresses or routes change (netlink
//! `RTM_NEWADDR`, `RTM_DELADDR`, `RTM_NEWROUTE`, `RTM_DELROUTE`), works out whether the
//! source address toward any member changed with them, and tells the node, which tells
//! those members at once (`hyphae_overlay`'s `node/roam.rs`).
//!
//! The source address is the kernel's own choice: a UDP socket connected to the member's
//! endpoint (no datagram leaves) reports the address the underlay socket, bound to all
//! addresses, sends from now. So a renumbered interface, a move to another subnet and a
//! default route through another uplink all show the same way, and changes to addresses
//! no member is reached through (the TAP's, a LAN bridge's) tell nobody anything.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};

use hyphae_overlay::PeerHandle;
use netlink_sys::protocols::NETLINK_ROUTE;
use netlink_sys::{Socket, SocketAddr as NetlinkAddr};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

/// The netlink groups: IPv4 and IPv6 addresses and routes.
const GROUPS: u32 = (libc::RTMGRP_IPV4_IFADDR
    | libc::RTMGRP_IPV4_ROUTE
    | libc::RTMGRP_IPV6_IFADDR
    | libc::RTMGRP_IPV6_ROUTE) as u32;

/// Bytes of one read: notifications are small, and a read returns one datagram of them.
const BUF_LEN: usize = 16 * 1024;

/// Netlink notifications of address and route changes.
pub(crate) struct NetWatch {
    socket: AsyncFd<Socket>,
    buf: Vec<u8>,
}

impl NetWatch {
    /// Subscribes to the kernel's address and route notifications.
    pub(crate) fn new() -> io::Result<Self> {
        let mut socket = Socket::new(NETLINK_ROUTE)?;
        socket.bind(&NetlinkAddr::new(0, GROUPS))?;
        socket.set_non_blocking(true)?;
        // SAFETY: the netlink socket owns its fd (closed when it drops) and moves into the
        // AsyncFd, which keeps it open for as long as it is registered.
        let socket = unsafe { AsyncFd::register_with_interest(socket, Interest::READABLE) }?;
        Ok(Self {
            socket,
            buf: vec![0; BUF_LEN],
        })
    }

    /// Ready when notifications can be read.
    pub(crate) fn poll_readable(&self, cx: &mut std::task::Context<'_>) -> std::task::Poll<()> {
        // The guard is dropped with its readiness retained: `drain` reads until
        // WouldBlock, which clears it. A failed socket is never ready.
        match self.socket.poll_read_ready(cx) {
            std::task::Poll::Ready(Ok(_)) => std::task::Poll::Ready(()),
            _ => std::task::Poll::Pending,
        }
    }

    /// Reads every pending notification; whether any was an address or route change. A
    /// full socket buffer (`ENOBUFS`: notifications were lost) counts as a change.
    pub(crate) fn drain(&mut self) -> bool {
        let mut changed = false;
        loop {
            let buf = &mut self.buf;
            let read = self
                .socket
                .try_io(Interest::READABLE, |s| s.recv(&mut &mut buf[..], 0));
            match read {
                Ok(n) => changed |= has_change(&self.buf[..n.min(BUF_LEN)]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return changed,
                Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => changed = true,
                Err(e) => {
                    tracing::debug!(error = %e, "netlink read failed");
                    return changed;
                }
            }
        }
    }
}

/// Whether a datagram of netlink messages holds an address or route change. Reads only the
/// message headers (length and type), and stops at the first one that does not fit.
fn has_change(mut datagram: &[u8]) -> bool {
    const HEADER: usize = 16;
    while datagram.len() >= HEADER {
        let len = u32::from_ne_bytes([datagram[0], datagram[1], datagram[2], datagram[3]]) as usize;
        let kind = u16::from_ne_bytes([datagram[4], datagram[5]]);
        if matches!(
            kind,
            libc::RTM_NEWADDR | libc::RTM_DELADDR | libc::RTM_NEWROUTE | libc::RTM_DELROUTE
        ) {
            return true;
        }
        // Messages are 4-byte aligned.
        let step = len.div_ceil(4) * 4;
        if len < HEADER || step > datagram.len() {
            return false;
        }
        datagram = &datagram[step..];
    }
    false
}

/// The source address the kernel picks toward `to` now; `None` without a route.
fn source_toward(to: SocketAddr) -> Option<IpAddr> {
    let any: IpAddr = match to {
        SocketAddr::V4(_) => Ipv4Addr::UNSPECIFIED.into(),
        SocketAddr::V6(_) => Ipv6Addr::UNSPECIFIED.into(),
    };
    let socket = UdpSocket::bind((any, 0)).ok()?;
    socket.connect(to).ok()?;
    Some(socket.local_addr().ok()?.ip())
}

/// Our source address toward each member endpoint, as last seen.
#[derive(Default)]
pub(crate) struct Sources {
    by_endpoint: HashMap<IpAddr, Option<IpAddr>>,
}

impl Sources {
    /// Notes the source toward member endpoints not seen before (new tunnels, members
    /// that roamed), so a later change is known for them, and forgets endpoints no tunnel
    /// uses any more.
    pub(crate) fn track(&mut self, members: impl Iterator<Item = SocketAddr>) {
        let members: HashMap<IpAddr, SocketAddr> = members.map(|m| (m.ip(), m)).collect();
        self.by_endpoint.retain(|ip, _| members.contains_key(ip));
        for (ip, endpoint) in members {
            self.by_endpoint
                .entry(ip)
                .or_insert_with(|| source_toward(endpoint));
        }
    }

    /// After addresses or routes changed: the members whose source address changed to one
    /// that reaches them. Losing the route (an address removed before its successor is
    /// added) tells nobody: there is nothing to tell them from yet, and the last source
    /// is kept, so the successor is a change and the same address back is none. A member
    /// not seen before is only noted.
    pub(crate) fn changed(
        &mut self,
        members: impl Iterator<Item = (PeerHandle, SocketAddr)>,
    ) -> Vec<PeerHandle> {
        self.changed_with(members, source_toward)
    }

    /// [`Sources::changed`], with `source` standing for the kernel's choice.
    fn changed_with<H>(
        &mut self,
        members: impl Iterator<Item = (H, SocketAddr)>,
        mut source: impl FnMut(SocketAddr) -> Option<IpAddr>,
    ) -> Vec<H> {
        let mut seen: HashMap<IpAddr, Option<IpAddr>> = HashMap::new();
        let mut moved = Vec::new();
        for (handle, endpoint) in members {
            let ip = endpoint.ip();
            let now = *seen.entry(ip).or_insert_with(|| source(endpoint));
            let known = self.by_endpoint.get(&ip).copied();
            if let (Some(before), Some(now)) = (known, now) {
                if before != Some(now) {
                    tracing::debug!(member = %endpoint, ?before, source = %now, "our source address changed");
                    moved.push(handle);
                }
            }
        }
        for (ip, source) in seen {
            if source.is_some() || !self.by_endpoint.contains_key(&ip) {
                self.by_endpoint.insert(ip, source);
            }
        }
        moved
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(kind: u16, len: u32) -> Vec<u8> {
        let mut m = Vec::new();
        m.extend_from_slice(&len.to_ne_bytes());
        m.extend_from_slice(&kind.to_ne_bytes());
        m.extend_from_slice(&[0; 10]);
        m.resize(len as usize, 0);
        m
    }

    /// The source toward every member is whatever `*at` says.
    fn changed(sources: &mut Sources, at: Option<[u8; 4]>) -> Vec<u32> {
        let members = [
            (0, SocketAddr::from(([10, 0, 0, 2], 7400))),
            (1, SocketAddr::from(([10, 0, 0, 3], 7400))),
        ];
        sources.changed_with(members.into_iter(), |_| at.map(IpAddr::from))
    }

    #[test]
    fn only_a_new_source_that_reaches_members_is_a_change() {
        let mut s = Sources::default();
        assert!(
            changed(&mut s, Some([10, 0, 0, 1])).is_empty(),
            "first seen: noted"
        );
        assert!(changed(&mut s, Some([10, 0, 0, 1])).is_empty(), "unchanged");
        // Renumbered: the old address goes first (no route: nothing to tell), then the new
        // one comes.
        assert!(changed(&mut s, None).is_empty());
        assert_eq!(changed(&mut s, Some([10, 0, 0, 21])).len(), 2);
        // Removed and added back as it was: the members still have it.
        assert!(changed(&mut s, None).is_empty());
        assert!(changed(&mut s, Some([10, 0, 0, 21])).is_empty());
        // Another uplink: the route changed, the source with it.
        assert_eq!(changed(&mut s, Some([192, 168, 7, 5])).len(), 2);
    }

    #[test]
    fn address_and_route_messages_are_changes_and_garbage_is_not() {
        assert!(has_change(&header(libc::RTM_NEWADDR, 24)));
        assert!(has_change(&header(libc::RTM_DELROUTE, 16)));
        // A link message, then an address message.
        let mut two = header(libc::RTM_NEWLINK, 18);
        two.resize(20, 0);
        two.extend(header(libc::RTM_DELADDR, 16));
        assert!(has_change(&two));
        assert!(!has_change(&header(libc::RTM_NEWLINK, 32)));
        assert!(!has_change(&[]));
        assert!(!has_change(&[1, 2, 3]));
        // A length that points past the end, or below a header, stops the walk.
        let mut bad = header(libc::RTM_NEWLINK, 16);
        bad[..4].copy_from_slice(&4000u32.to_ne_bytes());
        bad.extend(header(libc::RTM_NEWADDR, 16));
        assert!(!has_change(&bad));
        let mut zero = header(libc::RTM_NEWLINK, 16);
        zero[..4].copy_from_slice(&0u32.to_ne_bytes());
        zero.extend(header(libc::RTM_NEWADDR, 16));
        assert!(!has_change(&zero));
    }
}
