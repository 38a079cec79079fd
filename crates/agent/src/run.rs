//! `hyphae up`: the agent's setup and its single event loop.
//!
//! One thread owns everything on the data path (the TAP devices, the underlay socket, the
//! switches and the tunnel node), so nothing is locked per packet. Readiness on a device or
//! the socket drains up to [`BATCH`] packets at once through preallocated buffers.

use std::future::poll_fn;
use std::io::{self, ErrorKind};
use std::net::SocketAddr;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::task::Poll;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use hyphae_dhcp_dns::dhcp;
use hyphae_overlay::node::TICK;
use hyphae_overlay::{
    DropReason as NodeDrop, Event, Identity, NamespaceId, NamespaceKeys, Node, PeerDropReason,
    PeerHandle, Received,
};
use hyphae_vswitch::{Action, DropReason as SwitchDrop, Switch, HEADROOM};
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader, Interest};
use tokio::net::UnixListener;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::{mpsc, oneshot};
use tun_rs::SyncDevice;

use hyphae_overlay::swarm::{
    tcp_multiaddr, tunnel_endpoint, Overlay, OverlayEvent, OverlayOptions,
};

use crate::config::{Address, Config, Mode, Namespace};
use crate::control::{
    self, NamespaceStatus, OverlayStatus, PeerStatus, RelayStatus, Request, Status, STATUS_VERSION,
};
use crate::membership::{ClaimOutcome, Membership};
use crate::underlay::Underlay;

/// Packets handled per readiness event before the loop looks at its other sources.
const BATCH: usize = 64;

/// Largest datagram or frame: the UDP maximum, with room for headers in front.
const BUF_LEN: usize = 65536 + 64;

/// Underlay socket buffers: room for a few milliseconds of traffic at 10 Gb/s.
const SOCKET_BUFFER: usize = 4 << 20;

/// The name of the identity key file in the state directory.
pub const IDENTITY_FILE: &str = "identity.key";

/// Runs the agent in the foreground until SIGTERM or SIGINT.
pub fn up(config: Config) -> Result<()> {
    require_net_admin()?;
    // Bind first: a failed start should leave nothing behind, not even a new identity.
    let socket = bind_underlay(config.agent.listen)?;
    let identity = load_or_create_identity(&config.agent.state_dir)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?;
    runtime.block_on(async move {
        let listener = bind_control(&config.agent.control_socket)?;
        let result = Agent::start(config.clone(), identity, socket)?
            .run(listener)
            .await;
        let _ = std::fs::remove_file(&config.agent.control_socket);
        result
    })
}

/// `CAP_NET_ADMIN` is what creating TAP devices and setting their addresses needs.
fn require_net_admin() -> Result<()> {
    const CAP_NET_ADMIN: u32 = 12;
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let eff = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .unwrap_or(0);
    if eff & (1 << CAP_NET_ADMIN) == 0 {
        bail!("hyphae up needs root (CAP_NET_ADMIN) to create TAP devices; run it with sudo");
    }
    Ok(())
}

/// Loads the identity key from the state directory, creating both on first start.
pub fn load_or_create_identity(state_dir: &Path) -> Result<Identity> {
    let path = state_dir.join(IDENTITY_FILE);
    match std::fs::read_to_string(&path) {
        Ok(text) => Identity::from_text(&text).with_context(|| {
            format!(
                "{} is not a hyphae identity key (move it away to create a new identity)",
                path.display()
            )
        }),
        Err(e) if e.kind() == ErrorKind::NotFound => {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(state_dir)
                .with_context(|| format!("cannot create state_dir {}", state_dir.display()))?;
            let identity = Identity::generate()?;
            let mut file = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&path)
                .with_context(|| format!("cannot create {}", path.display()))?;
            io::Write::write_all(&mut file, identity.to_text().as_bytes())?;
            tracing::info!(path = %path.display(), id = %identity.peer_id(), "created identity");
            Ok(identity)
        }
        Err(e) => Err(e).with_context(|| format!("cannot read {}", path.display())),
    }
}

fn bind_underlay(listen: SocketAddr) -> Result<std::net::UdpSocket> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(
        Domain::for_address(listen),
        Type::DGRAM,
        Some(Protocol::UDP),
    )?;
    // Best effort: the kernel caps these at net.core.{r,w}mem_max.
    let _ = socket.set_recv_buffer_size(SOCKET_BUFFER);
    let _ = socket.set_send_buffer_size(SOCKET_BUFFER);
    socket.bind(&listen.into()).map_err(|e| match e.kind() {
        ErrorKind::AddrInUse => anyhow::anyhow!(
            "listen address {listen} is already in use (another hyphae agent, or set [agent] listen)"
        ),
        ErrorKind::AddrNotAvailable => {
            anyhow::anyhow!("listen address {listen} is not an address of this host")
        }
        _ => anyhow::anyhow!("cannot listen on {listen}: {e}"),
    })?;
    socket.set_nonblocking(true)?;
    Ok(socket.into())
}

fn bind_control(path: &Path) -> Result<UnixListener> {
    if let Some(dir) = path.parent() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
    }
    if path.exists() {
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            bail!(
                "another hyphae agent is running: its control socket {} answers",
                path.display()
            );
        }
        // A stale socket from an agent that was killed.
        let _ = std::fs::remove_file(path);
    }
    let listener = UnixListener::bind(path)
        .with_context(|| format!("cannot create control socket {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(listener)
}

fn create_tap(ns: &Namespace, name: &str, mac: [u8; 6]) -> Result<SyncDevice> {
    let mut builder = tun_rs::DeviceBuilder::new()
        .name(name)
        .layer(tun_rs::Layer::L2)
        .mac_addr(mac)
        .mtu(ns.mtu)
        .enable(true);
    // An `auto` address is set once it is won; a static one once the subnet is known. Only
    // an interface-mode TAP carries the address (router: none; hybrid: the veth does).
    if let (Mode::Interface, Address::Static(a), Some(subnet)) = (ns.mode, ns.address, ns.subnet) {
        builder = builder.ipv4(a, subnet.prefix_len(), None);
    }
    let device = builder.build_sync().map_err(|e| match e.raw_os_error() {
        Some(libc::EBUSY) | Some(libc::EEXIST) => anyhow::anyhow!(
            "namespace '{}': device {name} already exists and is in use; pick another `device`",
            ns.name,
        ),
        _ => anyhow::anyhow!("namespace '{}': cannot create TAP {name}: {e}", ns.name),
    })?;
    // The overlay carries IPv4; keep the kernel's IPv6 chatter (router solicitations, DAD)
    // off the device. Best effort: IPv6 may be disabled host-wide already.
    let _ = std::fs::write(format!("/proc/sys/net/ipv6/conf/{name}/disable_ipv6"), "1");
    device
        .set_nonblocking(true)
        .context("setting the TAP non-blocking")?;
    Ok(device)
}

/// A MAC that stays the same across restarts (LAN hosts' ARP caches stay right) and differs
/// between agents: `first` plus four bytes of a hash of the agent's identity and `label`.
fn stable_mac(first: [u8; 2], id: &hyphae_overlay::PeerId, label: &str) -> [u8; 6] {
    use blake2::{Blake2s256, Digest};
    let h = Blake2s256::new()
        .chain_update(id.as_bytes())
        .chain_update(label.as_bytes())
        .finalize();
    [first[0], first[1], h[0], h[1], h[2], h[3]]
}

/// The subnet of a namespace whose record has not been read yet: holds no address.
const NO_SUBNET: ipnet::Ipv4Net = match ipnet::Ipv4Net::new(std::net::Ipv4Addr::UNSPECIFIED, 32) {
    Ok(n) => n,
    Err(_) => panic!("a /32 is a valid prefix"),
};

struct Port {
    name: String,
    device: String,
    mode: Mode,
    /// Router and hybrid modes: the LAN bridge, and the links this namespace set up.
    bridge: Option<String>,
    lan: Option<crate::lan::Lan>,
    /// Members of the namespace's broadcast group (read from the DHT).
    group: Vec<hyphae_overlay::PeerId>,
    /// The virtual DHCP server (router mode, or `address = "dhcp"`), once the subnet is known.
    dhcp: Option<dhcp::Server>,
    /// The default gateway DHCP hands out, if configured.
    gateway: Option<std::net::Ipv4Addr>,
    /// The virtual DNS server.
    dns: crate::dns::Dns,
    switch: Switch<PeerHandle>,
    tap_errors: u64,
    /// Joined while running (`hyphae join`): a conflict leaves it instead of stopping.
    live: bool,
    /// Why it was left, if it failed.
    error: Option<String>,
}

struct Agent {
    config_path: PathBuf,
    state_dir: PathBuf,
    listen: SocketAddr,
    remote_mac: [u8; 6],
    identity: Identity,
    overlay: Overlay,
    members: Vec<Membership>,
    /// Why the agent must stop (a static address owned by another member).
    fatal: Option<String>,
    node: Node,
    ports: Vec<Port>,
    /// One per namespace ever joined; `None` once left.
    taps: Vec<Option<AsyncFd<SyncDevice>>>,
    underlay: Underlay,
    rx: Vec<u8>,
    tx: Vec<u8>,
    reply: Vec<u8>,
    /// Frames whose address resolved, to go through their switch again.
    replays: Vec<(usize, Vec<Vec<u8>>)>,
    /// Where DHCP replies, DNS answers and service-stack packets are framed.
    dhcp_buf: Vec<u8>,
    /// Queries forwarded to the namespaces' resolvers leave and come back here.
    resolver_socket: Option<tokio::net::UdpSocket>,
    /// `hyphae name set` calls waiting for their claim.
    name_waiters: Vec<NameWaiter>,
}

/// A `hyphae name set` waiting for its claim.
struct NameWaiter {
    ns: usize,
    name: String,
    /// The name before, restored if the new one is another member's.
    previous: Option<String>,
    reply: oneshot::Sender<Result<String, String>>,
    deadline: Instant,
}

/// A control request handed to the agent's loop.
enum Call {
    Status(oneshot::Sender<Status>),
    Join(String, oneshot::Sender<Result<(), String>>),
    Leave(String, oneshot::Sender<Result<usize, String>>),
    SetName(
        String,
        Option<String>,
        oneshot::Sender<Result<String, String>>,
    ),
}

impl Agent {
    fn start(config: Config, identity: Identity, socket: std::net::UdpSocket) -> Result<Self> {
        let bootstrap: Vec<_> = config
            .namespaces
            .iter()
            .flat_map(|n| n.bootstrap.iter().cloned())
            .collect();
        let options = OverlayOptions {
            mdns: config.agent.mdns,
            ..OverlayOptions::default()
        };
        let overlay = Overlay::new(
            &identity,
            tcp_multiaddr(config.agent.listen),
            bootstrap,
            options,
        )
        .map_err(|e| anyhow::anyhow!("{e}"))?;
        let own = Identity::from_seed(identity.seed());
        // The node's randomness (relay session ids) is an input; the agent draws it here.
        let mut node_seed = [0u8; 32];
        getrandom::getrandom(&mut node_seed)
            .map_err(|e| anyhow::anyhow!("random seed for the tunnel node: {e}"))?;
        let node = Node::new(identity, node_seed);
        let underlay = Underlay::new(socket)?;
        let mut agent = Self {
            config_path: config.path.clone(),
            state_dir: config.agent.state_dir.clone(),
            listen: config.agent.listen,
            // IPOP 4.1: one FE:FD MAC per agent stands for every remote member; hybrid
            // agents sharing a LAN each have their own.
            remote_mac: stable_mac(hyphae_vswitch::REMOTE_MAC_PREFIX, &own.peer_id(), "remote"),
            identity: own,
            overlay,
            members: Vec::new(),
            fatal: None,
            node,
            ports: Vec::new(),
            taps: Vec::new(),
            underlay,
            rx: vec![0; BUF_LEN],
            tx: vec![0; BUF_LEN],
            reply: vec![0; hyphae_vswitch::MIN_REPLY_BUF],
            replays: Vec::new(),
            dhcp_buf: vec![0; BUF_LEN],
            resolver_socket: None,
            name_waiters: Vec::new(),
        };
        if config.namespaces.iter().any(|n| !n.resolvers.is_empty()) {
            agent.resolver_socket = Some(bind_resolver_socket()?);
        }
        for ns in &config.namespaces {
            agent.add_namespace(ns, Instant::now())?;
        }
        if config.namespaces.is_empty() {
            tracing::warn!("no [[namespace]] in the config: the agent has nothing to carry");
        }
        tracing::info!(id = %agent.node.peer_id(), listen = %config.agent.listen, "agent started");
        Ok(agent)
    }

    /// Creates the namespace's TAP, tunnels, switch and DHT state.
    fn add_namespace(&mut self, ns: &Namespace, now: Instant) -> Result<()> {
        // Locally administered, unicast: 0x02 in the first byte.
        let device_mac = stable_mac([0x02, 0x48], &self.identity.peer_id(), &ns.name);
        let tap_name = crate::lan::tap_name(ns);
        // Router and hybrid TAPs are bridge ports: their own MAC is never addressed.
        let tap_mac = match ns.mode {
            Mode::Interface => device_mac,
            Mode::Router | Mode::Hybrid => {
                stable_mac([0x02, 0x49], &self.identity.peer_id(), &ns.name)
            }
        };
        let tap = create_tap(ns, &tap_name, tap_mac)?;
        let lan = match ns.mode {
            Mode::Interface => None,
            Mode::Router | Mode::Hybrid => Some(crate::lan::attach(ns, &tap_name, device_mac)?),
        };
        if let (Mode::Hybrid, Address::Static(a), Some(subnet)) = (ns.mode, ns.address, ns.subnet) {
            crate::lan::set_address(&ns.device, a, subnet.prefix_len())?;
        }
        // SAFETY: the SyncDevice owns its fd and moves into the AsyncFd, which keeps it
        // open for as long as it is registered.
        let tap = unsafe { AsyncFd::register(tap) }
            .map_err(|e| anyhow::anyhow!("registering the TAP: {e}"))?;
        // Members hear of our address once it is won, static or not.
        let id = self
            .node
            .add_namespace(NamespaceKeys::derive(&ns.name, &ns.secret), Vec::new());
        debug_assert_eq!(id.0, self.ports.len());
        self.taps.push(Some(tap));
        self.members.push(Membership::new(ns, &self.state_dir));
        for &peer in &ns.peers {
            self.node.add_static_peer(id, peer, now);
        }
        // A bootstrap agent is usually a member too: a tunnel with it gives every member
        // one it can relay through when two members cannot reach each other.
        for endpoint in ns.bootstrap.iter().filter_map(tunnel_endpoint) {
            if endpoint != self.listen && !ns.peers.contains(&endpoint) {
                self.node.add_static_peer(id, endpoint, now);
            }
        }
        self.ports.push(Port {
            name: ns.name.clone(),
            device: ns.device.clone(),
            mode: ns.mode,
            bridge: ns.bridge.clone(),
            lan,
            group: Vec::new(),
            switch: Switch::new(hyphae_vswitch::Config {
                mode: ns.mode,
                // The device has a static address from the start when the subnet is known
                // (see `create_tap`); any other is set once won.
                address: ns
                    .address
                    .fixed()
                    .filter(|_| ns.subnet.is_some())
                    .unwrap_or(std::net::Ipv4Addr::UNSPECIFIED),
                // Until the namespace record is read, nothing is in the subnet.
                subnet: ns.subnet.unwrap_or(NO_SUBNET),
                device_mac,
                remote_mac: self.remote_mac,
                probe_timeout: ns.probe_timeout,
                lan_timeout: ns.lan_timeout,
                broadcast_rate: ns.broadcast_rate,
                // A router's LAN hosts and a DHCP host get their addresses from the agent.
                dhcp: ns.mode == Mode::Router || ns.address == Address::Dhcp,
            }),
            dhcp: None,
            gateway: ns.gateway,
            dns: crate::dns::Dns::new(ns.resolvers.clone(), ns.mtu),
            tap_errors: 0,
            live: false,
            error: None,
        });
        tracing::info!(namespace = %ns.name, device = %ns.device, address = ?ns.address,
            subnet = ?ns.subnet, peers = ns.peers.len(), "namespace up");
        Ok(())
    }

    /// `hyphae join`: the namespace `name` was added to the config file; bring it up.
    fn join(&mut self, name: &str, now: Instant) -> Result<(), String> {
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
                self.ports[i].device
            ));
        }
        if let Some(p) = self
            .ports
            .iter()
            .zip(&self.taps)
            .find(|(p, t)| t.is_some() && p.device == ns.device)
        {
            return Err(format!(
                "device {} is already used by namespace '{}'",
                ns.device, p.0.name
            ));
        }
        if !ns.resolvers.is_empty() && self.resolver_socket.is_none() {
            self.resolver_socket = Some(bind_resolver_socket().map_err(|e| format!("{e:#}"))?);
        }
        self.add_namespace(ns, now).map_err(|e| format!("{e:#}"))?;
        if let Some(port) = self.ports.last_mut() {
            port.live = true;
        }
        for addr in &ns.bootstrap {
            self.overlay.dial(addr.clone());
        }
        if self.overlay.is_joined() {
            if let Some(m) = self.members.last_mut() {
                m.start(now);
            }
            self.run_claims(now);
        }
        Ok(())
    }

    /// The index of the namespace `name` this agent is a member of now.
    fn active(&self, name: &str) -> Option<usize> {
        (0..self.ports.len()).find(|&i| self.ports[i].name == name && self.taps[i].is_some())
    }

    /// `hyphae leave`: release the namespace's addresses, drop its tunnels and its TAP.
    fn leave(&mut self, name: &str) -> Result<usize, String> {
        let Some(i) = self.active(name) else {
            return Err(format!("not a member of '{name}'"));
        };
        Ok(self.drop_namespace(i))
    }

    fn drop_namespace(&mut self, i: usize) -> usize {
        let released = self.members[i].leave(&mut self.overlay);
        self.node.remove_namespace(Instant::now(), NamespaceId(i));
        // Dropping the TAP removes the device (and the hybrid veth goes with its links).
        self.taps[i] = None;
        self.ports[i].lan = None;
        self.ports[i].group.clear();
        tracing::info!(namespace = %self.ports[i].name, "namespace left");
        released
    }

    async fn run(mut self, listener: UnixListener) -> Result<()> {
        let (ctl_tx, mut ctl_rx) = mpsc::channel::<Call>(16);
        tokio::spawn(serve_control(listener, ctl_tx));
        let mut sigterm = signal(SignalKind::terminate())?;
        let mut sigint = signal(SignalKind::interrupt())?;
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = sigterm.recv() => break,
                _ = sigint.recv() => break,
                ready = self.underlay.readable() => {
                    ready?;
                    self.drain_underlay().await;
                    // A router asks its LAN for hosts members sent to: send the probes now.
                    for i in 0..self.ports.len() {
                        if self.ports[i].mode == Mode::Router && self.taps[i].is_some() {
                            self.flush_switch(i, Instant::now());
                        }
                    }
                }
                i = any_readable(&self.taps) => self.drain_tap(i).await,
                event = self.overlay.next_event() => self.handle_overlay(event),
                Some((len, from)) = recv_resolver(self.resolver_socket.as_ref(), &mut self.dhcp_buf) => {
                    self.resolver_answer(len, from);
                }
                _ = tick.tick() => self.handle_timeout(Instant::now()),
                Some(call) = ctl_rx.recv() => match call {
                    Call::Status(reply) => {
                        let _ = reply.send(self.status());
                    }
                    Call::Join(name, reply) => {
                        let _ = reply.send(self.join(&name, Instant::now()));
                    }
                    Call::Leave(name, reply) => {
                        let _ = reply.send(self.leave(&name));
                    }
                    Call::SetName(ns, name, reply) => self.set_name(&ns, name, reply),
                },
            }
            self.flush_node().await;
            if let Some(reason) = self.fatal.take() {
                bail!(reason);
            }
        }
        self.release_addresses().await;
        tracing::info!("stopping: removing devices");
        Ok(())
    }

    fn handle_timeout(&mut self, now: Instant) {
        self.node.handle_timeout(now);
        self.overlay.handle_timeout(now);
        for i in 0..self.ports.len() {
            if self.taps[i].is_some() {
                self.ports[i].switch.handle_timeout(now);
                self.flush_switch(i, now);
                if let Some(server) = self.ports[i].dhcp.as_mut() {
                    server.handle_timeout(now);
                    self.drain_dhcp(i, now);
                }
                self.ports[i]
                    .dns
                    .handle_timeout(now, &self.members[i], &mut self.overlay);
                self.flush_dns(i);
            }
        }
        // `hyphae name set` calls whose claim has not been decided yet.
        let (late, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut self.name_waiters)
            .into_iter()
            .partition(|w| now >= w.deadline);
        self.name_waiters = waiting;
        for w in late {
            let _ = w.reply.send(Ok(format!(
                "name '{}' set; its claim is still running (see `hyphae status`)",
                w.name
            )));
        }
        self.run_claims(now);
        for m in &mut self.members {
            m.expire_pending(now);
        }
    }

    /// Writes what switch `i` wants on its TAP (ARP probes and deferred replies) and acts
    /// on what it learned about the LAN (router mode: claim or release LAN hosts).
    fn flush_switch(&mut self, i: usize, now: Instant) {
        let port = &mut self.ports[i];
        while let Some(len) = port.switch.poll_transmit(&mut self.reply) {
            let sent = self.taps[i]
                .as_ref()
                .is_some_and(|t| t.get_ref().send(&self.reply[..len]).is_ok());
            if !sent {
                port.tap_errors += 1;
            }
        }
        let (mut changed, mut found) = (false, false);
        while let Some(event) = port.switch.poll_event() {
            match event {
                hyphae_vswitch::Event::LanHostUp(a) => {
                    self.members[i].add_hosted(a, now);
                    found = true;
                }
                hyphae_vswitch::Event::LanHostDown(a) => {
                    changed |= self.members[i].remove_hosted(a, &mut self.overlay);
                }
            }
        }
        if changed {
            self.node
                .set_addresses(now, NamespaceId(i), self.members[i].addresses());
        }
        if found {
            // Newly seen LAN hosts are claimed at once.
            let endpoints = self.endpoints();
            self.members[i].handle_timeout(now, &mut self.overlay, &self.identity, &endpoints);
        }
    }

    /// A DHCP request from the host or the LAN, for the namespace's virtual DHCP server.
    fn handle_dhcp(&mut self, i: usize, payload: &[u8], now: Instant) {
        let m = &self.members[i];
        let Some(subnet) = m.subnet else {
            return; // The namespace record is not read yet: the client will retry.
        };
        let settings = dhcp::Settings {
            subnet,
            server: hyphae_vswitch::service_address(subnet),
            dns: vec![hyphae_vswitch::service_address(subnet)],
            domain: m.name.clone(),
            // A gateway checked against a configured subnet may not fit the one the
            // namespace record says: then none.
            router: self.ports[i]
                .gateway
                .filter(|g| crate::config::check_in_subnet(*g, subnet).is_ok()),
            lease: m.lease(),
        };
        self.ports[i]
            .dhcp
            .get_or_insert_with(|| dhcp::Server::new(settings))
            .handle(payload, now);
        self.drain_dhcp(i, now);
    }

    /// Carries out what the DHCP server of namespace `i` asks: replies to the device,
    /// claims and releases in the DHT.
    fn drain_dhcp(&mut self, i: usize, now: Instant) {
        while let Some(output) = self.ports[i]
            .dhcp
            .as_mut()
            .and_then(dhcp::Server::poll_output)
        {
            match output {
                dhcp::Output::Reply(r) => {
                    let port = &mut self.ports[i];
                    let mac = if r.broadcast { [0xff; 6] } else { r.chaddr };
                    let Some(len) =
                        port.switch
                            .emit_dhcp_reply(&mut self.dhcp_buf, mac, r.dst, &r.bytes)
                    else {
                        continue;
                    };
                    let sent = self.taps[i]
                        .as_ref()
                        .is_some_and(|t| t.get_ref().send(&self.dhcp_buf[..len]).is_ok());
                    if !sent {
                        port.tap_errors += 1;
                    }
                }
                dhcp::Output::Claim {
                    client,
                    hint,
                    exact,
                } => self.claim_for_dhcp(i, client, hint, exact, now),
                dhcp::Output::Release(address) => {
                    if self.members[i].release_dhcp(address, &mut self.overlay) {
                        if self.ports[i].switch.config().address == address {
                            self.ports[i]
                                .switch
                                .set_address(std::net::Ipv4Addr::UNSPECIFIED);
                        }
                        self.node
                            .set_addresses(now, NamespaceId(i), self.members[i].addresses());
                    }
                }
                // The DHT lease is renewed while the client holds the address.
                dhcp::Output::Renew(_) => {}
                dhcp::Output::Hostname { address, name } => {
                    self.members[i].name_client(address, name, now, &mut self.overlay);
                }
            }
        }
    }

    fn claim_for_dhcp(
        &mut self,
        i: usize,
        client: dhcp::ClientId,
        hint: Option<std::net::Ipv4Addr>,
        exact: bool,
        now: Instant,
    ) {
        let endpoints = self.endpoints();
        if let Some(ClaimOutcome::Dhcp(client, address)) = self.members[i].claim_for_dhcp(
            client,
            hint,
            exact,
            &mut self.overlay,
            &self.identity,
            &endpoints,
        ) {
            self.dhcp_claimed(i, client, address, now);
        }
    }

    /// The DHT decided a DHCP client's claim: the reply that waited goes out.
    fn dhcp_claimed(
        &mut self,
        i: usize,
        client: dhcp::ClientId,
        address: Option<std::net::Ipv4Addr>,
        now: Instant,
    ) {
        let Some(server) = self.ports[i].dhcp.as_mut() else {
            return;
        };
        match address {
            Some(a) => {
                server.allocated(&client, a, now);
                if self.members[i].host_uses_dhcp() {
                    // The host's DHCP client configures the device; the switch and the
                    // tunnels learn the address now.
                    self.ports[i].switch.set_address(a);
                }
                self.node
                    .set_addresses(now, NamespaceId(i), self.members[i].addresses());
            }
            None => server.refused(&client),
        }
        self.drain_dhcp(i, now);
    }

    /// Sends what the DNS server of namespace `i` queued: UDP answers and service-stack
    /// packets to the device, queries to the resolvers.
    fn flush_dns(&mut self, i: usize) {
        let port = &mut self.ports[i];
        let tap = self.taps[i].as_ref();
        let mut write = |frame: &[u8]| {
            if tap.is_none_or(|t| t.get_ref().send(frame).is_err()) {
                port.tap_errors += 1;
            }
        };
        while let Some((client, answer)) = port.dns.poll_udp_answer() {
            if let Some(len) = port
                .switch
                .emit_dns_reply(&mut self.dhcp_buf, client, &answer)
            {
                write(&self.dhcp_buf[..len]);
            }
        }
        while let Some((mac, packet)) = port.dns.poll_service_packet() {
            if let Some(len) = port
                .switch
                .emit_service_packet(&mut self.dhcp_buf, mac, &packet)
            {
                write(&self.dhcp_buf[..len]);
            }
        }
        while let Some((to, query)) = port.dns.poll_resolver_datagram() {
            let sent = self
                .resolver_socket
                .as_ref()
                .is_some_and(|s| s.try_send_to(&query, resolver_target(s, to)).is_ok());
            if !sent {
                tracing::debug!(resolver = %to, "cannot send a query to the resolver");
            }
        }
    }

    /// An answer on the forwarding socket: to the namespace whose query it answers.
    fn resolver_answer(&mut self, len: usize, from: SocketAddr) {
        let now = Instant::now();
        let answer = self.dhcp_buf[..len].to_vec();
        for i in 0..self.ports.len() {
            if self.taps[i].is_some() && self.ports[i].dns.resolver_answer(from, &answer, now) {
                self.flush_dns(i);
                return;
            }
        }
        tracing::debug!(%from, "unexpected datagram on the resolver socket");
    }

    /// `hyphae name set`: names this member's own address in namespace `ns`.
    fn set_name(
        &mut self,
        ns: &str,
        name: Option<String>,
        reply: oneshot::Sender<Result<String, String>>,
    ) {
        let Some(i) = self.active(ns) else {
            let _ = reply.send(Err(format!("not a member of '{ns}'")));
            return;
        };
        if self.ports[i].mode == Mode::Router {
            let _ = reply.send(Err(format!(
                "namespace '{ns}' is in router mode: it has no address of its own to name"
            )));
            return;
        }
        let name = match name
            .map(|n| hyphae_dhcp_dns::dns::host_name(&n))
            .transpose()
        {
            Ok(name) => name,
            Err(e) => {
                let _ = reply.send(Err(e));
                return;
            }
        };
        if self.name_waiters.iter().any(|w| w.ns == i) {
            let _ = reply.send(Err(format!(
                "namespace '{ns}': another `hyphae name set` is still waiting for its claim"
            )));
            return;
        }
        let now = Instant::now();
        let m = &mut self.members[i];
        if let (Some(name), Some(owned)) = (&name, m.owned) {
            if m.address_for(name) == Some(owned) {
                let _ = reply.send(Ok(format!("{name}.{ns} is {owned}")));
                return;
            }
        }
        let previous = m.hostname.clone();
        m.set_hostname(name.clone(), now, &mut self.overlay);
        match (name, m.owned) {
            (None, _) => {
                let _ = reply.send(Ok(format!("namespace '{ns}': name cleared")));
            }
            (Some(name), None) => {
                let _ = reply.send(Ok(format!(
                    "name '{name}.{ns}' set; it is claimed once this member holds its address"
                )));
            }
            (Some(name), Some(_)) => {
                self.name_waiters.push(NameWaiter {
                    ns: i,
                    name,
                    previous,
                    reply,
                    deadline: now + std::time::Duration::from_secs(4),
                });
                self.run_claims(now);
            }
        }
    }

    /// A name claim ended: answer the `hyphae name set` waiting for it, if any.
    fn name_claimed(&mut self, i: usize, name: &str, result: Result<(), String>) {
        let (done, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut self.name_waiters)
            .into_iter()
            .partition(|w| w.ns == i && w.name == name);
        self.name_waiters = waiting;
        let address = self.members[i].address_for(name);
        for w in done {
            let answer = match (&result, address) {
                (Ok(()), Some(a)) => Ok(format!("{name}.{} is {a}", self.ports[i].name)),
                (Ok(()), None) => Ok(format!("name '{name}' claimed")),
                (Err(e), _) => {
                    // The name is another member's: keep the one we had.
                    self.members[i].set_hostname(w.previous, Instant::now(), &mut self.overlay);
                    Err(e.clone())
                }
            };
            let _ = w.reply.send(answer);
        }
    }

    /// A broadcast or multicast packet from the host or the LAN: to every member of the
    /// namespace's group.
    async fn broadcast(&mut self, i: usize, packet: &[u8], now: Instant) {
        if self.ports[i].group.is_empty() {
            self.members[i].refresh_group_soon(now);
        }
        for k in 0..self.ports[i].group.len() {
            let id = self.ports[i].group[k];
            let Some(handle) = self.node.member_handle(NamespaceId(i), id) else {
                continue;
            };
            if let Some(t) = self.node.send(handle, packet, &mut self.tx) {
                self.underlay.push(t.to, &self.tx[t.range]).await;
            }
        }
    }

    /// Starts the address claims and renewals that are due.
    fn run_claims(&mut self, now: Instant) {
        let endpoints = self.endpoints();
        for m in &mut self.members {
            m.handle_timeout(now, &mut self.overlay, &self.identity, &endpoints);
        }
    }

    /// Where members reach this agent's tunnels: its listen address, or (listening on all
    /// addresses) every address the overlay listens on, with the tunnel port.
    fn endpoints(&self) -> Vec<SocketAddr> {
        if !self.listen.ip().is_unspecified() {
            return vec![self.listen];
        }
        self.overlay
            .listen_ips()
            .into_iter()
            .map(|ip| SocketAddr::new(ip, self.listen.port()))
            .collect()
    }

    fn handle_overlay(&mut self, event: OverlayEvent) {
        let now = Instant::now();
        match event {
            OverlayEvent::Joined => {
                for m in &mut self.members {
                    m.start(now);
                }
                self.run_claims(now);
            }
            OverlayEvent::Claimed { op, result, .. } => {
                for i in 0..self.members.len() {
                    match self.members[i].claimed(op, &result, now, &mut self.overlay) {
                        None | Some(ClaimOutcome::Nothing) => {}
                        Some(ClaimOutcome::Hosted) => self.node.set_addresses(
                            now,
                            NamespaceId(i),
                            self.members[i].addresses(),
                        ),
                        Some(ClaimOutcome::Won(address)) => self.set_address(i, address, now),
                        Some(ClaimOutcome::Dhcp(client, address)) => {
                            self.dhcp_claimed(i, client, address, now);
                        }
                        Some(ClaimOutcome::DhcpRetry(client)) => {
                            self.claim_for_dhcp(i, client, None, false, now);
                        }
                        Some(ClaimOutcome::Conflict(reason)) => self.conflict(i, reason),
                        Some(ClaimOutcome::Name(name, result)) => {
                            self.name_claimed(i, &name, result)
                        }
                    }
                }
                // An `auto` claim that lost tries the next address at once.
                self.run_claims(now);
            }
            OverlayEvent::Got { op, envelopes, .. } => {
                let me = self.node.peer_id();
                for i in 0..self.members.len() {
                    if self.ports[i].dns.got(
                        op,
                        &envelopes,
                        now,
                        &self.members[i],
                        &mut self.overlay,
                    ) {
                        self.flush_dns(i);
                        continue;
                    }
                    let Some(found) = self.members[i].got(op, &envelopes, me, now) else {
                        continue;
                    };
                    let Some(r) = found else {
                        continue;
                    };
                    let Some(&endpoint) = r.endpoints.first() else {
                        continue;
                    };
                    tracing::debug!(namespace = %self.members[i].name, target = %r.target,
                        member = ?r.member, %endpoint, "resolved");
                    match self
                        .node
                        .add_member(now, NamespaceId(i), r.member, endpoint)
                    {
                        // The owner's signed lease is the route until its announcement
                        // arrives (a router that restarted has announced nothing yet);
                        // the frames that waited go out with either.
                        Ok(handle) => {
                            self.ports[i].switch.add_route(r.target, handle);
                            let frames = self.members[i].take_pending(&[r.target]);
                            if !frames.is_empty() {
                                self.replays.push((i, frames));
                            }
                            self.node.repeat_addresses(NamespaceId(i), Some(handle));
                        }
                        Err(reason) => {
                            tracing::debug!(reason = reason.as_str(), "cannot open a tunnel");
                        }
                    }
                }
            }
            OverlayEvent::Members { op, envelopes, .. } => {
                let me = self.node.peer_id();
                for i in 0..self.members.len() {
                    let Some(found) = self.members[i].group_members(op, &envelopes, me, now) else {
                        continue;
                    };
                    // A tunnel with every member, so a broadcast reaches them all.
                    for &(member, endpoint) in &found {
                        if self.node.member_handle(NamespaceId(i), member).is_none() {
                            let _ = self.node.add_member(now, NamespaceId(i), member, endpoint);
                        }
                    }
                    self.ports[i].group = found.into_iter().map(|(m, _)| m).collect();
                }
            }
            OverlayEvent::NewPeer => {
                for m in &mut self.members {
                    m.renew_soon(now);
                }
            }
            OverlayEvent::Listening { .. }
            | OverlayEvent::Released { .. }
            | OverlayEvent::Announced { .. } => {}
        }
        self.apply_settings();
    }

    /// What the namespace records said: learned subnets go to the switches; a conflict
    /// stops the agent.
    fn apply_settings(&mut self) {
        for i in 0..self.members.len() {
            if let Some(reason) = self.members[i].conflict.take() {
                self.conflict(i, reason);
            }
            if std::mem::take(&mut self.members[i].subnet_learned) {
                if let Some(subnet) = self.members[i].subnet {
                    self.ports[i].switch.set_subnet(subnet);
                    // Members announced before the subnet was known: route them now.
                    self.node.repeat_addresses(NamespaceId(i), None);
                }
            }
        }
    }

    /// Namespace `i` cannot be joined as configured: one joined with `hyphae join` is left
    /// (the error shows in its status); one from the config at start stops the agent.
    fn conflict(&mut self, i: usize, reason: String) {
        if self.ports[i].live {
            tracing::error!(namespace = %self.ports[i].name, "{reason}");
            self.drop_namespace(i);
            self.ports[i].error = Some(reason);
        } else {
            self.fatal = Some(reason);
        }
    }

    /// Gives this member's address to the device, the switch and the tunnels.
    fn set_address(&mut self, i: usize, address: std::net::Ipv4Addr, now: Instant) {
        let port = &mut self.ports[i];
        if port.switch.config().address != address {
            let prefix = port.switch.config().subnet.prefix_len();
            let result = match port.mode {
                Mode::Hybrid => crate::lan::set_address(&port.device, address, prefix),
                Mode::Interface | Mode::Router => match self.taps[i].as_ref() {
                    Some(t) => t
                        .get_ref()
                        .set_network_address(address, prefix, None)
                        .map_err(anyhow::Error::from),
                    None => Ok(()),
                },
            };
            if let Err(e) = result {
                tracing::error!(device = %port.device, error = %e, "cannot set the address");
            }
            port.switch.set_address(address);
        }
        self.node
            .set_addresses(now, NamespaceId(i), self.members[i].addresses());
    }

    /// On the way out: give our addresses back so others can take them now, not after
    /// the lease (waits at most a few seconds for the replicas).
    async fn release_addresses(&mut self) {
        let mut waiting = 0;
        for m in &self.members {
            for a in m.addresses() {
                self.overlay.release(m.keys.address_key(a));
                waiting += 1;
            }
            for (name, _) in m.held_names() {
                self.overlay.release(m.keys.name_key(&name));
                waiting += 1;
            }
        }
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(3);
        let mut tick = tokio::time::interval(TICK);
        while waiting > 0 {
            tokio::select! {
                event = self.overlay.next_event() => {
                    if let OverlayEvent::Released { .. } = event {
                        waiting -= 1;
                    }
                }
                _ = tick.tick() => self.overlay.handle_timeout(Instant::now()),
                _ = tokio::time::sleep_until(deadline) => break,
            }
        }
    }

    /// Datagrams from the underlay: decrypt, check, switch, write to the TAP.
    async fn drain_underlay(&mut self) {
        for _ in 0..BATCH {
            match self.underlay.try_recv() {
                Ok(true) => {}
                Ok(false) => return,
                Err(e) => {
                    tracing::debug!(error = %e, "underlay receive error");
                    return;
                }
            }
            let now = Instant::now();
            for d in self.underlay.datagrams() {
                let received =
                    self.node
                        .handle_datagram(now, d.from, d.bytes, &mut self.tx[HEADROOM..]);
                match received {
                    Received::Deliver { ns, len, .. } => {
                        let Some(port) = self.ports.get_mut(ns.0) else {
                            continue;
                        };
                        if let Action::ToTap { len } =
                            port.switch.handle_peer_packet(&mut self.tx, len, now)
                        {
                            let Some(tap) = self.taps.get(ns.0).and_then(Option::as_ref) else {
                                continue;
                            };
                            if tap.get_ref().send(&self.tx[..len]).is_err() {
                                port.tap_errors += 1;
                            }
                        }
                    }
                    Received::Dropped(reason) => {
                        tracing::trace!(from = %d.from, reason = reason.as_str(), "datagram dropped");
                    }
                    Received::PeerDropped(_, reason) => {
                        tracing::trace!(from = %d.from, reason = reason.as_str(), "tunnel packet dropped");
                    }
                    Received::Consumed => {}
                }
            }
        }
    }

    /// Frames from a TAP: switch, encrypt, send to the member (or answer ARP). Datagrams
    /// to one member leave in GSO batches.
    async fn drain_tap(&mut self, i: usize) {
        // The receive buffer leaves `self` for the batch, so frames can be switched by a
        // method that borrows the rest of the agent.
        let mut rx = std::mem::take(&mut self.rx);
        // One clock reading per batch: the switch needs it only for timers and rates.
        let now = Instant::now();
        for _ in 0..BATCH {
            // try_io clears the readiness only when the device reports WouldBlock.
            let Some(tap) = self.taps.get(i).and_then(Option::as_ref) else {
                break;
            };
            let n = match tap.try_io(Interest::READABLE, |tap| tap.recv(&mut rx)) {
                Ok(n) => n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) => {
                    tracing::debug!(error = %e, "TAP read error");
                    break;
                }
            };
            self.switch_frame(i, &rx[..n], now).await;
        }
        self.rx = rx;
        self.underlay.flush().await;
    }

    /// One frame from TAP `i`: to a member, an ARP reply back to the TAP, or held while
    /// its destination resolves.
    async fn switch_frame(&mut self, i: usize, frame: &[u8], now: Instant) {
        let port = &mut self.ports[i];
        let action = port.switch.handle_tap_frame(frame, now, &mut self.reply);
        match action {
            Action::ToPeer { peer, packet } => {
                if let Some(t) = self.node.send(peer, &frame[packet], &mut self.tx) {
                    self.underlay.push(t.to, &self.tx[t.range]).await;
                }
            }
            Action::Broadcast { packet } => self.broadcast(i, &frame[packet], now).await,
            Action::Dhcp { payload } => self.handle_dhcp(i, &frame[payload], now),
            Action::Dns { payload, client } => {
                self.ports[i].dns.udp_query(
                    &frame[payload],
                    client,
                    now,
                    &self.members[i],
                    &mut self.overlay,
                );
                self.flush_dns(i);
            }
            Action::Service { packet, mac } => {
                self.ports[i].dns.service_packet(
                    &frame[packet],
                    mac,
                    now,
                    &self.members[i],
                    &mut self.overlay,
                );
                self.flush_dns(i);
            }
            Action::ToTap { len } => {
                let sent = self.taps[i]
                    .as_ref()
                    .is_some_and(|t| t.get_ref().send(&self.reply[..len]).is_ok());
                if !sent {
                    port.tap_errors += 1;
                }
            }
            Action::Resolve { target } => {
                self.members[i].hold(now, target, frame, &mut self.overlay);
            }
            Action::Drop(_) => {}
        }
        // Router and hybrid switches learn LAN hosts and queue probes from what they see.
        if self.ports[i].mode != Mode::Interface {
            self.flush_switch(i, now);
        }
    }

    /// Frames that waited for a member's addresses go through the switch again.
    async fn replay(&mut self, i: usize, frames: Vec<Vec<u8>>) {
        for frame in frames {
            self.switch_frame(i, &frame, Instant::now()).await;
        }
        self.underlay.flush().await;
    }

    /// Sends what the node queued (handshakes, hellos, announcements) and applies its events.
    async fn flush_node(&mut self) {
        for (i, frames) in std::mem::take(&mut self.replays) {
            self.replay(i, frames).await;
        }
        while let Some((to, datagram)) = self.node.poll_transmit() {
            self.underlay.push(to, &datagram).await;
        }
        self.underlay.flush().await;
        while let Some(event) = self.node.poll_event() {
            match event {
                Event::PeerUnreachable {
                    ns,
                    peer,
                    addresses,
                } => {
                    if let Some(port) = self.ports.get_mut(ns.0) {
                        port.switch.remove_peer(peer);
                        self.members[ns.0].forget(&addresses);
                    }
                }
                Event::PeerAddresses {
                    ns,
                    peer,
                    addresses,
                } => {
                    if let Some(port) = self.ports.get_mut(ns.0) {
                        port.switch.set_peer_addresses(peer, &addresses);
                        let frames = self.members[ns.0].take_pending(&addresses);
                        if !frames.is_empty() {
                            self.replay(ns.0, frames).await;
                        }
                    }
                }
            }
        }
    }

    fn status(&self) -> Status {
        let mut namespaces: Vec<NamespaceStatus> = self
            .ports
            .iter()
            .zip(&self.members)
            .map(|(p, m)| {
                let c = p.switch.counters();
                let cfg = p.switch.config();
                NamespaceStatus {
                    name: p.name.clone(),
                    mode: match p.mode {
                        Mode::Interface => "interface".into(),
                        Mode::Router => "router".into(),
                        Mode::Hybrid => "hybrid".into(),
                    },
                    bridge: p.bridge.clone(),
                    lan_hosts: p.switch.lan_hosts().iter().map(|a| a.to_string()).collect(),
                    addresses: m.addresses().iter().map(|a| a.to_string()).collect(),
                    hosted_conflicts: m.hosted_conflicts,
                    group_members: p.group.len(),
                    broadcasts_out: c.broadcasts_out,
                    broadcasts_in: c.broadcasts_in,
                    arp_probes: c.arp_probes,
                    dhcp_requests: c.dhcp_requests,
                    dhcp_replies: p.dhcp.as_ref().map_or(0, |d| d.stats().replies),
                    dhcp_naks: p.dhcp.as_ref().map_or(0, |d| d.stats().naks),
                    dhcp_malformed: p.dhcp.as_ref().map_or(0, |d| d.stats().malformed),
                    hostname: m.hostname.clone(),
                    name_error: m.name_error.clone(),
                    names: m
                        .held_names()
                        .into_iter()
                        .map(|(n, a)| (n, a.to_string()))
                        .collect(),
                    dns: {
                        let (agent, zone, tcp) = p.dns.stats();
                        control::DnsStatus {
                            address: m
                                .subnet
                                .map(|s| hyphae_vswitch::service_address(s).to_string())
                                .unwrap_or_default(),
                            resolvers: p.dns.resolvers().iter().map(|r| r.to_string()).collect(),
                            udp_queries: agent.udp_queries,
                            tcp_queries: agent.tcp_queries,
                            tcp_connections: tcp.connections,
                            answered: zone.answered,
                            nxdomain: zone.nxdomain,
                            forwarded: zone.forwarded,
                            refused: zone.refused,
                            servfail: agent.servfail,
                            errors: zone.errors,
                            dropped: zone.dropped,
                            rate_limited: zone.rate_limited,
                            lookups: agent.lookups,
                            not_ready: agent.not_ready,
                            name_conflicts: m.name_conflicts,
                        }
                    },
                    device: p.device.clone(),
                    address: if cfg.address.is_unspecified() {
                        String::new()
                    } else {
                        cfg.address.to_string()
                    },
                    address_claimed: m.owned.is_some(),
                    subnet: m.subnet.map(|s| s.to_string()).unwrap_or_default(),
                    error: p.error.clone(),
                    lookups: m.lookups,
                    unresolved_drops: m.unresolved_drops,
                    to_peers: c.to_peer,
                    to_device: c.to_tap,
                    arp_replies: c.arp_replies,
                    drops: SwitchDrop::ALL
                        .iter()
                        .map(|r| (r.as_str().to_string(), c.drops(*r)))
                        .chain([("device_write".to_string(), p.tap_errors)])
                        .collect(),
                    peers: Vec::new(),
                }
            })
            .collect();
        for p in self.node.peers() {
            let Some(ns) = namespaces.get_mut(p.ns.0) else {
                continue;
            };
            let relay_addresses = p
                .relayed_via
                .and_then(|via| self.node.peers().find(|r| r.ns == p.ns && r.id == via))
                .map(|r| r.addresses.iter().map(|a| a.to_string()).collect())
                .unwrap_or_default();
            ns.peers.push(PeerStatus {
                identity: p.id.to_string(),
                endpoint: p.endpoint.to_string(),
                path: if p.relayed_via.is_some() {
                    "relayed".into()
                } else {
                    "direct".into()
                },
                relay: p.relayed_via.map(|id| id.to_string()),
                relay_addresses,
                rtt_ms: p.rtt.map(|d| d.as_secs_f64() * 1000.0),
                addresses: p.addresses.iter().map(|a| a.to_string()).collect(),
                handshake_age_secs: p.handshake_age.map(|d| d.as_secs_f64()),
                rx_packets: p.stats.rx_packets,
                rx_bytes: p.stats.rx_bytes,
                tx_packets: p.stats.tx_packets,
                tx_bytes: p.stats.tx_bytes,
                drops: PeerDropReason::ALL
                    .iter()
                    .map(|r| (r.as_str().to_string(), p.stats.drops(*r)))
                    .collect(),
            });
        }
        // Left namespaces are not shown, unless the last one of a name failed.
        let mut i = 0;
        namespaces.retain(|_| {
            let p = &self.ports[i];
            let keep = self.taps[i].is_some()
                || (p.error.is_some() && !self.ports[i + 1..].iter().any(|q| q.name == p.name));
            i += 1;
            keep
        });
        Status {
            version: STATUS_VERSION,
            identity: self.node.peer_id().to_string(),
            listen: self.listen.to_string(),
            drops: NodeDrop::ALL
                .iter()
                .map(|r| (r.as_str().to_string(), self.node.drops(*r)))
                .chain([("send_error".to_string(), self.underlay.send_errors)])
                .collect(),
            overlay: OverlayStatus {
                peer_id: self.overlay.local_id().to_string(),
                listen: self
                    .overlay
                    .listen_addrs()
                    .iter()
                    .map(|a| a.to_string())
                    .collect(),
                joined: self.overlay.is_joined(),
                connected: self.overlay.connected(),
                stored_records: self.overlay.stored_records(),
                rejected_requests: self.overlay.store_stats().rejected,
                bad_envelopes: self.overlay.stats().bad_envelopes,
                late_grants_released: self.overlay.stats().late_grants_released,
                relays: self
                    .overlay
                    .relays()
                    .iter()
                    .map(|p| p.to_string())
                    .collect(),
                relayed_peers: self
                    .overlay
                    .relayed_peers()
                    .iter()
                    .map(|p| p.to_string())
                    .collect(),
                relayed_connections: self.overlay.stats().relayed_connections,
                hole_punches: self.overlay.stats().hole_punches,
                hole_punch_failures: self.overlay.stats().hole_punch_failures,
                circuits_relayed: self.overlay.stats().circuits_relayed,
                mdns_discovered: self.overlay.stats().mdns_discovered,
            },
            relay: {
                let r = self.node.relay_stats();
                RelayStatus {
                    sessions: r.sessions,
                    packets: r.packets,
                    bytes: r.bytes,
                    refused: r.refused,
                }
            },
            namespaces,
        }
    }
}

/// The socket queries to the configured resolvers leave from: IPv6 and IPv4 if the host
/// has IPv6, IPv4 only otherwise; an ephemeral port.
fn bind_resolver_socket() -> Result<tokio::net::UdpSocket> {
    use socket2::{Domain, Protocol, Socket, Type};
    let dual = Socket::new(Domain::IPV6, Type::DGRAM, Some(Protocol::UDP)).and_then(|s| {
        s.set_only_v6(false)?;
        s.bind(&SocketAddr::from((std::net::Ipv6Addr::UNSPECIFIED, 0)).into())?;
        Ok(s)
    });
    let socket = match dual {
        Ok(s) => s,
        Err(_) => {
            let s = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP))?;
            s.bind(&SocketAddr::from((std::net::Ipv4Addr::UNSPECIFIED, 0)).into())?;
            s
        }
    };
    socket.set_nonblocking(true)?;
    tokio::net::UdpSocket::from_std(socket.into()).context("registering the resolver socket")
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
async fn recv_resolver(
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

/// Resolves with the index of the first TAP that is readable.
async fn any_readable(taps: &[Option<AsyncFd<SyncDevice>>]) -> usize {
    poll_fn(|cx| {
        for (i, tap) in taps.iter().enumerate() {
            let Some(tap) = tap else {
                continue;
            };
            // The guard is dropped with its readiness retained: the drain loop reads until
            // WouldBlock, which clears it.
            if let Poll::Ready(Ok(_guard)) = tap.poll_read_ready(cx) {
                return Poll::Ready(i);
            }
        }
        Poll::Pending
    })
    .await
}

async fn serve_control(listener: UnixListener, agent: mpsc::Sender<Call>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let agent = agent.clone();
        tokio::spawn(async move {
            let (read, mut write) = stream.into_split();
            let mut line = String::new();
            let mut reader = BufReader::new(read).take(control::MAX_REQUEST as u64);
            if reader.read_line(&mut line).await.is_err() {
                return;
            }
            let reply = match serde_json::from_str::<Request>(&line) {
                Ok(Request::Status) => {
                    let (tx, rx) = oneshot::channel();
                    if agent.send(Call::Status(tx)).await.is_err() {
                        return;
                    }
                    match rx.await {
                        Ok(status) => serde_json::to_string(&status).unwrap_or_default(),
                        Err(_) => return,
                    }
                }
                Ok(Request::Join { namespace }) => {
                    let (tx, rx) = oneshot::channel();
                    if agent.send(Call::Join(namespace, tx)).await.is_err() {
                        return;
                    }
                    match rx.await {
                        Ok(Ok(())) => serde_json::json!({ "ok": true }).to_string(),
                        Ok(Err(e)) => serde_json::json!({ "error": e }).to_string(),
                        Err(_) => return,
                    }
                }
                Ok(Request::SetName { namespace, name }) => {
                    let (tx, rx) = oneshot::channel();
                    if agent
                        .send(Call::SetName(namespace, name, tx))
                        .await
                        .is_err()
                    {
                        return;
                    }
                    match rx.await {
                        Ok(Ok(message)) => {
                            serde_json::json!({ "ok": true, "message": message }).to_string()
                        }
                        Ok(Err(e)) => serde_json::json!({ "error": e }).to_string(),
                        Err(_) => return,
                    }
                }
                Ok(Request::Leave { namespace }) => {
                    let (tx, rx) = oneshot::channel();
                    if agent.send(Call::Leave(namespace, tx)).await.is_err() {
                        return;
                    }
                    match rx.await {
                        Ok(Ok(released)) => {
                            serde_json::json!({ "ok": true, "released": released }).to_string()
                        }
                        Ok(Err(e)) => serde_json::json!({ "error": e }).to_string(),
                        Err(_) => return,
                    }
                }
                Err(e) => serde_json::json!({ "error": format!("bad request: {e}") }).to_string(),
            };
            let _ = write.write_all(format!("{reply}\n").as_bytes()).await;
        });
    }
}

/// The default config path.
pub fn default_config_path() -> PathBuf {
    PathBuf::from("/etc/hyphae/hyphae.toml")
}
