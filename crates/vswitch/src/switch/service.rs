//! The service address, where the agent's virtual DHCP and DNS servers and its service stack
//! answer: packets to it go to the agent, and its replies are framed here.

use std::net::{IpAddr, Ipv4Addr};
use std::ops::Range;

use super::Switch;
use crate::wire::{
    emit_ethernet_header, emit_udp, emit_udp6, udp_parts, EthernetFrame, Ipv4Packet, Ipv6Packet,
    ETHERTYPE_IPV4, ETH_HEADER_LEN, IPPROTO_UDP,
};
use crate::{service_address, service_address6, Action, Client, DropReason, Mac, Mode};

impl<P: Copy + Eq> Switch<P> {
    /// The service address (the virtual DHCP and DNS server's), if the subnet is known.
    pub(super) fn service(&self) -> Ipv4Addr {
        if self.config.subnet.prefix_len() >= 31 {
            // No subnet yet (or no room for a service address).
            return Ipv4Addr::UNSPECIFIED;
        }
        service_address(self.config.subnet)
    }

    /// A packet from the host (or a LAN host) to the service address.
    pub(super) fn to_service(
        &self,
        eth: &EthernetFrame<&[u8]>,
        ip: &Ipv4Packet<&[u8]>,
        packet: Range<usize>,
    ) -> Action<P> {
        // Router: unicast to someone else, flooded by the bridge.
        if self.config.mode == Mode::Router && eth.dst() != self.config.remote_mac {
            return Action::Drop(DropReason::LanLocal);
        }
        let src = ip.src();
        if !self.config.subnet.contains(&src)
            || src == self.config.subnet.network()
            || src == self.subnet_broadcast()
        {
            return Action::Drop(DropReason::OutsideSubnet);
        }
        if ip.protocol() == IPPROTO_UDP {
            if let Some((port, 53, udp)) = udp_parts(ip.payload()) {
                let at = packet.end - ip.payload().len();
                return Action::Dns {
                    payload: at + udp.start..at + udp.end,
                    client: Client {
                        mac: eth.src(),
                        ip: src.into(),
                        port,
                    },
                };
            }
        }
        Action::Service {
            packet,
            mac: eth.src(),
        }
    }

    /// Frames an answer of the virtual DNS server (UDP 53, from the service address and
    /// the remote MAC) to `client` into `buf`; returns its length, or `None` if it does
    /// not fit.
    pub fn emit_dns_reply(&self, buf: &mut [u8], client: Client, payload: &[u8]) -> Option<usize> {
        let macs = (client.mac, self.config.remote_mac);
        let ports = (53, client.port);
        match client.ip {
            IpAddr::V4(ip) => emit_udp(buf, macs, (self.service(), ip), ports, payload),
            IpAddr::V6(ip) => {
                let service = service_address6(self.config.prefix6?);
                emit_udp6(buf, macs, (service, ip), ports, payload)
            }
        }
    }

    /// An IPv6 packet from the host (or a LAN host) to the prefix's service address: a DNS
    /// query over UDP goes to the virtual DNS server; nothing else is served there over
    /// IPv6 (DNS over TCP and ping answer at the IPv4 service address).
    pub(super) fn to_service6(
        &self,
        eth: &EthernetFrame<&[u8]>,
        ip: &Ipv6Packet<&[u8]>,
        packet: Range<usize>,
    ) -> Action<P> {
        // Router: unicast to someone else, flooded by the bridge.
        if self.config.mode == Mode::Router && eth.dst() != self.config.remote_mac {
            return Action::Drop(DropReason::LanLocal);
        }
        if ip.next_header() == IPPROTO_UDP {
            let at = packet.end - ip.payload().len();
            let client = |port| Client {
                mac: eth.src(),
                ip: ip.src().into(),
                port,
            };
            match udp_parts(ip.payload()) {
                Some((port, 53, udp)) => {
                    return Action::Dns {
                        payload: at + udp.start..at + udp.end,
                        client: client(port),
                    };
                }
                // A relay agent's RELAY-FORW, sent to the server's address (router mode).
                Some((port, 547, udp)) if self.config.dhcp && self.config.mode == Mode::Router => {
                    return Action::Dhcp6 {
                        payload: at + udp.start..at + udp.end,
                        client: client(port),
                    };
                }
                _ => {}
            }
        }
        Action::Drop(DropReason::NoRoute)
    }

    /// Frames an IPv4 packet of the service stack (from the service address) to `dst_mac`
    /// into `buf`; returns its length, or `None` if it does not fit.
    pub fn emit_service_packet(
        &self,
        buf: &mut [u8],
        dst_mac: Mac,
        packet: &[u8],
    ) -> Option<usize> {
        let total = ETH_HEADER_LEN + packet.len();
        if buf.len() < total {
            return None;
        }
        emit_ethernet_header(buf, dst_mac, self.config.remote_mac, ETHERTYPE_IPV4);
        buf[ETH_HEADER_LEN..total].copy_from_slice(packet);
        Some(total)
    }

    /// Frames a reply of the virtual DHCP server (UDP from port 67 to `dst_port`: 68 for a
    /// client, 67 for a relay agent; from the service address and the remote MAC) into
    /// `buf`; returns its length, or `None` if it does not fit.
    pub fn emit_dhcp_reply(
        &self,
        buf: &mut [u8],
        dst_mac: Mac,
        dst: Ipv4Addr,
        dst_port: u16,
        payload: &[u8],
    ) -> Option<usize> {
        emit_udp(
            buf,
            (dst_mac, self.config.remote_mac),
            (service_address(self.config.subnet), dst),
            (67, dst_port),
            payload,
        )
    }
}
