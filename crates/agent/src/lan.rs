//! Router and hybrid modes' devices: the LAN bridge, the uplink, and (hybrid) the veth pair
//! whose host end carries the host's virtual address (IPOP Fig. 3 and 4).
//!
//! VEPA ports (`lan_ports = "vepa"`): every bridge port but the TAP is isolated (the
//! kernel bridge's `isolated` flag: an isolated port forwards only to ports that are not),
//! so LAN hosts reach each other only through the agent; ports plugged in later are
//! isolated within [`PORT_CHECK`]. VEB ports (the default) are never isolated.
//!
//! Links are set up with iproute2's `ip`, which every Linux host has (see DECISIONS.md). The
//! bridge is created if missing and left in place when the agent stops, so the LAN keeps
//! working without it; the hybrid veth is removed with the namespace, as a TAP is.

use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use hyphae_vswitch::{LanPorts, Mac};
use ipnet::Ipv4Net;

use anyhow::{bail, Context, Result};

use crate::config::{Mode, Namespace};

/// How often a VEPA bridge's ports are looked at for new ones to isolate.
pub const PORT_CHECK: Duration = Duration::from_secs(1);

/// The links a router- or hybrid-mode namespace set up; the veth goes when this is dropped.
pub struct Lan {
    /// Hybrid mode: the host end of the veth pair (deleting it deletes the pair).
    veth: Option<String>,
    /// VEPA: the bridge whose ports are kept isolated.
    vepa: Option<Isolation>,
}

/// A VEPA bridge: every port but the TAP isolated.
struct Isolation {
    bridge: String,
    tap: String,
    next_check: Option<Instant>,
    /// Ports isolated after start (plugged in later).
    late: u64,
}

impl Lan {
    /// When the ports are next looked at (VEPA).
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.vepa.as_ref().and_then(|v| v.next_check)
    }

    /// Isolates ports plugged into a VEPA bridge since the last look.
    pub fn handle_timeout(&mut self, now: Instant) {
        let Some(v) = self.vepa.as_mut() else {
            return;
        };
        if v.next_check.is_some_and(|t| t > now) {
            return;
        }
        v.next_check = Some(now + PORT_CHECK);
        match isolate_ports(&v.bridge, &v.tap, true) {
            Ok(0) => {}
            Ok(n) => {
                v.late += n as u64;
                tracing::info!(bridge = %v.bridge, ports = n, "new LAN ports isolated (VEPA)");
            }
            Err(e) => tracing::warn!(bridge = %v.bridge, error = %e, "cannot isolate LAN ports"),
        }
    }

    /// VEPA: ports isolated since start (plugged in after the agent started).
    pub fn isolated_late(&self) -> u64 {
        self.vepa.as_ref().map_or(0, |v| v.late)
    }

    /// VEPA: the bridge's ports (the TAP's excluded), and which MACs the bridge has
    /// learned behind each; `None` for VEB ports.
    pub fn ports(&self) -> Option<Vec<(String, Vec<Mac>)>> {
        let v = self.vepa.as_ref()?;
        let mut ports: Vec<(String, u16, Vec<Mac>)> = bridge_ports(&v.bridge)
            .unwrap_or_default()
            .into_iter()
            .filter(|(name, _)| *name != v.tap)
            .map(|(name, number)| (name, number, Vec::new()))
            .collect();
        for (mac, port) in learned_macs(&v.bridge).unwrap_or_default() {
            if let Some(entry) = ports.iter_mut().find(|(_, n, _)| *n == port) {
                entry.2.push(mac);
            }
        }
        let mut ports: Vec<(String, Vec<Mac>)> = ports
            .into_iter()
            .map(|(name, _, macs)| (name, macs))
            .collect();
        ports.sort();
        Some(ports)
    }
}

impl Drop for Lan {
    fn drop(&mut self) {
        if let Some(veth) = &self.veth {
            if let Err(e) = ip(&["link", "del", veth]) {
                tracing::warn!(device = %veth, error = %e, "cannot remove the veth");
            }
        }
    }
}

/// The TAP's name: the configured device, or in hybrid mode (where the device is the host's
/// veth) the device name plus `t`.
pub fn tap_name(ns: &Namespace) -> String {
    match ns.mode {
        Mode::Hybrid => format!("{}t", ns.device),
        Mode::Interface | Mode::Router => ns.device.clone(),
    }
}

/// Puts the TAP `tap` on the namespace's bridge (created if missing), enslaves the uplink,
/// and in hybrid mode creates the host's veth (with `device_mac`) with its peer on the bridge.
///
/// The TAP and the veth take the LAN's MTU, not the namespace's: a bridge drops a frame
/// larger than the port it leaves by, so a bridge port at 1420 would silently lose a 1500-byte
/// host's full-size frames. The switch fits what is larger than the tunnel (see
/// `hyphae_vswitch::mtu`).
pub fn attach(ns: &Namespace, tap: &str, device_mac: [u8; 6]) -> Result<Lan> {
    let mut lan = attach_links(ns, tap, device_mac)?;
    let bridge = ns.bridge.as_deref().unwrap_or_default();
    if ns.mode != Mode::Router {
        return Ok(lan);
    }
    if ns.vlan.is_some() {
        // A trunk's bridge is not VLAN-aware: a LAN host that sends on two VLANs with one
        // MAC (as VLAN sub-interfaces do) would be learned behind whichever namespace's
        // TAP wrote its frame last, and the other VLAN's frames to it would reach only
        // that TAP. Unlearned, they reach every TAP, and each namespace takes its own.
        let path = format!("/sys/class/net/{bridge}/brif/{tap}/learning");
        std::fs::write(&path, "0")
            .with_context(|| format!("namespace '{}': cannot write {path}", ns.name))?;
    }
    let vepa = ns.lan_ports == LanPorts::Vepa;
    let changed = isolate_ports(bridge, tap, vepa)
        .with_context(|| format!("namespace '{}': cannot set the ports of {bridge}", ns.name))?;
    if vepa {
        tracing::info!(namespace = %ns.name, %bridge, ports = changed,
            "VEPA: LAN ports isolated, hosts reach each other through the agent");
        lan.vepa = Some(Isolation {
            bridge: bridge.to_string(),
            tap: tap.to_string(),
            next_check: None,
            late: 0,
        });
        return Ok(lan);
    }
    if changed > 0 {
        tracing::info!(namespace = %ns.name, %bridge, ports = changed,
            "VEB: isolation taken off LAN ports (lan_ports = \"veb\")");
    }
    Ok(lan)
}

fn attach_links(ns: &Namespace, tap: &str, device_mac: [u8; 6]) -> Result<Lan> {
    let Some(bridge) = ns.bridge.as_deref() else {
        bail!("namespace '{}': mode needs `bridge`", ns.name);
    };
    if !exists(bridge) {
        ip(&["link", "add", "name", bridge, "type", "bridge"])
            .with_context(|| format!("namespace '{}': cannot create bridge {bridge}", ns.name))?;
        tracing::info!(namespace = %ns.name, %bridge, "bridge created");
    } else if !Path::new(&format!("/sys/class/net/{bridge}/bridge")).exists() {
        bail!(
            "namespace '{}': {bridge} exists and is not a bridge; name another `bridge`",
            ns.name
        );
    }
    ip(&["link", "set", bridge, "up"])?;
    if let Some(uplink) = ns.uplink.as_deref() {
        if !exists(uplink) {
            bail!("namespace '{}': uplink {uplink} does not exist", ns.name);
        }
    }
    // The uplink's MTU, or the bridge's before the TAP joins (a bridge has its smallest
    // port's MTU, or 1500 with none).
    let lan_mtu = mtu_of(ns.uplink.as_deref().unwrap_or(bridge))?;
    if lan_mtu < ns.mtu {
        tracing::warn!(namespace = %ns.name, lan_mtu, mtu = ns.mtu,
            "the LAN's MTU is below the namespace MTU: set `mtu` to at most the LAN's");
    }
    let lan_mtu = lan_mtu.to_string();
    ip(&["link", "set", tap, "mtu", &lan_mtu, "master", bridge, "up"])
        .with_context(|| format!("namespace '{}': cannot put {tap} on {bridge}", ns.name))?;
    if let Some(uplink) = ns.uplink.as_deref() {
        ip(&["link", "set", uplink, "master", bridge, "up"])
            .with_context(|| format!("namespace '{}': cannot put {uplink} on {bridge}", ns.name))?;
    }
    let mut lan = Lan {
        veth: None,
        vepa: None,
    };
    if ns.mode == Mode::Hybrid {
        let device = ns.device.as_str();
        let peer = format!("{device}p");
        if exists(device) {
            bail!(
                "namespace '{}': device {device} already exists; pick another `device`",
                ns.name
            );
        }
        let mac = format_mac(device_mac);
        ip(&[
            "link", "add", device, "address", &mac, "type", "veth", "peer", "name", &peer,
        ])
        .with_context(|| format!("namespace '{}': cannot create veth {device}", ns.name))?;
        lan.veth = Some(device.to_string());
        // An IPv4-only namespace: keep IPv6 chatter off the host's device. In a dual-stack
        // one the device carries the member's IPv6 address (set once won, without DAD).
        let ipv6 = ns.subnet6 != crate::config::Subnet6::Off
            && ns.address6 != crate::config::Address6::None;
        if !ipv6 {
            let _ = std::fs::write(
                format!("/proc/sys/net/ipv6/conf/{device}/disable_ipv6"),
                "1",
            );
        }
        ip(&[
            "link", "set", &peer, "mtu", &lan_mtu, "master", bridge, "up",
        ])?;
        ip(&["link", "set", device, "mtu", &lan_mtu, "up"])?;
    }
    Ok(lan)
}

/// Gives the hybrid host's device its virtual address (replacing any other).
pub fn set_address(device: &str, address: Ipv4Addr, prefix: u8) -> Result<()> {
    ip(&["-4", "addr", "flush", "dev", device])?;
    ip(&[
        "addr",
        "add",
        &format!("{address}/{prefix}"),
        "brd",
        "+",
        "dev",
        device,
    ])
}

/// Gives `device` the IPv6 `address` (`None`: no global address); link-local ones stay.
/// Without duplicate address detection: the address is a lease the DHT granted, and the
/// switch answers no probe for it.
pub fn set_address6(device: &str, address: Option<Ipv6Addr>, prefix: u8) -> Result<()> {
    ip(&["-6", "addr", "flush", "dev", device, "scope", "global"])?;
    match address {
        Some(a) => ip(&[
            "-6",
            "addr",
            "add",
            &format!("{a}/{prefix}"),
            "dev",
            device,
            "nodad",
        ]),
        None => Ok(()),
    }
}

/// Routes `net` (another namespace's addresses) through `gateway`, a member of this
/// namespace on `device` (a link of the policy).
pub fn set_route(device: &str, net: Ipv4Net, gateway: Ipv4Addr) -> Result<()> {
    ip(&[
        "-4",
        "route",
        "replace",
        &net.to_string(),
        "via",
        &gateway.to_string(),
        "dev",
        device,
        "onlink",
    ])
}

/// Removes the route to `net` on `device`.
pub fn del_route(device: &str, net: Ipv4Net) -> Result<()> {
    ip(&["-4", "route", "del", &net.to_string(), "dev", device])
}

/// Sets every port of `bridge` but `tap` isolated (`on`) or not, and `tap` not isolated;
/// returns how many ports changed.
fn isolate_ports(bridge: &str, tap: &str, on: bool) -> Result<usize> {
    let mut changed = 0;
    for (port, _) in bridge_ports(bridge)? {
        let want = on && port != tap;
        let path = format!("/sys/class/net/{bridge}/brif/{port}/isolated");
        let now = std::fs::read_to_string(&path).with_context(|| format!("cannot read {path}"))?;
        if (now.trim() == "1") != want {
            std::fs::write(&path, if want { "1" } else { "0" })
                .with_context(|| format!("cannot write {path}"))?;
            changed += 1;
        }
    }
    Ok(changed)
}

/// The ports of `bridge` and their port numbers, from sysfs.
fn bridge_ports(bridge: &str) -> Result<Vec<(String, u16)>> {
    let dir = format!("/sys/class/net/{bridge}/brif");
    let mut ports = Vec::new();
    for entry in std::fs::read_dir(&dir).with_context(|| format!("cannot read {dir}"))? {
        let name = entry?.file_name().to_string_lossy().into_owned();
        let number = std::fs::read_to_string(format!("{dir}/{name}/port_no"))
            .ok()
            .and_then(|t| u16::from_str_radix(t.trim().trim_start_matches("0x"), 16).ok())
            .unwrap_or(0);
        ports.push((name, number));
    }
    Ok(ports)
}

/// The MACs `bridge` learned on its ports (not its own), and each one's port number: its
/// forwarding table as sysfs gives it (`brforward`, 16-byte `struct __fdb_entry`s).
fn learned_macs(bridge: &str) -> Result<Vec<(Mac, u16)>> {
    let path = format!("/sys/class/net/{bridge}/brforward");
    let bytes = std::fs::read(&path).with_context(|| format!("cannot read {path}"))?;
    Ok(bytes
        .chunks_exact(16)
        .filter(|e| e[7] == 0) // is_local
        .map(|e| {
            let mut mac = [0u8; 6];
            mac.copy_from_slice(&e[..6]);
            (mac, u16::from(e[12]) << 8 | u16::from(e[6]))
        })
        .collect())
}

/// The MTU of `link`, from sysfs.
fn mtu_of(link: &str) -> Result<u16> {
    let path = format!("/sys/class/net/{link}/mtu");
    std::fs::read_to_string(&path)
        .with_context(|| format!("cannot read {path}"))?
        .trim()
        .parse()
        .with_context(|| format!("{path} does not hold an MTU"))
}

fn exists(link: &str) -> bool {
    Path::new(&format!("/sys/class/net/{link}")).exists()
}

fn format_mac(m: [u8; 6]) -> String {
    format!(
        "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
        m[0], m[1], m[2], m[3], m[4], m[5]
    )
}

/// Runs `ip ARGS`; an error carries what `ip` printed.
fn ip(args: &[&str]) -> Result<()> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .context("cannot run `ip` (install iproute2)")?;
    if !out.status.success() {
        bail!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}
