//! One `[[namespace]]` table checked and turned into a [`Namespace`]: every field's rule
//! and its one-line error.

use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use serde::Deserialize;

use super::{
    check_in_subnet, host_resolvers, lan, parse_bootstrap, parse_resolver, parse_subnets, qos,
    read_credential, read_policy, read_secret, resolve, Address, Address6, Mode, Namespace,
    PeerSection, Subnet6, DEFAULT_LEASE_SECS, DEFAULT_MTU, MAX_DEVICE_NAME, MAX_LEASE_SECS,
    MIN_LEASE_SECS, RESOLV_CONF,
};

/// An EtherType by name or in hex ([`hyphae_vswitch::layer2::parse_ethertype`]).
fn parse_ethertype(text: &str) -> Result<u16> {
    hyphae_vswitch::layer2::parse_ethertype(text).ok_or_else(|| {
        anyhow::anyhow!(
            "ethertype '{text}' is not {}",
            hyphae_vswitch::layer2::ETHERTYPE_NAMES
        )
    })
}

/// What a layer-2 namespace does not have (yet): one clear error each.
fn check_layer2(s: &NamespaceSection, mode: Mode) -> Result<()> {
    if mode == Mode::Hybrid {
        bail!("layer = 2 works in mode \"interface\" or \"router\": a hybrid host's LAN is already on the namespace's link");
    }
    if s.lan_ports.is_some() || !s.lan_table.is_empty() {
        bail!("layer = 2 forwards by MAC: `lan_ports` and `lan_table` are for IP namespaces");
    }
    if !s.caps.is_empty() || s.rate.is_some() {
        bail!("layer = 2 namespaces have no `rate` or `cap` yet: remove them, or use layer = 3");
    }
    if s.subnets.is_some() {
        bail!("layer = 2 namespaces have one subnet: `subnets` routes between several at layer 3");
    }
    if s.gateway.is_some() || s.resolvers.is_some() || s.hostname.is_some() {
        bail!("layer = 2 namespaces have no virtual DHCP or DNS: remove `gateway`, `resolvers` and `hostname` (a DHCP or DNS server on the segment serves its hosts)");
    }
    Ok(())
}

/// `subnet6` and `address6`: an IP namespace is dual-stack unless `subnet6 = "off"`; an
/// interface or hybrid member takes an `auto` IPv6 address unless it names one (or
/// `"none"`). A router holds no IPv6 address of its own: it claims its LAN hosts' (learned,
/// formed from its router advertisements, or leased by its DHCPv6 server).
fn parse_ipv6(s: &NamespaceSection, mode: Mode, layer2: bool) -> Result<(Subnet6, Address6)> {
    if layer2 {
        if s.subnet6.is_some() || s.address6.is_some() {
            bail!("layer = 2 namespaces carry IPv6 as any other frame: remove `subnet6` and `address6`");
        }
        return Ok((Subnet6::Off, Address6::None));
    }
    let subnet6 = match s.subnet6.as_deref() {
        None => Subnet6::Derived,
        Some("off" | "none") => Subnet6::Off,
        Some(text) => {
            let net: ipnet::Ipv6Net = text.parse().map_err(|_| {
                anyhow::anyhow!("subnet6 '{text}' is not an IPv6 prefix (as \"fd12:3456:789a::/64\") or \"off\"")
            })?;
            if net != net.trunc() {
                bail!(
                    "subnet6 '{text}' has host bits set (the prefix is {})",
                    net.trunc()
                );
            }
            if net.prefix_len() > 120 {
                bail!("subnet6 '{text}' is too small: a /120 or larger");
            }
            Subnet6::Prefix(net)
        }
    };
    let address6 = match (mode, s.address6.as_deref()) {
        (_, Some("none" | "off")) | (Mode::Router, None) => Address6::None,
        (Mode::Router, Some(_)) => bail!(
            "`address6` needs mode = \"interface\" or \"hybrid\" (a router claims its LAN hosts' IPv6 addresses)"
        ),
        (Mode::Interface | Mode::Hybrid, None | Some("auto")) => Address6::Auto,
        (Mode::Interface | Mode::Hybrid, Some(text)) => {
            let address: Ipv6Addr = text.parse().map_err(|_| {
                anyhow::anyhow!("address6 '{text}' is not an IPv6 address, \"auto\" or \"none\"")
            })?;
            if let Subnet6::Prefix(net) = subnet6 {
                if !hyphae_overlay::membership::usable6(net, address) {
                    bail!("address6 {address} is not a member's address of subnet6 {net} (inside it, and neither ::0 nor ::1 of it)");
                }
            }
            Address6::Static(address)
        }
    };
    if subnet6 == Subnet6::Off && address6 != Address6::None && s.address6.is_some() {
        bail!("`address6` needs IPv6: remove `subnet6 = \"off\"`");
    }
    Ok((subnet6, address6))
}

/// `mdns`: members may be found on the LAN, so the subnet may come from them.
pub(super) fn validate_namespace(s: NamespaceSection, mdns: bool) -> Result<Namespace> {
    let valid_name = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.';
    // The name is also the namespace's DNS zone: dots separate non-empty labels.
    if s.name.is_empty()
        || s.name.len() > 63
        || !s.name.chars().all(valid_name)
        || s.name.split('.').any(str::is_empty)
    {
        bail!("name must be 1-63 letters, digits, '-', '_' or '.' (dots between labels, as in a domain)");
    }
    let mode = match s.mode.as_str() {
        "interface" => Mode::Interface,
        "router" => Mode::Router,
        "hybrid" => Mode::Hybrid,
        other => bail!("mode '{other}' is not one of interface, router, hybrid"),
    };
    let layer2 = match s.layer {
        3 => false,
        2 => {
            check_layer2(&s, mode)?;
            true
        }
        other => bail!("layer {other} is not 2 (every Ethernet frame) or 3 (IP, the default)"),
    };
    if !s.ethertypes.is_empty() && !layer2 {
        bail!("`ethertypes` needs layer = 2 (an IP namespace carries IPv4 and ARP only)");
    }
    let ethertypes = s
        .ethertypes
        .iter()
        .map(|t| parse_ethertype(t))
        .collect::<Result<Vec<u16>>>()?;
    if let Some(vlan) = s.vlan {
        if !layer2 || mode != Mode::Router {
            bail!("`vlan` needs layer = 2 and mode = \"router\" (the uplink is a VLAN trunk)");
        }
        if !(1..=4094).contains(&vlan) {
            bail!("vlan {vlan} is outside 1..=4094");
        }
    }
    let (subnet, subnets) = parse_subnets(&s)?;
    let in_namespace = |a: &Ipv4Addr| {
        subnet.is_some_and(|n| n.contains(a)) || subnets.iter().any(|n| n.contains(a))
    };
    let address = match (mode, s.address.as_deref()) {
        (Mode::Router, None) => Address::None,
        (Mode::Router, Some(_)) => bail!(
            "mode \"router\" carries the addresses of its LAN hosts and has none of its own; remove `address`"
        ),
        (_, None | Some("auto")) => Address::Auto,
        (_, Some("dhcp")) => Address::Dhcp,
        (_, Some(text)) => {
            let address: Ipv4Addr = text.parse().map_err(|_| {
                anyhow::anyhow!("address '{text}' is not an IPv4 address, \"auto\" or \"dhcp\"")
            })?;
            if let Some(subnet) = subnet {
                check_in_subnet(address, subnet)?;
            }
            Address::Static(address)
        }
    };
    let (subnet6, address6) = parse_ipv6(&s, mode, layer2)?;
    let valid_dev = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.';
    let check_link = |key: &str, name: &str, max: usize| -> Result<()> {
        if name.is_empty() || name.len() > max || !name.chars().all(valid_dev) {
            bail!("{key} '{name}' is not a valid interface name (1-{max} letters, digits, '-', '_', '.')");
        }
        Ok(())
    };
    match mode {
        Mode::Interface => {
            if s.bridge.is_some() || s.uplink.is_some() {
                bail!("`bridge` and `uplink` need mode = \"router\" or \"hybrid\"");
            }
        }
        Mode::Router | Mode::Hybrid => {
            let Some(bridge) = &s.bridge else {
                bail!(
                    "mode \"{}\" needs `bridge` (the LAN bridge; created if missing)",
                    s.mode
                );
            };
            check_link("bridge", bridge, MAX_DEVICE_NAME)?;
            if let Some(uplink) = &s.uplink {
                check_link("uplink", uplink, MAX_DEVICE_NAME)?;
            }
        }
    }
    // Hybrid mode names the veth's bridge end and the TAP after the device (+1 byte).
    let max_device = if mode == Mode::Hybrid {
        MAX_DEVICE_NAME - 1
    } else {
        MAX_DEVICE_NAME
    };
    check_link("device", &s.device, max_device)?;
    if !(100..=60_000).contains(&s.probe_timeout_ms) {
        bail!(
            "probe_timeout_ms {} is outside 100..=60000",
            s.probe_timeout_ms
        );
    }
    if !(2..=3600).contains(&s.lan_timeout_secs) {
        bail!(
            "lan_timeout_secs {} is outside 2..=3600",
            s.lan_timeout_secs
        );
    }
    let reserved = s
        .reserved
        .iter()
        .map(|r| {
            let a: Ipv4Addr = r
                .parse()
                .map_err(|_| anyhow::anyhow!("reserved '{r}' is not an IPv4 address"))?;
            match subnet {
                Some(subnet) if !in_namespace(&a) => {
                    bail!("reserved address {a} is outside the subnet {subnet}")
                }
                _ => Ok(a),
            }
        })
        .collect::<Result<Vec<_>>>()?;
    if let Address::Static(a) = address {
        if reserved.contains(&a) {
            bail!("address {a} is reserved in this namespace");
        }
    }
    if subnet.is_none() && s.bootstrap.is_empty() && !mdns {
        bail!(
            "subnet is missing: set `subnet`, or `bootstrap` (or `mdns = true` in [agent]) to take it from the namespace"
        );
    }
    if s.lease_secs < MIN_LEASE_SECS {
        bail!(
            "lease_secs {} is too short: use at least {MIN_LEASE_SECS}",
            s.lease_secs
        );
    }
    if s.lease_secs > MAX_LEASE_SECS {
        bail!(
            "lease_secs {} is longer than replicas accept: use at most {MAX_LEASE_SECS}",
            s.lease_secs
        );
    }
    let bootstrap = s
        .bootstrap
        .iter()
        .map(|b| parse_bootstrap(b))
        .collect::<Result<Vec<_>>>()?;
    let mtu = s.mtu.unwrap_or(DEFAULT_MTU);
    if !(576..=65000).contains(&mtu) {
        bail!("mtu {mtu} is outside 576..=65000");
    }
    // IPv6 needs links of 1280 bytes at least (RFC 8200 5).
    let asked = matches!(subnet6, Subnet6::Prefix(_)) || matches!(address6, Address6::Static(_));
    let (subnet6, address6) = match (mtu < 1280, asked) {
        (true, true) => bail!("mtu {mtu} is below IPv6's 1280: raise `mtu`, or set `subnet6 = \"off\"` (the namespace is then IPv4 only)"),
        (true, false) => (Subnet6::Off, Address6::None),
        (false, _) => (subnet6, address6),
    };
    let hostname = match (&s.hostname, mode) {
        (None, _) => None,
        (Some(_), Mode::Router) => bail!(
            "mode \"router\" has no address of its own to name; its LAN hosts name themselves (DHCP option 12)"
        ),
        (Some(h), _) => Some(hyphae_dhcp_dns::dns::host_name(h).map_err(|e| anyhow::anyhow!("hostname {e}"))?),
    };
    let resolvers = match &s.resolvers {
        Some(list) => list
            .iter()
            .map(|r| parse_resolver(r))
            .collect::<Result<Vec<_>>>()?,
        // The agent runs on the host, so the host's resolvers (a loopback stub such as
        // systemd-resolved's 127.0.0.53 included) are reachable from it. No file, or no
        // nameserver in it: REFUSED, as with `resolvers = []`.
        None => std::fs::read_to_string(RESOLV_CONF)
            .map(|text| host_resolvers(&text))
            .unwrap_or_default(),
    };
    let gateway = s
        .gateway
        .as_deref()
        .map(|g| {
            let a: Ipv4Addr = g
                .parse()
                .map_err(|_| anyhow::anyhow!("gateway '{g}' is not an IPv4 address"))?;
            if let Some(subnet) = subnet {
                check_in_subnet(a, subnet).context("gateway")?;
            }
            Ok::<_, anyhow::Error>(a)
        })
        .transpose()?;
    let secret = read_secret(&s.secret_file)?;
    let mut credential = read_credential(&s.name, &s.authority, &s.certificate, &s.revocations)?;
    let policy = match &s.policy {
        Some(path) => read_policy(path, credential.as_mut().map(|c| &mut c.trust), layer2)?,
        None => hyphae_vswitch::policy::Policy::allow_all(),
    };
    let rate = qos::egress(&s.rate, s.burst)?;
    let weight = qos::weight(s.weight)?;
    let caps = hyphae_vswitch::qos::Caps::compile(&s.caps, credential.is_some())
        .map_err(|e| anyhow::anyhow!(e))?;
    if subnet6 == Subnet6::Off && !layer2 {
        for (i, picks) in caps.naming_ipv6() {
            tracing::warn!(namespace = %s.name, cap = i, %picks,
                "this cap names IPv6 addresses, but the namespace carries no IPv6 (subnet6 = \"off\", or mtu below 1280): they pick nothing");
        }
    }
    if s.flows == 0 {
        bail!("flows must be at least 1 (the policy's connection table)");
    }
    let (lan_ports, lan_table) = lan::parse_lan_ports(&s, mode, subnet)?;
    let peers = s
        .peers
        .iter()
        .map(|p| resolve(&p.endpoint).with_context(|| "peer endpoint".to_string()))
        .collect::<Result<Vec<_>>>()?;
    Ok(Namespace {
        name: s.name,
        secret,
        subnet,
        subnets,
        mode,
        layer2,
        vlan: s.vlan,
        ethertypes,
        device: s.device,
        bridge: s.bridge,
        uplink: s.uplink,
        lan_ports,
        lan_table,
        probe_timeout: Duration::from_millis(s.probe_timeout_ms),
        lan_timeout: Duration::from_secs(s.lan_timeout_secs),
        broadcast_rate: s.broadcast_rate,
        address,
        subnet6,
        address6,
        mtu,
        peers,
        bootstrap,
        lease: Duration::from_secs(s.lease_secs),
        reserved,
        hostname,
        resolvers,
        dns_rate: s.dns_rate,
        gateway,
        credential,
        certificate_path: s.certificate,
        policy,
        policy_path: s.policy,
        flows: s.flows,
        rate,
        weight,
        caps,
    })
}

/// One trunk, several namespaces: each a layer-2 one with its own VLAN, or one would take
/// the others' frames.
pub(super) fn check_shared_bridge(namespaces: &[Namespace], ns: &Namespace) -> Result<()> {
    let clash = namespaces.iter().find(|n| {
        n.bridge.is_some()
            && n.bridge == ns.bridge
            && (n.vlan.is_none() || ns.vlan.is_none() || n.vlan == ns.vlan)
    });
    if let Some(other) = clash {
        bail!(
            "namespaces '{}' and '{}' share bridge '{}': a trunk needs `layer = 2` and a different `vlan` in each",
            other.name,
            ns.name,
            ns.bridge.as_deref().unwrap_or_default()
        );
    }
    Ok(())
}

impl Namespace {
    /// The MTU of the TAP device: the namespace MTU, less the frame's Ethernet header and
    /// its envelope in a layer-2 namespace (whose tunnels carry whole frames).
    pub fn tap_mtu(&self) -> u16 {
        if self.layer2 {
            let overhead =
                hyphae_vswitch::layer2::ENVELOPE_LEN + hyphae_vswitch::wire::ETH_HEADER_LEN;
            self.mtu.saturating_sub(overhead as u16)
        } else {
            self.mtu
        }
    }
}

/// A `[[namespace]]` section as written (checked by [`validate_namespace`]).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct NamespaceSection {
    pub(super) name: String,
    pub(super) secret_file: PathBuf,
    #[serde(default)]
    pub(super) subnet: Option<String>,
    #[serde(default)]
    pub(super) subnets: Option<Vec<String>>,
    #[serde(default = "default_mode")]
    pub(super) mode: String,
    #[serde(default = "default_layer")]
    pub(super) layer: u8,
    #[serde(default)]
    pub(super) vlan: Option<u16>,
    #[serde(default)]
    pub(super) ethertypes: Vec<String>,
    #[serde(default = "default_device")]
    pub(super) device: String,
    #[serde(default)]
    pub(super) address: Option<String>,
    #[serde(default)]
    pub(super) subnet6: Option<String>,
    #[serde(default)]
    pub(super) address6: Option<String>,
    #[serde(default)]
    pub(super) bridge: Option<String>,
    #[serde(default)]
    pub(super) uplink: Option<String>,
    #[serde(default)]
    pub(super) lan_ports: Option<String>,
    #[serde(default)]
    pub(super) lan_table: Vec<lan::LanTableRow>,
    #[serde(default = "default_probe_timeout_ms")]
    pub(super) probe_timeout_ms: u64,
    #[serde(default = "default_lan_timeout_secs")]
    pub(super) lan_timeout_secs: u64,
    #[serde(default = "default_broadcast_rate")]
    pub(super) broadcast_rate: u32,
    #[serde(default)]
    pub(super) mtu: Option<u16>,
    #[serde(default)]
    pub(super) bootstrap: Vec<String>,
    #[serde(default = "default_lease_secs")]
    pub(super) lease_secs: u64,
    #[serde(default)]
    pub(super) reserved: Vec<String>,
    #[serde(default)]
    pub(super) hostname: Option<String>,
    #[serde(default)]
    pub(super) resolvers: Option<Vec<String>>,
    #[serde(default = "default_dns_rate")]
    pub(super) dns_rate: u32,
    #[serde(default)]
    pub(super) gateway: Option<String>,
    #[serde(default, rename = "peer")]
    pub(super) peers: Vec<PeerSection>,
    #[serde(default)]
    pub(super) authority: Option<String>,
    #[serde(default)]
    pub(super) certificate: Option<PathBuf>,
    #[serde(default)]
    pub(super) revocations: Option<PathBuf>,
    #[serde(default)]
    pub(super) policy: Option<PathBuf>,
    #[serde(default = "default_flows")]
    pub(super) flows: usize,
    #[serde(default)]
    pub(super) rate: Option<String>,
    #[serde(default)]
    pub(super) burst: Option<u64>,
    #[serde(default)]
    pub(super) weight: Option<u64>,
    #[serde(default, rename = "cap")]
    pub(super) caps: Vec<hyphae_vswitch::qos::CapFile>,
}

pub(super) fn default_flows() -> usize {
    hyphae_vswitch::policy::flows::DEFAULT_FLOWS
}

pub(super) fn default_mode() -> String {
    "interface".into()
}

pub(super) fn default_layer() -> u8 {
    3
}

pub(super) fn default_probe_timeout_ms() -> u64 {
    2000
}

pub(super) fn default_lan_timeout_secs() -> u64 {
    30
}

pub(super) fn default_broadcast_rate() -> u32 {
    200
}

pub(super) fn default_dns_rate() -> u32 {
    hyphae_dhcp_dns::limit::DEFAULT_RATE
}

pub(super) fn default_lease_secs() -> u64 {
    DEFAULT_LEASE_SECS
}

pub(super) fn default_device() -> String {
    "hyphae0".into()
}
