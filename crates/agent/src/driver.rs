//! The agent: every core (switches, tunnels, memberships, services, the overlay), fed what
//! arrives with one reading of the clock per turn; it carries out what they return and
//! tells the earliest deadline any core asks for (`poll_timeout`). The control thread's loop
//! (`run`) and the data-path workers (`workers`) share it, each holding it for one turn or
//! one batch at a time: nothing is locked per packet.
//!
//! Each namespace is one [`Namespace`]: its device, switch, DHCP and DNS services and its
//! membership (the DHT state). The other files of the driver hold the rest by concern:
//! `datapath` (frames and datagrams), `services` (DHCP and DNS), `events` (what the overlay
//! and the memberships report), `status`, `control_server`.
#![allow(clippy::disallowed_methods)] // The driver is where the clocks are read.

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Result};
use hyphae_dhcp_dns::{dhcp, service};
use hyphae_overlay::membership::{self, Membership, Token};
use hyphae_overlay::swarm::{tcp_multiaddr, tunnel_endpoint, OpId, Overlay, OverlayOptions};
use hyphae_overlay::{Identity, NamespaceId, NamespaceKeys, Node, PeerHandle, PeerId};
use hyphae_vswitch::{Client, Switch};
use tokio::sync::{mpsc, Notify};

use crate::config::{Address, Config, Mode, UnderlayMode};
use crate::setup;
use crate::workers::{Command, Io, Tap, WorkerLink};

/// Largest datagram or frame: the UDP maximum, with room for headers in front.
pub(crate) const BUF_LEN: usize = 65536 + 64;

/// How long a `hyphae name set` waits for its claim before answering "still running".
pub(crate) const NAME_SET_WAIT: Duration = Duration::from_secs(4);

/// With only `[[namespace.peer]]` contacts (no `bootstrap`): how long the agent waits for
/// one of them to answer before it starts the overlay alone. A member that is up answers a
/// TCP dial within a round trip (a refused port at once), so the wait only delays the first
/// member up; the same wait as for mDNS answers (`swarm::MDNS_WAIT`).
const STATIC_PEER_WAIT: Duration = Duration::from_secs(2);

/// The subnet of a namespace whose record has not been read yet: holds no address.
const NO_SUBNET: ipnet::Ipv4Net = match ipnet::Ipv4Net::new(Ipv4Addr::UNSPECIFIED, 32) {
    Ok(n) => n,
    Err(_) => panic!("a /32 is a valid prefix"),
};

/// One namespace this agent is (or was) a member of.
pub(crate) struct Namespace {
    pub(crate) name: String,
    /// Names the namespace in the control plane (its records and membership proofs).
    pub(crate) tag: [u8; hyphae_overlay::TAG_LEN],
    pub(crate) device: String,
    pub(crate) mode: Mode,
    /// Router and hybrid modes: the LAN bridge, and the links this namespace set up.
    pub(crate) bridge: Option<String>,
    pub(crate) lan: Option<crate::lan::Lan>,
    /// The TAP's first queue (the control thread writes through it; worker 0 reads it);
    /// `None` once the namespace was left.
    pub(crate) tap: Option<Tap>,
    pub(crate) switch: Switch<PeerHandle>,
    /// The DHT state: address, names, resolution, group.
    pub(crate) membership: Membership,
    /// Router mode: LAN hosts moving between this router and others.
    pub(crate) handoffs: crate::migration::Handoffs,
    /// Members of the broadcast group (read from the DHT).
    pub(crate) group: Vec<PeerId>,
    /// The virtual DHCP server (router mode, or `address = "dhcp"`), once the subnet is known.
    pub(crate) dhcp: Option<dhcp::Server>,
    /// The default gateway DHCP hands out, if configured.
    pub(crate) gateway: Option<Ipv4Addr>,
    /// The virtual DNS service.
    pub(crate) dns: service::Service<Client>,
    pub(crate) tap_errors: u64,
    /// The TAP has offloads on: a virtio-net header leads every read and write.
    pub(crate) offload: bool,
    pub(crate) offload_counters: crate::datapath::OffloadCounters,
    /// Joined while running (`hyphae join`): a conflict leaves it instead of stopping.
    pub(crate) live: bool,
    /// Why it was left, if it failed.
    pub(crate) error: Option<String>,
    /// The members last written to its members file (see [`setup::remembered_members`]).
    pub(crate) remembered: Vec<(PeerId, SocketAddr)>,
    /// The host names of the members' addresses, as last read from the DHT, and when the
    /// read started (for status; see `status::MEMBER_NAME_REFRESH`).
    pub(crate) member_names: HashMap<Ipv4Addr, (Option<String>, Instant)>,
}

impl Namespace {
    /// Whether this agent is a member now (not left).
    pub(crate) fn active(&self) -> bool {
        self.tap.is_some()
    }
}

/// A `hyphae name set` waiting for its claim.
pub(crate) struct NameWaiter {
    pub(crate) ns: usize,
    pub(crate) name: String,
    /// The name before, restored if the new one is another member's.
    pub(crate) previous: Option<String>,
    pub(crate) reply: tokio::sync::oneshot::Sender<serde_json::Value>,
    pub(crate) deadline: Instant,
}

pub(crate) struct Agent {
    pub(crate) config_path: PathBuf,
    pub(crate) state_dir: PathBuf,
    pub(crate) listen: SocketAddr,
    pub(crate) remote_mac: [u8; 6],
    pub(crate) identity: Identity,
    pub(crate) overlay: Overlay,
    /// DHT operations in flight: the namespace and the membership token they answer.
    pub(crate) ops: HashMap<OpId, (usize, Token)>,
    /// Why the agent must stop (a static address owned by another member).
    pub(crate) fatal: Option<String>,
    pub(crate) node: Node,
    pub(crate) namespaces: Vec<Namespace>,
    /// The I/O of the thread holding the agent: the control thread's, or a worker's for
    /// the batch it is carrying (`workers.rs`).
    pub(crate) io: Io,
    /// Datagrams the control thread sent, for worker 0 to put on the wire.
    pub(crate) outbox: Vec<(SocketAddr, Vec<u8>)>,
    /// The data-path workers, one per underlay socket.
    pub(crate) workers: Vec<WorkerLink>,
    /// The workers before `run` starts them.
    pub(crate) unstarted: Vec<crate::workers::Unstarted>,
    pub(crate) underlay_mode: UnderlayMode,
    /// Wakes the control thread: a worker left it work.
    pub(crate) poke: Arc<Notify>,
    /// Until when the control thread sleeps, unless poked.
    pub(crate) main_deadline: Option<Instant>,
    /// A worker's batch gave the control thread work (services, memberships, events).
    pub(crate) control_work: bool,
    /// Address and route changes, when listening on all addresses (roaming).
    pub(crate) netwatch: Option<crate::netwatch::NetWatch>,
    /// Our source address toward each member, to tell which a change concerns.
    pub(crate) sources: crate::netwatch::Sources,
    /// `[agent] offload`: open TAPs with offloads when the kernel accepts them.
    pub(crate) offload: bool,
    /// Frames whose address resolved, to go through their switch again.
    pub(crate) replays: Vec<(usize, Vec<Vec<u8>>)>,
    /// Packets for LAN hosts handed to another router, to send on (grace period).
    pub(crate) forwards: Vec<(PeerHandle, Vec<u8>)>,
    /// Where DHCP replies, DNS answers and service-stack packets are framed.
    pub(crate) service_buf: Vec<u8>,
    /// Answers to forwarded queries, from the tasks that send them (one per query).
    pub(crate) resolver_tx: mpsc::Sender<crate::services::ResolverReply>,
    pub(crate) resolver_rx: Option<mpsc::Receiver<crate::services::ResolverReply>>,
    /// `hyphae name set` calls waiting for their claim.
    pub(crate) name_waiters: Vec<NameWaiter>,
    /// Contacts are static peers only: when to start the overlay alone if none answered.
    pub(crate) alone_at: Option<Instant>,
    /// No static peer answered in time: the memberships run on an overlay of this agent
    /// alone, which a peer joins when it answers later (the swarm then bootstraps).
    pub(crate) alone: bool,
    /// Readiness and status for a service manager (`$NOTIFY_SOCKET`).
    pub(crate) notifier: crate::notify::Notifier,
}

impl Agent {
    pub(crate) fn start(
        config: Config,
        identity: Identity,
        sockets: Vec<std::net::UdpSocket>,
    ) -> Result<Self> {
        let mut bootstrap: Vec<_> = config
            .namespaces
            .iter()
            .flat_map(|n| n.bootstrap.iter().cloned())
            .collect();
        // Static peers are members too: dialled as bootstrap contacts (their TCP port is
        // their tunnel port), so agents that list only each other share one DHT and one
        // of two equal static addresses is refused.
        let only_static = bootstrap.is_empty();
        for peer in config.namespaces.iter().flat_map(|n| &n.peers) {
            let addr = tcp_multiaddr(*peer);
            if *peer != config.agent.listen && !bootstrap.contains(&addr) {
                bootstrap.push(addr);
            }
        }
        let alone_at =
            (only_static && !bootstrap.is_empty()).then(|| Instant::now() + STATIC_PEER_WAIT);
        let options = OverlayOptions {
            mdns: config.agent.mdns,
            ..OverlayOptions::default()
        };
        let mut overlay = Overlay::new(
            &identity,
            tcp_multiaddr(config.agent.listen),
            bootstrap,
            options,
            setup::os_seed()?,
        )
        .map_err(|e| anyhow::anyhow!("{e}"))?;
        // A namespace address is never an underlay address (the TAP's, when listening on
        // 0.0.0.0): keep them out of the DHT. Subnets learned later are added then.
        for subnet in config.namespaces.iter().filter_map(|n| n.subnet) {
            overlay.exclude_network(subnet.into());
        }
        let own = Identity::from_seed(identity.seed());
        let node = Node::new(identity, setup::os_seed()?);
        let (workers, unstarted) = crate::workers::links(sockets);
        // Bound to one address, the source never changes: nothing to roam.
        let netwatch = if config.agent.listen.ip().is_unspecified() {
            crate::netwatch::NetWatch::new()
                .map_err(|e| tracing::warn!(error = %e, "no netlink: address changes go unnoticed"))
                .ok()
        } else {
            None
        };
        let (resolver_tx, resolver_rx) = mpsc::channel(crate::services::RESOLVER_REPLIES);
        let mut agent = Self {
            config_path: config.path.clone(),
            state_dir: config.agent.state_dir.clone(),
            listen: config.agent.listen,
            // IPOP 4.1: one FE:FD MAC per agent stands for every remote member; hybrid
            // agents sharing a LAN each have their own (routers: one per namespace).
            remote_mac: setup::stable_mac(
                hyphae_vswitch::REMOTE_MAC_PREFIX,
                &own.peer_id(),
                "remote",
            ),
            identity: own,
            overlay,
            ops: HashMap::new(),
            fatal: None,
            node,
            namespaces: Vec::new(),
            io: Io::new(None),
            outbox: Vec::new(),
            workers,
            unstarted,
            underlay_mode: config.agent.underlay,
            poke: Arc::new(Notify::new()),
            main_deadline: None,
            control_work: false,
            netwatch,
            sources: crate::netwatch::Sources::default(),
            offload: config.agent.offload,
            replays: Vec::new(),
            forwards: Vec::new(),
            service_buf: vec![0; BUF_LEN],
            resolver_tx,
            resolver_rx: Some(resolver_rx),
            name_waiters: Vec::new(),
            alone_at,
            alone: false,
            notifier: crate::notify::Notifier::from_env(),
        };
        let now = Instant::now();
        for ns in &config.namespaces {
            agent.add_namespace(ns, now)?;
        }
        if config.namespaces.is_empty() {
            tracing::warn!("no [[namespace]] in the config: the agent has nothing to carry");
        }
        tracing::info!(id = %agent.node.peer_id(), listen = %config.agent.listen, "agent started");
        Ok(agent)
    }

    /// Creates the namespace's TAP, tunnels, switch, services and DHT state.
    pub(crate) fn add_namespace(
        &mut self,
        ns: &crate::config::Namespace,
        now: Instant,
    ) -> Result<()> {
        let me = self.identity.peer_id();
        // Locally administered, unicast: 0x02 in the first byte.
        let device_mac = setup::stable_mac([0x02, 0x48], &me, &ns.name);
        let tap_name = crate::lan::tap_name(ns);
        // Router and hybrid TAPs are bridge ports: their own MAC is never addressed.
        let tap_mac = match ns.mode {
            Mode::Interface => device_mac,
            Mode::Router | Mode::Hybrid => setup::stable_mac([0x02, 0x49], &me, &ns.name),
        };
        let queues = self.workers.len();
        let (tap, offload) = setup::create_tap(ns, &tap_name, tap_mac, self.offload, queues)?;
        // UDP datagrams are coalesced too where the TAP takes UDP segmentation offload.
        let udp = offload && tap.udp_gso();
        let more = setup::more_queues(&tap, queues)?;
        let lan = match ns.mode {
            Mode::Interface => None,
            Mode::Router | Mode::Hybrid => Some(crate::lan::attach(ns, &tap_name, device_mac)?),
        };
        if let (Mode::Hybrid, Address::Static(a), Some(subnet)) = (ns.mode, ns.address, ns.subnet) {
            crate::lan::set_address(&ns.device, a, subnet.prefix_len())?;
        }
        let tap = Arc::new(tap);
        let keys = NamespaceKeys::derive(&ns.name, &ns.secret);
        // Peers learn we are a member (and we which of them are) before anything is claimed.
        // An agent that leaves stays a proven member until it restarts: it still holds
        // the secret, and its releases must still reach the replicas.
        self.overlay.add_namespace(&keys);
        let tag = keys.tag();
        // Members hear of our address once it is won, static or not.
        let id = self.node.add_namespace(keys.clone(), Vec::new());
        if id.0 != self.namespaces.len() {
            bail!(
                "internal: the node numbered namespace '{}' {}, not {}",
                ns.name,
                id.0,
                self.namespaces.len()
            );
        }
        for &peer in &ns.peers {
            self.node.add_static_peer(id, peer, now);
        }
        // Members known before a restart still have tunnels with us that we forgot: a
        // hello makes them start fresh ones at once rather than after theirs time out. They
        // are dialled too, but not waited for (they may be gone).
        for endpoint in setup::remembered_members(&self.state_dir, &ns.name) {
            if endpoint != self.listen && !ns.peers.contains(&endpoint) {
                self.node.add_static_peer(id, endpoint, now);
                self.overlay.dial(tcp_multiaddr(endpoint));
            }
        }
        // A bootstrap agent is usually a member too: a tunnel with it gives every member
        // one it can relay through when two members cannot reach each other.
        for endpoint in ns.bootstrap.iter().filter_map(tunnel_endpoint) {
            if endpoint != self.listen && !ns.peers.contains(&endpoint) {
                self.node.add_static_peer(id, endpoint, now);
            }
        }
        let previous = std::fs::read_to_string(setup::state_file(&self.state_dir, &ns.name))
            .ok()
            .and_then(|t| t.trim().parse().ok());
        let mut membership = Membership::new(
            membership::Config {
                name: ns.name.clone(),
                keys,
                subnet: ns.subnet,
                reserved: ns.reserved.clone(),
                address: ns.address,
                lease: ns.lease,
                hostname: ns.hostname.clone(),
                previous,
            },
            Identity::from_seed(self.identity.seed()),
            setup::os_seed()?,
            now,
            unix_now(),
        );
        membership.set_endpoints(now, self.endpoints());
        let mut dns = service::Service::new(ns.resolvers.clone(), ns.mtu, setup::os_seed()?)
            .with_rate(ns.dns_rate);
        if let Some(subnet) = ns.subnet {
            dns.set_zone(&ns.name, subnet);
        }
        let Some(handoffs) = crate::migration::Handoffs::new(&me) else {
            bail!("internal: this agent's identity has no libp2p peer id");
        };
        // Each worker reads and writes a queue of its own; the control thread writes
        // through the first, which worker 0 reads.
        let i = self.namespaces.len();
        for (link, queue) in self
            .workers
            .iter()
            .zip(std::iter::once(tap.clone()).chain(more.into_iter().map(Arc::new)))
        {
            let _ = link.commands.send(Command::Tap { ns: i, queue, udp });
        }
        self.namespaces.push(Namespace {
            name: ns.name.clone(),
            tag,
            device: ns.device.clone(),
            mode: ns.mode,
            bridge: ns.bridge.clone(),
            lan,
            tap: Some(tap),
            switch: Switch::new(hyphae_vswitch::Config {
                mode: ns.mode,
                // The device has a static address from the start when the subnet is known
                // (see `create_tap`); any other is set once won.
                address: ns
                    .address
                    .fixed()
                    .filter(|_| ns.subnet.is_some())
                    .unwrap_or(Ipv4Addr::UNSPECIFIED),
                // Until the namespace record is read, nothing is in the subnet.
                subnet: ns.subnet.unwrap_or(NO_SUBNET),
                device_mac,
                remote_mac: match ns.mode {
                    Mode::Router => setup::router_remote_mac(&tag),
                    Mode::Interface | Mode::Hybrid => self.remote_mac,
                },
                probe_timeout: ns.probe_timeout,
                lan_timeout: ns.lan_timeout,
                broadcast_rate: ns.broadcast_rate,
                // A router's LAN hosts and a DHCP host get their addresses from the agent.
                dhcp: ns.mode == Mode::Router || ns.address == Address::Dhcp,
                tunnel_mtu: ns.mtu,
            }),
            membership,
            handoffs,
            group: Vec::new(),
            dhcp: None,
            gateway: ns.gateway,
            dns,
            tap_errors: 0,
            offload,
            offload_counters: Default::default(),
            live: false,
            error: None,
            remembered: Vec::new(),
            member_names: HashMap::new(),
        });
        tracing::info!(namespace = %ns.name, device = %ns.device, address = ?ns.address,
            subnet = ?ns.subnet, peers = ns.peers.len(), "namespace up");
        Ok(())
    }

    /// `hyphae join`: the namespace `name` was added to the config file; bring it up.
    pub(crate) fn join(&mut self, name: &str, now: Instant) -> Result<(), String> {
        let config = Config::load(&self.config_path).map_err(|e| format!("{e:#}"))?;
        let Some(ns) = config.namespaces.iter().find(|n| n.name == name) else {
            return Err(format!(
                "namespace '{name}' is not in {}",
                self.config_path.display()
            ));
        };
        if let Some(i) = self.active(name) {
            return Err(format!(
                "already a member of '{name}' (device {})",
                self.namespaces[i].device
            ));
        }
        if let Some(other) = self
            .namespaces
            .iter()
            .find(|n| n.active() && n.device == ns.device)
        {
            return Err(format!(
                "device {} is already used by namespace '{}'",
                ns.device, other.name
            ));
        }
        self.add_namespace(ns, now).map_err(|e| format!("{e:#}"))?;
        let ready = self.overlay_ready();
        if let Some(n) = self.namespaces.last_mut() {
            n.live = true;
            if ready {
                n.membership.start(now);
            }
        }
        for addr in &ns.bootstrap {
            self.overlay.dial(addr.clone());
        }
        for &peer in ns.peers.iter().filter(|&&p| p != self.listen) {
            self.overlay.dial(tcp_multiaddr(peer));
        }
        Ok(())
    }

    /// Whether the memberships run: the overlay was joined, or started alone.
    pub(crate) fn overlay_ready(&self) -> bool {
        self.overlay.is_joined() || self.alone
    }

    /// No static peer answered within [`STATIC_PEER_WAIT`]: start the overlay alone, as a
    /// first member does. One that answers while the swarm bootstraps is waited for.
    fn start_alone(&mut self, now: Instant) {
        self.alone_at = None;
        if self.overlay_ready() || self.overlay.connected() > 0 {
            return;
        }
        tracing::info!("no static peer answered: starting the overlay alone");
        self.alone = true;
        for n in self.namespaces.iter_mut().filter(|n| n.active()) {
            n.membership.start(now);
        }
    }

    /// The index of the namespace `name` this agent is a member of now.
    pub(crate) fn active(&self, name: &str) -> Option<usize> {
        self.namespaces
            .iter()
            .position(|n| n.name == name && n.active())
    }

    /// `hyphae leave`: release the namespace's addresses, drop its tunnels and its TAP.
    pub(crate) fn leave(&mut self, name: &str, now: Instant) -> Result<usize, String> {
        let Some(i) = self.active(name) else {
            return Err(format!("not a member of '{name}'"));
        };
        Ok(self.drop_namespace(i, now))
    }

    pub(crate) fn drop_namespace(&mut self, i: usize, now: Instant) -> usize {
        let n = &mut self.namespaces[i];
        let released = n.membership.leave();
        self.node.remove_namespace(now, NamespaceId(i));
        // Dropping the TAP's queues removes the device (and the hybrid veth goes with its
        // links).
        n.tap = None;
        for link in &self.workers {
            let _ = link.commands.send(Command::Leave(i));
        }
        n.lan = None;
        n.group.clear();
        tracing::info!(namespace = %n.name, "namespace left");
        released
    }

    /// The earliest deadline of any core: the loop sleeps until then at most.
    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        // Asked twice per loop turn: no allocation.
        let namespaces = self.namespaces.iter().filter(|n| n.active()).flat_map(|n| {
            [
                n.switch.poll_timeout(),
                n.membership.poll_timeout(),
                n.dhcp.as_ref().and_then(dhcp::Server::poll_timeout),
                n.dns.poll_timeout(),
                n.handoffs.poll_timeout(),
            ]
        });
        [
            self.node.poll_timeout(),
            self.overlay.poll_timeout(),
            self.alone_at,
        ]
        .into_iter()
        .chain(namespaces)
        .chain(self.name_waiters.iter().map(|w| Some(w.deadline)))
        .flatten()
        .min()
    }

    /// Runs the timers of every core whose deadline has come.
    pub(crate) fn handle_timeout(&mut self, now: Instant) {
        let due = |t: Option<Instant>| t.is_some_and(|t| t <= now);
        if due(self.node.poll_timeout()) {
            self.node.handle_timeout(now);
            if self.netwatch.is_some() {
                self.sources.track(self.node.peers().map(|p| p.endpoint));
            }
            // The node ticks while it has tunnels: note who is reachable, for a restart.
            for i in 0..self.namespaces.len() {
                if self.namespaces[i].active() {
                    self.remember_members(i);
                }
            }
        }
        if due(self.overlay.poll_timeout()) {
            self.overlay.handle_timeout(now);
        }
        if due(self.alone_at) {
            self.start_alone(now);
        }
        let unix = unix_now();
        for i in 0..self.namespaces.len() {
            let n = &mut self.namespaces[i];
            if !n.active() {
                continue;
            }
            if due(n.switch.poll_timeout()) {
                n.switch.handle_timeout(now);
                self.flush_switch(i, now);
            }
            let n = &mut self.namespaces[i];
            if due(n.dhcp.as_ref().and_then(dhcp::Server::poll_timeout)) {
                if let Some(server) = n.dhcp.as_mut() {
                    server.handle_timeout(now);
                }
                self.drain_dhcp(i, now);
            }
            let n = &mut self.namespaces[i];
            if due(n.dns.poll_timeout()) {
                n.dns
                    .handle_timeout(now, &crate::services::HeldBy(&n.membership));
            }
            if due(n.membership.poll_timeout()) {
                n.membership.handle_timeout(now, unix);
            }
            if due(n.handoffs.poll_timeout()) {
                self.handoffs_timeout(i, now);
            }
        }
        // `hyphae name set` calls whose claim has not been decided yet.
        let (late, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut self.name_waiters)
            .into_iter()
            .partition(|w| now >= w.deadline);
        self.name_waiters = waiting;
        for w in late {
            let message = format!(
                "name '{}' set; its claim is still running (see `hyphae status`)",
                w.name
            );
            let _ = w
                .reply
                .send(serde_json::json!({ "ok": true, "message": message }));
        }
    }

    /// Carries out what the cores asked for until none asks for more: frames that waited,
    /// the node's datagrams and events, the memberships' DHT operations and events, the
    /// DNS services' reads and answers.
    pub(crate) async fn flush(&mut self, now: Instant) {
        // Bounded: a core whose deadline stayed in the past would otherwise spin here.
        for _ in 0..16 {
            self.flush_node(now).await;
            let mut busy = false;
            for i in 0..self.namespaces.len() {
                busy |= self.flush_namespace(i, now);
            }
            // Timers a core set to `now` while handling the above run at once.
            if self.poll_timeout().is_some_and(|t| t <= now) {
                self.handle_timeout(now);
                busy = true;
            }
            if !busy && self.replays.is_empty() {
                return;
            }
        }
        tracing::debug!("the cores still had work after 16 rounds; the next turn goes on");
    }

    /// Namespace `i` cannot be joined as configured: one joined with `hyphae join` is left
    /// (the error shows in its status); one from the config at start stops the agent.
    pub(crate) fn conflict(&mut self, i: usize, reason: String, now: Instant) {
        if self.namespaces[i].live {
            tracing::error!(namespace = %self.namespaces[i].name, "{reason}");
            self.drop_namespace(i, now);
            self.namespaces[i].error = Some(reason);
        } else {
            self.fatal = Some(reason);
        }
    }

    /// Gives this member's address to the device, the switch and the tunnels.
    pub(crate) fn set_address(&mut self, i: usize, address: Ipv4Addr, now: Instant) {
        let n = &mut self.namespaces[i];
        if n.switch.config().address != address {
            let prefix = n.switch.config().subnet.prefix_len();
            // The TAP (interface, router) or the host's veth (hybrid).
            let result = match n.active() {
                true => crate::lan::set_address(&n.device, address, prefix),
                false => Ok(()),
            };
            if let Err(e) = result {
                tracing::error!(device = %n.device, error = %e, "cannot set the address");
            }
            n.switch.set_address(address);
        }
        let addresses = n.membership.addresses();
        self.node.set_addresses(now, NamespaceId(i), addresses);
    }

    /// Where members reach this agent's tunnels: its listen address, or (listening on all
    /// addresses) every address the overlay listens on, with the tunnel port.
    pub(crate) fn endpoints(&self) -> Vec<SocketAddr> {
        if !self.listen.ip().is_unspecified() {
            return vec![self.listen];
        }
        self.overlay
            .listen_ips()
            .into_iter()
            .map(|ip| SocketAddr::new(ip, self.listen.port()))
            .collect()
    }

    /// On the way out: give our addresses and names back so others can take them now, not
    /// after the lease (waits at most a few seconds for the replicas).
    pub(crate) async fn release_held(&mut self) {
        let mut waiting = 0;
        for n in &mut self.namespaces {
            n.membership.release_held();
            while let Some((_, request)) = n.membership.poll_request() {
                if let membership::Request::Release { key } = request {
                    self.overlay.release(n.tag, key);
                    waiting += 1;
                }
            }
        }
        let deadline = tokio::time::Instant::now() + Duration::from_secs(3);
        while waiting > 0 {
            let timer = self
                .overlay
                .poll_timeout()
                .map(tokio::time::Instant::from_std);
            tokio::select! {
                event = self.overlay.next_event() => {
                    if let hyphae_overlay::swarm::OverlayEvent::Released { .. } = event {
                        waiting -= 1;
                    }
                }
                () = crate::run::sleep_until(timer.map(|t| t.min(deadline)).map(tokio::time::Instant::into_std)) => {
                    self.overlay.handle_timeout(Instant::now());
                }
                _ = tokio::time::sleep_until(deadline) => break,
            }
        }
    }
}

/// Seconds since the Unix epoch: records carry expiry times on the wall clock.
pub(crate) fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
