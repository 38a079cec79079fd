//! The services at the namespace's service address, as the driver runs them: the virtual
//! DHCP server (its leases are the membership's DHT claims), the DNS service (its reads are
//! the membership's DHT reads; its forwarded queries leave through one socket), and
//! `hyphae name set`.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Instant;

use hyphae_dhcp_dns::service::Held;
use hyphae_dhcp_dns::{dhcp, dns};
use hyphae_overlay::membership::Membership;
use hyphae_overlay::NamespaceId;
use serde_json::json;

use crate::config::Mode;
use crate::driver::{Agent, NameWaiter, NAME_SET_WAIT};

/// What a member holds, as the DNS service asks it.
pub(crate) struct HeldBy<'a>(pub(crate) &'a Membership);

impl Held for HeldBy<'_> {
    fn address_for(&self, host: &str) -> Option<Ipv4Addr> {
        self.0.address_for(host)
    }

    fn holder_of(&self, address: Ipv4Addr) -> Option<Option<String>> {
        self.0
            .holds(address)
            .then(|| self.0.name_for(address).map(str::to_string))
    }
}

impl Agent {
    /// A DHCP request from the host or the LAN (a client's, or a relay agent's from `mac`),
    /// for the namespace's virtual DHCP server.
    pub(crate) fn handle_dhcp(
        &mut self,
        i: usize,
        payload: &[u8],
        mac: hyphae_vswitch::Mac,
        now: Instant,
    ) {
        let n = &mut self.namespaces[i];
        let m = &n.membership;
        let Some(subnet) = m.subnet() else {
            return; // The namespace record is not read yet: the client will retry.
        };
        let settings = dhcp::Settings {
            subnet,
            server: hyphae_vswitch::service_address(subnet),
            dns: vec![hyphae_vswitch::service_address(subnet)],
            domain: m.name().to_string(),
            // A gateway checked against a configured subnet may not fit the one the
            // namespace record says: then none.
            router: n
                .gateway
                .filter(|g| crate::config::check_in_subnet(*g, subnet).is_ok()),
            lease: m.lease(),
        };
        n.dhcp
            .get_or_insert_with(|| dhcp::Server::new(settings))
            .handle(payload, mac, now);
        self.drain_dhcp(i, now);
    }

    /// Carries out what the DHCP server of namespace `i` asks: replies to the device,
    /// claims and releases in the DHT.
    pub(crate) fn drain_dhcp(&mut self, i: usize, now: Instant) {
        let n = &mut self.namespaces[i];
        while let Some(output) = n.dhcp.as_mut().and_then(dhcp::Server::poll_output) {
            match output {
                dhcp::Output::Reply(r) => {
                    if let Some(len) = n.switch.emit_dhcp_reply(
                        &mut self.service_buf,
                        r.mac,
                        r.dst,
                        r.port,
                        &r.bytes,
                    ) {
                        n.write(&self.service_buf[..len]);
                    }
                }
                dhcp::Output::Claim {
                    client,
                    hint,
                    exact,
                } => n.membership.claim_for_dhcp(now, client.0, hint, exact),
                dhcp::Output::Release(address) => {
                    if n.membership.release_dhcp(address) {
                        if n.switch.config().address == address {
                            n.switch.set_address(Ipv4Addr::UNSPECIFIED);
                        }
                        let addresses = n.membership.addresses();
                        self.node.set_addresses(now, NamespaceId(i), addresses);
                    }
                }
                // The DHT lease is renewed while the client holds the address.
                dhcp::Output::Renew(_) => {}
                dhcp::Output::Hostname { address, name } => {
                    n.membership.name_client(now, address, name);
                }
            }
        }
    }

    /// The DHT decided a DHCP client's claim: the reply that waited goes out.
    pub(crate) fn dhcp_claimed(
        &mut self,
        i: usize,
        client: dhcp::ClientId,
        address: Option<Ipv4Addr>,
        now: Instant,
    ) {
        let n = &mut self.namespaces[i];
        let Some(server) = n.dhcp.as_mut() else {
            return;
        };
        match address {
            Some(a) => {
                server.allocated(&client, a, now);
                if n.membership.host_uses_dhcp() {
                    // The host's DHCP client configures the device; the switch and the
                    // tunnels learn the address now.
                    n.switch.set_address(a);
                }
                let addresses = n.membership.addresses();
                self.node.set_addresses(now, NamespaceId(i), addresses);
            }
            None => server.refused(&client),
        }
        self.drain_dhcp(i, now);
    }

    /// Sends what the DNS service of namespace `i` queued: UDP answers and service-stack
    /// packets to the device, queries to the resolvers, reads to the membership. Returns
    /// whether there was anything.
    pub(crate) fn flush_dns(&mut self, i: usize) -> bool {
        let n = &mut self.namespaces[i];
        let mut any = false;
        while let Some((client, answer)) = n.dns.poll_udp_answer() {
            any = true;
            if let Some(len) = n
                .switch
                .emit_dns_reply(&mut self.service_buf, client, &answer)
            {
                n.write(&self.service_buf[..len]);
            }
        }
        while let Some((mac, packet)) = n.dns.poll_service_packet() {
            any = true;
            if let Some(len) = n
                .switch
                .emit_service_packet(&mut self.service_buf, mac, &packet)
            {
                n.write(&self.service_buf[..len]);
            }
        }
        while let Some((to, query)) = n.dns.poll_resolver_datagram() {
            any = true;
            let sent = self
                .resolver_socket
                .as_ref()
                .is_some_and(|s| s.try_send_to(&query, resolver_target(s, to)).is_ok());
            if !sent {
                tracing::debug!(resolver = %to, "cannot send a query to the resolver");
            }
        }
        while let Some(missing) = n.dns.poll_lookup() {
            any = true;
            match missing {
                dns::Missing::Name(host) => n.membership.read_name(&host),
                dns::Missing::Address(a) => n.membership.read_holder(a),
            }
        }
        any
    }

    /// An answer on the forwarding socket: to the namespace whose query it answers.
    pub(crate) fn resolver_answer(&mut self, now: Instant, len: usize, from: SocketAddr) {
        let answer = self.service_buf[..len].to_vec();
        for n in self.namespaces.iter_mut().filter(|n| n.active()) {
            if n.dns.handle_resolver_answer(now, from, &answer) {
                return;
            }
        }
        tracing::debug!(%from, "unexpected datagram on the resolver socket");
    }

    /// `hyphae name set`: names this member's own address in namespace `ns`. The reply
    /// goes out now, or once the claim is decided.
    pub(crate) fn set_name(
        &mut self,
        now: Instant,
        ns: &str,
        name: Option<String>,
        reply: tokio::sync::oneshot::Sender<serde_json::Value>,
    ) {
        let answer = |reply: tokio::sync::oneshot::Sender<serde_json::Value>,
                      r: Result<String, String>| {
            let _ = reply.send(match r {
                Ok(message) => json!({ "ok": true, "message": message }),
                Err(e) => json!({ "error": e }),
            });
        };
        let Some(i) = self.active(ns) else {
            return answer(reply, Err(format!("not a member of '{ns}'")));
        };
        if self.namespaces[i].mode == Mode::Router {
            return answer(
                reply,
                Err(format!(
                    "namespace '{ns}' is in router mode: it has no address of its own to name"
                )),
            );
        }
        let name = match name.map(|n| dns::host_name(&n)).transpose() {
            Ok(name) => name,
            Err(e) => return answer(reply, Err(e)),
        };
        if self.name_waiters.iter().any(|w| w.ns == i) {
            return answer(
                reply,
                Err(format!(
                    "namespace '{ns}': another `hyphae name set` is still waiting for its claim"
                )),
            );
        }
        let m = &mut self.namespaces[i].membership;
        if let (Some(name), Some(owned)) = (&name, m.owned()) {
            if m.address_for(name) == Some(owned) {
                return answer(reply, Ok(format!("{name}.{ns} is {owned}")));
            }
        }
        let previous = m.hostname().map(str::to_string);
        m.set_hostname(now, name.clone());
        match (name, m.owned()) {
            (None, _) => answer(reply, Ok(format!("namespace '{ns}': name cleared"))),
            (Some(name), None) => answer(
                reply,
                Ok(format!(
                    "name '{name}.{ns}' set; it is claimed once this member holds its address"
                )),
            ),
            (Some(name), Some(_)) => self.name_waiters.push(NameWaiter {
                ns: i,
                name,
                previous,
                reply,
                deadline: now + NAME_SET_WAIT,
            }),
        }
    }

    /// A name claim ended: answer the `hyphae name set` waiting for it, if any.
    pub(crate) fn name_claimed(
        &mut self,
        now: Instant,
        i: usize,
        name: &str,
        result: Result<(), String>,
    ) {
        let (done, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut self.name_waiters)
            .into_iter()
            .partition(|w| w.ns == i && w.name == name);
        self.name_waiters = waiting;
        let n = &mut self.namespaces[i];
        let address = n.membership.address_for(name);
        for w in done {
            let answer = match (&result, address) {
                (Ok(()), Some(a)) => {
                    json!({ "ok": true, "message": format!("{name}.{} is {a}", n.name) })
                }
                (Ok(()), None) => {
                    json!({ "ok": true, "message": format!("name '{name}' claimed") })
                }
                (Err(e), _) => {
                    // The name is another member's: keep the one we had.
                    n.membership.set_hostname(now, w.previous);
                    json!({ "error": e })
                }
            };
            let _ = w.reply.send(answer);
        }
    }
}

/// `to` as the resolver socket can reach it: v4-mapped on a dual-stack socket.
fn resolver_target(socket: &tokio::net::UdpSocket, to: SocketAddr) -> SocketAddr {
    match (socket.local_addr(), to) {
        (Ok(SocketAddr::V6(_)), SocketAddr::V4(v4)) => {
            SocketAddr::from((v4.ip().to_ipv6_mapped(), v4.port()))
        }
        _ => to,
    }
}

/// The next datagram on the resolver socket (never, without one).
pub(crate) async fn recv_resolver(
    socket: Option<&tokio::net::UdpSocket>,
    buf: &mut [u8],
) -> Option<(usize, SocketAddr)> {
    match socket {
        Some(s) => s.recv_from(buf).await.ok().map(|(n, from)| {
            // A dual-stack socket reports IPv4 senders as v4-mapped IPv6.
            let from = match from {
                SocketAddr::V6(v6) => match v6.ip().to_ipv4_mapped() {
                    Some(v4) => SocketAddr::from((v4, v6.port())),
                    None => from,
                },
                v4 => v4,
            };
            (n, from)
        }),
        None => std::future::pending().await,
    }
}
