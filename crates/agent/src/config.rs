//! The agent's configuration file (TOML): parsing, defaults and validation.
//!
//! Every key is documented in the README. Validation turns the file into a [`Config`] whose
//! values are all usable; anything wrong is one line naming the key and what to do.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use hyphae_overlay::swarm::Multiaddr;

use anyhow::{bail, Context, Result};
use ipnet::Ipv4Net;
use serde::Deserialize;

mod addresses;
mod files;
mod lan;
mod namespace;
mod qos;
mod subnets;
mod underlay;
use addresses::read_secret;
pub(crate) use addresses::resolve;
pub use addresses::{
    host_resolvers, parse_bootstrap, parse_resolver, MAX_HOST_RESOLVERS, RESOLV_CONF,
};
use files::read_credential;
pub(crate) use files::{compile_policy, is_signed_policy, read_policy, SIGNED_POLICY};
use namespace::{check_shared_bridge, validate_namespace, NamespaceSection};
#[cfg(test)]
use namespace::{
    default_broadcast_rate, default_device, default_dns_rate, default_flows,
    default_lan_timeout_secs, default_probe_timeout_ms,
};
use subnets::parse_subnets;
pub use subnets::{check_in_subnet, parse_subnet};
use underlay::workers;
pub use underlay::{UnderlayMode, WorkerPriority, MAX_WORKERS, REALTIME_PRIORITY};

/// Default underlay UDP port.
pub const DEFAULT_PORT: u16 = 7400;

/// Default namespace (tunnel) MTU, 1420: see [`hyphae_overlay::DEFAULT_MTU`] for how it is
/// derived.
pub use hyphae_overlay::DEFAULT_MTU;

// The switch's default (it does not depend on the overlay) is the same figure.
const _: () = assert!(hyphae_vswitch::DEFAULT_TUNNEL_MTU == DEFAULT_MTU);

/// Default address lease time: a crashed member's address is free again after this long.
pub const DEFAULT_LEASE_SECS: u64 = 600;

/// Shortest lease: renewals go out every third of it.
pub use hyphae_overlay::membership::MIN_LEASE_SECS;

/// Longest lease: replicas refuse records that live longer.
pub use hyphae_overlay::membership::MAX_LEASE_SECS;

/// Linux interface names are at most 15 bytes (IFNAMSIZ - 1).
const MAX_DEVICE_NAME: usize = 15;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    agent: AgentSection,
    #[serde(default, rename = "namespace")]
    namespaces: Vec<NamespaceSection>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct AgentSection {
    state_dir: PathBuf,
    control_socket: PathBuf,
    listen: String,
    mdns: bool,
    metrics: Option<String>,
    metrics_remote: bool,
    underlay: String,
    offload: bool,
    workers: Option<usize>,
    worker_priority: Option<String>,
    uplink_rate: Option<String>,
    uplinks: Vec<UplinkSection>,
}

/// `[[agent.uplinks]]`: one underlay link of this host, for bonding (docs/QOS.md).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct UplinkSection {
    address: String,
    rate: String,
}

impl Default for AgentSection {
    fn default() -> Self {
        Self {
            state_dir: PathBuf::from("/var/lib/hyphae"),
            control_socket: PathBuf::from("/run/hyphae/hyphae.sock"),
            listen: format!("0.0.0.0:{DEFAULT_PORT}"),
            mdns: false,
            metrics: None,
            metrics_remote: false,
            underlay: "socket".into(),
            offload: true,
            workers: None,
            worker_priority: None,
            uplink_rate: None,
            uplinks: Vec::new(),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PeerSection {
    endpoint: String,
}

/// A validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// The file it was read from.
    pub path: PathBuf,
    /// Agent-wide settings.
    pub agent: Agent,
    /// The namespaces this agent is a member of.
    pub namespaces: Vec<Namespace>,
}

/// Agent-wide settings.
#[derive(Debug, Clone)]
pub struct Agent {
    /// Where the identity key is kept.
    pub state_dir: PathBuf,
    /// The control socket `hyphae status` talks to.
    pub control_socket: PathBuf,
    /// Underlay UDP address.
    pub listen: SocketAddr,
    /// Find members on the same LAN by mDNS (no bootstrap address needed).
    pub mdns: bool,
    /// Where `/metrics` and the topology page are served (TCP); `None`: nowhere.
    pub metrics: Option<SocketAddr>,
    /// How tunnel datagrams enter and leave the host.
    pub underlay: UnderlayMode,
    /// Open the TAPs with TCP segmentation and checksum offloads (when the kernel accepts
    /// them): the agent segments the kernel's super-frames and coalesces what it writes.
    pub offload: bool,
    /// Data-path threads, each with its own queue of every TAP and its own underlay socket
    /// (`crate::workers`). Default: one per core; one with an AF_XDP underlay.
    pub workers: usize,
    /// How the kernel schedules the workers.
    pub worker_priority: WorkerPriority,
    /// The underlay's rate, bits a second: namespaces share it by `weight` when it is
    /// saturated (docs/QOS.md). None: no shares.
    pub uplink_rate: Option<u64>,
    /// This host's underlay links (address and port members reach it at on each, rate in
    /// bits a second): members that read them bond to it over all of them (docs/QOS.md).
    /// Empty: members reach it at the one address they know.
    pub uplinks: Vec<(SocketAddr, u64)>,
}

/// How a namespace attaches to the host (IPOP Sec. 3): interface, router or hybrid.
pub use hyphae_vswitch::Mode;

/// How a member gets its virtual address: static, `auto`, none (router) or DHCP.
pub use hyphae_overlay::membership::Address;
/// How a member gets its IPv6 address: static, `auto` or none.
pub use hyphae_overlay::membership::Address6;

/// A namespace's IPv6 prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Subnet6 {
    /// A unique local /64 derived from the namespace's keys (the same at every member).
    Derived,
    /// This prefix (`subnet6 = "fd00:1::/64"`).
    Prefix(ipnet::Ipv6Net),
    /// IPv4 only (`subnet6 = "off"`).
    Off,
}

/// One namespace membership.
#[derive(Clone)]
pub struct Namespace {
    /// Namespace name.
    pub name: String,
    /// The namespace secret (never printed).
    pub secret: Vec<u8>,
    /// This member's subnet (its device's, or its LAN's); `None` to take it from the
    /// namespace record in the DHT.
    pub subnet: Option<Ipv4Net>,
    /// A multi-subnet namespace's every subnet, in order (`subnet` is one of them; the
    /// others are routed in one hop); empty for a one-subnet namespace.
    pub subnets: Vec<Ipv4Net>,
    /// Deployment mode.
    pub mode: Mode,
    /// A layer-2 namespace (`layer = 2`): every Ethernet frame crosses, forwarded by MAC
    /// (`hyphae_vswitch::layer2`); false: an IP namespace (`layer = 3`, the default).
    pub layer2: bool,
    /// A layer-2 router's uplink is a VLAN trunk and this namespace is VLAN `vlan` on it
    /// (`vlan = N`): frames of that VLAN only, untagged into the namespace and tagged out.
    pub vlan: Option<u16>,
    /// A layer-2 namespace: if not empty, the only EtherTypes it carries (`ethertypes`).
    pub ethertypes: Vec<u16>,
    /// The host's device: the TAP (interface and router modes) or the host end of the veth
    /// pair that carries its address (hybrid mode).
    pub device: String,
    /// The LAN bridge (router and hybrid modes).
    pub bridge: Option<String>,
    /// A LAN interface to enslave to the bridge (router and hybrid modes).
    pub uplink: Option<String>,
    /// Router mode: how the LAN's hosts reach each other (VEB: through the bridge; VEPA:
    /// only through the agent, checked and counted).
    pub lan_ports: hyphae_vswitch::LanPorts,
    /// VEPA: the only address and MAC pairs LAN hosts may send from, if not empty.
    pub lan_table: Vec<(Ipv4Addr, hyphae_vswitch::Mac)>,
    /// Hybrid mode: how long a LAN probe waits before ARP for a remote address is answered.
    pub probe_timeout: Duration,
    /// Router mode: a LAN host silent this long is probed, then forgotten.
    pub lan_timeout: Duration,
    /// Broadcast and multicast packets per second, each way; 0 carries none.
    pub broadcast_rate: u32,
    /// This member's virtual address.
    pub address: Address,
    /// The namespace's IPv6 prefix (`subnet6`): derived from the namespace by default.
    pub subnet6: Subnet6,
    /// This member's IPv6 address (`address6`): `auto` by default in interface mode.
    pub address6: Address6,
    /// TAP MTU.
    pub mtu: u16,
    /// Members to contact at start (tunnel endpoints).
    pub peers: Vec<SocketAddr>,
    /// Overlay members to join through (libp2p addresses).
    pub bootstrap: Vec<Multiaddr>,
    /// Address lease time (the namespace record's wins once read).
    pub lease: Duration,
    /// Addresses no member may claim (the namespace record's win once read).
    pub reserved: Vec<Ipv4Addr>,
    /// This member's name in the namespace zone (`HOST.NAMESPACE`), a lowercase label.
    pub hostname: Option<String>,
    /// Where the virtual DNS server forwards names outside the zone (not configured: the
    /// host's own, from [`RESOLV_CONF`]); none: REFUSED.
    pub resolvers: Vec<SocketAddr>,
    /// UDP queries per second (and burst) each source may send the virtual DNS server;
    /// 0: no limit.
    pub dns_rate: u32,
    /// The default gateway the virtual DHCP server hands out (option 3), if any.
    pub gateway: Option<Ipv4Addr>,
    /// With an authority: what it trusts and this member's certificate
    /// (docs/SECURITY.md, "Certificates").
    pub credential: Option<hyphae_overlay::proof::Credential>,
    /// The certificate file, for messages.
    pub certificate_path: Option<PathBuf>,
    /// The policy (docs/POLICY.md): who may open which flows to whom. Allow-all without
    /// a `policy` file.
    pub policy: hyphae_vswitch::policy::Policy,
    /// The policy file, for messages and reloads.
    pub policy_path: Option<PathBuf>,
    /// Most flows the policy's connection table keeps.
    pub flows: usize,
    /// A cap on what this member sends to the namespace's members: bits a second and a
    /// burst in bytes (docs/QOS.md). None: no cap.
    pub rate: Option<(u64, u64)>,
    /// Its share of `[agent] uplink_rate` when saturated, against the other namespaces'
    /// (default 1).
    pub weight: Option<u64>,
    /// Caps per member, group and host, egress and ingress (`[[namespace.cap]]`,
    /// docs/QOS.md). Empty: none.
    pub caps: hyphae_vswitch::qos::Caps,
}

impl std::fmt::Debug for Namespace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Namespace")
            .field("name", &self.name)
            .field("subnet", &self.subnet)
            .field("subnets", &self.subnets)
            .field("device", &self.device)
            .field("address", &self.address)
            .field("subnet6", &self.subnet6)
            .field("address6", &self.address6)
            .finish_non_exhaustive()
    }
}

/// A namespace with every default, for unit tests elsewhere in the crate.
#[cfg(test)]
pub(crate) fn tests_namespace(name: &str) -> Namespace {
    Namespace {
        name: name.to_string(),
        secret: b"0123456789abcdef".to_vec(),
        subnet: None,
        subnets: Vec::new(),
        mode: Mode::Interface,
        layer2: false,
        vlan: None,
        ethertypes: Vec::new(),
        device: default_device(),
        bridge: None,
        uplink: None,
        lan_ports: hyphae_vswitch::LanPorts::Veb,
        lan_table: Vec::new(),
        probe_timeout: Duration::from_millis(default_probe_timeout_ms()),
        lan_timeout: Duration::from_secs(default_lan_timeout_secs()),
        broadcast_rate: default_broadcast_rate(),
        address: Address::Auto,
        subnet6: Subnet6::Derived,
        address6: Address6::Auto,
        mtu: DEFAULT_MTU,
        peers: Vec::new(),
        bootstrap: Vec::new(),
        lease: Duration::from_secs(DEFAULT_LEASE_SECS),
        reserved: Vec::new(),
        hostname: None,
        resolvers: Vec::new(),
        dns_rate: default_dns_rate(),
        gateway: None,
        credential: None,
        certificate_path: None,
        policy: hyphae_vswitch::policy::Policy::allow_all(),
        policy_path: None,
        flows: default_flows(),
        rate: None,
        weight: None,
        caps: Default::default(),
    }
}

/// Reads just the state directory (where the identity is), for `hyphae id`; the default
/// one without a config file.
pub fn state_dir(path: &Path) -> Result<PathBuf> {
    if !path.exists() {
        return Ok(AgentSection::default().state_dir);
    }
    Ok(parse_file(path)?.agent.state_dir)
}

/// Reads just the control socket path, for the commands that talk to a running agent.
pub fn control_socket(path: &Path) -> Result<PathBuf> {
    Ok(parse_file(path)?.agent.control_socket)
}

fn parse_file(path: &Path) -> Result<File> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read config {}", path.display()))?;
    toml::from_str::<File>(&text).map_err(|e| {
        let line = e
            .span()
            .map(|s| text[..s.start.min(text.len())].lines().count().max(1))
            .unwrap_or(0);
        let msg = e.message().replace('\n', " ");
        anyhow::anyhow!("config {} line {line}: {msg}", path.display())
    })
}

impl Config {
    /// Reads and validates a configuration file, including the secret files it names.
    pub fn load(path: &Path) -> Result<Self> {
        let file = parse_file(path)?;
        let listen = resolve(&file.agent.listen)
            .with_context(|| format!("config {}: [agent] listen", path.display()))?;
        let metrics = match &file.agent.metrics {
            Some(text) => Some(
                metrics_address(text, file.agent.metrics_remote)
                    .with_context(|| format!("config {}: [agent] metrics", path.display()))?,
            ),
            None => None,
        };
        let underlay = UnderlayMode::parse(&file.agent.underlay)
            .with_context(|| format!("config {}: [agent] underlay", path.display()))?;
        let workers = workers(file.agent.workers, underlay)
            .with_context(|| format!("config {}: [agent] workers", path.display()))?;
        let worker_priority = WorkerPriority::parse(file.agent.worker_priority.as_deref())
            .with_context(|| format!("config {}: [agent] worker_priority", path.display()))?;
        let uplink_rate = qos::uplink(&file.agent.uplink_rate)
            .with_context(|| format!("config {}: [agent] uplink_rate", path.display()))?;
        let uplinks = file
            .agent
            .uplinks
            .iter()
            .map(|u| qos::uplink_link(&u.address, &u.rate, listen.port()))
            .collect::<Result<Vec<_>>>()
            .and_then(|links| qos::bond(links, listen, underlay))
            .with_context(|| format!("config {}: [agent] uplinks", path.display()))?;
        let mut namespaces: Vec<Namespace> = Vec::new();
        for section in file.namespaces {
            let name = section.name.clone();
            let ns = validate_namespace(section, file.agent.mdns)
                .with_context(|| format!("config {}: namespace '{name}'", path.display()))?;
            if namespaces.iter().any(|n| n.name == ns.name) {
                bail!(
                    "config {}: namespace '{}' appears twice",
                    path.display(),
                    ns.name
                );
            }
            check_shared_bridge(&namespaces, &ns)
                .with_context(|| format!("config {}", path.display()))?;
            if let Some(other) = namespaces.iter().find(|n| n.device == ns.device) {
                bail!(
                    "config {}: namespaces '{}' and '{}' both use device '{}'; give each its own `device`",
                    path.display(),
                    other.name,
                    ns.name,
                    ns.device
                );
            }
            if (ns.weight.is_some() || ns.caps.weighs()) && uplink_rate.is_none() {
                bail!("config {}: namespace '{}': weight shares [agent] uplink_rate, which is not set", path.display(), ns.name);
            }
            namespaces.push(ns);
        }
        Ok(Self {
            path: path.to_path_buf(),
            agent: Agent {
                state_dir: file.agent.state_dir,
                control_socket: file.agent.control_socket,
                listen,
                mdns: file.agent.mdns,
                metrics,
                underlay,
                offload: file.agent.offload,
                workers,
                worker_priority,
                uplink_rate,
                uplinks,
            },
            namespaces,
        })
    }
}

/// The metrics listener: an `ip:port`, on loopback unless `remote` is set, since the page
/// and the metrics show member identities, underlay endpoints and virtual addresses.
fn metrics_address(text: &str, remote: bool) -> Result<SocketAddr> {
    let address: SocketAddr = text
        .parse()
        .map_err(|_| anyhow::anyhow!("'{text}' is not an ip:port such as 127.0.0.1:9400"))?;
    if !address.ip().is_loopback() && !remote {
        bail!(
            "{address} is reachable from other hosts and shows members' identities and \
             endpoints; use 127.0.0.1, or set metrics_remote = true to serve it there"
        );
    }
    Ok(address)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(toml: &str, secret: Option<&str>) -> Result<Config> {
        let dir = std::env::temp_dir().join(format!(
            "hyphae-cfg-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        std::fs::create_dir_all(&dir)?;
        let secret_path = dir.join("s");
        let _ = std::fs::remove_file(&secret_path);
        if let Some(s) = secret {
            std::fs::write(&secret_path, s)?;
            use std::os::unix::fs::PermissionsExt as _;
            std::fs::set_permissions(&secret_path, std::fs::Permissions::from_mode(0o600))?;
        }
        let cfg = dir.join("c.toml");
        std::fs::write(
            &cfg,
            toml.replace("SECRET", &secret_path.display().to_string()),
        )?;
        let config = Config::load(&cfg);
        let _ = std::fs::remove_dir_all(&dir);
        config
    }

    const GOOD: &str = r#"
[agent]
state_dir = "/tmp/x"
listen = "127.0.0.1:7400"
[[namespace]]
name = "lab"
secret_file = "SECRET"
subnet = "10.201.0.0/16"
address = "10.201.0.5"
[[namespace.peer]]
endpoint = "10.200.0.2:7400"
[[namespace.peer]]
endpoint = "10.200.0.3"
"#;

    fn err(toml: &str, secret: Option<&str>) -> String {
        format!("{:#}", load(toml, secret).unwrap_err())
    }

    #[test]
    fn a_layer2_namespace_is_read_and_what_it_lacks_is_refused() {
        let with = |lines: &str| GOOD.replace("address = ", &format!("{lines}address = "));
        let secret = Some("0123456789abcdef\n");
        let ns = &load(&with("layer = 2\nmtu = 1420\n"), secret)
            .unwrap()
            .namespaces[0];
        assert!(ns.layer2);
        // The TAP leaves room for the frame's header and its envelope.
        assert_eq!(ns.tap_mtu(), 1420 - 14 - 22);
        let typed = &load(
            &with("layer = 2\nethertypes = [\"ipv4\", \"ARP\", \"0x88B5\"]\n"),
            secret,
        )
        .unwrap()
        .namespaces[0];
        assert_eq!(typed.ethertypes, vec![0x0800, 0x0806, 0x88b5]);
        let ip = &load(GOOD, secret).unwrap().namespaces[0];
        assert!(!ip.layer2);
        assert_eq!(ip.tap_mtu(), ip.mtu);
        for (lines, expect) in [
            ("layer = 4\n", "layer 4 is not 2"),
            (
                "layer = 2\nethertypes = [\"0x+88b5\"]\n",
                "ethertype '0x+88b5' is not",
            ),
            ("ethertypes = [\"ipv4\"]\n", "`ethertypes` needs layer = 2"),
            (
                "layer = 2\nethertypes = [\"0x12\"]\n",
                "ethertype '0x12' is not",
            ),
            ("vlan = 10\n", "`vlan` needs layer = 2 and mode"),
            ("layer = 2\nhostname = \"h\"\n", "no virtual DHCP or DNS"),
            (
                "layer = 2\nrate = \"10M\"\n",
                "layer = 2 namespaces have no `rate` or `cap`",
            ),
            (
                "layer = 2\nmode = \"hybrid\"\nbridge = \"br0\"\n",
                "layer = 2 works in mode",
            ),
        ] {
            let e = err(&with(lines), secret);
            assert!(e.contains(expect), "{lines}: {e}");
            assert!(!e.contains('\n'), "{e}");
        }
        // One trunk, two namespaces: each needs its own VLAN.
        let trunk = |a: &str, b: &str| {
            let ns = |name: &str, dev: &str, vlan: &str| {
                format!("[[namespace]]\nname = \"{name}\"\nsecret_file = \"SECRET\"\nsubnet = \"10.201.0.0/16\"\nlayer = 2\nmode = \"router\"\ndevice = \"{dev}\"\nbridge = \"br0\"\nuplink = \"eth1\"\n{vlan}")
            };
            format!(
                "[agent]\nstate_dir = \"/tmp/x\"\n{}{}",
                ns("red", "hy1", a),
                ns("blue", "hy2", b)
            )
        };
        let ok = load(&trunk("vlan = 10\n", "vlan = 20\n"), secret).unwrap();
        assert_eq!(ok.namespaces[1].vlan, Some(20));
        for (a, b) in [
            ("", ""),
            ("vlan = 10\n", ""),
            ("vlan = 10\n", "vlan = 10\n"),
        ] {
            let e = err(&trunk(a, b), secret);
            assert!(e.contains("share bridge 'br0'"), "{a} {b}: {e}");
        }
    }

    #[test]
    fn a_policy_file_is_read_and_its_mistakes_name_the_file_and_rule() {
        let dir = std::env::temp_dir().join(format!("hyphae-policy-cfg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let write = |name: &str, text: &str| {
            let path = dir.join(name);
            std::fs::write(&path, text).unwrap();
            path.display().to_string()
        };
        let good = write(
            "good.toml",
            "version = 2\ndefault = \"deny\"\n[[rule]]\nfrom = [\"10.201.0.0/24\"]\nto = [\"any\"]\nproto = \"tcp\"\nports = [\"22\"]\n",
        );
        let with = |lines: &str| GOOD.replace("address = ", &format!("{lines}address = "));
        let secret = Some("0123456789abcdef\n");
        let c = load(
            &with(&format!("policy = \"{good}\"\nflows = 100\n")),
            secret,
        )
        .unwrap();
        let ns = &c.namespaces[0];
        assert_eq!(
            (ns.policy.version(), ns.policy.rule_count(), ns.flows),
            (2, 1, 100)
        );
        assert!(load(GOOD, secret).unwrap().namespaces[0]
            .policy
            .is_allow_all());

        let group = write(
            "group.toml",
            "[[rule]]\nfrom = [\"group:web\"]\nto = [\"any\"]\n",
        );
        let typo = write("typo.toml", "defualt = \"deny\"\n");
        for (lines, expect) in [
            (
                format!("policy = \"{group}\"\n"),
                "policy rule 1: 'group:web' needs a namespace with an authority",
            ),
            (format!("policy = \"{typo}\"\n"), "unknown field `defualt`"),
            (
                "policy = \"/nonexistent.toml\"\n".to_string(),
                "cannot read policy",
            ),
            (
                format!("policy = \"{good}\"\nflows = 0\n"),
                "flows must be at least 1",
            ),
        ] {
            let e = format!("{:#}", load(&with(&lines), secret).unwrap_err());
            assert!(e.contains(expect), "{lines}: {e}");
            assert!(!e.contains('\n'), "{e}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn an_authority_needs_a_certificate_of_its_own_for_this_namespace() {
        use hyphae_overlay::cert::{armor, AuthorityKey, CertificateRequest};
        let dir = std::env::temp_dir().join(format!("hyphae-cert-cfg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ca = AuthorityKey::from_seed([7; 32]);
        let other = AuthorityKey::from_seed([8; 32]);
        let request = |namespace: &str| CertificateRequest {
            namespace: namespace.into(),
            identity: hyphae_overlay::Identity::from_seed([1; 32]).peer_id(),
            name: "alpha".into(),
            groups: Vec::new(),
            addresses: Vec::new(),
            not_before: 0,
            not_after: u64::MAX / 2,
        };
        let write = |name: &str, bytes: Vec<u8>| {
            let path = dir.join(name);
            std::fs::write(&path, armor("CERTIFICATE", &bytes)).unwrap();
            path.display().to_string()
        };
        let good = write("good.crt", ca.sign(&request("lab")).unwrap());
        let prod = write("prod.crt", ca.sign(&request("prod")).unwrap());
        let foreign = write("foreign.crt", other.sign(&request("lab")).unwrap());
        let list = dir.join("lab.revocations");
        std::fs::write(
            &list,
            armor("REVOCATION LIST", &ca.revoke(3, 0, &[], &[]).unwrap()),
        )
        .unwrap();
        let authority = format!("authority = \"{}\"\n", ca.authority());
        let with = |lines: &str| GOOD.replace("address = ", &format!("{lines}address = "));
        let secret = Some("0123456789abcdef\n");

        let c = load(
            &with(&format!(
                "{authority}certificate = \"{good}\"\nrevocations = \"{}\"\n",
                list.display()
            )),
            secret,
        )
        .unwrap();
        let credential = c.namespaces[0].credential.as_ref().unwrap();
        assert_eq!(credential.trust.authority(), ca.authority());
        assert_eq!(credential.trust.revocations_version(), 3);

        for (lines, expect) in [
            (authority.clone(), "certificate is not"),
            (format!("certificate = \"{good}\"\n"), "authority is not"),
            (
                format!("{authority}certificate = \"{prod}\"\n"),
                "for namespace 'prod'",
            ),
            (
                format!("{authority}certificate = \"{foreign}\"\n"),
                "another authority",
            ),
            (
                format!("{authority}certificate = \"/nonexistent.crt\"\n"),
                "cannot read certificate",
            ),
            (
                format!("authority = \"nope\"\ncertificate = \"{good}\"\n"),
                "not an authority public key",
            ),
            (
                format!("revocations = \"{}\"\n", list.display()),
                "needs an authority",
            ),
        ] {
            let e = err(&with(&lines), secret);
            assert!(e.contains(expect), "{lines}: {e}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn good_config_with_defaults() {
        let c = load(GOOD, Some("0123456789abcdef\n")).unwrap();
        let ns = &c.namespaces[0];
        assert_eq!(ns.device, "hyphae0");
        assert_eq!(ns.mode, Mode::Interface);
        assert_eq!(ns.mtu, DEFAULT_MTU);
        assert_eq!(ns.secret, b"0123456789abcdef");
        assert_eq!(ns.peers[1], "10.200.0.3:7400".parse().unwrap());
        assert_eq!(
            c.agent.control_socket,
            PathBuf::from("/run/hyphae/hyphae.sock")
        );
        assert_eq!(ns.address, Address::Static(Ipv4Addr::new(10, 201, 0, 5)));
        assert!(ns.bootstrap.is_empty());
        assert_eq!(ns.lease, Duration::from_secs(DEFAULT_LEASE_SECS));
    }

    #[test]
    fn metrics_listen_on_loopback_unless_remote_is_allowed() {
        let s = Some("0123456789abcdef");
        assert_eq!(load(GOOD, s).unwrap().agent.metrics, None);
        let with =
            |extra: &str| GOOD.replace("[[namespace]]\n", &format!("{extra}\n[[namespace]]\n"));
        let c = load(&with("metrics = \"127.0.0.1:9400\""), s).unwrap();
        assert_eq!(c.agent.metrics, Some("127.0.0.1:9400".parse().unwrap()));
        let e = err(&with("metrics = \"0.0.0.0:9400\""), s);
        assert!(
            e.contains("[agent] metrics") && e.contains("metrics_remote"),
            "{e}"
        );
        let c = load(
            &with("metrics = \"0.0.0.0:9400\"\nmetrics_remote = true"),
            s,
        )
        .unwrap();
        assert_eq!(c.agent.metrics, Some("0.0.0.0:9400".parse().unwrap()));
        let e = err(&with("metrics = \"localhost\""), s);
        assert!(e.contains("not an ip:port"), "{e}");
    }

    #[test]
    fn workers_default_to_the_cores_and_a_bad_count_is_named() {
        let s = Some("0123456789abcdef");
        let with =
            |extra: &str| GOOD.replace("[[namespace]]\n", &format!("{extra}\n[[namespace]]\n"));
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        assert_eq!(load(GOOD, s).unwrap().agent.workers, cores.min(MAX_WORKERS));
        assert_eq!(load(&with("workers = 3"), s).unwrap().agent.workers, 3);
        for bad in ["workers = 0", "workers = 65"] {
            let e = err(&with(bad), s);
            assert!(
                e.contains("[agent] workers") && e.contains("give 1 to 64"),
                "{e}"
            );
        }
        // AF_XDP: one worker by default, and more is refused.
        let c = load(&with("underlay = \"auto\""), s).unwrap();
        assert_eq!(c.agent.workers, 1);
        let e = err(&with("underlay = \"af_xdp\"\nworkers = 2"), s);
        assert!(e.contains("need underlay = \"socket\""), "{e}");
    }

    #[test]
    fn worker_priority_is_normal_unless_asked_and_a_bad_one_is_named() {
        let s = Some("0123456789abcdef");
        let with =
            |extra: &str| GOOD.replace("[[namespace]]\n", &format!("{extra}\n[[namespace]]\n"));
        assert_eq!(
            load(GOOD, s).unwrap().agent.worker_priority,
            WorkerPriority::Normal
        );
        let c = load(&with("worker_priority = \"realtime\""), s).unwrap();
        assert_eq!(c.agent.worker_priority, WorkerPriority::Realtime);
        let e = err(&with("worker_priority = \"high\""), s);
        assert!(
            e.contains("[agent] worker_priority") && e.contains("'high' is not"),
            "{e}"
        );
    }

    #[test]
    fn underlay_is_socket_unless_asked_and_a_bad_one_is_named() {
        let s = Some("0123456789abcdef");
        assert_eq!(load(GOOD, s).unwrap().agent.underlay, UnderlayMode::Socket);
        let with =
            |extra: &str| GOOD.replace("[[namespace]]\n", &format!("{extra}\n[[namespace]]\n"));
        for (text, mode) in [
            ("socket", UnderlayMode::Socket),
            ("af_xdp", UnderlayMode::AfXdp),
            ("auto", UnderlayMode::Auto),
        ] {
            let c = load(&with(&format!("underlay = \"{text}\"")), s).unwrap();
            assert_eq!(c.agent.underlay, mode);
        }
        let e = err(&with("underlay = \"xdp\""), s);
        assert!(
            e.contains("[agent] underlay") && e.contains("'xdp' is not an underlay"),
            "{e}"
        );
    }

    #[test]
    fn ipv6_is_on_by_default_and_its_keys_are_checked() {
        let s = Some("0123456789abcdef");
        let with = |lines: &str| GOOD.replace("address = ", &format!("{lines}address = "));
        let ns = load(GOOD, s).unwrap().namespaces.remove(0);
        assert_eq!(
            (ns.subnet6, ns.address6),
            (Subnet6::Derived, Address6::Auto)
        );
        let off = load(&with("subnet6 = \"off\"\n"), s)
            .unwrap()
            .namespaces
            .remove(0);
        assert_eq!((off.subnet6, off.address6), (Subnet6::Off, Address6::Auto));
        let fixed = load(
            &with("subnet6 = \"fd00:1::/64\"\naddress6 = \"fd00:1::7\"\n"),
            s,
        )
        .unwrap()
        .namespaces
        .remove(0);
        assert_eq!(
            (fixed.subnet6, fixed.address6),
            (
                Subnet6::Prefix("fd00:1::/64".parse().unwrap()),
                Address6::Static("fd00:1::7".parse().unwrap())
            )
        );
        let none = load(&with("address6 = \"none\"\n"), s).unwrap();
        assert_eq!(none.namespaces[0].address6, Address6::None);
        // A namespace MTU below IPv6's minimum leaves it IPv4 only, unless IPv6 is asked for.
        let small = load(&with("mtu = 1200\n"), s).unwrap().namespaces.remove(0);
        assert_eq!(
            (small.subnet6, small.address6),
            (Subnet6::Off, Address6::None)
        );
        let said_off = load(&with("mtu = 1200\nsubnet6 = \"off\"\n"), s).unwrap();
        assert_eq!(said_off.namespaces[0].subnet6, Subnet6::Off);
        for (lines, says) in [
            ("subnet6 = \"fd00:1::1/64\"\n", "has host bits set"),
            ("subnet6 = \"10.0.0.0/8\"\n", "is not an IPv6 prefix"),
            ("subnet6 = \"fd00::/124\"\n", "too small"),
            ("address6 = \"fd00::zz\"\n", "is not an IPv6 address"),
            (
                "subnet6 = \"fd00:1::/64\"\naddress6 = \"fd00:2::7\"\n",
                "is not a member's address",
            ),
            (
                "subnet6 = \"fd00:1::/64\"\naddress6 = \"fd00:1::1\"\n",
                "is not a member's address",
            ),
            (
                "subnet6 = \"off\"\naddress6 = \"fd00:1::7\"\n",
                "needs IPv6",
            ),
            (
                "mtu = 1200\nsubnet6 = \"fd00:1::/64\"\n",
                "below IPv6's 1280",
            ),
        ] {
            let e = err(&with(lines), s);
            assert!(e.contains(says), "{lines}: {e}");
        }
        let router = GOOD.replace("address = \"10.201.0.5\"\n", "").replace(
            "subnet = ",
            "mode = \"router\"\nbridge = \"br-lab\"\nsubnet = ",
        );
        let r = load(&router, s).unwrap().namespaces.remove(0);
        assert_eq!(r.address6, Address6::None);
        let e = err(
            &router.replace("mode = ", "address6 = \"auto\"\nmode = "),
            s,
        );
        assert!(e.contains("`address6` needs mode = \"interface\""), "{e}");
    }

    #[test]
    fn auto_address_and_bootstrap_addresses() {
        let s = Some("0123456789abcdef");
        let toml = GOOD.replace(
            "address = \"10.201.0.5\"",
            "bootstrap = [\"10.200.0.9:7500\", \"10.200.0.8\", \"/ip4/10.200.0.7/tcp/7400\"]\nlease_secs = 30",
        );
        let c = load(&toml, s).unwrap();
        let ns = &c.namespaces[0];
        assert_eq!(ns.address, Address::Auto);
        assert_eq!(ns.lease, Duration::from_secs(30));
        let b: Vec<String> = ns.bootstrap.iter().map(|a| a.to_string()).collect();
        assert_eq!(
            b,
            [
                "/ip4/10.200.0.9/tcp/7500",
                "/ip4/10.200.0.8/tcp/7400",
                "/ip4/10.200.0.7/tcp/7400"
            ]
        );
        // With a bootstrap, the subnet may come from the namespace record.
        let joiner = toml.replace("subnet = \"10.201.0.0/16\"\n", "");
        let c = load(&joiner, s).unwrap();
        assert_eq!(c.namespaces[0].subnet, None);
        let bad = GOOD.replace(
            "address = \"10.201.0.5\"",
            "bootstrap = [\"/ip4/nonsense\"]",
        );
        assert!(err(&bad, s).contains("bootstrap '/ip4/nonsense' is not a valid multiaddr"));
        let short = GOOD.replace("address = \"10.201.0.5\"", "lease_secs = 1");
        assert!(err(&short, s).contains("lease_secs 1 is too short"));
        let word = GOOD.replace("\"10.201.0.5\"", "\"automatic\"");
        assert!(err(&word, s).contains("not an IPv4 address, \"auto\" or \"dhcp\""));
        let dhcp = GOOD.replace("\"10.201.0.5\"", "\"dhcp\"");
        assert_eq!(load(&dhcp, s).unwrap().namespaces[0].address, Address::Dhcp);
    }

    #[test]
    fn router_and_hybrid_configs() {
        let s = Some("0123456789abcdef");
        let router = GOOD.replace("address = \"10.201.0.5\"\n", "").replace(
            "name = \"lab\"",
            "name = \"lab\"\nmode = \"router\"\nbridge = \"br-lan\"\nuplink = \"eth1\"",
        );
        let c = load(&router, s).unwrap();
        let ns = &c.namespaces[0];
        assert_eq!((ns.mode, ns.address), (Mode::Router, Address::None));
        assert_eq!(ns.bridge.as_deref(), Some("br-lan"));
        assert_eq!(ns.uplink.as_deref(), Some("eth1"));
        assert_eq!(ns.lan_timeout, Duration::from_secs(30));
        assert_eq!(ns.broadcast_rate, 200);
        assert_eq!(ns.dns_rate, 5000);
        let c = load(&router.replace("mode = ", "dns_rate = 0\nmode = "), s).unwrap();
        assert_eq!(c.namespaces[0].dns_rate, 0, "no limit");
        // A router has no address of its own, and needs a bridge.
        let with_address = router.replace("mode = ", "address = \"10.201.0.5\"\nmode = ");
        assert!(err(&with_address, s).contains("has none of its own; remove `address`"));
        assert!(err(&router.replace("bridge = \"br-lan\"\n", ""), s).contains("needs `bridge`"));
        let hybrid = GOOD.replace(
            "name = \"lab\"",
            "name = \"lab\"\nmode = \"hybrid\"\nbridge = \"br-lan\"\nprobe_timeout_ms = 500",
        );
        let c = load(&hybrid, s).unwrap();
        let ns = &c.namespaces[0];
        assert_eq!(ns.mode, Mode::Hybrid);
        assert_eq!(ns.probe_timeout, Duration::from_millis(500));
        assert_eq!(ns.address, Address::Static(Ipv4Addr::new(10, 201, 0, 5)));
        // The veth's bridge end and the TAP are named after the device: one byte less.
        let long = hybrid.replace("mode = ", "device = \"fifteen-chars15\"\nmode = ");
        assert!(err(&long, s).contains("1-14 letters"));
        assert!(err(&hybrid.replace("500", "5"), s).contains("probe_timeout_ms 5"));
        let iface_bridge = GOOD.replace("name = \"lab\"", "name = \"lab\"\nbridge = \"br0\"");
        assert!(err(&iface_bridge, s).contains("need mode = \"router\" or \"hybrid\""));
    }

    #[test]
    fn lan_ports_are_veb_by_default_and_vepa_takes_a_static_table() {
        let s = Some("0123456789abcdef");
        let router = GOOD.replace("address = \"10.201.0.5\"\n", "").replace(
            "name = \"lab\"",
            "name = \"lab\"\nmode = \"router\"\nbridge = \"br-lan\"",
        );
        let ns = &load(&router, s).unwrap().namespaces[0];
        assert_eq!(ns.lan_ports, hyphae_vswitch::LanPorts::Veb);
        let vepa = router.replace(
            "mode = ",
            "lan_ports = \"vepa\"\nlan_table = [{ address = \"10.201.0.11\", mac = \"02:00:00:00:00:11\" }]\nmode = ",
        );
        let ns = &load(&vepa, s).unwrap().namespaces[0];
        assert_eq!(ns.lan_ports, hyphae_vswitch::LanPorts::Vepa);
        assert_eq!(
            ns.lan_table,
            [(Ipv4Addr::new(10, 201, 0, 11), [2, 0, 0, 0, 0, 0x11])]
        );
        for (bad, says) in [
            (
                vepa.replace("\"vepa\"", "\"vpea\""),
                "lan_ports 'vpea' is not",
            ),
            (
                vepa.replace("\"vepa\"", "\"veb\""),
                "`lan_table` needs lan_ports = \"vepa\"",
            ),
            (
                vepa.replace("10.201.0.11", "10.9.0.11"),
                "10.9.0.11 is outside",
            ),
            (
                vepa.replace("02:00:00:00:00:11", "01:00:5e:00:00:11"),
                "not a host's MAC",
            ),
            (
                vepa.replace("02:00:00:00:00:11", "nonsense"),
                "not a MAC address",
            ),
            (vepa.replace("address =", "adress ="), "unknown field"),
            (
                vepa.replace(
                    "mode = \"router\"",
                    "mode = \"hybrid\"\naddress = \"10.201.0.5\"",
                ),
                "`lan_ports` needs mode = \"router\"",
            ),
        ] {
            let e = err(&bad, s);
            assert!(e.contains(says), "{e}");
        }
        let twice = vepa.replace(
            "}]",
            "}, { address = \"10.201.0.11\", mac = \"02:00:00:00:00:12\" }]",
        );
        assert!(err(&twice, s).contains("lists 10.201.0.11 twice"));
    }

    #[test]
    fn subnets_name_a_multi_subnet_namespace_and_this_members_own() {
        let s = Some("0123456789abcdef");
        let multi = |subnet: &str, address: &str| {
            GOOD.replace(
                "subnet = \"10.201.0.0/16\"\n",
                &format!("subnets = [\"10.1.0.0/24\", \"10.2.0.0/24\"]\n{subnet}"),
            )
            .replace("address = \"10.201.0.5\"", address)
        };
        let net = |t: &str| t.parse::<Ipv4Net>().unwrap();
        let both = vec![net("10.1.0.0/24"), net("10.2.0.0/24")];
        // The subnet holding the static address; else the first; else the one named.
        for (subnet, address, own) in [
            ("", "address = \"10.2.0.7\"", "10.2.0.0/24"),
            ("", "", "10.1.0.0/24"),
            ("subnet = \"10.2.0.0/24\"\n", "", "10.2.0.0/24"),
        ] {
            let c = load(&multi(subnet, address), s).unwrap();
            assert_eq!(c.namespaces[0].subnet, Some(net(own)), "{subnet}{address}");
            assert_eq!(c.namespaces[0].subnets, both);
        }
        // One subnet listed is the one-subnet case.
        let one = GOOD.replace(
            "subnet = \"10.201.0.0/16\"",
            "subnets = [\"10.201.0.0/16\"]",
        );
        let c = load(&one, s).unwrap();
        assert_eq!(c.namespaces[0].subnet, Some(net("10.201.0.0/16")));
        assert!(c.namespaces[0].subnets.is_empty());
        // Mistakes are named.
        let e = err(&multi("subnet = \"10.3.0.0/24\"\n", ""), s);
        assert!(
            e.contains("subnet 10.3.0.0/24 is not one of `subnets`"),
            "{e}"
        );
        let e = err(&multi("", "address = \"10.3.0.7\""), s);
        assert!(e.contains("outside the subnet 10.1.0.0/24"), "{e}");
        let overlap = multi("", "").replace("10.2.0.0/24", "10.1.0.128/25");
        assert!(err(&overlap, s).contains("overlap"));
        let empty = GOOD.replace("subnet = \"10.201.0.0/16\"", "subnets = []");
        assert!(err(&empty, s).contains("subnets is empty"));
        // A reserved address may be in any of them.
        let reserved = multi("", "").replacen(
            "[[namespace.peer]]",
            "reserved = [\"10.2.0.9\"]\n[[namespace.peer]]",
            1,
        );
        assert!(load(&reserved, s).is_ok());
    }

    #[test]
    fn bad_configs_say_what_is_wrong() {
        let s = Some("0123456789abcdef");
        assert!(err(GOOD, None).contains("cannot read secret_file"));
        assert!(err(GOOD, Some("\n")).contains("is empty"));
        assert!(err(GOOD, Some("short")).contains("at least 16"));
        assert!(
            err(&GOOD.replace("10.201.0.0/16", "10.201.0.0/33"), s).contains("not an IPv4 CIDR")
        );
        assert!(
            err(&GOOD.replace("\"10.201.0.5\"", "\"10.9.0.1\""), s).contains("outside the subnet")
        );
        assert!(err(&GOOD.replace("name = ", "nmae = "), s).contains("unknown field `nmae`"));
        assert!(err(
            &GOOD.replace("name = \"lab\"", "name = \"lab\"\nmode = \"bridge\""),
            s
        )
        .contains("not one of interface, router, hybrid"));
        assert!(
            err(&GOOD.replace("\"10.200.0.3\"", "\"not an address\""), s).contains("peer endpoint")
        );
        let no_subnet = GOOD.replace("subnet = \"10.201.0.0/16\"\n", "");
        assert!(err(&no_subnet, s).contains("subnet is missing"));
        // With mDNS, members on the LAN may tell the subnet.
        let lan = no_subnet.replace("[agent]\n", "[agent]\nmdns = true\n");
        let c = load(&lan, s).unwrap();
        assert!(c.agent.mdns);
        assert_eq!(c.namespaces[0].subnet, None);
        let reserved = GOOD.replace("address = ", "reserved = [\"10.201.0.5\"]\naddress = ");
        assert!(err(&reserved, s).contains("10.201.0.5 is reserved"));
        let outside = GOOD.replace("address = ", "reserved = [\"10.9.0.1\"]\naddress = ");
        assert!(err(&outside, s).contains("reserved address 10.9.0.1 is outside"));
        for e in [err(GOOD, None), err(&GOOD.replace("name = ", "nmae = "), s)] {
            assert!(!e.contains('\n'), "one line: {e}");
        }
    }

    #[test]
    fn uplinks_are_read_and_their_mistakes_named() {
        let s = Some("0123456789abcdef");
        let two = "[[agent.uplinks]]\naddress = \"10.200.0.5\"\nrate = \"200M\"\n\
                   [[agent.uplinks]]\naddress = \"10.210.0.5:7400\"\nrate = \"100M\"\n";
        let wild = GOOD.replace(
            "listen = \"127.0.0.1:7400\"\n",
            "listen = \"0.0.0.0:7400\"\n",
        );
        let good = wild.replace("[[namespace]]", &format!("{two}[[namespace]]"));
        let c = load(&good, s).unwrap();
        assert_eq!(
            c.agent.uplinks,
            vec![
                ("10.200.0.5:7400".parse().unwrap(), 200_000_000),
                ("10.210.0.5:7400".parse().unwrap(), 100_000_000)
            ]
        );
        assert!(load(GOOD, s).unwrap().agent.uplinks.is_empty());
        let cases = [
            (
                good.replace("0.0.0.0:7400", "10.200.0.5:7400"),
                "uplinks need [agent] listen on every address",
            ),
            (
                good.replace(
                    "[[agent.uplinks]]\naddress = \"10.210.0.5:7400\"\nrate = \"100M\"\n",
                    "",
                ),
                "one uplink makes no bond",
            ),
            (
                good.replace("10.210.0.5:7400", "10.200.0.5"),
                "listed twice",
            ),
            (
                good.replace("10.210.0.5:7400", "10.210.0.5:9"),
                "on its listen port 7400",
            ),
            (
                good.replace("10.210.0.5:7400", "eth1"),
                "'eth1' is not an address",
            ),
            (good.replace("100M", "fast"), "10.210.0.5:7400"),
            (
                good.replacen(
                    "[[agent.uplinks]]",
                    "underlay = \"af_xdp\"\n[[agent.uplinks]]",
                    1,
                ),
                "uplinks need underlay = \"socket\"",
            ),
        ];
        for (toml, want) in cases {
            let e = err(&toml, s);
            assert!(
                e.contains("[agent] uplinks") || e.contains("uplinks"),
                "{e}"
            );
            assert!(e.contains(want), "{want}: {e}");
        }
    }

    #[test]
    fn caps_per_member_and_host_are_read_and_their_mistakes_named() {
        let s = Some("0123456789abcdef");
        let caps = "[[namespace.cap]]\nmembers = [\"10.201.0.9\"]\negress = \"20M\"\n\
                    [[namespace.cap]]\nhosts = [\"10.201.3.0/24\"]\ningress = \"5M\"\nburst = 100000\n";
        let good = GOOD.replace("[[namespace.peer]]\nendpoint = \"10.200.0.2:7400\"\n", caps);
        let c = load(&good, s).unwrap();
        let caps = c.namespaces[0].caps.caps();
        assert_eq!(caps.len(), 2);
        assert_eq!((caps[0].egress, caps[0].ingress), (Some(20_000_000), None));
        assert_eq!(
            (caps[1].ingress, caps[1].burst(5_000_000)),
            (Some(5_000_000), 100_000)
        );
        // Groups need an authority; a cap needs a rate; typos are named.
        let e = err(&good.replace("10.201.0.9", "group:guests"), s);
        assert!(
            e.contains("cap 1: 'group:guests' needs a namespace with an authority"),
            "{e}"
        );
        let e = err(&good.replace("ingress = \"5M\"\nburst = 100000\n", ""), s);
        assert!(
            e.contains("cap 2: needs an egress or an ingress rate, or a weight"),
            "{e}"
        );
        let e = err(
            &good.replace("ingress = \"5M\"\nburst = 100000\n", "weight = 3\n"),
            s,
        );
        assert!(e.contains("weight shares [agent] uplink_rate"), "{e}");
        let e = err(&good.replace("egress = ", "egres = "), s);
        assert!(e.contains("unknown field `egres`"), "{e}");
    }

    #[test]
    fn a_secret_others_can_read_is_refused() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = std::env::temp_dir().join(format!("hyphae-cfg-mode-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let secret = dir.join("lab.secret");
        std::fs::write(&secret, "0123456789abcdef\n").unwrap();
        let cfg = dir.join("c.toml");
        std::fs::write(&cfg, GOOD.replace("SECRET", &secret.display().to_string())).unwrap();
        for mode in [0o644, 0o640, 0o604, 0o620] {
            std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(mode)).unwrap();
            let e = format!("{:#}", Config::load(&cfg).unwrap_err());
            assert!(
                e.contains(&secret.display().to_string())
                    && e.contains(&format!("mode {mode:03o}"))
                    && e.contains("chmod 600"),
                "{e}"
            );
            assert!(!e.contains('\n'), "one line: {e}");
        }
        for mode in [0o600, 0o400] {
            std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(mode)).unwrap();
            assert!(Config::load(&cfg).is_ok(), "mode {mode:o}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn lease_secs_must_be_what_replicas_accept() {
        let s = Some("0123456789abcdef");
        let lease =
            |secs: u64| GOOD.replace("address = ", &format!("lease_secs = {secs}\naddress = "));
        assert!(err(&lease(MIN_LEASE_SECS - 1), s).contains("too short"));
        let e = err(&lease(MAX_LEASE_SECS + 1), s);
        assert!(e.contains(&format!("at most {MAX_LEASE_SECS}")), "{e}");
        let c = load(&lease(MAX_LEASE_SECS), s).unwrap();
        assert_eq!(c.namespaces[0].lease, Duration::from_secs(MAX_LEASE_SECS));
    }

    #[test]
    fn names_resolvers_gateway_and_the_service_address() {
        let s = Some("0123456789abcdef");
        let dns = GOOD.replace(
            "address = ",
            "hostname = \"Web\"\nresolvers = [\"192.0.2.53\", \"192.0.2.54:5353\", \"2001:db8::53\"]\ngateway = \"10.201.255.254\"\naddress = ",
        );
        let c = load(&dns, s).unwrap();
        let ns = &c.namespaces[0];
        assert_eq!(ns.hostname.as_deref(), Some("web"));
        assert_eq!(
            ns.resolvers,
            vec![
                "192.0.2.53:53".parse().unwrap(),
                "192.0.2.54:5353".parse().unwrap(),
                "[2001:db8::53]:53".parse().unwrap()
            ]
        );
        assert_eq!(ns.gateway, Some(Ipv4Addr::new(10, 201, 255, 254)));
        // Not configured: the host's own; `[]`: none (REFUSED).
        let host = std::fs::read_to_string(RESOLV_CONF)
            .map(|t| host_resolvers(&t))
            .unwrap_or_default();
        assert_eq!(load(GOOD, s).unwrap().namespaces[0].resolvers, host);
        let none = GOOD.replace("address = ", "resolvers = []\naddress = ");
        assert!(load(&none, s).unwrap().namespaces[0].resolvers.is_empty());
        // The lowest usable address is where the virtual DHCP and DNS server answer.
        let service = GOOD.replace("10.201.0.5", "10.201.0.1");
        assert!(err(&service, s).contains("is the namespace's service address"));
        for (bad, expected) in [
            ("hostname = \"c201000005\"", "automatic name"),
            ("hostname = \"a.b\"", "not a host name"),
            ("resolvers = [\"dns.example\"]", "resolver 'dns.example'"),
            (
                "gateway = \"10.9.0.1\"",
                "gateway: address 10.9.0.1 is outside",
            ),
            ("gateway = \"10.201.0.1\"", "service address"),
        ] {
            let e = err(
                &GOOD.replace("address = ", &format!("{bad}\naddress = ")),
                s,
            );
            assert!(e.contains(expected), "{bad}: {e}");
        }
        // The namespace name is the DNS zone: no empty labels.
        for bad in ["lab.", ".lab", "a..b"] {
            let e = err(&GOOD.replace("\"lab\"", &format!("\"{bad}\"")), s);
            assert!(e.contains("dots between labels"), "{bad}: {e}");
        }
        let router = GOOD.replace("address = \"10.201.0.5\"\n", "").replace(
            "name = \"lab\"",
            "name = \"lab\"\nmode = \"router\"\nbridge = \"br0\"\nhostname = \"gw\"",
        );
        assert!(err(&router, s).contains("no address of its own to name"));
    }

    #[test]
    fn host_resolvers_are_the_nameserver_lines_of_resolv_conf() {
        let text = "# Generated by NetworkManager\nsearch example.org\nnameserver 127.0.0.53\n\
                    ; a comment\n  nameserver\t192.0.2.53  # trailing words are ignored\n\
                    nameserver fe80::1%eth0\nnameserver 2001:db8::53\nnameserver not-an-ip\n\
                    nameserverx 192.0.2.1\noptions edns0\nnameserver 192.0.2.54\n";
        assert_eq!(
            host_resolvers(text),
            vec![
                "127.0.0.53:53".parse::<SocketAddr>().unwrap(),
                "192.0.2.53:53".parse().unwrap(),
                "[2001:db8::53]:53".parse().unwrap(),
            ],
            "loopback stubs kept, link-local with a zone and junk skipped, at most three"
        );
        assert!(host_resolvers("").is_empty());
        assert!(host_resolvers("nameserver").is_empty());
    }
}
