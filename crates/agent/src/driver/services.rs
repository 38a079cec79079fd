//! The services at the namespace's service address, as the driver runs them: the virtual
//! DHCP server (its leases are the membership's DHT claims), the DNS service (its reads are
//! the membership's DHT reads; each forwarded query leaves from a socket of its own), and
//! `hyphae name set`.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Instant;

use hyphae_dhcp_dns::service::Held;
use hyphae_dhcp_dns::{dhcp, dns, forward};
use hyphae_overlay::membership::Membership;
use hyphae_overlay::NamespaceId;
use serde_json::json;
use tokio::sync::mpsc;

use super::workers::lock;
use super::{Control, NameWaiter, NAME_SET_WAIT};
use crate::config::Mode;

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

    fn address6_for(&self, host: &str) -> Option<std::net::Ipv6Addr> {
        // The own name stands for the own IPv6 address too.
        let own = self.0.owned()?;
        (self.0.address_for(host) == Some(own))
            .then(|| self.0.owned6())
            .flatten()
    }

    fn holder_of6(&self, address: std::net::Ipv6Addr) -> Option<Option<String>> {
        (self.0.owned6() == Some(address)).then(|| {
            self.0
                .owned()
                .and_then(|own| self.0.name_for(own))
                .map(str::to_string)
        })
    }
}

impl Control {
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
            // namespace record says: then none. A multi-subnet namespace's hosts have
            // the subnet's service address as their router unless one is configured.
            router: n
                .gateway
                .filter(|g| crate::config::check_in_subnet(*g, subnet).is_ok())
                .or_else(|| {
                    (!m.routed().is_empty()).then(|| hyphae_vswitch::service_address(subnet))
                }),
            routes: n.link_routes.clone(),
            lease: m.lease(),
        };
        n.dhcp
            .get_or_insert_with(|| dhcp::Server::new(settings))
            .handle_request(now, payload, mac);
        self.drain_dhcp(i, now);
    }

    /// Carries out what the DHCP server of namespace `i` asks: replies to the device,
    /// claims and releases in the DHT.
    pub(crate) fn drain_dhcp(&mut self, i: usize, now: Instant) {
        let n = &mut self.namespaces[i];
        while let Some(output) = n.dhcp.as_mut().and_then(dhcp::Server::poll_output) {
            match output {
                dhcp::Output::Reply(r) => {
                    let emitted = lock(&self.dp).lanes[i].switch.emit_dhcp_reply(
                        &mut self.batch.reply,
                        r.mac,
                        r.dst,
                        r.port,
                        &r.bytes,
                    );
                    if let Some(len) = emitted {
                        self.batch.write_reply(i, len);
                    }
                }
                dhcp::Output::Claim {
                    client,
                    hint,
                    exact,
                } => n.membership.claim_for_dhcp(now, client.0, hint, exact),
                dhcp::Output::Bound { address, mac } => {
                    lock(&self.dp).lanes[i].switch.bind_lease(address, mac);
                }
                dhcp::Output::Release(address) => {
                    lock(&self.dp).lanes[i].switch.unbind_lease(address);
                    if n.membership.release_dhcp(address) {
                        let addresses = n.membership.addresses();
                        let mut dp = lock(&self.dp);
                        let switch = &mut dp.lanes[i].switch;
                        if switch.config().address == address {
                            switch.set_address(Ipv4Addr::UNSPECIFIED);
                        }
                        dp.node.set_addresses(now, NamespaceId(i), addresses);
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
                let addresses = n.membership.addresses();
                let mut dp = lock(&self.dp);
                if n.membership.host_uses_dhcp() {
                    // The host's DHCP client configures the device; the switch and the
                    // tunnels learn the address now.
                    dp.lanes[i].switch.set_address(a);
                }
                dp.node.set_addresses(now, NamespaceId(i), addresses);
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
        // Answers and service-stack packets are framed by the switch: the data plane is
        // held once for all of them (no I/O: the frames go into this thread's batch).
        let mut dp = None;
        while let Some((client, answer)) = n.dns.poll_udp_answer() {
            any = true;
            let switch = &dp.get_or_insert_with(|| lock(&self.dp)).lanes[i].switch;
            if let Some(len) = switch.emit_dns_reply(&mut self.batch.reply, client, &answer) {
                self.batch.write_reply(i, len);
            }
        }
        while let Some((mac, packet)) = n.dns.poll_service_packet() {
            any = true;
            let switch = &dp.get_or_insert_with(|| lock(&self.dp)).lanes[i].switch;
            if let Some(len) = switch.emit_service_packet(&mut self.batch.reply, mac, &packet) {
                self.batch.write_reply(i, len);
            }
        }
        drop(dp);
        while let Some(transmit) = n.dns.poll_transmit() {
            any = true;
            tokio::spawn(ask_resolver(i, transmit, self.resolver_tx.clone()));
        }
        while let Some(missing) = n.dns.poll_lookup() {
            any = true;
            match missing {
                dns::Missing::Name(host) => n.membership.read_name(&host),
                dns::Missing::Address(a) => n.membership.read_holder(a),
                dns::Missing::Address6(a) => n.membership.read_holder6(a),
            }
        }
        any
    }

    /// What a resolver sent back for a query of namespace `ns`.
    pub(crate) fn resolver_answer(&mut self, now: Instant, reply: ResolverReply) {
        let Some(n) = self.namespaces.get_mut(reply.ns).filter(|n| n.active()) else {
            return;
        };
        if !n
            .dns
            .handle_resolver_answer(now, reply.id, reply.tcp, reply.from, &reply.message)
        {
            tracing::debug!(from = %reply.from, "a resolver's answer was not taken");
        }
    }

    /// `hyphae name set`: names this member's own address in namespace `namespace`. The reply
    /// goes out now, or once the claim is decided.
    pub(crate) fn set_name(
        &mut self,
        now: Instant,
        namespace: &str,
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
        let Some(i) = self.active(namespace) else {
            return answer(reply, Err(format!("not a member of '{namespace}'")));
        };
        if self.namespaces[i].mode == Mode::Router {
            return answer(
                reply,
                Err(format!(
                    "namespace '{namespace}' is in router mode: it has no address of its own to name"
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
                    "namespace '{namespace}': another `hyphae name set` is still waiting for its claim"
                )),
            );
        }
        let m = &mut self.namespaces[i].membership;
        if let Some(own) = m.certified_name() {
            let own = own.unwrap_or("none (the certificate's name is not a host name)");
            return answer(
                reply,
                Err(format!(
                    "namespace '{namespace}' has an authority: this host's name is its certificate's ({own}); sign a certificate with another name to change it"
                )),
            );
        }
        if let (Some(name), Some(owned)) = (&name, m.owned()) {
            if m.address_for(name) == Some(owned) {
                return answer(reply, Ok(format!("{name}.{namespace} is {owned}")));
            }
        }
        let previous = m.hostname().map(str::to_string);
        m.set_hostname(now, name.clone());
        match (name, m.owned()) {
            (None, _) => answer(reply, Ok(format!("namespace '{namespace}': name cleared"))),
            (Some(name), None) => answer(
                reply,
                Ok(format!(
                    "name '{name}.{namespace}' set; it is claimed once this member holds its address"
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

/// What came back from a resolver for one forwarded query.
pub(crate) struct ResolverReply {
    /// The namespace whose query it answers.
    pub(crate) ns: usize,
    /// The id of the query sent (names the socket or connection it came on).
    pub(crate) id: [u8; 2],
    pub(crate) tcp: bool,
    pub(crate) from: SocketAddr,
    pub(crate) message: Vec<u8>,
}

/// Answers taken off the resolver sockets, waiting for the loop: as many as queries may be
/// at the resolvers at once, for a few namespaces.
pub(crate) const RESOLVER_REPLIES: usize = 4 * forward::MAX_FORWARDS;

/// Largest DNS message: a TCP message's length is 16 bits (RFC 1035 4.2.2).
const MAX_MESSAGE: usize = 65535;

/// Sends one forwarded query and hands the answer to the loop. RFC 5452 9.2: over UDP, from
/// a socket of its own on a port the OS picks at random (Linux randomizes ephemeral ports),
/// connected to the resolver so only its address and port get through; the first message
/// with the query's id is passed on, the others (and anything after the resolver's
/// timeout) are not waited for. Over TCP, one connection per query (RFC 7766 6.2.1 allows
/// reuse; forwarded TCP is rare: truncated answers and TCP clients). Failures are left to
/// the forwarder's timeout, which asks the next resolver.
async fn ask_resolver(ns: usize, t: forward::Transmit, tx: mpsc::Sender<ResolverReply>) {
    let result = tokio::time::timeout(forward::FORWARD_TIMEOUT, async {
        if t.tcp {
            ask_over_tcp(&t).await
        } else {
            ask_over_udp(&t).await
        }
    })
    .await;
    match result {
        Ok(Ok(message)) => {
            let reply = ResolverReply {
                ns,
                id: t.id,
                tcp: t.tcp,
                from: t.to,
                message,
            };
            let _ = tx.send(reply).await;
        }
        Ok(Err(e)) => {
            tracing::debug!(resolver = %t.to, tcp = t.tcp, error = %e, "forwarding failed")
        }
        Err(_) => {
            tracing::debug!(resolver = %t.to, tcp = t.tcp, "the resolver did not answer in time")
        }
    }
}

async fn ask_over_udp(t: &forward::Transmit) -> std::io::Result<Vec<u8>> {
    let any: SocketAddr = match t.to {
        SocketAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
        SocketAddr::V6(_) => (std::net::Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    let socket = tokio::net::UdpSocket::bind(any).await?;
    socket.connect(t.to).await?;
    socket.send(&t.query).await?;
    let mut buf = vec![0; MAX_MESSAGE];
    loop {
        let len = socket.recv(&mut buf).await?;
        // Anything else on this port is a stray or a forgery: keep waiting for ours.
        if buf.get(..2) == Some(&t.id[..]) {
            buf.truncate(len);
            return Ok(buf);
        }
    }
}

async fn ask_over_tcp(t: &forward::Transmit) -> std::io::Result<Vec<u8>> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let len = u16::try_from(t.query.len())
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidInput, "query too long"))?;
    let mut stream = tokio::net::TcpStream::connect(t.to).await?;
    let mut out = Vec::with_capacity(2 + t.query.len());
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(&t.query);
    stream.write_all(&out).await?;
    let mut len = [0u8; 2];
    stream.read_exact(&mut len).await?;
    let mut message = vec![0; usize::from(u16::from_be_bytes(len))];
    stream.read_exact(&mut message).await?;
    Ok(message)
}
