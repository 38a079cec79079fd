//! The driver: the threads that carry out what the cores decide.
//!
//! - The **data plane** ([`data::DataPlane`]: the tunnel node and each namespace's switch) is
//!   what a packet needs. The workers ([`workers`]) and the control thread hold it for one
//!   batch at a time, a batch that is synchronous and free of I/O: it returns what to send,
//!   what to write to which TAP and what the control thread must hear; the system calls
//!   happen after it is let go. Nothing is locked per packet.
//! - The **control plane** ([`Control`]: the overlay swarm, the memberships, DHCP, DNS, the
//!   handoffs, the waiters, status) is owned by the control thread ([`run`]) and never
//!   locked. It reads the clock once per turn, polls the swarm with no lock held, takes what
//!   the workers left in the data plane's bounded inbox, and sleeps until the earliest
//!   deadline of any core.
//!
//! The control thread's files hold its concerns: `events` (what the overlay and the
//! memberships report), `services` (DHCP and DNS), `migration` (LAN host handoffs),
//! `joining` (`hyphae join` and `leave`), `status`, `calls` (the control socket's requests),
//! `host` (the devices, addresses, routes and seeds it asks of the kernel); `datapath` is
//! the data plane's batch. `sim` runs whole agents on a virtual clock for the tests.

mod addresses;
mod calls;
mod caps;
mod certificates;
pub(crate) mod data;
mod datapath;
mod dhcp6;
mod events;
#[cfg(test)]
mod frames;
mod host;
mod joining;
mod layer2;
mod links;
mod mac_checks;
mod migration;
mod policy;
mod restart;
mod run;
pub use run::up;
mod services;
#[cfg(test)]
mod sim;
#[cfg(test)]
mod sim_tests;
mod status;
#[cfg(test)]
mod tests;
mod workers;

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Result};
use hyphae_dhcp_dns::{dhcp, service};
use hyphae_overlay::membership::{self, Membership, Token};
use hyphae_overlay::swarm::{
    tcp_multiaddr, tunnel_endpoint, OpId, Overlay, OverlayOptions, STATIC_PEER_WAIT,
};
use hyphae_overlay::{Identity, NamespaceId, NamespaceKeys, Node, PeerId};
use hyphae_vswitch::{Client, Switch};
use tokio::sync::{mpsc, Notify};

use crate::config::{Address, Config, Mode, UnderlayMode};
use crate::setup;
use data::{Batch, DataPlane, Lane};
use workers::{lock, Command, Outgoing, Shared, WorkerLink};

/// How long a `hyphae name set` waits for its claim before answering "still running".
pub(crate) const NAME_SET_WAIT: Duration = Duration::from_secs(4);

/// The subnet of a namespace whose record has not been read yet: holds no address.
const NO_SUBNET: ipnet::Ipv4Net = match ipnet::Ipv4Net::new(Ipv4Addr::UNSPECIFIED, 32) {
    Ok(n) => n,
    Err(_) => panic!("a /32 is a valid prefix"),
};

/// One namespace this agent joined (or left), as the control thread keeps it; its switch
/// is the data plane's lane of the same index.
pub(crate) struct Joined {
    pub(crate) name: String,
    /// With an authority: this member's certificate (checked at start).
    pub(crate) certificate: Option<hyphae_overlay::cert::Certificate>,
    /// Where it is read from again on SIGHUP or `hyphae cert install` (a renewal).
    pub(crate) certificate_path: Option<PathBuf>,
    /// The policy file, read again on SIGHUP.
    pub(crate) policy_path: Option<PathBuf>,
    /// Names the namespace in the control plane (its records and membership proofs).
    pub(crate) tag: [u8; hyphae_overlay::TAG_LEN],
    pub(crate) device: String,
    /// The routes to linked namespaces, through their gateways: on the host's device
    /// (interface and hybrid modes), in DHCP replies (router mode).
    pub(crate) link_routes: Vec<(ipnet::Ipv4Net, Ipv4Addr)>,
    pub(crate) mode: Mode,
    /// Router and hybrid modes: the LAN bridge, and the links this namespace set up.
    pub(crate) bridge: Option<String>,
    pub(crate) lan: Option<crate::lan::Lan>,
    /// The TAP's first queue (the control thread writes through it; worker 0 reads it);
    /// `None` once the namespace was left.
    pub(crate) tap: Option<host::Device>,
    /// The TAP has offloads on: a virtio-net header leads every write.
    pub(crate) offload: bool,
    /// The DHT state: address, names, resolution, group.
    pub(crate) membership: Membership,
    /// Router mode: LAN hosts moving between this router and others.
    pub(crate) handoffs: migration::Handoffs,
    /// Members of the broadcast group (read from the DHT; the lane has them too).
    pub(crate) group: Vec<PeerId>,
    /// A layer-2 namespace: the MACs members announced, checked against the DHT.
    pub(crate) mac_checks: mac_checks::MacChecks<PeerId>,
    /// The virtual DHCP server (router mode, or `address = "dhcp"`), once the subnet is known.
    pub(crate) dhcp: Option<dhcp::Server>,
    /// Router mode, dual stack: the virtual DHCPv6 server, once a LAN host asks.
    pub(crate) dhcp6: Option<hyphae_dhcp_dns::dhcp6::Server>,
    /// Addresses DHCPv6 clients renew that another member holds, claimed once the handoff
    /// that asks that member for them ends (the host may have moved here), until when.
    pub(crate) dhcp6_after_handoff: HashMap<std::net::Ipv6Addr, Instant>,
    /// The default gateway DHCP hands out, if configured.
    pub(crate) gateway: Option<Ipv4Addr>,
    /// The virtual DNS service.
    pub(crate) dns: service::Service<Client>,
    /// Joined while running (`hyphae join`): a conflict leaves it instead of stopping.
    pub(crate) live: bool,
    /// Why it was left, if it failed.
    pub(crate) error: Option<String>,
    /// The members last written to its members file (see [`setup::remembered_members`]).
    pub(crate) remembered: Vec<(PeerId, SocketAddr)>,
}

impl Joined {
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

/// The control plane, owned by the control thread: every core but the tunnels and switches,
/// and the data plane it shares with the workers.
pub(crate) struct Control {
    pub(crate) config_path: PathBuf,
    pub(crate) state_dir: PathBuf,
    pub(crate) listen: SocketAddr,
    pub(crate) remote_mac: [u8; 6],
    pub(crate) identity: Identity,
    pub(crate) overlay: Overlay,
    /// DHT operations in flight: the namespace and the membership token they answer.
    pub(crate) ops: HashMap<OpId, (usize, Token)>,
    /// Why the agent must stop (a static address owned by another member, a worker that
    /// stopped).
    pub(crate) fatal: Option<String>,
    pub(crate) namespaces: Vec<Joined>,
    /// The tunnels and switches, shared with the workers.
    pub(crate) dp: Shared,
    /// What this thread's turns send and write, carried out after the data plane is let go.
    pub(crate) batch: Batch,
    /// The inbox taken from the data plane, kept to reuse its allocation.
    pub(crate) inbox: Vec<data::ToControl>,
    /// Datagrams for worker 0 to send (bounded), and those that did not fit.
    pub(crate) outbox: mpsc::Sender<Outgoing>,
    pub(crate) outbox_drops: u64,
    /// The data-path workers, one per underlay socket.
    pub(crate) workers: Vec<WorkerLink>,
    /// The workers before `run` starts them.
    pub(crate) unstarted: Vec<workers::Unstarted>,
    pub(crate) underlay_mode: UnderlayMode,
    /// How the kernel schedules the workers.
    pub(crate) worker_priority: crate::config::WorkerPriority,
    /// Wakes the control thread: a worker left it work.
    pub(crate) poke: Arc<Notify>,
    /// Address and route changes, when listening on all addresses (roaming).
    pub(crate) netwatch: Option<crate::netwatch::NetWatch>,
    /// Our source address toward each member, to tell which a change concerns.
    pub(crate) sources: crate::netwatch::Sources,
    /// `[agent] offload`: open TAPs with offloads when the kernel accepts them.
    pub(crate) offload: bool,
    /// Frames whose address resolved, to go through their switch again.
    pub(crate) replays: Vec<(usize, Vec<Vec<u8>>)>,
    /// Answers to forwarded queries, from the tasks that send them (one per query).
    pub(crate) resolver_tx: mpsc::Sender<services::ResolverReply>,
    pub(crate) resolver_rx: Option<mpsc::Receiver<services::ResolverReply>>,
    /// `hyphae name set` calls waiting for their claim.
    pub(crate) name_waiters: Vec<NameWaiter>,
    /// Readiness and status for a service manager (`$NOTIFY_SOCKET`).
    pub(crate) notifier: crate::notify::Notifier,
    /// Where devices, addresses and routes are made: the kernel.
    pub(crate) host: host::Host,
    /// The driver's deterministic tests: the DHT operations and member messages, kept for
    /// the test to answer instead of going to the overlay.
    #[cfg(test)]
    pub(crate) intercepted: Option<sim::Intercepted>,
}

impl Control {
    /// Starts the control plane of `config` on this machine's kernel, with a worker per
    /// underlay socket.
    pub(crate) fn start(
        config: Config,
        identity: Identity,
        sockets: Vec<std::net::UdpSocket>,
    ) -> Result<Self> {
        let listen = tcp_multiaddr(config.agent.listen);
        #[allow(clippy::disallowed_methods)] // the clock before the first turn
        let now = Instant::now();
        Self::start_on(config, identity, sockets, host::Host::Kernel, listen, now)
    }

    /// Starts the control plane on `host` at `now`, its overlay listening on
    /// `overlay_listen`.
    pub(crate) fn start_on(
        config: Config,
        identity: Identity,
        sockets: Vec<std::net::UdpSocket>,
        mut host: host::Host,
        overlay_listen: hyphae_overlay::swarm::Multiaddr,
        now: Instant,
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
        let options = OverlayOptions {
            mdns: config.agent.mdns,
            alone_after: (only_static && !bootstrap.is_empty()).then_some(STATIC_PEER_WAIT),
            ..OverlayOptions::default()
        };
        let mut overlay = Overlay::new(&identity, overlay_listen, bootstrap, options, host.seed()?)
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        // A namespace address is never an underlay address (the TAP's, when listening on
        // 0.0.0.0): keep them out of the DHT. Subnets learned later are added then.
        for ns in &config.namespaces {
            for subnet in ns.subnet.iter().chain(&ns.subnets) {
                overlay.exclude_network((*subnet).into());
            }
        }
        let own = Identity::from_seed(identity.seed());
        let mut node = Node::new(identity, host.seed()?);
        // A tunnel's traffic may spread over one WireGuard session per worker.
        node.set_shards(u8::try_from(sockets.len()).unwrap_or(u8::MAX));
        node.set_uplinks(config.agent.uplinks.clone())
            .map_err(|e| anyhow::anyhow!("[agent] uplinks: {e}"))?;
        let (workers, unstarted, outbox) = workers::links(sockets, config.namespaces.len());
        // Bound to one address, the source never changes: nothing to roam.
        let netwatch = if config.agent.listen.ip().is_unspecified() {
            crate::netwatch::NetWatch::new()
                .map_err(|e| tracing::warn!(error = %e, "no netlink: address changes go unnoticed"))
                .ok()
        } else {
            None
        };
        let (resolver_tx, resolver_rx) = mpsc::channel(services::RESOLVER_REPLIES);
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
            namespaces: Vec::new(),
            dp: Arc::new(Mutex::new(DataPlane {
                shares: config.agent.uplink_rate.map(|rate| {
                    // A burst of 10 ms at the rate; queues of 20 ms.
                    hyphae_vswitch::qos::Shares::new(
                        rate,
                        rate / 8 / 100,
                        hyphae_vswitch::qos::MAX_DELAY,
                    )
                }),
                ..DataPlane::new(node)
            })),
            batch: Batch::default(),
            inbox: Vec::new(),
            outbox,
            outbox_drops: 0,
            workers,
            unstarted,
            underlay_mode: config.agent.underlay,
            worker_priority: config.agent.worker_priority,
            poke: Arc::new(Notify::new()),
            netwatch,
            sources: crate::netwatch::Sources::default(),
            offload: config.agent.offload,
            replays: Vec::new(),
            resolver_tx,
            resolver_rx: Some(resolver_rx),
            name_waiters: Vec::new(),
            notifier: crate::notify::Notifier::from_env(),
            host,
            #[cfg(test)]
            intercepted: None,
        };
        for cfg in &config.namespaces {
            agent.add_namespace(cfg, now)?;
        }
        if config.namespaces.is_empty() {
            tracing::warn!("no [[namespace]] in the config: the agent has nothing to carry");
        }
        tracing::info!(id = %agent.identity.peer_id(), listen = %config.agent.listen, "agent started");
        Ok(agent)
    }

    /// Creates the namespace's TAP, tunnels, switch, services and DHT state.
    pub(crate) fn add_namespace(
        &mut self,
        cfg: &crate::config::Namespace,
        now: Instant,
    ) -> Result<()> {
        let me = self.identity.peer_id();
        let mut certificate = None;
        let credential = certificates::with_kept(&self.state_dir, cfg);
        let (lane_policy, policy_source) = policy::at_start(
            &cfg.name,
            credential.as_ref().map(|c| &c.trust),
            (&cfg.policy, cfg.layer2),
            cfg.policy_path.as_deref(),
        );

        // Before anything is created: a certificate for another host, or out of its
        // window, would only be refused by every member.
        if let Some(credential) = &credential {
            let file = cfg
                .certificate_path
                .as_ref()
                .map_or_else(String::new, |p| format!(" {}", p.display()));
            match credential
                .trust
                .check(&credential.certificate, &me, self.host.wall(now))
            {
                Ok(cert) => {
                    tracing::info!(namespace = %cfg.name, name = cert.name(), groups = ?cert.groups(), not_after = cert.not_after(), "certificate");
                    certificate = Some(cert);
                }
                Err(hyphae_overlay::cert::Refusal::OtherIdentity) => anyhow::bail!(
                    "namespace {}: certificate{file} is not for this host's identity {me} (`hyphae id` prints it; sign one for it)",
                    cfg.name
                ),
                Err(e) => anyhow::bail!("namespace {}: certificate{file}: {e}", cfg.name),
            }
        }
        // The certificate names this host and may pin its addresses.
        let certified;
        let cfg = match &certificate {
            Some(cert) => {
                certified = certificates::certified_config(cfg, cert)?;
                &certified
            }
            None => cfg,
        };
        // Locally administered, unicast: 0x02 in the first byte.
        let device_mac = setup::stable_mac([0x02, 0x48], &me, &cfg.name);
        let tap_name = crate::lan::tap_name(cfg);
        // Router and hybrid TAPs are bridge ports: their own MAC is never addressed.
        let tap_mac = match cfg.mode {
            Mode::Interface => device_mac,
            Mode::Router | Mode::Hybrid => setup::stable_mac([0x02, 0x49], &me, &cfg.name),
        };
        // Before any device: an IPv6 address outside the namespace's prefix is refused.
        let prefix6 = addresses::prefix6_of(cfg)?;
        // UDP datagrams are coalesced too where the TAP takes UDP segmentation offload.
        let host::Devices {
            tap,
            queues,
            offload,
            udp,
            lan,
        } = self.host.create(
            cfg,
            &tap_name,
            host::Macs {
                tap: tap_mac,
                device: device_mac,
            },
            self.offload,
            self.workers.len(),
        )?;
        let keys = NamespaceKeys::derive(&cfg.name, &cfg.secret);
        // Peers learn we are a member (and we which of them are) before anything is claimed.
        // An agent that leaves stays a proven member until it restarts: it still holds
        // the secret, and its releases must still reach the replicas.
        self.overlay.add_namespace(&keys, credential.clone());
        let tag = keys.tag();
        // Members hear of our address once it is won, static or not.
        // Members known before a restart still have tunnels with us that we forgot: a
        // hello makes them start fresh ones at once rather than after theirs time out. They
        // are dialled too, but not waited for (they may be gone).
        let remembered: Vec<SocketAddr> = setup::remembered_members(&self.state_dir, &cfg.name)
            .into_iter()
            .filter(|e| *e != self.listen && !cfg.peers.contains(e))
            .collect();
        for &endpoint in &remembered {
            self.overlay.dial(tcp_multiaddr(endpoint));
        }
        // A bootstrap agent is usually a member too: a tunnel with it gives every member
        // one it can relay through when two members cannot reach each other.
        let bootstrap = cfg
            .bootstrap
            .iter()
            .filter_map(tunnel_endpoint)
            .filter(|e| *e != self.listen && !cfg.peers.contains(e));
        let contacts: Vec<SocketAddr> = cfg
            .peers
            .iter()
            .copied()
            .chain(remembered)
            .chain(bootstrap)
            .collect();
        {
            let mut dp = lock(&self.dp);
            let id = dp.node.add_namespace(keys.clone(), Vec::new());
            dp.node.set_credential(id, credential);
            dp.node.set_wall(self.host.wall(now));
            if id.0 != self.namespaces.len() {
                bail!(
                    "internal: the node numbered namespace '{}' {}, not {}",
                    cfg.name,
                    id.0,
                    self.namespaces.len()
                );
            }
            for endpoint in contacts {
                dp.node.add_static_peer(id, endpoint, now);
            }
        }
        let previous = std::fs::read_to_string(setup::state_file(&self.state_dir, &cfg.name))
            .ok()
            .and_then(|t| t.trim().parse().ok());
        let mut membership = Membership::new(
            membership::Config {
                name: cfg.name.clone(),
                keys,
                subnet: cfg.subnet,
                subnets: cfg.subnets.clone(),
                reserved: cfg.reserved.clone(),
                address: cfg.address,
                lease: cfg.lease,
                hostname: cfg.hostname.clone(),
                previous,
                prefix6,
                address6: cfg.address6,
            },
            Identity::from_seed(self.identity.seed()),
            self.host.seed()?,
            now,
            self.host.wall(now),
        );
        membership.set_endpoints(now, self.endpoints());
        if certificate.is_some() {
            membership.set_certified_name(now, cfg.hostname.clone());
        }
        let mut dns = service::Service::new(cfg.resolvers.clone(), cfg.mtu, self.host.seed()?)
            .with_rate(cfg.dns_rate);
        dns.set_prefix6(prefix6);
        if let Some(subnet) = cfg.subnet {
            dns.set_zone(&cfg.name, subnet);
        }
        dns.set_routed(membership.routed().to_vec());
        let Some(handoffs) = migration::Handoffs::new(&me) else {
            bail!("internal: this agent's identity has no libp2p peer id");
        };
        let mut switch = Switch::new(hyphae_vswitch::Config {
            mode: cfg.mode,
            // The device has a static address from the start when the subnet is known
            // (see `create_tap`); any other is set once won.
            address: cfg
                .address
                .fixed()
                .filter(|_| cfg.subnet.is_some())
                .unwrap_or(Ipv4Addr::UNSPECIFIED),
            // Until the namespace record is read, nothing is in the subnet.
            subnet: cfg.subnet.unwrap_or(NO_SUBNET),
            routed: membership.routed().to_vec(),
            device_mac,
            remote_mac: match cfg.mode {
                Mode::Router => setup::router_remote_mac(&tag),
                Mode::Interface | Mode::Hybrid => self.remote_mac,
            },
            probe_timeout: cfg.probe_timeout,
            lan_timeout: cfg.lan_timeout,
            broadcast_rate: cfg.broadcast_rate,
            // A router's LAN hosts and a DHCP host get their addresses from the agent.
            dhcp: cfg.mode == Mode::Router || cfg.address == Address::Dhcp,
            tunnel_mtu: cfg.mtu,
            prefix6,
            address6: None,
            lan_ports: cfg.lan_ports,
            lan_table: cfg.lan_table.clone(),
        });
        switch.start(now);
        // Each worker reads and writes a queue of its own; the control thread writes
        // through the first, which worker 0 reads.
        let i = self.namespaces.len();
        for (link, queue) in self.workers.iter().zip(queues) {
            let command = Command::Tap {
                ns: i,
                queue,
                offload,
                udp,
            };
            if link.commands.try_send(command).is_err() {
                bail!("internal: a data-path worker does not take commands");
            }
        }
        let l2 = layer2::switch(cfg, device_mac, now);
        // The lane and the namespace take the same index, the node's id for it.
        let mut dp = lock(&self.dp);
        dp.lanes.push(Lane {
            name: cfg.name.clone(),
            mode: cfg.mode,
            switch,
            l2,
            active: true,
            offload,
            group: Vec::new(),
            group_wanted: false,
            grace: Vec::new(),
            tap_errors: 0,
            offload_counters: Default::default(),
            policy: policy::LanePolicy::new(
                lane_policy,
                policy_source,
                certificate.as_ref(),
                cfg.flows,
            ),
            egress: cfg.rate.map(|(bits, burst)| {
                hyphae_vswitch::qos::Pacer::new(bits, burst, hyphae_vswitch::qos::MAX_DELAY)
            }),
            caps: caps::LaneCaps::new(cfg.caps.clone()),
        });
        if cfg.layer2 {
            // Members' packets are frames from now on, even before a MAC is known.
            dp.node.set_macs(now, NamespaceId(i), Vec::new());
            dp.announce_macs(now, i);
        }
        if let Some(shares) = dp.shares.as_mut() {
            shares.set_weight(i, cfg.weight.unwrap_or(1));
        }
        drop(dp);
        self.namespaces.push(Joined {
            name: cfg.name.clone(),
            certificate,
            certificate_path: cfg.certificate_path.clone(),
            policy_path: cfg.policy_path.clone(),
            tag,
            device: cfg.device.clone(),
            link_routes: Vec::new(),
            mode: cfg.mode,
            bridge: cfg.bridge.clone(),
            lan,
            tap: Some(tap),
            offload,
            membership,
            handoffs,
            group: Vec::new(),
            mac_checks: Default::default(),
            dhcp: None,
            dhcp6: None,
            dhcp6_after_handoff: HashMap::new(),
            gateway: cfg.gateway,
            dns,
            live: false,
            error: None,
            remembered: Vec::new(),
        });
        self.apply_links(i);
        tracing::info!(namespace = %cfg.name, device = %cfg.device, address = ?cfg.address,
            subnet = ?cfg.subnet, peers = cfg.peers.len(), "namespace up");
        Ok(())
    }

    /// Whether the memberships run: the overlay was joined, or started alone.
    pub(crate) fn overlay_ready(&self) -> bool {
        self.overlay.is_ready()
    }

    /// The index of the namespace `name` this agent is a member of now.
    pub(crate) fn active(&self, name: &str) -> Option<usize> {
        self.namespaces
            .iter()
            .position(|n| n.name == name && n.active())
    }

    /// The earliest deadline of the control plane's cores (the data plane's is asked of it).
    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        // Asked every loop turn: no allocation.
        let namespaces = self.namespaces.iter().filter(|n| n.active()).flat_map(|n| {
            [
                n.membership.poll_timeout(),
                n.mac_checks.poll_timeout(),
                n.dhcp.as_ref().and_then(dhcp::Server::poll_timeout),
                n.dhcp6.as_ref().and_then(|s| s.poll_timeout()),
                n.dns.poll_timeout(),
                n.handoffs.poll_timeout(),
                n.lan.as_ref().and_then(crate::lan::Lan::poll_timeout),
            ]
        });
        std::iter::once(self.overlay.poll_timeout())
            .chain(namespaces)
            .chain(self.name_waiters.iter().map(|w| Some(w.deadline)))
            .flatten()
            .min()
    }

    /// Runs the timers of every core whose deadline has come: the data plane's (holding it
    /// for that alone), then the control plane's.
    pub(crate) fn handle_timeout(&mut self, now: Instant) {
        let due = |t: Option<Instant>| t.is_some_and(|t| t <= now);
        let tunnels = {
            let mut dp = lock(&self.dp);
            // Certificates are checked against the time of day.
            dp.node.set_wall(self.host.wall(now));
            dp.handle_timeout(now, &mut self.batch)
                .then(|| data::TunnelList::of(&dp.node))
        };
        if let Some(tunnels) = tunnels {
            // The node ticks while it has tunnels: note whom the source address reaches and
            // who is reachable, for a restart.
            if self.netwatch.is_some() {
                self.sources.track(tunnels.endpoints());
            }
            for i in 0..self.namespaces.len() {
                if self.namespaces[i].active() {
                    self.remember_members(i, &tunnels);
                }
            }
        }
        if due(self.overlay.poll_timeout()) {
            self.overlay.handle_timeout(now);
        }
        let unix = self.host.wall(now);
        for i in 0..self.namespaces.len() {
            let n = &mut self.namespaces[i];
            if !n.active() {
                continue;
            }
            if let Some(lan) = n.lan.as_mut() {
                lan.handle_timeout(now);
            }
            if due(n.dhcp.as_ref().and_then(dhcp::Server::poll_timeout)) {
                if let Some(server) = n.dhcp.as_mut() {
                    server.handle_timeout(now);
                }
                self.drain_dhcp(i, now);
            }
            self.dhcp6_timers(i, now);
            let n = &mut self.namespaces[i];
            if due(n.dns.poll_timeout()) {
                n.dns.handle_timeout(now, &services::HeldBy(&n.membership));
            }
            if due(n.membership.poll_timeout()) {
                n.membership.handle_timeout(now, unix);
            }
            // Read once the membership runs (before, no lookup finds the replicas).
            if n.membership.is_started() {
                n.mac_checks
                    .read_due(now, |mac| n.membership.read_mac_holder(mac));
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

    /// Carries out what the cores asked for until none asks for more: what the workers left
    /// in the inbox, frames that waited, the memberships' DHT operations and events, the
    /// DNS services' reads and answers.
    pub(crate) fn flush(&mut self, now: Instant) {
        // Bounded: a core whose deadline stayed in the past would otherwise spin here.
        for _ in 0..16 {
            let mut busy = self.take_inbox(now);
            busy |= self.replay(now);
            for i in 0..self.namespaces.len() {
                busy |= self.flush_namespace(i, now);
            }
            // Timers a core set to `now` while handling the above run at once.
            let data_due = lock(&self.dp).poll_timeout().is_some_and(|t| t <= now);
            if data_due || self.poll_timeout().is_some_and(|t| t <= now) {
                self.handle_timeout(now);
                busy = true;
            }
            if !busy {
                return;
            }
        }
        tracing::debug!("the cores still had work after 16 rounds; the next turn goes on");
    }

    /// Frames that waited for a member's addresses go through their switch again.
    fn replay(&mut self, now: Instant) -> bool {
        if self.replays.is_empty() {
            return false;
        }
        let replays = std::mem::take(&mut self.replays);
        let mut dp = lock(&self.dp);
        for (i, frames) in replays {
            if !dp.lanes.get(i).is_some_and(|l| l.active) {
                continue;
            }
            for mut frame in frames {
                dp.switch_frame(i, &mut frame, now, &mut self.batch);
            }
        }
        dp.drain_node(now, &mut self.batch);
        true
    }

    /// Carries out what this thread's turns left in its batch, with the data plane let go:
    /// datagrams to worker 0's outbox, frames to each namespace's first TAP queue.
    pub(crate) fn carry_out(&mut self) {
        self.batch.seal_pending(None);
        for (to, range) in &self.batch.sends {
            let datagram = self.batch.datagram(range).to_vec();
            if self.outbox.try_send((*to, datagram)).is_err() {
                self.outbox_drops += 1;
            }
        }
        let mut failed = Vec::new();
        for w in &self.batch.writes {
            let Some(n) = self.namespaces.get_mut(w.ns) else {
                continue;
            };
            let Some(tap) = n.tap.as_mut() else {
                continue;
            };
            if !tap.write(n.offload, self.batch.frame(&w.range)) {
                failed.push(w.ns);
            }
        }
        self.batch.clear();
        if !failed.is_empty() {
            let mut dp = lock(&self.dp);
            for i in failed {
                if let Some(lane) = dp.lanes.get_mut(i) {
                    lane.tap_errors += 1;
                }
            }
        }
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
}

/// Seconds since the Unix epoch: records carry expiry times on the wall clock.
#[allow(clippy::disallowed_methods)] // records carry wall-clock expiry times
pub(crate) fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
