//! What a membership tells its driver to act on.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use ipnet::Ipv4Net;

use super::{HostedClaim, Resolved};
use crate::PeerId;

/// What the driver must act on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// This member now holds `address` as its own: configure the device and switch.
    AddressWon(Ipv4Addr),
    /// This member now holds `address` as its own IPv6 address: configure the device
    /// and switch, and announce it.
    AddressWon6(Ipv6Addr),
    /// The set of addresses this member holds changed (LAN hosts, a DHCP lease ended):
    /// announce [`Membership::addresses`] to the tunnels.
    AddressesChanged,
    /// Remember `address` as the last one won (an `auto` member takes it again after a
    /// restart if it is free).
    Persist(Ipv4Addr),
    /// This member cannot be part of the namespace as configured (a static address
    /// another member owns, a subnet that contradicts the namespace record).
    Conflict(String),
    /// The subnet was learned from the namespace record: configure it.
    SubnetLearned(Ipv4Net),
    /// The namespace's other subnets (routed in one hop) were learned from the namespace
    /// record, or changed: route them.
    RoutedLearned(Vec<Ipv4Net>),
    /// A claim for a DHCP client ended: the address won, or `None` (refused).
    Dhcp {
        /// The client id, as given to [`Membership::claim_for_dhcp`].
        client: Vec<u8>,
        /// The address, if won.
        address: Option<Ipv4Addr>,
    },
    /// A claim for a DHCPv6 client ([`Membership::claim_for_dhcp6`]) ended: `address` won,
    /// or refused (another member holds it, or the replicas did not answer).
    Dhcp6 {
        /// The address claimed.
        address: Ipv6Addr,
        /// Whether this member holds it now.
        won: bool,
    },
    /// A name claim ended: held, or held by another member (why, in words).
    Name {
        /// The name.
        name: String,
        /// The outcome.
        result: Result<(), String>,
    },
    /// No member holds `target`: the frames that waited for it are dropped (a router
    /// answers them with ICMP "host unreachable").
    Unowned {
        /// The address looked up.
        target: IpAddr,
        /// The frames that waited, oldest first.
        frames: Vec<Vec<u8>>,
    },
    /// Another member owns an address frames wait for.
    Resolved(Resolved),
    /// The broadcast group was read: the members other than this one and where to
    /// reach them.
    Group(Vec<(PeerId, SocketAddr)>),
    /// A [`Membership::read_name`] finished: the address `host` stands for, if anyone
    /// holds the name.
    NameRead {
        /// The name.
        host: String,
        /// Its address.
        address: Option<Ipv4Addr>,
        /// Its IPv6 address, if the name is a dual-stack member's own.
        address6: Option<Ipv6Addr>,
    },
    /// A [`Membership::read_holder6`] finished: whether someone holds the IPv6 `address`
    /// (`None`: nobody), and the name it carries.
    HolderRead6 {
        /// The address.
        address: Ipv6Addr,
        /// Its holder's name for it, if someone holds it.
        holder: Option<Option<String>>,
    },
    /// A [`Membership::read_mac_holder`] finished: the member whose lease `mac` is
    /// (`None`: nobody holds it).
    MacHolder {
        /// The MAC.
        mac: [u8; 6],
        /// Its holder.
        holder: Option<crate::PeerId>,
    },
    /// A [`Membership::read_holder`] finished: whether someone holds `address` (`None`:
    /// nobody), and the name it carries.
    HolderRead {
        /// The address.
        address: Ipv4Addr,
        /// Its holder's name for it, if someone holds it.
        holder: Option<Option<String>>,
    },
    /// A [`Membership::hand_off_hosted`] ended: `done`, the lease is the new holder's on
    /// the replicas and this member no longer hosts the address; else it still does.
    HandOff {
        /// The address.
        address: IpAddr,
        /// Whether the lease moved.
        done: bool,
    },
    /// Router mode: a claim for a LAN host's address (not a renewal) was decided.
    HostedClaimed {
        /// The address.
        address: IpAddr,
        /// The outcome.
        outcome: HostedClaim,
    },
    /// A [`Membership::look_up_holder`] finished: the holder of `address` and the time
    /// left on its lease (`None`: nobody holds it, or no replica answered).
    Holder {
        /// The address.
        address: IpAddr,
        /// The holder and its lease's time left.
        holder: Option<(PeerId, Duration)>,
    },
}
