//! hyphae's virtual network services, as pure request -> reply logic: no sockets, no clock
//! of its own, no DHT. The vswitch hands over the UDP payloads it intercepts; the agent
//! backs the decisions that need the overlay (which address a client may have) and feeds
//! the answers back. Every input, however malformed, gets a reply or a counted drop.
//!
//! - [`dhcp`]: a DHCPv4 server (RFC 2131) over `dhcproto`, whose leases are DHT claims
//!   (IPOP Sec. 4.2, Diverter's synthesized DHCP).
//! - [`dhcp6`]: a DHCPv6 server (RFC 8415, stateful addresses) for a router's LAN, whose
//!   leases are DHT claims too.
//! - [`dns`]: the namespace's DNS zone (hickory-proto messages): member names, IPOP's
//!   automatic names, reverse names; forwarding or REFUSED outside it.
//! - [`forward`]: queries outside the zone to the configured resolvers, answers matched by
//!   resolver, id and question.
//! - [`limit`]: per-source rate limits on queries, slipping truncated answers as
//!   response-rate-limiting resolvers do.
//! - [`service`]: the DNS service of one namespace as the agent runs it: the zone over a
//!   cache of DHT reads, queries that wait for reads, forwarding, UDP and TCP askers.
//! - [`tcp`]: DNS over TCP (RFC 7766) at the service address, a sans-I/O smoltcp stack that
//!   turns client IPv4 packets into query messages and responses back into packets.

#![forbid(unsafe_code)]

pub mod dhcp;
pub mod dhcp6;
pub mod dns;
pub mod forward;
pub mod limit;
pub mod service;
pub mod tcp;
